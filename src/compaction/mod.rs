//! The compaction engine: from a parsed request of any dialect to the body that goes upstream.
//!
//! The engine sees a request only through [`WireRequest`]: elements with roles, canonical
//! hashes, token counts, transcripts and views, and a way to render the request through a
//! checkpoint. It imports the dialect seam and never a dialect, so it never reads a wire format.
//!
//! [`Engine::prepare`] runs the stages in order, each a method named after its stage:
//!
//! 1. `count` ([`count`]): the request's tokens, on the blocking pool when it is large;
//! 2. `identify` ([`conversation`]): the hash chain, the anchor, the model's window and budget;
//! 3. `measure`: what the request costs as the client sent it;
//! 4. `stored_checkpoints` / `apply_checkpoint`: the newest stored checkpoint whose prefix
//!    matches, and whether the request fits through it (or through one prepared ahead of time);
//! 5. `check_fits_at_all`; `clear` ([`tail_clearing`]): the oldest tool results past the
//!    checkpoint's cut stubbed, with no model call, when that alone makes the request fit
//!    (stored as a checkpoint); then the backoff after failed compactions ([`single_flight`]);
//! 6. `summarize` ([`compact`]): plan the cut ([`plan`]), write the summary once per
//!    conversation across replicas ([`single_flight`]) with the wording of [`prompt`], store
//!    the checkpoint;
//! 7. `rewrite` ([`render`]): the body through the checkpoint (its text from [`summary_text`],
//!    written in the request's own format by its dialect), or a marked fallback when no summary
//!    could be made.
//!
//! A retry after the provider's overflow ([`Engine::retry_after_overflow`]) starts again at
//! stage 4 with the window it learned, on the conversation stage 2 identified. What responses
//! teach (real windows from overflow errors, calibration from `usage`) lives in [`learn`];
//! summaries made in the background before they are needed, in [`ahead_of_time`]. The pure parts
//! ([`plan`], [`prompt`], [`summary_text`], [`files`], [`record`], [`user_words`], and the
//! planner of [`clearing`]) do no I/O.
//!
//! Before all of it, the context edits a client asks for (old tool results and reasoning
//! cleared in place, [`Engine::clear_context`]) are applied to the request when the proxy serves
//! them rather than the provider.
//!
//! On shutdown the engine drains ([`Engine::drain`]): it starts no new summary (a request that
//! needs one is served its fallback; waiting for one already being written is still allowed),
//! and the summaries it runs in tasks of their own can be waited for
//! ([`Engine::summaries_finished`]), so that one finishing within the grace is stored.

mod ahead_of_time;
pub mod clearing;
mod compact;
mod conversation;
mod count;
pub mod files;
mod learn;
mod outcome;
pub mod plan;
pub mod prompt;
pub mod record;
mod render;
mod single_flight;
mod slots;
pub mod summarizer;
pub mod summary_text;
mod tail_clearing;
pub mod user_words;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use dashmap::DashMap;
use tokio_util::task::TaskTracker;

use crate::config::{CompactionConfig, SummarizerConfig};
use crate::dialect::{Overflow, WireRequest};
use crate::identity::Hash;
use crate::measure::{windows::WindowTable, Meter};
use crate::metrics::Metrics;
use crate::store::CheckpointStore;
use crate::tokenizer::Encoding;

use conversation::{covers_all, Conversation, View};

/// A conversation's id as logs name it: the first 16 hex digits of its anchor.
pub fn identity_short(anchor: &Hash) -> String {
    crate::identity::hex(anchor)[..16].to_string()
}

pub use learn::{tenant_tag, SentCount};
pub use outcome::{
    CannotFit, Mode, Outcome, Prepared, Refusal, RequestContext, Status, SummaryError,
    SummaryReport, Trigger,
};
pub use summarizer::{Summarizer, SummarizerError};

/// A request as [`Engine::prepare_identified`] found it: its conversation (counts, hash chain,
/// anchor) and the stored checkpoints that match it, for a retry that needs them again.
pub struct Identified {
    conversation: Conversation,
    checkpoints: Vec<crate::store::Checkpoint>,
}

/// The shared engine.
pub struct Engine {
    config: CompactionConfig,
    summarizer: SummarizerConfig,
    store: Arc<dyn CheckpointStore>,
    meter: Meter,
    windows: WindowTable,
    summary_writer: Arc<dyn Summarizer>,
    /// Summarizers for the requests of particular dialects (by [`crate::dialect::Dialect::name`]),
    /// used instead of `summary_writer`: a conversation is summarized by its own provider.
    dialect_writers: Vec<(&'static str, Arc<dyn Summarizer>)>,
    metrics: Arc<Metrics>,
    /// Learned model facts, read through to the store (bounded: model names are the client's).
    facts: quick_cache::sync::Cache<String, (Arc<learn::CachedFacts>, Instant)>,
    /// Compactions in a row that failed or freed nothing, per conversation, and its backoff.
    unproductive: DashMap<Hash, single_flight::Unproductive>,
    /// Background summaries running, by conversation anchor.
    background: DashMap<Hash, ()>,
    /// Token counts of summary messages, by dialect, encoding and checkpoint id.
    summary_tokens: quick_cache::sync::Cache<(&'static str, Encoding, String), u64>,
    /// Summaries written at once by this proxy (`max_concurrent_summaries`).
    summary_slots: Arc<tokio::sync::Semaphore>,
    /// Summaries written at once per tenant (`max_concurrent_summaries_per_tenant`); an entry
    /// lives while one of the tenant's summaries does.
    tenant_slots: DashMap<Hash, Arc<tokio::sync::Semaphore>>,
    /// Summary texts, by checkpoint id ([`Engine::summary_text`]).
    summary_texts: quick_cache::sync::Cache<String, Arc<str>>,
    replica: String,
    attempts: AtomicU64,
    /// Summaries running in tasks of their own (under a lease, or ahead of time).
    tasks: TaskTracker,
    /// Set by [`Engine::drain`]: no new summary starts.
    draining: AtomicBool,
}

/// Where `apply_checkpoint` left a request.
enum Applied<'c> {
    /// It fits through a stored checkpoint (or as it is): ready to send.
    Ready(Prepared),
    /// Still over the limit through the best checkpoint found.
    OverLimit(View<'c>),
}

/// What an engine works with besides its settings.
pub struct Parts {
    pub store: Arc<dyn CheckpointStore>,
    pub meter: Meter,
    pub windows: WindowTable,
    /// The summarizer for requests of every dialect without one of its own
    /// ([`Engine::with_summarizer_for`]).
    pub summary_writer: Arc<dyn Summarizer>,
    pub metrics: Arc<Metrics>,
}

impl Engine {
    pub fn new(config: CompactionConfig, summarizer: SummarizerConfig, parts: Parts) -> Engine {
        let Parts {
            store,
            meter,
            windows,
            summary_writer,
            metrics,
        } = parts;
        let facts = quick_cache::sync::Cache::new(config.model_facts_cache_size.max(1));
        let summary_slots = Arc::new(tokio::sync::Semaphore::new(
            config.max_concurrent_summaries.max(1),
        ));
        Engine {
            config,
            summarizer,
            store,
            meter,
            windows,
            summary_writer,
            dialect_writers: Vec::new(),
            metrics,
            facts,
            unproductive: DashMap::new(),
            background: DashMap::new(),
            summary_tokens: quick_cache::sync::Cache::new(10_000),
            summary_texts: quick_cache::sync::Cache::new(1_000),
            summary_slots,
            tenant_slots: DashMap::new(),
            replica: format!("{:016x}", rand::random::<u64>()),
            attempts: AtomicU64::new(0),
            tasks: TaskTracker::new(),
            draining: AtomicBool::new(false),
        }
    }

    /// Stops starting summaries: the proxy is shutting down, and a summary started now would
    /// likely be cut off before it is stored. Summaries already running go on.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Resolves once no summary runs in a task of its own (ahead of time, or under a lease),
    /// and goes on taking new ones: for a
    /// replay that sends a conversation's requests one after another and gives each background
    /// summary the time an agent's own work between requests would (the cost and probe
    /// benchmarks). Waits on the engine's tasks, not on a clock, so a replay is the same from
    /// one run to the next.
    pub async fn background_settled(&self) {
        tokio::task::yield_now().await;
        while !self.tasks.is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    /// Resolves once no summary runs in a task of its own (call after [`Engine::drain`]).
    pub async fn summaries_finished(&self) {
        self.tasks.close();
        self.tasks.wait().await;
    }

    /// Summarizes the requests of `dialect` with `writer` instead of the default summarizer.
    pub fn with_summarizer_for(
        mut self,
        dialect: &'static str,
        writer: Arc<dyn Summarizer>,
    ) -> Self {
        self.dialect_writers.push((dialect, writer));
        self
    }

    /// The summarizer for a request of `dialect`.
    fn summarizer_for(&self, dialect: &str) -> &Arc<dyn Summarizer> {
        self.dialect_writers
            .iter()
            .find(|(name, _)| *name == dialect)
            .map_or(&self.summary_writer, |(_, writer)| writer)
    }

    pub fn store(&self) -> &Arc<dyn CheckpointStore> {
        &self.store
    }

    pub fn meter(&self) -> &Meter {
        &self.meter
    }

    /// Measures a request and decides what to send.
    pub async fn prepare(
        self: &Arc<Self>,
        context: &RequestContext,
        request: &Arc<dyn WireRequest>,
    ) -> Result<Prepared, Refusal> {
        Ok(self.prepare_identified(context, request).await?.0)
    }

    /// [`Engine::prepare`], keeping what it learned of the request (its conversation, counts and
    /// matching checkpoints) for [`Engine::retry_after_overflow`].
    pub async fn prepare_identified(
        self: &Arc<Self>,
        context: &RequestContext,
        request: &Arc<dyn WireRequest>,
    ) -> Result<(Prepared, Identified), Refusal> {
        let measured = self.count(request).await;
        let (facts, facts_degraded) = self.model_facts(request.model()).await;
        let conversation = self.with_facts(self.identify(context, request, measured), &facts);
        let mut outcome = self.measure(&conversation, facts_degraded);
        if !self.config.enabled || context.mode == Mode::Off || conversation.anchor.is_none() {
            let prepared = Prepared {
                body: request.original_body(),
                outcome,
            };
            let identified = Identified {
                conversation,
                checkpoints: vec![],
            };
            return Ok((prepared, identified));
        }
        let checkpoints = self.stored_checkpoints(&conversation, &mut outcome).await;
        let trigger = match context.mode {
            Mode::Force => Trigger::Forced,
            _ => Trigger::Threshold,
        };
        let prepared = self
            .compact_if_needed(&conversation, &checkpoints, trigger, outcome)
            .await?;
        let identified = Identified {
            conversation,
            checkpoints,
        };
        Ok((prepared, identified))
    }

    /// The provider refused what [`Engine::prepare_identified`] sent as too long: learns the
    /// window from `overflow` (`sent_raw_tokens` is our count of what was sent, and whose), and prepares the
    /// same request again, compacted harder, without counting, hashing or looking it up again.
    pub async fn retry_after_overflow(
        self: &Arc<Self>,
        identified: Identified,
        overflow: Overflow,
        sent_raw_tokens: SentCount,
    ) -> Result<Prepared, Refusal> {
        let Identified {
            conversation,
            checkpoints,
        } = identified;
        let model = conversation.request.model().to_string();
        self.learn_overflow(&model, overflow, sent_raw_tokens).await;
        let (facts, facts_degraded) = self.model_facts(&model).await;
        let conversation = self.with_facts(conversation, &facts);
        let outcome = self.measure(&conversation, facts_degraded);
        if conversation.anchor.is_none() {
            return Ok(Prepared {
                body: conversation.request.original_body(),
                outcome,
            });
        }
        self.compact_if_needed(&conversation, &checkpoints, Trigger::Overflow, outcome)
            .await
    }

    /// Stages `apply_checkpoint` to `rewrite`: through a stored checkpoint when that fits (a
    /// [`Trigger::Threshold`] request only), else through a new summary, else a marked fallback.
    async fn compact_if_needed(
        self: &Arc<Self>,
        conversation: &Conversation,
        checkpoints: &[crate::store::Checkpoint],
        trigger: Trigger,
        mut outcome: Outcome,
    ) -> Result<Prepared, Refusal> {
        let forced = trigger != Trigger::Threshold;
        let view = match self
            .apply_checkpoint(conversation, checkpoints, forced, &mut outcome)
            .await
        {
            Applied::Ready(prepared) => return Ok(prepared),
            Applied::OverLimit(view) => view,
        };
        // Boxed: the state of a clearing or a summary is many times that of the common path,
        // and every request's future would otherwise be as large (and be moved as a whole).
        Box::pin(self.compact_over_limit(conversation, view, trigger, outcome)).await
    }

    /// [`Engine::compact_if_needed`] for a request over the limit even through its newest
    /// checkpoint: a clearing of old tool results, else a new summary, else a marked fallback.
    async fn compact_over_limit(
        self: &Arc<Self>,
        conversation: &Conversation,
        view: View<'_>,
        trigger: Trigger,
        mut outcome: Outcome,
    ) -> Result<Prepared, Refusal> {
        let forced = trigger != Trigger::Threshold;
        self.check_fits_at_all(conversation)?;
        if !forced {
            if let Some(cleared) = self
                .clear_tail(conversation, &view, conversation.limit)
                .await
            {
                // A clearing over a ready summary serves that summary without waiting.
                self.note_ready_used(view.checkpoint, &mut outcome);
                let view = self.view(conversation, Some(&cleared));
                return Ok(self.rewrite(conversation, &view, outcome));
            }
        }
        if let Some(status) = self.backing_off(conversation) {
            outcome.status = Some(status);
            self.note_ready_used(view.checkpoint, &mut outcome);
            return Ok(self.fallback(conversation, &view, outcome));
        }
        Ok(self.summarize(conversation, &view, trigger, outcome).await)
    }

    /// The request through the newest stored checkpoint of its conversation, summarizing
    /// nothing: what the model would be sent now (for the providers' token-counting endpoints).
    pub async fn through_checkpoint(
        self: &Arc<Self>,
        context: &RequestContext,
        request: &Arc<dyn WireRequest>,
    ) -> Bytes {
        let measured = self.count(request).await;
        let (facts, _) = self.model_facts(request.model()).await;
        let conversation = self.with_facts(self.identify(context, request, measured), &facts);
        let mut outcome = Outcome::default();
        let checkpoints = self.stored_checkpoints(&conversation, &mut outcome).await;
        let newest = checkpoints.iter().find(|c| !c.ahead_of_time);
        let view = self.view(&conversation, newest);
        self.rewrite(&conversation, &view, outcome).body
    }

    /// Summarizes the whole conversation, instructions aside, into one checkpoint (extending
    /// the newest stored one that covers a prefix of it), for a client that asked for a
    /// compaction and will send the summary back in place of its history. A checkpoint that
    /// already covers everything is returned as it is.
    pub async fn compact_whole(
        self: &Arc<Self>,
        context: &RequestContext,
        request: &Arc<dyn WireRequest>,
    ) -> Result<crate::store::Checkpoint, SummaryError> {
        let context = RequestContext {
            mode: Mode::Whole,
            ..context.clone()
        };
        let measured = self.count(request).await;
        let (facts, _) = self.model_facts(request.model()).await;
        let conversation = self.with_facts(self.identify(&context, request, measured), &facts);
        let mut outcome = Outcome::default();
        let checkpoints = self.stored_checkpoints(&conversation, &mut outcome).await;
        if let Some(whole) = checkpoints.iter().find(|c| covers_all(c, &conversation)) {
            return Ok(whole.clone());
        }
        let base = checkpoints.iter().find(|c| !c.ahead_of_time);
        let (checkpoint, summarized) = self
            .compact(
                &conversation,
                base,
                Trigger::Client,
                tokio::time::Instant::now(),
            )
            .await?;
        if summarized {
            self.count_compaction(Trigger::Client);
        }
        Ok(checkpoint)
    }

    /// Counts one summary written for `trigger`.
    fn count_compaction(&self, trigger: Trigger) {
        self.metrics
            .compactions
            .get_or_create(&crate::metrics::TriggerLabel {
                trigger: trigger.label(),
            })
            .inc();
    }

    /// The text the model reads in place of what `checkpoint` covers. A checkpoint never
    /// changes, so its text is built once, not on every request through it.
    pub fn summary_text(&self, checkpoint: &crate::store::Checkpoint) -> Arc<str> {
        if let Some(text) = self.summary_texts.get(&checkpoint.id) {
            return text;
        }
        let text: Arc<str> = summary_text::summary_text(
            &checkpoint.summary,
            &checkpoint.files_read,
            &checkpoint.files_modified,
        )
        .into();
        if !checkpoint.id.is_empty() {
            self.summary_texts
                .insert(checkpoint.id.clone(), text.clone());
        }
        text
    }

    /// The request as the client sent it: its size, calibrated, against the window.
    fn measure(&self, conversation: &Conversation, facts_degraded: bool) -> Outcome {
        let original_total = conversation.measured.total();
        let prompt_tokens = conversation.correction.apply(original_total);
        Outcome {
            prompt_tokens,
            window: conversation.window,
            store_degraded: facts_degraded || !self.store.healthy(),
            sent_raw_tokens: SentCount {
                raw: original_total,
                tenant: conversation.tenant,
                countable: conversation::sends_only_counted(conversation, None),
                output_budget: conversation.request.max_output_tokens().unwrap_or(0),
            },
            tokens_before: prompt_tokens,
            tokens_after: prompt_tokens,
            anchor: conversation.anchor.map(|a| crate::identity::hex(&a)),
            ..Outcome::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_case_insensitively() {
        assert_eq!(Mode::parse(" FORCE "), Some(Mode::Force));
        assert_eq!(Mode::parse("sometimes"), None);
    }
}
