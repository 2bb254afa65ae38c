//! One mock provider on 127.0.0.1:0 that serves all three wire formats: chat completions at
//! `/v1/chat/completions`, Responses at `/v1/responses` (and `/v1/responses/input_tokens`),
//! Anthropic Messages at `/v1/messages` (and `/v1/messages/count_tokens`). Point `upstream` at
//! [`ProviderMock::openai_base`] and `anthropic_upstream` at [`ProviderMock::anthropic_base`]
//! ([`ProviderMock::config`] does both).
//!
//! Whatever the format, it does the same things, each in that provider's own words: it counts a
//! body's tokens by its own count ([`tokens`]: the text of the conversation and its
//! instructions, never more than the proxy counts), refuses a prompt over its window with that
//! provider's real overflow body (`/work/shared/reference/overflow-errors.md`), writes numbered
//! summaries (`SUMMARY-n`) for requests marked `x-compactor-purpose: summary`, answers
//! everything else with "Hello there" (whole or streamed), counts tokens on the count
//! endpoints, and records every request it receives with its format and purpose.
//!
//! The per-format mocks (`mod.rs`, `messages_mock.rs`, `responses_mock.rs`) stay for the tests
//! that need their special behaviours (rate limits, hangs, dropped streams, summaries that fail or
//! wait); this one serves the dialect battery (`tests/dialects.rs`), where every format must
//! meet the same provider.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use compactor::config::Config;
use serde_json::{json, Value};
use tokio::net::TcpListener;

/// What every non-summary answer says.
pub const ANSWER: &str = "Hello there";

/// The three wire formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Chat,
    Responses,
    Messages,
}

/// Why a request came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// A conversation turn, to be answered by the model.
    Turn,
    /// A summary request made by the proxy.
    Summary,
    /// A token-counting request.
    Count,
}

/// One request the mock received.
#[derive(Debug, Clone)]
pub struct Received {
    pub format: Format,
    pub purpose: Purpose,
    pub path: String,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Received {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

#[derive(Default)]
struct MockState {
    /// Enforced window (0: none).
    window: AtomicU64,
    overflows: AtomicUsize,
    received: Mutex<Vec<Received>>,
}

pub struct ProviderMock {
    pub addr: SocketAddr,
    state: Arc<MockState>,
}

impl ProviderMock {
    /// The OpenAI-compatible base (`upstream`), which ends in `/v1`.
    pub fn openai_base(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The Anthropic base (`anthropic_upstream`), to which `/v1/messages` is appended.
    pub fn anthropic_base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A proxy configuration with both providers here and an in-memory store.
    pub fn config(&self) -> Config {
        let mut config = super::config(&self.openai_base());
        config.anthropic_upstream = self.anthropic_base();
        config
    }

    /// The window the mock enforces from now on (0: none).
    pub fn set_window(&self, tokens: u64) {
        self.state.window.store(tokens, Ordering::SeqCst);
    }

    /// How many prompts the mock refused as too long.
    pub fn overflows(&self) -> usize {
        self.state.overflows.load(Ordering::SeqCst)
    }

    /// The requests received for `purpose`, in order.
    pub fn received(&self, purpose: Purpose) -> Vec<Received> {
        let all = self.state.received.lock().unwrap();
        all.iter()
            .filter(|r| r.purpose == purpose)
            .cloned()
            .collect()
    }
}

pub async fn start() -> ProviderMock {
    let state = Arc::new(MockState::default());
    let app = Router::new()
        .route(
            "/v1/chat/completions",
            post(|s: State<Arc<MockState>>, r: Request| answer(s, Format::Chat, r)),
        )
        .route(
            "/v1/responses",
            post(|s: State<Arc<MockState>>, r: Request| answer(s, Format::Responses, r)),
        )
        .route(
            "/v1/responses/input_tokens",
            post(|s: State<Arc<MockState>>, r: Request| count(s, Format::Responses, r)),
        )
        .route(
            "/v1/messages",
            post(|s: State<Arc<MockState>>, r: Request| answer(s, Format::Messages, r)),
        )
        .route(
            "/v1/messages/count_tokens",
            post(|s: State<Arc<MockState>>, r: Request| count(s, Format::Messages, r)),
        )
        .with_state(state.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    ProviderMock { addr, state }
}

/// The mock's own token count of a body of any format: the o200k count of the text of its
/// conversation (`messages` or `input`) and instructions (`system`, `instructions`). Only
/// strings under text-bearing keys count, not roles, types or ids, so the count stays below the
/// proxy's, which adds framing.
pub fn tokens(body: &Value) -> u64 {
    const TEXT_KEYS: &[&str] = &[
        "content",
        "text",
        "output",
        "arguments",
        "thinking",
        "system",
        "instructions",
        "input",
    ];
    fn collect(value: &Value, counted: bool, out: &mut String) {
        match value {
            Value::String(s) if counted => {
                out.push_str(s);
                out.push('\n');
            }
            Value::Array(items) => items.iter().for_each(|v| collect(v, counted, out)),
            Value::Object(map) => {
                for (key, v) in map {
                    collect(v, TEXT_KEYS.contains(&key.as_str()), out);
                }
            }
            _ => {}
        }
    }
    let mut text = String::new();
    for key in ["system", "instructions", "messages", "input"] {
        if let Some(value) = body.get(key) {
            collect(value, true, &mut text);
        }
    }
    compactor::tokenizer::Encoding::O200k.count(&text)
}

async fn receive(format: Format, purpose: Purpose, request: Request) -> Received {
    let (parts, body) = request.into_parts();
    Received {
        format,
        purpose,
        path: parts.uri.path().to_string(),
        headers: parts.headers,
        body: axum::body::to_bytes(body, usize::MAX).await.unwrap(),
    }
}

async fn count(State(state): State<Arc<MockState>>, format: Format, request: Request) -> Response {
    let received = receive(format, Purpose::Count, request).await;
    let tokens = tokens(&received.json());
    state.received.lock().unwrap().push(received);
    let answer = match format {
        Format::Responses => json!({"object": "response.input_tokens", "input_tokens": tokens}),
        _ => json!({"input_tokens": tokens}),
    };
    axum::Json(answer).into_response()
}

async fn answer(State(state): State<Arc<MockState>>, format: Format, request: Request) -> Response {
    let is_summary = request
        .headers()
        .get("x-compactor-purpose")
        .is_some_and(|v| v == "summary");
    let purpose = if is_summary {
        Purpose::Summary
    } else {
        Purpose::Turn
    };
    let received = receive(format, purpose, request).await;
    let body = received.json();
    let prompt = tokens(&body);
    let stream = body["stream"].as_bool() == Some(true);
    let summaries = {
        let mut all = state.received.lock().unwrap();
        all.push(received);
        all.iter().filter(|r| r.purpose == Purpose::Summary).count()
    };
    if is_summary {
        let text = format!(
            "## Goal\nSUMMARY-{summaries}: keep the conversation going.\n## Progress\n### Done\nsteps\n## Next steps\ncontinue"
        );
        // Summary requests are never streamed; answered whole in the format asked.
        return axum::Json(whole_answer(format, &text, prompt)).into_response();
    }
    let window = state.window.load(Ordering::SeqCst);
    if window > 0 && prompt > window {
        state.overflows.fetch_add(1, Ordering::SeqCst);
        return (
            http::StatusCode::BAD_REQUEST,
            axum::Json(overflow_body(format, prompt, window)),
        )
            .into_response();
    }
    if stream {
        let with_usage = body["stream_options"]["include_usage"].as_bool() == Some(true);
        return sse(stream_events(format, prompt, with_usage));
    }
    axum::Json(whole_answer(format, ANSWER, prompt)).into_response()
}

/// Each provider's own overflow error, as it sends it with status 400.
pub fn overflow_body(format: Format, tokens: u64, window: u64) -> Value {
    match format {
        Format::Chat => json!({"error": {
            "message": format!("This model's maximum context length is {window} tokens. However, your messages resulted in {tokens} tokens. Please reduce the length of the messages."),
            "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}),
        // OpenAI's Responses wording states no figures.
        Format::Responses => json!({"error": {
            "message": "Your input exceeds the context window of this model. Please adjust your input and try again.",
            "type": "invalid_request_error", "param": "input", "code": "context_length_exceeded"}}),
        Format::Messages => json!({"type": "error", "error": {
            "type": "invalid_request_error",
            "message": format!("prompt is too long: {tokens} tokens > {window} maximum")}}),
    }
}

/// A whole (non-streamed) answer saying `text`.
fn whole_answer(format: Format, text: &str, prompt: u64) -> Value {
    match format {
        Format::Chat => json!({
            "id": "chatcmpl-mock", "object": "chat.completion", "created": 1, "model": "mock",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": 3, "total_tokens": prompt + 3},
        }),
        Format::Responses => response_object(text, prompt),
        Format::Messages => json!({
            "id": "msg_mock", "type": "message", "role": "assistant", "model": "mock",
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn", "stop_sequence": null,
            "usage": {"input_tokens": prompt, "output_tokens": 3},
        }),
    }
}

fn response_object(text: &str, prompt: u64) -> Value {
    json!({
        "id": "resp_mock", "object": "response", "created_at": 1, "status": "completed", "model": "mock",
        "output": [{"type": "message", "id": "msg_mock", "status": "completed", "role": "assistant",
                    "content": [{"type": "output_text", "text": text, "annotations": []}]}],
        "usage": {"input_tokens": prompt, "output_tokens": 3, "total_tokens": prompt + 3},
    })
}

/// The events of a streamed answer saying [`ANSWER`], as `(event name, data)`; chat names none.
fn stream_events(
    format: Format,
    prompt: u64,
    with_usage: bool,
) -> Vec<(Option<&'static str>, Value)> {
    let chunk = |delta: Value, finish: Value| {
        json!({"id": "c", "object": "chat.completion.chunk",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    match format {
        Format::Chat => {
            let mut events = vec![
                (None, chunk(json!({"content": ANSWER}), Value::Null)),
                (None, chunk(json!({}), json!("stop"))),
            ];
            if with_usage {
                events.push((None, json!({"id": "c", "object": "chat.completion.chunk", "choices": [],
                    "usage": {"prompt_tokens": prompt, "completion_tokens": 3, "total_tokens": prompt + 3}})));
            }
            events
        }
        Format::Responses => {
            let item = &response_object(ANSWER, prompt)["output"][0];
            vec![
                (
                    Some("response.created"),
                    json!({"type": "response.created", "response": {"id": "resp_mock", "status": "in_progress", "output": []}}),
                ),
                (
                    Some("response.output_item.added"),
                    json!({"type": "response.output_item.added", "output_index": 0, "item": item}),
                ),
                (
                    Some("response.output_text.delta"),
                    json!({"type": "response.output_text.delta", "item_id": "msg_mock", "output_index": 0, "content_index": 0, "delta": ANSWER}),
                ),
                (
                    Some("response.output_item.done"),
                    json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
                ),
                (
                    Some("response.completed"),
                    json!({"type": "response.completed", "response": response_object(ANSWER, prompt)}),
                ),
            ]
        }
        Format::Messages => vec![
            (
                Some("message_start"),
                json!({"type": "message_start", "message": {"id": "msg_mock", "type": "message", "role": "assistant", "model": "mock", "content": [], "stop_reason": null, "usage": {"input_tokens": prompt, "output_tokens": 1}}}),
            ),
            (
                Some("content_block_start"),
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            ),
            (
                Some("content_block_delta"),
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": ANSWER}}),
            ),
            (
                Some("content_block_stop"),
                json!({"type": "content_block_stop", "index": 0}),
            ),
            (
                Some("message_delta"),
                json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 3}}),
            ),
            (Some("message_stop"), json!({"type": "message_stop"})),
        ],
    }
}

/// `events` as an SSE stream, one chunk per event; chat ends in `[DONE]`.
fn sse(events: Vec<(Option<&'static str>, Value)>) -> Response {
    let chat = events.first().is_some_and(|(name, _)| name.is_none());
    let mut chunks: Vec<String> = events
        .into_iter()
        .map(|(name, data)| match name {
            Some(name) => format!("event: {name}\ndata: {data}\n\n"),
            None => format!("data: {data}\n\n"),
        })
        .collect();
    if chat {
        chunks.push("data: [DONE]\n\n".into());
    }
    let stream = futures::stream::iter(
        chunks
            .into_iter()
            .map(|c| Ok::<_, std::io::Error>(Bytes::from(c))),
    );
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap()
}
