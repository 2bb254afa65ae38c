//! The secret that seals Compactor's compaction items: kept in the store when none is configured,
//! so items survive a restart (SQLite, Redis) and open on every replica of one Redis; the
//! previous secret accepted during a rotation; and a start refused when a named secret variable
//! is missing.

mod common;

use std::io::Read;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::redis_server::RedisServer;
use common::responses_mock::{start_responses_mock, ResponsesMock};
use common::{config, start_proxy, start_proxy_with_store, Proxy, Reply};
use compactor::config::Config;
use compactor::store::memory::MemoryStore;
use serde_json::{json, Value};

const MODEL: &str = "mock-responses";
const KEY: &str = "Bearer sk-alice";

fn settings(mock: &ResponsesMock, store: &str) -> Config {
    let mut c = config(&mock.url());
    c.store = store.to_string();
    c.windows.insert(MODEL.into(), 3000);
    c.compaction.keep_recent_tokens = 600;
    c.compaction.reserve_output_tokens = 256;
    c.compaction.margin_tokens = 64;
    c.summarizer.window = 100_000;
    c
}

fn user(text: &str) -> Value {
    json!({"type":"message","role":"user","content":[{"type":"input_text","text":text}]})
}

/// A thread of a developer message and `turns` exchanges.
fn thread(turns: usize) -> Vec<Value> {
    let mut items = vec![
        json!({"type":"message","role":"developer","content":[{"type":"input_text","text":"You are a coding agent."}]}),
    ];
    for t in 0..turns {
        items.push(user(&format!(
            "Turn {t}: {}",
            "look at the module ".repeat(30)
        )));
        items.push(json!({"type":"message","role":"assistant","id":format!("msg_{t}"),"status":"completed","content":[{"type":"output_text","text":format!("done {t}: {}", "it reads the file ".repeat(30)),"annotations":[]}]}));
    }
    items
}

async fn post(proxy: &Proxy, path: &str, body: &Value) -> Reply {
    let headers = [("authorization", KEY), ("content-type", "application/json")];
    common::post(
        &format!("{}/v1{path}", proxy.url()),
        &headers,
        body.to_string(),
    )
    .await
}

/// Asks `proxy` to compact a thread (distinct per `seed`); returns the thread and the item.
async fn compaction_item(proxy: &Proxy, seed: usize) -> (Vec<Value>, Value) {
    let mut items = thread(8);
    items.push(user(&format!("thread {seed}")));
    let body = json!({"model": MODEL, "input": items});
    let reply = post(proxy, "/responses/compact", &body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let item = reply.json()["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "compaction")
        .cloned()
        .expect("a compaction item");
    (items, item)
}

/// Sends `item` back to `proxy` as Codex does after a compaction; returns the answer.
async fn send_back(proxy: &Proxy, items: &[Value], item: &Value) -> Reply {
    let mut input: Vec<Value> = vec![items[0].clone()];
    input.push(item.clone());
    input.push(user("and now?"));
    post(
        proxy,
        "/responses",
        &json!({"model": MODEL, "store": false, "input": input}),
    )
    .await
}

fn assert_opened(reply: &Reply) {
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(reply.header("x-compactor-checkpoint").is_some());
}

fn assert_refused(reply: &Reply) {
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert_eq!(reply.json()["error"]["code"], "invalid_compaction_item");
}

/// An item minted before the proxy stops opens in the proxy started after it, on `store`.
async fn an_item_survives_a_restart(store: &str) {
    let mock = start_responses_mock().await;
    let mut before = start_proxy(settings(&mock, store)).await;
    let (items, item) = compaction_item(&before, 1).await;
    assert_opened(&send_back(&before, &items, &item).await);
    before.stopped().await;
    drop(before);
    let after = start_proxy(settings(&mock, store)).await;
    assert_opened(&send_back(&after, &items, &item).await);
    let sent = mock.turns().last().unwrap().json().to_string();
    assert!(sent.contains("SUMMARY-1"), "the item was expanded: {sent}");
    assert!(!sent.contains("\"compaction\""), "{sent}");
}

#[tokio::test]
async fn an_item_sealed_before_a_restart_opens_after_it_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("compactor.sqlite3");
    an_item_survives_a_restart(path.to_str().unwrap()).await;
}

#[tokio::test]
async fn an_item_sealed_before_a_restart_opens_after_it_on_redis() {
    let redis = RedisServer::start();
    an_item_survives_a_restart(&redis.url()).await;
}

#[tokio::test]
async fn two_replicas_on_one_redis_accept_each_others_items() {
    let redis = RedisServer::start();
    let mock = start_responses_mock().await;
    let (one, two) = tokio::join!(
        start_proxy(settings(&mock, &redis.url())),
        start_proxy(settings(&mock, &redis.url()))
    );
    let (items_one, item_one) = compaction_item(&one, 1).await;
    let (items_two, item_two) = compaction_item(&two, 2).await;
    assert_opened(&send_back(&two, &items_one, &item_one).await);
    assert_opened(&send_back(&one, &items_two, &item_two).await);
    // A third replica, started later, agrees too.
    let three = start_proxy(settings(&mock, &redis.url())).await;
    assert_opened(&send_back(&three, &items_one, &item_one).await);
}

#[tokio::test]
async fn during_a_rotation_the_previous_secret_still_opens_its_items() {
    const OLD: &str = "SEALED_ITEMS_TEST_OLD_SECRET";
    const NEW: &str = "SEALED_ITEMS_TEST_NEW_SECRET";
    std::env::set_var(OLD, "the secret before the rotation");
    std::env::set_var(NEW, "the secret after the rotation");
    let mock = start_responses_mock().await;
    // One store, so the checkpoints outlive each proxy; only the secrets differ.
    let store = Arc::new(MemoryStore::default());
    let with_secrets = |current: &str, previous: &str| {
        let mut c = settings(&mock, "memory");
        c.responses.compaction_secret_env = current.into();
        c.responses.compaction_secret_previous_env = previous.into();
        c
    };
    let old = start_proxy_with_store(with_secrets(OLD, ""), store.clone()).await;
    let (items, old_item) = compaction_item(&old, 1).await;

    let rotating = start_proxy_with_store(with_secrets(NEW, OLD), store.clone()).await;
    assert_opened(&send_back(&rotating, &items, &old_item).await);
    let (new_items, new_item) = compaction_item(&rotating, 2).await;
    assert_refused(&send_back(&old, &new_items, &new_item).await);

    let rotated = start_proxy_with_store(with_secrets(NEW, ""), store.clone()).await;
    assert_refused(&send_back(&rotated, &items, &old_item).await);
    assert_opened(&send_back(&rotated, &new_items, &new_item).await);
}

#[tokio::test]
async fn a_named_but_missing_secret_stops_the_start() {
    const MISSING: &str = "SEALED_ITEMS_TEST_NEVER_SET";
    let mock = start_responses_mock().await;
    for key in ["compaction_secret_env", "compaction_secret_previous_env"] {
        let mut c = settings(&mock, "memory");
        match key {
            "compaction_secret_env" => c.responses.compaction_secret_env = MISSING.into(),
            _ => c.responses.compaction_secret_previous_env = MISSING.into(),
        }
        let Err(e) = compactor::server::build(&c).await else {
            panic!("started with {key} naming an unset variable");
        };
        assert!(e.contains(MISSING) && e.contains(key), "{e}");
    }
    for command in [
        vec!["check-config"],
        vec!["serve", "--listen", "127.0.0.1:0", "--store", "memory"],
    ] {
        let mut child = common::compactor_command()
            .args(&command)
            .env("COMPACTOR_RESPONSES__COMPACTION_SECRET_ENV", MISSING)
            .env_remove(MISSING)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("{command:?} is still running: it started");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut stderr = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        assert!(!status.success(), "{command:?} succeeded: {stderr}");
        assert!(
            stderr.contains(MISSING) && stderr.contains("unset or empty"),
            "{command:?}: {stderr}"
        );
    }
}
