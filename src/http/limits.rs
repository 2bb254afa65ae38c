//! What one client may cost the proxy: the size of a body, the time taken to send it, and the
//! share of memory all buffered bodies together may hold.
//!
//! A chat body is read whole (it is parsed and maybe rewritten), so its bytes count against a
//! process-wide budget from the first byte until the handler is done with them. A declared
//! `Content-Length` is checked before anything is read, so an oversized body is refused without
//! `100 Continue` and without reading it; a body without one reserves its budget as it arrives.
//! When the budget is spent the request is refused with 503 and `retry-after`, rather than
//! queued: the client's own retry logic knows what to do with that, and nothing piles up here.
//! Pass-through bodies are streamed, never buffered, so they only get the read timeout.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use http::HeaderMap;
use http_body_util::BodyExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::error::ApiError;

/// Bytes reserved at a time for a body of unknown length, so that a body arriving in small
/// frames does not take the semaphore for each one.
const RESERVE_STEP: usize = 64 * 1024;

/// Request limits shared by every handler.
pub struct Limits {
    pub max_body_bytes: usize,
    pub body_read_timeout: Duration,
    in_flight: Arc<Semaphore>,
}

/// Limits on client connections, applied by the accept loop.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    pub header_read_timeout: Duration,
    pub max_connections: usize,
}

/// Budget held by one buffered body; returned when dropped.
pub struct BodyBudget(#[allow(dead_code)] Option<OwnedSemaphorePermit>);

impl Limits {
    pub fn new(
        max_body_bytes: usize,
        max_in_flight_body_bytes: usize,
        body_read_timeout: Duration,
    ) -> Limits {
        Limits {
            max_body_bytes,
            body_read_timeout,
            in_flight: Arc::new(Semaphore::new(
                max_in_flight_body_bytes.min(Semaphore::MAX_PERMITS),
            )),
        }
    }

    /// Reads a whole body within the size limit, the in-flight budget and the read timeout.
    pub async fn read_body(
        &self,
        headers: &HeaderMap,
        body: Body,
    ) -> Result<(Bytes, BodyBudget), ApiError> {
        let declared = declared_length(headers)?;
        if declared.is_some_and(|n| n > self.max_body_bytes) {
            return Err(ApiError::TooLarge {
                limit: self.max_body_bytes,
            });
        }
        let mut budget = self.reserve(None, declared.unwrap_or(0))?;
        let mut reserved = declared.unwrap_or(0);
        let mut collected = Vec::with_capacity(declared.unwrap_or(0));
        let mut body = body;
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
                if total > reserved {
                    let more = (total - reserved).max(RESERVE_STEP);
                    budget = self.reserve(budget.take(), more)?;
                    reserved += more;
                }
                collected.extend_from_slice(&data);
            }
            Ok(())
        };
        match tokio::time::timeout(self.body_read_timeout, read).await {
            Ok(result) => result?,
            Err(_) => return Err(self.timed_out()),
        }
        Ok((Bytes::from(collected), BodyBudget(budget)))
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

    /// Refuses a declared body larger than the limit, before any of it is read.
    pub fn check_declared(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        match declared_length(headers)? {
            Some(n) if n > self.max_body_bytes => Err(ApiError::TooLarge {
                limit: self.max_body_bytes,
            }),
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
