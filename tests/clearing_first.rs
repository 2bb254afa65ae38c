//! Old tool output cleared before anything is summarized, through the proxy against mock
//! Messages and chat completions providers: a tool-heavy conversation that nears its budget is
//! forwarded with its oldest results stubbed and no summary asked for, the next request (on this
//! replica or another on the same store) is forwarded with the same bytes up to its new turns,
//! a conversation that clearing cannot bring under its budget is summarized, and one tenant's
//! checkpoint never serves another.

mod common;

use common::messages_mock::{self, MessagesMock, Received};
use std::sync::Arc;

use common::{start_proxy, Proxy, Reply};
use compactor::store::{memory::MemoryStore, CheckpointStore};
use serde_json::{json, Value};

const MODEL: &str = "qwen2.5-coder-0.5b";
const WINDOW: u64 = 4000;

async fn proxy_for(mock: &MessagesMock, clear_first: bool) -> Proxy {
    proxy_clearing_from(mock, clear_first, 0.5).await
}

/// A proxy that clears first when `clear_first`, a clearing being made only when it frees at
/// least `min_share` of what a summary would.
async fn proxy_clearing_from(mock: &MessagesMock, clear_first: bool, min_share: f64) -> Proxy {
    let mut config = common::config("http://127.0.0.1:9/v1");
    config.compaction.clear_min_share = min_share;
    config.anthropic_upstream = mock.url();
    config.windows.insert(MODEL.to_string(), WINDOW);
    config.compaction.keep_recent_tokens = WINDOW / 3;
    config.compaction.clear_tool_results_first = clear_first;
    config.summarizer.window = 100_000;
    start_proxy(config).await
}

async fn post(proxy: &Proxy, key: &str, body: &Value) -> Reply {
    let headers = [
        ("x-api-key", key),
        ("content-type", "application/json"),
        ("anthropic-version", "2023-06-01"),
    ];
    common::post(
        &format!("{}/v1/messages", proxy.url()),
        &headers,
        body.to_string(),
    )
    .await
}

/// A user request, then `steps` Read calls, each result about `words` tokens long.
fn tool_loop(steps: usize, words: usize) -> Vec<Value> {
    let mut messages = vec![json!({"role": "user", "content": "read every source file"})];
    for t in 0..steps {
        messages.push(json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": format!("toolu_{t}"), "name": "Read",
             "input": {"path": format!("src/f{t}.rs")}}]}));
        messages.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": format!("toolu_{t}"),
             "content": format!("fn f{t}() {{}} {}", "data ".repeat(words))}]}));
    }
    messages
}

fn request(messages: &[Value]) -> Value {
    json!({"model": MODEL, "max_tokens": 256, "system": "be brief", "messages": messages})
}

/// The text of the tool result of step `t` in a forwarded body.
fn result_text(body: &Value, t: usize) -> String {
    let content = &body["messages"][2 + 2 * t]["content"][0]["content"];
    match content {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[tokio::test]
async fn old_tool_results_are_cleared_instead_of_summarized_and_stay_cleared() {
    let mock = messages_mock::start().await;
    let proxy = proxy_for(&mock, true).await;
    let steps = 8;
    let mut messages = tool_loop(steps, 600);
    let first = request(&messages);
    let reply = post(&proxy, "sk-a", &first).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(mock.summaries().is_empty(), "no summary asked for");

    let forwarded = mock.forwarded()[0].json();
    assert_eq!(
        forwarded["messages"].as_array().unwrap().len(),
        messages.len()
    );
    let stubbed: Vec<usize> = (0..steps)
        .filter(|&t| result_text(&forwarded, t).contains("cleared to save context"))
        .collect();
    assert!(!stubbed.is_empty(), "old results stubbed: {forwarded}");
    assert_eq!(
        stubbed,
        (0..stubbed.len()).collect::<Vec<_>>(),
        "oldest first"
    );
    let stub = result_text(&forwarded, 0);
    assert!(stub.contains("Read") && stub.contains("tokens"), "{stub}");
    assert!(!stub.contains("data data"), "{stub}");
    // The call and its arguments stay.
    assert_eq!(forwarded["messages"][1], messages[1]);
    // The newest steps reach the model whole.
    for t in steps - 3..steps {
        assert_eq!(
            forwarded["messages"][2 + 2 * t],
            messages[2 + 2 * t],
            "step {t}"
        );
    }

    // The next step: the same clearing, byte for byte, and still no summary.
    messages.push(json!({"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_next", "name": "Read", "input": {"path": "src/g.rs"}}]}));
    messages.push(json!({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_next", "content": "fn g() {}"}]}));
    let reply = post(&proxy, "sk-a", &request(&messages)).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(mock.summaries().is_empty(), "still no summary");
    let all = mock.forwarded();
    let (before, after) = (all[0].raw_messages(), all[1].raw_messages());
    assert_eq!(after[..before.len()], before[..], "byte-stable prefix");
    assert_eq!(after.len(), before.len() + 2);
}

#[tokio::test]
async fn another_replica_on_the_same_store_clears_the_same_way() {
    let mock = messages_mock::start().await;
    let store: Arc<dyn CheckpointStore> = Arc::new(MemoryStore::default());
    let replica = || {
        let mut config = common::config("http://127.0.0.1:9/v1");
        config.anthropic_upstream = mock.url();
        config.windows.insert(MODEL.to_string(), WINDOW);
        config.compaction.keep_recent_tokens = WINDOW / 3;
        config.compaction.clear_tool_results_first = true;
        config.summarizer.window = 100_000;
        common::start_proxy_with_store(config, store.clone())
    };
    let (one, two) = (replica().await, replica().await);
    let mut messages = tool_loop(8, 600);
    assert_eq!(post(&one, "sk-a", &request(&messages)).await.status, 200);
    messages.extend(tool_loop(1, 5).into_iter().skip(1).map(|mut m| {
        if let Some(block) = m["content"][0].as_object_mut() {
            for key in ["id", "tool_use_id"] {
                if block.contains_key(key) {
                    block.insert(key.into(), json!("toolu_other"));
                }
            }
        }
        m
    }));
    assert_eq!(post(&two, "sk-a", &request(&messages)).await.status, 200);
    let all = mock.forwarded();
    let (before, after) = (all[0].raw_messages(), all[1].raw_messages());
    assert!(before.iter().any(|m| m.contains("cleared to save context")));
    assert_eq!(after[..before.len()], before[..]);
    assert!(mock.summaries().is_empty());
}

#[tokio::test]
async fn without_clearing_first_the_same_conversation_is_summarized() {
    let mock = messages_mock::start().await;
    let proxy = proxy_for(&mock, false).await;
    let reply = post(&proxy, "sk-a", &request(&tool_loop(8, 600))).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    common::eventually("a summary", async || !mock.summaries().is_empty()).await;
    assert!(!mock.forwarded()[0]
        .json()
        .to_string()
        .contains("cleared to save context"));
}

/// A conversation whose weight is in what the user pasted, not in tool output.
fn pasted_loop() -> Vec<Value> {
    let mut messages = vec![
        json!({"role": "user", "content": format!("here is the log {}", "line ".repeat(2500))}),
    ];
    messages.extend(tool_loop(3, 400).into_iter().skip(1));
    messages
}

/// Sends `conversation` once through a proxy clearing first with `min_share`; whether a summary
/// was written, and whether the forwarded request carries cleared results.
async fn summarized_and_cleared(conversation: &Value, min_share: f64) -> (bool, bool) {
    let mock = messages_mock::start().await;
    let proxy = proxy_clearing_from(&mock, true, min_share).await;
    let reply = post(&proxy, "sk-a", conversation).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let cleared = mock.forwarded()[0]
        .json()
        .to_string()
        .contains("cleared to save context");
    (!mock.summaries().is_empty(), cleared)
}

#[tokio::test]
async fn a_conversation_clearing_cannot_bring_under_is_summarized() {
    let outcome = summarized_and_cleared(&request(&pasted_loop()), 0.5).await;
    assert_eq!(outcome, (true, false), "summarized, nothing cleared");
}

/// Long prose first, then a tool loop whose old results weigh little: clearing them is enough to
/// bring the request under its limit, but frees far less than a summary would.
fn prose_then_small_results() -> Vec<Value> {
    let mut messages = vec![
        json!({"role": "user", "content": format!("the design {}", "word ".repeat(1300))}),
        json!({"role": "assistant", "content": format!("my reading {}", "note ".repeat(1300))}),
    ];
    messages.extend(tool_loop(6, 150));
    messages
}

#[tokio::test]
async fn a_clearing_that_frees_much_less_than_a_summary_would_gives_way_to_one() {
    let conversation = request(&prose_then_small_results());
    // With no floor, clearing alone is enough here: the oldest results are stubbed.
    let outcome = summarized_and_cleared(&conversation, 0.0).await;
    assert_eq!(outcome, (false, true), "cleared, not summarized");
    // With the default floor, what clearing frees is weighed against what a summary frees.
    let outcome = summarized_and_cleared(&conversation, 0.5).await;
    assert_eq!(outcome, (true, false), "summarized, nothing cleared");
}

#[tokio::test]
async fn one_tenants_checkpoint_never_serves_another() {
    let mock = messages_mock::start().await;
    let proxy = proxy_for(&mock, true).await;
    let body = request(&pasted_loop());
    assert_eq!(post(&proxy, "sk-a", &body).await.status, 200);
    let after_a = mock.summaries().len();
    assert!(after_a > 0);
    // The same conversation from another tenant is summarized for that tenant, not served
    // tenant A's checkpoint.
    assert_eq!(post(&proxy, "sk-b", &body).await.status, 200);
    assert!(
        mock.summaries().len() > after_a,
        "tenant B got its own summary"
    );
    // And tenant A's next request reuses its own.
    let summaries = mock.summaries().len();
    assert_eq!(post(&proxy, "sk-a", &body).await.status, 200);
    assert_eq!(mock.summaries().len(), summaries);
}

#[tokio::test]
async fn chat_completions_tool_results_are_cleared_first_too() {
    let mock = common::start_mock().await;
    let mut config = common::config(&mock.url());
    config.windows.insert(MODEL.to_string(), WINDOW);
    config.compaction.keep_recent_tokens = WINDOW / 3;
    config.compaction.clear_tool_results_first = true;
    config.summarizer.window = 100_000;
    let proxy = start_proxy(config).await;
    let mut messages = vec![
        json!({"role": "system", "content": "be brief"}),
        json!({"role": "user", "content": "read every source file"}),
    ];
    for t in 0..8 {
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": format!("call_{t}"), "type": "function",
             "function": {"name": "read", "arguments": format!("{{\"path\":\"src/f{t}.rs\"}}")}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": format!("call_{t}"),
            "content": format!("fn f{t}() {{}} {}", "data ".repeat(600))}));
    }
    let body = json!({"model": MODEL, "max_tokens": 256, "messages": messages});
    common::post_chat(&proxy, "sk-a", &body).await;
    assert!(mock.summaries().is_empty(), "no summary asked for");
    let forwarded = mock.chats()[0].json();
    let sent = forwarded["messages"].as_array().unwrap();
    assert_eq!(sent.len(), messages.len());
    let stub = sent[3]["content"].as_str().unwrap();
    assert!(stub.contains("result of read cleared"), "{stub}");
    assert_eq!(sent[2], messages[2], "the call stays");
    assert_eq!(sent[17], messages[17], "the newest result stays whole");
}

#[tokio::test]
async fn a_summary_after_a_clearing_continues_the_prompt_as_it_was_forwarded() {
    let mock = messages_mock::start().await;
    let mut config = common::config("http://127.0.0.1:9/v1");
    config.anthropic_upstream = mock.url();
    // A window the prefix and the summary's own budget fit in beside each other, written ahead
    // of time at the soft threshold (at the limit they rarely do).
    config.windows.insert(MODEL.to_string(), 4 * WINDOW);
    config.compaction.ahead_of_time = true;
    config.compaction.clear_tool_results_first = true;
    config.summarizer.window = 100_000;
    config.summarizer.continue_conversation = compactor::config::ContinueConversation::Always;
    let proxy = start_proxy(config).await;
    // Each step explains itself, so clearing old results frees less and less until only a
    // summary helps.
    let mut session = tool_loop(0, 0);
    for steps in 0..100 {
        session.push(json!({"role": "assistant", "content": [
            {"type": "text", "text": format!("step {steps}: {}", "because ".repeat(200))},
            {"type": "tool_use", "id": format!("toolu_{steps}"), "name": "Read",
             "input": {"path": format!("src/f{steps}.rs")}}]}));
        session.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": format!("toolu_{steps}"),
             "content": format!("fn f{steps}() {{}} {}", "data ".repeat(300))}]}));
        let reply = post(&proxy, "sk-a", &request(&session)).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        // Summaries made ahead of time finish between the agent's steps.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        if !mock.summaries().is_empty() {
            break;
        }
    }
    let summaries = mock.summaries();
    assert!(!summaries.is_empty(), "a summary was written");
    let asked = summaries[0].json();
    let messages = asked["messages"].as_array().unwrap();
    let prefix = messages.len() - 1;
    assert!(prefix >= 3, "a continuation");
    // The conversation exactly as a request forwarded before it: its oldest results stubbed.
    let forwarded: Vec<Value> = mock.forwarded().iter().map(Received::json).collect();
    let before = forwarded
        .iter()
        .find(|f| {
            let sent = f["messages"].as_array().unwrap();
            sent.len() >= prefix && sent[..prefix] == messages[..prefix]
        })
        .expect("the prefix of a forwarded request");
    assert!(
        result_text(before, 0).contains("cleared to save context"),
        "a clearing came first"
    );
    assert_eq!(asked["system"], before["system"]);
    assert_eq!(asked["stream"], false);
    let closing = &messages[prefix]["content"][0];
    let text = closing["text"].as_str().unwrap();
    assert!(text.contains("about to be replaced by a summary"), "{text}");
    assert!(
        !text.contains("opens with a summary"),
        "a clearing is no summary"
    );
    assert_eq!(closing["cache_control"], json!({"type": "ephemeral"}));
    assert_eq!(
        summaries[0].headers.get("anthropic-version").unwrap(),
        "2023-06-01"
    );
}
