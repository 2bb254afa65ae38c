//! `GET /compactor/v1/checkpoints/{id}`: a checkpoint read by the tenant that made it, or by the
//! admin token.
//!
//! Without gateway keys a tenant is its credential headers, names included, so a key sent as
//! `x-api-key` (Claude Code, the Anthropic SDKs) and the same key as `Authorization: Bearer` are
//! two tenants on the provider routes. Here, where a person reads with curl what an agent made,
//! one key opens what it made under any of the credential headers.

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
    let tenants: Vec<String> = match (&app.gateway_keys, is_admin) {
        (_, true) => vec![],
        (Some(keys), false) => tenant::authenticate(keys, &mut headers)
            .into_iter()
            .filter(|t| !t.anonymous)
            .map(|t| identity::hex(&t.seed))
            .collect(),
        (None, false) => same_key_tenants(&headers),
    };
    // Every anonymous client would be one tenant: reading by id needs a credential.
    if tenants.is_empty() && !is_admin {
        return Err(ApiError::Unauthorized(
            "reading a checkpoint needs the credential that made it (or the admin token)".into(),
        ));
    }
    let found = app
        .engine
        .store()
        .get(&id)
        .await
        .map_err(|e| ApiError::Internal(format!("checkpoint store: {e}")))?;
    match found {
        // Another tenant's checkpoint is reported as absent, not as forbidden.
        Some(cp) if is_admin || tenants.contains(&cp.tenant) => Ok(axum::Json(cp).into_response()),
        _ => Err(ApiError::NotFound(format!("no checkpoint {id}"))),
    }
}

/// The tenants a request's one key would be under each credential header: the headers as sent,
/// and the same key as `Authorization: Bearer`, `x-api-key` and `api-key`. Anonymous: none.
fn same_key_tenants(headers: &HeaderMap) -> Vec<String> {
    let sent = tenant::Tenant::from_credentials(headers);
    if sent.anonymous {
        return vec![];
    }
    let mut tenants = vec![identity::hex(&sent.seed)];
    let key = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()))
        .or_else(|| headers.get("api-key").and_then(|v| v.to_str().ok()));
    let Some(key) = key.map(str::trim) else {
        return tenants;
    };
    let forms = [
        ("authorization", format!("Bearer {key}")),
        ("x-api-key", key.to_string()),
        ("api-key", key.to_string()),
    ];
    for (name, value) in forms {
        let Ok(value) = http::HeaderValue::from_str(&value) else {
            continue;
        };
        let mut one = HeaderMap::new();
        one.insert(name, value);
        let seed = identity::hex(&tenant::Tenant::from_credentials(&one).seed);
        if !tenants.contains(&seed) {
            tenants.push(seed);
        }
    }
    tenants
}
