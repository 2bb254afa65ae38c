//! A bound on the provider's silence inside an answer: a body that sends nothing for the
//! configured time ends with an error ([`Silent`]) instead of holding its client, the upstream
//! connection and the request's budget until someone else gives up.
//!
//! The clock is read once per chunk; a timer exists only while the body waits, so an answer that
//! arrives whole (most JSON bodies) never touches the timer wheel.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use prometheus_client::metrics::counter::Counter;
use tokio::time::{Instant, Sleep};

/// The provider sent nothing for `limit` in the middle of its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Silent {
    pub limit: Duration,
}

impl std::fmt::Display for Silent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the provider sent nothing for {} ms in the middle of its answer",
            self.limit.as_millis()
        )
    }
}

impl std::error::Error for Silent {}

impl Silent {
    /// The silence `error` reports, if it is one.
    pub fn of(error: &std::io::Error) -> Option<Silent> {
        error.get_ref()?.downcast_ref::<Silent>().copied()
    }
}

/// `inner`, ended by a [`Silent`] error once it has yielded nothing for `limit`.
pub struct IdleBound<S> {
    inner: S,
    limit: Duration,
    /// When the last chunk (or the head, before the first) arrived.
    last: Instant,
    /// Armed while `inner` waits; reset only when a chunk came in between.
    timer: Option<Pin<Box<Sleep>>>,
    done: bool,
    /// Counts the bodies ended for silence.
    silences: Counter,
}

impl<S> IdleBound<S> {
    pub fn new(inner: S, limit: Duration, silences: Counter) -> IdleBound<S> {
        IdleBound {
            inner,
            limit,
            last: Instant::now(),
            timer: None,
            done: false,
            silences,
        }
    }
}

impl<S> Stream for IdleBound<S>
where
    S: Stream<Item = Result<Bytes, std::io::Error>> + Unpin,
{
    type Item = Result<Bytes, std::io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_next(cx) {
            Poll::Ready(Some(item)) => {
                this.last = Instant::now();
                return Poll::Ready(Some(item));
            }
            Poll::Ready(None) => {
                this.done = true;
                this.timer = None;
                return Poll::Ready(None);
            }
            Poll::Pending => {}
        }
        let deadline = this.last + this.limit;
        let timer = this
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if timer.deadline() != deadline {
            timer.as_mut().reset(deadline);
        }
        match timer.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(()) => {
                this.done = true;
                this.timer = None;
                this.silences.inc();
                let silent = Silent { limit: this.limit };
                Poll::Ready(Some(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    silent,
                ))))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    /// Chunks sent at the given pauses (ms) after the previous one, then the end.
    fn paced(pauses: &[u64]) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Unpin {
        let pauses = pauses.to_vec();
        Box::pin(futures::stream::iter(pauses).then(|ms| async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(Bytes::from(format!("after {ms} ms;")))
        }))
    }

    #[tokio::test(start_paused = true)]
    async fn pauses_shorter_than_the_limit_pass_however_long_the_whole_answer() {
        let bounded = IdleBound::new(
            paced(&[90, 90, 90, 90, 90]),
            Duration::from_millis(100),
            Counter::default(),
        );
        let items: Vec<_> = bounded.collect().await;
        assert_eq!(items.len(), 5);
        assert!(items.iter().all(|i| i.is_ok()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_pause_longer_than_the_limit_ends_the_body_with_the_silence() {
        let started = Instant::now();
        let silences = Counter::default();
        let bounded = IdleBound::new(
            paced(&[10, 20, 5_000, 10]),
            Duration::from_millis(100),
            silences.clone(),
        );
        let items: Vec<_> = bounded.collect().await;
        assert_eq!(items.len(), 3, "two chunks, then the error, then nothing");
        assert!(items[..2].iter().all(|i| i.is_ok()));
        let error = items[2].as_ref().unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::TimedOut);
        assert_eq!(
            Silent::of(error),
            Some(Silent {
                limit: Duration::from_millis(100)
            })
        );
        // Cut 100 ms after the second chunk, not 100 ms after the first or at the end.
        assert_eq!(started.elapsed(), Duration::from_millis(130));
        assert_eq!(silences.get(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_provider_silent_from_the_head_on_is_cut_at_the_limit() {
        let started = Instant::now();
        let mut bounded = IdleBound::new(
            futures::stream::pending::<Result<Bytes, std::io::Error>>(),
            Duration::from_secs(3),
            Counter::default(),
        );
        let first = bounded.next().await.unwrap();
        assert!(Silent::of(&first.unwrap_err()).is_some());
        assert_eq!(started.elapsed(), Duration::from_secs(3));
        assert!(bounded.next().await.is_none());
    }

    #[test]
    fn other_errors_are_not_silences() {
        let broken = std::io::Error::other("connection reset");
        assert_eq!(Silent::of(&broken), None);
        let timed_out = std::io::Error::new(std::io::ErrorKind::TimedOut, "elsewhere");
        assert_eq!(Silent::of(&timed_out), None);
    }
}
