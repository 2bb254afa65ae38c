//! Who may read what the proxy keeps about conversations (checkpoints, timelines): the admin
//! token reads everything, any other caller what its own tenant made.
//!
//! Without gateway keys a tenant is its credential headers, names included, so a key sent as
//! `x-api-key` (Claude Code, the Anthropic SDKs) and the same key as `Authorization: Bearer` are
//! two tenants on the provider routes. Here, where a person reads with curl or a browser what an
//! agent made, one key opens what it made under any of the credential headers.

use std::sync::Arc;

use http::HeaderMap;

use super::app::App;
use super::error::ApiError;
use super::tenant::{self, Tenant};
use crate::identity;

/// The caller of a read endpoint.
pub(super) enum Reader {
    Admin,
    /// The tenant hashes (hex) the caller's key stands for; never empty.
    Tenants(Vec<String>),
}

impl Reader {
    /// The reader a request's headers make; a caller without a credential is refused, since
    /// every anonymous client would be one tenant. `what` names what was to be read.
    pub(super) fn of(app: &Arc<App>, headers: &HeaderMap, what: &str) -> Result<Reader, ApiError> {
        let bearer = headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        // Compared as hashes: `blake3::Hash` compares in constant time, so the answer's timing
        // tells nothing of how much of a guess was right.
        let admin = |token: &str, sent: &str| {
            blake3::hash(token.as_bytes()) == blake3::hash(sent.as_bytes())
        };
        if matches!((&app.admin_token, bearer), (Some(t), Some(b)) if admin(t, b)) {
            return Ok(Reader::Admin);
        }
        let tenants: Vec<String> = match &app.gateway_keys {
            Some(keys) => tenant::authenticate(keys, &mut headers.clone())
                .into_iter()
                .filter(|t| !t.anonymous)
                .map(|t| identity::hex(&t.seed))
                .collect(),
            None => same_key_tenants(headers),
        };
        if tenants.is_empty() {
            return Err(ApiError::Unauthorized(format!(
                "reading {what} needs the credential that made it (or the admin token)"
            )));
        }
        Ok(Reader::Tenants(tenants))
    }

    /// Whether this reader may read what `tenant` (a hash, in hex) made.
    pub(super) fn may_read(&self, tenant: &str) -> bool {
        match self {
            Reader::Admin => true,
            Reader::Tenants(tenants) => tenants.iter().any(|t| t == tenant),
        }
    }
}

/// The tenants a request's one key would be under each credential header: the headers as sent,
/// and the same key as `Authorization: Bearer`, `x-api-key` and `api-key`. Anonymous: none.
fn same_key_tenants(headers: &HeaderMap) -> Vec<String> {
    let sent = Tenant::from_credentials(headers);
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
        let seed = identity::hex(&Tenant::from_credentials(&one).seed);
        if !tenants.contains(&seed) {
            tenants.push(seed);
        }
    }
    tenants
}
