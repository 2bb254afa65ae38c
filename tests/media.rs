//! Images and documents as agents send them (a pasted screenshot, the Read tool on a PNG or a
//! PDF, Codex's `view_image`), through the proxy against the mock providers: counted as the
//! providers bill them rather than as their base64, forwarded byte for byte while kept, named by
//! a placeholder (never their bytes) in a summarizer's prompt, and never learned from when their
//! cost is a guess.

mod common;

use common::media::{base64, has_base64_run, pdf, png};
use common::responses_mock::{start_responses_mock, ResponsesMock};
use common::{messages_mock, start_mock, start_proxy, Proxy, Reply};
use serde_json::{json, Value};

const CLAUDE: &str = "claude-sonnet-4-5";
const RESPONSES_MODEL: &str = "mock-responses";

async fn post(proxy: &Proxy, path: &str, headers: &[(&str, &str)], body: &Value) -> Reply {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    common::post(&format!("{}{path}", proxy.url()), &all, body.to_string()).await
}

fn prompt_tokens(reply: &Reply) -> u64 {
    reply
        .header("x-compactor-prompt-tokens")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no prompt tokens header: {:?}", reply.headers))
}

/// A proxy in front of a Messages mock, with the built-in windows (Claude: 200,000 tokens).
async fn messages_proxy(mock: &messages_mock::MessagesMock) -> Proxy {
    let mut config = common::config("http://127.0.0.1:9/v1");
    config.anthropic_upstream = mock.url();
    start_proxy(config).await
}

fn image_block(data: &str) -> Value {
    json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}})
}

#[tokio::test]
async fn a_400_kb_screenshot_on_messages_is_forwarded_not_refused() {
    let mock = messages_mock::start().await;
    let proxy = messages_proxy(&mock).await;
    let screenshot = base64(&png(1920, 1080, 400_000));
    let body = json!({"model": CLAUDE, "max_tokens": 4096, "messages": [{"role": "user", "content": [
        image_block(&screenshot),
        {"type": "text", "text": "What is in this screenshot?"},
    ]}]});
    let reply = post(&proxy, "/v1/messages", &[("x-api-key", "sk-a")], &body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("x-compactor-compacted"), Some("false"));
    // 1920 × 1080 is scaled to 1568 × 882 and capped at 1,600 tokens; the text adds a few.
    let counted = prompt_tokens(&reply);
    assert!((1600..1700).contains(&counted), "{counted}");
    let forwarded = mock.forwarded();
    assert_eq!(forwarded.len(), 1);
    assert_eq!(forwarded[0].json()["messages"], body["messages"]);
}

#[tokio::test]
async fn a_pdf_document_on_messages_is_forwarded_and_billed_by_its_pages() {
    let mock = messages_mock::start().await;
    let proxy = messages_proxy(&mock).await;
    let document = base64(&pdf(4, 450_000));
    let body = json!({"model": CLAUDE, "max_tokens": 4096, "messages": [{"role": "user", "content": [
        {"type": "document", "title": "Design notes",
         "source": {"type": "base64", "media_type": "application/pdf", "data": document}},
        {"type": "text", "text": "Summarize this document."},
    ]}]});
    let reply = post(&proxy, "/v1/messages", &[("x-api-key", "sk-a")], &body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let counted = prompt_tokens(&reply);
    assert!((12_000..12_100).contains(&counted), "4 pages: {counted}");
    assert_eq!(mock.forwarded()[0].json()["messages"], body["messages"]);
}

/// A proxy in front of a Responses mock, planning with `window` for the mock's model.
async fn responses_proxy(mock: &ResponsesMock, window: u64) -> Proxy {
    let mut config = common::config(&mock.url());
    config.windows.insert(RESPONSES_MODEL.into(), window);
    config.compaction.keep_recent_tokens = window / 5;
    config.compaction.reserve_output_tokens = 256;
    config.compaction.margin_tokens = 64;
    config.summarizer.window = 100_000;
    start_proxy(config).await
}

fn data_url(png: &[u8]) -> String {
    format!("data:image/png;base64,{}", base64(png))
}

#[tokio::test]
async fn a_533_kb_input_image_on_responses_is_forwarded_and_an_image_beside_text_costs_its_tiles() {
    let mock = start_responses_mock().await;
    let proxy = responses_proxy(&mock, 128_000).await;
    let image = data_url(&png(1920, 1080, 400_000));
    assert!(image.len() > 533_000);
    let alone = json!({"model": RESPONSES_MODEL, "input": [{"type": "message", "role": "user",
        "content": [{"type": "input_image", "image_url": image}]}]});
    let reply = post(
        &proxy,
        "/v1/responses",
        &[("authorization", "Bearer a")],
        &alone,
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    // 1920 × 1080 at high detail: 1365 × 768, six tiles.
    let counted = prompt_tokens(&reply);
    assert!((1105..1130).contains(&counted), "{counted}");
    assert_eq!(mock.turns()[0].json()["input"], alone["input"]);

    let beside_text = json!({"model": RESPONSES_MODEL, "input": [{"type": "message", "role": "user",
        "content": [{"type": "input_text", "text": "What is in this screenshot?"},
                    {"type": "input_image", "image_url": image, "detail": "high"}]}]});
    let reply = post(
        &proxy,
        "/v1/responses",
        &[("authorization", "Bearer a")],
        &beside_text,
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(prompt_tokens(&reply) > counted, "the image is not free");
}

/// Codex's thread with a `view_image` call whose output is a 1 MB screenshot, at turn `shot`
/// of `turns` turns.
fn thread_with_screenshot(turns: usize, shot: usize, screenshot: &str) -> Vec<Value> {
    let mut items = vec![json!({"type": "message", "role": "developer",
        "content": [{"type": "input_text", "text": "You are a coding agent."}]})];
    for t in 0..turns {
        let words: Vec<String> = (0..40).map(|i| format!("t{t}w{i}")).collect();
        items.push(json!({"type": "message", "role": "user",
            "content": [{"type": "input_text", "text": format!("Step {t}: {}", words.join(" "))}]}));
        let call_id = format!("call_{t}");
        if t == shot {
            items.push(
                json!({"type": "function_call", "call_id": call_id, "name": "view_image",
                "arguments": "{\"path\":\"shots/login.png\"}"}),
            );
            items.push(json!({"type": "function_call_output", "call_id": call_id,
                "output": [{"type": "input_image", "image_url": screenshot}]}));
        } else {
            let output: Vec<String> = (0..300).map(|i| format!("o{t}x{i}")).collect();
            items.push(
                json!({"type": "function_call", "call_id": call_id, "name": "exec_command",
                "arguments": format!("{{\"cmd\":\"cat f{t}\"}}")}),
            );
            items.push(json!({"type": "function_call_output", "call_id": call_id,
                "output": output.join(" ")}));
        }
        items.push(json!({"type": "message", "role": "assistant",
            "content": [{"type": "output_text", "text": format!("done {t}")}]}));
    }
    items
}

#[tokio::test]
async fn a_screenshot_in_a_kept_function_call_output_is_forwarded_verbatim() {
    let mock = start_responses_mock().await;
    let proxy = responses_proxy(&mock, 32_000).await;
    let screenshot = data_url(&png(2560, 1600, 1_000_000));
    let items = thread_with_screenshot(6, 5, &screenshot);
    let body = json!({"model": RESPONSES_MODEL, "input": items});
    let reply = post(
        &proxy,
        "/v1/responses",
        &[("authorization", "Bearer a")],
        &body,
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("x-compactor-compacted"), Some("false"));
    let forwarded = String::from_utf8(mock.turns()[0].body.to_vec()).unwrap();
    let output = items
        .iter()
        .find(|i| i["call_id"] == "call_5" && i["type"] == "function_call_output")
        .unwrap();
    assert!(
        forwarded.contains(&output.to_string()),
        "the screenshot's output reaches the model byte for byte"
    );
}

#[tokio::test]
async fn a_screenshot_in_a_summarized_span_is_a_placeholder_in_the_summary_request() {
    let mock = start_responses_mock().await;
    let proxy = responses_proxy(&mock, 6_000).await;
    let screenshot = data_url(&png(2560, 1600, 1_000_000));
    let items = thread_with_screenshot(12, 1, &screenshot);
    let body = json!({"model": RESPONSES_MODEL, "input": items});
    let reply = post(
        &proxy,
        "/v1/responses",
        &[("authorization", "Bearer a")],
        &body,
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("x-compactor-compacted"), Some("true"));
    let summaries = mock.summaries();
    assert!(!summaries.is_empty());
    for summary in &summaries {
        let text = String::from_utf8(summary.body.to_vec()).unwrap();
        assert!(
            !has_base64_run(&text, 200),
            "no media bytes in a summary request"
        );
        assert!(!text.contains("base64,"));
    }
    let prompt = String::from_utf8(summaries[0].body.to_vec()).unwrap();
    for named in [
        "image (image/png, 1000000 bytes, 2560x1600)",
        "returned by the call view_image (call_1)",
    ] {
        assert!(prompt.contains(named), "{named} in {prompt}");
    }
    // The model is sent the summary, not the screenshot.
    let forwarded = String::from_utf8(mock.turns().last().unwrap().body.to_vec()).unwrap();
    assert!(!forwarded.contains(&screenshot));
}

#[tokio::test]
async fn a_screenshot_in_a_summarized_tool_result_on_messages_is_a_placeholder() {
    let mock = messages_mock::start().await;
    let mut config = common::config("http://127.0.0.1:9/v1");
    config.anthropic_upstream = mock.url();
    config.windows.insert(CLAUDE.into(), 6_000);
    config.compaction.keep_recent_tokens = 1_200;
    config.summarizer.window = 100_000;
    let proxy = start_proxy(config).await;
    let screenshot = base64(&png(1280, 800, 600_000));
    let mut messages = vec![
        json!({"role": "user", "content": "Open the login page and look at it."}),
        json!({"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_shot",
            "name": "browser_screenshot", "input": {"url": "http://localhost:3000/login"}}]}),
        json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_shot",
            "content": [{"type": "text", "text": "Screenshot taken"}, image_block(&screenshot)]}]}),
        json!({"role": "assistant", "content": "The login button overlaps the footer."}),
    ];
    for t in 0..10 {
        let words: Vec<String> = (0..300).map(|i| format!("m{t}w{i}")).collect();
        messages.push(json!({"role": "user", "content": format!("Next {t}: {}", words.join(" "))}));
        messages.push(json!({"role": "assistant", "content": format!("ok {t}")}));
    }
    messages.push(json!({"role": "user", "content": "Now fix the footer."}));
    let body = json!({"model": CLAUDE, "max_tokens": 1024, "messages": messages});
    let reply = post(&proxy, "/v1/messages", &[("x-api-key", "sk-a")], &body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("x-compactor-compacted"), Some("true"));
    let summaries = mock.summaries();
    assert!(!summaries.is_empty());
    let prompt = String::from_utf8(summaries[0].body.to_vec()).unwrap();
    assert!(!has_base64_run(&prompt, 200), "no media bytes: {prompt}");
    for named in [
        "image (image/png, 600000 bytes, 1280x800)",
        "returned by the call browser_screenshot (toolu_shot)",
    ] {
        assert!(prompt.contains(named), "{named} in {prompt}");
    }
}

/// A chat request of `words` words of text and `image`, from `auth`, that the provider bills
/// at twice our count; returns once the proxy has seen the answer.
async fn chat_with_image(proxy: &Proxy, model: &str, auth: &str, image: &Value, words: usize) {
    let text: Vec<String> = (0..words).map(|i| format!("{auth}{i}")).collect();
    let body = json!({"model": model, "messages": [{"role": "user", "content": [
        {"type": "text", "text": text.join(" ")}, image]}]});
    // What the proxy counts, to bill twice that.
    let request =
        compactor::dialect::chat::request::ChatRequest::parse(body.to_string().as_bytes()).unwrap();
    let ours = compactor::measure::Meter::new(16).measure(&request).total();
    let billed = (2 * ours).to_string();
    let store = proxy.app.engine.store();
    let before = store.model_facts(model).await.unwrap();
    let reply = post(
        proxy,
        "/v1/chat/completions",
        &[("authorization", auth), ("x-mock-billed-tokens", &billed)],
        &body,
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    common::eventually("the answer to be seen", async || {
        store.model_facts(model).await.unwrap() != before
    })
    .await;
}

/// Requests of two tenants for `model`, each with `image`, that the provider bills at twice
/// our count.
async fn from_two_tenants(proxy: &Proxy, model: &str, image: &Value) {
    for (auth, words) in [("Bearer a", 300), ("Bearer b", 600)] {
        chat_with_image(proxy, model, auth, image, words).await;
    }
}

#[tokio::test]
async fn a_prompt_whose_image_cost_is_a_guess_does_not_move_the_correction() {
    let mock = start_mock().await;
    let proxy = start_proxy(common::config(&mock.url())).await;
    let engine = &proxy.app.engine;
    let behind_url =
        json!({"type": "image_url", "image_url": {"url": "https://example.com/a.png"}});
    from_two_tenants(&proxy, "gpt-4o-a", &behind_url).await;
    assert_eq!(engine.correction_for("gpt-4o-a").await.factor, 1.0);
    // The same with images whose size their header states: those counts are ours to correct.
    let inline =
        json!({"type": "image_url", "image_url": {"url": data_url(&png(1024, 768, 50_000))}});
    from_two_tenants(&proxy, "gpt-4o-b", &inline).await;
    let factor = engine.correction_for("gpt-4o-b").await.factor;
    assert!((1.8..2.2).contains(&factor), "{factor}");
    // But not for a model whose provider bills images by rules of its own (a local vision
    // model behind llama.cpp): the cost of its images is a guess even with their size known.
    from_two_tenants(&proxy, "qwen2.5-vl-7b", &inline).await;
    assert_eq!(engine.correction_for("qwen2.5-vl-7b").await.factor, 1.0);
}

#[tokio::test]
async fn an_overflow_stating_a_window_for_a_prompt_with_a_guessed_image_teaches_no_window() {
    let mock = start_mock().await;
    mock.set_window(8192);
    let mut config = common::config(&mock.url());
    config.windows.insert("vision-model".into(), 128_000);
    config.windows.insert("text-model".into(), 128_000);
    let proxy = start_proxy(config).await;
    let words: Vec<String> = (0..2_500).map(|i| format!("w{i}")).collect();
    let send = async |model: &str, content: Value| {
        let body = json!({"model": model, "messages": [{"role": "user", "content": content}]});
        post(
            &proxy,
            "/v1/chat/completions",
            &[
                ("authorization", "Bearer a"),
                ("x-mock-billed-tokens", "9000"),
            ],
            &body,
        )
        .await
    };
    // An image behind a URL, which the provider bills by its own measure: refused as too long.
    let image = json!({"type": "image_url", "image_url": {"url": "https://example.com/a.png"}});
    let reply = send(
        "vision-model",
        json!([{"type": "text", "text": words.join(" ")}, image]),
    )
    .await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert_eq!(proxy.app.engine.window_for("vision-model").await, 128_000);
    // The same overflow of a prompt we counted teaches the window.
    let reply = send("text-model", json!(words.join(" "))).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert_eq!(proxy.app.engine.window_for("text-model").await, 8192);
}
