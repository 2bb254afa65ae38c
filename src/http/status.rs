//! The proxy's own endpoints that are not about a conversation: health, readiness, metrics, and
//! the answers for paths and methods nothing serves.

use std::sync::Arc;

use axum::extract::State;
use axum::response::IntoResponse;
use http::{Method, Uri};

use super::app::App;
use super::error::ApiError;

pub(super) async fn not_found(uri: Uri) -> ApiError {
    ApiError::NotFound(format!("no route for {}", uri.path()))
}

pub(super) async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::MethodNotAllowed(format!("{method} is not allowed on {}", uri.path()))
}

pub(super) async fn healthz() -> impl IntoResponse {
    axum::Json(serde_json::json!({"status": "ok"}))
}

pub(super) async fn readyz(State(app): State<Arc<App>>) -> impl IntoResponse {
    let store = app.engine.store();
    let status = if store.healthy() { "ready" } else { "degraded" };
    axum::Json(serde_json::json!({"status": status, "store": store.kind()}))
}

pub(super) async fn metrics(State(app): State<Arc<App>>) -> impl IntoResponse {
    (
        [(
            http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        app.metrics.render(),
    )
}
