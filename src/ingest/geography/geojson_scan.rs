//! A GeoJSON geography checked as it is read (a serde visitor over the text): its `type`, the
//! nesting of its `coordinates` against that type, each position's longitude and latitude, and
//! a collection's `geometries`, while every other member (`bbox`, `properties`, any unknown
//! one, however long) is skipped unread. Nothing of the value is kept: a `Point` padded with a
//! long member costs no more than the `Point`.

use std::cell::RefCell;
use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::{GeographyProblem, lon_lat};

/// Arrays within arrays a geometry's coordinates may hold (a MultiPolygon's four).
const MAX_COORDINATE_NESTING: usize = 4;

/// A GeoJSON geometry (not a Feature or FeatureCollection, which BigQuery does not take).
pub(crate) fn check_geojson(text: &str) -> Result<(), GeographyProblem> {
    let coordinate_problem = RefCell::new(None);
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let read = ObjectSeed { coordinate_problem: &coordinate_problem }
        .deserialize(&mut deserializer)
        .and_then(|object| deserializer.end().map(|()| object));
    let object = match read {
        Ok(object) => object,
        Err(error) => return Err(coordinate_problem.take().unwrap_or_else(|| format!("not valid GeoJSON: {error}"))),
    };
    match object {
        Kind::Feature => Err("a GeoJSON Feature is not a geometry; send its geometry".into()),
        Kind::FeatureCollection => {
            Err("a GeoJSON FeatureCollection is not a geometry; send each feature's geometry".into())
        }
        _ => Ok(()),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Point,
    MultiPoint,
    LineString,
    MultiLineString,
    Polygon,
    MultiPolygon,
    GeometryCollection,
    Feature,
    FeatureCollection,
}

impl Kind {
    /// How many arrays deep its coordinates are (a Point's position is one).
    fn coordinate_nesting(self) -> Option<usize> {
        match self {
            Kind::Point => Some(1),
            Kind::MultiPoint | Kind::LineString => Some(2),
            Kind::MultiLineString | Kind::Polygon => Some(3),
            Kind::MultiPolygon => Some(4),
            Kind::GeometryCollection | Kind::Feature | Kind::FeatureCollection => None,
        }
    }
}

impl<'de> de::Deserialize<'de> for Kind {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KindVisitor;
        impl Visitor<'_> for KindVisitor {
            type Value = Kind;
            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("a GeoJSON type")
            }
            fn visit_str<E: de::Error>(self, name: &str) -> Result<Kind, E> {
                Ok(match name {
                    "Point" => Kind::Point,
                    "MultiPoint" => Kind::MultiPoint,
                    "LineString" => Kind::LineString,
                    "MultiLineString" => Kind::MultiLineString,
                    "Polygon" => Kind::Polygon,
                    "MultiPolygon" => Kind::MultiPolygon,
                    "GeometryCollection" => Kind::GeometryCollection,
                    "Feature" => Kind::Feature,
                    "FeatureCollection" => Kind::FeatureCollection,
                    _ => return Err(E::custom("its type is not a GeoJSON type")),
                })
            }
        }
        deserializer.deserialize_str(KindVisitor)
    }
}

/// The members read; any other is skipped.
enum Member {
    Type,
    Coordinates,
    Geometries,
    Other,
}

impl<'de> de::Deserialize<'de> for Member {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MemberVisitor;
        impl Visitor<'_> for MemberVisitor {
            type Value = Member;
            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("a member name")
            }
            fn visit_str<E: de::Error>(self, name: &str) -> Result<Member, E> {
                Ok(match name {
                    "type" => Member::Type,
                    "coordinates" => Member::Coordinates,
                    "geometries" => Member::Geometries,
                    _ => Member::Other,
                })
            }
        }
        deserializer.deserialize_identifier(MemberVisitor)
    }
}

/// Where a coordinate out of range is put, so it is reported as itself rather than as JSON.
type ProblemSlot<'p> = &'p RefCell<Option<GeographyProblem>>;

fn coordinate_problem<E: de::Error>(slot: ProblemSlot<'_>, problem: GeographyProblem) -> E {
    let error = E::custom(&problem);
    slot.replace(Some(problem));
    error
}

/// One GeoJSON object: what it is, once its members are read and checked.
#[derive(Clone, Copy)]
struct ObjectSeed<'p> {
    coordinate_problem: ProblemSlot<'p>,
}

impl<'de> DeserializeSeed<'de> for ObjectSeed<'_> {
    type Value = Kind;
    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Kind, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ObjectSeed<'_> {
    type Value = Kind;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a GeoJSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut members: A) -> Result<Kind, A::Error> {
        let (mut kind, mut coordinates, mut has_geometries) = (None, None, false);
        while let Some(member) = members.next_key::<Member>()? {
            match member {
                Member::Type => kind = Some(members.next_value::<Kind>()?),
                Member::Coordinates => {
                    let seed = CoordinatesSeed { nesting: 1, coordinate_problem: self.coordinate_problem };
                    coordinates = Some(members.next_value_seed(seed)?);
                }
                Member::Geometries => {
                    members.next_value_seed(GeometriesSeed(self))?;
                    has_geometries = true;
                }
                Member::Other => {
                    members.next_value::<IgnoredAny>()?;
                }
            }
        }
        let Some(kind) = kind else { return Err(de::Error::custom("it has no type member")) };
        match (kind.coordinate_nesting(), coordinates) {
            (Some(_), None) => Err(de::Error::custom("a geometry without coordinates")),
            (Some(expected), Some(shape)) if !shape.fits(expected) => {
                Err(de::Error::custom("its coordinates do not nest as its type's do"))
            }
            (None, _) if kind == Kind::GeometryCollection && !has_geometries => {
                Err(de::Error::custom("a GeometryCollection without geometries"))
            }
            _ => Ok(kind),
        }
    }
}

/// A GeometryCollection's `geometries`: an array of geometries (not Features).
struct GeometriesSeed<'p>(ObjectSeed<'p>);

impl<'de> DeserializeSeed<'de> for GeometriesSeed<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for GeometriesSeed<'_> {
    type Value = ();

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("an array of GeoJSON geometries")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut geometries: A) -> Result<(), A::Error> {
        while let Some(kind) = geometries.next_element_seed(self.0)? {
            if matches!(kind, Kind::Feature | Kind::FeatureCollection) {
                return Err(de::Error::custom("a GeometryCollection holds geometries, not features"));
            }
        }
        Ok(())
    }
}

/// How deep a coordinates array nests: exactly, once a position is found in it, or at least
/// (an empty array, or arrays of empty arrays, say nothing of what they would have held).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shape {
    nesting: usize,
    exact: bool,
}

impl Shape {
    fn fits(self, expected: usize) -> bool {
        if self.exact { self.nesting == expected } else { self.nesting <= expected && expected > 1 }
    }

    /// Two elements of one array: their positions must be as deep as each other.
    fn with(self, other: Shape) -> Option<Shape> {
        match (self.exact, other.exact) {
            (true, true) => (self.nesting == other.nesting).then_some(self),
            (true, false) => (other.nesting <= self.nesting).then_some(self),
            (false, true) => (self.nesting <= other.nesting).then_some(other),
            (false, false) => Some(Shape { nesting: self.nesting.max(other.nesting), exact: false }),
        }
    }
}

/// A coordinates array `nesting` arrays deep: numbers (a position) or arrays, never both.
#[derive(Clone, Copy)]
struct CoordinatesSeed<'p> {
    nesting: usize,
    coordinate_problem: ProblemSlot<'p>,
}

/// An element of a coordinates array.
enum Element {
    Number(f64),
    Array(Shape),
}

impl<'de> DeserializeSeed<'de> for CoordinatesSeed<'_> {
    type Value = Shape;
    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Shape, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for CoordinatesSeed<'_> {
    type Value = Shape;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("an array of coordinates")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut elements: A) -> Result<Shape, A::Error> {
        if self.nesting > MAX_COORDINATE_NESTING {
            return Err(de::Error::custom("coordinates nest deeper than a MultiPolygon's"));
        }
        let (mut numbers, mut longitude, mut latitude) = (0usize, 0.0, 0.0);
        let mut inner: Option<Shape> = None;
        while let Some(element) = elements.next_element_seed(ElementSeed(self))? {
            match element {
                Element::Number(_) if inner.is_some() => return Err(mixed()),
                Element::Array(_) if numbers > 0 => return Err(mixed()),
                Element::Number(value) => {
                    match numbers {
                        0 => longitude = value,
                        1 => latitude = value,
                        _ => {}
                    }
                    numbers += 1;
                }
                Element::Array(shape) => match inner.map_or(Some(shape), |seen| seen.with(shape)) {
                    Some(combined) => inner = Some(combined),
                    None => return Err(de::Error::custom("positions at different depths")),
                },
            }
        }
        if numbers == 1 {
            return Err(de::Error::custom("a position has fewer than two numbers"));
        }
        if numbers >= 2 {
            return match lon_lat(longitude, latitude) {
                Ok(()) => Ok(Shape { nesting: 1, exact: true }),
                Err(problem) => Err(coordinate_problem(self.coordinate_problem, problem)),
            };
        }
        Ok(match inner {
            Some(shape) => Shape { nesting: shape.nesting + 1, exact: shape.exact },
            None => Shape { nesting: 1, exact: false },
        })
    }
}

fn mixed<E: de::Error>() -> E {
    E::custom("a coordinates array mixes numbers and arrays")
}

/// One element of a coordinates array, read as a number or as a deeper array.
struct ElementSeed<'p>(CoordinatesSeed<'p>);

impl<'de> DeserializeSeed<'de> for ElementSeed<'_> {
    type Value = Element;
    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Element, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ElementSeed<'_> {
    type Value = Element;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a number or an array of coordinates")
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<Element, E> {
        Ok(Element::Number(value))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Element, E> {
        Ok(Element::Number(value as f64))
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Element, E> {
        Ok(Element::Number(value as f64))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, elements: A) -> Result<Element, A::Error> {
        let deeper = CoordinatesSeed { nesting: self.0.nesting + 1, ..self.0 };
        deeper.visit_seq(elements).map(Element::Array)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Geometries the `geojson` crate reads, and so must this.
    const READ: [&str; 9] = [
        r#"{"type": "Point", "coordinates": [1, 2]}"#,
        r#"{"coordinates": [1.5, -2, 7], "type": "Point"}"#,
        r#"{"type": "LineString", "coordinates": [[1, 2], [3, 4]], "bbox": [1, 2, 3, 4]}"#,
        r#"{"type": "MultiPoint", "coordinates": []}"#,
        r#"{"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [1, 1], [0, 0]], []]}"#,
        r#"{"type": "MultiLineString", "coordinates": [[[0, 0], [1, 1]]]}"#,
        r#"{"type": "MultiPolygon", "coordinates": [[[[0, 0], [1, 0], [1, 1], [0, 0]]]]}"#,
        r#"{"type": "GeometryCollection", "geometries": [{"type": "Point", "coordinates": [1, 2]}]}"#,
        r#"{"type": "GeometryCollection", "geometries": [], "foreign": {"a": [1, "b", null]}}"#,
    ];

    /// Texts the `geojson` crate refuses as geometries, and so must this.
    const REFUSED: [&str; 10] = [
        r#"{"type": "Point""#,
        r#"{"type": "Point", "coordinates": [1]}"#,
        r#"{"type": "Point", "coordinates": [[1, 2]]}"#,
        r#"{"type": "LineString", "coordinates": [1, 2]}"#,
        r#"{"type": "Polygon", "coordinates": [[1, 2]]}"#,
        r#"{"type": "Circle", "coordinates": [1, 2]}"#,
        r#"{"coordinates": [1, 2]}"#,
        r#"{"type": "Point", "coordinates": ["1", 2]}"#,
        r#"{"type": "GeometryCollection"}"#,
        r#"[1, 2]"#,
    ];

    #[test]
    fn reads_what_the_geojson_crate_reads_and_refuses_what_it_refuses() {
        for text in READ {
            assert!(matches!(text.parse::<geojson::GeoJson>(), Ok(geojson::GeoJson::Geometry(_))), "{text}");
            assert_eq!(check_geojson(text), Ok(()), "{text}");
        }
        for text in REFUSED {
            assert!(text.parse::<geojson::GeoJson>().is_err(), "the crate refuses {text}");
            let problem = check_geojson(text).expect_err(text);
            assert!(problem.starts_with("not valid GeoJSON: "), "{text}: {problem}");
        }
    }

    #[test]
    fn features_are_named_and_positions_out_of_range_reported_as_such() {
        let feature = r#"{"type": "Feature", "geometry": null, "properties": {}}"#;
        assert!(check_geojson(feature).unwrap_err().contains("Feature is not a geometry"));
        let collection = r#"{"type": "FeatureCollection", "features": []}"#;
        assert!(check_geojson(collection).unwrap_err().contains("FeatureCollection is not a geometry"));
        let inner = r#"{"type": "GeometryCollection", "geometries": [{"type": "Feature", "geometry": null}]}"#;
        assert!(check_geojson(inner).is_err());
        let far = r#"{"type": "Polygon", "coordinates": [[[0, 0], [181, 0], [0, 1], [0, 0]]]}"#;
        let problem = check_geojson(far).unwrap_err();
        assert!(problem.starts_with("coordinate (181, 0)") && problem.contains("longitude"), "{problem}");
    }

    #[test]
    fn a_long_unknown_member_is_skipped_and_deep_nesting_refused() {
        let padded = format!(r#"{{"type": "Point", "pad": "{}", "coordinates": [1, 2]}}"#, "x".repeat(1 << 20));
        assert_eq!(check_geojson(&padded), Ok(()));
        let deep = format!(r#"{{"type": "Point", "coordinates": {}1{}}}"#, "[".repeat(10_000), "]".repeat(10_000));
        assert!(check_geojson(&deep).unwrap_err().starts_with("not valid GeoJSON"));
        let collections = format!(
            r#"{}{{"type": "Point", "coordinates": [1, 2]}}{}"#,
            r#"{"type": "GeometryCollection", "geometries": ["#.repeat(10_000),
            "]}".repeat(10_000)
        );
        assert!(check_geojson(&collections).unwrap_err().contains("recursion limit"), "serde_json's bound holds");
    }
}
