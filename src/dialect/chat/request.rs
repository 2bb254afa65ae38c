//! The chat completions parser: the request as it arrived, top-level fields kept as raw JSON in
//! their original order (unknown fields survive untouched), `messages` split into messages whose
//! role is read at once and whose content ([`super::view`]) on first use.
//!
//! Messages and `tools` are never re-serialized: the rewritten body splices their original bytes,
//! so what the client sent reaches the provider byte for byte.

use std::sync::{Arc, LazyLock, OnceLock};

use bytes::Bytes;
use serde_json::value::RawValue;

use crate::dialect::seen::{self, Counted, SeenElements};
use crate::dialect::{scan, splice};
use crate::dialect::{CallSettings, MessageView, RequestError, Role, MAX_OUTPUT_TOKENS};

use super::view;

/// One message: its original bytes, its role, and (read on first use) the rest of what
/// compaction looks at. Most requests only need roles and hashes: messages seen before are
/// never decoded again.
#[derive(Debug, Clone)]
pub struct Message {
    pub raw: Box<RawValue>,
    pub role: Role,
    view: OnceLock<MessageView>,
    /// What the meter learned of it.
    pub counted: Counted,
}

/// A parsed `POST /chat/completions` body.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    /// Top-level fields in arrival order, values untouched.
    fields: splice::Fields,
    /// `max_output_tokens` is `max_completion_tokens`, else `max_tokens`.
    pub settings: CallSettings,
    pub messages: Vec<Arc<Message>>,
    /// Whether the client itself asked for `stream_options.include_usage`.
    pub client_wants_usage: bool,
    /// Whether bodies written for the provider ask for it on the client's behalf
    /// ([`crate::dialect::WireRequest::ask_for_usage`]).
    pub(super) asks_for_usage: bool,
    /// The bytes the request was parsed from ([`ChatRequest::parse_shared`]), while nothing
    /// has changed it.
    pub(super) client_body: Option<Bytes>,
}

impl ChatRequest {
    /// Parses `body` and keeps it: forwarded as it is while nothing changes the request.
    pub fn parse_shared(body: &Bytes) -> Result<ChatRequest, RequestError> {
        let mut request = ChatRequest::parse(body)?;
        request.client_body = Some(body.clone());
        Ok(request)
    }

    /// Parses `body` without keeping it: a body for the provider is always written again.
    pub fn parse(body: &[u8]) -> Result<ChatRequest, RequestError> {
        // One pass over the body: each message is copied out once, everything else is kept as
        // raw JSON. Syntax errors are reported with their line and column even for bodies that
        // are not objects.
        let (fields, messages) = match seen::split(body, "messages", &SEEN, Message::parse) {
            Some(split) => split,
            None => split_exactly(body)?,
        };
        let model = splice::required_model(&fields)?;
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
            asks_for_usage: false,
            client_body: None,
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
        let wrote_stream_options = std::cell::Cell::new(false);
        let messages: Vec<&RawValue> = messages.into_iter().collect();
        // (48: room for the `stream_options` written on the client's behalf.)
        let capacity = splice::body_capacity(&self.fields, &messages) + 48;
        let mut messages = Some(messages);
        splice::write_object(
            &self.fields,
            capacity,
            |key, value, out| {
                if key == "messages" {
                    splice::write_array(out, messages.take().into_iter().flatten());
                } else if key == "stream_options" && force_usage {
                    let mut opts = serde_json::from_str::<serde_json::Value>(value.get())
                        .ok()
                        .filter(|v| v.is_object())
                        .unwrap_or_else(|| serde_json::json!({}));
                    opts["include_usage"] = serde_json::Value::Bool(true);
                    out.extend_from_slice(opts.to_string().as_bytes());
                    wrote_stream_options.set(true);
                } else {
                    out.extend_from_slice(value.get().as_bytes());
                }
            },
            |out| {
                if force_usage && !wrote_stream_options.get() {
                    let comma = if self.fields.is_empty() { "" } else { "," };
                    out.extend_from_slice(comma.as_bytes());
                    out.extend_from_slice(br#""stream_options":{"include_usage":true}"#);
                }
            },
        )
    }

    /// The original request, re-serialized without changes to `messages`.
    pub fn original_body(&self, force_usage: bool) -> Vec<u8> {
        self.to_body(self.messages.iter().map(|m| &*m.raw), force_usage)
    }
}

/// Messages parsed before, found again by their bytes.
static SEEN: LazyLock<SeenElements<Message>> =
    LazyLock::new(|| SeenElements::new(seen::capacity()));

/// What this dialect's lookup of elements seen before has found, parsed and kept.
pub fn seen_counts() -> seen::SeenCounts {
    SEEN.counts()
}

/// The split the [`seen`] one leaves a body to: every byte checked, errors said exactly.
fn split_exactly(body: &[u8]) -> Result<(splice::Fields, Vec<Arc<Message>>), RequestError> {
    let splice::Split { fields, elements } = splice::split_fields(body, "messages")?;
    let raw_messages = match elements {
        None => return Err(RequestError::Missing("messages")),
        Some(splice::Elements::Array(list)) => list,
        Some(_) => {
            return Err(RequestError::Type {
                field: "messages",
                expected: "an array",
            })
        }
    };
    let messages = raw_messages
        .into_iter()
        .enumerate()
        .map(|(index, raw)| {
            Message::parse(raw)
                .map(Arc::new)
                .map_err(|reason| RequestError::Message { index, reason })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((fields, messages))
}

impl Message {
    /// Checks that `raw` is a message object with a string role. `raw` has been validated by
    /// the split, so the role is found by skipping over the message's bytes, not reading them.
    pub fn parse(raw: Box<RawValue>) -> Result<Message, String> {
        let role = match scan::top_level(raw.get(), ["role"]) {
            Err(scan::Unreadable::NotObject) => return Err("expected an object".into()),
            Err(scan::Unreadable::Repeated(key)) => return Err(format!("duplicate field `{key}`")),
            Ok([None]) => return Err("missing 'role'".into()),
            Ok([Some(role)]) => match scan::text(role) {
                Ok(Some(role)) => role,
                Ok(None) => return Err("missing 'role'".into()),
                Err(scan::NotText) => return Err("'role' must be a string".into()),
            },
        };
        Ok(Message {
            role: Role::parse(&role),
            raw,
            view: OnceLock::new(),
            counted: Counted::default(),
        })
    }

    /// Content, name and tool calls, decoded on first use.
    pub fn view(&self) -> &MessageView {
        self.view.get_or_init(|| view::read(&self.raw))
    }
}

#[cfg(test)]
mod tests;
