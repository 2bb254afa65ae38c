//! What each stage of the request path costs, and its share of the whole: parse, identify,
//! measure, checkpoint lookup, plan, render, forward (the upstream round trip through reqwest to
//! an in-process provider on loopback) and stream back (the usage observer over the provider's
//! stream), timed one after another on one request, `--n` times, the median per stage printed
//! with its share, the slowest named.
//!
//! Two requests: the load benchmark's small one, and the largest conversation of
//! `--data` (the real sessions; absent: that row is skipped).
//!
//! `cargo run --release --example stage_costs -- --n 2000`

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use compactor::compaction::plan::{plan, PlanInput};
use compactor::compaction::summary_text::summary_text;
use compactor::dialect::chat::request::ChatRequest;
use compactor::dialect::{chat::Chat, Role, Through, WireRequest};
use compactor::http::stream::Observed;
use compactor::identity;
use compactor::measure::Meter;
use compactor::store::{memory::MemoryStore, Checkpoint, CheckpointStore};
use futures::StreamExt;
use tokio::net::TcpListener;

#[derive(Debug, Parser)]
struct Args {
    /// Requests timed per body.
    #[arg(long, default_value_t = 2000)]
    n: usize,
    /// Where the real sessions are (`*_upto_*` files): the largest is the large body.
    #[arg(long, default_value = "../shared/data/conversations")]
    data: PathBuf,
}

const SMALL: &str =
    r#"{"model":"mock","messages":[{"role":"user","content":"Say hello."}],"max_tokens":16}"#;
const STAGES: [&str; 8] = [
    "parse",
    "identify",
    "measure",
    "checkpoint lookup",
    "plan",
    "render",
    "forward",
    "stream back",
];

fn sse_stream() -> Vec<Bytes> {
    let mut events: Vec<Bytes> = ["Hello", " from", " the", " mock."]
        .iter()
        .map(|w| {
            Bytes::from(format!(
                "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{w}\"}}}}]}}\n\n"
            ))
        })
        .collect();
    events.push(Bytes::from(
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12}}\n\n",
    ));
    events.push(Bytes::from("data: [DONE]\n\n"));
    events
}

/// An in-process provider answering every POST with a fixed completion.
async fn provider() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let app = axum::Router::new().fallback(|| async {
        (
            [("content-type", "application/json")],
            r#"{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hello."},"finish_reason":"stop"}],"usage":{"prompt_tokens":0,"completion_tokens":2,"total_tokens":2}}"#,
        )
    });
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{address}/v1/chat/completions")
}

fn checkpoint_for(request: &ChatRequest, chain: &[identity::Hash], tenant: &str) -> Checkpoint {
    Checkpoint {
        id: "stage-costs".into(),
        tenant: tenant.into(),
        anchor: identity::hex(&chain[chain.len().min(2) - 1]),
        covered: 1,
        prefix_hash: identity::hex(&chain[0]),
        pinned_user: None,
        truncations: vec![],
        summary: "## Goal\nstage costs".into(),
        files_read: vec![],
        files_modified: vec![],
        tokens_before: 0,
        tokens_after: 0,
        created_ms: compactor::store::now_ms(),
        model: request.settings.model.clone(),
        ahead_of_time: false,
        cleared: None,
    }
}

/// Times every stage of one request `n` times; returns each stage's samples.
async fn time_stages(body: &[u8], n: usize, url: &str) -> Vec<Vec<Duration>> {
    let client = reqwest::Client::new();
    let store = MemoryStore::default();
    let meter = Meter::new(100_000);
    let events = sse_stream();
    let mut samples = vec![Vec::with_capacity(n); STAGES.len()];
    for i in 0..n + n / 10 {
        let mut laps = Laps {
            at: Instant::now(),
            keep: i >= n / 10,
        };
        let request = ChatRequest::parse(body).unwrap();
        laps.lap(0, &mut samples);
        // the meter also computes each message's canonical hash, which identify chains
        let measured = meter.measure(&request);
        laps.lap(2, &mut samples);
        let tenant = identity::tenant("Bearer stage-costs");
        let chain = identity::chain(&tenant, measured.elements.iter().map(|m| m.canonical));
        laps.lap(1, &mut samples);
        if i == 0 {
            store
                .put(&checkpoint_for(&request, &chain, &identity::hex(&tenant)))
                .await
                .unwrap();
            laps.at = Instant::now();
        }
        let anchor = identity::hex(&chain[chain.len().min(2) - 1]);
        let found = store.for_anchor(&anchor).await.unwrap();
        laps.lap(3, &mut samples);
        let roles: Vec<Role> = request.messages.iter().map(|m| m.role).collect();
        let tokens: Vec<u64> = measured.elements.iter().map(|m| m.tokens).collect();
        let chosen = plan(&PlanInput {
            roles: &roles,
            tokens: &tokens,
            start: 0,
            pinned: None,
            keep_budget: 20_000,
            step_budget: 0,
        });
        laps.lap(4, &mut samples);
        let rendered = match (found.first(), chosen) {
            (Some(checkpoint), Ok(_)) => {
                let text = summary_text(&checkpoint.summary, &[], &[]);
                let how = Through {
                    checkpoint,
                    tokens: &tokens,
                    merge_into_user: false,
                    text: &text,
                };
                WireRequest::render(&request, &how)
            }
            _ => body.to_vec(),
        };
        laps.lap(5, &mut samples);
        let answer = client
            .post(url)
            .header("content-type", "application/json")
            .body(rendered)
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        std::hint::black_box(answer);
        laps.lap(6, &mut samples);
        let source = futures::stream::iter(events.clone().into_iter().map(Ok::<_, std::io::Error>));
        let sent = Observed::sse(Box::pin(source), true, &Chat, Box::new(|_| {}))
            .map(|c| c.unwrap().len())
            .fold(0, |a, n| async move { a + n })
            .await;
        std::hint::black_box(sent);
        laps.lap(7, &mut samples);
    }
    samples
}

/// The time since the previous lap, kept as `stage`'s sample unless warming up.
struct Laps {
    at: Instant,
    keep: bool,
}

impl Laps {
    fn lap(&mut self, stage: usize, samples: &mut [Vec<Duration>]) {
        let now = Instant::now();
        if self.keep {
            samples[stage].push(now - self.at);
        }
        self.at = now;
    }
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn largest_session(dir: &PathBuf) -> Option<(String, Vec<u8>)> {
    let mut found: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().contains("_upto_"))
        })
        .filter_map(|p| {
            Some((
                p.file_stem()?.to_string_lossy().into_owned(),
                std::fs::read(&p).ok()?,
            ))
        })
        .filter(|(_, b)| ChatRequest::parse(b).is_ok())
        .collect();
    found.sort_by_key(|(_, b)| b.len());
    found.pop()
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = Args::parse();
    Meter::warm_up();
    let url = provider().await;
    let mut bodies = vec![(
        "small request".to_string(),
        SMALL.as_bytes().to_vec(),
        args.n,
    )];
    if let Some((name, body)) = largest_session(&args.data) {
        bodies.push((
            format!("{name} ({} KB)", body.len() / 1024),
            body,
            (args.n / 50).max(20),
        ));
    }
    for (name, body, n) in bodies {
        let mut samples = time_stages(&body, n, &url).await;
        let medians: Vec<Duration> = samples.iter_mut().map(|s| median(s)).collect();
        let total: Duration = medians.iter().sum();
        println!(
            "\n{name}: median of {n} requests per stage, total {:.1} µs",
            total.as_secs_f64() * 1e6
        );
        println!("| stage | median (µs) | share |");
        println!("|---|---|---|");
        for (stage, took) in STAGES.iter().zip(&medians) {
            println!(
                "| {stage} | {:.2} | {:.1} % |",
                took.as_secs_f64() * 1e6,
                100.0 * took.as_secs_f64() / total.as_secs_f64()
            );
        }
        let (slowest, took) = STAGES
            .iter()
            .zip(&medians)
            .max_by_key(|(_, d)| **d)
            .unwrap();
        let in_process: Duration = medians
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != 6)
            .map(|(_, d)| *d)
            .sum();
        let (cpu_slowest, _) = STAGES
            .iter()
            .zip(&medians)
            .enumerate()
            .filter(|(i, _)| *i != 6)
            .map(|(_, s)| s)
            .max_by_key(|(_, d)| **d)
            .unwrap();
        println!(
            "slowest: {slowest} ({:.1} µs); of the stages in the proxy itself (all but forward, {:.1} µs together): {cpu_slowest}",
            took.as_secs_f64() * 1e6,
            in_process.as_secs_f64() * 1e6
        );
    }
}
