//! What client-chosen model names cost: sends requests naming `--models` distinct models through
//! an in-process Compactor (SQLite store in a temporary directory) to an in-process provider,
//! and prints the process's resident memory before and after, and the model rows stored.
//!
//! `--answer fail` (the provider knows no such model: 404), `overflow-html` (a 413 page from a
//! front), `echo` (a 400 echoing the client's `tool_choice`), or `ok` (a provider that serves
//! any name and reports `usage`, as llama.cpp does).
//!
//! `cargo run --example model_names -- --models 20000 --answer fail`

use std::time::{Duration, Instant};

use axum::response::IntoResponse;
use clap::Parser;
use compactor::config::Config;
use futures::StreamExt;
use serde_json::json;
use tokio::net::TcpListener;

#[derive(Debug, Parser)]
struct Args {
    /// Distinct model names to send.
    #[arg(long, default_value_t = 20_000)]
    models: usize,
    /// How the provider answers: fail, overflow-html, echo or ok.
    #[arg(long, default_value = "fail")]
    answer: String,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
}

/// Resident memory of this process, in MiB.
fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

async fn provider(answer: String) -> String {
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move |body: axum::body::Bytes| {
            let answer = answer.clone();
            async move {
                let request: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                let model = request["model"].as_str().unwrap_or("").to_string();
                match answer.as_str() {
                    "ok" => axum::Json(json!({
                        "id": "c", "object": "chat.completion", "model": model,
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 40, "completion_tokens": 1, "total_tokens": 41},
                    }))
                    .into_response(),
                    "overflow-html" => (
                        http::StatusCode::PAYLOAD_TOO_LARGE,
                        [("content-type", "text/html")],
                        "<html><head><title>413 Request Entity Too Large</title></head></html>",
                    )
                        .into_response(),
                    "echo" => (
                        http::StatusCode::BAD_REQUEST,
                        axum::Json(json!({"error": {"code": 400, "type": "invalid_request_error",
                            "message": format!("Invalid tool_choice: {}", request["tool_choice"].as_str().unwrap_or(""))}})),
                    )
                        .into_response(),
                    _ => (
                        http::StatusCode::NOT_FOUND,
                        axum::Json(json!({"error": {"message": format!("The model `{model}` does not exist"),
                            "type": "invalid_request_error", "code": "model_not_found"}})),
                    )
                        .into_response(),
                }
            }
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/v1")
}

/// Sends one request per name, `concurrency` at a time; bodies are made as they go, so the
/// driver's own memory does not grow with the number of names.
async fn send_all(url: &str, names: impl Iterator<Item = String>, concurrency: usize) {
    let client = reqwest::Client::new();
    futures::stream::iter(names)
        .for_each_concurrent(concurrency, |model| {
            let body = json!({
                "model": model,
                "tool_choice": "This model's maximum context length is 64 tokens",
                "messages": [
                    {"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": "Say hello."},
                ],
            })
            .to_string();
            let request = client
                .post(url)
                .header("authorization", "Bearer k")
                .header("content-type", "application/json")
                .body(body)
                .send();
            async move {
                if let Ok(response) = request.await {
                    let _ = response.bytes().await;
                }
            }
        })
        .await;
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("facts.sqlite3");
    let config = Config {
        upstream: provider(args.answer.clone()).await,
        store: db.display().to_string(),
        ..Config::default()
    };
    let app = compactor::server::build(&config).await.unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "http://{}/v1/chat/completions",
        listener.local_addr().unwrap()
    );
    tokio::spawn(compactor::server::serve(
        listener,
        app,
        std::future::pending(),
        Duration::from_secs(1),
    ));
    // Warm up with one model name, so that what follows is the cost of more names alone.
    send_all(
        &url,
        (0..2_000).map(|_| "gpt-4o".to_string()),
        args.concurrency,
    )
    .await;
    let before = rss_mib();
    let started = Instant::now();
    send_all(
        &url,
        (0..args.models).map(|i| format!("model-{i:06}")),
        args.concurrency,
    )
    .await;
    let elapsed = started.elapsed();
    let after = rss_mib();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rows: i64 = rusqlite::Connection::open(&db)
        .and_then(|c| c.query_row("SELECT COUNT(*) FROM model_facts", [], |r| r.get(0)))
        .unwrap_or(-1);
    println!(
        "answer={} models={} in {:.1}s: RSS {before:.1} MiB before, {after:.1} MiB after \
         (+{:.1} MiB), {:.1} MiB 2 s later; model_facts rows: {rows}",
        args.answer,
        args.models,
        elapsed.as_secs_f64(),
        after - before,
        rss_mib(),
    );
}
