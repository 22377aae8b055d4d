//! What a publication does given what this execution published before (a redelivery), decided
//! purely from the stored record and the fingerprint of what is staged now.

use crate::error::{ErrorCode, Problem};
use crate::model::PublicationState;
use crate::store::PublicationRecord;

/// The decision for one destination of one execution.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Reconciled {
    /// Nothing was published for it yet: submit the job.
    Submit,
    /// The same content was published earlier (a redelivery): its job stands.
    Reuse { job_id: String },
    /// Interrupted while its job ran: the same job id re-attaches to that job.
    Reattach,
    /// The earlier job failed for good, or published other content: refuse with this problem.
    Refuse(Problem),
}

/// The decision table:
///
/// | earlier record             | same fingerprint | other fingerprint |
/// |----------------------------|------------------|-------------------|
/// | none                       | submit           | submit            |
/// | done                       | reuse its job    | replay_mismatch   |
/// | running (outcome unknown)  | re-attach        | replay_mismatch   |
/// | failed                     | publication_failed (a corrected attempt needs a new id) |
pub(crate) fn reconcile(previous: Option<&PublicationRecord>, fingerprint: &str) -> Reconciled {
    let Some(previous) = previous else { return Reconciled::Submit };
    let same = previous.fingerprint == fingerprint;
    match previous.state {
        PublicationState::Done if same => Reconciled::Reuse { job_id: previous.job_id.clone() },
        PublicationState::Running if same => Reconciled::Reattach,
        PublicationState::Failed => {
            let detail = previous.error.as_ref().map(|e| e.detail.as_str()).unwrap_or_default();
            Reconciled::Refuse(
                Problem::new(
                    ErrorCode::PublicationFailed,
                    format!("publication job {} failed earlier: {detail}", previous.job_id),
                )
                .with_hint("a corrected attempt needs a new execution ID"),
            )
        }
        PublicationState::Done | PublicationState::Running => Reconciled::Refuse(
            Problem::new(
                ErrorCode::ReplayMismatch,
                format!(
                    "this execution was already published by job {} with other content or batch boundaries",
                    previous.job_id
                ),
            )
            .with_hint("a corrected load needs a new execution ID"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(state: PublicationState, fingerprint: &str) -> PublicationRecord {
        PublicationRecord {
            resource: "users".parse().unwrap(),
            destination: "raw.users".into(),
            job_id: "job-1".into(),
            fingerprint: fingerprint.into(),
            state,
            rows_affected: None,
            error: (state == PublicationState::Failed)
                .then(|| Problem::new(ErrorCode::PublicationFailed, "syntax error")),
            cost: Default::default(),
            committed_streams: None,
        }
    }

    fn refused_code(decision: Reconciled) -> ErrorCode {
        match decision {
            Reconciled::Refuse(problem) => problem.code,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn nothing_published_yet_submits() {
        assert_eq!(reconcile(None, "f"), Reconciled::Submit);
    }

    #[test]
    fn the_same_content_done_reuses_the_job() {
        assert_eq!(
            reconcile(Some(&record(PublicationState::Done, "f")), "f"),
            Reconciled::Reuse { job_id: "job-1".into() }
        );
    }

    #[test]
    fn the_same_content_running_reattaches() {
        assert_eq!(reconcile(Some(&record(PublicationState::Running, "f")), "f"), Reconciled::Reattach);
    }

    #[test]
    fn other_content_is_a_replay_mismatch() {
        for state in [PublicationState::Done, PublicationState::Running] {
            assert_eq!(refused_code(reconcile(Some(&record(state, "f")), "g")), ErrorCode::ReplayMismatch);
        }
    }

    #[test]
    fn a_failed_job_is_reported_whatever_is_staged() {
        for fingerprint in ["f", "g"] {
            let decision = reconcile(Some(&record(PublicationState::Failed, "f")), fingerprint);
            let Reconciled::Refuse(problem) = decision else { panic!("expected a refusal") };
            assert_eq!(problem.code, ErrorCode::PublicationFailed);
            assert!(problem.detail.contains("syntax error"), "{problem}");
        }
    }
}
