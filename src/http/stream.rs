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
use crate::upstream::ByteStream;

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
    /// The stream was ended by the proxy (its provider went silent): nothing more is read.
    ended: bool,
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
            ended: false,
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
        let error = ApiError::UpstreamTimeout(format!("upstream timed out: {silent}"));
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
        self.ended = true;
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
    memchr::memmem::find(chunk, b"\"usage\"").is_some()
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
        if self.ended {
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
mod tests {
    use super::*;
    use crate::dialect::chat::Chat;
    use crate::http::sse_events::MAX_HELD_EVENT_BYTES;
    use futures::StreamExt;
    use std::sync::{Arc, Mutex};

    fn source(chunks: &[&'static str]) -> ByteStream {
        let items: Vec<Result<Bytes, std::io::Error>> = chunks
            .iter()
            .map(|c| Ok(Bytes::from_static(c.as_bytes())))
            .collect();
        Box::pin(futures::stream::iter(items))
    }

    async fn run(observed: Observed) -> String {
        let parts: Vec<Bytes> = observed.map(|c| c.unwrap()).collect().await;
        String::from_utf8(parts.concat()).unwrap()
    }

    /// A sink that keeps the prompt size reported.
    fn sink() -> (UsageSink, Arc<Mutex<Option<u64>>>) {
        let seen = Arc::new(Mutex::new(None));
        let s = seen.clone();
        (
            Box::new(move |u: Usage| *s.lock().unwrap() = u.input_tokens),
            seen,
        )
    }

    /// A sink that keeps the whole usage, once it is called.
    fn usage_sink() -> (UsageSink, Arc<Mutex<Option<Usage>>>) {
        let seen = Arc::new(Mutex::new(None));
        let s = seen.clone();
        (Box::new(move |u| *s.lock().unwrap() = Some(u)), seen)
    }

    const USAGE: &str = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":42}}\n\n";

    #[tokio::test]
    async fn strips_the_usage_event_it_added() {
        let (s, seen) = sink();
        let out = run(Observed::sse(
            source(&[
                "data: {\"choices\":[{\"delta\":{}}]}\n",
                "\ndata: {\"choi",
                "ces\":[],\"usage\":{\"prompt_tokens\":42}}\n\n",
                "data: [DONE]\n\n",
            ]),
            true,
            &Chat,
            s,
        ))
        .await;
        assert_eq!(
            out,
            "data: {\"choices\":[{\"delta\":{}}]}\n\ndata: [DONE]\n\n"
        );
        assert_eq!(*seen.lock().unwrap(), Some(42));
    }

    #[tokio::test]
    async fn an_event_that_does_not_end_is_not_held_without_bound() {
        let (s, _) = sink();
        let start = "data: {\"choices\":[{\"delta\":{\"content\":\"";
        let long = "x".repeat(MAX_HELD_EVENT_BYTES);
        let sent = [Bytes::from_static(start.as_bytes()), Bytes::from(long)];
        let total: usize = sent.iter().map(Bytes::len).sum();
        // The event's end never comes: the provider goes quiet.
        let quiet = futures::stream::iter(sent.map(Ok)).chain(futures::stream::pending());
        let mut observed = Observed::sse(Box::pin(quiet), true, &Chat, s);
        let mut forwarded = Vec::new();
        while forwarded.len() < total {
            let next = tokio::time::timeout(std::time::Duration::from_secs(5), observed.next())
                .await
                .expect("held back while waiting for the event's end");
            forwarded.extend_from_slice(&next.unwrap().unwrap());
        }
        assert_eq!(&forwarded[..start.len()], start.as_bytes());
        assert_eq!(forwarded.len(), total);
    }

    #[tokio::test]
    async fn keeps_usage_the_client_asked_for() {
        let (s, seen) = sink();
        let input = ["data: {\"choices\":[{}]}\n\n", USAGE, "data: [DONE]\n\n"];
        let out = run(Observed::sse(source(&input), false, &Chat, s)).await;
        assert_eq!(out, input.concat());
        assert_eq!(*seen.lock().unwrap(), Some(42));
    }

    #[tokio::test]
    async fn reads_usage_of_json_bodies() {
        let (s, seen) = sink();
        let out = run(Observed::json(
            source(&["{\"choices\":[],", "\"usage\":{\"prompt_tokens\":7}}"]),
            &Chat,
            s,
        ))
        .await;
        assert_eq!(out, "{\"choices\":[],\"usage\":{\"prompt_tokens\":7}}");
        assert_eq!(*seen.lock().unwrap(), Some(7));
    }

    #[tokio::test]
    async fn reads_usage_in_the_answers_dialect() {
        use crate::dialect::{anthropic::Messages, responses::Responses};
        let (s, seen) = sink();
        let start = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5,\"cache_read_input_tokens\":90,\"cache_creation_input_tokens\":10}}}\n\n";
        let input = [
            start,
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        ];
        let out = run(Observed::sse(source(&input), false, &Messages, s)).await;
        assert_eq!(out, input.concat());
        assert_eq!(*seen.lock().unwrap(), Some(105));

        let (s, seen) = sink();
        let done = "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":321,\"output_tokens\":4}}}\n\n";
        run(Observed::sse(source(&[done]), false, &Responses, s)).await;
        assert_eq!(*seen.lock().unwrap(), Some(321));
    }

    /// Chunks follow the provider's writes and the network, not its events: an event that
    /// reports usage is read wherever it is cut, and passes untouched.
    #[tokio::test]
    async fn usage_is_read_from_an_event_cut_across_chunks() {
        use crate::dialect::responses::Responses;
        let answer = "word ".repeat(4_000);
        let stream = format!(
            "event: response.output_text.delta\ndata: {{\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}}\n\nevent: response.completed\ndata: {{\"type\":\"response.completed\",\"response\":{{\"output_text\":\"{answer}\",\"usage\":{{\"input_tokens\":321,\"output_tokens\":4}}}}}}\n\n"
        );
        let stream: &'static str = Box::leak(stream.into_boxed_str());
        let completed_at = stream.find("event: response.completed").unwrap();
        for cut in [
            completed_at + 1,
            completed_at + 40,
            stream.len() / 2,
            stream.len() - 30,
            stream.len() - 1,
        ] {
            for strip in [false, true] {
                let (s, seen) = sink();
                let (a, b) = stream.split_at(cut);
                let out = run(Observed::sse(source(&[a, b]), strip, &Responses, s)).await;
                assert_eq!(out, stream, "cut at {cut}");
                assert_eq!(
                    *seen.lock().unwrap(),
                    Some(321),
                    "cut at {cut}, strip {strip}"
                );
            }
        }
        // In 16 KiB chunks, as a long answer comes off the network.
        let chunks: Vec<&'static str> = stream
            .as_bytes()
            .chunks(1 << 14)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect();
        let (s, seen) = sink();
        let out = run(Observed::sse(source(&chunks), false, &Responses, s)).await;
        assert_eq!(out, stream);
        assert_eq!(*seen.lock().unwrap(), Some(321));
    }

    #[tokio::test]
    async fn a_stream_reported_in_parts_is_merged() {
        use crate::dialect::anthropic::Messages;
        let (s, seen) = usage_sink();
        let start = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-x\",\"usage\":{\"input_tokens\":5,\"cache_read_input_tokens\":90,\"cache_creation_input_tokens\":10,\"output_tokens\":1}}}\n\n";
        let delta = "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":17}}\n\n";
        run(Observed::sse(source(&[start, delta]), false, &Messages, s)).await;
        let usage = seen.lock().unwrap().clone().expect("reported at the end");
        assert_eq!(
            usage,
            Usage {
                input_tokens: Some(105),
                output_tokens: Some(17),
                cache_read_tokens: Some(90),
                cache_creation_tokens: Some(10),
                model: Some("claude-x".into()),
            }
        );

        let (s, seen) = usage_sink();
        let body = "{\"model\":\"gpt-x-2026\",\"choices\":[],\"usage\":{\"prompt_tokens\":70,\"completion_tokens\":6,\"prompt_tokens_details\":{\"cached_tokens\":64}}}";
        run(Observed::json(source(&[body]), &Chat, s)).await;
        let usage = seen.lock().unwrap().clone().unwrap();
        assert_eq!(
            (
                usage.input_tokens,
                usage.output_tokens,
                usage.cache_read_tokens
            ),
            (Some(70), Some(6), Some(64))
        );
        assert_eq!(usage.model.as_deref(), Some("gpt-x-2026"));

        let (s, seen) = usage_sink();
        let done = "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"model\":\"gpt-r\",\"usage\":{\"input_tokens\":321,\"input_tokens_details\":{\"cached_tokens\":300},\"output_tokens\":4}}}\n\n";
        run(Observed::sse(
            source(&[done]),
            false,
            &crate::dialect::responses::Responses,
            s,
        ))
        .await;
        let usage = seen.lock().unwrap().clone().unwrap();
        assert_eq!(
            (
                usage.input_tokens,
                usage.output_tokens,
                usage.cache_read_tokens
            ),
            (Some(321), Some(4), Some(300))
        );
        assert_eq!(usage.model.as_deref(), Some("gpt-r"));
    }

    #[tokio::test]
    async fn the_sink_hears_of_a_body_without_usage_and_of_one_dropped_early() {
        let (s, seen) = usage_sink();
        run(Observed::sse(
            source(&["data: {\"choices\":[{}]}\n\n", "data: [DONE]\n\n"]),
            false,
            &Chat,
            s,
        ))
        .await;
        assert_eq!(seen.lock().unwrap().clone(), Some(Usage::default()));

        let (s, seen) = usage_sink();
        let mut observed = Observed::sse(source(&["data: {}\n\n", USAGE]), false, &Chat, s);
        let first = observed.next().await;
        assert!(first.is_some());
        assert_eq!(*seen.lock().unwrap(), None, "not before the body ends");
        drop(observed);
        assert_eq!(seen.lock().unwrap().clone(), Some(Usage::default()));
    }
}
