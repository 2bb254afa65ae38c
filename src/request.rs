//! The chat request as it arrived: top-level fields kept as raw JSON in their original order
//! (unknown fields survive untouched), plus a typed view of what compaction needs.
//!
//! Messages and `tools` are never re-serialized: the rewritten body splices their original bytes,
//! so what the client sent reaches the provider byte for byte.

use indexmap::IndexMap;
use serde::Deserialize;
use serde_json::value::RawValue;

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
}

impl RequestError {
    /// The request parameter the error is about, for the OpenAI error's `param`.
    pub fn param(&self) -> Option<String> {
        match self {
            RequestError::Missing(f) => Some((*f).to_string()),
            RequestError::Type { field, .. } => Some((*field).to_string()),
            RequestError::Message { index, .. } => Some(format!("messages[{index}]")),
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

/// One message: its original bytes and the parts of it compaction reads.
#[derive(Debug, Clone)]
pub struct Message {
    pub raw: Box<RawValue>,
    pub role: Role,
    /// Text of the content (string content, or the text parts joined by newlines).
    pub text: String,
    /// Number of image (or other non-text media) parts.
    pub media_parts: usize,
    pub name: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    pub tool_call_id: Option<String>,
}

/// A parsed `POST /chat/completions` body.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    /// Top-level fields in arrival order, values untouched.
    fields: IndexMap<String, Box<RawValue>>,
    pub model: String,
    pub messages: Vec<Message>,
    pub stream: bool,
    /// `max_completion_tokens`, else `max_tokens`.
    pub max_output_tokens: Option<u64>,
    /// Whether the client itself asked for `stream_options.include_usage`.
    pub client_wants_usage: bool,
}

#[derive(Deserialize)]
struct RawMessage<'a> {
    #[serde(borrow)]
    role: Option<&'a RawValue>,
    #[serde(default)]
    content: Option<serde_json::Value>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<RawToolCall>>,
    #[serde(default)]
    tool_call_id: Option<String>,
}

#[derive(Deserialize)]
struct RawToolCall {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<RawFunction>,
}

#[derive(Deserialize)]
struct RawFunction {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<serde_json::Value>,
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
        // Validate syntax first so errors name a line and column even for non-objects.
        let fields: IndexMap<String, Box<RawValue>> = match serde_json::from_slice(body) {
            Ok(f) => f,
            Err(e) if e.is_data() => {
                serde_json::from_slice::<serde::de::IgnoredAny>(body).map_err(json_error)?;
                return Err(RequestError::NotObject);
            }
            Err(e) => return Err(json_error(e)),
        };
        let model = match fields.get("model") {
            None => return Err(RequestError::Missing("model")),
            Some(raw) => {
                serde_json::from_str::<String>(raw.get()).map_err(|_| RequestError::Type {
                    field: "model",
                    expected: "a string",
                })?
            }
        };
        let raw_messages = match fields.get("messages") {
            None => return Err(RequestError::Missing("messages")),
            Some(raw) => serde_json::from_str::<Vec<Box<RawValue>>>(raw.get()).map_err(|_| {
                RequestError::Type {
                    field: "messages",
                    expected: "an array",
                }
            })?,
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
            model,
            stream: bool_field("stream"),
            max_output_tokens: number_field("max_completion_tokens")
                .or_else(|| number_field("max_tokens")),
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
    pub fn parse(raw: Box<RawValue>) -> Result<Message, String> {
        let parsed: RawMessage = serde_json::from_str(raw.get()).map_err(|e| {
            let s = e.to_string();
            if s.contains("invalid type: ") && !raw.get().trim_start().starts_with('{') {
                "expected an object".to_string()
            } else {
                s
            }
        })?;
        let role = match parsed.role {
            None => return Err("missing 'role'".into()),
            Some(r) => serde_json::from_str::<String>(r.get())
                .map_err(|_| "'role' must be a string".to_string())?,
        };
        let mut text = String::new();
        let mut media_parts = 0;
        match &parsed.content {
            Some(serde_json::Value::String(s)) => text.push_str(s),
            Some(serde_json::Value::Array(parts)) => {
                for part in parts {
                    if let Some(t) = part.get("text").and_then(|t| t.as_str()) {
                        if !text.is_empty() {
                            text.push('\n');
                        }
                        text.push_str(t);
                    } else if part.is_object() {
                        media_parts += 1;
                    }
                }
            }
            _ => {}
        }
        let tool_calls = parsed
            .tool_calls
            .unwrap_or_default()
            .into_iter()
            .map(|c| {
                let function = c.function.unwrap_or(RawFunction {
                    name: None,
                    arguments: None,
                });
                ToolCall {
                    id: c.id.unwrap_or_default(),
                    name: function.name.unwrap_or_default(),
                    arguments: match function.arguments {
                        Some(serde_json::Value::String(s)) => s,
                        Some(other) => other.to_string(),
                        None => String::new(),
                    },
                }
            })
            .collect();
        Ok(Message {
            role: Role::parse(&role),
            text,
            media_parts,
            name: parsed.name,
            tool_calls,
            tool_call_id: parsed.tool_call_id,
            raw,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_unknown_fields_and_bytes() {
        let body = br#"{"model":"gpt-4o","zeta":{"b":1,"a":[1.50,2]},"messages":[{"role":"user","content":"hi",  "x":1}],"stream":true}"#;
        let req = ChatRequest::parse(body).unwrap();
        assert!(req.stream);
        assert_eq!(req.original_body(false), body.to_vec());
    }

    #[test]
    fn forcing_usage_adds_or_merges_stream_options() {
        let req = ChatRequest::parse(br#"{"model":"m","messages":[],"stream":true}"#).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&req.original_body(true)).unwrap();
        assert_eq!(v["stream_options"]["include_usage"], true);
        let req = ChatRequest::parse(
            br#"{"model":"m","messages":[],"stream_options":{"x":1,"include_usage":false}}"#,
        )
        .unwrap();
        assert!(!req.client_wants_usage);
        let v: serde_json::Value = serde_json::from_slice(&req.original_body(true)).unwrap();
        assert_eq!(
            v["stream_options"],
            serde_json::json!({"x":1,"include_usage":true})
        );
    }

    #[test]
    fn reports_position_of_syntax_errors() {
        let err = ChatRequest::parse(b"{\n  \"model\": \"x\",\n  oops\n}").unwrap_err();
        match err {
            RequestError::Json { line, column, .. } => assert_eq!((line, column), (3, 3)),
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(
            ChatRequest::parse(b"[1]").unwrap_err(),
            RequestError::NotObject
        );
    }

    #[test]
    fn validates_required_fields() {
        assert_eq!(
            ChatRequest::parse(br#"{"messages":[]}"#).unwrap_err(),
            RequestError::Missing("model")
        );
        assert_eq!(
            ChatRequest::parse(br#"{"model":"m"}"#).unwrap_err(),
            RequestError::Missing("messages")
        );
        assert!(matches!(
            ChatRequest::parse(br#"{"model":"m","messages":{}}"#).unwrap_err(),
            RequestError::Type {
                field: "messages",
                ..
            }
        ));
        assert!(matches!(
            ChatRequest::parse(br#"{"model":"m","messages":[3]}"#).unwrap_err(),
            RequestError::Message { index: 0, .. }
        ));
    }

    #[test]
    fn reads_tool_calls_and_parts() {
        let req = ChatRequest::parse(
            br#"{"model":"m","max_tokens":50,"messages":[
              {"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"x"}}]},
              {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"read","arguments":"{\"path\":\"a.rs\"}"}}]},
              {"role":"tool","tool_call_id":"c1","content":"fn main"}]}"#,
        )
        .unwrap();
        assert_eq!(req.max_output_tokens, Some(50));
        assert_eq!(req.messages[0].media_parts, 1);
        assert_eq!(req.messages[1].tool_calls[0].name, "read");
        assert_eq!(req.messages[2].role, Role::Tool);
        assert_eq!(req.messages[2].tool_call_id.as_deref(), Some("c1"));
    }
}
