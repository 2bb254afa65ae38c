//! A `POST /v1/messages` body as it arrived: top-level fields kept raw in their order (unknown
//! ones survive untouched), each message's original bytes, and what compaction reads from them.
//! Everything a client can get wrong is found here and reported as a [`RequestError`].

use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::dialect::splice::{self, Fields};
use crate::dialect::{CallSettings, RequestError};

/// Content block types the Messages API accepts in a request. Anything else is refused: a block
/// the proxy does not know could hide a pairing it would then break.
const KNOWN_BLOCKS: &[&str] = &[
    "text",
    "image",
    "document",
    "search_result",
    "tool_use",
    "tool_result",
    "server_tool_use",
    "web_search_tool_result",
    "web_fetch_tool_result",
    "code_execution_tool_result",
    "bash_code_execution_tool_result",
    "text_editor_code_execution_tool_result",
    "tool_search_tool_result",
    "mcp_tool_use",
    "mcp_tool_result",
    "container_upload",
    "thinking",
    "redacted_thinking",
    "compaction",
];

/// Who wrote a message. `System` messages inside `messages` (Claude Code's environment notes)
/// are legal on some providers and pinned by compaction, never summarized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Author {
    User,
    Assistant,
    System,
}

/// One message: original bytes and what compaction needs from it.
#[derive(Debug, Clone)]
pub struct Message {
    pub raw: Box<RawValue>,
    pub role: Author,
    /// The content as blocks (a string is one text block).
    pub blocks: Vec<Value>,
}

impl Message {
    /// A user message that carries tool results: it belongs to the assistant step before it.
    pub fn has_tool_results(&self) -> bool {
        self.block_types().any(|t| t == "tool_result")
    }

    pub fn has_thinking(&self) -> bool {
        self.block_types()
            .any(|t| t == "thinking" || t == "redacted_thinking")
    }

    /// A user message that starts a turn: one a kept tail may begin with.
    pub fn is_real_user(&self) -> bool {
        self.role == Author::User && !self.has_tool_results()
    }

    pub fn tool_use_ids(&self) -> impl Iterator<Item = &str> {
        self.blocks_of("tool_use")
            .chain(self.blocks_of("server_tool_use"))
            .chain(self.blocks_of("mcp_tool_use"))
            .filter_map(|b| b.get("id").and_then(Value::as_str))
    }

    fn block_types(&self) -> impl Iterator<Item = &str> {
        self.blocks
            .iter()
            .filter_map(|b| b.get("type").and_then(Value::as_str))
    }

    fn blocks_of<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Value> {
        self.blocks
            .iter()
            .filter(move |b| b.get("type").and_then(Value::as_str) == Some(kind))
    }
}

/// A parsed Messages request.
#[derive(Debug, Clone)]
pub struct MessagesRequest {
    /// Top-level fields in arrival order, values untouched (`messages` holds a placeholder).
    pub fields: Fields,
    /// `max_output_tokens` is the body's `max_tokens`.
    pub settings: CallSettings,
    pub messages: Vec<Message>,
    /// Extended thinking is on (`thinking.type` `enabled` or `adaptive`): the turn in progress
    /// must then reach the provider unmodified, signatures included.
    pub thinking: bool,
}

impl MessagesRequest {
    pub fn parse(body: &[u8]) -> Result<MessagesRequest, RequestError> {
        let mut fields = splice::top_level_fields(body)?;
        let model = splice::required_model(&fields)?;
        let max_tokens =
            match fields.get("max_tokens") {
                None => None,
                Some(raw) => Some(serde_json::from_str::<u64>(raw.get()).map_err(|_| {
                    RequestError::Type {
                        field: "max_tokens",
                        expected: "a non-negative integer",
                    }
                })?),
            };
        let raw_messages = match fields.get_mut("messages") {
            None => return Err(RequestError::Missing("messages")),
            Some(raw) => {
                let list = serde_json::from_str::<Vec<Box<RawValue>>>(raw.get()).map_err(|_| {
                    RequestError::Type {
                        field: "messages",
                        expected: "an array of messages",
                    }
                })?;
                *raw = RawValue::NULL.to_owned();
                list
            }
        };
        let messages = raw_messages
            .into_iter()
            .enumerate()
            .map(|(index, raw)| {
                parse_message(raw).map_err(|reason| RequestError::Message { index, reason })
            })
            .collect::<Result<Vec<_>, _>>()?;
        check_pairs(&messages)?;
        if let Some(raw) = fields.get("system") {
            let system: Value = serde_json::from_str(raw.get()).unwrap_or(Value::Null);
            if !(system.is_string() || system.is_array()) {
                return Err(RequestError::Type {
                    field: "system",
                    expected: "a string or an array of text blocks",
                });
            }
        }
        let value_of = |name: &str| {
            fields
                .get(name)
                .and_then(|r| serde_json::from_str::<Value>(r.get()).ok())
        };
        let stream = value_of("stream")
            .and_then(|v| v.as_bool())
            .unwrap_or(false);
        let thinking = value_of("thinking")
            .and_then(|v| v.get("type").and_then(Value::as_str).map(str::to_string))
            .is_some_and(|t| t == "enabled" || t == "adaptive");
        Ok(MessagesRequest {
            fields,
            settings: CallSettings {
                model,
                stream,
                max_output_tokens: max_tokens,
            },
            messages,
            thinking,
        })
    }

    /// The body with `messages` replaced by these raw messages; every other field keeps its
    /// original bytes and position.
    pub fn to_body<'a>(&self, messages: impl IntoIterator<Item = &'a RawValue>) -> Vec<u8> {
        splice::object_with_array(&self.fields, "messages", messages)
    }

    /// The raw `tools` array, if any.
    pub fn tools_raw(&self) -> Option<&str> {
        self.fields.get("tools").map(|r| r.get())
    }

    /// The raw `system` field, if any.
    pub fn system_raw(&self) -> Option<&str> {
        self.fields.get("system").map(|r| r.get())
    }
}

fn parse_message(raw: Box<RawValue>) -> Result<Message, String> {
    let value: Value = serde_json::from_str(raw.get()).map_err(|e| e.to_string())?;
    let Value::Object(object) = value else {
        return Err("expected an object".into());
    };
    let role = match object.get("role").and_then(Value::as_str) {
        Some("user") => Author::User,
        Some("assistant") => Author::Assistant,
        Some("system") => Author::System,
        Some(other) => {
            return Err(format!(
                "unknown role `{other}`: expected user or assistant"
            ))
        }
        None => return Err("role: field required (a string)".into()),
    };
    let blocks = match object.get("content") {
        Some(Value::String(text)) => vec![text_block(text)],
        Some(Value::Array(blocks)) => blocks.clone(),
        Some(_) => return Err("content: expected a string or an array of blocks".into()),
        None => return Err("content: field required".into()),
    };
    for (i, block) in blocks.iter().enumerate() {
        let kind = block
            .get("type")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("content.{i}: expected a block object with a string `type`"))?;
        if !KNOWN_BLOCKS.contains(&kind) {
            return Err(format!("content.{i}: unknown content block type `{kind}`"));
        }
        let needs_string = |field: &str| match block.get(field) {
            Some(Value::String(_)) => Ok(()),
            _ => Err(format!("content.{i}.{field}: expected a string")),
        };
        match kind {
            "text" => needs_string("text")?,
            "tool_use" => {
                needs_string("id")?;
                needs_string("name")?;
            }
            "tool_result" => needs_string("tool_use_id")?,
            "thinking" => needs_string("thinking")?,
            _ => {}
        }
    }
    Ok(Message { raw, role, blocks })
}

fn text_block(text: &str) -> Value {
    let mut block = Map::new();
    block.insert("type".into(), Value::String("text".into()));
    block.insert("text".into(), Value::String(text.into()));
    Value::Object(block)
}

/// Every `tool_result` must answer a `tool_use` of the assistant message right before it.
fn check_pairs(messages: &[Message]) -> Result<(), RequestError> {
    for (index, message) in messages.iter().enumerate() {
        let results = message
            .blocks_of("tool_result")
            .filter_map(|b| b.get("tool_use_id").and_then(Value::as_str));
        let previous = index
            .checked_sub(1)
            .map(|i| &messages[i])
            .filter(|m| m.role == Author::Assistant);
        for id in results {
            if !previous.is_some_and(|p| p.tool_use_ids().any(|u| u == id)) {
                return Err(RequestError::Message {
                    index,
                    reason: format!(
                        "tool_result for `{id}` has no matching tool_use in the previous assistant message"
                    ),
                });
            }
        }
    }
    Ok(())
}

/// The message as the hash chain sees it: what clients re-serialize differently between
/// requests hashes the same. Claude Code drops an old message's `cache_control` and turns a
/// single text block into a plain string.
pub fn canonical(message: &Message) -> Value {
    let role = match message.role {
        Author::User => "user",
        Author::Assistant => "assistant",
        Author::System => "system",
    };
    let blocks = message.blocks.iter().map(without_cache_control).collect();
    let mut object = Map::new();
    object.insert("role".into(), Value::String(role.into()));
    object.insert("content".into(), Value::Array(blocks));
    Value::Object(object)
}

fn without_cache_control(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| k.as_str() != "cache_control")
                .map(|(k, v)| (k.clone(), without_cache_control(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_cache_control).collect()),
        other => other.clone(),
    }
}

/// How many `cache_control` breakpoints a JSON value carries.
pub fn breakpoints(value: &Value) -> usize {
    match value {
        Value::Object(map) => {
            usize::from(map.contains_key("cache_control"))
                + map.values().map(breakpoints).sum::<usize>()
        }
        Value::Array(items) => items.iter().map(breakpoints).sum(),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(body: &str) -> String {
        MessagesRequest::parse(body.as_bytes())
            .expect_err("refused")
            .to_string()
    }

    #[test]
    fn bad_input_is_named() {
        assert!(refused("{nope").starts_with("request body is not valid JSON"));
        assert_eq!(refused("[1]"), "request body must be a JSON object");
        assert_eq!(
            refused(r#"{"messages":[]}"#),
            "missing required parameter: 'model'"
        );
        assert_eq!(
            refused(r#"{"model":1,"messages":[]}"#),
            "invalid type for 'model': expected a string"
        );
        assert_eq!(
            refused(r#"{"model":"m","messages":{}}"#),
            "invalid type for 'messages': expected an array of messages"
        );
        assert_eq!(
            refused(r#"{"model":"m","max_tokens":"many","messages":[]}"#),
            "invalid type for 'max_tokens': expected a non-negative integer"
        );
        assert!(refused(
            r#"{"model":"m","messages":[{"role":"user","content":[{"type":"hologram"}]}]}"#
        )
        .contains("unknown content block type `hologram`"));
        assert!(
            refused(r#"{"model":"m","messages":[{"role":"robot","content":"x"}]}"#)
                .contains("unknown role `robot`")
        );
        assert!(
            refused(r#"{"model":"m","messages":[{"role":"user","content":7}]}"#)
                .starts_with("invalid message at messages[0]: content: expected a string")
        );
        assert!(refused(r#"{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"x","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t9","content":"r"}]}]}"#)
            .starts_with("invalid message at messages[2]: tool_result for `t9` has no matching tool_use"));
        assert!(refused(r#"{"model":"m","system":5,"messages":[]}"#).contains("'system'"));
    }

    #[test]
    fn re_serialized_messages_hash_the_same() {
        let first = r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}]}]}"#;
        let later = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
        let edited = r#"{"model":"m","messages":[{"role":"user","content":"hi!"}]}"#;
        let canon = |b: &str| canonical(&MessagesRequest::parse(b.as_bytes()).unwrap().messages[0]);
        assert_eq!(canon(first), canon(later));
        assert_ne!(canon(first), canon(edited));
    }

    #[test]
    fn body_keeps_every_other_field_byte_for_byte() {
        let body = r#"{"model":"m","system":[{"type":"text","text":"s","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"a"}],"context_management":{"edits":[{"type":"clear_thinking_20251015","keep":"all"}]},"stream":true}"#;
        let req = MessagesRequest::parse(body.as_bytes()).unwrap();
        assert!(req.settings.stream);
        let out = req.to_body(req.messages.iter().map(|m| &*m.raw));
        assert_eq!(String::from_utf8(out).unwrap(), body);
    }
}
