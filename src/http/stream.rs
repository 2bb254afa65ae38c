//! Response bodies on their way to the client: forwarded chunk by chunk, watched for `usage`
//! (read in the answer's dialect, [`Dialect::reported_usage`]), which is handed on once the body
//! has ended or was dropped.
//!
//! A streaming body's events are read whole however the provider's chunks cut them
//! ([`EventSplitter`]), and those that mention `usage` are read. Where the proxy added
//! `stream_options.include_usage` itself, the usage-only event is also removed, so the client
//! sees exactly the stream it asked for; everywhere else the chunks pass as they came.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::Stream;

use super::error::ApiError;
use super::sse_events::EventSplitter;
use crate::dialect::{Dialect, Usage};
use crate::upstream::idle::Silent;
use crate::upstream::{ByteStream, UpstreamError};

/// Called once with what the provider reported (all of it `None` when it reported nothing),
/// after the body's last byte was forwarded, or when the body is dropped before that.
pub type UsageSink = Box<dyn FnOnce(Usage) + Send>;

/// Most bytes of a non-streaming body kept to read its usage.
const JSON_TAIL_LIMIT: usize = 4 * 1024 * 1024;

pub struct Observed {
    inner: ByteStream,
    mode: ObserveMode,
    events: EventSplitter,
    /// A JSON body's chunks so far (reference-counted, not copied) and its length.
    json_chunks: Vec<Bytes>,
    json_len: usize,
    sink: Option<UsageSink>,
    usage: Usage,
    /// Reads `usage` in the answer's format.
    dialect: &'static dyn Dialect,
}

enum ObserveMode {
    /// A JSON body: keep it (bounded) and read `usage` at the end.
    Json,
    /// An SSE body: look at each event; drop usage-only events when `strip`.
    Sse { strip: bool },
}

impl Observed {
    pub fn json(inner: ByteStream, dialect: &'static dyn Dialect, sink: UsageSink) -> Observed {
        Observed::new(inner, ObserveMode::Json, dialect, sink)
    }

    pub fn sse(
        inner: ByteStream,
        strip_usage: bool,
        dialect: &'static dyn Dialect,
        sink: UsageSink,
    ) -> Observed {
        Observed::new(
            inner,
            ObserveMode::Sse { strip: strip_usage },
            dialect,
            sink,
        )
    }

    fn new(
        inner: ByteStream,
        mode: ObserveMode,
        dialect: &'static dyn Dialect,
        sink: UsageSink,
    ) -> Observed {
        Observed {
            dialect,
            inner,
            mode,
            events: EventSplitter::default(),
            json_chunks: Vec::new(),
            json_len: 0,
            sink: Some(sink),
            usage: Usage::default(),
        }
    }

    /// The last bytes of a stream the provider left silent: an `error` event in the client's
    /// format.
    fn silence_event(&mut self, silent: Silent) -> Bytes {
        tracing::warn!(
            dialect = self.dialect.name(),
            silent_ms = silent.limit.as_millis() as u64,
            "Ended a stream the provider left silent."
        );
        let error = ApiError::from(UpstreamError::Timeout(silent.to_string()));
        let body = self.dialect.error_body(&error.client_error());
        let mut event = Vec::new();
        // An event cut short is let go (when events are forwarded one by one, it was held) and
        // closed by the blank line, which after a whole event is an empty one clients skip.
        if let Some(unfinished) = self.events.finish() {
            if matches!(self.mode, ObserveMode::Sse { strip: true }) {
                event.extend_from_slice(&unfinished);
            }
        }
        event.extend_from_slice(b"\n\nevent: error\ndata: ");
        event.extend_from_slice(body.to_string().as_bytes());
        event.extend_from_slice(b"\n\n");
        Bytes::from(event)
    }

    fn report(&mut self) {
        if let Some(sink) = self.sink.take() {
            sink(std::mem::take(&mut self.usage));
        }
    }

    /// Handles one SSE chunk: returns what to forward now.
    fn sse_chunk(&mut self, chunk: Bytes, strip: bool) -> Bytes {
        let Observed {
            events,
            dialect,
            usage,
            ..
        } = self;
        if !strip {
            // The chunk goes on untouched; an event too long to hold is no usage event.
            let _let_go = events.feed(&chunk, |event| {
                read_usage(*dialect, usage, event);
            });
            return chunk;
        }
        let mut out = Vec::with_capacity(chunk.len());
        let let_go = events.feed(&chunk, |event| {
            let stated_the_prompt = read_usage(*dialect, usage, event);
            if !stated_the_prompt.is_some_and(|data| is_usage_only(&data)) {
                out.extend_from_slice(event);
            }
        });
        if let Some(overlong) = let_go {
            out.extend_from_slice(&overlong);
        }
        Bytes::from(out)
    }
}

/// Merges into `usage` what `event` reports, if it mentions usage. Returns the event's data
/// when it stated the prompt's size (the usage event the proxy may have asked for).
fn read_usage(dialect: &dyn Dialect, usage: &mut Usage, event: &[u8]) -> Option<String> {
    let data = usage_event_data(event)?;
    let reported = dialect.reported_usage(data.as_bytes())?;
    let states_the_prompt = reported.input_tokens.is_some();
    usage.merge(reported);
    states_the_prompt.then_some(data)
}

fn mentions_usage(chunk: &[u8]) -> bool {
    // Built once: `memmem::find` builds its searcher on every call, and this runs on every
    // event of every stream.
    static USAGE: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\"usage\""));
    USAGE.find(chunk).is_some()
}

/// The data of an event that mentions `usage`.
fn usage_event_data(event: &[u8]) -> Option<String> {
    if !mentions_usage(event) {
        return None;
    }
    let text = std::str::from_utf8(event).ok()?;
    let data: String = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|l| l.trim_start())
        .collect::<Vec<_>>()
        .join("\n");
    Some(data)
}

/// Whether a chat stream event carries usage and nothing else (the event the proxy asked for).
fn is_usage_only(data: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(data).is_ok_and(|value| {
        value
            .get("choices")
            .and_then(|c| c.as_array())
            .is_some_and(|c| c.is_empty())
    })
}

impl Drop for Observed {
    /// A body with a known length may be dropped once its last byte went out, without being
    /// polled to its end; usage is read here in that case.
    fn drop(&mut self) {
        if self.sink.is_none() {
            return;
        }
        if let ObserveMode::Json = self.mode {
            if let Some(usage) = self.json_body_usage() {
                self.usage.merge(usage);
            }
        }
        self.report();
    }
}

impl Observed {
    /// The usage the JSON body seen so far reports, if it was complete and small enough.
    fn json_body_usage(&self) -> Option<Usage> {
        if self.json_len > JSON_TAIL_LIMIT {
            return None;
        }
        match self.json_chunks.as_slice() {
            [] => None,
            [single] => self.dialect.reported_usage(single),
            chunks => self.dialect.reported_usage(&chunks.concat()),
        }
    }
}

impl Stream for Observed {
    type Item = Result<Bytes, std::io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        // Reported: the body has ended (or the proxy ended it), and the source is not polled again.
        if self.sink.is_none() {
            return Poll::Ready(None);
        }
        loop {
            let polled = self.inner.as_mut().poll_next(cx);
            return match polled {
                Poll::Ready(Some(Ok(chunk))) => {
                    let out = match self.mode {
                        ObserveMode::Json => {
                            // Keep handles to the chunks (no copy) while the body is small
                            // enough to read usage from.
                            self.json_len += chunk.len();
                            if self.json_len <= JSON_TAIL_LIMIT {
                                self.json_chunks.push(chunk.clone());
                            }
                            chunk
                        }
                        ObserveMode::Sse { strip } => self.sse_chunk(chunk, strip),
                    };
                    if out.is_empty() {
                        // Everything in this chunk was held back (an incomplete or stripped
                        // event); wait for more rather than sending an empty frame.
                        continue;
                    }
                    Poll::Ready(Some(Ok(out)))
                }
                Poll::Ready(None) => {
                    if let ObserveMode::Json = self.mode {
                        if let Some(usage) = self.json_body_usage() {
                            self.usage.merge(usage);
                        }
                        self.json_chunks.clear();
                    } else if let Some(rest) = self.events.finish() {
                        // A final event without its blank line: read, and forwarded as it is
                        // when events are forwarded one by one.
                        let Observed { dialect, usage, .. } = &mut *self;
                        read_usage(*dialect, usage, &rest);
                        if matches!(self.mode, ObserveMode::Sse { strip: true }) {
                            self.report();
                            return Poll::Ready(Some(Ok(rest)));
                        }
                    }
                    self.report();
                    Poll::Ready(None)
                }
                Poll::Ready(Some(Err(e))) => match (&self.mode, Silent::of(&e)) {
                    // A stream the provider left silent ends with an error event the client's
                    // SDK raises, rather than a cut its reader may wait on.
                    (ObserveMode::Sse { .. }, Some(silent)) => {
                        let event = self.silence_event(silent);
                        self.report();
                        Poll::Ready(Some(Ok(event)))
                    }
                    // Any other failure mid-stream ends the client's stream the same way.
                    _ => Poll::Ready(Some(Err(e))),
                },
                Poll::Pending => Poll::Pending,
            };
        }
    }
}

#[cfg(test)]
mod tests;
