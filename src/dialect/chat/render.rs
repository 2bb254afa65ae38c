//! A chat request through a checkpoint: the message array the provider receives.
//!
//! `instructions (byte for byte) + summary message + pinned user message + kept messages`. The
//! result depends only on the request and the checkpoint, so between compactions every request
//! of a conversation starts with the same bytes and provider prompt caches keep hitting.

use std::borrow::Cow;

use serde_json::value::RawValue;
use serde_json::Value;

use crate::dialect::splice::to_raw;
use crate::dialect::text::{cut_texts, part_texts, Arguments};
use crate::dialect::{Role, Through};

use super::request::ChatRequest;

/// The summary as a user message of its own.
pub fn summary_message(text: &str) -> Box<RawValue> {
    to_raw(&serde_json::json!({"role": "user", "content": text}))
}

/// The messages to send for `request` through `how.checkpoint`.
///
/// `how.tokens` gives each message's token count, used to size middle cuts.
pub fn messages_through<'a>(request: &'a ChatRequest, how: &Through<'_>) -> Vec<Cow<'a, RawValue>> {
    let (checkpoint, message_tokens, text) = (how.checkpoint, how.tokens, how.text);
    let messages = &request.messages;
    let covered = checkpoint.covered.min(messages.len());
    let mut out: Vec<Cow<'a, RawValue>> = Vec::with_capacity(messages.len() - covered + 4);
    out.extend(
        messages[..covered]
            .iter()
            .filter(|m| m.role.is_instruction())
            .map(|m| Cow::Borrowed(&*m.raw)),
    );
    let pinned = checkpoint.pinned_user.filter(|&p| p < covered);
    let mut rest: Vec<(usize, Cow<'a, RawValue>)> = pinned
        .into_iter()
        .chain(covered..messages.len())
        .map(|i| {
            let message = &messages[i];
            let cut = checkpoint.truncations.iter().find(|t| t.index == i);
            let raw = match cut {
                Some(t) => Cow::Owned(truncate_content(
                    &message.raw,
                    message_tokens.get(i).copied(),
                    t.keep_tokens,
                )),
                None => Cow::Borrowed(&*message.raw),
            };
            (i, raw)
        })
        .collect();
    match rest.first_mut() {
        Some((i, first)) if how.merge_into_user && messages[*i].role == Role::User => {
            *first = Cow::Owned(merge_summary(first, text));
        }
        _ => out.push(Cow::Owned(summary_message(text))),
    }
    out.extend(rest.into_iter().map(|(_, raw)| raw));
    out
}

/// Puts the summary at the start of a user message's content.
fn merge_summary(message: &RawValue, summary: &str) -> Box<RawValue> {
    let Ok(mut value) = serde_json::from_str::<Value>(message.get()) else {
        return message.to_owned();
    };
    let merged = match value.get("content") {
        Some(Value::String(s)) => Value::String(format!("{summary}\n\n{s}")),
        Some(Value::Array(parts)) => {
            let mut parts = parts.clone();
            parts.insert(0, serde_json::json!({"type": "text", "text": summary}));
            Value::Array(parts)
        }
        _ => Value::String(summary.to_string()),
    };
    value["content"] = merged;
    to_raw(&value)
}

/// A kept message with its long texts cut in the middle to about `keep_tokens` of its `tokens`:
/// its content, and the arguments of its tool calls (an assistant step whose call carries a whole
/// file is kept, shortened, rather than summarized).
fn truncate_content(raw: &RawValue, tokens: Option<u64>, keep_tokens: u64) -> Box<RawValue> {
    let Ok(mut value) = serde_json::from_str::<Value>(raw.get()) else {
        return raw.to_owned();
    };
    let tokens = tokens.unwrap_or((raw.get().len() / 4) as u64).max(1);
    let mut content = value.get_mut("content").map(std::mem::take);
    let mut arguments: Vec<Arguments> = value
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|call| Arguments::open(call["function"]["arguments"].as_str().unwrap_or("")))
        .collect();
    {
        let mut texts: Vec<&mut String> = match content.as_mut() {
            Some(Value::String(s)) => vec![s],
            Some(Value::Array(parts)) => part_texts(parts),
            _ => vec![],
        };
        texts.extend(arguments.iter_mut().flat_map(Arguments::strings));
        cut_texts(&mut texts, tokens, keep_tokens);
    }
    if let Some(content) = content {
        value["content"] = content;
    }
    if let Some(calls) = value.get_mut("tool_calls").and_then(Value::as_array_mut) {
        for (call, arguments) in calls.iter_mut().zip(arguments) {
            if call["function"]["arguments"].is_string() {
                call["function"]["arguments"] = Value::String(arguments.close());
            }
        }
    }
    to_raw(&value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Checkpoint, Truncation};

    const SUMMARY: &str = "[Context compacted]\n<summary>\nship it; see src/a.rs\n</summary>";

    fn request() -> ChatRequest {
        ChatRequest::parse(
            br#"{"model":"m","messages":[
            {"role":"system","content":"rules", "z":1},
            {"role":"user","content":"one"},
            {"role":"assistant","content":"two"},
            {"role":"user","content":"three"},
            {"role":"assistant","content":null,"tool_calls":[{"id":"a","type":"function","function":{"name":"read","arguments":"{}"}}]},
            {"role":"tool","tool_call_id":"a","content":"0123456789abcdefghij"}]}"#,
        )
        .unwrap()
    }

    fn through<'a>(
        req: &'a ChatRequest,
        cp: &Checkpoint,
        tokens: &[u64],
        merge_into_user: bool,
    ) -> Vec<Cow<'a, RawValue>> {
        messages_through(
            req,
            &Through {
                checkpoint: cp,
                tokens,
                merge_into_user,
                text: SUMMARY,
            },
        )
    }

    fn checkpoint(covered: usize, pinned: Option<usize>) -> Checkpoint {
        let mut cp = crate::store::contract::sample("x", covered, 1);
        cp.pinned_user = pinned;
        cp.truncations.clear();
        cp
    }

    #[test]
    fn instructions_summary_then_kept_verbatim() {
        let req = request();
        let out = through(&req, &checkpoint(3, None), &[1; 6], false);
        let texts: Vec<&str> = out.iter().map(|m| m.get()).collect();
        assert_eq!(texts[0], req.messages[0].raw.get());
        assert!(
            texts[1].contains("<summary>")
                && texts[1].contains("ship it")
                && texts[1].contains("src/a.rs")
        );
        assert_eq!(
            &texts[2..],
            &[
                req.messages[3].raw.get(),
                req.messages[4].raw.get(),
                req.messages[5].raw.get()
            ]
        );
    }

    #[test]
    fn pinned_user_follows_the_summary_and_merge_joins_them() {
        let req = request();
        let out = through(&req, &checkpoint(5, Some(3)), &[1; 6], false);
        assert_eq!(out.len(), 4);
        assert_eq!(out[2].get(), req.messages[3].raw.get());
        let merged = through(&req, &checkpoint(5, Some(3)), &[1; 6], true);
        assert_eq!(merged.len(), 3);
        let v: Value = serde_json::from_str(merged[1].get()).unwrap();
        let content = v["content"].as_str().unwrap();
        assert!(content.starts_with(SUMMARY) && content.ends_with("three"));
    }

    #[test]
    fn truncation_cuts_the_middle_with_a_marker() {
        use crate::dialect::text::cut_middle;
        let cut = cut_middle("0123456789abcdefghij", 10, 4);
        assert!(
            cut.starts_with("0123") && cut.ends_with("ghij") && cut.contains("12 of 20 characters"),
            "{cut}"
        );
        let mut cp = checkpoint(3, None);
        cp.truncations.push(Truncation {
            index: 5,
            keep_tokens: 4,
        });
        let req = request();
        let out = through(&req, &cp, &[1, 1, 1, 1, 1, 10], false);
        assert!(out.last().unwrap().get().contains("cut from the middle"));
        assert!(cut_middle("héllo wörld ünïcode", 5, 2).is_char_boundary(0));
    }

    #[test]
    fn a_call_too_large_to_keep_is_cut_in_its_arguments_paths_kept() {
        let content = "fn main() {}\n".repeat(2000);
        let arguments = serde_json::json!({"path": "src/main.rs", "content": content}).to_string();
        let call = serde_json::json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "w", "type": "function", "function": {"name": "write", "arguments": arguments}}]});
        let raw = to_raw(&call);
        let cut = truncate_content(&raw, Some(7000), 500);
        let value: Value = serde_json::from_str(cut.get()).unwrap();
        assert_eq!(value["content"], Value::Null);
        assert_eq!(value["tool_calls"][0]["id"], "w");
        let args: Value = serde_json::from_str(
            value["tool_calls"][0]["function"]["arguments"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(args["path"], "src/main.rs");
        let kept = args["content"].as_str().unwrap();
        assert!(kept.contains("cut from the middle") && kept.len() < content.len() / 10);
    }
}
