//! Anthropic's `compact_20260112` context edit (beta `compact-2026-01-12`) through the proxy
//! against a mock Messages provider that knows nothing of it: under its trigger the request is
//! forwarded as sent; past it, with `pause_after_compaction: true`, the conversation is
//! summarized with the edit's instructions and answered with the `compaction` block alone
//! (`stop_reason: "compaction"`, the step in `usage.iterations`), a block that expands when it
//! comes back. Compacting and sampling in one answer is refused, not dropped.
//!
//! Shapes: the `anthropic` SDK's `BetaCompact20260112EditParam` (`trigger`, `instructions`,
//! `pause_after_compaction`), `BetaCompactionBlock` and `BetaCompactionIterationUsage`.

mod common;

use common::messages_mock::{self, MessagesMock};
use common::{start_proxy, Proxy, Reply};
use serde_json::{json, Value};

const MODEL: &str = "claude-sonnet-4-5";

async fn proxy_for(mock: &MessagesMock) -> Proxy {
    let mut config = common::config("http://127.0.0.1:9/v1");
    config.anthropic_upstream = mock.url();
    config.windows.insert(MODEL.to_string(), 1_000_000);
    config.summarizer.window = 100_000;
    start_proxy(config).await
}

async fn post(proxy: &Proxy, body: &Value) -> Reply {
    let headers = [
        ("x-api-key", "sk-test"),
        ("content-type", "application/json"),
        ("anthropic-beta", "compact-2026-01-12"),
    ];
    let url = format!("{}/v1/messages", proxy.url());
    common::post(&url, &headers, body.to_string()).await
}

fn conversation() -> Vec<Value> {
    let mut messages = vec![];
    for t in 0..4 {
        messages.push(json!({"role": "user", "content": format!("step {t}: edit src/f{t}.rs")}));
        messages.push(
            json!({"role": "assistant", "content": format!("edited f{t}: {}", "ok ".repeat(60))}),
        );
    }
    messages.push(json!({"role": "user", "content": "what next?"}));
    messages
}

fn with_edit(edit: Value, stream: bool) -> Value {
    json!({"model": MODEL, "max_tokens": 512, "stream": stream, "system": "be brief",
           "context_management": {"edits": [edit]}, "messages": conversation()})
}

fn compact(trigger: u64, pause: bool) -> Value {
    json!({"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": trigger},
           "instructions": "Keep every file name.", "pause_after_compaction": pause})
}

#[tokio::test]
async fn past_its_trigger_the_edit_pauses_with_the_block_and_its_usage() {
    let mock = messages_mock::start().await;
    let proxy = proxy_for(&mock).await;
    let reply = post(&proxy, &with_edit(compact(100, true), false)).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let answer = reply.json();
    assert_eq!(answer["stop_reason"], "compaction");
    let content = answer["content"].as_array().unwrap();
    assert_eq!(content.len(), 1, "the block alone: {content:?}");
    assert_eq!(content[0]["type"], "compaction");
    assert!(content[0]["content"]
        .as_str()
        .unwrap()
        .contains("SUMMARY-1"));
    assert!(content[0]["signature"].is_string());
    let step = &answer["usage"]["iterations"][0];
    assert_eq!(step["type"], "compaction");
    assert!(step["input_tokens"].as_u64().unwrap() > 100);
    assert!(step["output_tokens"].as_u64().unwrap() > 0);
    assert!(
        mock.forwarded().is_empty(),
        "nothing sampled after the block"
    );
    let summaries = mock.summaries();
    assert_eq!(summaries.len(), 1);
    assert!(summaries[0]
        .json()
        .to_string()
        .contains("Keep every file name."));

    // The block sent back opens the next request and is expanded into the summary.
    let next = json!({"model": MODEL, "max_tokens": 512,
        "context_management": {"edits": [compact(100_000, true)]},
        "messages": [{"role": "assistant", "content": [content[0]]},
                     {"role": "user", "content": "go on"}]});
    let reply = post(&proxy, &next).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let sent = mock.forwarded().pop().unwrap().json();
    assert_eq!(
        sent["messages"][0]["content"][0]["text"],
        content[0]["content"]
    );
    assert!(!sent.to_string().contains("compact_20260112"));
}

#[tokio::test]
async fn a_streamed_pause_sends_the_block_events_and_the_step_usage() {
    let mock = messages_mock::start().await;
    let proxy = proxy_for(&mock).await;
    let reply = post(&proxy, &with_edit(compact(100, true), true)).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let events: Vec<Value> = reply
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(events[1]["content_block"]["type"], "compaction");
    assert_eq!(events[2]["delta"]["type"], "compaction_delta");
    assert_eq!(events[4]["delta"]["stop_reason"], "compaction");
    assert_eq!(events[4]["usage"]["iterations"][0]["type"], "compaction");
}

#[tokio::test]
async fn under_its_trigger_the_request_is_forwarded_without_the_edit() {
    let mock = messages_mock::start().await;
    let proxy = proxy_for(&mock).await;
    let reply = post(&proxy, &with_edit(compact(1_000_000, true), false)).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_ne!(reply.json()["stop_reason"], "compaction");
    assert!(mock.summaries().is_empty());
    let sent = mock.forwarded().pop().unwrap().json();
    assert_eq!(sent["messages"].as_array().unwrap().len(), 9);
    assert!(!sent.to_string().contains("compact_20260112"));
}

#[tokio::test]
async fn a_malformed_edit_or_an_unserved_mode_is_refused_in_anthropic_shape() {
    let mock = messages_mock::start().await;
    let proxy = proxy_for(&mock).await;
    let mut bad_trigger = compact(100, true);
    bad_trigger["trigger"] = json!({"type": "tool_uses", "value": 3});
    let mut bad_pause = compact(100, true);
    bad_pause["pause_after_compaction"] = json!("yes");
    let cases = [
        (with_edit(bad_trigger, false), "trigger"),
        (with_edit(bad_pause, false), "pause_after_compaction"),
        (
            with_edit(compact(100, false), false),
            "pause_after_compaction: true",
        ),
    ];
    for (body, words) in cases {
        let reply = post(&proxy, &body).await;
        assert_eq!(reply.status, 400, "{}", reply.body);
        let error = reply.json();
        assert_eq!(error["type"], "error");
        assert_eq!(error["error"]["type"], "invalid_request_error");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains(words), "{message}");
    }
    assert!(mock.forwarded().is_empty());
}
