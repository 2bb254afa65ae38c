//! The probe benchmark (`--probes`): per category, how many probes of the replaced turns the
//! next request still answers, beside the share of tokens it keeps.
//!
//! - A conversation with a reference summary beside it is one compaction point: the span the
//!   planner replaces when it keeps the newest `--keep-tokens`, scored on the request made of
//!   our summary (record and file lists, no model text) and the kept turns, of the reference
//!   summary and the kept turns, and of the kept turns and as many of the newest replaced ones
//!   as fit the size of ours (drop-oldest). Ours gets the reference's size as its budget.
//! - Any other conversation is replayed through the engine at `--window` ([`replay`]) and
//!   scored at each compaction point and after the last.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use compactor::compaction::{files::FileOps, record, summary_text};
use compactor::dialect::chat::request::ChatRequest;
use compactor::dialect::{MessageView, Role};
use compactor::measure::Meter;
use compactor::tokenizer::Encoding;
use serde_json::Value;

use crate::probes::{self, Category, Haystack, Tally};
use crate::replay::{self, Replay};
use crate::span;

/// What the probe run needs of the driver's options.
pub struct ProbeArgs<'a> {
    pub files: &'a [PathBuf],
    pub window: u64,
    pub keep_tokens: u64,
    pub label: &'a str,
    pub revision: &'a str,
    pub date: &'a str,
    pub out: Option<&'a Path>,
    /// Where the last summary of each replay is written, for reading.
    pub summaries: Option<&'a Path>,
    /// Whether the replayed engine clears old tool output before it summarizes.
    pub clear_first: bool,
    /// The model that writes the replays' summaries; none: a summarizer whose text carries
    /// nothing.
    pub summarizer: Option<replay::ModelSummarizer>,
}

/// One scored request: its probes' tally and its tokens against the history's.
struct Scored {
    tally: Tally,
    tokens: u64,
    original: u64,
}

pub async fn run(args: &ProbeArgs<'_>) -> Result<(), String> {
    let mut single: Vec<(String, [Scored; 3])> = Vec::new();
    let mut replays: Vec<(String, Replay)> = Vec::new();
    for file in args.files {
        let name = file
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let bytes = std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?;
        match std::fs::read_to_string(file.with_extension("reference_summary.md")) {
            Ok(reference) => {
                if let Some(scored) = one_point(&bytes, &reference, args.keep_tokens)? {
                    single.push((name, scored));
                }
            }
            Err(_) => {
                let body: Value =
                    serde_json::from_slice(&bytes).map_err(|e| format!("{name}: {e}"))?;
                let started = std::time::Instant::now();
                let replayed = replay::replay(
                    &body,
                    args.window,
                    args.clear_first,
                    args.summarizer.as_ref(),
                )
                .await?;
                eprintln!(
                    "fidelity: {name}: {} requests, {} compactions, {} clearings, {:.0} s",
                    replayed.requests,
                    replayed.compactions,
                    replayed.clearings,
                    started.elapsed().as_secs_f64()
                );
                if let Some(dir) = args.summaries {
                    let _ = std::fs::create_dir_all(dir);
                    let path = dir.join(format!("{}-{name}-replayed.md", args.label));
                    std::fs::write(&path, &replayed.last_summary)
                        .map_err(|e| format!("{}: {e}", path.display()))?;
                }
                replays.push((name, replayed));
            }
        }
    }
    let text = report(args, &single, &replays);
    print!("{text}");
    if let Some(out) = args.out {
        let mut all = std::fs::read_to_string(out).unwrap_or_default();
        if all.is_empty() {
            let _ = write!(
                all,
                "# Probes of replaced turns, {}\n\nProduced by `scripts/fidelity --probes`. \
                 Deterministic unless a model writes the replays' summaries \
                 (`--probes-model`).\n\n## Probe rules\n\n{}\n",
                args.date,
                probes::PROBE_RULES
            );
        }
        all.push_str(&text);
        std::fs::write(out, all).map_err(|e| format!("{}: {e}", out.display()))?;
    }
    Ok(())
}

/// Ours, the reference and drop-oldest at the compaction point of one conversation.
fn one_point(bytes: &[u8], reference: &str, keep: u64) -> Result<Option<[Scored; 3]>, String> {
    let request = ChatRequest::parse(bytes).map_err(|e| e.to_string())?;
    let measured = Meter::new(100_000).measure(&request);
    let roles: Vec<Role> = request.messages.iter().map(|m| m.role).collect();
    let tokens: Vec<u64> = measured.elements.iter().map(|e| e.tokens).collect();
    let Some(chosen) = span::choose(&roles, &tokens, keep, None) else {
        return Ok(None);
    };
    let views: Vec<(Role, MessageView)> = request
        .messages
        .iter()
        .map(|m| (m.role, m.view().clone()))
        .collect();
    let span: Vec<(Role, MessageView)> =
        chosen.messages.iter().map(|&i| views[i].clone()).collect();
    let probes = probes::draw(&span);
    let kept = &views[chosen.cut..];
    let head: Vec<(Role, MessageView)> = views[..chosen.messages[0]].to_vec();
    let encoding = Encoding::O200k;
    let reference_tokens = encoding.count(reference);
    let mut files = FileOps::default();
    files.collect(span.iter().map(|(_, v)| v));
    let (read, modified) = files.into_lists();
    // Ours within the reference's size: the file lists first, the record in what they leave.
    let lists = summary_text::summary_text("", &read, &modified);
    let budget = reference_tokens.saturating_sub(encoding.count(&lists));
    let ours = summary_text::summary_text(
        &record::attach("", &span, None, encoding, budget),
        &read,
        &modified,
    );
    let kept_text = replay::drop_oldest(kept, &vec![0; kept.len()], 0);
    let kept_tokens: u64 = tokens[chosen.cut..].iter().sum();
    let head_tokens: u64 = tokens[..chosen.messages[0]].iter().sum::<u64>() + measured.head_tokens;
    let original = measured.total();
    let scored = |summary: &str| {
        let tokens = head_tokens + kept_tokens + encoding.count(summary);
        Scored {
            tally: Tally::score(&probes, &Haystack::new(&format!("{summary}\n{kept_text}"))),
            tokens,
            original,
        }
    };
    let ours = scored(&ours);
    let reference = scored(reference);
    // Drop-oldest: the kept turns and the newest replaced ones, within our request's size.
    let all: Vec<(Role, MessageView)> = head.into_iter().chain(span).chain(kept.to_vec()).collect();
    let all_tokens: Vec<u64> = tokens[..chosen.messages[0]]
        .iter()
        .chain(chosen.messages.iter().map(|&i| &tokens[i]))
        .chain(&tokens[chosen.cut..])
        .copied()
        .collect();
    let dropped = replay::drop_oldest(&all, &all_tokens, ours.tokens - measured.head_tokens);
    let dropped = Scored {
        tally: Tally::score(&probes, &Haystack::new(&dropped)),
        tokens: ours.tokens,
        original,
    };
    Ok(Some([ours, reference, dropped]))
}

fn share((found, total): (usize, usize)) -> String {
    if total == 0 {
        return "n/a".into();
    }
    format!(
        "{:.0}% ({found}/{total})",
        found as f64 * 100.0 / total as f64
    )
}

fn row(out: &mut String, first: &str, tally: &Tally, tokens: String) {
    let _ = write!(out, "| {first} |");
    for category in Category::ALL {
        let _ = write!(out, " {} |", share(tally.get(category)));
    }
    let _ = writeln!(out, " {} | {tokens} |", share(tally.all()));
}

fn header(out: &mut String, first: &str) {
    let _ = write!(out, "| {first} |");
    for category in Category::ALL {
        let _ = write!(out, " {} |", category.label());
    }
    let _ = writeln!(out, " all probes | tokens kept |");
    let _ = writeln!(out, "|{}", "---|".repeat(Category::ALL.len() + 3));
}

fn kept(tokens: u64, original: u64) -> String {
    format!(
        "{:.1}% ({tokens} of {original})",
        tokens as f64 * 100.0 / original.max(1) as f64
    )
}

fn report(
    args: &ProbeArgs<'_>,
    single: &[(String, [Scored; 3])],
    replays: &[(String, Replay)],
) -> String {
    let mut out = format!(
        "\n## {} (revision {}, {})\n",
        args.label, args.revision, args.date
    );
    if !single.is_empty() {
        let _ = writeln!(
            out,
            "\n### At the reference summaries' compaction points\n\nThe span the planner \
             replaces keeping the newest {} tokens verbatim; ours at the reference's size.\n",
            args.keep_tokens
        );
        header(&mut out, "conversation, request");
        for (name, scored) in single {
            for (who, s) in [
                "ours (record + file lists)",
                "reference summary",
                "drop-oldest",
            ]
            .iter()
            .zip(scored)
            {
                row(
                    &mut out,
                    &format!("{name}, {who}"),
                    &s.tally,
                    kept(s.tokens, s.original),
                );
            }
        }
    }
    if !replays.is_empty() {
        let summarized_by = match &args.summarizer {
            Some(m) => format!(
                "summarized by `{}` (a {}-token window; the record fills what its text \
                 leaves); \"ours without the record\" is the last request with the record taken \
                 out of its summary",
                m.model, m.window
            ),
            None => "summarized by a summarizer whose text carries nothing: only what code \
                     carries counts"
                .to_string(),
        };
        let _ = writeln!(
            out,
            "\n### Replayed at a {}-token window through the engine\n\nEach conversation sent \
             as its client would, the whole history up to each point the model answers next, \
             {summarized_by}.\n",
            args.window
        );
        for (name, r) in replays {
            let _ = writeln!(
                out,
                "- {name}: {} requests, {} compactions in a row, {} crossings answered by \
                 clearing old tool output alone (no model call), {} summary requests",
                r.requests, r.compactions, r.clearings, r.summary_requests
            );
            if r.cleared_results > 0 {
                let (answered, total) = r
                    .cleared_uses
                    .per
                    .values()
                    .fold((0, 0), |(a, t), &(x, y)| (a + x, t + y));
                let _ = writeln!(
                    out,
                    "  - {} tool results cleared; probes of the cleared tool uses (call and \
                     result) still answered on the request that cleared them: {answered}/{total}",
                    r.cleared_results
                );
            }
        }
        out.push('\n');
        header(&mut out, "conversation, request");
        let mut totals = [
            Tally::default(),
            Tally::default(),
            Tally::default(),
            Tally::default(),
        ];
        let mut sums = [(0, 0), (0, 0)];
        for (name, r) in replays {
            let at_points = kept(r.point_tokens.0, r.point_tokens.1);
            let last = kept(r.last_tokens, r.original_tokens);
            row(
                &mut out,
                &format!("{name}, ours at each compaction point"),
                &r.at_points,
                at_points.clone(),
            );
            row(
                &mut out,
                &format!("{name}, drop-oldest at each point"),
                &r.at_points_dropped,
                at_points,
            );
            row(
                &mut out,
                &format!("{name}, ours after the last"),
                &r.last,
                last.clone(),
            );
            row(
                &mut out,
                &format!("{name}, ours at every request, probes of its newest half window"),
                &r.recent,
                format!("{} requests", r.requests),
            );
            if let Some(prose) = &r.last_without_record {
                row(
                    &mut out,
                    &format!("{name}, ours without the record, after the last"),
                    prose,
                    last.clone(),
                );
            }
            row(
                &mut out,
                &format!("{name}, drop-oldest after the last"),
                &r.last_dropped,
                last,
            );
            for (total, tally) in totals.iter_mut().zip([
                &r.at_points,
                &r.at_points_dropped,
                &r.last,
                &r.last_dropped,
            ]) {
                total.add(tally);
            }
            sums[0].0 += r.point_tokens.0;
            sums[0].1 += r.point_tokens.1;
            sums[1].0 += r.last_tokens;
            sums[1].1 += r.original_tokens;
        }
        let labels = [
            "**all, ours at each point**",
            "**all, drop-oldest at each point**",
            "**all, ours after the last**",
            "**all, drop-oldest after the last**",
        ];
        for (i, (label, tally)) in labels.iter().zip(&totals).enumerate() {
            let (t, o) = sums[i / 2];
            row(&mut out, label, tally, kept(t, o));
        }
        let _ = writeln!(
            out,
            "\nRoom after the last compaction: the record's tokens in the last summary, against \
             what listing every probe's answer as a line of its own would take (`- ` and the \
             answer):\n"
        );
        for (name, r) in replays {
            let needs: Vec<String> = r
                .answer_tokens
                .iter()
                .map(|(category, tokens)| format!("{} {tokens}", category.label()))
                .collect();
            let _ = writeln!(
                out,
                "- {name}: record {} tokens; answers: {}",
                r.record_tokens,
                needs.join(", ")
            );
        }
        let _ = writeln!(
            out,
            "\nMissing after the last compaction (ours, first 12 per category):\n"
        );
        for category in Category::ALL {
            let missing: Vec<String> = totals[2]
                .missing
                .get(&category)
                .map(|m| m.iter().take(12).map(|s| format!("`{s}`")).collect())
                .unwrap_or_default();
            if !missing.is_empty() {
                let _ = writeln!(out, "- {}: {}", category.label(), missing.join(", "));
            }
        }
    }
    out
}
