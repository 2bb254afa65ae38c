//! The Responses API's own context management (`context_management: [{"type": "compaction",
//! "compact_threshold": N}]`) through the proxy against a mock provider that knows nothing of
//! it: past its threshold the input is compacted into a sealed `compaction` item, which comes
//! first in the answer's `output` (whole and streamed, with `response.compaction.compacting`),
//! and which later stands for everything before it; under it the field is only taken off; an
//! unknown entry is refused in OpenAI's shape; a provider that serves it gets it untouched.
//!
//! Shapes: the `openai` SDK's `ResponseCompactionItem` (`id`, `encrypted_content`,
//! `type: "compaction"`) and `ResponseCompactionCompactingEvent` (`item_id`, `output_index`,
//! `sequence_number`, `type`); the request's `context_management` is recorded in
//! `tests/fixtures/codex/context-management.json`.

mod common;

use common::responses_mock::{start_responses_mock, ResponsesMock};
use common::{config, start_proxy, Proxy, Reply};
use compactor::config::ServerCompaction;
use serde_json::{json, Value};

const MODEL: &str = "mock-responses";
const KEY: &str = "Bearer sk-alice";

async fn proxy_for(mock: &ResponsesMock, mode: ServerCompaction) -> Proxy {
    let mut c = config(&mock.url());
    c.responses.server_compaction = mode;
    // Compactor's own compaction never starts here: only the client's threshold counts.
    c.windows.insert(MODEL.into(), 1_000_000);
    c.summarizer.window = 100_000;
    start_proxy(c).await
}

async fn post(proxy: &Proxy, body: &Value) -> Reply {
    let headers = [("authorization", KEY), ("content-type", "application/json")];
    let url = format!("{}/v1/responses", proxy.url());
    common::post(&url, &headers, body.to_string()).await
}

fn user(text: &str) -> Value {
    json!({"type":"message","role":"user","content":[{"type":"input_text","text":text}]})
}

/// A thread of `turns` turns, each a user request, a call and its long output, an answer.
fn thread(turns: usize) -> Vec<Value> {
    let mut items = vec![
        json!({"type":"message","role":"developer","content":[{"type":"input_text","text":"You are a coding agent."}]}),
    ];
    for t in 0..turns {
        items.push(user(&format!("turn {t}: look at f{t}")));
        items.push(json!({"type":"function_call","call_id":format!("call_{t}"),"name":"exec_command","arguments":format!("{{\"cmd\":\"cat f{t}\"}}")}));
        items.push(json!({"type":"function_call_output","call_id":format!("call_{t}"),"output":format!("line {t} ").repeat(60)}));
        items.push(json!({"type":"message","role":"assistant","content":[{"type":"output_text","text":format!("done {t}"),"annotations":[]}]}));
    }
    items.push(user("and the next one?"));
    items
}

fn context_management() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/codex/context-management.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn body(input: &[Value], stream: bool) -> Value {
    json!({"model": MODEL, "stream": stream, "store": false, "input": input,
           "context_management": context_management()})
}

fn assert_compaction_item(item: &Value) {
    let mut keys: Vec<&str> = item
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    keys.sort();
    assert_eq!(keys, ["encrypted_content", "id", "type"], "{item}");
    assert_eq!(item["type"], "compaction");
}

#[tokio::test]
async fn past_the_threshold_the_answer_opens_with_a_compaction_item_that_stands_for_the_past() {
    let mock = start_responses_mock().await;
    let proxy = proxy_for(&mock, ServerCompaction::Auto).await;
    let input = thread(8);
    let reply = post(&proxy, &body(&input, false)).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let output = reply.json()["output"].as_array().unwrap().clone();
    assert_eq!(output.len(), 2, "{output:?}");
    assert_compaction_item(&output[0]);
    assert_eq!(output[1]["type"], "message");
    assert_eq!(mock.summaries().len(), 1);
    // The answer names the checkpoint it stands on, as every compacted answer does.
    let checkpoint = reply.header("x-compactor-checkpoint");
    assert!(
        checkpoint.is_some_and(|id| id.len() == 24),
        "{checkpoint:?}"
    );

    // The model answered from the compacted input: instructions, summary, the turn in progress.
    let sent = mock.turns().pop().unwrap().json();
    assert!(sent.get("context_management").is_none());
    let sent_input = sent["input"].as_array().unwrap();
    assert_eq!(sent_input.len(), 3, "{sent_input:?}");
    assert_eq!(sent_input[0], input[0]);
    assert!(sent_input[1]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("SUMMARY-1"));
    assert_eq!(sent_input[2], *input.last().unwrap());

    // The client appends the output and a new request, as with OpenAI's API: what came before
    // the item is left out, the item expands to its summary, and under the threshold now no
    // summary is written.
    let mut next = input.clone();
    next.extend(output.iter().cloned());
    next.push(user("thanks, go on"));
    let reply = post(&proxy, &body(&next, false)).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.json()["output"].as_array().unwrap().len(), 1);
    let sent = mock.turns().pop().unwrap().json();
    let sent_input = sent["input"].as_array().unwrap();
    assert_eq!(sent_input.len(), 4, "{sent_input:?}");
    assert_eq!(sent_input[0], input[0]);
    assert!(sent_input[1]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("SUMMARY-1"));
    assert_eq!(sent_input[2], output[1]);
    assert_eq!(sent_input[3], user("thanks, go on"));
    assert_eq!(mock.summaries().len(), 1, "no second summary");
}

#[tokio::test]
async fn a_streamed_answer_carries_the_item_and_its_events_first() {
    let mock = start_responses_mock().await;
    let proxy = proxy_for(&mock, ServerCompaction::Auto).await;
    let reply = post(&proxy, &body(&thread(8), true)).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let events = reply.events();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.output_item.added",
            "response.compaction.compacting",
            "response.output_item.done",
            "response.output_item.added",
            "response.output_text.delta",
            "response.output_item.done",
            "response.completed"
        ]
    );
    let item = &events[1]["item"];
    assert_compaction_item(item);
    assert_eq!(events[3]["item"], *item);
    let compacting = &events[2];
    let mut keys: Vec<&str> = compacting
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    keys.sort();
    assert_eq!(keys, ["item_id", "output_index", "sequence_number", "type"]);
    assert_eq!(compacting["item_id"], item["id"]);
    let places: Vec<u64> = events[1..7]
        .iter()
        .map(|e| e["output_index"].as_u64().unwrap())
        .collect();
    assert_eq!(places, [0, 0, 0, 1, 1, 1], "the answer moves one place on");
    let completed = events[7]["response"]["output"].as_array().unwrap();
    assert_eq!(completed[0], *item);
    assert_eq!(completed[1]["type"], "message");
}

#[tokio::test]
async fn under_the_threshold_only_the_field_is_taken_off() {
    let mock = start_responses_mock().await;
    let proxy = proxy_for(&mock, ServerCompaction::Auto).await;
    let input = thread(1);
    let reply = post(&proxy, &body(&input, false)).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.json()["output"].as_array().unwrap().len(), 1);
    let sent = mock.turns().pop().unwrap().json();
    assert_eq!(sent["input"], json!(input));
    assert!(sent.get("context_management").is_none());
    assert!(mock.summaries().is_empty());
}

#[tokio::test]
async fn an_entry_compactor_does_not_know_is_refused_in_openais_shape() {
    let mock = start_responses_mock().await;
    let proxy = proxy_for(&mock, ServerCompaction::Auto).await;
    let mut request = body(&thread(1), false);
    request["context_management"] = json!([{"type": "truncation", "compact_threshold": 10}]);
    let reply = post(&proxy, &request).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    let error = &reply.json()["error"];
    assert_eq!(error["type"], "invalid_request_error");
    assert_eq!(error["param"], "context_management[0].type");
    assert!(mock.turns().is_empty());
}

#[tokio::test]
async fn a_provider_that_serves_it_gets_it_untouched() {
    let mock = start_responses_mock().await;
    let proxy = proxy_for(&mock, ServerCompaction::Passthrough).await;
    let request = body(&thread(8), false);
    let reply = post(&proxy, &request).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(mock.turns().pop().unwrap().json(), request);
    assert!(mock.summaries().is_empty());
}
