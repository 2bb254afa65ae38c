//! What the chat route reads from request headers before it parses the body: the body's
//! content encoding, and the client's extra instructions for summaries.

use http::HeaderMap;

use super::error::ApiError;

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

/// `x-compactor-instructions`: UTF-8 as sent, or an RFC 8187 value (`UTF-8''` followed by
/// percent-encoded UTF-8) for clients that can only send ASCII headers.
pub(super) fn instructions(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get("x-compactor-instructions") else {
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
