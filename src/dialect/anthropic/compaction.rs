//! Anthropic's on-demand compaction (beta `compact-2026-09-04`: a top-level
//! `"compaction": {"type": "summarize", "instructions": …}`) when the proxy serves it: the
//! request read (anything else refused), the answer written (the `compaction` block alone,
//! `stop_reason: "compaction"`, whole or streamed), and the blocks a client sends back found
//! and replaced by the summary they stand for. What the block's `signature` holds, and whether
//! it is genuine, is the proxy's business, not the dialect's.

pub mod answer;

pub use answer::{BlockFirst, Issued};

use std::sync::Arc;

use serde_json::{json, Value};

use super::parse::{Author, Message, MessagesRequest};
use super::wire::summary_message;
use crate::dialect::splice::to_raw;
use crate::dialect::RequestError;

/// The request field.
pub const FIELD: &str = "compaction";

/// Anthropic's `error.details.error_code` for each compaction refusal Compactor raises where
/// Anthropic would (the SDK raises a class of its own for each: `CompactionBlockAmbiguousError`,
/// …). The two that concern blocks Compactor never issues (`tool_changes`, tool references)
/// cannot arise here.
pub mod refusal {
    /// More than one block with content.
    pub const BLOCK_AMBIGUOUS: &str = "compaction_block_ambiguous";
    /// A block anywhere but first in `messages`.
    pub const BLOCK_MISPLACED: &str = "compaction_block_misplaced";
    /// The block's content is not what its signature stands for.
    pub const CONTENT_MISMATCH: &str = "compaction_content_mismatch";
    /// The conversation ends on an assistant turn.
    pub const INCOMPLETE_TURN: &str = "compaction_incomplete_turn";
    /// No user or assistant content to summarize.
    pub const NOTHING_TO_SUMMARIZE: &str = "compaction_nothing_to_summarize";
    /// The signature does not open for this client, or its summary is gone.
    pub const SIGNATURE_INVALID: &str = "compaction_signature_invalid";
    /// The summary could not be written for a transient reason (status 529).
    pub const UNAVAILABLE: &str = "compaction_unavailable";

    /// Every code above: these travel in `error.details.error_code`.
    pub const ALL: [&str; 7] = [
        BLOCK_AMBIGUOUS,
        BLOCK_MISPLACED,
        CONTENT_MISMATCH,
        INCOMPLETE_TURN,
        NOTHING_TO_SUMMARIZE,
        SIGNATURE_INVALID,
        UNAVAILABLE,
    ];
}

/// What an on-demand compaction asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OnDemand {
    /// Instructions for the summary; `None` when absent, empty or only whitespace.
    pub instructions: Option<String>,
}

use super::edits::COMPACT_EDIT;

/// Anthropic's default trigger for [`COMPACT_EDIT`].
const DEFAULT_COMPACT_TRIGGER_TOKENS: u64 = 150_000;

/// What a `compact_20260112` edit asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompactEdit {
    /// Compact once the prompt passes this many tokens.
    pub trigger_tokens: u64,
    pub instructions: Option<String>,
    /// Answer with the compaction block alone (`stop_reason: "compaction"`).
    pub pause_after_compaction: bool,
}

/// The `compact_20260112` edit of `context_management.edits`, if there is one; any other
/// edit is left to the edits reader.
pub fn compact_edit(request: &MessagesRequest) -> Result<Option<CompactEdit>, RequestError> {
    let Some(raw) = request.fields.get(super::edits::FIELD) else {
        return Ok(None);
    };
    let value: Value = serde_json::from_str(raw.get()).unwrap_or(Value::Null);
    let Some(list) = value.get("edits").and_then(Value::as_array) else {
        return Ok(None);
    };
    let mut found = None;
    for (i, edit) in list.iter().enumerate() {
        if edit.get("type").and_then(Value::as_str) != Some(COMPACT_EDIT) {
            continue;
        }
        let at = format!("{}.edits.{i}", super::edits::FIELD);
        let refused = |field: &str, reason: &str| RequestError::ContextEdit {
            param: format!("{at}{field}"),
            reason: reason.to_string(),
        };
        if found.is_some() {
            return Err(refused(
                ".type",
                "`compact_20260112` is given more than once",
            ));
        }
        let Some(edit) = edit.as_object() else {
            continue;
        };
        if let Some(extra) = edit.keys().find(|k| {
            !["type", "trigger", "instructions", "pause_after_compaction"].contains(&k.as_str())
        }) {
            return Err(refused(&format!(".{extra}"), "unknown field"));
        }
        let trigger_tokens =
            match edit.get("trigger") {
                None | Some(Value::Null) => DEFAULT_COMPACT_TRIGGER_TOKENS,
                Some(trigger) => match (
                    trigger.get("type").and_then(Value::as_str),
                    trigger.get("value").and_then(Value::as_u64),
                ) {
                    (Some("input_tokens"), Some(value))
                        if trigger.as_object().map(|o| o.len()) == Some(2) =>
                    {
                        value
                    }
                    _ => return Err(refused(
                        ".trigger",
                        "expected {\"type\": \"input_tokens\", \"value\": a non-negative integer}",
                    )),
                },
            };
        let instructions = match edit.get("instructions") {
            None | Some(Value::Null) => None,
            Some(Value::String(text)) => Some(text.trim().to_string()).filter(|t| !t.is_empty()),
            Some(_) => return Err(refused(".instructions", "expected a string")),
        };
        let pause_after_compaction = match edit.get("pause_after_compaction") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(pause)) => *pause,
            Some(_) => return Err(refused(".pause_after_compaction", "expected a boolean")),
        };
        found = Some(CompactEdit {
            trigger_tokens,
            instructions,
            pause_after_compaction,
        });
    }
    Ok(found)
}

/// A `compaction` block in a request: where it stands and what it carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentBack {
    pub message: usize,
    pub block: usize,
    /// Whether the block opens an assistant message: where an answer put it.
    pub opens_answer: bool,
    pub content: Option<String>,
    pub signature: Option<String>,
}

/// The on-demand compaction the body asks for, if it asks for one.
pub fn on_demand(request: &MessagesRequest) -> Result<Option<OnDemand>, RequestError> {
    let Some(raw) = request.fields.get(FIELD) else {
        return Ok(None);
    };
    let refused = |param: &str, reason: &str| RequestError::ContextEdit {
        param: param.to_string(),
        reason: reason.to_string(),
    };
    let value: Value = serde_json::from_str(raw.get()).unwrap_or(Value::Null);
    let config = match value {
        Value::Null => return Ok(None),
        Value::Object(config) => config,
        _ => return Err(refused(FIELD, "expected an object")),
    };
    if let Some(extra) = config
        .keys()
        .find(|k| !["type", "instructions"].contains(&k.as_str()))
    {
        return Err(refused(&format!("{FIELD}.{extra}"), "unknown field"));
    }
    if config.get("type").and_then(Value::as_str) != Some("summarize") {
        return Err(refused(&format!("{FIELD}.type"), "expected \"summarize\""));
    }
    let instructions = match config.get("instructions") {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => Some(text.trim().to_string()).filter(|t| !t.is_empty()),
        Some(_) => {
            return Err(refused(
                &format!("{FIELD}.instructions"),
                "expected a string",
            ))
        }
    };
    Ok(Some(OnDemand { instructions }))
}

/// Takes the on-demand compaction off the body (for a request only counted).
pub fn remove_on_demand(request: &mut MessagesRequest) {
    if request.fields.shift_remove(FIELD).is_some() {
        request.client_body = None;
    }
}

/// Takes off the blocks of failed compactions (`content` null or absent), which Anthropic treats
/// as no-ops; a message left empty goes with them.
pub fn drop_failed(request: &mut MessagesRequest) -> Result<(), RequestError> {
    let failed = |block: &Value| {
        block.get("type").and_then(Value::as_str) == Some("compaction")
            && block.get("content").is_none_or(Value::is_null)
    };
    // Only a message with a compaction block has its blocks built.
    let holds_failed =
        |m: &Arc<Message>| m.has_block("compaction") && m.blocks().iter().any(failed);
    if !request.messages.iter().any(holds_failed) {
        return Ok(());
    }
    let mut raws = Vec::with_capacity(request.messages.len());
    for message in &request.messages {
        if !holds_failed(message) {
            raws.push(message.raw.clone());
            continue;
        }
        let kept: Vec<&Value> = message.blocks().iter().filter(|b| !failed(b)).collect();
        if kept.is_empty() {
            continue;
        }
        let mut value: Value = serde_json::from_str(message.raw.get()).unwrap_or(Value::Null);
        value["content"] = json!(kept);
        raws.push(to_raw(&value));
    }
    let body = request.to_body(raws.iter().map(|r| &**r));
    *request = MessagesRequest::parse(&body)?;
    Ok(())
}

/// Whether the conversation ends on an assistant turn, which a compaction cannot summarize
/// (the turn is not finished).
pub fn ends_unfinished(request: &MessagesRequest) -> bool {
    request
        .messages
        .last()
        .is_some_and(|m| m.role == Author::Assistant)
}

/// The conversation as the model reads it once compacted to `summary`: the summary as a user
/// message (after the system messages `messages` holds), then the turn in progress verbatim,
/// from the user's last own message (not one that
/// only carries tool results, which belong to the assistant's step before them) on.
pub fn compacted_to(request: &mut MessagesRequest, summary: &str) -> Result<(), RequestError> {
    let turn = request
        .messages
        .iter()
        .rposition(|m| m.is_real_user())
        .unwrap_or(request.messages.len());
    // System messages inside `messages` are pinned, never summarized away.
    let mut raws: Vec<Box<serde_json::value::RawValue>> = request.messages[..turn]
        .iter()
        .filter(|m| m.role == Author::System)
        .map(|m| m.raw.clone())
        .collect();
    raws.push(to_raw(&summary_message(summary)));
    raws.extend(request.messages[turn..].iter().map(|m| m.raw.clone()));
    let body = request.to_body(raws.iter().map(|r| &**r));
    *request = MessagesRequest::parse(&body)?;
    Ok(())
}

/// Every `compaction` block of the request, in order.
pub fn sent_back(request: &MessagesRequest) -> Vec<SentBack> {
    let mut found = Vec::new();
    for (m, message) in request.messages.iter().enumerate() {
        if !message.has_block("compaction") {
            // Known from the block heads: the message's blocks are not built for this.
            continue;
        }
        for (b, block) in message.blocks().iter().enumerate() {
            if block.get("type").and_then(Value::as_str) != Some("compaction") {
                continue;
            }
            let text = |field: &str| block.get(field).and_then(Value::as_str).map(str::to_string);
            found.push(SentBack {
                message: m,
                block: b,
                opens_answer: b == 0 && message.role == Author::Assistant,
                content: text("content"),
                signature: text("signature"),
            });
        }
    }
    found
}

/// Expands the compaction block that opens message `index` into the summary it stands for (a
/// user message), keeping what else that message held as a message of its own, and leaves out
/// the messages before it, which the block stands for, all but the system messages, which are
/// pinned.
pub fn expand_at(
    request: &mut MessagesRequest,
    index: usize,
    summary: &str,
) -> Result<(), RequestError> {
    let Some(opening) = request.messages.get(index) else {
        return Ok(());
    };
    let role = match opening.role {
        Author::Assistant => "assistant",
        Author::User => "user",
        Author::System => "system",
    };
    let rest: Vec<Value> = opening.blocks().iter().skip(1).cloned().collect();
    let mut raws: Vec<Box<serde_json::value::RawValue>> = request.messages[..index]
        .iter()
        .filter(|m| m.role == Author::System)
        .map(|m| m.raw.clone())
        .collect();
    raws.push(to_raw(&summary_message(summary)));
    if !rest.is_empty() {
        raws.push(to_raw(&json!({"role": role, "content": rest})));
    }
    raws.extend(request.messages[index + 1..].iter().map(|m| m.raw.clone()));
    let body = request.to_body(raws.iter().map(|r| &**r));
    *request = MessagesRequest::parse(&body)?;
    Ok(())
}
