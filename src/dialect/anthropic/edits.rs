//! Anthropic's context editing (`context_management.edits`, beta
//! `context-management-2025-06-27`) when the proxy serves it: the edits read into the seam's
//! words, what a message holds that they may clear, a clearing written back into messages, and
//! the `context_management` objects the answers carry.
//!
//! Every parameter of `clear_tool_uses_20250919` (trigger, keep, clear_at_least, exclude_tools,
//! clear_tool_inputs) and `clear_thinking_20251015` (keep) is read with Anthropic's defaults;
//! anything else (an unknown edit type or field, a value of the wrong shape, an edit given
//! twice) is refused, never dropped.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::block_text;
use super::parse::{Author, Message, MessagesRequest};
use crate::dialect::edits::{
    AppliedEdit, ClearInputs, ClearThinking, ClearToolUses, ClearTrigger, Clearable, ClearableCall,
    ClearableResult, Clearing, ContextEdits,
};
use crate::dialect::splice::to_raw;
use crate::dialect::RequestError;
use crate::tokenizer::Encoding;

/// The request field that asks for context edits.
pub const FIELD: &str = "context_management";

/// Anthropic's defaults: clear once the prompt passes 100,000 tokens, keep the 3 newest tool
/// uses; keep the newest assistant turn's thinking.
const DEFAULT_TRIGGER_TOKENS: u64 = 100_000;
const DEFAULT_KEEP_TOOL_USES: u64 = 3;
const DEFAULT_KEEP_THINKING_TURNS: u64 = 1;

const CLEAR_TOOL_USES: &str = "clear_tool_uses_20250919";
const CLEAR_THINKING: &str = "clear_thinking_20251015";
/// The context edit that compacts at a threshold (beta `compact-2026-01-12`); read by
/// `compaction::compact_edit`, since it compacts rather than clears.
pub const COMPACT_EDIT: &str = "compact_20260112";

/// The edits the body asks for, or `None` when it has no `context_management`.
pub fn read(request: &MessagesRequest) -> Result<Option<ContextEdits>, RequestError> {
    let Some(raw) = request.fields.get(FIELD) else {
        return Ok(None);
    };
    let value: Value = serde_json::from_str(raw.get()).unwrap_or(Value::Null);
    let refused = |param: String, reason: String| RequestError::ContextEdit { param, reason };
    let Value::Object(config) = value else {
        return Err(refused(FIELD.into(), "expected an object".into()));
    };
    only_fields(&config, FIELD, &["edits"])?;
    let mut edits = ContextEdits::default();
    let list = match config.get("edits") {
        None | Some(Value::Null) => return Ok(Some(edits)),
        Some(Value::Array(list)) => list,
        Some(_) => {
            return Err(refused(
                format!("{FIELD}.edits"),
                "expected an array of edits".into(),
            ))
        }
    };
    for (i, edit) in list.iter().enumerate() {
        let at = format!("{FIELD}.edits.{i}");
        let Some(edit) = edit.as_object() else {
            return Err(refused(at, "expected an edit object".into()));
        };
        let kind = edit.get("type").and_then(Value::as_str).unwrap_or("");
        let twice = || {
            refused(
                format!("{at}.type"),
                format!("`{kind}` is given more than once"),
            )
        };
        match kind {
            CLEAR_TOOL_USES => {
                if edits.tool_uses.is_some() {
                    return Err(twice());
                }
                edits.tool_uses = Some(tool_uses(edit, &at)?);
            }
            CLEAR_THINKING => {
                if edits.thinking.is_some() {
                    return Err(twice());
                }
                edits.thinking = Some(thinking(edit, &at)?);
            }
            COMPACT_EDIT => {}
            other => {
                return Err(refused(
                    format!("{at}.type"),
                    format!(
                        "the context edit type `{other}` is not one Compactor serves \
                         (expected `{CLEAR_TOOL_USES}`, `{CLEAR_THINKING}` or `{COMPACT_EDIT}`)"
                    ),
                ))
            }
        }
    }
    Ok(Some(edits))
}

/// Refuses a field of `object` not in `known`.
fn only_fields(object: &Map<String, Value>, at: &str, known: &[&str]) -> Result<(), RequestError> {
    match object.keys().find(|k| !known.contains(&k.as_str())) {
        Some(extra) => Err(RequestError::ContextEdit {
            param: format!("{at}.{extra}"),
            reason: "unknown field".into(),
        }),
        None => Ok(()),
    }
}

/// `{"type": <one of kinds>, "value": <non-negative integer>}`, with the kind given back.
fn counted(
    value: &Value,
    at: &str,
    kinds: &[&'static str],
) -> Result<(&'static str, u64), RequestError> {
    let wrong = || RequestError::ContextEdit {
        param: at.to_string(),
        reason: format!(
            "expected {{\"type\": {}, \"value\": a non-negative integer}}",
            kinds
                .iter()
                .map(|k| format!("\"{k}\""))
                .collect::<Vec<_>>()
                .join(" or ")
        ),
    };
    let object = value.as_object().ok_or_else(wrong)?;
    only_fields(object, at, &["type", "value"])?;
    let kind = object
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(wrong)?;
    let kind = kinds.iter().find(|k| **k == kind).ok_or_else(wrong)?;
    let value = object
        .get("value")
        .and_then(Value::as_u64)
        .ok_or_else(wrong)?;
    Ok((kind, value))
}

fn tool_names(value: &Value, at: &str) -> Result<BTreeSet<String>, RequestError> {
    let names = value.as_array().and_then(|list| {
        list.iter()
            .map(|n| n.as_str().map(str::to_string))
            .collect::<Option<BTreeSet<_>>>()
    });
    names.ok_or_else(|| RequestError::ContextEdit {
        param: at.to_string(),
        reason: "expected an array of tool names".into(),
    })
}

fn tool_uses(edit: &Map<String, Value>, at: &str) -> Result<ClearToolUses, RequestError> {
    let known = [
        "type",
        "trigger",
        "keep",
        "clear_at_least",
        "exclude_tools",
        "clear_tool_inputs",
    ];
    only_fields(edit, at, &known)?;
    let present = |name: &str| edit.get(name).filter(|v| !v.is_null());
    let trigger = match present("trigger") {
        None => ClearTrigger::InputTokens(DEFAULT_TRIGGER_TOKENS),
        Some(v) => match counted(v, &format!("{at}.trigger"), &["input_tokens", "tool_uses"])? {
            ("input_tokens", n) => ClearTrigger::InputTokens(n),
            (_, n) => ClearTrigger::ToolUses(n),
        },
    };
    let keep = match present("keep") {
        None => DEFAULT_KEEP_TOOL_USES,
        Some(v) => counted(v, &format!("{at}.keep"), &["tool_uses"])?.1,
    };
    let clear_at_least = match present("clear_at_least") {
        None => 0,
        Some(v) => counted(v, &format!("{at}.clear_at_least"), &["input_tokens"])?.1,
    };
    let exclude_tools = match present("exclude_tools") {
        None => BTreeSet::new(),
        Some(v) => tool_names(v, &format!("{at}.exclude_tools"))?,
    };
    let clear_inputs = match present("clear_tool_inputs") {
        None | Some(Value::Bool(false)) => ClearInputs::None,
        Some(Value::Bool(true)) => ClearInputs::All,
        Some(v) => ClearInputs::Tools(tool_names(v, &format!("{at}.clear_tool_inputs"))?),
    };
    Ok(ClearToolUses {
        trigger,
        keep,
        clear_at_least,
        exclude_tools,
        clear_inputs,
    })
}

fn thinking(edit: &Map<String, Value>, at: &str) -> Result<ClearThinking, RequestError> {
    only_fields(edit, at, &["type", "keep"])?;
    let keep_turns = match edit.get("keep") {
        None | Some(Value::Null) => Some(DEFAULT_KEEP_THINKING_TURNS),
        Some(Value::String(all)) if all == "all" => None,
        Some(Value::Object(o)) if o.get("type") == Some(&json!("all")) && o.len() == 1 => None,
        Some(v) => Some(counted(v, &format!("{at}.keep"), &["thinking_turns", "all"])?.1),
    };
    Ok(ClearThinking { keep_turns })
}

fn is_reasoning(block: &Value) -> bool {
    matches!(
        block.get("type").and_then(Value::as_str),
        Some("thinking" | "redacted_thinking")
    )
}

/// What `message` holds that an edit may clear: its client tool calls, its tool results, its
/// reasoning (unless it is nothing but reasoning, which would leave it empty).
pub fn clearable(message: &Message, encoding: Encoding) -> Clearable {
    let mut clearable = Clearable::default();
    let str_of = |block: &Value, field: &str| {
        block
            .get(field)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let mut thinking = 0;
    for block in message.blocks() {
        match block.get("type").and_then(Value::as_str).unwrap_or("") {
            "tool_use" if message.role == Author::Assistant => {
                clearable.calls.push(ClearableCall {
                    id: str_of(block, "id"),
                    tool: str_of(block, "name"),
                    input_tokens: block
                        .get("input")
                        .map_or(0, |input| encoding.count(&input.to_string())),
                })
            }
            "tool_result" if message.role == Author::User => {
                clearable.results.push(ClearableResult {
                    call_id: str_of(block, "tool_use_id"),
                    tokens: encoding.count(&block_text(block)),
                    is_error: block.get("is_error") == Some(&Value::Bool(true)),
                })
            }
            "thinking" => thinking += encoding.count(&str_of(block, "thinking")),
            "redacted_thinking" => thinking += encoding.count(&str_of(block, "data")),
            _ => {}
        }
    }
    if message.blocks().iter().any(|b| !is_reasoning(b)) {
        clearable.thinking_tokens = thinking;
    }
    clearable
}

/// Writes `clearing` into the messages, rewriting only those it changes, and removes
/// `context_management` from the body.
pub fn apply(request: &mut MessagesRequest, clearing: &Clearing) {
    request.client_body = None;
    request.fields.shift_remove(FIELD);
    for (index, message) in request.messages.iter_mut().enumerate() {
        let strip_thinking = clearing.thinking.contains(&index);
        let mut changed = false;
        let mut blocks = Vec::with_capacity(message.blocks().len());
        for mut block in message.blocks().iter().cloned() {
            if strip_thinking && is_reasoning(&block) {
                changed = true;
                continue;
            }
            let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
            let id_of = |field: &str| block.get(field).and_then(Value::as_str).unwrap_or("");
            if kind == "tool_result" {
                let id = id_of("tool_use_id");
                if let Some(cleared) = clearing.results.iter().find(|r| r.call_id == id) {
                    block["content"] = Value::String(cleared.stub.clone());
                    changed = true;
                }
            } else if kind == "tool_use" && clearing.inputs.contains(id_of("id")) {
                block["input"] = json!({});
                changed = true;
            }
            blocks.push(block);
        }
        if !changed {
            continue;
        }
        // The message may be shared with other requests (parsed once, found again by its
        // bytes): the rewritten one is this request's own.
        let message = Arc::make_mut(message);
        if let Ok(Value::Object(mut object)) = serde_json::from_str(message.raw.get()) {
            object.insert("content".into(), Value::Array(blocks.clone()));
            message.raw = to_raw(&Value::Object(object));
        }
        message.set_blocks(blocks);
    }
}

/// The `context_management` object of an answer: what the edits cleared.
pub fn applied_edits(applied: &[AppliedEdit]) -> Value {
    let edits: Vec<Value> = applied
        .iter()
        .map(|edit| match *edit {
            AppliedEdit::ToolUses {
                cleared_tool_uses,
                cleared_input_tokens,
            } => json!({
                "type": CLEAR_TOOL_USES,
                "cleared_tool_uses": cleared_tool_uses,
                "cleared_input_tokens": cleared_input_tokens,
            }),
            AppliedEdit::Thinking {
                cleared_thinking_turns,
                cleared_input_tokens,
            } => json!({
                "type": CLEAR_THINKING,
                "cleared_thinking_turns": cleared_thinking_turns,
                "cleared_input_tokens": cleared_input_tokens,
            }),
        })
        .collect();
    json!({ "applied_edits": edits })
}

/// The `context_management` object of a `count_tokens` answer: the count before the edits.
pub fn counted_before_edits(input_tokens: u64, applied: &[AppliedEdit]) -> Value {
    let cleared: u64 = applied.iter().map(AppliedEdit::cleared_input_tokens).sum();
    json!({ "original_input_tokens": input_tokens.saturating_add(cleared) })
}

/// The beta flags of the features the proxy serves itself when it emulates context
/// management: taken off `anthropic-beta` before a request goes to a provider that does not
/// offer them.
pub const SERVED_BETAS: &[&str] = &[
    "context-management-2025-06-27",
    "compact-2026-01-12",
    "compact-2026-09-04",
];
