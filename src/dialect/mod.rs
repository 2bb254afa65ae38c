//! Dialects: one wire format each, turned into what the compaction core needs and back.
//!
//! Clients speak chat completions (`/v1/chat/completions`), Anthropic Messages (`/v1/messages`)
//! and OpenAI Responses (`/v1/responses`). The core never sees a format: a [`Dialect`] parses a
//! body into a [`WireRequest`], and the core works on what that exposes, in request order:
//!
//! 1. **the pinned head**: what is never summarized and is forwarded byte for byte
//!    (chat: `tools`, plus every system/developer message wherever it stands; Messages: `system`
//!    and `tools`; Responses: `instructions`, `tools` and developer items). Its cost is
//!    [`WireRequest::head_tokens`]; instruction elements carry [`Role::System`] or
//!    [`Role::Developer`].
//! 2. **the elements** of the conversation, in order, each with its [`Role`], its original bytes
//!    ([`WireRequest::raw`]), its [`canonical`](WireRequest::canonical) hash for the conversation's
//!    hash chain, a plain-text [`transcript`](WireRequest::transcript) for the summarizer, and its
//!    [`tokens`](WireRequest::tokens). Elements group into **units** ([`units`]), the smallest
//!    spans that may be cut between: a user message; an assistant step with every result of its
//!    tool calls. A dialect maps its own shapes onto roles so that this grouping holds (a
//!    Messages user message made of `tool_result` blocks is [`Role::Tool`]; a Responses
//!    `function_call` item is [`Role::Assistant`] and its `function_call_output` is
//!    [`Role::Tool`]).
//! 3. **the rewritten body** ([`WireRequest::render`]): the head untouched, one summary message
//!    in the dialect's own shape, then the kept elements' original bytes; every field the proxy
//!    does not know survives in place.
//! 4. **the provider's answer**: [`Dialect::overflow`] recognises "context full" in an error
//!    response, [`Dialect::overflow_in_stream`] in the first event of a stream that failed before
//!    any output; [`Dialect::error_body`] answers a client in its own error shape when
//!    compaction cannot help.
//! 5. **summary requests** in the format ([`Dialect::summary_request`],
//!    [`Dialect::summary_answer`]), so that a summarizer can be a model of this provider.
//!
//! ## The floor
//!
//! This file, [`vocabulary`], [`edits`], [`splice`], [`text`], [`media`], [`media_parts`] and
//! [`overflow`] are the seam: the words the core and the dialects share (roles, views, errors,
//! context edits), the body splicing, text cutting and media costing every dialect uses, and the
//! providers' overflow wording. The seam imports nothing of the core
//! ([`crate::compaction`], [`crate::measure`]) and nothing of a dialect; beneath it are only
//! [`crate::tokenizer`], [`crate::identity`] and [`crate::store`]'s types. The core imports the
//! seam, never a dialect. Each dialect is a folder ([`chat`], [`anthropic`], [`responses`])
//! that imports the seam and nothing of the core; `tests/layers.rs` checks all of it.
//!
//! A new format is its folder implementing both traits, one line in [`registry`] and its config
//! table; `tests/dialects.rs` is the battery it must pass. [`chat`] is the reference.

pub mod anthropic;
pub mod chat;
pub mod edits;
pub mod event_fields;
pub mod media;
pub mod media_parts;
pub mod overflow;
pub mod registry;
pub mod responses;
pub mod scan;
pub mod seen;
pub mod splice;
pub mod text;
pub mod vocabulary;

use std::ops::Range;

use bytes::Bytes;

use crate::identity::Hash;
use crate::store::Checkpoint;
use crate::tokenizer::{Cancel, Encoding};

pub use edits::{AppliedEdit, Clearable, Clearing, ContextEdits};
pub use overflow::Overflow;
pub use vocabulary::{AnswerError, MessageView, RequestError, Role, ToolCall, Usage};

/// The largest output budget taken from a request (`max_tokens` and the like): bounded so that
/// budget arithmetic cannot wrap; no model writes more in one answer.
pub const MAX_OUTPUT_TOKENS: u64 = 1 << 32;

/// A wire format: parsing its requests, recognising its provider's errors, writing its errors
/// and its summary requests. One value per format, shared by all requests.
pub trait Dialect: Send + Sync + 'static {
    /// Short stable name for logs, metric labels and headers: `chat`, `messages`, `responses`.
    fn name(&self) -> &'static str;

    /// Parses a request body. An error is the client's fault and becomes a 400 in this
    /// dialect's error shape. The request may keep `body` (shared, not copied): while nothing
    /// changes it, [`WireRequest::original_body`] is then those very bytes, and a large body
    /// that needs no compaction is forwarded without being written again.
    fn parse(&self, body: &Bytes) -> Result<Box<dyn WireRequest>, RequestError>;

    /// Recognises "the prompt did not fit" in an error response (status and body), with the real
    /// window and the provider's count of the prompt when it states them. Rate limits are never
    /// overflows.
    fn overflow(&self, status: u16, body: &[u8]) -> Option<Overflow>;

    /// Recognises the same at the start of a successful (200) stream that failed before any
    /// output: `head` holds the first bytes of the stream. The default: this provider always
    /// reports overflows as error statuses.
    fn overflow_in_stream(&self, head: &[u8]) -> Option<Overflow> {
        let _ = head;
        None
    }

    /// Whether a stream's first bytes (`head`) cannot yet tell output from a failure, so more
    /// must be read before forwarding (Responses opens with `response.created` and
    /// `response.in_progress`, and may then fail). The default: the first bytes tell.
    fn stream_head_undecided(&self, head: &[u8]) -> bool {
        let _ = head;
        false
    }

    /// What the provider reports it used in a whole JSON answer, or in the data of one stream
    /// event; `None` when it carries no `usage`. Its `input_tokens` (the whole prompt, cached
    /// parts included: chat's `usage.prompt_tokens`) is what calibration learns from.
    fn reported_usage(&self, json: &[u8]) -> Option<Usage>;

    /// The body of an error answered by the proxy itself (not forwarded from upstream), in this
    /// dialect's error shape.
    fn error_body(&self, error: &ClientError) -> serde_json::Value;

    /// Path of summary requests relative to the upstream base (chat: `/chat/completions`).
    fn summary_path(&self) -> &'static str;

    /// Writes a summary request in this format.
    fn summary_request(&self, request: &SummaryRequest<'_>) -> serde_json::Value;

    /// Reads the summary out of the answer to a summary request.
    fn summary_answer(&self, body: &[u8]) -> Result<String, AnswerError>;
}

/// What a request asks of the call besides its conversation: the fields every dialect has, under
/// its own names (Messages' `max_tokens` is `max_output_tokens` here).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallSettings {
    pub model: String,
    pub stream: bool,
    pub max_output_tokens: Option<u64>,
}

/// One parsed request of some dialect: the conversation as elements, and how to write it back.
/// The engine takes it as `Arc<dyn WireRequest>`, so a summary made ahead of time can keep it.
///
/// Element indices run over the conversation in order (`0..len()`); checkpoints store how many
/// leading elements they cover, so a dialect must number elements the same way for the same
/// conversation on every request.
pub trait WireRequest: Send + Sync {
    /// The dialect's [`Dialect::name`]: elements of different formats never share a cache entry.
    fn dialect(&self) -> &'static str;
    /// What the request asks of the call, apart from the conversation.
    fn settings(&self) -> &CallSettings;
    /// The model asked for.
    fn model(&self) -> &str {
        &self.settings().model
    }
    /// Whether the client asked for a streamed answer.
    fn stream(&self) -> bool {
        self.settings().stream
    }
    /// The output budget the client asked for, if it did.
    fn max_output_tokens(&self) -> Option<u64> {
        self.settings().max_output_tokens
    }

    /// Number of elements.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The role element `index` plays (what the core plans with).
    fn role(&self, index: usize) -> Role;
    /// The element's original bytes, forwarded verbatim when it is kept.
    fn raw(&self, index: usize) -> &str;
    /// What the meter learned of the element, kept with it ([`seen::Counted`]); `None` where
    /// a dialect keeps nothing (the meter's own cache still knows it).
    fn counted(&self, _index: usize) -> Option<&seen::Counted> {
        None
    }
    /// Hash of the element's canonical form (see [`crate::identity::canonical_hash`]): what a
    /// client re-serializes differently from request to request must hash the same.
    fn canonical(&self, index: usize) -> Hash;
    /// The element as plain text for the summarizer's transcript (labelled, long tool results
    /// cut in the middle).
    fn transcript(&self, index: usize) -> String;
    /// Tokens the element costs in the prompt, overhead included.
    fn tokens(&self, encoding: Encoding, index: usize) -> u64;
    /// Like [`WireRequest::tokens`], giving up (None) once `cancel` is set; a dialect whose
    /// elements can be long overrides it to stop mid-element.
    fn tokens_until(&self, encoding: Encoding, index: usize, cancel: &Cancel) -> Option<u64> {
        (!cancel.is_set()).then(|| self.tokens(encoding, index))
    }
    /// The element read as text, tool calls and the id of the call it answers: what the
    /// summary's record and the file lists are taken from, whatever the wire format.
    fn view(&self, index: usize) -> MessageView;
    /// How the element's media (images, documents, audio, files, at any depth) were costed by
    /// [`WireRequest::tokens`]: none, read from their bytes, or guessed. Nothing is learned from
    /// an answer to a prompt whose media cost is a guess. The default, for a dialect that does
    /// not read its media: any media at all is a guess.
    fn media_cost(&self, index: usize) -> media::MediaCost {
        if media_parts::holds_media(self.raw(index)) {
            media::MediaCost::Guessed
        } else {
            media::MediaCost::None
        }
    }
    /// Whether the model asked for bills media by the rules the dialect costs them with
    /// ([`media::Billing::applies_to`]); if not, even media read from their bytes are a guess.
    fn media_rules_apply(&self) -> bool {
        false
    }

    /// Tokens of the pinned head that is not an element (chat: `tools`), overhead included.
    fn head_tokens(&self, encoding: Encoding) -> u64;
    /// The pinned head's original bytes, in parts: the key under which its count is cached
    /// (agents resend the same tools and system prompt with every request).
    fn head_parts(&self) -> Vec<&str>;
    /// Tokens the summary message costs when it carries `text`.
    fn summary_tokens(&self, encoding: Encoding, text: &str) -> u64;
    /// Tokens to keep free for the answer, given the configured share of the window
    /// (`configured`): the output budget the client asked for, capped at that share. Clients
    /// send a fixed large budget whatever the model (Claude Code 32,000, Qwen Code 32,768):
    /// taken as it is, it alone would fill a small window that the server would serve.
    fn output_reserve(&self, configured: u64) -> u64 {
        self.max_output_tokens()
            .map_or(configured, |asked| asked.min(configured))
    }

    /// Whether the last turn must never be cut inside (split, or its results shortened): its
    /// steps carry signed reasoning the provider checks (Anthropic's thinking blocks).
    fn keeps_last_turn_whole(&self) -> bool {
        false
    }

    /// Whether the request relies on history the provider holds (Responses'
    /// `previous_response_id`): it is forwarded untouched, since the proxy cannot see what it
    /// would compact.
    fn uses_server_state(&self) -> bool {
        false
    }

    /// Has every body written from now on ask a streamed answer for its prompt size, where the
    /// format reports it only when asked (a chat stream without `stream_options.include_usage`),
    /// so that calibration can learn from it. Returns whether it asked: the proxy then strips
    /// what the client did not ask for from the stream.
    fn ask_for_usage(&mut self) -> bool {
        false
    }

    /// The context edits the client asks the provider for (Anthropic's
    /// `context_management.edits`), read when the proxy serves them itself: `Ok(None)` when it
    /// asks for none, an error for an edit the proxy does not know or cannot serve as asked
    /// (never dropped in silence). The default: the format has none.
    fn context_edits(&self) -> Result<Option<ContextEdits>, RequestError> {
        Ok(None)
    }

    /// What element `index` holds that a context edit may clear (tool calls, tool results,
    /// reasoning), with their token counts.
    fn clearable(&self, encoding: Encoding, index: usize) -> Clearable {
        let _ = (encoding, index);
        Clearable::default()
    }

    /// Writes `clearing` into the elements (their original bytes change where something is
    /// cleared, and nowhere else), and removes the client's request for context edits from the
    /// body: they are served here, and a provider that does not offer them would refuse it.
    fn apply_clearing(&mut self, clearing: &Clearing) {
        let _ = clearing;
    }

    /// A copy of the request with `clearing` written into it ([`WireRequest::apply_clearing`]),
    /// the request itself unchanged: what a checkpoint that cleared tool results is rendered
    /// through. `None` for a format that clears nothing.
    fn cleared_copy(&self, clearing: &Clearing) -> Option<Box<dyn WireRequest>> {
        let _ = clearing;
        None
    }

    /// A copy of the request holding only its first `end` elements, everything else in place:
    /// the conversation as it stood when it reached `end`, rendered like any request (what a
    /// summary request that continues the conversation is built from). `None` for a format
    /// that cannot be cut.
    fn prefix_copy(&self, end: usize) -> Option<Box<dyn WireRequest>> {
        let _ = end;
        None
    }

    /// The body as the client sent it (asking for usage if [`WireRequest::ask_for_usage`] did).
    fn original_body(&self) -> Bytes;

    /// The body through a checkpoint: the head, the summary message in this dialect's shape,
    /// and the kept elements' original bytes (cut to the checkpoint's truncations).
    fn render(&self, through: &Through<'_>) -> Vec<u8>;
}

/// How to write a request through a checkpoint.
#[derive(Debug, Clone, Copy)]
pub struct Through<'a> {
    /// Elements `[0..covered)` are replaced by the summary, except instructions and the pinned
    /// user element; `truncations` cut kept elements' long texts in the middle (tool results,
    /// message text, tool-call arguments, short strings such as paths left whole).
    pub checkpoint: &'a Checkpoint,
    /// The summary message's text: the checkpoint's summary with what code carries appended
    /// (written by the core), or the marker of a trimmed conversation.
    pub text: &'a str,
    /// Tokens per element (for truncations).
    pub tokens: &'a [u64],
    /// Merge the summary into the next user message instead of sending it on its own (for
    /// backends that demand strict user/assistant alternation).
    pub merge_into_user: bool,
}

/// A summary request, whatever its format.
///
/// Standalone (`conversation` is `None`): the summarizer's own system prompt and one user
/// message holding the transcript. As a continuation: `conversation` is a body of the
/// conversation's own format, as it was last sent upstream and cut where the span to summarize
/// ends; the request is that body with `user` as one more user message (and `system` unused),
/// so a provider that caches prompts reads everything before it from its cache instead of
/// billing it as fresh input.
#[derive(Debug, Clone, Copy)]
pub struct SummaryRequest<'a> {
    pub model: &'a str,
    /// The summarizer's system prompt.
    pub system: &'a str,
    /// The user message: previous summary, transcript, instructions (or, continuing, the
    /// instructions alone).
    pub user: &'a str,
    pub max_tokens: u64,
    /// The conversation the request continues, if it does.
    pub conversation: Option<&'a [u8]>,
}

impl SummaryRequest<'_> {
    /// The continuation's body: `conversation` parsed, its `array` of elements extended by
    /// `message`, the output budget written into the first of `budget_fields` the body has
    /// (the last when it has none; the others removed, so a client's `max_completion_tokens`
    /// does not contradict it), asked whole rather than streamed, and the fields in `dropped`
    /// removed (what would change the answer's shape or make the provider act on the request
    /// itself). `None` when the conversation is not a JSON object with that array. Also returns
    /// the budget the client had asked for there, if any.
    pub fn continuation(
        &self,
        array: &str,
        message: serde_json::Value,
        budget_fields: &[&str],
        dropped: &[&str],
    ) -> Option<(serde_json::Value, Option<u64>)> {
        let mut body: serde_json::Value = serde_json::from_slice(self.conversation?).ok()?;
        let fields = body.as_object_mut()?;
        fields.get_mut(array)?.as_array_mut()?.push(message);
        let field = budget_fields
            .iter()
            .copied()
            .find(|f| fields.contains_key(*f))
            .or(budget_fields.last().copied())?;
        for other in budget_fields.iter().filter(|f| **f != field) {
            fields.remove(*other);
        }
        let asked = fields
            .insert(field.to_string(), self.max_tokens.into())
            .and_then(|v| v.as_u64());
        fields.insert("stream".to_string(), false.into());
        for name in dropped {
            fields.remove(*name);
        }
        Some((body, asked))
    }
}

/// An error the proxy answers itself, before or instead of the provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientError {
    pub status: u16,
    /// OpenAI's `type` vocabulary (`invalid_request_error`, `upstream_error`, `server_error`);
    /// a dialect maps it onto its own.
    pub kind: &'static str,
    pub code: Option<&'static str>,
    pub param: Option<String>,
    pub message: String,
}

/// OpenAI's error body, `{"error": {"message", "type", "param", "code"}}`: what chat
/// completions and Responses clients read.
pub fn openai_error_body(error: &ClientError) -> serde_json::Value {
    serde_json::json!({"error": {
        "message": error.message,
        "type": error.kind,
        "param": error.param,
        "code": error.code,
    }})
}

/// The units of a conversation: the smallest spans that may be cut between. A unit is one
/// element plus the tool results right after it, so no result is ever separated from the
/// assistant step that called it.
pub fn units(roles: &[Role]) -> Vec<Range<usize>> {
    let mut units: Vec<Range<usize>> = Vec::new();
    for (i, role) in roles.iter().enumerate() {
        let joins_previous = matches!(role, Role::Tool | Role::Other) && i > 0;
        match units.last_mut() {
            Some(last) if joins_previous => last.end = i + 1,
            _ => units.push(i..i + 1),
        }
    }
    units
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_results_stay_with_the_step_that_called_them() {
        use Role::*;
        let roles = [System, User, Assistant, Tool, Tool, Assistant, User, Tool];
        assert_eq!(units(&roles), vec![0..1, 1..2, 2..5, 5..6, 6..8]);
        assert_eq!(units(&[Tool, User]), vec![0..1, 1..2]);
        assert!(units(&[]).is_empty());
    }
}
