//! One generated case put together from its generated parts ([`super::generated`]): its
//! columns, key, key ranges, `order_by`, CDC input, metadata columns and deletes, and the
//! features it exercises, for the coverage check.

use std::collections::BTreeSet;
use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema};
use filament_bigquery::conformance::Case;
use filament_bigquery::model::WriteMode;
use filament_bigquery::model::key_ranges::KeyRange;
use filament_bigquery::model::write_options::{Deletes, MetadataColumn};

use super::generated::{Generated, GeneratedCase, GeneratedKey, TRICKY_NAMES, is_plain, key_value, ordered};
use super::keyed;

/// One generated case as it is put together, with the features it exercises.
pub(super) struct CaseBuilder {
    write_mode: WriteMode,
    keyed: bool,
    features: BTreeSet<String>,
    fields: Vec<Field>,
    primary_key: Vec<String>,
    collated_keys: Vec<String>,
    key_ranges: Vec<KeyRange>,
    order_by: Vec<String>,
    /// Column names taken so far, lowercased.
    taken: BTreeSet<String>,
}

impl CaseBuilder {
    pub(super) fn new(write_mode: WriteMode) -> Self {
        Self {
            write_mode,
            keyed: keyed(write_mode),
            features: BTreeSet::new(),
            fields: Vec::new(),
            primary_key: Vec::new(),
            collated_keys: Vec::new(),
            key_ranges: Vec::new(),
            order_by: Vec::new(),
            taken: BTreeSet::new(),
        }
    }

    /// The key columns: in the primary key of a keyed mode, plain columns otherwise.
    pub(super) fn keys(&mut self, key: &[GeneratedKey]) {
        for (name, ((data_type, bigquery_type), collated, (pick_low, pick_high, low, high))) in key {
            self.fields.push(Field::new(name, data_type.clone(), true));
            self.taken.insert(name.to_lowercase());
            if !self.keyed {
                continue;
            }
            self.primary_key.push(name.clone());
            if !is_plain(name) {
                self.features.insert("flexible name of a key column".into());
            }
            let alone = if key.len() == 1 { "alone" } else { "in a composite key" };
            self.features.insert(format!("key {bigquery_type} {alone}"));
            if *bigquery_type == "STRING" && *collated {
                self.collated_keys.push(name.clone());
                self.features.insert("collated STRING key".into());
            }
            if let (Some((a, a_extreme)), Some((b, b_extreme))) =
                (key_value(bigquery_type, *pick_low, *low), key_value(bigquery_type, *pick_high, *high))
            {
                let (min, max) = if ordered(&a, &b) { (a, b) } else { (b, a) };
                if a_extreme || b_extreme {
                    self.features.insert(format!("key range {bigquery_type} at an extreme"));
                }
                self.key_ranges.push(KeyRange { column: name.clone(), min, max });
            }
        }
    }

    /// `order_by` columns of a keyed mode (history orders its versions by one column).
    pub(super) fn order_by(&mut self, order: Vec<(String, (DataType, &'static str))>) {
        for (name, (data_type, bigquery_type)) in order {
            let room = self.write_mode != WriteMode::History || self.order_by.is_empty();
            if !self.keyed || !room || !self.taken.insert(name.to_lowercase()) {
                continue;
            }
            self.features.insert(format!("order_by {bigquery_type}"));
            if !is_plain(&name) {
                self.features.insert("flexible name of an order_by column".into());
            }
            self.fields.push(Field::new(&name, data_type, true));
            self.order_by.push(name);
        }
        if self.order_by.len() > 1 {
            self.features.insert("order_by of several columns".into());
        }
    }

    /// The other columns, whose names no key or `order_by` column took.
    pub(super) fn others(&mut self, others: Vec<(String, Generated)>) {
        for (name, generated) in others.into_iter().filter(|(n, _)| !self.taken.contains(&n.to_lowercase())) {
            generated.conversions(0, "top level", &mut self.features);
            if !is_plain(&name) {
                self.features.insert("flexible name of a column".into());
            }
            self.fields.push(generated.field(&name));
        }
    }

    /// The case, with `_filament_op` where the mode takes CDC input, its metadata columns and
    /// its deletes.
    pub(super) fn finish(mut self, metadata_columns: Vec<MetadataColumn>, soft: bool, snapshot: bool) -> GeneratedCase {
        let write_mode = self.write_mode;
        // history takes CDC input or plain rows (upserts).
        let history_cdc = write_mode == WriteMode::History && snapshot;
        if matches!(write_mode, WriteMode::CdcAppend | WriteMode::CdcMerge) || history_cdc {
            self.fields.push(Field::new("_filament_op", DataType::Utf8, true));
        }
        if write_mode == WriteMode::History {
            let input = if history_cdc { "CDC input" } else { "plain rows" };
            let order = if self.order_by.is_empty() { "the publication time" } else { "order_by" };
            self.features.insert(format!("history from {input} by {order}"));
        }
        for field in &self.fields {
            if TRICKY_NAMES.contains(&field.name().as_str()) {
                self.features.insert(format!("column named {}", field.name().to_ascii_lowercase()));
            }
        }
        self.features.insert(format!("write mode {write_mode}"));
        for column in &metadata_columns {
            self.features.insert(format!("{write_mode} with {}", column.column_name()));
        }
        let deletes = self.deletes(soft);
        let delete_missing = snapshot && write_mode == WriteMode::FullUpsert;
        if delete_missing {
            self.features.insert(format!("delete_missing with {deletes:?} deletes"));
            if !self.order_by.is_empty() {
                self.features.insert("delete_missing with order_by".into());
            }
        }
        let case = Case {
            schema: Arc::new(Schema::new(self.fields)),
            write_mode,
            primary_key: self.primary_key,
            collated_keys: self.collated_keys,
            key_ranges: self.key_ranges,
            order_by: self.order_by,
            metadata_columns,
            deletes,
            delete_missing,
        };
        GeneratedCase { case, features: self.features }
    }

    /// Soft deletes where the mode takes them and the case asks for them.
    fn deletes(&mut self, soft: bool) -> Deletes {
        let write_mode = self.write_mode;
        if !(soft && self.keyed && write_mode != WriteMode::History) {
            return Deletes::Hard;
        }
        self.features.insert(format!("{write_mode} with soft deletes"));
        if !self.order_by.is_empty() {
            self.features.insert(format!("{write_mode} with soft deletes and order_by"));
        }
        Deletes::Soft
    }
}
