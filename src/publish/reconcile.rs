//! What a publication does given what this execution published before (a redelivery), decided
//! purely from the stored record and the fingerprint of what is staged now ([`reconcile`]), and
//! whether it then runs a query job or commits write streams into the destination
//! ([`publish_by`], `direct_append`).

use crate::error::{ErrorCode, Problem};
use crate::model::PublicationState;
use crate::model::staging::WritePath;
use crate::store::PublicationRecord;

/// The decision for one destination of one execution.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Reconciled {
    /// Nothing was published for it yet: submit the job.
    Submit,
    /// The same content was published earlier (a redelivery): its job stands.
    Reuse { job_id: String },
    /// Interrupted while its job ran: the job id it recorded re-attaches to that job (never
    /// an id computed again: the key may have been rotated since).
    Reattach { job_id: String },
    /// The earlier job failed for good, or published other content: refuse with this problem.
    Refuse(Problem),
}

/// The decision table:
///
/// | earlier record             | same fingerprint | other fingerprint |
/// |----------------------------|------------------|-------------------|
/// | none                       | submit           | submit            |
/// | done                       | reuse its job    | replay_mismatch   |
/// | running (outcome unknown)  | re-attach its job| replay_mismatch   |
/// | failed                     | publication_failed (a corrected attempt needs a new id) |
pub(crate) fn reconcile(previous: Option<&PublicationRecord>, fingerprint: &str) -> Reconciled {
    let Some(previous) = previous else { return Reconciled::Submit };
    let same = previous.fingerprint == fingerprint;
    match previous.state {
        PublicationState::Done if same => Reconciled::Reuse { job_id: previous.job_id.clone() },
        PublicationState::Running if same => Reconciled::Reattach { job_id: previous.job_id.clone() },
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

/// How a publication that is to run (submitted or re-attached) publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PublishBy<'a> {
    /// A query job over the staging table, under the publication's deterministic job id (an
    /// earlier delivery's running job is re-attached to under it, whichever way this delivery
    /// wrote).
    QueryJob,
    /// Committing write streams into the destination (`direct_append`): the streams an earlier
    /// delivery recorded and was committing when it stopped, first, when there are some.
    CommittingStreams { earlier_streams: Option<&'a [String]> },
}

/// The way a publication `decision` runs ([`Reconciled::Submit`] or [`Reconciled::Reattach`];
/// the others never run), from the `previous` record and the way this delivery's lane
/// `written` its rows (`None`: no lane, an empty replacement or a snapshot's end).
pub(crate) fn publish_by<'a>(
    decision: &Reconciled,
    previous: Option<&'a PublicationRecord>,
    written: Option<&WritePath>,
) -> PublishBy<'a> {
    let earlier_streams = match decision {
        Reconciled::Reattach { .. } => previous.and_then(|previous| previous.committed_streams.as_deref()),
        _ => None,
    };
    let written_directly = matches!(written, Some(WritePath::Direct));
    if earlier_streams.is_some() || (written_directly && *decision == Reconciled::Submit) {
        PublishBy::CommittingStreams { earlier_streams }
    } else {
        PublishBy::QueryJob
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

    const DIRECT: Option<&WritePath> = Some(&WritePath::Direct);

    fn staging() -> WritePath {
        WritePath::Staging { staging_table: "_filament_stg_users".into() }
    }

    fn reattach() -> Reconciled {
        Reconciled::Reattach { job_id: "job-1".into() }
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
        assert_eq!(
            reconcile(Some(&record(PublicationState::Running, "f")), "f"),
            Reconciled::Reattach { job_id: "job-1".into() }
        );
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

    #[test]
    fn a_direct_append_commits_its_stream_and_a_staged_one_runs_a_job() {
        assert_eq!(
            publish_by(&Reconciled::Submit, None, DIRECT),
            PublishBy::CommittingStreams { earlier_streams: None }
        );
        assert_eq!(publish_by(&Reconciled::Submit, None, Some(&staging())), PublishBy::QueryJob);
        assert_eq!(publish_by(&Reconciled::Submit, None, None), PublishBy::QueryJob);
    }

    #[test]
    fn an_unfinished_commit_of_streams_is_resolved_by_those_streams_whichever_way_this_delivery_wrote() {
        let mut committing = record(PublicationState::Running, "f");
        committing.committed_streams = Some(vec!["streams/earlier".into()]);
        let earlier_streams = Some(&["streams/earlier".to_string()][..]);
        for written in [DIRECT, Some(&staging()), None] {
            let by = publish_by(&reattach(), Some(&committing), written);
            assert_eq!(by, PublishBy::CommittingStreams { earlier_streams }, "{written:?}");
        }
    }

    #[test]
    fn an_unfinished_query_job_is_reattached_to_even_when_this_delivery_wrote_directly() {
        let running_job = record(PublicationState::Running, "f");
        assert_eq!(publish_by(&reattach(), Some(&running_job), DIRECT), PublishBy::QueryJob);
    }
}
