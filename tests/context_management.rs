//! The context edits an Anthropic client asks for (`context_management`, beta
//! `context-management-2025-06-27`), through the proxy against a mock Messages provider that
//! knows nothing of them: served by Compactor (applied to the forwarded body, reported in the
//! answer's `context_management`, whole and streamed, and in `count_tokens`), stable from
//! request to request between clearings, refused in Anthropic's error shape when unknown, and
//! passed through untouched to a provider that serves them itself.
//!
//! The shapes are those of the `anthropic` SDK's types (`BetaContextManagementResponse`,
//! `BetaClearToolUses20250919EditResponse`, `BetaClearThinking20251015EditResponse`,
//! `BetaRawMessageDeltaEvent.context_management`, `BetaMessageTokensCount`); the requests and
//! answers of `tests/fixtures/anthropic/context-management/` are checked exactly.

mod common;

use common::messages_mock::{self, MessagesMock};
use common::{start_proxy, Proxy, Reply};
use compactor::config::ServerCompaction;
use serde_json::{json, Value};

const MODEL: &str = "claude-sonnet-4-5";
const BETA: &str = "context-management-2025-06-27";
const FIXTURES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/anthropic/context-management"
);

async fn proxy_for(mock: &MessagesMock, mode: ServerCompaction) -> Proxy {
    let mut config = mock.config_for(MODEL);
    config.messages.context_management = mode;
    start_proxy(config).await
}

async fn post(proxy: &Proxy, path: &str, body: &Value) -> Reply {
    let headers = [
        ("x-api-key", "sk-test"),
        ("content-type", "application/json"),
        ("anthropic-version", "2023-06-01"),
        (
            "anthropic-beta",
            "context-management-2025-06-27,interleaved-thinking-2025-05-14",
        ),
    ];
    common::post(
        &format!("{}{path}", proxy.url()),
        &headers,
        body.to_string(),
    )
    .await
}

fn fixture(name: &str) -> Value {
    let path = format!("{FIXTURES}/{name}");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap()
}

/// Checks `actual` against the recorded fixture `name`; with `RECORD_FIXTURES=1` in the
/// environment, records it instead (then read the file before committing it).
fn assert_fixture(name: &str, actual: &Value) {
    if std::env::var_os("RECORD_FIXTURES").is_some() {
        let path = format!("{FIXTURES}/{name}");
        std::fs::write(&path, serde_json::to_string_pretty(actual).unwrap() + "\n").unwrap();
    }
    assert_eq!(actual, &fixture(name), "{name}");
}

/// A tool loop of `steps` Read calls (each with reasoning), each result `filler` words long.
fn tool_loop(steps: usize, filler: usize) -> Vec<Value> {
    let mut messages = vec![json!({"role": "user", "content": "read the sources"})];
    for t in 0..steps {
        messages.push(json!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": format!("next file {t}"), "signature": format!("sig{t}")},
            {"type": "tool_use", "id": format!("toolu_{t}"), "name": if t == 1 { "Memory" } else { "Read" },
             "input": {"path": format!("src/f{t}.rs")}}]}));
        messages.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": format!("toolu_{t}"), "content": format!("fn f{t}() {{}} {}", "data ".repeat(filler))}]}));
        if t == 2 {
            // A new request: the assistant turn after it is another thinking turn.
            messages.push(json!({"role": "user", "content": "now the tests"}));
        }
    }
    messages
}

fn request(messages: &[Value], context_management: &Value) -> Value {
    json!({"model": MODEL, "max_tokens": 256, "system": "be brief",
           "context_management": context_management, "messages": messages})
}

#[tokio::test]
async fn edits_are_applied_to_the_forwarded_body_and_reported_in_the_answer() {
    let mock = messages_mock::start().await;
    let proxy = proxy_for(&mock, ServerCompaction::Auto).await;
    let body = request(&tool_loop(5, 60), &fixture("edits.json"));
    let reply = post(&proxy, "/v1/messages", &body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);

    let forwarded = mock.forwarded().pop().unwrap();
    assert_fixture("forwarded.json", &forwarded.json());
    assert!(forwarded.json().get("context_management").is_none());
    let betas: Vec<_> = forwarded.headers.get_all("anthropic-beta").iter().collect();
    assert_eq!(betas, ["interleaved-thinking-2025-05-14"]);

    let answer = reply.json();
    assert_fixture("applied-edits.json", &answer["context_management"]);
    assert_eq!(
        answer["content"][0]["text"], "Hello there",
        "the rest as it came"
    );
    // What the SDK's types hold, and nothing else.
    for edit in answer["context_management"]["applied_edits"]
        .as_array()
        .unwrap()
    {
        let mut keys: Vec<&str> = edit
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .collect();
        keys.sort();
        let expected = match edit["type"].as_str().unwrap() {
            "clear_tool_uses_20250919" => ["cleared_input_tokens", "cleared_tool_uses", "type"],
            "clear_thinking_20251015" => ["cleared_input_tokens", "cleared_thinking_turns", "type"],
            other => panic!("unexpected applied edit {other}"),
        };
        assert_eq!(keys, expected);
    }
}

#[tokio::test]
async fn a_streamed_answer_reports_them_in_its_message_delta() {
    let mock = messages_mock::start().await;
    let proxy = proxy_for(&mock, ServerCompaction::Auto).await;
    let mut body = request(&tool_loop(5, 60), &fixture("edits.json"));
    body["stream"] = json!(true);
    let reply = post(&proxy, "/v1/messages", &body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let events = reply.events();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    let delta = &events[4];
    assert_eq!(delta["context_management"], fixture("applied-edits.json"));
    assert_eq!(delta["usage"]["output_tokens"], 2);
    assert!(
        events
            .iter()
            .filter(|e| e.get("context_management").is_some())
            .count()
            == 1
    );
}

/// Each request of a growing tool loop forwards what the one before it did, byte for byte,
/// except where a clearing falls; and clearings are few.
#[tokio::test]
async fn the_forwarded_prefix_stays_the_same_between_clearings() {
    let mock = messages_mock::start().await;
    let proxy = proxy_for(&mock, ServerCompaction::Auto).await;
    let edits = json!({"edits": [{"type": "clear_tool_uses_20250919",
        "trigger": {"type": "input_tokens", "value": 1500},
        "keep": {"type": "tool_uses", "value": 2},
        "clear_at_least": {"type": "input_tokens", "value": 400}}]});
    let conversation = tool_loop(24, 100);
    let mut previous: Vec<Value> = vec![];
    let (mut clearings, mut reported) = (0, vec![]);
    let ends = (2..=conversation.len()).filter(|&end| conversation[end - 1]["role"] == "user");
    for end in ends {
        let reply = post(
            &proxy,
            "/v1/messages",
            &request(&conversation[..end], &edits),
        )
        .await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        let sent = mock.forwarded().pop().unwrap().json()["messages"]
            .as_array()
            .unwrap()
            .clone();
        if sent[..previous.len()] != previous[..] {
            clearings += 1;
        }
        assert!(messages_mock::mock_tokens(&json!({"messages": sent})) < 2_000);
        let applied = &reply.json()["context_management"]["applied_edits"];
        reported.push(
            applied
                .get(0)
                .map_or(0, |e| e["cleared_tool_uses"].as_u64().unwrap()),
        );
        previous = sent;
    }
    assert!((2..=6).contains(&clearings), "{clearings} clearings");
    assert!(reported.windows(2).all(|w| w[0] <= w[1]), "{reported:?}");
    assert!(*reported.last().unwrap() > 10, "{reported:?}");
}

#[tokio::test]
async fn thinking_is_kept_when_asked_to_keep_all() {
    let mock = messages_mock::start().await;
    let proxy = proxy_for(&mock, ServerCompaction::Auto).await;
    // What Claude Code sends.
    let edits = json!({"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]});
    let messages = tool_loop(3, 10);
    let reply = post(&proxy, "/v1/messages", &request(&messages, &edits)).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(
        reply.json()["context_management"],
        json!({"applied_edits": []})
    );
    let sent = mock.forwarded().pop().unwrap().json();
    assert_eq!(sent["messages"], json!(messages));
    assert!(sent.get("context_management").is_none());
}

#[tokio::test]
async fn count_tokens_counts_what_the_edits_leave() {
    let mock = messages_mock::start().await;
    let proxy = proxy_for(&mock, ServerCompaction::Auto).await;
    let mut body = request(&tool_loop(5, 60), &fixture("edits.json"));
    body.as_object_mut().unwrap().remove("max_tokens");
    let reply = post(&proxy, "/v1/messages/count_tokens", &body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let counted = mock.counts().pop().unwrap().json();
    assert_eq!(counted["messages"], fixture("forwarded.json")["messages"]);
    assert!(counted.get("context_management").is_none());
    let answer = reply.json();
    let input = answer["input_tokens"].as_u64().unwrap();
    assert_eq!(input, messages_mock::mock_tokens(&counted));
    let cleared: u64 = fixture("applied-edits.json")["applied_edits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["cleared_input_tokens"].as_u64().unwrap())
        .sum();
    assert_eq!(
        answer["context_management"],
        json!({"original_input_tokens": input + cleared})
    );
}

#[tokio::test]
async fn an_edit_compactor_does_not_know_is_refused_in_anthropics_shape() {
    let mock = messages_mock::start().await;
    let proxy = proxy_for(&mock, ServerCompaction::Auto).await;
    let cases = [
        (
            json!({"edits": [{"type": "clear_everything_20990101"}]}),
            "context_management.edits.0.type",
        ),
        (
            json!({"edits": [{"type": "clear_tool_uses_20250919", "keep": {"type": "input_tokens", "value": 3}}]}),
            "context_management.edits.0.keep",
        ),
        (
            json!({"edits": [{"type": "clear_tool_uses_20250919", "sometimes": true}]}),
            "context_management.edits.0.sometimes",
        ),
        (
            json!({"edits": [{"type": "clear_thinking_20251015"}, {"type": "clear_thinking_20251015"}]}),
            "context_management.edits.1.type",
        ),
        (
            json!({"edits": {"type": "clear_thinking_20251015"}}),
            "context_management.edits",
        ),
        (json!("clear"), "context_management"),
    ];
    for (edits, param) in cases {
        let reply = post(&proxy, "/v1/messages", &request(&tool_loop(1, 5), &edits)).await;
        assert_eq!(reply.status, 400, "{edits}: {}", reply.body);
        let error = reply.json();
        assert_eq!(error["type"], "error", "{}", reply.body);
        assert_eq!(error["error"]["type"], "invalid_request_error");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(param), "{message}");
    }
    let mut on_demand = request(&tool_loop(1, 5), &json!({"edits": []}));
    // An on-demand compaction of a kind Anthropic does not define either.
    on_demand["compaction"] = json!({"type": "everything"});
    let reply = post(&proxy, "/v1/messages", &on_demand).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert_eq!(reply.json()["error"]["type"], "invalid_request_error");
    let message = reply.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(message.starts_with("compaction.type"), "{message}");
    assert!(mock.forwarded().is_empty(), "nothing reached the provider");
}

#[tokio::test]
async fn a_provider_that_serves_them_gets_them_untouched() {
    let mock = messages_mock::start().await;
    let proxy = proxy_for(&mock, ServerCompaction::Passthrough).await;
    let edits = json!({"edits": [{"type": "clear_everything_20990101"}]});
    let body = request(&tool_loop(5, 60), &edits);
    let reply = post(&proxy, "/v1/messages", &body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let forwarded = mock.forwarded().pop().unwrap();
    assert_eq!(forwarded.json(), body);
    assert_eq!(
        forwarded.headers.get("anthropic-beta").unwrap(),
        "context-management-2025-06-27,interleaved-thinking-2025-05-14"
    );
    assert!(reply.json().get("context_management").is_none());
    assert_eq!(BETA, "context-management-2025-06-27");
}
