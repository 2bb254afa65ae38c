//! Ahead-of-time compaction: past the soft threshold the summary is written in the background,
//! so the request that crosses the window does not wait for it.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{client, config, start_mock, start_proxy, Mock, Proxy};
use serde_json::{json, Value};

const W: u64 = 6000;
const SUMMARY_MS: u64 = 2000;

fn turn(messages: &mut Vec<Value>, t: usize) {
    messages.push(json!({"role":"user","content": format!("Task {t}: please look at module {t} and report. {}", "detail ".repeat(60))}));
    messages.push(json!({"role":"assistant","content": format!("Module {t} looks fine. {}", "finding ".repeat(80))}));
}

async fn send(proxy: &Proxy, messages: &[Value]) -> (reqwest::header::HeaderMap, Duration) {
    let mut body = json!({"model":"agent-model","max_tokens":256,"messages":messages});
    // Every request ends with the user's newest message.
    if messages.last().is_some_and(|m| m["role"] == "assistant") {
        body["messages"].as_array_mut().unwrap().pop();
    }
    let started = Instant::now();
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
    (headers, started.elapsed())
}

async fn setup(ahead_of_time: bool) -> (Mock, Proxy) {
    setup_applying(ahead_of_time, true).await
}

async fn setup_applying(ahead_of_time: bool, apply_when_ready: bool) -> (Mock, Proxy) {
    let mock = start_mock().await;
    mock.set_window(W);
    mock.state
        .summary_delay_ms
        .store(SUMMARY_MS, Ordering::SeqCst);
    let mut cfg = config(&mock.url());
    cfg.windows.insert("agent-model".into(), W);
    cfg.summarizer.window = 100_000;
    cfg.compaction.ahead_of_time = ahead_of_time;
    cfg.compaction.apply_when_ready = apply_when_ready;
    (mock, start_proxy(cfg).await)
}

#[tokio::test]
async fn the_crossing_request_uses_the_ready_summary_without_waiting() {
    let (mock, proxy) = setup(true).await;
    let mut messages = vec![json!({"role":"system","content":"You help with code."})];
    let mut crossed = false;
    let mut background_seen = false;
    for t in 0..40 {
        turn(&mut messages, t);
        let (headers, elapsed) = send(&proxy, &messages).await;
        let compacted = headers.get("x-compactor-compacted").unwrap() == "true";
        if !compacted {
            // Below the window: never delayed, even while a summary is being written.
            assert!(
                elapsed < Duration::from_millis(SUMMARY_MS / 2),
                "turn {t} took {elapsed:?}"
            );
        }
        if !background_seen && !mock.summaries().is_empty() {
            background_seen = true;
            assert!(!compacted, "the summary started ahead of the window");
            // The agent works for a while; the summary finishes meanwhile.
            proxy.app.engine.background_settled().await;
        }
        if compacted {
            assert!(background_seen);
            assert_eq!(headers.get("x-compactor-ready-checkpoint").unwrap(), "true");
            assert!(
                elapsed < Duration::from_millis(SUMMARY_MS / 2),
                "the crossing request waited {elapsed:?}"
            );
            assert!(headers.get("x-compactor-summary-ms").is_none());
            assert_eq!(mock.summaries().len(), 1, "the summary was made once");
            crossed = true;
            break;
        }
    }
    assert!(crossed, "the conversation never crossed the window");
    assert_eq!(mock.state.overflows.load(Ordering::SeqCst), 0);
    let (_, metrics) = common::get(&format!("{}/metrics", proxy.url()), None).await;
    assert!(
        metrics.contains("compactor_ready_checkpoints_used_total 1"),
        "{metrics}"
    );
}

/// Sends turns until a background summary is ready, then one more; returns whether that one
/// was compacted, and whether it would have fit the window verbatim.
async fn the_request_after_a_ready_summary(apply_when_ready: bool) -> (bool, bool) {
    let (mock, proxy) = setup_applying(true, apply_when_ready).await;
    let mut messages = vec![json!({"role":"system","content":"You help with code."})];
    let mut t = 0;
    while mock.summaries().is_empty() {
        turn(&mut messages, t);
        let (headers, _) = send(&proxy, &messages).await;
        assert_eq!(headers.get("x-compactor-compacted").unwrap(), "false");
        t += 1;
        assert!(t < 40, "no summary started");
    }
    proxy.app.engine.background_settled().await;
    turn(&mut messages, t);
    let (headers, _) = send(&proxy, &messages).await;
    let compacted = headers.get("x-compactor-compacted").unwrap() == "true";
    if compacted {
        assert_eq!(headers.get("x-compactor-ready-checkpoint").unwrap(), "true");
    }
    let verbatim = common::mock_tokens(&json!({ "messages": messages }));
    (compacted, verbatim + 256 < W)
}

#[tokio::test]
async fn a_ready_summary_is_applied_to_the_next_request_unless_told_to_wait_for_the_window() {
    let (compacted, would_fit) = the_request_after_a_ready_summary(true).await;
    assert!(
        would_fit,
        "the test's request must fit verbatim to show anything"
    );
    assert!(
        compacted,
        "the ready summary was not applied to the next request"
    );
    let (compacted, would_fit) = the_request_after_a_ready_summary(false).await;
    assert!(would_fit);
    assert!(
        !compacted,
        "apply_when_ready = false applied the summary before the window"
    );
}

#[tokio::test]
async fn a_crossing_request_waits_for_a_running_background_summary_instead_of_starting_another() {
    let (mock, proxy) = setup(true).await;
    let mut messages = vec![json!({"role":"system","content":"You help with code."})];
    let mut t = 0;
    while mock.summaries().is_empty() {
        turn(&mut messages, t);
        send(&proxy, &messages).await;
        t += 1;
        assert!(t < 40);
    }
    // Jump straight past the window while the background summary is still running.
    while common::mock_tokens(&json!({ "messages": messages })) <= W {
        turn(&mut messages, t);
        t += 1;
    }
    let (headers, _) = send(&proxy, &messages).await;
    assert_eq!(headers.get("x-compactor-compacted").unwrap(), "true");
    assert_eq!(mock.state.overflows.load(Ordering::SeqCst), 0);
    // One background summary; the crossing request extended it at most once more.
    common::assert_at_most_one_update(&mock);
}

#[tokio::test]
async fn an_edited_history_ignores_the_ready_checkpoint() {
    let (mock, proxy) = setup(true).await;
    let mut messages = vec![json!({"role":"system","content":"You help with code."})];
    let mut t = 0;
    while mock.summaries().is_empty() {
        turn(&mut messages, t);
        send(&proxy, &messages).await;
        t += 1;
    }
    proxy.app.engine.background_settled().await;
    // The client rewrites an early assistant message, then continues past the window.
    messages[2]["content"] = json!("An edited answer.");
    let before = mock.summaries().len();
    let mut compacted = false;
    for _ in 0..12 {
        turn(&mut messages, t);
        t += 1;
        let (headers, _) = send(&proxy, &messages).await;
        if headers.get("x-compactor-compacted").unwrap() == "true" {
            // Whatever checkpoint serves it was written for the edited history, not the old one.
            let id = headers
                .get("x-compactor-checkpoint")
                .unwrap()
                .to_str()
                .unwrap()
                .to_string();
            let cp = common::checkpoint(&proxy, &id, "Bearer k").await;
            assert!(
                !cp["summary"].as_str().unwrap().contains("SUMMARY-1:"),
                "the old ready summary was applied"
            );
            compacted = true;
            break;
        }
    }
    assert!(compacted);
    assert!(
        mock.summaries().len() > before,
        "the edited conversation got its own summary"
    );
    assert_eq!(mock.state.overflows.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn turned_off_it_summarizes_only_at_the_window() {
    let (mock, proxy) = setup(false).await;
    let mut messages = vec![json!({"role":"system","content":"You help with code."})];
    for t in 0..40 {
        turn(&mut messages, t);
        let (headers, elapsed) = send(&proxy, &messages).await;
        if headers.get("x-compactor-compacted").unwrap() == "true" {
            assert!(
                elapsed >= Duration::from_millis(SUMMARY_MS),
                "the crossing request paid for the summary"
            );
            assert_eq!(mock.summaries().len(), 1);
            return;
        }
        assert!(mock.summaries().is_empty(), "no summary before the window");
    }
    panic!("never crossed the window");
}

/// One tool step: a read of `src/m{t}.rs` and its result of about 250 tokens.
fn tool_step(messages: &mut Vec<Value>, t: usize) {
    messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": format!("call_{t}"), "type": "function",
         "function": {"name": "read", "arguments": format!("{{\"path\":\"src/m{t}.rs\"}}")}}]}));
    messages.push(json!({"role": "tool", "tool_call_id": format!("call_{t}"),
        "content": format!("fn m{t}() {{}} {}", "data ".repeat(250))}));
}

fn ready_used(metrics: &str) -> f64 {
    common::metric(metrics, "compactor_ready_checkpoints_used_total").unwrap_or(0.0)
}

#[tokio::test]
async fn a_clearing_over_the_ready_summary_counts_it_as_used() {
    let mock = start_mock().await;
    mock.set_window(W);
    mock.state.summary_delay_ms.store(50, Ordering::SeqCst);
    let mut cfg = config(&mock.url());
    cfg.windows.insert("agent-model".into(), W);
    cfg.summarizer.window = 100_000;
    cfg.compaction.ahead_of_time = true;
    cfg.compaction.clear_tool_results_first = true;
    cfg.compaction.clear_min_share = 0.0;
    let proxy = start_proxy(cfg).await;
    let metrics = || async {
        common::get(&format!("{}/metrics", proxy.url()), None)
            .await
            .1
    };

    // Plain turns until a summary is made ahead of time, then the window is crossed through it.
    let mut messages = vec![json!({"role":"system","content":"You help with code."})];
    let mut t = 0;
    let ready_id = loop {
        assert!(t < 60, "the ready summary was never applied");
        turn(&mut messages, t);
        t += 1;
        let (headers, _) = send(&proxy, &messages).await;
        proxy.app.engine.background_settled().await;
        if headers.get("x-compactor-compacted").unwrap() == "true" {
            assert_eq!(headers.get("x-compactor-ready-checkpoint").unwrap(), "true");
            break headers.get("x-compactor-checkpoint").unwrap().clone();
        }
    };
    // The next summaries take longer than the agent's steps, so the ready one stays the newest.
    mock.state.summary_delay_ms.store(30_000, Ordering::SeqCst);

    // Tool steps until the conversation is over the window even through the ready summary:
    // clearing old results over it is enough, without waiting for a summary.
    let cleared = loop {
        assert!(t < 120, "no clearing was made over the ready summary");
        tool_step(&mut messages, t);
        t += 1;
        let used_before = ready_used(&metrics().await);
        let (headers, elapsed) = send(&proxy, &messages).await;
        assert_eq!(headers.get("x-compactor-compacted").unwrap(), "true");
        assert_eq!(headers.get("x-compactor-ready-checkpoint").unwrap(), "true");
        assert!(headers.get("x-compactor-summary-ms").is_none());
        assert!(
            elapsed < Duration::from_secs(5),
            "step {t} waited {elapsed:?}"
        );
        // Every request the ready summary served is counted, the clearing's too.
        assert_eq!(ready_used(&metrics().await), used_before + 1.0, "step {t}");
        let id = headers.get("x-compactor-checkpoint").unwrap().clone();
        if id != ready_id {
            break id;
        }
    };
    let chats = mock.chats();
    let forwarded = String::from_utf8_lossy(&chats.last().unwrap().body).to_string();
    assert!(
        forwarded.contains("cleared"),
        "{cleared:?} is not a clearing"
    );
    assert_eq!(mock.state.overflows.load(Ordering::SeqCst), 0);
}
