//! A mock OpenAI Responses provider on 127.0.0.1:0, for the `/v1/responses` tests.
//!
//! It enforces a window by its own token count (the text of the `input` items, never more than
//! the proxy's count), answers an overflow in the shape chosen (OpenAI's HTTP 400, a
//! `response.failed` event at the start of the stream, or llama.cpp's body), writes numbered
//! summaries for requests marked `x-compactor-purpose: summary` (on `/v1/responses` and on
//! `/v1/chat/completions`), and records everything it receives.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, post};
use axum::Router;
use bytes::Bytes;
use serde_json::{json, Value};
use tokio::net::TcpListener;

/// How the mock words an overflow.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Overflow {
    /// HTTP 400 with `code: "context_length_exceeded"`.
    #[default]
    Http,
    /// HTTP 200, and the stream's first event after `response.created` is `response.failed`.
    InStream,
    /// llama.cpp's `exceed_context_size_error` body, HTTP 400.
    LlamaCpp,
}

/// One request the mock received.
#[derive(Debug, Clone)]
pub struct Received {
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
pub struct ResponsesState {
    pub window: AtomicU64,
    pub overflow: Mutex<Overflow>,
    pub turns: Mutex<Vec<Received>>,
    pub summaries: Mutex<Vec<Received>>,
    pub others: Mutex<Vec<Received>>,
    pub overflows: AtomicUsize,
}

pub struct ResponsesMock {
    pub addr: SocketAddr,
    pub state: Arc<ResponsesState>,
}

impl ResponsesMock {
    pub fn url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn set_window(&self, tokens: u64) {
        self.state.window.store(tokens, Ordering::SeqCst);
    }

    pub fn set_overflow(&self, style: Overflow) {
        *self.state.overflow.lock().unwrap() = style;
    }

    /// The conversation requests that reached the mock (summaries and others excluded).
    pub fn turns(&self) -> Vec<Received> {
        self.state.turns.lock().unwrap().clone()
    }

    pub fn summaries(&self) -> Vec<Received> {
        self.state.summaries.lock().unwrap().clone()
    }

    pub fn others(&self) -> Vec<Received> {
        self.state.others.lock().unwrap().clone()
    }
}

pub async fn start_responses_mock() -> ResponsesMock {
    let state = Arc::new(ResponsesState::default());
    let app = Router::new()
        .route("/v1/responses", post(responses))
        .route("/v1/chat/completions", post(chat_summary))
        .route("/v1/{*rest}", any(other))
        .with_state(state.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    ResponsesMock { addr, state }
}

async fn receive(req: Request) -> Received {
    let (parts, body) = req.into_parts();
    Received {
        path: parts.uri.path().to_string(),
        headers: parts.headers,
        body: axum::body::to_bytes(body, usize::MAX).await.unwrap(),
    }
}

fn is_summary(rec: &Received) -> bool {
    rec.headers
        .get("x-compactor-purpose")
        .is_some_and(|v| v == "summary")
}

/// The text the mock counts: every string under `content`, `output`, `arguments`, `text`.
pub fn input_text(body: &Value) -> String {
    fn collect(v: &Value, out: &mut String) {
        match v {
            Value::String(s) => {
                out.push_str(s);
                out.push('\n');
            }
            Value::Array(a) => a.iter().for_each(|x| collect(x, out)),
            Value::Object(m) => {
                for (k, x) in m {
                    // Text under these keys; elsewhere only what nests (not ids, types, …).
                    let text = matches!(k.as_str(), "content" | "output" | "arguments" | "text");
                    if text || x.is_array() || x.is_object() {
                        collect(x, out);
                    }
                }
            }
            _ => {}
        }
    }
    let mut out = String::new();
    match &body["input"] {
        Value::String(s) => out.push_str(s),
        other => collect(other, &mut out),
    }
    out
}

pub fn mock_tokens(body: &Value) -> u64 {
    tiktoken_rs::o200k_base_singleton()
        .encode_ordinary(&input_text(body))
        .len() as u64
}

fn summary_text(n: usize) -> String {
    format!("## Goal\nSUMMARY-{n}: keep going.\n## Progress\nsteps\n## Next steps\ncontinue")
}

async fn chat_summary(State(state): State<Arc<ResponsesState>>, req: Request) -> Response {
    let rec = receive(req).await;
    state.summaries.lock().unwrap().push(rec);
    let n = state.summaries.lock().unwrap().len();
    axum::Json(json!({
        "id": "chatcmpl-mock", "object": "chat.completion", "created": 1, "model": "mock",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": summary_text(n)}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
    }))
    .into_response()
}

fn response_object(text: &str, input_tokens: u64, status: &str) -> Value {
    json!({
        "id": "resp_mock", "object": "response", "created_at": 1, "status": status, "model": "mock",
        "output": if status == "completed" { json!([{
            "type": "message", "id": "msg_mock", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }]) } else { json!([]) },
        "usage": {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": 3, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": input_tokens + 3},
    })
}

pub fn sse_event(event: &Value) -> String {
    format!(
        "event: {}\ndata: {}\n\n",
        event["type"].as_str().unwrap(),
        event
    )
}

/// The events of a streamed answer `text`.
pub fn answer_events(text: &str, input_tokens: u64) -> Vec<String> {
    let item = json!({"type": "message", "id": "msg_mock", "status": "completed", "role": "assistant",
                      "content": [{"type": "output_text", "text": text, "annotations": []}]});
    [
        json!({"type": "response.created", "response": response_object("", 0, "in_progress")}),
        json!({"type": "response.output_item.added", "output_index": 0, "item": item}),
        json!({"type": "response.output_text.delta", "item_id": "msg_mock", "output_index": 0, "content_index": 0, "delta": text}),
        json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
        json!({"type": "response.completed", "response": response_object(text, input_tokens, "completed")}),
    ]
    .iter()
    .map(sse_event)
    .collect()
}

fn sse(chunks: Vec<String>) -> Response {
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

async fn responses(State(state): State<Arc<ResponsesState>>, req: Request) -> Response {
    let rec = receive(req).await;
    let body = rec.json();
    let stream = body["stream"].as_bool() == Some(true);
    if is_summary(&rec) {
        state.summaries.lock().unwrap().push(rec);
        let n = state.summaries.lock().unwrap().len();
        let text = summary_text(n);
        return if stream {
            sse(answer_events(&text, 10))
        } else {
            axum::Json(response_object(&text, 10, "completed")).into_response()
        };
    }
    state.turns.lock().unwrap().push(rec);
    let tokens = mock_tokens(&body);
    let window = state.window.load(Ordering::SeqCst);
    if window > 0 && tokens > window {
        state.overflows.fetch_add(1, Ordering::SeqCst);
        let message = format!(
            "Your input exceeds the context window of this model: {tokens} tokens, limit {window}."
        );
        let error = json!({"message": message, "type": "invalid_request_error", "param": "input", "code": "context_length_exceeded"});
        match *state.overflow.lock().unwrap() {
            Overflow::Http => {
                return (http::StatusCode::BAD_REQUEST, axum::Json(json!({"error": error})))
                    .into_response()
            }
            Overflow::LlamaCpp => {
                return (
                    http::StatusCode::BAD_REQUEST,
                    axum::Json(json!({"error":{"code":400,"message": format!("request ({tokens} tokens) exceeds the available context size ({window} tokens), try increasing it"),"type":"exceed_context_size_error","n_prompt_tokens":tokens,"n_ctx":window}})),
                )
                    .into_response()
            }
            Overflow::InStream if stream => {
                let mut failed = response_object("", 0, "failed");
                failed["error"] = error;
                return sse(vec![
                    sse_event(&json!({"type": "response.created", "response": response_object("", 0, "in_progress")})),
                    sse_event(&json!({"type": "response.failed", "response": failed})),
                ]);
            }
            Overflow::InStream => {
                return (http::StatusCode::BAD_REQUEST, axum::Json(json!({"error": error})))
                    .into_response()
            }
        }
    }
    if stream {
        sse(answer_events("Hello there", tokens))
    } else {
        axum::Json(response_object("Hello there", tokens, "completed")).into_response()
    }
}

async fn other(State(state): State<Arc<ResponsesState>>, req: Request) -> Response {
    let rec = receive(req).await;
    let body = rec.json();
    let path = rec.path.clone();
    state.others.lock().unwrap().push(rec);
    if path.ends_with("/responses/input_tokens") {
        return axum::Json(
            json!({"object": "response.input_tokens", "input_tokens": mock_tokens(&body)}),
        )
        .into_response();
    }
    (
        http::StatusCode::NOT_FOUND,
        axum::Json(json!({"error": {"message": format!("no route {path}"), "type": "invalid_request_error"}})),
    )
        .into_response()
}
