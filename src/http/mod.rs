//! The inbound side: the only module that knows axum. Routes, the handlers of the measured path
//! (chat completions, Anthropic Messages, Responses; the path itself is [`measured`]), the
//! pass-through for everything else under `/v1/`, health, metrics and the checkpoint API.

pub mod client_compaction;
mod counting;
pub mod error;
pub mod gateway_keys;
pub mod limits;
pub mod log;
mod measured;
pub mod parse_error_bodies;
pub mod path;
mod request_headers;
pub mod stream;
pub mod tenant;

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::Extension;
use axum::Router;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Uri};

use crate::compaction::Engine;
use crate::dialect::{anthropic::Messages, chat::Chat, responses::Responses};
use crate::identity;
use crate::metrics::{Metrics, RequestLabels, Route};
use crate::upstream::{self, Upstream, CREDENTIAL_HEADERS};

pub use error::ApiError;
use log::Escaped;

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
    /// Who answers the compaction Responses clients ask for.
    pub client_compaction: client_compaction::ClientCompaction,
}

/// The router with every route and the panic guard.
pub fn router(app: Arc<App>) -> Router {
    let provider_routes = Router::new()
        .route("/v1/chat/completions", post(chat).fallback(passthrough))
        .route("/v1/messages", post(messages).fallback(passthrough))
        .route(
            "/v1/messages/count_tokens",
            post(count_tokens).fallback(passthrough),
        )
        .route("/v1/responses", post(responses).fallback(passthrough))
        .route(
            "/v1/responses/input_tokens",
            post(input_tokens).fallback(passthrough),
        )
        .route(
            "/v1/responses/compact",
            post(client_compaction::compact).fallback(passthrough),
        )
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

/// `POST /v1/chat/completions`: the measured path in the chat dialect.
async fn chat(
    State(app): State<Arc<App>>,
    Extension(tenant): Extension<tenant::Tenant>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let target = measured::Target {
        dialect: &Chat,
        route: Route::ChatCompletions,
        path: "/v1/chat/completions",
        upstream: &app.upstream,
        upstream_path: "/chat/completions".into(),
        holds_server_state: None,
        client_compaction: false,
    };
    measured::serve(&app, &tenant, &headers, body, target).await
}

/// `POST /v1/messages`: the measured path in Anthropic's dialect, to the Anthropic provider.
/// The query (`?beta=true`) goes along.
async fn messages(
    State(app): State<Arc<App>>,
    Extension(tenant): Extension<tenant::Tenant>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let target = messages_target(&app, "/v1/messages", &uri);
    measured::serve(&app, &tenant, &headers, body, target).await
}

/// `POST /v1/messages/count_tokens`: counted through the conversation's checkpoint.
async fn count_tokens(
    State(app): State<Arc<App>>,
    Extension(tenant): Extension<tenant::Tenant>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let target = messages_target(&app, "/v1/messages/count_tokens", &uri);
    measured::count_through_checkpoint(&app, &tenant, &headers, body, target).await
}

/// A `/v1/messages…` route on the Anthropic provider, which keeps the whole path and query.
fn messages_target<'a>(app: &'a App, path: &'static str, uri: &Uri) -> measured::Target<'a> {
    measured::Target {
        dialect: &Messages,
        route: Route::Messages,
        path,
        upstream: &app.anthropic_upstream,
        upstream_path: match uri.query() {
            Some(q) => format!("{path}?{q}"),
            None => path.into(),
        },
        holds_server_state: None,
        client_compaction: false,
    }
}

/// `POST /v1/responses/input_tokens`: counted through the conversation's checkpoint.
async fn input_tokens(
    State(app): State<Arc<App>>,
    Extension(tenant): Extension<tenant::Tenant>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let target = responses_target(&app, "/v1/responses/input_tokens");
    measured::count_through_checkpoint(&app, &tenant, &headers, body, target).await
}

/// `POST /v1/responses`: the measured path in the Responses dialect. A request that relies on
/// state the provider holds (`previous_response_id`, `conversation`) is forwarded untouched.
async fn responses(
    State(app): State<Arc<App>>,
    Extension(tenant): Extension<tenant::Tenant>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let target = measured::Target {
        holds_server_state: Some(crate::dialect::responses::uses_server_state),
        ..responses_target(&app, "/v1/responses")
    };
    measured::serve(&app, &tenant, &headers, body, target).await
}

/// A `/v1/responses…` route on the OpenAI-compatible provider, whose base already ends in `/v1`.
fn responses_target<'a>(app: &'a App, path: &'static str) -> measured::Target<'a> {
    measured::Target {
        dialect: &Responses,
        route: Route::Responses,
        path,
        upstream: &app.upstream,
        upstream_path: path.trim_start_matches("/v1").into(),
        holds_server_state: None,
        client_compaction: app.client_compaction.emulate,
    }
}

pub(super) fn set(headers: &mut HeaderMap, name: &'static str, value: impl ToString) {
    if let Ok(v) = HeaderValue::from_str(&value.to_string()) {
        headers.insert(HeaderName::from_static(name), v);
    }
}

pub(super) async fn passthrough(
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
