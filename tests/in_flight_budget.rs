//! The in-flight budget of buffered bodies (`max_in_flight_body_bytes`) bounds what requests
//! hold in memory: each body is charged for its parsed form too, for as long as it is served.

mod common;

use common::{config, eventually, start_mock, start_proxy, Proxy, Reply};
use compactor::http::limits::HELD_PER_BODY_BYTE;

/// A chat body of exactly `len` bytes for `model`.
fn chat_of(len: usize, model: &str) -> String {
    let body = serde_json::json!({"model": model, "messages": [{"role": "user", "content": "hi"}]})
        .to_string();
    format!("{body}{}", " ".repeat(len - body.len()))
}

async fn post(proxy: &Proxy, body: String) -> Reply {
    common::post(
        &format!("{}/v1/chat/completions", proxy.url()),
        &[("authorization", "Bearer k")],
        body,
    )
    .await
}

#[tokio::test]
async fn a_body_is_charged_for_its_parsed_form_while_it_is_served() {
    const BODY: usize = 1000;
    let mock = start_mock().await;
    let mut cfg = config(&mock.url());
    cfg.max_body_bytes = 4000;
    cfg.max_in_flight_body_bytes = 5000;
    // Two bodies' bytes fit the budget; what two of them hold once parsed does not.
    assert!(2 * BODY < cfg.max_in_flight_body_bytes);
    assert!(2.0 * BODY as f64 * HELD_PER_BODY_BYTE > cfg.max_in_flight_body_bytes as f64);
    let proxy = start_proxy(cfg).await;

    // The provider never answers this one: it stays in flight, read and parsed.
    let url = proxy.url();
    let waiting = tokio::spawn(async move {
        common::post(
            &format!("{url}/v1/chat/completions"),
            &[("authorization", "Bearer k")],
            chat_of(BODY, "mock-hang"),
        )
        .await
    });
    eventually("the first request to reach the provider", async || {
        !mock.chats().is_empty()
    })
    .await;

    let refused = post(&proxy, chat_of(BODY, "gpt-4o")).await;
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert_eq!(refused.header("retry-after"), Some("1"));
    let error = &refused.json()["error"];
    assert_eq!(error["code"], "overloaded", "{}", refused.body);
    assert_eq!(
        mock.chats().len(),
        1,
        "the refused body never went upstream"
    );

    // Once the first client gives up, its budget is free again.
    waiting.abort();
    eventually("the budget to be returned", async || {
        post(&proxy, chat_of(BODY, "gpt-4o")).await.status == 200
    })
    .await;
    // A body charged more than the whole budget is still served when it is alone.
    let alone = post(&proxy, chat_of(4000, "gpt-4o")).await;
    assert_eq!(alone.status, 200, "{}", alone.body);
}
