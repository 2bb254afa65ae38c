//! How often a conversation is summarized: a compaction leaves room for several turns before the
//! next summary starts, and a summary written ahead of time is found by the client's next
//! request even though the client re-serialized its newest message.

mod common;

use std::sync::atomic::Ordering;

use common::messages_mock::{self, Overflow};
use common::{client, config, start_mock, start_proxy, Mock, Proxy};
use serde_json::{json, Value};

const W: u64 = 6000;

/// A summary about as long as a real one at this window (the model writes up to half of it).
const SUMMARY_PADDING_WORDS: u64 = 300;

fn user(t: usize) -> Value {
    user_of(t, 120)
}

/// A user message large beside the kept tail at this window (a pasted file, a long request), so
/// a summary made while it is the newest message would have to pin it.
fn long_user(t: usize) -> Value {
    user_of(t, 2000)
}

fn user_of(t: usize, words: usize) -> Value {
    json!({"role":"user","content": format!("Task {t}: please look at module {t} and report. {}", "detail ".repeat(words))})
}

/// Instructions and tools as large as an agent's at a small window: a tenth of it.
fn system() -> Value {
    json!({"role":"system","content": format!("You help with code. {}", "rule ".repeat(600))})
}

fn assistant(t: usize) -> Value {
    json!({"role":"assistant","content": format!("Module {t} looks fine. {}", "finding ".repeat(160))})
}

async fn chat_proxy() -> (Mock, Proxy) {
    let mock = start_mock().await;
    mock.set_window(W);
    mock.state
        .summary_padding_words
        .store(SUMMARY_PADDING_WORDS, Ordering::SeqCst);
    let mut cfg = config(&mock.url());
    cfg.windows.insert("agent-model".into(), W);
    cfg.summarizer.window = 100_000;
    cfg.compaction.ahead_of_time = true;
    (mock, start_proxy(cfg).await)
}

async fn send_chat(proxy: &Proxy, messages: &[Value]) -> reqwest::header::HeaderMap {
    let body = json!({"model":"agent-model","max_tokens":256,"messages":messages});
    let resp = client()
        .post(format!("{}/v1/chat/completions", proxy.url()))
        .header("authorization", "Bearer k")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let headers = resp.headers().clone();
    resp.bytes().await.unwrap();
    headers
}

fn flag(headers: &reqwest::header::HeaderMap, name: &str) -> bool {
    headers.get(name).is_some_and(|v| v == "true")
}

/// Waits until no summary runs in the background, as an agent's own work between requests
/// would (the mock answers at once): on the engine's tasks, not on a clock.
async fn settle(proxy: &Proxy) {
    proxy.app.engine.background_settled().await;
}

#[tokio::test]
async fn a_compaction_leaves_room_for_further_turns_without_a_summary() {
    let (mock, proxy) = chat_proxy().await;
    let mut messages = vec![system()];
    let mut t = 0;
    loop {
        messages.push(user(t));
        let headers = send_chat(&proxy, &messages).await;
        settle(&proxy).await;
        messages.push(assistant(t));
        t += 1;
        if flag(&headers, "x-compactor-compacted") {
            break;
        }
        assert!(t < 60, "the conversation never crossed the window");
    }
    let after_compaction = mock.summaries().len();
    assert!(after_compaction >= 1);
    for further in 0..3 {
        messages.push(user(t));
        let headers = send_chat(&proxy, &messages).await;
        settle(&proxy).await;
        messages.push(assistant(t));
        t += 1;
        assert!(flag(&headers, "x-compactor-compacted"));
        assert_eq!(
            mock.summaries().len(),
            after_compaction,
            "turn {further} after the compaction started a summary"
        );
    }
    assert_eq!(mock.state.overflows.load(Ordering::SeqCst), 0);
}

/// Sends ordinary turns until a background summary has been made; the last user message of the
/// last request sent ends with a note the client drops on the next request.
async fn until_ahead_of_time_summary(
    proxy: &Proxy,
    summaries: impl Fn() -> usize,
    send: impl AsyncFn(&[Value]) -> reqwest::header::HeaderMap,
    messages: &mut Vec<Value>,
    with_note: impl Fn(usize) -> Value,
) -> usize {
    let mut t = 0;
    loop {
        messages.push(with_note(t));
        let headers = send(messages).await;
        assert!(
            !flag(&headers, "x-compactor-compacted"),
            "compacted at turn {t}"
        );
        settle(proxy).await;
        if summaries() > 0 {
            return t;
        }
        *messages.last_mut().unwrap() = long_user(t);
        messages.push(assistant(t));
        t += 1;
        assert!(t < 60, "no summary was made ahead of time");
    }
}

#[tokio::test]
async fn a_ready_summary_serves_the_next_chat_request_whose_newest_message_changed() {
    let (mock, proxy) = chat_proxy().await;
    let mut messages = vec![json!({"role":"system","content":"You help with code."})];
    let with_note = |t: usize| {
        let mut m = long_user(t);
        let content = m["content"].as_str().unwrap().to_string();
        m["content"] = json!(format!(
            "{content}\n<system-reminder>Today is Tuesday.</system-reminder>"
        ));
        m
    };
    let t = until_ahead_of_time_summary(
        &proxy,
        || mock.summaries().len(),
        async |m: &[Value]| send_chat(&proxy, m).await,
        &mut messages,
        with_note,
    )
    .await;
    assert_eq!(mock.summaries().len(), 1);
    // The client drops its note from the message it sent last, and the next turn crosses the
    // window.
    *messages.last_mut().unwrap() = long_user(t);
    messages.push(assistant(t));
    let mut next = t + 1;
    let headers = loop {
        messages.push(long_user(next));
        assert_eq!(mock.summaries().len(), 1, "a second summary was started");
        let headers = send_chat(&proxy, &messages).await;
        if flag(&headers, "x-compactor-compacted") {
            break headers;
        }
        messages.push(assistant(next));
        next += 1;
        assert!(next < t + 30, "never crossed the window");
    };
    assert!(
        flag(&headers, "x-compactor-ready-checkpoint"),
        "{headers:?}"
    );
    assert!(
        headers.get("x-compactor-summary-ms").is_none(),
        "the request waited for a summary"
    );
}

const MODEL: &str = "claude-test";

async fn send_messages(proxy: &Proxy, messages: &[Value]) -> reqwest::header::HeaderMap {
    let body =
        json!({"model":MODEL,"max_tokens":256,"system":"You help with code.","messages":messages});
    let reply = common::post(
        &format!("{}/v1/messages", proxy.url()),
        &[
            ("x-api-key", "sk-test"),
            ("content-type", "application/json"),
        ],
        body.to_string(),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let mut headers = reqwest::header::HeaderMap::new();
    for name in [
        "x-compactor-compacted",
        "x-compactor-ready-checkpoint",
        "x-compactor-summary-ms",
    ] {
        if let Some(v) = reply.header(name) {
            headers.insert(name, v.parse().unwrap());
        }
    }
    headers
}

#[tokio::test]
async fn a_ready_summary_serves_the_next_messages_request_whose_cache_marker_moved() {
    let mock = messages_mock::start().await;
    mock.set_window(W, Overflow::Anthropic);
    let mut cfg = config("http://127.0.0.1:9/v1");
    cfg.anthropic_upstream = mock.url();
    cfg.windows.insert(MODEL.into(), W);
    cfg.summarizer.window = 100_000;
    cfg.compaction.ahead_of_time = true;
    let proxy = start_proxy(cfg).await;
    let marked = |t: usize| {
        let text = long_user(t)["content"].as_str().unwrap().to_string();
        json!({"role":"user","content":[{"type":"text","text":text,"cache_control":{"type":"ephemeral"}}]})
    };
    let mut messages = vec![];
    let t = until_ahead_of_time_summary(
        &proxy,
        || mock.summaries().len(),
        async |m: &[Value]| send_messages(&proxy, m).await,
        &mut messages,
        marked,
    )
    .await;
    assert_eq!(mock.summaries().len(), 1);
    // The marker moves from the message sent last to the newest one.
    *messages.last_mut().unwrap() = long_user(t);
    messages.push(assistant(t));
    let mut next = t + 1;
    let headers = loop {
        messages.push(marked(next));
        assert_eq!(mock.summaries().len(), 1, "a second summary was started");
        let headers = send_messages(&proxy, &messages).await;
        if flag(&headers, "x-compactor-compacted") {
            break headers;
        }
        assert!(next < t + 30, "never crossed the window");
        *messages.last_mut().unwrap() = long_user(next);
        messages.push(assistant(next));
        next += 1;
    };
    assert!(
        flag(&headers, "x-compactor-ready-checkpoint"),
        "{headers:?}"
    );
    assert!(
        headers.get("x-compactor-summary-ms").is_none(),
        "the request waited for a summary"
    );
}

/// A tool loop's turn: the question, the call and the file it read (about 1,800 tokens: over the
/// tail a compaction keeps for the cadence at this window, within half the room below it).
fn tool_turn(t: usize) -> [Value; 3] {
    let file: String = (0..210).map(|i| format!("value_{t}_{i} = {i}\n")).collect();
    let id = format!("call_{t}");
    [
        json!({"role":"user","content": format!("Turn {t}: what does module {t} do?")}),
        json!({"role":"assistant","content": null, "tool_calls": [{"id": id, "type": "function",
            "function": {"name": "read_file", "arguments": format!("{{\"path\":\"src/module_{t}.py\"}}")}}]}),
        json!({"role":"tool","tool_call_id": id, "content": file}),
    ]
}

#[tokio::test]
async fn the_step_being_answered_reaches_the_model_whole_when_it_fits() {
    let (mock, proxy) = chat_proxy().await;
    // A session resumed past the window: the first request needs a summary at once, so the
    // plan is made against the tail kept for the cadence, not ahead of time.
    let mut messages = vec![system()];
    for t in 0..3 {
        messages.extend(tool_turn(t));
        messages.push(assistant(t));
    }
    let mut compacted = 0;
    for t in 3..8 {
        let turn = tool_turn(t);
        messages.extend(turn.iter().cloned());
        let headers = send_chat(&proxy, &messages).await;
        settle(&proxy).await;
        let forwarded = mock.chats().last().unwrap().json();
        let sent = forwarded["messages"].as_array().unwrap();
        assert_eq!(
            sent[sent.len() - 3..],
            turn[..],
            "turn {t}: the step in progress was not forwarded as the client sent it"
        );
        compacted += flag(&headers, "x-compactor-compacted") as usize;
        messages.push(assistant(t));
    }
    assert_eq!(compacted, 5, "every request is past the window");
}
