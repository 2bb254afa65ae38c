//! What client-chosen model names may cost: facts are stored only for models the provider
//! served (or genuinely refused as too long), stored facts lapse (SQLite prunes them, Redis
//! expires the key), and the facts kept in memory are bounded however many names arrive.

mod common;

use compactor::store::now_ms;
use redis::AsyncCommands;
use serde_json::{json, Value};

use common::redis_server::RedisServer;
use common::{client, config, eventually, start_mock, start_proxy, Mock, Proxy};

const TTL_SECS: u64 = 3600;

fn body(model: &str) -> Value {
    json!({"model": model, "messages": [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Say hello."},
    ]})
}

/// Requests naming `n` models each that fail in the ways a provider or a front fails: an
/// unknown model (404), a 413 page, an error quoting the client's input back.
fn failing(n: usize) -> Vec<Value> {
    let mut bodies = Vec::new();
    for i in 0..n {
        bodies.push(body(&format!("mock-404-{i}")));
        bodies.push(body(&format!("mock-413-html-{i}")));
        let mut echo = body(&format!("echo-{i}"));
        echo["tool_choice"] = json!("This model's maximum context length is 64 tokens");
        bodies.push(echo);
    }
    bodies
}

async fn status(proxy: &Proxy, body: &Value) -> u16 {
    let response = client()
        .post(format!("{}/v1/chat/completions", proxy.url()))
        .header("authorization", "Bearer k")
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    response.bytes().await.unwrap();
    status
}

/// Sends every failing request, then one that the provider serves.
async fn fail_then_serve(proxy: &Proxy) {
    for body in failing(10) {
        assert!(status(proxy, &body).await >= 400, "{body}");
    }
    assert_eq!(status(proxy, &body("served-model")).await, 200);
}

async fn proxy_on(mock: &Mock, store: String) -> Proxy {
    let mut cfg = config(&mock.url());
    cfg.store = store;
    cfg.compaction.model_facts_ttl_secs = TTL_SECS;
    start_proxy(cfg).await
}

fn assert_expires_after_the_ttl(expires_ms: u64) {
    let expected = now_ms() + TTL_SECS * 1000;
    assert!(
        expires_ms <= expected && expires_ms + 60_000 > expected,
        "expires at {expires_ms}, expected about {expected}"
    );
}

#[tokio::test]
async fn failing_model_names_leave_no_rows_in_sqlite_and_served_ones_lapse() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.sqlite3");
    let proxy = proxy_on(&mock, path.display().to_string()).await;
    fail_then_serve(&proxy).await;
    let mut rows = Vec::new();
    eventually("the served model's facts to be saved", async || {
        let db = rusqlite::Connection::open(&path).unwrap();
        let mut stmt = db
            .prepare("SELECT model, expires_ms FROM model_facts")
            .unwrap();
        rows = stmt
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
            .unwrap()
            .collect::<Result<Vec<(String, i64)>, _>>()
            .unwrap();
        !rows.is_empty()
    })
    .await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].0, "served-model");
    assert_expires_after_the_ttl(rows[0].1 as u64);
}

#[tokio::test]
async fn failing_model_names_leave_no_keys_in_redis_and_served_ones_expire() {
    let mock = start_mock().await;
    let redis = RedisServer::start();
    let proxy = proxy_on(&mock, redis.url()).await;
    fail_then_serve(&proxy).await;
    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut keys: Vec<String> = Vec::new();
    eventually("the served model's facts to be saved", async || {
        keys = conn.keys("compactor:model:*").await.unwrap();
        !keys.is_empty()
    })
    .await;
    assert_eq!(keys, vec!["compactor:model:served-model".to_string()]);
    let ttl_ms: i64 = conn.pttl(&keys[0]).await.unwrap();
    assert!(
        ttl_ms > 0 && ttl_ms as u64 <= TTL_SECS * 1000,
        "PTTL {ttl_ms}"
    );
    assert_expires_after_the_ttl(now_ms() + ttl_ms as u64);
}

#[tokio::test]
async fn facts_kept_in_memory_are_bounded() {
    let mock = start_mock().await;
    let mut cfg = config(&mock.url());
    cfg.compaction.model_facts_cache_size = 50;
    let proxy = start_proxy(cfg).await;
    for i in 0..400 {
        assert_eq!(status(&proxy, &body(&format!("model-{i}"))).await, 200);
    }
    let cached = proxy.app.engine.cached_models();
    assert!(cached > 0 && cached <= 50, "{cached} models in memory");
}

#[tokio::test]
async fn a_model_name_longer_than_any_real_one_is_refused_in_the_clients_shape() {
    let mock = start_mock().await;
    let mut cfg = config(&mock.url());
    cfg.anthropic_upstream = mock.url();
    let proxy = start_proxy(cfg).await;
    let long = "m".repeat(100_000);
    let send = |path: &'static str, body: Value| {
        let url = format!("{}{path}", proxy.url());
        async move {
            common::post(
                &url,
                &[
                    ("authorization", "Bearer k"),
                    ("x-api-key", "k"),
                    ("content-type", "application/json"),
                ],
                body.to_string(),
            )
            .await
        }
    };
    let chat = send("/v1/chat/completions", body(&long)).await;
    assert_eq!(chat.status, 400, "{}", chat.body);
    assert_eq!(chat.json()["error"]["param"], "model", "{}", chat.body);
    let message = chat.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(message.contains("256"), "{message}");
    assert!(
        !message.contains(&long[..300]),
        "the name is not echoed back whole"
    );
    let anthropic = json!({"model": long, "max_tokens": 16,
        "messages": [{"role": "user", "content": "Say hello."}]});
    let messages = send("/v1/messages", anthropic).await;
    assert_eq!(messages.status, 400, "{}", messages.body);
    assert_eq!(messages.json()["type"], "error", "{}", messages.body);
    let responses = send(
        "/v1/responses",
        json!({"model": long, "input": "Say hello."}),
    )
    .await;
    assert_eq!(responses.status, 400, "{}", responses.body);
    assert!(mock.chats().is_empty() && mock.state.others.lock().unwrap().is_empty());
    // A name at the bound is served.
    assert_eq!(status(&proxy, &body(&"m".repeat(256))).await, 200);
}
