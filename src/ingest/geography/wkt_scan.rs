//! A WKT geography checked in one pass over its text, holding nothing but the nesting of the
//! geometry collections it is in: the grammar the `wkt` crate reads (a type word, optionally
//! with `Z`, `M` or `ZM` joined or apart, then `EMPTY` or its parenthesised body), each
//! coordinate's longitude and latitude checked as it is read. A whole tree of a 9 MiB
//! `LINESTRING` would take about fifteen times its text; this takes none of it.

use super::{GeographyProblem, lon_lat};

/// How deep geometry collections may nest within each other.
pub(super) const MAX_WKT_NESTING: usize = 64;

/// A WKT value: a geometry, then nothing but white space.
pub(crate) fn check_wkt(text: &str) -> Result<(), GeographyProblem> {
    let mut scanner = Scanner { text, at: 0 };
    scanner.geometry(0).map_err(|problem| problem.shown())?;
    match scanner.next() {
        Token::End => Ok(()),
        _ => Err(Problem::Syntax("text follows the geometry").shown()),
    }
}

/// Why a WKT value is refused: its syntax, or a coordinate out of range (reported as is).
enum Problem {
    Syntax(&'static str),
    Coordinate(GeographyProblem),
}

impl Problem {
    fn shown(self) -> GeographyProblem {
        match self {
            Problem::Syntax(what) => format!("not valid WKT: {what}"),
            Problem::Coordinate(problem) => problem,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token<'a> {
    Open,
    Close,
    Comma,
    /// Text that starts like a number (a digit, `.`, `-` or `+`), as the `wkt` crate reads them.
    Number(&'a str),
    Word(&'a str),
    End,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Point,
    LineString,
    Polygon,
    MultiPoint,
    MultiLineString,
    MultiPolygon,
    GeometryCollection,
}

/// The type words; each may end in `Z`, `M` or `ZM` (`POINTZ`), as the `wkt` crate reads them.
const KINDS: [(&str, Kind); 7] = [
    ("POINT", Kind::Point),
    ("LINESTRING", Kind::LineString),
    ("POLYGON", Kind::Polygon),
    ("MULTIPOINT", Kind::MultiPoint),
    ("MULTILINESTRING", Kind::MultiLineString),
    ("MULTIPOLYGON", Kind::MultiPolygon),
    ("GEOMETRYCOLLECTION", Kind::GeometryCollection),
];

/// How many numbers a coordinate has after a dimension word (`Z`, `M`, `ZM`).
fn numbers_after(word: &[u8]) -> Option<usize> {
    if word.eq_ignore_ascii_case(b"Z") || word.eq_ignore_ascii_case(b"M") {
        Some(3)
    } else if word.eq_ignore_ascii_case(b"ZM") {
        Some(4)
    } else {
        None
    }
}

/// The geometry type a word names and, when the word carries its dimension, the numbers per
/// coordinate.
fn kind_of(word: &str) -> Result<(Kind, Option<usize>), Problem> {
    let word = word.as_bytes();
    for (name, kind) in KINDS {
        let Some((head, suffix)) = word.split_at_checked(name.len()) else { continue };
        if !head.eq_ignore_ascii_case(name.as_bytes()) {
            continue;
        }
        if suffix.is_empty() {
            return Ok((kind, None));
        }
        if let Some(numbers) = numbers_after(suffix) {
            return Ok((kind, Some(numbers)));
        }
    }
    Err(Problem::Syntax("expected a geometry type (POINT, LINESTRING, POLYGON, MULTI..., GEOMETRYCOLLECTION)"))
}

fn is_white_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\n' | b'\r' | b'\t')
}

struct Scanner<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Scanner<'a> {
    /// The next token and where it ends, without taking it.
    fn peek(&self) -> (Token<'a>, usize) {
        let bytes = self.text.as_bytes();
        let mut start = self.at;
        while bytes.get(start).is_some_and(|&b| is_white_space(b)) {
            start += 1;
        }
        let Some(&first) = bytes.get(start) else { return (Token::End, start) };
        match first {
            b'(' => (Token::Open, start + 1),
            b')' => (Token::Close, start + 1),
            b',' => (Token::Comma, start + 1),
            _ => {
                let mut end = start + 1;
                while bytes.get(end).is_some_and(|&b| !is_white_space(b) && !matches!(b, b'(' | b')' | b',')) {
                    end += 1;
                }
                // `start` and `end` sit next to ASCII bytes (or at the ends), so on char boundaries.
                let text = &self.text[start..end];
                let token = if first.is_ascii_digit() || matches!(first, b'.' | b'-' | b'+') {
                    Token::Number(text)
                } else {
                    Token::Word(text)
                };
                (token, end)
            }
        }
    }

    fn next(&mut self) -> Token<'a> {
        let (token, end) = self.peek();
        self.at = end;
        token
    }

    fn geometry(&mut self, depth: usize) -> Result<(), Problem> {
        if depth > MAX_WKT_NESTING {
            return Err(Problem::Syntax("geometry collections nest deeper than 64 levels"));
        }
        let Token::Word(word) = self.next() else {
            return Err(Problem::Syntax("expected a geometry type"));
        };
        let (kind, joined_numbers) = kind_of(word)?;
        let numbers = match (joined_numbers, self.peek().0) {
            (Some(numbers), _) => numbers,
            (None, Token::Word(dimension)) => match numbers_after(dimension.as_bytes()) {
                Some(numbers) => {
                    self.next();
                    numbers
                }
                None if dimension.eq_ignore_ascii_case("EMPTY") => 2,
                None => return Err(Problem::Syntax("unexpected word before the opening parenthesis")),
            },
            (None, _) => 2,
        };
        self.parenthesised(|scanner| scanner.body(kind, numbers, depth))
    }

    fn body(&mut self, kind: Kind, numbers: usize, depth: usize) -> Result<(), Problem> {
        match kind {
            Kind::Point => self.coordinate(numbers),
            Kind::LineString => self.coordinates(numbers),
            Kind::Polygon | Kind::MultiLineString => {
                self.comma_separated(|scanner| scanner.parenthesised(|scanner| scanner.coordinates(numbers)))
            }
            Kind::MultiPoint => self.comma_separated(|scanner| {
                if scanner.peek().0 == Token::Open {
                    scanner.parenthesised(|scanner| scanner.coordinate(numbers))
                } else {
                    scanner.coordinate(numbers)
                }
            }),
            Kind::MultiPolygon => self.comma_separated(|scanner| {
                scanner.parenthesised(|scanner| {
                    scanner.comma_separated(|scanner| scanner.parenthesised(|scanner| scanner.coordinates(numbers)))
                })
            }),
            Kind::GeometryCollection => self.comma_separated(|scanner| scanner.geometry(depth + 1)),
        }
    }

    /// `EMPTY`, or `(` what `body` reads `)`.
    fn parenthesised(&mut self, body: impl FnOnce(&mut Self) -> Result<(), Problem>) -> Result<(), Problem> {
        match self.next() {
            Token::Open => {}
            Token::Word(word) if word.eq_ignore_ascii_case("EMPTY") => return Ok(()),
            _ => return Err(Problem::Syntax("missing an opening parenthesis")),
        }
        body(self)?;
        match self.next() {
            Token::Close => Ok(()),
            _ => Err(Problem::Syntax("missing a closing parenthesis")),
        }
    }

    /// One or more of what `item` reads, separated by commas.
    fn comma_separated(&mut self, mut item: impl FnMut(&mut Self) -> Result<(), Problem>) -> Result<(), Problem> {
        item(self)?;
        while self.peek().0 == Token::Comma {
            self.next();
            item(self)?;
        }
        Ok(())
    }

    fn coordinates(&mut self, numbers: usize) -> Result<(), Problem> {
        self.comma_separated(|scanner| scanner.coordinate(numbers))
    }

    /// A coordinate of `numbers` numbers, its first two a longitude and latitude BigQuery takes.
    fn coordinate(&mut self, numbers: usize) -> Result<(), Problem> {
        let longitude = self.number()?;
        let latitude = self.number()?;
        for _ in 2..numbers {
            self.number()?;
        }
        lon_lat(longitude, latitude).map_err(Problem::Coordinate)
    }

    fn number(&mut self) -> Result<f64, Problem> {
        match self.next() {
            Token::Number(text) => text.parse().map_err(|_| Problem::Syntax("a coordinate is not a number")),
            _ => Err(Problem::Syntax("expected a number")),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::str::FromStr as _;

    use super::*;

    /// Texts the `wkt` crate reads, and so must this.
    const READ: [&str; 16] = [
        "POINT(1 2)",
        "point ( 1.5 -2e1 )",
        "POINT EMPTY",
        "POINT Z (1 2 3)",
        "POINTZM(1 2 3 4)",
        "POINT M (1 2 3)",
        "LINESTRING(0 0, 1 1,2 2)",
        "\tLINESTRING\n(0 0,\r\n1 1)  ",
        "POLYGON((0 0, 1 0, 1 1, 0 0), (0.1 0.1, 0.2 0.1, 0.1 0.1))",
        "POLYGON(EMPTY)",
        "MULTIPOINT((1 2), (3 4))",
        "MULTIPOINT(1 2, 3 4)",
        "MULTILINESTRING((0 0, 1 1), EMPTY)",
        "MULTIPOLYGON(((0 0, 1 0, 1 1, 0 0)), ((2 2, 3 2, 3 3, 2 2)))",
        "GEOMETRYCOLLECTION(POINT(1 2), LINESTRING Z (0 0 0, 1 1 1), GEOMETRYCOLLECTION EMPTY)",
        "MULTIPOLYGON EMPTY",
    ];

    /// Texts the `wkt` crate refuses, and so must this.
    const REFUSED: [&str; 12] = [
        "",
        "POINT(1 2",
        "POINT(1)",
        "POINT(1 2 3)",
        "POINT Z (1 2)",
        "POINT(NaN 1)",
        "CIRCLE(1 2)",
        "POINT X (1 2)",
        "LINESTRING(0 0,, 1 1)",
        "POLYGON(0 0, 1 1)",
        "MULTIPOINT(EMPTY, 1 2)",
        "GEOMETRYCOLLECTION((1 2))",
    ];

    #[test]
    fn reads_what_the_wkt_crate_reads_and_refuses_what_it_refuses() {
        for text in READ {
            assert!(wkt::Wkt::<f64>::from_str(text).is_ok(), "the crate reads {text:?}");
            assert_eq!(check_wkt(text), Ok(()), "{text:?}");
        }
        for text in REFUSED {
            assert!(wkt::Wkt::<f64>::from_str(text).is_err(), "the crate refuses {text:?}");
            let problem = check_wkt(text).expect_err(text);
            assert!(problem.starts_with("not valid WKT: "), "{text:?}: {problem}");
        }
    }

    #[test]
    fn text_after_the_geometry_and_non_ascii_words_are_refused_without_panicking() {
        assert!(check_wkt("POINT(1 2) POINT(3 4)").unwrap_err().contains("text follows"));
        assert!(check_wkt("POINTé(1 2)").is_err());
        assert!(check_wkt("é").is_err());
        assert!(check_wkt("POINT(1 2é)").is_err());
    }

    #[test]
    fn coordinates_out_of_range_are_reported_as_such() {
        let problem = check_wkt("LINESTRING(0 0, 10 95)").unwrap_err();
        assert!(problem.contains("latitude in [-90, 90]") && !problem.starts_with("not valid"), "{problem}");
        assert!(check_wkt("POINT(-inf 0)").unwrap_err().contains("longitude"));
        assert!(check_wkt("MULTIPOINT((181 0))").is_err());
    }

    #[test]
    fn collections_nest_at_most_sixty_four_deep() {
        let nested =
            |levels: usize| format!("{}POINT(1 2){}", "GEOMETRYCOLLECTION(".repeat(levels), ")".repeat(levels));
        assert_eq!(check_wkt(&nested(MAX_WKT_NESTING)), Ok(()));
        assert!(check_wkt(&nested(MAX_WKT_NESTING + 1)).unwrap_err().contains("nest deeper"));
        assert!(check_wkt(&nested(100_000)).unwrap_err().contains("nest deeper"), "no stack overflow");
    }

    #[test]
    fn a_long_line_is_read_in_one_pass() {
        let mut text = String::from("LINESTRING(0 0");
        for _ in 0..200_000 {
            text.push_str(",1.25 -3.5");
        }
        text.push(')');
        assert_eq!(check_wkt(&text), Ok(()));
    }
}
