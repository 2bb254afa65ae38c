use proptest::prelude::*;
use serde_json::{json, Value};

use super::*;
use crate::dialect::scan::tests::value;
use crate::dialect::splice::{split_fields, Elements};

/// A split's fields (key, raw value) and elements, as text, for comparing.
type Read = (Vec<(String, String)>, Vec<String>);

/// The exact split, as text.
fn exact(body: &[u8]) -> Option<Read> {
    let split = split_fields(body, "messages").ok()?;
    let fields = split
        .fields
        .iter()
        .map(|(k, v)| (k.clone(), v.get().to_string()))
        .collect();
    let Some(Elements::Array(elements)) = split.elements else {
        return None;
    };
    Some((
        fields,
        elements.iter().map(|e| e.get().to_string()).collect(),
    ))
}

fn fast(body: &[u8], seen: &SeenElements<String>) -> Option<Read> {
    let (fields, elements) = split(body, "messages", seen, |raw| Ok(raw.get().to_string()))?;
    let fields = fields
        .iter()
        .map(|(k, v)| (k.clone(), v.get().to_string()))
        .collect();
    Some((fields, elements.iter().map(|e| e.to_string()).collect()))
}

fn body(fields: &[(String, Value)], messages: &[Value], pretty: bool) -> Vec<u8> {
    let mut object = serde_json::Map::new();
    object.insert("model".into(), json!("m"));
    for (k, v) in fields {
        object.insert(k.clone(), v.clone());
    }
    object.insert("messages".into(), Value::Array(messages.to_vec()));
    if pretty {
        serde_json::to_vec_pretty(&object).unwrap()
    } else {
        serde_json::to_vec(&object).unwrap()
    }
}

#[test]
fn an_element_seen_before_is_the_one_parsed_then() {
    let seen = SeenElements::new(SEEN_BYTES);
    let parse = |raw: Box<RawValue>| Ok(raw.get().to_string());
    let first = br#"{"model":"m","messages":[{"role":"user","content":"a \"b\" \\ c"}]}"#;
    let longer = br#"{"model":"m", "messages": [ {"role":"user","content":"a \"b\" \\ c"} , {"role":"assistant","content":"d"} ] }"#;
    let (_, before) = split(first, "messages", &seen, parse).unwrap();
    let (fields, after) = split(longer, "messages", &seen, parse).unwrap();
    assert!(Arc::ptr_eq(&before[0], &after[0]));
    assert_eq!(*after[1], r#"{"role":"assistant","content":"d"}"#);
    assert_eq!(fields.get("messages").unwrap().get(), "null");
    assert_eq!(fields.get("model").unwrap().get(), r#""m""#);
}

#[test]
fn what_was_found_and_parsed_is_counted() {
    let seen = SeenElements::new(SEEN_BYTES);
    let parse = |raw: Box<RawValue>| Ok(raw.get().to_string());
    let first = br#"{"model":"m","messages":[{"role":"user","content":"a"}]}"#;
    let longer = br#"{"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}]}"#;
    split(first, "messages", &seen, parse).unwrap();
    split(longer, "messages", &seen, parse).unwrap();
    let counts = seen.counts();
    assert_eq!((counts.found, counts.parsed), (1, 2));
    assert!(
        counts.kept_bytes >= (first.len() + longer.len()) as u64 / 2,
        "{counts:?}"
    );
}

#[test]
fn no_room_means_every_body_takes_the_full_path() {
    let seen = SeenElements::new(0);
    let parse = |raw: Box<RawValue>| Ok(raw.get().to_string());
    let body = br#"{"model":"m","messages":[{"role":"user","content":"a"}]}"#;
    assert!(split(body, "messages", &seen, parse).is_none());
    assert!(split(body, "messages", &seen, parse).is_none());
    assert_eq!(seen.counts(), SeenCounts::default());
}

#[test]
fn what_is_not_plain_is_left_to_the_full_path() {
    let seen = SeenElements::new(SEEN_BYTES);
    let parse = |raw: Box<RawValue>| Ok(raw.get().to_string());
    let deep = format!(
        r#"{{"model":"m","messages":[{}1{}]}}"#,
        "[".repeat(CHECKED_DEPTH + 1),
        "]".repeat(CHECKED_DEPTH + 1)
    );
    for body in [
        &br#"{"model":"m","messages":"text"}"#[..],
        br#"{"model":"m"}"#,
        br#"{"messages":[],"messages":[]}"#,
        br#"{"m\u0065ssages":[]}"#,
        br#"{"model":"m","messages":[1,]}"#,
        br#"{"model":"m","messages":[{"a":"\x01"}]}"#,
        br#"{"model":"m","messages":[]} x"#,
        b"{\"model\":\"\xff\",\"messages\":[]}",
        deep.as_bytes(),
    ] {
        assert!(
            split(body, "messages", &seen, parse).is_none(),
            "{}",
            String::from_utf8_lossy(body)
        );
    }
    let refused = split(br#"{"messages":[{"role":1}]}"#, "messages", &seen, |_| {
        Err::<String, _>("no".to_string())
    });
    assert!(refused.is_none());
}

proptest! {
    /// On valid bodies the split finds what the exact split finds, the first time and again
    /// from what it has seen.
    #[test]
    fn agrees_with_the_exact_split(
        fields in prop::collection::vec(("[a-z]{1,4}", value()), 0..4),
        messages in prop::collection::vec(value(), 0..6),
        pretty in any::<bool>(),
    ) {
        let seen = SeenElements::new(SEEN_BYTES);
        let body = body(&fields, &messages, pretty);
        let expected = exact(&body);
        prop_assert!(expected.is_some());
        prop_assert_eq!(fast(&body, &seen), expected.clone());
        prop_assert_eq!(fast(&body, &seen), expected);
    }

    /// Whatever a byte changed to, a body the exact split refuses is never read here, even with
    /// every element of the unchanged body already seen; one it reads is read alike.
    #[test]
    fn never_reads_what_the_exact_split_refuses(
        messages in prop::collection::vec(value(), 1..5),
        at in any::<prop::sample::Index>(),
        byte in prop_oneof![
            Just(b'"'), Just(b'\\'), Just(b','), Just(b'{'), Just(b'}'), Just(b'['), Just(b']'),
            Just(b':'), Just(b' '), Just(0x01u8), Just(0xffu8), Just(b'a'), Just(b'1'),
        ],
        remove in any::<bool>(),
    ) {
        let seen = SeenElements::new(SEEN_BYTES);
        let original = body(&[], &messages, false);
        prop_assert!(fast(&original, &seen).is_some());
        let mut changed = original.clone();
        let at = at.index(changed.len());
        if remove {
            changed.remove(at);
        } else {
            changed[at] = byte;
        }
        let expected = exact(&changed);
        let got = fast(&changed, &seen);
        if expected.is_none() {
            prop_assert!(got.is_none());
        } else if let Some(got) = got {
            prop_assert_eq!(Some(got), expected);
        }
    }
}
