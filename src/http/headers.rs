//! Headers in and out: what a compacting route reads before it parses the body (the body's
//! content encoding, `x-compactor-mode`, the client's extra instructions for summaries), the
//! client's headers as they go upstream, and the `x-compactor-*` headers set on answers.

use http::header::IntoHeaderName;
use http::{HeaderMap, HeaderName, HeaderValue};

use std::sync::Arc;
use std::time::Duration;

use super::app::App;
use super::context_edits::ANTHROPIC_BETA;
use super::error::ApiError;
use crate::compaction::{Mode, Outcome};
use crate::upstream::CREDENTIAL_HEADERS;

/// Chat bodies are read as JSON: a compressed one is refused with a clear reason rather than
/// reported as invalid JSON.
pub(super) fn refuse_encoded_body(headers: &HeaderMap) -> Result<(), ApiError> {
    let encoding = headers
        .get_all(http::header::CONTENT_ENCODING)
        .iter()
        .map(|v| {
            String::from_utf8_lossy(v.as_bytes())
                .trim()
                .to_ascii_lowercase()
        })
        .find(|v| !v.is_empty() && v != "identity");
    match encoding {
        Some(encoding) => Err(ApiError::UnsupportedEncoding(format!(
            "request bodies with content-encoding `{encoding}` are not supported; send the JSON uncompressed"
        ))),
        None => Ok(()),
    }
}

/// Names of the headers read and written on every request, validated once at compile time
/// rather than on each lookup.
const INSTRUCTIONS: HeaderName = HeaderName::from_static("x-compactor-instructions");
const MODE: HeaderName = HeaderName::from_static("x-compactor-mode");
const PROMPT_TOKENS: HeaderName = HeaderName::from_static("x-compactor-prompt-tokens");
const CONTEXT_WINDOW: HeaderName = HeaderName::from_static("x-compactor-context-window");
const OVERHEAD_MS: HeaderName = HeaderName::from_static("x-compactor-overhead-ms");
const COMPACTED: HeaderName = HeaderName::from_static("x-compactor-compacted");
const TOKENS_BEFORE: HeaderName = HeaderName::from_static("x-compactor-tokens-before");
const TOKENS_AFTER: HeaderName = HeaderName::from_static("x-compactor-tokens-after");
const CONVERSATION: HeaderName = HeaderName::from_static("x-compactor-conversation");

/// `x-compactor-instructions`: UTF-8 as sent, or an RFC 8187 value (`UTF-8''` followed by
/// percent-encoded UTF-8) for clients that can only send ASCII headers.
pub(super) fn instructions(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get(INSTRUCTIONS) else {
        return Ok(None);
    };
    let bytes = value.as_bytes();
    let decoded: Vec<u8> = match bytes.get(..7) {
        Some(prefix) if prefix.eq_ignore_ascii_case(b"utf-8''") => {
            percent_encoding::percent_decode(&bytes[7..]).collect()
        }
        _ => bytes.to_vec(),
    };
    String::from_utf8(decoded).map(Some).map_err(|_| ApiError::BadRequest {
        message: "x-compactor-instructions is not valid UTF-8 (send UTF-8, or an RFC 8187 value: UTF-8'' followed by percent-encoded UTF-8)".into(),
        param: Some("x-compactor-instructions".into()),
        code: None,
    })
}

/// `x-compactor-mode`: `auto` when absent.
pub(super) fn mode(headers: &HeaderMap) -> Result<Mode, ApiError> {
    match headers.get(MODE).and_then(|v| v.to_str().ok()) {
        None => Ok(Mode::Auto),
        // The value is not repeated: refusals are logged, and a header may hold anything.
        Some(v) => Mode::parse(v).ok_or_else(|| ApiError::BadRequest {
            message: "invalid x-compactor-mode: expected auto, force or off".into(),
            param: Some("x-compactor-mode".into()),
            code: None,
        }),
    }
}

/// Headers that say which version of a provider's API a request is written for, and which of
/// its betas and accounts it uses: a summary request made on the client's behalf needs them as
/// much as the client's own (Anthropic refuses a request without `anthropic-version`, and a
/// summary that continues the conversation carries its beta tools and features).
const PROVIDER_HEADERS: [HeaderName; 4] = [
    HeaderName::from_static("anthropic-version"),
    ANTHROPIC_BETA,
    HeaderName::from_static("openai-organization"),
    HeaderName::from_static("openai-project"),
];

/// The client's credential and provider headers, for summary requests made on its behalf
/// (without the betas Compactor serves itself, which a summary request never uses).
pub(super) fn credential_headers(headers: &HeaderMap) -> Arc<HeaderMap> {
    // One pass over the request's few headers: a lookup of each of the seven names wanted
    // would hash and probe for each, and most are never sent.
    let mut out = HeaderMap::new();
    let mut betas = false;
    for (name, value) in headers {
        if CREDENTIAL_HEADERS.contains(name) || PROVIDER_HEADERS.contains(name) {
            betas |= *name == ANTHROPIC_BETA;
            out.append(name.clone(), value.clone());
        }
    }
    if betas {
        super::context_edits::strip_served_betas(&mut out);
    }
    Arc::new(out)
}

/// The client's headers as they go upstream: our own `x-compactor-*` headers removed.
pub(super) fn forwarded_headers(headers: &HeaderMap) -> HeaderMap {
    // Copied into a map with room for what is added on the way. A clone would hold exactly
    // the entries the client sent, and the map lives on: hyper keeps a connection's last
    // request map to parse the provider's answer into, and the answer's headers and then
    // the `x-compactor-*` ones would grow it twice (an index table can have room while its
    // entries have none, and `HeaderMap::reserve` then does nothing).
    let mut out = HeaderMap::with_capacity(headers.len() + ADDED_ON_THE_WAY);
    for (name, value) in headers {
        if !name.as_str().starts_with("x-compactor-") {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

/// Headers a forwarded map takes on after the client's: the provider's `Host`, a configured
/// key, trace context, and in the answer the provider's own and [`outcome_headers`].
const ADDED_ON_THE_WAY: usize = 8 + OUTCOME_HEADERS_AT_MOST;

/// Sets a header the proxy writes; a value that is not a valid header value is left out.
pub(super) fn set(headers: &mut HeaderMap, name: impl IntoHeaderName, value: impl ToString) {
    // From the `String` itself: its bytes become the value's without a second copy.
    if let Ok(v) = HeaderValue::try_from(value.to_string()) {
        headers.insert(name, v);
    }
}

/// The `x-compactor-*` headers that say what happened to a request.
pub(super) fn outcome_headers(
    app: &App,
    headers: &mut HeaderMap,
    outcome: &Outcome,
    overhead: Duration,
) {
    // Room for every header below at once: the provider's answer comes with a map sized for
    // its own headers, which would otherwise grow more than once.
    headers.reserve(OUTCOME_HEADERS_AT_MOST);
    headers.insert(PROMPT_TOKENS, outcome.prompt_tokens.into());
    headers.insert(CONTEXT_WINDOW, outcome.window.into());
    headers.insert(OVERHEAD_MS, milliseconds_to_the_microsecond(overhead));
    headers.insert(
        COMPACTED,
        HeaderValue::from_static(if outcome.compacted { "true" } else { "false" }),
    );
    headers.insert(TOKENS_BEFORE, outcome.tokens_before.into());
    headers.insert(TOKENS_AFTER, outcome.tokens_after.into());
    if let Some(id) = &outcome.checkpoint_id {
        set(headers, "x-compactor-checkpoint", id);
    }
    // What the conversation's page and timeline endpoints name it by.
    if let (Some(_), Some(anchor)) = (app.timeline, &outcome.anchor) {
        set(headers, CONVERSATION, anchor);
    }
    if !outcome.summary_time.is_zero() {
        set(
            headers,
            "x-compactor-summary-ms",
            outcome.summary_time.as_millis(),
        );
    }
    if let Some(status) = &outcome.status {
        set(headers, "x-compactor-compaction", status.header_value());
    }
    if outcome.ready_checkpoint_used {
        set(headers, "x-compactor-ready-checkpoint", "true");
    }
    // Checked again now: the store may have noticed an outage while serving this request.
    if outcome.store_degraded || !app.engine.store().healthy() {
        set(headers, "x-compactor-store", "degraded");
    }
}

/// How many headers [`outcome_headers`] sets at most.
const OUTCOME_HEADERS_AT_MOST: usize = 12;

/// `duration` in whole microseconds, rounded: what the overhead header and the log line give.
/// In 64 bits (584,000 years of microseconds), spared a 128-bit division.
pub(super) fn rounded_micros(duration: Duration) -> u64 {
    duration
        .as_secs()
        .saturating_mul(1_000_000)
        .saturating_add(u64::from((duration.subsec_nanos() + 500) / 1000))
}

/// `duration` in milliseconds with three decimals (`0.046`), rounded to the microsecond.
fn milliseconds_to_the_microsecond(duration: Duration) -> HeaderValue {
    let mut text = Vec::with_capacity(24);
    write_milliseconds(rounded_micros(duration), &mut text);
    HeaderValue::try_from(text).unwrap_or(HeaderValue::from_static("0.000"))
}

/// `micros` as milliseconds with three decimals (`0.046`), written from integers, sparing every
/// request a float's formatting.
pub(super) fn write_milliseconds(micros: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(itoa::Buffer::new().format(micros / 1000).as_bytes());
    let fraction = micros % 1000;
    out.push(b'.');
    for digit in [fraction / 100, fraction / 10 % 10, fraction % 10] {
        out.push(b'0' + digit as u8);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_overhead_is_written_as_milliseconds_with_three_decimals() {
        for (nanos, text) in [
            (0, "0.000"),
            (499, "0.000"),
            (500, "0.001"),
            (46_200, "0.046"),
            (999_600, "1.000"),
            (1_234_567, "1.235"),
            (12_000_000, "12.000"),
            (3_600_000_000_000, "3600000.000"),
        ] {
            let value = milliseconds_to_the_microsecond(Duration::from_nanos(nanos));
            assert_eq!(value.to_str().unwrap(), text, "{nanos} ns");
        }
        // The same text the float formatting wrote, wherever the value is not a tie.
        for nanos in (0..5_000_000u64).step_by(7_919) {
            let duration = Duration::from_nanos(nanos);
            let float = format!("{:.3}", duration.as_secs_f64() * 1000.0);
            let micros_tie = nanos % 1000 == 500;
            if !micros_tie {
                assert_eq!(
                    milliseconds_to_the_microsecond(duration).to_str().unwrap(),
                    float
                );
            }
        }
    }

    #[test]
    fn forwarded_headers_keep_the_clients_in_order_and_leave_room_for_the_answers() {
        let mut sent = HeaderMap::new();
        sent.insert("content-type", HeaderValue::from_static("application/json"));
        sent.append("x-api-key", HeaderValue::from_static("k1"));
        sent.insert("x-compactor-mode", HeaderValue::from_static("off"));
        sent.append("x-api-key", HeaderValue::from_static("k2"));
        sent.insert("user-agent", HeaderValue::from_static("agent"));
        sent.insert("X-Compactor-Window", HeaderValue::from_static("4000"));
        let forwarded = forwarded_headers(&sent);
        let pairs: Vec<(&str, &str)> = forwarded
            .iter()
            .map(|(n, v)| (n.as_str(), v.to_str().unwrap()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("content-type", "application/json"),
                ("x-api-key", "k1"),
                ("x-api-key", "k2"),
                ("user-agent", "agent"),
            ]
        );
        // Room for an answer's headers and the proxy's own beside them, without growing.
        assert!(forwarded.capacity() >= forwarded.len() + ADDED_ON_THE_WAY);
    }

    #[test]
    fn summary_requests_get_the_credential_and_provider_headers_with_their_repeats() {
        let mut sent = HeaderMap::new();
        sent.insert("content-type", HeaderValue::from_static("application/json"));
        sent.append("x-api-key", HeaderValue::from_static("k1"));
        sent.insert("anthropic-version", HeaderValue::from_static("2023-06-01"));
        sent.append("x-api-key", HeaderValue::from_static("k2"));
        sent.insert("authorization", HeaderValue::from_static("Bearer t"));
        sent.insert("user-agent", HeaderValue::from_static("agent"));
        sent.insert("openai-project", HeaderValue::from_static("p"));
        let kept = credential_headers(&sent);
        let values = |name: &str| -> Vec<&str> {
            kept.get_all(name)
                .iter()
                .map(|v| v.to_str().unwrap())
                .collect()
        };
        assert_eq!(values("x-api-key"), ["k1", "k2"], "repeats kept, in order");
        assert_eq!(values("authorization"), ["Bearer t"]);
        assert_eq!(values("anthropic-version"), ["2023-06-01"]);
        assert_eq!(values("openai-project"), ["p"]);
        assert_eq!(kept.len(), 5, "nothing else: {kept:?}");

        // The betas the proxy serves itself are taken out; the client's others stay.
        sent.insert(
            "anthropic-beta",
            HeaderValue::from_static("context-management-2025-06-27, files-api-2025-04-14"),
        );
        let kept = credential_headers(&sent);
        assert_eq!(
            kept.get_all("anthropic-beta").iter().collect::<Vec<_>>(),
            ["files-api-2025-04-14"]
        );
    }
}
