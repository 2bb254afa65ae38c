//! One task replayed one way: every request of a shared session, in order, sent straight
//! through, through Compactor's engine, or through a proxy that rewrites its summary on every
//! request; each prompt forwarded goes through the provider's cache ([`cache`]), and so does
//! each summary request.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use compactor::compaction::{Engine, Parts, RequestContext, Summarizer, SummarizerError};
use compactor::config::{CompactionConfig, SummarizerConfig};
use compactor::dialect::chat::request::ChatRequest;
use compactor::dialect::{Role, SummaryRequest, WireRequest};
use compactor::identity;
use compactor::measure::{windows::WindowTable, Measured, Meter};
use compactor::metrics::Metrics;
use compactor::store::{memory::MemoryStore, CheckpointStore};
use compactor::tokenizer::Encoding;
use serde_json::Value;

use crate::cache::{self, Block, Breakpoint, Hit, PromptCache, Provider, TextCache, Tokens};

/// Output tokens of every summary the replay's summarizer writes (less when the request allows
/// less): about what a model writes for Compactor's summary prompt.
pub const SUMMARY_TOKENS: u64 = 1500;

/// How a task is sent.
#[derive(Debug, Clone, Copy)]
pub enum Way {
    /// Every request as the client sends it, as if the window held it.
    Straight,
    /// Through Compactor at this window.
    Compactor(u64),
    /// At this window, through a proxy that summarizes the replaced turns afresh on every
    /// request over it: the same forwarded sizes as Compactor's, but nothing after the
    /// instructions is shared with an earlier prompt, and every such request pays a summary of
    /// everything it replaced.
    Naive(u64),
}

/// What one task cost, as each provider would bill it.
#[derive(Debug, Default, Clone)]
pub struct Bill {
    pub requests: u64,
    pub turns: u64,
    /// The task's prompts, per provider (in the order of [`cache::PRICES`]).
    pub prompts: [Tokens; 2],
    /// The summarizer's prompts and answers, per provider.
    pub summaries: [Tokens; 2],
    /// Compactions (summaries stored), and the summary requests they took.
    pub summary_count: u64,
    pub summary_requests: u64,
    pub ahead_of_time: u64,
    pub ahead_of_time_used: u64,
}

/// A summarizer that writes [`SUMMARY_TOKENS`] and keeps what it was sent.
struct Writer {
    /// The conversation's encoding, in which a summary's text is as long as it is billed.
    encoding: Encoding,
    written: AtomicU64,
    /// Whether the engine may ask it for summaries that continue the conversation.
    continues: bool,
    sent: Mutex<Vec<SentSummary>>,
}

/// One summary request as the writer received it.
struct SentSummary {
    /// A standalone request's system prompt and user message.
    prompt: String,
    /// A continuation's conversation body and closing user message.
    continued: Option<(Vec<u8>, String)>,
    output: u64,
}

/// Whether summary requests continue the conversation (the default) or stand alone.
static STANDALONE: OnceLock<bool> = OnceLock::new();

/// Makes every later replay's summary requests standalone (once, before the first).
pub fn set_standalone_summaries(standalone: bool) {
    let _ = STANDALONE.set(standalone);
}

fn writer(encoding: Encoding) -> Arc<Writer> {
    Arc::new(Writer {
        encoding,
        written: AtomicU64::new(0),
        continues: !STANDALONE.get().copied().unwrap_or(false),
        sent: Mutex::default(),
    })
}

/// Words of one token each in the encodings the replays use.
const ONE_TOKEN_WORDS: [&str; 8] = [
    " the", " file", " was", " changed", " and", " tested", " then", " user",
];

/// The `n`th summary's text, `tokens` long in `encoding`: the model's answer as long as it is
/// billed, so the summary message forwarded afterwards is the size a real one would be.
fn summary_of(n: u64, tokens: u64, encoding: Encoding) -> String {
    let mut text = format!("Summary {n}:");
    let mut words = (0..).map(|i| ONE_TOKEN_WORDS[(i + n as usize) % ONE_TOKEN_WORDS.len()]);
    // Each word is one token: add as many as are missing until the count reaches the length.
    loop {
        let missing = tokens.saturating_sub(encoding.count(&text));
        if missing == 0 {
            return text;
        }
        text.extend(words.by_ref().take(missing as usize));
    }
}

#[async_trait::async_trait]
impl Summarizer for Writer {
    async fn summarize(
        &self,
        request: &SummaryRequest<'_>,
        _credentials: &http::HeaderMap,
    ) -> Result<String, SummarizerError> {
        let n = self.written.fetch_add(1, Ordering::SeqCst);
        let words = SUMMARY_TOKENS.min(request.max_tokens);
        let text = summary_of(n, words, self.encoding);
        let sent = SentSummary {
            prompt: format!("{}\n{}", request.system, request.user),
            continued: request
                .conversation
                .map(|body| (body.to_vec(), request.user.to_string())),
            output: words,
        };
        self.sent.lock().unwrap().push(sent);
        Ok(text)
    }

    fn continues_conversations(&self) -> bool {
        self.continues
    }
}

/// A continuation's prompt as cache blocks: the conversation's, then its closing message.
fn continuation_blocks(
    body: &[u8],
    user: &str,
    meter: &Meter,
    encoding: Encoding,
) -> Result<Vec<Block>, String> {
    let conversation = ChatRequest::parse(body).map_err(|e| e.to_string())?;
    let mut blocks = blocks_of(&meter.measure(&conversation));
    blocks.push(Block {
        key: cache::key_of(&("summary request", user)),
        tokens: encoding.count(user) + 4,
    });
    Ok(blocks)
}

/// Replays `body` (a chat request holding the whole session) the given way.
pub async fn replay(body: &Value, way: Way) -> Result<Bill, String> {
    let messages = body["messages"].as_array().ok_or("no messages")?.clone();
    let model = body["model"].as_str().unwrap_or_default().to_string();
    let encoding = Encoding::for_model(&model);
    let meter = Meter::new(100_000);
    let writer = writer(encoding);
    let metrics = Arc::new(Metrics::default());
    let (engine, store) = match way {
        Way::Straight => (None, None),
        Way::Compactor(window) | Way::Naive(window) => {
            let (engine, store) = engine(&model, window, writer.clone(), metrics.clone());
            (Some(engine), Some(store))
        }
    };
    let context = RequestContext {
        tenant: identity::tenant("Bearer cost"),
        ..RequestContext::default()
    };
    let roles: Vec<&str> = messages
        .iter()
        .map(|m| m["role"].as_str().unwrap_or_default())
        .collect();
    // The client asks for an answer after each user message and each batch of tool results.
    let ends: Vec<usize> = (1..=messages.len())
        .filter(|&end| end == messages.len() || roles[end] == "assistant")
        .filter(|&end| matches!(roles[end - 1], "user" | "tool"))
        .collect();
    let mut bill = Bill::default();
    let mut caches = [PromptCache::default(), PromptCache::default()];
    let mut ready_served = BTreeSet::new();
    let mut standalone = Vec::new();
    for (n, &end) in ends.iter().enumerate() {
        let request: Arc<dyn WireRequest> = Arc::new(parse(body, &messages[..end])?);
        bill.requests += 1;
        bill.turns += u64::from(roles[end - 1] == "user");
        // The answer the session recorded next (the same whichever way the prompt went).
        let output = messages
            .get(end)
            .map_or(0, |m| encoding.count(&m["content"].to_string()));
        let mut beside = Vec::new();
        let blocks = match &engine {
            None => blocks_of(&meter.measure(request.as_ref())),
            Some(engine) => {
                let prepared = engine
                    .prepare(&context, &request)
                    .await
                    .map_err(|e| format!("request {}: {e}", n + 1))?;
                let sent = ChatRequest::parse(&prepared.body).map_err(|e| e.to_string())?;
                let measured = meter.measure(&sent);
                if prepared.outcome.ready_checkpoint_used && !prepared.outcome.summarized {
                    // A clearing made over a ready checkpoint is served as a checkpoint of its
                    // own: only those written ahead of time count as the ready ones used.
                    if let (Some(id), Some(store)) = (&prepared.outcome.checkpoint_id, &store) {
                        let stored = store.get(id).await.ok().flatten();
                        if stored.is_some_and(|c| c.ahead_of_time) {
                            ready_served.insert(id.clone());
                        }
                    }
                }
                engine.background_settled().await;
                if !matches!(way, Way::Naive(_)) {
                    // The summaries this request started, billed before its own prompt: a
                    // summary made for it runs before it is forwarded, one made ahead of time
                    // beside it (the provider has not cached it yet).
                    let new: Vec<SentSummary> = writer.sent.lock().unwrap().drain(..).collect();
                    for summary in new {
                        beside.extend(bill_summary(
                            &mut bill,
                            (&caches, &mut standalone),
                            summary,
                            &meter,
                            encoding,
                        )?);
                    }
                }
                match way {
                    Way::Naive(_) if prepared.outcome.compacted => {
                        naive_summary(&mut bill, &measured, &request, &meter);
                        naive_blocks(&sent, &measured, n)
                    }
                    _ => blocks_of(&measured),
                }
            }
        };
        for (i, provider) in providers().enumerate() {
            let hit = caches[i].send(&blocks);
            let usage = cache::usage(provider, hit, Breakpoint::AtEnd, output);
            bill.prompts[i].add(Tokens::from_usage(provider, &usage));
            for blocks in &beside {
                caches[i].send(blocks);
            }
        }
    }
    if let (Some(engine), false) = (&engine, matches!(way, Way::Naive(_))) {
        engine.background_settled().await;
        let late: Vec<SentSummary> = writer.sent.lock().unwrap().drain(..).collect();
        for summary in late {
            bill_summary(
                &mut bill,
                (&caches, &mut standalone),
                summary,
                &meter,
                encoding,
            )?;
        }
        // Standalone summary requests share no prefix with the conversation: each is cached
        // only against the earlier ones.
        for (i, provider) in providers().enumerate() {
            let mut cache = TextCache::new(encoding);
            for (prompt, out) in &standalone {
                let hit = cache.send(prompt.clone());
                let usage = cache::usage(provider, hit, Breakpoint::None, *out);
                bill.summaries[i].add(Tokens::from_usage(provider, &usage));
            }
        }
    }
    let rendered = metrics.render();
    if !matches!(way, Way::Naive(_)) {
        bill.summary_count = rendered
            .lines()
            .filter(|l| l.starts_with("compactor_compactions_total"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64;
    } else {
        // The naive proxy's own summaries were counted; Compactor's, which only chose the
        // forwarded sizes, are not its.
        bill.summary_requests = bill.summary_count;
        return Ok(bill);
    }
    bill.ahead_of_time = rendered
        .lines()
        .filter(|l| l.starts_with("compactor_compactions_total") && l.contains("ahead"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64;
    bill.ahead_of_time_used = ready_served.len() as u64;
    Ok(bill)
}

/// Bills one summary request: a continuation through the conversation's own caches as they
/// were before the request it was made for or beside (it reads what the earlier prompts wrote,
/// and its closing message carries a breakpoint; that request, sent before it is written or at
/// the same time, reads nothing of it), a standalone one kept for the summarizer's own cache.
/// Returns a continuation's blocks, for the caches to remember once that request is sent.
fn bill_summary(
    bill: &mut Bill,
    (caches, standalone): (&[PromptCache; 2], &mut Vec<(String, u64)>),
    summary: SentSummary,
    meter: &Meter,
    encoding: Encoding,
) -> Result<Option<Vec<Block>>, String> {
    bill.summary_requests += 1;
    let Some((body, user)) = summary.continued else {
        standalone.push((summary.prompt, summary.output));
        return Ok(None);
    };
    let blocks = continuation_blocks(&body, &user, meter, encoding)?;
    for (i, provider) in providers().enumerate() {
        let hit = caches[i].peek(&blocks);
        let usage = cache::usage(provider, hit, Breakpoint::AtEnd, summary.output);
        bill.summaries[i].add(Tokens::from_usage(provider, &usage));
    }
    Ok(Some(blocks))
}

fn providers() -> impl Iterator<Item = Provider> {
    cache::PRICES.iter().map(|p| p.provider)
}

/// The tools, then each message, as cache blocks.
fn blocks_of(measured: &Measured) -> Vec<Block> {
    std::iter::once(Block {
        key: 0,
        tokens: measured.head_tokens,
    })
    .chain(measured.elements.iter().map(|e| Block {
        key: cache::key_of(&e.canonical),
        tokens: e.tokens,
    }))
    .collect()
}

/// A naive proxy's prompt: the instructions as Compactor sends them, then everything else new
/// (its summary is written again for this request).
fn naive_blocks(sent: &ChatRequest, measured: &Measured, n: usize) -> Vec<Block> {
    let head = sent
        .messages
        .iter()
        .take_while(|m| m.role == Role::System)
        .count();
    let mut blocks = blocks_of(measured);
    let rest: u64 = blocks.drain(head + 1..).map(|b| b.tokens).sum();
    blocks.push(Block {
        key: cache::key_of(&("naive", n)),
        tokens: rest,
    });
    blocks
}

/// A naive proxy's summary for this request: everything the forwarded prompt replaced, read
/// fresh (it is new text after the summarizer's instructions), and [`SUMMARY_TOKENS`] written.
fn naive_summary(bill: &mut Bill, sent: &Measured, request: &Arc<dyn WireRequest>, meter: &Meter) {
    let original = meter.measure(request.as_ref()).total();
    let replaced = (original + SUMMARY_TOKENS).saturating_sub(sent.total());
    bill.summary_count += 1;
    for (i, provider) in providers().enumerate() {
        let hit = Hit {
            total: replaced,
            shared: 0,
        };
        let usage = cache::usage(provider, hit, Breakpoint::None, SUMMARY_TOKENS);
        bill.summaries[i].add(Tokens::from_usage(provider, &usage));
    }
}

/// The compaction settings of every engine the replays make: the default ones unless
/// [`set_compaction`] was called first.
static COMPACTION: OnceLock<CompactionConfig> = OnceLock::new();

/// Sets the compaction settings of every later replay (once, before the first).
pub fn set_compaction(config: CompactionConfig) {
    let _ = COMPACTION.set(config);
}

/// The engine at `window`, with the memory store and the compaction settings (the default's:
/// ahead-of-time summaries on, clearing first).
fn engine(
    model: &str,
    window: u64,
    writer: Arc<Writer>,
    metrics: Arc<Metrics>,
) -> (Arc<Engine>, Arc<dyn CheckpointStore>) {
    let summarizer = SummarizerConfig {
        window: 1_000_000,
        ..SummarizerConfig::default()
    };
    let store = Arc::new(MemoryStore::default()) as Arc<dyn CheckpointStore>;
    let parts = Parts {
        store: store.clone(),
        meter: Meter::new(100_000),
        windows: WindowTable::new(&BTreeMap::from([(model.to_string(), window)]), window),
        summary_writer: writer,
        metrics,
    };
    let compaction = COMPACTION.get_or_init(CompactionConfig::default).clone();
    (Arc::new(Engine::new(compaction, summarizer, parts)), store)
}

fn parse(body: &Value, messages: &[Value]) -> Result<ChatRequest, String> {
    let mut body = body.clone();
    body["messages"] = Value::Array(messages.to_vec());
    ChatRequest::parse(body.to_string().as_bytes()).map_err(|e| e.to_string())
}

/// One-shot requests: `count` conversations of one request each, of sizes spread between
/// `low` and `high` of `window`, cut from the start of `body`'s session. Returns the summaries
/// written for them (none of which can serve a later request) and their summarizer tokens.
pub async fn one_shots(
    body: &Value,
    window: u64,
    count: usize,
    (low, high): (f64, f64),
) -> Result<(u64, u64, Tokens), String> {
    let messages = body["messages"].as_array().ok_or("no messages")?.clone();
    let model = body["model"].as_str().unwrap_or_default().to_string();
    let meter = Meter::new(100_000);
    let encoding = Encoding::for_model(&model);
    let writer = writer(encoding);
    let metrics = Arc::new(Metrics::default());
    let (engine, _) = engine(&model, window, writer.clone(), metrics.clone());
    let mut sent = 0;
    for k in 0..count {
        let target = window as f64 * (low + (high - low) * k as f64 / (count - 1).max(1) as f64);
        // The longest start of the session, ending after a user message or tool result, under
        // the target size.
        let mut best = None;
        for end in 1..=messages.len() {
            let role = messages[end - 1]["role"].as_str().unwrap_or_default();
            if !matches!(role, "user" | "tool") {
                continue;
            }
            let request = parse(body, &messages[..end])?;
            if meter.measure(&request).total() as f64 > target {
                break;
            }
            best = Some(request);
        }
        let Some(request) = best else { continue };
        let request: Arc<dyn WireRequest> = Arc::new(request);
        let context = RequestContext {
            tenant: identity::tenant(&format!("Bearer one-shot {k}")),
            ..RequestContext::default()
        };
        engine
            .prepare(&context, &request)
            .await
            .map_err(|e| e.to_string())?;
        engine.background_settled().await;
        sent += 1;
    }
    let written = std::mem::take(&mut *writer.sent.lock().unwrap());
    let mut tokens = Tokens::default();
    for summary in &written {
        // Billed as fresh input either way: nothing of a one-shot conversation is cached when
        // its summary is asked beside its only request.
        let fresh = match &summary.continued {
            None => encoding.count(&summary.prompt),
            Some((body, user)) => continuation_blocks(body, user, &meter, encoding)?
                .iter()
                .map(|b| b.tokens)
                .sum(),
        };
        tokens.add(Tokens {
            fresh,
            output: summary.output,
            ..Tokens::default()
        });
    }
    Ok((sent, written.len() as u64, tokens))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_is_as_long_in_the_prompt_as_it_is_billed() {
        for encoding in [Encoding::O200k, Encoding::Cl100k] {
            let first = summary_of(0, SUMMARY_TOKENS, encoding);
            let second = summary_of(1, SUMMARY_TOKENS, encoding);
            assert_eq!(encoding.count(&first), SUMMARY_TOKENS);
            assert_eq!(encoding.count(&second), SUMMARY_TOKENS);
            // Each summary is its own text, so no prompt shares it with an earlier one.
            assert_ne!(first, second);
        }
        assert_eq!(
            Encoding::O200k.count(&summary_of(3, 40, Encoding::O200k)),
            40
        );
    }
}
