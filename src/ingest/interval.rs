//! INTERVAL values: Arrow's `Interval(MonthDayNano)`, `Interval(YearMonth)`, `Interval(DayTime)`
//! and `Duration` (any unit) staged as `months days microseconds`, three exact integers the
//! publication rebuilds the INTERVAL from (`publish::sql`). A `Duration` is a time part only
//! (one day of duration is 24 hours, not a calendar day). Nanoseconds that are not whole
//! microseconds are `precision_loss`; a part beyond BigQuery's INTERVAL range ("Y-M:
//! -10000-0 to 10000-0, D: -3660000 to 3660000, H:M:S: -87840000:0:0 to 87840000:0:0",
//! GoogleSQL reference, Data types, Interval type) is `invalid_value`.

use std::sync::Arc;

use arrow_array::cast::AsArray as _;
use arrow_array::types::{
    DurationMicrosecondType, DurationMillisecondType, DurationNanosecondType, DurationSecondType, IntervalDayTimeType,
    IntervalMonthDayNanoType, IntervalYearMonthType,
};
use arrow_array::{ArrayRef, StringArray};
use arrow_schema::{DataType, IntervalUnit, TimeUnit};

use super::IngestError;
use super::scalars::{RowOf, invalid_value};

const MAX_MONTHS: i64 = 10_000 * 12;
const MAX_DAYS: i64 = 3_660_000;
const MAX_MICROS: i64 = 87_840_000 * 3_600 * 1_000_000;

/// One INTERVAL as BigQuery holds it: a year-month part (months), a day part and a time part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IntervalParts {
    pub(crate) months: i64,
    pub(crate) days: i64,
    pub(crate) micros: i64,
}

/// Why one value cannot be staged exactly.
#[derive(Debug, PartialEq, Eq)]
enum Refusal {
    PrecisionLoss,
    OutOfRange(&'static str),
}

impl IntervalParts {
    fn of_nanos(months: i64, days: i64, nanos: i64) -> Result<Self, Refusal> {
        if nanos % 1_000 != 0 {
            return Err(Refusal::PrecisionLoss);
        }
        Self { months, days, micros: nanos / 1_000 }.checked()
    }

    fn checked(self) -> Result<Self, Refusal> {
        if self.months.unsigned_abs() > MAX_MONTHS as u64 {
            Err(Refusal::OutOfRange("its year-month part is beyond 10000 years"))
        } else if self.days.unsigned_abs() > MAX_DAYS as u64 {
            Err(Refusal::OutOfRange("its day part is beyond 3660000 days"))
        } else if self.micros.unsigned_abs() > MAX_MICROS as u64 {
            Err(Refusal::OutOfRange("its time part is beyond 87840000 hours"))
        } else {
            Ok(self)
        }
    }

    /// `months days microseconds`, as staged.
    pub(crate) fn staged(&self) -> String {
        format!("{} {} {}", self.months, self.days, self.micros)
    }
}

/// A duration of `value` `unit`s as a time part.
fn duration(value: i64, nanos_per_unit: i64) -> Result<IntervalParts, Refusal> {
    let too_long = Refusal::OutOfRange("its time part is beyond 87840000 hours");
    if nanos_per_unit >= 1_000 {
        let micros = value.checked_mul(nanos_per_unit / 1_000).ok_or(too_long)?;
        IntervalParts { months: 0, days: 0, micros }.checked()
    } else {
        IntervalParts::of_nanos(0, 0, value)
    }
}

/// The parts of each value of an interval or duration array (`None` for NULL).
fn parts(array: &ArrayRef) -> Result<Vec<Option<Result<IntervalParts, Refusal>>>, IngestError> {
    let of = |m: i32, d: i32, n: i64| IntervalParts::of_nanos(i64::from(m), i64::from(d), n);
    Ok(match array.data_type() {
        DataType::Interval(IntervalUnit::MonthDayNano) => array
            .as_primitive::<IntervalMonthDayNanoType>()
            .iter()
            .map(|v| v.map(|v| of(v.months, v.days, v.nanoseconds)))
            .collect(),
        DataType::Interval(IntervalUnit::YearMonth) => {
            array.as_primitive::<IntervalYearMonthType>().iter().map(|v| v.map(|months| of(months, 0, 0))).collect()
        }
        DataType::Interval(IntervalUnit::DayTime) => array
            .as_primitive::<IntervalDayTimeType>()
            .iter()
            .map(|v| v.map(|v| of(0, v.days, i64::from(v.milliseconds) * 1_000_000)))
            .collect(),
        DataType::Duration(TimeUnit::Second) => {
            array.as_primitive::<DurationSecondType>().iter().map(|v| v.map(|s| duration(s, 1_000_000_000))).collect()
        }
        DataType::Duration(TimeUnit::Millisecond) => array
            .as_primitive::<DurationMillisecondType>()
            .iter()
            .map(|v| v.map(|ms| duration(ms, 1_000_000)))
            .collect(),
        DataType::Duration(TimeUnit::Microsecond) => {
            array.as_primitive::<DurationMicrosecondType>().iter().map(|v| v.map(|us| duration(us, 1_000))).collect()
        }
        DataType::Duration(TimeUnit::Nanosecond) => {
            array.as_primitive::<DurationNanosecondType>().iter().map(|v| v.map(|ns| duration(ns, 1))).collect()
        }
        other => return Err(IngestError::Arrow(format!("{other} is not an interval"))),
    })
}

/// The staged strings of an interval or duration column, refusing the first value that
/// cannot be held exactly.
pub(crate) fn stage_intervals(array: &ArrayRef, path: &str, row_of: RowOf<'_>) -> Result<ArrayRef, IngestError> {
    let mut staged = Vec::with_capacity(array.len());
    for (index, value) in parts(array)?.into_iter().enumerate() {
        staged.push(match value {
            None => None,
            Some(Ok(parts)) => Some(parts.staged()),
            Some(Err(Refusal::PrecisionLoss)) => {
                return Err(IngestError::PrecisionLoss {
                    column: path.to_string(),
                    row: row_of(index),
                    reason: "interval has nanoseconds that are not whole microseconds; BigQuery INTERVAL stores microseconds".into(),
                });
            }
            Some(Err(Refusal::OutOfRange(reason))) => {
                return Err(invalid_value(path, row_of(index), format!("outside BigQuery's INTERVAL range: {reason}")));
            }
        });
    }
    Ok(Arc::new(StringArray::from(staged)))
}

#[cfg(test)]
mod tests {
    use arrow_array::types::IntervalMonthDayNano;
    use arrow_array::{
        DurationMicrosecondArray, DurationNanosecondArray, DurationSecondArray, IntervalMonthDayNanoArray,
        IntervalYearMonthArray,
    };

    use super::*;

    fn staged(array: ArrayRef) -> Result<Vec<Option<String>>, IngestError> {
        let out = stage_intervals(&array, "i", &|row| row + 10)?;
        Ok(out.as_string::<i32>().iter().map(|v| v.map(str::to_string)).collect())
    }

    #[test]
    fn every_arrow_interval_stages_its_exact_parts() {
        let mdn = IntervalMonthDayNanoArray::from(vec![
            Some(IntervalMonthDayNano::new(14, -3, 1_234_567_000)),
            None,
            Some(IntervalMonthDayNano::new(-120_000, 3_660_000, -9_000_000_000_000_000_000)),
        ]);
        let s = |v: &str| Some(v.to_string());
        assert_eq!(
            staged(Arc::new(mdn)).unwrap(),
            vec![s("14 -3 1234567"), None, s("-120000 3660000 -9000000000000000")]
        );
        assert_eq!(staged(Arc::new(IntervalYearMonthArray::from(vec![-25]))).unwrap(), vec![s("-25 0 0")]);
        let one_day = DurationSecondArray::from(vec![86_400]);
        assert_eq!(staged(Arc::new(one_day)).unwrap(), vec![s("0 0 86400000000")], "a duration is a time part");
        assert_eq!(staged(Arc::new(DurationNanosecondArray::from(vec![-5_000]))).unwrap(), vec![s("0 0 -5")]);
    }

    #[test]
    fn nanoseconds_and_parts_beyond_the_range_are_refused_naming_the_row() {
        let nanos = DurationNanosecondArray::from(vec![Some(1_000), Some(1_500)]);
        assert!(matches!(staged(Arc::new(nanos)), Err(IngestError::PrecisionLoss { row: 11, .. })));
        let months = IntervalYearMonthArray::from(vec![(MAX_MONTHS + 1) as i32]);
        assert!(matches!(staged(Arc::new(months)), Err(IngestError::InvalidValue { row: 10, .. })));
        let days = IntervalMonthDayNanoArray::from(vec![IntervalMonthDayNano::new(0, -3_660_001, 0)]);
        assert!(matches!(staged(Arc::new(days)), Err(IngestError::InvalidValue { row: 10, .. })));
        let overflow = DurationSecondArray::from(vec![0, i64::MAX]);
        assert!(matches!(staged(Arc::new(overflow)), Err(IngestError::InvalidValue { row: 11, .. })));
        let most_negative = DurationMicrosecondArray::from(vec![i64::MIN]);
        assert!(matches!(staged(Arc::new(most_negative)), Err(IngestError::InvalidValue { row: 10, .. })));
    }
}
