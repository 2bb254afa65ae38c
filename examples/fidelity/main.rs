//! The fidelity benchmark's driver (run it through `scripts/fidelity`, which starts the model).
//!
//! For each conversation file (a chat request body, as in `../shared/data/conversations`):
//! choose the span Compactor's planner summarizes when it keeps the newest `--keep-tokens`
//! verbatim, cap it to its newest `--span-tokens`, have the summarizer at `--url` write
//! Compactor's summary of it, and score that summary, and the reference summary beside the file
//! (`NAME.reference_summary.md`) when there is one, with [`score`]. Prints a table and appends
//! it to `--out`.
//!
//! The pure parts are modules here, so the metric is unit-tested and stated once: [`span`]
//! chooses the messages a compaction summarizes (optionally capped to the newest tokens),
//! [`score`] extracts what a summary must keep from that span and measures how much of it a
//! summary holds. [`score::RULES`] states the extraction rules in words for the results file.

mod probe_run;
mod probes;
mod replay;
mod score;
mod span;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use compactor::compaction::prompt::{self, Style};
use compactor::compaction::{files::FileOps, record, summary_text};
use compactor::dialect::chat::request::{ChatRequest, Message};
use compactor::dialect::chat::{transcript, Chat};
use compactor::dialect::{Dialect, MessageView, Role, SummaryRequest};
use compactor::measure::Meter;
use compactor::tokenizer::Encoding;
use score::{Score, Share, SpanFacts};
use serde_json::Value;

#[derive(Debug, Parser)]
struct Args {
    /// Conversation files (chat request bodies).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Base URL of the summarizer (OpenAI-compatible, e.g. llama-server's `/v1`).
    #[arg(long, default_value = "http://127.0.0.1:18090/v1")]
    url: String,
    #[arg(long, default_value = "qwen2.5-coder-0.5b-instruct")]
    model: String,
    /// The summarizer's context window, in tokens.
    #[arg(long, default_value_t = 16384)]
    window: u64,
    /// Newest tokens kept verbatim; the rest is the span summarized.
    #[arg(long, default_value_t = 20000)]
    keep_tokens: u64,
    /// Summarize only the newest tokens of the span, from a user message (0: the whole span).
    #[arg(long, default_value_t = 12000)]
    span_tokens: u64,
    /// Longest summary, in tokens (default: what the proxy allows for this window).
    #[arg(long)]
    summary_tokens: Option<u64>,
    /// How summary requests are worded: `sections` (the proxy's) or `outline` (for small
    /// models: the task and bare headings after the transcript).
    #[arg(long, default_value = "sections", value_parser = ["sections", "outline"])]
    wording: String,
    /// How a chunk's summary is carried into the next: `rewrite` (the model rewrites it with the
    /// next chunk) or `append` (each chunk summarized alone, the texts joined).
    #[arg(long, default_value = "append", value_parser = ["rewrite", "append"])]
    carry: String,
    /// Transcript tokens per summary request (default: what fits the window beside the prompt,
    /// the previous summary and the answer).
    #[arg(long)]
    chunk_tokens: Option<u64>,
    /// Longest answer the model may write, in tokens (default: the proxy's, half the summary
    /// budget; the record gets what the model leaves, up to `--record-share`).
    #[arg(long)]
    model_tokens: Option<u64>,
    /// Most of the summary budget the record takes, in percent (the proxy's: all the model
    /// leaves).
    #[arg(long, default_value_t = record::SHARE)]
    record_share: u64,
    /// Score again the model texts an earlier run saved under this label (in `--summaries`)
    /// instead of asking the model: record variants on the same model text.
    #[arg(long)]
    model_texts: Option<String>,
    /// Name of the variant measured, for the results.
    #[arg(long, default_value = "current")]
    label: String,
    /// Also score the record after the span is compacted this many times in a row (the span cut
    /// into as many consecutive parts at user messages, each folded into the previous summary
    /// with a model text that carries nothing): what code alone carries across compactions.
    #[arg(long, default_value_t = 0)]
    repeat: usize,
    /// Score the reference summaries only; no model is asked.
    #[arg(long)]
    no_model: bool,
    /// Run the probe benchmark instead ([`probe_run`]): conversations with a reference summary
    /// scored at their compaction point, the others replayed through the engine at `--window`.
    /// No model is asked.
    #[arg(long)]
    probes: bool,
    /// In the probe benchmark's replays, summarize at every crossing: no old tool output is
    /// cleared first (`compaction.clear_tool_results_first = false`).
    #[arg(long)]
    no_clearing: bool,
    /// In the probe benchmark's replays, a clearing is made only when it frees at least this
    /// share of what a summary would (`compaction.clear_min_share`; default: the proxy's).
    #[arg(long)]
    clear_min_share: Option<f64>,
    /// In the probe benchmark's replays, the summaries are written by the model at `--url`
    /// (`--model`, with a context window of `--probes-model-window` tokens) instead of a
    /// summarizer whose text carries nothing.
    #[arg(long)]
    probes_model: bool,
    /// The context window of the model writing the replays' summaries (default `--window`).
    #[arg(long)]
    probes_model_window: Option<u64>,
    /// In the probe benchmark's replays, summaries are written ahead of time, as the proxy
    /// does by default (each waited for before the next request).
    #[arg(long)]
    probes_ahead_of_time: bool,
    /// In the probe benchmark's replays, the most a compaction keeps verbatim
    /// (`compaction.keep_recent_tokens`; default: the proxy's).
    #[arg(long)]
    keep_recent_tokens: Option<u64>,
    /// Markdown file the results are appended to.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Where each summary is written, for reading.
    #[arg(long)]
    summaries: Option<PathBuf>,
    /// Print what each span expects: paths, salient entities, requests and their key words.
    #[arg(long)]
    verbose: bool,
    /// Revision and date to print in the results.
    #[arg(long, default_value = "unknown")]
    revision: String,
    #[arg(long, default_value = "unknown")]
    date: String,
}

/// One scored summary of one conversation.
struct Row {
    conversation: String,
    who: &'static str,
    span: String,
    score: Score,
    tokens: u64,
    budget: Option<u64>,
    seconds: Option<f64>,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    match run(&args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fidelity: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: &Args) -> Result<(), String> {
    if args.probes {
        if let Some(share) = args.clear_min_share {
            replay::set_clear_min_share(share);
        }
        replay::set_cadence(replay::Cadence {
            ahead_of_time: args.probes_ahead_of_time,
            keep_recent_tokens: args.keep_recent_tokens,
        });
        return probe_run::run(&probe_run::ProbeArgs {
            files: &args.files,
            window: args.window,
            keep_tokens: args.keep_tokens,
            label: &args.label,
            revision: &args.revision,
            date: &args.date,
            out: args.out.as_deref(),
            summaries: args.summaries.as_deref(),
            clear_first: !args.no_clearing,
            summarizer: args.probes_model.then(|| replay::ModelSummarizer {
                url: args.url.clone(),
                model: args.model.clone(),
                window: args.probes_model_window.unwrap_or(args.window),
            }),
        })
        .await;
    }
    let budget = args
        .summary_tokens
        .unwrap_or_else(|| (args.window / 8).clamp(128, 4096));
    let span = match args.span_tokens {
        0 => "the whole span summarized".to_string(),
        cap => format!("span capped to its newest {cap} tokens from a user message"),
    };
    let mut settings = format!(
        "model `{}`, summarizer window {} tokens, summary budget {budget} tokens, newest {} tokens \
         kept verbatim, {span}; wording `{}`, carry `{}`",
        args.model, args.window, args.keep_tokens, args.wording, args.carry,
    );
    if let Some(n) = args.chunk_tokens {
        let _ = write!(settings, ", chunks of at most {n} transcript tokens");
    }
    let model_tokens = args
        .model_tokens
        .unwrap_or_else(|| record::model_allowance(budget))
        .min(budget);
    let _ = write!(
        settings,
        ", model answers of at most {model_tokens} tokens, record up to {}% of the budget",
        args.record_share
    );
    println!("{} ({settings})", args.label);
    let client = reqwest::Client::builder()
        // One request may read 8k tokens and more on a loaded 2-core machine: 30 minutes was
        // seen to be too short.
        .timeout(Duration::from_secs(4 * 3600))
        .build()
        .map_err(|e| e.to_string())?;
    let mut rows = Vec::new();
    let mut missing = String::new();
    // The user's constraints in the spans, as the record's detector finds them, and how many of
    // them the record still holds after the repeated compactions.
    let mut constraints = (0, 0);
    // How many compactions each span was actually cut into (a span with few user messages
    // gets fewer than asked for).
    let mut folds: Vec<usize> = Vec::new();
    for file in &args.files {
        let name = file
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let body = std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?;
        let request = ChatRequest::parse(&body).map_err(|e| format!("{name}: {e}"))?;
        let measured = Meter::new(4096).measure(&request);
        let roles: Vec<_> = request.messages.iter().map(|m| m.role).collect();
        let tokens: Vec<u64> = measured.elements.iter().map(|m| m.tokens).collect();
        let cap = (args.span_tokens > 0).then_some(args.span_tokens);
        let Some(chosen) = span::choose(&roles, &tokens, args.keep_tokens, cap) else {
            println!(
                "{name}: nothing to summarize at {} kept tokens",
                args.keep_tokens
            );
            continue;
        };
        let span_label = format!(
            "{} msgs, {} of {} tok",
            chosen.messages.len(),
            chosen.tokens,
            chosen.full_tokens
        );
        let facts = SpanFacts::of(&request.messages, &chosen.messages);
        let reference = std::fs::read_to_string(reference_path(file)).ok();
        let entities = reference
            .as_deref()
            .map(|r| score::salient_entities(r, &facts));
        if args.verbose {
            println!("{name}: span {span_label}\n  paths: {:?}", facts.paths);
            println!("  salient entities: {entities:?}");
            for r in &facts.requests {
                println!("  request in message {}: {:?}", r.message, r.key_words);
            }
            println!("  requests too short to judge: {}", facts.unscored_requests);
        }
        let row = |who, summary: &str, budget, seconds| Row {
            conversation: name.clone(),
            who,
            span: span_label.clone(),
            score: score::score(summary, &facts, entities.as_deref()),
            tokens: Encoding::O200k.count(summary),
            budget,
            seconds,
        };
        let span: Vec<&Message> = chosen
            .messages
            .iter()
            .map(|&i| &*request.messages[i])
            .collect();
        let mut files = FileOps::default();
        files.collect(span.iter().map(|m| m.view()));
        let views: Vec<_> = span.iter().map(|m| (m.role, m.view().clone())).collect();
        let (read, modified) = files.into_lists();
        let encoding = Encoding::for_model(&args.model);
        let room = record::RecordRoom {
            encoding,
            budget,
            share: args.record_share,
        };
        // What no model can lose: the file lists (before the record existed), then the record
        // and the file lists, without any model text.
        let mut variants = vec![
            ("files", "file lists only", String::new(), None),
            (
                "record",
                "record + file lists only",
                record::attach_share("", &views, None, room),
                None,
            ),
        ];
        if args.repeat > 1 {
            let (repeated, times) = compact_repeatedly(&views, args.repeat, room);
            folds.push(times);
            let (set, carried) = carried_constraints(&views, &repeated);
            constraints.0 += set;
            constraints.1 += carried;
            variants.push((
                "repeated",
                "record after repeated compactions",
                repeated,
                None,
            ));
        }
        let answer = match &args.model_texts {
            Some(label) => Some((saved_model_text(args, label, &name)?, None)),
            None if !args.no_model => {
                let started = Instant::now();
                let text = summarize_span(&client, args, &span, model_tokens).await?;
                Some((text, Some(started.elapsed().as_secs_f64())))
            }
            None => None,
        };
        if let Some((model_text, seconds)) = answer {
            // What the proxy stores: the model's text, then the record.
            let stored = record::attach_share(&model_text, &views, None, room);
            variants.push((
                "model",
                "ours, model text + file lists",
                model_text,
                seconds,
            ));
            variants.push(("stored", "ours, as stored (+ record)", stored, seconds));
        }
        for (slug, who, text, seconds) in variants {
            let summary = summary_text::summary_text(&text, &read, &modified);
            if let Some(dir) = &args.summaries {
                let _ = std::fs::create_dir_all(dir);
                let path = dir.join(format!("{}-{name}-{slug}.md", args.label));
                std::fs::write(&path, &summary).map_err(|e| format!("{}: {e}", path.display()))?;
            }
            let ours = row(who, &summary, Some(budget), seconds);
            note_missing(&mut missing, &ours);
            rows.push(ours);
        }
        if let Some(reference) = &reference {
            rows.push(row("reference", reference, None, None));
        }
    }
    let mut table = table(&rows);
    if args.repeat > 1 {
        let _ = writeln!(
            table,
            "\nCompactions in a row per span: {} to {} (asked for {}; a span with fewer user \
             messages gets fewer). User constraints (as the record detects them) carried \
             verbatim after them: {} of {}.",
            folds.iter().min().unwrap_or(&0),
            folds.iter().max().unwrap_or(&0),
            args.repeat,
            constraints.1,
            constraints.0
        );
    }
    print!("{table}");
    if !missing.is_empty() {
        print!("\nMissing from ours:\n{missing}");
    }
    if let Some(out) = &args.out {
        append_results(out, args, &settings, &table, &missing)?;
    }
    Ok(())
}

/// The summary after `views` is compacted `times` times in a row: cut into as many parts of
/// about equal length, each starting at a user message, each folded into the summary before it
/// with no model text; with the number of parts.
fn compact_repeatedly(
    views: &[(Role, MessageView)],
    times: usize,
    room: record::RecordRoom,
) -> (String, usize) {
    // Each part starts at the first user message at or after its even share of the span.
    let mut starts = vec![0];
    for k in 1..times {
        let target = k * views.len() / times;
        let next = (target.max(starts.last().unwrap() + 1)..views.len())
            .find(|&i| views[i].0 == Role::User);
        match next {
            Some(i) => starts.push(i),
            None => break,
        }
    }
    starts.push(views.len());
    let mut summary: Option<String> = None;
    for part in starts.windows(2) {
        let span = &views[part[0]..part[1]];
        summary = Some(record::attach_share("", span, summary.as_deref(), room));
    }
    (summary.unwrap_or_default(), starts.len() - 1)
}

/// The user's constraints of `views` (as the record detects them), and how many of them the
/// record of `summary` holds verbatim.
fn carried_constraints(views: &[(Role, MessageView)], summary: &str) -> (usize, usize) {
    let carried = record::split(summary)
        .1
        .map(record::Record::parse)
        .unwrap_or_default();
    let set = record::Record::collect(views);
    let kept = set
        .constraints()
        .iter()
        .filter(|c| carried.constraints().contains(c))
        .count();
    (set.constraints().len(), kept)
}

/// The model's text in the summary an earlier run (`label`) saved for conversation `name`.
fn saved_model_text(args: &Args, label: &str, name: &str) -> Result<String, String> {
    let dir = args.summaries.as_deref().unwrap_or(Path::new("."));
    let path = dir.join(format!("{label}-{name}-model.md"));
    let saved = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let start = saved
        .find("<summary>\n")
        .map_or(0, |at| at + "<summary>\n".len());
    let text = &saved[start..];
    let end = ["\n<files-read>", "\n<files-modified>", "\n</summary>"]
        .iter()
        .filter_map(|tag| text.find(tag))
        .min()
        .unwrap_or(text.len());
    Ok(text[..end].trim().to_string())
}

fn reference_path(file: &Path) -> PathBuf {
    file.with_extension("reference_summary.md")
}

/// The summary style the flags ask for.
fn style(args: &Args) -> Style {
    Style {
        wording: match args.wording.as_str() {
            "outline" => prompt::Wording::Outline,
            _ => prompt::Wording::Sections,
        },
        carry: match args.carry.as_str() {
            "append" => prompt::Carry::Append,
            _ => prompt::Carry::Rewrite,
        },
    }
}

/// The summarizer's text for `span`: the transcript in chunks that fit the summarizer, folded
/// into one running summary, as the proxy does it.
async fn summarize_span(
    client: &reqwest::Client,
    args: &Args,
    span: &[&Message],
    max_tokens: u64,
) -> Result<String, String> {
    let encoding = Encoding::for_model(&args.model);
    let margin = 1024.min(args.window / 16);
    // As the proxy sizes chunks before it has learned a correction: by our own count.
    let usable = args.window - margin;
    // Room for the transcript beside the prompt, the largest previous summary and the answer.
    let fits = usable
        .saturating_sub(2 * max_tokens)
        .saturating_sub(prompt::fixed_cost(encoding))
        .max(256);
    let budget = args.chunk_tokens.map_or(fits, |n| n.min(fits));
    let style = style(args);
    let entries = span
        .iter()
        .map(|m| transcript::transcript_entry(m, None))
        .collect();
    let mut running: Option<String> = None;
    let chunks = prompt::chunk(entries, encoding, budget);
    let count = chunks.len();
    for (n, chunk) in chunks.into_iter().enumerate() {
        let started = Instant::now();
        let body = request_body(&args.model, style, running.as_deref(), &chunk, max_tokens);
        let response = client
            .post(format!(
                "{}/chat/completions",
                args.url.trim_end_matches('/')
            ))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| format!("summarizer: {e}"))?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(|e| e.to_string())?;
        if !status.is_success() {
            return Err(format!("summarizer answered {status}"));
        }
        let answer =
            prompt::clean_answer(&transcript::read_answer(&bytes).map_err(|e| e.to_string())?);
        eprintln!(
            "fidelity: chunk {}/{count} ({} tokens) summarized in {:.0} s",
            n + 1,
            encoding.count(&chunk),
            started.elapsed().as_secs_f64()
        );
        running = Some(style.fold(running.as_deref(), answer, encoding, max_tokens));
    }
    running.ok_or_else(|| "empty span".to_string())
}

fn percent(share: Option<&Share>) -> String {
    match share.and_then(|s| s.percent().map(|p| (s, p))) {
        Some((s, p)) => format!("{p:.0}% ({}/{})", s.found, s.total),
        None => "n/a".into(),
    }
}

fn table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| conversation | summary | span | paths | salient entities | user requests | tokens / budget | seconds |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    let line = |out: &mut String,
                conv: &str,
                who: &str,
                span: &str,
                s: &Score,
                size: String,
                secs: String| {
        let _ = writeln!(
            out,
            "| {conv} | {who} | {span} | {} | {} | {} | {size} | {secs} |",
            percent(Some(&s.paths)),
            percent(s.entities.as_ref()),
            percent(Some(&s.requests)),
        );
    };
    for row in rows {
        let size = match row.budget {
            Some(b) => format!("{} / {b}", row.tokens),
            None => row.tokens.to_string(),
        };
        let secs = row.seconds.map_or("n/a".into(), |s| format!("{s:.0}"));
        line(
            &mut out,
            &row.conversation,
            row.who,
            &row.span,
            &row.score,
            size,
            secs,
        );
    }
    let mut kinds: Vec<&str> = Vec::new();
    for row in rows {
        if !kinds.contains(&row.who) {
            kinds.push(row.who);
        }
    }
    for who in kinds {
        let mine: Vec<&Row> = rows.iter().filter(|r| r.who == who).collect();
        if mine.is_empty() {
            continue;
        }
        let mut total = Score::default();
        let mut entities = Share::default();
        for r in &mine {
            total.paths.add(&r.score.paths);
            total.requests.add(&r.score.requests);
            if let Some(e) = &r.score.entities {
                entities.add(e);
            }
        }
        total.entities = (entities.total > 0).then_some(entities);
        let tokens: u64 = mine.iter().map(|r| r.tokens).sum();
        let secs: f64 = mine.iter().filter_map(|r| r.seconds).sum();
        let timed = mine.iter().any(|r| r.seconds.is_some());
        let secs = if timed {
            format!("{secs:.0}")
        } else {
            "n/a".into()
        };
        line(
            &mut out,
            "**total**",
            who,
            "",
            &total,
            tokens.to_string(),
            secs,
        );
    }
    out
}

fn note_missing(out: &mut String, row: &Row) {
    let list = |share: Option<&Share>| {
        share.map_or(String::new(), |s| {
            let shown: Vec<&str> = s.missing.iter().take(20).map(String::as_str).collect();
            let more = s.missing.len().saturating_sub(shown.len());
            let more = if more > 0 {
                format!(" … and {more} more")
            } else {
                String::new()
            };
            format!("{}{more}", shown.join(", "))
        })
    };
    let _ = writeln!(
        out,
        "- {} ({}): paths: {}; entities: {}; requests: {}",
        row.conversation,
        row.who,
        list(Some(&row.score.paths)),
        list(row.score.entities.as_ref()),
        list(Some(&row.score.requests)),
    );
}

fn append_results(
    out: &Path,
    args: &Args,
    settings: &str,
    table: &str,
    missing: &str,
) -> Result<(), String> {
    let mut text = std::fs::read_to_string(out).unwrap_or_default();
    if text.is_empty() {
        let _ = write!(
            text,
            "# Summary fidelity, {}\n\nProduced by `scripts/fidelity`. Each variant's summaries \
             (ours) and the summaries the conversation's own agent wrote at the same point \
             (reference), scored on the same span.\n\n## Extraction rules\n\n{}\n",
            args.date,
            score::RULES
        );
    }
    let _ = write!(
        text,
        "\n## {} (revision {}, {})\n\n{settings}.\n\n{table}",
        args.label, args.revision, args.date
    );
    if !missing.is_empty() {
        let _ = write!(text, "\nMissing from ours:\n{missing}");
    }
    std::fs::write(out, text).map_err(|e| format!("{}: {e}", out.display()))
}

/// The body of one summary request, in chat completions form.
fn request_body(
    model: &str,
    style: Style,
    previous: Option<&str>,
    transcript: &str,
    max_tokens: u64,
) -> Value {
    let user = prompt::user_prompt(style, previous, transcript, &[], max_tokens);
    Chat.summary_request(&SummaryRequest {
        model,
        system: style.system_prompt(),
        user: &user,
        max_tokens,
        conversation: None,
    })
}
