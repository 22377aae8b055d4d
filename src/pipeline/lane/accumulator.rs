//! The accumulator of a lane: coalesces accepted payloads into upload batches (max rows, max
//! bytes, flush interval; flushed on demand at checkpoints and when the lane closes) and hands
//! them, each with its part of the byte budget and the staged rows it encodes (which the lane
//! checks against the destination before appending, `super::check_uploads`), to the
//! [`super::appender`]. Rows held back for a fuller batch also go at once while a request waits
//! for the budget or for the resource's share ([`LanePressure`]).

use arrow_array::RecordBatch;
use bytes::Bytes;
use tokio::sync::{mpsc, watch};

use super::{BatchingPolicy, LaneCommand};
use crate::ingest::encode::{AppendPayload, record_batch_message};
use crate::pipeline::admission::QueuedRows;
use crate::pipeline::budget::BudgetPermit;

/// One upload batch ready to send.
#[derive(Debug)]
pub(super) struct UploadBatch {
    pub(super) rows: usize,
    pub(super) message: Bytes,
    /// The staged rows the message encodes, per batch request: taken (and dropped) by the
    /// lane's check before the batch is appended.
    pub(super) staged: Vec<StagedRows>,
    /// Held until the upload is acknowledged: dropping it returns its bytes to the budget.
    pub(super) _budget: BudgetPermit,
}

/// Staged rows of one batch request in an upload batch, with where they came from.
#[derive(Debug)]
pub(super) struct StagedRows {
    /// `None` only for payloads built without them (never by intake).
    pub(super) batch: Option<RecordBatch>,
    /// The batch request's receipt `seq`.
    pub(super) seq: i64,
    /// The index of the first row in its body.
    pub(super) first_row: usize,
}

impl StagedRows {
    fn of(seq: i64, payload: AppendPayload) -> (Self, Bytes, usize) {
        let AppendPayload { rows, first_row, serialized_record_batch, batch } = payload;
        (Self { batch, seq, first_row }, serialized_record_batch, rows)
    }
}

/// One payload as its own upload batch.
fn upload_of(seq: i64, payload: AppendPayload, budget: BudgetPermit) -> UploadBatch {
    let (staged, message, rows) = StagedRows::of(seq, payload);
    UploadBatch { rows, message, staged: vec![staged], _budget: budget }
}

/// Coalesces payloads into upload batches. Payloads at least half a batch go out as encoded at
/// request time (never above the run's `max_bytes`: intake splits by it); smaller ones
/// accumulate (as staged rows) and are re-encoded together.
pub(super) async fn accumulate(
    policy: BatchingPolicy,
    mut commands: mpsc::UnboundedReceiver<LaneCommand>,
    upload_batches: mpsc::UnboundedSender<UploadBatch>,
    mut pressure: LanePressure,
) {
    let mut pending = Pending::default();
    loop {
        let deadline = pending.started.map(|started| started + policy.flush_interval);
        let command = tokio::select! {
            command = commands.recv() => command,
            () = sleep_until_opt(deadline) => {
                pending.flush(&policy, &upload_batches);
                continue;
            }
            () = raised(&mut pressure, pending.started.is_some()) => {
                pending.flush(&policy, &upload_batches);
                continue;
            }
        };
        match command {
            Some(LaneCommand::Rows(rows)) => pending.add(rows, &policy, &upload_batches),
            Some(LaneCommand::Flush(done)) => {
                pending.flush(&policy, &upload_batches);
                let _ = done.send(());
            }
            None => {
                pending.flush(&policy, &upload_batches);
                return;
            }
        }
    }
}

/// What makes a lane send the rows it holds back: requests waiting for the gateway's budget,
/// or for this resource's share of it ([`super::budget::Pressure`]).
#[derive(Debug)]
pub(crate) struct LanePressure {
    pub(crate) budget: watch::Receiver<usize>,
    pub(crate) share: watch::Receiver<usize>,
}

/// Completes while the lane holds rows and a request waits for the budget or the share; never
/// otherwise.
async fn raised(pressure: &mut LanePressure, holding_rows: bool) {
    if holding_rows {
        let LanePressure { budget, share } = pressure;
        tokio::select! {
            Ok(_) = budget.wait_for(|waiting| *waiting > 0) => return,
            Ok(_) = share.wait_for(|waiting| *waiting > 0) => return,
            else => {}
        }
    }
    std::future::pending::<()>().await;
}

async fn sleep_until_opt(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Rows accumulated towards the next upload batch.
#[derive(Debug, Default)]
struct Pending {
    /// Each payload with its batch request's `seq`.
    pieces: Vec<(i64, AppendPayload)>,
    permit: Option<BudgetPermit>,
    rows: usize,
    bytes: usize,
    /// When the oldest accumulated rows arrived (tokio's clock, so tests can pause time).
    started: Option<tokio::time::Instant>,
}

impl Pending {
    /// Takes one request's payloads: big ones go out at once (after what is pending), small
    /// ones accumulate, flushing first when they would overflow the batch.
    fn add(&mut self, rows: QueuedRows, policy: &BatchingPolicy, upload_batches: &mpsc::UnboundedSender<UploadBatch>) {
        let (payloads, permit, seq) = rows.into_parts();
        let permits = permit.divide(payloads.iter().map(|p| p.serialized_record_batch.len()));
        for (payload, share) in payloads.into_iter().zip(permits) {
            let big =
                payload.rows * 2 >= policy.max_rows || payload.serialized_record_batch.len() * 2 >= policy.max_bytes;
            if big {
                self.flush(policy, upload_batches);
                let _ = upload_batches.send(upload_of(seq, payload, share));
                continue;
            }
            if self.rows + payload.rows > policy.max_rows
                || self.bytes + payload.serialized_record_batch.len() > policy.max_bytes
            {
                self.flush(policy, upload_batches);
            }
            self.push(seq, payload, share);
        }
    }

    fn push(&mut self, seq: i64, payload: AppendPayload, permit: BudgetPermit) {
        self.rows += payload.rows;
        self.bytes += payload.serialized_record_batch.len();
        self.started.get_or_insert_with(tokio::time::Instant::now);
        match self.permit.as_mut() {
            Some(held) => held.merge(permit),
            None => self.permit = Some(permit),
        }
        self.pieces.push((seq, payload));
    }

    fn flush(&mut self, policy: &BatchingPolicy, upload_batches: &mpsc::UnboundedSender<UploadBatch>) {
        let pieces = std::mem::take(&mut self.pieces);
        let permit = self.permit.take().unwrap_or_else(BudgetPermit::empty);
        let rows = std::mem::take(&mut self.rows);
        self.bytes = 0;
        self.started = None;
        if pieces.is_empty() {
            return;
        }
        if pieces.len() > 1
            && let Some(message) = coalesced(&pieces, policy.max_bytes)
        {
            let staged = pieces.into_iter().map(|(seq, piece)| StagedRows::of(seq, piece).0).collect();
            let _ = upload_batches.send(UploadBatch { rows, message, staged, _budget: permit });
            return;
        }
        // One piece, or coalescing did not fit: send the pieces as encoded at request time.
        let permits = permit.divide(pieces.iter().map(|(_, p)| p.serialized_record_batch.len()));
        for ((seq, piece), share) in pieces.into_iter().zip(permits) {
            let _ = upload_batches.send(upload_of(seq, piece, share));
        }
    }
}

/// The pieces' staged rows as one record-batch message, when it fits in `max_bytes`.
fn coalesced(pieces: &[(i64, AppendPayload)], max_bytes: usize) -> Option<Bytes> {
    let batches: Vec<RecordBatch> = pieces.iter().map(|(_, p)| p.batch.clone()).collect::<Option<_>>()?;
    let schema = batches.first().map(RecordBatch::schema)?;
    let combined = arrow_select::concat::concat_batches(&schema, &batches).ok()?;
    record_batch_message(&combined).ok().filter(|message| message.len() <= max_bytes)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use arrow_array::Int64Array;
    use arrow_schema::{DataType, Field, Schema};
    use tokio::sync::oneshot;

    use super::*;

    fn payload(first_id: i64, rows: usize) -> AppendPayload {
        let batch = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true)])),
            vec![Arc::new(Int64Array::from_iter_values(first_id..first_id + rows as i64))],
        )
        .unwrap();
        AppendPayload {
            rows,
            first_row: 0,
            serialized_record_batch: record_batch_message(&batch).unwrap(),
            batch: Some(batch),
        }
    }

    fn rows(payloads: Vec<AppendPayload>) -> LaneCommand {
        LaneCommand::Rows(QueuedRows::unbudgeted(payloads))
    }

    #[tokio::test(start_paused = true)]
    async fn small_rows_wait_for_the_flush_interval_or_the_row_limit() {
        let policy = BatchingPolicy { max_rows: 100, max_bytes: 1 << 20, flush_interval: Duration::from_secs(10) };
        let (commands, receiver) = mpsc::unbounded_channel();
        let (upload_batches_tx, mut upload_batches) = mpsc::unbounded_channel();
        let (_budget, budget) = watch::channel(0usize);
        let (_share, share) = watch::channel(0usize);
        tokio::spawn(accumulate(policy, receiver, upload_batches_tx, LanePressure { budget, share }));

        for i in 0..3 {
            commands.send(rows(vec![payload(i * 10, 10)])).unwrap();
        }
        tokio::time::sleep(Duration::from_millis(9_900)).await;
        assert!(upload_batches.try_recv().is_err(), "nothing before the flush interval");
        tokio::time::sleep(Duration::from_millis(200)).await;
        let upload = upload_batches.try_recv().expect("flushed after 10 s");
        assert_eq!(upload.rows, 30, "the three requests were coalesced into one upload");

        // The row limit flushes without waiting: 10 x 10 rows fill one batch of 100.
        for i in 0..11 {
            commands.send(rows(vec![payload(100 + i * 10, 10)])).unwrap();
        }
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(upload_batches.try_recv().expect("full batch").rows, 100);
        assert!(upload_batches.try_recv().is_err(), "the 11th request waits for more rows");

        // A flush (checkpoint) queues what is left and then answers.
        let (done, flushed) = oneshot::channel();
        commands.send(LaneCommand::Flush(done)).unwrap();
        flushed.await.unwrap();
        assert_eq!(upload_batches.try_recv().expect("flushed remainder").rows, 10);

        // Payloads of at least half a batch go out as they are, in order.
        commands.send(rows(vec![payload(0, 5), payload(5, 60)])).unwrap();
        drop(commands);
        tokio::time::sleep(Duration::from_millis(1)).await;
        let sizes: Vec<usize> = std::iter::from_fn(|| upload_batches.try_recv().ok()).map(|u| u.rows).collect();
        assert_eq!(sizes, [5, 60]);
    }

    /// While a request waits for the budget or the resource's share, held rows go at once, and
    /// so do rows that arrive meanwhile; once nobody waits, rows are held for their interval.
    #[tokio::test(start_paused = true)]
    async fn rows_go_at_once_while_a_request_waits_for_the_budget_or_the_share() {
        let policy = BatchingPolicy { max_rows: 100, max_bytes: 1 << 20, flush_interval: Duration::from_secs(10) };
        for waits_for_share in [false, true] {
            let (commands, receiver) = mpsc::unbounded_channel();
            let (upload_batches_tx, mut upload_batches) = mpsc::unbounded_channel();
            let (budget_waiters, budget) = watch::channel(0usize);
            let (share_waiters, share) = watch::channel(0usize);
            let waiters = if waits_for_share { &share_waiters } else { &budget_waiters };
            tokio::spawn(accumulate(policy, receiver, upload_batches_tx, LanePressure { budget, share }));

            commands.send(rows(vec![payload(0, 10)])).unwrap();
            commands.send(rows(vec![payload(10, 10)])).unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert!(upload_batches.try_recv().is_err(), "held while nobody waits");

            waiters.send_replace(1);
            tokio::time::sleep(Duration::from_millis(1)).await;
            assert_eq!(upload_batches.try_recv().expect("sent while a request waits").rows, 20);
            commands.send(rows(vec![payload(20, 10)])).unwrap();
            tokio::time::sleep(Duration::from_millis(1)).await;
            assert_eq!(upload_batches.try_recv().expect("arrived while a request waits").rows, 10);

            waiters.send_replace(0);
            commands.send(rows(vec![payload(30, 10)])).unwrap();
            tokio::time::sleep(Duration::from_millis(9_000)).await;
            assert!(upload_batches.try_recv().is_err());
            tokio::time::sleep(Duration::from_millis(1_100)).await;
            assert_eq!(upload_batches.try_recv().expect("flushed after 10 s").rows, 10);
        }
    }
}
