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
//! `OTEL_BSP_MAX_QUEUE_SIZE` (default 4096), `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` (512) and
//! `OTEL_BSP_SCHEDULE_DELAY` (milliseconds, 1000). At shutdown [`TraceExport::flush`] sends
//! what is still queued, so the last requests' spans are not lost with the process.

use std::time::Duration;

use opentelemetry::propagation::{Extractor, TextMapPropagator as _};
use opentelemetry::trace::{SpanContext, TraceContextExt as _, TracerProvider as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanProcessor};
use tokio::sync::{mpsc, oneshot};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::telemetry;

/// The `tracing` target of every span exported as a trace.
pub const TARGET: &str = "filament_trace";
/// Ended spans waiting for export at most, unless `OTEL_BSP_MAX_QUEUE_SIZE` says otherwise;
/// beyond, spans are dropped (and counted).
const DEFAULT_QUEUE_SPANS: usize = 4096;
/// Spans exported in one request at most, unless `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` says otherwise.
const DEFAULT_BATCH_SPANS: usize = 512;
/// How long an ended span waits for a fuller batch at most, unless `OTEL_BSP_SCHEDULE_DELAY`
/// (milliseconds) says otherwise.
const DEFAULT_BATCH_DELAY: Duration = Duration::from_secs(1);

/// The trace export of a serving gateway: the provider its `tracing` layer feeds, and the way
/// to send what is still queued before the process exits.
#[derive(Debug)]
pub struct TraceExport {
    provider: SdkTracerProvider,
    flush_requests: mpsc::Sender<oneshot::Sender<()>>,
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
            if self.flush_requests.send(done).await.is_ok() {
                let _ = exported.await;
            }
        };
        if tokio::time::timeout(at_most, flushed).await.is_err() {
            tracing::warn!(waited_secs = at_most.as_secs(), "spans still queued at shutdown were not all exported");
        }
    }
}

/// The batching of the export, from the standard `OTEL_BSP_*` variables.
#[derive(Debug, Clone, Copy)]
struct BatchSettings {
    queue_spans: usize,
    batch_spans: usize,
    delay: Duration,
}

impl BatchSettings {
    fn from_env() -> Self {
        let read = |name: &str| std::env::var(name).ok().and_then(|value| value.trim().parse::<u64>().ok());
        let queue_spans = read("OTEL_BSP_MAX_QUEUE_SIZE").map_or(DEFAULT_QUEUE_SPANS, |n| n as usize).max(1);
        let batch_spans = read("OTEL_BSP_MAX_EXPORT_BATCH_SIZE").map_or(DEFAULT_BATCH_SPANS, |n| n as usize).max(1);
        let delay = read("OTEL_BSP_SCHEDULE_DELAY").map_or(DEFAULT_BATCH_DELAY, Duration::from_millis);
        Self { queue_spans, batch_spans: batch_spans.min(queue_spans), delay }
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
    let (processor, flush_requests) = if grpc {
        BoundedBatchProcessor::start(builder.with_tonic().build()?, &resource, settings)
    } else {
        BoundedBatchProcessor::start(builder.with_http().build()?, &resource, settings)
    };
    let provider = SdkTracerProvider::builder().with_span_processor(processor).with_resource(resource).build();
    Ok(TraceExport { provider, flush_requests })
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
}

impl BoundedBatchProcessor {
    /// Starts the export task; the exporter describes its spans with `resource`. Returns the
    /// processor and where flush requests go.
    fn start<E: opentelemetry_sdk::trace::SpanExporter + 'static>(
        mut exporter: E,
        resource: &Resource,
        settings: BatchSettings,
    ) -> (Self, mpsc::Sender<oneshot::Sender<()>>) {
        exporter.set_resource(resource);
        let (queue, spans) = mpsc::channel(settings.queue_spans);
        let (flush_requests, flushes) = mpsc::channel(1);
        tokio::spawn(export_batches(exporter, spans, flushes, settings));
        (Self { queue }, flush_requests)
    }
}

impl SpanProcessor for BoundedBatchProcessor {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &opentelemetry::Context) {}

    fn on_end(&self, span: SpanData) {
        if self.queue.try_send(span).is_err() {
            metrics::counter!(telemetry::TRACE_SPANS_DROPPED).increment(1);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// Sends the queued spans to `exporter`, a batch when `batch_spans` are queued or the oldest
/// waited `delay`, and everything queued when a flush is requested, until the queue closes.
async fn export_batches<E: opentelemetry_sdk::trace::SpanExporter>(
    exporter: E,
    mut spans: mpsc::Receiver<SpanData>,
    mut flushes: mpsc::Receiver<oneshot::Sender<()>>,
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
            Some(done) = flushes.recv() => {
                while let Ok(span) = spans.try_recv() {
                    pending.push(span);
                }
                export_all(&exporter, &mut pending, settings.batch_spans).await;
                oldest_due = None;
                let _ = done.send(());
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
            metrics::counter!(telemetry::TRACE_SPANS_DROPPED).increment(exported as u64);
            tracing::warn!(error = %e, spans = exported, "could not export spans");
        }
    }
}
