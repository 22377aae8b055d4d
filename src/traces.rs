//! OpenTelemetry traces, off unless an OTLP endpoint is configured (the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, with
//! `OTEL_EXPORTER_OTLP_PROTOCOL` `http/protobuf` (the default) or `grpc`, `OTEL_SERVICE_NAME`,
//! and sampling by `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG`).
//!
//! The gateway's spans are `tracing` spans of target [`TARGET`] at TRACE level, bridged by
//! `tracing-opentelemetry`: one per HTTP request (continuing the caller's W3C `traceparent`
//! when the request authenticates as a principal; anyone else's request starts a trace of its
//! own), and below it decode, admission, conversion and encoding; per resource its set-up and
//! each AppendRows request (parented to the request that accepted its first rows, linked to the
//! others); the commit in a trace of the gateway's own, linked to the request that committed:
//! the finalize, the commit of streams and each publication job, whose label carries that
//! trace's id (never one a caller chose). Nothing
//! else sees them (the log layer's filter is its own), so with no endpoint they cost a disabled
//! callsite each. Attributes carry names, counts and ids, never row payloads or credentials.
//!
//! Export never blocks or slows ingestion: ended spans go into a bounded queue that a task
//! drains to the exporter in batches; a span that finds the queue full is dropped and counted
//! (`filament_trace_spans_dropped_total`). The queue and batches follow the standard
//! `OTEL_BSP_MAX_QUEUE_SIZE` (default 2048), `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` (512),
//! `OTEL_BSP_SCHEDULE_DELAY` (milliseconds, 5000) and `OTEL_BSP_EXPORT_TIMEOUT` (milliseconds,
//! 30000: how long a flush or shutdown waits), with the specification's defaults. At shutdown
//! [`TraceExport::flush`] sends what is still queued, so the last requests' spans are not lost
//! with the process; the span processor's own `force_flush` and `shutdown_with_timeout` drain
//! the queue too, and answer an error when they could not within their time.
//!
//! Why not the SDK's `BatchSpanProcessor`: it exports from a thread of its own through
//! `futures_executor::block_on`, where the tonic (gRPC) and async reqwest (HTTP) OTLP exporters
//! find no Tokio reactor; its variant on an async runtime is behind the SDK's experimental
//! `experimental_trace_batch_span_processor_with_async_runtime` feature; and a span it drops on
//! a full queue is one internal warning, not a count an operator can alert on.

use std::time::Duration;

use opentelemetry::propagation::{Extractor, TextMapPropagator as _};
use opentelemetry::trace::{SpanContext, TraceContextExt as _, TracerProvider as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanProcessor};
use tokio::sync::{mpsc, oneshot};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// Spans dropped by the exporter's bounded queue.
pub(crate) const TRACE_SPANS_DROPPED: &str = "filament_trace_spans_dropped_total";

/// The `tracing` target of every span exported as a trace.
pub const TARGET: &str = "filament_trace";
/// Ended spans waiting for export at most, unless `OTEL_BSP_MAX_QUEUE_SIZE` says otherwise;
/// beyond, spans are dropped (and counted). The specification's default.
const DEFAULT_QUEUE_SPANS: usize = 2048;
/// Spans exported in one request at most, unless `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` says otherwise.
const DEFAULT_BATCH_SPANS: usize = 512;
/// How long an ended span waits for a fuller batch at most, unless `OTEL_BSP_SCHEDULE_DELAY`
/// (milliseconds) says otherwise. The specification's default.
const DEFAULT_BATCH_DELAY: Duration = Duration::from_secs(5);
/// How long a flush or shutdown of the processor waits for the exporter, unless
/// `OTEL_BSP_EXPORT_TIMEOUT` (milliseconds) says otherwise. The specification's default.
const DEFAULT_EXPORT_TIMEOUT: Duration = Duration::from_secs(30);

/// The trace export of a serving gateway: the provider its `tracing` layer feeds, and the way
/// to send what is still queued before the process exits.
#[derive(Debug)]
pub struct TraceExport {
    provider: SdkTracerProvider,
    control: mpsc::Sender<ExportControl>,
}

impl TraceExport {
    /// The provider to build the `tracing` layer on ([`layer`]).
    pub fn provider(&self) -> &SdkTracerProvider {
        &self.provider
    }

    /// Exports every span ended so far, waiting `at_most` for the exporter.
    pub async fn flush(&self, at_most: Duration) {
        let (done, exported) = oneshot::channel();
        let flushed = async {
            if self.control.send(ExportControl::Flush(Done::Async(done))).await.is_ok() {
                let _ = exported.await;
            }
        };
        if tokio::time::timeout(at_most, flushed).await.is_err() {
            tracing::warn!(waited_secs = at_most.as_secs(), "spans still queued at shutdown were not all exported");
        }
    }
}

/// What the export task is asked besides exporting: each answered once it is done.
#[derive(Debug)]
enum ExportControl {
    /// Export everything queued now.
    Flush(Done),
    /// Export everything queued, shut the exporter down and end.
    Shutdown(Done),
}

/// How the export task tells the one who asked that it is done.
#[derive(Debug)]
enum Done {
    Async(oneshot::Sender<()>),
    Blocking(std::sync::mpsc::SyncSender<()>),
}

impl Done {
    fn answer(self) {
        match self {
            Self::Async(sender) => drop(sender.send(())),
            Self::Blocking(sender) => drop(sender.try_send(())),
        }
    }
}

/// The batching of the export, from the standard `OTEL_BSP_*` variables.
#[derive(Debug, Clone, Copy)]
struct BatchSettings {
    queue_spans: usize,
    batch_spans: usize,
    delay: Duration,
    export_timeout: Duration,
}

impl BatchSettings {
    fn from_env() -> Self {
        let read = |name: &str| std::env::var(name).ok().and_then(|value| value.trim().parse::<u64>().ok());
        let queue_spans = read("OTEL_BSP_MAX_QUEUE_SIZE").map_or(DEFAULT_QUEUE_SPANS, |n| n as usize).max(1);
        let batch_spans = read("OTEL_BSP_MAX_EXPORT_BATCH_SIZE").map_or(DEFAULT_BATCH_SPANS, |n| n as usize).max(1);
        let delay = read("OTEL_BSP_SCHEDULE_DELAY").map_or(DEFAULT_BATCH_DELAY, Duration::from_millis);
        let export_timeout = read("OTEL_BSP_EXPORT_TIMEOUT").map_or(DEFAULT_EXPORT_TIMEOUT, Duration::from_millis);
        Self { queue_spans, batch_spans: batch_spans.min(queue_spans), delay, export_timeout }
    }
}

/// Whether the standard variables configure an OTLP endpoint for traces.
pub fn configured() -> bool {
    ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"]
        .iter()
        .any(|name| std::env::var(name).is_ok_and(|value| !value.trim().is_empty()))
}

/// The trace export to the configured endpoint (inside a tokio runtime: the export task runs
/// on it).
pub fn export() -> anyhow::Result<TraceExport> {
    // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES are read by the resource's detectors.
    let mut resource = opentelemetry_sdk::Resource::builder();
    if std::env::var("OTEL_SERVICE_NAME").is_err() {
        resource = resource.with_service_name("filament-bigquery");
    }
    let resource = resource.build();
    let grpc = std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL").is_ok_and(|protocol| protocol.trim() == "grpc");
    let builder = opentelemetry_otlp::SpanExporter::builder();
    let settings = BatchSettings::from_env();
    let (processor, control) = if grpc {
        BoundedBatchProcessor::start(builder.with_tonic().build()?, &resource, settings)
    } else {
        BoundedBatchProcessor::start(builder.with_http().build()?, &resource, settings)
    };
    let provider = SdkTracerProvider::builder().with_span_processor(processor).with_resource(resource).build();
    Ok(TraceExport { provider, control })
}

/// The `tracing` layer that turns [`TARGET`] spans into OpenTelemetry spans of `provider`.
pub fn layer<S>(provider: &SdkTracerProvider) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    use tracing_subscriber::Layer as _;
    let filter = tracing_subscriber::filter::Targets::new().with_target(TARGET, tracing::Level::TRACE);
    tracing_opentelemetry::layer().with_tracer(provider.tracer("filament-bigquery")).with_filter(filter)
}

/// Whether `span` is exported and `headers` carry a W3C `traceparent` it could continue (the
/// caller then decides whether it may).
pub(crate) fn would_continue(span: &tracing::Span, headers: &axum::http::HeaderMap) -> bool {
    !span.is_disabled() && headers.contains_key("traceparent")
}

/// Makes `span` continue the trace of the W3C `traceparent` (and `tracestate`) in `headers`,
/// when they carry a valid one. Only for an authenticated caller (`api::record_request`).
pub(crate) fn continue_remote_trace(span: &tracing::Span, headers: &axum::http::HeaderMap) {
    if span.is_disabled() {
        return;
    }
    let remote = opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&HeaderExtractor(headers));
    if remote.span().span_context().is_valid() {
        // Fails only when the span is not exported (traces off): nothing to continue then.
        let _ = span.set_parent(remote);
    }
}

/// The OpenTelemetry identity of the current span, when traces are on and it is sampled: what
/// work done later, elsewhere, links back to.
pub(crate) fn current_span_context() -> Option<SpanContext> {
    let context = tracing::Span::current().context();
    let span_context = context.span().span_context().clone();
    (span_context.is_valid() && span_context.is_sampled()).then_some(span_context)
}

/// Parents `span` on `parent` (another task's span, ended or not) and links it to `links`.
pub(crate) fn follow(span: &tracing::Span, parent: Option<&SpanContext>, links: &[SpanContext]) {
    if let Some(parent) = parent {
        let remote = opentelemetry::Context::new().with_remote_span_context(parent.clone());
        let _ = span.set_parent(remote);
    }
    for link in links {
        span.add_link(link.clone());
    }
}

/// The trace id of `span` (32 lowercase hex digits), when it is sampled (exported).
pub(crate) fn trace_id_of(span: &tracing::Span) -> Option<String> {
    let context = span.context();
    let span_context = context.span().span_context().clone();
    (span_context.is_valid() && span_context.is_sampled()).then(|| span_context.trace_id().to_string())
}

struct HeaderExtractor<'a>(&'a axum::http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(axum::http::HeaderName::as_str).collect()
    }
}

/// A batch span processor whose queue is bounded and never waited on: a span that finds it
/// full is dropped and counted.
#[derive(Debug)]
struct BoundedBatchProcessor {
    queue: mpsc::Sender<SpanData>,
    control: mpsc::Sender<ExportControl>,
    export_timeout: Duration,
}

impl BoundedBatchProcessor {
    /// Starts the export task; the exporter describes its spans with `resource`. Returns the
    /// processor and where the export's control requests go.
    fn start<E: opentelemetry_sdk::trace::SpanExporter + 'static>(
        mut exporter: E,
        resource: &Resource,
        settings: BatchSettings,
    ) -> (Self, mpsc::Sender<ExportControl>) {
        exporter.set_resource(resource);
        let (queue, spans) = mpsc::channel(settings.queue_spans);
        let (control, requests) = mpsc::channel(4);
        tokio::spawn(export_batches(exporter, spans, requests, settings));
        (Self { queue, control: control.clone(), export_timeout: settings.export_timeout }, control)
    }

    /// Asks the export task for `request` and waits for its answer, at most `timeout`. From a
    /// thread of a multi-threaded runtime the wait gives the thread's other tasks away first;
    /// from the current-thread runtime the task runs on, it cannot wait, and says so.
    fn ask_and_wait(&self, request: fn(Done) -> ExportControl, timeout: Duration) -> OTelSdkResult {
        let runtime = tokio::runtime::Handle::try_current().ok().map(|handle| handle.runtime_flavor());
        if runtime == Some(tokio::runtime::RuntimeFlavor::CurrentThread) {
            return Err(OTelSdkError::InternalFailure(
                "cannot wait for the span export from the current-thread runtime it runs on".into(),
            ));
        }
        let (done, answered) = std::sync::mpsc::sync_channel(1);
        self.control
            .try_send(request(Done::Blocking(done)))
            .map_err(|e| OTelSdkError::InternalFailure(format!("the span export cannot take the request: {e}")))?;
        let wait = || answered.recv_timeout(timeout);
        let outcome = if runtime.is_some() { tokio::task::block_in_place(wait) } else { wait() };
        outcome.map_err(|e| match e {
            std::sync::mpsc::RecvTimeoutError::Timeout => OTelSdkError::Timeout(timeout),
            std::sync::mpsc::RecvTimeoutError::Disconnected => {
                OTelSdkError::InternalFailure("the span export ended before it answered".into())
            }
        })
    }
}

impl SpanProcessor for BoundedBatchProcessor {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &opentelemetry::Context) {}

    fn on_end(&self, span: SpanData) {
        if self.queue.try_send(span).is_err() {
            metrics::counter!(TRACE_SPANS_DROPPED).increment(1);
        }
    }

    /// Exports every span queued so far; an error when that did not end within
    /// `OTEL_BSP_EXPORT_TIMEOUT`.
    fn force_flush(&self) -> OTelSdkResult {
        self.ask_and_wait(ExportControl::Flush, self.export_timeout)
    }

    /// Exports every span queued so far and ends the export (later spans are dropped and
    /// counted); an error when that did not end within `timeout`.
    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.ask_and_wait(ExportControl::Shutdown, timeout)
    }
}

/// Sends the queued spans to `exporter`, a batch when `batch_spans` are queued or the oldest
/// waited `delay`, and everything queued when a flush or the shutdown is requested, until the
/// queue closes or the shutdown.
async fn export_batches<E: opentelemetry_sdk::trace::SpanExporter>(
    exporter: E,
    mut spans: mpsc::Receiver<SpanData>,
    mut requests: mpsc::Receiver<ExportControl>,
    settings: BatchSettings,
) {
    let mut pending: Vec<SpanData> = Vec::new();
    let mut oldest_due: Option<tokio::time::Instant> = None;
    loop {
        let delay_over = async {
            match oldest_due {
                Some(due) => tokio::time::sleep_until(due).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            span = spans.recv() => match span {
                Some(span) => {
                    oldest_due.get_or_insert_with(|| tokio::time::Instant::now() + settings.delay);
                    pending.push(span);
                    if pending.len() >= settings.batch_spans {
                        export_all(&exporter, &mut pending, settings.batch_spans).await;
                        oldest_due = None;
                    }
                }
                None => {
                    export_all(&exporter, &mut pending, settings.batch_spans).await;
                    return;
                }
            },
            () = delay_over => {
                export_all(&exporter, &mut pending, settings.batch_spans).await;
                oldest_due = None;
            }
            Some(request) = requests.recv() => {
                while let Ok(span) = spans.try_recv() {
                    pending.push(span);
                }
                export_all(&exporter, &mut pending, settings.batch_spans).await;
                oldest_due = None;
                match request {
                    ExportControl::Flush(done) => done.answer(),
                    ExportControl::Shutdown(done) => {
                        spans.close();
                        if let Err(e) = exporter.shutdown() {
                            tracing::warn!(error = %e, "the span exporter did not shut down cleanly");
                        }
                        done.answer();
                        return;
                    }
                }
            }
        }
    }
}

/// Exports `pending` in batches of `batch_spans` at most, counting what the exporter refuses
/// as dropped.
async fn export_all<E: opentelemetry_sdk::trace::SpanExporter>(
    exporter: &E,
    pending: &mut Vec<SpanData>,
    batch_spans: usize,
) {
    while !pending.is_empty() {
        let batch: Vec<SpanData> = pending.drain(..pending.len().min(batch_spans)).collect();
        let exported = batch.len();
        if let Err(e) = exporter.export(batch).await {
            metrics::counter!(TRACE_SPANS_DROPPED).increment(exported as u64);
            tracing::warn!(error = %e, spans = exported, "could not export spans");
        }
    }
}

#[cfg(test)]
mod tests {
    use parking_lot::Mutex;
    use std::sync::Arc;

    use opentelemetry::trace::{Span as _, Tracer as _};

    use super::*;

    /// An exporter that records what it was sent, after `delay`.
    #[derive(Debug, Clone, Default)]
    struct RecordingExporter {
        exported: Arc<Mutex<Vec<String>>>,
        delay: Duration,
    }

    impl opentelemetry_sdk::trace::SpanExporter for RecordingExporter {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            tokio::time::sleep(self.delay).await;
            self.exported.lock().extend(batch.into_iter().map(|span| span.name.to_string()));
            Ok(())
        }
    }

    /// A provider whose batches would wait an hour, so only a flush or shutdown exports.
    fn provider_over(exporter: &RecordingExporter, export_timeout: Duration) -> SdkTracerProvider {
        let settings =
            BatchSettings { queue_spans: 16, batch_spans: 16, delay: Duration::from_secs(3600), export_timeout };
        let (processor, _control) =
            BoundedBatchProcessor::start(exporter.clone(), &Resource::builder().build(), settings);
        SdkTracerProvider::builder().with_span_processor(processor).build()
    }

    fn end_spans(provider: &SdkTracerProvider, names: &[&'static str]) {
        let tracer = provider.tracer("test");
        for name in names {
            tracer.start(*name).end();
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn force_flush_exports_every_queued_span_before_it_answers() {
        let exporter = RecordingExporter { delay: Duration::from_millis(50), ..Default::default() };
        let provider = provider_over(&exporter, Duration::from_secs(10));
        end_spans(&provider, &["a", "b", "c"]);

        provider.force_flush().expect("flushed");
        assert_eq!(*exporter.exported.lock(), ["a", "b", "c"]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_flush_the_exporter_does_not_finish_in_time_is_an_error() {
        let exporter = RecordingExporter { delay: Duration::from_secs(5), ..Default::default() };
        let provider = provider_over(&exporter, Duration::from_millis(100));
        end_spans(&provider, &["slow"]);

        assert!(provider.force_flush().is_err());
        assert!(exporter.exported.lock().is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_exports_what_is_queued_and_ends_the_export() {
        let exporter = RecordingExporter::default();
        let provider = provider_over(&exporter, Duration::from_secs(10));
        end_spans(&provider, &["last"]);

        provider.shutdown_with_timeout(Duration::from_secs(10)).expect("shut down");
        assert_eq!(*exporter.exported.lock(), ["last"]);
    }

    #[tokio::test]
    async fn on_its_own_current_thread_runtime_a_flush_says_it_cannot_wait() {
        let exporter = RecordingExporter::default();
        let provider = provider_over(&exporter, Duration::from_secs(10));
        end_spans(&provider, &["queued"]);

        assert!(provider.force_flush().is_err());
    }
}
