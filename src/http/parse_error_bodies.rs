//! Error bodies for the answers hyper writes on its own, before any handler runs.
//!
//! When a request's head cannot be parsed (a malformed request line or header, an invalid
//! `Content-Length`, a `Transfer-Encoding` that does not end in `chunked`, headers larger than
//! hyper's buffer or more of them than it takes), hyper answers 400, 414 or 431 itself, with an
//! empty body, and closes the connection; it has no hook to change that answer. [`ParseErrorBodies`]
//! wraps the accepted socket and replaces exactly that answer with one that says what was wrong,
//! in a body both the OpenAI and the Anthropic SDKs read (the path is not known: the head that
//! would name it did not parse).
//!
//! Telling hyper's answer from a handler's: every response the service produces is counted
//! ([`Answered::one_more`]) before hyper writes its head, and the first write after that carries
//! the head, so it is never touched. Only a write made when no response is owed, and which is
//! a whole bodiless error head of the form hyper gives its own answers, is replaced.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Responses the service has handed to hyper whose heads the socket has not yet seen written.
#[derive(Clone, Default)]
pub struct Answered(Arc<AtomicUsize>);

impl Answered {
    /// Called when the service's response is ready, before hyper writes it.
    pub fn one_more(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }

    /// Takes one owed response, if any: the write being made carries its head.
    fn claim(&self) -> bool {
        self.0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

/// An accepted connection whose automatic parse-error answers get an error body.
pub struct ParseErrorBodies<S> {
    inner: S,
    answered: Answered,
    /// The answer written in place of hyper's, and how much of it the socket has taken.
    replacement: Option<(Vec<u8>, usize)>,
}

impl<S> ParseErrorBodies<S> {
    pub fn new(inner: S, answered: Answered) -> ParseErrorBodies<S> {
        ParseErrorBodies {
            inner,
            answered,
            replacement: None,
        }
    }
}

impl<S: AsyncWrite + Unpin> ParseErrorBodies<S> {
    /// Writes what is left of the replacement; ready once the socket has taken all of it.
    fn poll_replacement(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((bytes, written)) = &mut self.replacement {
            if *written == bytes.len() {
                self.replacement = None;
                break;
            }
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &bytes[*written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *written += n;
        }
        Poll::Ready(Ok(()))
    }

    /// Whether `bytes`, written now, is hyper's own answer; if so, queues the replacement.
    fn replaces(&mut self, bytes: &[u8]) -> bool {
        if self.answered.claim() {
            return false;
        }
        match automatic_error_status(bytes) {
            Some(status) => {
                self.replacement = Some((answer(status), 0));
                true
            }
            None => false,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for ParseErrorBodies<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for ParseErrorBodies<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_replacement(cx))?;
        if this.replaces(buf) {
            // Hyper's bytes count as written; ours go out now or at the flush that follows.
            let _ = this.poll_replacement(cx)?;
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_replacement(cx))?;
        let mut filled = bufs.iter().filter(|b| !b.is_empty());
        if let (Some(only), None) = (filled.next(), filled.next()) {
            if this.replaces(only) {
                let _ = this.poll_replacement(cx)?;
                return Poll::Ready(Ok(only.len()));
            }
        } else if bufs.iter().any(|b| !b.is_empty()) {
            // More than one piece: a response's head and body, never hyper's bare answer.
            this.answered.claim();
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_replacement(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_replacement(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

/// The status of `bytes` if they are exactly an answer of the kind hyper makes for a request it
/// cannot parse: an HTTP/1.1 error status line and at most `connection`, `content-length: 0`
/// and `date`, nothing after the blank line.
fn automatic_error_status(bytes: &[u8]) -> Option<u16> {
    let text = std::str::from_utf8(bytes).ok()?;
    let head = text.strip_prefix("HTTP/1.1 ")?.strip_suffix("\r\n\r\n")?;
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next()?.get(..3)?.parse().ok()?;
    if !(400..600).contains(&status) {
        return None;
    }
    for line in lines {
        let (name, value) = line.split_once(':')?;
        let plain = match name.to_ascii_lowercase().as_str() {
            "connection" | "date" => true,
            "content-length" => value.trim() == "0",
            _ => false,
        };
        if !plain {
            return None;
        }
    }
    Some(status)
}

/// Our answer for `status`: the same status, a JSON error body, and the connection closed (as
/// hyper does: after a head it cannot parse it cannot find the next request).
fn answer(status: u16) -> Vec<u8> {
    let (reason, message, code) = match status {
        431 => (
            "Request Header Fields Too Large",
            "the request's headers are too large: too many of them, or longer than the proxy reads",
            "request_header_fields_too_large",
        ),
        414 => (
            "URI Too Long",
            "the request's URI is longer than the proxy reads",
            "uri_too_long",
        ),
        _ => (
            "Bad Request",
            "the request is not valid HTTP/1.1: a malformed request line or header, or an invalid \
             Content-Length or Transfer-Encoding",
            "malformed_request",
        ),
    };
    // The OpenAI shape (`error.message`, `type`, `param`, `code`) with Anthropic's top-level
    // `"type": "error"`: each SDK finds what it reads.
    let body = serde_json::json!({
        "type": "error",
        "error": {"message": message, "type": "invalid_request_error", "param": null, "code": code},
    })
    .to_string();
    format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\nx-compactor-error: true\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_bare_error_heads_are_taken_for_hyper_answers() {
        let date = "date: Mon, 30 Nov 2026 21:08:59 GMT";
        let bare = format!("HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\n{date}\r\n\r\n");
        assert_eq!(automatic_error_status(bare.as_bytes()), Some(431));
        for not_hyper in [
            format!("HTTP/1.1 400 Bad Request\r\ncontent-length: 2\r\n{date}\r\n\r\n{{}}"),
            format!("HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\ncontent-length: 0\r\n{date}\r\n\r\n"),
            format!("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n{date}\r\n\r\n"),
            format!("HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n{date}\r\n"),
            "0\r\n\r\n".to_string(),
        ] {
            assert_eq!(automatic_error_status(not_hyper.as_bytes()), None, "{not_hyper:?}");
        }
    }
}
