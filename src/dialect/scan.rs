//! Reading a few top-level fields out of JSON the body's first pass has already checked.
//!
//! Splitting a body ([`super::splice::split_fields`]) validates every element once. Reading an
//! element's role or type with serde afterwards would validate all of its bytes a second time,
//! and on a long conversation that second pass cost as much as the first. Here the element's
//! bytes are skipped instead: strings (most of a conversation's bytes) by searching for their
//! closing quote, structure by counting brackets.
//!
//! Only for text known to be valid JSON. On anything else the answers are unspecified, but the
//! scanner never panics and never reads out of bounds.

use std::borrow::Cow;

use memchr::memchr;

/// Why an element's fields could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unreadable {
    /// The element is not a JSON object.
    NotObject,
    /// One of the wanted keys appears twice (serde's derived readers refuse this too).
    Repeated(&'static str),
}

/// The raw JSON text of the values of `wanted` keys at the top level of the object `json`, in
/// the order of `wanted`; `None` where a key is absent. Keys are compared after decoding their
/// escapes, as serde compares them.
pub fn top_level<'a, const N: usize>(
    json: &'a str,
    wanted: [&'static str; N],
) -> Result<[Option<&'a str>; N], Unreadable> {
    let bytes = json.as_bytes();
    let mut found = [None; N];
    let mut at = skip_whitespace(bytes, 0);
    if bytes.get(at) != Some(&b'{') {
        return Err(Unreadable::NotObject);
    }
    at += 1;
    loop {
        at = skip_whitespace(bytes, at);
        match bytes.get(at) {
            Some(b',') => {
                at += 1;
                continue;
            }
            Some(b'"') => {}
            // `}`, or the end of text that was not valid after all.
            _ => return Ok(found),
        }
        let key_end = skip_string(bytes, at);
        let key = key_text(json.get(at..key_end).unwrap_or(""));
        at = skip_whitespace(bytes, key_end);
        if bytes.get(at) != Some(&b':') {
            return Ok(found);
        }
        let value_start = skip_whitespace(bytes, at + 1);
        let value_end = skip_value(bytes, value_start);
        if let Some(slot) = wanted.iter().position(|w| key == *w) {
            if found[slot].is_some() {
                return Err(Unreadable::Repeated(wanted[slot]));
            }
            found[slot] = json.get(value_start..value_end);
        }
        at = value_end;
    }
}

/// A value that [`text`] cannot read as text: neither a string nor `null`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotText;

/// A field's value as text, as serde reads an `Option<String>`: `Ok(None)` for `null`,
/// [`NotText`] for anything but a string or `null`. Borrowed when the string holds no escapes.
pub fn text(raw: &str) -> Result<Option<Cow<'_, str>>, NotText> {
    match raw.as_bytes().first() {
        Some(b'n') => Ok(None),
        Some(b'"') if raw.len() >= 2 && raw.ends_with('"') && !raw.contains('\\') => {
            Ok(raw.get(1..raw.len() - 1).map(Cow::Borrowed))
        }
        Some(b'"') => serde_json::from_str::<String>(raw)
            .map(|s| Some(Cow::Owned(s)))
            .map_err(|_| NotText),
        _ => Err(NotText),
    }
}

/// The elements of the JSON array `json`, as raw text; empty for anything but an array.
pub fn elements(json: &str) -> Vec<&str> {
    let bytes = json.as_bytes();
    let mut found = Vec::new();
    let mut at = skip_whitespace(bytes, 0);
    if bytes.get(at) != Some(&b'[') {
        return found;
    }
    at += 1;
    loop {
        at = skip_whitespace(bytes, at);
        match bytes.get(at) {
            Some(b',') => at += 1,
            None | Some(b']') => return found,
            Some(_) => {
                let end = skip_value(bytes, at);
                if end == at {
                    return found;
                }
                if let Some(element) = json.get(at..end) {
                    found.push(element);
                }
                at = end;
            }
        }
    }
}

/// Nesting past this depth is left to an exact reader (`serde_json` refuses past 128).
const PLAIN_DEPTH: usize = 100;
/// Numbers longer than this are left to an exact reader (an `f64` overflows past 309 digits).
const PLAIN_NUMBER: usize = 300;

/// Whether `json` holds only what a [`serde_json::Value`] reads without complaint, as far as
/// skipping can tell. A value refuses three things the body's first pass lets through: a
/// number out of `f64`'s range, nesting past 128, and an unpaired UTF-16 surrogate escape. So
/// `json` is plain when no escape could be a surrogate (`\ud…`), no number has an exponent or
/// more than 300 characters, and nothing nests deeper than 100; anything else is for an exact
/// reader to judge.
pub fn is_plain(json: &str) -> bool {
    let bytes = json.as_bytes();
    if memchr::memmem::find(bytes, b"\\ud").is_some()
        || memchr::memmem::find(bytes, b"\\uD").is_some()
    {
        return false;
    }
    let mut depth = 0usize;
    let mut at = 0;
    while let Some(&byte) = bytes.get(at) {
        match byte {
            b'"' => {
                at = skip_string(bytes, at);
                continue;
            }
            b'{' | b'[' => {
                depth += 1;
                if depth > PLAIN_DEPTH {
                    return false;
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            b'-' | b'0'..=b'9' => {
                let end = skip_value(bytes, at);
                let number = &bytes[at..end];
                if number.len() > PLAIN_NUMBER || number.iter().any(|b| matches!(b, b'e' | b'E')) {
                    return false;
                }
                at = end;
                continue;
            }
            _ => {}
        }
        at += 1;
    }
    true
}

/// How deep `json` nests: 0 for a scalar, 1 for a flat array or object.
pub(super) fn depth(json: &str) -> usize {
    let bytes = json.as_bytes();
    let (mut depth, mut deepest) = (0usize, 0usize);
    let mut at = 0;
    while let Some(&byte) = bytes.get(at) {
        match byte {
            b'"' => {
                at = skip_string(bytes, at);
                continue;
            }
            b'{' | b'[' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
        at += 1;
    }
    deepest
}

/// The text of the JSON string `key` (quotes included), borrowed unless it holds escapes.
fn key_text(key: &str) -> Cow<'_, str> {
    let inner = key.get(1..key.len().saturating_sub(1)).unwrap_or("");
    if !inner.contains('\\') {
        return Cow::Borrowed(inner);
    }
    serde_json::from_str::<String>(key).map_or(Cow::Borrowed(""), Cow::Owned)
}

pub(super) fn skip_whitespace(bytes: &[u8], mut at: usize) -> usize {
    while matches!(bytes.get(at), Some(b' ' | b'\n' | b'\r' | b'\t')) {
        at += 1;
    }
    at
}

/// The index just past the string that opens at `at` (a quote). Escapes are common inside
/// strings (`\n` in file contents, `\"` in tool arguments), so the search stops only at quotes:
/// a quote ends the string unless an odd number of backslashes comes right before it.
pub(super) fn skip_string(bytes: &[u8], at: usize) -> usize {
    let mut at = at + 1;
    loop {
        let Some(offset) = bytes.get(at..).and_then(|rest| memchr(b'"', rest)) else {
            return bytes.len();
        };
        let quote = at + offset;
        let backslashes = bytes[..quote]
            .iter()
            .rev()
            .take_while(|&&b| b == b'\\')
            .count();
        if backslashes % 2 == 0 {
            return quote + 1;
        }
        at = quote + 1;
    }
}

/// The index just past the value that starts at `at`.
pub(super) fn skip_value(bytes: &[u8], at: usize) -> usize {
    match bytes.get(at) {
        None => at,
        Some(b'"') => skip_string(bytes, at),
        Some(b'{' | b'[') => {
            let mut depth = 0usize;
            let mut at = at;
            while let Some(&byte) = bytes.get(at) {
                match byte {
                    b'"' => {
                        at = skip_string(bytes, at);
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth = depth.saturating_sub(1);
                        if depth == 0 {
                            return at + 1;
                        }
                    }
                    _ => {}
                }
                at += 1;
            }
            at
        }
        // A number, `true`, `false` or `null`.
        Some(_) => {
            let mut at = at;
            while !matches!(
                bytes.get(at),
                None | Some(b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t')
            ) {
                at += 1;
            }
            at
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{Map, Value};

    #[test]
    fn reads_wanted_fields_past_long_and_escaped_values() {
        let json = r#" { "content" : [{"type":"text","text":"a \"quoted\" }] { \\"}],
            "n": -1.5e3, "ok": true, "role":"user", "name" : null } "#;
        assert_eq!(
            top_level(json, ["role", "name", "missing"]),
            Ok([Some(r#""user""#), Some("null"), None])
        );
        assert_eq!(text(r#""user""#), Ok(Some(Cow::Borrowed("user"))));
        assert_eq!(text("null"), Ok(None));
        assert_eq!(text("5"), Err(NotText));
        assert_eq!(text(r#""a\u0062""#).unwrap().unwrap(), "ab");
    }

    #[test]
    fn escaped_keys_match_and_repeats_are_refused() {
        assert_eq!(
            top_level(r#"{"r\u006fle":"tool"}"#, ["role"]),
            Ok([Some(r#""tool""#)])
        );
        assert_eq!(
            top_level(r#"{"role":"user","x":{"role":1},"role":"tool"}"#, ["role"]),
            Err(Unreadable::Repeated("role"))
        );
        assert_eq!(top_level("[1]", ["role"]), Err(Unreadable::NotObject));
        assert_eq!(top_level(r#""{}""#, ["role"]), Err(Unreadable::NotObject));
    }

    #[test]
    fn text_that_is_not_json_ends_the_scan_without_panicking() {
        for broken in [
            "{",
            r#"{"a"#,
            r#"{"a":"#,
            r#"{"a":"x"#,
            r#"{"a":[{"#,
            r#"{"a" 1}"#,
            "{\"a\\",
        ] {
            let _ = top_level(broken, ["a"]);
        }
    }

    #[test]
    fn a_string_ends_at_its_closing_quote_wherever_its_escapes_fall() {
        // Short and long strings, escapes anywhere in them.
        for at in 0..70 {
            for escape in [r#"\""#, r"\\", r"\n", r"\u0041", r#"\\\""#] {
                for tail in [0, 1, 40] {
                    let inner = format!("{}{escape}{}", "a".repeat(at), "b".repeat(tail));
                    let json = format!(r#""{inner}","next""#);
                    let end = inner.len() + 2;
                    assert_eq!(skip_string(json.as_bytes(), 0), end, "{json}");
                    assert_eq!(&json[end..end + 1], ",");
                }
            }
        }
        // Cut short: the end of the text, never past it.
        for cut in ["\"abc", "\"abc\\", "\"", &format!("\"{}\\", "a".repeat(40))] {
            assert_eq!(skip_string(cut.as_bytes(), 0), cut.len(), "{cut}");
        }
    }

    /// Any JSON value, strings drawn to hold quotes, backslashes, brackets and non-ASCII.
    pub(in crate::dialect) fn value() -> impl Strategy<Value = Value> {
        // Up to 40 characters: short strings and longer ones.
        let text = "[a-z\"\\\\{}\\[\\],: é\u{1F600}\n]{0,40}";
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            (-1e9f64..1e9).prop_map(Value::from),
            text.prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 40, 6, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::vec((text, inner), 0..5)
                    .prop_map(|entries| Value::Object(entries.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// On valid JSON the scan finds exactly what serde finds, compact or pretty-printed.
        #[test]
        fn agrees_with_serde(
            mut fields in prop::collection::vec(("(role|type|call_id|[a-z]{1,3})", value()), 0..6),
            pretty in any::<bool>(),
        ) {
            fields.dedup_by(|a, b| a.0 == b.0);
            let mut seen = std::collections::HashSet::new();
            fields.retain(|(k, _)| seen.insert(k.clone()));
            let object: Map<String, Value> = fields.into_iter().collect();
            let json = if pretty {
                serde_json::to_string_pretty(&object).unwrap()
            } else {
                serde_json::to_string(&object).unwrap()
            };
            let [role, kind, call_id] = top_level(&json, ["role", "type", "call_id"]).unwrap();
            for (key, raw) in [("role", role), ("type", kind), ("call_id", call_id)] {
                // Both sides read from text, so that a float reads the same way into both.
                let read = |text: &str| serde_json::from_str::<Value>(text).unwrap();
                let expected = object.get(key).map(|v| read(&v.to_string()));
                prop_assert_eq!(raw.map(read), expected, "{} in {}", key, json);
            }
        }
    }
}
