//! Name resolution for the upstream client, bounded like the connection it precedes.
//!
//! The client's connect timeout bounds the TCP connection only. The lookup before it runs the
//! system resolver on a blocking thread, with no bound of its own: a DNS server that never
//! answers (a container whose `resolv.conf` lists a second server that does not reply, say)
//! holds the request for as long as the system's timeouts and retries take, ten seconds and
//! more, and the answer then does not say why. Here the lookup gets the connect timeout too,
//! and running out of it fails the request as a timed-out connection that names the lookup.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::client::legacy::connect::dns::Name;
use tower::Service;

/// A resolver whose lookups fail with [`io::ErrorKind::TimedOut`] after `bound`.
#[derive(Clone)]
pub struct Bounded<R> {
    inner: R,
    bound: Duration,
}

impl<R> Bounded<R> {
    pub fn new(inner: R, bound: Duration) -> Bounded<R> {
        Bounded { inner, bound }
    }
}

type Lookup<A> = Pin<Box<dyn Future<Output = Result<A, io::Error>> + Send>>;

impl<R> Service<Name> for Bounded<R>
where
    R: Service<Name>,
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
        let lookup = self.inner.call(name);
        let bound = self.bound;
        Box::pin(async move {
            match tokio::time::timeout(bound, lookup).await {
                Ok(found) => found.map_err(io::Error::other),
                // The blocking lookup goes on by itself and its answer is dropped.
                Err(_) => Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("name resolution took longer than {} ms", bound.as_millis()),
                )),
            }
        })
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
        let mut resolver = Bounded::new(Silent, Duration::from_secs(3));
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
        let connector =
            HttpConnector::new_with_resolver(Bounded::new(Silent, Duration::from_secs(2)));
        let client: Client<_, http_body_util::Empty<bytes::Bytes>> =
            Client::builder(hyper_util::rt::TokioExecutor::new()).build(connector);
        let err = client
            .get("http://provider.internal/v1/models".parse().unwrap())
            .await
            .unwrap_err();
        assert!(err.is_connect());
        assert!(super::super::timed_out(&err));
        let described = super::super::describe(&err);
        assert!(
            described.starts_with("timed out")
                && described.contains("name resolution took longer than 2000 ms"),
            "{described}"
        );
    }

    #[tokio::test]
    async fn a_lookup_that_answers_in_time_is_passed_on() {
        let mut resolver = Bounded::new(GaiResolver::new(), Duration::from_secs(10));
        let found: Vec<SocketAddr> = resolver
            .call(Name::from_str("localhost").unwrap())
            .await
            .unwrap()
            .collect();
        assert!(found.iter().any(|a| a.ip().is_loopback()), "{found:?}");
    }
}
