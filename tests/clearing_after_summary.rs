//! Clearing old tool output after a summary, through the proxy against a mock chat completions
//! provider, on a SQLite file: a conversation summarized once that grows past its budget again
//! is forwarded with the summary it had and the oldest tool results past its cut stubbed, with
//! no summary request; the next request is forwarded with the same bytes up to its new turns;
//! and a second proxy on the same file applies the stored clearing the same way.

mod common;

use common::{start_proxy, Mock, Proxy, Reply};
use serde_json::{json, Value};

const MODEL: &str = "qwen2.5-coder-0.5b";
const WINDOW: u64 = 4000;
const STUB: &str = "cleared to save context";

async fn proxy_on(mock: &Mock, store: &std::path::Path) -> Proxy {
    let mut config = common::config(&mock.url());
    config.store = store.display().to_string();
    config.windows.insert(MODEL.to_string(), WINDOW);
    config.compaction.keep_recent_tokens = WINDOW / 3;
    config.compaction.clear_tool_results_first = true;
    // Clear whenever clearing alone is enough: this suite follows what a clearing after a
    // summary does; when a summary is preferred to a clearing that frees little is
    // `clearing_first`'s to check.
    config.compaction.clear_min_share = 0.0;
    config.summarizer.window = 100_000;
    start_proxy(config).await
}

async fn post(proxy: &Proxy, messages: &[Value]) -> Reply {
    let body = json!({"model": MODEL, "max_tokens": 256, "messages": messages});
    common::post_chat(proxy, "sk-a", &body).await
}

/// One tool step: a read of `src/f{t}.rs` and its result of about `words` tokens.
fn step(t: usize, words: usize) -> [Value; 2] {
    [
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": format!("call_{t}"), "type": "function",
             "function": {"name": "read", "arguments": format!("{{\"path\":\"src/f{t}.rs\"}}")}}]}),
        json!({"role": "tool", "tool_call_id": format!("call_{t}"),
            "content": format!("fn f{t}() {{}} {}", "data ".repeat(words))}),
    ]
}

/// The raw JSON text of each message of the newest forwarded chat request.
fn last_forwarded(mock: &Mock) -> Vec<String> {
    #[derive(serde::Deserialize)]
    struct Body<'a> {
        #[serde(borrow)]
        messages: Vec<&'a serde_json::value::RawValue>,
    }
    let chats = mock.chats();
    let last = chats.last().expect("a request was forwarded");
    let body: Body = serde_json::from_slice(&last.body).unwrap();
    body.messages.iter().map(|m| m.get().to_string()).collect()
}

#[tokio::test]
async fn a_second_crossing_is_answered_by_clearing_and_replayed_by_another_replica() {
    let mock = common::start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("compactor.db");
    let one = proxy_on(&mock, &file).await;

    // The first crossing: the weight is a pasted log, which clearing cannot touch.
    let mut messages = vec![
        json!({"role": "system", "content": "be brief"}),
        json!({"role": "user", "content": format!("here is the log {}", "line ".repeat(2500))}),
    ];
    for t in 0..3 {
        messages.extend(step(t, 300));
    }
    post(&one, &messages).await;
    let summaries = mock.summaries().len();
    assert!(summaries > 0, "the first crossing is summarized");
    let first = last_forwarded(&mock);
    assert!(!first.iter().any(|m| m.contains(STUB)));

    // The conversation grows by tool steps until it crosses its budget again.
    let mut t = 3;
    let cleared = loop {
        assert!(t < 40, "the conversation never crossed its budget again");
        messages.extend(step(t, 150));
        t += 1;
        post(&one, &messages).await;
        assert_eq!(
            mock.summaries().len(),
            summaries,
            "step {t}: a crossing after the summary was summarized, not cleared"
        );
        let sent = last_forwarded(&mock);
        if sent.iter().any(|m| m.contains(STUB)) {
            break sent;
        }
    };
    assert_eq!(
        mock.summaries().len(),
        summaries,
        "the second crossing asked for no summary"
    );
    // The summary it had still stands first, as it was forwarded before.
    assert_eq!(
        cleared[..2],
        first[..2],
        "instructions and summary unchanged"
    );
    let stubbed: Vec<&String> = cleared.iter().filter(|m| m.contains(STUB)).collect();
    assert!(
        stubbed[0].contains("result of read cleared") && stubbed[0].contains("tokens"),
        "{}",
        stubbed[0]
    );
    // The newest three tool uses reach the model whole.
    let newest: Vec<&String> = cleared.iter().rev().take(6).collect();
    assert!(!newest.iter().any(|m| m.contains(STUB)), "{newest:?}");
    // The calls of the cleared results stay.
    let calls = cleared.iter().filter(|m| m.contains("tool_calls")).count();
    assert_eq!(
        calls,
        cleared.iter().filter(|m| m.contains("\"tool\"")).count()
    );

    // The next step: the same bytes up to its new turns, and still no summary.
    messages.extend(step(t, 20));
    t += 1;
    post(&one, &messages).await;
    let next = last_forwarded(&mock);
    assert_eq!(next[..cleared.len()], cleared[..], "byte-stable prefix");
    assert_eq!(next.len(), cleared.len() + 2);
    assert_eq!(mock.summaries().len(), summaries);

    // Another replica on the same file reads the stored clearing and applies it as it is.
    let two = proxy_on(&mock, &file).await;
    messages.extend(step(t, 20));
    post(&two, &messages).await;
    let elsewhere = last_forwarded(&mock);
    assert_eq!(
        elsewhere[..next.len()],
        next[..],
        "the other replica's prefix"
    );
    assert_eq!(mock.summaries().len(), summaries, "no summary there either");

    // Another tenant's same conversation is served nothing of this one's: neither its summary
    // nor its clearing.
    let body = json!({"model": MODEL, "max_tokens": 256, "messages": messages});
    common::post_chat(&two, "sk-b", &body).await;
    let theirs = last_forwarded(&mock);
    assert!(
        !theirs.contains(&first[1]),
        "tenant A's summary reached tenant B"
    );
    assert_ne!(theirs.get(..next.len()), Some(&next[..]));
}
