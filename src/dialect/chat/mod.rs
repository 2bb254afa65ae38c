//! Chat completions (`POST /v1/chat/completions`): the first dialect, and the reference for
//! writing others.
//!
//! Elements are the `messages`; system and developer messages are instructions (pinned
//! wherever they stand); `tools` (and legacy `functions`) are the rest of the head. Errors are
//! OpenAI's `{"error": {"message", "type", "param", "code"}}`.
//!
//! [`request`] parses a body (each message's content read on first use by [`view`]),
//! [`count`] prices a message as OpenAI does, [`transcript`] writes it for the summarizer and
//! reads summary answers, [`render`] writes the request through a checkpoint; this file ties
//! them to the seam's two traits.

pub mod count;
pub mod edits;
pub mod render;
pub mod request;
pub mod transcript;
pub mod view;

use bytes::Bytes;
use serde_json::json;

use crate::dialect::event_fields;
use crate::dialect::media::{Billing, MediaCost};
use crate::dialect::overflow::{self, Overflow};
use crate::dialect::{
    AnswerError, CallSettings, Clearable, Clearing, ClientError, Dialect, MessageView,
    RequestError, Role, SummaryRequest, Through, Usage, WireRequest,
};
use crate::identity::{self, Hash};
use crate::tokenizer::{Cancel, Encoding, TOKENS_FOR_TOOLS};

use count::{count_message, count_message_until};
use request::{ChatRequest, Message};

/// The chat completions dialect.
#[derive(Debug, Clone, Copy, Default)]
pub struct Chat;

impl Dialect for Chat {
    fn name(&self) -> &'static str {
        "chat"
    }

    fn parse(&self, body: &Bytes) -> Result<Box<dyn WireRequest>, RequestError> {
        Ok(Box::new(ChatRequest::parse_shared(body)?))
    }

    fn overflow(&self, status: u16, body: &[u8]) -> Option<Overflow> {
        overflow::classify(status, body)
    }

    /// Some OpenAI-compatible servers answer 200 and then send the error as the first SSE
    /// event: `data: {"error": {...}}`.
    fn overflow_in_stream(&self, head: &[u8]) -> Option<Overflow> {
        let text = std::str::from_utf8(head).ok()?;
        let payload = text
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty() && !l.starts_with(':'))?
            .strip_prefix("data:")?
            .trim();
        crate::dialect::event_fields::has_error(payload).then_some(())?;
        overflow::classify(400, payload.as_bytes())
    }

    fn error_body(&self, error: &ClientError) -> serde_json::Value {
        crate::dialect::openai_error_body(error)
    }

    fn summary_path(&self) -> &'static str {
        "/chat/completions"
    }

    fn summary_request(&self, request: &SummaryRequest<'_>) -> serde_json::Value {
        let continued = request.continuation(
            "messages",
            json!({"role": "user", "content": request.user}),
            &["max_completion_tokens", "max_tokens"],
            // Asked whole, with one answer, no forced tool and no structured format.
            &["stream_options", "n", "response_format", "tool_choice"],
        );
        if let Some((body, _)) = continued {
            return body;
        }
        json!({
            "model": request.model,
            "messages": [
                {"role": "system", "content": request.system},
                {"role": "user", "content": request.user},
            ],
            "max_tokens": request.max_tokens,
            "temperature": 0.2,
            "stream": false,
        })
    }

    fn summary_answer(&self, body: &[u8]) -> Result<String, AnswerError> {
        transcript::read_answer(body)
    }

    /// `usage` (`prompt_tokens`, `completion_tokens`, `prompt_tokens_details.cached_tokens`)
    /// and `model`; the rest of the answer is skipped ([`event_fields::answer_fields`]).
    fn reported_usage(&self, json: &[u8]) -> Option<Usage> {
        let [model, usage] = event_fields::answer_fields(json, ["model", "usage"])?;
        let usage: ChatUsage = event_fields::parsed(usage)?;
        Some(Usage {
            input_tokens: usage.prompt_tokens,
            output_tokens: usage.completion_tokens,
            cache_read_tokens: usage.prompt_tokens_details.and_then(|d| d.cached_tokens),
            cache_creation_tokens: None,
            model: event_fields::model_name(model)?,
        })
    }
}

#[derive(serde::Deserialize)]
struct ChatUsage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    prompt_tokens_details: Option<PromptDetails>,
}

#[derive(serde::Deserialize)]
struct PromptDetails {
    cached_tokens: Option<u64>,
}

impl WireRequest for ChatRequest {
    fn dialect(&self) -> &'static str {
        "chat"
    }

    fn settings(&self) -> &CallSettings {
        &self.settings
    }

    fn len(&self) -> usize {
        self.messages.len()
    }

    fn role(&self, index: usize) -> Role {
        self.messages[index].role
    }

    fn raw(&self, index: usize) -> &str {
        self.messages[index].raw.get()
    }

    fn counted(&self, index: usize) -> Option<&crate::dialect::seen::Counted> {
        self.messages.get(index).map(|element| &element.counted)
    }

    fn clearable(&self, encoding: Encoding, index: usize) -> Clearable {
        edits::clearable(&self.messages[index], encoding)
    }

    fn apply_clearing(&mut self, clearing: &Clearing) {
        self.client_body = None;
        edits::apply(&mut self.messages, clearing)
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

    fn canonical(&self, index: usize) -> Hash {
        identity::canonical_hash(&self.messages[index].raw)
    }

    fn transcript(&self, index: usize) -> String {
        let message = &self.messages[index];
        let call = (!message.view().media.is_empty())
            .then(|| self.call_name(index))
            .flatten();
        transcript::transcript_entry(message, call.as_deref())
    }

    fn tokens(&self, encoding: Encoding, index: usize) -> u64 {
        count_message(encoding, &self.messages[index])
    }

    fn tokens_until(&self, encoding: Encoding, index: usize, cancel: &Cancel) -> Option<u64> {
        count_message_until(encoding, &self.messages[index], cancel)
    }

    fn view(&self, index: usize) -> MessageView {
        self.messages[index].view().clone()
    }

    fn media_cost(&self, index: usize) -> MediaCost {
        MediaCost::of(&self.messages[index].view().media)
    }

    fn media_rules_apply(&self) -> bool {
        Billing::OpenAi.applies_to(self.model())
    }

    fn head_tokens(&self, encoding: Encoding) -> u64 {
        self.tools_raw()
            .map(|raw| encoding.count(raw) + TOKENS_FOR_TOOLS)
            .sum()
    }

    fn head_parts(&self) -> Vec<&str> {
        self.tools_raw().collect()
    }

    fn summary_tokens(&self, encoding: Encoding, text: &str) -> u64 {
        Message::parse(render::summary_message(text))
            .map(|m| count_message(encoding, &m))
            .unwrap_or(0)
    }

    fn ask_for_usage(&mut self) -> bool {
        self.asks_for_usage = self.settings.stream && !self.client_wants_usage;
        self.asks_for_usage
    }

    fn original_body(&self) -> Bytes {
        match &self.client_body {
            Some(body) if !self.asks_for_usage => body.clone(),
            _ => Bytes::from(ChatRequest::original_body(self, self.asks_for_usage)),
        }
    }

    fn render(&self, through: &Through<'_>) -> Vec<u8> {
        let messages = render::messages_through(self, through);
        self.to_body(messages.iter().map(|m| &**m), self.asks_for_usage)
    }
}

impl ChatRequest {
    /// The name of the tool call that the tool message at `index` answers, from the assistant
    /// message before it that made the call.
    fn call_name(&self, index: usize) -> Option<String> {
        let id = self.messages[index].view().tool_call_id.as_deref()?;
        self.messages[..index].iter().rev().find_map(|m| {
            let view = m.view();
            let call = view.tool_calls.iter().find(|c| c.id == id)?;
            Some(call.name.clone())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_usage_and_model_of_answers_and_chunks() {
        let whole = br#"{"id":"c","model":"gpt-x","choices":[{"message":{"content":"\"usage\":{\"prompt_tokens\":1}"}}],
            "usage":{"prompt_tokens":900,"completion_tokens":12,"prompt_tokens_details":{"cached_tokens":640}}}"#;
        let usage = Chat.reported_usage(whole).unwrap();
        assert_eq!(usage.input_tokens, Some(900));
        assert_eq!(usage.output_tokens, Some(12));
        assert_eq!(usage.cache_read_tokens, Some(640));
        assert_eq!(usage.model.as_deref(), Some("gpt-x"));
        // Every chunk but the last has no usage, or `null`.
        assert!(Chat
            .reported_usage(br#"{"choices":[{"delta":{"content":"usage"}}]}"#)
            .is_none());
        assert!(Chat
            .reported_usage(br#"{"choices":[],"usage":null}"#)
            .is_none());
        assert!(Chat
            .reported_usage(b"{\"usage\":{\"prompt_tokens\":7")
            .is_none());
        assert!(Chat.reported_usage(b"\xff\xfe").is_none());
    }

    #[test]
    fn writes_and_reads_summary_requests() {
        let body = Chat.summary_request(&SummaryRequest {
            model: "m",
            system: "sys",
            user: "transcript",
            max_tokens: 500,
            conversation: None,
        });
        assert_eq!(body["messages"][0]["content"], "sys");
        assert_eq!(body["messages"][1]["content"], "transcript");
        assert_eq!(body["max_tokens"], 500);
        assert_eq!(
            Chat.summary_answer(br###"{"choices":[{"message":{"content":"## Goal\nx"}}]}"###)
                .unwrap(),
            "## Goal\nx"
        );
    }

    #[test]
    fn a_continuation_is_the_conversation_then_the_instructions_asked_whole() {
        let conversation = br#"{"model":"m","stream":true,"stream_options":{"include_usage":true},
            "max_completion_tokens":32000,"tool_choice":"required","temperature":0.7,
            "tools":[{"type":"function","function":{"name":"read"}}],
            "messages":[{"role":"system","content":"rules"},{"role":"user","content":"hi"},
                        {"role":"assistant","content":"hello"}]}"#;
        let body = Chat.summary_request(&SummaryRequest {
            model: "m",
            system: "unused",
            user: "summarize it",
            max_tokens: 700,
            conversation: Some(conversation),
        });
        let sent: serde_json::Value = serde_json::from_slice(conversation).unwrap();
        let messages = body["messages"].as_array().unwrap();
        assert_eq!(messages[..3], sent["messages"].as_array().unwrap()[..]);
        assert_eq!(
            messages[3],
            json!({"role": "user", "content": "summarize it"})
        );
        assert_eq!(body["tools"], sent["tools"], "tools as sent");
        assert_eq!(body["temperature"], 0.7, "the client's settings stay");
        // The client's budget field, with the summary's budget; whole, no forced tool.
        assert_eq!(body["max_completion_tokens"], 700);
        assert!(body.get("max_tokens").is_none());
        assert_eq!(body["stream"], false);
        assert!(body.get("stream_options").is_none() && body.get("tool_choice").is_none());
        // Not a conversation body: the standalone request.
        let standalone = Chat.summary_request(&SummaryRequest {
            model: "m",
            system: "sys",
            user: "transcript",
            max_tokens: 500,
            conversation: Some(b"[1]"),
        });
        assert_eq!(standalone["messages"][0]["content"], "sys");
    }

    #[test]
    fn recognises_an_overflow_sent_as_the_first_stream_event() {
        let head = b"data: {\"error\":{\"message\":\"This model's maximum context length is 8192 tokens.\",\"code\":\"context_length_exceeded\"}}\n\n";
        assert_eq!(Chat.overflow_in_stream(head).unwrap().limit, Some(8192));
        let normal = b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n";
        assert_eq!(Chat.overflow_in_stream(normal), None);
        assert_eq!(Chat.overflow(429, b"too many tokens"), None);
    }

    #[test]
    fn errors_are_in_the_openai_shape() {
        let body = Chat.error_body(&ClientError {
            status: 400,
            kind: "invalid_request_error",
            code: Some("context_length_exceeded"),
            param: Some("messages".into()),
            message: "too long".into(),
        });
        assert_eq!(body["error"]["code"], "context_length_exceeded");
        assert_eq!(body["error"]["param"], "messages");
    }

    #[test]
    fn elements_are_the_messages() {
        let request = Chat
            .parse(&Bytes::from_static(br#"{"model":"m","tools":[{"type":"function","function":{"name":"read"}}],"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}"#))
            .unwrap();
        assert_eq!(request.len(), 2);
        assert_eq!(request.role(0), Role::System);
        assert_eq!(request.raw(1), r#"{"role":"user","content":"hi"}"#);
        assert!(request.head_tokens(Encoding::O200k) > TOKENS_FOR_TOOLS);
        assert_eq!(request.transcript(1), "[user]\nhi\n");
    }
}
