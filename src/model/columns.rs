//! The column vocabulary every stage shares: BigQuery column types and columns as the
//! destination and staging tables hold them, with the Arrow type each is staged as. The
//! mapping from Arrow schemas lives in `ingest::schema`; `bigquery` turns columns into table
//! schemas and `publish` into SQL.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use arrow_schema::{DataType, Field, TimeUnit};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// BigQuery's limit on columns per table: "A table, query result, or view definition can have up
/// to 10,000 columns. This includes nested and repeated columns"
/// (BigQuery documentation, Quotas and limits, Table limits); see [`Column::column_count`].
pub(crate) const MAX_COLUMNS: usize = 10_000;
/// "Maximum depth of nested records | 15 levels | ... independent of whether the records are
/// scalar or array-based (repeated)" (BigQuery documentation, Quotas and limits, Table limits);
/// see [`Column::record_depth`].
pub(crate) const MAX_RECORD_DEPTH: usize = 15;
/// BigQuery's limit on primary-key columns.
pub(crate) const MAX_KEY_COLUMNS: usize = 16;
/// Staged names of columns whose own names are flexible ([`Column::staged_name`]).
const STAGED_NAME_PREFIX: &str = "_filament_col_";

/// Whether two column names are one to BigQuery, which compares them without regard to case
/// ("Duplicate column names are not allowed even if the case differs"), Unicode case included
/// (`Größe` and `GRÖßE`).
pub(crate) fn same_name(a: &str, b: &str) -> bool {
    a.eq_ignore_ascii_case(b) || (!a.is_ascii() && a.to_lowercase() == b.to_lowercase())
}

/// A name BigQuery takes everywhere, the Storage Write API included: `[A-Za-z_][A-Za-z0-9_]*`.
pub(crate) fn is_plain_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A BigQuery column type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum BigQueryType {
    Bool,
    Int64,
    Float64,
    Numeric,
    BigNumeric,
    String,
    Bytes,
    Date,
    Time,
    Datetime,
    Timestamp,
    Json,
    Geography(GeographyEncoding),
    Range(RangeElement),
    Interval,
    Struct(Vec<Column>),
}

/// How a GEOGRAPHY column's values arrive, which is how they are staged (unchanged, checked to
/// parse) and which of BigQuery's constructors publishes them, with which edges: GeoArrow's
/// columns have planar edges unless their extension metadata says `"edges": "spherical"`
/// (GeoArrow specification, Extension metadata), published with `planar => TRUE`; columns
/// marked `bigquery_type` take BigQuery's geodesic edges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum GeographyEncoding {
    /// Well-known binary, staged as BYTES, published with `ST_GEOGFROMWKB`.
    Wkb,
    /// WKB with planar edges: staged as its WKT (each coordinate written in the shortest text
    /// that reads back as the same double, so the geometry is exact) and published with
    /// `ST_GEOGFROMTEXT(..., planar => TRUE)`, the planar constructor Google's analyzer knows.
    PlanarWkb,
    /// Well-known text, staged as STRING, published with `ST_GEOGFROMTEXT`.
    Wkt,
    /// WKT with planar edges: `ST_GEOGFROMTEXT(..., planar => TRUE)`.
    PlanarWkt,
    /// WKT or GeoJSON, told apart per value (GeoJSON starts with `{`), staged as STRING and
    /// published with `ST_GEOGFROMGEOJSON` or `ST_GEOGFROMTEXT`.
    WktOrGeoJson,
}

impl GeographyEncoding {
    /// Binary well-known geometries as received; the others are text.
    pub(crate) fn is_wkb(self) -> bool {
        matches!(self, GeographyEncoding::Wkb | GeographyEncoding::PlanarWkb)
    }

    /// Staged as BYTES (the WKB as received); the others are staged as text.
    pub(crate) fn stages_bytes(self) -> bool {
        self == GeographyEncoding::Wkb
    }
}

/// The element type of a RANGE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum RangeElement {
    Date,
    Datetime,
    Timestamp,
}

impl RangeElement {
    pub(crate) fn type_name(self) -> &'static str {
        match self {
            RangeElement::Date => "DATE",
            RangeElement::Datetime => "DATETIME",
            RangeElement::Timestamp => "TIMESTAMP",
        }
    }
}

impl BigQueryType {
    /// The type name `tables.insert` takes.
    pub(crate) fn type_name(&self) -> &'static str {
        match self {
            BigQueryType::Bool => "BOOL",
            BigQueryType::Int64 => "INT64",
            BigQueryType::Float64 => "FLOAT64",
            BigQueryType::Numeric => "NUMERIC",
            BigQueryType::BigNumeric => "BIGNUMERIC",
            BigQueryType::String => "STRING",
            BigQueryType::Bytes => "BYTES",
            BigQueryType::Date => "DATE",
            BigQueryType::Time => "TIME",
            BigQueryType::Datetime => "DATETIME",
            BigQueryType::Timestamp => "TIMESTAMP",
            BigQueryType::Json => "JSON",
            BigQueryType::Geography(_) => "GEOGRAPHY",
            BigQueryType::Range(_) => "RANGE",
            BigQueryType::Interval => "INTERVAL",
            BigQueryType::Struct(_) => "RECORD",
        }
    }

    /// The types an existing destination column of this type accepts by coercion, as BigQuery's
    /// conversion rules coerce them without changing what a value means ("Conversion rules",
    /// GoogleSQL reference: INT64 coerces to NUMERIC, BIGNUMERIC and FLOAT64; NUMERIC to
    /// BIGNUMERIC and FLOAT64). The publication casts the staged value into the column's type.
    pub(crate) fn coerces_into(&self) -> &'static [BigQueryType] {
        match self {
            BigQueryType::Int64 => &[BigQueryType::Numeric, BigQueryType::BigNumeric, BigQueryType::Float64],
            BigQueryType::Numeric => &[BigQueryType::BigNumeric, BigQueryType::Float64],
            _ => &[],
        }
    }

    /// The scalar type `tables.get` names `name` (legacy or standard spelling), for the types
    /// coercion and widening consider.
    pub(crate) fn numeric_named(name: &str) -> Option<BigQueryType> {
        [BigQueryType::Int64, BigQueryType::Numeric, BigQueryType::BigNumeric, BigQueryType::Float64]
            .into_iter()
            .find(|t| t.is_named(name))
    }

    /// Whether `name`, as `tables.get` reports a type (legacy or standard spelling), is this type.
    /// Struct fields are compared by [`Column::matches_existing`].
    pub(crate) fn is_named(&self, name: &str) -> bool {
        let name = name.to_ascii_uppercase();
        let aliases: &[&str] = match self {
            BigQueryType::Bool => &["BOOL", "BOOLEAN"],
            BigQueryType::Int64 => &["INT64", "INTEGER"],
            BigQueryType::Float64 => &["FLOAT64", "FLOAT"],
            BigQueryType::Numeric => &["NUMERIC", "DECIMAL"],
            BigQueryType::BigNumeric => &["BIGNUMERIC", "BIGDECIMAL"],
            BigQueryType::Struct(_) => &["RECORD", "STRUCT"],
            other => return name == other.type_name(),
        };
        aliases.contains(&name.as_str())
    }

    /// Values staged as strings and converted by the publication query.
    pub(crate) fn is_staged_as_string(&self) -> bool {
        matches!(
            self,
            BigQueryType::Numeric
                | BigQueryType::BigNumeric
                | BigQueryType::Time
                | BigQueryType::Json
                | BigQueryType::Range(_)
                | BigQueryType::Interval
        ) || matches!(self, BigQueryType::Geography(encoding) if !encoding.stages_bytes())
    }

    /// Whether the publication query must convert the staged value: a type staged in another
    /// form, or a STRUCT with such a field or with a field staged under another name.
    pub(crate) fn needs_conversion(&self) -> bool {
        match self {
            BigQueryType::Struct(fields) => fields.iter().any(|f| f.needs_conversion()),
            BigQueryType::Geography(_) => true,
            other => other.is_staged_as_string(),
        }
    }

    /// BigQuery allows these in primary keys (BYTES and TIME compare fine too); never FLOAT64,
    /// JSON, GEOGRAPHY, RANGE, INTERVAL, STRUCT.
    pub(crate) fn is_key_eligible(&self) -> bool {
        !matches!(
            self,
            BigQueryType::Float64
                | BigQueryType::Json
                | BigQueryType::Geography(_)
                | BigQueryType::Range(_)
                | BigQueryType::Interval
                | BigQueryType::Struct(_)
        )
    }

    /// The types `order_by` takes (the issue's ordered key types: no BOOL, BYTES or TIME,
    /// whose order means nothing to a change stream).
    pub(crate) fn is_orderable(&self) -> bool {
        matches!(
            self,
            BigQueryType::Int64
                | BigQueryType::Numeric
                | BigQueryType::BigNumeric
                | BigQueryType::Date
                | BigQueryType::Datetime
                | BigQueryType::Timestamp
                | BigQueryType::String
        )
    }

    /// The type rows are staged with (STRUCT fields under their staged names).
    pub(crate) fn staged(&self) -> BigQueryType {
        match self {
            BigQueryType::Struct(fields) => BigQueryType::Struct(fields.iter().map(Column::staged).collect()),
            BigQueryType::Geography(encoding) if encoding.stages_bytes() => BigQueryType::Bytes,
            other if other.is_staged_as_string() => BigQueryType::String,
            other => other.clone(),
        }
    }

    /// The Arrow type of the staged value (what the Storage Write API expects for the column).
    fn staging_arrow_type(&self) -> DataType {
        match self {
            BigQueryType::Bool => DataType::Boolean,
            BigQueryType::Int64 => DataType::Int64,
            BigQueryType::Float64 => DataType::Float64,
            BigQueryType::Bytes => DataType::Binary,
            BigQueryType::Geography(encoding) if encoding.stages_bytes() => DataType::Binary,
            BigQueryType::Date => DataType::Date32,
            BigQueryType::Datetime => DataType::Timestamp(TimeUnit::Microsecond, None),
            BigQueryType::Timestamp => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            BigQueryType::Struct(fields) => DataType::Struct(fields.iter().map(Column::staging_field).collect()),
            BigQueryType::String
            | BigQueryType::Numeric
            | BigQueryType::BigNumeric
            | BigQueryType::Time
            | BigQueryType::Json
            | BigQueryType::Range(_)
            | BigQueryType::Interval
            | BigQueryType::Geography(_) => DataType::Utf8,
        }
    }
}

impl fmt::Display for BigQueryType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BigQueryType::Struct(fields) => {
                f.write_str("STRUCT<")?;
                for (i, field) in fields.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{field}")?;
                }
                f.write_str(">")
            }
            BigQueryType::Range(element) => write!(f, "RANGE<{}>", element.type_name()),
            other => f.write_str(other.type_name()),
        }
    }
}

/// One column as the destination (or staging) table holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Column {
    pub(crate) name: String,
    pub(crate) bigquery_type: BigQueryType,
    /// An ARRAY (`REPEATED` mode); otherwise `NULLABLE` (or `REQUIRED`, [`Column::required`]).
    pub(crate) repeated: bool,
    /// The wider type the existing destination column holds, into which the publication casts
    /// this column's values ([`BigQueryType::coerces_into`]); set by set-up, never by the
    /// schema mapping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) published_as: Option<BigQueryType>,
    /// The existing destination column is `REQUIRED`: every row the publication writes must
    /// hold a value ([`crate::ingest::destination_rules`]); set by set-up, never by the
    /// schema mapping (the gateway creates every column `NULLABLE`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) required: bool,
}

impl Column {
    pub(crate) fn new(name: impl Into<String>, bigquery_type: BigQueryType) -> Self {
        Self { name: name.into(), bigquery_type, repeated: false, published_as: None, required: false }
    }

    pub(crate) fn repeated(name: impl Into<String>, bigquery_type: BigQueryType) -> Self {
        Self { name: name.into(), bigquery_type, repeated: true, published_as: None, required: false }
    }

    /// The name the staging table holds the column under: its own when it is a plain name
    /// (`[A-Za-z_][A-Za-z0-9_]*`), otherwise one made from its hash under the reserved prefix
    /// (which no client column may start with), so the Storage Write API never sees a flexible
    /// column name. The publication maps it back ([`crate::publish`]'s SQL).
    pub(crate) fn staged_name(&self) -> Cow<'_, str> {
        if is_plain_name(&self.name) {
            return Cow::Borrowed(&self.name);
        }
        let digest = Sha256::digest(self.name.as_bytes());
        Cow::Owned(format!("{STAGED_NAME_PREFIX}{}", &hex::encode(digest)[..16]))
    }

    /// Whether the publication converts the staged value: its type ([`BigQueryType::needs_conversion`]),
    /// or a cast into the destination's wider type.
    pub(crate) fn needs_conversion(&self) -> bool {
        self.published_as.is_some() || self.bigquery_type.needs_conversion() || self.staged_name() != self.name
    }

    pub(crate) fn mode(&self) -> &'static str {
        match (self.repeated, self.required) {
            (true, _) => "REPEATED",
            (false, true) => "REQUIRED",
            (false, false) => "NULLABLE",
        }
    }

    /// The column as the staging table holds it: staged name, staged type.
    pub(crate) fn staged(&self) -> Column {
        Column {
            name: self.staged_name().into_owned(),
            bigquery_type: self.bigquery_type.staged(),
            repeated: self.repeated,
            published_as: None,
            required: false,
        }
    }

    /// The Arrow field of the staged column (under its staged name): lists for REPEATED columns.
    pub(crate) fn staging_field(&self) -> Field {
        let value_type = self.bigquery_type.staged().staging_arrow_type();
        let name = self.staged_name();
        if self.repeated {
            Field::new(name, DataType::List(Arc::new(Field::new_list_field(value_type, true))), true)
        } else {
            Field::new(name, value_type, true)
        }
    }

    /// The same column holding one element of the array (for a REPEATED column).
    pub(crate) fn element(&self) -> Column {
        Column { repeated: false, ..self.clone() }
    }

    /// How many RECORDs nest here: 0 for a scalar or an ARRAY of scalars, 1 for a STRUCT (or
    /// an ARRAY of STRUCTs) of scalars, and so on.
    pub(crate) fn record_depth(&self) -> usize {
        match &self.bigquery_type {
            BigQueryType::Struct(fields) => 1 + fields.iter().map(Column::record_depth).max().unwrap_or(0),
            _ => 0,
        }
    }

    /// The columns this one counts as against [`MAX_COLUMNS`]: itself and every nested field.
    pub(crate) fn column_count(&self) -> usize {
        match &self.bigquery_type {
            BigQueryType::Struct(fields) => 1 + fields.iter().map(Column::column_count).sum::<usize>(),
            _ => 1,
        }
    }

    /// The SQL type, as error messages and docs show it (`ARRAY<STRUCT<a INT64>>`).
    pub(crate) fn sql_type(&self) -> String {
        if self.repeated { format!("ARRAY<{}>", self.bigquery_type) } else { self.bigquery_type.to_string() }
    }
}

impl fmt::Display for Column {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.name, self.sql_type())
    }
}

/// A collation specification a STRING column compares and groups under, as BigQuery names it
/// (`und:ci`). Only names of ASCII letters, digits, `:`, `_` and `-` are kept, so the name can
/// be written into SQL as a string literal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Collation(String);

impl Collation {
    /// The collation named `name`, or `None` for the empty name (code-point order) and names
    /// with other characters.
    pub(crate) fn parse(name: &str) -> Option<Self> {
        let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, ':' | '_' | '-');
        (!name.is_empty() && name.chars().all(allowed)).then(|| Self(name.to_string()))
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_records_count_as_columns_and_levels() {
        let scalar = Column::new("a", BigQueryType::Int64);
        let inner = Column::repeated("r", BigQueryType::Struct(vec![scalar.clone(), scalar.clone()]));
        let outer = Column::new("o", BigQueryType::Struct(vec![inner.clone(), scalar.clone()]));
        assert_eq!((scalar.record_depth(), inner.record_depth(), outer.record_depth()), (0, 1, 2));
        assert_eq!((scalar.column_count(), inner.column_count(), outer.column_count()), (1, 3, 5));
    }

    #[test]
    fn only_plain_collation_names_are_kept() {
        assert_eq!(Collation::parse("und:ci").map(|c| c.as_str().to_string()), Some("und:ci".into()));
        assert_eq!(Collation::parse(""), None);
        assert_eq!(Collation::parse("und:ci') OR ('"), None);
    }
}
