//! OpenAI Responses (`POST /v1/responses`): Codex and the SDKs' `responses.*`.
//!
//! Elements are the `input` items ([`items`]); the pinned head is `instructions`, `tools` and the
//! developer/system messages. A reasoning item, the calls it precedes and all their outputs form
//! one unit, so a cut never leaves a provider an output without its call or a reasoning item
//! without what follows it. The summary goes in as one user message item. Overflows arrive as an
//! HTTP 400 with `code: "context_length_exceeded"` (or llama.cpp's body) or as a
//! `response.failed` event before any output item. Errors are OpenAI's shape.
//!
//! Compaction requested by the client (`/responses/compact`, an `input` ending in
//! `compaction_trigger`) is answered with a `compaction` item whose content is a [`sealed`]
//! reference to a checkpoint; [`answers`] writes those replies. [`context`] reads the request's
//! own `context_management` threshold and puts such an item first in an answer's output.

pub mod answers;
pub mod context;
pub mod edits;
pub mod items;
pub mod request;
pub mod sealed;

use bytes::Bytes;
use serde_json::{json, Value};

use crate::dialect::event_fields;
use crate::dialect::overflow::{self, Overflow};

use super::{AnswerError, ClientError, Dialect, RequestError, SummaryRequest, Usage, WireRequest};
pub use request::ResponsesRequest;

/// The Responses dialect.
#[derive(Debug, Clone, Copy, Default)]
pub struct Responses;

/// Whether a request body relies on state the provider holds (`previous_response_id`,
/// `conversation`): its history is not all in the body, so the proxy cannot compact it.
pub fn uses_server_state(body: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct ServerState {
        previous_response_id: Option<serde::de::IgnoredAny>,
        conversation: Option<serde::de::IgnoredAny>,
    }
    // Only an object can hold them (serde would read an array as the fields in order).
    let is_object = body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    is_object
        && serde_json::from_slice::<ServerState>(body)
            .is_ok_and(|s| s.previous_response_id.is_some() || s.conversation.is_some())
}

impl Dialect for Responses {
    fn name(&self) -> &'static str {
        "responses"
    }

    fn parse(&self, body: &Bytes) -> Result<Box<dyn WireRequest>, RequestError> {
        Ok(Box::new(ResponsesRequest::parse_shared(body)?))
    }

    fn overflow(&self, status: u16, body: &[u8]) -> Option<Overflow> {
        overflow::classify(status, body)
    }

    /// A stream that fails before any output: `response.failed` (or an `error` event) whose error
    /// says the context is full, before any `response.output_item.added`.
    fn overflow_in_stream(&self, head: &[u8]) -> Option<Overflow> {
        let text = String::from_utf8_lossy(head);
        for line in text.lines() {
            let Some(data) = line.strip_prefix("data:") else {
                continue;
            };
            let data = data.trim();
            // Most events open or carry the answer: only an error is parsed whole.
            let failed = match crate::dialect::event_fields::event_type(data).as_deref() {
                Some("response.failed") => true,
                Some("error") => false,
                Some(kind) if kind.starts_with("response.output") => return None,
                _ => continue,
            };
            let Ok(event) = serde_json::from_str::<Value>(data) else {
                continue;
            };
            let error = if failed {
                event.pointer("/response/error")?.clone()
            } else {
                event.get("error").cloned().unwrap_or(event.clone())
            };
            return overflow::classify(400, json!({ "error": error }).to_string().as_bytes());
        }
        None
    }

    /// Undecided while every complete event so far only opens the response
    /// (`response.created`, `response.in_progress`).
    fn stream_head_undecided(&self, head: &[u8]) -> bool {
        let text = String::from_utf8_lossy(head);
        let mut opening_only = true;
        for line in text.lines() {
            let Some(kind) = line.strip_prefix("event:").map(str::trim) else {
                continue;
            };
            opening_only &= matches!(kind, "response.created" | "response.in_progress");
        }
        opening_only
    }

    /// `usage` (`input_tokens`, `output_tokens`, `input_tokens_details.cached_tokens`) and
    /// `model` of a response, or of the response a `response.completed` event carries.
    fn reported_usage(&self, json: &[u8]) -> Option<Usage> {
        let [response, usage, model] =
            event_fields::answer_fields(json, ["response", "usage", "model"])?;
        let [usage, model] = match response {
            Some(response) => event_fields::answer_fields(response.as_bytes(), ["usage", "model"])?,
            None => [usage, model],
        };
        let usage: Value = event_fields::parsed(usage).filter(Value::is_object)?;
        let count = |pointer: &str| usage.pointer(pointer).and_then(Value::as_u64);
        Some(Usage {
            input_tokens: count("/input_tokens"),
            output_tokens: count("/output_tokens"),
            cache_read_tokens: count("/input_tokens_details/cached_tokens"),
            cache_creation_tokens: None,
            model: event_fields::parsed(model),
        })
    }

    /// OpenAI's error shape, as for chat completions.
    fn error_body(&self, error: &ClientError) -> Value {
        super::openai_error_body(error)
    }

    fn summary_path(&self) -> &'static str {
        "/responses"
    }

    fn summary_request(&self, request: &SummaryRequest<'_>) -> Value {
        let continued = request.continuation(
            "input",
            json!({"type": "message", "role": "user",
                   "content": [{"type": "input_text", "text": request.user}]}),
            &["max_output_tokens"],
            // Asked whole and not stored, with no forced tool, no structured format and no
            // compaction of its own by the provider.
            &[
                "stream_options",
                "tool_choice",
                "text",
                "context_management",
                "previous_response_id",
                "background",
            ],
        );
        if let Some((mut body, _)) = continued {
            body["store"] = false.into();
            return body;
        }
        json!({
            "model": request.model,
            "instructions": request.system,
            "input": [{"type": "message", "role": "user",
                       "content": [{"type": "input_text", "text": request.user}]}],
            "max_output_tokens": request.max_tokens,
            "temperature": 0.2,
            "stream": false,
            "store": false,
        })
    }

    fn summary_answer(&self, body: &[u8]) -> Result<String, AnswerError> {
        let value: Value = serde_json::from_slice(body).map_err(|_| AnswerError::Malformed)?;
        let output = value
            .get("output")
            .and_then(Value::as_array)
            .ok_or(AnswerError::Malformed)?;
        let text: String = output
            .iter()
            .filter(|item| item.get("type").and_then(Value::as_str) == Some("message"))
            .flat_map(|item| {
                item.get("content")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
            })
            .filter_map(|part| part.get("text").and_then(Value::as_str))
            .collect();
        let text = text.trim();
        if text.is_empty() {
            return Err(AnswerError::Empty);
        }
        // As for chat: a summary cut off after its first sections is kept, a stub is not.
        let cut_off = value.get("status").and_then(Value::as_str) == Some("incomplete");
        if cut_off && text.len() < 200 {
            return Err(AnswerError::Truncated);
        }
        Ok(text.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_usage_of_answers_and_of_completed_events() {
        let event = br#"{"type":"response.completed","sequence_number":9,"response":{"id":"r","model":"gpt-y",
            "output":[{"type":"message","content":[{"type":"output_text","text":"usage"}]}],
            "usage":{"input_tokens":321,"output_tokens":4,"input_tokens_details":{"cached_tokens":256}}}}"#;
        let usage = Responses.reported_usage(event).unwrap();
        assert_eq!(usage.input_tokens, Some(321));
        assert_eq!(usage.cache_read_tokens, Some(256));
        assert_eq!(usage.model.as_deref(), Some("gpt-y"));
        let whole = br#"{"id":"r","model":"gpt-z","usage":{"input_tokens":5,"output_tokens":1}}"#;
        assert_eq!(
            Responses.reported_usage(whole).unwrap().input_tokens,
            Some(5)
        );
        assert!(Responses
            .reported_usage(br#"{"type":"response.created","response":{"usage":null}}"#)
            .is_none());
        assert!(Responses
            .reported_usage(br#"{"type":"response.output_text.delta","delta":"x"}"#)
            .is_none());
    }

    #[test]
    fn a_failed_response_before_any_output_is_an_overflow() {
        let failed = b"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{}}\n\nevent: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"error\":{\"code\":\"context_length_exceeded\",\"message\":\"Your input exceeds the context window of this model.\"}}}\n\n";
        assert!(Responses.overflow_in_stream(failed).is_some());
        let other = b"data: {\"type\":\"response.failed\",\"response\":{\"error\":{\"code\":\"server_error\",\"message\":\"boom\"}}}\n\n";
        assert_eq!(Responses.overflow_in_stream(other), None);
        let output = b"data: {\"type\":\"response.output_item.added\",\"item\":{}}\n\ndata: {\"type\":\"response.failed\",\"response\":{\"error\":{\"code\":\"context_length_exceeded\",\"message\":\"x\"}}}\n\n";
        assert_eq!(Responses.overflow_in_stream(output), None);
    }

    #[test]
    fn llama_cpp_and_openai_error_bodies_are_overflows() {
        let llama = br#"{"error":{"code":400,"message":"request (5000 tokens) exceeds the available context size (4096 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":5000,"n_ctx":4096}}"#;
        assert_eq!(Responses.overflow(400, llama).unwrap().limit, Some(4096));
        let openai = br#"{"error":{"message":"Your input exceeds the context window of this model.","type":"invalid_request_error","param":"input","code":"context_length_exceeded"}}"#;
        assert!(Responses.overflow(400, openai).is_some());
        assert_eq!(Responses.overflow(429, openai), None);
    }

    #[test]
    fn writes_and_reads_summary_requests() {
        let body = Responses.summary_request(&SummaryRequest {
            model: "m",
            system: "sys",
            user: "transcript",
            max_tokens: 300,
            conversation: None,
        });
        assert_eq!(body["instructions"], "sys");
        assert_eq!(body["input"][0]["content"][0]["text"], "transcript");
        assert_eq!(body["max_output_tokens"], 300);
        assert!(body.get("prompt_cache_key").is_none());
        let conversation = br#"{"model":"m","stream":true,"store":true,"instructions":"rules",
            "prompt_cache_key":"k","tools":[],"tool_choice":"required","max_output_tokens":9000,
            "text":{"format":{"type":"json_schema"}},"input":[{"role":"user","content":"hi"}]}"#;
        let continued = Responses.summary_request(&SummaryRequest {
            model: "m",
            system: "unused",
            user: "summarize it",
            max_tokens: 300,
            conversation: Some(conversation),
        });
        assert_eq!(continued["instructions"], "rules");
        assert_eq!(
            continued["prompt_cache_key"], "k",
            "routed to the same cache"
        );
        assert_eq!(
            continued["input"][0],
            json!({"role": "user", "content": "hi"})
        );
        assert_eq!(continued["input"][1]["content"][0]["text"], "summarize it");
        assert_eq!(continued["max_output_tokens"], 300);
        assert_eq!(continued["stream"], false);
        assert_eq!(continued["store"], false);
        for dropped in ["tool_choice", "text"] {
            assert!(continued.get(dropped).is_none(), "{dropped}");
        }
        let answer = br###"{"output":[{"type":"reasoning","content":[{"type":"reasoning_text","text":"hm"}]},{"type":"message","content":[{"type":"output_text","text":"## Goal\nship it"}]}]}"###;
        assert_eq!(
            Responses.summary_answer(answer).unwrap(),
            "## Goal\nship it"
        );
    }
}
