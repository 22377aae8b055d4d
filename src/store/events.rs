//! The timeline of a delivery: events recorded as the gateway acts (delivery started, tables
//! set up, append retries, pause, commit started, streams committed, the priced plan, publication jobs, hand-
//! overs, the end state) and read back in order by `GET .../events`. Recording is best effort:
//! a timeline row that cannot be written is logged and the operation it describes goes on;
//! except a stream's events (set up, committed), which are written by the statement that
//! changes its staging row ([`Store::change_stream`]): one round trip, standing or falling
//! together.
//! None of these is per batch, so a batch costs no extra Postgres round trip, except one that
//! waited [`BACKPRESSURE_EVENT_MIN_MS`] or more for the upload budget: its wait is recorded
//! by a task of its own, after the request let go of what it held.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::{BindKey as _, Store, StoreResult};
use crate::error::ErrorCode;
use crate::model::publication_plan::{PricedPublication, estimated_cost_usd};
use crate::model::staging::WritePath;
use crate::model::{DeliveryRef, ExecutionKey, ExecutionState, ResourceRef};

/// Rows a delivery's timeline holds at most; the end state is recorded even beyond it.
pub(crate) const MAX_EVENTS_PER_DELIVERY: i64 = 1000;

/// The shortest backpressure wait a batch request records (shorter ones are in the metrics
/// only), so a batch that did not wait costs no Postgres round trip.
pub(crate) const BACKPRESSURE_EVENT_MIN_MS: u64 = 100;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "text", rename_all = "snake_case")]
pub(crate) enum EventKind {
    /// A delivery of the execution began (`delivery`).
    DeliveryStarted,
    /// A resource's tables and pending stream are ready (`duration_ms`, `table`). Stored as
    /// `prepare_finished` before its rename: migration 0019 renamed the stored rows, and
    /// `stored_kind!` reads a row a replica of the previous release writes during a rolling
    /// upgrade under the new name.
    #[serde(alias = "prepare_finished")]
    SetUpFinished,
    /// An AppendRows attempt failed (`code`, `attempt`, `retryable`); repeats of one resource
    /// with the same code are one event whose `count` grows.
    AppendRetried,
    /// Batch requests of a resource waited for room in the upload budget for at least
    /// [`BACKPRESSURE_EVENT_MIN_MS`] (`code` `backpressure`, `waited_ms` of the latest,
    /// `total_ms` summed, `refused` how many were then answered 429); repeats are one event
    /// whose `count` grows.
    BackpressureWaited,
    Paused,
    CommitStarted,
    /// A resource's stream was finalized and committed into its staging table (`rows`).
    StreamCommitted,
    /// A resource's publication was planned at the barrier, before any publication (`path`,
    /// `statement`, `bytes_processed`, `estimated_cost_usd`, `query_jobs`, and `unpriced` when
    /// the statement could not be dry-run).
    Planned,
    /// A commit asked to hold stopped at the barrier: every stream staged, the plan recorded,
    /// nothing published (`over_budget` names why a commit of it would fail, when it would).
    Staged,
    /// A destination's publication job (one attempt) was submitted (`job_id`).
    PublicationStarted,
    /// A destination's publication job ended (`job_id`, `duration_ms`, `rows_affected`,
    /// `bytes_billed`), or failed (`job_id`, `code`, `hint`).
    PublicationFinished,
    PublicationFailed,
    /// Another replica adopted the execution (`replica`).
    HandedOver,
    /// The delivery's end state (`state`, and `code`, `hint` when it failed).
    Ended,
}

/// How a repeat of an event folds into the resource's latest event of the same kind and code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Coalescing {
    /// Every occurrence is an event of its own.
    Never,
    /// The latest event's `count` grows and its detail becomes the repeat's.
    KeepLatest,
    /// As [`Coalescing::KeepLatest`], with `total_ms` and `refused` summed.
    SumWaits,
}

impl EventKind {
    /// How repeats of this kind coalesce.
    pub(crate) fn coalescing(self) -> Coalescing {
        match self {
            EventKind::AppendRetried => Coalescing::KeepLatest,
            EventKind::BackpressureWaited => Coalescing::SumWaits,
            _ => Coalescing::Never,
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            EventKind::DeliveryStarted => "delivery_started",
            EventKind::SetUpFinished => "set_up_finished",
            EventKind::AppendRetried => "append_retried",
            EventKind::BackpressureWaited => "backpressure_waited",
            EventKind::Paused => "paused",
            EventKind::CommitStarted => "commit_started",
            EventKind::StreamCommitted => "stream_committed",
            EventKind::Planned => "planned",
            EventKind::Staged => "staged",
            EventKind::PublicationStarted => "publication_started",
            EventKind::PublicationFinished => "publication_finished",
            EventKind::PublicationFailed => "publication_failed",
            EventKind::HandedOver => "handed_over",
            EventKind::Ended => "ended",
        }
    }
}

/// What happened, with the detail the timeline keeps of it: one variant per [`EventKind`],
/// its fields serialized as `GET .../events` answers them.
#[derive(Debug, Clone)]
pub(crate) enum Event<'a> {
    DeliveryStarted {
        delivery: i32,
        replica: &'a str,
    },
    AppendRetried {
        code: String,
        attempt: u32,
        retryable: bool,
    },
    /// One batch request's wait for the upload budget, and whether it was then refused.
    BackpressureWaited {
        waited_ms: u64,
        refused: bool,
    },
    Paused,
    CommitStarted,
    /// The resource's priced plan, at the price in force.
    Planned {
        priced: &'a PricedPublication,
        price_per_tib_usd: f64,
    },
    Staged {
        over_budget: Option<&'a str>,
    },
    PublicationStarted {
        job_id: &'a str,
    },
    PublicationFinished {
        job_id: &'a str,
        duration_ms: u64,
        rows_affected: Option<i64>,
        bytes_billed: Option<i64>,
    },
    PublicationFailed {
        job_id: &'a str,
        duration_ms: u64,
        code: ErrorCode,
        hint: Option<&'a str>,
    },
    HandedOver {
        replica: &'a str,
    },
    Ended {
        state: ExecutionState,
    },
}

impl Event<'_> {
    pub(crate) fn kind(&self) -> EventKind {
        match self {
            Event::DeliveryStarted { .. } => EventKind::DeliveryStarted,
            Event::AppendRetried { .. } => EventKind::AppendRetried,
            Event::BackpressureWaited { .. } => EventKind::BackpressureWaited,
            Event::Paused => EventKind::Paused,
            Event::CommitStarted => EventKind::CommitStarted,
            Event::Planned { .. } => EventKind::Planned,
            Event::Staged { .. } => EventKind::Staged,
            Event::PublicationStarted { .. } => EventKind::PublicationStarted,
            Event::PublicationFinished { .. } => EventKind::PublicationFinished,
            Event::PublicationFailed { .. } => EventKind::PublicationFailed,
            Event::HandedOver { .. } => EventKind::HandedOver,
            Event::Ended { .. } => EventKind::Ended,
        }
    }

    /// The detail as stored and answered.
    pub(crate) fn detail(&self) -> Value {
        match self {
            Event::DeliveryStarted { delivery, replica } => json!({"delivery": delivery, "replica": replica}),
            Event::AppendRetried { code, attempt, retryable } => {
                json!({"code": code, "attempt": attempt, "retryable": retryable})
            }
            Event::BackpressureWaited { waited_ms, refused } => json!({"code": "backpressure", "waited_ms": waited_ms,
                "total_ms": waited_ms, "refused": u8::from(*refused)}),
            Event::Paused | Event::CommitStarted => json!({}),
            Event::Planned { priced, price_per_tib_usd } => json!({"path": priced.path, "statement": priced.statement,
                "bytes_processed": priced.bytes_processed, "query_jobs": priced.query_jobs, "unpriced": priced.unpriced,
                "estimated_cost_usd": priced.bytes_processed.map(|bytes| estimated_cost_usd(bytes, *price_per_tib_usd))}),
            Event::Staged { over_budget } => json!({"over_budget": over_budget}),
            Event::PublicationStarted { job_id } => json!({"job_id": job_id}),
            Event::PublicationFinished { job_id, duration_ms, rows_affected, bytes_billed } => json!({"job_id": job_id,
                "duration_ms": duration_ms, "rows_affected": rows_affected, "bytes_billed": bytes_billed}),
            Event::PublicationFailed { job_id, duration_ms, code, hint } => {
                json!({"job_id": job_id, "duration_ms": duration_ms, "code": code, "hint": hint})
            }
            Event::HandedOver { replica } => json!({"replica": replica}),
            Event::Ended { state } => json!({"state": state}),
        }
    }
}

/// The stored kind as read, a kind renamed since it was written under its new name (the
/// previous release's replicas write `prepare_finished` until they are replaced).
macro_rules! stored_kind {
    () => {
        "CASE kind WHEN 'prepare_finished' THEN 'set_up_finished' ELSE kind END AS kind"
    };
}

/// One event as stored and answered.
#[derive(Debug, Clone, Serialize, ToSchema, sqlx::FromRow)]
pub(crate) struct EventRecord {
    /// Increasing: pass the last one seen as `after` to get only newer events.
    pub(crate) event_id: i64,
    pub(crate) delivery: i32,
    /// When it happened (the last time, for a coalesced event).
    pub(crate) at: DateTime<Utc>,
    pub(crate) kind: EventKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) resource: Option<String>,
    /// How many times it happened (coalesced retries); 1 otherwise.
    pub(crate) count: i32,
    #[schema(value_type = Object)]
    pub(crate) detail: Value,
}

// The common table expressions of [`RECORD_EVENT`], as a literal: a statement that changes
// state first ([`StreamChange`]) prefixes its own and stays a constant.
macro_rules! record_event_ctes {
    () => {
        "latest AS (
     SELECT event_id FROM execution_events
     WHERE run_id = $1 AND execution_id = $2 AND delivery = $3 AND resource IS NOT DISTINCT FROM $5
     ORDER BY event_id DESC LIMIT 1
 ), coalesced AS (
     UPDATE execution_events ev SET count = ev.count + 1, at = now(),
         detail = CASE WHEN $9 THEN $6::jsonb || jsonb_build_object(
                 'total_ms', COALESCE((ev.detail->>'total_ms')::bigint, 0) + ($6::jsonb->>'total_ms')::bigint,
                 'refused', COALESCE((ev.detail->>'refused')::bigint, 0) + COALESCE(($6::jsonb->>'refused')::bigint, 0))
             ELSE $6 END
     FROM latest
     WHERE ev.event_id = latest.event_id AND $7 AND ev.kind = $4 AND ev.detail->>'code' = $6::jsonb->>'code'
     RETURNING 1
 )
 INSERT INTO execution_events (run_id, execution_id, delivery, kind, resource, detail)
 SELECT $1, $2, $3, $4, $5, $6
 WHERE NOT EXISTS (SELECT 1 FROM coalesced)
   AND ($4 = 'ended' OR (SELECT COUNT(*) FROM execution_events
                         WHERE run_id = $1 AND execution_id = $2 AND delivery = $3) < $8)"
    };
}
/// Coalesces into the resource's latest event when that is the same kind with the same
/// `code`, as the kind's [`Coalescing`] says (`$7`: at all; `$9`: summing `total_ms` and
/// `refused`); otherwise inserts, within the bound (the end state always).
pub(super) const RECORD_EVENT: &str = concat!("WITH ", record_event_ctes!());

/// A change to a resource's staging row that its timeline records, in one statement.
#[derive(Debug, Clone, Copy)]
pub(crate) enum StreamChange<'a> {
    /// Its PENDING stream exists: its name is recorded before any commit, so a commit whose
    /// answer was lost can be resolved by asking BigQuery (`set_up_finished`).
    /// `path`: where the stream writes (the destination `table` itself, or a staging table);
    /// `declined`: why a resource declared `direct_append` loads through staging all the same.
    Created { stream_name: &'a str, duration_ms: u64, table: &'a str, path: &'a WritePath, declined: Option<&'a str> },
    /// Its stream was finalized with `rows` and committed into its staging table
    /// (`stream_committed`); both recorded by this one statement.
    Committed { stream_name: &'a str, rows: i64 },
}

impl StreamChange<'_> {
    /// The event's detail as stored and answered.
    fn detail(self) -> Value {
        match self {
            StreamChange::Created { duration_ms, table, path, declined, .. } => {
                let path = match path {
                    WritePath::Direct => "direct_append",
                    WritePath::Staging { .. } => "staging",
                };
                let mut detail = json!({"duration_ms": duration_ms, "table": table, "path": path});
                if let Some(declined) = declined {
                    detail["direct_append_declined"] = json!(declined);
                }
                detail
            }
            StreamChange::Committed { stream_name, rows } => json!({"rows": rows, "stream": stream_name}),
        }
    }

    /// The event, and the statement: the staging row's change (over the event's parameters,
    /// `$10` the stream name, or the finalized row count) as a data-modifying `WITH`, which runs whether or not the event
    /// is inserted, then the event.
    fn parts(self) -> (EventKind, &'static str) {
        match self {
            StreamChange::Created { .. } => (
                EventKind::SetUpFinished,
                concat!(
                    "WITH changed AS (UPDATE staging_streams SET stream_name = $10, stream_created_at = now(),
                             direct_append = $11
                         WHERE run_id = $1 AND execution_id = $2 AND delivery = $3 AND resource = $5), ",
                    record_event_ctes!()
                ),
            ),
            StreamChange::Committed { .. } => (
                EventKind::StreamCommitted,
                concat!(
                    "WITH changed AS (UPDATE staging_streams SET committed_at = now(), finalized_row_count = $10
                         WHERE run_id = $1 AND execution_id = $2 AND delivery = $3 AND resource = $5), ",
                    record_event_ctes!()
                ),
            ),
        }
    }
}

/// `statement`'s first nine parameters, as [`RECORD_EVENT`] numbers them.
pub(super) fn bind_event<'q>(
    statement: &'q str,
    delivery: &'q DeliveryRef,
    kind: EventKind,
    resource: Option<&'q str>,
    detail: &'q Value,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    sqlx::query(statement)
        .bind_delivery(delivery)
        .bind(kind.as_str())
        .bind(resource)
        .bind(detail)
        .bind(kind.coalescing() != Coalescing::Never)
        .bind(MAX_EVENTS_PER_DELIVERY)
        .bind(kind.coalescing() == Coalescing::SumWaits)
}

impl Store {
    /// Changes the resource's staging row and records the change on its delivery's timeline,
    /// in one statement.
    pub(crate) async fn change_stream(&self, resource: &ResourceRef, change: StreamChange<'_>) -> StoreResult<()> {
        let (kind, statement) = change.parts();
        let detail = change.detail();
        let query = bind_event(statement, &resource.delivery, kind, Some(&resource.resource), &detail);
        let query = match change {
            // Stored as the `direct_append` column.
            StreamChange::Created { stream_name, path, .. } => {
                query.bind(stream_name).bind(matches!(path, WritePath::Direct))
            }
            // Finalized with that count just before: recorded with the commit, one statement.
            StreamChange::Committed { rows, .. } => query.bind(rows),
        };
        query.execute(&self.pool).await?;
        Ok(())
    }

    /// Records `event` for `delivery` (and `resource`); logs and goes on when it cannot.
    pub(crate) async fn record_event(&self, delivery: &DeliveryRef, resource: Option<&str>, event: Event<'_>) {
        let (kind, detail) = (event.kind(), event.detail());
        let recorded = bind_event(RECORD_EVENT, delivery, kind, resource, &detail).execute(&self.pool).await;
        if let Err(error) = recorded {
            tracing::warn!(run_id = %delivery.run_id(), execution_id = %delivery.execution_id(), kind = kind.as_str(),
                %error, "store.event_not_recorded");
        }
    }

    /// Records several events of `delivery` in one transaction (the plan's `planned` events, one
    /// per resource); logs and goes on when it cannot.
    pub(crate) async fn record_events(&self, delivery: &DeliveryRef, events: &[(Option<&str>, Event<'_>)]) {
        let recorded: Result<(), sqlx::Error> = async {
            let mut tx = self.pool.begin().await?;
            for (resource, event) in events {
                let detail = event.detail();
                bind_event(RECORD_EVENT, delivery, event.kind(), *resource, &detail).execute(&mut *tx).await?;
            }
            tx.commit().await
        }
        .await;
        if let Err(error) = recorded {
            tracing::warn!(run_id = %delivery.run_id(), execution_id = %delivery.execution_id(), events = events.len(),
                %error, "store.event_not_recorded");
        }
    }

    /// The execution's newest `limit` events (every delivery), oldest first.
    pub(crate) async fn latest_events(&self, key: &ExecutionKey, limit: i64) -> StoreResult<Vec<EventRecord>> {
        let mut events: Vec<EventRecord> = sqlx::query_as(concat!(
            "SELECT event_id, delivery, at, ",
            stored_kind!(),
            ", resource, count, detail FROM execution_events
             WHERE run_id = $1 AND execution_id = $2 ORDER BY event_id DESC LIMIT $3"
        ))
        .bind_execution(key)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        events.reverse();
        Ok(events)
    }

    /// The execution's events after `after` (every delivery), oldest first, at most `limit`.
    pub(crate) async fn events_after(
        &self,
        key: &ExecutionKey,
        after: i64,
        limit: i64,
    ) -> StoreResult<Vec<EventRecord>> {
        Ok(sqlx::query_as(concat!(
            "SELECT event_id, delivery, at, ",
            stored_kind!(),
            ", resource, count, detail FROM execution_events
             WHERE run_id = $1 AND execution_id = $2 AND event_id > $3
             ORDER BY event_id LIMIT $4"
        ))
        .bind_execution(key)
        .bind(after)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }
}
