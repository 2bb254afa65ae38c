//! What the trace of a compacting request says: one span per request in the terms of the
//! OpenTelemetry GenAI semantic conventions (`gen_ai.*`), with Compactor's own figures
//! (`compactor.*`), and beneath it a span for the summary stage and one for each call upstream.
//!
//! The request span is the client's (a child of its `traceparent`, when it sent one) and ends
//! once the answer's last byte went out, with the usage the provider reported in it. The call
//! span's context goes upstream as `traceparent`, so the provider's spans join the same trace.
//! The `gen_ai.usage.*` figures are set on the request span alone: a backend that adds them up
//! over a trace would otherwise count them twice.
//!
//! Only figures, names and ids go into a span: the model, token counts, the conversation id (a
//! hash), checkpoint ids, statuses and the provider's host. Never message content, a summary's
//! text, a header's value or the upstream's query (which may hold a key).

use axum::body::Body;
use axum::response::Response;
use futures::StreamExt;

use crate::compaction::{Outcome, SummaryReport};
use crate::dialect::Usage;
use crate::metrics::Route;
use crate::telemetry::{Span, SpanKind, Telemetry};
use crate::upstream::{Upstream, UpstreamError, UpstreamResponse};

/// The GenAI operation every compacting route performs.
const OPERATION: &str = "chat";

/// Characters of a provider-given model name kept in a span (the client's is bounded already).
const MAX_MODEL_CHARS: usize = 256;

/// Opens the span of a request on `route`, sent to `upstream`: the client's trace continued.
pub(super) fn request(
    telemetry: &Telemetry,
    client_headers: &http::HeaderMap,
    route: Route,
    dialect: &'static str,
    upstream: &Upstream,
) -> Span {
    let mut span = telemetry.server_span(OPERATION, client_headers);
    if span.is_recording() {
        span.set("gen_ai.operation.name", OPERATION);
        span.set(
            "gen_ai.provider.name",
            provider_name(upstream.host(), route),
        );
        span.set("compactor.dialect", dialect);
    }
    span
}

/// Names the request span after the model asked for, as the conventions name it.
pub(super) fn model_asked(span: &mut Span, model: &str) {
    if span.is_recording() {
        span.rename(format!("{OPERATION} {model}"));
        span.set("gen_ai.request.model", model.to_string());
    }
}

/// Opens the span of a call upstream (`attempt` 2 is the retry after an overflow).
pub(super) fn upstream_call(
    parent: &Span,
    upstream: &Upstream,
    path_and_query: &str,
    attempt: u32,
) -> Span {
    if !parent.is_recording() {
        return Span::default();
    }
    let path = upstream.path_of(path_and_query);
    let mut span = parent.child(format!("POST {path}"), SpanKind::Client);
    span.set("http.request.method", "POST");
    span.set("server.address", upstream.host().to_string());
    if let Some(port) = upstream.port() {
        span.set("server.port", i64::from(port));
    }
    span.set("url.path", path);
    span.set("compactor.upstream.attempt", i64::from(attempt));
    span
}

/// Records how the call went: its status, or why it failed.
pub(super) fn call_answered(span: &mut Span, response: &Result<UpstreamResponse, UpstreamError>) {
    if !span.is_recording() {
        return;
    }
    match response {
        Ok(response) => call_status(span, response.status.as_u16()),
        Err(e) => span.fail(match e {
            UpstreamError::Unreachable(_) => "upstream_unreachable",
            UpstreamError::Broken(_) => "upstream_broken",
            UpstreamError::Timeout(_) => "upstream_timeout",
            UpstreamError::Refused(_) => "upstream_refused",
        }),
    }
}

/// The status of the answer to the client: an error status is what the request ended with,
/// and the span's failure when it is the proxy's or the provider's (5xx), as the HTTP
/// conventions have it for a server.
pub(super) fn status(span: &mut Span, status: u16) {
    span.set("http.response.status_code", i64::from(status));
    if status >= 400 {
        span.ended_in_error(status.to_string(), status >= 500);
    }
}

/// The status of the provider's answer: any error status fails the call.
fn call_status(span: &mut Span, status: u16) {
    span.set("http.response.status_code", i64::from(status));
    if status >= 400 {
        span.fail(status.to_string());
    }
}

/// Reports the request's summary stage as a child span, timed as it ran.
pub(super) fn summary(parent: &Span, report: &SummaryReport) {
    if !parent.is_recording() {
        return;
    }
    let end = report.started + report.duration;
    parent.finished_child("compactor summary".into(), report.started, end, |span| {
        span.set("compactor.summary.trigger", report.trigger.label());
        span.set("compactor.summary.model", bounded(&report.model));
        span.set("compactor.summary.written", report.written);
        span.set_count(
            "compactor.summary.duration_ms",
            report.duration.as_millis() as u64,
        );
        span.set_count("compactor.tokens.before", report.tokens_before);
        span.set_count("compactor.tokens.after", report.tokens_after);
        if let Some(id) = &report.checkpoint_id {
            span.set("compactor.checkpoint.id", id.clone());
        }
        if let Some(reason) = &report.failure {
            span.fail(reason.clone());
        }
    });
}

/// What the engine did with the request: compacted or not, through which checkpoint, its size
/// as the client sent it and as forwarded, the window, the conversation.
pub(super) fn outcome(span: &mut Span, outcome: &Outcome, checkpoint: Option<&str>) {
    if !span.is_recording() {
        return;
    }
    span.set("compactor.compacted", outcome.compacted);
    span.set_count("compactor.tokens.as_sent", outcome.prompt_tokens);
    span.set_count("compactor.tokens.forwarded", outcome.tokens_after);
    span.set_count("compactor.window", outcome.window);
    if let Some(id) = checkpoint {
        span.set("compactor.checkpoint.id", id.to_string());
    }
    if let Some(conversation) = &outcome.anchor {
        span.set("gen_ai.conversation.id", conversation.clone());
    }
    if let Some(status) = &outcome.status {
        span.set("compactor.compaction.status", status.header_value());
    }
}

/// What the provider reported it used, each figure only when it stated it.
pub(super) fn usage(span: &mut Span, usage: &Usage) {
    if !span.is_recording() {
        return;
    }
    for (key, figure) in [
        ("gen_ai.usage.input_tokens", usage.input_tokens),
        ("gen_ai.usage.output_tokens", usage.output_tokens),
        (
            "gen_ai.usage.cache_read.input_tokens",
            usage.cache_read_tokens,
        ),
        (
            "gen_ai.usage.cache_creation.input_tokens",
            usage.cache_creation_tokens,
        ),
    ] {
        if let Some(figure) = figure {
            span.set_count(key, figure);
        }
    }
    if let Some(model) = &usage.model {
        span.set("gen_ai.response.model", bounded(model));
    }
}

/// `response` with `spans` kept open until its body has been sent (or dropped).
pub(super) fn open_until_sent(response: Response, spans: Vec<Span>) -> Response {
    if spans.iter().all(|s| !s.is_recording()) {
        return response;
    }
    let (parts, body) = response.into_parts();
    let body = body.into_data_stream().map(move |chunk| {
        // Owned here, so they end when the body does.
        let _ = &spans;
        chunk
    });
    Response::from_parts(parts, Body::from_stream(body))
}

fn bounded(text: &str) -> String {
    text.chars().take(MAX_MODEL_CHARS).collect()
}

/// `gen_ai.provider.name` for a provider at `host`, in the conventions' well-known values;
/// another host is named after the API it speaks (an OpenAI-compatible server is `openai`).
fn provider_name(host: &str, route: Route) -> &'static str {
    const KNOWN: &[(&str, &str)] = &[
        ("openai.azure.com", "azure.ai.openai"),
        ("services.ai.azure.com", "azure.ai.inference"),
        ("models.ai.azure.com", "azure.ai.inference"),
        ("openai.com", "openai"),
        ("anthropic.com", "anthropic"),
        ("amazonaws.com", "aws.bedrock"),
        ("generativelanguage.googleapis.com", "gcp.gemini"),
        ("aiplatform.googleapis.com", "gcp.vertex_ai"),
        ("mistral.ai", "mistral_ai"),
        ("groq.com", "groq"),
        ("deepseek.com", "deepseek"),
        ("x.ai", "x_ai"),
        ("perplexity.ai", "perplexity"),
        ("cohere.com", "cohere"),
        ("cohere.ai", "cohere"),
    ];
    let host = host.to_ascii_lowercase();
    let known = KNOWN.iter().find(|(domain, _)| {
        host == *domain
            || host
                .strip_suffix(domain)
                .is_some_and(|rest| rest.ends_with('.'))
    });
    match (known, route) {
        (Some((_, name)), _) => name,
        (None, Route::Messages) => "anthropic",
        (None, _) => "openai",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn providers_are_named_from_their_host_then_their_api() {
        let named = |host| provider_name(host, Route::ChatCompletions);
        assert_eq!(named("api.openai.com"), "openai");
        assert_eq!(named("my-res.openai.azure.com"), "azure.ai.openai");
        assert_eq!(named("api.anthropic.com"), "anthropic");
        assert_eq!(
            named("bedrock-runtime.us-east-1.amazonaws.com"),
            "aws.bedrock"
        );
        assert_eq!(named("generativelanguage.googleapis.com"), "gcp.gemini");
        assert_eq!(named("API.GROQ.COM"), "groq");
        assert_eq!(named("api.x.ai"), "x_ai");
        // Not a subdomain of a known one.
        assert_eq!(named("notopenai.com"), "openai");
        assert_eq!(named("fakex.ai"), "openai");
        assert_eq!(named("127.0.0.1"), "openai");
        assert_eq!(provider_name("127.0.0.1", Route::Messages), "anthropic");
        assert_eq!(provider_name("api.openai.com", Route::Messages), "openai");
    }
}
