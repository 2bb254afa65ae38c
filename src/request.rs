//! The chat request as it arrived: top-level fields kept as raw JSON in their original order
//! (unknown fields survive untouched), plus a typed view of what compaction needs.
//!
//! Messages and `tools` are never re-serialized: the rewritten body splices their original bytes,
//! so what the client sent reaches the provider byte for byte.

use std::borrow::Cow;
use std::sync::OnceLock;

use indexmap::IndexMap;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::dialect::CallSettings;

mod view;
pub use view::MessageView;

/// The largest output budget taken from a request (`max_tokens` and the like).
pub const MAX_OUTPUT_TOKENS: u64 = 1 << 32;

/// Why a body is not a chat request we can handle; each becomes a 400.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RequestError {
    #[error("request body is not valid JSON: {message} at line {line} column {column}")]
    Json {
        message: String,
        line: usize,
        column: usize,
    },
    #[error("request body must be a JSON object")]
    NotObject,
    #[error("missing required parameter: '{0}'")]
    Missing(&'static str),
    #[error("invalid type for '{field}': expected {expected}")]
    Type {
        field: &'static str,
        expected: &'static str,
    },
    #[error("invalid message at messages[{index}]: {reason}")]
    Message { index: usize, reason: String },
    #[error("invalid item at input[{index}]: {reason}")]
    Item { index: usize, reason: String },
}

impl RequestError {
    /// The request parameter the error is about, for the OpenAI error's `param`.
    pub fn param(&self) -> Option<String> {
        match self {
            RequestError::Missing(f) => Some((*f).to_string()),
            RequestError::Type { field, .. } => Some((*field).to_string()),
            RequestError::Message { index, .. } => Some(format!("messages[{index}]")),
            RequestError::Item { index, .. } => Some(format!("input[{index}]")),
            _ => None,
        }
    }
}

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    System,
    Developer,
    User,
    Assistant,
    Tool,
    /// Legacy `function` results and anything unknown: treated like a tool result.
    Other,
}

impl Role {
    fn parse(s: &str) -> Role {
        match s {
            "system" => Role::System,
            "developer" => Role::Developer,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" | "function" => Role::Tool,
            _ => Role::Other,
        }
    }

    /// System and developer messages are instructions: never summarized, never moved.
    pub fn is_instruction(self) -> bool {
        matches!(self, Role::System | Role::Developer)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::Developer => "developer",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
            Role::Other => "other",
        }
    }
}

/// A tool call made by an assistant message.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// One message: its original bytes, its role, and (read on first use) the rest of what
/// compaction looks at. Most requests only need roles and hashes: messages seen before are
/// never decoded again.
#[derive(Debug, Clone)]
pub struct Message {
    pub raw: Box<RawValue>,
    pub role: Role,
    view: OnceLock<MessageView>,
}

/// A parsed `POST /chat/completions` body.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    /// Top-level fields in arrival order, values untouched.
    fields: IndexMap<String, Box<RawValue>>,
    /// `max_output_tokens` is `max_completion_tokens`, else `max_tokens`.
    pub settings: CallSettings,
    pub messages: Vec<Message>,
    /// Whether the client itself asked for `stream_options.include_usage`.
    pub client_wants_usage: bool,
}

/// What every message is checked for when the request arrives.
#[derive(Deserialize)]
struct RawRole<'a> {
    #[serde(borrow)]
    role: Option<&'a RawValue>,
}

/// The body's top level: `messages` split into its elements, every other field kept raw (with
/// a placeholder marking where `messages` stood).
struct TopLevel {
    fields: IndexMap<String, Box<RawValue>>,
    messages: Option<Messages>,
}

enum Messages {
    Array(Vec<Box<RawValue>>),
    NotArray,
}

impl<'de> Deserialize<'de> for TopLevel {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TopVisitor;
        impl<'de> serde::de::Visitor<'de> for TopVisitor {
            type Value = TopLevel;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<TopLevel, A::Error> {
                let mut fields = IndexMap::new();
                let mut messages = None;
                while let Some(key) = map.next_key::<String>()? {
                    if key == "messages" {
                        messages = Some(map.next_value::<Messages>()?);
                        fields.insert(key, RawValue::NULL.to_owned());
                    } else {
                        fields.insert(key, map.next_value::<Box<RawValue>>()?);
                    }
                }
                Ok(TopLevel { fields, messages })
            }
        }
        deserializer.deserialize_map(TopVisitor)
    }
}

impl<'de> Deserialize<'de> for Messages {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MessagesVisitor;
        impl<'de> serde::de::Visitor<'de> for MessagesVisitor {
            type Value = Messages;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Messages, A::Error> {
                let mut list = Vec::with_capacity(seq.size_hint().unwrap_or(16));
                while let Some(message) = seq.next_element::<Box<RawValue>>()? {
                    list.push(message);
                }
                Ok(Messages::Array(list))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Messages, A::Error> {
                while map
                    .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(Messages::NotArray)
            }
            fn visit_bool<E>(self, _: bool) -> Result<Messages, E> {
                Ok(Messages::NotArray)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Messages, E> {
                Ok(Messages::NotArray)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Messages, E> {
                Ok(Messages::NotArray)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Messages, E> {
                Ok(Messages::NotArray)
            }
            fn visit_str<E>(self, _: &str) -> Result<Messages, E> {
                Ok(Messages::NotArray)
            }
            fn visit_unit<E>(self) -> Result<Messages, E> {
                Ok(Messages::NotArray)
            }
        }
        deserializer.deserialize_any(MessagesVisitor)
    }
}

impl RequestError {
    /// A body that is not JSON, with where it stops being JSON.
    pub fn from_json(e: serde_json::Error) -> RequestError {
        json_error(e)
    }
}

fn json_error(e: serde_json::Error) -> RequestError {
    let message = e.to_string();
    // serde_json appends " at line L column C"; the position is reported separately.
    let message = match message.rfind(" at line ") {
        Some(i) => message[..i].to_string(),
        None => message,
    };
    RequestError::Json {
        message,
        line: e.line(),
        column: e.column(),
    }
}

impl ChatRequest {
    pub fn parse(body: &[u8]) -> Result<ChatRequest, RequestError> {
        // One pass over the body: each message is copied out once, everything else is kept as
        // raw JSON. Syntax errors are reported with their line and column even for bodies that
        // are not objects.
        let top: TopLevel = match serde_json::from_slice(body) {
            Ok(top) => top,
            Err(e) if e.is_data() => {
                serde_json::from_slice::<serde::de::IgnoredAny>(body).map_err(json_error)?;
                return Err(RequestError::NotObject);
            }
            Err(e) => return Err(json_error(e)),
        };
        let fields = top.fields;
        let model = match fields.get("model") {
            None => return Err(RequestError::Missing("model")),
            Some(raw) => {
                serde_json::from_str::<String>(raw.get()).map_err(|_| RequestError::Type {
                    field: "model",
                    expected: "a string",
                })?
            }
        };
        let raw_messages = match top.messages {
            None => return Err(RequestError::Missing("messages")),
            Some(Messages::NotArray) => {
                return Err(RequestError::Type {
                    field: "messages",
                    expected: "an array",
                })
            }
            Some(Messages::Array(list)) => list,
        };
        let messages = raw_messages
            .into_iter()
            .enumerate()
            .map(|(index, raw)| {
                Message::parse(raw).map_err(|reason| RequestError::Message { index, reason })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let bool_field = |name: &str| {
            fields
                .get(name)
                .map(|r| r.get().trim() == "true")
                .unwrap_or(false)
        };
        let number_field = |name: &str| {
            fields
                .get(name)
                .and_then(|r| r.get().trim().parse::<u64>().ok())
        };
        let client_wants_usage = fields
            .get("stream_options")
            .and_then(|r| serde_json::from_str::<serde_json::Value>(r.get()).ok())
            .and_then(|v| v.get("include_usage").and_then(|b| b.as_bool()))
            .unwrap_or(false);
        Ok(ChatRequest {
            settings: CallSettings {
                model,
                stream: bool_field("stream"),
                // Bounded so budget arithmetic cannot wrap; no model writes more in one answer.
                max_output_tokens: number_field("max_completion_tokens")
                    .or_else(|| number_field("max_tokens"))
                    .map(|n| n.min(MAX_OUTPUT_TOKENS)),
            },
            client_wants_usage,
            messages,
            fields,
        })
    }

    /// The raw `tools` array (and legacy `functions`), if any.
    pub fn tools_raw(&self) -> impl Iterator<Item = &str> {
        ["tools", "functions"]
            .into_iter()
            .filter_map(|k| self.fields.get(k).map(|r| r.get()))
    }

    /// Serializes the request with `messages` replaced by `messages` (raw JSON values) and, when
    /// `force_usage` is set, `stream_options.include_usage` switched on. Every other field keeps
    /// its original bytes and position.
    pub fn to_body<'a>(
        &self,
        messages: impl IntoIterator<Item = &'a RawValue>,
        force_usage: bool,
    ) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.approx_len());
        out.push(b'{');
        let mut first = true;
        let mut wrote_stream_options = false;
        let mut messages = Some(messages);
        for (key, value) in &self.fields {
            if !first {
                out.push(b',');
            }
            first = false;
            write_key(&mut out, key);
            if key == "messages" {
                out.push(b'[');
                for (i, m) in messages.take().into_iter().flatten().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    out.extend_from_slice(m.get().as_bytes());
                }
                out.push(b']');
            } else if key == "stream_options" && force_usage {
                let mut opts = serde_json::from_str::<serde_json::Value>(value.get())
                    .ok()
                    .filter(|v| v.is_object())
                    .unwrap_or_else(|| serde_json::json!({}));
                opts["include_usage"] = serde_json::Value::Bool(true);
                out.extend_from_slice(opts.to_string().as_bytes());
                wrote_stream_options = true;
            } else {
                out.extend_from_slice(value.get().as_bytes());
            }
        }
        if force_usage && !wrote_stream_options {
            out.extend_from_slice(br#","stream_options":{"include_usage":true}"#);
        }
        out.push(b'}');
        out
    }

    /// The original request, re-serialized without changes to `messages`.
    pub fn original_body(&self, force_usage: bool) -> Vec<u8> {
        self.to_body(self.messages.iter().map(|m| &*m.raw), force_usage)
    }

    fn approx_len(&self) -> usize {
        self.fields
            .iter()
            .map(|(k, v)| k.len() + v.get().len() + 4)
            .sum()
    }
}

fn write_key(out: &mut Vec<u8>, key: &str) {
    // Keys came from valid JSON; re-escaping through serde keeps any escapes valid.
    out.extend_from_slice(serde_json::to_string(key).unwrap_or_default().as_bytes());
    out.push(b':');
}

impl Message {
    /// Checks that `raw` is a message object with a string role.
    pub fn parse(raw: Box<RawValue>) -> Result<Message, String> {
        if !raw.get().trim_start().starts_with('{') {
            return Err("expected an object".into());
        }
        let parsed: RawRole = serde_json::from_str(raw.get()).map_err(|e| e.to_string())?;
        let role = match parsed.role {
            None => return Err("missing 'role'".into()),
            Some(r) => serde_json::from_str::<Cow<str>>(r.get())
                .map_err(|_| "'role' must be a string".to_string())?,
        };
        Ok(Message {
            role: Role::parse(&role),
            raw,
            view: OnceLock::new(),
        })
    }

    /// Content, name and tool calls, decoded on first use.
    pub fn view(&self) -> &MessageView {
        self.view.get_or_init(|| MessageView::read(&self.raw))
    }
}

#[cfg(test)]
mod tests;
