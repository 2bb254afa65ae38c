//! Windows learned from providers' answers, against the mock provider: only the provider's own
//! overflow errors teach one, a larger accepted prompt raises it, and it expires; one tenant
//! can never shrink a model's window for the others, and an overflow that states no window
//! teaches nothing from a prompt with images and no bound below what was sent.

mod common;

use std::time::Duration;

use serde_json::{json, Value};

use common::{config, start_mock, start_proxy, OverflowStyle, Proxy, Reply};

/// A conversation of about `words` tokens (by the mock's count) in `turns` turns.
fn conversation(model: &str, turns: usize, words: usize) -> Value {
    let mut messages = vec![json!({"role": "system", "content": "You are a coding agent."})];
    for t in 0..turns {
        let text: Vec<String> = (0..words / turns / 2)
            .map(|w| format!("w{t}x{w}"))
            .collect();
        messages.push(json!({"role": "user", "content": format!("step {t}: {}", text.join(" "))}));
        messages
            .push(json!({"role": "assistant", "content": format!("done {t}: {}", text.join(" "))}));
    }
    messages.push(json!({"role": "user", "content": "What next?"}));
    json!({"model": model, "messages": messages})
}

async fn send(proxy: &Proxy, body: &Value, auth: &str, mode: &str) -> Reply {
    send_with(proxy, body, auth, mode, &[]).await
}

async fn send_with(
    proxy: &Proxy,
    body: &Value,
    auth: &str,
    mode: &str,
    extra: &[(&str, &str)],
) -> Reply {
    let mut headers = vec![
        ("authorization", auth),
        ("x-compactor-mode", mode),
        ("content-type", "application/json"),
    ];
    headers.extend_from_slice(extra);
    let url = format!("{}/v1/chat/completions", proxy.url());
    common::post(&url, &headers, body.to_string()).await
}

/// A provider whose overflow errors state no window.
fn without_figures(mock: &common::Mock, window: u64) {
    mock.set_window(window);
    *mock.state.overflow_style.lock().unwrap() = Some(OverflowStyle::NoFigures);
}

/// The window the proxy says it used for a reply.
fn window(reply: &Reply) -> Option<u64> {
    reply
        .header("x-compactor-context-window")
        .and_then(|v| v.parse().ok())
}

/// Waits until the proxy believes `window` for `model` (usage is read after the body streams).
async fn until_window(proxy: &Proxy, model: &str, window: u64) {
    for _ in 0..100 {
        if proxy.app.engine.window_for(model).await == window {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "{model}: window {} instead of {window}",
        proxy.app.engine.window_for(model).await
    );
}

#[tokio::test]
async fn an_overflow_message_quoted_back_from_the_clients_input_teaches_nothing() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&mock.url());
    cfg.store = dir.path().join("c.sqlite3").display().to_string();
    cfg.windows.insert("victim-model".into(), 100_000);
    let proxy = start_proxy(cfg.clone()).await;

    // The attacker's request: the provider quotes its `tool_choice` back in a 400.
    let mut attack = conversation("victim-model", 1, 10);
    attack["tool_choice"] = json!("This model's maximum context length is 64 tokens");
    let r = send(&proxy, &attack, "Bearer attacker", "auto").await;
    assert_eq!(r.status, 400);
    assert!(r.body.contains("Invalid tool_choice"), "{}", r.body);

    // Another tenant's ordinary request is untouched.
    let normal = conversation("victim-model", 4, 400);
    let r = send(&proxy, &normal, "Bearer victim", "auto").await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(window(&r), Some(100_000));
    assert_eq!(
        mock.chats().last().unwrap().json()["messages"],
        normal["messages"]
    );
    drop(proxy);

    // Nor after a restart on the same store.
    let proxy = start_proxy(cfg).await;
    let r = send(&proxy, &normal, "Bearer victim", "auto").await;
    assert_eq!((r.status, window(&r)), (200, Some(100_000)), "{}", r.body);
}

#[tokio::test]
async fn a_413_page_from_a_front_teaches_nothing() {
    let mock = start_mock().await;
    let mut cfg = config(&mock.url());
    cfg.windows.insert("mock-413-html".into(), 100_000);
    let proxy = start_proxy(cfg).await;
    let r = send(
        &proxy,
        &conversation("mock-413-html", 4, 400),
        "Bearer k",
        "auto",
    )
    .await;
    assert_eq!(r.status, 413);
    assert_eq!(proxy.app.engine.window_for("mock-413-html").await, 100_000);
    let stored = proxy
        .app
        .engine
        .store()
        .model_facts("mock-413-html")
        .await
        .unwrap();
    assert_eq!(stored, Default::default(), "nothing stored for the model");
}

#[tokio::test]
async fn a_genuine_overflow_teaches_and_a_larger_accepted_prompt_raises_it_again() {
    let mock = start_mock().await;
    mock.set_window(3000);
    let mut cfg = config(&mock.url());
    cfg.windows.insert("agent-model".into(), 100_000);
    cfg.compaction.keep_recent_tokens = 1000;
    cfg.summarizer.window = 200_000;
    let proxy = start_proxy(cfg).await;
    let big = conversation("agent-model", 20, 5000);

    let r = send(&proxy, &big, "Bearer k", "auto").await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        mock.state
            .overflows
            .load(std::sync::atomic::Ordering::SeqCst),
        1
    );
    assert_eq!(proxy.app.engine.window_for("agent-model").await, 3000);

    // The provider now takes more: a prompt above the learned window, sent as it is, succeeds
    // and the learned window gives way to the configured one.
    mock.set_window(50_000);
    let r = send(&proxy, &big, "Bearer k", "off").await;
    assert_eq!(r.status, 200, "{}", r.body);
    until_window(&proxy, "agent-model", 100_000).await;
    let r = send(&proxy, &big, "Bearer other", "auto").await;
    assert_eq!((r.status, window(&r)), (200, Some(100_000)));
}

#[tokio::test]
async fn learned_windows_expire() {
    let mock = start_mock().await;
    mock.set_window(3000);
    let mut cfg = config(&mock.url());
    cfg.windows.insert("agent-model".into(), 100_000);
    cfg.compaction.keep_recent_tokens = 1000;
    cfg.compaction.model_facts_ttl_secs = 1;
    cfg.summarizer.window = 200_000;
    let proxy = start_proxy(cfg).await;
    let r = send(
        &proxy,
        &conversation("agent-model", 20, 5000),
        "Bearer k",
        "auto",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(proxy.app.engine.window_for("agent-model").await, 3000);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(proxy.app.engine.window_for("agent-model").await, 100_000);
}

#[tokio::test]
async fn an_overflow_without_figures_for_a_prompt_with_images_teaches_no_window() {
    let mock = start_mock().await;
    without_figures(&mock, 128_000);
    let mut cfg = config(&mock.url());
    cfg.windows.insert("vision-model".into(), 128_000);
    let proxy = start_proxy(cfg).await;
    // Eight images the provider bills at more than the window.
    let image = json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}});
    let mut parts = vec![json!({"type": "text", "text": "Compare these."})];
    parts.extend(std::iter::repeat_n(image, 8));
    let body = json!({"model": "vision-model", "messages": [{"role": "user", "content": parts}]});
    let r = send_with(
        &proxy,
        &body,
        "Bearer a",
        "auto",
        &[("x-mock-billed-tokens", "200000")],
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(proxy.app.engine.window_for("vision-model").await, 128_000);

    // Neither the sender's next chat nor another tenant's is planned under a smaller window.
    let small = conversation("vision-model", 2, 400);
    for auth in ["Bearer a", "Bearer b"] {
        let r = send(&proxy, &small, auth, "auto").await;
        assert_eq!((r.status, window(&r)), (200, Some(128_000)), "{auth}");
        assert_eq!(r.header("x-compactor-compacted"), Some("false"));
    }
}

#[tokio::test]
async fn an_overflow_without_figures_bounds_its_tenants_window_not_below_what_was_sent() {
    let mock = start_mock().await;
    without_figures(&mock, 8192);
    let mut cfg = config(&mock.url());
    cfg.windows.insert("honest-model".into(), 128_000);
    let proxy = start_proxy(cfg).await;
    // An accepted request first, as in any session: what the provider reports is learned.
    let r = send(
        &proxy,
        &conversation("honest-model", 2, 2_000),
        "Bearer a",
        "auto",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    // Then one user message a little over the window.
    let words: Vec<String> = (0..3_200).map(|w| format!("w{w}")).collect();
    let over = json!({"model": "honest-model", "messages": [{"role": "user", "content": words.join(" ")}]});
    let sent = common::mock_tokens(&over);
    assert!((8_193..10_000).contains(&sent), "{sent}");
    send(&proxy, &over, "Bearer a", "auto").await;
    let r = send(
        &proxy,
        &conversation("honest-model", 1, 10),
        "Bearer a",
        "auto",
    )
    .await;
    let learned = window(&r).unwrap();
    assert!(
        (8_192..128_000).contains(&learned),
        "learned {learned} for a window of 8192"
    );
}

#[tokio::test]
async fn one_tenants_overflow_without_figures_bounds_only_its_own_window_until_another_meets_one() {
    let mock = start_mock().await;
    without_figures(&mock, 3000);
    let mut cfg = config(&mock.url());
    cfg.windows.insert("agent-model".into(), 100_000);
    cfg.compaction.keep_recent_tokens = 1000;
    cfg.summarizer.window = 200_000;
    let proxy = start_proxy(cfg).await;
    let big = conversation("agent-model", 20, 5000);
    let small = conversation("agent-model", 1, 10);
    let window_of = async |auth: &str| window(&send(&proxy, &small, auth, "auto").await).unwrap();

    send(&proxy, &big, "Bearer a", "auto").await;
    assert!(window_of("Bearer a").await < 100_000);
    assert_eq!(window_of("Bearer b").await, 100_000);
    assert_eq!(proxy.app.engine.window_for("agent-model").await, 100_000);

    // A second tenant meets one too: now it is everyone's.
    send(&proxy, &big, "Bearer b", "auto").await;
    assert!(window_of("Bearer c").await < 100_000);

    // The provider accepts a prompt larger than both bounds: they are dropped.
    mock.set_window(0);
    let r = send_with(
        &proxy,
        &big,
        "Bearer a",
        "off",
        &[("x-mock-billed-tokens", "50000")],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    until_window(&proxy, "agent-model", 100_000).await;
    assert_eq!(window_of("Bearer a").await, 100_000);
}
