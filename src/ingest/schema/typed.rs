//! Columns whose BigQuery type is chosen by field metadata or an Arrow extension type, not by
//! the Arrow type alone: JSON (`arrow.json`), GEOGRAPHY (GeoArrow's serialized encodings
//! `geoarrow.wkb` and `geoarrow.wkt`) and RANGE (a `start`/`end` struct), each also reachable
//! with the field metadata `bigquery_type` for writers that cannot set extension types.

use arrow_schema::{DataType, Field, Fields};

use super::unsupported;
use crate::ingest::IngestError;
use crate::model::columns::{BigQueryType, GeographyEncoding, RangeElement};

pub(crate) const EXTENSION_NAME_KEY: &str = "ARROW:extension:name";
pub(crate) const EXTENSION_METADATA_KEY: &str = "ARROW:extension:metadata";
pub(crate) const BIGQUERY_TYPE_KEY: &str = "bigquery_type";
pub(crate) const JSON_EXTENSION: &str = "arrow.json";
pub(crate) const GEOARROW_WKB: &str = "geoarrow.wkb";
pub(crate) const GEOARROW_WKT: &str = "geoarrow.wkt";
/// The `start` and `end` fields of a RANGE struct, in this order.
pub(crate) const RANGE_FIELDS: [&str; 2] = ["start", "end"];

/// The BigQuery type a field's metadata asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Marked {
    Json,
    /// GEOGRAPHY; `Some` when a GeoArrow extension names the encoding.
    Geography(Option<GeographyEncoding>),
    Range,
}

impl Marked {
    /// What the canonical schema records of the mark, so a later batch must repeat it.
    pub(crate) fn canonical_name(self) -> &'static str {
        match self {
            Marked::Json => "JSON",
            Marked::Geography(Some(GeographyEncoding::Wkb)) => "geoarrow.wkb spherical",
            Marked::Geography(Some(GeographyEncoding::Wkt)) => "geoarrow.wkt spherical",
            Marked::Geography(Some(encoding)) if encoding.is_wkb() => GEOARROW_WKB,
            Marked::Geography(Some(_)) => GEOARROW_WKT,
            Marked::Geography(None) => "GEOGRAPHY",
            Marked::Range => "RANGE",
        }
    }
}

/// What `field`'s metadata asks for: `None` for nothing (or an extension type of no concern
/// here), an error for a `bigquery_type` it does not know or a GeoArrow encoding it cannot
/// stage.
pub(crate) fn marked(path: &str, field: &Field) -> Result<Option<Marked>, IngestError> {
    let metadata = field.metadata();
    let extension = metadata.get(EXTENSION_NAME_KEY).map(String::as_str);
    match extension {
        Some(JSON_EXTENSION) => return Ok(Some(Marked::Json)),
        Some(GEOARROW_WKB) => {
            let encoding =
                if spherical_edges(path, field)? { GeographyEncoding::Wkb } else { GeographyEncoding::PlanarWkb };
            return Ok(Some(Marked::Geography(Some(encoding))));
        }
        Some(GEOARROW_WKT) => {
            let encoding =
                if spherical_edges(path, field)? { GeographyEncoding::Wkt } else { GeographyEncoding::PlanarWkt };
            return Ok(Some(Marked::Geography(Some(encoding))));
        }
        Some(other) if other.starts_with("geoarrow.") => {
            return Err(unsupported(
                path,
                field.data_type(),
                format!("GeoArrow's {other} encoding is not supported; send geoarrow.wkb or geoarrow.wkt"),
            ));
        }
        _ => {}
    }
    let Some(asked) = metadata.get(BIGQUERY_TYPE_KEY) else { return Ok(None) };
    match asked.to_ascii_uppercase().as_str() {
        "JSON" => Ok(Some(Marked::Json)),
        "GEOGRAPHY" => Ok(Some(Marked::Geography(None))),
        "RANGE" => Ok(Some(Marked::Range)),
        _ => {
            let shown: String = asked.chars().take(40).collect();
            Err(unsupported(
                path,
                field.data_type(),
                format!("field metadata bigquery_type = {shown:?} is not one of JSON, GEOGRAPHY, RANGE"),
            ))
        }
    }
}

/// The longest `ARROW:extension:metadata` read. GeoArrow's is a few dozen bytes
/// (`{"edges": "spherical"}`), a few KiB with a PROJJSON `crs`; longer is refused unread.
pub(crate) const MAX_EXTENSION_METADATA_BYTES: usize = 64 * 1024;

/// Whether a GeoArrow field's extension metadata gives its edges as other than planar
/// (`"edges": "spherical"`, or one of the ellipsoidal algorithms, which BigQuery's sphere
/// approximates); absent or unreadable metadata means planar, GeoArrow's default. Only `edges`
/// is kept: every other member (the `crs`, whatever its size) is skipped as it is read.
fn spherical_edges(path: &str, field: &Field) -> Result<bool, IngestError> {
    #[derive(serde::Deserialize)]
    struct GeoArrowMetadata {
        edges: Option<String>,
    }
    let Some(text) = field.metadata().get(EXTENSION_METADATA_KEY) else { return Ok(false) };
    if text.len() > MAX_EXTENSION_METADATA_BYTES {
        return Err(unsupported(
            path,
            field.data_type(),
            format!(
                "its ARROW:extension:metadata is {} bytes, more than the {MAX_EXTENSION_METADATA_BYTES} read",
                text.len()
            ),
        ));
    }
    let edges = serde_json::from_str::<GeoArrowMetadata>(text).ok().and_then(|metadata| metadata.edges);
    Ok(edges.is_some_and(|edges| edges != "planar"))
}

fn is_string(data_type: &DataType) -> bool {
    matches!(data_type, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

fn is_binary(data_type: &DataType) -> bool {
    matches!(data_type, DataType::Binary | DataType::LargeBinary | DataType::BinaryView)
}

/// The type of a scalar field marked `marked`.
pub(crate) fn marked_scalar(path: &str, data_type: &DataType, marked: Marked) -> Result<BigQueryType, IngestError> {
    let geography = |encoding| Ok(BigQueryType::Geography(encoding));
    match marked {
        Marked::Json if is_string(data_type) => Ok(BigQueryType::Json),
        Marked::Json => Err(unsupported(path, data_type, "JSON columns must be strings")),
        Marked::Geography(None) if is_binary(data_type) => geography(GeographyEncoding::Wkb),
        Marked::Geography(Some(encoding)) if encoding.is_wkb() && is_binary(data_type) => geography(encoding),
        Marked::Geography(Some(encoding)) if !encoding.is_wkb() && is_string(data_type) => geography(encoding),
        Marked::Geography(None) if is_string(data_type) => geography(GeographyEncoding::WktOrGeoJson),
        Marked::Geography(_) => Err(unsupported(
            path,
            data_type,
            "GEOGRAPHY columns are binaries (WKB) or strings (WKT, or GeoJSON under bigquery_type)",
        )),
        Marked::Range => Err(unsupported(path, data_type, "RANGE columns are structs of start and end")),
    }
}

/// The RANGE a `Struct{start, end}` field marked RANGE becomes: both of one type, Date32
/// (RANGE<DATE>), Timestamp without a time zone (RANGE<DATETIME>) or with one (RANGE<TIMESTAMP>).
pub(crate) fn range_type(path: &str, data_type: &DataType, children: &Fields) -> Result<BigQueryType, IngestError> {
    let names: Vec<&str> = children.iter().map(|f| f.name().as_str()).collect();
    if names != RANGE_FIELDS {
        return Err(unsupported(path, data_type, "a RANGE struct has exactly the fields start and end, in this order"));
    }
    let (start, end) = (children[0].data_type(), children[1].data_type());
    if start != end {
        return Err(unsupported(path, data_type, "a RANGE's start and end have one type"));
    }
    let element = match start {
        DataType::Date32 => RangeElement::Date,
        DataType::Timestamp(_, None) => RangeElement::Datetime,
        DataType::Timestamp(_, Some(_)) => RangeElement::Timestamp,
        _ => {
            return Err(unsupported(
                path,
                data_type,
                "RANGE elements are Date32 (DATE), Timestamp without a time zone (DATETIME) or with one (TIMESTAMP)",
            ));
        }
    };
    Ok(BigQueryType::Range(element))
}
