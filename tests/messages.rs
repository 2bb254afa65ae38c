//! Anthropic Messages through the proxy: Claude Code's recorded request sequence replayed
//! against a mock Messages provider, cut rules on synthetic tool loops with thinking, overflow
//! handling, `count_tokens`, and bad input answered in Anthropic's error shape.

mod common;

use common::messages_mock::{self, MessagesMock, Overflow};
use common::{start_proxy, Proxy, Reply};
use serde_json::{json, Value};

const MODEL: &str = "qwen2.5-coder-0.5b";
const SESSION: &str = include_str!("fixtures/claude-code/session.jsonl");

/// A proxy whose Messages upstream is `mock`, with `window` tokens for the fixture's model.
async fn proxy_for(mock: &MessagesMock, window: u64) -> Proxy {
    let mut config = common::config("http://127.0.0.1:9/v1");
    config.anthropic_upstream = mock.url();
    config.windows.insert(MODEL.to_string(), window);
    config.compaction.keep_recent_tokens = window / 3;
    // One summary request per summary: the span is never folded in chunks.
    config.summarizer.window = 100_000;
    start_proxy(config).await
}

async fn post(proxy: &Proxy, path: &str, headers: &[(&str, &str)], body: String) -> Reply {
    let mut all = vec![
        ("x-api-key", "sk-test"),
        ("content-type", "application/json"),
    ];
    all.extend_from_slice(headers);
    common::post(&format!("{}{path}", proxy.url()), &all, body).await
}

/// The fixture's requests: path, headers and body, in order.
/// One recorded request: path, headers, body.
type Recorded = (String, Vec<(String, String)>, Value);

fn session() -> Vec<Recorded> {
    SESSION
        .lines()
        .map(|line| {
            let record: Value = serde_json::from_str(line).unwrap();
            let headers = record["headers"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                .collect();
            (
                record["path"].as_str().unwrap().to_string(),
                headers,
                record["body"].clone(),
            )
        })
        .collect()
}

/// What is wrong with a body the proxy forwarded.
fn cut_problems(body: &Value) -> Vec<String> {
    let mut problems = vec![];
    let messages = body["messages"].as_array().unwrap();
    if messages.first().map(|m| &m["role"]) != Some(&json!("user")) {
        problems.push("first message is not a user's".to_string());
    }
    let blocks = |i: usize| {
        messages[i]["content"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    let ids = |i: usize, kind: &str, field: &str| -> Vec<String> {
        blocks(i)
            .iter()
            .filter(|b| b["type"] == kind)
            .map(|b| b[field].as_str().unwrap().to_string())
            .collect()
    };
    for i in 0..messages.len() {
        let results = ids(i, "tool_result", "tool_use_id");
        if !results.is_empty() {
            let calls = if i > 0 {
                ids(i - 1, "tool_use", "id")
            } else {
                vec![]
            };
            if !results.iter().all(|r| calls.contains(r)) {
                problems.push(format!("messages[{i}]: a tool_result without its tool_use"));
            }
        }
        let calls = ids(i, "tool_use", "id");
        if !calls.is_empty() {
            let next = if i + 1 < messages.len() {
                ids(i + 1, "tool_result", "tool_use_id")
            } else {
                vec![]
            };
            if i + 1 < messages.len() && !calls.iter().all(|c| next.contains(c)) {
                problems.push(format!("messages[{i}]: a tool_use without its result"));
            }
        }
    }
    let breakpoints = body.to_string().matches("\"cache_control\"").count();
    if breakpoints > 4 {
        problems.push(format!("{breakpoints} cache_control breakpoints"));
    }
    problems
}

#[tokio::test]
async fn claude_code_session_replays_with_one_summary_per_checkpoint() {
    let mock = messages_mock::start().await;
    let proxy = proxy_for(&mock, 1100).await;
    let requests = session();
    let mut checkpoints = vec![];
    for (n, (path, headers, body)) in requests.iter().enumerate() {
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let reply = post(&proxy, path, &headers, body.to_string()).await;
        assert_eq!(reply.status, 200, "request {n}: {}", reply.body);
        assert!(
            reply.body.contains("event: message_stop"),
            "request {n} streamed to the end"
        );
        checkpoints.push(reply.header("x-compactor-checkpoint").map(str::to_string));
    }
    let forwarded = mock.forwarded();
    assert_eq!(
        forwarded.len(),
        requests.len(),
        "one upstream request per client request"
    );
    assert!(forwarded
        .iter()
        .all(|r| r.query.as_deref() == Some("beta=true")));
    let distinct: std::collections::BTreeSet<_> = checkpoints.iter().flatten().collect();
    // The recorded session grows from about 500 to 900 tokens: past a 1,100-token window once.
    assert!(
        !distinct.is_empty(),
        "the session was compacted: {checkpoints:?}"
    );
    assert_eq!(
        mock.summaries().len(),
        distinct.len(),
        "one summary per checkpoint"
    );
    // Summary requests are made on the client's behalf with the API version and betas it uses
    // (Anthropic refuses a request without `anthropic-version`), less the context management
    // Compactor serves itself.
    for summary in mock.summaries() {
        let header = |name: &str| summary.headers.get(name).and_then(|v| v.to_str().ok());
        assert_eq!(header("anthropic-version"), Some("2023-06-01"));
        let betas = header("anthropic-beta").unwrap_or_default();
        assert!(betas.contains("claude-code-20250219"), "{betas}");
        assert!(!betas.contains("context-management"), "{betas}");
        assert_eq!(header("x-api-key"), Some("sk-test"));
    }
    // The key the client sent as `x-api-key` reads its checkpoints as `Authorization: Bearer`
    // too (and under its own header); another key does not.
    let id = distinct.iter().next().unwrap();
    let url = format!("{}/compactor/v1/checkpoints/{id}", proxy.url());
    let (status, body) = common::get(&url, Some("Bearer sk-test")).await;
    assert_eq!(status, 200, "{body}");
    let response = common::client()
        .get(&url)
        .header("x-api-key", "sk-test")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(common::get(&url, Some("Bearer sk-other")).await.0, 404);
    for (n, (received, (_, _, sent))) in forwarded.iter().zip(&requests).enumerate() {
        let body = received.json();
        assert_eq!(cut_problems(&body), Vec::<String>::new(), "request {n}");
        for field in ["system", "tools", "metadata", "thinking", "output_config"] {
            assert_eq!(body[field], sent[field], "request {n}: {field} unchanged");
        }
        // Claude Code's context edit (`clear_thinking_20251015`, keep all) is served by
        // Compactor for an upstream other than Anthropic's: taken off, nothing cleared.
        assert!(body.get("context_management").is_none(), "request {n}");
        let last = sent["messages"].as_array().unwrap().last().unwrap();
        assert_eq!(
            body["messages"].as_array().unwrap().last(),
            Some(last),
            "request {n}"
        );
    }
    // Between two compactions the rewritten prefix stays byte for byte the same: every message
    // of the previous request but its last one (which Claude Code itself re-serializes).
    for n in 1..forwarded.len() {
        if checkpoints[n].is_none() || checkpoints[n] != checkpoints[n - 1] {
            continue;
        }
        let (before, after) = (forwarded[n - 1].raw_messages(), forwarded[n].raw_messages());
        let stable = before.len() - 1;
        assert_eq!(
            before[..stable],
            after[..stable],
            "request {n} kept the prefix"
        );
    }
}

#[tokio::test]
async fn a_large_max_tokens_does_not_crowd_out_the_prompt() {
    let mock = messages_mock::start().await;
    let proxy = proxy_for(&mock, 4096).await;
    let (path, _, mut body) = session().remove(0);
    body["max_tokens"] = json!(32000);
    let reply = post(&proxy, &path, &[], body.to_string()).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("x-compactor-compacted"), Some("false"));
}

/// A tool loop with thinking: `turns` earlier turns, then a turn in progress.
fn thinking_loop(turns: usize, filler: usize) -> Value {
    let mut messages = vec![];
    for t in 0..=turns {
        messages.push(
            json!({"role": "user", "content": format!("question {t} {}", "word ".repeat(filler))}),
        );
        messages.push(json!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": format!("plan {t}"), "signature": format!("sig{t}")},
            {"type": "tool_use", "id": format!("toolu_{t}"), "name": "Read", "input": {"path": format!("f{t}.rs")}}]}));
        messages.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": format!("toolu_{t}"), "content": "data ".repeat(filler)}]}));
        if t < turns {
            messages.push(json!({"role": "assistant", "content": [{"type": "text", "text": format!("answer {t}")}]}));
        }
    }
    json!({"model": MODEL, "max_tokens": 64, "thinking": {"type": "enabled", "budget_tokens": 32},
           "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
           "messages": messages})
}

#[tokio::test]
async fn thinking_turn_in_progress_reaches_the_model_unmodified() {
    let mock = messages_mock::start().await;
    let proxy = proxy_for(&mock, 2000).await;
    let body = thinking_loop(8, 120);
    let reply = post(&proxy, "/v1/messages", &[], body.to_string()).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("x-compactor-compacted"), Some("true"));
    let sent = mock.forwarded().pop().unwrap().json();
    assert_eq!(cut_problems(&sent), Vec::<String>::new());
    let (ours, theirs) = (
        sent["messages"].as_array().unwrap(),
        body["messages"].as_array().unwrap(),
    );
    assert!(ours.len() < theirs.len());
    assert_eq!(
        ours[ours.len() - 3..],
        theirs[theirs.len() - 3..],
        "the turn in progress, whole"
    );
    assert!(sent.to_string().contains("SUMMARY-"));
}

#[tokio::test]
async fn overflow_from_the_provider_is_compacted_and_retried() {
    for style in [
        Overflow::Anthropic,
        Overflow::LlamaCpp,
        Overflow::AfterMessageStart,
    ] {
        let mock = messages_mock::start().await;
        // The proxy believes in a large window; the provider's is smaller.
        let proxy = proxy_for(&mock, 100_000).await;
        mock.set_window(1500, style);
        let mut body = thinking_loop(8, 120);
        body["stream"] = json!(style == Overflow::AfterMessageStart);
        let reply = post(&proxy, "/v1/messages", &[], body.to_string()).await;
        assert_eq!(reply.status, 200, "{style:?}: {}", reply.body);
        assert_eq!(reply.header("x-compactor-compacted"), Some("true"));
        assert_eq!(mock.forwarded().len(), 2, "{style:?}: one retry");
        assert!(
            !reply.body.contains("error") && reply.body.contains("Hello there"),
            "{style:?}: the client sees the retried answer only: {}",
            reply.body
        );
    }
}

#[tokio::test]
async fn a_prompt_that_cannot_fit_is_refused_in_anthropics_words() {
    let mock = messages_mock::start().await;
    let proxy = proxy_for(&mock, 1000).await;
    let body = json!({"model": MODEL, "max_tokens": 16,
                      "messages": [{"role": "user", "content": "word ".repeat(3000)}]});
    let reply = post(&proxy, "/v1/messages", &[], body.to_string()).await;
    assert_eq!(reply.status, 400);
    let error = reply.json();
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "invalid_request_error");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("prompt is too long: "), "{message}");
    assert!(message.ends_with(" tokens > 1000 maximum"), "{message}");
}

#[tokio::test]
async fn count_tokens_counts_what_the_model_will_see() {
    let mock = messages_mock::start().await;
    let proxy = proxy_for(&mock, 2000).await;
    let body = thinking_loop(8, 120);
    let reply = post(&proxy, "/v1/messages", &[], body.to_string()).await;
    assert_eq!(reply.header("x-compactor-compacted"), Some("true"));
    let mut count = body.clone();
    count.as_object_mut().unwrap().remove("max_tokens");
    let reply = post(
        &proxy,
        "/v1/messages/count_tokens?beta=true",
        &[],
        count.to_string(),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let counted = mock.counts().pop().unwrap();
    assert_eq!(counted.query.as_deref(), Some("beta=true"));
    assert!(
        counted.json().to_string().contains("SUMMARY-"),
        "the checkpoint applied"
    );
    let forwarded = mock.forwarded().pop().unwrap().json();
    assert_eq!(
        reply.json()["input_tokens"],
        json!(messages_mock::mock_tokens(&forwarded))
    );
}

#[tokio::test]
async fn bad_input_gets_a_400_in_anthropics_shape() {
    let mock = messages_mock::start().await;
    let proxy = proxy_for(&mock, 4096).await;
    let cases = [
        ("{\"model\": ", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        (r#"{"model": 7, "max_tokens": 1, "messages": []}"#, "model"),
        (
            r#"{"model": "m", "max_tokens": 1, "messages": "hi"}"#,
            "messages",
        ),
        (
            r#"{"model": "m", "max_tokens": "x", "messages": []}"#,
            "max_tokens",
        ),
        (
            r#"{"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "hologram"}]}]}"#,
            "content.0.type: unknown content block type",
        ),
        (
            r#"{"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "x"}]}]}"#,
            "toolu_9",
        ),
        (
            r#"{"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}"#,
            "text",
        ),
    ];
    for (body, mentions) in cases {
        for path in ["/v1/messages", "/v1/messages/count_tokens"] {
            let reply = post(&proxy, path, &[], body.to_string()).await;
            assert_eq!(reply.status, 400, "{path} {body}: {}", reply.body);
            let error = reply.json();
            assert_eq!(error["type"], "error", "{body}");
            assert_eq!(error["error"]["type"], "invalid_request_error", "{body}");
            let message = error["error"]["message"].as_str().unwrap();
            assert!(message.contains(mentions), "{body}: {message}");
        }
    }
    assert!(mock.forwarded().is_empty() && mock.counts().is_empty());
}

/// A Messages body nothing changes reaches the provider as the very bytes the client sent;
/// one whose context edits the proxy serves goes without them.
#[tokio::test]
async fn a_body_that_needs_no_change_reaches_the_provider_byte_for_byte() {
    let mock = messages_mock::start().await;
    let proxy = proxy_for(&mock, 100_000).await;
    let mut body = json!({
        "model": MODEL,
        "max_tokens": 256,
        "system": "be brief",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]
    });
    let pretty = serde_json::to_string_pretty(&body).unwrap();
    let reply = post(&proxy, "/v1/messages", &[], pretty.clone()).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(mock.forwarded().pop().unwrap().body, pretty.as_bytes());
    body["context_management"] = json!({"edits": [{"type": "clear_tool_uses_20250919"}]});
    let pretty = serde_json::to_string_pretty(&body).unwrap();
    let headers = [("anthropic-beta", "context-management-2025-06-27")];
    let reply = post(&proxy, "/v1/messages", &headers, pretty).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let sent = mock.forwarded().pop().unwrap().json();
    assert!(sent.get("context_management").is_none(), "{sent}");
    assert_eq!(sent["messages"], body["messages"]);
}

/// A Messages stream the provider leaves silent after its opening events ends with Anthropic's
/// own `error` event (the SDK raises it), once `stream_idle_timeout_ms` passes without a byte.
#[tokio::test]
async fn a_stream_left_silent_ends_with_anthropics_error_event() {
    let mock = messages_mock::start().await;
    let mut config = common::config("http://127.0.0.1:9/v1");
    config.anthropic_upstream = mock.url();
    config.stream_idle_timeout_ms = 300;
    let proxy = start_proxy(config).await;
    let body = json!({"model": "mock-stall-mid-stream", "max_tokens": 64, "stream": true,
                      "messages": [{"role": "user", "content": "Hello"}]});
    let response = reqwest::Client::new()
        .post(format!("{}/v1/messages", proxy.url()))
        .header("content-type", "application/json")
        .header("x-api-key", "sk-test")
        .header("anthropic-version", "2023-06-01")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let text = tokio::time::timeout(std::time::Duration::from_secs(10), response.text())
        .await
        .expect("the silent stream was ended")
        .unwrap();
    let events: Vec<&str> = text
        .split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .collect();
    let names: Vec<&str> = events
        .iter()
        .map(|e| e.lines().next().unwrap_or(""))
        .collect();
    assert_eq!(
        names,
        [
            "event: message_start",
            "event: content_block_start",
            "event: content_block_delta",
            "event: error"
        ],
        "{text}"
    );
    let data = events[3].strip_prefix("event: error\ndata: ").unwrap();
    let error: Value = serde_json::from_str(data).unwrap();
    assert_eq!(error["type"], "error", "{data}");
    assert_eq!(error["error"]["type"], "timeout_error", "{data}");
}
