//! `/v1/responses` end to end against a mock Responses provider: Codex-style threads past the
//! window, the three ways a provider says the window is full, the error a client sees when
//! nothing helps, server-held state, bad input, compaction the client asks for (answered with
//! sealed items that expand when they come back), and the recorded Codex sequences in
//! `tests/fixtures/codex/`.

mod common;

use common::responses_mock::{start_responses_mock, Overflow, ResponsesMock};
use common::{client, config, start_proxy, Proxy, Reply};
use serde_json::{json, Value};

const MODEL: &str = "mock-responses";
const KEY: &str = "Bearer sk-alice";

async fn proxy_for(mock: &ResponsesMock, window: u64) -> Proxy {
    let mut c = config(&mock.url());
    c.windows.insert(MODEL.into(), window);
    c.compaction.keep_recent_tokens = window / 5;
    c.compaction.reserve_output_tokens = 256;
    c.compaction.margin_tokens = 64;
    // One summary request per summary: the span is never folded in chunks.
    c.summarizer.window = 100_000;
    start_proxy(c).await
}

/// Words that tokenize predictably: `n` of them, different for each `seed`.
fn words(seed: usize, n: usize) -> String {
    (0..n)
        .map(|i| format!("w{}", (seed * 31 + i * 7) % 97))
        .collect::<Vec<_>>()
        .join(" ")
}

fn user(text: &str) -> Value {
    json!({"type":"message","role":"user","content":[{"type":"input_text","text":text}]})
}

/// A Codex-like thread: a developer message, then turns of a user message, a reasoning item,
/// one or two parallel calls with their outputs, and an assistant message.
struct Thread {
    items: Vec<Value>,
}

impl Thread {
    fn new() -> Thread {
        Thread {
            items: vec![
                json!({"type":"message","role":"developer","content":[{"type":"input_text","text":"You are a coding agent."}]}),
            ],
        }
    }

    fn turn(&mut self, t: usize, output_words: usize) {
        self.items
            .push(user(&format!("Turn {t}: {}", words(t, 20))));
        self.items.push(json!({"type":"reasoning","id":format!("rs_{t}"),"summary":[],"content":[{"type":"reasoning_text","text":"read it"}]}));
        let calls = if t % 2 == 0 { 2 } else { 1 };
        for k in 0..calls {
            self.items.push(json!({"type":"function_call","id":format!("fc_{t}_{k}"),"status":"completed","call_id":format!("call_{t}_{k}"),"name":"exec_command","arguments":format!("{{\"cmd\":\"cat f{t}_{k}\"}}")}));
        }
        for k in 0..calls {
            self.items.push(json!({"type":"function_call_output","call_id":format!("call_{t}_{k}"),"output":words(t * 3 + k, output_words)}));
        }
        self.items.push(json!({"type":"message","role":"assistant","id":format!("msg_{t}"),"status":"completed","content":[{"type":"output_text","text":format!("done {t}"),"annotations":[]}]}));
    }

    fn body(&self, stream: bool) -> Value {
        json!({"model": MODEL, "stream": stream, "store": false, "input": self.items,
               "tools": [{"type":"function","name":"exec_command","parameters":{"type":"object"}}],
               "prompt_cache_key": "thread-1"})
    }
}

async fn post(proxy: &Proxy, path: &str, key: &str, body: &Value) -> Reply {
    let headers = [("authorization", key), ("content-type", "application/json")];
    common::post(
        &format!("{}/v1{path}", proxy.url()),
        &headers,
        body.to_string(),
    )
    .await
}

/// Indices where a unit of `items` may begin (the rules a provider enforces).
fn unit_starts(items: &[Value]) -> Vec<usize> {
    let mut starts = Vec::new();
    let mut open: Vec<String> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let kind = item["type"].as_str().unwrap_or("message");
        let after_reasoning = i > 0 && items[i - 1]["type"] == "reasoning";
        if !kind.ends_with("_output") && !after_reasoning && open.is_empty() {
            starts.push(i);
        }
        let call_id = item["call_id"].as_str().map(str::to_string);
        match (kind.ends_with("_call"), kind.ends_with("_output"), call_id) {
            (true, _, Some(id)) => open.push(id),
            (_, true, Some(id)) => open.retain(|c| *c != id),
            _ => {}
        }
    }
    starts
}

/// The forwarded input keeps the head, then one summary message, then whole units of the
/// client's input; returns the summary's text.
fn assert_rewritten_whole(sent: &[Value], original: &[Value]) -> String {
    assert_eq!(sent[0], original[0], "the developer message is kept");
    let summary = &sent[1];
    assert_eq!(summary["type"], "message");
    assert_eq!(summary["role"], "user");
    let text = summary["content"][0]["text"].as_str().unwrap().to_string();
    assert!(text.contains("SUMMARY-"), "{text}");
    let mut kept = &sent[2..];
    // A turn too long to keep whole is split: its user message pinned after the summary, then
    // the newest whole units of the turn.
    let split = !original.ends_with(kept) && kept.len() > 1 && kept[0]["role"] == "user";
    if split && original.ends_with(&kept[1..]) {
        let pinned = original.iter().rposition(|i| *i == kept[0]).unwrap();
        assert!(
            pinned < original.len() - (kept.len() - 1),
            "the pinned message comes first"
        );
        kept = &kept[1..];
    }
    let start = original.len() - kept.len();
    assert_eq!(
        kept,
        &original[start..],
        "the tail is the client's, verbatim"
    );
    assert!(
        unit_starts(original).contains(&start),
        "the kept tail starts inside a unit, at item {start} ({})",
        original[start]["type"]
    );
    text
}

#[tokio::test]
async fn a_thread_past_the_window_is_compacted_into_whole_units_with_a_stable_prefix() {
    let mock = start_responses_mock().await;
    let proxy = proxy_for(&mock, 3000).await;
    let mut thread = Thread::new();
    let mut compacted_prefixes: Vec<Vec<Value>> = Vec::new();
    for t in 0..14 {
        thread.turn(t, 120);
        let reply = post(&proxy, "/responses", KEY, &thread.body(t % 2 == 1)).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert!(reply.body.contains("Hello there"));
        if reply.header("x-compactor-compacted") == Some("true") {
            let sent = mock.turns().last().unwrap().json()["input"]
                .as_array()
                .unwrap()
                .clone();
            assert_rewritten_whole(&sent, &thread.items);
            compacted_prefixes.push(sent[..2].to_vec());
        }
    }
    assert!(
        compacted_prefixes.len() >= 4,
        "{}",
        compacted_prefixes.len()
    );
    let summaries = mock.summaries().len();
    assert!(summaries >= 1 && summaries < compacted_prefixes.len());
    // Between two summaries the rewritten prefix (head + summary) stays byte-identical.
    let distinct: std::collections::BTreeSet<String> = compacted_prefixes
        .iter()
        .map(|p| json!(p).to_string())
        .collect();
    assert_eq!(distinct.len(), summaries);
    // The client's prompt_cache_key reaches the provider; the summary requests do not carry it.
    let last = mock.turns().last().unwrap().json();
    assert_eq!(last["prompt_cache_key"], "thread-1");
    for s in mock.summaries() {
        assert_ne!(s.json()["prompt_cache_key"], "thread-1");
    }
}

async fn overflow_is_compacted_and_retried(style: Overflow, stream: bool) {
    let mock = start_responses_mock().await;
    // The proxy believes the window is large; the provider's is small.
    let proxy = proxy_for(&mock, 100_000).await;
    mock.set_window(1500);
    mock.set_overflow(style);
    let mut thread = Thread::new();
    for t in 0..10 {
        thread.turn(t, 100);
    }
    let reply = post(&proxy, "/responses", KEY, &thread.body(stream)).await;
    assert_eq!(reply.status, 200, "{style:?}: {}", reply.body);
    assert!(reply.body.contains("Hello there"), "{}", reply.body);
    assert!(!reply.body.contains("response.failed"), "{}", reply.body);
    assert_eq!(reply.header("x-compactor-compacted"), Some("true"));
    assert_eq!(
        mock.state
            .overflows
            .load(std::sync::atomic::Ordering::SeqCst),
        1
    );
    let turns = mock.turns();
    assert_eq!(turns.len(), 2, "one overflow, one retry");
    assert_rewritten_whole(turns[1].json()["input"].as_array().unwrap(), &thread.items);
}

#[tokio::test]
async fn an_http_400_overflow_is_compacted_and_retried() {
    overflow_is_compacted_and_retried(Overflow::Http, false).await;
}

#[tokio::test]
async fn a_response_failed_event_at_the_start_of_the_stream_is_compacted_and_retried() {
    overflow_is_compacted_and_retried(Overflow::InStream, true).await;
}

#[tokio::test]
async fn a_llama_cpp_overflow_is_compacted_and_retried() {
    overflow_is_compacted_and_retried(Overflow::LlamaCpp, true).await;
}

#[tokio::test]
async fn when_nothing_helps_the_client_sees_context_length_exceeded() {
    let mock = start_responses_mock().await;
    let proxy = proxy_for(&mock, 100_000).await;
    // Too small for even the head and the newest turn.
    mock.set_window(20);
    mock.set_overflow(Overflow::LlamaCpp);
    let mut thread = Thread::new();
    for t in 0..3 {
        thread.turn(t, 100);
    }
    let reply = post(&proxy, "/responses", KEY, &thread.body(true)).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    let error = &reply.json()["error"];
    assert_eq!(error["code"], "context_length_exceeded", "{}", reply.body);
    // What was measured: the whole compacted prompt, as the provider counted it, against the
    // window it stated.
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("the compacted prompt takes")
            && message.contains("tokens by the provider's count")
            && !message.contains("alone take"),
        "{message}"
    );
}

#[tokio::test]
async fn server_held_state_is_forwarded_untouched() {
    let mock = start_responses_mock().await;
    let proxy = proxy_for(&mock, 3000).await;
    let body =
        json!({"model": MODEL, "previous_response_id": "resp_1", "input": [user(&words(1, 3000))]});
    let reply = post(&proxy, "/responses", KEY, &body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(
        reply.header("x-compactor-compaction"),
        Some("skipped; reason=server-state")
    );
    assert_eq!(mock.turns()[0].json(), body);
}

#[tokio::test]
async fn bad_input_gets_a_400_in_the_openai_shape() {
    let mock = start_responses_mock().await;
    let proxy = proxy_for(&mock, 3000).await;
    let cases = [
        json!([1, 2]),
        json!({"input": []}),
        json!({"model": MODEL}),
        json!({"model": MODEL, "input": 7}),
        json!({"model": MODEL, "input": [3]}),
        json!({"model": MODEL, "input": [{"type": "message"}]}),
        json!({"model": MODEL, "input": [{"type": "function_call_output", "output": "x"}]}),
        json!({"model": 5, "input": "hi"}),
    ];
    for body in cases {
        let reply = post(&proxy, "/responses", KEY, &body).await;
        assert_eq!(reply.status, 400, "{body}: {}", reply.body);
        let error = &reply.json()["error"];
        assert!(
            error["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{body}: {}",
            reply.body
        );
        assert_eq!(error["type"], "invalid_request_error");
    }
    let r = client()
        .post(format!("{}/v1/responses", proxy.url()))
        .header("content-type", "application/json")
        .body("{\"model\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(mock.turns().is_empty(), "nothing bad was forwarded");
}

#[tokio::test]
async fn a_string_input_is_served() {
    let mock = start_responses_mock().await;
    let proxy = proxy_for(&mock, 3000).await;
    let body = json!({"model": MODEL, "input": "hello", "instructions": "be brief"});
    let reply = post(&proxy, "/responses", KEY, &body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(mock.turns()[0].json(), body);
}

#[tokio::test]
async fn input_tokens_are_counted_on_the_body_as_it_would_be_sent() {
    let mock = start_responses_mock().await;
    let proxy = proxy_for(&mock, 3000).await;
    let mut thread = Thread::new();
    for t in 0..12 {
        thread.turn(t, 120);
    }
    let reply = post(&proxy, "/responses", KEY, &thread.body(false)).await;
    assert_eq!(reply.header("x-compactor-compacted"), Some("true"));
    let sent = mock.turns().last().unwrap().json();
    let reply = post(&proxy, "/responses/input_tokens", KEY, &thread.body(false)).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let counted = mock.others().last().unwrap().json();
    assert_eq!(
        counted["input"], sent["input"],
        "counted through the checkpoint"
    );
    assert!(reply.json()["input_tokens"].as_u64().unwrap() > 0);
}

fn fixture(name: &str) -> Vec<Value> {
    let path = format!(
        "{}/tests/fixtures/codex/{name}.jsonl",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test]
async fn recorded_codex_threads_replay_with_one_checkpoint_per_compaction() {
    for name in ["exec-resume", "compaction"] {
        let mock = start_responses_mock().await;
        let mut c = config(&mock.url());
        // The recorded thread grows from about 900 to 1,950 tokens: past this window twice.
        c.windows.insert("qwen2.5-coder-0.5b-instruct".into(), 1600);
        c.summarizer.window = 100_000;
        c.compaction.keep_recent_tokens = 500;
        c.compaction.reserve_output_tokens = 128;
        c.compaction.margin_tokens = 32;
        let proxy = start_proxy(c).await;
        let mut compacted: Vec<(String, Vec<Value>)> = Vec::new();
        // The stub's compaction item, recorded, stands for the one the proxy mints on replay.
        let mut minted: Option<Value> = None;
        let mut minted_ids: Vec<String> = Vec::new();
        for mut request in fixture(name) {
            if let Some(item) = &minted {
                for input in request["body"]["input"].as_array_mut().unwrap() {
                    if input["type"] == "compaction" {
                        *input = item.clone();
                    }
                }
            }
            let mut r = client()
                .post(format!(
                    "{}{}",
                    proxy.url(),
                    request["path"].as_str().unwrap()
                ))
                .header("authorization", "Bearer sk-replay");
            for (k, v) in request["headers"].as_object().unwrap() {
                r = r.header(k.as_str(), v.as_str().unwrap());
            }
            let response = r
                .header("content-type", "application/json")
                .body(request["body"].to_string())
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            let checkpoint = response
                .headers()
                .get("x-compactor-checkpoint")
                .map(|v| v.to_str().unwrap().to_string());
            let text = response.text().await.unwrap();
            assert_eq!(status, 200, "{name}: {text}");
            if let Some(item) = text
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .filter_map(|d| serde_json::from_str::<Value>(d).ok())
                .find(|e| {
                    e["type"] == "response.output_item.done" && e["item"]["type"] == "compaction"
                })
            {
                // Answered by the proxy itself: one checkpoint, and nothing sent upstream.
                minted = Some(item["item"].clone());
                minted_ids.push(checkpoint.expect("a trigger's answer names its checkpoint"));
                continue;
            }
            if let Some(id) = checkpoint {
                let sent = mock.turns().last().unwrap().json()["input"]
                    .as_array()
                    .unwrap()
                    .clone();
                compacted.push((id, sent));
            }
        }
        assert!(
            !compacted.is_empty(),
            "{name}: the thread was never compacted"
        );
        assert_eq!(
            minted_ids.len(),
            usize::from(name == "compaction"),
            "{name}: the recorded trigger is answered by the proxy"
        );
        assert_eq!(
            mock.summaries().len(),
            compacted
                .iter()
                .map(|(id, _)| id)
                .chain(&minted_ids)
                .collect::<std::collections::BTreeSet<_>>()
                .len(),
            "{name}: one summary per checkpoint"
        );
        // Under one checkpoint, each forwarded input extends the previous one byte for byte.
        for pair in compacted.windows(2) {
            let ((a, before), (b, after)) = (&pair[0], &pair[1]);
            if a == b {
                assert_eq!(
                    &after[..before.len()],
                    &before[..],
                    "{name}: the prefix changed"
                );
            }
        }
    }
}

/// A thread of `turns` turns, past a 3,000-token window.
fn long_thread(turns: usize) -> Thread {
    let mut thread = Thread::new();
    for t in 0..turns {
        thread.turn(t, 120);
    }
    thread
}

fn with_trigger(thread: &Thread, stream: bool) -> Value {
    let mut body = thread.body(stream);
    body["input"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type":"compaction_trigger"}));
    body
}

/// The one `compaction` item of an output list.
fn the_compaction_item(output: &Value) -> Value {
    let items: Vec<&Value> = output
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "compaction")
        .collect();
    assert_eq!(items.len(), 1, "{output}");
    assert!(items[0]["encrypted_content"]
        .as_str()
        .is_some_and(|c| !c.is_empty()));
    items[0].clone()
}

/// What Codex sends after a compaction: the head, the user messages, the item, a new turn.
fn after_compaction(thread: &Thread, item: &Value) -> Value {
    let mut input: Vec<Value> = vec![thread.items[0].clone()];
    input.extend(thread.items.iter().filter(|i| i["role"] == "user").cloned());
    input.push(item.clone());
    input.push(user("and now?"));
    json!({"model": MODEL, "stream": false, "store": false, "input": input})
}

#[tokio::test]
async fn a_compaction_trigger_is_answered_with_one_sealed_item_that_later_expands() {
    let mock = start_responses_mock().await;
    let proxy = proxy_for(&mock, 3000).await;
    let thread = long_thread(10);
    let reply = post(&proxy, "/responses", KEY, &with_trigger(&thread, false)).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let item = the_compaction_item(&reply.json()["output"]);
    let checkpoint_id = reply.header("x-compactor-checkpoint").unwrap().to_string();
    assert!(
        mock.turns().is_empty(),
        "the provider never saw the trigger"
    );
    assert_eq!(mock.summaries().len(), 1);
    // The checkpoint covers the whole thread: nothing of it is left verbatim.
    let stored = common::checkpoint(&proxy, &checkpoint_id, KEY).await;
    assert_eq!(stored["covered"], thread.items.len());
    let summary_request = mock.summaries()[0].json().to_string();
    assert!(
        summary_request.contains("done 9"),
        "the last turn is summarized too"
    );

    let reply = post(&proxy, "/responses", KEY, &after_compaction(&thread, &item)).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let sent = mock.turns().last().unwrap().json();
    assert_eq!(
        reply.header("x-compactor-checkpoint"),
        Some(checkpoint_id.as_str()),
        "the expanded item names its checkpoint"
    );
    let sent = sent["input"].as_array().unwrap();
    assert!(sent.iter().all(|i| i["type"] != "compaction"), "{sent:?}");
    let expanded = &sent[sent.len() - 2];
    assert_eq!(expanded["role"], "user");
    assert!(expanded["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("SUMMARY-1"));
    assert_eq!(sent.last().unwrap(), &user("and now?"));
    assert_eq!(mock.summaries().len(), 1, "no second summary");
}

#[tokio::test]
async fn a_streamed_compaction_trigger_gets_the_item_as_events() {
    let mock = start_responses_mock().await;
    let proxy = proxy_for(&mock, 3000).await;
    let reply = post(
        &proxy,
        "/responses",
        KEY,
        &with_trigger(&long_thread(10), true),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(reply
        .header("content-type")
        .is_some_and(|c| c.starts_with("text/event-stream")));
    let events = reply.events();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.output_item.added",
            "response.output_item.done",
            "response.completed"
        ]
    );
    let done = &events[2]["item"];
    assert_eq!(done["type"], "compaction");
    assert_eq!(the_compaction_item(&events[3]["response"]["output"]), *done);
}

#[tokio::test]
async fn even_a_short_thread_is_compacted_when_the_client_asks() {
    let mock = start_responses_mock().await;
    let proxy = proxy_for(&mock, 3000).await;
    // Two short turns: a summary frees nothing here, but the client asked for one.
    let mut thread = Thread::new();
    thread.turn(0, 3);
    let reply = post(&proxy, "/responses", KEY, &with_trigger(&thread, false)).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    the_compaction_item(&reply.json()["output"]);
    // Only instructions before the trigger: nothing to compact, said clearly.
    let empty = Thread::new();
    let reply = post(&proxy, "/responses", KEY, &with_trigger(&empty, false)).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert_eq!(reply.json()["error"]["code"], "nothing_to_compact");
}

#[tokio::test]
async fn the_compact_endpoint_answers_with_the_user_messages_and_one_item() {
    let mock = start_responses_mock().await;
    let proxy = proxy_for(&mock, 3000).await;
    let thread = long_thread(10);
    let body = json!({"model": MODEL, "input": thread.items});
    let reply = post(&proxy, "/responses/compact", KEY, &body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let answer = reply.json();
    assert_eq!(answer["object"], "response.compaction");
    let output = answer["output"].as_array().unwrap();
    let users: Vec<&Value> = thread
        .items
        .iter()
        .filter(|i| i["role"] == "user")
        .collect();
    assert_eq!(output.len(), users.len() + 1);
    assert_eq!(output[..users.len()].iter().collect::<Vec<_>>(), users);
    let item = the_compaction_item(&answer["output"]);
    let reply = post(&proxy, "/responses", KEY, &after_compaction(&thread, &item)).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    // Counting through the item: the provider counts the summary, never the item.
    let reply = post(
        &proxy,
        "/responses/input_tokens",
        KEY,
        &after_compaction(&thread, &item),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let counted = mock.others().last().unwrap().json().to_string();
    assert!(!counted.contains("\"type\":\"compaction\""), "{counted}");
    assert!(counted.contains("SUMMARY-1"), "{counted}");
}

#[tokio::test]
async fn a_forged_or_another_tenants_item_is_refused() {
    let mock = start_responses_mock().await;
    let proxy = proxy_for(&mock, 3000).await;
    let thread = long_thread(10);
    let reply = post(&proxy, "/responses", KEY, &with_trigger(&thread, false)).await;
    let item = the_compaction_item(&reply.json()["output"]);
    let content = item["encrypted_content"].as_str().unwrap().to_string();
    let mut forged = item.clone();
    let flipped = if content.ends_with('0') { "1" } else { "0" };
    forged["encrypted_content"] = json!(format!("{}{flipped}", &content[..content.len() - 1]));
    let mut other_checkpoint = item.clone();
    let (_, mac) = content.rsplit_once('.').unwrap();
    other_checkpoint["encrypted_content"] = json!(format!("cmpx1.0000.{mac}"));
    let cases = [
        (KEY, forged),
        (KEY, other_checkpoint),
        ("Bearer sk-mallory", item.clone()),
    ];
    for (key, item) in cases {
        for path in [
            "/responses",
            "/responses/input_tokens",
            "/responses/compact",
        ] {
            let reply = post(&proxy, path, key, &after_compaction(&thread, &item)).await;
            assert_eq!(reply.status, 400, "{path} {key} {item}: {}", reply.body);
            let error = &reply.json()["error"];
            assert_eq!(error["type"], "invalid_request_error");
            assert_eq!(error["code"], "invalid_compaction_item");
            assert!(error["param"].as_str().unwrap().starts_with("input["));
        }
    }
    assert!(
        mock.turns().is_empty() && mock.others().is_empty(),
        "no refused request reached the provider"
    );
    assert_eq!(mock.summaries().len(), 1, "only the first compaction");
}

#[tokio::test]
async fn toward_a_provider_with_its_own_compaction_both_pass_through() {
    let mock = start_responses_mock().await;
    let mut c = config(&mock.url());
    c.windows.insert(MODEL.into(), 100_000);
    c.responses.server_compaction = compactor::config::ServerCompaction::Passthrough;
    let proxy = start_proxy(c).await;
    let body = with_trigger(&long_thread(3), false);
    let reply = post(&proxy, "/responses", KEY, &body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(mock.turns()[0].json(), body);
    let body = json!({"model": MODEL, "input": long_thread(3).items});
    post(&proxy, "/responses/compact", KEY, &body).await;
    assert_eq!(mock.others().last().unwrap().json(), body);
    assert!(mock.summaries().is_empty());
}

#[tokio::test]
async fn an_item_sent_twice_or_too_many_items_are_refused_before_any_work() {
    let mock = start_responses_mock().await;
    let proxy = proxy_for(&mock, 3000).await;
    let thread = long_thread(10);
    let reply = post(&proxy, "/responses", KEY, &with_trigger(&thread, false)).await;
    let item = the_compaction_item(&reply.json()["output"]);
    // The same item twice: expanded once each time it appears, it would multiply the request.
    let mut twice = after_compaction(&thread, &item);
    let input = twice["input"].as_array_mut().unwrap();
    let at = input.len() - 1;
    input.insert(at, item.clone());
    let reply = post(&proxy, "/responses", KEY, &twice).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert_eq!(reply.json()["error"]["code"], "invalid_compaction_item");
    assert!(
        reply.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("repeats"),
        "{}",
        reply.body
    );
    // Many distinct-looking items (forged copies) are refused by count, before any is opened.
    let mut many = after_compaction(&thread, &item);
    let input = many["input"].as_array_mut().unwrap();
    for n in 0..20 {
        let mut copy = item.clone();
        copy["encrypted_content"] = json!(format!("cmpx1.{n:04}.00"));
        input.insert(1, copy);
    }
    let reply = post(&proxy, "/responses", KEY, &many).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert!(reply.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("at most"));
    assert!(mock.turns().is_empty(), "nothing reached the provider");
    assert_eq!(mock.summaries().len(), 1, "only the first compaction");
}

#[tokio::test]
async fn a_minted_item_never_reaches_the_provider_with_server_state_or_escaped_words() {
    let mock = start_responses_mock().await;
    let proxy = proxy_for(&mock, 3000).await;
    let thread = long_thread(10);
    let reply = post(&proxy, "/responses", KEY, &with_trigger(&thread, false)).await;
    let item = the_compaction_item(&reply.json()["output"]);
    let content = item["encrypted_content"].as_str().unwrap().to_string();
    // With `previous_response_id` the request is not compacted, but the item is still expanded.
    let mut stateful = after_compaction(&thread, &item);
    stateful["previous_response_id"] = json!("resp_1");
    let reply = post(&proxy, "/responses", KEY, &stateful).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let sent = mock.turns().last().unwrap().body.clone();
    let sent = String::from_utf8_lossy(&sent);
    assert!(
        !sent.contains(&content) && sent.contains("SUMMARY-1"),
        "{sent}"
    );
    assert!(sent.contains("resp_1"));
    // The item's type written with a JSON escape is the same item.
    let escaped = serde_json::to_string(&after_compaction(&thread, &item))
        .unwrap()
        .replace("\"compaction\"", "\"\\u0063ompaction\"");
    let reply = common::post(
        &format!("{}/v1/responses", proxy.url()),
        &[("authorization", KEY)],
        escaped,
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let sent = String::from_utf8_lossy(&mock.turns().last().unwrap().body).to_string();
    assert!(!sent.contains(&content), "{sent}");
    // A body that is not a Responses request but holds server state and a minted item is
    // refused rather than forwarded.
    let broken = json!({"model": MODEL, "previous_response_id": "resp_1", "input": [item, 5]});
    let turns = mock.turns().len();
    let reply = post(&proxy, "/responses", KEY, &broken).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert_eq!(mock.turns().len(), turns, "the broken body never left");
}
