//! Replays real sessions (`../shared/data/conversations`, read in place) request by request
//! through the proxy against the mock, at small windows, and prints how often the proxy
//! summarized: summaries per 100 requests, the share of ahead-of-time summaries that served a
//! request without waiting (distinct checkpoints), and the requests that waited for a summary made while they were waiting. Not a check
//! (it asserts only that every request was answered); run it with
//! `cargo test --test cadence_replay -- --ignored --nocapture`.

mod common;

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{client, config, start_mock, start_proxy};
use serde_json::{json, Value};

const DATA: &str = "../shared/data/conversations";
const SESSIONS: &[&str] = &[
    "pi_large-session_upto_user060.json",
    "swegym_openhands_Project-MONAI__MONAI-3715_4.json",
    "taubench_airline_gpt4o_task02_trial1.json",
];
/// Requests replayed per session at most (the first ones).
const MAX_REQUESTS: usize = 120;

#[derive(Default)]
struct Tally {
    requests: u64,
    refused: u64,
    compacted: u64,
    waited: u64,
    summaries: u64,
    ahead_of_time: u64,
    ready_used: u64,
}

fn metric(metrics: &str, name: &str, label: Option<&str>) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && label.is_none_or(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

async fn replay(file: &Path, window: u64) -> Tally {
    let data: Value = serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap();
    let messages = data["messages"].as_array().unwrap();
    let tools = data.get("tools").cloned().unwrap_or(json!([]));
    let mock = start_mock().await;
    // A summary about as long as the model may write at this window.
    let allowance = (window / 8).clamp(128, 4096);
    mock.state
        .summary_padding_words
        .store(allowance / 2, Ordering::SeqCst);
    let mut cfg = config(&mock.url());
    cfg.windows.insert("replay-model".into(), window);
    cfg.summarizer.window = 100_000;
    cfg.compaction.ahead_of_time = true;
    let proxy = start_proxy(cfg).await;
    let mut tally = Tally::default();
    let mut ready_served = std::collections::BTreeSet::new();
    // The client sends a request after each user message and each batch of tool results.
    let ends: Vec<usize> = (1..messages.len())
        .filter(|&i| {
            messages[i - 1]["role"] != "assistant"
                && messages[i - 1]["role"] != "system"
                && messages[i]["role"] == "assistant"
        })
        .take(MAX_REQUESTS)
        .collect();
    for end in ends {
        let body = json!({"model":"replay-model","max_tokens":512,"messages":&messages[..end],"tools":tools});
        let resp = client()
            .post(format!("{}/v1/chat/completions", proxy.url()))
            .header("authorization", "Bearer k")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        tally.requests += 1;
        let status = resp.status();
        let headers = resp.headers().clone();
        resp.bytes().await.unwrap();
        if status != 200 {
            tally.refused += 1;
            continue;
        }
        tally.compacted += u64::from(headers.get("x-compactor-compacted").unwrap() == "true");
        let waited = headers.get("x-compactor-summary-ms").is_some();
        tally.waited += u64::from(waited);
        if !waited
            && headers
                .get("x-compactor-ready-checkpoint")
                .is_some_and(|v| v == "true")
        {
            ready_served.insert(headers.get("x-compactor-checkpoint").unwrap().clone());
        }
        // The agent's own work between requests: background summaries finish meanwhile.
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let (_, metrics) = common::get(&format!("{}/metrics", proxy.url()), None).await;
    tally.summaries = metric(&metrics, "compactor_compactions_total", None);
    tally.ahead_of_time = metric(&metrics, "compactor_compactions_total", Some("ahead"));
    tally.ready_used = ready_served.len() as u64;
    tally
}

#[tokio::test]
#[ignore = "a replay of real sessions that prints numbers; run by hand"]
async fn replay_real_sessions_at_small_windows() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(DATA);
    println!("| session | window | requests | refused | compacted | summaries | per 100 requests | ahead of time | of those used | waited for a summary |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for session in SESSIONS {
        let file = dir.join(session);
        if !file.exists() {
            println!("| {session} | missing | | | | | | | | |");
            continue;
        }
        for window in [4096, 16384] {
            let t = replay(&file, window).await;
            let served = t.requests - t.refused;
            let used = if t.ahead_of_time == 0 {
                "-".to_string()
            } else {
                format!(
                    "{:.0} %",
                    100.0 * t.ready_used as f64 / t.ahead_of_time as f64
                )
            };
            println!(
                "| {session} | {window} | {} | {} | {} | {} | {:.1} | {} | {} ({used}) | {} |",
                t.requests,
                t.refused,
                t.compacted,
                t.summaries,
                100.0 * t.summaries as f64 / served.max(1) as f64,
                t.ahead_of_time,
                t.ready_used,
                t.waited,
            );
        }
    }
}
