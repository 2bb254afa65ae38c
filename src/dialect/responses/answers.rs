//! Replies Compactor writes itself when it answers a client-requested compaction: an `input`
//! ending in `{"type":"compaction_trigger"}` (a response whose only output is one `compaction`
//! item, streamed or not; Codex fails on anything else) and `POST /responses/compact` (the user
//! messages, then the item).

use serde_json::value::RawValue;
use serde_json::{json, Value};

/// The `compaction` item standing for a checkpoint; `sealed` is its `encrypted_content`.
pub fn compaction_item(checkpoint_id: &str, sealed: &str) -> Value {
    json!({"type": "compaction", "id": format!("cmp_{checkpoint_id}"), "encrypted_content": sealed})
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn usage(input_tokens: u64) -> Value {
    json!({"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0},
           "output_tokens": 0, "output_tokens_details": {"reasoning_tokens": 0},
           "total_tokens": input_tokens})
}

fn response(model: &str, checkpoint_id: &str, output: Value, status: &str, tokens: u64) -> Value {
    json!({
        "id": format!("resp_{checkpoint_id}"),
        "object": "response",
        "created_at": now_secs(),
        "status": status,
        "model": model,
        "output": output,
        "usage": if status == "completed" { usage(tokens) } else { Value::Null },
    })
}

/// The answer to a `compaction_trigger` request: a JSON response, or its SSE events.
pub fn trigger_answer(
    model: &str,
    checkpoint_id: &str,
    item: &Value,
    input_tokens: u64,
    stream: bool,
) -> Vec<u8> {
    let done = response(
        model,
        checkpoint_id,
        json!([item]),
        "completed",
        input_tokens,
    );
    if !stream {
        return done.to_string().into_bytes();
    }
    let events = [
        json!({"type": "response.created",
               "response": response(model, checkpoint_id, json!([]), "in_progress", 0)}),
        json!({"type": "response.output_item.added", "output_index": 0, "item": item}),
        json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
        json!({"type": "response.completed", "response": done}),
    ];
    let mut out = String::new();
    for (n, mut event) in events.into_iter().enumerate() {
        event["sequence_number"] = json!(n);
        let kind = event["type"].as_str().unwrap_or_default().to_string();
        out.push_str(&format!("event: {kind}\ndata: {event}\n\n"));
    }
    out.into_bytes()
}

/// The answer to `POST /responses/compact`: the window that replaces the input.
pub fn compact_answer<'a>(
    checkpoint_id: &str,
    user_messages: impl IntoIterator<Item = &'a RawValue>,
    item: &Value,
    input_tokens: u64,
) -> Value {
    let mut output: Vec<Value> = user_messages
        .into_iter()
        .filter_map(|raw| serde_json::from_str(raw.get()).ok())
        .collect();
    output.push(item.clone());
    json!({
        "id": format!("resp_{checkpoint_id}"),
        "object": "response.compaction",
        "created_at": now_secs(),
        "output": output,
        "usage": usage(input_tokens),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_streamed_trigger_answer_carries_exactly_one_compaction_item() {
        let item = compaction_item("c1", "cmpx1.c1.00");
        let body = trigger_answer("m", "c1", &item, 100, true);
        let events: Vec<Value> = String::from_utf8(body)
            .unwrap()
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        assert_eq!(events.len(), 4);
        assert_eq!(events[2]["item"], item);
        assert_eq!(events[3]["response"]["output"], json!([item]));
        assert_eq!(events[3]["response"]["usage"]["input_tokens"], 100);
        let plain: Value =
            serde_json::from_slice(&trigger_answer("m", "c1", &item, 100, false)).unwrap();
        assert_eq!(plain["output"], json!([item]));
    }

    #[test]
    fn the_compact_answer_lists_user_messages_then_the_item() {
        let user: Box<RawValue> =
            serde_json::from_str(r#"{"role":"user","content":"hi"}"#).unwrap();
        let item = compaction_item("c1", "x");
        let answer = compact_answer("c1", [&*user], &item, 5);
        assert_eq!(answer["object"], "response.compaction");
        assert_eq!(
            answer["output"],
            json!([{"role":"user","content":"hi"}, item])
        );
    }
}
