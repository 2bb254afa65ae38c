//! Text helpers every dialect's transcript and renderer share: cutting the middle out of a long
//! text with a marker saying how much went, and the lengths a transcript copies whole. Part of
//! the seam: it imports nothing of the crate.

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
