//! Clearing in chat completions: what a message holds that a clearing may clear (an assistant
//! message's `tool_calls`, a `tool` message's result) and a clearing written back into the
//! messages it changes. Chat completions has no client-asked context edits: these serve the
//! engine's own clearing before a summary.

use std::sync::Arc;

use serde_json::Value;

use crate::dialect::edits::{Clearable, ClearableCall, ClearableResult, Clearing};
use crate::dialect::splice::to_raw;
use crate::dialect::Role;
use crate::tokenizer::Encoding;

use super::request::Message;

/// The tool calls an assistant message makes, or the result a tool message carries (chat
/// results have no error flag).
pub fn clearable(message: &Message, encoding: Encoding) -> Clearable {
    let view = message.view();
    let mut clearable = Clearable::default();
    match message.role {
        Role::Assistant => {
            clearable.calls = view
                .tool_calls
                .iter()
                .map(|call| ClearableCall {
                    id: call.id.clone(),
                    tool: call.name.clone(),
                    input_tokens: encoding.count(&call.arguments),
                })
                .collect();
        }
        Role::Tool => {
            if let Some(id) = &view.tool_call_id {
                clearable.results.push(ClearableResult {
                    call_id: id.clone(),
                    tokens: encoding.count(&view.text),
                    is_error: false,
                });
            }
        }
        _ => {}
    }
    clearable
}

/// Writes `clearing` into the messages, rewriting only those it changes (a result's `content`
/// becomes its stub; an emptied input's `arguments` becomes `{}`). Reasoning is not cleared:
/// chat messages carry none the provider reads back.
pub fn apply(messages: &mut [Arc<Message>], clearing: &Clearing) {
    for message in messages.iter_mut() {
        let rewritten = match message.role {
            Role::Tool => {
                let Some(id) = message.view().tool_call_id.clone() else {
                    continue;
                };
                let Some(cleared) = clearing.results.iter().find(|r| r.call_id == id) else {
                    continue;
                };
                let Ok(Value::Object(mut object)) = serde_json::from_str(message.raw.get()) else {
                    continue;
                };
                object.insert("content".into(), Value::String(cleared.stub.clone()));
                Value::Object(object)
            }
            Role::Assistant if !clearing.inputs.is_empty() => {
                let Ok(mut object) = serde_json::from_str::<Value>(message.raw.get()) else {
                    continue;
                };
                let mut changed = false;
                if let Some(calls) = object.get_mut("tool_calls").and_then(Value::as_array_mut) {
                    for call in calls {
                        let id = call.get("id").and_then(Value::as_str).unwrap_or("");
                        if clearing.inputs.contains(id) {
                            call["function"]["arguments"] = Value::String("{}".into());
                            changed = true;
                        }
                    }
                }
                if !changed {
                    continue;
                }
                object
            }
            _ => continue,
        };
        if let Ok(cleared) = Message::parse(to_raw(&rewritten)) {
            *message = Arc::new(cleared);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::edits::ClearedResult;

    fn message(json: &str) -> Arc<Message> {
        Arc::new(
            Message::parse(serde_json::value::RawValue::from_string(json.into()).unwrap()).unwrap(),
        )
    }

    #[test]
    fn a_cleared_result_becomes_its_stub_and_nothing_else_changes() {
        let call = r#"{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"read","arguments":"{\"path\":\"a.rs\"}"}}]}"#;
        let result = r#"{"role":"tool","tool_call_id":"c1","content":"fn a() {} and much more"}"#;
        let other = r#"{"role":"tool","tool_call_id":"c2","content":"kept"}"#;
        let mut messages = vec![message(call), message(result), message(other)];
        let encoding = Encoding::for_model("gpt-4o");
        let calls = clearable(&messages[0], encoding).calls;
        assert_eq!(
            (calls[0].id.as_str(), calls[0].tool.as_str()),
            ("c1", "read")
        );
        assert_eq!(clearable(&messages[1], encoding).results[0].call_id, "c1");
        let clearing = Clearing {
            results: vec![ClearedResult {
                call_id: "c1".into(),
                stub: "[cleared]".into(),
            }],
            ..Clearing::default()
        };
        apply(&mut messages, &clearing);
        assert_eq!(messages[0].raw.get(), call);
        assert_eq!(messages[1].view().text, "[cleared]");
        assert_eq!(messages[1].view().tool_call_id.as_deref(), Some("c1"));
        assert_eq!(messages[2].raw.get(), other);
    }
}
