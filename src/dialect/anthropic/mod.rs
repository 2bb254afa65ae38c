//! Anthropic's Messages API (`POST /v1/messages`: Claude Code and the Anthropic SDKs).
//!
//! Elements are the `messages`; `system` and `tools` are the head, forwarded byte for byte like
//! every other top-level field (`context_management`, `thinking`, `metadata`, …). Roles map onto
//! the core's grouping: a user message made of `tool_result` blocks is a tool result (it stays
//! with the assistant step before it), a `role: "system"` message inside `messages` (Claude
//! Code's environment notes) is an instruction: never summarized, kept verbatim after the
//! summary. The summary is a user message; consecutive user messages are legal here, and for a
//! backend that demands alternation (`merge_into_user`) it opens the next user message instead.
//!
//! [`parse`] reads and validates a body, [`wire`] writes errors and summary requests in
//! Messages form and reads answers and `usage` back, [`edits`] reads and writes Anthropic's
//! context editing and [`compaction`] its on-demand compaction, for when the proxy serves them.

pub mod compaction;
pub mod edits;
pub mod parse;
pub mod read;
pub mod wire;

use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::dialect::event_fields;
use crate::dialect::media::{Billing, Media, MediaCost};
use crate::dialect::media_parts;
use crate::dialect::overflow::{self, Overflow};
use crate::dialect::splice::to_raw;
use crate::dialect::text::{cut_texts, part_texts, strings_in};
use crate::dialect::{
    AnswerError, CallSettings, Clearable, Clearing, ClientError, ContextEdits, Dialect,
    MessageView, RequestError, Role, SummaryRequest, Through, ToolCall, Usage, WireRequest,
};
use crate::identity::{self, Hash};
use crate::tokenizer::Encoding;

use parse::{Author, MessagesRequest};

/// Tokens a message costs beyond its text (role and block framing).
const MESSAGE_OVERHEAD: u64 = 4;

/// The Messages dialect.
#[derive(Debug, Clone, Copy, Default)]
pub struct Messages;

impl Dialect for Messages {
    fn name(&self) -> &'static str {
        "messages"
    }

    fn parse(&self, body: &Bytes) -> Result<Box<dyn WireRequest>, RequestError> {
        Ok(Box::new(MessagesRequest::parse_shared(body)?))
    }

    /// Anthropic's `prompt is too long: N tokens > M maximum`, and llama.cpp's own body, which
    /// it sends on this endpoint too.
    fn overflow(&self, status: u16, body: &[u8]) -> Option<Overflow> {
        overflow::classify(status, body)
    }

    /// A stream that failed before any output: `event: error` with Anthropic's error body, as
    /// the first event or after `message_start` and `ping`s.
    fn overflow_in_stream(&self, head: &[u8]) -> Option<Overflow> {
        let text = String::from_utf8_lossy(head);
        text.lines()
            .filter_map(|l| l.trim().strip_prefix("data:"))
            .map(str::trim)
            .find_map(|data| {
                (crate::dialect::event_fields::event_type(data)? == "error").then_some(())?;
                overflow::classify(400, data.as_bytes())
            })
    }

    /// A stream that has shown only `message_start` and `ping`s so far may still fail before
    /// any output (an overflow sent as `event: error`): more is read before it is forwarded.
    fn stream_head_undecided(&self, head: &[u8]) -> bool {
        let text = String::from_utf8_lossy(head);
        let mut opening_only = true;
        for line in text.lines() {
            let Some(kind) = line.strip_prefix("event:").map(str::trim) else {
                continue;
            };
            opening_only &= matches!(kind, "message_start" | "ping");
        }
        // An event whose data has not fully arrived is not decided either way yet.
        opening_only || !text.ends_with("\n\n")
    }

    fn error_body(&self, error: &ClientError) -> Value {
        let message = match error.code {
            Some("context_length_exceeded") => too_long(&error.message),
            _ => error.message.clone(),
        };
        let mut body = wire::error_body(wire::error_kind(error.status), &message);
        if let Some(code) = error.code.filter(|c| compaction::refusal::ALL.contains(c)) {
            // Where the SDK reads the cause, and picks its error class by.
            body["error"]["details"] = serde_json::json!({"error_code": code});
        }
        body
    }

    fn summary_path(&self) -> &'static str {
        "/v1/messages"
    }

    fn summary_request(&self, request: &SummaryRequest<'_>) -> Value {
        if let Some(body) = wire::continuation_request(request) {
            return body;
        }
        wire::summary_request(
            request.model,
            request.system,
            request.user,
            request.max_tokens,
        )
    }

    fn summary_answer(&self, body: &[u8]) -> Result<String, AnswerError> {
        wire::read_answer(body)
    }

    /// `usage` of the answer, of a stream's `message_start` (the prompt: fresh, cached and
    /// cache-written input together) or of its `message_delta` (the output so far).
    fn reported_usage(&self, json: &[u8]) -> Option<Usage> {
        let [usage, message, model] =
            event_fields::answer_fields(json, ["usage", "message", "model"])?;
        let [message_usage, message_model] = message
            .and_then(|m| event_fields::answer_fields(m.as_bytes(), ["usage", "model"]))
            .unwrap_or_default();
        let usage: Value = event_fields::parsed(usage.or(message_usage))?;
        let field = |name: &str| usage.get(name).and_then(Value::as_u64);
        Some(Usage {
            input_tokens: wire::prompt_tokens(&usage),
            output_tokens: field("output_tokens"),
            cache_read_tokens: field("cache_read_input_tokens"),
            cache_creation_tokens: field("cache_creation_input_tokens"),
            model: event_fields::parsed(model.or(message_model)),
        })
    }
}

/// Rewords the proxy's "cannot fit" message the way Anthropic words an overflow, which clients
/// such as Claude Code recognise: the first two numbers in it are the tokens needed and the
/// window.
fn too_long(message: &str) -> String {
    let numbers: Vec<u64> = message
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect();
    match numbers[..] {
        [needed, window, ..] => wire::too_long_message(needed, window),
        _ => format!("prompt is too long: {message}"),
    }
}

impl WireRequest for MessagesRequest {
    fn dialect(&self) -> &'static str {
        "messages"
    }

    fn settings(&self) -> &CallSettings {
        &self.settings
    }

    fn len(&self) -> usize {
        self.messages.len()
    }

    fn role(&self, index: usize) -> Role {
        let message = &self.messages[index];
        match message.role {
            Author::System => Role::System,
            Author::Assistant => Role::Assistant,
            Author::User if message.has_tool_results() => Role::Tool,
            Author::User => Role::User,
        }
    }

    fn raw(&self, index: usize) -> &str {
        self.messages[index].raw.get()
    }

    fn counted(&self, index: usize) -> Option<&crate::dialect::seen::Counted> {
        self.messages.get(index).map(|element| &element.counted)
    }

    fn canonical(&self, index: usize) -> Hash {
        let canonical = parse::canonical(&self.messages[index]).to_string();
        let raw = RawValue::from_string(canonical).expect("serde_json output is valid JSON");
        identity::canonical_hash(&raw)
    }

    fn transcript(&self, index: usize) -> String {
        // A tool result names the call it answers; the call's tool is in the message before.
        let calls = index
            .checked_sub(1)
            .map(|i| view_of(&self.messages[i]).tool_calls)
            .unwrap_or_default();
        let name_of = |id: &str| calls.iter().find(|c| c.id == id).map(|c| c.name.clone());
        wire::transcript_entry(&self.messages[index], &name_of)
    }

    /// The text of the blocks, and their media (images and documents, in tool results too) as
    /// Anthropic bills them.
    fn tokens(&self, encoding: Encoding, index: usize) -> u64 {
        let blocks = self.messages[index].blocks();
        let text: String = blocks.iter().map(block_text).collect::<Vec<_>>().join("\n");
        let media: u64 = media_of(blocks)
            .iter()
            .map(|m| m.cost(|t| encoding.count(t)))
            .sum();
        encoding.count(&text) + media + MESSAGE_OVERHEAD
    }

    fn media_cost(&self, index: usize) -> MediaCost {
        MediaCost::of(&media_of(self.messages[index].blocks()))
    }

    fn media_rules_apply(&self) -> bool {
        Billing::Anthropic.applies_to(self.model())
    }

    fn head_tokens(&self, encoding: Encoding) -> u64 {
        let system = self.system_raw().map_or(0, |raw| {
            let value: Value = serde_json::from_str(raw).unwrap_or(Value::Null);
            match value {
                Value::String(text) => encoding.count(&text),
                other => other
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|b| encoding.count(b.get("text").and_then(Value::as_str).unwrap_or("")))
                    .sum(),
            }
        });
        let tools = self.tools_raw().map_or(0, |raw| encoding.count(raw));
        system + tools + MESSAGE_OVERHEAD
    }

    fn head_parts(&self) -> Vec<&str> {
        self.system_raw()
            .into_iter()
            .chain(self.tools_raw())
            .collect()
    }

    fn summary_tokens(&self, encoding: Encoding, text: &str) -> u64 {
        encoding.count(text) + MESSAGE_OVERHEAD
    }

    fn view(&self, index: usize) -> MessageView {
        view_of(&self.messages[index])
    }

    /// With thinking on, the tool loop in progress carries signed thinking blocks that must
    /// reach the model exactly as they were made.
    fn keeps_last_turn_whole(&self) -> bool {
        self.thinking
    }

    fn context_edits(&self) -> Result<Option<ContextEdits>, RequestError> {
        edits::read(self)
    }

    fn clearable(&self, encoding: Encoding, index: usize) -> Clearable {
        edits::clearable(&self.messages[index], encoding)
    }

    fn apply_clearing(&mut self, clearing: &Clearing) {
        edits::apply(self, clearing)
    }

    fn cleared_copy(&self, clearing: &Clearing) -> Option<Box<dyn WireRequest>> {
        let mut copy = self.clone();
        copy.apply_clearing(clearing);
        Some(Box::new(copy))
    }

    fn prefix_copy(&self, end: usize) -> Option<Box<dyn WireRequest>> {
        let mut copy = self.clone();
        copy.messages.truncate(end);
        copy.client_body = None;
        Some(Box::new(copy))
    }

    fn original_body(&self) -> Bytes {
        // Messages streams always report usage (in `message_start`): nothing to ask for.
        match &self.client_body {
            Some(body) => body.clone(),
            None => Bytes::from(self.to_body(self.messages.iter().map(|m| &*m.raw))),
        }
    }

    fn render(&self, rewrite: &Through<'_>) -> Vec<u8> {
        let checkpoint = rewrite.checkpoint;
        let covered = checkpoint.covered.min(self.messages.len());
        let text = rewrite.text;
        let summary = to_raw(&wire::summary_message(text));
        let pinned = (0..covered).filter(|&i| {
            self.messages[i].role == Author::System || Some(i) == checkpoint.pinned_user
        });
        let truncated: Vec<(usize, Box<RawValue>)> = checkpoint
            .truncations
            .iter()
            .filter(|t| t.index >= covered && t.index < self.messages.len())
            .map(|t| {
                let tokens = rewrite.tokens.get(t.index).copied().unwrap_or(0);
                (
                    t.index,
                    truncate_blocks(
                        self.messages[t.index].blocks(),
                        &self.messages[t.index].raw,
                        tokens,
                        t.keep_tokens,
                    ),
                )
            })
            .collect();
        let kept = (covered..self.messages.len()).map(|i| {
            let raw = truncated
                .iter()
                .find(|(index, _)| *index == i)
                .map_or(&*self.messages[i].raw, |(_, raw)| &**raw);
            (i, raw)
        });
        let sent: Vec<(usize, &RawValue)> = pinned
            .map(|i| (i, &*self.messages[i].raw))
            .chain(kept)
            .collect();
        // For a backend that demands alternation, the summary opens the first message that
        // starts a turn rather than standing alone before it.
        let opening = sent
            .iter()
            .position(|&(i, _)| self.messages[i].role != Author::System)
            .filter(|&p| rewrite.merge_into_user && self.messages[sent[p].0].is_real_user());
        let Some(opening) = opening else {
            let rest = sent.iter().map(|&(_, raw)| raw);
            return self.to_body(std::iter::once(&*summary).chain(rest));
        };
        let merged = merge_summary(sent[opening].1, text);
        let messages = sent
            .iter()
            .enumerate()
            .map(|(p, &(_, raw))| if p == opening { &*merged } else { raw });
        self.to_body(messages)
    }
}

/// A user message with the summary as the first block of its content.
fn merge_summary(message: &RawValue, text: &str) -> Box<RawValue> {
    let Ok(mut value) = serde_json::from_str::<Value>(message.get()) else {
        return message.to_owned();
    };
    let summary = wire::summary_message(text)["content"][0].clone();
    value["content"] = match value.get("content") {
        Some(Value::String(s)) => serde_json::json!([summary, {"type": "text", "text": s}]),
        Some(Value::Array(blocks)) => {
            Value::Array(std::iter::once(summary).chain(blocks.clone()).collect())
        }
        _ => serde_json::json!([summary]),
    };
    to_raw(&value)
}

/// A message read as text, tool calls (`tool_use` blocks, their `input` as the arguments) and
/// the call its first `tool_result` answers.
fn view_of(message: &parse::Message) -> MessageView {
    let mut view = MessageView::default();
    let mut texts = Vec::new();
    for block in message.blocks() {
        let str_of = |field: &str| block.get(field).and_then(Value::as_str).unwrap_or("");
        match block.get("type").and_then(Value::as_str).unwrap_or("") {
            "tool_use" | "server_tool_use" | "mcp_tool_use" => view.tool_calls.push(ToolCall {
                id: str_of("id").to_string(),
                name: str_of("name").to_string(),
                arguments: block.get("input").map(Value::to_string).unwrap_or_default(),
            }),
            "image" | "document" => {}
            kind => {
                if kind == "tool_result" && view.tool_call_id.is_none() {
                    view.tool_call_id = Some(str_of("tool_use_id").to_string());
                }
                texts.push(block_text(block));
            }
        }
    }
    view.text = texts.join("\n");
    view.media = media_of(message.blocks());
    view
}

/// The media of a message's blocks, at any depth, as Anthropic bills them.
fn media_of(blocks: &[Value]) -> Vec<Media> {
    blocks
        .iter()
        .flat_map(|b| media_parts::find(b, Billing::Anthropic))
        .collect()
}

/// The text a block puts in front of the model, its media aside (they are billed by
/// [`media_of`]).
fn block_text(block: &Value) -> String {
    let str_of = |field: &str| block.get(field).and_then(Value::as_str).unwrap_or("");
    match block.get("type").and_then(Value::as_str).unwrap_or("") {
        "text" => str_of("text").to_string(),
        "image" | "document" => String::new(),
        "thinking" => str_of("thinking").to_string(),
        "tool_use" | "server_tool_use" | "mcp_tool_use" => {
            format!(
                "{} {}",
                str_of("name"),
                block.get("input").map(Value::to_string).unwrap_or_default()
            )
        }
        "tool_result" | "mcp_tool_result" => match block.get("content") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => {
                parts.iter().map(block_text).collect::<Vec<_>>().join("\n")
            }
            _ => String::new(),
        },
        _ => media_parts::without_media(block).to_string(),
    }
}

/// A kept message with its long texts cut in the middle, to about `keep_tokens` of the message's
/// `tokens`: the text of its tool results and text blocks, and the strings in its `tool_use`
/// inputs (an assistant step whose call carries a whole file is kept, shortened, rather than
/// summarized). Thinking blocks are signed and stay as they are.
fn truncate_blocks(
    blocks: &[Value],
    raw: &RawValue,
    tokens: u64,
    keep_tokens: u64,
) -> Box<RawValue> {
    let Ok(mut message) = serde_json::from_str::<Value>(raw.get()) else {
        return raw.to_owned();
    };
    let mut content: Vec<Value> = blocks.to_vec();
    let mut texts: Vec<&mut String> = content.iter_mut().flat_map(cuttable_texts).collect();
    cut_texts(&mut texts, tokens, keep_tokens);
    message["content"] = Value::Array(content);
    to_raw(&message)
}

/// The texts of a block that may be cut in the middle.
fn cuttable_texts(block: &mut Value) -> Vec<&mut String> {
    let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
    match kind {
        "text" => match block.get_mut("text") {
            Some(Value::String(s)) => vec![s],
            _ => vec![],
        },
        "tool_use" | "server_tool_use" | "mcp_tool_use" => {
            block.get_mut("input").map(strings_in).unwrap_or_default()
        }
        "tool_result" | "mcp_tool_result" => match block.get_mut("content") {
            Some(Value::String(s)) => vec![s],
            Some(Value::Array(parts)) => part_texts(parts),
            _ => vec![],
        },
        _ => vec![],
    }
}

#[cfg(test)]
mod tests;
