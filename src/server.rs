//! Building the application from configuration and serving it until shutdown.
//!
//! `serve` takes its listener and shutdown signal as parameters, so tests start the proxy on port
//! 0 in-process and stop it at will.
//!
//! Shutdown drains: no new connections, open ones closed once their requests are answered, no
//! new summary started ([`Engine::drain`]), and summaries already running (for a waiting client
//! or ahead of time) given the grace to finish and be stored. When the grace is about to run out,
//! every request still without an answer (most likely one waiting for a summary) is answered 503
//! with `retry-after` in its client's error shape, so that it is retried elsewhere or after the
//! restart rather than cut off with no answer. Then the spans still queued for export are sent.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use crate::compaction::{Engine, Parts};
use crate::config::{redact_url, Config};
use crate::dialect::{anthropic::Messages, chat::Chat, responses::Responses, Dialect};
use crate::http::app::ClientCompaction;
use crate::http::direct::{self, Direct};
use crate::http::gateway_keys::GatewayKeys;
use crate::http::limits::{Activity, ConnectionLimits, HeldOpen, Limits};
use crate::http::parse_error_bodies::{Answered, ParseErrorBodies};
use crate::http::sealing::SealingKeys;
use crate::http::{router, ApiError, App};
use crate::measure::{windows::WindowTable, Meter};
use crate::metrics::Metrics;
use crate::store::{self, CheckpointStore, TimelineBounds};
use crate::telemetry::Telemetry;
use crate::upstream::summarizer::HttpSummarizer;
use crate::upstream::{KeyHeader, Upstream};

/// Messages whose token counts are remembered.
const METER_CACHE_MESSAGES: usize = 200_000;

/// The end of the shutdown grace kept for writing the 503s to requests still waiting (at most a
/// quarter of the grace).
const DRAIN_FLUSH: Duration = Duration::from_secs(1);

/// Builds the application state from a validated configuration.
pub async fn build(config: &Config) -> Result<Arc<App>, String> {
    let store = store::open(
        &config.store,
        Duration::from_secs(config.compaction.checkpoint_ttl_secs),
    )
    .await
    .map_err(|e| format!("store `{}`: {e}", redact_url(&config.store)))?;
    build_with_store(config, store).await
}

/// Builds the application around a given store (tests share one between instances).
pub async fn build_with_store(
    config: &Config,
    store: Arc<dyn CheckpointStore>,
) -> Result<Arc<App>, String> {
    let sealer = SealingKeys::open(config, store.clone()).await?;
    let metrics = Arc::new(
        Metrics::default()
            .reading_seen_elements(|| crate::dialect::registry::seen_counts().to_vec()),
    );
    let upstream = Upstream::new(
        &config.upstream,
        config.upstream_key(),
        Duration::from_millis(config.connect_timeout_ms),
        Duration::from_millis(config.first_byte_timeout_ms),
    )
    .map_err(|e| e.to_string())?
    .with_idle_timeout(
        Duration::from_millis(config.stream_idle_timeout_ms),
        metrics.upstream_silences.clone(),
    );
    let summary_base = if config.summarizer.upstream.is_empty() {
        &config.upstream
    } else {
        &config.summarizer.upstream
    };
    let summary_upstream = upstream
        .with_base(summary_base, config.summarizer_key())
        .map_err(|e| e.to_string())?;
    let anthropic_upstream = upstream
        .for_provider(
            &config.anthropic_upstream,
            config.anthropic_upstream_key(),
            KeyHeader::XApiKey,
        )
        .map_err(|e| e.to_string())?;
    let gateway_keys = GatewayKeys::load(
        Some(&config.gateway_keys_file)
            .filter(|f| !f.is_empty())
            .map(PathBuf::from),
        config.gateway_keys_text()?.as_deref(),
    )?;
    let telemetry = Telemetry::from_config(&config.telemetry)?;
    // Read when a wire format first parses a body: set before the first request.
    crate::dialect::seen::set_capacity(config.seen_elements_bytes);
    let (openai_continues, anthropic_continues) = config.summaries_continue();
    store.count_absorbed_errors(metrics.store_errors.clone());
    let parts = Parts {
        store,
        meter: Meter::new(METER_CACHE_MESSAGES),
        windows: WindowTable::new(&config.windows, config.default_window),
        summary_writer: Arc::new(
            HttpSummarizer::new(summary_upstream.clone(), Arc::new(Chat))
                .continuing(openai_continues),
        ),
        metrics: metrics.clone(),
    };
    let mut engine = Engine::new(config.compaction.clone(), config.summarizer.clone(), parts);
    if config.summarizer.upstream.is_empty() {
        // No summarizer of its own: each conversation is summarized by the provider it talks
        // to, in that provider's format and with the client's credentials for it.
        engine = engine
            .with_summarizer_for(
                Messages.name(),
                Arc::new(
                    HttpSummarizer::new(anthropic_upstream.clone(), Arc::new(Messages))
                        .continuing(anthropic_continues),
                ),
            )
            .with_summarizer_for(
                Responses.name(),
                Arc::new(
                    HttpSummarizer::new(summary_upstream, Arc::new(Responses))
                        .continuing(openai_continues),
                ),
            );
    }
    let engine = Arc::new(engine);
    Ok(Arc::new(App {
        engine,
        upstream,
        anthropic_upstream,
        metrics,
        limits: Limits::new(
            config.max_body_bytes,
            config.max_in_flight_body_bytes,
            Duration::from_millis(config.body_read_timeout_ms),
        ),
        connections: ConnectionLimits::new(
            Duration::from_millis(config.header_read_timeout_ms),
            config.max_connections,
        ),
        calibrate_streams: config.compaction.calibrate_streams,
        admin_token: Some(config.admin_token.clone()).filter(|t| !t.is_empty()),
        gateway_keys: gateway_keys.map(Arc::new),
        timeline: config.timeline.enabled.then_some(TimelineBounds {
            requests_per_conversation: config.timeline.requests_per_conversation,
            conversations: config.timeline.conversations,
            conversations_per_tenant: config.timeline.conversations_per_tenant,
        }),
        context_edits: config.emulates_context_management(),
        client_compaction: ClientCompaction {
            emulate: config.emulates_responses_compaction(),
            sealer,
        },
        telemetry,
    }))
}

/// Serves until `shutdown` resolves, then lets open requests finish for up to `grace`.
///
/// The accept loop is written out (rather than `axum::serve`) for the connection limits: at
/// most `max_connections` open at once, a connection that has not completed a request's
/// headers within `header_read_timeout` is closed, however slowly it trickles them, and so is
/// one left without an open request for as long, HTTP/1.1 and HTTP/2 alike. Each socket is
/// wrapped so that the answers hyper makes itself for unparsable requests carry an error body.
/// The spans still queued are sent before it returns.
pub async fn serve(
    listener: TcpListener,
    app: Arc<App>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> std::io::Result<()> {
    let telemetry = app.telemetry.clone();
    serve_connections(listener, app, shutdown, grace).await?;
    // The spans of the requests just drained are still queued: sent before the process ends.
    telemetry.shutdown().await;
    Ok(())
}

/// [`serve`] on one listener of several (one per runtime, started by the `workers` module): the
/// same, but the spans are left for the caller to send once every runtime has drained.
pub async fn serve_connections(
    listener: TcpListener,
    app: Arc<App>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> std::io::Result<()> {
    let limits = app.connections.clone();
    let engine = app.engine.clone();
    let router = router(app.clone());
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder.http2().timer(TokioTimer::new());
    let open = limits.open.clone();
    let connections = TaskTracker::new();
    let draining = CancellationToken::new();
    let abandon = CancellationToken::new();
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors, or the peer gave up before the accept: wait a moment
                    // rather than spin, and keep serving the connections already open.
                    tracing::warn!(error = %e, "Accepting a connection failed.");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // Responses are written in more than one segment (head, then body chunks); with Nagle's
        // algorithm on, the second segment waits for the client's delayed ACK (tens of
        // milliseconds per request on a kept-alive connection).
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "Could not set TCP_NODELAY on an accepted connection.");
        }
        let Ok(permit) = open.clone().try_acquire_owned() else {
            refuse_connection(stream);
            continue;
        };
        let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
        let started = std::sync::Mutex::new(Some(started_tx));
        let router = router.clone();
        let app = app.clone();
        let answered = Answered::default();
        let activity = Activity::default();
        let io = ParseErrorBodies::new(stream, answered.clone());
        let requests = activity.clone();
        let abandon = abandon.clone();
        let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            let first = started.lock().ok().and_then(|mut s| s.take());
            if let Some(tx) = first {
                let _ = tx.send(());
            }
            let open = requests.open();
            let answered = answered.clone();
            let anthropic = crate::http::error::is_messages_path(request.uri().path());
            let request = request.map(axum::body::Body::new);
            let response = match Direct::of(request.method(), request.uri().path()) {
                // Not boxed again: the handler inside is boxed where it is made, so what
                // hyper keeps room for, for as long as the connection lives, is small.
                Some(route) => direct::serve(app.clone(), route, request)
                    .map(Ok)
                    .left_future(),
                None => router.clone().oneshot(request).right_future(),
            };
            let abandon = abandon.clone();
            async move {
                let response = tokio::select! {
                    biased;
                    response = response => response,
                    _ = abandon.cancelled() => Ok(shutting_down(anthropic)),
                };
                answered.one_more();
                // Handed to hyper as it is: boxing it again would add a layer to every frame.
                response.map(|r| r.map(|body| HeldOpen { body, open }))
            }
        });
        let connection = builder
            .serve_connection_with_upgrades(TokioIo::new(io), service)
            .into_owned();
        let header_read_timeout = limits.header_read_timeout;
        let draining = draining.clone();
        connections.spawn(async move {
            tokio::pin!(connection);
            // HTTP/1 bounds each request's headers itself; this also bounds the time before
            // the first request of any protocol (hyper waits for a silent client's first bytes
            // without a deadline).
            let first = tokio::time::timeout(header_read_timeout, started_rx);
            tokio::pin!(first);
            let (mut started, mut closing) = (false, false);
            // Once asked to close, a connection has as long again to finish: an HTTP/2 client
            // that never acknowledges the GOAWAY's ping would otherwise keep it open.
            let close_by = tokio::time::sleep(Duration::MAX);
            tokio::pin!(close_by);
            loop {
                tokio::select! {
                    _ = &mut connection => break,
                    first = &mut first, if !started => {
                        if !matches!(first, Ok(Ok(()))) {
                            break;
                        }
                        started = true;
                    }
                    _ = draining.cancelled(), if !closing => {
                        connection.as_mut().graceful_shutdown();
                        closing = true;
                    }
                    // Closing an idle connection gracefully (a GOAWAY on HTTP/2) tells its
                    // client to open a new one for its next request.
                    _ = activity.idle_for(header_read_timeout), if started && !closing => {
                        connection.as_mut().graceful_shutdown();
                        closing = true;
                        close_by
                            .as_mut()
                            .reset(tokio::time::Instant::now() + header_read_timeout);
                    }
                    _ = &mut close_by, if closing => break,
                }
            }
            drop(permit);
        });
    }
    drop(listener);
    tracing::info!(
        grace_ms = grace.as_millis() as u64,
        "Shutting down: no new connections; draining open requests."
    );
    engine.drain();
    draining.cancel();
    connections.close();
    let flush = DRAIN_FLUSH.min(grace / 4);
    let settled = async {
        tokio::join!(connections.wait(), engine.summaries_finished());
    };
    if tokio::time::timeout(grace - flush, settled).await.is_err() {
        tracing::warn!(
            "Drain deadline reached; answering the requests still waiting 503 and closing."
        );
        abandon.cancel();
        if tokio::time::timeout(flush, connections.wait())
            .await
            .is_err()
        {
            tracing::warn!("Closing the connections still open.");
        }
    }
    Ok(())
}

/// The answer to a request still waiting when the shutdown grace runs out, in its client's error
/// shape (Anthropic's on `/v1/messages`).
fn shutting_down(anthropic: bool) -> axum::response::Response {
    ApiError::Busy {
        message: "the proxy is shutting down; retry the request".into(),
        retry_after_secs: 1,
    }
    .in_shape_of(anthropic)
}

/// Answers a connection beyond the cap with a 503 and closes it, without reading from it.
fn refuse_connection(stream: TcpStream) {
    // Written before any request is read, so for either client: the OpenAI shape with
    // Anthropic's top-level `"type": "error"`, as the answers to unparsable requests are.
    let body = r#"{"type":"error","error":{"message":"the proxy has as many open connections as it allows; retry shortly","type":"server_error","param":null,"code":"overloaded"}}"#;
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    // One attempt, never a wait: a fresh socket's send buffer takes this whole.
    let _ = stream.try_write(answer.as_bytes());
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn answer(anthropic: bool) -> (u16, Option<String>, serde_json::Value) {
        let response = shutting_down(anthropic);
        let status = response.status().as_u16();
        let retry = response
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        (status, retry, serde_json::from_slice(&body).unwrap())
    }

    #[tokio::test]
    async fn requests_cut_by_the_drain_are_answered_503_in_their_clients_shape() {
        let (status, retry, openai) = answer(false).await;
        assert_eq!((status, retry.as_deref()), (503, Some("1")));
        assert_eq!(openai["error"]["code"], "overloaded");
        let (status, retry, anthropic) = answer(true).await;
        assert_eq!((status, retry.as_deref()), (503, Some("1")));
        assert_eq!(anthropic["type"], "error");
        assert!(anthropic["error"]["message"]
            .as_str()
            .unwrap()
            .contains("shutting down"));
    }
}
