//! Text helpers every dialect's transcript and renderer share: cutting the middle out of a long
//! text with a marker saying how much went (one text, or the long texts of one element, tool-call
//! arguments included, sharing a budget), and the lengths a transcript copies whole. Part of the
//! seam: it imports nothing of the crate.

use serde_json::Value;

/// Longest tool result, in characters, copied into a transcript whole.
pub const TRANSCRIPT_RESULT_CHARS: usize = 4000;
/// Longest other message, in characters, copied whole.
pub const TRANSCRIPT_MESSAGE_CHARS: usize = 16000;

/// `text`, cut in the middle to at most `limit` characters.
pub fn shorten(text: &str, limit: usize) -> String {
    let chars = text.chars().count();
    if chars <= limit {
        return text.to_string();
    }
    // Token figures are unknown here; characters stand in for both sides of the ratio.
    cut_middle(text, chars as u64, limit as u64)
}

/// Cuts the middle out of a text so that about `keep_tokens` of `tokens` remain, with a marker
/// saying how much went.
pub fn cut_middle(text: &str, tokens: u64, keep_tokens: u64) -> String {
    if keep_tokens >= tokens {
        return text.to_string();
    }
    let chars = text.chars().count() as u64;
    let keep_chars = (chars * keep_tokens / tokens.max(1)) as usize;
    let head = keep_chars / 2;
    let tail = keep_chars - head;
    let start_tail = chars as usize - tail;
    let head_end = text.char_indices().nth(head).map_or(text.len(), |(b, _)| b);
    let tail_start = text
        .char_indices()
        .nth(start_tail)
        .map_or(text.len(), |(b, _)| b);
    format!(
        "{}\n\n[... {} of {} characters (about {} tokens) cut from the middle ...]\n\n{}",
        &text[..head_end],
        start_tail - head,
        chars,
        tokens - keep_tokens,
        &text[tail_start..]
    )
}

/// Texts shorter than this stay whole when an element's long texts can be cut instead: the
/// paths, names and flags in a tool call's arguments say the most per character.
pub const SHORT_TEXT_CHARS: usize = 200;

/// Cuts the middle out of the long ones among `texts`, the texts of one element, so that about
/// `keep_tokens` of the `tokens` the element costs remain: the short texts stay whole (all are
/// cut when none is long) and each long one keeps the same share of itself.
pub fn cut_texts(texts: &mut [&mut String], tokens: u64, keep_tokens: u64) {
    if keep_tokens >= tokens {
        return;
    }
    let chars: Vec<u64> = texts.iter().map(|t| t.chars().count() as u64).collect();
    let total: u64 = chars.iter().sum();
    let any_long = chars.iter().any(|&c| c >= SHORT_TEXT_CHARS as u64);
    let is_cut = |c: u64| !any_long || c >= SHORT_TEXT_CHARS as u64;
    let long: u64 = chars.iter().copied().filter(|&c| is_cut(c)).sum();
    if long == 0 {
        return;
    }
    // In u128: characters times tokens may exceed u64 for a huge element.
    let scale =
        |a: u64, b: u64, c: u64| (u128::from(a) * u128::from(b) / u128::from(c.max(1))) as u64;
    // The characters kept overall, of which the short texts take theirs first.
    let keep_chars = scale(total, keep_tokens, tokens);
    let long_keep = keep_chars.saturating_sub(total - long);
    for (text, &c) in texts.iter_mut().zip(&chars) {
        if is_cut(c) {
            // This text's share of the element's tokens, and of what is kept of them.
            let own = scale(tokens, c, total).max(1);
            **text = cut_middle(text, own, scale(own, long_keep, long));
        }
    }
}

/// A tool call's arguments (a JSON text) opened so that their strings can be cut with the rest
/// of their element, then written back as JSON: arguments that are not JSON are one string.
pub struct Arguments {
    value: Value,
    json: bool,
}

impl Arguments {
    pub fn open(text: &str) -> Arguments {
        match serde_json::from_str::<Value>(text) {
            Ok(value) => Arguments { value, json: true },
            Err(_) => Arguments {
                value: Value::String(text.to_string()),
                json: false,
            },
        }
    }

    /// The strings inside, in order.
    pub fn strings(&mut self) -> Vec<&mut String> {
        strings_in(&mut self.value)
    }

    pub fn close(self) -> String {
        match self.value {
            Value::String(s) if !self.json => s,
            value => value.to_string(),
        }
    }
}

/// The `text` of each content part that has one.
pub fn part_texts(parts: &mut [Value]) -> Vec<&mut String> {
    parts
        .iter_mut()
        .filter_map(|part| match part.get_mut("text") {
            Some(Value::String(s)) => Some(s),
            _ => None,
        })
        .collect()
}

/// Every string inside a JSON value (object keys aside), in order.
pub fn strings_in(value: &mut Value) -> Vec<&mut String> {
    match value {
        Value::String(s) => vec![s],
        Value::Array(items) => items.iter_mut().flat_map(strings_in).collect(),
        Value::Object(map) => map.values_mut().flat_map(strings_in).collect(),
        _ => vec![],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_texts_share_the_cut_and_short_ones_stay() {
        let mut path = "src/main.rs".to_string();
        let mut content = "x".repeat(10_000);
        let mut note = "y".repeat(2_000);
        cut_texts(&mut [&mut path, &mut content, &mut note], 3000, 300);
        assert_eq!(path, "src/main.rs");
        assert!(
            content.len() < 1200 && content.contains("cut from the middle"),
            "{}",
            content.len()
        );
        assert!(
            note.len() < 400 && note.contains("cut from the middle"),
            "{}",
            note.len()
        );
        let mut args = Arguments::open(
            &serde_json::json!({"path": "a.rs", "content": "z".repeat(5000)}).to_string(),
        );
        cut_texts(&mut args.strings(), 1250, 100);
        let back: Value = serde_json::from_str(&args.close()).unwrap();
        assert_eq!(back["path"], "a.rs");
        assert!(back["content"].as_str().unwrap().len() < 600);
        let mut plain = Arguments::open("not json");
        assert_eq!(plain.strings().len(), 1);
        assert_eq!(plain.close(), "not json");
    }
}
