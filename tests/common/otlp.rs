//! A collector for the tests: an OTLP/HTTP receiver on 127.0.0.1:0 that takes `POST /v1/traces`
//! and decodes each export with the official OTLP protobuf definitions (the `opentelemetry-proto`
//! crate's types generated from them), keeping the decoded requests and the bytes as they came.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

#[derive(Default)]
struct Received {
    exports: Vec<ExportTraceServiceRequest>,
    bytes: Vec<Bytes>,
    refused: usize,
}

pub struct Collector {
    pub addr: SocketAddr,
    received: Arc<Mutex<Received>>,
}

pub async fn start_collector() -> Collector {
    let received = Arc::new(Mutex::new(Received::default()));
    let app = Router::new()
        .route("/v1/traces", post(traces))
        .with_state(received.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    Collector { addr, received }
}

async fn traces(
    State(received): State<Arc<Mutex<Received>>>,
    headers: http::HeaderMap,
    body: Bytes,
) -> Response {
    let protobuf = headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v == "application/x-protobuf");
    let decoded = ExportTraceServiceRequest::decode(body.as_ref());
    let mut received = received.lock().unwrap();
    match decoded {
        Ok(export) if protobuf => {
            received.exports.push(export);
            received.bytes.push(body);
            (
                [(http::header::CONTENT_TYPE, "application/x-protobuf")],
                ExportTraceServiceResponse::default().encode_to_vec(),
            )
                .into_response()
        }
        _ => {
            received.refused += 1;
            http::StatusCode::BAD_REQUEST.into_response()
        }
    }
}

impl Collector {
    /// The base URL to configure as `telemetry.otlp_endpoint`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received, in order.
    pub fn spans(&self) -> Vec<Span> {
        let received = self.received.lock().unwrap();
        assert_eq!(received.refused, 0, "an export was not OTLP protobuf");
        received
            .exports
            .iter()
            .flat_map(|e| &e.resource_spans)
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| s.spans.clone())
            .collect()
    }

    /// The resource attributes of every export.
    pub fn resource_attributes(&self) -> Vec<KeyValue> {
        let received = self.received.lock().unwrap();
        received
            .exports
            .iter()
            .flat_map(|e| &e.resource_spans)
            .filter_map(|r| r.resource.as_ref())
            .flat_map(|r| r.attributes.clone())
            .collect()
    }

    /// Every export's bytes, as sent.
    pub fn bytes(&self) -> Vec<u8> {
        self.received.lock().unwrap().bytes.concat()
    }
}

/// The value of `key` among `attributes`.
pub fn value<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
    attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref())
        .and_then(|v: &AnyValue| v.value.as_ref())
}

/// A span's attribute as text.
pub fn text(span: &Span, key: &str) -> Option<String> {
    match value(&span.attributes, key)? {
        any_value::Value::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

/// A span's attribute as an integer.
pub fn int(span: &Span, key: &str) -> Option<i64> {
    match value(&span.attributes, key)? {
        any_value::Value::IntValue(i) => Some(*i),
        _ => None,
    }
}

/// A span's attribute as a boolean.
pub fn flag(span: &Span, key: &str) -> Option<bool> {
    match value(&span.attributes, key)? {
        any_value::Value::BoolValue(b) => Some(*b),
        _ => None,
    }
}

/// Every attribute value of `span` written as text (for searching them).
pub fn all_values(span: &Span) -> Vec<String> {
    span.attributes
        .iter()
        .filter_map(|a| a.value.as_ref()?.value.as_ref())
        .map(|v| format!("{v:?}"))
        .collect()
}
