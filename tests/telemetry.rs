//! OpenTelemetry traces end to end: a proxy with `[telemetry] otlp_endpoint` set, in front of a
//! mock provider, exports to a collector that decodes each export with the official OTLP
//! protobuf definitions ([`common::otlp`]). The proxy is stopped before the spans are read, so
//! that its shutdown sends what its batch still holds.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use common::otlp::{self, flag, int, text, Collector};
use common::{config, post as send, start_mock, start_proxy, Proxy, Reply};
use compactor::config::Config;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use opentelemetry_proto::tonic::trace::v1::Span;
use serde_json::{json, Value};

/// What the provider reports: the whole prompt, the part read from its cache, the part written
/// to it (Messages only), the answer.
const INPUT: u64 = 1234;
const CACHE_READ: u64 = 1000;
const CACHE_WRITE: u64 = 200;
const OUTPUT: u64 = 56;
const CHAT_MODEL: &str = "gpt-test-2026-01-01";
const MESSAGES_MODEL: &str = "claude-test-2026";

/// The pause before the last chunk of a streamed answer.
const LAST_CHUNK_PAUSE: Duration = Duration::from_millis(300);

/// A provider that reports fixed usage and records the headers it receives and when it sent the
/// last chunk of a stream.
#[derive(Default)]
struct Provider {
    headers: Mutex<Vec<http::HeaderMap>>,
    last_chunk_sent: Mutex<Option<SystemTime>>,
}

async fn start_provider() -> (SocketAddr, Arc<Provider>) {
    let provider = Arc::new(Provider::default());
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/messages", post(messages))
        .with_state(provider.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (addr, provider)
}

/// `events` as an SSE body, the last one sent after [`LAST_CHUNK_PAUSE`] (its time recorded).
fn stream(provider: Arc<Provider>, mut events: Vec<String>) -> Response {
    let last = events.pop().unwrap();
    let head = futures::stream::iter(
        events
            .into_iter()
            .map(|e| Ok::<_, std::io::Error>(Bytes::from(e))),
    );
    let tail = futures::stream::once(async move {
        tokio::time::sleep(LAST_CHUNK_PAUSE).await;
        *provider.last_chunk_sent.lock().unwrap() = Some(SystemTime::now());
        Ok(Bytes::from(last))
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(futures::StreamExt::chain(head, tail)))
        .unwrap()
}

async fn chat(
    State(provider): State<Arc<Provider>>,
    headers: http::HeaderMap,
    body: Bytes,
) -> Response {
    provider.headers.lock().unwrap().push(headers);
    let body: Value = serde_json::from_slice(&body).unwrap();
    let usage = json!({"prompt_tokens": INPUT, "completion_tokens": OUTPUT,
        "total_tokens": INPUT + OUTPUT, "prompt_tokens_details": {"cached_tokens": CACHE_READ}});
    if body["stream"] != json!(true) {
        return axum::Json(
            json!({"id": "c", "object": "chat.completion", "model": CHAT_MODEL,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello"},
                         "finish_reason": "stop"}],
            "usage": usage}),
        )
        .into_response();
    }
    let chunk = |choices: Value, usage: Value| {
        format!(
            "data: {}\n\n",
            json!({"id": "c", "object": "chat.completion.chunk", "model": CHAT_MODEL,
                   "choices": choices, "usage": usage})
        )
    };
    let mut events = vec![
        chunk(
            json!([{"index": 0, "delta": {"content": "Hel"}}]),
            Value::Null,
        ),
        chunk(
            json!([{"index": 0, "delta": {}, "finish_reason": "stop"}]),
            Value::Null,
        ),
    ];
    if body["stream_options"]["include_usage"] == json!(true) {
        events.push(chunk(json!([]), usage));
    }
    events.push("data: [DONE]\n\n".into());
    stream(provider, events)
}

async fn messages(State(provider): State<Arc<Provider>>, headers: http::HeaderMap) -> Response {
    provider.headers.lock().unwrap().push(headers);
    let event = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
    let events = vec![
        event(
            "message_start",
            json!({"type": "message_start", "message": {"id": "m", "type": "message",
                "role": "assistant", "model": MESSAGES_MODEL, "content": [],
                "usage": {"input_tokens": INPUT - CACHE_READ - CACHE_WRITE,
                          "cache_read_input_tokens": CACHE_READ,
                          "cache_creation_input_tokens": CACHE_WRITE, "output_tokens": 1}}}),
        ),
        event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
                   "delta": {"type": "text_delta", "text": "Hello"}}),
        ),
        event(
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                   "usage": {"output_tokens": OUTPUT}}),
        ),
        event("message_stop", json!({"type": "message_stop"})),
    ];
    stream(provider, events)
}

/// A proxy configured by `cfg`, exporting to `collector`.
async fn traced_proxy(mut cfg: Config, collector: &Collector) -> Proxy {
    cfg.telemetry.otlp_endpoint = collector.endpoint();
    start_proxy(cfg).await
}

/// A configuration whose providers (OpenAI-compatible and Anthropic) are both at `addr`.
fn proxy_to(addr: SocketAddr) -> Config {
    let mut cfg = config(&format!("http://{addr}/v1"));
    cfg.anthropic_upstream = format!("http://{addr}");
    cfg
}

fn hello(model: &str, stream: bool) -> String {
    json!({"model": model, "stream": stream,
           "messages": [{"role": "system", "content": "You are terse."},
                        {"role": "user", "content": "Say hello."}]})
    .to_string()
}

fn unix_nanos(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64
}

/// The spans of kind `kind`.
fn of_kind(spans: &[Span], kind: SpanKind) -> Vec<Span> {
    spans
        .iter()
        .filter(|s| s.kind == kind as i32)
        .cloned()
        .collect()
}

/// The spans whose parent is `parent`.
fn children<'a>(spans: &'a [Span], parent: &Span) -> Vec<&'a Span> {
    spans
        .iter()
        .filter(|s| s.trace_id == parent.trace_id && s.parent_span_id == parent.span_id)
        .collect()
}

fn header(reply: &Reply, name: &str) -> i64 {
    reply.header(name).unwrap().parse().unwrap()
}

/// The request span's attributes that come from the answer's headers and the provider's usage.
fn assert_request_span(span: &Span, reply: &Reply, provider: &str, asked: &str, answered: &str) {
    assert_eq!(span.name, format!("chat {asked}"));
    assert_eq!(text(span, "gen_ai.operation.name").as_deref(), Some("chat"));
    assert_eq!(
        text(span, "gen_ai.provider.name").as_deref(),
        Some(provider)
    );
    assert_eq!(text(span, "gen_ai.request.model").as_deref(), Some(asked));
    assert_eq!(
        text(span, "gen_ai.response.model").as_deref(),
        Some(answered)
    );
    assert_eq!(int(span, "gen_ai.usage.input_tokens"), Some(INPUT as i64));
    assert_eq!(int(span, "gen_ai.usage.output_tokens"), Some(OUTPUT as i64));
    assert_eq!(
        int(span, "gen_ai.usage.cache_read.input_tokens"),
        Some(CACHE_READ as i64)
    );
    // The id the conversation page and its endpoints know it by.
    let conversation = text(span, "gen_ai.conversation.id").unwrap();
    assert_eq!(
        Some(conversation.as_str()),
        reply.header("x-compactor-conversation")
    );
    assert!(
        conversation.chars().all(|c| c.is_ascii_hexdigit()),
        "{conversation}"
    );
    assert_eq!(flag(span, "compactor.compacted"), Some(false));
    assert_eq!(
        int(span, "compactor.tokens.as_sent"),
        Some(header(reply, "x-compactor-prompt-tokens"))
    );
    assert_eq!(
        int(span, "compactor.tokens.forwarded"),
        Some(header(reply, "x-compactor-tokens-after"))
    );
    assert_eq!(
        int(span, "compactor.window"),
        Some(header(reply, "x-compactor-context-window"))
    );
    assert_eq!(int(span, "http.response.status_code"), Some(200));
}

#[tokio::test]
async fn a_request_is_one_span_with_the_genai_attributes_and_the_providers_usage() {
    let collector = otlp::start_collector().await;
    let (addr, _provider) = start_provider().await;
    let mut proxy = traced_proxy(proxy_to(addr), &collector).await;
    let url = format!("{}/v1/chat/completions", proxy.url());
    let reply = send(&url, &[], hello("gpt-asked", false)).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    proxy.stopped().await;

    let spans = collector.spans();
    let requests = of_kind(&spans, SpanKind::Server);
    assert_eq!(requests.len(), 1, "one span per request: {spans:?}");
    let request = &requests[0];
    assert_request_span(request, &reply, "openai", "gpt-asked", CHAT_MODEL);
    assert_eq!(
        otlp::value(
            &request.attributes,
            "gen_ai.usage.cache_creation.input_tokens"
        ),
        None,
        "not reported by this provider"
    );
    let calls = children(&spans, request);
    assert_eq!(calls.len(), 1);
    let call = calls[0];
    assert_eq!(call.kind, SpanKind::Client as i32);
    assert_eq!(call.name, "POST /v1/chat/completions");
    assert_eq!(int(call, "http.response.status_code"), Some(200));
    assert_eq!(text(call, "server.address").as_deref(), Some("127.0.0.1"));
    assert_eq!(int(call, "server.port"), Some(addr.port() as i64));
    assert!(call.start_time_unix_nano >= request.start_time_unix_nano);
    assert!(call.end_time_unix_nano <= request.end_time_unix_nano);
    let service = otlp::value(&collector.resource_attributes(), "service.name").cloned();
    assert_eq!(
        service,
        Some(
            opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(
                "compactor".into()
            )
        )
    );
}

#[tokio::test]
async fn a_streamed_answer_ends_its_span_after_the_last_chunk_with_the_streams_usage() {
    let collector = otlp::start_collector().await;
    let (addr, provider) = start_provider().await;
    let mut proxy = traced_proxy(proxy_to(addr), &collector).await;
    // The client does not ask for usage: the proxy asks, reads it and strips it.
    let reply = send(
        &format!("{}/v1/chat/completions", proxy.url()),
        &[],
        hello("gpt-asked", true),
    )
    .await;
    assert_eq!(reply.status, 200);
    assert!(!reply.body.contains("\"usage\":{"), "{}", reply.body);
    let chat_last_chunk = provider.last_chunk_sent.lock().unwrap().unwrap();

    let messages = json!({"model": "claude-asked", "max_tokens": 100, "stream": true,
        "messages": [{"role": "user", "content": "Say hello."}]});
    let anthropic = send(
        &format!("{}/v1/messages", proxy.url()),
        &[
            ("x-api-key", "sk-ant-test"),
            ("anthropic-version", "2023-06-01"),
        ],
        messages.to_string(),
    )
    .await;
    assert_eq!(anthropic.status, 200);
    let messages_last_chunk = provider.last_chunk_sent.lock().unwrap().unwrap();
    proxy.stopped().await;

    let spans = collector.spans();
    let requests = of_kind(&spans, SpanKind::Server);
    assert_eq!(requests.len(), 2, "{spans:?}");
    let by_dialect = |dialect: &str| {
        requests
            .iter()
            .find(|s| text(s, "compactor.dialect").as_deref() == Some(dialect))
            .unwrap()
            .clone()
    };
    let chat = by_dialect("chat");
    assert_request_span(&chat, &reply, "openai", "gpt-asked", CHAT_MODEL);
    let messages = by_dialect("messages");
    assert_request_span(
        &messages,
        &anthropic,
        "anthropic",
        "claude-asked",
        MESSAGES_MODEL,
    );
    assert_eq!(
        int(&messages, "gen_ai.usage.cache_creation.input_tokens"),
        Some(CACHE_WRITE as i64)
    );
    for (span, last_chunk) in [(&chat, chat_last_chunk), (&messages, messages_last_chunk)] {
        // The request span and the call's end once the stream has: not when its head came.
        assert!(
            span.end_time_unix_nano >= unix_nanos(last_chunk),
            "{} ended before the stream's last chunk was sent",
            span.name
        );
        let call = children(&spans, span)[0];
        assert!(call.end_time_unix_nano >= unix_nanos(last_chunk));
        assert!(call.end_time_unix_nano <= span.end_time_unix_nano);
        assert!(
            span.end_time_unix_nano - span.start_time_unix_nano
                >= LAST_CHUNK_PAUSE.as_nanos() as u64
        );
    }
}

/// A conversation long enough to be summarized when compaction is forced, with `marker` in
/// every message.
fn history(marker: &str) -> Value {
    let mut messages =
        vec![json!({"role": "system", "content": format!("You are a coding agent. {marker}")})];
    for turn in 0..8 {
        messages.push(json!({"role": "user", "content": format!("step {turn}: {marker} change the parser {}", "and the lexer ".repeat(40))}));
        messages.push(
            json!({"role": "assistant", "content": format!("done with step {turn} {marker}")}),
        );
    }
    messages.push(json!({"role": "user", "content": format!("next {marker}")}));
    json!({"model": "gpt-4o", "messages": messages})
}

#[tokio::test]
async fn a_compacted_request_has_a_summary_span_beneath_it() {
    let collector = otlp::start_collector().await;
    let mock = start_mock().await;
    mock.state
        .summary_delay_ms
        .store(150, std::sync::atomic::Ordering::SeqCst);
    let mut proxy = traced_proxy(config(&mock.url()), &collector).await;
    let reply = send(
        &format!("{}/v1/chat/completions", proxy.url()),
        &[("x-compactor-mode", "force"), ("authorization", "Bearer k")],
        history("m").to_string(),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("x-compactor-compacted"), Some("true"));
    let checkpoint = reply.header("x-compactor-checkpoint").unwrap().to_string();
    proxy.stopped().await;

    let spans = collector.spans();
    let requests = of_kind(&spans, SpanKind::Server);
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(flag(request, "compactor.compacted"), Some(true));
    assert_eq!(
        text(request, "compactor.checkpoint.id").as_deref(),
        Some(checkpoint.as_str())
    );
    assert_eq!(
        int(request, "compactor.tokens.forwarded"),
        Some(header(&reply, "x-compactor-tokens-after"))
    );
    let below = children(&spans, request);
    assert_eq!(below.len(), 2, "the summary and the call upstream");
    let summary = below
        .iter()
        .find(|s| s.name == "compactor summary")
        .expect("a summary span");
    assert_eq!(summary.kind, SpanKind::Internal as i32);
    assert_eq!(
        text(summary, "compactor.summary.trigger").as_deref(),
        Some("forced")
    );
    assert_eq!(
        text(summary, "compactor.summary.model").as_deref(),
        Some("gpt-4o")
    );
    assert_eq!(flag(summary, "compactor.summary.written"), Some(true));
    assert_eq!(
        text(summary, "compactor.checkpoint.id").as_deref(),
        Some(checkpoint.as_str())
    );
    let before = int(summary, "compactor.tokens.before").unwrap();
    let after = int(summary, "compactor.tokens.after").unwrap();
    assert!(after < before, "{after} < {before}");
    assert_eq!(before, header(&reply, "x-compactor-tokens-before"));
    let duration = int(summary, "compactor.summary.duration_ms").unwrap();
    assert!(duration >= 150, "{duration} ms");
    assert_eq!(
        (summary.end_time_unix_nano - summary.start_time_unix_nano) / 1_000_000,
        duration as u64,
        "the span lasts what the summary took"
    );
    // The summary ran before the call upstream, within the request.
    let call = below
        .iter()
        .find(|s| s.kind == SpanKind::Client as i32)
        .unwrap();
    assert!(summary.start_time_unix_nano >= request.start_time_unix_nano);
    assert!(summary.end_time_unix_nano <= call.start_time_unix_nano);
}

#[tokio::test]
async fn the_clients_trace_is_continued_and_passed_on_upstream() {
    let collector = otlp::start_collector().await;
    let (addr, provider) = start_provider().await;
    let mut proxy = traced_proxy(proxy_to(addr), &collector).await;
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let client_span = "00f067aa0ba902b7";
    let url = format!("{}/v1/chat/completions", proxy.url());
    let traceparent = format!("00-{trace_id}-{client_span}-01");
    let reply = send(
        &url,
        &[("traceparent", &traceparent), ("tracestate", "vendor=1")],
        hello("gpt-asked", false),
    )
    .await;
    assert_eq!(reply.status, 200);
    // Without one, the request starts a trace of its own and still passes it on.
    let alone = send(&url, &[], hello("gpt-asked", false)).await;
    assert_eq!(alone.status, 200);
    proxy.stopped().await;

    let spans = collector.spans();
    let received: Vec<String> = provider
        .headers
        .lock()
        .unwrap()
        .iter()
        .map(|h| h["traceparent"].to_str().unwrap().to_string())
        .collect();
    assert_eq!(received.len(), 2);
    let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let requests = of_kind(&spans, SpanKind::Server);
    let continued = requests
        .iter()
        .find(|s| hex(&s.trace_id) == trace_id)
        .expect("the client's trace id kept");
    assert_eq!(hex(&continued.parent_span_id), client_span);
    let call = children(&spans, continued)[0];
    assert_eq!(
        received[0],
        format!("00-{trace_id}-{}-01", hex(&call.span_id)),
        "the provider's parent is the call span"
    );
    assert_eq!(
        provider.headers.lock().unwrap()[0]["tracestate"],
        "vendor=1"
    );

    let own = requests
        .iter()
        .find(|s| hex(&s.trace_id) != trace_id)
        .unwrap();
    assert!(own.parent_span_id.is_empty(), "a root span");
    let call = children(&spans, own)[0];
    assert_eq!(
        received[1],
        format!("00-{}-{}-01", hex(&own.trace_id), hex(&call.span_id))
    );
}

#[tokio::test]
async fn no_span_holds_message_text_a_summary_or_a_credential() {
    let collector = otlp::start_collector().await;
    let mock = start_mock().await;
    let mut proxy = traced_proxy(config(&mock.url()), &collector).await;
    let url = format!("{}/v1/chat/completions", proxy.url());
    let marker = "Zebrafish-Quokka-7731";
    let key = "sk-test-Key-Never-Exported-5512";
    let bearer = format!("Bearer {key}");
    let instructions = "Keep-The-Instruction-Private-4410";
    for (mode, stream) in [("force", false), ("auto", true), ("auto", false)] {
        let mut body = history(marker);
        body["stream"] = json!(stream);
        let reply = send(
            &url,
            &[
                ("authorization", &bearer),
                ("x-compactor-mode", mode),
                ("x-compactor-instructions", instructions),
            ],
            body.to_string(),
        )
        .await;
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    assert!(!mock.summaries().is_empty(), "a summary was written");
    proxy.stopped().await;

    let spans = collector.spans();
    assert!(spans.len() >= 7, "{} spans", spans.len());
    let exported = String::from_utf8_lossy(&collector.bytes()).into_owned();
    for secret in [marker, key, instructions, "SUMMARY-1", "and the lexer"] {
        assert!(!exported.contains(secret), "`{secret}` was exported");
        for span in &spans {
            for value in otlp::all_values(span) {
                assert!(!value.contains(secret), "`{secret}` in {}", span.name);
            }
        }
    }
    // What the spans do say is there.
    assert!(exported.contains("gen_ai.conversation.id"));
}

#[tokio::test]
async fn a_retry_after_an_overflow_is_a_second_call_after_its_summary() {
    let collector = otlp::start_collector().await;
    let mock = start_mock().await;
    // The provider's window is far smaller than the one the proxy assumes.
    mock.set_window(1000);
    let mut cfg = config(&mock.url());
    cfg.summarizer.window = 200_000;
    let mut proxy = traced_proxy(cfg, &collector).await;
    let reply = send(
        &format!("{}/v1/chat/completions", proxy.url()),
        &[("authorization", "Bearer k")],
        history("m").to_string(),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("x-compactor-compacted"), Some("true"));
    assert_eq!(mock.chats().len(), 2, "one retry");
    proxy.stopped().await;

    let spans = collector.spans();
    let requests = of_kind(&spans, SpanKind::Server);
    assert_eq!(requests.len(), 1);
    let below = children(&spans, &requests[0]);
    let mut calls: Vec<&&Span> = below
        .iter()
        .filter(|s| s.kind == SpanKind::Client as i32)
        .collect();
    calls.sort_by_key(|s| int(s, "compactor.upstream.attempt"));
    assert_eq!(calls.len(), 2);
    assert_eq!(int(calls[0], "http.response.status_code"), Some(400));
    assert_eq!(text(calls[0], "error.type").as_deref(), Some("400"));
    let refused = calls[0].status.clone().unwrap_or_default();
    assert_eq!(
        refused.code,
        StatusCode::Error as i32,
        "the provider refused the call"
    );
    assert_eq!(int(calls[1], "http.response.status_code"), Some(200));
    assert!(
        calls[0].end_time_unix_nano <= calls[1].start_time_unix_nano,
        "the refused call ended before the retry"
    );
    let summaries: Vec<_> = below
        .iter()
        .filter(|s| s.name == "compactor summary")
        .collect();
    assert_eq!(summaries.len(), 1, "only the retry needed a summary");
    assert_eq!(
        text(summaries[0], "compactor.summary.trigger").as_deref(),
        Some("overflow")
    );
    assert!(summaries[0].start_time_unix_nano >= calls[0].end_time_unix_nano);
}

#[tokio::test]
async fn a_refused_request_is_a_span_that_says_why_without_failing_the_server() {
    let collector = otlp::start_collector().await;
    let (addr, provider) = start_provider().await;
    let mut proxy = traced_proxy(proxy_to(addr), &collector).await;
    let reply = send(
        &format!("{}/v1/chat/completions", proxy.url()),
        &[],
        "{not json".into(),
    )
    .await;
    assert_eq!(reply.status, 400);
    assert!(provider.headers.lock().unwrap().is_empty());
    proxy.stopped().await;

    let spans = collector.spans();
    assert_eq!(spans.len(), 1, "no call upstream: {spans:?}");
    let span = &spans[0];
    assert_eq!(span.name, "chat");
    assert_eq!(int(span, "http.response.status_code"), Some(400));
    assert_eq!(text(span, "error.type").as_deref(), Some("400"));
    // A client's mistake is not the server's failure (the HTTP conventions for servers).
    let status = span.status.clone().unwrap_or_default();
    assert_ne!(status.code, StatusCode::Error as i32);
}
