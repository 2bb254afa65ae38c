//! Where the proxy's time goes on a large body, per dialect: parse, measure (warm: the
//! conversation seen one turn before; and cold: every element new, counted), identify (the
//! hash chain) and the body for the provider (the client's own bytes, shared, where nothing
//! changes them; written again where something does), each timed one after another on one
//! request, the median per stage printed with its share of the warm path.
//!
//! The bodies are files named after their dialect (`chat.json`, `responses.json`,
//! `responses+item.json`, `messages.json`), as `scripts/bench/large_dialects.py --dump DIR`
//! writes them.
//!
//! `cargo run --release --example large_stages -- --bodies DIR [--n 40]`

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use compactor::dialect::registry::DIALECTS;
use compactor::dialect::Dialect;
use compactor::identity;
use compactor::measure::Meter;

#[derive(Debug, Parser)]
struct Args {
    /// Directory of the bodies.
    #[arg(long)]
    bodies: PathBuf,
    /// Timed repetitions of the warm path per body (the cold count runs a fifth as often).
    #[arg(long, default_value_t = 40)]
    n: usize,
}

const WARM: [&str; 4] = [
    "parse",
    "measure (warm)",
    "identify",
    "body for the provider",
];

fn dialect_of(name: &str) -> Option<&'static dyn Dialect> {
    let wanted = match name.split('+').next()? {
        "chat" => "chat",
        "responses" => "responses",
        "messages" => "messages",
        _ => return None,
    };
    DIALECTS.iter().copied().find(|d| d.name() == wanted)
}

/// `body` with every element's bytes changed (a key's colon moved `round + 1` spaces on), so
/// that none of its elements was parsed or counted before.
fn unseen(body: &[u8], round: usize) -> Vec<u8> {
    let spaced = format!("\"{}:", " ".repeat(round + 1));
    String::from_utf8_lossy(body)
        .replace("\":", &spaced)
        .into_bytes()
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() {
    let args = Args::parse();
    Meter::warm_up();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&args.bodies)
        .expect("the bodies' directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    let tenant = identity::tenant("Bearer large-stages");
    for path in files {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let Some(dialect) = dialect_of(&name) else {
            continue;
        };
        let body = Bytes::from(std::fs::read(&path).unwrap());
        let meter = Meter::new(100_000);
        meter.measure(dialect.parse(&body).unwrap().as_ref());
        let mut samples = vec![Vec::with_capacity(args.n); WARM.len()];
        for i in 0..args.n + args.n / 10 {
            let keep = i >= args.n / 10;
            let mut at = Instant::now();
            let mut lap = |stage: usize, samples: &mut Vec<Vec<Duration>>| {
                let now = Instant::now();
                if keep {
                    samples[stage].push(now - at);
                }
                at = now;
            };
            let request = dialect.parse(&body).unwrap();
            lap(0, &mut samples);
            let measured = meter.measure(request.as_ref());
            lap(1, &mut samples);
            let chain = identity::chain(&tenant, measured.elements.iter().map(|m| m.canonical));
            lap(2, &mut samples);
            let sent = request.original_body();
            lap(3, &mut samples);
            std::hint::black_box((chain, sent));
        }
        let mut cold = Vec::new();
        for round in 0..(args.n / 5).max(3) {
            // Elements parsed before carry their counts: each round's body is new throughout.
            let request = dialect.parse(&Bytes::from(unseen(&body, round))).unwrap();
            let fresh = Meter::new(100_000);
            let started = Instant::now();
            std::hint::black_box(fresh.measure(request.as_ref()).total());
            cold.push(started.elapsed());
        }
        let medians: Vec<Duration> = samples.iter_mut().map(|s| median(s)).collect();
        let total: Duration = medians.iter().sum();
        println!(
            "\n{name} ({} KB, {} elements): warm path {:.1} µs (median of {} per stage); cold count {:.1} µs",
            body.len() / 1024,
            dialect.parse(&body).unwrap().len(),
            us(total),
            args.n,
            us(median(&mut cold)),
        );
        println!("| stage | median (µs) | share of the warm path |");
        println!("|---|---|---|");
        for (stage, took) in WARM.iter().zip(&medians) {
            println!(
                "| {stage} | {:.1} | {:.1} % |",
                us(*took),
                100.0 * took.as_secs_f64() / total.as_secs_f64()
            );
        }
    }
}
