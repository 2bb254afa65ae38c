//! Recognising "the context window is full" in providers' error responses, and reading the real
//! window out of them when they state it.
//!
//! Structured fields (`code`, `type`) are preferred; otherwise the message is matched
//! case-insensitively against what each provider is known to say. A 429 is a rate limit, never
//! an overflow, whatever its text.

use std::sync::LazyLock;

use regex::Regex;

/// An upstream error that means the prompt did not fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overflow {
    /// The window the provider stated, when it did.
    pub limit: Option<u64>,
    /// The prompt size the provider counted, when it said.
    pub requested: Option<u64>,
}

static MESSAGE_PATTERNS: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    [
        r"maximum context length is \d+",
        r"exceeds the context window",
        r"prompt is too long",
        r"input is too long for requested model",
        r"input token count.*exceeds the maximum",
        r"maximum prompt length is \d+",
        r"reduce the length of the messages",
        r"context length is only \d+",
        r"input length.*exceeds.*context length",
        r"exceeds the limit of \d+",
        r"exceeds the available context size",
        r"greater than the context length",
        r"too large for model with \d+ maximum context length",
        r"context window exceeds limit",
        r"exceeded model token limit",
        r"model_context_window_exceeded",
        r"context[_ ]length[_ ]exceeded",
        r"request entity too large",
        r"too many tokens",
        r"token limit exceeded",
    ]
    .iter()
    .map(|p| Regex::new(&format!("(?is){p}")).expect("static pattern"))
    .collect()
});

static BARE_STATUS: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)^\s*4(00|13)\s*(status code)?\s*\(no body\)").expect("static pattern")
});

/// Patterns that state the window; the first capture group is the number.
static LIMIT_PATTERNS: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    [
        r"maximum context length is (\d+)",
        r"> (\d+) maximum",
        r"context size \((\d+) tokens\)",
        r"maximum number of tokens allowed \((\d+)\)",
        r"maximum prompt length is (\d+)",
        r"context length is only (\d+)",
        r"limit of (\d+)",
        r"model with (\d+) maximum context length",
        r"context window of (\d+)",
    ]
    .iter()
    .map(|p| Regex::new(&format!("(?i){p}")).expect("static pattern"))
    .collect()
});

/// Patterns that state the prompt's size as the provider counted it.
static REQUESTED_PATTERNS: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    [
        r"resulted in (\d+) tokens",
        r"request \((\d+) tokens\)",
        r"prompt is too long: (\d+) tokens",
        r"requested (?:about )?(\d+) tokens",
        r"request contains (\d+) tokens",
        r"input token count \((\d+)\)",
        r"prompt token count of (\d+)",
        r"prompt contains (\d+) tokens",
    ]
    .iter()
    .map(|p| Regex::new(&format!("(?i){p}")).expect("static pattern"))
    .collect()
});

/// Classifies an upstream error response.
pub fn classify(status: u16, body: &[u8]) -> Option<Overflow> {
    if status == 429 || status < 400 {
        return None;
    }
    let text = String::from_utf8_lossy(body);
    let json: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let error = json.as_ref().map(|v| v.get("error").unwrap_or(v));
    let field = |name: &str| {
        error
            .and_then(|e| e.get(name))
            .and_then(|v| v.as_str())
            .unwrap_or("")
    };
    let message = match error
        .and_then(|e| e.get("message"))
        .and_then(|m| m.as_str())
    {
        Some(m) => m.to_string(),
        None => text.to_string(),
    };
    let structured = matches!(
        field("code"),
        "context_length_exceeded" | "model_context_window_exceeded"
    ) || matches!(
        field("type"),
        "exceed_context_size_error" | "context_length_exceeded"
    );
    let matched = structured
        || MESSAGE_PATTERNS.iter().any(|p| p.is_match(&message))
        || (status == 413)
        || BARE_STATUS.is_match(&message);
    if !matched {
        return None;
    }
    let n_ctx = error.and_then(|e| e.get("n_ctx")).and_then(|v| v.as_u64());
    let limit = n_ctx.or_else(|| {
        LIMIT_PATTERNS
            .iter()
            .find_map(|p| p.captures(&message).and_then(|c| c[1].parse::<u64>().ok()))
    });
    let n_prompt = error
        .and_then(|e| e.get("n_prompt_tokens"))
        .and_then(|v| v.as_u64());
    let requested = n_prompt.or_else(|| {
        REQUESTED_PATTERNS
            .iter()
            .find_map(|p| p.captures(&message).and_then(|c| c[1].parse::<u64>().ok()))
    });
    Some(Overflow {
        limit: limit.filter(|l| *l >= 64),
        requested,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(status: u16, body: &str) -> Option<Option<u64>> {
        classify(status, body.as_bytes()).map(|o| o.limit)
    }

    #[test]
    fn recognises_each_provider() {
        let cases: &[(u16, &str, Option<u64>)] = &[
            (
                400,
                r#"{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 130512 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
                Some(128000),
            ),
            (
                400,
                r#"{"error":{"message":"Your input exceeds the context window of this model.","code":null}}"#,
                None,
            ),
            (
                400,
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 213462 tokens > 200000 maximum"}}"#,
                Some(200000),
            ),
            (
                400,
                r#"{"message":"Input is too long for requested model."}"#,
                None,
            ),
            (
                400,
                r#"{"error":{"code":400,"message":"The input token count (1196265) exceeds the maximum number of tokens allowed (1048575).","status":"INVALID_ARGUMENT"}}"#,
                Some(1048575),
            ),
            (
                400,
                r#"{"error":{"message":"This model's maximum prompt length is 131072 but the request contains 537812 tokens."}}"#,
                Some(131072),
            ),
            (
                400,
                r#"{"error":{"message":"Please reduce the length of the messages or completion.","type":"invalid_request_error"}}"#,
                None,
            ),
            (
                400,
                r#"{"error":{"message":"This endpoint's maximum context length is 65536 tokens. However, you requested about 70000 tokens."}}"#,
                Some(65536),
            ),
            (
                400,
                r#"{"object":"error","message":"This model's maximum context length is 32768 tokens. However, you requested 40000 tokens","type":"BadRequestError","code":400}"#,
                Some(32768),
            ),
            (
                400,
                r#"{"error":{"message":"prompt token count of 140000 exceeds the limit of 128000"}}"#,
                Some(128000),
            ),
            (
                400,
                r#"{"error":{"code":400,"message":"request (3036 tokens) exceeds the available context size (2048 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":3036,"n_ctx":2048}}"#,
                Some(2048),
            ),
            (
                400,
                r#"{"error":"The number of tokens to keep from the initial prompt is greater than the context length"}"#,
                None,
            ),
            (
                400,
                r#"{"object":"error","message":"Prompt contains 40000 tokens, too large for model with 32768 maximum context length","type":"invalid_request_error"}"#,
                Some(32768),
            ),
            (
                400,
                r#"{"error":{"message":"context window exceeds limit"}}"#,
                None,
            ),
            (
                400,
                r#"{"error":{"message":"Invalid request: Your request exceeded model token limit: 131072"}}"#,
                None,
            ),
            (400, "400 status code (no body)", None),
            (413, "", None),
            (413, "<html>Request Entity Too Large</html>", None),
        ];
        for (status, body, expected) in cases {
            assert_eq!(limit(*status, body), Some(*expected), "{body}");
        }
        let llama = r#"{"error":{"code":400,"message":"request (3036 tokens) exceeds the available context size (2048 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":3036,"n_ctx":2048}}"#;
        assert_eq!(
            classify(400, llama.as_bytes()).unwrap().requested,
            Some(3036)
        );
        let openai = r#"{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 130512 tokens.","code":"context_length_exceeded"}}"#;
        assert_eq!(
            classify(400, openai.as_bytes()).unwrap().requested,
            Some(130512)
        );
    }

    #[test]
    fn ignores_other_errors() {
        assert_eq!(
            limit(
                429,
                r#"{"error":{"message":"Rate limit reached for tokens per min (TPM): too many tokens"}}"#
            ),
            None
        );
        assert_eq!(
            limit(
                400,
                r#"{"error":{"message":"Invalid value for 'temperature'"}}"#
            ),
            None
        );
        assert_eq!(
            limit(401, r#"{"error":{"message":"Incorrect API key provided"}}"#),
            None
        );
        assert_eq!(limit(200, r#"{"choices":[]}"#), None);
    }
}
