//! Connections to a plain-HTTP provider (a model server on the same host or network), pooled
//! here rather than by the general client.
//!
//! Such a connection is always HTTP/1.1 and always to one address, so its pool is a stack of
//! idle connections per base and runtime, taken and given back under a lock held for a push
//! or a pop. The general client ([`super::http_client`]) keys one shared pool by scheme and
//! authority, hashing the key three times a request, and adds its connection info to every
//! answer: on a small request that was a tenth of the proxy's instructions
//! (`benches/results/2026-12-08-plain-pool.md`). TLS bases keep the general client, which
//! offers HTTP/2 by ALPN.
//!
//! What the general client does for a pooled connection is kept: a connection the provider
//! closed while idle is found closed and dropped; a request that could not be written on a
//! reused connection goes out again on the next idle one, or a new one when none waits; a
//! connection is given back once its answer has been read (at once when the answer arrived
//! whole, else by a small task waiting for it); an idle connection is closed after
//! [`IDLE_FOR`]. The sweep and the waiting tasks run on the runtime that started them: a pool
//! shared between runtimes (the summarizer's) loses them when that runtime stops, which only
//! happens at shutdown.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tower::util::BoxCloneSyncService;
use tower::{Service, ServiceExt};

type Body = UnsyncBoxBody<Bytes, std::io::Error>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// Makes a TCP connection (boxed: a connection is made far less often than a request).
type Connector = BoxCloneSyncService<Uri, TokioIo<TcpStream>, BoxError>;

/// How long a connection may sit idle before it is closed (the general client's setting).
/// The sweep runs that often, so a connection is closed between one and two of these after
/// its last use.
pub(super) const IDLE_FOR: Duration = Duration::from_secs(90);

/// How many request targets a pool keeps.
const TARGETS_KEPT: usize = 16;

/// Why a request to a plain-HTTP provider failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum PlainError {
    /// No connection could be made (refused, unresolvable, timed out).
    #[error("connection failed")]
    Connect(#[source] BoxError),
    /// Connected, but the exchange failed.
    #[error("request failed")]
    Exchange(#[source] hyper::Error),
}

/// The idle connections to one plain-HTTP base, for one runtime.
#[derive(Clone)]
pub(super) struct PlainPool {
    shared: Arc<Shared>,
}

struct Shared {
    idle: Mutex<IdleList>,
    /// The request targets of the last paths made, each made once ([`PlainPool::target`]).
    targets: Mutex<Vec<(Box<str>, Uri)>>,
    connector: Connector,
    /// `http://host:port`: what the connector resolves and connects to.
    target: Uri,
    idle_for: Duration,
}

#[derive(Default)]
struct IdleList {
    /// Most recently used last: taken from the end, so the warmest connection serves next and
    /// the oldest age out at the front.
    connections: Vec<Idle>,
    /// A task closes the expired ones while any wait ([`Shared::put`]).
    swept: bool,
}

struct Idle {
    sender: SendRequest<Body>,
    since: Instant,
}

impl PlainPool {
    /// A pool of connections to `target` (scheme and authority), each made by `connector`.
    pub(super) fn new<C>(connector: C, target: Uri, idle_for: Duration) -> PlainPool
    where
        C: Service<Uri, Response = TokioIo<TcpStream>> + Clone + Send + Sync + 'static,
        C::Error: Into<BoxError>,
        C::Future: Send + 'static,
    {
        PlainPool {
            shared: Arc::new(Shared {
                idle: Mutex::default(),
                targets: Mutex::default(),
                connector: BoxCloneSyncService::new(connector.map_err(Into::into)),
                target,
                idle_for,
            }),
        }
    }

    /// The request target (path and query, origin form) of `path_and_query`, as `make` makes
    /// it. A provider is asked a handful of paths, over and over: the last [`TARGETS_KEPT`]
    /// distinct ones made are kept (the first made is the first dropped, so a path in use is
    /// made again once after that many others), which spares most requests an allocation and
    /// a parse (about 1.1k instructions, 1 % of a small request).
    pub(super) fn target<E>(
        &self,
        path_and_query: &str,
        make: impl FnOnce() -> Result<Uri, E>,
    ) -> Result<Uri, E> {
        let mut targets = lock(&self.shared.targets);
        if let Some((_, uri)) = targets.iter().find(|(path, _)| **path == *path_and_query) {
            return Ok(uri.clone());
        }
        let uri = make()?;
        if targets.len() == TARGETS_KEPT {
            targets.remove(0);
        }
        targets.push((path_and_query.into(), uri.clone()));
        Ok(uri)
    }

    /// Sends `request` (its URI in origin form, its `Host` set) on an idle connection or a new
    /// one, and returns the answer's head.
    pub(super) async fn send(
        &self,
        mut request: Request<Body>,
    ) -> Result<Response<Incoming>, PlainError> {
        loop {
            let (mut sender, reused) = match self.take_idle() {
                Some(sender) => (sender, true),
                None => (self.connect().await?, false),
            };
            match sender.try_send_request(request).await {
                Ok(response) => {
                    self.give_back(sender);
                    return Ok(response);
                }
                Err(mut failed) => match failed.take_message() {
                    // Not written: the connection closed as it was taken. Only a reused
                    // connection is tried again, so a provider that closes every new
                    // connection is reported, not retried forever.
                    Some(unsent) if reused => request = unsent,
                    _ => return Err(PlainError::Exchange(failed.into_error())),
                },
            }
        }
    }

    /// The warmest idle connection still open and ready, dropping the closed and the expired.
    fn take_idle(&self) -> Option<SendRequest<Body>> {
        let mut idle = self.shared.lock();
        while let Some(entry) = idle.connections.pop() {
            if entry.since.elapsed() >= self.shared.idle_for {
                // The rest are older still.
                idle.connections.clear();
                return None;
            }
            if entry.sender.is_ready() {
                return Some(entry.sender);
            }
        }
        None
    }

    async fn connect(&self) -> Result<SendRequest<Body>, PlainError> {
        let mut connector = self.shared.connector.clone();
        let stream = connector
            .call(self.shared.target.clone())
            .await
            .map_err(PlainError::Connect)?;
        let (sender, connection) = hyper::client::conn::http1::handshake(stream)
            .await
            .map_err(PlainError::Exchange)?;
        // The connection is driven by a task of its own; it ends when the provider closes it
        // or every sender is dropped (a request's error reaches that request too).
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "A connection to the provider ended with an error.");
            }
        });
        Ok(sender)
    }

    /// Pools `sender` once its answer has been read: now, when it arrived whole; else when the
    /// connection is ready again (a streamed answer's end), or never, if it closes first.
    fn give_back(&self, mut sender: SendRequest<Body>) {
        if sender.is_ready() {
            self.shared.put(sender);
        } else if !sender.is_closed() {
            let pool = Arc::downgrade(&self.shared);
            tokio::spawn(async move {
                if sender.ready().await.is_ok() {
                    if let Some(pool) = pool.upgrade() {
                        pool.put(sender);
                    }
                }
            });
        }
    }

    /// How many connections wait idle (for tests).
    #[cfg(test)]
    fn idle_count(&self) -> usize {
        self.shared.lock().connections.len()
    }
}

/// Locks `mutex`: a panic while one of these is held leaves its list as it was before a push
/// or a removal.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, IdleList> {
        lock(&self.idle)
    }

    /// Pools an idle connection. The first one to wait starts a task that closes them as they
    /// expire, even when no request comes to find them expired; it ends when none is left.
    fn put(self: &Arc<Shared>, sender: SendRequest<Body>) {
        let mut idle = self.lock();
        idle.connections.push(Idle {
            sender,
            since: Instant::now(),
        });
        if !idle.swept {
            idle.swept = true;
            drop(idle);
            Shared::sweep(Arc::downgrade(self), self.idle_for);
        }
    }

    fn sweep(pool: Weak<Shared>, every: Duration) {
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(pool) = pool.upgrade() else { return };
                let mut idle = pool.lock();
                idle.connections
                    .retain(|entry| entry.since.elapsed() < every && !entry.sender.is_closed());
                if idle.connections.is_empty() {
                    idle.swept = false;
                    return;
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http_body_util::{BodyExt, Full, StreamBody};
    use hyper::body::Frame;
    use tokio::net::TcpListener;

    use hyper_util::client::legacy::connect::dns::GaiResolver;
    use hyper_util::client::legacy::connect::HttpConnector;

    use super::super::resolve;
    use super::*;

    /// A provider on a port of its own, counting the connections it accepts. `close_after_one`:
    /// it closes each connection after answering once, without saying so (as a provider's idle
    /// timeout does). `streamed`: the answer comes in chunks, the last one later.
    async fn provider(close_after_one: bool, streamed: bool) -> (Uri, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = Uri::try_from(format!("http://{}", listener.local_addr().unwrap())).unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                counter.fetch_add(1, Ordering::SeqCst);
                if close_after_one {
                    tokio::spawn(answer_once_and_close(stream));
                    continue;
                }
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                        let path = request.uri().to_string();
                        async move {
                            let body: Body = if streamed {
                                let chunks = futures::stream::unfold(0, move |sent| {
                                    let path = path.clone();
                                    async move {
                                        if sent == 2 {
                                            return None;
                                        }
                                        tokio::time::sleep(Duration::from_millis(20)).await;
                                        let chunk = Bytes::from(format!("{path} part {sent}"));
                                        Some((Ok(Frame::data(chunk)), sent + 1))
                                    }
                                });
                                StreamBody::new(chunks).boxed_unsync()
                            } else {
                                Full::new(Bytes::from(path))
                                    .map_err(|never| match never {})
                                    .boxed_unsync()
                            };
                            Ok::<_, Infallible>(Response::new(body))
                        }
                    });
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, service)
                        .await;
                });
            }
        });
        (target, accepted)
    }

    /// Reads one request head, answers it with its own path and closes the connection without
    /// saying so (a keep-alive answer).
    async fn answer_once_and_close(mut stream: tokio::net::TcpStream) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut head = Vec::new();
        let mut buffer = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let Ok(read @ 1..) = stream.read(&mut buffer).await else {
                return;
            };
            head.extend_from_slice(&buffer[..read]);
        }
        let line = String::from_utf8_lossy(&head);
        let path = line.split(' ').nth(1).unwrap_or("").to_string();
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{path}",
            path.len()
        );
        let _ = stream.write_all(answer.as_bytes()).await;
    }

    fn pool(target: Uri, idle_for: Duration) -> PlainPool {
        let mut connector = HttpConnector::new_with_resolver(resolve::Bounded::new(
            GaiResolver::new(),
            Duration::from_secs(5),
            resolve::HEDGE_AFTER,
        ));
        connector.set_nodelay(true);
        PlainPool::new(connector, target, idle_for)
    }

    fn request(path: &str) -> Request<Body> {
        let mut request = Request::new(
            Full::new(Bytes::new())
                .map_err(|never| match never {})
                .boxed_unsync(),
        );
        *request.uri_mut() = Uri::try_from(path).unwrap();
        request
    }

    async fn text(response: Response<Incoming>) -> String {
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn requests_one_after_another_share_one_connection() {
        let (target, accepted) = provider(false, false).await;
        let pool = pool(target, IDLE_FOR);
        for n in 0..3 {
            let path = format!("/v1/chat/completions?n={n}");
            let answer = pool.send(request(&path)).await.unwrap();
            assert_eq!(answer.status(), 200);
            // The provider saw the request in origin form.
            assert_eq!(text(answer).await, path);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert_eq!(pool.idle_count(), 1);
    }

    #[tokio::test]
    async fn requests_at_once_open_a_connection_each_and_all_are_pooled() {
        let (target, accepted) = provider(false, true).await;
        let pool = pool(target, IDLE_FOR);
        let (a, b) = tokio::join!(pool.send(request("/a")), pool.send(request("/b")));
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        // Streamed answers: the connections come back once their answers are read.
        assert_eq!(pool.idle_count(), 0);
        assert_eq!(text(a.unwrap()).await, "/a part 0/a part 1");
        assert_eq!(text(b.unwrap()).await, "/b part 0/b part 1");
        for _ in 0..100 {
            if pool.idle_count() == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(pool.idle_count(), 2);
        pool.send(request("/c")).await.unwrap();
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_connection_the_provider_closed_while_idle_is_replaced() {
        let (target, accepted) = provider(true, false).await;
        let pool = pool(target, IDLE_FOR);
        for n in 0..4 {
            let path = format!("/n{n}");
            let answer = pool.send(request(&path)).await.unwrap();
            assert_eq!(text(answer).await, path);
            // Time for the close to arrive: the connection is found closed, not written to.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn an_expired_connection_is_closed_and_not_used() {
        let (target, accepted) = provider(false, false).await;
        let pool = pool(target, Duration::from_millis(50));
        text(pool.send(request("/one")).await.unwrap()).await;
        assert_eq!(pool.idle_count(), 1);
        // The sweeper closes it without a request to find it.
        tokio::time::sleep(Duration::from_millis(160)).await;
        assert_eq!(pool.idle_count(), 0);
        text(pool.send(request("/two")).await.unwrap()).await;
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        // And one found expired by a request is dropped too.
        tokio::time::sleep(Duration::from_millis(60)).await;
        text(pool.send(request("/three")).await.unwrap()).await;
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
        assert_eq!(pool.idle_count(), 1);
    }

    #[test]
    fn request_targets_are_made_once_for_the_paths_last_asked() {
        let pool = pool("http://127.0.0.1:9".parse().unwrap(), IDLE_FOR);
        let made = std::cell::Cell::new(0);
        let target = |path: &str| {
            pool.target(path, || {
                made.set(made.get() + 1);
                Uri::try_from(format!("/v1{path}"))
            })
            .unwrap()
            .to_string()
        };
        assert_eq!(target("/chat/completions"), "/v1/chat/completions");
        assert_eq!(target("/chat/completions"), "/v1/chat/completions");
        assert_eq!(target("/messages?beta=true"), "/v1/messages?beta=true");
        assert_eq!(made.get(), 2);
        // A failure is not kept: the next ask makes it again.
        let refused: Result<Uri, &str> = pool.target("/../x", || Err("outside"));
        assert_eq!(refused.unwrap_err(), "outside");
        // Past the bound, the oldest goes first.
        for n in 0..TARGETS_KEPT - 1 {
            target(&format!("/files/{n}"));
        }
        assert_eq!(made.get(), 2 + TARGETS_KEPT - 1);
        target("/messages?beta=true");
        assert_eq!(made.get(), 2 + TARGETS_KEPT - 1);
        assert_eq!(target("/chat/completions"), "/v1/chat/completions");
        assert_eq!(made.get(), 2 + TARGETS_KEPT);
    }

    #[tokio::test]
    async fn no_provider_is_a_connect_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let target = Uri::try_from(format!("http://{}", listener.local_addr().unwrap())).unwrap();
        drop(listener);
        let pool = pool(target, IDLE_FOR);
        let error = pool.send(request("/")).await.unwrap_err();
        assert!(matches!(error, PlainError::Connect(_)), "{error:?}");
        assert_eq!(pool.idle_count(), 0);
    }
}
