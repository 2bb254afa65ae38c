//! The Responses API's own context management (`context_management: [{"type": "compaction",
//! "compact_threshold": N}]`) when Compactor serves it: the threshold read (anything else
//! refused), the field taken off what goes to the provider, the input cut to what a
//! compaction item stands for, and the item put first in the answer's `output`, whole or
//! streamed, as OpenAI's API puts it there.

use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::Value;

use super::items::ItemKind;
use super::request::{summary_item, ResponsesRequest};
use crate::dialect::splice::{self, to_raw};
use crate::dialect::RequestError;

/// The request field.
pub const FIELD: &str = "context_management";

impl ResponsesRequest {
    /// The smallest `compact_threshold` of the request's `compaction` entries: `None` when it
    /// asks for none (an entry without a threshold leaves the timing to Compactor's own
    /// trigger). An entry of another type is refused.
    pub fn compact_threshold(&self) -> Result<Option<u64>, RequestError> {
        let Some(raw) = self.fields.get(FIELD) else {
            return Ok(None);
        };
        let refused = |param: String, reason: &str| RequestError::ContextEdit {
            param,
            reason: reason.to_string(),
        };
        let entries = match serde_json::from_str::<Value>(raw.get()) {
            Ok(Value::Null) => return Ok(None),
            Ok(Value::Array(entries)) => entries,
            _ => return Err(refused(FIELD.into(), "expected an array of entries")),
        };
        let mut threshold: Option<u64> = None;
        for (i, entry) in entries.iter().enumerate() {
            let at = format!("{FIELD}[{i}]");
            match entry.get("type").and_then(Value::as_str) {
                Some("compaction") => {}
                Some(other) => {
                    return Err(refused(
                        format!("{at}.type"),
                        &format!(
                            "the context management type `{other}` is not one Compactor serves \
                             (expected `compaction`)"
                        ),
                    ))
                }
                None => return Err(refused(format!("{at}.type"), "expected a string")),
            }
            match entry.get("compact_threshold") {
                None | Some(Value::Null) => {}
                Some(value) => {
                    let n = value.as_u64().ok_or_else(|| {
                        refused(
                            format!("{at}.compact_threshold"),
                            "expected a non-negative integer",
                        )
                    })?;
                    threshold = Some(threshold.map_or(n, |t| t.min(n)));
                }
            }
        }
        Ok(threshold)
    }

    /// Takes `context_management` off the body: served here, and a provider that does not
    /// offer it may refuse it.
    pub fn remove_context_management(&mut self) {
        if self.fields.shift_remove(FIELD).is_some() {
            self.items_changed();
        }
    }

    /// Leaves out the items before `index` (a compaction item's place), instructions aside:
    /// the compaction item stands for them.
    pub fn drop_before(&mut self, index: usize) {
        let mut at = 0;
        self.items.retain(|item| {
            let keep = at >= index
                || matches!(&item.kind, ItemKind::Message(r) if r == "developer" || r == "system");
            at += 1;
            keep
        });
        self.items_changed();
    }

    /// The input as the model reads it once compacted: instructions, the summary, then the
    /// turn in progress (from its last user message on) verbatim.
    pub fn compacted_to(&mut self, summary: &str) -> Result<(), RequestError> {
        let last_user = self.items.iter().rposition(|i| i.is_user_message());
        let mut kept: Vec<Box<RawValue>> = self
            .items
            .iter()
            .enumerate()
            .filter(|(i, item)| {
                let instruction =
                    matches!(&item.kind, ItemKind::Message(r) if r == "developer" || r == "system");
                instruction && last_user.is_none_or(|u| *i < u)
            })
            .map(|(_, item)| item.raw.clone())
            .collect();
        kept.push(summary_item(summary));
        if let Some(u) = last_user {
            kept.extend(self.items[u..].iter().map(|i| i.raw.clone()));
        }
        let body = self.with_input(kept.iter().map(|r| &**r));
        *self = ResponsesRequest::parse_shared(&Bytes::from(body))?;
        Ok(())
    }
}

/// A whole Responses answer with `item` first in its `output`; `None` when it is not one.
pub fn with_item_first(answer: &[u8], item: &Value) -> Option<Vec<u8>> {
    let fields = splice::top_level_fields(answer).ok()?;
    let output: Vec<Value> = serde_json::from_str(fields.get("output")?.get()).ok()?;
    let output = to_raw(&Value::Array(
        std::iter::once(item.clone()).chain(output).collect(),
    ));
    Some(splice::write_object(
        &fields,
        answer.len() + output.get().len(),
        |name, value, out| {
            let raw = if name == "output" { &*output } else { value };
            out.extend_from_slice(raw.get().as_bytes());
        },
        |_| {},
    ))
}

/// The events a stream gains for a compaction item put first in its output.
const ADDED_EVENTS: u64 = 3;

/// One event of a streamed answer (`data` its JSON) with the compaction item put first: the
/// item's own events follow `response.created`, later events move one output place and
/// [`ADDED_EVENTS`] sequence numbers on, and a final response lists the item first.
pub fn stream_event_with_item(data: &Value, item: &Value) -> Vec<Value> {
    let mut event = data.clone();
    let kind = event
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let sequence = event.get("sequence_number").and_then(Value::as_u64);
    if kind == "response.created" {
        let item_id = item.get("id").cloned().unwrap_or(Value::Null);
        let base = sequence.unwrap_or(0);
        let added = [
            serde_json::json!({"type": "response.output_item.added", "output_index": 0, "item": item}),
            serde_json::json!({"type": "response.compaction.compacting", "output_index": 0, "item_id": item_id}),
            serde_json::json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
        ];
        let mut events = vec![event];
        for (n, mut extra) in added.into_iter().enumerate() {
            extra["sequence_number"] = Value::from(base.saturating_add(1 + n as u64));
            events.push(extra);
        }
        return events;
    }
    if let Some(n) = sequence {
        event["sequence_number"] = Value::from(n.saturating_add(ADDED_EVENTS));
    }
    if let Some(n) = event.get("output_index").and_then(Value::as_u64) {
        event["output_index"] = Value::from(n.saturating_add(1));
    }
    if let Some(Value::Array(output)) = event.get_mut("response").and_then(|r| r.get_mut("output"))
    {
        if !output.is_empty() || kind != "response.in_progress" {
            output.insert(0, item.clone());
        }
    }
    vec![event]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_threshold_is_read_and_other_types_refused() {
        let read = |cm: Value| {
            let body = json!({"model": "m", "input": "hi", "context_management": cm});
            ResponsesRequest::parse(body.to_string().as_bytes())
                .unwrap()
                .compact_threshold()
        };
        assert_eq!(
            read(json!([{"type": "compaction", "compact_threshold": 900}])),
            Ok(Some(900))
        );
        assert_eq!(read(json!([{"type": "compaction"}])), Ok(None));
        assert_eq!(read(Value::Null), Ok(None));
        let refused = read(json!([{"type": "truncation"}])).unwrap_err();
        assert_eq!(
            refused.param().as_deref(),
            Some("context_management[0].type")
        );
        assert!(read(json!([{"type": "compaction", "compact_threshold": "big"}])).is_err());
        assert!(read(json!({"type": "compaction"})).is_err());
    }

    #[test]
    fn a_whole_answer_lists_the_item_first() {
        let item = json!({"type": "compaction", "id": "cmp_1", "encrypted_content": "x"});
        let answer = br#"{"id":"r","output":[{"type":"message"}],"usage":{"input_tokens":1.0}}"#;
        let out = String::from_utf8(with_item_first(answer, &item).unwrap()).unwrap();
        assert_eq!(
            out,
            r#"{"id":"r","output":[{"encrypted_content":"x","id":"cmp_1","type":"compaction"},{"type":"message"}],"usage":{"input_tokens":1.0}}"#
        );
    }
}
