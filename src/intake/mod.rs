//! Intake: one batch request, from its body to rows queued on the resource's upload lane.
//!
//! The HTTP handler (`api::batches`) checks what the request says about itself and loads what
//! it names ([`BatchTarget`]); from there the request's path stays here and goes on forward:
//! get admitted (room in the resource's share, `pipeline::admission`), read and decode the body
//! under the receive budget (`ingest::decode`), prepare it against the declaration, its staged
//! size known (`ingest::prepare`), convert and encode it under the upload budget, then record
//! the receipt (`store::batches`) and queue the rows under the execution's gate (`pipeline`).
//! The order is carried by the admission types, so a rejected request changes nothing and
//! every byte it makes the gateway hold is counted before it is allocated.

mod problems;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use futures::{Stream, StreamExt as _};
use tracing::Instrument as _;

use crate::error::{ErrorCode, Problem};
use crate::ingest::IngestError;
use crate::ingest::decode::{BodyDecoder, DecodedBody, Progress};
use crate::ingest::encode::PayloadLimits;
use crate::ingest::prepare::{BatchLimits, BodySummary, Declaration, PreparedBatch, prepare};
use crate::model::key_ranges::KeyRange;
use crate::model::staging::staging_table_name;
use crate::model::{ExecutionState, ResourceRef};
use crate::pipeline::lane::BatchingPolicy;
use crate::pipeline::{Admission, Converting, DeliveryLanes, LaneTarget, Pipeline, ReservedBatch};
use crate::principals::Principal;
use crate::replica::{Owned, Replica};
use crate::store::{
    BACKPRESSURE_EVENT_MIN_MS, Event, ExecutionRecord, InsertBatch, NewBatch, ReceiptRecord, ResourceRecord, RunRecord,
    Store,
};
use crate::telemetry;
use problems::{redeclared, replayed, schema_mismatch};

/// What a batch request loads into: the run, the declared resource and the execution's
/// current delivery, which this replica serves.
pub(crate) struct BatchTarget {
    pub(crate) run: RunRecord,
    pub(crate) declared: ResourceRecord,
    pub(crate) execution: Owned<ExecutionRecord>,
}

/// One batch request as intake takes it: where it goes, its `seq`, the body's length when the
/// request declares it, and the body's bytes (read errors already answered as problems).
pub(crate) struct BatchRequest<B> {
    pub(crate) target: BatchTarget,
    /// Who sends it: its share of the gateway bounds what the request may hold.
    pub(crate) principal: Arc<Principal>,
    pub(crate) seq: Option<i64>,
    pub(crate) declared_length: Option<usize>,
    pub(crate) body: B,
}

/// How an accepted batch request ends.
#[derive(Debug)]
pub(crate) enum Accepted {
    /// Recorded and queued for upload.
    Queued(ReceiptRecord),
    /// The `seq` was accepted before with the same body: its original receipt.
    Replayed(ReceiptRecord),
}

/// What intake works with; borrowed from the gateway's state per request.
pub(crate) struct Intake<'a> {
    pub(crate) store: &'a Store,
    pub(crate) pipeline: &'a Pipeline,
    pub(crate) replica: &'a Replica,
    pub(crate) limits: BatchLimits,
}

/// A request past admission: a `seq` accepted before, or a new batch converting under the
/// upload budget.
enum Admitted {
    Replay(ReceiptRecord),
    New(Converting, Box<PreparedBatch>),
}

/// The request's place in its execution, fixed once loaded.
struct Loaded {
    target: BatchTarget,
    resource: ResourceRef,
    lanes: Arc<DeliveryLanes>,
}

impl Intake<'_> {
    /// Accepts one batch request, or refuses it having changed nothing.
    pub(crate) async fn accept<B>(&self, request: BatchRequest<B>) -> Result<Accepted, Problem>
    where
        B: Stream<Item = Result<Bytes, Problem>> + Unpin,
    {
        let BatchRequest { target, principal, seq, declared_length, body } = request;
        let loaded = self.load(target)?;
        let share = self.pipeline.principal_share(principal.name.as_str(), principal.max_buffered_bytes);
        let admitted_at = Instant::now();
        let admitted = async {
            let admitting = stage_span("batch.admission");
            let mut admission = self
                .pipeline
                .admit(&loaded.lanes, &loaded.resource.resource, declared_length, share)
                .instrument(admitting.clone())
                .await?;
            let decoding = stage_span("batch.decode");
            let body = self.receive_body(body, &mut admission).instrument(decoding.clone()).await?;
            let prepared = self.prepare_body(&loaded, seq, body).instrument(decoding).await?;
            Ok::<_, Problem>(match prepared {
                Prepared::Replay(receipt) => Admitted::Replay(receipt),
                Prepared::New(prepared) => {
                    let reserved = admission.reserve(prepared.staged_bytes()).instrument(admitting).await?;
                    Admitted::New(reserved, prepared)
                }
            })
        };
        let (converting, prepared) = match admitted.await {
            Ok(Admitted::New(converting, prepared)) => (converting, prepared),
            Ok(Admitted::Replay(receipt)) => return Ok(Accepted::Replayed(receipt)),
            Err(problem) => {
                if problem.code == ErrorCode::Backpressure {
                    // It waited out what was left of the backpressure wait, at most all of it.
                    let waited = admitted_at.elapsed().min(self.pipeline.backpressure_wait());
                    self.record_backpressure(&loaded.resource, waited, true);
                }
                return Err(problem);
            }
        };
        self.record_backpressure(&loaded.resource, converting.waited(), false);
        let (mut encoded, summary) = stage_span("batch.convert_and_encode").in_scope(|| prepared.encode())?;
        // Once the lane's set-up has learned what the destination asks of each value, a batch
        // that breaks it is refused here, before anything is recorded. A batch of another schema
        // than the lane's is not checked against them: its receipt's transaction refuses it.
        let resource = &loaded.resource.resource;
        if let Some(rules) = self.pipeline.destination_rules(&loaded.lanes, resource, &summary.canonical_schema_sha256)
        {
            rules.check_payloads(&encoded.payloads)?;
        }
        let key_ranges = encoded.key_ranges.take();
        let reserved = converting.settle(encoded);
        self.record_and_enqueue(&loaded, seq, summary, key_ranges, reserved).await
    }

    /// A wait for room in the upload budget on the timeline, when it lasted long enough to
    /// matter; recorded by a task of its own, so the request does not hold what it was
    /// admitted to (its budget, its conversion slot) through another round trip.
    fn record_backpressure(&self, resource: &ResourceRef, waited: Duration, refused: bool) {
        let waited_ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX);
        if waited_ms < BACKPRESSURE_EVENT_MIN_MS {
            return;
        }
        let (store, resource) = (self.store.clone(), resource.clone());
        tokio::spawn(async move {
            let name: &str = &resource.resource;
            let waited = Event::BackpressureWaited { waited_ms, refused };
            store.record_event(&resource.delivery, Some(name), waited).await;
        });
    }

    /// The execution must accept batches; its delivery's lanes are opened for them.
    fn load(&self, target: BatchTarget) -> Result<Loaded, Problem> {
        let execution = &target.execution;
        if !ExecutionState::ACCEPTING_BATCHES.contains(&execution.state) {
            return Err(Problem::new(
                ErrorCode::ExecutionNotExtracting,
                format!("execution {} is {}; it accepts no more batches", execution.execution_id, execution.state),
            ));
        }
        let lanes = self.pipeline.open_delivery(&execution.key(), execution.delivery);
        let resource = execution.delivery_ref().resource(target.declared.resource.clone());
        self.pipeline.check_lane_room(&lanes, &resource.resource, &target.run.principal)?;
        Ok(Loaded { target, resource, lanes })
    }

    /// Reads and decodes the body, holding what it receives (and what IPC-compressed buffers
    /// decompress to, and the room a message's buffer takes ahead of its bytes) in the receive
    /// budget before decoding allocates it.
    async fn receive_body<B>(&self, mut body: B, admission: &mut Admission) -> Result<DecodedBody, Problem>
    where
        B: Stream<Item = Result<Bytes, Problem>> + Unpin,
    {
        let max_body_bytes = self.limits.max_batch_body_bytes;
        let mut decoder = BodyDecoder::pooled(max_body_bytes, self.pipeline.message_buffers());
        let (mut received, mut held) = (0usize, admission.received_bytes());
        while let Some(chunk) = body.next().await {
            let mut chunk = chunk?;
            received = received.saturating_add(chunk.len());
            if received > max_body_bytes {
                return Err(IngestError::BodyTooLarge { limit_bytes: max_body_bytes }.into());
            }
            if received > held {
                admission.hold_received(received - held).await?;
                held = received;
            }
            while !chunk.is_empty() {
                if let Progress::MessageComplete { decompressed_bytes } = decoder.push_some(&mut chunk)? {
                    admission.hold_received(decompressed_bytes).await?;
                    decoder.decode_completed()?;
                }
                // A message's buffer, taken at its length, is counted before its bytes arrive.
                let to_hold = decoder.bytes_to_hold();
                if to_hold > held {
                    admission.hold_received(to_hold - held).await?;
                    held = to_hold;
                }
            }
        }
        Ok(decoder.finish()?)
    }

    /// The body checked against the declaration, its staged size known; or the receipt of a
    /// `seq` accepted before. Its schema is checked against the resource's earlier batches in
    /// this delivery by the receipt's transaction (`InsertBatch::SchemaMismatch`).
    async fn prepare_body(&self, loaded: &Loaded, seq: Option<i64>, body: DecodedBody) -> Result<Prepared, Problem> {
        let declared = &loaded.target.declared;
        let declaration = Declaration {
            write_mode: declared.write_mode,
            primary_key: &declared.primary_key,
            order_by: &declared.write_options.order_by,
            table_options: declared.table_options.as_ref(),
        };
        // The run's batch size (rows and bytes) also bounds the requests of one large body.
        let run_batch = BatchingPolicy::new(&loaded.target.run.batching, usize::MAX);
        let run_batch = PayloadLimits { max_bytes: run_batch.max_bytes, max_rows: run_batch.max_rows };
        let prepared = prepare(body, declaration, seq, &self.limits, run_batch)?;
        let summary = prepared.summary();
        if let Some(seq) = seq
            && let Some(existing) = self.store.find_receipt(&loaded.resource, seq).await?
        {
            return replayed(existing, &summary.arrow_ipc_sha256).map(Prepared::Replay);
        }
        Ok(Prepared::New(Box::new(prepared)))
    }

    /// Under the execution's gate (shared), re-checks the state, records the receipt, stamps
    /// the rows with its `seq` and queues them on the resource's lane.
    async fn record_and_enqueue(
        &self,
        loaded: &Loaded,
        seq: Option<i64>,
        body: BodySummary,
        key_ranges: Option<Vec<KeyRange>>,
        reserved: ReservedBatch,
    ) -> Result<Accepted, Problem> {
        let accepting = loaded.lanes.accepting().await;
        let principal = &loaded.target.run.principal;
        let lane_place = self.pipeline.lane_place(&accepting, &loaded.resource.resource, principal)?;
        let declared = &loaded.target.declared;
        let staging_table = staging_table_name(&loaded.resource, &declared.table_name);
        let new_batch = NewBatch {
            resource: &loaded.resource,
            seq,
            rows: body.rows as i64,
            uncompressed_bytes: body.uncompressed_bytes as i64,
            arrow_ipc_sha256: &body.arrow_ipc_sha256,
            arrow_schema: &body.canonical_schema,
            arrow_schema_sha256: &body.canonical_schema_sha256,
            staging_table: &staging_table,
            key_ranges: key_ranges.as_ref().map(|ranges| serde_json::json!(ranges)),
            declaration: declared,
            serving_replica: &self.replica.lease.owner,
        };
        let inserted = match self.store.insert_batch(&new_batch).await? {
            // Claimed again: adopted (then recorded), or the reason it takes no batch here.
            InsertBatch::NotServing => {
                self.recheck_under_gate(loaded).await?;
                self.store.insert_batch(&new_batch).await?
            }
            inserted => inserted,
        };
        let (receipt, handed_over) = match inserted {
            InsertBatch::Inserted { receipt, handed_over } => (receipt, handed_over),
            InsertBatch::SeqTaken(existing) => {
                return replayed(existing, &body.arrow_ipc_sha256).map(Accepted::Replayed);
            }
            InsertBatch::SchemaMismatch { recorded } => {
                return Err(schema_mismatch(&loaded.resource.resource, &recorded, &body.canonical_schema));
            }
            InsertBatch::DeclarationChanged { current } => return Err(redeclared(declared, current.as_ref())),
            InsertBatch::NotServing => return Err(not_serving(&loaded.target.execution)),
        };
        let queued = reserved.accept(&receipt)?;
        let (rows, uncompressed_bytes) = (body.rows as u64, body.uncompressed_bytes as u64);
        let lane_target = || LaneTarget::new(loaded.resource.clone(), &loaded.target.run, declared, body, handed_over);
        self.pipeline.enqueue(&accepting, &loaded.resource.resource, lane_target, queued, lane_place);
        telemetry::batch_queued(rows, uncompressed_bytes);
        Ok(Accepted::Queued(receipt))
    }

    /// A transition or redelivery may have happened while the body was read, and the owner
    /// may have handed the execution over meanwhile (it is shutting down): asked when the
    /// receipt's transaction found the execution not served here (`InsertBatch::NotServing`),
    /// it adopts a handed-over execution or answers why no batch is taken.
    async fn recheck_under_gate(&self, loaded: &Loaded) -> Result<(), Problem> {
        let key = loaded.target.execution.key();
        let current = self.store.get_execution(&key).await?.ok_or_else(|| Problem::not_found(&key))?;
        let current = self.replica.claim(current).await?;
        if !ExecutionState::ACCEPTING_BATCHES.contains(&current.state)
            || current.delivery != loaded.target.execution.delivery
        {
            return Err(Problem::new(
                ErrorCode::ExecutionNotExtracting,
                format!(
                    "execution {} is {} (delivery {}); it accepts no more batches",
                    current.execution_id, current.state, current.delivery
                ),
            ));
        }
        Ok(())
    }
}

/// The receipt's transaction found the execution not served here although a claim just now
/// said it was: it changed again meanwhile.
fn not_serving(execution: &ExecutionRecord) -> Problem {
    Problem::new(
        ErrorCode::ExecutionNotExtracting,
        format!(
            "execution {} changed while the batch was recorded; it accepts no more batches here",
            execution.execution_id
        ),
    )
}

enum Prepared {
    /// The `seq` was accepted before: its receipt.
    Replay(ReceiptRecord),
    New(Box<PreparedBatch>),
}

/// A span of one stage of accepting a batch, under the request's (`crate::traces`).
fn stage_span(stage: &'static str) -> tracing::Span {
    tracing::trace_span!(target: crate::traces::TARGET, "batch.stage", otel.name = stage)
}
