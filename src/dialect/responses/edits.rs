//! Clearing in Responses: what an item holds that a clearing may clear (a call item's call, a
//! `*_output` item's result) and a clearing written back into the items it changes. Responses
//! has no client-asked edits of this kind: these serve the engine's own clearing before a
//! summary, the same as for chat completions and Messages.

use std::sync::Arc;

use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::items::{self, Item, ItemKind};
use crate::dialect::edits::{Clearable, ClearableCall, ClearableResult, Clearing};
use crate::dialect::splice::to_raw;
use crate::tokenizer::Encoding;

/// The call a call item makes, or the result an output item carries (Responses outputs have no
/// error flag).
pub fn clearable(item: &Item, encoding: Encoding) -> Clearable {
    let mut clearable = Clearable::default();
    let Some(id) = item.call_id.as_deref() else {
        return clearable;
    };
    match item.kind {
        ItemKind::Call => {
            let value: Value = serde_json::from_str(item.raw.get()).unwrap_or(Value::Null);
            let (name, arguments) = items::call_of(&value);
            clearable.calls.push(ClearableCall {
                id: id.to_string(),
                // A `local_shell_call` names no tool: its `action` holds the command.
                tool: name.unwrap_or("shell").to_string(),
                input_tokens: encoding.count(&arguments),
            });
        }
        ItemKind::Output => {
            let text = items::readable(item)
                .map(|(_, text)| text)
                .unwrap_or_default();
            clearable.results.push(ClearableResult {
                call_id: id.to_string(),
                tokens: encoding.count(&text),
                is_error: false,
            });
        }
        _ => {}
    }
    clearable
}

/// The items `clearing` changes, rewritten: a result's `output` becomes its stub; an emptied
/// input's `arguments` becomes `{}` (a custom tool's `input`, ""). Every other item is left out.
pub fn replacements(items: &[Arc<Item>], clearing: &Clearing) -> Vec<(usize, Box<RawValue>)> {
    let mut replacements = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let Some(id) = item.call_id.as_deref() else {
            continue;
        };
        let stub = match item.kind {
            ItemKind::Output => clearing.results.iter().find(|r| r.call_id == id),
            _ => None,
        };
        let clears_input = item.kind == ItemKind::Call && clearing.inputs.contains(id);
        if stub.is_none() && !clears_input {
            continue;
        }
        let Ok(mut object) = serde_json::from_str::<Map<String, Value>>(item.raw.get()) else {
            continue;
        };
        if let Some(cleared) = stub {
            object.insert("output".into(), Value::String(cleared.stub.clone()));
        }
        if clears_input {
            if object.contains_key("arguments") {
                object.insert("arguments".into(), Value::String("{}".into()));
            } else if object.contains_key("input") {
                object.insert("input".into(), Value::String(String::new()));
            } else {
                continue;
            }
        }
        replacements.push((index, to_raw(&Value::Object(object))));
    }
    replacements
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::edits::ClearedResult;

    const INPUT: &str = r#"[
        {"type":"message","role":"user","content":"read both"},
        {"type":"function_call","call_id":"a","name":"read","arguments":"{\"path\":\"a.rs\"}"},
        {"type":"function_call","call_id":"b","name":"read","arguments":"{\"path\":\"b.rs\"}"},
        {"type":"function_call_output","call_id":"a","output":"fn a() {} and much more"},
        {"type":"function_call_output","call_id":"b","output":[{"type":"input_text","text":"fn b() {}"}]}
    ]"#;

    fn items() -> Vec<Arc<Item>> {
        let raw: Vec<Box<RawValue>> = serde_json::from_str(INPUT).unwrap();
        raw.into_iter()
            .map(|r| Arc::new(Item::parse(r).unwrap()))
            .collect()
    }

    #[test]
    fn calls_and_outputs_are_read_and_a_cleared_output_becomes_its_stub() {
        let encoding = Encoding::for_model("gpt-4o");
        let items = items();
        let calls = clearable(&items[1], encoding).calls;
        assert_eq!(
            (calls[0].id.as_str(), calls[0].tool.as_str()),
            ("a", "read")
        );
        let results = clearable(&items[4], encoding).results;
        assert_eq!(results[0].call_id, "b");
        assert_eq!(results[0].tokens, encoding.count("fn b() {}"));
        assert_eq!(clearable(&items[0], encoding), Clearable::default());
        let clearing = Clearing {
            results: vec![ClearedResult {
                call_id: "a".into(),
                stub: "[cleared]".into(),
            }],
            inputs: ["b".to_string()].into(),
            ..Clearing::default()
        };
        let replaced = replacements(&items, &clearing);
        assert_eq!(
            replaced.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            [2, 3],
            "only the items cleared"
        );
        let input: Value = serde_json::from_str(replaced[0].1.get()).unwrap();
        assert_eq!(input["arguments"], "{}");
        assert_eq!(input["name"], "read");
        let output: Value = serde_json::from_str(replaced[1].1.get()).unwrap();
        assert_eq!(output["output"], "[cleared]");
        assert_eq!(output["call_id"], "a");
    }
}
