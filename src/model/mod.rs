//! The vocabulary every stage shares: identifiers and keys ([`ids`]), columns ([`columns`]),
//! the staging contract ([`staging`]), declared table layouts ([`table_options`], [`table_layout`]), write
//! modes and their options ([`write_options`]), the priced plan of a commit ([`publication_plan`]), execution and publication states, and the
//! run's destination and batching settings, with the validation rules of the contract
//! (`openapi/openapi.json`). Anything that reaches SQL or a BigQuery name passes through
//! one of the validated types here first. `model` depends on nothing but [`crate::error`].

pub(crate) mod columns;
pub(crate) mod ids;
pub mod key_ranges;
pub(crate) mod publication_plan;
pub(crate) mod request_bounds;
pub(crate) mod staging;
pub(crate) mod table_layout;
pub(crate) mod table_options;
pub mod write_options;

pub(crate) use ids::{DeliveryRef, ExecutionId, ExecutionKey, ResourceName, ResourceRef, RunId};

use std::fmt;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::error::Problem;
use ids::{validate_dataset_id, validate_location, validate_project_id};

/// Ceiling of the uncompressed payload of one AppendRows request as the operator may set it
/// (`FILAMENT_MAX_APPEND_REQUEST_BYTES`, 8 MiB by default) and of a run's `batching.max_bytes`:
/// BigQuery's 20 MB request limit ("Maximum size of an AppendRows request", the Storage Write
/// API quotas; it was 10 MB) less room for the request's framing.
pub(crate) const MAX_APPEND_PAYLOAD_BYTES: usize = 19 * 1024 * 1024;

/// How a resource's rows reach its destination table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "text", rename_all = "snake_case")]
pub enum WriteMode {
    FullReplace,
    FullAppend,
    FullUpsert,
    IncrementalAppend,
    IncrementalUpsert,
    IncrementalDelete,
    CdcAppend,
    CdcMerge,
    /// Keyed: every version of each key (SCD2), with its validity interval.
    History,
}

impl WriteMode {
    /// Every write mode, in declaration order.
    pub const ALL: [WriteMode; 9] = [
        WriteMode::FullReplace,
        WriteMode::FullAppend,
        WriteMode::FullUpsert,
        WriteMode::IncrementalAppend,
        WriteMode::IncrementalUpsert,
        WriteMode::IncrementalDelete,
        WriteMode::CdcAppend,
        WriteMode::CdcMerge,
        WriteMode::History,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            WriteMode::FullReplace => "full_replace",
            WriteMode::FullAppend => "full_append",
            WriteMode::FullUpsert => "full_upsert",
            WriteMode::IncrementalAppend => "incremental_append",
            WriteMode::IncrementalUpsert => "incremental_upsert",
            WriteMode::IncrementalDelete => "incremental_delete",
            WriteMode::CdcAppend => "cdc_append",
            WriteMode::CdcMerge => "cdc_merge",
            WriteMode::History => "history",
        }
    }

    /// Modes published with a MERGE keyed on the primary key (which they need), ordering each
    /// key's changes by the staged `_filament_seq` (`history` keeps every version, the others
    /// fold each key to its last operation).
    pub(crate) fn is_merge(self) -> bool {
        matches!(
            self,
            WriteMode::FullUpsert
                | WriteMode::IncrementalUpsert
                | WriteMode::IncrementalDelete
                | WriteMode::CdcMerge
                | WriteMode::History
        )
    }

    /// Modes whose publication inserts every staged row as it is (`insert_select`, no fold):
    /// the ones `direct_append` may write straight into the destination.
    pub(crate) fn is_append(self) -> bool {
        matches!(self, WriteMode::FullAppend | WriteMode::IncrementalAppend | WriteMode::CdcAppend)
    }

    /// Modes that need a primary key.
    pub(crate) fn requires_primary_key(self) -> bool {
        self.is_merge()
    }
}

impl fmt::Display for WriteMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Lifecycle of an execution: `extracting -> paused -> committing -> committed | failed`;
/// a commit asked to hold stops at `staged` (every stream committed to staging, the plan
/// recorded, nothing published) until a second commit moves it back to `committing`;
/// `aborted` from any non-terminal state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "text", rename_all = "snake_case")]
pub(crate) enum ExecutionState {
    Extracting,
    Paused,
    Committing,
    /// Staged and planned by a commit asked to hold; nothing published. Nothing of it lives in
    /// a replica's memory, so no lease keeps it: any replica takes the next commit or abort.
    Staged,
    Committed,
    Failed,
    Aborted,
}

impl ExecutionState {
    /// Where batches are accepted.
    pub(crate) const ACCEPTING_BATCHES: &'static [Self] = &[Self::Extracting];
    /// Where checkpoints, pause and commit may still act: extraction has not ended.
    pub(crate) const BEFORE_COMMIT: &'static [Self] = &[Self::Extracting, Self::Paused];
    /// Every state that has not ended: abort and failure move from these.
    pub(crate) const OPEN: &'static [Self] = &[Self::Extracting, Self::Paused, Self::Committing, Self::Staged];
    /// The open states whose work lives in its replica's memory: the replica's lease keeps
    /// them, and one whose lease lapsed is failed (`gateway_restarted`).
    pub(crate) const LEASED: &'static [Self] = &[Self::Extracting, Self::Paused, Self::Committing];

    pub(crate) fn is_terminal(self) -> bool {
        matches!(self, ExecutionState::Committed | ExecutionState::Failed | ExecutionState::Aborted)
    }

    /// Where a commit rests: ended, or held at the barrier (`staged`) until the next request.
    pub(crate) fn is_resting(self) -> bool {
        self.is_terminal() || self == ExecutionState::Staged
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ExecutionState::Extracting => "extracting",
            ExecutionState::Paused => "paused",
            ExecutionState::Committing => "committing",
            ExecutionState::Staged => "staged",
            ExecutionState::Committed => "committed",
            ExecutionState::Failed => "failed",
            ExecutionState::Aborted => "aborted",
        }
    }
}

impl fmt::Display for ExecutionState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a finished job cost and did, as BigQuery reports it (a figure it did not report is absent).
#[derive(Debug, Clone, Default, PartialEq, Eq, sqlx::FromRow, Serialize, Deserialize, ToSchema)]
pub(crate) struct JobCost {
    /// Bytes the job read (`totalBytesProcessed`).
    pub(crate) bytes_processed: Option<i64>,
    /// Bytes billed for it (`totalBytesBilled`; on-demand pricing bills these).
    pub(crate) bytes_billed: Option<i64>,
    /// Slot milliseconds it used (`totalSlotMs`; capacity pricing consumes these).
    pub(crate) slot_ms: Option<i64>,
    /// Rows inserted, updated and deleted (`dmlStats`).
    pub(crate) rows_inserted: Option<i64>,
    pub(crate) rows_updated: Option<i64>,
    pub(crate) rows_deleted: Option<i64>,
}

/// How one delivery of an execution ended (`deliveries.final_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "text", rename_all = "snake_case")]
pub(crate) enum DeliveryOutcome {
    Committed,
    Failed,
    Aborted,
    /// A newer delivery of the execution replaced it before it ended.
    Redelivered,
}

impl DeliveryOutcome {
    /// The outcome of a delivery left in `state` when the next one starts.
    pub(crate) fn replaced_in(state: ExecutionState) -> Self {
        match state {
            ExecutionState::Committed => Self::Committed,
            ExecutionState::Failed => Self::Failed,
            ExecutionState::Aborted => Self::Aborted,
            ExecutionState::Extracting
            | ExecutionState::Paused
            | ExecutionState::Committing
            | ExecutionState::Staged => Self::Redelivered,
        }
    }
}

/// State of one destination table's publication query job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "text", rename_all = "snake_case")]
pub(crate) enum PublicationState {
    Running,
    Done,
    Failed,
}

/// Where a run loads: one BigQuery dataset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
#[serde(deny_unknown_fields)]
pub(crate) struct Destination {
    /// Google Cloud project ID.
    #[schema(example = "my-project")]
    pub(crate) project: String,
    /// BigQuery dataset ID (letters, digits, underscores); created when missing.
    #[schema(example = "raw_filament")]
    pub(crate) dataset: String,
    /// Dataset location (for example `US`, `EU`); empty or absent lets BigQuery decide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) location: Option<String>,
}

impl Destination {
    pub(crate) fn validate(&self) -> Result<(), Problem> {
        validate_project_id(&self.project)?;
        validate_dataset_id(&self.dataset)?;
        if let Some(location) = self.location.as_deref().filter(|l| !l.is_empty()) {
            validate_location(location)?;
        }
        Ok(())
    }

    /// The location, treating an empty string as absent.
    pub(crate) fn location(&self) -> Option<&str> {
        self.location.as_deref().filter(|l| !l.is_empty())
    }
}

/// Per-run overrides of the upload batching policy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Batching {
    /// Rows per upload batch (default 20,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) max_rows: Option<u64>,
    /// Encoded bytes per AppendRows request: every append's payload, upload batches and the
    /// parts a large body is split into alike (default about 8 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) max_bytes: Option<u64>,
    /// Flush interval in milliseconds (default 10,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) flush_interval_ms: Option<u64>,
}

impl Batching {
    pub(crate) fn validate(&self) -> Result<(), Problem> {
        use request_bounds::{BATCHING_FLUSH_INTERVAL_MS, BATCHING_MAX_BYTES, BATCHING_MAX_ROWS, IntegerBounds};
        let check = |name: &str, value: Option<u64>, bounds: IntegerBounds| match value {
            Some(v) if !i64::try_from(v).is_ok_and(|v| bounds.contains(v)) => {
                Err(Problem::invalid_request(format!("batching.{name} must be {}", bounds.describe())))
            }
            _ => Ok(()),
        };
        check("max_rows", self.max_rows, BATCHING_MAX_ROWS)?;
        check("max_bytes", self.max_bytes, BATCHING_MAX_BYTES)?;
        check("flush_interval_ms", self.flush_interval_ms, BATCHING_FLUSH_INTERVAL_MS)
    }
}
