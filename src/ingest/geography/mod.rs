//! GEOGRAPHY values checked at ingestion: each one must parse in its encoding (WKB, WKT or a
//! GeoJSON geometry) and hold longitude/latitude coordinates BigQuery accepts (finite,
//! longitude in [-180, 180], latitude in [-90, 90]: a projected geometry, such as one in
//! Web Mercator metres, is refused here, naming its row, rather than failing the publication).
//! The value is staged as sent; `publish::sql` constructs the GEOGRAPHY from it.
//!
//! What a check costs is bounded before it is paid: a value longer than one append can carry
//! is refused unread (`row_too_large`), WKT and GeoJSON are checked in one pass that keeps
//! nothing of the geometry ([`wkt_scan`], [`geojson_scan`]), and WKB is read in place (the
//! `wkb` reader indexes parts and rings, never copies coordinates).

mod geojson_scan;
mod wkt_scan;

pub(crate) use geojson_scan::check_geojson;
pub(crate) use wkt_scan::check_wkt;

use std::sync::Arc;

use arrow_array::builder::StringBuilder;
use arrow_array::cast::AsArray as _;
use arrow_array::{Array as _, ArrayRef};
use arrow_schema::DataType;

use geo_traits::{
    CoordTrait, GeometryCollectionTrait, GeometryTrait, GeometryType, LineStringTrait, LineTrait, MultiLineStringTrait,
    MultiPointTrait, MultiPolygonTrait, PointTrait, PolygonTrait, RectTrait, TriangleTrait,
};

use super::IngestError;
use super::scalars::{RowOf, cast_strict, invalid_value};
use crate::model::columns::GeographyEncoding;

/// The longest GEOGRAPHY value read: one append under the default request budget could not
/// carry a longer one, and its checks (a WKB value rewritten as WKT: about three times its
/// length) stay bounded per value whatever budget an operator sets
/// (`FILAMENT_MAX_APPEND_REQUEST_BYTES` may reach 19 MiB).
pub(crate) const MAX_GEOGRAPHY_VALUE_BYTES: usize = 9 * 1024 * 1024;

/// Why a value is not a geography BigQuery takes.
pub(crate) type GeographyProblem = String;

/// A GEOGRAPHY column's values as staged (BYTES for WKB, STRING otherwise), each checked.
pub(crate) fn stage_geographies(
    array: &ArrayRef,
    encoding: GeographyEncoding,
    path: &str,
    row_of: RowOf<'_>,
) -> Result<ArrayRef, IngestError> {
    let refuse = |index: usize, problem: GeographyProblem| invalid_value(path, row_of(index), problem);
    refuse_values_longer_than_an_append(array, row_of)?;
    if encoding == GeographyEncoding::PlanarWkb {
        return planar_wkb_as_wkt(array, path, row_of);
    }
    if encoding.is_wkb() {
        let staged = cast_strict(array, &DataType::Binary)?;
        for (index, value) in staged.as_binary::<i32>().iter().enumerate() {
            if let Some(bytes) = value {
                check_wkb(bytes).map_err(|problem| refuse(index, problem))?;
            }
        }
        return Ok(staged);
    }
    let check = if encoding == GeographyEncoding::WktOrGeoJson { check_text } else { check_wkt };
    let staged = cast_strict(array, &DataType::Utf8)?;
    for (index, value) in staged.as_string::<i32>().iter().enumerate() {
        if let Some(text) = value {
            check(text).map_err(|problem| refuse(index, problem))?;
        }
    }
    Ok(staged)
}

/// A value longer than [`MAX_GEOGRAPHY_VALUE_BYTES`] is refused before it is read, so no check
/// spends time or memory on it.
fn refuse_values_longer_than_an_append(array: &ArrayRef, row_of: RowOf<'_>) -> Result<(), IngestError> {
    let longest = |lengths: &mut dyn Iterator<Item = usize>| {
        lengths.enumerate().find(|&(_, len)| len > MAX_GEOGRAPHY_VALUE_BYTES)
    };
    let found = match array.data_type() {
        DataType::Utf8 => longest(&mut array.as_string::<i32>().offsets().lengths()),
        DataType::LargeUtf8 => longest(&mut array.as_string::<i64>().offsets().lengths()),
        DataType::Binary => longest(&mut array.as_binary::<i32>().offsets().lengths()),
        DataType::LargeBinary => longest(&mut array.as_binary::<i64>().offsets().lengths()),
        DataType::Utf8View => longest(&mut array.as_string_view().views().iter().map(|view| *view as u32 as usize)),
        DataType::BinaryView => longest(&mut array.as_binary_view().views().iter().map(|view| *view as u32 as usize)),
        _ => None,
    };
    match found {
        Some((index, row_bytes)) => {
            Err(IngestError::RowTooLarge { row: row_of(index), row_bytes, limit_bytes: MAX_GEOGRAPHY_VALUE_BYTES })
        }
        None => Ok(()),
    }
}

/// Planar WKB staged as WKT: Google's analyzer knows `planar => TRUE` on `ST_GEOGFROMTEXT`
/// only. Coordinates are written in the shortest text that reads back as the same double, so
/// the staged geometry is the one received.
fn planar_wkb_as_wkt(array: &ArrayRef, path: &str, row_of: RowOf<'_>) -> Result<ArrayRef, IngestError> {
    let binary = cast_strict(array, &DataType::Binary)?;
    let mut staged = StringBuilder::with_capacity(binary.len(), binary.get_buffer_memory_size() * 4);
    for (index, value) in binary.as_binary::<i32>().iter().enumerate() {
        let Some(bytes) = value else {
            staged.append_null();
            continue;
        };
        let refuse = |problem: GeographyProblem| invalid_value(path, row_of(index), problem);
        let geometry = wkb::reader::read_wkb(bytes).map_err(|e| refuse(format!("not valid WKB: {e}")))?;
        coordinates_in_range(&geometry).map_err(refuse)?;
        let mut text = String::new();
        wkt::to_wkt::write_geometry(&mut text, &geometry)
            .map_err(|e| refuse(format!("cannot be written as WKT: {e}")))?;
        staged.append_value(text);
    }
    Ok(Arc::new(staged.finish()))
}

/// A WKB value.
pub(crate) fn check_wkb(bytes: &[u8]) -> Result<(), GeographyProblem> {
    let geometry = wkb::reader::read_wkb(bytes).map_err(|e| format!("not valid WKB: {e}"))?;
    coordinates_in_range(&geometry)
}

/// Whether a text value is GeoJSON (it starts with `{`), as the publication tells them apart.
pub(crate) fn is_geojson(text: &str) -> bool {
    text.trim_start().starts_with('{')
}

/// WKT or GeoJSON, told apart by [`is_geojson`].
pub(crate) fn check_text(text: &str) -> Result<(), GeographyProblem> {
    if is_geojson(text) { check_geojson(text) } else { check_wkt(text) }
}

fn lon_lat(x: f64, y: f64) -> Result<(), GeographyProblem> {
    if (-180.0..=180.0).contains(&x) && (-90.0..=90.0).contains(&y) {
        Ok(())
    } else {
        Err(format!(
            "coordinate ({x}, {y}) is not a longitude in [-180, 180] and a latitude in [-90, 90]; \
             BigQuery GEOGRAPHY takes WGS84 longitude/latitude"
        ))
    }
}

fn coord_in_range(coord: &impl CoordTrait<T = f64>) -> Result<(), GeographyProblem> {
    lon_lat(coord.x(), coord.y())
}

fn line_in_range(line: &impl LineStringTrait<T = f64>) -> Result<(), GeographyProblem> {
    line.coords().try_for_each(|c| coord_in_range(&c))
}

fn polygon_in_range(polygon: &impl PolygonTrait<T = f64>) -> Result<(), GeographyProblem> {
    if let Some(exterior) = polygon.exterior() {
        line_in_range(&exterior)?;
    }
    polygon.interiors().try_for_each(|ring| line_in_range(&ring))
}

fn coordinates_in_range(geometry: &impl GeometryTrait<T = f64>) -> Result<(), GeographyProblem> {
    match geometry.as_type() {
        GeometryType::Point(point) => point.coord().map_or(Ok(()), |c| coord_in_range(&c)),
        GeometryType::LineString(line) => line_in_range(line),
        GeometryType::Polygon(polygon) => polygon_in_range(polygon),
        GeometryType::MultiPoint(points) => {
            points.points().try_for_each(|p| p.coord().map_or(Ok(()), |c| coord_in_range(&c)))
        }
        GeometryType::MultiLineString(lines) => lines.line_strings().try_for_each(|l| line_in_range(&l)),
        GeometryType::MultiPolygon(polygons) => polygons.polygons().try_for_each(|p| polygon_in_range(&p)),
        GeometryType::GeometryCollection(collection) => {
            collection.geometries().try_for_each(|g| coordinates_in_range(&g))
        }
        GeometryType::Rect(rect) => coord_in_range(&rect.min()).and_then(|()| coord_in_range(&rect.max())),
        GeometryType::Triangle(triangle) => triangle.coords().iter().try_for_each(coord_in_range),
        GeometryType::Line(line) => coord_in_range(&line.start()).and_then(|()| coord_in_range(&line.end())),
    }
}

#[cfg(test)]
mod tests {
    use std::str::FromStr as _;

    use super::*;

    /// `POINT(1 2)` as little-endian WKB.
    const POINT_WKB: &str = "0101000000000000000000f03f0000000000000040";

    #[test]
    fn each_encoding_parses_and_is_told_apart() {
        assert_eq!(check_wkb(&hex::decode(POINT_WKB).unwrap()), Ok(()));
        assert_eq!(check_text("POLYGON((0 0, 1 0, 1 1, 0 0))"), Ok(()));
        assert_eq!(check_text(r#" {"type": "LineString", "coordinates": [[1, 2], [3, 4]]}"#), Ok(()));
        assert_eq!(check_text("GEOMETRYCOLLECTION(POINT(1 2), LINESTRING(0 0, 1 1))"), Ok(()));
        assert!(is_geojson("\n {}") && !is_geojson("POINT(1 2)"));
    }

    #[test]
    fn planar_wkb_is_staged_as_wkt_of_the_same_doubles() {
        let point = hex::decode(POINT_WKB).unwrap();
        let odd = [-179.999_999_999_999_97, 0.1_f64 + 0.2];
        let mut line = vec![1u8, 2, 0, 0, 0, 2, 0, 0, 0];
        for value in [odd[0], odd[1], 0.0, 45.5] {
            line.extend(value.to_le_bytes());
        }
        let array: ArrayRef = Arc::new(arrow_array::BinaryArray::from(vec![Some(&point[..]), None, Some(&line[..])]));
        let staged = stage_geographies(&array, GeographyEncoding::PlanarWkb, "g", &|row| row).unwrap();
        let texts: Vec<Option<&str>> = staged.as_string::<i32>().iter().collect();
        assert_eq!(texts[0], Some("POINT(1 2)"));
        assert_eq!(texts[1], None);
        let parsed = wkt::Wkt::<f64>::from_str(texts[2].unwrap()).unwrap();
        let wkt::Wkt::LineString(parsed) = parsed else { panic!("{:?}", texts[2]) };
        let coords: Vec<(f64, f64)> = parsed.coords().iter().map(|c| (c.x, c.y)).collect();
        assert_eq!(coords, [(odd[0], odd[1]), (0.0, 45.5)], "bit for bit: {:?}", texts[2]);
    }

    #[test]
    fn malformed_values_and_projected_coordinates_are_refused() {
        assert!(check_wkb(&[1, 2, 3]).unwrap_err().starts_with("not valid WKB"));
        assert!(check_text("POINT(1 2").unwrap_err().starts_with("not valid WKT"));
        assert!(check_text("{\"type\": \"Point\"").unwrap_err().starts_with("not valid GeoJSON"));
        let feature = r#"{"type": "Feature", "geometry": null, "properties": {}}"#;
        assert!(check_text(feature).unwrap_err().contains("not a geometry"), "{:?}", check_text(feature));
        assert!(check_text("POINT(1113194.9 2273030.9)").unwrap_err().contains("longitude"));
        assert!(check_text("LINESTRING(0 0, 10 95)").is_err(), "latitude beyond the pole");
        assert!(check_text(r#"{"type": "Polygon", "coordinates": [[[0, 0], [181, 0], [0, 1], [0, 0]]]}"#).is_err());
        assert!(check_text("POINT(NaN 1)").is_err(), "NaN is not a longitude");
    }
}
