//! The lenient reader of a chat message: its text, media parts (costed by OpenAI's rules, see
//! [`crate::dialect::media_parts`]), name and tool calls, as a [`MessageView`].
//!
//! Read leniently, so that what a client sent is counted and summarized even when it is not
//! shaped as expected: a field of an unexpected type (`name: 5`, a non-string `text` part) is
//! read as its JSON text, and a key that appears twice is read both times.

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::dialect::media::Billing;
use crate::dialect::media_parts::{self, MEDIA_TYPES};
use crate::dialect::{MessageView, ToolCall};

/// A JSON object's entries in order, repeated keys included (serde's derive rejects them).
struct Entries<'a>(Vec<(String, &'a RawValue)>);

impl<'de> Deserialize<'de> for Entries<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct EntriesVisitor;
        impl<'de> Visitor<'de> for EntriesVisitor {
            type Value = Entries<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries<'de>, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry::<String, &'de RawValue>()? {
                    entries.push(entry);
                }
                Ok(Entries(entries))
            }
        }
        deserializer.deserialize_map(EntriesVisitor)
    }
}

/// The entries of a JSON object; none for anything else.
fn entries(raw: &RawValue) -> Vec<(String, &RawValue)> {
    serde_json::from_str::<Entries>(raw.get())
        .map(|e| e.0)
        .unwrap_or_default()
}

/// The elements of a JSON array; none for anything else.
fn elements(raw: &RawValue) -> Vec<&RawValue> {
    serde_json::from_str(raw.get()).unwrap_or_default()
}

fn first_byte(raw: &RawValue) -> Option<u8> {
    raw.get().trim_start().bytes().next()
}

/// The text of a JSON string; the JSON itself for anything else but `null`.
fn text_of(raw: &RawValue) -> Option<String> {
    match first_byte(raw) {
        Some(b'"') => serde_json::from_str(raw.get()).ok(),
        Some(b'n') | None => None,
        Some(_) => Some(raw.get().to_string()),
    }
}

/// Appends `more` on a new line (repeated keys keep both values).
fn append(to: &mut String, more: &str) {
    if !to.is_empty() {
        to.push('\n');
    }
    to.push_str(more);
}

fn append_opt(to: &mut Option<String>, more: Option<String>) {
    if let Some(more) = more {
        append(to.get_or_insert_with(String::new), &more);
    }
}

/// A chat message's content as compaction reads it.
pub fn read(raw: &RawValue) -> MessageView {
    let mut view = MessageView::default();
    for (key, value) in entries(raw) {
        match key.as_str() {
            "content" => read_content(&mut view, value),
            "name" => append_opt(&mut view.name, text_of(value)),
            "tool_call_id" => append_opt(&mut view.tool_call_id, text_of(value)),
            "tool_calls" => read_tool_calls(&mut view, value),
            _ => {}
        }
    }
    view
}

fn read_content(view: &mut MessageView, content: &RawValue) {
    if first_byte(content) != Some(b'[') {
        if let Some(text) = text_of(content) {
            append(&mut view.text, &text);
        }
        return;
    }
    for part in elements(content) {
        if first_byte(part) == Some(b'"') {
            append_opt_text(&mut view.text, text_of(part));
            continue;
        }
        let fields = entries(part);
        let kind = fields
            .iter()
            .find(|(k, _)| k == "type")
            .and_then(|(_, v)| text_of(v));
        if kind.is_some_and(|k| MEDIA_TYPES.contains(&k.as_str())) {
            if let Ok(value) = serde_json::from_str(part.get()) {
                view.media.push(media_parts::read(&value, Billing::OpenAi));
            }
            continue;
        }
        let texts: Vec<String> = fields
            .into_iter()
            .filter(|(k, _)| k == "text" || k == "refusal")
            .filter_map(|(_, v)| text_of(v))
            .collect();
        if texts.is_empty() {
            // A part of a type the proxy does not know: what the model reads is no more than it.
            append(&mut view.text, part.get());
        }
        for text in texts {
            append(&mut view.text, &text);
        }
    }
}

fn read_tool_calls(view: &mut MessageView, calls: &RawValue) {
    if first_byte(calls) != Some(b'[') {
        // Not a list of calls: still what the model will read, so counted as arguments.
        if let Some(arguments) = text_of(calls) {
            view.tool_calls.push(ToolCall {
                id: String::new(),
                name: String::new(),
                arguments,
            });
        }
        return;
    }
    for call in elements(calls) {
        let mut read = ToolCall {
            id: String::new(),
            name: String::new(),
            arguments: String::new(),
        };
        for (key, value) in entries(call) {
            match key.as_str() {
                "id" => append_opt_text(&mut read.id, text_of(value)),
                "function" => {
                    for (key, value) in entries(value) {
                        match key.as_str() {
                            "name" => append_opt_text(&mut read.name, text_of(value)),
                            "arguments" => append_opt_text(&mut read.arguments, text_of(value)),
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        view.tool_calls.push(read);
    }
}

fn append_opt_text(to: &mut String, more: Option<String>) {
    if let Some(more) = more {
        append(to, &more);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(json: &str) -> MessageView {
        read(&RawValue::from_string(json.to_string()).unwrap())
    }

    #[test]
    fn fields_of_unexpected_types_are_read_as_their_json() {
        let v = view(r#"{"role":"user","name":5,"tool_call_id":7,"content":"look at this"}"#);
        assert_eq!(v.text, "look at this");
        assert_eq!(v.name.as_deref(), Some("5"));
        assert_eq!(v.tool_call_id.as_deref(), Some("7"));
        let v = view(r#"{"role":"user","content":[{"type":"text","text":{"nested":"words"}}]}"#);
        assert_eq!(v.text, r#"{"nested":"words"}"#);
        assert!(v.media.is_empty());
        let v = view(r#"{"role":"user","content":{"odd":"object content"}}"#);
        assert_eq!(v.text, r#"{"odd":"object content"}"#);
    }

    #[test]
    fn a_repeated_key_is_read_both_times() {
        let v = view(r#"{"role":"user","content":"first half","content":"second half"}"#);
        assert_eq!(v.text, "first half\nsecond half");
    }

    #[test]
    fn tool_calls_are_read_field_by_field() {
        let v = view(
            r#"{"role":"assistant","content":null,"tool_calls":[{"id":3,"type":"function","function":{"name":"read","arguments":{"path":"a.rs"}}}]}"#,
        );
        assert_eq!(v.text, "");
        assert_eq!(v.tool_calls[0].id, "3");
        assert_eq!(v.tool_calls[0].name, "read");
        assert_eq!(v.tool_calls[0].arguments, r#"{"path":"a.rs"}"#);
    }

    #[test]
    fn media_parts_and_null_content_are_as_before() {
        let v = view(
            r#"{"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"x"}}]}"#,
        );
        assert_eq!((v.text.as_str(), v.media.len()), ("look", 1));
        assert!(v.media[0].guessed, "an image behind a URL");
        let v = view(r#"{"role":"assistant","content":null}"#);
        assert_eq!((v.text.as_str(), v.media.len()), ("", 0));
    }
}
