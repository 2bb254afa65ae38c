//! Everything else under `/v1/`: forwarded as it comes, within the body limits, to the provider
//! its path belongs to, and streamed back.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use http::{HeaderMap, Method, Uri};

use super::app::App;
use super::error::ApiError;
use super::headers::forwarded_headers;
use super::log::Escaped;
use super::path;
use crate::metrics::Route;
use crate::upstream::{self, Upstream};

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
        Err(e) => e.for_path(uri.path()),
    };
    app.count_request(Route::Passthrough, &response);
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
    mut body: Body,
) -> Result<Response, ApiError> {
    app.limits.check_declared(headers, &mut body).await?;
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
