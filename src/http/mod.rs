//! The inbound side: the only module that knows axum. Routes, the chat handler that takes the
//! measuring path, the pass-through for everything else under `/v1/`, health, metrics and the
//! checkpoint API.

pub mod error;
pub mod gateway_keys;
pub mod limits;
pub mod log;
pub mod path;
mod request_headers;
pub mod stream;
pub mod tenant;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::Extension;
use axum::Router;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Uri};

use crate::compaction::{Engine, Mode, Outcome, Prepared, RequestContext};
use crate::identity;
use crate::measure::{overflow, Cancel};
use crate::metrics::{Metrics, RequestLabels, Route};
use crate::request::ChatRequest;
use crate::upstream::{self, Upstream, UpstreamResponse, CREDENTIAL_HEADERS};

pub use error::ApiError;
use log::Escaped;
use request_headers::{instructions, refuse_encoded_body};

/// Everything a handler needs.
pub struct App {
    pub engine: Arc<Engine>,
    pub upstream: Upstream,
    /// Where `/v1/messages…` goes (the Anthropic provider).
    pub anthropic_upstream: Upstream,
    pub metrics: Arc<Metrics>,
    pub limits: limits::Limits,
    pub connections: limits::ConnectionLimits,
    pub calibrate_streams: bool,
    pub admin_token: Option<String>,
    /// Accepted client keys; `None`: any client may use the proxy.
    pub gateway_keys: Option<gateway_keys::GatewayKeys>,
}

/// The router with every route and the panic guard.
pub fn router(app: Arc<App>) -> Router {
    let provider_routes = Router::new()
        .route("/v1/chat/completions", post(chat).fallback(passthrough))
        .route("/v1/messages", any(passthrough))
        .route("/v1/messages/{*rest}", any(passthrough))
        .route("/v1/{*rest}", any(passthrough))
        .route_layer(axum::middleware::from_fn_with_state(
            app.clone(),
            tenant::identify,
        ));
    Router::new()
        .merge(provider_routes)
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/compactor/v1/checkpoints/{id}", get(checkpoint))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            error::panic_response,
        ))
        .with_state(app)
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::NotFound(format!("no route for {}", uri.path()))
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::MethodNotAllowed(format!("{method} is not allowed on {}", uri.path()))
}

async fn healthz() -> impl IntoResponse {
    axum::Json(serde_json::json!({"status": "ok"}))
}

async fn readyz(State(app): State<Arc<App>>) -> impl IntoResponse {
    let store = app.engine.store();
    let status = if store.healthy() { "ready" } else { "degraded" };
    axum::Json(serde_json::json!({"status": status, "store": store.kind()}))
}

async fn metrics(State(app): State<Arc<App>>) -> impl IntoResponse {
    (
        [(
            http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        app.metrics.render(),
    )
}

fn credential_headers(headers: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::new();
    for name in CREDENTIAL_HEADERS {
        for value in headers.get_all(*name) {
            out.append(HeaderName::from_static(name), value.clone());
        }
    }
    out
}

/// The client's headers as they go upstream: our own `x-compactor-*` headers removed.
fn forwarded_headers(headers: &HeaderMap) -> HeaderMap {
    let mut out = headers.clone();
    let own: Vec<HeaderName> = out
        .keys()
        .filter(|k| k.as_str().starts_with("x-compactor-"))
        .cloned()
        .collect();
    for name in own {
        out.remove(name);
    }
    out
}

async fn checkpoint(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    mut headers: HeaderMap,
) -> Result<Response, ApiError> {
    let bearer = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let is_admin = matches!((&app.admin_token, bearer), (Some(t), Some(b)) if t == b);
    let tenant = match (&app.gateway_keys, is_admin) {
        (_, true) => None,
        (Some(keys), false) => tenant::authenticate(keys, &mut headers),
        (None, false) => Some(tenant::Tenant::from_credentials(&headers)),
    };
    // Every anonymous client would be one tenant: reading by id needs a credential.
    let tenant = match tenant {
        Some(t) if t.anonymous => None,
        other => other,
    };
    if tenant.is_none() && !is_admin {
        return Err(ApiError::Unauthorized(
            "reading a checkpoint needs the credential that made it (or the admin token)".into(),
        ));
    }
    let tenant = tenant.map(|t| identity::hex(&t.seed));
    let found = app
        .engine
        .store()
        .get(&id)
        .await
        .map_err(|e| ApiError::Internal(format!("checkpoint store: {e}")))?;
    match found {
        // Another tenant's checkpoint is reported as absent, not as forbidden.
        Some(cp) if is_admin || tenant.as_deref() == Some(cp.tenant.as_str()) => {
            Ok(axum::Json(cp).into_response())
        }
        _ => Err(ApiError::NotFound(format!("no checkpoint {id}"))),
    }
}

fn header_str(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

async fn chat(
    State(app): State<Arc<App>>,
    Extension(tenant): Extension<tenant::Tenant>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    let result = chat_inner(&app, &tenant, &headers, body, started).await;
    let response = match result {
        Ok(r) => r,
        Err(e) => {
            tracing::info!(method = "POST", path = "/v1/chat/completions", status = e.status().as_u16(), error = %Escaped(&e), "Refused a chat request.");
            e.into_response()
        }
    };
    app.metrics
        .requests
        .get_or_create(&RequestLabels {
            route: Route::ChatCompletions,
            status: response.status().as_u16(),
        })
        .inc();
    response
}

async fn chat_inner(
    app: &Arc<App>,
    tenant: &tenant::Tenant,
    headers: &HeaderMap,
    body: Body,
    started: Instant,
) -> Result<Response, ApiError> {
    refuse_encoded_body(headers)?;
    let instructions = instructions(headers)?;
    let (bytes, _budget) = app.limits.read_body(headers, body).await?;
    let request = Arc::new(ChatRequest::parse(&bytes)?);
    measure_on_blocking_pool(app, &request).await;
    let mode = match header_str(headers, "x-compactor-mode") {
        None => Mode::Auto,
        Some(v) => Mode::parse(&v).ok_or_else(|| ApiError::BadRequest {
            message: format!("invalid x-compactor-mode `{v}`: expected auto, force or off"),
            param: Some("x-compactor-mode".into()),
            code: None,
        })?,
    };
    let context = RequestContext {
        tenant: tenant.seed,
        credentials: credential_headers(headers),
        mode,
        instructions,
        force_usage: request.stream && app.calibrate_streams && !request.client_wants_usage,
    };
    let outgoing = || {
        let mut out = forwarded_headers(headers);
        // Bodies come back uncompressed so usage can be read from them.
        out.remove(http::header::ACCEPT_ENCODING);
        out
    };
    let prepared = app
        .engine
        .prepare(&context, &request, None)
        .await
        .map_err(|e| ApiError::ContextLength(e.to_string()))?;
    let mut upstream_time = Duration::ZERO;
    let (mut prepared, mut response) =
        send_timed(app, outgoing(), prepared, &mut upstream_time).await?;
    if !response.status.is_success() {
        let error_body = response.read_body(4 * 1024 * 1024).await?;
        let overflow = overflow::classify(response.status.as_u16(), &error_body)
            .map(|o| o.unless_echoed(&error_body, &bytes));
        let retry = overflow.filter(|_| mode != Mode::Off);
        let Some(overflow) = retry else {
            return Ok(finish(
                app,
                &request,
                prepared.outcome,
                response,
                Some(error_body),
                started,
                upstream_time,
                &context,
            ));
        };
        // The provider's window is smaller than we thought: learn it, compact harder, retry once.
        app.metrics.overflow_retries.inc();
        app.engine
            .learn_overflow(&request.model, overflow, prepared.outcome.sent_raw_tokens)
            .await;
        let again = app
            .engine
            .prepare(&context, &request, Some(overflow))
            .await
            .map_err(|e| ApiError::ContextLength(e.to_string()))?;
        let summary_before = prepared.outcome.summary_time;
        (prepared, response) = send_timed(app, outgoing(), again, &mut upstream_time).await?;
        prepared.outcome.summary_time += summary_before;
        if !response.status.is_success() {
            let error_body = response.read_body(4 * 1024 * 1024).await?;
            return Ok(finish(
                app,
                &request,
                prepared.outcome,
                response,
                Some(error_body),
                started,
                upstream_time,
                &context,
            ));
        }
    }
    Ok(finish(
        app,
        &request,
        prepared.outcome,
        response,
        None,
        started,
        upstream_time,
        &context,
    ))
}

/// Counts the request's tokens on the blocking pool, which fills the meter's cache for the
/// engine: a large body never holds up the async workers (health checks, other clients), and
/// the count stops when the client leaves (this future is dropped).
async fn measure_on_blocking_pool(app: &App, request: &Arc<ChatRequest>) {
    let cancel = Cancel::default();
    let _cancel_when_dropped = cancel.on_drop();
    let (meter, request) = (app.engine.meter().clone(), request.clone());
    let counted =
        tokio::task::spawn_blocking(move || meter.measure_cancellable(&request, &cancel)).await;
    if let Err(e) = counted {
        tracing::warn!(error = %e, "Counting tokens on the blocking pool failed.");
    }
}

async fn send_timed(
    app: &App,
    headers: HeaderMap,
    mut prepared: Prepared,
    upstream_time: &mut Duration,
) -> Result<(Prepared, UpstreamResponse), ApiError> {
    let sent = Instant::now();
    let body = upstream::body_from(std::mem::take(&mut prepared.body));
    let response = app
        .upstream
        .send(Method::POST, "/chat/completions", headers, body)
        .await;
    let elapsed = sent.elapsed();
    *upstream_time += elapsed;
    app.metrics.upstream_seconds.observe(elapsed.as_secs_f64());
    Ok((prepared, response?))
}

fn set(headers: &mut HeaderMap, name: &'static str, value: impl ToString) {
    if let Ok(v) = HeaderValue::from_str(&value.to_string()) {
        headers.insert(HeaderName::from_static(name), v);
    }
}

#[allow(clippy::too_many_arguments)]
fn finish(
    app: &Arc<App>,
    request: &ChatRequest,
    outcome: Outcome,
    response: UpstreamResponse,
    error_body: Option<bytes::Bytes>,
    started: Instant,
    upstream_time: Duration,
    context: &RequestContext,
) -> Response {
    let UpstreamResponse {
        status,
        mut headers,
        body,
    } = response;
    let overhead = started
        .elapsed()
        .saturating_sub(upstream_time)
        .saturating_sub(outcome.summary_time);
    app.metrics.overhead_seconds.observe(overhead.as_secs_f64());
    set(
        &mut headers,
        "x-compactor-prompt-tokens",
        outcome.prompt_tokens,
    );
    set(&mut headers, "x-compactor-context-window", outcome.window);
    set(
        &mut headers,
        "x-compactor-overhead-ms",
        format!("{:.3}", overhead.as_secs_f64() * 1000.0),
    );
    set(&mut headers, "x-compactor-compacted", outcome.compacted);
    set(
        &mut headers,
        "x-compactor-tokens-before",
        outcome.tokens_before,
    );
    set(
        &mut headers,
        "x-compactor-tokens-after",
        outcome.tokens_after,
    );
    if let Some(id) = &outcome.checkpoint_id {
        set(&mut headers, "x-compactor-checkpoint", id);
    }
    if !outcome.summary_time.is_zero() {
        set(
            &mut headers,
            "x-compactor-summary-ms",
            outcome.summary_time.as_millis(),
        );
    }
    if let Some(status) = &outcome.status {
        set(
            &mut headers,
            "x-compactor-compaction",
            status.header_value(),
        );
    }
    if outcome.ready_checkpoint_used {
        set(&mut headers, "x-compactor-ready-checkpoint", "true");
    }
    // Checked again now: the store may have noticed an outage while serving this request.
    if outcome.store_degraded || !app.engine.store().healthy() {
        set(&mut headers, "x-compactor-store", "degraded");
    }
    tracing::info!(
        method = "POST",
        path = "/v1/chat/completions",
        status = status.as_u16(),
        model = %Escaped(&request.model),
        prompt_tokens = outcome.prompt_tokens,
        tokens_sent = outcome.tokens_after,
        compacted = outcome.compacted,
        upstream_ms = upstream_time.as_millis() as u64,
        overhead_ms = overhead.as_secs_f64() * 1000.0,
        "Served a chat request."
    );
    let body = match error_body {
        Some(bytes) => Body::from(bytes),
        None => {
            let engine = app.engine.clone();
            let model = request.model.clone();
            let counted = outcome.sent_raw_tokens;
            let sink: stream::UsageSink =
                Box::new(move |prompt_tokens| engine.observe_usage(&model, counted, prompt_tokens));
            let is_sse = headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("text/event-stream"));
            if is_sse {
                if context.force_usage {
                    headers.remove(http::header::CONTENT_LENGTH);
                }
                Body::from_stream(stream::Observed::sse(body, context.force_usage, sink))
            } else {
                Body::from_stream(stream::Observed::json(body, sink))
            }
        }
    };
    let mut out = Response::new(body);
    *out.status_mut() = status;
    *out.headers_mut() = headers;
    out
}

async fn passthrough(
    State(app): State<Arc<App>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    let response = match passthrough_inner(&app, method.clone(), &uri, &headers, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    };
    app.metrics
        .requests
        .get_or_create(&RequestLabels {
            route: Route::Passthrough,
            status: response.status().as_u16(),
        })
        .inc();
    tracing::info!(
        method = %Escaped(&method),
        path = %Escaped(uri.path()),
        status = response.status().as_u16(),
        elapsed_ms = started.elapsed().as_secs_f64() * 1000.0,
        "Passed a request through."
    );
    response
}

/// The provider a confined path (relative to `/v1`) goes to, and the path relative to its base:
/// `/v1/messages…` keeps its whole path on the Anthropic upstream; everything else goes without
/// `/v1` to the OpenAI-compatible one, whose base already ends in it.
fn upstream_for<'a>(app: &'a App, confined: &str) -> (&'a Upstream, String) {
    let is_messages = confined == "/messages" || confined.starts_with("/messages/");
    if is_messages {
        (&app.anthropic_upstream, format!("/v1{confined}"))
    } else {
        (&app.upstream, confined.to_string())
    }
}

async fn passthrough_inner(
    app: &App,
    method: Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    app.limits.check_declared(headers)?;
    let confined = path::confine(uri.path()).map_err(|e| ApiError::BadRequest {
        message: format!("refused path: {e}"),
        param: None,
        code: Some("invalid_path"),
    })?;
    let (upstream, path) = upstream_for(app, &confined);
    let path_and_query = match uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_string(),
    };
    let stream = app.limits.idle_limited(body);
    let response = upstream
        .send(
            method,
            &path_and_query,
            forwarded_headers(headers),
            upstream::body_from_stream(stream),
        )
        .await?;
    let mut out = Response::new(Body::from_stream(response.body));
    *out.status_mut() = response.status;
    *out.headers_mut() = response.headers;
    Ok(out)
}
