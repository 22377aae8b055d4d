//! Every statement the publication generator can produce, judged by Google's GoogleSQL analyzer
//! (ZetaSQL, the front end BigQuery is built on; `make test` starts its local service) instead of
//! by text we wrote or by the emulator. Resource schemas are generated (proptest): every write
//! mode; every key-eligible type as a key, alone and in composite keys; every converted type
//! (NUMERIC, BIGNUMERIC, TIME, JSON) at top level and nested in STRUCTs and ARRAYs; column names
//! that collide with the statement's aliases and with keywords, in any case; collated STRING
//! keys; key ranges at the extremes of every literal type; every `full_replace` statement.
//! Each case goes through `filament_bigquery::conformance::shape`, so the analyzer's catalog is
//! the schema the gateway would create for the destination and the staging table.
//!
//! The run is deterministic (a fixed seed; `FILAMENT_PROPTEST_SEED` picks another) and checks
//! that the generated cases covered every feature above, so a change to the generator that
//! stops reaching one fails here rather than silently testing less.

use std::collections::BTreeSet;
use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema, TimeUnit};
use filament_bigquery::conformance::{Case, Shaped, shape};
use filament_bigquery::model::WriteMode;
use filament_bigquery::model::write_options::{Deletes, MetadataColumn};
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};

use super::generated::generated_case;
use crate::support::zetasql::Analyzer;

const PROJECT: &str = "my-project";
const DATASET: &str = "raw";
const TABLE: &str = "dest";
/// Generated resources per run (each gives one to three statements).
const CASES: u32 = 1_000;

/// What every run must have covered.
fn required_features() -> BTreeSet<String> {
    let mut required = BTreeSet::new();
    for mode in WriteMode::ALL {
        required.insert(format!("write mode {mode}"));
        for column in MetadataColumn::ALL {
            required.insert(format!("{mode} with {}", column.column_name()));
        }
    }
    for input in ["CDC input", "plain rows"] {
        for order in ["the publication time", "order_by"] {
            required.insert(format!("history from {input} by {order}"));
        }
    }
    for shape in ["merge", "insert", "replace", "truncate", "snapshot_completion", "delete_missing", "history"] {
        required.insert(format!("statement {shape}"));
    }
    for key in ["INT64", "STRING", "BOOL", "BYTES", "DATE", "TIME", "DATETIME", "TIMESTAMP", "NUMERIC", "BIGNUMERIC"] {
        required.insert(format!("key {key} alone"));
        required.insert(format!("key {key} in a composite key"));
    }
    for flexible in ["a key column", "an order_by column", "a column", "a struct field"] {
        required.insert(format!("flexible name of {flexible}"));
    }
    for converted in ["NUMERIC", "BIGNUMERIC", "TIME", "JSON", "GEOGRAPHY", "RANGE", "INTERVAL"] {
        for container in ["top level", "struct", "array"] {
            // A list of RANGE or INTERVAL values is refused at the schema.
            if container != "array" || !matches!(converted, "RANGE" | "INTERVAL") {
                required.insert(format!("converted {converted} in {container}"));
            }
        }
        required.insert(format!("converted {converted} nested deeper"));
    }
    for ranged in ["INT64", "STRING", "DATE", "DATETIME", "TIMESTAMP"] {
        required.insert(format!("key range {ranged} at an extreme"));
    }
    for name in ["t", "s", "e0", "o0", "order", "qualify", "select"] {
        required.insert(format!("column named {name}"));
    }
    required.insert("collated STRING key".into());
    for ordered in ["INT64", "STRING", "DATE", "DATETIME", "TIMESTAMP", "NUMERIC", "BIGNUMERIC"] {
        required.insert(format!("order_by {ordered}"));
    }
    required.insert("order_by of several columns".into());
    for deletes in ["Hard", "Soft"] {
        required.insert(format!("delete_missing with {deletes} deletes"));
    }
    required.insert("delete_missing with order_by".into());
    for mode in ["cdc_merge", "incremental_delete", "full_upsert", "incremental_upsert"] {
        required.insert(format!("{mode} with soft deletes"));
        required.insert(format!("{mode} with soft deletes and order_by"));
    }
    required
}

fn runner() -> TestRunner {
    let seed = std::env::var("FILAMENT_PROPTEST_SEED").ok().and_then(|s| s.parse::<u64>().ok()).unwrap_or(27);
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let config = Config { cases: CASES, failure_persistence: None, ..Config::default() };
    TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes))
}

/// Analyzes every statement of a shaped case; the first refusal fails the case.
fn judge(analyzer: &mut Analyzer, shaped: &Shaped) -> Result<usize, String> {
    let tables = [&shaped.destination, &shaped.staging];
    let mut analyzed = 0;
    for statement in &shaped.statements {
        let verdict = analyzer.analyze(&tables, &statement.sql, statement.script);
        if !verdict.ok {
            return Err(format!(
                "Google's analyzer refused the {} statement:\n{}\n\nerrors: {:#?}\ndestination: {}\nstaging: {}",
                statement.shape, statement.sql, verdict.errors, shaped.destination.body, shaped.staging.body
            ));
        }
        analyzed += verdict.statements;
    }
    Ok(analyzed)
}

#[test]
fn every_statement_the_generator_produces_is_valid_googlesql() {
    let analyzer = std::cell::RefCell::new(Analyzer::start());
    let covered = std::cell::RefCell::new(BTreeSet::new());
    let statements = std::cell::Cell::new(0usize);
    let new_shapes = std::cell::RefCell::new(std::collections::BTreeMap::<String, usize>::new());
    let result = runner().run(&generated_case(), |generated| {
        let shaped = shape(&generated.case, PROJECT, DATASET, TABLE)
            .map_err(|problem| TestCaseError::fail(format!("the gateway refused the generated schema: {problem}")))?;
        let analyzed = judge(&mut analyzer.borrow_mut(), &shaped).map_err(TestCaseError::fail)?;
        statements.set(statements.get() + analyzed);
        let mut counts = new_shapes.borrow_mut();
        for shape in ["GEOGRAPHY", "RANGE", "INTERVAL", "flexible name"] {
            if generated.features.iter().any(|f| f.contains(shape)) {
                *counts.entry(shape.to_string()).or_default() += 1;
            }
        }
        let mut covered = covered.borrow_mut();
        covered.extend(generated.features);
        covered.extend(shaped.statements.iter().map(|s| format!("statement {}", s.shape)));
        Ok(())
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
    let covered = covered.into_inner();
    let required = required_features();
    let missing: Vec<&String> = required.iter().filter(|f| !covered.contains(*f)).collect();
    assert!(missing.is_empty(), "the generated cases did not reach: {missing:#?}");
    let new_shapes = new_shapes.into_inner();
    for shape in ["GEOGRAPHY", "RANGE", "INTERVAL", "flexible name"] {
        let cases = new_shapes.get(shape).copied().unwrap_or(0);
        assert!(cases >= 100, "only {cases} of {CASES} generated resources had a {shape}");
    }
    let counts: Vec<String> = new_shapes.iter().map(|(shape, cases)| format!("{cases} with {shape}")).collect();
    let summary = format!(
        "GoogleSQL conformance: {CASES} generated resources, {} statements analyzed by ZetaSQL, {} features covered (every write mode and statement shape, key type, converted type and depth, aliased and flexible name); resources with the types and names sources send: {}\n",
        statements.get(),
        covered.len(),
        counts.join(", ")
    );
    report(&summary);
}

/// Writes the run's figures where `make test` prints them (and to stderr).
fn report(summary: &str) {
    eprint!("{summary}");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("build/conformance");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("googlesql.txt"), summary).unwrap();
}

/// A small resource with an INT64 key, a STRING, a NUMERIC and columns named like the old aliases.
fn sample() -> Shaped {
    let fields = vec![
        Field::new("id", DataType::Int64, true),
        Field::new("name", DataType::Utf8, true),
        Field::new("amount", DataType::Decimal128(38, 9), true),
        Field::new("t", DataType::Int64, true),
        Field::new("s", DataType::Utf8, true),
        Field::new("order", DataType::Int64, true),
    ];
    let case = Case {
        schema: Arc::new(Schema::new(fields)),
        write_mode: WriteMode::IncrementalUpsert,
        primary_key: vec!["id".into()],
        collated_keys: vec![],
        key_ranges: vec![],
        order_by: vec![],
        metadata_columns: vec![],
        deletes: Deletes::Hard,
        delete_missing: false,
    };
    shape(&case, PROJECT, DATASET, TABLE).unwrap()
}

#[test]
fn the_analyzer_refuses_misspelled_functions_type_errors_and_a_qualify_without_where() {
    let mut analyzer = Analyzer::start();
    let shaped = sample();
    let tables = [&shaped.destination, &shaped.staging];
    let merge = &shaped.statements[0].sql;
    assert!(analyzer.analyze(&tables, merge, false).ok, "the control's own statement is valid: {merge}");
    let mutations = [
        ("a misspelled function", merge.replace("PARSE_NUMERIC(", "PARSE_NUMERC(")),
        ("a type error in ON", merge.replace("= _filament_source.`id`", "= _filament_source.`name`")),
        ("a QUALIFY without WHERE", merge.replace("  WHERE TRUE\n", "")),
    ];
    for (what, sql) in mutations {
        assert_ne!(&sql, merge, "the mutation applies: {what}");
        let verdict = analyzer.analyze(&tables, &sql, false);
        assert!(!verdict.ok, "{what} must be refused:\n{sql}");
    }
}

#[test]
fn numeric_keys_and_columns_named_like_the_aliases_analyze_cleanly() {
    let mut analyzer = Analyzer::start();
    for key_type in [DataType::Decimal128(38, 9), DataType::Decimal256(76, 38)] {
        let fields = vec![
            Field::new("k", key_type.clone(), true),
            Field::new("t", DataType::Utf8, true),
            Field::new("s", DataType::Int64, true),
            Field::new("order", DataType::Time64(TimeUnit::Microsecond), true),
            Field::new("_filament_op", DataType::Utf8, true),
        ];
        for write_mode in [WriteMode::IncrementalUpsert, WriteMode::CdcMerge] {
            let mut fields = fields.clone();
            if write_mode != WriteMode::CdcMerge {
                fields.pop();
            }
            let case = Case {
                schema: Arc::new(Schema::new(fields)),
                write_mode,
                primary_key: vec!["k".into()],
                collated_keys: vec![],
                key_ranges: vec![],
                // Ordered by a column named like an alias, then by the NUMERIC key itself.
                order_by: vec!["s".into(), "k".into()],
                metadata_columns: MetadataColumn::ALL.to_vec(),
                deletes: if write_mode == WriteMode::CdcMerge { Deletes::Soft } else { Deletes::Hard },
                delete_missing: false,
            };
            let shaped = shape(&case, PROJECT, DATASET, TABLE).unwrap();
            judge(&mut analyzer, &shaped).unwrap_or_else(|refusal| panic!("{key_type} key, {write_mode}: {refusal}"));
        }
    }
}
