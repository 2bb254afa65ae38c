//! The items of a Responses `input`: what kind each is, which role it plays for the core (so that
//! cuts fall only between units), how two serializations of the same item are recognised as
//! equal, and what it says in plain text.
//!
//! Cut rules (OpenAI answers 400 to a tail that breaks them): a call's output stays with its
//! call, a reasoning item stays with the item after it, and parallel calls of one step stay with
//! every one of their outputs. So a cut may fall before item `i` only when `i` is not an output,
//! `i - 1` is not reasoning, and every call before `i` has its output before `i`.

use std::borrow::Cow;
use std::sync::Arc;

use crate::dialect::seen::Counted;
use crate::dialect::{scan, Role};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// What an item is, as far as cutting and summarizing care.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ItemKind {
    /// A `message` (or a role-only item, which the API reads as one) with its role.
    Message(String),
    Reasoning,
    /// `function_call`, `custom_tool_call`, `local_shell_call`, `tool_search_call`, ….
    Call,
    /// `function_call_output`, `custom_tool_call_output`, `tool_search_output`, ….
    Output,
    /// An opaque summary of earlier items.
    Compaction,
    /// Codex's request for a compaction of everything before it.
    CompactionTrigger,
    /// Anything else (`web_search_call`, `item_reference`, newer types): kept, never cut inside.
    Other(String),
}

/// One input item: its bytes as the client sent them and what is read from them.
#[derive(Debug, Clone)]
pub struct Item {
    pub raw: Box<RawValue>,
    pub kind: ItemKind,
    pub call_id: Option<String>,
    /// What the meter learned of it.
    pub counted: Counted,
}

impl Item {
    /// Reads an item; the error says what is wrong with it.
    pub fn parse(raw: Box<RawValue>) -> Result<Item, String> {
        // The split has validated the item: its head is found by skipping over its bytes.
        let refused = || "an input item must be an object with a string `type`".to_string();
        let [kind, role, call_id] =
            scan::top_level(raw.get(), ["type", "role", "call_id"]).map_err(|_| refused())?;
        let (Ok(kind), Ok(role), Ok(call_id)) = (
            kind.map_or(Ok(None), scan::text),
            role.map_or(Ok(None), scan::text),
            call_id.map_or(Ok(None), scan::text),
        ) else {
            return Err(refused());
        };
        let kind = match (kind.as_deref(), role) {
            (Some("message") | None, Some(role)) => ItemKind::Message(role.into_owned()),
            (Some("message") | None, None) => return Err("a message needs a `role`".into()),
            (Some("reasoning"), _) => ItemKind::Reasoning,
            (Some("compaction" | "compaction_summary"), _) => ItemKind::Compaction,
            (Some("compaction_trigger"), _) => ItemKind::CompactionTrigger,
            (Some(t), _) if t.ends_with("_output") => ItemKind::Output,
            (Some(t), _) if t.ends_with("_call") && t != "web_search_call" => ItemKind::Call,
            (Some(t), _) => ItemKind::Other(t.to_string()),
        };
        if matches!(kind, ItemKind::Output) && call_id.is_none() {
            return Err("a tool output needs a `call_id`".into());
        }
        let call_id = call_id.map(Cow::into_owned);
        Ok(Item {
            raw,
            kind,
            call_id,
            counted: Counted::default(),
        })
    }

    pub fn is_instruction(&self) -> bool {
        matches!(&self.kind, ItemKind::Message(r) if r == "developer" || r == "system")
    }

    pub fn is_user_message(&self) -> bool {
        matches!(&self.kind, ItemKind::Message(r) if r == "user")
    }
}

/// The role each item plays for the core, which cuts only before an item that does not join
/// the one before it (see [`crate::dialect::units`]). An item joins the previous one when it is
/// an output, follows a reasoning item, or comes while a call is still waiting for its output;
/// outputs then read as [`Role::Tool`], the rest as [`Role::Other`]. An opaque compaction item
/// the proxy cannot read is pinned like an instruction ([`Role::System`]): it stands for what
/// came before it, which no summary of ours may replace.
pub fn roles(items: &[Arc<Item>]) -> Vec<Role> {
    let mut roles = Vec::with_capacity(items.len());
    let mut open_calls: Vec<&str> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let after_reasoning = i > 0 && items[i - 1].kind == ItemKind::Reasoning;
        let joins = item.kind == ItemKind::Output || after_reasoning || !open_calls.is_empty();
        let role = match &item.kind {
            ItemKind::Output => Role::Tool,
            _ if joins => Role::Other,
            ItemKind::Message(role) => match role.as_str() {
                "system" => Role::System,
                "developer" => Role::Developer,
                "user" => Role::User,
                _ => Role::Assistant,
            },
            ItemKind::Compaction => Role::System,
            ItemKind::CompactionTrigger => Role::Other,
            ItemKind::Reasoning | ItemKind::Call | ItemKind::Other(_) => Role::Assistant,
        };
        roles.push(role);
        match (&item.kind, item.call_id.as_deref()) {
            (ItemKind::Call, Some(id)) => open_calls.push(id),
            (ItemKind::Output, Some(id)) => open_calls.retain(|c| *c != id),
            _ => {}
        }
    }
    roles
}

/// The item as the hash chain sees it: `id` and `status` dropped (other clients regenerate
/// them), and a message's string content the same as one text part of that string.
pub fn canonical(raw: &RawValue) -> Value {
    let Ok(Value::Object(mut map)) = serde_json::from_str::<Value>(raw.get()) else {
        // An item serde cannot read as a value (a lone surrogate escape, a number out of
        // range) is known by its text: such items must not all look alike to the hash chain.
        return serde_json::from_str(raw.get())
            .unwrap_or_else(|_| Value::Array(vec![Value::Null, Value::from(raw.get())]));
    };
    map.remove("id");
    map.remove("status");
    let is_message = map.get("type").is_none_or(|t| t == "message");
    if is_message {
        map.insert("type".into(), Value::from("message"));
        if let Some(Value::String(text)) = map.get("content") {
            let part_type = match map.get("role").and_then(Value::as_str) {
                Some("assistant") => "output_text",
                _ => "input_text",
            };
            let mut part = Map::new();
            part.insert("type".into(), Value::from(part_type));
            part.insert("text".into(), Value::from(text.clone()));
            map.insert("content".into(), Value::Array(vec![Value::Object(part)]));
        }
        if let Some(Value::Array(parts)) = map.get_mut("content") {
            for part in parts.iter_mut() {
                if let Value::Object(p) = part {
                    // Output text parts come back with empty annotations and logprobs or without.
                    p.retain(|k, v| {
                        !(matches!(k.as_str(), "annotations" | "logprobs") && is_empty(v))
                    });
                }
            }
        }
    }
    Value::Object(map)
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

/// A call item's tool name (none for `local_shell_call`) and its arguments as text: `arguments`,
/// a custom tool's `input`, or a shell call's `action`.
pub fn call_of(value: &Value) -> (Option<&str>, String) {
    let name = value.get("name").and_then(Value::as_str);
    let args = match value.get("arguments").or_else(|| value.get("input")) {
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
        None => value
            .get("action")
            .map(Value::to_string)
            .unwrap_or_default(),
    };
    (name, args)
}

/// What an item says, as plain text: who (`user`, `assistant`, `tool result`, …) and the text
/// itself, in full. `None` for what cannot be read (encrypted reasoning, opaque items).
pub fn readable(item: &Item) -> Option<(String, String)> {
    let value: Value = serde_json::from_str(item.raw.get()).ok()?;
    let texts = |v: Option<&Value>| -> String {
        match v {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n"),
            _ => String::new(),
        }
    };
    let (label, text) = match &item.kind {
        ItemKind::Message(role) => (role.clone(), texts(value.get("content"))),
        ItemKind::Reasoning => {
            let summary = texts(value.get("summary"));
            let content = texts(value.get("content"));
            let text = [summary, content].join("\n").trim().to_string();
            ("assistant reasoning".to_string(), text)
        }
        ItemKind::Call => {
            let (name, args) = call_of(&value);
            (format!("assistant called {}", name.unwrap_or("tool")), args)
        }
        ItemKind::Output => {
            let output = match value.get("output") {
                Some(Value::String(s)) => s.clone(),
                Some(v @ Value::Array(_)) => texts(Some(v)),
                Some(v) => v.to_string(),
                None => String::new(),
            };
            ("tool result".to_string(), output)
        }
        ItemKind::Compaction | ItemKind::CompactionTrigger | ItemKind::Other(_) => return None,
    };
    (!text.is_empty()).then_some((label, text))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(json: &str) -> Vec<Arc<Item>> {
        let list: Vec<Box<RawValue>> = serde_json::from_str(json).unwrap();
        list.into_iter()
            .map(|r| Arc::new(Item::parse(r).unwrap()))
            .collect()
    }

    const STEP: &str = r#"[
        {"type":"message","role":"developer","content":"be brief"},
        {"type":"message","role":"user","content":"read two files"},
        {"type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"both"}]},
        {"type":"function_call","call_id":"a","name":"read","arguments":"{}"},
        {"type":"function_call","call_id":"b","name":"read","arguments":"{}"},
        {"type":"function_call_output","call_id":"a","output":"A"},
        {"type":"function_call_output","call_id":"b","output":"B"},
        {"type":"message","role":"assistant","content":[{"type":"output_text","text":"done"}]},
        {"type":"message","role":"user","content":"next"}
    ]"#;

    #[test]
    fn items_serde_cannot_read_as_values_do_not_all_look_alike() {
        let raw = |text: &str| RawValue::from_string(text.to_string()).unwrap();
        let surrogate = canonical(&raw(r#"{"type":"message","content":"\ud800"}"#));
        let too_large = canonical(&raw(r#"{"type":"message","content":1e400}"#));
        let other_large = canonical(&raw(r#"{"type":"message","content":2e400}"#));
        assert_ne!(surrogate, too_large);
        assert_ne!(too_large, other_large);
        assert_ne!(too_large, Value::Null);
    }

    #[test]
    fn parallel_calls_and_reasoning_stay_with_their_step() {
        use Role::*;
        let items = items(STEP);
        let roles = roles(&items);
        assert_eq!(
            roles,
            [Developer, User, Assistant, Other, Other, Tool, Tool, Assistant, User]
        );
        // user | reasoning + both calls + both outputs | assistant message | user
        let units = crate::dialect::units(&roles);
        assert_eq!(units, vec![0..1, 1..2, 2..7, 7..8, 8..9]);
    }

    #[test]
    fn an_opaque_compaction_item_is_pinned() {
        let items = items(
            r#"[
            {"type":"message","role":"user","content":"first"},
            {"type":"compaction","encrypted_content":"gAAA"},
            {"type":"message","role":"user","content":"next"}
        ]"#,
        );
        assert_eq!(roles(&items), [Role::User, Role::System, Role::User]);
    }

    #[test]
    fn ids_statuses_and_string_content_do_not_change_the_canonical_form() {
        let a: Box<RawValue> = serde_json::from_str(
            r#"{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"hi","annotations":[]}]}"#,
        )
        .unwrap();
        let b: Box<RawValue> =
            serde_json::from_str(r#"{"role":"assistant","content":"hi"}"#).unwrap();
        assert_eq!(canonical(&a), canonical(&b));
        let c: Box<RawValue> =
            serde_json::from_str(r#"{"role":"assistant","content":"hello"}"#).unwrap();
        assert_ne!(canonical(&a), canonical(&c));
    }

    #[test]
    fn bad_items_are_named() {
        for bad in [
            r#"3"#,
            r#"{"type":"message"}"#,
            r#"{"type":"function_call_output"}"#,
        ] {
            let raw: Box<RawValue> = serde_json::from_str(bad).unwrap();
            assert!(Item::parse(raw).is_err(), "{bad}");
        }
    }

    #[test]
    fn calls_read_as_name_and_arguments_and_encrypted_reasoning_not_at_all() {
        let items = items(STEP);
        assert_eq!(
            readable(&items[1]).unwrap(),
            ("user".into(), "read two files".into())
        );
        assert_eq!(
            readable(&items[3]).unwrap(),
            ("assistant called read".into(), "{}".into())
        );
        assert_eq!(readable(&items[5]).unwrap().1, "A");
        let encrypted =
            self::items(r#"[{"type":"reasoning","summary":[],"encrypted_content":"gAAA"}]"#);
        assert_eq!(readable(&encrypted[0]), None);
    }
}
