use super::*;
use proptest::prelude::*;
use serde_json::{json, Value};

/// What the split hands over: the message's bytes, checked as a raw value.
fn head(raw: &str) -> Result<MessageHead, String> {
    message_head(&serde_json::from_str::<Box<RawValue>>(raw).unwrap())
}

#[test]
fn what_skipping_cannot_vouch_for_goes_to_the_exact_pass() {
    let deep = format!(
        r#"{{"role":"user","content":"x","d":{}{}}}"#,
        "[".repeat(101),
        "]".repeat(101)
    );
    for raw in [
        r#"{"role":"user","content":"\ud83d\ude00"}"#,
        r#"{"role":"user","content":"x","n":1.5E3}"#,
        r#"{"role":"user","role":"assistant","content":"x"}"#,
        r#"{"role":"user","content":[{"type":"text","type":"image"}]}"#,
        &deep,
    ] {
        assert_eq!(message_head_plain(raw), None, "{raw}");
        assert_eq!(head(raw), message_head_exact(raw), "{raw}");
    }
    let plain = r#"{"role":"user","content":[{"type":"text","text":"a \"b\" \\"},{"type":"tool_result","tool_use_id":"t1","content":[]}],"n":-12.5}"#;
    assert!(message_head_plain(plain).is_some());
    assert_eq!(head(plain), message_head_exact(plain));
}

/// A block as clients send them, or something else in a block's place.
fn block() -> impl Strategy<Value = Value> {
    let text = "[a-z\"\\\\ é\n{}]{0,8}";
    let scalar = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i32>().prop_map(Value::from),
        text.prop_map(Value::from),
    ];
    let field = prop_oneof![
        Just("type"),
        Just("id"),
        Just("tool_use_id"),
        Just("text"),
        Just("name"),
        Just("thinking"),
        Just("input"),
    ];
    prop_oneof![
        4 => prop::collection::vec((field, scalar.clone()), 0..5)
            .prop_map(|f| Value::Object(f.into_iter().map(|(k, v)| (k.to_string(), v)).collect())),
        1 => scalar,
    ]
}

proptest! {
    /// Where skipping answers, it answers what the exact pass answers.
    #[test]
    fn the_plain_read_agrees_with_the_exact_one(
        role in prop_oneof![Just(json!("user")), Just(json!("assistant")), Just(json!(3)), Just(Value::Null)],
        content in prop_oneof![
            "[a-z ]{0,8}".prop_map(Value::from),
            prop::collection::vec(block(), 0..4).prop_map(Value::Array),
            Just(json!({"a": 1})),
            Just(Value::Null),
        ],
        has_role in any::<bool>(),
        pretty in any::<bool>(),
    ) {
        let mut message = serde_json::Map::new();
        if has_role {
            message.insert("role".into(), role);
        }
        message.insert("content".into(), content);
        let raw = if pretty {
            serde_json::to_string_pretty(&message).unwrap()
        } else {
            serde_json::to_string(&message).unwrap()
        };
        let plain = message_head_plain(&raw);
        prop_assert!(plain.is_some(), "{}", raw);
        prop_assert_eq!(Ok(plain.unwrap()), message_head_exact(&raw), "{}", raw);
    }
}

/// The pass refuses exactly what reading into a value refuses, with the same words.
#[test]
fn refuses_what_a_value_refuses_in_the_same_words() {
    let deep = format!(
        r#"{{"role":"user","content":[{{"type":"text","text":"x","extra":{}1{}}}]}}"#,
        "[".repeat(200),
        "]".repeat(200)
    );
    for raw in [
        r#"{"role":"user","content":[{"type":"tool_use","id":"t","name":"n","input":{"n":1e400}}]}"#,
        r#"{"role":"user","content":"\ud800"}"#,
        r#"{"role":"user","content":[{"type":"text","text":"a"}],"x":-1e999}"#,
        &deep,
    ] {
        let by_value = serde_json::from_str::<Value>(raw).unwrap_err().to_string();
        assert_eq!(head(raw).unwrap_err(), by_value, "{raw}");
    }
}

#[test]
fn keeps_the_role_and_each_block_head_last_key_winning() {
    let message = head(
        r#"{"role":"assistant","role":"user","content":[{"type":"tool_use","id":"a","id":"b","name":"n","input":{}},7,{"type":5,"text":"t"}]}"#,
    )
    .unwrap();
    assert_eq!(message.role, RoleField::Is("user".into()));
    let ContentField::Blocks(blocks) = message.content else {
        panic!("blocks expected");
    };
    assert_eq!(blocks[0].object_kind(), Some("tool_use"));
    assert_eq!(blocks[0].id.as_deref(), Some("b"));
    assert!(blocks[0].has_string("name") && !blocks[0].has_string("text"));
    assert_eq!(blocks[1].object_kind(), None);
    assert_eq!(blocks[2].kind, None);
    assert!(blocks[2].has_string("text"));
    for (raw, block) in [
        r#"{"type":"tool_use","id":"a","id":"b","name":"n","input":{}}"#,
        r#"{"type":5,"text":"t"}"#,
    ]
    .iter()
    .zip([&blocks[0], &blocks[2]])
    {
        assert_eq!(&BlockHead::of(&serde_json::from_str(raw).unwrap()), block);
    }
    let read = head(r#"{"role":3,"content":{"a":1}}"#).unwrap();
    assert_eq!(
        (read.role, read.content),
        (RoleField::NotString, ContentField::Other)
    );
    assert!(!head("[1]").unwrap().object);
}
