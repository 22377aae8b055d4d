//! Key ranges: the smallest and largest staged value of each key column of a batch, recorded
//! with its receipt at ingestion. A keyed publication's MERGE bounds the destination side with
//! `T.k BETWEEN min AND max` over every batch's ranges: implied by the join (`T.k = S.k`), so
//! always safe, and what lets BigQuery prune partitions and clustered blocks instead of scanning
//! the whole destination. Only types whose order the gateway and BigQuery agree on get a range
//! (and at publication a STRING column the destination compares under a collation, `und:ci`,
//! gets none).

use std::cmp::Ordering;

use chrono::{DateTime, NaiveDate};
use serde::{Deserialize, Serialize};

/// One key value, in its column's type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "value", rename_all = "snake_case")]
pub enum KeyValue {
    Int64(i64),
    /// Compared by UTF-8 bytes, which is BigQuery's (code point) order.
    String(String),
    /// Days since the epoch.
    Date(i32),
    /// Microseconds since the epoch, no zone.
    Datetime(i64),
    /// Microseconds since the epoch, UTC.
    Timestamp(i64),
}

impl KeyValue {
    /// The order of two values of the same type; `None` across types.
    fn compare(&self, other: &KeyValue) -> Option<Ordering> {
        match (self, other) {
            (KeyValue::Int64(a), KeyValue::Int64(b)) => Some(a.cmp(b)),
            (KeyValue::String(a), KeyValue::String(b)) => Some(a.as_bytes().cmp(b.as_bytes())),
            (KeyValue::Date(a), KeyValue::Date(b)) => Some(a.cmp(b)),
            (KeyValue::Datetime(a), KeyValue::Datetime(b)) | (KeyValue::Timestamp(a), KeyValue::Timestamp(b)) => {
                Some(a.cmp(b))
            }
            _ => None,
        }
    }

    /// The value as a GoogleSQL literal of its type; `None` when it cannot be written as one
    /// (a date or time outside chrono's range): the column then gets no bound.
    pub(crate) fn sql_literal(&self) -> Option<String> {
        Some(match self {
            KeyValue::Int64(v) => v.to_string(),
            KeyValue::String(v) => string_literal(v),
            KeyValue::Date(days) => {
                let date = NaiveDate::from_num_days_from_ce_opt(days.checked_add(719_163)?)?;
                format!("DATE '{}'", date.format("%Y-%m-%d"))
            }
            KeyValue::Datetime(micros) => {
                let at = DateTime::from_timestamp_micros(*micros)?.naive_utc();
                format!("DATETIME '{}'", at.format("%Y-%m-%d %H:%M:%S%.6f"))
            }
            KeyValue::Timestamp(micros) => {
                let at = DateTime::from_timestamp_micros(*micros)?;
                format!("TIMESTAMP '{}'", at.format("%Y-%m-%d %H:%M:%S%.6f+00"))
            }
        })
    }
}

/// A GoogleSQL string literal: quotes and backslashes escaped, control characters as `\xHH`.
pub(crate) fn string_literal(value: &str) -> String {
    let mut literal = String::with_capacity(value.len() + 2);
    literal.push('\'');
    for c in value.chars() {
        match c {
            '\\' => literal.push_str("\\\\"),
            '\'' => literal.push_str("\\'"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => literal.push_str(&format!("\\x{:02x}", c as u32)),
            c => literal.push(c),
        }
    }
    literal.push('\'');
    literal
}

/// The staged values of one key column lie between `min` and `max` (both included).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRange {
    pub column: String,
    pub min: KeyValue,
    pub max: KeyValue,
}

impl KeyRange {
    /// Widens this range to cover `other` (same column and type); `false` when they differ.
    pub(crate) fn widen(&mut self, other: &KeyRange) -> bool {
        if self.column != other.column {
            return false;
        }
        match (other.min.compare(&self.min), other.max.compare(&self.max)) {
            (Some(low), Some(high)) => {
                if low == Ordering::Less {
                    self.min = other.min.clone();
                }
                if high == Ordering::Greater {
                    self.max = other.max.clone();
                }
                true
            }
            _ => false,
        }
    }
}

/// The ranges that cover every batch: a key column gets a range only when every batch has one.
/// `batches` holds each batch's ranges (`None`: a batch recorded without ranges).
pub(crate) fn covering_ranges<'a>(mut batches: impl Iterator<Item = Option<&'a [KeyRange]>>) -> Vec<KeyRange> {
    let Some(Some(first)) = batches.next() else { return Vec::new() };
    let mut covering: Vec<KeyRange> = first.to_vec();
    for batch in batches {
        let Some(ranges) = batch else { return Vec::new() };
        covering.retain_mut(|range| ranges.iter().any(|other| other.column == range.column && range.widen(other)));
    }
    covering
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int_range(column: &str, min: i64, max: i64) -> KeyRange {
        KeyRange { column: column.into(), min: KeyValue::Int64(min), max: KeyValue::Int64(max) }
    }

    #[test]
    fn covering_ranges_widen_over_batches_and_drop_columns_some_batch_lacks() {
        let a = [int_range("id", 5, 9), int_range("tenant", 1, 1)];
        let b = [int_range("id", -3, 6)];
        assert_eq!(covering_ranges([Some(&a[..]), Some(&b[..])].into_iter()), vec![int_range("id", -3, 9)]);
        assert!(covering_ranges([Some(&a[..]), None].into_iter()).is_empty(), "a batch without ranges");
        assert!(covering_ranges(std::iter::empty()).is_empty());
    }

    #[test]
    fn literals_are_typed_and_strings_escaped() {
        let literal = |value: KeyValue| value.sql_literal().unwrap();
        assert_eq!(literal(KeyValue::Int64(-42)), "-42");
        assert_eq!(literal(KeyValue::String("it's a \\ \n".into())), "'it\\'s a \\\\ \\x0a'");
        assert_eq!(literal(KeyValue::Date(19_723)), "DATE '2024-01-01'");
        assert_eq!(literal(KeyValue::Datetime(1_704_067_200_000_001)), "DATETIME '2024-01-01 00:00:00.000001'");
        assert_eq!(literal(KeyValue::Timestamp(0)), "TIMESTAMP '1970-01-01 00:00:00.000000+00'");
        assert_eq!(KeyValue::Date(i32::MAX).sql_literal(), None, "no literal, so no bound");
    }

    #[test]
    fn strings_order_by_bytes() {
        let mut range =
            KeyRange { column: "k".into(), min: KeyValue::String("b".into()), max: KeyValue::String("b".into()) };
        let other =
            KeyRange { column: "k".into(), min: KeyValue::String("B".into()), max: KeyValue::String("é".into()) };
        assert!(range.widen(&other));
        assert_eq!((range.min, range.max), (KeyValue::String("B".into()), KeyValue::String("é".into())));
    }
}
