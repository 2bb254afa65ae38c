//! What ordinary clients do must not cost them: kept-alive connections, odd but valid bodies,
//! methods a route does not take, compressed bodies, non-ASCII instructions, streamed uploads,
//! and providers that hang up.

mod common;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use common::served::Served;
use common::{client, config, start_mock, start_proxy};

/// Asserts the OpenAI error shape and returns `error.code`.
fn error_code(status: u16, body: &str) -> String {
    let value: Value = serde_json::from_str(body)
        .unwrap_or_else(|e| panic!("status {status}: body is not JSON ({e}): {body:?}"));
    let error = &value["error"];
    assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()));
    assert!(error["type"].is_string(), "{body}");
    error["code"].as_str().unwrap_or_default().to_string()
}

#[tokio::test]
async fn kept_alive_requests_are_not_held_back_by_delayed_acks() {
    let mock = start_mock().await;
    let proxy = start_proxy(config(&mock.url())).await;
    // One connection, reused. A streamed answer goes out as several small writes; without
    // TCP_NODELAY the second waits for the client's delayed ACK of the first: at least 40 ms
    // (Linux's shortest delayed-ACK timeout) on every request, whatever the machine's load.
    let http = client();
    let url = format!("{}/v1/chat/completions", proxy.url());
    let body = serde_json::to_vec(&json!({"model": "gpt-4o", "stream": true, "messages": [{"role": "user", "content": "hi"}]})).unwrap();
    let mut times = Vec::new();
    for _ in 0..21 {
        let started = Instant::now();
        let response = http
            .post(&url)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        response.bytes().await.unwrap();
        times.push(started.elapsed());
    }
    times.sort();
    let median = times[times.len() / 2];
    assert!(
        median < Duration::from_millis(38),
        "median {median:?}: requests waited for delayed ACKs"
    );
}

/// 300 KB of one letter: one pre-tokenized piece, which tiktoken alone counts in quadratic time.
fn one_letter_body(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "a".repeat(300_000)}]})
}

#[tokio::test]
async fn a_body_without_word_boundaries_is_counted_quickly_and_off_the_runtime() {
    let mock = start_mock().await;
    let mut cfg = config(&mock.url());
    cfg.compaction.enabled = false;
    let proxy = start_proxy(cfg).await;
    let url = format!("{}/v1/chat/completions", proxy.url());
    let mut slow = Vec::new();
    for model in ["gpt-4o", "gpt-4"] {
        let url = url.clone();
        slow.push(tokio::spawn(async move {
            client()
                .post(&url)
                .header("content-type", "application/json")
                .body(serde_json::to_vec(&one_letter_body(model)).unwrap())
                .send()
                .await
                .map(|r| r.status().as_u16())
        }));
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let health = tokio::time::timeout(
        Duration::from_secs(5),
        client().get(format!("{}/healthz", proxy.url())).send(),
    )
    .await
    .expect("/healthz answers while large bodies are counted")
    .unwrap();
    assert_eq!(health.status(), 200);
    for request in slow {
        let status = tokio::time::timeout(Duration::from_secs(30), request)
            .await
            .expect("the large requests are served")
            .unwrap()
            .unwrap();
        assert_eq!(status, 200);
    }
}

#[tokio::test]
async fn a_method_a_route_does_not_take_gets_405_in_the_openai_shape() {
    let mock = start_mock().await;
    let proxy = start_proxy(config(&mock.url())).await;
    for path in ["/healthz", "/metrics", "/compactor/v1/checkpoints/x"] {
        let response = client()
            .delete(format!("{}{path}", proxy.url()))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 405, "{path}");
        let body = response.text().await.unwrap();
        assert_eq!(error_code(405, &body), "method_not_allowed", "{path}");
    }
}

#[tokio::test]
async fn a_compressed_chat_body_gets_415_naming_the_encoding() {
    let mock = start_mock().await;
    let proxy = start_proxy(config(&mock.url())).await;
    let response = client()
        .post(format!("{}/v1/chat/completions", proxy.url()))
        .header("content-type", "application/json")
        .header("content-encoding", "gzip")
        .body(vec![0x1f, 0x8b, 0x08, 0x00, 0, 0, 0, 0])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 415);
    let body = response.text().await.unwrap();
    assert_eq!(error_code(415, &body), "unsupported_content_encoding");
    assert!(body.contains("gzip"), "{body}");
    assert!(mock.chats().is_empty());
}

/// A conversation long enough to be summarized when compaction is forced.
fn history() -> Value {
    let mut messages = vec![json!({"role": "system", "content": "You are a coding agent."})];
    for turn in 0..8 {
        messages.push(json!({"role": "user", "content": format!("step {turn}: change the parser {}", "and the lexer ".repeat(40))}));
        messages.push(json!({"role": "assistant", "content": format!("done with step {turn}")}));
    }
    messages.push(json!({"role": "user", "content": "next"}));
    json!({"model": "gpt-4o", "messages": messages})
}

#[tokio::test]
async fn non_ascii_instructions_reach_the_summary_raw_or_rfc8187_encoded() {
    let mock = start_mock().await;
    let proxy = start_proxy(config(&mock.url())).await;
    let url = format!("{}/v1/chat/completions", proxy.url());
    let wanted = "Résumé: keep the naïve parser";
    let values = [
        http::HeaderValue::from_bytes(wanted.as_bytes()).unwrap(),
        http::HeaderValue::from_static(
            "UTF-8''R%C3%A9sum%C3%A9%3A%20keep%20the%20na%C3%AFve%20parser",
        ),
    ];
    for (i, value) in values.into_iter().enumerate() {
        let mut body = history();
        body["messages"][1]["content"] = json!(format!("conversation {i}"));
        let response = client()
            .post(&url)
            .header("x-compactor-mode", "force")
            .header("x-compactor-instructions", value)
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body).unwrap())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let summary = mock.summaries()[i].json();
        assert!(
            summary["messages"][1]["content"]
                .as_str()
                .unwrap()
                .contains(wanted),
            "instructions {i} missing from the summary request"
        );
    }
    let response = client()
        .post(&url)
        .header(
            "x-compactor-instructions",
            http::HeaderValue::from_bytes(b"caf\xe9").unwrap(),
        )
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&history()).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400, "not UTF-8: said so, not ignored");
    assert!(response.text().await.unwrap().contains("RFC 8187"));
}

#[tokio::test]
async fn a_passed_through_upload_keeps_its_content_length() {
    let mock = start_mock().await;
    let proxy = start_proxy(config(&mock.url())).await;
    let upload = vec![b'x'; 200_000];
    let response = client()
        .post(format!("{}/v1/files", proxy.url()))
        .header("content-type", "application/octet-stream")
        .body(upload.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let received = mock.state.others.lock().unwrap()[0].clone();
    assert_eq!(received.body.len(), upload.len());
    assert_eq!(
        received.headers.get("content-length").map(|v| v.as_bytes()),
        Some(b"200000".as_slice())
    );
    assert!(received.headers.get("transfer-encoding").is_none());
}

/// A provider that reads each request, writes `answer` (raw bytes) and closes.
async fn raw_upstream(answer: &'static [u8]) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut buf = [0u8; 4096];
            let _ = socket.read(&mut buf).await;
            let _ = socket.write_all(answer).await;
            let _ = socket.shutdown().await;
        }
    });
    addr
}

#[tokio::test]
async fn an_upstream_that_accepts_and_closes_is_not_called_unreachable() {
    let addr = raw_upstream(b"").await;
    let proxy = start_proxy(config(&format!("http://{addr}/v1"))).await;
    let response = client()
        .post(format!("{}/v1/chat/completions", proxy.url()))
        .header("content-type", "application/json")
        .body(
            serde_json::to_vec(
                &json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}),
            )
            .unwrap(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 502);
    let body = response.text().await.unwrap();
    assert_eq!(error_code(502, &body), "upstream_no_response");
    assert!(!body.contains("unreachable"), "{body}");
}

#[test]
fn the_startup_log_names_the_bound_port() {
    let served = Served::start(
        &[
            "--log-format",
            "json",
            "--upstream",
            "http://127.0.0.1:9/v1",
        ],
        &[("COMPACTOR_LOG", "info")],
    );
    assert_ne!(served.addr.port(), 0, "{}", served.started);
    std::net::TcpStream::connect(served.addr)
        .unwrap_or_else(|e| panic!("nothing listens on the logged address: {e}"));
}

#[tokio::test]
async fn the_largest_max_tokens_is_capped_without_wrapping() {
    let mock = start_mock().await;
    let proxy = start_proxy(config(&mock.url())).await;
    for field in ["max_tokens", "max_completion_tokens"] {
        let mut body = history();
        body[field] = json!(u64::MAX);
        let response = client()
            .post(format!("{}/v1/chat/completions", proxy.url()))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body).unwrap())
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        // The reserve is capped, never a 500 or a wrap; the budget itself goes as it came.
        assert_eq!(status, 200, "{field}: {text}");
        assert_eq!(mock.chats().last().unwrap().json()[field], json!(u64::MAX));
    }
}

/// Somewhat more than `n` tokens of text.
fn prose(n: usize) -> String {
    (0..n / 2)
        .map(|i| format!("w{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[tokio::test]
async fn a_large_output_budget_does_not_refuse_a_small_request_at_a_small_window() {
    let mock = start_mock().await;
    let mut cfg = config(&mock.url());
    cfg.windows.insert("qwen-local".into(), 4096);
    let proxy = start_proxy(cfg).await;
    // Qwen Code asks for 32,768 output tokens whatever the model; others ask for 4,096.
    for (field, budget) in [("max_tokens", 32_768), ("max_completion_tokens", 4096)] {
        let mut body =
            json!({"model": "qwen-local", "messages": [{"role": "user", "content": "Say hi."}]});
        body[field] = json!(budget);
        let r = common::post(
            &format!("{}/v1/chat/completions", proxy.url()),
            &[("content-type", "application/json")],
            body.to_string(),
        )
        .await;
        assert_eq!(r.status, 200, "{field}: {}", r.body);
        assert_eq!(mock.chats().last().unwrap().json()[field], json!(budget));
    }

    let responses = common::responses_mock::start_responses_mock().await;
    let mut cfg = config(&responses.url());
    cfg.windows.insert("qwen-local".into(), 4096);
    let proxy = start_proxy(cfg).await;
    let body = json!({"model": "qwen-local", "max_output_tokens": 32_768, "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hi."}]}
    ]});
    let r = common::post(
        &format!("{}/v1/responses", proxy.url()),
        &[("content-type", "application/json")],
        body.to_string(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        responses.turns().last().unwrap().json()["max_output_tokens"],
        32_768
    );
}

#[tokio::test]
async fn when_the_output_budget_is_what_cannot_fit_the_error_says_so() {
    let mock = start_mock().await;
    let mut cfg = config(&mock.url());
    cfg.windows.insert("qwen-local".into(), 4096);
    let proxy = start_proxy(cfg).await;
    let mut body = json!({"model": "qwen-local", "messages": [
        {"role": "system", "content": prose(2_700)},
        {"role": "user", "content": "hi"},
    ]});
    let url = format!("{}/v1/chat/completions", proxy.url());
    let headers = [("content-type", "application/json")];
    // Without a budget of its own the prompt fits (and is sent as it is).
    let r = common::post(&url, &headers, body.to_string()).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let prompt: u64 = r
        .header("x-compactor-prompt-tokens")
        .unwrap()
        .parse()
        .unwrap();
    assert!((3_000..3_840).contains(&prompt), "{prompt}");

    body["max_tokens"] = json!(32_768);
    let r = common::post(&url, &headers, body.to_string()).await;
    assert_eq!(error_code(r.status, &r.body), "context_length_exceeded");
    let message = r.json()["error"]["message"].as_str().unwrap().to_string();
    for part in [
        "output budget".to_string(),
        format!("{prompt} for the system prompt, tools and last user message"),
        "1024 kept for the answer (of the 32768 output tokens asked for)".to_string(),
        "context window of 4096 tokens".to_string(),
    ] {
        assert!(message.contains(&part), "{part:?} missing from {message}");
    }
}

/// Writes `requests` on one fresh connection and reads until the proxy closes it (or goes quiet
/// for five seconds); returns the answers, split into (status, body) after each head.
async fn raw_exchange(addr: std::net::SocketAddr, requests: &[u8]) -> Vec<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    // The proxy may answer and close before it has read everything; that is not a failure.
    let _ = stream.write_all(requests).await;
    let answers = common::read_until_quiet(&mut stream, Duration::from_secs(5)).await;
    split_answers(&answers)
}

/// Splits a stream of HTTP/1.1 answers with `content-length` framing into (status, body).
fn split_answers(mut text: &str) -> Vec<(u16, String)> {
    let mut answers = Vec::new();
    while let Some(end) = text.find("\r\n\r\n") {
        let head = &text[..end];
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status line in {head:?}"));
        let length = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse::<usize>().ok())?
            })
            .unwrap_or_else(|| panic!("no content-length in {head:?}"));
        let rest = &text[end + 4..];
        answers.push((status, rest[..length.min(rest.len())].to_string()));
        text = &rest[length.min(rest.len())..];
    }
    answers
}

/// A request the proxy serves itself, so that the next one on the connection is a second.
const HEALTH: &str = "GET /healthz HTTP/1.1\r\nhost: proxy\r\n\r\n";

#[tokio::test]
async fn request_headers_too_large_get_431_with_an_error_body() {
    let mock = start_mock().await;
    let proxy = start_proxy(config(&mock.url())).await;
    let long = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: proxy\r\nx-long: {}\r\ncontent-length: 2\r\n\r\n{{}}",
        "a".repeat(600_000)
    );
    let many = format!(
        "POST /v1/messages HTTP/1.1\r\nhost: proxy\r\n{}content-length: 2\r\n\r\n{{}}",
        (0..200)
            .map(|i| format!("x-h{i}: v\r\n"))
            .collect::<String>()
    );
    for (what, request) in [
        ("one long header", long.clone()),
        ("too many headers", many),
        ("after a served request", format!("{HEALTH}{long}")),
    ] {
        let answers = raw_exchange(proxy.addr, request.as_bytes()).await;
        let (status, body) = answers
            .last()
            .unwrap_or_else(|| panic!("{what}: no answer"));
        assert_eq!(*status, 431, "{what}: {body}");
        assert_eq!(
            error_code(*status, body),
            "request_header_fields_too_large",
            "{what}"
        );
        // Anthropic's SDK reads the same body: `type` at the top, `error.type` and `message`.
        let value: Value = serde_json::from_str(body).unwrap();
        assert_eq!(value["type"], "error", "{what}: {body}");
    }
    assert!(mock.chats().is_empty());
}

#[tokio::test]
async fn badly_framed_requests_get_400_with_an_error_body() {
    let mock = start_mock().await;
    let proxy = start_proxy(config(&mock.url())).await;
    let chat = |framing: &str| {
        format!("POST /v1/chat/completions HTTP/1.1\r\nhost: proxy\r\n{framing}\r\n\r\n{{}}")
    };
    for (what, request) in [
        (
            "a malformed request line",
            "GET\u{7f} / HTTP/1.1\r\nhost: proxy\r\n\r\n".to_string(),
        ),
        (
            "no version",
            "GET /healthz\r\nhost: proxy\r\n\r\n".to_string(),
        ),
        (
            "a header without a colon",
            "GET /healthz HTTP/1.1\r\nhost proxy\r\n\r\n".to_string(),
        ),
        ("an invalid content-length", chat("content-length: two")),
        (
            "conflicting content-lengths",
            chat("content-length: 2\r\ncontent-length: 3"),
        ),
        (
            "a transfer-encoding that does not end in chunked",
            chat("transfer-encoding: chunked, gzip"),
        ),
        (
            "an invalid content-length after a served request",
            format!("{HEALTH}{}", chat("content-length: two")),
        ),
    ] {
        let answers = raw_exchange(proxy.addr, request.as_bytes()).await;
        let (status, body) = answers
            .last()
            .unwrap_or_else(|| panic!("{what}: no answer"));
        assert_eq!(*status, 400, "{what}: {body}");
        assert_eq!(error_code(*status, body), "malformed_request", "{what}");
        if what.ends_with("after a served request") {
            assert_eq!(answers.len(), 2, "{what}: {answers:?}");
            assert_eq!(answers[0].0, 200, "{what}");
        }
    }
    assert!(mock.chats().is_empty());
}

#[tokio::test]
async fn a_provider_error_without_a_body_is_forwarded_unchanged() {
    // A bare 400: the same head hyper writes for a request it cannot parse, once the proxy
    // forwards it to a client that asked to close.
    let addr = raw_upstream(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n").await;
    let proxy = start_proxy(config(&format!("http://{addr}/v1"))).await;
    let request = "GET /v1/models HTTP/1.1\r\nhost: proxy\r\nconnection: close\r\n\r\n";
    let answers = raw_exchange(proxy.addr, request.as_bytes()).await;
    assert_eq!(answers, vec![(400, String::new())]);
}

/// Sends a whole request the way Python's `http.client` (under the OpenAI SDK, httpx alike)
/// does: every byte of the body written before the answer is read. Returns the answer's status
/// line, or the write or read error the client would see.
async fn send_all_then_read(addr: &str, path: &str, body_len: usize) -> Result<String, String> {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {body_len}\r\n\r\n"
    );
    stream
        .write_all(head.as_bytes())
        .await
        .map_err(|e| format!("writing the head: {e}"))?;
    // A JSON string of spaces, written in 64 KB pieces as a socket client does.
    let mut body = Vec::with_capacity(body_len);
    body.extend_from_slice(
        b"{\"model\":\"gpt-4o\",\"messages\":[{\"role\":\"user\",\"content\":\"",
    );
    body.resize(body_len - 4, b' ');
    body.extend_from_slice(b"\"}]}");
    for piece in body.chunks(64 * 1024) {
        stream
            .write_all(piece)
            .await
            .map_err(|e| format!("writing the body: {e}"))?;
    }
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => {
                answer.extend_from_slice(&buf[..n]);
                if answer.windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
            Err(e) => return Err(format!("reading the answer: {e}")),
        }
    }
    let text = String::from_utf8_lossy(&answer);
    Ok(text.lines().next().unwrap_or_default().to_string())
}

#[tokio::test]
async fn a_body_over_the_limit_is_answered_413_to_a_client_that_sends_it_all_first() {
    let mock = start_mock().await;
    let mut config = config(&mock.url());
    config.max_body_bytes = 1024 * 1024;
    let proxy = start_proxy(config).await;
    let addr = proxy.url().trim_start_matches("http://").to_string();
    // Declared too large (refused before reading), and over the limit only once read (a
    // content-length the proxy cannot refuse up front is the same case for the drain). Four
    // times the limit: far more than the kernel's socket buffers hold, so a proxy that closes
    // at once makes the writes fail.
    for path in ["/v1/chat/completions", "/v1/messages", "/v1/responses"] {
        let status = send_all_then_read(&addr, path, 4 * 1024 * 1024).await;
        assert_eq!(
            status.as_deref(),
            Ok("HTTP/1.1 413 Payload Too Large"),
            "{path}: the client must read the 413, not a broken pipe"
        );
    }
}

#[tokio::test]
async fn a_body_refused_while_the_budget_is_spent_is_answered_503_to_a_client_that_sends_it_all_first(
) {
    let mock = start_mock().await;
    let mut config = config(&mock.url());
    config.max_body_bytes = 16 * 1024 * 1024;
    config.max_in_flight_body_bytes = 4 * 1024 * 1024;
    let proxy = start_proxy(config).await;
    // A request the provider never answers holds the whole budget.
    let url = proxy.url();
    // Two megabytes, most of them whitespace after the JSON, so the request is small in tokens.
    let held = json!({"model": "mock-hang", "messages": [{"role": "user", "content": "hi"}]});
    let held = format!("{held}{}", " ".repeat(2 * 1024 * 1024));
    let holding = tokio::spawn(async move {
        common::post(
            &format!("{url}/v1/chat/completions"),
            &[("authorization", "Bearer k")],
            held,
        )
        .await
    });
    common::eventually("the first request to reach the provider", async || {
        !mock.chats().is_empty()
    })
    .await;
    let addr = proxy.url().trim_start_matches("http://").to_string();
    let status = send_all_then_read(&addr, "/v1/chat/completions", 4 * 1024 * 1024).await;
    assert_eq!(
        status.as_deref(),
        Ok("HTTP/1.1 503 Service Unavailable"),
        "the client must read the 503, not a broken pipe"
    );
    holding.abort();
}
