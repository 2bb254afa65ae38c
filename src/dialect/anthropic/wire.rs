//! What Messages looks like on the wire besides the request: errors in Anthropic's shape, the
//! summary message and summary requests in Messages form, answers and `usage` read back, and
//! the transcript of a message for the summarizer.

use serde_json::{json, Value};

use super::parse::{Author, Message};
use crate::dialect::media::{self, Billing};
use crate::dialect::media_parts;
use crate::dialect::text::{shorten, TRANSCRIPT_MESSAGE_CHARS, TRANSCRIPT_RESULT_CHARS};
use crate::dialect::{AnswerError, SummaryRequest};

/// Anthropic's error body: `{"type":"error","error":{"type","message"}}`.
pub fn error_body(kind: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

/// Anthropic's error type for an HTTP status.
pub fn error_kind(status: u16) -> &'static str {
    match status {
        400 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        504 => "timeout_error",
        529 => "overloaded_error",
        _ => "api_error",
    }
}

/// The message a client sees when its prompt cannot be made to fit. Worded like Anthropic's own
/// overflow error, so that clients which recognise that one (Claude Code does) react to it.
pub fn too_long_message(needed: u64, window: u64) -> String {
    format!("prompt is too long: {needed} tokens > {window} maximum")
}

/// The summary as one user message in Messages form.
pub fn summary_message(text: &str) -> Value {
    json!({"role": "user", "content": [{"type": "text", "text": text}]})
}

/// A summary request to a Messages provider: the summarizer's prompt as `system`, the user turn
/// the core wrote, no tools, not streamed.
pub fn summary_request(model: &str, system: &str, user: &str, max_tokens: u64) -> Value {
    json!({
        "model": model,
        "system": system,
        "messages": [{"role": "user", "content": user}],
        "max_tokens": max_tokens,
        "temperature": 0.2,
        "stream": false,
    })
}

/// Cache breakpoints Anthropic accepts in one request.
const MAX_CACHE_BREAKPOINTS: usize = 4;

/// A summary request that continues the conversation ([`SummaryRequest::continuation`]). The
/// instructions carry a cache breakpoint, so the provider reads the conversation before them
/// from its cache (it looks back from a breakpoint for the entries earlier requests wrote),
/// unless the conversation already holds as many breakpoints as a request may. A tool choice
/// that forces a tool is dropped (the answer must be text); any other stays, since changing it
/// would invalidate the cached messages, and so do the thinking settings. With extended
/// thinking on, its budget is added to the output budget, which must exceed it; with adaptive
/// thinking, whose length the model decides, the output budget is the client's own when larger
/// (the summary's length is asked in words).
pub fn continuation_request(request: &SummaryRequest<'_>) -> Option<Value> {
    let conversation = request.conversation?;
    let breakpoints = memchr::memmem::find_iter(conversation, b"\"cache_control\"").count();
    let mut block = json!({"type": "text", "text": request.user});
    if breakpoints < MAX_CACHE_BREAKPOINTS {
        block["cache_control"] = json!({"type": "ephemeral"});
    }
    let message = json!({"role": "user", "content": [block]});
    let (mut body, asked) = request.continuation(
        "messages",
        message,
        &["max_tokens"],
        &["context_management"],
    )?;
    let forced = body
        .pointer("/tool_choice/type")
        .and_then(Value::as_str)
        .is_some_and(|kind| matches!(kind, "any" | "tool"));
    if forced {
        body.as_object_mut()?.remove("tool_choice");
    }
    let thinking = body.get("thinking").cloned().unwrap_or(Value::Null);
    match thinking.get("type").and_then(Value::as_str) {
        Some("enabled") => {
            let budget = thinking["budget_tokens"].as_u64().unwrap_or(0);
            body["max_tokens"] = budget.saturating_add(request.max_tokens).into();
        }
        Some("adaptive") => {
            body["max_tokens"] = asked.unwrap_or(0).max(request.max_tokens).into();
        }
        _ => {}
    }
    Some(body)
}

/// The text of a non-streamed Messages response.
pub fn read_answer(body: &[u8]) -> Result<String, AnswerError> {
    let value: Value = serde_json::from_slice(body).map_err(|_| AnswerError::Malformed)?;
    let content = value
        .get("content")
        .and_then(Value::as_array)
        .ok_or(AnswerError::Malformed)?;
    let text: String = content
        .iter()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("\n");
    let text = text.trim();
    if text.is_empty() {
        return Err(AnswerError::Empty);
    }
    // Cut off early, before anything useful was said: refused; a long cut-off summary is kept.
    let stop = value.get("stop_reason").and_then(Value::as_str);
    if stop == Some("max_tokens") && text.len() < 200 {
        return Err(AnswerError::Truncated);
    }
    Ok(text.to_string())
}

/// The prompt size a Messages `usage` object reports: what was read fresh plus what came from
/// or went into the provider's cache (llama.cpp too splits its count this way).
pub fn prompt_tokens(usage: &Value) -> Option<u64> {
    let field = |name: &str| usage.get(name).and_then(Value::as_u64);
    let input = field("input_tokens")?;
    Some(
        input
            .saturating_add(field("cache_creation_input_tokens").unwrap_or(0))
            .saturating_add(field("cache_read_input_tokens").unwrap_or(0)),
    )
}

/// One message rendered for the summarizer's transcript; `call_name` names the tool of a
/// `tool_use` id. Media appear as placeholders that name them, never as their bytes.
pub fn transcript_entry(message: &Message, call_name: &dyn Fn(&str) -> Option<String>) -> String {
    let role = match message.role {
        Author::User => "user",
        Author::Assistant => "assistant",
        Author::System => "system",
    };
    let mut entry = String::new();
    for block in message.blocks() {
        let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
        let str_of = |field: &str| block.get(field).and_then(Value::as_str).unwrap_or("");
        match kind {
            "text" => {
                let text = shorten(str_of("text"), TRANSCRIPT_MESSAGE_CHARS);
                entry.push_str(&format!("[{role}]\n{text}\n"));
            }
            "tool_use" | "server_tool_use" | "mcp_tool_use" => {
                let input = block.get("input").map(Value::to_string).unwrap_or_default();
                let input = shorten(&input, TRANSCRIPT_RESULT_CHARS);
                entry.push_str(&format!(
                    "[assistant calls {} ({})]\n{input}\n",
                    str_of("name"),
                    str_of("id")
                ));
            }
            "image" | "document" => {
                let media = media_parts::read(block, Billing::Anthropic);
                entry.push_str(&format!("[{role} attached {}]\n", media.describe()));
            }
            "tool_result" | "mcp_tool_result" => {
                let text = shorten(&result_text(block), TRANSCRIPT_RESULT_CHARS);
                let error = if block.get("is_error") == Some(&Value::Bool(true)) {
                    " (error)"
                } else {
                    ""
                };
                let id = str_of("tool_use_id");
                entry.push_str(&format!("[tool result {id}{error}]\n{text}\n"));
                let name = call_name(id);
                for media in media_parts::find(block, Billing::Anthropic) {
                    entry.push_str(&media::returned_by(&media, name.as_deref(), id));
                }
            }
            // Earlier turns' reasoning is not needed to continue, and may be unreadable.
            "thinking" | "redacted_thinking" => {}
            "compaction" => {
                let text = shorten(str_of("content"), TRANSCRIPT_MESSAGE_CHARS);
                entry.push_str(&format!("[earlier summary]\n{text}\n"));
            }
            other => {
                entry.push_str(&format!("[{role} attached {other}]\n"));
                for media in media_parts::find(block, Billing::Anthropic) {
                    entry.push_str(&format!("[{role} attached {}]\n", media.describe()));
                }
            }
        }
    }
    entry
}

/// The text inside a tool result: a string, or its text blocks (its media are listed after it).
fn result_text(block: &Value) -> String {
    match block.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter(|p| !media_parts::is_media(p))
            .map(|p| match p.get("type").and_then(Value::as_str) {
                Some("text") => p.get("text").and_then(Value::as_str).unwrap_or("").into(),
                Some(other) => format!("[{other}]"),
                None => String::new(),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}
