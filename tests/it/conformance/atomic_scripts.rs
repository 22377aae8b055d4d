//! The transaction an atomic execution would publish with (issue 58 item 4), judged by Google's
//! GoogleSQL analyzer like every single-table statement (`googlesql.rs`): generated executions
//! of 1, 2 and 100 resources, each publishing its first segment, across the write modes, as
//! one `BEGIN TRANSACTION; ...; COMMIT TRANSACTION;` script over every destination and staging
//! table. Deterministic (fixed seeds per size).

use std::cell::RefCell;
use std::collections::BTreeSet;

use filament_bigquery::conformance::{Shaped, Statement, TableBody, atomic, shape};
use filament_bigquery::model::WriteMode;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};

use super::generated::generated_case;
use crate::support::zetasql::Analyzer;

/// Executions generated per size: (resources, executions).
const SIZES: [(usize, u32); 3] = [(1, 24), (2, 24), (100, 3)];

fn runner(resources: usize, cases: u32) -> TestRunner {
    let config = Config { cases, failure_persistence: None, ..Config::default() };
    let seed = [u8::try_from(resources).unwrap_or(u8::MAX); 32];
    TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed))
}

#[test]
fn atomic_transactions_of_1_2_and_100_tables_are_valid_googlesql() {
    let analyzer = RefCell::new(Analyzer::start());
    let modes = RefCell::new(std::collections::HashSet::new());
    let shapes = RefCell::new(BTreeSet::new());
    for (resources, cases) in SIZES {
        let strategy = proptest::collection::vec(generated_case(), resources);
        let result = runner(resources, cases).run(&strategy, |generated| {
            let shaped = generated
                .iter()
                .enumerate()
                .map(|(i, g)| shape(&g.case, "my-project", "raw", &format!("t{i}")))
                .collect::<Result<Vec<Shaped>, _>>()
                .map_err(|problem| TestCaseError::fail(format!("the gateway refused a generated schema: {problem}")))?;
            let first: Vec<&Statement> = shaped.iter().filter_map(|s| s.statements.first()).collect();
            let script = atomic(&first);
            let tables: Vec<&TableBody> = shaped.iter().flat_map(|s| [&s.destination, &s.staging]).collect();
            let verdict = analyzer.borrow_mut().analyze(&tables, &script.sql, script.script);
            if !verdict.ok {
                return Err(TestCaseError::fail(format!(
                    "Google's analyzer refused the transaction over {resources} tables:\n{}\n\nerrors: {:#?}",
                    script.sql, verdict.errors
                )));
            }
            // One statement per table, and the transaction's own two.
            let expected = first.iter().map(|s| if s.shape == "replace" { 2 } else { 1 }).sum::<usize>() + 2;
            if verdict.statements != expected {
                return Err(TestCaseError::fail(format!(
                    "{} statements analyzed, {expected} expected",
                    verdict.statements
                )));
            }
            modes.borrow_mut().extend(generated.iter().map(|g| g.case.write_mode));
            shapes.borrow_mut().extend(first.iter().map(|s| s.shape));
            Ok(())
        });
        if let Err(failure) = result {
            panic!("{failure}");
        }
    }
    let modes = modes.into_inner();
    let missing: Vec<&WriteMode> = WriteMode::ALL.iter().filter(|mode| !modes.contains(mode)).collect();
    assert!(missing.is_empty(), "no generated atomic execution published a {missing:?} resource");
    let shapes = shapes.into_inner();
    assert!(shapes.contains("replace") && shapes.contains("merge") && shapes.contains("insert"), "{shapes:?}");
}
