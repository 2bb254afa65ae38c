//! The answers of a served Messages compaction, in Anthropic's shapes: the `compaction` block
//! alone (`stop_reason: "compaction"`: on-demand compaction, or the `compact_20260112` edit
//! with `pause_after_compaction: true`), or the block first and then what the model answered
//! from the compacted conversation (the edit without a pause), whole or streamed. Either way
//! `usage.iterations` lists the compaction step first; with an answer after it, the sampling
//! step follows, and the top-level `usage` is the sampling step's alone, as Anthropic reports
//! it.

use serde_json::{json, Value};

use crate::dialect::splice;

/// A compaction block as issued: for which model, under which id, its summary and signature,
/// the size of the conversation it stands for and of the summary.
#[derive(Debug, Clone, Copy)]
pub struct Issued<'a> {
    pub model: &'a str,
    pub id: &'a str,
    pub summary: &'a str,
    pub signature: &'a str,
    pub input_tokens: u64,
    /// Tokens of the summary written.
    pub output_tokens: u64,
}

impl Issued<'_> {
    /// The block as a whole answer carries it.
    pub fn block(&self) -> Value {
        json!({"type": "compaction", "content": self.summary, "signature": self.signature})
    }

    /// The compaction step of `usage.iterations`.
    pub fn step(&self) -> Value {
        json!({"type": "compaction", "input_tokens": self.input_tokens,
               "output_tokens": self.output_tokens, "cache_creation_input_tokens": 0,
               "cache_read_input_tokens": 0})
    }

    /// What an answer needs to put this block first.
    pub fn first_in_answer(&self) -> BlockFirst {
        BlockFirst {
            summary: self.summary.to_string(),
            signature: self.signature.to_string(),
            step: self.step(),
            prompt: None,
        }
    }
}

/// The events of a streamed block at `index`: its start (the signature, no content yet), the
/// summary as one `compaction_delta`, its stop.
fn block_events(index: u64, summary: &str, signature: &str) -> [Value; 3] {
    [
        json!({"type": "content_block_start", "index": index,
               "content_block": {"type": "compaction", "content": null, "signature": signature}}),
        json!({"type": "content_block_delta", "index": index,
               "delta": {"type": "compaction_delta", "content": summary}}),
        json!({"type": "content_block_stop", "index": index}),
    ]
}

/// Server-sent events, each named by its `type`.
pub fn to_sse<'a>(events: impl IntoIterator<Item = &'a Value>) -> String {
    let mut out = String::new();
    for event in events {
        let kind = event["type"].as_str().unwrap_or_default();
        out.push_str(&format!("event: {kind}\ndata: {event}\n\n"));
    }
    out
}

/// The answer to a compaction that pauses: the `compaction` block alone, whole or as the
/// events of a stream.
pub fn paused(issued: Issued<'_>, stream: bool) -> Vec<u8> {
    let step = issued.step();
    // The compaction step is the whole of this answer: no message was sampled after it.
    let usage = json!({"input_tokens": issued.input_tokens, "output_tokens": issued.output_tokens,
                       "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                       "iterations": [step]});
    let message = |content: Value, stop: Value| {
        json!({"id": format!("msg_{}", issued.id), "type": "message", "role": "assistant",
               "model": issued.model, "content": content, "stop_reason": stop,
               "stop_sequence": null, "usage": usage})
    };
    if !stream {
        return message(json!([issued.block()]), json!("compaction"))
            .to_string()
            .into_bytes();
    }
    let mut events =
        vec![json!({"type": "message_start", "message": message(json!([]), Value::Null)})];
    events.extend(block_events(0, issued.summary, issued.signature));
    events.push(json!({"type": "message_delta",
                       "delta": {"stop_reason": "compaction", "stop_sequence": null},
                       "usage": {"output_tokens": issued.output_tokens,
                                 "iterations": usage["iterations"]}}));
    events.push(json!({"type": "message_stop"}));
    to_sse(&events).into_bytes()
}

/// A compaction block to put first in the model's answer (the `compact_20260112` edit without
/// a pause), and, for a stream, the prompt usage its `message_start` reported.
#[derive(Debug, Clone)]
pub struct BlockFirst {
    summary: String,
    signature: String,
    step: Value,
    prompt: Option<Value>,
}

/// The sampling step of `usage.iterations`, from an answer's `usage`.
fn sampling_step(usage: &Value) -> Value {
    let tokens = |field: &str| usage.get(field).and_then(Value::as_u64).unwrap_or(0);
    json!({"type": "message", "input_tokens": tokens("input_tokens"),
           "output_tokens": tokens("output_tokens"),
           "cache_creation_input_tokens": tokens("cache_creation_input_tokens"),
           "cache_read_input_tokens": tokens("cache_read_input_tokens")})
}

impl BlockFirst {
    /// `usage.iterations` for an answer whose own usage is `usage`: the compaction step, then
    /// the provider's own steps if it listed them, else one sampling step.
    fn iterations(&self, usage: &Value) -> Value {
        let sampled = match usage.get("iterations").and_then(Value::as_array) {
            Some(steps) if !steps.is_empty() => steps.clone(),
            _ => vec![sampling_step(usage)],
        };
        Value::Array(std::iter::once(self.step.clone()).chain(sampled).collect())
    }

    /// A whole answer (a message) with the block first in `content` and the compaction step in
    /// `usage.iterations`; `None` when it is not a message.
    pub fn whole(&self, answer: &[u8]) -> Option<Vec<u8>> {
        let fields = splice::top_level_fields(answer).ok()?;
        let content: Vec<Value> = serde_json::from_str(fields.get("content")?.get()).ok()?;
        let block = json!({"type": "compaction", "content": self.summary,
                           "signature": self.signature});
        let content = splice::to_raw(&Value::Array(
            std::iter::once(block).chain(content).collect(),
        ));
        // A provider's `usage` that is not an object is replaced: fields cannot be set on it.
        let mut usage: Value = fields
            .get("usage")
            .and_then(|u| serde_json::from_str(u.get()).ok())
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({}));
        usage["iterations"] = self.iterations(&usage);
        let usage = splice::to_raw(&usage);
        Some(splice::write_object(
            &fields,
            answer.len() + content.get().len() + usage.get().len(),
            |name, value, out| {
                let raw = match name {
                    "content" => &*content,
                    "usage" => &*usage,
                    _ => value,
                };
                out.extend_from_slice(raw.get().as_bytes());
            },
            |_| {},
        ))
    }

    /// One event of a streamed answer (`data` its JSON) as the client gets it: the block's own
    /// events follow `message_start`, every content block after it moves one place on, and the
    /// `message_delta` lists the compaction step before the sampling step.
    pub fn event(&mut self, data: &Value) -> Vec<Value> {
        let mut event = data.clone();
        match event.get("type").and_then(Value::as_str).unwrap_or("") {
            "message_start" => {
                self.prompt = event
                    .pointer("/message/usage")
                    .filter(|usage| usage.is_object())
                    .cloned();
                let mut events = vec![event];
                events.extend(block_events(0, &self.summary, &self.signature));
                return events;
            }
            "message_delta" => {
                // The stream's usage: the prompt's counts from `message_start`, overridden by
                // whatever the delta itself reports.
                let mut usage = self.prompt.clone().unwrap_or_else(|| json!({}));
                if let Some(Value::Object(delta)) = event.get("usage") {
                    for (key, value) in delta {
                        usage[key] = value.clone();
                    }
                }
                let iterations = self.iterations(&usage);
                if !event.get("usage").is_some_and(Value::is_object) {
                    event["usage"] = json!({});
                }
                event["usage"]["iterations"] = iterations;
            }
            _ => {
                if let Some(n) = event.get("index").and_then(Value::as_u64) {
                    event["index"] = Value::from(n.saturating_add(1));
                }
            }
        }
        vec![event]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issued() -> Issued<'static> {
        Issued {
            model: "m",
            id: "c1",
            summary: "SUMMARY",
            signature: "sig",
            input_tokens: 900,
            output_tokens: 40,
        }
    }

    #[test]
    fn a_whole_answer_gets_the_block_first_and_both_steps() {
        let answer = json!({"id": "msg_1", "type": "message", "role": "assistant",
            "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
            "usage": {"input_tokens": 120, "output_tokens": 7, "cache_read_input_tokens": 3}});
        let out = issued()
            .first_in_answer()
            .whole(answer.to_string().as_bytes())
            .unwrap();
        let out: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(out["content"][0]["type"], "compaction");
        assert_eq!(out["content"][0]["content"], "SUMMARY");
        assert_eq!(out["content"][1]["text"], "hi");
        assert_eq!(out["stop_reason"], "end_turn");
        assert_eq!(out["usage"]["input_tokens"], 120, "the sampling step's own");
        let steps = out["usage"]["iterations"].as_array().unwrap();
        assert_eq!(steps[0]["type"], "compaction");
        assert_eq!(steps[0]["input_tokens"], 900);
        assert_eq!(steps[1]["type"], "message");
        assert_eq!(steps[1]["input_tokens"], 120);
        assert_eq!(steps[1]["cache_read_input_tokens"], 3);
        assert!(issued().first_in_answer().whole(b"[1]").is_none());
    }

    #[test]
    fn a_usage_that_is_not_an_object_is_replaced_not_indexed() {
        for usage in [json!(5), json!("x"), json!([1]), json!(null)] {
            let answer = json!({"type": "message", "content": [], "usage": usage});
            let out = issued()
                .first_in_answer()
                .whole(answer.to_string().as_bytes())
                .unwrap();
            let out: Value = serde_json::from_slice(&out).unwrap();
            assert_eq!(
                out["usage"]["iterations"][0]["type"], "compaction",
                "{usage}"
            );

            let mut stream = issued().first_in_answer();
            stream.event(&json!({"type": "message_start", "message": {"usage": usage}}));
            let delta = stream.event(&json!({"type": "message_delta", "usage": usage}));
            assert_eq!(delta[0]["usage"]["iterations"][0]["type"], "compaction");
        }
    }

    #[test]
    fn a_stream_gets_the_block_events_after_message_start_and_later_indexes_move_on() {
        let mut first = issued().first_in_answer();
        let stream = [
            json!({"type": "message_start", "message": {"content": [],
                   "usage": {"input_tokens": 120, "output_tokens": 1}}}),
            json!({"type": "content_block_start", "index": 0,
                   "content_block": {"type": "text", "text": ""}}),
            json!({"type": "content_block_delta", "index": 0,
                   "delta": {"type": "text_delta", "text": "hi"}}),
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                   "usage": {"output_tokens": 7}}),
            json!({"type": "message_stop"}),
        ];
        let out: Vec<Value> = stream.iter().flat_map(|e| first.event(e)).collect();
        let kinds: Vec<(&str, Option<u64>)> = out
            .iter()
            .map(|e| (e["type"].as_str().unwrap(), e["index"].as_u64()))
            .collect();
        assert_eq!(
            kinds,
            [
                ("message_start", None),
                ("content_block_start", Some(0)),
                ("content_block_delta", Some(0)),
                ("content_block_stop", Some(0)),
                ("content_block_start", Some(1)),
                ("content_block_delta", Some(1)),
                ("content_block_stop", Some(1)),
                ("message_delta", None),
                ("message_stop", None),
            ]
        );
        assert_eq!(out[1]["content_block"]["signature"], "sig");
        assert_eq!(out[2]["delta"]["content"], "SUMMARY");
        let steps = out[7]["usage"]["iterations"].as_array().unwrap();
        assert_eq!(steps[0]["type"], "compaction");
        assert_eq!(steps[1]["input_tokens"], 120);
        assert_eq!(steps[1]["output_tokens"], 7);
        assert_eq!(out[7]["usage"]["output_tokens"], 7);
    }
}
