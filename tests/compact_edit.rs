//! Anthropic's `compact_20260112` context edit (beta `compact-2026-01-12`) through the proxy
//! against a mock Messages provider that knows nothing of it: under its trigger the request is
//! forwarded as sent; past it, with `pause_after_compaction: true`, the conversation is
//! summarized with the edit's instructions and answered with the `compaction` block alone
//! (`stop_reason: "compaction"`, the step in `usage.iterations`), a block that expands when it
//! comes back; without a pause, the model answers from the summary and the turn in progress,
//! and the block comes first in that answer (whole and streamed), with both steps in
//! `usage.iterations`. A compaction that cannot be made leaves the request served as it came.
//!
//! Shapes: the `anthropic` SDK's `BetaCompact20260112EditParam` (`trigger`, `instructions`,
//! `pause_after_compaction`), `BetaCompactionBlock` and `BetaCompactionIterationUsage`.

mod common;

use common::messages_mock::{self, MessagesMock};
use common::{start_proxy, Proxy, Reply};
use serde_json::{json, Value};

const MODEL: &str = "claude-sonnet-4-5";

async fn proxy_for(mock: &MessagesMock) -> Proxy {
    start_proxy(mock.config_for(MODEL)).await
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

/// Asserts `block` is a signed compaction block carrying the conversation's first summary.
fn assert_first_summary_block(block: &Value) {
    assert_eq!(block["type"], "compaction", "{block}");
    assert!(block["content"].as_str().unwrap().contains("SUMMARY-1"));
    assert!(block["signature"].is_string());
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
    assert_first_summary_block(&content[0]);
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
    let events = reply.events();
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
async fn a_malformed_edit_is_refused_in_anthropic_shape() {
    let mock = messages_mock::start().await;
    let proxy = proxy_for(&mock).await;
    let mut bad_trigger = compact(100, true);
    bad_trigger["trigger"] = json!({"type": "tool_uses", "value": 3});
    let mut bad_pause = compact(100, true);
    bad_pause["pause_after_compaction"] = json!("yes");
    let cases = [
        (with_edit(bad_trigger, false), "trigger"),
        (with_edit(bad_pause, false), "pause_after_compaction"),
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

#[tokio::test]
async fn without_a_pause_the_model_answers_from_the_summary_after_the_block() {
    let mock = messages_mock::start().await;
    let proxy = proxy_for(&mock).await;
    let reply = post(&proxy, &with_edit(compact(100, false), false)).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let checkpoint = reply.header("x-compactor-checkpoint").unwrap().to_string();
    let answer = reply.json();
    let content = answer["content"].as_array().unwrap();
    assert_eq!(
        content.len(),
        2,
        "the block, then the model's text: {content:?}"
    );
    assert_first_summary_block(&content[0]);
    assert_eq!(content[1]["type"], "text");
    assert_ne!(answer["stop_reason"], "compaction");
    let steps = answer["usage"]["iterations"].as_array().unwrap();
    assert_eq!(steps.len(), 2, "{steps:?}");
    assert_eq!(steps[0]["type"], "compaction");
    assert!(steps[0]["input_tokens"].as_u64().unwrap() > 100);
    assert_eq!(steps[1]["type"], "message");
    assert_eq!(steps[1]["input_tokens"], answer["usage"]["input_tokens"]);

    // The model was asked from the summary and the turn in progress, the edit taken off.
    let sent = mock.forwarded().pop().unwrap().json();
    let messages = sent["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert_eq!(messages[0]["content"][0]["text"], content[0]["content"]);
    assert_eq!(
        messages[1],
        json!({"role": "user", "content": "what next?"})
    );
    assert_eq!(sent["system"], "be brief");
    assert!(!sent.to_string().contains("compact_20260112"));
    assert_eq!(mock.summaries().len(), 1);

    // The client keeps the answer whole: the block first, the text after it.
    let next = json!({"model": MODEL, "max_tokens": 512,
        "context_management": {"edits": [compact(100_000, false)]},
        "messages": [{"role": "assistant", "content": content},
                     {"role": "user", "content": "go on"}]});
    let reply = post(&proxy, &next).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(
        reply.header("x-compactor-checkpoint"),
        Some(checkpoint.as_str())
    );
    let sent = mock.forwarded().pop().unwrap().json();
    let messages = sent["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 3, "{messages:?}");
    assert_eq!(messages[0]["content"][0]["text"], content[0]["content"]);
    assert_eq!(messages[1]["role"], "assistant");
    assert_eq!(messages[1]["content"], json!([content[1]]));

    // Or the whole history with the answer appended, as Anthropic also takes it: what the
    // block stands for is left out.
    let mut history = conversation();
    history.push(json!({"role": "assistant", "content": content}));
    history.push(json!({"role": "user", "content": "go on"}));
    let whole = json!({"model": MODEL, "max_tokens": 512, "system": "be brief",
        "context_management": {"edits": [compact(100_000, false)]}, "messages": history});
    let reply = post(&proxy, &whole).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let resent = mock.forwarded().pop().unwrap().json();
    assert_eq!(resent["messages"], sent["messages"]);
    assert_eq!(mock.summaries().len(), 1, "no second summary");
}

#[tokio::test]
async fn a_streamed_answer_without_a_pause_opens_with_the_block_events() {
    let mock = messages_mock::start().await;
    let proxy = proxy_for(&mock).await;
    let reply = post(&proxy, &with_edit(compact(100, false), true)).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let events = reply.events();
    assert_eq!(events[0]["type"], "message_start");
    assert_eq!(events[1]["type"], "content_block_start");
    assert_eq!(events[1]["index"], 0);
    assert_eq!(events[1]["content_block"]["type"], "compaction");
    assert!(events[1]["content_block"]["signature"].is_string());
    assert_eq!(events[2]["delta"]["type"], "compaction_delta");
    assert!(events[2]["delta"]["content"]
        .as_str()
        .unwrap()
        .contains("SUMMARY-1"));
    assert_eq!(events[3]["type"], "content_block_stop");
    assert_eq!(events[3]["index"], 0);
    // Every block of the model's own answer moved one place on.
    let model_indexes: Vec<u64> = events[4..]
        .iter()
        .filter_map(|e| e["index"].as_u64())
        .collect();
    assert!(!model_indexes.is_empty());
    assert!(model_indexes.iter().all(|&i| i >= 1), "{model_indexes:?}");
    let delta = events
        .iter()
        .find(|e| e["type"] == "message_delta")
        .expect("a message_delta");
    assert_ne!(delta["delta"]["stop_reason"], "compaction");
    let steps = delta["usage"]["iterations"].as_array().unwrap();
    assert_eq!(steps[0]["type"], "compaction");
    assert_eq!(steps[1]["type"], "message");
    assert!(steps[1]["input_tokens"].as_u64().unwrap() > 0);
    assert_eq!(events.last().unwrap()["type"], "message_stop");
    assert_eq!(mock.forwarded().len(), 1);
}

#[tokio::test]
async fn a_compaction_that_cannot_be_made_leaves_the_request_served_as_it_came() {
    let mock = messages_mock::start().await;
    let mut config = mock.config_for(MODEL);
    // No summarizer answers there.
    config.summarizer.upstream = "http://127.0.0.1:9".into();
    let proxy = start_proxy(config).await;

    let reply = post(&proxy, &with_edit(compact(100, false), false)).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(reply
        .header("x-compactor-compaction")
        .unwrap_or_default()
        .starts_with("failed"));
    let answer = reply.json();
    assert_eq!(answer["content"][0]["type"], "text", "no block: {answer}");
    let sent = mock.forwarded().pop().unwrap().json();
    assert_eq!(sent["messages"].as_array().unwrap().len(), 9, "all of it");

    // Pausing has nothing else to answer with: Anthropic's retryable refusal.
    let reply = post(&proxy, &with_edit(compact(100, true), false)).await;
    assert_eq!(reply.status, 529, "{}", reply.body);
    let error = reply.json();
    assert_eq!(error["error"]["type"], "overloaded_error");
    assert_eq!(
        error["error"]["details"]["error_code"],
        "compaction_unavailable"
    );
}
