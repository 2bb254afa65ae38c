//! `GET /compactor/v1/checkpoints/{id}`: a checkpoint read by the tenant that made it (with the
//! credential its client uses), or by the admin token.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use http::HeaderMap;

use super::app::App;
use super::error::ApiError;
use super::tenant;
use crate::identity;

pub(super) async fn checkpoint(
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
