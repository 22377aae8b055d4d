//! The commit's decisions on plain data: no emulator, no Postgres, no network.

use std::time::Duration;

use super::*;

fn facts(write_mode: WriteMode, staged_rows: Option<i64>) -> PublicationFacts {
    PublicationFacts { write_mode, delete_missing: false, staged_rows, first_segment: true, completes_snapshot: true }
}

const STAGED: StatementChoice = StatementChoice::FromStaging { replace: false, scope: ScopeChoice::StagedKeys };

#[test]
fn staged_rows_publish_in_every_mode() {
    for mode in WriteMode::ALL {
        let expected = if mode == WriteMode::FullReplace {
            StatementChoice::FromStaging { replace: true, scope: ScopeChoice::StagedKeys }
        } else {
            STAGED
        };
        assert_eq!(choose_statement(facts(mode, Some(3))), expected, "{mode:?}");
    }
}

#[test]
fn an_empty_append_or_upsert_submits_nothing() {
    for mode in WriteMode::ALL.into_iter().filter(|m| *m != WriteMode::FullReplace) {
        for staged in [None, Some(0)] {
            assert_eq!(choose_statement(facts(mode, staged)), StatementChoice::Nothing, "{mode:?} {staged:?}");
        }
    }
}

#[test]
fn an_empty_replacement_truncates_and_an_empty_stream_replaces_in_the_first_segment_only() {
    let replace = facts(WriteMode::FullReplace, None);
    assert_eq!(choose_statement(replace), StatementChoice::Truncate);
    let with_empty_stream = PublicationFacts { staged_rows: Some(0), ..replace };
    assert_eq!(
        choose_statement(with_empty_stream),
        StatementChoice::FromStaging { replace: true, scope: ScopeChoice::StagedKeys }
    );
    let later = PublicationFacts { first_segment: false, ..replace };
    assert_eq!(choose_statement(later), StatementChoice::Nothing, "a later segment leaves the table alone");
    assert_eq!(choose_statement(PublicationFacts { staged_rows: Some(2), ..later }), STAGED, "a later segment appends");
}

#[test]
fn a_snapshot_segment_is_scoped_and_its_completion_deletes_what_was_not_sent() {
    let snapshot = PublicationFacts { delete_missing: true, ..facts(WriteMode::FullUpsert, Some(5)) };
    let segment = PublicationFacts { completes_snapshot: false, ..snapshot };
    assert_eq!(
        choose_statement(segment),
        StatementChoice::FromStaging { replace: false, scope: ScopeChoice::SnapshotSegment }
    );
    assert_eq!(
        choose_statement(snapshot),
        StatementChoice::FromStaging { replace: false, scope: ScopeChoice::SnapshotCompletion }
    );
    for staged in [None, Some(0)] {
        let empty = PublicationFacts { staged_rows: staged, ..snapshot };
        assert_eq!(choose_statement(empty), StatementChoice::DeleteMissing, "{staged:?}");
        assert_eq!(choose_statement(PublicationFacts { completes_snapshot: false, ..empty }), StatementChoice::Nothing);
    }
}

#[test]
fn only_truncation_and_snapshot_deletion_need_the_destination_to_exist() {
    assert!(StatementChoice::Truncate.needs_existing_destination());
    assert!(StatementChoice::DeleteMissing.needs_existing_destination());
    assert!(!STAGED.needs_existing_destination());
    assert!(!StatementChoice::Nothing.needs_existing_destination());
}

#[test]
fn shapes_name_the_generators_paths() {
    let shape = |mode, choice: StatementChoice| choice.shape(mode);
    assert_eq!(shape(WriteMode::FullAppend, STAGED), Some("insert"));
    assert_eq!(shape(WriteMode::IncrementalUpsert, STAGED), Some("merge"));
    assert_eq!(shape(WriteMode::History, STAGED), Some("history"));
    let replace = StatementChoice::FromStaging { replace: true, scope: ScopeChoice::StagedKeys };
    assert_eq!(shape(WriteMode::FullReplace, replace), Some("replace"));
    let completion = StatementChoice::FromStaging { replace: false, scope: ScopeChoice::SnapshotCompletion };
    assert_eq!(shape(WriteMode::FullUpsert, completion), Some("snapshot_completion"));
    assert_eq!(shape(WriteMode::FullReplace, StatementChoice::Truncate), Some("truncate"));
    assert_eq!(shape(WriteMode::FullUpsert, StatementChoice::DeleteMissing), Some("delete_missing"));
    assert_eq!(shape(WriteMode::FullAppend, StatementChoice::Nothing), None);
}

fn job_failed(reason: &str) -> BigQueryError {
    BigQueryError::JobFailed { reason: reason.into(), message: "failed".into() }
}

#[test]
fn a_job_failed_in_passing_or_refused_before_running_may_run_again() {
    assert!(runs_again(&job_failed("backendError")));
    assert!(runs_again(&job_failed("jobRateLimitExceeded")));
    let conflict = BigQueryError::JobFailed {
        reason: "invalidQuery".into(),
        message: "Could not serialize access to table t due to concurrent update".into(),
    };
    assert!(runs_again(&conflict), "a DML conflict runs again");
    let status = google_cloud_gax::error::Error::http(429, Default::default(), Default::default());
    let refused = BigQueryError::Rest { operation: "jobs.insert", source: status };
    assert!(runs_again(&refused), "no job was created");
}

#[test]
fn a_publication_runs_again_up_to_its_attempts_and_waits_pushback_out() {
    let policy = RetryPolicy { quota_wait: Duration::from_secs(600), ..PUBLICATION_RETRY };
    for attempt in 1..PUBLICATION_RETRY.max_attempts {
        assert!(policy.decide(RetryClass::Transient, attempt, Duration::ZERO).delay().is_some(), "attempt {attempt}");
    }
    assert_eq!(policy.decide(RetryClass::Transient, 4, Duration::ZERO), RetryAction::Fail);
    assert!(policy.decide(RetryClass::Pushback, 10, Duration::from_secs(599)).delay().is_some());
    assert_eq!(policy.decide(RetryClass::Pushback, 10, Duration::from_secs(600)), RetryAction::Fail);
}

#[test]
fn a_job_that_failed_for_good_or_was_lost_does_not_run_again() {
    assert!(!runs_again(&job_failed("invalidQuery")), "a permanent failure");
    // Lost track of: it may still run, and a new job id could run the statement twice.
    let lost = BigQueryError::Timeout { operation: "jobs.query", seconds: 10 };
    assert!(!runs_again(&lost));
}

fn result(name: &str, outcome: Result<PublishOutcome, Problem>) -> PublicationResult {
    PublicationResult { resource: name.parse().unwrap(), staging_table: Some(format!("stg_{name}")), outcome }
}

#[test]
fn a_commit_whose_publications_all_finished_deletes_every_staging_table() {
    let verdict =
        publications_ended(vec![result("a", Ok(PublishOutcome::Done)), result("b", Ok(PublishOutcome::Done))]);
    assert_eq!(verdict, CommitVerdict { delete_staging_tables: vec!["stg_a".into(), "stg_b".into()], end: Ok(()) });
}

#[test]
fn a_job_that_may_still_run_keeps_its_staging_table_and_fails_the_commit() {
    let lost = Problem::new(ErrorCode::BigqueryUnavailable, "lost track of the job");
    let failed = Problem::new(ErrorCode::PublicationFailed, "syntax error");
    let verdict = publications_ended(vec![
        result("a", Ok(PublishOutcome::Done)),
        result("b", Ok(PublishOutcome::Unfinished(lost))),
        result("c", Err(failed)),
    ]);
    assert_eq!(verdict.delete_staging_tables, ["stg_a", "stg_c"], "b's job may still read its staging table");
    let problem = verdict.end.unwrap_err();
    assert_eq!(problem.code, ErrorCode::BigqueryUnavailable, "the first failure's code");
    assert!(problem.detail.contains("resource b") && problem.detail.contains("resource c"), "{problem}");
}

#[test]
fn a_foreign_job_keeps_its_staging_table_and_fails_the_commit_with_its_code() {
    let foreign = Problem::new(ErrorCode::ForeignJob, "job j exists and is not the gateway's");
    let verdict = publications_ended(vec![
        result("a", Ok(PublishOutcome::ForeignJob(foreign))),
        result("b", Ok(PublishOutcome::Done)),
    ]);
    assert_eq!(verdict.delete_staging_tables, ["stg_b"], "a's staging table is kept");
    assert_eq!(verdict.end.unwrap_err().code, ErrorCode::ForeignJob);
}

#[test]
fn a_failure_before_publication_deletes_every_staging_table_and_fails_the_commit() {
    let refused = Problem::new(ErrorCode::UploadFailed, "INVALID_ARGUMENT");
    let tables = vec!["stg_fast".to_string(), "stg_slow".to_string()];
    let verdict = failed_before_publishing(refused.clone(), tables.clone());
    assert_eq!(verdict, CommitVerdict { delete_staging_tables: tables, end: Err(refused) });
}
