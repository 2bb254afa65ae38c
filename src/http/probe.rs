//! The start of a provider's answer, read before anything is forwarded: an error answer read
//! whole, or a stream's opening events held back until they show output or a failure, so that
//! a context overflow can still be retried. Whatever was read is put back in front of the rest.

use std::time::Instant;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use http::HeaderMap;

use super::error::ApiError;
use crate::dialect::{Dialect, Overflow};
use crate::upstream::{self, UpstreamError, UpstreamResponse};

/// Largest error body read from the provider (to recognise an overflow in it).
const ERROR_BODY_LIMIT: usize = 4 * 1024 * 1024;
/// Largest head of a stream held back while looking for a failure before any output.
const STREAM_HEAD_LIMIT: usize = 64 * 1024;

/// What the start of the provider's answer says.
#[derive(Default)]
pub(super) struct Probe {
    /// It refused the prompt as too long.
    pub overflow: Option<Overflow>,
    /// The whole body of an error answer, read to look for an overflow in it.
    pub error_body: Option<Bytes>,
}

/// Reads an error answer whole, or holds back the head of a stream until it shows output or a
/// failure; a stream's head is put back in front of the rest, so nothing is lost.
///
/// An overflow whose words appear in what the client sent (`sent`) is not trusted to teach a
/// window: the provider may be quoting the client's input back.
///
/// Both reads end by `deadline`: a provider that sends its headers and then nothing more must not
/// hold the request (and the body budget it keeps) for ever. An error answer not read by then is
/// a timeout; a stream's head not decided by then goes on as it is, undecided.
pub(super) async fn probe(
    dialect: &dyn Dialect,
    response: &mut UpstreamResponse,
    sent: &[u8],
    deadline: Instant,
) -> Result<Probe, ApiError> {
    let deadline = tokio::time::Instant::from_std(deadline);
    if !response.status.is_success() {
        let body = tokio::time::timeout_at(deadline, response.read_body(ERROR_BODY_LIMIT))
            .await
            .map_err(|_| {
                UpstreamError::Timeout(
                    "the error answer's body did not arrive within the first-byte timeout".into(),
                )
            })??;
        return Ok(Probe {
            overflow: dialect
                .overflow(response.status.as_u16(), &body)
                .map(|o| o.unless_echoed(&body, sent)),
            error_body: Some(body),
        });
    }
    if !is_sse(&response.headers) {
        return Ok(Probe::default());
    }
    let mut head = BytesMut::new();
    let mut ended = None;
    let reading = async {
        loop {
            match response.body.next().await {
                Some(Ok(chunk)) => head.extend_from_slice(&chunk),
                Some(Err(e)) => {
                    ended = Some(e);
                    break;
                }
                None => break,
            }
            if head.len() >= STREAM_HEAD_LIMIT || !dialect.stream_head_undecided(&head) {
                break;
            }
        }
    };
    // Past the deadline the stream goes on undecided, with what was read in front of the rest.
    let _ = tokio::time::timeout_at(deadline, reading).await;
    let head = head.freeze();
    let overflow = dialect
        .overflow_in_stream(&head)
        .map(|o| o.unless_echoed(&head, sent));
    let rest = std::mem::replace(&mut response.body, Box::pin(futures::stream::empty()));
    let tail: upstream::ByteStream = match ended {
        Some(e) => Box::pin(futures::stream::once(async move { Err(e) })),
        None => rest,
    };
    response.body = Box::pin(futures::stream::once(async move { Ok(head) }).chain(tail));
    Ok(Probe {
        overflow,
        error_body: None,
    })
}

pub(super) fn is_sse(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}
