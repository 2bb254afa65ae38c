//! Canonical identity: the same conversation re-serialized the way clients do (key order,
//! whitespace, `cache_control` markers, item ids and statuses, a string versus one text block)
//! keeps its hash chain; any change of content changes it from that element on.

use compactor::identity::{canonical_hash, chain, tenant, Hash};
use proptest::prelude::*;
use serde_json::value::RawValue;

#[derive(Debug, Clone)]
struct Element {
    role: &'static str,
    text: String,
    call: Option<String>,
}

/// How one request happens to write an element.
#[derive(Debug, Clone)]
struct Style {
    block: bool,
    cache_control: bool,
    id: Option<String>,
    status: bool,
    reverse_keys: bool,
    spaces: bool,
}

fn element() -> impl Strategy<Value = Element> {
    (
        prop::sample::select(vec!["user", "assistant", "tool"]),
        "[a-z \"\\\\é]{0,12}",
        proptest::option::of("[a-z0-9]{1,6}"),
    )
        .prop_map(|(role, text, call)| Element { role, text, call })
}

fn style() -> impl Strategy<Value = Style> {
    (
        any::<bool>(),
        any::<bool>(),
        proptest::option::of("[a-z0-9_]{1,8}"),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(block, cache_control, id, status, reverse_keys, spaces)| Style {
                block,
                cache_control,
                id,
                status,
                reverse_keys,
                spaces,
            },
        )
}

fn quoted(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

fn render(element: &Element, style: &Style) -> Box<RawValue> {
    const MARKER: &str = r#"{"type":"ephemeral"}"#;
    let content = if style.block {
        let marker = if style.cache_control {
            format!(r#","cache_control":{MARKER}"#)
        } else {
            String::new()
        };
        format!(
            r#"[{{"type":"text","text":{}{marker}}}]"#,
            quoted(&element.text)
        )
    } else {
        quoted(&element.text)
    };
    let mut fields = vec![("role", quoted(element.role)), ("content", content)];
    if let Some(call) = &element.call {
        let calls = format!(r#"[{{"id":{},"type":"function"}}]"#, quoted(call));
        fields.push(("tool_calls", calls));
    }
    if let Some(id) = &style.id {
        fields.push(("id", quoted(id)));
    }
    if style.status {
        fields.push(("status", quoted("completed")));
    }
    if style.cache_control && !style.block {
        fields.push(("cache_control", MARKER.to_string()));
    }
    if style.reverse_keys {
        fields.reverse();
    }
    let (colon, comma) = if style.spaces {
        (" : ", " ,\n ")
    } else {
        (":", ",")
    };
    let body: Vec<String> = fields
        .iter()
        .map(|(k, v)| format!("{}{colon}{v}", quoted(k)))
        .collect();
    RawValue::from_string(format!("{{{}}}", body.join(comma))).unwrap()
}

fn chain_of(elements: &[Element], styles: &[Style]) -> Vec<Hash> {
    chain(
        &tenant("Bearer t"),
        elements
            .iter()
            .zip(styles.iter().cycle())
            .map(|(e, s)| canonical_hash(&render(e, s))),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn reserializing_keeps_the_chain(
        elements in prop::collection::vec(element(), 1..12),
        first in prop::collection::vec(style(), 12),
        second in prop::collection::vec(style(), 12),
    ) {
        prop_assert_eq!(chain_of(&elements, &first), chain_of(&elements, &second));
    }

    #[test]
    fn changing_content_changes_the_chain_from_there(
        elements in prop::collection::vec(element(), 1..12),
        styles in prop::collection::vec(style(), 12),
        at in any::<prop::sample::Index>(),
        change in 0..3u8,
    ) {
        let k = at.index(elements.len());
        let mut edited = elements.clone();
        match change {
            0 => edited[k].text.push('x'),
            1 => edited[k].role = if edited[k].role == "user" { "assistant" } else { "user" },
            _ => edited[k].call = Some(format!("{}x", edited[k].call.clone().unwrap_or_default())),
        }
        let before = chain_of(&elements, &styles);
        let after = chain_of(&edited, &styles);
        prop_assert_eq!(&before[..k], &after[..k]);
        for (b, a) in before[k..].iter().zip(&after[k..]) {
            prop_assert_ne!(b, a);
        }
    }
}
