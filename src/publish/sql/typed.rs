//! The expressions that turn a staged scalar into its destination type: lossless strings into
//! NUMERIC, BIGNUMERIC, TIME, JSON, RANGE and INTERVAL, and the geometry a client sent into a
//! GEOGRAPHY with BigQuery's own constructors.
//!
//! GEOGRAPHY constructors take the edges the column declares: planar for GeoArrow columns
//! unless their metadata says spherical (`planar => TRUE`: BigQuery follows the straight lines
//! of the source's plane), geodesic for columns marked `bigquery_type` (BigQuery's default,
//! and the only reading GeoJSON has). None repairs (`make_valid => FALSE`), so the published
//! value is the geometry sent, never a silently altered one; ingestion already refused what
//! does not parse or lies outside longitude/latitude (`ingest::geography`).
//!
//! RANGE is staged as its literal, `[2024-01-01, UNBOUNDED)`, and rebuilt with the `RANGE`
//! constructor from its bounds rather than `CAST(... AS RANGE<T>)`, which the emulator runs only
//! on literals.
//!
//! INTERVAL is staged as `months days microseconds` (three exact integers) and rebuilt as the
//! sum of `INTERVAL n MONTH`, `INTERVAL n DAY` and `INTERVAL n MICROSECOND`: BigQuery builds each
//! part exactly, and the emulator, which can neither `CAST` a string to INTERVAL nor take
//! `MAKE_INTERVAL` of anything but literals (`docs/testing.md`), runs it too.

use crate::model::columns::{BigQueryType, GeographyEncoding};

/// `expr`, a staged value of a top-level or nested scalar of type `bigquery_type`, as that type.
pub(super) fn from_staged(expr: &str, bigquery_type: &BigQueryType) -> String {
    match bigquery_type {
        BigQueryType::Numeric => format!("PARSE_NUMERIC({expr})"),
        BigQueryType::BigNumeric => format!("PARSE_BIGNUMERIC({expr})"),
        BigQueryType::Time => format!("CAST({expr} AS TIME)"),
        BigQueryType::Json => format!("PARSE_JSON({expr})"),
        BigQueryType::Range(element) => range(expr, element.type_name()),
        BigQueryType::Interval => interval(expr),
        BigQueryType::Geography(GeographyEncoding::Wkb) => format!("ST_GEOGFROMWKB({expr})"),
        BigQueryType::Geography(GeographyEncoding::Wkt) => format!("ST_GEOGFROMTEXT({expr})"),
        // Planar WKB is staged as its WKT (`ingest::geography`).
        BigQueryType::Geography(GeographyEncoding::PlanarWkt | GeographyEncoding::PlanarWkb) => {
            format!("ST_GEOGFROMTEXT({expr}, planar => TRUE)")
        }
        BigQueryType::Geography(GeographyEncoding::WktOrGeoJson) => {
            format!("IF(STARTS_WITH(LTRIM({expr}), '{{'), ST_GEOGFROMGEOJSON({expr}), ST_GEOGFROMTEXT({expr}))")
        }
        // Staged in its own type: only a cast into a wider destination column, if any.
        _ => expr.to_string(),
    }
}

/// A RANGE from its staged literal `[start, end)` (`UNBOUNDED` for an open bound), built with
/// the `RANGE` constructor from its two bounds.
fn range(expr: &str, element: &str) -> String {
    let bound = |i: usize| {
        format!(
            "CAST(NULLIF(SPLIT(SUBSTR({expr}, 2, LENGTH({expr}) - 2), ', ')[OFFSET({i})], 'UNBOUNDED') AS {element})"
        )
    };
    format!("IF({expr} IS NULL, NULL, RANGE({}, {}))", bound(0), bound(1))
}

/// An INTERVAL from its staged `months days microseconds`.
fn interval(expr: &str) -> String {
    let part = |i: usize| format!("CAST(SPLIT({expr}, ' ')[OFFSET({i})] AS INT64)");
    format!(
        "IF({expr} IS NULL, NULL, INTERVAL {} MONTH + INTERVAL {} DAY + INTERVAL {} MICROSECOND)",
        part(0),
        part(1),
        part(2)
    )
}
