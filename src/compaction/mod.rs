//! The compaction engine: from a parsed chat request to the body that goes upstream.
//!
//! `identify → apply stored checkpoint → measure → plan → summarize → rewrite`, plus what is
//! learned from responses (real windows from overflow errors, calibration from `usage`). The pure
//! parts live in [`plan`], [`rewrite`], [`summarize`] and [`files`]; this module does the I/O:
//! the store, the summary requests, single flight, and background (ahead-of-time) summaries.

pub mod files;
pub mod plan;
pub mod rewrite;
pub mod summarize;

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dashmap::DashMap;
use http::HeaderMap;
use serde_json::value::RawValue;

use crate::config::{CompactionConfig, SummarizerConfig};
use crate::identity::{self, Hash};
use crate::measure::{calibration, windows::WindowTable, Encoding, Measured, Meter, REPLY_PRIMING};
use crate::metrics::Metrics;
use crate::request::{ChatRequest, Role};
use crate::store::{Checkpoint, CheckpointStore, ModelFacts};
use crate::upstream::{self, overflow::Overflow, Upstream};

use plan::{PlanError, PlanInput};

/// What the client asked for in `x-compactor-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    #[default]
    Auto,
    Force,
    Off,
}

impl Mode {
    pub fn parse(value: &str) -> Option<Mode> {
        match value.trim().to_ascii_lowercase().as_str() {
            "auto" => Some(Mode::Auto),
            "force" => Some(Mode::Force),
            "off" => Some(Mode::Off),
            _ => None,
        }
    }
}

/// Per-request facts the engine needs besides the body.
#[derive(Debug, Clone, Default)]
pub struct RequestContext {
    /// Hash of the client's credential.
    pub tenant: Hash,
    /// The client's credential headers, for summary requests made on its behalf.
    pub credentials: HeaderMap,
    pub mode: Mode,
    /// `x-compactor-instructions`.
    pub instructions: Option<String>,
    /// Ask a streaming upstream for `stream_options.include_usage` (for calibration).
    pub force_usage: bool,
}

/// Why a compaction did not happen or did not work; shown in `x-compactor-compaction`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Compaction would have been needed but was skipped.
    Skipped(&'static str),
    /// Compaction was attempted and failed; the request went out via `fallback`.
    Failed {
        reason: String,
        fallback: &'static str,
    },
}

impl Status {
    pub fn header_value(&self) -> String {
        match self {
            Status::Skipped(reason) => format!("skipped; reason={reason}"),
            Status::Failed { reason, fallback } => {
                format!("failed; reason={reason}; fallback={fallback}")
            }
        }
    }
}

/// What happened to one request, for headers, logs and metrics.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// The proxy's count of the request as the client sent it (calibrated).
    pub prompt_tokens: u64,
    pub window: u64,
    /// Whether the body sent upstream differs from the client's (a checkpoint was applied).
    pub compacted: bool,
    pub tokens_before: u64,
    pub tokens_after: u64,
    pub checkpoint_id: Option<String>,
    /// Time spent waiting for summaries (excluded from the proxy's overhead).
    pub summary_time: Duration,
    /// A new summary was written for this request (not only applied).
    pub summarized: bool,
    /// A checkpoint prepared ahead of time was applied.
    pub ready_checkpoint_used: bool,
    pub status: Option<Status>,
    /// The store failed or is degraded; the request was served without it.
    pub store_degraded: bool,
    /// Raw (uncalibrated) tokens of what was sent, for calibration against `usage`.
    pub sent_raw_tokens: u64,
}

/// The body to send and what happened.
pub struct Prepared {
    pub body: Vec<u8>,
    pub outcome: Outcome,
}

/// The request cannot fit even after compaction.
#[derive(Debug, thiserror::Error)]
#[error("this conversation cannot fit in the model's context window of {window} tokens even after compaction: the system prompt, tools and last user message alone take {needed} tokens")]
pub struct CannotFit {
    pub needed: u64,
    pub window: u64,
}

/// Why a summary could not be made.
#[derive(Debug, thiserror::Error)]
enum SummaryError {
    #[error("summarizer-timeout")]
    Timeout,
    #[error("summarizer-error")]
    Upstream(String),
    #[error("summarizer-answer")]
    Answer(#[from] summarize::AnswerError),
    #[error("no-reduction")]
    NoReduction,
    #[error("nothing-to-summarize")]
    Nothing,
}

/// The shared engine.
pub struct Engine {
    config: CompactionConfig,
    summarizer: SummarizerConfig,
    store: Arc<dyn CheckpointStore>,
    meter: Meter,
    windows: WindowTable,
    summary_upstream: Upstream,
    metrics: Arc<Metrics>,
    /// Learned model facts, read through to the store.
    facts: DashMap<String, (ModelFacts, Instant)>,
    /// Compactions in a row per conversation that freed nothing.
    unproductive: DashMap<Hash, u32>,
    /// Background summaries running, by conversation anchor.
    background: DashMap<Hash, ()>,
    /// Token counts of summary messages, by encoding and checkpoint id.
    summary_tokens: quick_cache::sync::Cache<(Encoding, String), u64>,
    replica: String,
    attempts: AtomicU64,
}

/// How long learned model facts are trusted before re-reading the (possibly shared) store.
const FACTS_REFRESH: Duration = Duration::from_secs(15);
/// How often a request waiting for another's summary looks for the result.
const WAIT_POLL: Duration = Duration::from_millis(40);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The conversation as seen through a checkpoint: which messages are sent and what they cost.
struct View<'c> {
    checkpoint: Option<&'c Checkpoint>,
    /// Raw tokens of what would be sent (messages, summary, tools, priming).
    tokens: u64,
}

/// Everything about one request that the steps share.
struct Conversation<'r> {
    request: &'r ChatRequest,
    measured: Measured,
    chain: Vec<Hash>,
    anchor: Option<Hash>,
    roles: Vec<Role>,
    message_tokens: Vec<u64>,
    factor: f64,
    window: u64,
    /// `window - margin`.
    limit: u64,
    reserve: u64,
    force_usage: bool,
    mode: Mode,
}

impl Engine {
    pub fn new(
        config: CompactionConfig,
        summarizer: SummarizerConfig,
        store: Arc<dyn CheckpointStore>,
        meter: Meter,
        windows: WindowTable,
        summary_upstream: Upstream,
        metrics: Arc<Metrics>,
    ) -> Engine {
        Engine {
            config,
            summarizer,
            store,
            meter,
            windows,
            summary_upstream,
            metrics,
            facts: DashMap::new(),
            unproductive: DashMap::new(),
            background: DashMap::new(),
            summary_tokens: quick_cache::sync::Cache::new(10_000),
            replica: format!("{:016x}", rand::random::<u64>()),
            attempts: AtomicU64::new(0),
        }
    }

    pub fn store(&self) -> &Arc<dyn CheckpointStore> {
        &self.store
    }

    pub fn meter(&self) -> &Meter {
        &self.meter
    }

    /// Learned facts for `model`, from the local cache or the store.
    async fn model_facts(&self, model: &str) -> (ModelFacts, bool) {
        if let Some(entry) = self.facts.get(model) {
            if entry.1.elapsed() < FACTS_REFRESH {
                return (entry.0, false);
            }
        }
        match self.store.model_facts(model).await {
            Ok(facts) => {
                self.facts
                    .insert(model.to_string(), (facts, Instant::now()));
                (facts, false)
            }
            Err(e) => {
                self.metrics.store_errors.inc();
                tracing::warn!(error = %e, "Reading model facts failed.");
                let cached = self.facts.get(model).map(|e| e.0).unwrap_or_default();
                (cached, true)
            }
        }
    }

    async fn save_facts(&self, model: &str, facts: ModelFacts) {
        self.facts
            .insert(model.to_string(), (facts, Instant::now()));
        if let Err(e) = self.store.put_model_facts(model, facts).await {
            self.metrics.store_errors.inc();
            tracing::warn!(error = %e, "Saving model facts failed.");
        }
    }

    /// The window the proxy currently believes for `model`.
    pub async fn window_for(&self, model: &str) -> u64 {
        let (facts, _) = self.model_facts(model).await;
        self.windows.window(model, facts.window).0
    }

    /// Records an overflow error: the real window if stated, and a higher correction factor if
    /// the provider counted more tokens than we did.
    pub async fn learn_overflow(&self, model: &str, overflow: Overflow, sent_raw_tokens: u64) {
        let (mut facts, _) = self.model_facts(model).await;
        let (believed, _) = self.windows.window(model, facts.window);
        let factor = facts
            .calibration
            .unwrap_or_else(|| calibration::initial_factor(model));
        facts.window = Some(match overflow.limit {
            Some(limit) => limit,
            // No number given: what we sent was too much, so the window is below it.
            None => believed
                .min(calibration::apply(sent_raw_tokens, factor) * 9 / 10)
                .max(256),
        });
        if let Some(requested) = overflow.requested.filter(|_| sent_raw_tokens > 0) {
            let observed = requested as f64 / sent_raw_tokens as f64;
            if observed > factor {
                facts.calibration = Some(
                    calibration::update(factor, sent_raw_tokens, requested).max(observed * 1.05),
                );
            }
        }
        tracing::info!(
            model,
            window = facts.window,
            "Learned the model's window from an overflow error."
        );
        self.save_facts(model, facts).await;
    }

    /// Records the provider's count of a prompt we counted as `counted_raw`. Runs on the
    /// response path, so the common case (facts cached, factor unchanged) does no I/O and spawns
    /// nothing; a changed factor is saved in the background.
    pub fn observe_usage(self: &Arc<Self>, model: &str, counted_raw: u64, prompt_tokens: u64) {
        let cached = self.facts.get(model).map(|entry| entry.0);
        let Some(mut facts) = cached else {
            // Not cached yet (the first response of a model): read through the store first.
            let engine = self.clone();
            let model = model.to_string();
            tokio::spawn(async move {
                engine.model_facts(&model).await;
                if engine.facts.contains_key(&model) {
                    engine.observe_usage(&model, counted_raw, prompt_tokens);
                }
            });
            return;
        };
        let previous = facts
            .calibration
            .unwrap_or_else(|| calibration::initial_factor(model));
        let mut next = calibration::update(previous, counted_raw, prompt_tokens);
        if calibration::is_exact_family(model) {
            // Counted with the model's own tokenizer: a lower figure from the provider means
            // it counts differently (cached prefixes, gateways), not that we over-count.
            next = next.max(1.0);
        }
        if (next - previous).abs() <= 0.005 {
            return;
        }
        facts.calibration = Some(next);
        self.facts
            .insert(model.to_string(), (facts, Instant::now()));
        let engine = self.clone();
        let model = model.to_string();
        tokio::spawn(async move { engine.save_facts(&model, facts).await });
    }

    /// Measures a request and decides what to send. `overflow` is set when the provider just
    /// refused the previous attempt as too long.
    pub async fn prepare(
        self: &Arc<Self>,
        context: &RequestContext,
        request: &ChatRequest,
        overflow: Option<Overflow>,
    ) -> Result<Prepared, CannotFit> {
        let (facts, facts_degraded) = self.model_facts(&request.model).await;
        let conversation = self.conversation(context, request, facts);
        let original_total = conversation.measured.total();
        let mut outcome = Outcome {
            prompt_tokens: calibration::apply(original_total, conversation.factor),
            window: conversation.window,
            store_degraded: facts_degraded || !self.store.healthy(),
            sent_raw_tokens: original_total,
            ..Outcome::default()
        };
        outcome.tokens_before = outcome.prompt_tokens;
        outcome.tokens_after = outcome.prompt_tokens;
        let original = || request.original_body(context.force_usage);
        if !self.config.enabled || context.mode == Mode::Off || conversation.anchor.is_none() {
            return Ok(Prepared {
                body: original(),
                outcome,
            });
        }
        let checkpoints = self.checkpoints(&conversation, &mut outcome).await;
        let forced = context.mode == Mode::Force || overflow.is_some();
        let regular = checkpoints.iter().find(|c| !c.ahead_of_time);
        let mut view = self.view(&conversation, regular);
        if !forced && self.fits(&conversation, &view) {
            self.maybe_start_background(context, &conversation, &view);
            return Ok(self.finish(&conversation, &view, outcome));
        }
        // Over the limit: a checkpoint prepared ahead of time may be all that is needed.
        if let Some(ready) = checkpoints
            .iter()
            .find(|c| c.ahead_of_time && c.covered > view.checkpoint.map_or(0, |r| r.covered))
        {
            view = self.view(&conversation, Some(ready));
            outcome.ready_checkpoint_used = true;
            if !forced && self.fits(&conversation, &view) {
                self.metrics.ready_checkpoints_used.inc();
                // The conversation keeps growing from here: prepare its next summary early too.
                self.maybe_start_background(context, &conversation, &view);
                return Ok(self.finish(&conversation, &view, outcome));
            }
        }
        self.check_fits_at_all(&conversation)?;
        if context.mode != Mode::Force && self.is_stuck(conversation.anchor) {
            outcome.status = Some(Status::Skipped("no-progress"));
            return Ok(self.fallback(&conversation, &view, outcome));
        }
        let trigger = if overflow.is_some() {
            "overflow"
        } else if context.mode == Mode::Force {
            "forced"
        } else {
            "threshold"
        };
        let started = Instant::now();
        let result = self
            .compact(
                context,
                &conversation,
                view.checkpoint,
                overflow.is_some(),
                false,
                started,
            )
            .await;
        outcome.summary_time = started.elapsed();
        match result {
            Ok((checkpoint, summarized)) => {
                if summarized {
                    self.metrics
                        .compactions
                        .get_or_create(&crate::metrics::TriggerLabel { trigger })
                        .inc();
                    outcome.summarized = true;
                } else if checkpoint.ahead_of_time {
                    outcome.ready_checkpoint_used = true;
                    self.metrics.ready_checkpoints_used.inc();
                }
                let view = self.view(&conversation, Some(&checkpoint));
                let fits = self.fits(&conversation, &view);
                self.note_progress(conversation.anchor, fits);
                Ok(self.finish(&conversation, &view, outcome))
            }
            Err(e) => {
                self.metrics.compaction_failures.inc();
                self.note_progress(conversation.anchor, false);
                tracing::warn!(reason = %e, "Compaction failed; serving the request without it.");
                outcome.status = Some(Status::Failed {
                    reason: e.to_string(),
                    fallback: "original",
                });
                Ok(self.fallback(&conversation, &view, outcome))
            }
        }
    }

    fn conversation<'r>(
        &self,
        context: &RequestContext,
        request: &'r ChatRequest,
        facts: ModelFacts,
    ) -> Conversation<'r> {
        let measured = self.meter.measure(request);
        let chain = identity::chain(
            &context.tenant,
            measured.messages.iter().map(|m| m.canonical),
        );
        let roles: Vec<Role> = request.messages.iter().map(|m| m.role).collect();
        let first_turn = roles.iter().position(|r| !r.is_instruction());
        let anchor = identity::anchor(&chain, first_turn);
        let message_tokens = measured.messages.iter().map(|m| m.tokens).collect();
        let (window, _) = self.windows.window(&request.model, facts.window);
        let factor = facts
            .calibration
            .unwrap_or_else(|| calibration::initial_factor(&request.model));
        let margin = self.config.margin_tokens.min(window / 16);
        let reserve = request
            .max_output_tokens
            .unwrap_or_else(|| self.config.reserve_output_tokens.min(window / 4));
        Conversation {
            request,
            measured,
            chain,
            anchor,
            roles,
            message_tokens,
            factor,
            window,
            limit: window.saturating_sub(margin),
            reserve,
            force_usage: context.force_usage,
            mode: context.mode,
        }
    }

    /// Stored checkpoints that match this conversation's prefix, newest first.
    async fn checkpoints(
        &self,
        conversation: &Conversation<'_>,
        outcome: &mut Outcome,
    ) -> Vec<Checkpoint> {
        let Some(anchor) = conversation.anchor else {
            return vec![];
        };
        match self.store.for_anchor(&identity::hex(&anchor)).await {
            Ok(list) => {
                let matching: Vec<Checkpoint> = list
                    .iter()
                    .filter(|c| matches_prefix(c, &conversation.chain))
                    .cloned()
                    .collect();
                let hit = if matching.is_empty() { "miss" } else { "hit" };
                self.metrics
                    .checkpoint_lookups
                    .get_or_create(&crate::metrics::ResultLabel { result: hit })
                    .inc();
                matching
            }
            Err(e) => {
                self.metrics.store_errors.inc();
                outcome.store_degraded = true;
                tracing::warn!(error = %e, "Reading checkpoints failed; continuing without them.");
                vec![]
            }
        }
    }

    /// Tokens of a checkpoint's summary message. A checkpoint never changes, so the message is
    /// rendered and counted once per checkpoint, not on every request that applies it.
    fn summary_tokens(&self, encoding: Encoding, checkpoint: &Checkpoint) -> u64 {
        let key = (encoding, checkpoint.id.clone());
        if let Some(tokens) = self.summary_tokens.get(&key) {
            return tokens;
        }
        let raw = rewrite::summary_message(&rewrite::summary_text(
            &checkpoint.summary,
            &checkpoint.files_read,
            &checkpoint.files_modified,
        ));
        let tokens = crate::request::Message::parse(raw)
            .map(|m| crate::measure::count_message(encoding, &m))
            .unwrap_or(0);
        self.summary_tokens.insert(key, tokens);
        tokens
    }

    /// What the request costs when sent through `checkpoint`.
    fn view<'c>(
        &self,
        conversation: &Conversation<'_>,
        checkpoint: Option<&'c Checkpoint>,
    ) -> View<'c> {
        let fixed = conversation.measured.tools_tokens + REPLY_PRIMING;
        let Some(cp) = checkpoint else {
            return View {
                checkpoint: None,
                tokens: conversation.measured.total(),
            };
        };
        let tokens = &conversation.message_tokens;
        let covered = cp.covered.min(tokens.len());
        let instructions: u64 = (0..covered)
            .filter(|&i| conversation.roles[i].is_instruction())
            .map(|i| tokens[i])
            .sum();
        let pinned = cp
            .pinned_user
            .filter(|&p| p < covered)
            .map_or(0, |p| tokens[p]);
        let kept: u64 = (covered..tokens.len())
            .map(|i| match cp.truncations.iter().find(|t| t.index == i) {
                Some(t) => tokens[i].min(t.keep_tokens + 40),
                None => tokens[i],
            })
            .sum();
        let summary = self.summary_tokens(conversation.measured.encoding, cp);
        View {
            checkpoint: Some(cp),
            tokens: fixed + instructions + pinned + kept + summary,
        }
    }

    fn fits(&self, conversation: &Conversation<'_>, view: &View<'_>) -> bool {
        calibration::apply(view.tokens, conversation.factor) + conversation.reserve
            <= conversation.limit
    }

    /// Refuses requests whose instructions, tools and last user message cannot fit at all.
    fn check_fits_at_all(&self, conversation: &Conversation<'_>) -> Result<(), CannotFit> {
        let instructions: u64 = conversation
            .roles
            .iter()
            .zip(&conversation.message_tokens)
            .filter(|(r, _)| r.is_instruction())
            .map(|(_, t)| t)
            .sum();
        let last_user = conversation
            .roles
            .iter()
            .rposition(|r| *r == Role::User)
            .map_or(0, |i| conversation.message_tokens[i]);
        let raw = instructions + last_user + conversation.measured.tools_tokens + REPLY_PRIMING;
        let needed = calibration::apply(raw, conversation.factor)
            + conversation.request.max_output_tokens.unwrap_or(0);
        if needed > conversation.limit {
            return Err(CannotFit {
                needed,
                window: conversation.window,
            });
        }
        Ok(())
    }

    fn is_stuck(&self, anchor: Option<Hash>) -> bool {
        anchor
            .and_then(|a| self.unproductive.get(&a).map(|n| *n))
            .is_some_and(|n| n >= self.config.max_unproductive_compactions)
    }

    fn note_progress(&self, anchor: Option<Hash>, productive: bool) {
        let Some(anchor) = anchor else { return };
        if productive {
            self.unproductive.remove(&anchor);
        } else {
            *self.unproductive.entry(anchor).or_insert(0) += 1;
        }
    }

    /// The body through `view`'s checkpoint, with the outcome filled in.
    fn finish(
        &self,
        conversation: &Conversation<'_>,
        view: &View<'_>,
        mut outcome: Outcome,
    ) -> Prepared {
        let Some(cp) = view.checkpoint else {
            return Prepared {
                body: conversation.request.original_body(conversation.force_usage),
                outcome,
            };
        };
        let messages = rewrite::rewrite(
            conversation.request,
            cp,
            &conversation.message_tokens,
            self.config.merge_summary_into_user,
        );
        outcome.compacted = true;
        outcome.checkpoint_id = Some(cp.id.clone());
        outcome.tokens_after = calibration::apply(view.tokens, conversation.factor);
        outcome.sent_raw_tokens = view.tokens;
        Prepared {
            body: conversation
                .request
                .to_body(messages.iter().map(|m| &**m), conversation.force_usage),
            outcome,
        }
    }

    /// Serves a request without a new summary: through the checkpoint it already had if that
    /// fits, else with its oldest turns dropped under a marker.
    fn fallback(
        &self,
        conversation: &Conversation<'_>,
        view: &View<'_>,
        mut outcome: Outcome,
    ) -> Prepared {
        if self.fits(conversation, view) {
            return self.finish(conversation, view, outcome);
        }
        let base: Vec<Cow<RawValue>> = match view.checkpoint {
            Some(cp) => rewrite::rewrite(
                conversation.request,
                cp,
                &conversation.message_tokens,
                false,
            ),
            None => conversation
                .request
                .messages
                .iter()
                .map(|m| Cow::Borrowed(&*m.raw))
                .collect(),
        };
        let parsed: Vec<crate::request::Message> = base
            .iter()
            .filter_map(|m| crate::request::Message::parse(m.as_ref().to_owned()).ok())
            .collect();
        let encoding = conversation.measured.encoding;
        let tokens: Vec<u64> = parsed
            .iter()
            .map(|m| self.meter.message(encoding, m).tokens)
            .collect();
        let budget = conversation
            .limit
            .saturating_sub(conversation.reserve)
            .saturating_sub(conversation.measured.tools_tokens + REPLY_PRIMING + 64);
        let total: u64 = tokens.iter().sum();
        let mut dropped = 0usize;
        let mut remaining = calibration::apply(total, conversation.factor);
        let mut start = parsed
            .iter()
            .position(|m| !m.role.is_instruction())
            .unwrap_or(parsed.len());
        let last_user = parsed
            .iter()
            .rposition(|m| m.role == Role::User)
            .unwrap_or(parsed.len());
        while remaining > budget && start < last_user {
            // Drop a whole turn: up to the next user message.
            let next = (start + 1..parsed.len())
                .find(|&i| parsed[i].role == Role::User)
                .unwrap_or(last_user);
            for i in start..next {
                if !parsed[i].role.is_instruction() {
                    remaining = remaining
                        .saturating_sub(calibration::apply(tokens[i], conversation.factor));
                    dropped += 1;
                }
            }
            start = next;
        }
        if dropped == 0 {
            return self.finish(conversation, view, outcome);
        }
        let marker = rewrite::summary_message(&format!(
            "[Context trimmed] {dropped} earlier messages of this conversation were omitted because they did not fit in the model's context window and could not be summarized."
        ));
        let first_turn = parsed
            .iter()
            .position(|m| !m.role.is_instruction())
            .unwrap_or(0);
        let mut messages: Vec<&RawValue> = Vec::new();
        messages.extend(parsed[..first_turn].iter().map(|m| &*m.raw));
        messages.push(&marker);
        messages.extend(
            parsed[start..]
                .iter()
                .filter(|m| !m.role.is_instruction())
                .map(|m| &*m.raw),
        );
        if let Some(Status::Failed { fallback, .. }) = &mut outcome.status {
            *fallback = "dropped-oldest";
        }
        outcome.compacted = true;
        outcome.tokens_after = remaining;
        outcome.sent_raw_tokens = (remaining as f64 / conversation.factor) as u64;
        Prepared {
            body: conversation
                .request
                .to_body(messages, conversation.force_usage),
            outcome,
        }
    }
}

fn matches_prefix(checkpoint: &Checkpoint, chain: &[Hash]) -> bool {
    checkpoint.covered > 0
        && chain
            .get(checkpoint.covered - 1)
            .is_some_and(|h| identity::hex(h) == checkpoint.prefix_hash)
}

/// A lease holder names the job: who, which attempt, and the prefix it summarizes.
fn holder_name(replica: &str, attempt: u64, covered: usize, prefix: &str) -> String {
    format!("{replica}.{attempt}/{covered}/{prefix}")
}

fn holder_job(holder: &str) -> Option<(usize, &str)> {
    let mut parts = holder.splitn(3, '/');
    parts.next()?;
    let covered = parts.next()?.parse().ok()?;
    Some((covered, parts.next()?))
}

impl Engine {
    /// Makes (or waits for) a checkpoint for this conversation. Returns it and whether this call
    /// wrote a new summary.
    async fn compact(
        self: &Arc<Self>,
        context: &RequestContext,
        conversation: &Conversation<'_>,
        base: Option<&Checkpoint>,
        harder: bool,
        ahead_of_time: bool,
        started: Instant,
    ) -> Result<(Checkpoint, bool), SummaryError> {
        let anchor = conversation.anchor.ok_or(SummaryError::Nothing)?;
        let lease_key = format!("lease:{}", identity::hex(&anchor));
        let deadline = started + Duration::from_millis(self.config.summary_timeout_ms);
        let mut base = base.cloned();
        loop {
            let plan = self.plan(conversation, base.as_ref(), harder, ahead_of_time)?;
            let prefix = identity::hex(&conversation.chain[plan.cut - 1]);
            let attempt = self.attempts.fetch_add(1, Ordering::Relaxed);
            let holder = holder_name(&self.replica, attempt, plan.cut, &prefix);
            let ttl = Duration::from_millis(self.config.summary_timeout_ms + 10_000);
            let leased = match self.store.try_lease(&lease_key, &holder, ttl).await {
                Ok(leased) => leased,
                Err(e) => {
                    self.metrics.store_errors.inc();
                    tracing::warn!(error = %e, "Taking the summary lease failed; summarizing without it.");
                    true
                }
            };
            if leased {
                let result = self
                    .summarize_and_store(context, conversation, base.as_ref(), &plan, ahead_of_time)
                    .await;
                if let Err(e) = self.store.release_lease(&lease_key, &holder).await {
                    tracing::warn!(error = %e, "Releasing the summary lease failed; it will expire.");
                }
                return result.map(|cp| (cp, true));
            }
            // Someone else is summarizing this conversation. Wait for their result if it is a
            // prefix of ours; an edited history (a job on another prefix) does not wait.
            let other = self.store.lease_holder(&lease_key).await.ok().flatten();
            let theirs = other.as_deref().and_then(holder_job);
            let ours = theirs.is_some_and(|(covered, prefix)| {
                covered > 0
                    && conversation
                        .chain
                        .get(covered - 1)
                        .is_some_and(|h| identity::hex(h) == prefix)
            });
            if other.is_some() && !ours {
                let result = self
                    .summarize_and_store(context, conversation, base.as_ref(), &plan, ahead_of_time)
                    .await;
                return result.map(|cp| (cp, true));
            }
            loop {
                if Instant::now() >= deadline {
                    return Err(SummaryError::Timeout);
                }
                tokio::time::sleep(WAIT_POLL).await;
                let fresh = self
                    .store
                    .for_anchor(&identity::hex(&anchor))
                    .await
                    .ok()
                    .and_then(|list| {
                        list.iter()
                            .find(|c| {
                                matches_prefix(c, &conversation.chain)
                                    && c.covered > base.as_ref().map_or(0, |b| b.covered)
                            })
                            .cloned()
                    });
                if let Some(cp) = fresh {
                    let view = self.view(conversation, Some(&cp));
                    if self.fits(conversation, &view) || context.mode == Mode::Force {
                        return Ok((cp, false));
                    }
                    // Their checkpoint helps but is not enough: extend it.
                    base = Some(cp);
                    break;
                }
                if self
                    .store
                    .lease_holder(&lease_key)
                    .await
                    .ok()
                    .flatten()
                    .is_none()
                {
                    break;
                }
            }
        }
    }

    fn plan(
        &self,
        conversation: &Conversation<'_>,
        base: Option<&Checkpoint>,
        harder: bool,
        ahead_of_time: bool,
    ) -> Result<plan::Plan, SummaryError> {
        let instructions: u64 = conversation
            .roles
            .iter()
            .zip(&conversation.message_tokens)
            .filter(|(r, _)| r.is_instruction())
            .map(|(_, t)| t)
            .sum();
        let fixed = instructions + conversation.measured.tools_tokens + REPLY_PRIMING;
        let summary_allowance = self.summary_allowance(conversation.window);
        let usable = conversation
            .limit
            .saturating_sub(conversation.reserve)
            .saturating_sub(calibration::apply(
                fixed + summary_allowance,
                conversation.factor,
            ));
        // Half of what is left stays verbatim, so the conversation has room to grow before the
        // next compaction; counts are raw tokens, so undo the calibration factor.
        let mut keep = ((usable / 2) as f64 / conversation.factor) as u64;
        keep = keep.min(self.config.keep_recent_tokens);
        if harder {
            keep /= 2;
        }
        if conversation.mode == Mode::Force {
            // Asked to compact now (`/compact`): keep only the newest quarter of the conversation.
            keep = keep.min(conversation.measured.total() / 4);
        }
        if ahead_of_time {
            // Written now, applied later: leave room for what the conversation adds until then.
            let current = self.view(conversation, base).tokens;
            let growth = (conversation.limit.saturating_sub(conversation.reserve) as f64
                / conversation.factor) as u64;
            keep = keep.saturating_sub(growth.saturating_sub(current));
        }
        let input = PlanInput {
            roles: &conversation.roles,
            tokens: &conversation.message_tokens,
            start: base.map_or(0, |b| b.covered),
            pinned: base.and_then(|b| b.pinned_user),
            keep_budget: keep,
        };
        plan::plan(&input).map_err(|PlanError::NothingToSummarize| SummaryError::Nothing)
    }

    fn summary_allowance(&self, window: u64) -> u64 {
        self.config.summary_max_tokens.min(window / 8).max(128)
    }

    /// Writes the summary for `plan`, checks it helps, and stores the checkpoint.
    async fn summarize_and_store(
        &self,
        context: &RequestContext,
        conversation: &Conversation<'_>,
        base: Option<&Checkpoint>,
        plan: &plan::Plan,
        ahead_of_time: bool,
    ) -> Result<Checkpoint, SummaryError> {
        let request = conversation.request;
        let input = PlanInput {
            roles: &conversation.roles,
            tokens: &conversation.message_tokens,
            start: base.map_or(0, |b| b.covered),
            pinned: base.and_then(|b| b.pinned_user),
            keep_budget: 0,
        };
        let span: Vec<&crate::request::Message> = plan
            .newly_covered(&input)
            .into_iter()
            .map(|i| &request.messages[i])
            .collect();
        let started = Instant::now();
        let timeout = Duration::from_millis(self.config.summary_timeout_ms);
        let summary = tokio::time::timeout(
            timeout,
            self.summarize(
                context,
                conversation,
                base.map(|b| b.summary.as_str()),
                &span,
            ),
        )
        .await
        .map_err(|_| SummaryError::Timeout)??;
        self.metrics
            .summary_seconds
            .observe(started.elapsed().as_secs_f64());
        let mut files = match base {
            Some(b) => files::FileOps::from_lists(&b.files_read, &b.files_modified),
            None => files::FileOps::default(),
        };
        files.collect(span.iter().copied());
        let (files_read, files_modified) = files.into_lists();
        let prefix_hash = identity::hex(&conversation.chain[plan.cut - 1]);
        let created_ms = now_ms();
        let id = identity::hex(
            blake3::hash(format!("{prefix_hash}/{created_ms}/{}", self.replica).as_bytes())
                .as_bytes(),
        )[..24]
            .to_string();
        let mut checkpoint = Checkpoint {
            id,
            tenant: identity::hex(&context.tenant),
            anchor: identity::hex(&conversation.anchor.ok_or(SummaryError::Nothing)?),
            covered: plan.cut,
            prefix_hash,
            pinned_user: plan.pinned_user,
            truncations: plan.truncations.clone(),
            summary,
            files_read,
            files_modified,
            tokens_before: 0,
            tokens_after: 0,
            created_ms,
            model: request.model.clone(),
            ahead_of_time,
        };
        let before = self.view(conversation, base).tokens;
        let after = self.view(conversation, Some(&checkpoint)).tokens;
        if after >= before {
            return Err(SummaryError::NoReduction);
        }
        checkpoint.tokens_before =
            calibration::apply(conversation.measured.total(), conversation.factor);
        checkpoint.tokens_after = calibration::apply(after, conversation.factor);
        self.metrics.tokens_saved.inc_by(before - after);
        if let Err(e) = self.store.put(&checkpoint).await {
            self.metrics.store_errors.inc();
            tracing::warn!(error = %e, "Storing the checkpoint failed; it serves this request only.");
        }
        tracing::info!(
            checkpoint = %checkpoint.id,
            covered = checkpoint.covered,
            tokens_before = checkpoint.tokens_before,
            tokens_after = checkpoint.tokens_after,
            ahead_of_time,
            "Compacted a conversation."
        );
        Ok(checkpoint)
    }

    /// Summarizes `span`, folding it into `previous`, in chunks that fit the summarizer.
    async fn summarize(
        &self,
        context: &RequestContext,
        conversation: &Conversation<'_>,
        previous: Option<&str>,
        span: &[&crate::request::Message],
    ) -> Result<String, SummaryError> {
        if span.is_empty() {
            return Err(SummaryError::Nothing);
        }
        let model = if self.summarizer.model.is_empty() {
            conversation.request.model.clone()
        } else {
            self.summarizer.model.clone()
        };
        let window = if self.summarizer.window > 0 {
            self.summarizer.window
        } else {
            self.window_for(&model).await
        };
        let max_tokens = self.summary_allowance(conversation.window.min(window));
        let encoding = Encoding::for_model(&model);
        let factor = calibration::initial_factor(&model).max(conversation.factor);
        let usable = ((window.saturating_sub(self.config.margin_tokens.min(window / 16)) as f64)
            / factor) as u64;
        let budget_for = |previous: Option<&str>| {
            usable
                .saturating_sub(max_tokens)
                .saturating_sub(summarize::fixed_cost(encoding))
                .saturating_sub(previous.map_or(0, |p| encoding.count(p)))
        };
        let entries: Vec<String> = span
            .iter()
            .map(|m| summarize::transcript_entry(m))
            .collect();
        let instructions: Vec<&str> = [
            self.config.instructions.as_str(),
            context.instructions.as_deref().unwrap_or(""),
        ]
        .into_iter()
        .collect();
        // Chunks are sized for the largest summary the previous step could leave behind.
        let chunks = summarize::chunk(
            entries,
            encoding,
            budget_for(previous).saturating_sub(max_tokens).max(256),
        );
        let mut running = previous.map(str::to_string);
        for chunk in chunks {
            let body = summarize::request_body(
                &model,
                running.as_deref(),
                &chunk,
                &instructions,
                max_tokens,
            );
            running = Some(self.ask_summarizer(context, &body).await?);
        }
        running.ok_or(SummaryError::Nothing)
    }

    async fn ask_summarizer(
        &self,
        context: &RequestContext,
        body: &serde_json::Value,
    ) -> Result<String, SummaryError> {
        let mut headers = context.credentials.clone();
        headers.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        headers.insert(
            "x-compactor-purpose",
            http::HeaderValue::from_static("summary"),
        );
        let bytes = serde_json::to_vec(body).map_err(|e| SummaryError::Upstream(e.to_string()))?;
        let mut response = self
            .summary_upstream
            .send(
                http::Method::POST,
                "/chat/completions",
                headers,
                upstream::body_from(bytes),
            )
            .await
            .map_err(|e| match e {
                upstream::UpstreamError::Timeout(_) => SummaryError::Timeout,
                other => SummaryError::Upstream(other.to_string()),
            })?;
        let body = response
            .read_body(8 * 1024 * 1024)
            .await
            .map_err(|e| SummaryError::Upstream(e.to_string()))?;
        if !response.status.is_success() {
            return Err(SummaryError::Upstream(format!(
                "status {}",
                response.status.as_u16()
            )));
        }
        Ok(summarize::read_answer(&body)?)
    }

    /// Starts a background summary when the conversation passed the soft threshold and no
    /// checkpoint is ready or being made for it.
    fn maybe_start_background(
        self: &Arc<Self>,
        context: &RequestContext,
        conversation: &Conversation<'_>,
        view: &View<'_>,
    ) {
        if !self.config.ahead_of_time || context.mode != Mode::Auto {
            return;
        }
        let Some(anchor) = conversation.anchor else {
            return;
        };
        let soft = (conversation.limit as f64 * self.config.soft_threshold) as u64;
        if calibration::apply(view.tokens, conversation.factor) + conversation.reserve <= soft {
            return;
        }
        if self.background.insert(anchor, ()).is_some() {
            return;
        }
        let engine = self.clone();
        let context = context.clone();
        let request = conversation.request.clone();
        let base = view.checkpoint.cloned();
        tokio::spawn(async move {
            let (facts, _) = engine.model_facts(&request.model).await;
            let conversation = engine.conversation(&context, &request, facts);
            // A ready checkpoint that covers more than the one in use already exists: done.
            let existing = engine.store.for_anchor(&identity::hex(&anchor)).await.ok();
            let ready = existing.is_some_and(|list| {
                list.iter().any(|c| {
                    c.ahead_of_time
                        && matches_prefix(c, &conversation.chain)
                        && c.covered > base.as_ref().map_or(0, |b| b.covered)
                })
            });
            if !ready {
                let started = Instant::now();
                match engine
                    .compact(&context, &conversation, base.as_ref(), false, true, started)
                    .await
                {
                    Ok(_) => {
                        engine
                            .metrics
                            .compactions
                            .get_or_create(&crate::metrics::TriggerLabel {
                                trigger: "ahead_of_time",
                            })
                            .inc();
                    }
                    Err(e) => tracing::info!(reason = %e, "Ahead-of-time summary not made."),
                }
            }
            engine.background.remove(&anchor);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_holders_name_their_job() {
        let h = holder_name("r1", 7, 12, "abcd");
        assert_eq!(holder_job(&h), Some((12, "abcd")));
        assert_eq!(holder_job("garbage"), None);
        assert_eq!(Mode::parse(" FORCE "), Some(Mode::Force));
        assert_eq!(Mode::parse("sometimes"), None);
    }
}
