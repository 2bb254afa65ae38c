//! `GET /compactor/v1/checkpoints/{id}`: a checkpoint read by the tenant that made it, or by the
//! admin token ([`Reader`]).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use http::HeaderMap;

use super::app::App;
use super::error::ApiError;
use super::reader::Reader;

pub(super) async fn checkpoint(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let reader = Reader::of(&app, &headers, "a checkpoint")?;
    let found = app
        .engine
        .store()
        .get(&id)
        .await
        .map_err(|e| ApiError::Internal(format!("checkpoint store: {e}")))?;
    match found {
        // Another tenant's checkpoint is reported as absent, not as forbidden.
        Some(cp) if reader.may_read(&cp.tenant) => Ok(axum::Json(cp).into_response()),
        _ => Err(ApiError::NotFound(format!("no checkpoint {id}"))),
    }
}
