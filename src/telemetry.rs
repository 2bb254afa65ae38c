//! OpenTelemetry traces: the exporter, the spans handlers open, and the W3C trace context that
//! joins them to the client's trace and the provider's.
//!
//! With `[telemetry] otlp_endpoint` set, [`Telemetry`] holds a tracer provider that exports
//! finished spans over OTLP/HTTP (protobuf) in batches: a span ending hands its data to a
//! bounded queue and returns (a full queue drops spans rather than wait), and a thread of the
//! SDK's own sends them; [`Telemetry::shutdown`] sends what is still queued. Without an
//! endpoint nothing is created: every [`Span`] is empty and each call on it returns at once.
//!
//! This module knows the SDK and the propagation format, not what a span says: the request
//! path ([`crate::http`]) names its spans and chooses their attributes, and it alone decides that
//! no message content and no credential goes into one.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::HeaderMap;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{Span as _, Status, TraceContextExt, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, InstrumentationScope, KeyValue, Value};
use opentelemetry_http::{HeaderExtractor, HeaderInjector};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;

use crate::config::{redact_url, TelemetryConfig};

pub use opentelemetry::trace::SpanKind;

/// The path OTLP/HTTP collectors receive traces on, appended to a base URL.
const TRACES_PATH: &str = "/v1/traces";

/// How long one export may take before it is given up.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The traces of this process: exported when an endpoint is configured, not made otherwise.
#[derive(Clone, Default)]
pub struct Telemetry {
    exporting: Option<Arc<Exporting>>,
}

struct Exporting {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

impl Telemetry {
    /// Traces as `config` asks: none without an endpoint.
    pub fn from_config(config: &TelemetryConfig) -> Result<Telemetry, String> {
        if config.otlp_endpoint.is_empty() {
            return Ok(Telemetry::default());
        }
        let endpoint = traces_url(&config.otlp_endpoint);
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(endpoint)
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| {
                format!(
                    "telemetry.otlp_endpoint `{}`: {e}",
                    redact_url(&config.otlp_endpoint)
                )
            })?;
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(
                Resource::builder()
                    .with_service_name(config.service_name.clone())
                    .build(),
            )
            .build();
        let scope = InstrumentationScope::builder("compactor")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        let tracer = provider.tracer_with_scope(scope);
        Ok(Telemetry {
            exporting: Some(Arc::new(Exporting { provider, tracer })),
        })
    }

    pub fn enabled(&self) -> bool {
        self.exporting.is_some()
    }

    /// Opens the span of a request received from a client, continuing the client's trace when
    /// its headers carry a `traceparent` (the span is then its child), a new trace otherwise.
    pub fn server_span(&self, name: &'static str, client_headers: &HeaderMap) -> Span {
        let Some(exporting) = &self.exporting else {
            return Span::default();
        };
        let parent = TraceContextPropagator::new().extract(&HeaderExtractor(client_headers));
        let span = exporting
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Server)
            .start_with_context(&exporting.tracer, &parent);
        Span {
            recording: Some(Box::new(Recording {
                tracer: exporting.tracer.clone(),
                span,
            })),
        }
    }

    /// Exports the spans still queued and stops exporting; spans ending later are dropped.
    pub async fn shutdown(&self) {
        let Some(exporting) = self.exporting.clone() else {
            return;
        };
        // The SDK waits for its export thread: off the async workers.
        let result = tokio::task::spawn_blocking(move || exporting.provider.shutdown()).await;
        match result {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "Exporting the last spans failed."),
            Err(e) => tracing::warn!(error = %e, "Exporting the last spans failed."),
        }
    }
}

/// `base` with the traces path appended, unless it already ends with it.
fn traces_url(base: &str) -> String {
    let trimmed = base.trim_end_matches('/');
    if trimmed.ends_with(TRACES_PATH) {
        trimmed.to_string()
    } else {
        format!("{trimmed}{TRACES_PATH}")
    }
}

/// One span, ended when dropped (or by [`Span::end`]); empty when traces are off.
#[derive(Default)]
pub struct Span {
    /// Boxed: a recording span is half a kilobyte, and every request carries several spans
    /// through futures that are moved whole, traces on or off.
    recording: Option<Box<Recording>>,
}

struct Recording {
    tracer: SdkTracer,
    span: opentelemetry_sdk::trace::Span,
}

impl Span {
    /// Whether this span is exported (traces are on and it was sampled).
    pub fn is_recording(&self) -> bool {
        self.recording
            .as_ref()
            .is_some_and(|r| r.span.is_recording())
    }

    /// Renames the span (once the request says what it is about).
    pub fn rename(&mut self, name: String) {
        if let Some(r) = &mut self.recording {
            r.span.update_name(name);
        }
    }

    /// Sets one attribute.
    pub fn set(&mut self, key: &'static str, value: impl Into<Value>) {
        if let Some(r) = &mut self.recording {
            r.span.set_attribute(KeyValue::new(key, value));
        }
    }

    /// Sets a count (OTLP integers are signed).
    pub fn set_count(&mut self, key: &'static str, count: u64) {
        self.set(key, i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// Marks the span failed, with a short reason of low cardinality (`error.type`).
    pub fn fail(&mut self, error_type: impl Into<String>) {
        self.ended_in_error(error_type, true);
    }

    /// Says what the operation ended with (`error.type`); with `failed`, the span's status is
    /// an error too (a server's span is not failed by its client's mistake).
    pub fn ended_in_error(&mut self, error_type: impl Into<String>, failed: bool) {
        if let Some(r) = &mut self.recording {
            let error_type = error_type.into();
            r.span
                .set_attribute(KeyValue::new("error.type", error_type.clone()));
            if failed {
                r.span.set_status(Status::error(error_type));
            }
        }
    }

    /// Opens a child span starting now.
    pub fn child(&self, name: String, kind: SpanKind) -> Span {
        self.child_from(name, kind, None)
    }

    /// A child span that started at `start` and ended at `end`: a stage timed while it ran,
    /// reported once it is over.
    pub fn finished_child(
        &self,
        name: String,
        start: SystemTime,
        end: SystemTime,
        describe: impl FnOnce(&mut Span),
    ) {
        let mut child = self.child_from(name, SpanKind::Internal, Some(start));
        describe(&mut child);
        if let Some(r) = &mut child.recording {
            r.span.end_with_timestamp(end);
        }
    }

    fn child_from(&self, name: String, kind: SpanKind, start: Option<SystemTime>) -> Span {
        let Some(parent) = &self.recording else {
            return Span::default();
        };
        let context = Context::new().with_remote_span_context(parent.span.span_context().clone());
        let mut builder = parent.tracer.span_builder(name).with_kind(kind);
        if let Some(start) = start {
            builder = builder.with_start_time(start);
        }
        Span {
            recording: Some(Box::new(Recording {
                tracer: parent.tracer.clone(),
                span: builder.start_with_context(&parent.tracer, &context),
            })),
        }
    }

    /// Writes this span's W3C trace context (`traceparent`, and the client's `tracestate`) into
    /// `headers`, so that what receives them continues the trace from this span.
    pub fn propagate_into(&self, headers: &mut HeaderMap) {
        let Some(r) = &self.recording else {
            return;
        };
        let context = Context::new().with_remote_span_context(r.span.span_context().clone());
        TraceContextPropagator::new().inject_context(&context, &mut HeaderInjector(headers));
    }

    /// Ends the span now.
    pub fn end(self) {
        drop(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_traces_path_is_appended_once() {
        assert_eq!(
            traces_url("http://collector:4318"),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://collector:4318/"),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            traces_url("https://otel.example/v1/traces"),
            "https://otel.example/v1/traces"
        );
    }

    #[test]
    fn without_an_endpoint_nothing_is_made() {
        let telemetry = Telemetry::from_config(&TelemetryConfig::default()).unwrap();
        assert!(!telemetry.enabled());
        let mut headers = HeaderMap::new();
        let mut span = telemetry.server_span("chat", &headers);
        span.set("gen_ai.operation.name", "chat");
        assert!(!span.is_recording());
        span.propagate_into(&mut headers);
        assert!(headers.is_empty(), "no traceparent from a span not made");
    }
}
