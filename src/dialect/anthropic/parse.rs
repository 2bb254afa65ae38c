//! A `POST /v1/messages` body as it arrived: top-level fields kept raw in their order (unknown
//! ones survive untouched), each message's original bytes, and what compaction reads from them.
//! Everything a client can get wrong is found here and reported as a [`RequestError`].

use std::sync::{Arc, LazyLock, OnceLock};

use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::read::{self, BlockHead, ContentField, RoleField};

use crate::dialect::seen::{self, Counted, SeenElements};
use crate::dialect::splice::{self, Elements, Fields};
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

/// One message: original bytes, its role, and what compaction needs from its blocks. Each
/// block's type and ids are read when the request arrives; the blocks themselves on first use
/// ([`Message::blocks`]): a message seen before is counted from the cache and never built.
#[derive(Debug, Clone)]
pub struct Message {
    pub raw: Box<RawValue>,
    pub role: Author,
    heads: Vec<BlockHead>,
    /// The content as blocks (a string is one text block), built on first use.
    blocks: OnceLock<Vec<Value>>,
    /// What the meter learned of it.
    pub counted: Counted,
}

impl Message {
    /// The content as blocks (a string is one text block).
    pub fn blocks(&self) -> &[Value] {
        self.blocks.get_or_init(|| blocks_of_raw(&self.raw))
    }

    /// Replaces the blocks (the bytes are the caller's to rewrite).
    pub fn set_blocks(&mut self, blocks: Vec<Value>) {
        self.counted = Counted::default();
        self.heads = blocks.iter().map(BlockHead::of).collect();
        self.blocks = OnceLock::from(blocks);
    }

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
        self.heads_of("tool_use")
            .chain(self.heads_of("server_tool_use"))
            .chain(self.heads_of("mcp_tool_use"))
            .filter_map(|b| b.id.as_deref())
    }

    /// Whether the message holds a block of type `kind`.
    pub fn has_block(&self, kind: &str) -> bool {
        self.block_types().any(|t| t == kind)
    }

    fn block_types(&self) -> impl Iterator<Item = &str> {
        self.heads.iter().filter_map(BlockHead::object_kind)
    }

    fn heads_of<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a BlockHead> {
        self.heads
            .iter()
            .filter(move |b| b.object_kind() == Some(kind))
    }
}

/// The blocks of a message already checked by [`parse_message`].
fn blocks_of_raw(raw: &RawValue) -> Vec<Value> {
    let Ok(Value::Object(mut object)) = serde_json::from_str::<Value>(raw.get()) else {
        return vec![];
    };
    match object.remove("content") {
        Some(Value::String(text)) => vec![text_block(&text)],
        Some(Value::Array(blocks)) => blocks,
        _ => vec![],
    }
}

/// A parsed Messages request.
#[derive(Debug, Clone)]
pub struct MessagesRequest {
    /// Top-level fields in arrival order, values untouched (`messages` holds a placeholder).
    pub fields: Fields,
    /// `max_output_tokens` is the body's `max_tokens`.
    pub settings: CallSettings,
    pub messages: Vec<Arc<Message>>,
    /// Extended thinking is on (`thinking.type` `enabled` or `adaptive`): the turn in progress
    /// must then reach the provider unmodified, signatures included.
    pub thinking: bool,
    /// The bytes the request was parsed from ([`MessagesRequest::parse_shared`]), while nothing
    /// has changed it. What changes the request either parses a new one (which holds none) or
    /// lets go of them.
    pub(super) client_body: Option<Bytes>,
}

/// Messages parsed before, found again by their bytes.
static SEEN: LazyLock<SeenElements<Message>> =
    LazyLock::new(|| SeenElements::new(seen::capacity()));

/// What this dialect's lookup of elements seen before has found, parsed and kept.
pub fn seen_counts() -> seen::SeenCounts {
    SEEN.counts()
}

/// The split the [`seen`] one leaves a body to: every byte checked, the first error said
/// exactly, in the order the fields are checked.
fn split_exactly(body: &[u8]) -> Result<(Fields, Vec<Arc<Message>>), RequestError> {
    let splice::Split { fields, elements } = splice::split_fields(body, "messages")?;
    splice::required_model(&fields)?;
    max_tokens(&fields)?;
    let raw_messages = match elements {
        None => return Err(RequestError::Missing("messages")),
        Some(Elements::Array(list)) => list,
        Some(_) => {
            return Err(RequestError::Type {
                field: "messages",
                expected: "an array of messages",
            })
        }
    };
    let messages = raw_messages
        .into_iter()
        .enumerate()
        .map(|(index, raw)| {
            parse_message(raw)
                .map(Arc::new)
                .map_err(|reason| RequestError::Message { index, reason })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((fields, messages))
}

/// The body's `max_tokens`, refused unless a non-negative integer.
fn max_tokens(fields: &Fields) -> Result<Option<u64>, RequestError> {
    fields
        .get("max_tokens")
        .map(|raw| {
            serde_json::from_str::<u64>(raw.get()).map_err(|_| RequestError::Type {
                field: "max_tokens",
                expected: "a non-negative integer",
            })
        })
        .transpose()
}

impl MessagesRequest {
    /// Parses `body` and keeps it: forwarded as it is while nothing changes the request.
    pub fn parse_shared(body: &Bytes) -> Result<MessagesRequest, RequestError> {
        let mut request = MessagesRequest::parse(body)?;
        request.client_body = Some(body.clone());
        Ok(request)
    }

    /// Parses `body` without keeping it: a body for the provider is always written again.
    pub fn parse(body: &[u8]) -> Result<MessagesRequest, RequestError> {
        // One pass splits the messages out of the body; each is then read once, or found
        // parsed from the same bytes before.
        let (fields, messages) = match seen::split(body, "messages", &SEEN, parse_message) {
            Some(split) => split,
            None => split_exactly(body)?,
        };
        let model = splice::required_model(&fields)?;
        let max_tokens = max_tokens(&fields)?;
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
            client_body: None,
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
    let head = read::message_head(&raw)?;
    if !head.object {
        return Err("expected an object".into());
    }
    let role = match &head.role {
        RoleField::Is(role) if role == "user" => Author::User,
        RoleField::Is(role) if role == "assistant" => Author::Assistant,
        RoleField::Is(role) if role == "system" => Author::System,
        // The value is not repeated: refusals are logged, and a field may hold anything.
        RoleField::Is(_) => return Err("role: unknown, expected user or assistant".into()),
        RoleField::Missing | RoleField::NotString => {
            return Err("role: field required (a string)".into())
        }
    };
    let heads = match head.content {
        ContentField::Text => vec![BlockHead::text()],
        ContentField::Blocks(heads) => heads,
        ContentField::Other => {
            return Err("content: expected a string or an array of blocks".into())
        }
        ContentField::Missing => return Err("content: field required".into()),
    };
    for (i, block) in heads.iter().enumerate() {
        let kind = block
            .object_kind()
            .ok_or_else(|| format!("content.{i}: expected a block object with a string `type`"))?;
        if !KNOWN_BLOCKS.contains(&kind) {
            return Err(format!(
                "content.{i}.type: unknown content block type (expected one of: {})",
                KNOWN_BLOCKS.join(", ")
            ));
        }
        let needs_string = |field: &str| match block.has_string(field) {
            true => Ok(()),
            false => Err(format!("content.{i}.{field}: expected a string")),
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
    Ok(Message {
        raw,
        role,
        heads,
        blocks: OnceLock::new(),
        counted: Counted::default(),
    })
}

fn text_block(text: &str) -> Value {
    let mut block = Map::new();
    block.insert("type".into(), Value::String("text".into()));
    block.insert("text".into(), Value::String(text.into()));
    Value::Object(block)
}

/// Every `tool_result` must answer a `tool_use` of the assistant message right before it.
fn check_pairs(messages: &[Arc<Message>]) -> Result<(), RequestError> {
    for (index, message) in messages.iter().enumerate() {
        let results = message
            .heads_of("tool_result")
            .filter_map(|b| b.tool_use_id.as_deref());
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
    let blocks = message.blocks().iter().map(without_cache_control).collect();
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
        // What was refused is named by its place, not repeated: refusals are logged.
        let block = refused(
            r#"{"model":"m","messages":[{"role":"user","content":[{"type":"hologram"}]}]}"#,
        );
        assert!(
            block.contains("content.0.type: unknown content block type"),
            "{block}"
        );
        assert!(!block.contains("hologram"), "{block}");
        let role = refused(r#"{"model":"m","messages":[{"role":"robot","content":"x"}]}"#);
        assert!(role.contains("role: unknown"), "{role}");
        assert!(!role.contains("robot"), "{role}");
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
