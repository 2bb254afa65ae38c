//! Talking to the provider: the only module that knows the HTTP client.
//!
//! A TLS provider is reached through hyper's own pooled client (hyper-util's), with rustls and
//! HTTP/2 where the provider offers it; a plain-HTTP one (a model server nearby) through
//! HTTP/1.1 connections pooled here ([`plain`]), which costs a small request a tenth fewer
//! instructions. Either way a request crosses the fewest layers there are, which a proxy pays
//! on every request (`benches/results/2026-12-03-floor.md`). Requests go out with the client's
//! headers minus hop-by-hop ones (and with the configured key in place of the client's
//! credentials, when there is one); responses come back as a status, headers and a byte stream
//! that is never buffered. An answer that goes silent for longer than configured ends with an
//! error ([`idle`]). [`summarizer`] sends summary requests; [`base`] builds the URIs they go
//! to; [`resolve`] bounds the name lookup before a connection as the connection is bounded;
//! [`hop_by_hop`] names the headers that never travel on.

mod base;
mod hop_by_hop;
pub mod idle;
mod plain;
mod resolve;
pub mod summarizer;

use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt, TryStreamExt};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::dns::GaiResolver;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use prometheus_client::metrics::counter::Counter;

use base::Base;
pub use hop_by_hop::{strip_hop_by_hop, CREDENTIAL_HEADERS};
use plain::{PlainError, PlainPool};

/// A response body as it arrives.
pub type ByteStream = Pin<Box<dyn Stream<Item = Result<Bytes, std::io::Error>> + Send>>;

/// Why the upstream could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("upstream unreachable: {0}")]
    Unreachable(String),
    /// Connected, but the exchange failed (closed early, not HTTP).
    #[error("upstream sent no valid response: {0}")]
    Broken(String),
    #[error("upstream timed out: {0}")]
    Timeout(String),
    #[error("request refused: {0}")]
    Refused(String),
}

/// A response's head and its streaming body.
pub struct UpstreamResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: ByteStream,
}

impl UpstreamResponse {
    /// Reads the whole body, up to `limit` bytes (error bodies and summaries are small).
    pub async fn read_body(&mut self, limit: usize) -> Result<Bytes, UpstreamError> {
        let mut collected = Vec::new();
        while let Some(chunk) = self.body.next().await {
            let chunk = chunk.map_err(|e| UpstreamError::Broken(e.to_string()))?;
            collected.extend_from_slice(&chunk);
            if collected.len() > limit {
                return Err(UpstreamError::Broken(format!(
                    "response larger than {limit} bytes"
                )));
            }
        }
        Ok(Bytes::from(collected))
    }
}

/// How a configured key is presented to the provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyHeader {
    /// `Authorization: Bearer {key}` (OpenAI and compatible providers).
    #[default]
    Bearer,
    /// `x-api-key: {key}` (Anthropic).
    XApiKey,
}

/// A request body on its way to the provider: bytes in hand, or the client's upload as it
/// arrives.
pub struct RequestBody {
    body: UnsyncBoxBody<Bytes, std::io::Error>,
    whole: bool,
}

type Connector = HttpsConnector<HttpConnector<resolve::Bounded<GaiResolver>>>;
type HttpClient = Client<Connector, UnsyncBoxBody<Bytes, std::io::Error>>;

/// The configured way to reach one provider.
#[derive(Clone)]
pub struct Upstream {
    client: HttpClient,
    /// A plain-HTTP base's own pool ([`plain`]); TLS bases go through `client`.
    plain: Option<PlainPool>,
    base: Base,
    key: Option<String>,
    key_header: KeyHeader,
    connect_timeout: Duration,
    first_byte_timeout: Duration,
    /// The longest silence allowed inside an answer, once its head has arrived.
    idle_timeout: Duration,
    /// Counts the answers ended for it.
    silences: Counter,
}

/// A client over a pool of its own, HTTP/1.1 and HTTP/2, TLS by the web PKI roots. HTTP/2 only
/// by ALPN over TLS: a plain-HTTP base's `Host` is made once on that ground
/// ([`base::Base::host_header`]).
fn http_client(connect_timeout: Duration) -> HttpClient {
    let mut http = tcp_connector(connect_timeout);
    http.enforce_http(false);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_webpki_roots()
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http);
    // This client follows no redirects, as it must not: a redirect would carry the prompt and
    // the credential headers (`api-key` and `x-api-key` included) to wherever the upstream
    // points, so 3xx answers go back to the client.
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .build(https)
}

/// TCP connections with the name lookup and the connection itself bounded by
/// `connect_timeout`, and Nagle's delay off (a request's head and body go out at once).
fn tcp_connector(connect_timeout: Duration) -> HttpConnector<resolve::Bounded<GaiResolver>> {
    let resolver = resolve::Bounded::new(GaiResolver::new(), connect_timeout, resolve::HEDGE_AFTER);
    let mut http = HttpConnector::new_with_resolver(resolver);
    http.set_connect_timeout(Some(connect_timeout));
    http.set_nodelay(true);
    http
}

/// A pool of its own for `base` when it is plain HTTP.
fn plain_pool(base: &Base, connect_timeout: Duration) -> Option<PlainPool> {
    let target = base.plain_target()?;
    Some(PlainPool::new(
        tcp_connector(connect_timeout),
        target,
        plain::IDLE_FOR,
    ))
}

impl Upstream {
    pub fn new(
        base: &str,
        key: Option<String>,
        connect_timeout: Duration,
        first_byte_timeout: Duration,
    ) -> Result<Upstream, UpstreamError> {
        let base = Base::parse(base)?;
        Ok(Upstream {
            client: http_client(connect_timeout),
            plain: plain_pool(&base, connect_timeout),
            base,
            key,
            key_header: KeyHeader::Bearer,
            connect_timeout,
            first_byte_timeout,
            idle_timeout: first_byte_timeout,
            silences: Counter::default(),
        })
    }

    /// The same, with answers ended after `idle` without a byte ([`idle::IdleBound`]), each
    /// one counted in `silences`.
    pub fn with_idle_timeout(mut self, idle: Duration, silences: Counter) -> Upstream {
        self.idle_timeout = idle;
        self.silences = silences;
        self
    }

    /// The same provider with a connection pool of its own, for another runtime: a pooled
    /// connection is driven by the runtime that opened it, so sharing one pool between runtimes
    /// would wake another thread for every call.
    pub fn with_own_pool(&self) -> Upstream {
        Upstream {
            client: http_client(self.connect_timeout),
            plain: plain_pool(&self.base, self.connect_timeout),
            ..self.clone()
        }
    }

    /// The same general client and timeouts, aimed at another base URL and key (a plain-HTTP
    /// base gets a pool of its own).
    pub fn with_base(&self, base: &str, key: Option<String>) -> Result<Upstream, UpstreamError> {
        self.for_provider(base, key.or_else(|| self.key.clone()), self.key_header)
    }

    /// The same general client and timeouts, aimed at another provider with its own key (none:
    /// the client's credentials pass through), presented as `key_header` (a plain-HTTP base
    /// gets a pool of its own).
    pub fn for_provider(
        &self,
        base: &str,
        key: Option<String>,
        key_header: KeyHeader,
    ) -> Result<Upstream, UpstreamError> {
        let base = Base::parse(base)?;
        Ok(Upstream {
            client: self.client.clone(),
            plain: plain_pool(&base, self.connect_timeout),
            base,
            key,
            key_header,
            connect_timeout: self.connect_timeout,
            first_byte_timeout: self.first_byte_timeout,
            idle_timeout: self.idle_timeout,
            silences: self.silences.clone(),
        })
    }

    /// How long the provider has to start its answer after a request is sent.
    pub fn first_byte_timeout(&self) -> Duration {
        self.first_byte_timeout
    }

    /// The provider's host, as its base URL names it.
    pub fn host(&self) -> &str {
        self.base.host()
    }

    /// The provider's port, stated or the scheme's.
    pub fn port(&self) -> Option<u16> {
        self.base.port()
    }

    /// The path `path_and_query` reaches on the provider (its base path joined on), without
    /// the query.
    pub fn path_of(&self, path_and_query: &str) -> String {
        self.base.path_of(path_and_query)
    }

    /// Sends a request to `{base}{path_and_query}` and returns once the response head arrives.
    pub async fn send(
        &self,
        method: Method,
        path_and_query: &str,
        mut headers: HeaderMap,
        body: RequestBody,
    ) -> Result<UpstreamResponse, UpstreamError> {
        strip_hop_by_hop(&mut headers);
        // The provider's host, not the proxy's: made once for a plain-HTTP base, else set
        // by the client library from the URI.
        match self.base.host_header() {
            Some(host) => {
                headers.insert(http::header::HOST, host.clone());
            }
            None => {
                headers.remove(http::header::HOST);
            }
        }
        // A buffered body gets its length from the client library; a streamed one is the
        // client's own upload, sent with the length the client declared (not chunked: some
        // servers do not accept chunked uploads).
        if body.whole {
            headers.remove(http::header::CONTENT_LENGTH);
        }
        if let Some(key) = &self.key {
            for name in &CREDENTIAL_HEADERS {
                headers.remove(name);
            }
            let (name, value) = match self.key_header {
                KeyHeader::Bearer => (http::header::AUTHORIZATION, format!("Bearer {key}")),
                KeyHeader::XApiKey => (HeaderName::from_static("x-api-key"), key.clone()),
            };
            let value = HeaderValue::from_str(&value).map_err(|_| {
                UpstreamError::Unreachable(
                    "configured upstream key is not a valid header value".into(),
                )
            })?;
            headers.insert(name, value);
        }
        let mut request = http::Request::new(body.body);
        *request.method_mut() = method;
        *request.headers_mut() = headers;
        let no_answer = || {
            UpstreamError::Timeout(format!(
                "no response within {} ms",
                self.first_byte_timeout.as_millis()
            ))
        };
        let response = match &self.plain {
            Some(pool) => {
                // Sent on a connection to the base's own address: the request line names the
                // path and query only (the host is in `Host`).
                *request.uri_mut() = pool.target(path_and_query, || {
                    self.base.uri_for(path_and_query).map(origin_form)
                })?;
                match tokio::time::timeout(self.first_byte_timeout, pool.send(request)).await {
                    Err(_) => return Err(no_answer()),
                    Ok(Err(e)) => {
                        let connect = matches!(e, PlainError::Connect(_));
                        return Err(upstream_error(&e, connect));
                    }
                    Ok(Ok(r)) => r,
                }
            }
            None => {
                *request.uri_mut() = self.base.uri_for(path_and_query)?;
                let sent = self.client.request(request);
                match tokio::time::timeout(self.first_byte_timeout, sent).await {
                    Err(_) => return Err(no_answer()),
                    Ok(Err(e)) => return Err(upstream_error(&e, e.is_connect())),
                    Ok(Ok(r)) => r,
                }
            }
        };
        let (head, body) = response.into_parts();
        let mut headers = head.headers;
        strip_hop_by_hop(&mut headers);
        let body = body.into_data_stream().map_err(std::io::Error::other);
        Ok(UpstreamResponse {
            status: head.status,
            headers,
            body: Box::pin(idle::IdleBound::new(
                body,
                self.idle_timeout,
                self.silences.clone(),
            )),
        })
    }
}

/// The path and query of `uri`, alone.
fn origin_form(uri: Uri) -> Uri {
    let mut parts = uri.into_parts();
    parts.scheme = None;
    parts.authority = None;
    Uri::from_parts(parts).unwrap_or_else(|_| Uri::from_static("/"))
}

/// What a failed exchange is to the client: out of time, no connection (`connect`), or a
/// connection that gave no valid answer.
fn upstream_error(e: &(dyn std::error::Error + 'static), connect: bool) -> UpstreamError {
    if timed_out(e) {
        UpstreamError::Timeout(describe(e, connect))
    } else if connect {
        UpstreamError::Unreachable(describe(e, connect))
    } else {
        UpstreamError::Broken(describe(e, connect))
    }
}

/// Whether the connection attempt or the exchange ran out of time (the connect timeout).
fn timed_out(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if s.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        {
            return true;
        }
        source = s.source();
    }
    false
}

/// An error's chain of causes. The URL is never part of it (its query could carry
/// credentials): the client's errors do not name it.
fn describe(e: &(dyn std::error::Error + 'static), connect: bool) -> String {
    let mut text = String::from(if timed_out(e) {
        "timed out"
    } else if connect {
        "connection failed"
    } else {
        "request failed"
    });
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Wraps bytes as a request body.
pub fn body_from(bytes: impl Into<Bytes>) -> RequestBody {
    RequestBody {
        body: Full::new(bytes.into())
            .map_err(|never| match never {})
            .boxed_unsync(),
        whole: true,
    }
}

/// Wraps a stream as a request body, for pass-through uploads.
pub fn body_from_stream<S>(stream: S) -> RequestBody
where
    S: Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
{
    RequestBody {
        body: StreamBody::new(stream.map_ok(Frame::data)).boxed_unsync(),
        whole: false,
    }
}
