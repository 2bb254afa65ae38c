//! One top-level field of a provider's stream event, read without building the rest of it.
//!
//! The first events of every stream are read to catch an error sent in place of an answer, and an
//! Anthropic stream with context edits is read event by event for its `message_delta`. Built into
//! a `serde_json::Value`, each event cost a map, a string per key and a node per value (a
//! Responses `response.created` event repeats the whole request's settings): some 8k
//! instructions for a small chat stream's first event, more than the rest of the stream's
//! handling. Here the event is still checked as JSON, but every other field is skipped.

use std::borrow::Cow;

use serde::de::{Deserializer, IgnoredAny};
use serde::Deserialize;

/// The `type` of the JSON object `data`, when it is an object with a string `type`.
pub fn event_type(data: &str) -> Option<Cow<'_, str>> {
    #[derive(Deserialize)]
    struct Typed<'a> {
        #[serde(rename = "type", borrow, default)]
        kind: Option<Cow<'a, str>>,
    }
    if !is_object(data) {
        return None;
    }
    serde_json::from_str::<Typed>(data).ok()?.kind
}

/// Whether `data` is a JSON object with an `error` key at its top level (whatever its value,
/// `null` included).
pub fn has_error(data: &str) -> bool {
    #[derive(Deserialize)]
    struct WithError {
        #[serde(default, deserialize_with = "present")]
        error: bool,
    }
    is_object(data) && serde_json::from_str::<WithError>(data).is_ok_and(|event| event.error)
}

/// A field that is there, whatever it holds.
fn present<'de, D: Deserializer<'de>>(value: D) -> Result<bool, D::Error> {
    IgnoredAny::deserialize(value).map(|_| true)
}

/// A derived reader also accepts an array for a struct (its fields in order): only an object
/// is what the callers ask about.
fn is_object(data: &str) -> bool {
    data.trim_start().starts_with('{')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_type_is_read_from_an_object_only() {
        assert_eq!(
            event_type(r#"{"type":"error","error":{"type":"x"}}"#).as_deref(),
            Some("error")
        );
        assert_eq!(
            event_type(r#" {"a":[1,{"type":"inner"}],"type":"response.created"}"#).as_deref(),
            Some("response.created")
        );
        // Escapes are decoded, as a parsed value's would be.
        assert_eq!(
            event_type(r#"{"type":"err\u006fr"}"#).as_deref(),
            Some("error")
        );
        assert_eq!(event_type(r#"{"kind":"error"}"#), None);
        assert_eq!(event_type(r#"{"type":7}"#), None);
        assert_eq!(event_type(r#"["error"]"#), None);
        assert_eq!(event_type(r#"{"type":"error""#), None, "cut short");
        assert_eq!(event_type("[DONE]"), None);
    }

    #[test]
    fn an_error_key_counts_at_the_top_level_only_and_whatever_it_holds() {
        assert!(has_error(r#"{"error":{"message":"too long"}}"#));
        assert!(has_error(r#"{"id":"x","error":null}"#));
        assert!(!has_error(r#"{"choices":[{"error":"inner"}]}"#));
        assert!(!has_error(r#"{"choices":[]}"#));
        assert!(!has_error(r#"[{"message":"an array"}]"#));
        assert!(!has_error(r#"{"error":{"message":"cut"#));
        assert!(!has_error("[DONE]"));
    }
}
