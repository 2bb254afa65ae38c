//! One top-level field of a provider's stream event, read without building the rest of it.
//!
//! The first events of every stream are read to catch an error sent in place of an answer, and an
//! Anthropic stream with context edits is read event by event for its `message_delta`. Built into
//! a `serde_json::Value`, each event cost a map, a string per key and a node per value (a
//! Responses `response.created` event repeats the whole request's settings): some 8k
//! instructions for a small chat stream's first event, more than the rest of the stream's
//! handling. Here the event is still checked as JSON, but every other field is skipped.
//!
//! An answer's `usage` is read the same way, from every answer and every usage event: the
//! fields around it (the answer's text, its tool calls) are skipped unchecked, and only the
//! fields asked for are read exactly.

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
    // A key `error` is written `"error"` unless a character of it is escaped: an event with
    // neither that text nor a backslash (a stream's usual first event) has none, and is not
    // parsed.
    // The searcher is built once, as `http::stream`'s for `usage`: `memmem::find` builds one
    // on every call, and this runs on every stream.
    static ERROR_KEY: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\"error\""));
    let may_hold_one = ERROR_KEY.find(data.as_bytes()).is_some()
        || memchr::memchr(b'\\', data.as_bytes()).is_some();
    may_hold_one
        && is_object(data)
        && serde_json::from_str::<WithError>(data).is_ok_and(|event| event.error)
}

/// The raw JSON text of the `wanted` top-level fields of the object `json` (a provider's
/// answer or event), in the order of `wanted`; `None` when `json` is not an object holding each
/// wanted key at most once, or is not UTF-8.
///
/// The other fields are skipped without being checked: the answer reaches the client as the
/// provider sent it either way, and a caller parses each value it uses, so a malformed answer
/// yields no usage, or the usage its well-formed fields hold. No value is built for the rest
/// of a Responses or Anthropic answer, as it was before; a small chat completion's usage costs
/// 5.8k instructions, against 6.3k through a derived reader that checks every byte.
pub fn answer_fields<'a, const N: usize>(
    json: &'a [u8],
    wanted: [&'static str; N],
) -> Option<[Option<&'a str>; N]> {
    let json = std::str::from_utf8(json).ok()?;
    super::scan::top_level(json, wanted).ok()
}

/// A field's value read exactly as `T`, when present.
pub fn parsed<'a, T: Deserialize<'a>>(raw: Option<&'a str>) -> Option<T> {
    serde_json::from_str(raw?).ok()
}

/// A `model` field read beside usage: absent or `null` is no name; anything but a string makes
/// the answer unreadable (`None`), as it would for a derived reader of the whole answer.
pub fn model_name(raw: Option<&str>) -> Option<Option<String>> {
    match raw {
        None => Some(None),
        raw => parsed::<Option<String>>(raw),
    }
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
        // An escaped key is the same key; an escaped value or a longer key is not one.
        assert!(has_error(
            r#"{"id":"x","\u0065rror":{"message":"too long"}}"#
        ));
        assert!(!has_error(
            r#"{"choices":[{"delta":{"content":"\"error\""}}]}"#
        ));
        assert!(!has_error(r#"{"errors":[],"id":"a\nb"}"#));
    }

    #[test]
    fn answer_fields_are_read_at_the_top_level_only() {
        let answer = br#"{"id":"x","choices":[{"usage":{"inner":1},"message":{"content":"a \"usage\": {}"}}],"model":"m","usage":{"prompt_tokens":7}}"#;
        let [model, usage, absent] = answer_fields(answer, ["model", "usage", "absent"]).unwrap();
        assert_eq!(model, Some(r#""m""#));
        assert_eq!(usage, Some(r#"{"prompt_tokens":7}"#));
        assert_eq!(absent, None);
        assert_eq!(parsed::<String>(model).as_deref(), Some("m"));
        assert_eq!(parsed::<u64>(Some("7")), Some(7));
        assert_eq!(
            parsed::<u64>(Some("\"7\"")),
            None,
            "read exactly, not coerced"
        );
        assert_eq!(parsed::<u64>(None), None);
    }

    #[test]
    fn answer_fields_refuse_what_is_not_one_object() {
        assert_eq!(answer_fields(br#"[{"usage":1}]"#, ["usage"]), None);
        assert_eq!(answer_fields(br#"{"usage":1,"usage":2}"#, ["usage"]), None);
        assert_eq!(
            answer_fields(b"{\"usage\":\xff}", ["usage"]),
            None,
            "not UTF-8"
        );
        assert_eq!(answer_fields(b"[DONE]", ["usage"]), None);
        // Cut short: what is there is found, and its caller's exact read refuses it.
        let [usage] = answer_fields(br#"{"usage":{"prompt_tokens":7"#, ["usage"]).unwrap();
        assert_eq!(parsed::<serde_json::Value>(usage), None);
    }
}
