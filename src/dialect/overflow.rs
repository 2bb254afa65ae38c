//! Recognising "the context window is full" in providers' error responses, and reading the real
//! window out of them when they state it.
//!
//! Structured fields (`code`, `type`) are preferred; otherwise the message is matched
//! case-insensitively against what each provider is known to say. A 429 is a rate limit, never
//! an overflow, whatever its text.
//!
//! Recognising an overflow (worth one harder-compacted retry) is not the same as believing what
//! it says: the window learned from it is shared by every tenant, and error messages often
//! quote the client's own input back. An overflow is [`Overflow::trusted`] only when it has the
//! provider's own shape: a JSON error with status 400 or 413, no other error code or parameter,
//! stated figures that agree with each other, and wording that is not an echo of a string the
//! client sent ([`Overflow::unless_echoed`]). A bare 413, an HTML page or an empty body teaches
//! nothing.

use std::sync::LazyLock;

use regex::Regex;

/// An upstream error that means the prompt did not fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overflow {
    /// The window the provider stated, when it did.
    pub limit: Option<u64>,
    /// The prompt size the provider counted, when it said.
    pub requested: Option<u64>,
    /// Whether the response is the provider's own overflow error, so that its figures may be
    /// learned; otherwise it only earns a retry.
    pub trusted: bool,
}

/// `code` values of providers' overflow errors.
const OVERFLOW_CODES: &[&str] = &["context_length_exceeded", "model_context_window_exceeded"];
/// `type` values of providers' overflow errors.
const OVERFLOW_TYPES: &[&str] = &["exceed_context_size_error", "context_length_exceeded"];
/// `param` values an overflow error may name (the part of the request that is too long).
const OVERFLOW_PARAMS: &[&str] = &["messages", "input", "prompt"];

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
    let json: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let error = json.as_ref().map(|v| v.get("error").unwrap_or(v));
    let field = |name: &str| error.and_then(|e| e.get(name));
    let text = |name: &str| field(name).and_then(|v| v.as_str());
    let number = |name: &str| field(name).and_then(|v| v.as_u64());
    let message = message_of(body, error);
    let structured = text("code").is_some_and(|c| OVERFLOW_CODES.contains(&c))
        || text("type").is_some_and(|t| OVERFLOW_TYPES.contains(&t));
    let worded = MESSAGE_PATTERNS.iter().any(|p| p.is_match(&message));
    let bare = status == 413 || BARE_STATUS.is_match(&message);
    if !(structured || worded || bare) {
        return None;
    }
    let limit = number("n_ctx")
        .or_else(|| first_number(&LIMIT_PATTERNS, &message))
        .filter(|l| *l >= 64);
    let requested =
        number("n_prompt_tokens").or_else(|| first_number(&REQUESTED_PATTERNS, &message));
    // Another error that happens to mention tokens names its own code or parameter.
    let other_code = text("code").is_some_and(|c| !OVERFLOW_CODES.contains(&c));
    let other_param = text("param").is_some_and(|p| !OVERFLOW_PARAMS.contains(&p));
    // llama.cpp states its window in `n_ctx` whenever its overflow type is set.
    let missing_limit_field =
        text("type") == Some("exceed_context_size_error") && number("n_ctx").is_none();
    // An overflow whose prompt fits its own stated window contradicts itself.
    let contradicts_itself = matches!((limit, requested), (Some(l), Some(r)) if r <= l);
    let trusted = json.is_some()
        && matches!(status, 400 | 413)
        && (structured || worded)
        && !other_code
        && !other_param
        && !missing_limit_field
        && !contradicts_itself;
    Some(Overflow {
        limit,
        requested,
        trusted,
    })
}

/// The error's message: the `message` field when the body is a JSON error, else the whole body.
fn message_of(body: &[u8], error: Option<&serde_json::Value>) -> String {
    match error
        .and_then(|e| e.get("message"))
        .and_then(|m| m.as_str())
    {
        Some(m) => m.to_string(),
        None => String::from_utf8_lossy(body).into_owned(),
    }
}

fn first_number(patterns: &[Regex], message: &str) -> Option<u64> {
    patterns
        .iter()
        .find_map(|p| p.captures(message).and_then(|c| c[1].parse::<u64>().ok()))
}

impl Overflow {
    /// This overflow, no longer trusted when the words that make it one (or the figures it
    /// states) appear in a string the client sent (`sent`, a JSON body): the provider may be
    /// quoting the client's input back, as in "Invalid tool_choice: <value>". Errors whose
    /// `code` or `type` says overflow are the provider's own and are not checked.
    pub fn unless_echoed(self, error_body: &[u8], sent: &[u8]) -> Overflow {
        if !self.trusted {
            return self;
        }
        let json: Option<serde_json::Value> = serde_json::from_slice(error_body).ok();
        let error = json.as_ref().map(|v| v.get("error").unwrap_or(v));
        let says = |name: &str, values: &[&str]| {
            error
                .and_then(|e| e.get(name))
                .and_then(|v| v.as_str())
                .is_some_and(|v| values.contains(&v))
        };
        if says("code", OVERFLOW_CODES) || says("type", OVERFLOW_TYPES) {
            return self;
        }
        let message = message_of(error_body, error);
        let phrases: Vec<String> = MESSAGE_PATTERNS
            .iter()
            .chain(LIMIT_PATTERNS.iter())
            .chain(REQUESTED_PATTERNS.iter())
            .filter_map(|p| p.find(&message))
            .map(|m| m.as_str().to_lowercase())
            .collect();
        let echoed = match serde_json::from_slice::<serde_json::Value>(sent) {
            Ok(value) => any_string(&value, &mut |s| {
                let s = s.to_lowercase();
                phrases.iter().any(|p| s.contains(p.as_str()))
            }),
            // Not JSON: compare with the raw text.
            Err(_) => {
                let s = String::from_utf8_lossy(sent).to_lowercase();
                phrases.iter().any(|p| s.contains(p.as_str()))
            }
        };
        Overflow {
            trusted: !echoed,
            ..self
        }
    }
}

/// Whether `test` holds for any string in `value`, object keys included.
fn any_string(value: &serde_json::Value, test: &mut impl FnMut(&str) -> bool) -> bool {
    match value {
        serde_json::Value::String(s) => test(s),
        serde_json::Value::Array(items) => items.iter().any(|v| any_string(v, test)),
        serde_json::Value::Object(map) => map.iter().any(|(k, v)| test(k) || any_string(v, test)),
        _ => false,
    }
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
            let bare = body.is_empty() || body.starts_with('<') || body.starts_with("400 ");
            assert_eq!(
                classify(*status, body.as_bytes()).unwrap().trusted,
                !bare,
                "only JSON errors teach: {body}"
            );
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

    const ATTACK: &str = "This model's maximum context length is 64 tokens";

    fn sent_with_tool_choice(value: &str) -> Vec<u8> {
        serde_json::json!({"model": "m", "tool_choice": value, "messages": [{"role": "user", "content": "hi"}]})
            .to_string()
            .into_bytes()
    }

    #[test]
    fn an_echo_of_the_clients_input_is_not_trusted() {
        // llama.cpp quotes an invalid `tool_choice` back in a plain 400.
        let echo = serde_json::json!({"error": {"code": 400, "type": "invalid_request_error",
            "message": format!("Invalid tool_choice: {ATTACK}")}})
        .to_string();
        let seen = classify(400, echo.as_bytes()).unwrap();
        assert_eq!(seen.limit, Some(64));
        let sent = sent_with_tool_choice(ATTACK);
        assert!(!seen.unless_echoed(echo.as_bytes(), &sent).trusted);
        // The same words escaped differently in the client's JSON are the same string.
        let escaped =
            br#"{"model":"m","tool_choice":"This model's MAXIMUM context length is 64 tokens"}"#;
        assert!(!seen.unless_echoed(echo.as_bytes(), escaped).trusted);
        // A client that sent nothing like it: the provider's own words.
        let plain = sent_with_tool_choice("auto");
        assert!(seen.unless_echoed(echo.as_bytes(), &plain).trusted);

        // OpenAI names the parameter and its own code: not an overflow error at all.
        let openai = serde_json::json!({"error": {"message": format!("Invalid value: '{ATTACK}'. Supported values are: 'none', 'auto', and 'required'."),
            "type": "invalid_request_error", "param": "tool_choice", "code": "invalid_value"}})
        .to_string();
        assert!(!classify(400, openai.as_bytes()).unwrap().trusted);
    }

    #[test]
    fn structured_overflows_are_trusted_even_when_the_conversation_quotes_one() {
        let llama = r#"{"error":{"code":400,"message":"request (3036 tokens) exceeds the available context size (2048 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":3036,"n_ctx":2048}}"#;
        let sent = sent_with_tool_choice("exceeds the available context size (2048 tokens)");
        let seen = classify(400, llama.as_bytes()).unwrap();
        assert!(seen.unless_echoed(llama.as_bytes(), &sent).trusted);
        // Its type without the window field is not llama.cpp's shape.
        let no_field = r#"{"error":{"code":400,"message":"exceeds the available context size (2048 tokens)","type":"exceed_context_size_error"}}"#;
        assert!(!classify(400, no_field.as_bytes()).unwrap().trusted);
    }

    #[test]
    fn figures_that_contradict_each_other_are_not_trusted() {
        let fits = r#"{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 100 tokens."}}"#;
        let seen = classify(400, fits.as_bytes()).unwrap();
        assert_eq!(seen.limit, Some(8192));
        assert!(!seen.trusted);
        // Only 400 and 413 are overflow statuses.
        let real = r#"{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.","code":"context_length_exceeded"}}"#;
        assert!(classify(400, real.as_bytes()).unwrap().trusted);
        assert!(!classify(500, real.as_bytes()).unwrap().trusted);
    }
}
