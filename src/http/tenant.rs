//! Who sent a request: the tenant whose hash seeds its conversations and owns its checkpoints.
//!
//! With gateway keys configured, a client must present one (as `Authorization: Bearer …`,
//! `api-key` or `x-api-key`); its tenant is the key's name, the key itself is removed before
//! the request goes upstream, and anything else is refused with 401 in the client's own error
//! shape. Without gateway keys, the tenant is a hash of the credential headers the client sent,
//! names included, so the same value under `api-key` and under `authorization` are two tenants.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use http::HeaderMap;
use tracing::Instrument;

use super::app::App;
use super::error::ApiError;
use super::gateway_keys::GatewayKeys;
use crate::identity::{self, Hash};
use crate::upstream::CREDENTIAL_HEADERS;

/// The tenant of one request, as handlers find it in the request's extensions.
#[derive(Debug, Clone)]
pub struct Tenant {
    /// Seeds the conversation hash chain; stored (as hex) with each checkpoint.
    pub seed: Hash,
    /// The gateway key's name, when gateway keys are in use.
    pub name: Option<Arc<str>>,
    /// Whether the client sent no credential at all.
    pub anonymous: bool,
}

impl Tenant {
    /// The tenant a request's credential headers make, without gateway keys.
    pub fn from_credentials(headers: &HeaderMap) -> Tenant {
        // The seed is the hash of the lines `name: value`, one per credential header sent,
        // joined by newlines. The bytes as sent: credentials that differ only in bytes that
        // are not UTF-8 are different tenants.
        SEEDS.with_borrow_mut(|seeds| {
            let lines = &mut seeds.lines;
            lines.clear();
            for name in &CREDENTIAL_HEADERS {
                for value in headers.get_all(name) {
                    if !lines.is_empty() {
                        lines.push(b'\n');
                    }
                    lines.extend_from_slice(name.as_str().as_bytes());
                    lines.extend_from_slice(b": ");
                    lines.extend_from_slice(value.as_bytes());
                }
            }
            Tenant {
                seed: seeds.seed(),
                name: None,
                // Every line holds a name: none were sent when there is none.
                anonymous: seeds.lines.is_empty(),
            }
        })
    }

    fn named(name: Arc<str>) -> Tenant {
        // Credential-derived seeds always start with a header name, so none can equal this.
        Tenant {
            seed: identity::tenant(&format!("gateway-key: {name}")),
            name: Some(name),
            anonymous: false,
        }
    }
}

/// The seeds of the credentials a thread saw last, by the credential lines themselves.
///
/// A seed is a keyed BLAKE3 hash, about 2 % of a small request's instructions; a client sends
/// the same credentials with every request. Kept by the lines' exact bytes, so two
/// credentials never share an entry; per thread (a runtime serves on one), so no lock is
/// taken. The credentials stay in the process's memory while kept (never written anywhere);
/// lines longer than [`SEED_LINES_KEPT_AT_MOST`] are hashed every time, so that a client
/// cannot make the cache hold more than about a megabyte a thread.
struct SeedCache {
    by_lines: std::collections::HashMap<Box<[u8]>, Hash, ahash::RandomState>,
    /// The request's credential lines, made in a buffer kept between requests.
    lines: Vec<u8>,
}

/// How many credentials a thread keeps the seeds of; past it, it starts again.
const SEEDS_KEPT: usize = 1024;

/// The longest credential lines whose seed is kept (a provider's key is under 300 bytes).
const SEED_LINES_KEPT_AT_MOST: usize = 1024;

thread_local! {
    static SEEDS: std::cell::RefCell<SeedCache> = std::cell::RefCell::new(SeedCache {
        by_lines: Default::default(),
        lines: Vec::new(),
    });
}

impl SeedCache {
    /// The seed of `self.lines`.
    fn seed(&mut self) -> Hash {
        if let Some(seed) = self.by_lines.get(self.lines.as_slice()) {
            return *seed;
        }
        let mut hasher = identity::TenantSeed::new();
        hasher.update(&self.lines);
        let seed = hasher.finish();
        if self.lines.len() > SEED_LINES_KEPT_AT_MOST {
            return seed;
        }
        if self.by_lines.len() == SEEDS_KEPT {
            self.by_lines.clear();
        }
        self.by_lines
            .insert(self.lines.clone().into_boxed_slice(), seed);
        seed
    }
}

/// The keys a client presented, one per credential header it sent.
fn presented_keys(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    CREDENTIAL_HEADERS.iter().filter_map(|name| {
        let value = headers.get(name)?.to_str().ok()?.trim();
        let key = if name == http::header::AUTHORIZATION {
            value
                .strip_prefix("Bearer ")
                .or_else(|| value.strip_prefix("bearer "))?
        } else {
            value
        };
        Some(key.trim())
    })
}

/// Middleware: identifies the tenant (refusing unknown gateway keys) and runs the request
/// inside a span that names it.
pub async fn identify(State(app): State<Arc<App>>, mut request: Request, next: Next) -> Response {
    match resolve(&app, &mut request) {
        Ok((tenant, span)) => {
            request.extensions_mut().insert(tenant);
            next.run(request).instrument(span).await
        }
        Err(Unknown) => unauthorized(request.uri().path()),
    }
}

/// A request that presented no gateway key this gateway accepts.
pub(super) struct Unknown;

/// The tenant of `request` and the span its handling runs in (none unless a gateway key names
/// the tenant); [`unauthorized`] answers an [`Unknown`] one.
pub(super) fn resolve(
    app: &App,
    request: &mut Request,
) -> Result<(Tenant, tracing::Span), Unknown> {
    let tenant = match &app.gateway_keys {
        None => Tenant::from_credentials(request.headers()),
        Some(keys) => authenticate(keys, request.headers_mut()).ok_or(Unknown)?,
    };
    let span = match &tenant.name {
        Some(name) => {
            app.metrics.count_tenant_request(name);
            tracing::info_span!("request", tenant = %name)
        }
        None => tracing::Span::none(),
    };
    Ok((tenant, span))
}

/// The tenant of an accepted gateway key; every credential header is then removed, so the key
/// never travels upstream.
pub fn authenticate(keys: &GatewayKeys, headers: &mut HeaderMap) -> Option<Tenant> {
    let name = presented_keys(headers).find_map(|key| keys.tenant_of(key))?;
    for header in &CREDENTIAL_HEADERS {
        headers.remove(header);
    }
    Some(Tenant::named(name))
}

/// 401 in the error shape of the client the path belongs to.
pub(super) fn unauthorized(path: &str) -> Response {
    let message = "missing or unknown gateway key: send the key this gateway issued you as \
                   `Authorization: Bearer <key>` (or `x-api-key`)";
    tracing::info!(
        status = 401,
        "Refused a request without an accepted gateway key."
    );
    ApiError::Unauthorized(message.into()).for_path(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.append(*name, value.parse().unwrap());
        }
        h
    }

    #[test]
    fn the_header_that_carried_a_credential_is_part_of_the_tenant() {
        let a = Tenant::from_credentials(&headers(&[("api-key", "K")]));
        let b = Tenant::from_credentials(&headers(&[("authorization", "K")]));
        let c = Tenant::from_credentials(&headers(&[("api-key", "K")]));
        assert_ne!(a.seed, b.seed);
        assert_eq!(a.seed, c.seed);
        assert!(!a.anonymous);
        assert!(Tenant::from_credentials(&HeaderMap::new()).anonymous);
    }

    #[test]
    fn the_seed_is_the_hash_of_the_credential_lines_joined() {
        // Checkpoints stored under a seed must still be found by the same client after an
        // upgrade: the seed stays the hash of `name: value` lines joined by newlines.
        let sent = headers(&[
            ("x-api-key", "key \u{e9}"),
            ("authorization", "Bearer a"),
            ("authorization", "Bearer b"),
        ]);
        assert_eq!(
            Tenant::from_credentials(&sent).seed,
            identity::tenant(
                "authorization: Bearer a\nauthorization: Bearer b\nx-api-key: key \u{e9}"
            )
        );
        assert_eq!(
            Tenant::from_credentials(&HeaderMap::new()).seed,
            identity::tenant("")
        );
    }

    #[test]
    fn seeds_kept_between_requests_are_those_of_the_same_credentials() {
        // Many credentials, each asked twice, with more than the cache keeps in between: every
        // seed is the hash of its own lines, whether it was kept or made again.
        let count = SEEDS_KEPT + 10;
        for round in 0..2 {
            for n in 0..count {
                let key = format!("Bearer sk-{n}");
                let tenant = Tenant::from_credentials(&headers(&[("authorization", &key)]));
                assert_eq!(
                    tenant.seed,
                    identity::tenant(&format!("authorization: {key}")),
                    "round {round}, key {n}"
                );
            }
        }
        // A credential that is a prefix of another, or that differs in one byte not UTF-8.
        let short = Tenant::from_credentials(&headers(&[("api-key", "abc")]));
        let long = Tenant::from_credentials(&headers(&[("api-key", "abcd")]));
        assert_ne!(short.seed, long.seed);
        let mut latin = HeaderMap::new();
        latin.insert("api-key", http::HeaderValue::from_bytes(b"k\xe9").unwrap());
        let mut other = HeaderMap::new();
        other.insert("api-key", http::HeaderValue::from_bytes(b"k\xe8").unwrap());
        assert_ne!(
            Tenant::from_credentials(&latin).seed,
            Tenant::from_credentials(&other).seed
        );
        // Lines too long to keep are hashed each time, to the same seed.
        let long_key = "k".repeat(SEED_LINES_KEPT_AT_MOST);
        let long = || Tenant::from_credentials(&headers(&[("x-api-key", &long_key)])).seed;
        assert_eq!(long(), identity::tenant(&format!("x-api-key: {long_key}")));
        assert_eq!(long(), long());
        SEEDS.with_borrow(|seeds| {
            assert!(seeds
                .by_lines
                .keys()
                .all(|lines| lines.len() <= SEED_LINES_KEPT_AT_MOST));
        });
        // No credential after one: anonymous, the empty seed.
        let none = Tenant::from_credentials(&HeaderMap::new());
        assert!(none.anonymous);
        assert_eq!(none.seed, identity::tenant(""));
    }

    #[test]
    fn an_accepted_gateway_key_is_removed_before_forwarding() {
        let text = format!("alice {}", super::super::gateway_keys::hash_key("sk-alice"));
        let keys = GatewayKeys::load(None, Some(&text)).unwrap().unwrap();
        let mut h = headers(&[("x-api-key", "sk-alice"), ("api-key", "other")]);
        let tenant = authenticate(&keys, &mut h).unwrap();
        assert_eq!(tenant.name.as_deref(), Some("alice"));
        assert!(h.is_empty());
        let mut wrong = headers(&[("authorization", "Bearer sk-bob")]);
        assert!(authenticate(&keys, &mut wrong).is_none());
    }
}
