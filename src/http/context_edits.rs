//! The context edits a Messages client asks for (`context_management`), served by Compactor
//! when its provider does not offer them (`[messages] context_management`): the beta flags of
//! the features served here taken off the request, and the answer given the
//! `context_management` object the provider would have added. The clearing itself is the
//! engine's ([`crate::compaction::Engine::clear_context`]).
//!
//! Where Anthropic puts that object: at the top of a whole answer (a message, or a
//! `count_tokens` result, which carries `original_input_tokens`), and in a stream's
//! `message_delta` event.

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use http::{HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;

use super::sse_events::EventSplitter;
use crate::dialect::anthropic::edits::{self, SERVED_BETAS};
use crate::dialect::splice::{self, Fields};
use crate::upstream::ByteStream;

/// Most bytes of a whole answer held to add the object; a larger one goes on as it came.
const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;

/// Named once: a name given as text is checked and hashed from its bytes at every use.
pub(super) const ANTHROPIC_BETA: HeaderName = HeaderName::from_static("anthropic-beta");

/// Takes the flags of the features Compactor serves itself off `anthropic-beta`, so a provider
/// that does not know them is not asked for them; the header goes when nothing is left.
pub(super) fn strip_served_betas(headers: &mut HeaderMap) {
    // Every request's summary headers pass through here: most carry no betas at all.
    if !headers.contains_key(ANTHROPIC_BETA) {
        return;
    }
    let kept: Vec<String> = headers
        .get_all(ANTHROPIC_BETA)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|flag| !flag.is_empty() && !SERVED_BETAS.contains(flag))
        .map(str::to_string)
        .collect();
    headers.remove(ANTHROPIC_BETA);
    if let Ok(value) = HeaderValue::from_str(&kept.join(",")) {
        if !kept.is_empty() {
            headers.insert(ANTHROPIC_BETA, value);
        }
    }
}

/// `object` (a JSON object's bytes) with `key` set to `value`: in place when present, else last;
/// `None` when it is not an object.
fn with_field(object: &[u8], key: &str, value: &Value) -> Option<Vec<u8>> {
    let fields: Fields = splice::top_level_fields(object).ok()?;
    let present = fields.contains_key(key);
    let value = splice::to_raw(value);
    Some(splice::write_object(
        &fields,
        object.len() + value.get().len() + key.len() + 4,
        |name, original, out| {
            let raw = if name == key { &*value } else { original };
            out.extend_from_slice(raw.get().as_bytes());
        },
        |out| {
            if !present {
                if !fields.is_empty() {
                    out.push(b',');
                }
                out.extend_from_slice(format!("\"{key}\":{}", value.get()).as_bytes());
            }
        },
    ))
}

/// A whole answer through `rewrite`, once all of it arrived; one too large to hold goes on
/// unchanged.
pub(super) fn map_whole(
    body: ByteStream,
    rewrite: impl FnOnce(Bytes) -> Bytes + Send + 'static,
) -> ByteStream {
    let whole = async move {
        let mut body = body;
        let mut held = BytesMut::new();
        while let Some(chunk) = body.next().await {
            let chunk = chunk?;
            held.extend_from_slice(&chunk);
            if held.len() > MAX_ANSWER_BYTES {
                // Too large to hold: what was read goes first, then the rest as it comes.
                let head = futures::stream::once(async move { Ok(held.freeze()) });
                return Ok::<_, std::io::Error>(head.chain(body).boxed());
            }
        }
        let out = rewrite(held.freeze());
        Ok(futures::stream::once(async move { Ok(out) }).boxed())
    };
    futures::stream::once(whole)
        .flat_map(|held| match held {
            Ok(stream) => stream,
            Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
        })
        .boxed()
}

/// A whole JSON answer with `context_management` set to what `make` writes from the answer's
/// fields. An answer that is not an object, or too large, goes on unchanged.
pub(super) fn annotate_json(
    body: ByteStream,
    make: impl FnOnce(&Fields) -> Value + Send + 'static,
) -> ByteStream {
    map_whole(body, move |held| {
        let annotated = splice::top_level_fields(&held)
            .ok()
            .and_then(|fields| with_field(&held, edits::FIELD, &make(&fields)));
        annotated.map_or(held, Bytes::from)
    })
}

/// A Messages answer with `context_management: {"applied_edits": …}`.
pub(super) fn annotate_message(body: ByteStream, applied_edits: Value) -> ByteStream {
    annotate_json(body, move |_| applied_edits)
}

/// A `count_tokens` answer with `context_management: {"original_input_tokens": …}`: its count
/// plus what the edits cleared.
pub(super) fn annotate_count(
    body: ByteStream,
    applied: Vec<crate::dialect::AppliedEdit>,
) -> ByteStream {
    annotate_json(body, move |fields| {
        let counted = fields
            .get("input_tokens")
            .and_then(|raw| serde_json::from_str::<u64>(raw.get()).ok())
            .unwrap_or(0);
        edits::counted_before_edits(counted, &applied)
    })
}

/// A Messages stream whose `message_delta` events carry `context_management`. Other events
/// pass as they came.
pub(super) fn annotate_stream(body: ByteStream, applied_edits: Value) -> ByteStream {
    map_events(body, move |event| annotated_event(event, &applied_edits))
}

/// An SSE stream with each complete event through `rewrite`; events are held only until
/// complete, and a last one without its blank line goes on as it is.
pub(super) fn map_events(
    body: ByteStream,
    rewrite: impl FnMut(&[u8]) -> Vec<u8> + Send + 'static,
) -> ByteStream {
    struct Reading<F> {
        body: ByteStream,
        events: EventSplitter,
        rewrite: F,
        done: bool,
    }
    let start = Reading {
        body,
        events: EventSplitter::default(),
        rewrite,
        done: false,
    };
    futures::stream::unfold(start, |mut reading| async move {
        loop {
            if reading.done {
                return None;
            }
            match reading.body.next().await {
                Some(Ok(chunk)) => {
                    let Reading {
                        events, rewrite, ..
                    } = &mut reading;
                    let mut out = Vec::new();
                    let let_go =
                        events.feed(&chunk, |event| out.extend_from_slice(&rewrite(event)));
                    if let Some(overlong) = let_go {
                        // Not an event to rewrite: it goes on as it came rather than grow.
                        out.extend_from_slice(&overlong);
                    }
                    if out.is_empty() {
                        continue;
                    }
                    return Some((Ok(Bytes::from(out)), reading));
                }
                Some(Err(e)) => {
                    reading.done = true;
                    return Some((Err(e), reading));
                }
                None => {
                    reading.done = true;
                    let rest = reading.events.finish()?;
                    return Some((Ok(rest), reading));
                }
            }
        }
    })
    .boxed()
}

/// One event, with `context_management` in its data when it is a `message_delta`.
fn annotated_event(event: &[u8], applied_edits: &Value) -> Vec<u8> {
    let Ok(text) = std::str::from_utf8(event) else {
        return event.to_vec();
    };
    let data_line = text.lines().find_map(|l| l.strip_prefix("data:"));
    let Some(data) = data_line.map(str::trim) else {
        return event.to_vec();
    };
    let is_delta =
        crate::dialect::event_fields::event_type(data).as_deref() == Some("message_delta");
    let annotated = is_delta
        .then(|| with_field(data.as_bytes(), edits::FIELD, applied_edits))
        .flatten();
    let Some(annotated) = annotated.and_then(|a| String::from_utf8(a).ok()) else {
        return event.to_vec();
    };
    let newline = if text.contains("\r\n") { "\r\n" } else { "\n" };
    let mut out = String::with_capacity(text.len() + 128);
    for line in text.lines() {
        if line.starts_with("event:") {
            out.push_str(line);
        } else if line.starts_with("data:") {
            out.push_str("data: ");
            out.push_str(&annotated);
        } else {
            continue;
        }
        out.push_str(newline);
    }
    out.push_str(newline);
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn source(chunks: &[&'static str]) -> ByteStream {
        let items: Vec<Result<Bytes, std::io::Error>> = chunks
            .iter()
            .map(|c| Ok(Bytes::from_static(c.as_bytes())))
            .collect();
        futures::stream::iter(items).boxed()
    }

    async fn collect(stream: ByteStream) -> String {
        let parts: Vec<Bytes> = stream.map(|c| c.unwrap()).collect().await;
        String::from_utf8(parts.concat()).unwrap()
    }

    #[tokio::test]
    async fn a_whole_answer_gets_the_object_last_and_keeps_its_bytes() {
        let object = json!({"applied_edits": []});
        let out = collect(annotate_message(
            source(&[r#"{"id":"m","usage":{"input_tokens":1.0}"#, "}"]),
            object.clone(),
        ))
        .await;
        assert_eq!(
            out,
            r#"{"id":"m","usage":{"input_tokens":1.0},"context_management":{"applied_edits":[]}}"#
        );
        let replaced = collect(annotate_message(
            source(&[r#"{"context_management":null,"id":"m"}"#]),
            object,
        ))
        .await;
        assert_eq!(
            replaced,
            r#"{"context_management":{"applied_edits":[]},"id":"m"}"#
        );
    }

    #[tokio::test]
    async fn only_the_message_delta_event_is_rewritten() {
        let start = "event: message_start\ndata: {\"type\":\"message_start\"}\n\n";
        let stop = "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        let out = collect(annotate_stream(
            source(&[
                start,
                "event: message_delta\ndata: {\"type\":\"message_de",
                "lta\",\"usage\":{\"output_tokens\":2}}\n\n",
                stop,
            ]),
            json!({"applied_edits": []}),
        ))
        .await;
        let delta = "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":2},\"context_management\":{\"applied_edits\":[]}}\n\n";
        assert_eq!(out, format!("{start}{delta}{stop}"));
    }

    #[test]
    fn served_betas_leave_and_others_stay() {
        let mut headers = HeaderMap::new();
        headers.append(
            "anthropic-beta",
            HeaderValue::from_static(
                "context-management-2025-06-27, interleaved-thinking-2025-05-14",
            ),
        );
        headers.append(
            "anthropic-beta",
            HeaderValue::from_static("compact-2026-01-12"),
        );
        strip_served_betas(&mut headers);
        assert_eq!(
            headers.get_all("anthropic-beta").iter().collect::<Vec<_>>(),
            ["interleaved-thinking-2025-05-14"]
        );
        let mut only = HeaderMap::new();
        only.insert(
            "anthropic-beta",
            HeaderValue::from_static("context-management-2025-06-27"),
        );
        strip_served_betas(&mut only);
        assert!(only.get("anthropic-beta").is_none());
    }
}
