//! Building the application from configuration and serving it until shutdown.
//!
//! `serve` takes its listener and shutdown signal as parameters, so tests start the proxy on port
//! 0 in-process and stop it at will.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::serve::ListenerExt;
use tokio::net::TcpListener;

use crate::compaction::Engine;
use crate::config::Config;
use crate::dialect::chat::Chat;
use crate::http::{router, App};
use crate::measure::{windows::WindowTable, Meter};
use crate::metrics::Metrics;
use crate::store::{self, CheckpointStore};
use crate::upstream::summarizer::HttpSummarizer;
use crate::upstream::{KeyHeader, Upstream};

/// Messages whose token counts are remembered.
const METER_CACHE_MESSAGES: usize = 200_000;

/// Builds the application state from a validated configuration.
pub async fn build(config: &Config) -> Result<Arc<App>, String> {
    let store = store::open(
        &config.store,
        Duration::from_secs(config.compaction.checkpoint_ttl_secs),
    )
    .await
    .map_err(|e| format!("store `{}`: {e}", redact_url(&config.store)))?;
    build_with_store(config, store)
}

/// Builds the application around a given store (tests share one between instances).
pub fn build_with_store(
    config: &Config,
    store: Arc<dyn CheckpointStore>,
) -> Result<Arc<App>, String> {
    let upstream = Upstream::new(
        &config.upstream,
        config.upstream_key(),
        Duration::from_millis(config.connect_timeout_ms),
        Duration::from_millis(config.first_byte_timeout_ms),
    )
    .map_err(|e| e.to_string())?;
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
    let metrics = Arc::new(Metrics::default());
    let engine = Arc::new(Engine::new(
        config.compaction.clone(),
        config.summarizer.clone(),
        store,
        Meter::new(METER_CACHE_MESSAGES),
        WindowTable::new(&config.windows, config.default_window),
        Arc::new(HttpSummarizer::new(summary_upstream, Arc::new(Chat))),
        metrics.clone(),
    ));
    Ok(Arc::new(App {
        engine,
        upstream,
        anthropic_upstream,
        metrics,
        max_body_bytes: config.max_body_bytes,
        calibrate_streams: config.compaction.calibrate_streams,
        admin_token: Some(config.admin_token.clone()).filter(|t| !t.is_empty()),
    }))
}

/// Serves until `shutdown` resolves, then lets open requests finish for up to `grace`.
pub async fn serve(
    listener: TcpListener,
    app: Arc<App>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> std::io::Result<()> {
    let (stopping_tx, stopping_rx) = tokio::sync::oneshot::channel::<()>();
    let signal = async move {
        shutdown.await;
        tracing::info!(
            grace_ms = grace.as_millis() as u64,
            "Shutting down: no new connections; draining open requests."
        );
        let _ = stopping_tx.send(());
    };
    // Responses are written in more than one segment (head, then body chunks); with Nagle's
    // algorithm on, the second segment waits for the client's delayed ACK (tens of milliseconds
    // per request on a kept-alive connection).
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "Could not set TCP_NODELAY on an accepted connection.");
        }
    });
    let server = axum::serve(listener, router(app)).with_graceful_shutdown(signal);
    let deadline = async move {
        if stopping_rx.await.is_ok() {
            tokio::time::sleep(grace).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        result = server => result,
        _ = deadline => {
            tracing::warn!("Drain deadline reached; closing the remaining requests.");
            Ok(())
        }
    }
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

/// A store URL with any password hidden, for messages.
fn redact_url(spec: &str) -> String {
    match (spec.find("://"), spec.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://<redacted>{}", &spec[..s], &spec[at..]),
        _ => spec.to_string(),
    }
}
