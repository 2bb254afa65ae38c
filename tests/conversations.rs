//! The conversation timeline endpoints (`/compactor/v1/conversations…`) against the mock
//! provider: what each request row says, which tenant sees what, the bounds, and replicas
//! sharing one history through Redis.

mod common;

use common::agent_session::{checkpoint_changes, AgentSession};
use common::redis_server::RedisServer;
use common::{config, get, get_json, start_mock, start_proxy, start_proxy_with_store, Mock, Proxy};
use compactor::config::Config;
use serde_json::Value;

const SYSTEM: &str = "You are a coding agent. Use the tools to read and edit files.";
const WINDOW: u64 = 4000;
const ADMIN: &str = "Bearer admin-secret";

fn windowed(mock: &Mock) -> Config {
    let mut c = config(&mock.url());
    c.windows.insert("agent-model".into(), WINDOW);
    c.summarizer.window = 200_000;
    c.admin_token = "admin-secret".into();
    c
}

/// The rows of conversation `id` as `auth` reads them, once `expected` have been recorded
/// (rows are written off the request's path).
async fn timeline(proxy: &Proxy, id: &str, auth: &str, expected: usize) -> Value {
    let url = format!("{}/compactor/v1/conversations/{id}", proxy.url());
    let mut found = Value::Null;
    common::eventually("the timeline's rows", async || {
        found = get_json(&url, Some(auth)).await;
        found["requests"].as_array().map_or(0, Vec::len) >= expected
    })
    .await;
    found
}

fn listed(answer: &Value) -> Vec<String> {
    answer["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn each_request_is_a_row_with_its_sizes_window_checkpoint_and_waits() {
    let mock = start_mock().await;
    mock.set_window(WINDOW);
    let proxy = start_proxy(windowed(&mock)).await;
    let mut session = AgentSession::new("agent-model", SYSTEM);
    let replies = session
        .drive(&proxy, ("authorization", "Bearer ka"), 30)
        .await;
    let id = replies[0]
        .header("x-compactor-conversation")
        .unwrap()
        .to_string();
    assert!(replies
        .iter()
        .all(|r| r.header("x-compactor-conversation") == Some(&id)));
    let changes = checkpoint_changes(&replies);
    assert!(
        changes.len() >= 2,
        "the session compacted only at {changes:?}"
    );

    let answer = timeline(&proxy, &id, "Bearer ka", replies.len()).await;
    let rows = answer["requests"].as_array().unwrap();
    assert_eq!(rows.len(), replies.len());
    for (row, reply) in rows.iter().zip(&replies) {
        let header = |name: &str| reply.header(name).unwrap().parse::<u64>().unwrap();
        assert_eq!(row["tokens_sent"], header("x-compactor-prompt-tokens"));
        assert_eq!(row["tokens_forwarded"], header("x-compactor-tokens-after"));
        assert_eq!(row["window"], WINDOW);
        assert_eq!(row["status"], 200);
        assert_eq!(row["path"], "/v1/chat/completions");
        assert_eq!(
            row["checkpoint"].as_str(),
            reply.header("x-compactor-checkpoint")
        );
        assert_eq!(
            row["summary_ms"].as_u64().unwrap() > 0,
            reply
                .header("x-compactor-summary-ms")
                .is_some_and(|ms| ms != "0")
        );
    }
    let marked: Vec<usize> = rows
        .iter()
        .enumerate()
        .filter(|(_, r)| r["new_checkpoint"] == true)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(
        marked, changes,
        "compactions are marked where the checkpoint changed"
    );
    let last = rows.last().unwrap();
    assert!(last["tokens_sent"].as_u64() > last["tokens_forwarded"].as_u64());
    let entry = &answer["conversation"];
    assert_eq!(entry["requests"], replies.len());
    assert_eq!(entry["compactions"], changes.len());
    // No message content: nothing the session said is in the rows.
    let text = answer.to_string();
    assert!(!text.contains("Step 3") && !text.contains(SYSTEM) && !text.contains("parser"));

    // Its checkpoints, with the summary split by who wrote it.
    let checkpoints = get_json(
        &format!(
            "{}/compactor/v1/conversations/{id}/checkpoints",
            proxy.url()
        ),
        Some("Bearer ka"),
    )
    .await;
    let checkpoints = checkpoints["checkpoints"].as_array().unwrap();
    assert!(!checkpoints.is_empty());
    let newest = checkpoints.last().unwrap();
    assert_eq!(
        newest["id"].as_str(),
        replies.last().unwrap().header("x-compactor-checkpoint")
    );
    assert!(newest["model_text"].as_str().unwrap().contains("SUMMARY-"));
    let model_text = newest["model_text"].as_str().unwrap();
    assert!(!model_text.contains("Record (copied") && !model_text.contains("### User requests"));
    let titles: Vec<&str> = newest["code_sections"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["title"].as_str().unwrap())
        .collect();
    assert!(
        titles.iter().any(|t| t.starts_with("User requests")),
        "{titles:?}"
    );
    assert!(newest["files_read"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f == "src/module_0.rs"));
    assert!(newest["files_modified"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f == "src/feature_0.rs"));
    assert!(newest["covered"].as_u64().unwrap() > 0);
}

#[tokio::test]
async fn a_tenant_sees_only_its_own_conversations_and_the_admin_token_sees_all() {
    let mock = start_mock().await;
    mock.set_window(WINDOW);
    let proxy = start_proxy(windowed(&mock)).await;
    let alice = AgentSession::new("agent-model", SYSTEM)
        .drive(&proxy, ("authorization", "Bearer ka"), 8)
        .await;
    let bob = AgentSession::new("agent-model", "You are another agent.")
        .drive(&proxy, ("authorization", "Bearer kb"), 2)
        .await;
    let a = alice[0].header("x-compactor-conversation").unwrap();
    let b = bob[0].header("x-compactor-conversation").unwrap();
    timeline(&proxy, a, "Bearer ka", alice.len()).await;
    timeline(&proxy, b, "Bearer kb", bob.len()).await;
    let list = |auth: &'static str| {
        let url = format!("{}/compactor/v1/conversations", proxy.url());
        async move { listed(&get_json(&url, Some(auth)).await) }
    };
    assert_eq!(list("Bearer ka").await, vec![a.to_string()]);
    assert_eq!(list("Bearer kb").await, vec![b.to_string()]);
    let mut all = list(ADMIN).await;
    all.sort();
    let mut both = vec![a.to_string(), b.to_string()];
    both.sort();
    assert_eq!(all, both);

    // Bob can name Alice's conversation and still not read it, nor its checkpoints.
    for path in [
        format!("conversations/{a}"),
        format!("conversations/{a}/checkpoints"),
    ] {
        let url = format!("{}/compactor/v1/{path}", proxy.url());
        let (status, body) = get(&url, Some("Bearer kb")).await;
        assert_eq!(status, 404, "{path}: {body}");
        assert!(!body.contains("SUMMARY"));
        let (status, _) = get(&url, Some(ADMIN)).await;
        assert_eq!(status, 200, "the admin token reads {path}");
        let (status, body) = get(&url, None).await;
        assert_eq!(status, 401, "{body}");
    }
    let (status, _) = get(&format!("{}/compactor/v1/conversations", proxy.url()), None).await;
    assert_eq!(status, 401);

    // Alice's key opens her conversations under the header Claude Code sends it in, too.
    let response = common::client()
        .get(format!("{}/compactor/v1/conversations", proxy.url()))
        .header("x-api-key", "ka")
        .send()
        .await
        .unwrap();
    let answer: Value = serde_json::from_str(&response.text().await.unwrap()).unwrap();
    assert_eq!(listed(&answer), vec![a.to_string()]);
}

#[tokio::test]
async fn gateway_tenants_are_named_and_kept_apart() {
    let mock = start_mock().await;
    mock.set_window(WINDOW);
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::write(
        &keys,
        format!(
            "alice {}\nbob {}\n",
            compactor::http::gateway_keys::hash_key("sk-alice"),
            compactor::http::gateway_keys::hash_key("sk-bob")
        ),
    )
    .unwrap();
    let mut c = windowed(&mock);
    c.gateway_keys_file = keys.display().to_string();
    let proxy = start_proxy(c).await;
    let alice = AgentSession::new("agent-model", SYSTEM)
        .drive(&proxy, ("x-api-key", "sk-alice"), 2)
        .await;
    let a = alice[0].header("x-compactor-conversation").unwrap();
    let answer = timeline(&proxy, a, "Bearer sk-alice", 2).await;
    assert_eq!(answer["conversation"]["tenant_name"], "alice");
    let url = format!("{}/compactor/v1/conversations", proxy.url());
    assert!(listed(&get_json(&url, Some("Bearer sk-bob")).await).is_empty());
    let (status, _) = get(&url, Some("Bearer sk-nobody")).await;
    assert_eq!(status, 401);
    let (status, _) = get(&format!("{url}/{a}"), Some("Bearer sk-bob")).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn rows_and_conversations_stay_within_their_bounds() {
    let mock = start_mock().await;
    let mut c = windowed(&mock);
    c.timeline.requests_per_conversation = 3;
    c.timeline.conversations = 2;
    let proxy = start_proxy(c).await;
    let mut ids = vec![];
    for n in 0..3 {
        let replies = AgentSession::new("agent-model", &format!("Agent number {n}."))
            .drive(&proxy, ("authorization", "Bearer ka"), 5)
            .await;
        let id = replies[0]
            .header("x-compactor-conversation")
            .unwrap()
            .to_string();
        // Each conversation's five rows are in before the next one starts.
        common::eventually("five requests counted", async || {
            let url = format!("{}/compactor/v1/conversations/{id}", proxy.url());
            get_json(&url, Some("Bearer ka")).await["conversation"]["requests"] == 5
        })
        .await;
        ids.push(id);
    }
    let url = format!("{}/compactor/v1/conversations", proxy.url());
    let answer = get_json(&url, Some("Bearer ka")).await;
    assert_eq!(listed(&answer), vec![ids[2].clone(), ids[1].clone()]);
    assert_eq!(answer["limits"]["requests_per_conversation"], 3);
    assert_eq!(answer["limits"]["conversations"], 2);
    let (status, _) = get(&format!("{url}/{}", ids[0]), Some("Bearer ka")).await;
    assert_eq!(
        status, 404,
        "the least recently active conversation is forgotten"
    );
    let kept = get_json(&format!("{url}/{}", ids[2]), Some("Bearer ka")).await;
    assert_eq!(kept["requests"].as_array().unwrap().len(), 3);
    assert_eq!(kept["dropped_requests"], 2);
    assert_eq!(kept["conversation"]["requests"], 5);
}

#[tokio::test]
async fn turned_off_no_rows_are_kept() {
    let mock = start_mock().await;
    let mut c = windowed(&mock);
    c.timeline.enabled = false;
    let proxy = start_proxy(c).await;
    let replies = AgentSession::new("agent-model", SYSTEM)
        .drive(&proxy, ("authorization", "Bearer ka"), 2)
        .await;
    assert!(replies[0].header("x-compactor-conversation").is_none());
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let answer = get_json(
        &format!("{}/compactor/v1/conversations", proxy.url()),
        Some(ADMIN),
    )
    .await;
    assert_eq!(answer["enabled"], false);
    assert!(listed(&answer).is_empty());
}

#[tokio::test]
async fn replicas_share_one_history_through_redis() {
    let server = RedisServer::start();
    let mock = start_mock().await;
    mock.set_window(WINDOW);
    let url = server.url();
    let open = async || {
        compactor::store::open(&url, std::time::Duration::ZERO)
            .await
            .unwrap()
    };
    let one = start_proxy_with_store(windowed(&mock), open().await).await;
    let two = start_proxy_with_store(windowed(&mock), open().await).await;
    let mut session = AgentSession::new("agent-model", SYSTEM);
    let mut replies = vec![];
    for t in 0..8 {
        session.turn(t);
        // Behind a load balancer, turns land on either replica.
        let proxy = if t % 2 == 0 { &one } else { &two };
        let reply = session.send(proxy, ("authorization", "Bearer ka")).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        replies.push(reply);
        session.answered(t);
    }
    let id = replies[0].header("x-compactor-conversation").unwrap();
    // Each replica records its rows off the request's path; two served within the same
    // millisecond by different replicas may be listed in either order, so rows are matched to
    // replies as a whole.
    let mut sent: Vec<String> = replies
        .iter()
        .map(|r| r.header("x-compactor-tokens-after").unwrap().to_string())
        .collect();
    sent.sort();
    for proxy in [&one, &two] {
        let answer = timeline(proxy, id, "Bearer ka", replies.len()).await;
        let rows = answer["requests"].as_array().unwrap();
        assert_eq!(rows.len(), replies.len());
        let mut recorded: Vec<String> = rows
            .iter()
            .map(|row| row["tokens_forwarded"].as_u64().unwrap().to_string())
            .collect();
        recorded.sort();
        assert_eq!(recorded, sent);
        let at: Vec<u64> = rows.iter().map(|r| r["at_ms"].as_u64().unwrap()).collect();
        assert!(
            at.is_sorted(),
            "rows are listed in the order they were served: {at:?}"
        );
    }
}
