//! Anthropic's on-demand compaction (beta `compact-2026-09-04`: a top-level
//! `"compaction": {"type": "summarize", "instructions": …}`) when the proxy serves it: the
//! request read (anything else refused), the answer written (the `compaction` block alone,
//! `stop_reason: "compaction"`, whole or streamed), and the blocks a client sends back found
//! and replaced by the summary they stand for. What the block's `signature` holds, and whether
//! it is genuine, is the proxy's business, not the dialect's.

use serde_json::{json, Value};

use super::parse::{Author, MessagesRequest};
use super::wire::summary_message;
use crate::dialect::splice::to_raw;
use crate::dialect::RequestError;

/// The request field.
pub const FIELD: &str = "compaction";

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
    request.fields.shift_remove(FIELD);
}

/// Every `compaction` block of the request, in order.
pub fn sent_back(request: &MessagesRequest) -> Vec<SentBack> {
    let mut found = Vec::new();
    for (m, message) in request.messages.iter().enumerate() {
        for (b, block) in message.blocks.iter().enumerate() {
            if block.get("type").and_then(Value::as_str) != Some("compaction") {
                continue;
            }
            let text = |field: &str| block.get(field).and_then(Value::as_str).map(str::to_string);
            found.push(SentBack {
                message: m,
                block: b,
                content: text("content"),
                signature: text("signature"),
            });
        }
    }
    found
}

/// Replaces the first message, which opens with a compaction block, by the summary the block
/// stands for (as a user message), keeping what else it held as a message of its own.
pub fn expand_first(request: &mut MessagesRequest, summary: &str) -> Result<(), RequestError> {
    let Some(first) = request.messages.first() else {
        return Ok(());
    };
    let role = match first.role {
        Author::Assistant => "assistant",
        Author::User => "user",
        Author::System => "system",
    };
    let rest: Vec<Value> = first.blocks.iter().skip(1).cloned().collect();
    let mut raws = vec![to_raw(&summary_message(summary))];
    if !rest.is_empty() {
        raws.push(to_raw(&json!({"role": role, "content": rest})));
    }
    raws.extend(request.messages.iter().skip(1).map(|m| m.raw.clone()));
    let body = request.to_body(raws.iter().map(|r| &**r));
    *request = MessagesRequest::parse(&body)?;
    Ok(())
}

/// A compaction block as issued: for which model, under which id, its summary and signature,
/// the size of the conversation it stands for and of the summary.
#[derive(Debug, Clone, Copy)]
pub struct Issued<'a> {
    pub model: &'a str,
    pub id: &'a str,
    pub summary: &'a str,
    pub signature: &'a str,
    pub input_tokens: u64,
    /// Tokens of the summary written.
    pub output_tokens: u64,
}

/// The answer to an on-demand compaction: the `compaction` block alone, whole or as the
/// events of a stream.
pub fn answer(issued: Issued<'_>, stream: bool) -> Vec<u8> {
    let Issued {
        model,
        id,
        summary,
        signature,
        input_tokens,
        output_tokens,
    } = issued;
    let step = json!({"type": "compaction", "input_tokens": input_tokens,
                      "output_tokens": output_tokens, "cache_creation_input_tokens": 0,
                      "cache_read_input_tokens": 0});
    // The compaction step is the whole of this answer: no message was sampled after it.
    let usage = json!({"input_tokens": input_tokens, "output_tokens": output_tokens,
                       "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                       "iterations": [step]});
    let block = json!({"type": "compaction", "content": summary, "signature": signature});
    let message = |content: Value, stop: Value| {
        json!({"id": format!("msg_{id}"), "type": "message", "role": "assistant", "model": model,
               "content": content, "stop_reason": stop, "stop_sequence": null, "usage": usage})
    };
    if !stream {
        return message(json!([block]), json!("compaction"))
            .to_string()
            .into_bytes();
    }
    let events = [
        json!({"type": "message_start", "message": message(json!([]), Value::Null)}),
        json!({"type": "content_block_start", "index": 0,
               "content_block": {"type": "compaction", "content": null, "signature": signature}}),
        json!({"type": "content_block_delta", "index": 0,
               "delta": {"type": "compaction_delta", "content": summary}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "message_delta", "delta": {"stop_reason": "compaction", "stop_sequence": null},
               "usage": {"output_tokens": output_tokens, "iterations": usage["iterations"]}}),
        json!({"type": "message_stop"}),
    ];
    let mut out = String::new();
    for event in events {
        let kind = event["type"].as_str().unwrap_or_default().to_string();
        out.push_str(&format!("event: {kind}\ndata: {event}\n\n"));
    }
    out.into_bytes()
}
