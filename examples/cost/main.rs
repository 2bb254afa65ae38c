//! The cost replay (issue 26): what a task costs with the provider's prompt cache, sent
//! straight through, through Compactor at the model's window and at a quarter and an eighth of
//! it, and through a proxy that rebuilds its prefix on every request. Run it through
//! `scripts/cost`; it prints a Markdown table and appends it to `--out`.
//!
//! [`cache`] is the provider's side (the cache, `usage`, prices), [`run`] the replay.

mod cache;
mod run;

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::Parser;
use run::{Bill, Way};

#[derive(Debug, Parser)]
struct Args {
    /// Session files (chat request bodies holding the whole session).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// The model's context window, in tokens.
    #[arg(long, default_value_t = 200_000)]
    window: u64,
    /// One-shot requests replayed per session (each its own conversation).
    #[arg(long, default_value_t = 10)]
    one_shots: usize,
    /// A file to append the table to.
    #[arg(long)]
    out: Option<PathBuf>,
    /// A line put above the table.
    #[arg(long, default_value = "")]
    label: String,
    /// `compaction.clear_min_share` for the replays through Compactor (the default's otherwise).
    #[arg(long)]
    clear_min_share: Option<f64>,
    /// `compaction.soft_threshold` for the replays through Compactor (the default's otherwise):
    /// where ahead-of-time summaries start, as a share of the window.
    #[arg(long)]
    soft_threshold: Option<f64>,
    /// `compaction.keep_recent_tokens` for the replays through Compactor (the default's
    /// otherwise): the most a compaction keeps verbatim.
    #[arg(long)]
    keep_recent_tokens: Option<u64>,
    /// How summary requests are sent: `continuation` of the conversation's cached prompt, or
    /// `standalone` (their own system prompt and a transcript).
    #[arg(long, value_enum, default_value_t = Summaries::Continuation)]
    summaries: Summaries,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Summaries {
    Continuation,
    Standalone,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), String> {
    let args = Args::parse();
    if args.clear_min_share.is_some()
        || args.soft_threshold.is_some()
        || args.keep_recent_tokens.is_some()
    {
        let defaults = compactor::config::CompactionConfig::default();
        run::set_compaction(compactor::config::CompactionConfig {
            clear_min_share: args.clear_min_share.unwrap_or(defaults.clear_min_share),
            soft_threshold: args.soft_threshold.unwrap_or(defaults.soft_threshold),
            keep_recent_tokens: args
                .keep_recent_tokens
                .unwrap_or(defaults.keep_recent_tokens),
            ..defaults
        });
    }
    run::set_standalone_summaries(args.summaries == Summaries::Standalone);
    let mut table = String::new();
    if !args.label.is_empty() {
        writeln!(table, "### {}\n", args.label).unwrap();
    }
    let prices = &cache::PRICES;
    writeln!(
        table,
        "| session | way | requests | turns | fresh | read | written | summarizer in (read) / out | summaries (requests) | per 100 requests | per turn | ahead of time (used) | cache-read share | {} $ | × straight | {} $ | × straight |",
        prices[0].name, prices[1].name
    )
    .unwrap();
    writeln!(
        table,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    .unwrap();
    let mut notes = String::new();
    for file in &args.files {
        let name = file
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        let body: serde_json::Value = serde_json::from_slice(
            &std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?,
        )
        .map_err(|e| format!("{}: {e}", file.display()))?;
        let w = args.window;
        let ways = [
            ("straight through", Way::Straight),
            ("Compactor, window", Way::Compactor(w)),
            ("Compactor, ¼ window", Way::Compactor(w / 4)),
            ("Compactor, ⅛ window", Way::Compactor(w / 8)),
            ("naive, ¼ window", Way::Naive(w / 4)),
            ("naive, ⅛ window", Way::Naive(w / 8)),
        ];
        let mut straight = [0.0; 2];
        for (label, way) in ways {
            let started = std::time::Instant::now();
            let bill = run::replay(&body, way)
                .await
                .map_err(|e| format!("{name}: {e}"))?;
            eprintln!("{name} {label}: {:.1} s", started.elapsed().as_secs_f64());
            let dollars = cost(&bill);
            if matches!(way, Way::Straight) {
                straight = dollars;
                let answers: Vec<String> = prices
                    .iter()
                    .map(|p| {
                        let t = cache::Tokens {
                            output: bill.prompts[0].output,
                            ..Default::default()
                        };
                        format!("{} ${:.2}", p.name, p.dollars(&t))
                    })
                    .collect();
                writeln!(
                    notes,
                    "- {name}: the session's own answers, {} output tokens, cost the same every way ({}) and are left out of the costs above.",
                    bill.prompts[0].output,
                    answers.join(", ")
                )
                .unwrap();
            }
            writeln!(table, "{}", row(&name, label, &bill, dollars, straight)).unwrap();
        }
        let (sent, summaries, tokens) = run::one_shots(&body, w / 4, args.one_shots, (0.45, 0.69))
            .await
            .map_err(|e| format!("{name}: {e}"))?;
        let dollars: Vec<String> = prices
            .iter()
            .map(|p| format!("{} ${:.3}", p.name, p.dollars(&tokens)))
            .collect();
        writeln!(
            notes,
            "- {name}: {sent} one-shot requests of 45–69 % of a ¼ window ({} tokens), each its own conversation: {summaries} ahead-of-time summaries written, none of which can be used; {} summarizer tokens in, {} out ({}, at fresh-input prices).",
            w / 4,
            tokens.fresh,
            tokens.output,
            dollars.join(", ")
        )
        .unwrap();
    }
    let text = format!("{table}\n{notes}");
    print!("{text}");
    if let Some(out) = &args.out {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(out)
            .map_err(|e| format!("{}: {e}", out.display()))?;
        writeln!(f, "{text}").map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The task's prompts and its summaries, at each provider's prices (the session's own answers
/// left out: they are the same every way).
fn cost(bill: &Bill) -> [f64; 2] {
    let mut out = [0.0; 2];
    for (i, p) in cache::PRICES.iter().enumerate() {
        let prompts = cache::Tokens {
            output: 0,
            ..bill.prompts[i]
        };
        out[i] = p.dollars(&prompts) + p.dollars(&bill.summaries[i]);
    }
    out
}

fn row(name: &str, label: &str, bill: &Bill, dollars: [f64; 2], straight: [f64; 2]) -> String {
    let a = &bill.prompts[0];
    let s = &bill.summaries[0];
    let input = a.input() + s.input();
    let share = 100.0 * (a.read + s.read) as f64 / input.max(1) as f64;
    let used = if bill.ahead_of_time == 0 {
        "0".to_string()
    } else {
        format!(
            "{} ({:.0} %)",
            bill.ahead_of_time,
            100.0 * bill.ahead_of_time_used as f64 / bill.ahead_of_time as f64
        )
    };
    format!(
        "| {name} | {label} | {} | {} | {} | {} | {} | {} ({}) / {} | {} ({}) | {:.1} | {:.2} | {used} | {share:.0} % | {:.2} | {:.2} | {:.2} | {:.2} |",
        bill.requests,
        bill.turns,
        a.fresh,
        a.read,
        a.written,
        s.input(),
        bill.summaries[1].read,
        s.output,
        bill.summary_count,
        bill.summary_requests,
        100.0 * bill.summary_count as f64 / bill.requests.max(1) as f64,
        bill.summary_count as f64 / bill.turns.max(1) as f64,
        dollars[0],
        dollars[0] / straight[0].max(1e-9),
        dollars[1],
        dollars[1] / straight[1].max(1e-9),
    )
}
