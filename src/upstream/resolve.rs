//! Name resolution for the upstream client: bounded like the connection it precedes, and asked
//! again when an answer is late.
//!
//! The client's connect timeout bounds the TCP connection only. The lookup before it runs the
//! system resolver on a blocking thread, with no bound of its own: a DNS server that never
//! answers (a container whose `resolv.conf` lists a second server that does not reply, say)
//! holds the request for as long as the system's timeouts and retries take, ten seconds and
//! more, and the answer then does not say why. Here the lookup gets the connect timeout too,
//! and running out of it fails the request as a timed-out connection that names the lookup.
//!
//! DNS runs over UDP, and a query or its answer can be lost (a container network's DNS server
//! drops what arrives while it reloads, for one). The system resolver waits five seconds by
//! default before it asks again, and with a second server that does not answer, five more. A
//! lookup not answered within [`HEDGE_AFTER`] is therefore started a second time beside the
//! first, as nginx's own resolver re-sends a query each second, and the first answer of the two
//! is taken. An answer of "no such name" that comes before then is asked for once more: while it
//! reloads, such a server can also send that for a name it holds.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::client::legacy::connect::dns::Name;
use tower::{Service, ServiceExt};

/// How long a lookup may go unanswered before a second one is started beside it.
pub const HEDGE_AFTER: Duration = Duration::from_secs(1);

/// A resolver whose lookups are asked again after `hedge_after` and fail with
/// [`io::ErrorKind::TimedOut`] after `bound`.
#[derive(Clone)]
pub struct Bounded<R> {
    inner: R,
    bound: Duration,
    hedge_after: Duration,
}

impl<R> Bounded<R> {
    pub fn new(inner: R, bound: Duration, hedge_after: Duration) -> Bounded<R> {
        Bounded {
            inner,
            bound,
            hedge_after,
        }
    }
}

type Lookup<A> = Pin<Box<dyn Future<Output = Result<A, io::Error>> + Send>>;

impl<R> Service<Name> for Bounded<R>
where
    R: Service<Name> + Clone + Send + 'static,
    R::Future: Send + 'static,
    R::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = R::Response;
    type Error = io::Error;
    type Future = Lookup<R::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        self.inner.poll_ready(cx).map_err(io::Error::other)
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let first = self.inner.call(name.clone());
        let again = self.inner.clone();
        let (bound, hedge_after) = (self.bound, self.hedge_after);
        Box::pin(async move {
            let lookup = hedged(first, again, name, hedge_after);
            match tokio::time::timeout(bound, lookup).await {
                Ok(found) => found,
                // The blocking lookups go on by themselves and their answers are dropped.
                Err(_) => Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("name resolution took longer than {} ms", bound.as_millis()),
                )),
            }
        })
    }
}

/// The answer of `first`; if it has none after `hedge_after`, the first answer of it and a
/// second lookup of `name` (a failure counts only once both have failed); if it fails sooner,
/// the answer of a second lookup.
async fn hedged<R>(
    first: R::Future,
    mut again: R,
    name: Name,
    hedge_after: Duration,
) -> Result<R::Response, io::Error>
where
    R: Service<Name> + Send + 'static,
    R::Future: Send + 'static,
    R::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut first = Box::pin(first);
    let failed_fast = match tokio::time::timeout(hedge_after, &mut first).await {
        Ok(Ok(found)) => return Ok(found),
        Ok(Err(err)) => Some(io::Error::other(err)),
        Err(_) => None,
    };
    let ready = again.ready().await.is_ok();
    match failed_fast {
        // A container network's DNS server can also answer "no such name" for one that exists
        // while it reloads; a name that truly does not exist costs one more lookup.
        Some(err) => {
            if !ready {
                return Err(err);
            }
            tracing::warn!(
                host = name.as_str(),
                "upstream host name not found; looking it up again"
            );
            again.call(name).await.map_err(io::Error::other)
        }
        None => {
            if !ready {
                // No second lookup to be had: the first may still answer.
                return first.await.map_err(io::Error::other);
            }
            tracing::warn!(
                host = name.as_str(),
                after_ms = hedge_after.as_millis() as u64,
                "upstream host name not resolved yet; looking it up again"
            );
            let second = Box::pin(again.call(name));
            match futures::future::select_ok([first, second]).await {
                Ok((found, _)) => Ok(found),
                Err(err) => Err(io::Error::other(err)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper_util::client::legacy::connect::dns::GaiResolver;
    use std::net::SocketAddr;
    use std::str::FromStr;

    /// A resolver that never answers, as a DNS server that does not reply.
    #[derive(Clone)]
    struct Silent;

    impl Service<Name> for Silent {
        type Response = std::vec::IntoIter<SocketAddr>;
        type Error = io::Error;
        type Future = futures::future::Pending<Result<Self::Response, io::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Name) -> Self::Future {
            futures::future::pending()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_lookup_that_never_answers_times_out_at_the_bound() {
        let mut resolver = Bounded::new(Silent, Duration::from_secs(3), HEDGE_AFTER);
        let started = tokio::time::Instant::now();
        let err = resolver
            .call(Name::from_str("provider.internal").unwrap())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(err.to_string().contains("name resolution"), "{err}");
        assert_eq!(started.elapsed(), Duration::from_secs(3));
    }

    /// Through the client the proxy builds: a connection error that the upstream module takes
    /// as a timeout, and whose description names the lookup.
    #[tokio::test(start_paused = true)]
    async fn a_silent_resolver_fails_the_request_as_a_timed_out_connection() {
        use hyper_util::client::legacy::{connect::HttpConnector, Client};
        let connector = HttpConnector::new_with_resolver(Bounded::new(
            Silent,
            Duration::from_secs(2),
            HEDGE_AFTER,
        ));
        let client: Client<_, http_body_util::Empty<bytes::Bytes>> =
            Client::builder(hyper_util::rt::TokioExecutor::new()).build(connector);
        let err = client
            .get("http://provider.internal/v1/models".parse().unwrap())
            .await
            .unwrap_err();
        assert!(err.is_connect());
        assert!(super::super::timed_out(&err));
        let described = super::super::describe(&err, err.is_connect());
        assert!(
            described.starts_with("timed out")
                && described.contains("name resolution took longer than 2000 ms"),
            "{described}"
        );
    }

    /// The same through a plain-HTTP base's own pool.
    #[tokio::test(start_paused = true)]
    async fn a_silent_resolver_fails_a_plain_http_request_as_a_timed_out_connection() {
        use http_body_util::BodyExt;
        let connector = hyper_util::client::legacy::connect::HttpConnector::new_with_resolver(
            Bounded::new(Silent, Duration::from_secs(2), HEDGE_AFTER),
        );
        let pool = super::super::plain::PlainPool::new(
            connector,
            "http://provider.internal:80".parse().unwrap(),
            super::super::plain::IDLE_FOR,
        );
        let mut request = http::Request::new(
            http_body_util::Empty::<bytes::Bytes>::new()
                .map_err(|never| match never {})
                .boxed_unsync(),
        );
        *request.uri_mut() = "/v1/models".parse().unwrap();
        let err = pool.send(request).await.unwrap_err();
        let connect = matches!(err, super::super::plain::PlainError::Connect(_));
        assert!(connect, "{err:?}");
        let error = super::super::upstream_error(&err, connect);
        let described = error.to_string();
        assert!(
            matches!(error, super::super::UpstreamError::Timeout(_))
                && described.contains("timed out")
                && described.contains("name resolution took longer than 2000 ms"),
            "{described}"
        );
    }

    /// A resolver whose first lookup is lost (never answered), or fails at once if
    /// `first_fails`, and whose later ones answer, or fail if `fail_later`; it counts its lookups.
    #[derive(Clone)]
    struct LosesFirst {
        calls: std::sync::Arc<std::sync::atomic::AtomicUsize>,
        first_fails: bool,
        fail_later: bool,
    }

    impl LosesFirst {
        fn new(fail_later: bool) -> LosesFirst {
            LosesFirst {
                calls: Default::default(),
                first_fails: false,
                fail_later,
            }
        }

        fn calls(&self) -> usize {
            self.calls.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    impl Service<Name> for LosesFirst {
        type Response = std::vec::IntoIter<SocketAddr>;
        type Error = io::Error;
        type Future = futures::future::BoxFuture<'static, Result<Self::Response, io::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Name) -> Self::Future {
            let nth = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let fail = self.fail_later || (nth == 0 && self.first_fails);
            let lost = nth == 0 && !self.first_fails;
            Box::pin(async move {
                if lost {
                    futures::future::pending::<()>().await;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                if fail {
                    return Err(io::Error::other("no such host"));
                }
                Ok(vec![SocketAddr::from(STUB_ADDRESS)].into_iter())
            })
        }
    }

    /// `service`'s lookup of the provider's name through a resolver bounded at `bound` that asks
    /// again after 500 ms: what it found, and how long it took on the paused clock.
    async fn look_up(
        service: &LosesFirst,
        bound: Duration,
    ) -> (io::Result<Vec<SocketAddr>>, Duration) {
        let mut resolver = Bounded::new(service.clone(), bound, Duration::from_millis(500));
        let started = tokio::time::Instant::now();
        let found = resolver
            .call(Name::from_str("upstream").unwrap())
            .await
            .map(Iterator::collect);
        (found, started.elapsed())
    }

    const STUB_ADDRESS: ([u8; 4], u16) = ([10, 89, 0, 7], 0);

    #[tokio::test(start_paused = true)]
    async fn a_lost_lookup_is_asked_again_and_the_second_answer_taken() {
        let lossy = LosesFirst::new(false);
        let (found, took) = look_up(&lossy, Duration::from_secs(10)).await;
        assert_eq!(found.unwrap(), vec![SocketAddr::from(STUB_ADDRESS)]);
        assert_eq!(took, Duration::from_millis(520));
        assert_eq!(lossy.calls(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_prompt_answer_is_not_asked_for_twice() {
        let lossy = LosesFirst::new(false);
        // Its first lookup already made, the next one answers in 20 ms.
        lossy.calls.store(1, std::sync::atomic::Ordering::SeqCst);
        let (found, _) = look_up(&lossy, Duration::from_secs(10)).await;
        found.unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(lossy.calls(), 2, "one lookup only");
    }

    #[tokio::test(start_paused = true)]
    async fn a_second_lookup_that_fails_while_the_first_is_lost_waits_for_the_bound() {
        // The failure of one lookup is not the answer while the other may still come: here the
        // first never does, so the bound ends it.
        let lossy = LosesFirst::new(true);
        let (found, took) = look_up(&lossy, Duration::from_secs(3)).await;
        let err = found.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        assert_eq!(took, Duration::from_secs(3));
        assert_eq!(lossy.calls(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_name_not_found_is_asked_for_once_more() {
        let wrong_once = LosesFirst {
            first_fails: true,
            ..LosesFirst::new(false)
        };
        let (found, _) = look_up(&wrong_once, Duration::from_secs(10)).await;
        assert_eq!(found.unwrap(), vec![SocketAddr::from(STUB_ADDRESS)]);
        assert_eq!(wrong_once.calls(), 2);

        // A name that is not found twice is not found: two lookups, then the error.
        let never = LosesFirst {
            first_fails: true,
            ..LosesFirst::new(true)
        };
        let (found, took) = look_up(&never, Duration::from_secs(10)).await;
        let err = found.unwrap_err();
        assert!(err.to_string().contains("no such host"), "{err}");
        assert_eq!(took, Duration::from_millis(40));
        assert_eq!(never.calls(), 2);
    }

    #[tokio::test]
    async fn a_lookup_that_answers_in_time_is_passed_on() {
        let mut resolver = Bounded::new(GaiResolver::new(), Duration::from_secs(10), HEDGE_AFTER);
        let found: Vec<SocketAddr> = resolver
            .call(Name::from_str("localhost").unwrap())
            .await
            .unwrap()
            .collect();
        assert!(found.iter().any(|a| a.ip().is_loopback()), "{found:?}");
    }
}
