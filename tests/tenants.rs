//! Tenants on a shared proxy: whose checkpoint is whose, and gateway keys that decide who may
//! use the proxy (and the team's upstream key) at all.

mod common;

use std::time::Duration;

use serde_json::{json, Value};

use common::{client, config, start_mock, start_proxy, Proxy};

fn conversation() -> Value {
    let mut messages = vec![json!({"role": "system", "content": "You are a coding agent."})];
    for t in 0..6 {
        messages.push(json!({"role": "user", "content": format!("step {t}: {}", "explain the design ".repeat(40))}));
        messages.push(json!({"role": "assistant", "content": format!("answer {t}: {}", "because of the tradeoffs ".repeat(40))}));
    }
    messages.push(json!({"role": "user", "content": "what next?"}));
    json!({"model": "agent-model", "max_tokens": 200, "messages": messages})
}

/// Sends `request` with the given headers; returns the status, headers and body.
async fn send(
    request: reqwest::RequestBuilder,
    headers: &[(&str, &str)],
) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut request = request;
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap_or(Value::Null);
    (status, headers, body)
}

/// Compacts the conversation now, as the client with `credential`; the new checkpoint's id.
async fn compact(proxy: &Proxy, credential: &[(&str, &str)]) -> String {
    let mut headers = vec![("x-compactor-mode", "force")];
    headers.extend_from_slice(credential);
    let request = client()
        .post(format!("{}/v1/chat/completions", proxy.url()))
        .header("content-type", "application/json")
        .body(conversation().to_string());
    let (status, headers, body) = send(request, &headers).await;
    assert_eq!(status, 200, "{body}");
    headers["x-compactor-checkpoint"]
        .to_str()
        .unwrap()
        .to_string()
}

async fn read_checkpoint(proxy: &Proxy, id: &str, credential: &[(&str, &str)]) -> u16 {
    let request = client().get(format!("{}/compactor/v1/checkpoints/{id}", proxy.url()));
    send(request, credential).await.0
}

#[tokio::test]
async fn checkpoints_need_a_credential_and_the_header_that_carried_it_counts() {
    let mock = start_mock().await;
    let mut cfg = config(&mock.url());
    cfg.admin_token = "admin-secret".into();
    let proxy = start_proxy(cfg).await;
    // Anonymous clients are all one tenant: none of them may read checkpoints by id.
    let anonymous = compact(&proxy, &[]).await;
    assert_eq!(read_checkpoint(&proxy, &anonymous, &[]).await, 401);
    // The same value under another header is another tenant.
    let keyed = compact(&proxy, &[("api-key", "K")]).await;
    assert_eq!(
        read_checkpoint(&proxy, &keyed, &[("api-key", "K")]).await,
        200
    );
    assert_eq!(
        read_checkpoint(&proxy, &keyed, &[("authorization", "K")]).await,
        404
    );
    assert_eq!(
        read_checkpoint(&proxy, &keyed, &[("api-key", "L")]).await,
        404
    );
    let admin = [("authorization", "Bearer admin-secret")];
    assert_eq!(read_checkpoint(&proxy, &anonymous, &admin).await, 200);
    assert_eq!(read_checkpoint(&proxy, &keyed, &admin).await, 200);
}

fn key_file(entries: &[(&str, &str)]) -> String {
    entries
        .iter()
        .map(|(name, key)| format!("{name} {}\n", compactor::http::gateway_keys::hash_key(key)))
        .collect()
}

#[tokio::test]
async fn gateway_keys_decide_who_spends_the_upstream_key() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("gateway-keys");
    std::fs::write(&keys, key_file(&[("alice", "gk-alice"), ("bob", "gk-bob")])).unwrap();
    std::env::set_var("TENANTS_TEST_TEAM_KEY", "sk-team");
    let mut cfg = config(&mock.url());
    cfg.upstream_key_env = "TENANTS_TEST_TEAM_KEY".into();
    cfg.gateway_keys_file = keys.display().to_string();
    let proxy = start_proxy(cfg).await;
    let models = || client().get(format!("{}/v1/models", proxy.url()));

    // No key, a wrong key, a key in the wrong place: 401 in the OpenAI shape; nothing upstream.
    for headers in [
        vec![],
        vec![("authorization", "Bearer gk-carol")],
        vec![("authorization", "gk-alice")],
    ] {
        let (status, _, body) = send(models(), &headers).await;
        assert_eq!(status, 401, "{headers:?}");
        assert_eq!(body["error"]["code"], "invalid_api_key", "{body}");
    }
    let chat = client()
        .post(format!("{}/v1/chat/completions", proxy.url()))
        .header("content-type", "application/json")
        .body(conversation().to_string());
    assert_eq!(send(chat, &[]).await.0, 401);
    // On the Anthropic route, the Anthropic shape.
    let messages = client()
        .post(format!("{}/v1/messages", proxy.url()))
        .header("content-type", "application/json")
        .body(json!({"model": "claude", "max_tokens": 10, "messages": []}).to_string());
    let (status, _, body) = send(messages, &[("x-api-key", "gk-carol")]).await;
    assert_eq!(status, 401);
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], "authentication_error", "{body}");
    assert!(mock.state.others.lock().unwrap().is_empty());
    assert!(mock.chats().is_empty());

    // A known key passes; upstream sees the team's key, never the gateway key.
    let (status, _, _) = send(models(), &[("authorization", "Bearer gk-alice")]).await;
    assert_eq!(status, 200);
    let forwarded = mock.state.others.lock().unwrap()[0].headers.clone();
    assert_eq!(forwarded["authorization"], "Bearer sk-team");
    for value in forwarded.values() {
        assert!(!value.to_str().unwrap_or("").contains("gk-alice"));
    }

    // Each key is its own tenant.
    let alices = compact(&proxy, &[("x-api-key", "gk-alice")]).await;
    for header in ["authorization", "api-key"] {
        let value = if header == "authorization" {
            "Bearer gk-alice"
        } else {
            "gk-alice"
        };
        assert_eq!(
            read_checkpoint(&proxy, &alices, &[(header, value)]).await,
            200
        );
    }
    assert_eq!(
        read_checkpoint(&proxy, &alices, &[("x-api-key", "gk-bob")]).await,
        404
    );
    assert_eq!(
        read_checkpoint(&proxy, &alices, &[("x-api-key", "gk-carol")]).await,
        401
    );
    let metrics = common::get(&format!("{}/metrics", proxy.url()), None)
        .await
        .1;
    assert!(
        metrics.contains(r#"compactor_tenant_requests_total{tenant="alice"}"#),
        "{metrics}"
    );

    // Removing a key from the file takes effect without a restart.
    std::fs::write(&keys, key_file(&[("bob", "gk-bob")])).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(4);
    loop {
        let (status, _, _) = send(models(), &[("authorization", "Bearer gk-alice")]).await;
        if status == 401 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "alice's key still works"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (status, _, _) = send(models(), &[("authorization", "Bearer gk-bob")]).await;
    assert_eq!(status, 200);
}
