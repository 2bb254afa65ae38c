//! Test support: an in-process mock provider on 127.0.0.1:0 and a Compactor started in-process
//! in front of it.
//!
//! The mock enforces a context window by its own token count (the text of the messages, which
//! is never more than the proxy's count), answers overflows with a real provider's error body,
//! writes numbered summaries for requests marked `x-compactor-purpose: summary`, and records
//! everything it receives. Models named `mock-…` select special behaviours; a request's
//! `x-mock-billed-tokens` sets the prompt size the mock reports (and enforces), and
//! `x-mock-template-tokens` adds to its count, as a chat template would.
//!
//! Beside it: [`messages_mock`] and [`responses_mock`], the same for one format each; [`otlp`], a
//! collector that decodes the traces exported to it;
//! [`provider_mock`], one mock serving all three formats alike (the dialect battery's);
//! [`turns_dialect`], a wire format written only for the tests; [`redis_server`] and
//! [`redis_cluster`], real Redis processes on free ports; [`media`], real image and PDF bytes;
//! [`served`], the `compactor` binary started as a process.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{self, any};
use axum::Router;
use bytes::Bytes;
use compactor::config::Config;
use serde_json::{json, Value};
use tokio::net::TcpListener;

/// One request the mock received.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Recorded {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// How the mock words an overflow.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OverflowStyle {
    OpenAi,
    LlamaCpp,
    /// OpenAI's newer wording, which states no window and no count.
    NoFigures,
}

#[derive(Default)]
pub struct MockState {
    /// Enforced window (0: none).
    pub window: AtomicU64,
    pub overflow_style: Mutex<Option<OverflowStyle>>,
    pub chats: Mutex<Vec<Recorded>>,
    pub summaries: Mutex<Vec<Recorded>>,
    pub others: Mutex<Vec<Recorded>>,
    pub overflows: AtomicUsize,
    pub summary_delay_ms: AtomicU64,
    pub summary_fails: AtomicBool,
    pub summary_hangs: AtomicBool,
    /// Words of filler added to every summary (to make summaries that save nothing).
    pub summary_padding_words: AtomicU64,
    /// Pause between SSE chunks.
    pub chunk_pause_ms: AtomicU64,
    /// Set when a streaming response's connection was closed before the stream finished.
    pub stream_cancelled: AtomicBool,
    pub chunks_sent: AtomicUsize,
}

pub struct Mock {
    pub addr: SocketAddr,
    pub state: Arc<MockState>,
}

impl Mock {
    pub fn url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn set_window(&self, w: u64) {
        self.state.window.store(w, Ordering::SeqCst);
    }

    pub fn summaries(&self) -> Vec<Recorded> {
        self.state.summaries.lock().unwrap().clone()
    }

    pub fn chats(&self) -> Vec<Recorded> {
        self.state.chats.lock().unwrap().clone()
    }
}

/// The mock's own token count of a chat body: the text it carries.
pub fn mock_tokens(body: &Value) -> u64 {
    let mut text = String::new();
    for m in body["messages"].as_array().into_iter().flatten() {
        match &m["content"] {
            Value::String(s) => text.push_str(s),
            Value::Array(parts) => {
                for p in parts {
                    text.push_str(p["text"].as_str().unwrap_or(""));
                }
            }
            _ => {}
        }
        for c in m["tool_calls"].as_array().into_iter().flatten() {
            text.push_str(c["function"]["arguments"].as_str().unwrap_or(""));
        }
        text.push('\n');
    }
    // The proxy's encoder: exact on ordinary text, and linear on text without word boundaries.
    compactor::tokenizer::Encoding::O200k.count(&text)
}

pub async fn start_mock() -> Mock {
    let state = Arc::new(MockState::default());
    let app = Router::new()
        .route("/v1/chat/completions", routing::post(chat))
        .route("/v1/{*rest}", any(other))
        .with_state(state.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Like a real provider, the mock does not hold back small writes (no Nagle delay).
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    Mock { addr, state }
}

async fn record(req: Request) -> Recorded {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    Recorded {
        method: parts.method.to_string(),
        path: parts.uri.path().to_string(),
        query: parts.uri.query().map(str::to_string),
        headers: parts.headers,
        body,
    }
}

async fn other(State(state): State<Arc<MockState>>, req: Request) -> Response {
    let rec = record(req).await;
    state.others.lock().unwrap().push(rec.clone());
    let echo = json!({
        "object": "list",
        "method": rec.method,
        "path": rec.path,
        "query": rec.query,
        "x_custom": rec.headers.get("x-custom").and_then(|v| v.to_str().ok()),
        "body_len": rec.body.len(),
        "data": [{"id": "mock-model", "object": "model"}],
    });
    ([("x-request-id", "req-other")], axum::Json(echo)).into_response()
}

fn completion(text: &str, prompt_tokens: u64) -> Value {
    json!({
        "id": "chatcmpl-mock",
        "object": "chat.completion",
        "created": 1,
        "model": "mock",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 3, "total_tokens": prompt_tokens + 3},
    })
}

/// The fixed SSE stream the mock sends (as separate chunks).
pub fn sse_chunks(with_usage: bool, prompt_tokens: u64) -> Vec<String> {
    let mut chunks: Vec<String> = ["Hel", "lo", " there"]
        .iter()
        .map(|t| {
            format!(
                "data: {}\n\n",
                json!({"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":t},"finish_reason":null}]})
            )
        })
        .collect();
    chunks.push(format!(
        "data: {}\n\n",
        json!({"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]})
    ));
    if with_usage {
        chunks.push(format!(
            "data: {}\n\n",
            json!({"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":prompt_tokens,"completion_tokens":3,"total_tokens":prompt_tokens+3}})
        ));
    }
    chunks.push("data: [DONE]\n\n".to_string());
    chunks
}

struct CancelGuard {
    state: Arc<MockState>,
    finished: bool,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if !self.finished {
            self.state.stream_cancelled.store(true, Ordering::SeqCst);
        }
    }
}

async fn chat(State(state): State<Arc<MockState>>, req: Request) -> Response {
    let rec = record(req).await;
    let body = rec.json();
    if rec
        .headers
        .get("x-compactor-purpose")
        .is_some_and(|v| v == "summary")
    {
        state.summaries.lock().unwrap().push(rec.clone());
        let n = state.summaries.lock().unwrap().len();
        let delay = state.summary_delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if state.summary_hangs.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        if state.summary_fails.load(Ordering::SeqCst) {
            return (
                http::StatusCode::INTERNAL_SERVER_ERROR,
                axum::Json(json!({"error":{"message":"summarizer broke","type":"server_error"}})),
            )
                .into_response();
        }
        let text = format!(
            "## Goal\nSUMMARY-{n}: keep the conversation going.\n## Constraints and preferences\nNone\n## Progress\n### Done\nsteps\n## Key decisions\nNone\n## Next steps\ncontinue\n## Critical context\nnone"
        );
        let padding = state.summary_padding_words.load(Ordering::SeqCst) as usize;
        let text = format!("{text}\n{}", "filler ".repeat(padding));
        return axum::Json(completion(&text, mock_tokens(&body))).into_response();
    }
    state.chats.lock().unwrap().push(rec.clone());
    let model = body["model"].as_str().unwrap_or("").to_string();
    match model.as_str() {
        "mock-429" => {
            return (
                http::StatusCode::TOO_MANY_REQUESTS,
                [("retry-after", "7"), ("x-request-id", "req-429"), ("openai-processing-ms", "3")],
                r#"{"error":{"message":"Rate limit reached","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#,
            )
                .into_response()
        }
        "mock-hang" => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        // A provider that sends an error answer's headers and the start of its body, then
        // nothing more.
        "mock-stall-error" => {
            let start = futures::stream::once(async {
                Ok::<_, std::io::Error>(Bytes::from_static(b"{\"error\":"))
            });
            return Response::builder()
                .status(http::StatusCode::INTERNAL_SERVER_ERROR)
                .header("content-type", "application/json")
                .body(Body::from_stream(futures::StreamExt::chain(
                    start,
                    futures::stream::pending(),
                )))
                .unwrap();
        }
        // A provider that streams its first event and then goes silent.
        "mock-stall-mid-stream" => {
            let first = futures::stream::once(async move {
                Ok::<_, std::io::Error>(Bytes::from(format!(
                    "data: {}\n\n",
                    json!({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 1, "model": model, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hel"}, "finish_reason": null}]})
                )))
            });
            return Response::builder()
                .header("content-type", "text/event-stream")
                .body(Body::from_stream(futures::StreamExt::chain(
                    first,
                    futures::stream::pending(),
                )))
                .unwrap();
        }
        // A provider that opens a stream and sends nothing on it.
        "mock-stall-stream" => {
            let nothing = futures::stream::pending::<Result<Bytes, std::io::Error>>();
            return Response::builder()
                .header("content-type", "text/event-stream")
                .body(Body::from_stream(nothing))
                .unwrap();
        }
        // A provider that does not know the model.
        m if m.starts_with("mock-404") => {
            let error = json!({"error":{"message":format!("The model `{m}` does not exist"),"type":"invalid_request_error","param":null,"code":"model_not_found"}});
            return (http::StatusCode::NOT_FOUND, axum::Json(error)).into_response();
        }
        // A front (nginx) refusing the body before any provider sees it.
        m if m.starts_with("mock-413-html") => {
            return (
                http::StatusCode::PAYLOAD_TOO_LARGE,
                [("content-type", "text/html")],
                "<html>\r\n<head><title>413 Request Entity Too Large</title></head>\r\n<body>\r\n<center><h1>413 Request Entity Too Large</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n",
            )
                .into_response()
        }
        _ => {}
    }
    // As llama.cpp does, an invalid `tool_choice` is quoted back in a plain 400.
    if let Some(choice) = body["tool_choice"]
        .as_str()
        .filter(|c| !["none", "auto", "required"].contains(c))
    {
        let error = json!({"error":{"code":400,"message":format!("Invalid tool_choice: {choice}"),"type":"invalid_request_error"}});
        return (http::StatusCode::BAD_REQUEST, axum::Json(error)).into_response();
    }
    // What a provider bills beyond the text, as another tokenizer or a chat template would: a
    // client header (forwarded upstream) says so.
    let header = |name: &str| {
        rec.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
    };
    let tokens = header("x-mock-billed-tokens")
        .unwrap_or_else(|| mock_tokens(&body) + header("x-mock-template-tokens").unwrap_or(0));
    let window = state.window.load(Ordering::SeqCst);
    if window > 0 && tokens > window {
        state.overflows.fetch_add(1, Ordering::SeqCst);
        let style = state
            .overflow_style
            .lock()
            .unwrap()
            .unwrap_or(OverflowStyle::OpenAi);
        let text = match style {
            OverflowStyle::OpenAi => {
                json!({"error":{"message": format!("This model's maximum context length is {window} tokens. However, your messages resulted in {tokens} tokens. Please reduce the length of the messages."),"type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}})
            }
            OverflowStyle::NoFigures => {
                json!({"error":{"message":"Your input exceeds the context window of this model.","type":"invalid_request_error","param":"input","code":"context_length_exceeded"}})
            }
            OverflowStyle::LlamaCpp => {
                json!({"error":{"code":400,"message": format!("request ({tokens} tokens) exceeds the available context size ({window} tokens), try increasing it"),"type":"exceed_context_size_error","n_prompt_tokens":tokens,"n_ctx":window}})
            }
        };
        return (http::StatusCode::BAD_REQUEST, axum::Json(text)).into_response();
    }
    if body["stream"].as_bool() == Some(true) {
        let with_usage = body["stream_options"]["include_usage"].as_bool() == Some(true);
        let chunks = sse_chunks(with_usage, tokens);
        let pause = Duration::from_millis(state.chunk_pause_ms.load(Ordering::SeqCst));
        let drop_midway = model == "mock-drop-stream";
        let st = state.clone();
        let stream = async_stream(chunks, pause, drop_midway, st);
        return Response::builder()
            .header("content-type", "text/event-stream")
            .header("x-request-id", "req-stream")
            .body(Body::from_stream(stream))
            .unwrap();
    }
    (
        [("x-request-id", "req-chat")],
        axum::Json(completion("Hello there", tokens)),
    )
        .into_response()
}

fn async_stream(
    chunks: Vec<String>,
    pause: Duration,
    drop_midway: bool,
    state: Arc<MockState>,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> {
    let total = chunks.len();
    let guard = CancelGuard {
        state: state.clone(),
        finished: false,
    };
    futures::stream::unfold(
        (chunks.into_iter().enumerate(), guard),
        move |(mut it, mut guard)| {
            let state = state.clone();
            async move {
                let (i, chunk) = it.next()?;
                if i > 0 && !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
                if drop_midway && i == 2 {
                    guard.finished = true;
                    return Some((Err(std::io::Error::other("upstream dropped")), (it, guard)));
                }
                state.chunks_sent.fetch_add(1, Ordering::SeqCst);
                if i + 1 == total {
                    guard.finished = true;
                }
                Some((Ok(Bytes::from(chunk)), (it, guard)))
            }
        },
    )
}

/// A running Compactor.
pub struct Proxy {
    pub addr: SocketAddr,
    pub app: Arc<compactor::http::App>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    served: Option<tokio::task::JoinHandle<()>>,
}

impl Proxy {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn stop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }

    /// Stops the proxy and waits until `serve` has returned (its drain is over).
    pub async fn stopped(&mut self) {
        self.stop();
        if let Some(served) = self.served.take() {
            served.await.unwrap();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A configuration aimed at `upstream` with an in-memory store.
pub fn config(upstream: &str) -> Config {
    let mut c = Config {
        upstream: upstream.to_string(),
        store: "memory".into(),
        ..Config::default()
    };
    c.compaction.ahead_of_time = false;
    // The suites built on this measure summaries; clearing old tool output first is tested on
    // its own (tests/clearing_first.rs), which turns it on.
    c.compaction.clear_tool_results_first = false;
    c
}

pub async fn start_proxy(config: Config) -> Proxy {
    let app = compactor::server::build(&config).await.unwrap();
    start_app(app).await
}

pub async fn start_proxy_with_store(
    config: Config,
    store: Arc<dyn compactor::store::CheckpointStore>,
) -> Proxy {
    start_app(
        compactor::server::build_with_store(&config, store)
            .await
            .unwrap(),
    )
    .await
}

async fn start_app(app: Arc<compactor::http::App>) -> Proxy {
    start_app_with_grace(app, Duration::from_secs(2)).await
}

/// A proxy serving `app` that drains open requests for `grace` when stopped.
pub async fn start_app_with_grace(app: Arc<compactor::http::App>, grace: Duration) -> Proxy {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let served = app.clone();
    let served = tokio::spawn(async move {
        let _ = compactor::server::serve(
            listener,
            served,
            async {
                let _ = rx.await;
            },
            grace,
        )
        .await;
    });
    Proxy {
        addr,
        app,
        shutdown: Some(tx),
        served: Some(served),
    }
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// The exact JSON body the mock answers a non-streaming chat request with.
pub fn completion_json(text: &str, prompt_tokens: u64) -> Value {
    completion(text, prompt_tokens)
}

pub mod agent_session;
pub mod media;
pub mod messages_mock;
pub mod otlp;
pub mod provider_mock;
pub mod redis_cluster;
pub mod redis_server;
pub mod responses_mock;
pub mod served;
pub mod turns_dialect;

/// The value of one series in a Prometheus text exposition: `series` is the name with its
/// labels as printed (`compactor_store_errors_total`, `name{model="m"}`).
pub fn metric(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let value = line.strip_prefix(series)?.strip_prefix(' ')?;
        value.trim().parse().ok()
    })
}

/// The binary, with no `COMPACTOR_…` variable of the test's environment.
pub fn compactor_command() -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_compactor"));
    for (name, _) in std::env::vars() {
        if name.starts_with("COMPACTOR_") {
            command.env_remove(name);
        }
    }
    command
}

/// A proxy's answer, read whole: its status, its headers and its body as text.
pub struct Reply {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: String,
}

impl Reply {
    /// Reads `response` to its end.
    pub async fn read(response: reqwest::Response) -> Reply {
        Reply {
            status: response.status().as_u16(),
            headers: response.headers().clone(),
            body: response.text().await.unwrap(),
        }
    }

    /// The header `name`, when present and text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The body as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }

    /// A streamed body's events: the JSON of each `data:` line, in order.
    pub fn events(&self) -> Vec<Value> {
        self.body
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(|d| serde_json::from_str(d).unwrap())
            .collect()
    }
}

/// `POST url` with `headers` (in order) and `body`, read whole.
pub async fn post(url: &str, headers: &[(&str, &str)], body: String) -> Reply {
    let mut request = client().post(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    Reply::read(request.body(body).send().await.unwrap()).await
}

/// A chat completions request through `proxy` with the API key `key`, answered 200.
pub async fn post_chat(proxy: &Proxy, key: &str, body: &Value) -> Reply {
    let authorization = format!("Bearer {key}");
    let reply = post(
        &format!("{}/v1/chat/completions", proxy.url()),
        &[
            ("authorization", authorization.as_str()),
            ("content-type", "application/json"),
        ],
        body.to_string(),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    reply
}

/// Polls `check` until it holds, failing the test after 15 s: for what the proxy does in the
/// background (saving facts, reconnecting to its store).
pub async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while !check().await {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `n` connections to `addr` that each hold a slot of the proxy's connection cap: each has sent
/// the first line of a request and waits, inside the header read timeout, with the rest unsent.
pub async fn hold_connections(addr: SocketAddr, n: usize) -> Vec<tokio::net::TcpStream> {
    use tokio::io::AsyncWriteExt;
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\n")
            .await
            .unwrap();
        held.push(stream);
    }
    held
}

/// What `stream` receives until the peer closes it or it is quiet for `quiet`, as text.
pub async fn read_until_quiet(stream: &mut tokio::net::TcpStream, quiet: Duration) -> String {
    use tokio::io::AsyncReadExt;
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    while let Ok(Ok(n)) = tokio::time::timeout(quiet, stream.read(&mut buf)).await {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `GET url` with an optional `Authorization` value: the status and the body as text.
pub async fn get(url: &str, auth: Option<&str>) -> (u16, String) {
    let mut request = client().get(url);
    if let Some(auth) = auth {
        request = request.header("authorization", auth);
    }
    let response = request.send().await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

/// `GET url` answered with JSON.
pub async fn get_json(url: &str, auth: Option<&str>) -> Value {
    let (status, body) = get(url, auth).await;
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{url}: {status} {body}: {e}"))
}

/// A stored checkpoint, read through the proxy's API as the tenant `auth`.
pub async fn checkpoint(proxy: &Proxy, id: &str, auth: &str) -> Value {
    get_json(
        &format!("{}/compactor/v1/checkpoints/{id}", proxy.url()),
        Some(auth),
    )
    .await
}

/// After a crossing request that may have extended a background summary: at most one summary
/// besides the first, and if there is one, it folds the first in rather than starting over.
pub fn assert_at_most_one_update(mock: &Mock) {
    let summaries = mock.summaries();
    assert!(summaries.len() <= 2, "{} summaries", summaries.len());
    if let Some(update) = summaries.get(1) {
        let prompt = update.json()["messages"][1]["content"]
            .as_str()
            .unwrap_or("")
            .to_string();
        assert!(
            prompt.contains("SUMMARY-1"),
            "the second summary must extend the first"
        );
    }
}

/// Every reply compacted through one and the same checkpoint.
pub fn assert_one_shared_checkpoint(replies: &[Reply]) {
    let mut ids = std::collections::BTreeSet::new();
    for reply in replies {
        assert_eq!(reply.status, 200);
        assert_eq!(reply.header("x-compactor-compacted"), Some("true"));
        ids.insert(reply.header("x-compactor-checkpoint").map(str::to_string));
    }
    assert_eq!(
        ids.len(),
        1,
        "every request used the same checkpoint: {ids:?}"
    );
}
