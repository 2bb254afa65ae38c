//! What one client may cost the proxy: the size of a body, the time taken to send it, and the
//! share of memory all buffered bodies together may hold.
//!
//! A chat body is read whole (it is parsed and maybe rewritten), so it counts against a
//! process-wide budget from the first byte until the handler is done with it. What it counts
//! is what the request holds, not only its bytes: the body, its parsed messages and their
//! decoded text, [`HELD_PER_BODY_BYTE`] times the body's size (measured with
//! `examples/memory_burst.rs`), so that the bound is one on the process's memory. One body is
//! never charged more than the whole budget, so any body within `max_body_bytes` is served when
//! nothing else is in flight. A declared `Content-Length` is checked before anything is read, so
//! an oversized body is refused without `100 Continue` and without reading it; a body without one
//! reserves its budget as it arrives.
//! A refused body is read to its end and thrown away (up to [`DRAIN_MAX_BYTES`], for at most
//! [`DRAIN_MAX_TIME`]) before the 413 goes out: clients such as Python's `http.client` (under the
//! OpenAI SDK) and httpx write the whole body before they read the answer, and a proxy that
//! closed at once would leave them with a broken pipe instead of the 413.
//! When the budget is spent the request is refused with 503 and `retry-after` (its body drained
//! the same way), rather than queued: the client's own retry logic knows what to do with that,
//! and nothing piles up here.
//! Pass-through bodies are streamed, never buffered, so they only get the read timeout.
//!
//! A model name is the client's choice too, and it is kept (learned facts are stored under it,
//! checkpoints and logs name it): one longer than [`MAX_MODEL_NAME_BYTES`], far beyond any real
//! model's, is refused with 400 before the request is counted or forwarded.
//!
//! A connection may also cost one of the `max_connections` slots while it does nothing:
//! [`Activity`] counts the requests open on one connection so that the accept loop can close it
//! once it has been idle for the header read timeout, whatever its protocol (hyper bounds the wait
//! for the next HTTP/1.1 request itself, but nothing bounds an idle HTTP/2 connection).

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use http::HeaderMap;
use http_body_util::BodyExt;
use hyper::body::{Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::error::ApiError;

/// Bytes reserved at a time for a body of unknown length, so that a body arriving in small
/// frames does not take the semaphore for each one.
const RESERVE_STEP: usize = 64 * 1024;

/// The most of a refused body read and thrown away so that its client gets to read the 413. A
/// declared body larger than this is refused at once: reading part of it would not help.
pub const DRAIN_MAX_BYTES: usize = 64 * 1024 * 1024;

/// The longest a refused body is read for, as nginx bounds its lingering close.
pub const DRAIN_MAX_TIME: Duration = Duration::from_secs(5);

/// Reads what is left of a refused body and throws it away, within [`DRAIN_MAX_BYTES`] (counting
/// the `already` read) and [`DRAIN_MAX_TIME`]. Nothing is kept, so it costs no budget.
async fn drain(body: &mut Body, already: usize) {
    let mut read = already;
    let reading = async {
        while read <= DRAIN_MAX_BYTES {
            match body.frame().await {
                Some(Ok(frame)) => read += frame.data_ref().map_or(0, Bytes::len),
                Some(Err(_)) | None => break,
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_MAX_TIME, reading).await;
}

/// What a buffered body holds once parsed, per byte of the body: the body itself, its
/// messages' raw JSON and the text decoded from them to count tokens (2.45 to 2.61 bytes beyond
/// the body, by `examples/memory_burst.rs --parse-only`; figures in
/// `benches/results/2026-12-01-memory-burst.md`).
pub const HELD_PER_BODY_BYTE: f64 = HELD_TENTHS as f64 / 10.0;
const HELD_TENTHS: usize = 35;

/// The longest model name accepted. Real ones (a provider's model, a deployment, a Bedrock
/// ARN, a path on a model hub) are well under 200 bytes.
pub const MAX_MODEL_NAME_BYTES: usize = 256;

/// Refuses a model name longer than [`MAX_MODEL_NAME_BYTES`]. The message gives its length,
/// not the name: error messages are logged.
pub fn check_model_name(model: &str) -> Result<(), ApiError> {
    if model.len() <= MAX_MODEL_NAME_BYTES {
        return Ok(());
    }
    Err(ApiError::BadRequest {
        message: format!(
            "the model name is {} bytes long; at most {MAX_MODEL_NAME_BYTES} are accepted",
            model.len()
        ),
        param: Some("model".into()),
        code: None,
    })
}

/// Request limits shared by every handler; a clone shares the in-flight budget.
#[derive(Clone)]
pub struct Limits {
    pub max_body_bytes: usize,
    pub body_read_timeout: Duration,
    in_flight: Arc<Semaphore>,
    /// The whole budget: what `in_flight` started with.
    in_flight_capacity: usize,
}

/// Limits on client connections, applied by the accept loop.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    pub header_read_timeout: Duration,
    /// One permit per open client connection, `max_connections` in all, shared by every
    /// runtime's accept loop (a clone shares them).
    pub open: Arc<Semaphore>,
}

impl ConnectionLimits {
    pub fn new(header_read_timeout: Duration, max_connections: usize) -> ConnectionLimits {
        ConnectionLimits {
            header_read_timeout,
            open: Arc::new(Semaphore::new(max_connections)),
        }
    }
}

/// The requests open on one connection: from the moment its handler is called until its
/// response body is sent or dropped (a streamed answer keeps its connection busy).
///
/// Opening and closing a request only touch two atomics: the connection's task is not woken
/// for either. The wait for an idle spell ([`Activity::idle_for`]) instead sleeps until the
/// moment the connection would have been idle long enough and checks again then.
#[derive(Clone)]
pub struct Activity(Arc<Counts>);

struct Counts {
    open: AtomicUsize,
    /// When the last request closed (or the connection started), in nanoseconds after `since`.
    last_closed: AtomicU64,
    since: Instant,
}

/// One open request of an [`Activity`]; the request is over when this is dropped.
pub struct Open(Arc<Counts>);

impl Default for Activity {
    fn default() -> Activity {
        Activity(Arc::new(Counts {
            open: AtomicUsize::new(0),
            last_closed: AtomicU64::new(0),
            since: Instant::now(),
        }))
    }
}

impl Counts {
    fn elapsed_nanos(&self) -> u64 {
        u64::try_from(self.since.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

impl Activity {
    /// Counts a request as open until the returned guard is dropped.
    pub fn open(&self) -> Open {
        self.0.open.fetch_add(1, Ordering::AcqRel);
        Open(self.0.clone())
    }

    /// Resolves once no request has been open for `bound` without a break; any request that
    /// opens meanwhile starts the wait over once it is done.
    pub async fn idle_for(&self, bound: Duration) {
        let counts = &self.0;
        loop {
            let wake_at = if counts.open.load(Ordering::Acquire) > 0 {
                // Busy now: it cannot be idle for `bound` before `bound` from now.
                Instant::now() + bound
            } else {
                let closed =
                    counts.since + Duration::from_nanos(counts.last_closed.load(Ordering::Acquire));
                let idle_until = closed + bound;
                if Instant::now() >= idle_until {
                    return;
                }
                idle_until
            };
            tokio::time::sleep_until(wake_at).await;
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        let counts = &self.0;
        // The time first, so that a waiter that sees no request open also sees when the last
        // one closed.
        counts
            .last_closed
            .fetch_max(counts.elapsed_nanos(), Ordering::AcqRel);
        counts.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its request counted as open until it is sent or dropped.
pub struct HeldOpen {
    pub body: Body,
    pub open: Open,
}

impl hyper::body::Body for HeldOpen {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Budget held by one buffered body; returned when dropped, so it is kept for as long as the
/// request's parsed form lives.
pub struct BodyBudget {
    /// Never read: held for its drop, which returns the bytes to the budget.
    _permit: Option<OwnedSemaphorePermit>,
}

impl Limits {
    pub fn new(
        max_body_bytes: usize,
        max_in_flight_body_bytes: usize,
        body_read_timeout: Duration,
    ) -> Limits {
        let in_flight_capacity = max_in_flight_body_bytes
            .min(Semaphore::MAX_PERMITS)
            .min(u32::MAX as usize);
        Limits {
            max_body_bytes,
            body_read_timeout,
            in_flight: Arc::new(Semaphore::new(in_flight_capacity)),
            in_flight_capacity,
        }
    }

    /// The budget a body of `bytes` is charged: what it holds once parsed, at most all of it.
    fn charge(&self, bytes: usize) -> usize {
        (bytes.saturating_mul(HELD_TENTHS) / 10).min(self.in_flight_capacity)
    }

    /// Reads a whole body within the size limit, the in-flight budget and the read timeout.
    pub async fn read_body(
        &self,
        headers: &HeaderMap,
        body: Body,
    ) -> Result<(Bytes, BodyBudget), ApiError> {
        let mut body = body;
        let declared = declared_length(headers)?;
        if let Some(n) = declared.filter(|&n| n > self.max_body_bytes) {
            if n <= DRAIN_MAX_BYTES {
                drain(&mut body, 0).await;
            }
            return Err(ApiError::TooLarge {
                limit: self.max_body_bytes,
            });
        }
        let mut reserved = self.charge(declared.unwrap_or(0));
        let mut budget = match self.reserve(None, reserved) {
            Ok(budget) => budget,
            Err(busy) => {
                // Read and thrown away, as a body over the limit is, so the client reads the 503.
                if declared.is_none_or(|n| n <= DRAIN_MAX_BYTES) {
                    drain(&mut body, 0).await;
                }
                return Err(busy);
            }
        };
        let mut collected = Vec::with_capacity(declared.unwrap_or(0));
        let read = async {
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| {
                    ApiError::bad_request(format!("could not read request body: {e}"))
                })?;
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                let total = collected.len() + data.len();
                if total > self.max_body_bytes {
                    return Err(ApiError::TooLarge {
                        limit: self.max_body_bytes,
                    });
                }
                let needed = self.charge(total);
                if needed > reserved {
                    let more = (needed - reserved)
                        .max(RESERVE_STEP)
                        .min(self.in_flight_capacity - reserved);
                    budget = self.reserve(budget.take(), more)?;
                    reserved += more;
                }
                collected.extend_from_slice(&data);
            }
            Ok(())
        };
        match tokio::time::timeout(self.body_read_timeout, read).await {
            Ok(Err(refused @ (ApiError::TooLarge { .. } | ApiError::Busy { .. }))) => {
                drain(&mut body, collected.len()).await;
                return Err(refused);
            }
            Ok(result) => result?,
            Err(_) => return Err(self.timed_out()),
        }
        Ok((Bytes::from(collected), BodyBudget { _permit: budget }))
    }

    /// Adds `bytes` to a body's reservation, or refuses the request when the budget is spent.
    fn reserve(
        &self,
        held: Option<OwnedSemaphorePermit>,
        bytes: usize,
    ) -> Result<Option<OwnedSemaphorePermit>, ApiError> {
        if bytes == 0 {
            return Ok(held);
        }
        let n = u32::try_from(bytes).map_err(|_| ApiError::TooLarge {
            limit: self.max_body_bytes,
        })?;
        let more = self
            .in_flight
            .clone()
            .try_acquire_many_owned(n)
            .map_err(|_| ApiError::Busy {
                message: "the proxy is holding as many request bytes as it may; retry shortly"
                    .into(),
                retry_after_secs: 1,
            })?;
        Ok(Some(match held {
            Some(mut permit) => {
                permit.merge(more);
                permit
            }
            None => more,
        }))
    }

    fn timed_out(&self) -> ApiError {
        ApiError::RequestTimeout(format!(
            "the request body did not arrive within {} ms",
            self.body_read_timeout.as_millis()
        ))
    }

    /// A streamed body that fails when no bytes arrive for the read timeout.
    pub fn idle_limited(
        &self,
        body: Body,
    ) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
        let idle = self.body_read_timeout;
        let stream = body.into_data_stream();
        futures::stream::unfold(Some(stream), move |state| async move {
            let mut stream = state?;
            match tokio::time::timeout(idle, stream.next()).await {
                Ok(Some(Ok(chunk))) => Some((Ok(chunk), Some(stream))),
                Ok(Some(Err(e))) => Some((Err(std::io::Error::other(e)), None)),
                Ok(None) => None,
                Err(_) => Some((
                    Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "request body stalled",
                    )),
                    None,
                )),
            }
        })
    }

    /// Refuses a declared body larger than the limit, before any of it is kept (what the client
    /// sends anyway is drained, so that it reads the 413).
    pub async fn check_declared(
        &self,
        headers: &HeaderMap,
        body: &mut Body,
    ) -> Result<(), ApiError> {
        match declared_length(headers)? {
            Some(n) if n > self.max_body_bytes => {
                if n <= DRAIN_MAX_BYTES {
                    drain(body, 0).await;
                }
                Err(ApiError::TooLarge {
                    limit: self.max_body_bytes,
                })
            }
            _ => Ok(()),
        }
    }
}

/// The body size the client declared, if it did.
fn declared_length(headers: &HeaderMap) -> Result<Option<usize>, ApiError> {
    let Some(value) = headers.get(http::header::CONTENT_LENGTH) else {
        return Ok(None);
    };
    value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|n| Some(usize::try_from(n).unwrap_or(usize::MAX)))
        .ok_or_else(|| ApiError::bad_request("invalid content-length header"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_connection_is_idle_only_once_its_last_request_is_done_for_the_bound() {
        let activity = Activity::default();
        let bound = Duration::from_secs(30);
        let open = activity.open();
        let started = tokio::time::Instant::now();
        // A request open for longer than the bound (a long streamed answer) is not idleness.
        let waited = tokio::time::timeout(Duration::from_secs(100), activity.idle_for(bound)).await;
        assert!(waited.is_err());
        drop(open);
        activity.idle_for(bound).await;
        assert_eq!(started.elapsed(), Duration::from_secs(130));
        // Idle for the bound already: no further wait.
        let asked = tokio::time::Instant::now();
        activity.idle_for(bound).await;
        assert_eq!(asked.elapsed(), Duration::ZERO);
        // A request in the middle of the wait starts it over once it is done.
        drop(activity.open());
        let started = tokio::time::Instant::now();
        let waiting = activity.clone();
        let idle = tokio::spawn(async move { waiting.idle_for(bound).await });
        tokio::time::sleep(Duration::from_secs(20)).await;
        let open = activity.open();
        tokio::time::sleep(Duration::from_secs(5)).await;
        drop(open);
        idle.await.unwrap();
        assert_eq!(started.elapsed(), Duration::from_secs(55));
    }
}
