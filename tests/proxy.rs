//! The proxy foundation end to end: an in-process mock provider, a Compactor in front of it, and
//! a client that talks to Compactor as it would to OpenAI.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use compactor::dialect::chat::request::ChatRequest;
use compactor::measure::Meter;
use futures::StreamExt;
use serde_json::{json, Value};

use common::{
    client, compactor_command, config, mock_tokens, sse_chunks, start_mock, start_proxy, Mock,
    Proxy,
};

async fn json_of(response: reqwest::Response) -> Value {
    let bytes = response.bytes().await.unwrap();
    serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&bytes)))
}

fn chat_url(proxy: &common::Proxy) -> String {
    format!("{}/v1/chat/completions", proxy.url())
}

fn hello(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hello world"}]})
}

fn streaming(model: &str) -> Value {
    json!({
        "model": model,
        "stream": true,
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "say hello"}
        ]
    })
}

/// Asserts the OpenAI error shape (exactly `message`, `type`, `param`, `code`) and returns the
/// error object.
fn assert_error_shape(body: &Value) -> &serde_json::Map<String, Value> {
    let outer = body.as_object().expect("error body is an object");
    assert_eq!(outer.len(), 1, "only `error` at the top: {body}");
    let error = body["error"].as_object().expect("`error` is an object");
    let mut keys: Vec<&str> = error.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["code", "message", "param", "type"], "{body}");
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert!(error["type"].is_string(), "{body}");
    assert!(error["param"].is_string() || error["param"].is_null());
    assert!(error["code"].is_string() || error["code"].is_null());
    error
}

/// Sends a raw body to the chat route and returns the status and the parsed error body.
async fn chat_error(
    proxy: &common::Proxy,
    body: impl Into<reqwest::Body>,
) -> (u16, serde_json::Map<String, Value>) {
    let response = client()
        .post(chat_url(proxy))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    assert_eq!(
        response.headers()["content-type"],
        "application/json",
        "the proxy's own errors are JSON"
    );
    let body: Value = json_of(response).await;
    (status, assert_error_shape(&body).clone())
}

// ---------------------------------------------------------------------------------------------
// Byte-identical answers
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn non_streaming_completion_is_byte_identical() {
    let mock = start_mock().await;
    let proxy = start_proxy(config(&mock.url())).await;
    let request = hello("gpt-4o");
    let response = client()
        .post(chat_url(&proxy))
        .bearer_auth("sk-test")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&request).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-request-id"], "req-chat");
    let got = response.bytes().await.unwrap();
    let expected = serde_json::to_vec(&common::completion_json(
        "Hello there",
        mock_tokens(&request),
    ))
    .unwrap();
    assert_eq!(
        got,
        Bytes::from(expected),
        "{}",
        String::from_utf8_lossy(&got)
    );
    // The mock got the client's request and its credentials.
    let chats = mock.chats();
    assert_eq!(chats.len(), 1);
    assert_eq!(chats[0].json(), request);
    assert_eq!(chats[0].headers["authorization"], "Bearer sk-test");
}

/// A body nothing changes goes to the provider as the very bytes the client sent, its layout
/// included; one the proxy must change (a stream it asks usage for) is written again.
#[tokio::test]
async fn a_body_that_needs_no_change_reaches_the_provider_byte_for_byte() {
    let mock = start_mock().await;
    let proxy = start_proxy(config(&mock.url())).await;
    let send = |body: Vec<u8>| {
        client()
            .post(chat_url(&proxy))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let plain = serde_json::to_vec_pretty(&hello("gpt-4o")).unwrap();
    assert_eq!(send(plain.clone()).await.unwrap().status(), 200);
    let streamed = serde_json::to_vec_pretty(&streaming("gpt-4o")).unwrap();
    let response = send(streamed.clone()).await.unwrap();
    assert_eq!(response.status(), 200);
    response.bytes().await.unwrap();
    let chats = mock.chats();
    assert_eq!(chats.len(), 2);
    assert_eq!(chats[0].body, Bytes::from(plain));
    assert_ne!(chats[1].body, Bytes::from(streamed.clone()));
    let mut asked = serde_json::from_slice::<Value>(&streamed).unwrap();
    asked["stream_options"] = json!({"include_usage": true});
    assert_eq!(chats[1].json(), asked);
}

/// An upstream named by host name, not address: its name goes through the bounded lookup.
#[tokio::test]
async fn an_upstream_named_by_host_name_is_resolved_and_reached() {
    let mock = start_mock().await;
    let upstream = format!("http://localhost:{}/v1", mock.addr.port());
    let proxy = start_proxy(config(&upstream)).await;
    let reply = common::post_chat(&proxy, "sk-test", &hello("gpt-4o")).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(mock.chats().len(), 1);
}

#[tokio::test]
async fn streaming_completion_is_byte_identical_without_the_added_usage_chunk() {
    let mock = start_mock().await;
    let proxy = start_proxy(config(&mock.url())).await;
    let request = streaming("gpt-4o");
    let response = client()
        .post(chat_url(&proxy))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&request).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let got = response.bytes().await.unwrap();
    // The proxy asked for usage upstream (to calibrate) and must hide it again.
    let sent = mock.chats();
    assert_eq!(sent[0].json()["stream_options"]["include_usage"], true);
    let expected = sse_chunks(false, mock_tokens(&request)).concat();
    assert_eq!(String::from_utf8_lossy(&got), expected);
}

#[tokio::test]
async fn streaming_client_that_asks_for_usage_gets_the_usage_chunk() {
    let mock = start_mock().await;
    let proxy = start_proxy(config(&mock.url())).await;
    let mut request = streaming("gpt-4o");
    request["stream_options"] = json!({"include_usage": true});
    let response = client()
        .post(chat_url(&proxy))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&request).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let got = response.bytes().await.unwrap();
    let expected = sse_chunks(true, mock_tokens(&request)).concat();
    assert_eq!(String::from_utf8_lossy(&got), expected);
    assert!(expected.contains("\"usage\""));
}

#[tokio::test]
async fn first_sse_chunk_arrives_before_the_mock_sends_its_last() {
    let mock = start_mock().await;
    mock.state.chunk_pause_ms.store(300, Ordering::SeqCst);
    let proxy = start_proxy(config(&mock.url())).await;
    let request = streaming("gpt-4o");
    // The proxy adds include_usage upstream, so the mock sends the usage chunk too.
    let total = sse_chunks(true, 0).len();
    let response = client()
        .post(chat_url(&proxy))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&request).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut stream = response.bytes_stream();
    let first = stream.next().await.unwrap().unwrap();
    let sent = mock.state.chunks_sent.load(Ordering::SeqCst);
    assert!(
        sent < total,
        "first chunk reached the client only after the mock sent {sent} of {total} chunks"
    );
    let expected = sse_chunks(false, mock_tokens(&request));
    assert!(
        expected[0].starts_with(std::str::from_utf8(&first).unwrap()),
        "first bytes {:?}",
        String::from_utf8_lossy(&first)
    );
    // The rest still arrives, complete.
    let mut all = first.to_vec();
    while let Some(chunk) = stream.next().await {
        all.extend_from_slice(&chunk.unwrap());
    }
    assert_eq!(String::from_utf8_lossy(&all), expected.concat());
    assert_eq!(mock.state.chunks_sent.load(Ordering::SeqCst), total);
}

// ---------------------------------------------------------------------------------------------
// Pass-through
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn models_pass_through() {
    let mock = start_mock().await;
    let proxy = start_proxy(config(&mock.url())).await;
    let response = client()
        .get(format!("{}/v1/models", proxy.url()))
        .bearer_auth("sk-models")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-request-id"], "req-other");
    let body: Value = json_of(response).await;
    assert_eq!(body["method"], "GET");
    assert_eq!(body["path"], "/v1/models");
    assert_eq!(body["query"], Value::Null);
    assert_eq!(body["data"][0]["id"], "mock-model");
    let others = mock.state.others.lock().unwrap().clone();
    assert_eq!(others.len(), 1);
    assert_eq!(others[0].headers["authorization"], "Bearer sk-models");
}

#[tokio::test]
async fn messages_go_to_the_anthropic_upstream_with_its_own_key() {
    let openai = start_mock().await;
    let anthropic = start_mock().await;
    let mut cfg = config(&openai.url());
    cfg.anthropic_upstream = format!("http://{}", anthropic.addr);
    cfg.anthropic_upstream_key_env = "COMPACTOR_TEST_ANTHROPIC_KEY".into();
    std::env::set_var("COMPACTOR_TEST_ANTHROPIC_KEY", "sk-ant-configured");
    let proxy = start_proxy(cfg).await;
    for path in ["/v1/messages", "/v1/messages/count_tokens"] {
        let response = client()
            .post(format!("{}{path}?beta=true", proxy.url()))
            .header("x-api-key", "sk-ant-client")
            .body(json!({"model": "claude-x", "messages": []}).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let echo: Value = json_of(response).await;
        assert_eq!(echo["path"], path);
        assert_eq!(echo["query"], "beta=true");
    }
    let received = anthropic.state.others.lock().unwrap().clone();
    assert_eq!(received.len(), 2);
    assert_eq!(received[0].headers["x-api-key"], "sk-ant-configured");
    assert!(received[0].headers.get("authorization").is_none());
    assert!(openai.state.others.lock().unwrap().is_empty());
    // Everything else still goes to the OpenAI-compatible upstream.
    let response = client()
        .get(format!("{}/v1/models", proxy.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(openai.state.others.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn embeddings_pass_through_with_query_and_headers() {
    let mock = start_mock().await;
    let proxy = start_proxy(config(&mock.url())).await;
    let body = json!({"model": "text-embedding-3-small", "input": "hello world"}).to_string();
    let response = client()
        .post(format!(
            "{}/v1/embeddings?api-version=2024-06-01&x=1",
            proxy.url()
        ))
        .header("x-custom", "kept-as-is")
        .header("content-type", "application/json")
        .header("x-compactor-mode", "off")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-request-id"], "req-other");
    let echo: Value = json_of(response).await;
    assert_eq!(echo["method"], "POST");
    assert_eq!(echo["path"], "/v1/embeddings");
    assert_eq!(echo["query"], "api-version=2024-06-01&x=1");
    assert_eq!(echo["x_custom"], "kept-as-is");
    assert_eq!(echo["body_len"], body.len());
    let others = mock.state.others.lock().unwrap().clone();
    assert_eq!(others[0].body, Bytes::from(body));
    assert_eq!(others[0].headers["content-type"], "application/json");
    // The proxy's own headers stay with the proxy.
    assert!(others[0].headers.get("x-compactor-mode").is_none());
    // The provider is asked for by its own name, on a passed request and a compacted one.
    assert_eq!(others[0].headers["host"], mock.addr.to_string());
    let chat = client()
        .post(format!("{}/v1/chat/completions", proxy.url()))
        .header("host", "proxy.example:8787")
        .header("content-type", "application/json")
        .body(
            json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}).to_string(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(chat.status(), 200);
    let chats = mock.state.chats.lock().unwrap().clone();
    assert_eq!(chats[0].headers["host"], mock.addr.to_string());
    assert_eq!(chats[0].headers.get_all("host").iter().count(), 1);
}

#[tokio::test]
async fn health_endpoints_answer() {
    let mock = start_mock().await;
    let proxy = start_proxy(config(&mock.url())).await;
    let health = client()
        .get(format!("{}/healthz", proxy.url()))
        .send()
        .await
        .unwrap();
    let health = json_of(health).await;
    assert_eq!(health["status"], "ok");
    let ready = client()
        .get(format!("{}/readyz", proxy.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    let ready: Value = json_of(ready).await;
    assert_eq!(ready["status"], "ready");
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn malformed_json_is_400_naming_line_and_column() {
    let mock = start_mock().await;
    let proxy = start_proxy(config(&mock.url())).await;
    let body = "{\n  \"model\": \"gpt-4o\",\n  \"messages\": [}\n}";
    let (status, error) = chat_error(&proxy, body).await;
    assert_eq!(status, 400);
    assert_eq!(error["type"], "invalid_request_error");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("line 3 column 16"), "{message}");
    assert!(mock.chats().is_empty(), "nothing went upstream");
}

#[tokio::test]
async fn missing_or_mistyped_fields_are_400() {
    let mock = start_mock().await;
    let proxy = start_proxy(config(&mock.url())).await;
    let cases = [
        (json!({"messages": []}), "model"),
        (json!({"model": "gpt-4o"}), "messages"),
        (
            json!({"model": "gpt-4o", "messages": "hello world"}),
            "messages",
        ),
        (
            json!({"model": "gpt-4o", "messages": {"role": "user"}}),
            "messages",
        ),
    ];
    for (body, param) in cases {
        let (status, error) = chat_error(&proxy, body.to_string()).await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(error["type"], "invalid_request_error", "{body}");
        assert_eq!(error["param"], param, "{body}");
        assert!(
            error["message"].as_str().unwrap().contains(param),
            "{body}: {error:?}"
        );
    }
    // A body that is JSON but not an object.
    let (status, _) = chat_error(&proxy, "[1, 2]").await;
    assert_eq!(status, 400);
    assert!(mock.chats().is_empty(), "nothing went upstream");
}

#[tokio::test]
async fn body_over_the_limit_is_413() {
    let mock = start_mock().await;
    let mut cfg = config(&mock.url());
    cfg.max_body_bytes = 256;
    let proxy = start_proxy(cfg).await;
    let big =
        json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "x".repeat(1000)}]});
    let (status, error) = chat_error(&proxy, big.to_string()).await;
    assert_eq!(status, 413);
    assert_eq!(error["code"], "request_too_large");
    assert!(error["message"].as_str().unwrap().contains("256"));
    // The same limit without a content-length (a chunked upload).
    let chunks: Vec<Result<Bytes, std::io::Error>> =
        (0..8).map(|_| Ok(Bytes::from(vec![b' '; 100]))).collect();
    let (status, _) = chat_error(
        &proxy,
        reqwest::Body::wrap_stream(futures::stream::iter(chunks)),
    )
    .await;
    assert_eq!(status, 413);
    // Under the limit still works.
    let response = client()
        .post(chat_url(&proxy))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&hello("gpt-4o")).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(mock.chats().len() == 1);
}

#[tokio::test]
async fn unreachable_upstream_is_502() {
    // A port that was just free: nothing listens there.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let proxy = start_proxy(config(&format!("http://127.0.0.1:{port}/v1"))).await;
    let (status, error) = chat_error(&proxy, hello("gpt-4o").to_string()).await;
    assert_eq!(status, 502);
    assert_eq!(error["code"], "upstream_unreachable");
    // Pass-through routes say the same.
    let response = client()
        .get(format!("{}/v1/models", proxy.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 502);
    let body: Value = json_of(response).await;
    assert_error_shape(&body);
}

/// A mock and a proxy in front of it whose first-byte timeout is 300 ms.
async fn with_short_first_byte_timeout() -> (Mock, Proxy) {
    let mock = start_mock().await;
    let mut cfg = config(&mock.url());
    cfg.first_byte_timeout_ms = 300;
    let proxy = start_proxy(cfg).await;
    (mock, proxy)
}

/// Asks `model` for a chat completion and expects a 504 `upstream_timeout`, well before the
/// mock's behaviour would have ended on its own.
async fn assert_timed_out(proxy: &Proxy, model: &str) {
    let started = Instant::now();
    let (status, error) = chat_error(proxy, hello(model).to_string()).await;
    assert_eq!(status, 504);
    assert_eq!(error["code"], "upstream_timeout");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "answered after {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn first_byte_timeout_is_504() {
    let (mock, proxy) = with_short_first_byte_timeout().await;
    assert_timed_out(&proxy, "mock-hang").await;
    assert_eq!(mock.chats().len(), 1, "the request did reach the mock");
}

/// A provider that sends its headers and then stalls holds the request no longer than the
/// first-byte timeout: an error answer is a 504, a stream goes on to the client undecided.
#[tokio::test]
async fn a_provider_stalling_after_its_headers_is_bounded_by_the_first_byte_timeout() {
    let (_mock, proxy) = with_short_first_byte_timeout().await;
    assert_timed_out(&proxy, "mock-stall-error").await;

    let mut streamed = hello("mock-stall-stream");
    streamed["stream"] = json!(true);
    let started = Instant::now();
    let response = tokio::time::timeout(
        Duration::from_secs(10),
        client()
            .post(chat_url(&proxy))
            .header("content-type", "application/json")
            .body(streamed.to_string())
            .send(),
    )
    .await
    .expect("the stream's headers were held back")
    .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"],
        "text/event-stream",
        "{:?}",
        started.elapsed()
    );
}

/// A stream the provider leaves silent, from its head on or after its first event, ends once
/// `stream_idle_timeout_ms` passes without a byte, with an `error` event the OpenAI SDKs raise
/// (`data` holding an `error` object), after everything the provider did send.
#[tokio::test]
async fn a_stream_the_provider_leaves_silent_ends_with_an_error_event() {
    let mock = start_mock().await;
    let mut cfg = config(&mock.url());
    cfg.stream_idle_timeout_ms = 300;
    let proxy = start_proxy(cfg).await;
    for (model, sent_before) in [("mock-stall-mid-stream", 1), ("mock-stall-stream", 0)] {
        let mut body = hello(model);
        body["stream"] = json!(true);
        let started = Instant::now();
        let response = client()
            .post(chat_url(&proxy))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let text = tokio::time::timeout(Duration::from_secs(10), response.text())
            .await
            .expect("the silent stream was ended")
            .unwrap();
        assert!(started.elapsed() >= Duration::from_millis(300), "{model}");
        let events: Vec<&str> = text
            .split("\n\n")
            .filter(|e| !e.trim().is_empty())
            .collect();
        assert_eq!(events.len(), sent_before + 1, "{model}: {text}");
        if sent_before == 1 {
            assert!(events[0].contains("\"Hel\""), "{text}");
        }
        let data = events[sent_before]
            .strip_prefix("event: error\ndata: ")
            .unwrap_or_else(|| panic!("{model}: no error event last: {text}"));
        let error: Value = serde_json::from_str(data).unwrap();
        assert_eq!(error["error"]["code"], "upstream_timeout", "{data}");
        assert_eq!(error["error"]["type"], "upstream_error", "{data}");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains("nothing for 300 ms"), "{message}");
    }
    let (_, metrics) = common::get(&format!("{}/metrics", proxy.url()), None).await;
    assert_eq!(
        common::metric(&metrics, "compactor_upstream_silences_total"),
        Some(2.0),
        "{metrics}"
    );
}

#[tokio::test]
async fn upstream_429_passes_through_verbatim() {
    let mock = start_mock().await;
    let proxy = start_proxy(config(&mock.url())).await;
    let response = client()
        .post(chat_url(&proxy))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&hello("mock-429")).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 429);
    let headers = response.headers().clone();
    assert_eq!(headers["retry-after"], "7");
    assert_eq!(headers["x-request-id"], "req-429");
    assert_eq!(headers["openai-processing-ms"], "3");
    assert!(
        headers.get("x-compactor-error").is_none(),
        "not the proxy's own error"
    );
    let body = response.bytes().await.unwrap();
    assert_eq!(
        body,
        Bytes::from_static(
            br#"{"error":{"message":"Rate limit reached","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#
        )
    );
}

#[tokio::test]
async fn invalid_mode_header_is_400() {
    let mock = start_mock().await;
    let proxy = start_proxy(config(&mock.url())).await;
    let response = client()
        .post(chat_url(&proxy))
        .header("x-compactor-mode", "sideways")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&hello("gpt-4o")).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let body: Value = json_of(response).await;
    let error = assert_error_shape(&body);
    assert_eq!(error["param"], "x-compactor-mode");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("expected auto, force or off"), "{message}");
    // Not repeated: refusals are logged, and a header may hold anything.
    assert!(!message.contains("sideways"), "{message}");
    assert!(mock.chats().is_empty(), "nothing went upstream");
    // The valid values are accepted.
    for mode in ["auto", "off", "force"] {
        let response = client()
            .post(chat_url(&proxy))
            .header("x-compactor-mode", mode)
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&hello("gpt-4o")).unwrap())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "mode {mode}");
    }
}

// ---------------------------------------------------------------------------------------------
// Streams that end early
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn client_disconnect_cancels_the_upstream_stream() {
    let mock = start_mock().await;
    mock.state.chunk_pause_ms.store(300, Ordering::SeqCst);
    let proxy = start_proxy(config(&mock.url())).await;
    let response = client()
        .post(chat_url(&proxy))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&streaming("gpt-4o")).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut stream = response.bytes_stream();
    stream.next().await.unwrap().unwrap();
    assert!(!mock.state.stream_cancelled.load(Ordering::SeqCst));
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !mock.state.stream_cancelled.load(Ordering::SeqCst) {
        assert!(
            Instant::now() < deadline,
            "the mock never saw its stream cancelled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        mock.state.chunks_sent.load(Ordering::SeqCst) < sse_chunks(true, 0).len(),
        "the mock did not send the whole stream"
    );
}

#[tokio::test]
async fn upstream_drop_mid_stream_ends_the_client_stream_without_done() {
    let mock = start_mock().await;
    // Paced, so the head and the first chunks are on the wire before the drop.
    mock.state.chunk_pause_ms.store(50, Ordering::SeqCst);
    let proxy = start_proxy(config(&mock.url())).await;
    let response = client()
        .post(chat_url(&proxy))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&streaming("mock-drop-stream")).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut stream = response.bytes_stream();
    let mut received = Vec::new();
    let mut failed = false;
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("the client's stream neither ended nor failed")
    {
        match chunk {
            Ok(bytes) => received.extend_from_slice(&bytes),
            Err(_) => {
                failed = true;
                break;
            }
        }
    }
    let text = String::from_utf8_lossy(&received);
    assert!(failed, "the stream ended cleanly: {text:?}");
    assert!(
        text.starts_with("data: "),
        "nothing arrived before the drop"
    );
    assert!(!text.contains("[DONE]"), "an invented [DONE]: {text:?}");
    // What did arrive is exactly what the mock sent before dropping.
    let sent = sse_chunks(true, 0);
    let before_drop = sent[..mock.state.chunks_sent.load(Ordering::SeqCst)].concat();
    assert!(before_drop.starts_with(&*text), "{text:?}");
}

// ---------------------------------------------------------------------------------------------
// Counting
// ---------------------------------------------------------------------------------------------

async fn prompt_tokens(proxy: &common::Proxy, body: &Value) -> (u64, reqwest::header::HeaderMap) {
    let response = client()
        .post(chat_url(proxy))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "{body}");
    let headers = response.headers().clone();
    response.bytes().await.unwrap();
    let tokens = headers["x-compactor-prompt-tokens"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    (tokens, headers)
}

#[tokio::test]
async fn prompt_tokens_and_window_headers_match_known_counts() {
    let mock = start_mock().await;
    let proxy = start_proxy(config(&mock.url())).await;
    // o200k_base: 3 per message + "user" (1) + "hello world" (2) + 3 to prime the reply.
    let (tokens, headers) = prompt_tokens(&proxy, &hello("gpt-4o")).await;
    assert_eq!(tokens, 3 + 1 + 2 + 3);
    assert_eq!(headers["x-compactor-context-window"], "128000");
    // cl100k_base for gpt-4: "tiktoken is great!" is 6 tokens, "hello world" 2, "user" 1.
    let two = json!({"model": "gpt-4", "messages": [
        {"role": "user", "content": "hello world"},
        {"role": "user", "content": "tiktoken is great!"}
    ]});
    let (tokens, headers) = prompt_tokens(&proxy, &two).await;
    assert_eq!(tokens, (3 + 1 + 2) + (3 + 1 + 6) + 3);
    assert_eq!(headers["x-compactor-context-window"], "8192");
}

#[tokio::test]
async fn repeated_conversation_plus_one_turn_hits_the_cache() {
    let mock = start_mock().await;
    let proxy = start_proxy(config(&mock.url())).await;
    let meter = proxy.app.engine.meter();
    // Messages no other test sends: a message parsed before in this process carries its count,
    // and this one watches the meter's own cache fill.
    let mut conversation = json!({"model": "gpt-4o", "messages": [
        {"role": "system", "content": "You are a careful assistant, counted once."},
        {"role": "user", "content": "hello world, counted once"},
        {"role": "assistant", "content": "Hello there, counted once"}
    ]});
    let before = meter.cached();
    let (first, _) = prompt_tokens(&proxy, &conversation).await;
    let after_first = meter.cached();
    assert_eq!(after_first, before + 3);
    // The same conversation again: nothing new to tokenize.
    let (again, _) = prompt_tokens(&proxy, &conversation).await;
    assert_eq!(again, first);
    assert_eq!(meter.cached(), after_first);
    // Plus one turn: exactly one more message counted.
    conversation["messages"]
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "user", "content": "and now, counted once?"}));
    let (longer, _) = prompt_tokens(&proxy, &conversation).await;
    assert_eq!(meter.cached(), after_first + 1);
    let new_turn = 3 + 1 + compactor::tokenizer::Encoding::O200k.count("and now, counted once?");
    assert_eq!(longer, first + new_turn);
}

#[tokio::test]
async fn overhead_header_is_a_float() {
    let mock = start_mock().await;
    let proxy = start_proxy(config(&mock.url())).await;
    for body in [hello("gpt-4o"), streaming("gpt-4o")] {
        let response = client()
            .post(chat_url(&proxy))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body).unwrap())
            .send()
            .await
            .unwrap();
        let overhead: f64 = response.headers()["x-compactor-overhead-ms"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(overhead.is_finite() && overhead >= 0.0, "{overhead}");
        assert!(overhead < 10_000.0, "{overhead}");
        response.bytes().await.unwrap();
    }
}

/// Every real conversation in the shared data folder is accepted, counted and forwarded.
#[tokio::test]
async fn shared_conversations_are_accepted_and_counted() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/conversations");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        eprintln!("skipped: {} is not present", dir.display());
        return;
    };
    let mut files: Vec<_> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "json")
                && p.file_name().is_some_and(|n| n != "manifest.json")
        })
        .collect();
    files.sort();
    if files.is_empty() {
        eprintln!("skipped: no request bodies in {}", dir.display());
        return;
    }
    let mock = start_mock().await;
    for file in &files {
        let bytes = std::fs::read(file).unwrap();
        let request = ChatRequest::parse(&bytes).unwrap_or_else(|e| panic!("{file:?}: {e}"));
        let total = Meter::new(1024).measure(&request).total();
        // Nothing learned yet: the count is ours, uncorrected.
        let expected = total;
        // A fresh proxy per file: a correction learned from earlier answers must not interfere.
        let proxy = start_proxy(config(&mock.url())).await;
        let response = client()
            .post(chat_url(&proxy))
            .header("content-type", "application/json")
            .header("x-compactor-mode", "off")
            .body(bytes.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{file:?}");
        let counted: u64 = response.headers()["x-compactor-prompt-tokens"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(counted, expected, "{file:?}");
        assert!(counted > 1000, "{file:?}: {counted}");
        response.bytes().await.unwrap();
        let sent = mock.chats().pop().unwrap().json();
        let original: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(sent["messages"], original["messages"], "{file:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// The binary
// ---------------------------------------------------------------------------------------------

#[test]
fn check_config_prints_the_effective_config_with_secrets_redacted() {
    let output = compactor_command()
        .arg("check-config")
        .env("COMPACTOR_ADMIN_TOKEN", "very-secret-admin-token")
        .env("COMPACTOR_UPSTREAM", "http://127.0.0.1:9/v1")
        .env("COMPACTOR_ANTHROPIC_UPSTREAM", "http://127.0.0.1:10")
        .env("COMPACTOR_ANTHROPIC_UPSTREAM_KEY_ENV", "ANTHROPIC_API_KEY")
        .env(
            "COMPACTOR_TELEMETRY__OTLP_ENDPOINT",
            "http://127.0.0.1:4318",
        )
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!stdout.contains("very-secret-admin-token"), "{stdout}");
    let shown: toml::Table = toml::from_str(&stdout).unwrap();
    assert_eq!(shown["admin_token"].as_str(), Some("<redacted>"));
    assert_eq!(shown["upstream"].as_str(), Some("http://127.0.0.1:9/v1"));
    assert_eq!(
        shown["anthropic_upstream"].as_str(),
        Some("http://127.0.0.1:10")
    );
    assert_eq!(
        shown["anthropic_upstream_key_env"].as_str(),
        Some("ANTHROPIC_API_KEY")
    );
    assert_eq!(shown["listen"].as_str(), Some("127.0.0.1:8787"));
    assert_eq!(
        shown["telemetry"]["otlp_endpoint"].as_str(),
        Some("http://127.0.0.1:4318")
    );
    assert_eq!(
        shown["telemetry"]["service_name"].as_str(),
        Some("compactor")
    );
    assert_eq!(shown["max_body_bytes"].as_integer(), Some(32 * 1024 * 1024));
}

#[test]
fn check_config_names_an_unknown_key() {
    let dir = tempfile::tempdir().unwrap();
    for (text, key) in [
        ("upstreem = \"http://127.0.0.1:9/v1\"\n", "upstreem"),
        ("[compaction]\nkeep_recnt_tokens = 5\n", "keep_recnt_tokens"),
    ] {
        let path = dir.path().join("compactor.toml");
        std::fs::write(&path, text).unwrap();
        let output = compactor_command()
            .arg("check-config")
            .arg("--config")
            .arg(&path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{text} was accepted");
        assert!(stderr.contains(key), "{stderr}");
    }
}

#[test]
fn count_prints_tokens_per_message_and_the_total() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("request.json");
    std::fs::write(
        &path,
        json!({"model": "gpt-4", "messages": [
            {"role": "user", "content": "hello world"},
            {"role": "user", "content": "tiktoken is great!"}
        ]})
        .to_string(),
    )
    .unwrap();
    let output = compactor_command()
        .arg("count")
        .arg(&path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert!(rows.contains(&vec!["0", "user", "6"]), "{stdout}");
    assert!(rows.contains(&vec!["1", "user", "10"]), "{stdout}");
    assert!(stdout.contains("total 19 tokens"), "{stdout}");
    assert!(stdout.contains("window 8192 tokens"), "{stdout}");
    assert!(stdout.contains("0.2% used"), "{stdout}");
}

// ---------------------------------------------------------------------------------------------
// Shutdown
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn stopping_lets_an_open_stream_finish() {
    let mock = start_mock().await;
    mock.state.chunk_pause_ms.store(200, Ordering::SeqCst);
    let mut proxy = start_proxy(config(&mock.url())).await;
    let request = streaming("gpt-4o");
    let response = client()
        .post(chat_url(&proxy))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&request).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut stream = response.bytes_stream();
    let mut received = stream.next().await.unwrap().unwrap().to_vec();
    proxy.stop();
    // New connections are refused once the proxy stops accepting.
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let fresh = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap();
        if fresh
            .get(format!("{}/healthz", proxy.url()))
            .send()
            .await
            .is_err()
        {
            break;
        }
        assert!(Instant::now() < deadline, "still accepting after the stop");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    while let Some(chunk) = stream.next().await {
        received.extend_from_slice(&chunk.expect("the open stream was cut"));
    }
    assert_eq!(
        String::from_utf8_lossy(&received),
        sse_chunks(false, mock_tokens(&request)).concat()
    );
    assert!(!mock.state.stream_cancelled.load(Ordering::SeqCst));
}
