//! The token-count correction learned from providers' `usage`, against the mock provider: one
//! tenant's odd prompts and anyone's images never move it for the others, a chat template's
//! fixed overhead is added rather than multiplied, it starts neutral, a correction alone never
//! refuses a request, and `/metrics` shows it per model.

mod common;

use std::future::Future;

use compactor::dialect::chat::request::ChatRequest;
use compactor::measure::Meter;
use serde_json::{json, Value};

use common::{config, start_mock, start_proxy, Proxy, Reply};

async fn send(proxy: &Proxy, body: &Value, auth: &str, extra: &[(&str, &str)]) -> Reply {
    let mut headers = vec![
        ("authorization", auth),
        ("content-type", "application/json"),
    ];
    headers.extend_from_slice(extra);
    let url = format!("{}/v1/chat/completions", proxy.url());
    common::post(&url, &headers, body.to_string()).await
}

/// Runs `request` and waits until the proxy has learned from its answer (the model's stored
/// facts changed), since `usage` is read after the body is streamed back.
async fn learned_from(proxy: &Proxy, model: &str, request: impl Future<Output = Reply>) -> Reply {
    let store = proxy.app.engine.store();
    let before = store.model_facts(model).await.unwrap();
    let reply = request.await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    common::eventually("the answer to be learned from", async || {
        store.model_facts(model).await.unwrap() != before
    })
    .await;
    reply
}

/// About `words` tokens of ordinary text.
fn text(seed: usize, words: usize) -> String {
    (0..words)
        .map(|i| format!("w{seed}x{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn chat(model: &str, system: &str, user: Value) -> Value {
    json!({"model": model, "messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": user},
    ]})
}

/// The proxy's own count of a chat body.
fn our_count(body: &Value) -> u64 {
    let request = ChatRequest::parse(body.to_string().as_bytes()).unwrap();
    Meter::new(16).measure(&request).total()
}

fn prompt_tokens(reply: &Reply) -> u64 {
    reply
        .header("x-compactor-prompt-tokens")
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn one_tenants_odd_prompt_and_anothers_images_do_not_refuse_a_third_tenants_request() {
    let mock = start_mock().await;
    let mut cfg = config(&mock.url());
    cfg.windows.insert("victim-model".into(), 32_768);
    let proxy = start_proxy(cfg).await;

    // A prompt the provider bills at 21 times our count (150 KB of spaces did that) ...
    let odd = chat("victim-model", "be brief", json!(text(1, 500)));
    learned_from(
        &proxy,
        "victim-model",
        send(
            &proxy,
            &odd,
            "Bearer one",
            &[("x-mock-billed-tokens", "25002")],
        ),
    )
    .await;
    // ... and an ordinary request with three images, whose cost is the provider's own.
    let image = json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}});
    let pictures = chat(
        "victim-model",
        "be brief",
        json!([{"type": "text", "text": "What is in these?"}, image, image, image]),
    );
    learned_from(
        &proxy,
        "victim-model",
        send(
            &proxy,
            &pictures,
            "Bearer two",
            &[("x-mock-billed-tokens", "30000")],
        ),
    )
    .await;

    // Another tenant's request at about a quarter of the window is served as it is, counted as
    // the proxy counts it.
    let body = json!({
        "model": "victim-model",
        "max_tokens": 1024,
        "messages": [
            {"role": "system", "content": text(2, 700)},
            {"role": "user", "content": text(3, 1_060)},
        ],
    });
    let ours = our_count(&body);
    assert!((7_000..9_000).contains(&ours), "{ours}");
    let r = send(&proxy, &body, "Bearer victim", &[]).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("x-compactor-compacted"), Some("false"));
    assert_eq!(prompt_tokens(&r), ours);
}

#[tokio::test]
async fn a_chat_templates_fixed_overhead_is_added_not_multiplied() {
    let mock = start_mock().await;
    let mut cfg = config(&mock.url());
    cfg.windows.insert("qwen-local".into(), 4096);
    let proxy = start_proxy(cfg).await;
    // Two users' smoke tests against llama-server, whose chat template adds 20 tokens.
    let template = [("x-mock-template-tokens", "20")];
    for (auth, greeting) in [
        ("Bearer a", "Say hi."),
        ("Bearer b", "Say hi. Say hi. Say hi."),
    ] {
        let body =
            json!({"model": "qwen-local", "messages": [{"role": "user", "content": greeting}]});
        learned_from(&proxy, "qwen-local", send(&proxy, &body, auth, &template)).await;
    }

    // Qwen Code's first turn (about 1,900 tokens) then fits the 4k window it is served in.
    let first_turn = chat("qwen-local", &text(4, 900), json!("Read the README."));
    let ours = our_count(&first_turn);
    let r = send(&proxy, &first_turn, "Bearer c", &template).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("x-compactor-compacted"), Some("false"));
    let counted = prompt_tokens(&r);
    assert!(
        counted > ours && counted <= ours + 20,
        "{counted} for {ours} of ours"
    );

    // The live correction is shown per model.
    let (status, metrics) = common::get(&format!("{}/metrics", proxy.url()), None).await;
    assert_eq!(status, 200);
    let value = |name: &str| -> f64 {
        let series = format!("{name}{{model=\"qwen-local\"}}");
        common::metric(&metrics, &series).unwrap_or_else(|| panic!("no {series} in\n{metrics}"))
    };
    assert_eq!(value("compactor_model_correction_factor"), 1.0);
    let overhead = value("compactor_model_correction_overhead_tokens");
    assert!((1.0..=20.0).contains(&overhead), "{overhead}");
    assert_eq!(value("compactor_model_window_tokens"), 4096.0);
    assert!(value("compactor_model_correction_observations") >= 2.0);
}

#[tokio::test]
async fn a_first_request_near_the_window_is_served_with_no_correction_learned() {
    let mock = start_mock().await;
    let mut cfg = config(&mock.url());
    cfg.windows.insert("qwen-local".into(), 16_384);
    let proxy = start_proxy(cfg).await;
    // Qwen Code's default prompt is about 13,200 tokens: 80 % of a 16k window.
    let body = chat("qwen-local", &text(5, 2_720), json!("hi"));
    let ours = our_count(&body);
    assert!((12_500..14_500).contains(&ours), "{ours}");
    let r = send(&proxy, &body, "Bearer new-user", &[]).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(prompt_tokens(&r), ours);
    assert_eq!(
        mock.chats().last().unwrap().json()["messages"],
        body["messages"]
    );
}

#[tokio::test]
async fn a_request_that_only_the_correction_says_is_too_large_is_forwarded() {
    let mock = start_mock().await;
    let mut cfg = config(&mock.url());
    cfg.windows.insert("wide-tokenizer".into(), 8192);
    let proxy = start_proxy(cfg).await;
    // Two tenants agree that the provider counts twice what we do.
    for (seed, auth) in [(6, "Bearer a"), (7, "Bearer b")] {
        let body = chat("wide-tokenizer", "be brief", json!(text(seed, 300)));
        let billed = (2 * our_count(&body)).to_string();
        learned_from(
            &proxy,
            "wide-tokenizer",
            send(&proxy, &body, auth, &[("x-mock-billed-tokens", &billed)]),
        )
        .await;
    }
    // 60 % of the window by our count, 120 % corrected: sent, and the answer teaches.
    let body = chat("wide-tokenizer", "be brief", json!(text(8, 1_200)));
    let ours = our_count(&body);
    assert!((4_500..5_500).contains(&ours), "{ours}");
    let r = send(&proxy, &body, "Bearer c", &[]).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        prompt_tokens(&r) > ours * 3 / 2,
        "the correction was learned"
    );
    assert_eq!(
        mock.chats().last().unwrap().json()["messages"],
        body["messages"]
    );
}
