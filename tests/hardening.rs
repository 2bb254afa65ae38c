//! Attacks from a hostile client or a hostile network path, each reproduced against an
//! in-process proxy: escaping the upstream's base path, redirects that carry credentials away.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::Request;
use axum::response::IntoResponse;
use axum::Router;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use common::served::Served;
use common::{
    client, compactor_command, config, hold_connections, read_until_quiet, start_mock, start_proxy,
};

/// Sends `head` (a request line and headers, without the blank line) on a fresh connection and
/// returns everything the proxy answers before it closes (or goes quiet for five seconds).
async fn raw(addr: SocketAddr, head: &str) -> String {
    raw_with_body(addr, head, "").await
}

/// [`raw`] with a body after the headers.
async fn raw_with_body(addr: SocketAddr, head: &str, body: &str) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!("{head}\r\nhost: {addr}\r\nconnection: close\r\n\r\n{body}");
    stream.write_all(request.as_bytes()).await.unwrap();
    read_until_quiet(&mut stream, Duration::from_secs(5)).await
}

fn status_of(response: &str) -> u16 {
    response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {response:?}"))
}

// ---------------------------------------------------------------------------------------------
// Path traversal
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn paths_that_climb_out_of_the_base_path_are_refused() {
    let mock = start_mock().await;
    // The upstream is one deployment of a host that serves others beside it.
    let mut cfg = config(&format!("http://{}/v1/deployments/mine", mock.addr));
    cfg.upstream_key_env = "HARDENING_TEST_SERVER_KEY".into();
    std::env::set_var("HARDENING_TEST_SERVER_KEY", "sk-server");
    let proxy = start_proxy(cfg).await;
    for head in [
        "DELETE /v1/../other HTTP/1.1",
        "DELETE /v1/%2e%2e/other HTTP/1.1",
        "DELETE /v1/%2E%2E/other HTTP/1.1",
        "GET /v1/models/../../other HTTP/1.1",
        "GET /v1/..%2fother HTTP/1.1",
    ] {
        let response = raw(proxy.addr, head).await;
        assert_eq!(status_of(&response), 400, "{head}: {response}");
        assert!(response.contains("invalid_path"), "{head}: {response}");
    }
    let others = mock.state.others.lock().unwrap().clone();
    assert!(
        others.is_empty(),
        "reached the upstream: {:?}",
        others.iter().map(|r| &r.path).collect::<Vec<_>>()
    );
    // Dot segments that stay inside are resolved, not refused.
    let response = raw(proxy.addr, "GET /v1/files/../models HTTP/1.1").await;
    assert_eq!(status_of(&response), 200, "{response}");
    let others = mock.state.others.lock().unwrap().clone();
    assert_eq!(others.len(), 1);
    assert_eq!(others[0].path, "/v1/deployments/mine/models");
}

// ---------------------------------------------------------------------------------------------
// Redirects
// ---------------------------------------------------------------------------------------------

/// A server that records every request it gets and answers 200.
async fn start_recorder() -> (SocketAddr, Arc<Mutex<Vec<http::HeaderMap>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let app = Router::new().fallback(move |req: Request| {
        let log = log.clone();
        async move {
            log.lock().unwrap().push(req.headers().clone());
            "stolen"
        }
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, seen)
}

/// An upstream that answers everything with a 307 to `target`.
async fn start_redirector(target: String) -> SocketAddr {
    let app = Router::new().fallback(move || {
        let target = target.clone();
        async move {
            (
                http::StatusCode::TEMPORARY_REDIRECT,
                [(http::header::LOCATION, target)],
            )
                .into_response()
        }
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

#[tokio::test]
async fn upstream_redirects_are_passed_back_not_followed() {
    let (thief, seen) = start_recorder().await;
    let redirector = start_redirector(format!("http://{thief}/collect")).await;
    let proxy = start_proxy(config(&format!("http://{redirector}/v1"))).await;
    // The test's own client must not follow the 307 either.
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let chat = client
        .post(format!("{}/v1/chat/completions", proxy.url()))
        .header("api-key", "azure-secret")
        .header("x-api-key", "anthropic-secret")
        .header("content-type", "application/json")
        .body((serde_json::json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "secret prompt"}]})).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(chat.status(), 307);
    let models = client
        .get(format!("{}/v1/models", proxy.url()))
        .header("api-key", "azure-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(models.status(), 307);
    assert!(
        seen.lock().unwrap().is_empty(),
        "the redirect target received the request"
    );
}

// ---------------------------------------------------------------------------------------------
// Secrets and log injection
// ---------------------------------------------------------------------------------------------

/// `compactor serve` in front of `upstream`, and the address it listens on.
fn in_front_of(upstream: &str, env: &[(&str, &str)]) -> (Served, String) {
    let served = Served::start(&["--upstream", upstream], env);
    let listen = served.addr.to_string();
    (served, listen)
}

/// Sends a chat completion `body` with `headers` to the proxy at `listen`, expects 200 and
/// reads the answer.
async fn post_chat(listen: &str, headers: &[(&str, &str)], body: String) {
    let mut request = client()
        .post(format!("http://{listen}/v1/chat/completions"))
        .header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.body(body).send().await.unwrap();
    assert_eq!(response.status(), 200);
    response.bytes().await.unwrap();
}

/// What `compactor serve` logs up to the line that says it is listening.
fn startup_log(args: &[&str], env: &[(&str, &str)]) -> String {
    Served::start(args, env).log()
}

const SECRET_UPSTREAM: &str = "http://alice:pw-in-url@127.0.0.1:9/v1?api-key=key-in-query";

#[test]
fn check_config_and_serve_hide_url_credentials() {
    let output = compactor_command()
        .arg("check-config")
        .env("COMPACTOR_UPSTREAM", SECRET_UPSTREAM)
        .env("COMPACTOR_SUMMARIZER__UPSTREAM", SECRET_UPSTREAM)
        .env(
            "COMPACTOR_ANTHROPIC_UPSTREAM",
            "https://carol:anthropic-pw@127.0.0.1:9/?key=anthropic-key",
        )
        .env("COMPACTOR_STORE", "redis://:redis-pw@127.0.0.1:9/")
        .env(
            "COMPACTOR_TELEMETRY__OTLP_ENDPOINT",
            "https://dave:otel-pw@127.0.0.1:9/?api-key=otel-key",
        )
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    for secret in [
        "pw-in-url",
        "key-in-query",
        "redis-pw",
        "alice",
        "carol",
        "anthropic-pw",
        "anthropic-key",
        "dave",
        "otel-pw",
        "otel-key",
    ] {
        assert!(
            !stdout.contains(secret),
            "check-config shows {secret}: {stdout}"
        );
    }
    let log = startup_log(
        &["--listen", "127.0.0.1:0", "--upstream", SECRET_UPSTREAM],
        &[],
    );
    assert!(log.contains("127.0.0.1:9"), "{log}");
    for secret in ["pw-in-url", "key-in-query", "alice"] {
        assert!(!log.contains(secret), "serve logs {secret}: {log}");
    }
}

#[tokio::test]
async fn a_newline_in_a_client_value_cannot_forge_a_log_line() {
    let mock = start_mock().await;
    let (served, listen) = in_front_of(&mock.url(), &[]);
    let forged = "2026-01-01T00:00:00.000000Z  INFO compactor: FORGED";
    let body = serde_json::json!({
        "model": format!("gpt-4o\n{forged}\r\n{forged}"),
        "messages": [{"role": "user", "content": "hi"}],
    });
    post_chat(&listen, &[], body.to_string()).await;
    let log = served.log_with("Served a chat request").await;
    assert!(log.contains("FORGED"), "{log}");
    for line in log.lines() {
        assert!(!line.starts_with("2026-01-01"), "forged line: {line}");
    }
}

#[tokio::test]
async fn a_model_with_spaces_cannot_forge_fields_of_the_served_request_line() {
    let mock = start_mock().await;
    // Plain text, as a log collector reads it (no colour codes between the fields).
    let (served, listen) = in_front_of(&mock.url(), &[("NO_COLOR", "1")]);
    let body = serde_json::json!({
        "model": "gpt-4o status=500 compacted=true",
        "messages": [{"role": "user", "content": "hi"}],
    });
    post_chat(&listen, &[], body.to_string()).await;
    let log = served.log_with("Served a chat request").await;
    let line = log
        .lines()
        .find(|l| l.contains("Served a chat request"))
        .unwrap();
    assert!(
        line.contains(r#"model="gpt-4o status=500 compacted=true""#),
        "{line}"
    );
    let outside_the_model = line.replace(r#""gpt-4o status=500 compacted=true""#, "");
    assert!(outside_the_model.contains("status=200"), "{line}");
    assert!(!outside_the_model.contains("status=500"), "{line}");
    assert!(!outside_the_model.contains("compacted=true"), "{line}");
}

#[tokio::test]
async fn a_named_tenant_s_served_line_carries_its_span() {
    let mock = start_mock().await;
    let keys = format!(
        "alice {}",
        compactor::http::gateway_keys::hash_key("sk-alice")
    );
    let (served, listen) = in_front_of(
        &mock.url(),
        &[
            ("COMPACTOR_GATEWAY_KEYS_ENV", "HARDENING_KEYS"),
            ("HARDENING_KEYS", keys.as_str()),
        ],
    );
    let body = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#;
    post_chat(
        &listen,
        &[("authorization", "Bearer sk-alice")],
        body.to_string(),
    )
    .await;
    let log = served.log_with("Served a chat request").await;
    let line = log.lines().find(|l| l.contains("Served a chat")).unwrap();
    // The formatter writes the tenant's span before the target; the direct line could not.
    assert!(
        line.contains("request{tenant=alice}: compactor::http::exchange::closing: Served a chat"),
        "{line}"
    );
}

#[tokio::test]
async fn a_log_filter_leaves_out_the_served_request_line() {
    let mock = start_mock().await;
    let filter = "info,compactor::http::exchange::closing=warn";
    let (served, listen) = in_front_of(&mock.url(), &[("COMPACTOR_LOG", filter)]);
    for _ in 0..3 {
        let body = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#;
        post_chat(&listen, &[], body.to_string()).await;
    }
    // Everything it logged, flushed at the stop.
    let log = served.stopped_log();
    assert!(log.contains("Compactor is listening"), "{log}");
    assert!(log.contains("Shutting down"), "{log}");
    assert!(!log.contains("Served a"), "{log}");
}

// ---------------------------------------------------------------------------------------------
// Slow clients and connection counts
// ---------------------------------------------------------------------------------------------

/// Reads until the peer closes; `None` when it was still open after `within`.
async fn closed_within(stream: &mut tokio::net::tcp::OwnedReadHalf, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test]
async fn clients_that_trickle_or_withhold_headers_are_cut_off() {
    let mock = start_mock().await;
    let mut cfg = config(&mock.url());
    cfg.header_read_timeout_ms = 400;
    let proxy = start_proxy(cfg).await;
    // One header byte every 100 ms: never a whole request.
    let (mut reader, mut writer) = TcpStream::connect(proxy.addr).await.unwrap().into_split();
    writer
        .write_all(b"GET /healthz HTTP/1.1\r\nx-slow: ")
        .await
        .unwrap();
    let trickle = tokio::spawn(async move {
        for _ in 0..40 {
            if writer.write_all(b"a").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    assert!(
        closed_within(&mut reader, Duration::from_secs(4)).await,
        "a trickling client kept its connection"
    );
    trickle.abort();
    // A client that connects and sends nothing at all.
    let (mut reader, _writer) = TcpStream::connect(proxy.addr).await.unwrap().into_split();
    assert!(
        closed_within(&mut reader, Duration::from_secs(4)).await,
        "a silent client kept its connection"
    );
    // A normal client is unaffected.
    let response = raw(proxy.addr, "GET /healthz HTTP/1.1").await;
    assert_eq!(status_of(&response), 200, "{response}");
}

/// An HTTP/2 (h2c, prior knowledge) connection that asks `GET /healthz` once: the preface, an
/// empty SETTINGS frame and one HEADERS frame (`:method GET`, `:scheme http`, `:path /healthz`).
async fn h2c_healthz(addr: SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    bytes.extend_from_slice(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]);
    let mut block = vec![0x82, 0x86, 0x44, 8];
    block.extend_from_slice(b"/healthz");
    bytes.extend_from_slice(&[0, 0, block.len() as u8, 0x1, 0x5, 0, 0, 0, 1]);
    bytes.extend_from_slice(&block);
    stream.write_all(&bytes).await.unwrap();
    stream
}

/// What the peer sent until it closed the connection; fails the test when it was still open
/// after `within`.
async fn read_until_closed(stream: &mut TcpStream, within: Duration) -> Vec<u8> {
    let deadline = tokio::time::Instant::now() + within;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => panic!("the connection was still open after {within:?}"),
            Ok(Ok(0)) | Ok(Err(_)) => return out,
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
    }
}

/// HTTP/2 frames as (type, stream id, payload).
fn h2_frames(mut bytes: &[u8]) -> Vec<(u8, u32, Vec<u8>)> {
    let mut frames = Vec::new();
    while bytes.len() >= 9 {
        let len = u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]]) as usize;
        let id = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) & 0x7fff_ffff;
        let end = (9 + len).min(bytes.len());
        frames.push((bytes[3], id, bytes[9..end].to_vec()));
        bytes = &bytes[end..];
    }
    frames
}

#[tokio::test]
async fn idle_http2_connections_are_closed_like_http1_ones() {
    let mock = start_mock().await;
    let mut cfg = config(&mock.url());
    cfg.header_read_timeout_ms = 400;
    cfg.max_connections = 2;
    let proxy = start_proxy(cfg).await;
    let held = [h2c_healthz(proxy.addr).await, h2c_healthz(proxy.addr).await];
    for mut stream in held {
        // Answered 200 (`:status 200` is the static table's entry 8), then, idle, closed with
        // a GOAWAY.
        let frames = h2_frames(&read_until_closed(&mut stream, Duration::from_secs(4)).await);
        assert!(
            frames.iter().any(|(kind, id, payload)| *kind == 0x1
                && *id == 1
                && payload.first() == Some(&0x88)),
            "{frames:?}"
        );
        assert!(frames.iter().any(|(kind, ..)| *kind == 0x7), "{frames:?}");
    }
    // Their slots are free again: a new client is served, not refused as overloaded.
    let response = raw(proxy.addr, "GET /healthz HTTP/1.1").await;
    assert_eq!(status_of(&response), 200, "{response}");
}

#[tokio::test]
async fn connections_beyond_the_cap_are_answered_503() {
    let mock = start_mock().await;
    let mut cfg = config(&mock.url());
    cfg.max_connections = 2;
    let proxy = start_proxy(cfg).await;
    let mut held = hold_connections(proxy.addr, 2).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut third = TcpStream::connect(proxy.addr).await.unwrap();
    let answer = read_until_quiet(&mut third, Duration::from_secs(5)).await;
    assert_eq!(status_of(&answer), 503, "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: 1"),
        "{answer}"
    );
    // Written before any request is read: a body either client's SDK reads.
    let body: serde_json::Value =
        serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap_or("")).unwrap();
    assert_eq!(body["type"], "error", "{answer}");
    assert_eq!(body["error"]["code"], "overloaded", "{answer}");
    // A freed slot serves again.
    drop(held.pop());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let response = raw(proxy.addr, "GET /healthz HTTP/1.1").await;
        if status_of(&response) == 200 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{response}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Bodies: size declared up front, bytes in flight, read timeout
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn an_oversized_declared_body_is_refused_before_100_continue() {
    let mock = start_mock().await;
    let proxy = start_proxy(config(&mock.url())).await;
    let response = raw(
        proxy.addr,
        "POST /v1/chat/completions HTTP/1.1\r\ncontent-type: application/json\r\ncontent-length: 100000000\r\nexpect: 100-continue",
    )
    .await;
    assert_eq!(status_of(&response), 413, "{response}");
    assert!(!response.contains("100 Continue"), "{response}");
}

/// A chat body of exactly `len` bytes.
fn padded_chat(len: usize) -> String {
    let body =
        serde_json::json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})
            .to_string();
    assert!(body.len() <= len);
    format!("{body}{}", " ".repeat(len - body.len()))
}

fn chat_head(len: usize) -> String {
    format!("POST /v1/chat/completions HTTP/1.1\r\ncontent-type: application/json\r\ncontent-length: {len}")
}

#[tokio::test]
async fn bodies_in_flight_are_bounded() {
    let mock = start_mock().await;
    let mut cfg = config(&mock.url());
    cfg.max_body_bytes = 4000;
    cfg.max_in_flight_body_bytes = 5000;
    let proxy = start_proxy(cfg).await;
    // A slow upload holds 3000 bytes of the budget while it arrives.
    let slow = padded_chat(3000);
    let mut first = TcpStream::connect(proxy.addr).await.unwrap();
    let head = format!(
        "{}\r\nhost: x\r\nconnection: close\r\n\r\n",
        chat_head(3000)
    );
    first.write_all(head.as_bytes()).await.unwrap();
    first.write_all(&slow.as_bytes()[..10]).await.unwrap();
    // Time for the proxy to take the first request in (slow when every core is busy).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let second = padded_chat(2500);
    let busy = raw_with_body(proxy.addr, &chat_head(2500), &second).await;
    assert_eq!(status_of(&busy), 503, "{busy}");
    assert!(
        busy.to_ascii_lowercase().contains("retry-after: 1"),
        "{busy}"
    );
    // Once the first is done, its bytes are free again.
    first.write_all(&slow.as_bytes()[10..]).await.unwrap();
    let done = read_until_quiet(&mut first, Duration::from_secs(5)).await;
    assert_eq!(status_of(&done), 200, "{done}");
    let retried = raw_with_body(proxy.addr, &chat_head(2500), &second).await;
    assert_eq!(status_of(&retried), 200, "{retried}");
}

#[tokio::test]
async fn a_body_that_stops_arriving_is_answered_408() {
    let mock = start_mock().await;
    let mut cfg = config(&mock.url());
    cfg.body_read_timeout_ms = 300;
    let proxy = start_proxy(cfg).await;
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    let head = format!("{}\r\nhost: x\r\n\r\n{{\"model\"", chat_head(100));
    stream.write_all(head.as_bytes()).await.unwrap();
    let answer = read_until_quiet(&mut stream, Duration::from_secs(3)).await;
    assert_eq!(status_of(&answer), 408, "{answer}");
    assert!(mock.chats().is_empty());
}

#[test]
fn serve_warns_when_anyone_reachable_spends_the_upstream_key() {
    let env = [
        ("COMPACTOR_UPSTREAM_KEY_ENV", "HARDENING_TEAM_KEY"),
        ("HARDENING_TEAM_KEY", "sk-team"),
    ];
    let open = startup_log(&["--listen", "0.0.0.0:0"], &env);
    assert!(open.contains("OPEN RELAY"), "{open}");
    assert!(!open.contains("sk-team"), "{open}");
    let loopback = startup_log(&["--listen", "127.0.0.1:0"], &env);
    assert!(!loopback.contains("OPEN RELAY"), "{loopback}");
}

#[tokio::test]
async fn an_error_that_only_quotes_overflow_words_is_passed_on_without_a_retry() {
    let mock = start_mock().await;
    let proxy = start_proxy(config(&mock.url())).await;
    // llama.cpp quotes an invalid `tool_choice` back in a plain 400: the words of an overflow,
    // in a request a hundredth of the window.
    let body = serde_json::json!({
        "model": "agent-model",
        "tool_choice": "context length exceeded: this model's maximum context length is 64 tokens",
        "messages": [{"role": "user", "content": "Say hello."}],
    });
    for _ in 0..2 {
        let reply = common::post(
            &format!("{}/v1/chat/completions", proxy.url()),
            &[("authorization", "Bearer k")],
            body.to_string(),
        )
        .await;
        assert_eq!(reply.status, 400, "{}", reply.body);
        assert!(
            reply.body.contains("Invalid tool_choice"),
            "the provider's own error: {}",
            reply.body
        );
        assert_eq!(reply.header("x-compactor-compacted"), Some("false"));
    }
    assert_eq!(
        mock.chats().len(),
        2,
        "one upstream call per request, no retry"
    );
    assert!(mock.summaries().is_empty(), "no compaction");
}

#[tokio::test]
async fn the_log_names_each_requests_conversation_and_checkpoint_and_what_a_checkpoint_replaces() {
    let mock = start_mock().await;
    let (served, listen) = in_front_of(&mock.url(), &[]);
    let mut messages = vec![serde_json::json!({"role": "system", "content": "be brief"})];
    let mut ids = Vec::new();
    for turn in 0..2 {
        for n in 0..6 {
            let words = format!("turn {turn} step {n} {}", "words to summarize ".repeat(40));
            messages.push(serde_json::json!({"role": "user", "content": words}));
            messages.push(serde_json::json!({"role": "assistant", "content": "done"}));
        }
        messages.push(serde_json::json!({"role": "user", "content": "and now?"}));
        let response = client()
            .post(format!("http://{listen}/v1/chat/completions"))
            .header("authorization", "Bearer k")
            .header("x-compactor-mode", "force")
            .header("content-type", "application/json")
            .body(serde_json::json!({"model": "gpt-4o", "messages": messages}).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let id = response.headers()["x-compactor-checkpoint"]
            .to_str()
            .unwrap()
            .to_string();
        response.bytes().await.unwrap();
        ids.push(id);
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while served.log().matches("Served a chat request").count() < 2 {
        assert!(tokio::time::Instant::now() < deadline, "{}", served.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The text format, without colours: the log goes to a pipe, not a terminal.
    let log = served.log();
    assert!(
        !log.contains('\x1b'),
        "escape codes in a log that is not a terminal: {log}"
    );
    let field = |line: &str, name: &str| -> String {
        let at = line
            .find(&format!(" {name}="))
            .unwrap_or_else(|| panic!("{name}: {line}"));
        line[at + name.len() + 2..]
            .split_whitespace()
            .next()
            .unwrap()
            .trim_matches('"')
            .to_string()
    };
    let served_lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("Served a chat"))
        .collect();
    let compacted: Vec<&str> = log.lines().filter(|l| l.contains("Compacted a")).collect();
    assert_eq!(compacted.len(), 2, "{log}");
    let conversation = field(served_lines[0], "conversation");
    assert_eq!(conversation.len(), 16, "{}", served_lines[0]);
    for (n, line) in served_lines.iter().enumerate() {
        assert_eq!(field(line, "conversation"), conversation, "{line}");
        assert_eq!(field(line, "checkpoint"), ids[n], "{line}");
    }
    assert_eq!(field(compacted[0], "replaces"), "-");
    assert_eq!(field(compacted[1], "checkpoint"), ids[1]);
    assert_eq!(field(compacted[1], "replaces"), ids[0], "{}", compacted[1]);
    assert_eq!(field(compacted[1], "conversation"), conversation);
}
