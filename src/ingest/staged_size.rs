//! What a decoded body will hold once converted to its staging form ([`super::convert`]),
//! computed from the decoded arrays before anything is converted. Some Arrow encodings are far
//! smaller than what they stand for: a dictionary column's indices each select a whole value
//! (1,000 indices into one 1 MiB string become 1 GiB of strings), a view array's views may all
//! point at one long buffer, narrow integers widen to INT64, decimals and times become strings.
//! So the body limit, which counts the bytes received and the decompressed IPC buffers, is not
//! a bound on what conversion allocates; this is: a body whose staged form exceeds the limit is
//! refused (413, naming the column that takes the most) before conversion, and the staged size
//! is what the request reserves in the upload budget while it converts.

use arrow_array::cast::AsArray as _;
use arrow_array::types::{Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type, UInt32Type, UInt64Type};
use arrow_array::{Array, ArrayRef, DictionaryArray};
use arrow_buffer::ArrowNativeType as _;
use arrow_schema::DataType;

use super::IngestError;
use super::decode::DecodedBody;
use super::schema::MappedSchema;
use crate::model::columns::{BigQueryType, Column, GeographyEncoding};

/// Offsets of a staged string or list value (Arrow's 32-bit offsets).
const OFFSET_BYTES: usize = 4;
/// `HH:MM:SS.ffffff`, as TIME values are staged.
const TIME_STRING_BYTES: usize = 15;
/// The longest staged RANGE: `[` two `YYYY-MM-DD HH:MM:SS.ffffff+00` bounds `, ` `)`.
const RANGE_STRING_BYTES: usize = 1 + 2 * 29 + 2 + 1;
/// The longest staged INTERVAL: `months days microseconds` (7, 8 and 19 characters with signs).
const INTERVAL_STRING_BYTES: usize = 7 + 1 + 8 + 1 + 19;
/// IPC framing of one staged batch beyond its buffers: the message and record-batch metadata.
const ENCODING_BYTES_PER_BATCH: usize = 512;
/// IPC framing per staged field, nested ones included: its field node, buffer entries and
/// alignment padding (each buffer padded to 64 bytes; up to three buffers a field).
const ENCODING_BYTES_PER_FIELD: usize = 256;

/// The staged size of a body: in all, and the column that takes the most.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StagedSize {
    pub(crate) bytes: usize,
    pub(crate) largest_column: String,
    pub(crate) largest_column_bytes: usize,
}

/// The staged size of `body`, or `BodyTooLarge` naming the largest column when it exceeds
/// `limit_bytes`.
pub(crate) fn staged_size(
    body: &DecodedBody,
    mapped: &MappedSchema,
    limit_bytes: usize,
) -> Result<StagedSize, IngestError> {
    let mut per_column = vec![0usize; mapped.data_columns.len()];
    let mut reserved_columns = 0usize;
    for decoded in &body.batches {
        let batch = &decoded.batch;
        for (slot, (column, index)) in mapped.data_columns.iter().zip(&mapped.data_indices).enumerate() {
            per_column[slot] = per_column[slot].saturating_add(staged_bytes(batch.column(*index), column));
        }
        match mapped.op_index {
            Some(index) => reserved_columns = reserved_columns.saturating_add(string_bytes(batch.column(index))),
            // An all-NULL string column: offsets and validity.
            None if mapped.stages_op => {
                reserved_columns = reserved_columns.saturating_add(batch.num_rows() * 4 + batch.num_rows() / 8 + 8);
            }
            None => {}
        }
        if mapped.stages_seq {
            reserved_columns = reserved_columns.saturating_add(batch.num_rows() * 8);
        }
        reserved_columns = reserved_columns.saturating_add(framing_bytes(mapped));
    }
    let bytes = per_column.iter().fold(reserved_columns, |sum, bytes| sum.saturating_add(*bytes));
    let (slot, largest) = per_column.iter().enumerate().max_by_key(|(_, bytes)| **bytes).unwrap_or((0, &0));
    let largest_column = mapped.data_columns.get(slot).map(|c| c.name.clone()).unwrap_or_default();
    if bytes > limit_bytes {
        return Err(IngestError::StagedTooLarge {
            staged_bytes: bytes,
            limit_bytes,
            column: largest_column,
            column_bytes: *largest,
        });
    }
    Ok(StagedSize { bytes, largest_column, largest_column_bytes: *largest })
}

/// The IPC framing of one encoded batch of `mapped`'s staged columns, counted once per received
/// batch.
fn framing_bytes(mapped: &MappedSchema) -> usize {
    let fields: usize = mapped.staging.fields().iter().map(|field| nested_fields(field.data_type())).sum();
    ENCODING_BYTES_PER_BATCH + ENCODING_BYTES_PER_FIELD * fields
}

/// A field and every field nested in it (struct members, list items, map entries).
fn nested_fields(data_type: &DataType) -> usize {
    1 + match data_type {
        DataType::Struct(fields) => fields.iter().map(|f| nested_fields(f.data_type())).sum(),
        DataType::List(item) | DataType::LargeList(item) | DataType::ListView(item) | DataType::LargeListView(item) => {
            nested_fields(item.data_type())
        }
        DataType::FixedSizeList(item, _) | DataType::Map(item, _) => nested_fields(item.data_type()),
        _ => 0,
    }
}

/// Bytes of the validity bitmap of `array` when it has nulls.
fn validity_bytes(array: &dyn Array) -> usize {
    if array.null_count() > 0 { array.len().div_ceil(8) } else { 0 }
}

/// What `array` (received for `column`) takes once staged.
fn staged_bytes(array: &ArrayRef, column: &Column) -> usize {
    let validity = validity_bytes(array.as_ref());
    if column.repeated {
        let element = Column { repeated: false, ..column.clone() };
        let (values, count) = list_values(array);
        let offsets = (count + 1) * OFFSET_BYTES;
        return validity + offsets + values.map_or(0, |values| staged_bytes(&values, &element));
    }
    let values = match &column.bigquery_type {
        BigQueryType::Struct(fields) => struct_bytes(array, fields),
        BigQueryType::String | BigQueryType::Bytes | BigQueryType::Json => string_bytes(array),
        BigQueryType::Numeric | BigQueryType::BigNumeric => decimal_string_bytes(array),
        BigQueryType::Time => array.len() * (TIME_STRING_BYTES + OFFSET_BYTES),
        // Planar WKB becomes WKT: a coordinate's 8 bytes take at most 24 characters and a
        // separator, so at most four times the WKB.
        BigQueryType::Geography(GeographyEncoding::PlanarWkb) => string_bytes(array).saturating_mul(4),
        // Staged as received: WKB bytes, WKT or GeoJSON text.
        BigQueryType::Geography(_) => string_bytes(array),
        BigQueryType::Range(_) => array.len() * (RANGE_STRING_BYTES + OFFSET_BYTES),
        BigQueryType::Interval => array.len() * (INTERVAL_STRING_BYTES + OFFSET_BYTES),
        BigQueryType::Bool => array.len().div_ceil(8),
        BigQueryType::Date => array.len() * 4,
        BigQueryType::Int64 | BigQueryType::Float64 | BigQueryType::Datetime | BigQueryType::Timestamp => {
            array.len() * 8
        }
    };
    validity + values
}

/// The child values a list array's rows reference, and how many rows it has (maps are lists
/// of their entries).
fn list_values(array: &ArrayRef) -> (Option<ArrayRef>, usize) {
    let rows = array.len();
    let values = match array.data_type() {
        DataType::List(_) => {
            let list = array.as_list::<i32>();
            let offsets = list.value_offsets();
            let (start, end) = (offsets[0] as usize, offsets[rows] as usize);
            Some(list.values().slice(start, end - start))
        }
        DataType::LargeList(_) => {
            let list = array.as_list::<i64>();
            let offsets = list.value_offsets();
            let (start, end) = (offsets[0] as usize, offsets[rows] as usize);
            Some(list.values().slice(start, end - start))
        }
        DataType::FixedSizeList(_, size) => {
            let list = array.as_fixed_size_list();
            let size = *size as usize;
            Some(list.values().slice(list.offset() * size, rows * size))
        }
        DataType::Map(_, _) => {
            let map = array.as_map();
            let offsets = map.value_offsets();
            let (start, end) = (offsets[0] as usize, offsets[rows] as usize);
            let entries: ArrayRef = std::sync::Arc::new(map.entries().clone());
            Some(entries.slice(start, end - start))
        }
        DataType::Dictionary(_, _) => return list_values(&materialized_dictionary(array)),
        _ => None,
    };
    (values, rows)
}

/// A dictionary array's values, one per row (for the rare dictionary of lists or structs).
fn materialized_dictionary(array: &ArrayRef) -> ArrayRef {
    let DataType::Dictionary(_, value_type) = array.data_type() else { return std::sync::Arc::clone(array) };
    arrow_cast::cast(array, value_type).unwrap_or_else(|_| std::sync::Arc::clone(array))
}

fn struct_bytes(array: &ArrayRef, fields: &[Column]) -> usize {
    if let DataType::Dictionary(_, _) = array.data_type() {
        return struct_bytes(&materialized_dictionary(array), fields);
    }
    let Some(structs) = array.as_struct_opt() else { return 0 };
    let children = structs.columns();
    fields.iter().zip(children).fold(0usize, |sum, (field, child)| sum.saturating_add(staged_bytes(child, field)))
}

/// Bytes of the strings (or binary values) `array` stands for, with their offsets: a
/// dictionary's values counted once per index, a view array's views by their lengths.
fn string_bytes(array: &ArrayRef) -> usize {
    let offsets = (array.len() + 1) * OFFSET_BYTES;
    let values = match array.data_type() {
        DataType::Utf8 => value_range(array.as_string::<i32>().value_offsets()),
        DataType::LargeUtf8 => value_range(array.as_string::<i64>().value_offsets()),
        DataType::Binary => value_range(array.as_binary::<i32>().value_offsets()),
        DataType::LargeBinary => value_range(array.as_binary::<i64>().value_offsets()),
        DataType::FixedSizeBinary(size) => array.len() * (*size).max(0) as usize,
        DataType::Utf8View => view_lengths(array.as_string_view().views()),
        DataType::BinaryView => view_lengths(array.as_binary_view().views()),
        DataType::Dictionary(key, _) => return dictionary_string_bytes(array, key),
        // Anything else becomes a string of its decimal digits at most (`_filament_op` casts).
        _ => array.len() * 40,
    };
    offsets.saturating_add(values)
}

fn value_range<O: arrow_array::OffsetSizeTrait>(offsets: &[O]) -> usize {
    match (offsets.first(), offsets.last()) {
        (Some(first), Some(last)) => last.as_usize().saturating_sub(first.as_usize()),
        _ => 0,
    }
}

/// The sum of the lengths of string views (the low 32 bits of each view).
fn view_lengths(views: &[u128]) -> usize {
    views.iter().fold(0usize, |sum, view| sum.saturating_add((*view as u32) as usize))
}

/// A dictionary of strings: every index stands for its value's bytes.
fn dictionary_string_bytes(array: &ArrayRef, key: &DataType) -> usize {
    fn of<K: arrow_array::types::ArrowDictionaryKeyType>(array: &ArrayRef) -> usize {
        let dictionary: &DictionaryArray<K> = array.as_dictionary();
        let values = dictionary.values();
        let lengths = value_lengths(values);
        let offsets = (array.len() + 1) * OFFSET_BYTES;
        let selected = dictionary
            .keys()
            .iter()
            .flatten()
            .fold(0usize, |sum, index| sum.saturating_add(lengths.get(index.as_usize()).copied().unwrap_or(0)));
        offsets.saturating_add(selected)
    }
    match key {
        DataType::Int8 => of::<Int8Type>(array),
        DataType::Int16 => of::<Int16Type>(array),
        DataType::Int32 => of::<Int32Type>(array),
        DataType::Int64 => of::<Int64Type>(array),
        DataType::UInt8 => of::<UInt8Type>(array),
        DataType::UInt16 => of::<UInt16Type>(array),
        DataType::UInt32 => of::<UInt32Type>(array),
        DataType::UInt64 => of::<UInt64Type>(array),
        _ => array.len() * 40,
    }
}

/// The byte length of each value of a dictionary's values array.
fn value_lengths(values: &ArrayRef) -> Vec<usize> {
    fn from_offsets<O: arrow_array::OffsetSizeTrait>(offsets: &[O]) -> Vec<usize> {
        offsets.windows(2).map(|pair| pair[1].as_usize().saturating_sub(pair[0].as_usize())).collect()
    }
    match values.data_type() {
        DataType::Utf8 => from_offsets(values.as_string::<i32>().value_offsets()),
        DataType::LargeUtf8 => from_offsets(values.as_string::<i64>().value_offsets()),
        DataType::Binary => from_offsets(values.as_binary::<i32>().value_offsets()),
        DataType::LargeBinary => from_offsets(values.as_binary::<i64>().value_offsets()),
        DataType::Utf8View => values.as_string_view().views().iter().map(|v| (*v as u32) as usize).collect(),
        DataType::BinaryView => values.as_binary_view().views().iter().map(|v| (*v as u32) as usize).collect(),
        // Non-string values staged as strings (a dictionary of decimals): their longest form.
        _ => vec![40; values.len()],
    }
}

/// Decimals (and UInt64, staged as NUMERIC) become strings of at most their precision, a sign
/// and a point.
fn decimal_string_bytes(array: &ArrayRef) -> usize {
    let per_value = match array.data_type() {
        DataType::Decimal32(precision, _)
        | DataType::Decimal64(precision, _)
        | DataType::Decimal128(precision, _)
        | DataType::Decimal256(precision, _) => usize::from(*precision) + 2,
        DataType::Dictionary(_, value) => return array.len() * (decimal_width(value) + OFFSET_BYTES),
        _ => 40,
    };
    array.len() * (per_value + OFFSET_BYTES)
}

fn decimal_width(data_type: &DataType) -> usize {
    match data_type {
        DataType::Decimal32(p, _)
        | DataType::Decimal64(p, _)
        | DataType::Decimal128(p, _)
        | DataType::Decimal256(p, _) => usize::from(*p) + 2,
        _ => 40,
    }
}

#[cfg(test)]
#[path = "staged_size_tests.rs"]
mod tests;
