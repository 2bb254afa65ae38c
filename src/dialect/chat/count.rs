//! What a chat message costs in the prompt, following OpenAI's accounting: a fixed overhead per
//! message, its role, content, name and tool calls, and its media as OpenAI bills them
//! ([`crate::dialect::media`]).

use crate::tokenizer::{Cancel, Encoding};

use super::request::Message;

/// Tokens every message costs beyond its content (role and delimiters).
pub const TOKENS_PER_MESSAGE: u64 = 3;
/// Extra cost of a `name` field.
pub const TOKENS_PER_NAME: u64 = 1;
/// Overhead of each tool call inside an assistant message.
pub const TOKENS_PER_TOOL_CALL: u64 = 8;

/// Tokens of one message, without the cache.
pub fn count_message(encoding: Encoding, message: &Message) -> u64 {
    count_message_until(encoding, message, &Cancel::default()).unwrap_or(0)
}

pub fn count_message_until(encoding: Encoding, message: &Message, cancel: &Cancel) -> Option<u64> {
    let view = message.view();
    let count = |text: &str| encoding.count_until(text, cancel);
    let mut tokens = TOKENS_PER_MESSAGE + count(message.role.as_str())? + count(&view.text)?;
    if let Some(name) = &view.name {
        tokens += TOKENS_PER_NAME + count(name)?;
    }
    for call in &view.tool_calls {
        tokens += TOKENS_PER_TOOL_CALL + count(&call.name)? + count(&call.arguments)?;
    }
    if let Some(id) = &view.tool_call_id {
        tokens += count(id)?;
    }
    let media: u64 = view
        .media
        .iter()
        .map(|m| m.cost(|t| encoding.count(t)))
        .sum();
    Some(tokens + media)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_of_unexpected_shape_is_counted_with_all_its_text() {
        let text = "the quick brown fox jumps over the lazy dog ".repeat(20);
        let plain = format!(r#"{{"role":"user","content":"{text}"}}"#);
        let odd = [
            format!(r#"{{"role":"user","name":5,"content":"{text}"}}"#),
            format!(r#"{{"role":"tool","tool_call_id":5,"content":"{text}"}}"#),
            format!(r#"{{"role":"user","content":"x","content":"{text}"}}"#),
            format!(
                r#"{{"role":"user","content":[{{"type":"text","text":1}},{{"type":"text","text":"{text}"}}]}}"#
            ),
        ];
        let count = |json: &str| {
            let raw = serde_json::value::RawValue::from_string(json.to_string()).unwrap();
            count_message(Encoding::O200k, &Message::parse(raw).unwrap())
        };
        let baseline = count(&plain);
        assert!(baseline > 100);
        for message in odd {
            assert!(count(&message) >= baseline, "{message}");
        }
    }
}
