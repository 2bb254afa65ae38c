//! A mock Anthropic Messages provider on 127.0.0.1:0, for the `/v1/messages` tests.
//!
//! It counts a body's tokens as the o200k count of every string in `system` and `messages`,
//! base64 media aside (never more than the proxy's count), enforces a window with Anthropic's or llama.cpp's
//! overflow body, answers summary requests (`x-compactor-purpose: summary`) with numbered
//! summaries, streams valid SSE with llama.cpp's split usage (`input_tokens` plus
//! `cache_read_input_tokens`), answers `count_tokens`, and records everything.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use serde_json::{json, Value};
use tokio::net::TcpListener;

/// One request the mock received.
#[derive(Debug, Clone)]
pub struct Received {
    pub path: String,
    pub query: Option<String>,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Received {
    /// The raw JSON text of each message in the body, in order.
    pub fn raw_messages(&self) -> Vec<String> {
        #[derive(serde::Deserialize)]
        struct Body<'a> {
            #[serde(borrow)]
            messages: Vec<&'a serde_json::value::RawValue>,
        }
        let body: Body = serde_json::from_slice(&self.body).unwrap();
        body.messages.iter().map(|m| m.get().to_string()).collect()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// How the mock words an overflow.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Overflow {
    Anthropic,
    LlamaCpp,
    /// A streamed request answered 200, `message_start` and a `ping`, then `event: error` with
    /// Anthropic's overflow body, before any content (each event its own chunk).
    AfterMessageStart,
}

#[derive(Default)]
pub struct MockState {
    /// Enforced window (0: none).
    pub window: AtomicU64,
    pub llama_overflow: std::sync::atomic::AtomicBool,
    pub overflow_after_start: std::sync::atomic::AtomicBool,
    pub overflows: AtomicU64,
    pub messages: Mutex<Vec<Received>>,
    pub summaries: Mutex<Vec<Received>>,
    pub counts: Mutex<Vec<Received>>,
}

pub struct MessagesMock {
    pub addr: SocketAddr,
    pub state: Arc<MockState>,
}

impl MessagesMock {
    /// The base URL, as `anthropic_upstream` takes it.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set_window(&self, window: u64, style: Overflow) {
        self.state.window.store(window, Ordering::SeqCst);
        self.state
            .llama_overflow
            .store(style == Overflow::LlamaCpp, Ordering::SeqCst);
        self.state
            .overflow_after_start
            .store(style == Overflow::AfterMessageStart, Ordering::SeqCst);
    }

    /// A proxy's configuration in front of this mock for `model`, whose window is so large
    /// that Compactor's own compaction never starts: only what a client asks for compacts.
    pub fn config_for(&self, model: &str) -> compactor::config::Config {
        let mut config = super::config("http://127.0.0.1:9/v1");
        config.anthropic_upstream = self.url();
        config.windows.insert(model.to_string(), 1_000_000);
        config.summarizer.window = 100_000;
        config
    }

    /// Client requests forwarded to the model (summary requests excluded).
    pub fn forwarded(&self) -> Vec<Received> {
        self.state.messages.lock().unwrap().clone()
    }

    pub fn summaries(&self) -> Vec<Received> {
        self.state.summaries.lock().unwrap().clone()
    }

    pub fn counts(&self) -> Vec<Received> {
        self.state.counts.lock().unwrap().clone()
    }
}

/// The mock's token count of a Messages body: every string in `system` and `messages` but the
/// base64 data of images and documents, which a provider decodes rather than reads.
pub fn mock_tokens(body: &Value) -> u64 {
    fn strings(value: &Value, out: &mut String) {
        match value {
            Value::String(s) => {
                out.push_str(s);
                out.push('\n');
            }
            Value::Array(items) => items.iter().for_each(|v| strings(v, out)),
            Value::Object(map) if map.get("type") == Some(&json!("base64")) => {}
            Value::Object(map) => map.values().for_each(|v| strings(v, out)),
            _ => {}
        }
    }
    let mut text = String::new();
    strings(&body["system"], &mut text);
    strings(&body["messages"], &mut text);
    tiktoken_rs::o200k_base_singleton()
        .encode_ordinary(&text)
        .len() as u64
}

pub async fn start() -> MessagesMock {
    let state = Arc::new(MockState::default());
    let app = Router::new()
        .route("/v1/messages", post(messages))
        .route("/v1/messages/count_tokens", post(count_tokens))
        .with_state(state.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    MessagesMock { addr, state }
}

async fn receive(req: Request) -> Received {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    Received {
        path: parts.uri.path().to_string(),
        query: parts.uri.query().map(str::to_string),
        headers: parts.headers,
        body,
    }
}

async fn count_tokens(State(state): State<Arc<MockState>>, req: Request) -> Response {
    let received = receive(req).await;
    let tokens = mock_tokens(&received.json());
    state.counts.lock().unwrap().push(received);
    axum::Json(json!({"input_tokens": tokens})).into_response()
}

fn message(text: &str, usage: Value) -> Value {
    json!({
        "id": "msg_mock", "type": "message", "role": "assistant", "model": "mock",
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn", "stop_sequence": null, "usage": usage,
    })
}

/// llama.cpp's usage: the cached part of the prompt reported apart.
fn usage(prompt_tokens: u64) -> Value {
    let cached = prompt_tokens / 2;
    json!({"input_tokens": prompt_tokens - cached, "cache_creation_input_tokens": 0,
           "cache_read_input_tokens": cached, "output_tokens": 2})
}

async fn messages(State(state): State<Arc<MockState>>, req: Request) -> Response {
    let received = receive(req).await;
    let body = received.json();
    let tokens = mock_tokens(&body);
    if received
        .headers
        .get("x-compactor-purpose")
        .is_some_and(|v| v == "summary")
    {
        state.summaries.lock().unwrap().push(received);
        let n = state.summaries.lock().unwrap().len();
        let text = format!("## Goal\nSUMMARY-{n}: keep going.\n## Progress\n### Done\nsteps\n## Next steps\ncontinue");
        return axum::Json(message(&text, usage(tokens))).into_response();
    }
    state.messages.lock().unwrap().push(received);
    let window = state.window.load(Ordering::SeqCst);
    let streamed = body["stream"].as_bool() == Some(true);
    if window > 0
        && tokens > window
        && streamed
        && state.overflow_after_start.load(Ordering::SeqCst)
    {
        state.overflows.fetch_add(1, Ordering::SeqCst);
        let start = json!({"type": "message_start", "message": {"id": "msg_mock", "type": "message", "role": "assistant", "model": "mock", "content": [], "stop_reason": null, "usage": usage(tokens)}});
        let error = json!({"type": "error", "error": {"type": "invalid_request_error", "message": format!("prompt is too long: {tokens} tokens > {window} maximum")}});
        let chunks: Vec<Result<Bytes, std::io::Error>> = [
            ("message_start", start),
            ("ping", json!({"type": "ping"})),
            ("error", error),
        ]
        .into_iter()
        .map(|(name, data)| Ok(Bytes::from(format!("event: {name}\ndata: {data}\n\n"))))
        .collect();
        return Response::builder()
            .header("content-type", "text/event-stream")
            .body(Body::from_stream(futures::stream::iter(chunks)))
            .unwrap();
    }
    if window > 0 && tokens > window {
        state.overflows.fetch_add(1, Ordering::SeqCst);
        let error = if state.llama_overflow.load(Ordering::SeqCst) {
            json!({"error": {"code": 400, "message": format!("request ({tokens} tokens) exceeds the available context size ({window} tokens), try increasing it"), "type": "exceed_context_size_error", "n_prompt_tokens": tokens, "n_ctx": window}})
        } else {
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": format!("prompt is too long: {tokens} tokens > {window} maximum")}})
        };
        return (http::StatusCode::BAD_REQUEST, axum::Json(error)).into_response();
    }
    if body["stream"].as_bool() != Some(true) {
        return axum::Json(message("Hello there", usage(tokens))).into_response();
    }
    let start = json!({"type": "message_start", "message": {"id": "msg_mock", "type": "message", "role": "assistant", "model": "mock", "content": [], "stop_reason": null, "usage": usage(tokens)}});
    let events = [
        ("message_start", start),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello there"}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        (
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 2}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ];
    let chunks: Vec<Result<Bytes, std::io::Error>> = events
        .into_iter()
        .map(|(name, data)| Ok(Bytes::from(format!("event: {name}\ndata: {data}\n\n"))))
        .collect();
    // A provider that starts its answer and then goes silent: the opening events, then nothing.
    if body["model"] == "mock-stall-mid-stream" {
        let opening: Vec<_> = chunks.into_iter().take(3).collect();
        return Response::builder()
            .header("content-type", "text/event-stream")
            .body(Body::from_stream(futures::StreamExt::chain(
                futures::stream::iter(opening),
                futures::stream::pending(),
            )))
            .unwrap();
    }
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(futures::stream::iter(chunks)))
        .unwrap()
}
