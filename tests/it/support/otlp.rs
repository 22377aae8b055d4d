//! A real OTLP/HTTP trace receiver: `POST /v1/traces` bodies (`application/x-protobuf`) decoded
//! with the OpenTelemetry project's own protocol definitions (`opentelemetry-proto`), the spans
//! kept for the test to read.

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message as _;

/// One received span, flattened.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    pub name: String,
    /// 32 lowercase hex digits.
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: String,
    /// Trace ids of its links.
    pub linked_traces: Vec<String>,
    pub attributes: Vec<(String, String)>,
    pub service_name: String,
}

impl ReceivedSpan {
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

#[derive(Clone)]
pub struct OtlpReceiver {
    pub endpoint: String,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
}

impl OtlpReceiver {
    pub async fn start() -> Self {
        let spans = Arc::new(Mutex::new(Vec::new()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let app = axum::Router::new().route("/v1/traces", axum::routing::post(receive)).with_state(Arc::clone(&spans));
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { endpoint, spans }
    }

    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().unwrap().clone()
    }
}

async fn receive(State(spans): State<Arc<Mutex<Vec<ReceivedSpan>>>>, body: Bytes) -> Vec<u8> {
    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf export request");
    let mut received = spans.lock().unwrap();
    for resource_spans in request.resource_spans {
        let service_name = resource_spans
            .resource
            .iter()
            .flat_map(|resource| &resource.attributes)
            .find(|kv| kv.key == "service.name")
            .map(|kv| text(kv.value.as_ref().and_then(|v| v.value.as_ref())))
            .unwrap_or_default();
        for span in resource_spans.scope_spans.into_iter().flat_map(|scope| scope.spans) {
            received.push(ReceivedSpan {
                name: span.name,
                trace_id: hex::encode(&span.trace_id),
                span_id: hex::encode(&span.span_id),
                parent_span_id: hex::encode(&span.parent_span_id),
                linked_traces: span.links.iter().map(|link| hex::encode(&link.trace_id)).collect(),
                attributes: span
                    .attributes
                    .into_iter()
                    .map(|kv| (kv.key, text(kv.value.as_ref().and_then(|v| v.value.as_ref()))))
                    .collect(),
                service_name: service_name.clone(),
            });
        }
    }
    ExportTraceServiceResponse::default().encode_to_vec()
}

fn text(value: Option<&AnyValue>) -> String {
    match value {
        Some(AnyValue::StringValue(s)) => s.clone(),
        Some(AnyValue::IntValue(i)) => i.to_string(),
        Some(AnyValue::BoolValue(b)) => b.to_string(),
        Some(AnyValue::DoubleValue(d)) => d.to_string(),
        _ => String::new(),
    }
}
