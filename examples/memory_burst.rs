//! What a burst of large request bodies costs in memory, and what is given back after it: starts
//! the `compactor` binary (`--binary`, default `target/release/compactor`) in front of an
//! in-process provider, sends `--bodies` chat bodies of `--body-mib` MiB each at once, `--bursts`
//! times, and prints the proxy's resident memory before, at its peak (`VmHWM`) and idle after
//! each burst, with how many bodies were admitted (200) and refused (503).
//!
//! `--parse-only` measures instead what the parsed form of one body holds, in this process:
//! the resident memory that `--bodies` parsed and counted bodies add, per body byte.
//!
//! `cargo build --release && cargo run --release --example memory_burst -- --bodies 16 --body-mib 30`

use std::time::{Duration, Instant};

use axum::response::IntoResponse;
use clap::Parser;
use serde_json::json;
use tokio::net::TcpListener;

#[derive(Debug, Parser)]
struct Args {
    /// The proxy to measure.
    #[arg(long, default_value = "target/release/compactor")]
    binary: String,
    /// Bodies sent at once in each burst.
    #[arg(long, default_value_t = 16)]
    bodies: usize,
    /// Size of each body, in MiB.
    #[arg(long, default_value_t = 30)]
    body_mib: usize,
    /// Size of each message of a body, in KiB (an agent's turns and tool outputs).
    #[arg(long, default_value_t = 2)]
    message_kib: usize,
    /// Bursts, each followed by an idle wait.
    #[arg(long, default_value_t = 2)]
    bursts: usize,
    /// The proxy's `max_in_flight_body_bytes`, in MiB.
    #[arg(long, default_value_t = 256)]
    in_flight_mib: usize,
    /// Seconds of idleness after each burst before the idle figure is read.
    #[arg(long, default_value_t = 5)]
    idle_secs: u64,
    /// Measure the parsed form of bodies in this process instead.
    #[arg(long)]
    parse_only: bool,
}

/// A chat body of about `mib` MiB: a system message, then user and assistant turns of
/// `message_kib` KiB of varied words each (`seed` makes each body's text its own).
fn body(mib: usize, message_kib: usize, seed: usize) -> Vec<u8> {
    let words: Vec<String> = (0..4096)
        .map(|i| format!("w{}", (i * 7919 + seed * 104_729) % 50_000))
        .collect();
    let target = mib * 1024 * 1024;
    let per_message = message_kib * 1024;
    let mut messages = vec![json!({"role": "system", "content": "You are a coding agent."})];
    let (mut size, mut w) = (0, seed);
    while size < target {
        let mut text = String::with_capacity(per_message + 16);
        while text.len() < per_message {
            text.push_str(&words[w % words.len()]);
            text.push(' ');
            w += 1;
        }
        size += text.len() + 40;
        let role = if messages.len() % 2 == 1 {
            "user"
        } else {
            "assistant"
        };
        messages.push(json!({"role": role, "content": text}));
    }
    messages.push(json!({"role": "user", "content": "what next?"}));
    serde_json::to_vec(&json!({"model": "burst-model", "max_tokens": 16, "messages": messages}))
        .unwrap()
}

/// A figure (kB) of `/proc/<pid>/status`, in MiB.
fn status_mib(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

/// Resets the peak (`VmHWM`) of `pid` to its current resident size.
fn reset_peak(pid: u32) {
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
}

/// A provider that reads the whole request and answers a short completion.
async fn provider() -> String {
    let completion = |body: axum::body::Bytes| async move {
        let prompt_tokens = body.len() / 5;
        axum::Json(json!({
            "id": "c", "object": "chat.completion", "model": "burst-model",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 1, "total_tokens": prompt_tokens + 1},
        }))
        .into_response()
    };
    let app = axum::Router::new()
        .route("/v1/chat/completions", axum::routing::post(completion))
        .layer(axum::extract::DefaultBodyLimit::disable());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Parses and counts `args.bodies` bodies, keeping them all, and prints what they add.
fn parse_only(args: &Args) {
    use compactor::dialect::chat::request::ChatRequest;
    use compactor::measure::Meter;
    let bodies: Vec<Vec<u8>> = (0..args.bodies)
        .map(|i| body(args.body_mib, args.message_kib, i))
        .collect();
    let bytes: usize = bodies.iter().map(Vec::len).sum();
    let meter = Meter::new(0);
    let before = status_mib(std::process::id(), "VmRSS:");
    let kept: Vec<_> = bodies
        .iter()
        .map(|b| {
            let request = ChatRequest::parse(b).unwrap();
            let measured = meter.measure(&request);
            (request, measured)
        })
        .collect();
    let after = status_mib(std::process::id(), "VmRSS:");
    let added = (after - before) * 1024.0 * 1024.0;
    println!(
        "parsed {} bodies of {:.1} MiB ({} KiB messages): +{:.1} MiB resident, {:.2} bytes per body byte",
        kept.len(),
        bytes as f64 / args.bodies as f64 / 1048576.0,
        args.message_kib,
        after - before,
        added / bytes as f64
    );
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    if args.parse_only {
        parse_only(&args);
        return;
    }
    let upstream = provider().await;
    let port = free_port();
    let mut child = std::process::Command::new(&args.binary)
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--upstream",
            &upstream,
            "--store",
            "memory",
        ])
        .env("COMPACTOR_LOG", "warn")
        .env(
            "COMPACTOR_MAX_IN_FLIGHT_BODY_BYTES",
            (args.in_flight_mib << 20).to_string(),
        )
        .env(
            "COMPACTOR_MAX_BODY_BYTES",
            ((args.body_mib + 1) << 20)
                .min(args.in_flight_mib << 20)
                .to_string(),
        )
        // Large enough that nothing is compacted: this measures holding and forwarding bodies.
        .env("COMPACTOR_DEFAULT_WINDOW", "1000000000")
        .env("COMPACTOR_COMPACTION__AHEAD_OF_TIME", "false")
        .spawn()
        .expect("start the proxy (build it first: cargo build --release)");
    let pid = child.id();
    let url = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(300))
        .build()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while client.get(format!("{url}/healthz")).send().await.is_err() {
        assert!(Instant::now() < deadline, "the proxy did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let bodies: Vec<bytes::Bytes> = (0..args.bodies)
        .map(|i| body(args.body_mib, args.message_kib, i).into())
        .collect();
    let body_mib = bodies[0].len() as f64 / 1048576.0;
    let start = status_mib(pid, "VmRSS:");
    println!(
        "binary {}; {} bodies of {body_mib:.1} MiB ({} KiB messages) at once, in-flight bound {} MiB; RSS at start {start:.1} MiB",
        args.binary, args.bodies, args.message_kib, args.in_flight_mib
    );
    for burst in 1..=args.bursts {
        reset_peak(pid);
        let before = status_mib(pid, "VmRSS:");
        let started = Instant::now();
        let sends = bodies.iter().map(|b| {
            let client = client.clone();
            let b = b.clone();
            let url = url.clone();
            async move {
                client
                    .post(format!("{url}/v1/chat/completions"))
                    .header("content-type", "application/json")
                    .header("authorization", "Bearer sk-burst")
                    .body(b)
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
                    .unwrap_or_else(|e| {
                        // Refused (503) before the upload ended: the proxy closed the connection.
                        let _ = e;
                        0
                    })
            }
        });
        let statuses = futures::future::join_all(sends).await;
        let elapsed = started.elapsed();
        let peak = status_mib(pid, "VmHWM:");
        let admitted = statuses.iter().filter(|s| **s == 200).count();
        let busy = statuses.iter().filter(|s| **s == 503).count();
        let other: Vec<u16> = statuses
            .iter()
            .copied()
            .filter(|s| *s != 200 && *s != 503)
            .collect();
        tokio::time::sleep(Duration::from_secs(args.idle_secs)).await;
        let idle = status_mib(pid, "VmRSS:");
        let admitted_mib = admitted as f64 * body_mib;
        println!(
            "burst {burst}: {admitted} admitted, {busy} refused 503, other {other:?} (0: cut off while uploading), in {:.1}s; \
             RSS {before:.1} MiB before, peak {peak:.1} MiB (+{:.1} MiB, {:.2}x the {admitted_mib:.0} MiB admitted), \
             {idle:.1} MiB idle {}s after",
            elapsed.as_secs_f64(),
            peak - before,
            (peak - before) / admitted_mib.max(f64::MIN_POSITIVE),
            args.idle_secs,
        );
    }
    let _ = child.kill();
    let _ = child.wait();
}
