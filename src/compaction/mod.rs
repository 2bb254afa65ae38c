//! The compaction engine: from a parsed request of any dialect to the body that goes upstream.
//!
//! The engine sees a request only through [`WireRequest`]: elements with roles, canonical
//! hashes, token counts, transcripts and views, and a way to render the request through a
//! checkpoint. It never reads a wire format itself.
//!
//! [`Engine::prepare`] runs the stages in order, each a method named after its stage:
//!
//! 1. `identify` ([`conversation`]): the hash chain, the anchor, the model's window and budget;
//! 2. `measure`: what the request costs as the client sent it;
//! 3. `stored_checkpoints` / `apply_checkpoint`: the newest stored checkpoint whose prefix
//!    matches, and whether the request fits through it (or through one prepared ahead of time);
//! 4. `check_fits_at_all`, then the backoff after failed compactions ([`single_flight`]);
//! 5. `summarize` ([`summary`]): plan the cut ([`plan`]), write the summary once per
//!    conversation across replicas ([`single_flight`]), store the checkpoint;
//! 6. `rewrite` ([`finish`]): the body through the checkpoint ([`rewrite`]), or a marked
//!    fallback when no summary could be made.
//!
//! What responses teach (real windows from overflow errors, calibration from `usage`) lives in
//! [`learn`]; summaries made in the background before they are needed, in [`ahead_of_time`].
//! The pure parts ([`plan`], [`rewrite`], [`summarize`], [`files`], [`record`]) do no I/O.

mod ahead_of_time;
mod compact;
mod conversation;
pub mod files;
mod learn;
pub mod plan;
pub mod prompt;
pub mod record;
mod render;
mod single_flight;
pub mod summarizer;
pub mod summary_text;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::DashMap;
use http::HeaderMap;

use crate::config::{CompactionConfig, SummarizerConfig};
use crate::dialect::{AnswerError, Overflow, WireRequest};
use crate::identity::Hash;
use crate::measure::{calibration, windows::WindowTable, Measured, Meter};
use crate::metrics::Metrics;
use crate::store::{CheckpointStore, ModelFacts};
use crate::tokenizer::Encoding;

use conversation::{covers_all, Conversation, View};
pub use summarizer::{Summarizer, SummarizerError};

/// What the client asked for in `x-compactor-mode`, or by asking for a compaction in its own
/// protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    #[default]
    Auto,
    Force,
    Off,
    /// Summarize the whole conversation, nothing kept verbatim (Responses' client-requested
    /// compaction: the client replaces its history with the result). Not a header value.
    Whole,
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
    /// Compaction was needed but not tried: this conversation's last compactions failed or freed
    /// nothing, and the next attempt waits until `retry_in` has passed. The request went out via
    /// `fallback`.
    BackingOff {
        retry_in: Duration,
        fallback: &'static str,
    },
    /// Compaction was attempted and failed; the request went out via `fallback`.
    Failed {
        reason: String,
        fallback: &'static str,
    },
}

impl Status {
    pub fn header_value(&self) -> String {
        match self {
            Status::BackingOff { retry_in, fallback } => format!(
                "skipped; reason=backoff; retry_in_ms={}; fallback={fallback}",
                retry_in.as_millis()
            ),
            Status::Failed { reason, fallback } => {
                format!("failed; reason={reason}; fallback={fallback}")
            }
        }
    }

    /// Records how the request was served instead.
    fn served_by(&mut self, how: &'static str) {
        match self {
            Status::BackingOff { fallback, .. } | Status::Failed { fallback, .. } => {
                *fallback = how
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
#[error("this conversation cannot fit even after compaction: the system prompt, tools and last user message alone take {needed} tokens of the model's context window of {window} tokens")]
pub struct CannotFit {
    pub needed: u64,
    pub window: u64,
}

/// Why a summary could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SummaryError {
    #[error("summarizer-timeout")]
    Timeout,
    #[error("summarizer-error")]
    Summarizer(#[source] SummarizerError),
    #[error("summarizer-answer")]
    Answer(#[source] AnswerError),
    #[error("no-reduction")]
    NoReduction,
    #[error("nothing-to-summarize")]
    Nothing,
}

impl From<SummarizerError> for SummaryError {
    fn from(e: SummarizerError) -> SummaryError {
        match e {
            SummarizerError::Timeout => SummaryError::Timeout,
            SummarizerError::Answer(answer) => SummaryError::Answer(answer),
            other => SummaryError::Summarizer(other),
        }
    }
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
    facts: quick_cache::sync::Cache<String, (ModelFacts, Instant)>,
    /// Compactions in a row that failed or freed nothing, per conversation, and its backoff.
    unproductive: DashMap<Hash, single_flight::Unproductive>,
    /// Background summaries running, by conversation anchor.
    background: DashMap<Hash, ()>,
    /// Token counts of summary messages, by encoding and checkpoint id.
    summary_tokens: quick_cache::sync::Cache<(&'static str, Encoding, String), u64>,
    replica: String,
    attempts: AtomicU64,
}

/// Where `apply_checkpoint` left a request.
enum Applied<'c> {
    /// It fits through a stored checkpoint (or as it is): ready to send.
    Ready(Prepared),
    /// Still over the limit through the best checkpoint found.
    OverLimit(View<'c>),
}

impl Engine {
    pub fn new(
        config: CompactionConfig,
        summarizer: SummarizerConfig,
        store: Arc<dyn CheckpointStore>,
        meter: Meter,
        windows: WindowTable,
        summary_writer: Arc<dyn Summarizer>,
        metrics: Arc<Metrics>,
    ) -> Engine {
        let facts = quick_cache::sync::Cache::new(config.model_facts_cache_size.max(1));
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
            replica: format!("{:016x}", rand::random::<u64>()),
            attempts: AtomicU64::new(0),
        }
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

    /// Measures a request and decides what to send. `overflow` is set when the provider just
    /// refused the previous attempt as too long.
    pub async fn prepare(
        self: &Arc<Self>,
        context: &RequestContext,
        request: &Arc<dyn WireRequest>,
        overflow: Option<Overflow>,
    ) -> Result<Prepared, CannotFit> {
        let measured = self.meter.measure(request.as_ref());
        self.prepare_measured(context, request, measured, overflow)
            .await
    }

    /// [`Engine::prepare`] of a request already measured with [`Engine::meter`]: the proxy
    /// counts a large body on the blocking pool first, and need not hash it all again.
    pub async fn prepare_measured(
        self: &Arc<Self>,
        context: &RequestContext,
        request: &Arc<dyn WireRequest>,
        measured: Measured,
        overflow: Option<Overflow>,
    ) -> Result<Prepared, CannotFit> {
        let (facts, facts_degraded) = self.model_facts(request.model()).await;
        let conversation = self.identify_measured(context, request, facts, measured);
        let mut outcome = self.measure(&conversation, facts_degraded);
        if !self.config.enabled || context.mode == Mode::Off || conversation.anchor.is_none() {
            return Ok(Prepared {
                body: request.original_body(context.force_usage),
                outcome,
            });
        }
        let checkpoints = self.stored_checkpoints(&conversation, &mut outcome).await;
        let forced = context.mode == Mode::Force || overflow.is_some();
        let view =
            match self.apply_checkpoint(context, &conversation, &checkpoints, forced, &mut outcome)
            {
                Applied::Ready(prepared) => return Ok(prepared),
                Applied::OverLimit(view) => view,
            };
        self.check_fits_at_all(&conversation)?;
        if let Some(status) = self.backing_off(context, conversation.anchor) {
            outcome.status = Some(status);
            return Ok(self.fallback(&conversation, &view, outcome));
        }
        Ok(self
            .summarize(context, &conversation, &view, overflow.is_some(), outcome)
            .await)
    }

    /// The request through the newest stored checkpoint of its conversation, summarizing
    /// nothing: what the model would be sent now (for the providers' token-counting endpoints).
    /// `measured` is the request as [`Engine::meter`] counted it.
    pub async fn through_checkpoint(
        self: &Arc<Self>,
        context: &RequestContext,
        request: &Arc<dyn WireRequest>,
        measured: Measured,
    ) -> Vec<u8> {
        let (facts, _) = self.model_facts(request.model()).await;
        let conversation = self.identify_measured(context, request, facts, measured);
        let mut outcome = Outcome::default();
        let checkpoints = self.stored_checkpoints(&conversation, &mut outcome).await;
        let newest = checkpoints.iter().find(|c| !c.ahead_of_time);
        let view = self.view(&conversation, newest);
        self.rewrite(&conversation, &view, outcome).body
    }

    /// Summarizes the whole conversation, instructions aside, into one checkpoint (extending
    /// the newest stored one that covers a prefix of it), for a client that asked for a
    /// compaction and will send the summary back in place of its history. A checkpoint that
    /// already covers everything is returned as it is. `measured` is the request as
    /// [`Engine::meter`] counted it.
    pub async fn compact_whole(
        self: &Arc<Self>,
        context: &RequestContext,
        request: &Arc<dyn WireRequest>,
        measured: Measured,
    ) -> Result<crate::store::Checkpoint, SummaryError> {
        let context = RequestContext {
            mode: Mode::Whole,
            ..context.clone()
        };
        let (facts, _) = self.model_facts(request.model()).await;
        let conversation = self.identify_measured(&context, request, facts, measured);
        let mut outcome = Outcome::default();
        let checkpoints = self.stored_checkpoints(&conversation, &mut outcome).await;
        if let Some(whole) = checkpoints.iter().find(|c| covers_all(c, &conversation)) {
            return Ok(whole.clone());
        }
        let base = checkpoints.iter().find(|c| !c.ahead_of_time);
        let (checkpoint, summarized) = self
            .compact(
                &context,
                &conversation,
                base,
                false,
                false,
                tokio::time::Instant::now(),
            )
            .await?;
        if summarized {
            self.metrics
                .compactions
                .get_or_create(&crate::metrics::TriggerLabel { trigger: "client" })
                .inc();
        }
        Ok(checkpoint)
    }

    /// The request as the client sent it: its size, calibrated, against the window.
    fn measure(&self, conversation: &Conversation, facts_degraded: bool) -> Outcome {
        let original_total = conversation.measured.total();
        let prompt_tokens = calibration::apply(original_total, conversation.factor);
        Outcome {
            prompt_tokens,
            window: conversation.window,
            store_degraded: facts_degraded || !self.store.healthy(),
            sent_raw_tokens: original_total,
            tokens_before: prompt_tokens,
            tokens_after: prompt_tokens,
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
