//! What the engine's callers say and hear: how a request asks to be treated ([`Mode`],
//! [`RequestContext`]), why a summary is written ([`Trigger`]), what happened to a request
//! ([`Outcome`], [`Status`], [`Prepared`], [`SummaryReport`]), and why it was refused or could
//! not be compacted ([`CannotFit`], [`Refusal`], [`SummaryError`]).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::HeaderMap;

use crate::dialect::AnswerError;
use crate::identity::Hash;

use super::learn::SentCount;
use super::summarizer::SummarizerError;

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
    /// The client's credential headers, for summary requests made on its behalf (shared: the
    /// context is cloned into every conversation and background summary).
    pub credentials: Arc<HeaderMap>,
    pub mode: Mode,
    /// `x-compactor-instructions`.
    pub instructions: Option<String>,
    /// The context edits the client asked for were served on this request
    /// ([`super::Engine::clear_context`]): the engine clears nothing more of it.
    pub edits_served: bool,
}

/// Why a summary is written: one name for the plan's choices, the log and the metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// The request does not fit its window.
    Threshold,
    /// The client asked for a compaction now (`x-compactor-mode: force`).
    Forced,
    /// The provider refused the previous attempt as too long: compact harder.
    Overflow,
    /// The conversation passed the soft threshold: written in the background, applied later.
    AheadOfTime,
    /// The client asked for its whole conversation to be summarized, to replace its history.
    Client,
}

impl Trigger {
    /// The `trigger` label of `compactor_compactions_total`.
    pub fn label(self) -> &'static str {
        match self {
            Trigger::Threshold => "threshold",
            Trigger::Forced => "forced",
            Trigger::Overflow => "overflow",
            Trigger::AheadOfTime => "ahead_of_time",
            Trigger::Client => "client",
        }
    }

    /// Whether the plan keeps less verbatim than usual (the provider's window was smaller than
    /// we thought).
    pub(super) fn harder(self) -> bool {
        self == Trigger::Overflow
    }

    /// Whether the checkpoint is made before it is needed.
    pub(super) fn ahead_of_time(self) -> bool {
        self == Trigger::AheadOfTime
    }
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
    pub(super) fn served_by(&mut self, how: &'static str) {
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
    /// Our raw (uncorrected) count of what was sent, with whose it was and whether it was all
    /// counted: what the provider's `usage` and overflow errors are compared against.
    pub sent_raw_tokens: SentCount,
    /// The conversation's anchor, in hex, when it has one: what its checkpoints and timeline
    /// are kept under (logs show its first 16 digits).
    pub anchor: Option<String>,
    /// The summary stage, when the request went through it (for its trace).
    pub summary: Option<Box<SummaryReport>>,
}

/// The summary stage of one request, as its trace shows it: when it ran, why, with which model,
/// and what it made. Figures only, never the summary's text.
#[derive(Debug, Clone)]
pub struct SummaryReport {
    pub trigger: Trigger,
    pub started: SystemTime,
    /// The wait for the summary: written for this request, or by another one and waited for.
    pub duration: Duration,
    /// The model summaries are asked of.
    pub model: String,
    /// Written for this request (not one made by another request or ahead of time).
    pub written: bool,
    /// The checkpoint made or found.
    pub checkpoint_id: Option<String>,
    /// The conversation's tokens before the checkpoint, and through it.
    pub tokens_before: u64,
    pub tokens_after: u64,
    /// Why no summary could be used (the reason `x-compactor-compaction` gives).
    pub failure: Option<String>,
}

/// The body to send and what happened.
pub struct Prepared {
    /// What goes to the provider: the client's own bytes when nothing changed them.
    pub body: Bytes,
    pub outcome: Outcome,
}

/// The request cannot fit even after compaction.
#[derive(Debug, thiserror::Error)]
#[error("this conversation cannot fit even after compaction: the system prompt, tools and last user message alone take {needed} tokens of the model's context window of {window} tokens")]
pub struct CannotFit {
    pub needed: u64,
    pub window: u64,
}

/// Why a request is refused before it is sent: what is sent whatever is summarized does not
/// fit the window. The first two figures of each message are the tokens needed and the window
/// (what the Messages dialect rewords as Anthropic's "prompt is too long: N tokens > W").
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// The system prompt, tools and last user message alone do not fit.
    #[error(transparent)]
    Prompt(#[from] CannotFit),
    /// They fit, but not beside the output budget kept for the answer.
    #[error("this request cannot fit with its output budget: it needs {needed} tokens of the model's context window of {window} tokens, {prompt} for the system prompt, tools and last user message and {reserved} kept for the answer (of the {asked} output tokens asked for); ask for fewer output tokens")]
    OutputBudget {
        needed: u64,
        window: u64,
        /// Tokens of the system prompt, tools and last user message.
        prompt: u64,
        /// Tokens reserved for the answer: the budget asked for, capped.
        reserved: u64,
        /// The output budget the client asked for.
        asked: u64,
    },
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
    /// The span would take more summary requests than `max_summary_chunks`.
    #[error("span-too-large")]
    SpanTooLarge,
    /// The summarizer refused the summary request as too long, in smaller chunks too.
    #[error("summarizer-overflow")]
    SummarizerOverflow,
    /// The proxy is shutting down: no new summary is started.
    #[error("draining")]
    Draining,
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
