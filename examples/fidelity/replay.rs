//! A conversation replayed through Compactor's own engine at a small window, as a client sends
//! it: the whole history up to each point where the model answers next (after a user message
//! or a tool result), every request through the same engine and store, so that it compacts again
//! and again. The summarizer writes a text that carries nothing, so what the requests still hold
//! of the replaced turns is what code carries (the record and the file lists).
//!
//! At each compaction point the probes of the newly replaced span ([`probes::draw`]) are scored
//! on the request just forwarded; after the last request, every probe of the run is scored on
//! it, and on a drop-oldest request of the same size.
//!
//! With a [`ModelSummarizer`], the summaries are written by that model instead (the record
//! fills what its text leaves, as in the proxy), and the last request is also scored with the
//! record taken out of its summary: what the model's prose and the file lists carry alone.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use std::time::Duration;

use compactor::compaction::record;
use compactor::compaction::summary_text::SUMMARY_PREAMBLE;
use compactor::compaction::{Engine, Parts, RequestContext, Summarizer, SummarizerError};
use compactor::config::{CompactionConfig, SummarizerConfig};
use compactor::dialect::chat::request::ChatRequest;
use compactor::dialect::chat::Chat;
use compactor::dialect::{MessageView, Role, SummaryRequest, WireRequest};
use compactor::identity;
use compactor::measure::{windows::WindowTable, Meter};
use compactor::metrics::Metrics;
use compactor::store::{memory::MemoryStore, CheckpointStore};
use compactor::tokenizer::Encoding;
use compactor::upstream::{summarizer::HttpSummarizer, Upstream};
use serde_json::Value;

use crate::probes::{self, Haystack, Probe, Tally};

/// A summarizer whose text carries nothing of the span.
struct Blank;

#[async_trait::async_trait]
impl Summarizer for Blank {
    async fn summarize(
        &self,
        _request: &SummaryRequest<'_>,
        _credentials: &http::HeaderMap,
    ) -> Result<String, SummarizerError> {
        Ok(String::new())
    }
}

/// A real summarizer for the replay: an OpenAI-compatible endpoint and its context window.
#[derive(Debug, Clone)]
pub struct ModelSummarizer {
    pub url: String,
    pub model: String,
    pub window: u64,
}

/// What one replay measured.
#[derive(Debug, Default)]
pub struct Replay {
    /// Requests sent through the engine.
    pub requests: usize,
    /// Requests that moved the cut forward: compaction points.
    pub compactions: usize,
    /// Requests that crossed the budget and were brought under it by a new clearing of old
    /// tool output, with no summary (no model call).
    pub clearings: usize,
    /// Summary requests the engine made (model calls).
    pub summary_requests: u64,
    /// At each compaction point, the newly replaced span's probes on the request forwarded.
    pub at_points: Tally,
    /// The same probes on a drop-oldest request of the same size at each point.
    pub at_points_dropped: Tally,
    /// After the last request: every probe of the run.
    pub last: Tally,
    pub last_dropped: Tally,
    /// Tokens of the last request forwarded, and of the history it stands for.
    pub last_tokens: u64,
    pub original_tokens: u64,
    /// Tokens forwarded and tokens of the history, summed over the compaction points.
    pub point_tokens: (u64, u64),
    /// The summary message of the last request, for reading.
    pub last_summary: String,
    /// Probes of each tool use whose result was cleared (its call and its result), scored on
    /// the request that first cleared it: what a stub costs in the verbatim tail.
    pub cleared_uses: Tally,
    /// Tool results cleared over the replay.
    pub cleared_results: usize,
    /// Tokens of the last summary's record, and what listing every probe's answer of each
    /// category as a line of its own would take (`- ` and the answer's strings): the room the
    /// answers need against the room there is.
    pub record_tokens: u64,
    pub answer_tokens: Vec<(probes::Category, u64)>,
    /// With a model summarizer: every probe of the run on the last request with the record
    /// taken out of its summary (the model's prose, the file lists and the turns kept).
    pub last_without_record: Option<Tally>,
    /// At every request, the probes of the history's newest half window of tokens, on the
    /// request forwarded: what the model still sees of its recent turns, verbatim or carried.
    /// Comparable between settings of the kept tail: every setting is asked the same probes.
    pub recent: Tally,
}

/// What a cleared result reads as ([`compactor::compaction::clearing::result_stub`]).
const STUB_MARK: &str = "cleared to save context";

/// Replays `body` (a chat request with the whole conversation) at `window` tokens.
pub async fn replay(
    body: &Value,
    window: u64,
    clear_first: bool,
    summarizer: Option<&ModelSummarizer>,
) -> Result<Replay, String> {
    let messages = body["messages"]
        .as_array()
        .ok_or("the conversation has no messages")?
        .clone();
    let model = body["model"].as_str().unwrap_or_default();
    let (engine, metrics) = engine(model, window, clear_first, summarizer)?;
    let context = RequestContext {
        tenant: identity::tenant("Bearer fidelity"),
        ..RequestContext::default()
    };
    let meter = Meter::new(100_000);
    let full = parse(body, &messages)?;
    let views: Vec<(Role, MessageView)> = full
        .messages
        .iter()
        .map(|m| (m.role, m.view().clone()))
        .collect();
    let tokens: Vec<u64> = meter
        .measure(&full)
        .elements
        .iter()
        .map(|e| e.tokens)
        .collect();
    let mut out = Replay::default();
    let mut covered = first_turn(&views);
    let mut seen = BTreeSet::new();
    let mut all: Vec<Probe> = Vec::new();
    let ends: Vec<usize> = (1..=messages.len())
        .filter(|&end| end == messages.len() || views[end].0 == Role::Assistant)
        .filter(|&end| matches!(views[end - 1].0, Role::User | Role::Tool))
        .collect();
    let mut last_sent = bytes::Bytes::new();
    let (mut cleared_ids, mut seen_cleared) = (BTreeSet::new(), BTreeSet::new());
    for &end in &ends {
        let request: Arc<dyn WireRequest> = Arc::new(parse(body, &messages[..end])?);
        let (clearings, summaries) = (
            metrics.clearings_applied.get(),
            metrics.summary_requests.get(),
        );
        let prepared = engine
            .prepare(&context, &request)
            .await
            .map_err(|e| format!("request {}: {e}", out.requests + 1))?;
        out.requests += 1;
        if cadence().ahead_of_time {
            engine.background_settled().await;
        }
        let sent = parse_sent(&prepared.body)?;
        // What the model reads of this request, searched by every probe scored on it.
        let read = haystack(&sent);
        let recent = newest(&tokens[..end], first_turn(&views), window / 2);
        out.recent
            .add(&Tally::score(&probes::draw(&views[recent..end]), &read));
        let now_covered = cut_of(&sent, end);
        if metrics.clearings_applied.get() > clearings
            && metrics.summary_requests.get() == summaries
        {
            out.clearings += 1;
        }
        let fresh_uses = newly_cleared(&sent, &views[..end], &mut cleared_ids);
        out.cleared_results += fresh_uses.len();
        let mut fresh: Vec<Probe> = fresh_uses
            .iter()
            .flat_map(|&(call, result)| probes::draw(&[views[call].clone(), views[result].clone()]))
            .collect();
        fresh.retain(|p| seen_cleared.insert((p.category, p.answer.clone())));
        out.cleared_uses.add(&Tally::score(&fresh, &read));
        if now_covered > covered {
            out.compactions += 1;
            let span = &views[covered..now_covered];
            let mut fresh = probes::draw(span);
            fresh.retain(|p| seen.insert((p.category, p.answer.clone())));
            let sent_tokens = meter.measure(&sent).total();
            let history = meter.measure(request.as_ref()).total();
            out.point_tokens.0 += sent_tokens;
            out.point_tokens.1 += history;
            out.at_points.add(&Tally::score(&fresh, &read));
            let dropped = drop_oldest(&views[..end], &tokens[..end], sent_tokens);
            out.at_points_dropped
                .add(&Tally::score(&fresh, &Haystack::new(&dropped)));
            all.extend(fresh);
            covered = now_covered;
        }
        last_sent = prepared.body;
    }
    out.summary_requests = metrics.summary_requests.get();
    let sent = parse_sent(&last_sent)?;
    out.last_summary = sent
        .messages
        .iter()
        .map(|m| m.view().text.clone())
        .find(|t| t.starts_with(SUMMARY_PREAMBLE))
        .unwrap_or_default();
    out.last_tokens = meter.measure(&sent).total();
    out.original_tokens = meter.measure(&full).total();
    out.last = Tally::score(&all, &haystack(&sent));
    let encoding = Encoding::O200k;
    out.record_tokens = record::split(&out.last_summary)
        .1
        .map_or(0, |r| encoding.count(without_lists(r)));
    for category in probes::Category::ALL {
        let tokens = all
            .iter()
            .filter(|p| p.category == category)
            .map(|p| encoding.count(&p.answer.join(" ")) + 2)
            .sum();
        out.answer_tokens.push((category, tokens));
    }
    if summarizer.is_some() {
        let prose: Vec<(Role, MessageView)> = sent
            .messages
            .iter()
            .map(|m| {
                let mut view = m.view().clone();
                if view.text.starts_with(SUMMARY_PREAMBLE) {
                    view.text = without_record(&view.text);
                }
                (m.role, view)
            })
            .collect();
        out.last_without_record = Some(Tally::score(&all, &Haystack::new(&text_of(&prose))));
    }
    let dropped = drop_oldest(&views, &tokens, out.last_tokens);
    out.last_dropped = Tally::score(&all, &Haystack::new(&dropped));
    Ok(out)
}

/// `compaction.clear_min_share` for every replay of this run, when not the proxy's default.
static CLEAR_MIN_SHARE: std::sync::OnceLock<f64> = std::sync::OnceLock::new();

pub fn set_clear_min_share(share: f64) {
    let _ = CLEAR_MIN_SHARE.set(share);
}

/// How the replays' engine makes its summaries, beyond the window and clearing.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cadence {
    /// Summaries written ahead of time, as the proxy does by default, each waited for before
    /// the next request (the agent's own work between requests gives it that time). Off: a
    /// summary is written when a request crosses the limit.
    pub ahead_of_time: bool,
    /// `compaction.keep_recent_tokens`, when not the proxy's default.
    pub keep_recent_tokens: Option<u64>,
}

static CADENCE: std::sync::OnceLock<Cadence> = std::sync::OnceLock::new();

pub fn set_cadence(cadence: Cadence) {
    let _ = CADENCE.set(cadence);
}

fn cadence() -> Cadence {
    CADENCE.get().copied().unwrap_or_default()
}

/// Where the newest `budget` tokens of `tokens` start, not before `from`.
fn newest(tokens: &[u64], from: usize, budget: u64) -> usize {
    let (mut start, mut used) = (tokens.len(), 0);
    while start > from && used + tokens[start - 1] <= budget {
        start -= 1;
        used += tokens[start];
    }
    start
}

/// The engine at `window`, with the memory store, real time and the [`Cadence`] of this run
/// (by default no ahead-of-time summaries: a replay sends the next request at once), clearing
/// old tool output first or not; and its metrics (the summary requests it made).
fn engine(
    model: &str,
    window: u64,
    clear_first: bool,
    writer: Option<&ModelSummarizer>,
) -> Result<(Arc<Engine>, Arc<Metrics>), String> {
    let defaults = CompactionConfig::default();
    let config = CompactionConfig {
        ahead_of_time: cadence().ahead_of_time,
        keep_recent_tokens: cadence()
            .keep_recent_tokens
            .unwrap_or(defaults.keep_recent_tokens),
        clear_tool_results_first: clear_first,
        clear_min_share: CLEAR_MIN_SHARE
            .get()
            .copied()
            .unwrap_or(defaults.clear_min_share),
        max_summary_chunks: 10_000,
        // A 0.5B model on a loaded CPU takes minutes per summary, past the proxy's timeout.
        summary_timeout_ms: if writer.is_some() { 3_600_000 } else { 120_000 },
        ..defaults
    };
    let summarizer = match writer {
        Some(w) => SummarizerConfig {
            model: w.model.clone(),
            window: w.window,
            ..SummarizerConfig::default()
        },
        None => SummarizerConfig {
            window: 1_000_000,
            ..SummarizerConfig::default()
        },
    };
    let summary_writer: Arc<dyn Summarizer> = match writer {
        Some(w) => {
            // A 0.5B model on a loaded CPU may read for many minutes before its first byte.
            let upstream = Upstream::new(
                &w.url,
                None,
                Duration::from_secs(10),
                Duration::from_secs(3600),
            )
            .map_err(|e| e.to_string())?;
            Arc::new(HttpSummarizer::new(upstream, Arc::new(Chat)))
        }
        None => Arc::new(Blank),
    };
    let metrics = Arc::new(Metrics::default());
    let parts = Parts {
        store: Arc::new(MemoryStore::default()) as Arc<dyn CheckpointStore>,
        meter: Meter::new(100_000),
        // The model's window as configured: a known model's own window would win over a default.
        windows: WindowTable::new(&BTreeMap::from([(model.to_string(), window)]), window),
        summary_writer,
        metrics: metrics.clone(),
    };
    Ok((Arc::new(Engine::new(config, summarizer, parts)), metrics))
}

/// A record's text without the file lists that follow it in a summary message.
fn without_lists(record: &str) -> &str {
    let end = ["\n<files-read>", "\n<files-modified>", "</summary>"]
        .iter()
        .filter_map(|marker| record.find(marker))
        .min()
        .unwrap_or(record.len());
    &record[..end]
}

/// A summary message's text without its record: from the record's heading to the file lists
/// (or the summary's end).
fn without_record(text: &str) -> String {
    let Some(start) = text.find(record::HEADING) else {
        return text.to_string();
    };
    let rest = &text[start..];
    let end = without_lists(rest).len();
    format!("{}{}", &text[..start], &rest[end..])
}

/// The tool uses whose results `sent` forwards cleared and no earlier request did (their ids
/// noted in `cleared`): each as the element of its call and of its result in `views`.
fn newly_cleared(
    sent: &ChatRequest,
    views: &[(Role, MessageView)],
    cleared: &mut BTreeSet<String>,
) -> Vec<(usize, usize)> {
    let mut uses = Vec::new();
    for message in &sent.messages {
        let view = message.view();
        let Some(id) = view.tool_call_id.as_deref() else {
            continue;
        };
        if message.role != Role::Tool
            || !view.text.contains(STUB_MARK)
            || !cleared.insert(id.into())
        {
            continue;
        }
        let result = views
            .iter()
            .position(|(_, v)| v.tool_call_id.as_deref() == Some(id));
        let call = views
            .iter()
            .position(|(_, v)| v.tool_calls.iter().any(|c| c.id == id));
        if let (Some(call), Some(result)) = (call, result) {
            uses.push((call, result));
        }
    }
    uses
}

/// Where the conversation's own turns start: after its instructions.
fn first_turn(views: &[(Role, MessageView)]) -> usize {
    views
        .iter()
        .position(|(role, _)| *role != Role::System)
        .unwrap_or(views.len())
}

fn parse(body: &Value, messages: &[Value]) -> Result<ChatRequest, String> {
    let mut body = body.clone();
    body["messages"] = Value::Array(messages.to_vec());
    ChatRequest::parse(body.to_string().as_bytes()).map_err(|e| e.to_string())
}

fn parse_sent(body: &[u8]) -> Result<ChatRequest, String> {
    ChatRequest::parse(body).map_err(|e| format!("forwarded body: {e}"))
}

/// How many of the first `sent_of` messages the forwarded request replaced: all before the
/// messages it kept after its summary.
fn cut_of(sent: &ChatRequest, sent_of: usize) -> usize {
    let summary = sent
        .messages
        .iter()
        .position(|m| m.role == Role::User && m.view().text.starts_with(SUMMARY_PREAMBLE));
    match summary {
        Some(at) => sent_of - (sent.messages.len() - at - 1),
        None => 0,
    }
}

/// What a request says outside its instructions: message texts, tool names and arguments.
fn haystack(request: &ChatRequest) -> Haystack {
    let views: Vec<(Role, MessageView)> = request
        .messages
        .iter()
        .map(|m| (m.role, m.view().clone()))
        .collect();
    Haystack::new(&text_of(&views))
}

fn text_of(views: &[(Role, MessageView)]) -> String {
    let mut text = String::new();
    for (role, view) in views {
        if *role == Role::System {
            continue;
        }
        text.push_str(&view.text);
        text.push('\n');
        for call in &view.tool_calls {
            text.push_str(&call.name);
            text.push('\n');
            match serde_json::from_str::<Value>(&call.arguments) {
                Ok(args) => push_strings(&args, &mut text),
                Err(_) => text.push_str(&call.arguments),
            }
            text.push('\n');
        }
    }
    text
}

fn push_strings(value: &Value, out: &mut String) {
    match value {
        Value::String(s) => {
            out.push_str(s);
            out.push('\n');
        }
        Value::Array(items) => items.iter().for_each(|v| push_strings(v, out)),
        Value::Object(map) => map.values().for_each(|v| push_strings(v, out)),
        other => {
            out.push_str(&other.to_string());
            out.push('\n');
        }
    }
}

/// The text of a request of at most `budget` tokens that keeps the instructions and the newest
/// messages, starting at a message a conversation may start at (not a tool result).
pub fn drop_oldest(views: &[(Role, MessageView)], tokens: &[u64], budget: u64) -> String {
    let head = first_turn(views);
    let mut used: u64 = tokens[..head].iter().sum();
    let mut start = views.len();
    while start > head && used + tokens[start - 1] <= budget {
        start -= 1;
        used += tokens[start];
    }
    while start < views.len() && views[start].0 == Role::Tool {
        start += 1;
    }
    text_of(&views[start..])
}
