//! A parsed `POST /responses` body: top-level fields kept raw in their order, `input` split into
//! items, and the body written back through a checkpoint.

use std::sync::{Arc, LazyLock};

use bytes::Bytes;

use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::items::{self, Item, ItemKind};
use crate::dialect::media::{self, Billing, Media, MediaCost};
use crate::dialect::media_parts;
use crate::dialect::seen::{self, SeenElements};
use crate::dialect::splice::{self, to_raw, Fields};
use crate::dialect::text::{
    cut_middle, cut_texts, part_texts, Arguments, TRANSCRIPT_MESSAGE_CHARS, TRANSCRIPT_RESULT_CHARS,
};
use crate::dialect::{
    CallSettings, Clearable, Clearing, MessageView, RequestError, Role, Through, ToolCall,
    WireRequest,
};
use crate::identity::{self, Hash};
use crate::tokenizer::{Encoding, TOKENS_FOR_TOOLS};

/// Tokens an item costs besides its text (the chat template's framing).
const TOKENS_PER_ITEM: u64 = 4;

/// A Responses request as the proxy reads it.
#[derive(Debug, Clone)]
pub struct ResponsesRequest {
    /// Top-level fields in arrival order, values untouched.
    pub(super) fields: Fields,
    /// The body exactly as it arrived, or as it would have with the changes made since; shared
    /// by every body written from it that changes nothing.
    original: Bytes,
    settings: CallSettings,
    pub(super) items: Vec<Arc<Item>>,
    roles: Vec<Role>,
}

/// Items parsed before, found again by their bytes.
static SEEN: LazyLock<SeenElements<Item>> = LazyLock::new(|| SeenElements::new(seen::capacity()));

/// What this dialect's lookup of elements seen before has found, parsed and kept.
pub fn seen_counts() -> seen::SeenCounts {
    SEEN.counts()
}

/// The split the [`seen`] one leaves a body to (a string input among them): every byte checked,
/// errors said exactly.
fn split_exactly(body: &[u8]) -> Result<(Fields, Vec<Arc<Item>>), RequestError> {
    let splice::Split { fields, elements } = splice::split_fields(body, "input")?;
    let raw_items: Vec<Box<RawValue>> = match elements {
        None => return Err(RequestError::Missing("input")),
        // A string input is one user message.
        Some(splice::Elements::Text(text)) => {
            vec![to_raw(&json!({"role": "user", "content": text}))]
        }
        Some(splice::Elements::Array(items)) => items,
        Some(splice::Elements::Other) => {
            return Err(RequestError::Type {
                field: "input",
                expected: "a string or an array of items",
            })
        }
    };
    let items = raw_items
        .into_iter()
        .enumerate()
        .map(|(index, raw)| {
            Item::parse(raw)
                .map(Arc::new)
                .map_err(|reason| RequestError::Item { index, reason })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((fields, items))
}

impl ResponsesRequest {
    /// Parses `body`, keeping it shared rather than copied.
    pub fn parse_shared(body: &Bytes) -> Result<ResponsesRequest, RequestError> {
        ResponsesRequest::parse_keeping(body, body.clone())
    }

    /// Parses `body`, keeping a copy of it.
    pub fn parse(body: &[u8]) -> Result<ResponsesRequest, RequestError> {
        ResponsesRequest::parse_keeping(body, Bytes::copy_from_slice(body))
    }

    /// Parses `body`; `original` holds the same bytes.
    fn parse_keeping(body: &[u8], original: Bytes) -> Result<ResponsesRequest, RequestError> {
        // One pass splits the items out of the body; each is then read once.
        let (fields, items) = match seen::split(body, "input", &SEEN, Item::parse) {
            Some(split) => split,
            None => split_exactly(body)?,
        };
        let model = splice::required_model(&fields)?;
        let roles = items::roles(&items);
        let stream = fields
            .get("stream")
            .is_some_and(|r| r.get().trim() == "true");
        let max_output_tokens = fields
            .get("max_output_tokens")
            .and_then(|r| serde_json::from_str::<u64>(r.get()).ok());
        Ok(ResponsesRequest {
            fields,
            original,
            settings: CallSettings {
                model,
                stream,
                max_output_tokens,
            },
            items,
            roles,
        })
    }

    /// The body with `input` replaced by `items` (every other field as it came, in place).
    pub fn with_input<'a>(&self, items: impl IntoIterator<Item = &'a RawValue>) -> Vec<u8> {
        splice::object_with_array(&self.fields, "input", items)
    }

    /// The user messages of the input, as sent (what `/responses/compact` hands back).
    pub fn user_messages(&self) -> impl Iterator<Item = &RawValue> {
        self.items
            .iter()
            .filter(|i| i.is_user_message())
            .map(|i| &*i.raw)
    }

    /// Whether the input ends in `{"type":"compaction_trigger"}`: the client asks for a
    /// compaction of everything before it.
    pub fn ends_in_trigger(&self) -> bool {
        self.items
            .last()
            .is_some_and(|i| i.kind == ItemKind::CompactionTrigger)
    }

    /// Leaves out the compaction triggers: what remains is the conversation they ask to
    /// compact.
    pub fn remove_triggers(&mut self) {
        self.items.retain(|i| i.kind != ItemKind::CompactionTrigger);
        self.items_changed();
    }

    /// Index and `encrypted_content` of each `compaction` item that Compactor minted
    /// ([`super::sealed::Sealer::is_ours`]); other providers' items are not listed.
    pub fn minted_compactions(&self) -> Vec<(usize, String)> {
        self.items
            .iter()
            .enumerate()
            .filter(|(_, item)| item.kind == ItemKind::Compaction)
            .filter_map(|(index, item)| {
                let value: Value = serde_json::from_str(item.raw.get()).ok()?;
                let content = value.get("encrypted_content")?.as_str()?;
                super::sealed::Sealer::is_ours(content).then(|| (index, content.to_string()))
            })
            .collect()
    }

    /// Replaces the items at the given indices, in place: only the new items are read, and the
    /// body is written once.
    pub fn replace_items(
        &mut self,
        replacements: Vec<(usize, Box<RawValue>)>,
    ) -> Result<(), RequestError> {
        for (index, raw) in replacements {
            let item = Item::parse(raw).map_err(|reason| RequestError::Item { index, reason })?;
            if let Some(slot) = self.items.get_mut(index) {
                *slot = Arc::new(item);
            }
        }
        self.items_changed();
        Ok(())
    }

    /// After the items changed: their roles, and the body as the client would have sent it
    /// (`input` in [`ResponsesRequest::fields`] keeps its old bytes; it is always replaced when
    /// written).
    pub(super) fn items_changed(&mut self) {
        self.roles = items::roles(&self.items);
        self.original = Bytes::from(self.with_input(self.items.iter().map(|i| &*i.raw)));
    }

    /// Whether the request relies on history the provider holds (`previous_response_id`,
    /// `conversation`): the proxy cannot see what it would compact.
    pub fn uses_server_state(&self) -> bool {
        ["previous_response_id", "conversation"].iter().any(|key| {
            self.fields
                .get(*key)
                .is_some_and(|v| v.get().trim() != "null")
        })
    }

    fn text(&self, index: usize) -> Option<(String, String)> {
        items::readable(&self.items[index])
    }

    /// The item's media parts, at any depth (a message's content, an output's parts).
    fn media(&self, index: usize) -> Vec<Media> {
        media_parts::find_in_raw(self.items[index].raw.get(), Billing::OpenAi)
    }

    /// The tool name of the call item whose `call_id` is `id`.
    fn call_name(&self, id: &str) -> Option<String> {
        let call = self
            .items
            .iter()
            .find(|i| i.kind == ItemKind::Call && i.call_id.as_deref() == Some(id))?;
        let value: Value = serde_json::from_str(call.raw.get()).ok()?;
        items::call_of(&value).0.map(str::to_string)
    }

    /// A kept item with its long texts cut in the middle to about `keep_tokens` of its
    /// `tokens`: an output's text, a message's text, a call's arguments or input (a call that
    /// carries a whole file is kept, shortened, rather than summarized).
    fn truncated(&self, index: usize, tokens: u64, keep_tokens: u64) -> Box<RawValue> {
        let item = &self.items[index];
        let Ok(mut value) = serde_json::from_str::<Value>(item.raw.get()) else {
            return item.raw.clone();
        };
        match item.kind {
            ItemKind::Output | ItemKind::Message(_) => {
                let field = if item.kind == ItemKind::Output {
                    "output"
                } else {
                    "content"
                };
                let mut texts: Vec<&mut String> = match value.get_mut(field) {
                    Some(Value::String(s)) => vec![s],
                    Some(Value::Array(parts)) => part_texts(parts),
                    _ => vec![],
                };
                cut_texts(&mut texts, tokens, keep_tokens);
            }
            ItemKind::Call => {
                let field = ["arguments", "input"]
                    .into_iter()
                    .find(|f| value.get(*f).is_some_and(Value::is_string));
                if let Some(field) = field {
                    let mut arguments = Arguments::open(value[field].as_str().unwrap_or(""));
                    cut_texts(&mut arguments.strings(), tokens, keep_tokens);
                    value[field] = Value::String(arguments.close());
                }
            }
            _ => {}
        }
        to_raw(&value)
    }
}

/// The summary as a user message item.
pub fn summary_item(text: &str) -> Box<RawValue> {
    to_raw(
        &json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}),
    )
}

/// A user message item with the summary put first in its content.
fn merged_into(item: &RawValue, text: &str) -> Box<RawValue> {
    let Ok(mut value) = serde_json::from_str::<Value>(item.get()) else {
        return item.to_owned();
    };
    let summary = json!({"type": "input_text", "text": text});
    value["content"] = match value.get("content") {
        Some(Value::String(s)) => json!([summary, {"type": "input_text", "text": s}]),
        Some(Value::Array(parts)) => {
            let mut parts = parts.clone();
            parts.insert(0, summary);
            Value::Array(parts)
        }
        _ => json!([summary]),
    };
    to_raw(&value)
}

impl WireRequest for ResponsesRequest {
    fn dialect(&self) -> &'static str {
        "responses"
    }

    fn settings(&self) -> &CallSettings {
        &self.settings
    }

    fn len(&self) -> usize {
        self.items.len()
    }

    fn clearable(&self, encoding: Encoding, index: usize) -> Clearable {
        super::edits::clearable(&self.items[index], encoding)
    }

    fn apply_clearing(&mut self, clearing: &Clearing) {
        let replacements = super::edits::replacements(&self.items, clearing);
        if !replacements.is_empty() {
            // Each replacement is the item it replaces with one string changed: it parses.
            let _ = self.replace_items(replacements);
        }
    }

    fn cleared_copy(&self, clearing: &Clearing) -> Option<Box<dyn WireRequest>> {
        let mut copy = self.clone();
        copy.apply_clearing(clearing);
        Some(Box::new(copy))
    }

    fn prefix_copy(&self, end: usize) -> Option<Box<dyn WireRequest>> {
        let mut copy = self.clone();
        copy.items.truncate(end);
        copy.roles.truncate(end);
        copy.original = Bytes::from(copy.with_input(copy.items.iter().map(|i| &*i.raw)));
        Some(Box::new(copy))
    }

    fn role(&self, index: usize) -> Role {
        self.roles[index]
    }

    fn raw(&self, index: usize) -> &str {
        self.items[index].raw.get()
    }

    fn counted(&self, index: usize) -> Option<&crate::dialect::seen::Counted> {
        self.items.get(index).map(|element| &element.counted)
    }

    fn canonical(&self, index: usize) -> Hash {
        identity::canonical_hash(&to_raw(&items::canonical(&self.items[index].raw)))
    }

    /// The item's text, then a placeholder for each of its media (never their bytes).
    fn transcript(&self, index: usize) -> String {
        let item = &self.items[index];
        let mut entry = match self.text(index) {
            Some((label, text)) => {
                let limit = match item.kind {
                    ItemKind::Output | ItemKind::Call => TRANSCRIPT_RESULT_CHARS,
                    _ => TRANSCRIPT_MESSAGE_CHARS,
                };
                let chars = text.chars().count();
                let text = if chars > limit {
                    cut_middle(&text, chars as u64, limit as u64)
                } else {
                    text
                };
                format!("[{label}]\n{text}\n")
            }
            None => String::new(),
        };
        let found = self.media(index);
        let call_id = item.call_id.as_deref().unwrap_or("");
        let call_name = match item.kind {
            ItemKind::Output if !found.is_empty() => self.call_name(call_id),
            _ => None,
        };
        for media in &found {
            match &item.kind {
                ItemKind::Output => {
                    entry.push_str(&media::returned_by(media, call_name.as_deref(), call_id))
                }
                ItemKind::Message(role) => {
                    entry.push_str(&format!("[{role} attached {}]\n", media.describe()))
                }
                _ => entry.push_str(&format!("[attached {}]\n", media.describe())),
            }
        }
        entry
    }

    /// The item's text and its media as OpenAI bills them; an item without readable text
    /// (encrypted reasoning, an opaque compaction) costs its bytes, media aside.
    fn tokens(&self, encoding: Encoding, index: usize) -> u64 {
        let item = &self.items[index];
        let found = self.media(index);
        let text = match self.text(index) {
            Some((label, text)) => encoding.count(&label) + encoding.count(&text),
            None if found.is_empty() => item.raw.get().len() as u64 / 4,
            None => match item.kind {
                ItemKind::Output | ItemKind::Message(_) => 0,
                _ => serde_json::from_str::<Value>(item.raw.get()).map_or(0, |v| {
                    media_parts::without_media(&v).to_string().len() as u64 / 4
                }),
            },
        };
        let media: u64 = found.iter().map(|m| m.cost(|t| encoding.count(t))).sum();
        TOKENS_PER_ITEM + text + media
    }

    fn media_cost(&self, index: usize) -> MediaCost {
        MediaCost::of(&self.media(index))
    }

    fn media_rules_apply(&self) -> bool {
        Billing::OpenAi.applies_to(self.model())
    }

    fn head_tokens(&self, encoding: Encoding) -> u64 {
        let count = |key: &str| {
            self.fields
                .get(key)
                .filter(|raw| raw.get() != "null")
                .map_or(0, |raw| encoding.count(raw.get()) + TOKENS_FOR_TOOLS)
        };
        count("instructions") + count("tools")
    }

    fn head_parts(&self) -> Vec<&str> {
        ["instructions", "tools"]
            .iter()
            .filter_map(|key| self.fields.get(*key).map(|raw| raw.get()))
            .collect()
    }

    fn summary_tokens(&self, encoding: Encoding, text: &str) -> u64 {
        TOKENS_PER_ITEM + encoding.count(text)
    }

    fn view(&self, index: usize) -> MessageView {
        let item = &self.items[index];
        let text = || self.text(index).map(|(_, text)| text).unwrap_or_default();
        let mut view = MessageView::default();
        match &item.kind {
            ItemKind::Call => {
                let value: Value = serde_json::from_str(item.raw.get()).unwrap_or(Value::Null);
                let (name, arguments) = items::call_of(&value);
                view.tool_calls.push(ToolCall {
                    id: item.call_id.clone().unwrap_or_default(),
                    // A `local_shell_call` names no tool: its `action` holds the command.
                    name: name.unwrap_or("shell").to_string(),
                    arguments,
                });
            }
            ItemKind::Output => {
                view.tool_call_id = item.call_id.clone();
                view.text = text();
            }
            _ => view.text = text(),
        }
        view.media = self.media(index);
        view
    }

    fn uses_server_state(&self) -> bool {
        ResponsesRequest::uses_server_state(self)
    }

    fn original_body(&self) -> Bytes {
        // Usage always comes in `response.completed`: nothing to ask for.
        self.original.clone()
    }

    fn render(&self, rewrite: &Through<'_>) -> Vec<u8> {
        let checkpoint = rewrite.checkpoint;
        let covered = checkpoint.covered.min(self.items.len());
        let text = rewrite.text;
        let mut out: Vec<Box<RawValue>> = self.items[..covered]
            .iter()
            .zip(&self.roles)
            .filter(|(_, role)| role.is_instruction())
            .map(|(item, _)| item.raw.clone())
            .collect();
        let pinned = checkpoint.pinned_user.filter(|&p| p < covered);
        let mut rest: Vec<(usize, Box<RawValue>)> = pinned
            .into_iter()
            .chain(covered..self.items.len())
            .map(|i| {
                let cut = checkpoint.truncations.iter().find(|t| t.index == i);
                let raw = match (cut, rewrite.tokens.get(i)) {
                    (Some(t), Some(&tokens)) => self.truncated(i, tokens, t.keep_tokens),
                    _ => self.items[i].raw.clone(),
                };
                (i, raw)
            })
            .collect();
        match rest.first_mut() {
            Some((i, first)) if rewrite.merge_into_user && self.roles[*i] == Role::User => {
                *first = merged_into(first, text);
            }
            _ => out.push(summary_item(text)),
        }
        out.extend(rest.into_iter().map(|(_, raw)| raw));
        self.with_input(out.iter().map(|r| &**r))
    }
}

#[cfg(test)]
mod tests;
