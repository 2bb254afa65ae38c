//! The compacting routes reached without the router: a POST to one of their exact paths goes
//! straight from the connection to its handler, with the same tenant resolution (gateway keys
//! included), span and panic guard the router's layers give it. Those layers (path matching,
//! the middleware's boxed futures, the extractors' copies) cost every request a few
//! microseconds of the proxy's own time. Everything else, other methods on these paths
//! included, still goes through [`router`](super::router).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::Response;
use axum::Extension;
use futures::future::BoxFuture;
use futures::FutureExt;
use http::Method;
use tracing::Instrument;

use super::app::App;
use super::tenant::{self, Tenant};
use super::{client_compaction, error, routes};

/// A compacting route served directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direct {
    Chat,
    Messages,
    CountTokens,
    Responses,
    InputTokens,
    Compact,
}

impl Direct {
    /// Every compacting route: the router registers these, and only these are served directly.
    pub const ALL: [Direct; 6] = [
        Direct::Chat,
        Direct::Messages,
        Direct::CountTokens,
        Direct::Responses,
        Direct::InputTokens,
        Direct::Compact,
    ];

    /// The route's path.
    pub fn path(self) -> &'static str {
        match self {
            Direct::Chat => "/v1/chat/completions",
            Direct::Messages => "/v1/messages",
            Direct::CountTokens => "/v1/messages/count_tokens",
            Direct::Responses => "/v1/responses",
            Direct::InputTokens => "/v1/responses/input_tokens",
            Direct::Compact => "/v1/responses/compact",
        }
    }

    /// The compacting route a request is for, when it is a POST to one of their paths.
    pub fn of(method: &Method, path: &str) -> Option<Direct> {
        if method != Method::POST {
            return None;
        }
        Direct::ALL.into_iter().find(|route| route.path() == path)
    }

    /// The route's handler, once the tenant is known (the router's layers, or [`serve`]).
    ///
    /// Boxed here, where it is made: a handler's future is kilobytes, and every layer that
    /// holds it (the span, the panic guard, hyper's connection) would otherwise copy it whole
    /// as it is built around it.
    pub fn handle(
        self,
        app: State<Arc<App>>,
        tenant: Extension<Tenant>,
        request: Request,
    ) -> BoxFuture<'static, Response> {
        match self {
            Direct::Chat => routes::chat(app, tenant, request).boxed(),
            Direct::Messages => routes::messages(app, tenant, request).boxed(),
            Direct::CountTokens => routes::count_tokens(app, tenant, request).boxed(),
            Direct::Responses => routes::responses(app, tenant, request).boxed(),
            Direct::InputTokens => routes::input_tokens(app, tenant, request).boxed(),
            Direct::Compact => client_compaction::compact(app, tenant, request).boxed(),
        }
    }
}

/// Serves `request` on `route`, as the router would.
pub async fn serve(app: Arc<App>, route: Direct, request: Request) -> Response {
    guarded(app, route.path(), request, move |app, tenant, request| {
        route.handle(app, tenant, request)
    })
    .await
}

/// Runs `handler` as the router's layers would: with the request's tenant (401 for an unknown
/// gateway key), inside the span that names it, and answering 500 if it panics.
async fn guarded<H, F>(app: Arc<App>, path: &str, mut request: Request, handler: H) -> Response
where
    H: FnOnce(State<Arc<App>>, Extension<Tenant>, Request) -> F,
    F: Future<Output = Response>,
{
    let handled = AssertUnwindSafe(async move {
        let Ok((tenant, span)) = tenant::resolve(&app, &mut request) else {
            return tenant::unauthorized(path);
        };
        handler(State(app), Extension(tenant), request)
            .instrument(span)
            .await
    });
    handled
        .catch_unwind()
        .await
        .unwrap_or_else(|_| error::panic_response(error::is_messages_path(path)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    async fn answer(keys: Option<&str>, credential: &str, handler_panics: bool) -> (u16, String) {
        let mut app = crate::server::build(&Config::default()).await.unwrap();
        Arc::get_mut(&mut app)
            .expect("the only handle")
            .gateway_keys = keys
            .and_then(|k| super::super::gateway_keys::GatewayKeys::load(None, Some(k)).unwrap())
            .map(Arc::new);
        let request = http::Request::post("/v1/messages")
            .header("x-api-key", credential)
            .body(axum::body::Body::empty())
            .unwrap();
        let response = guarded(
            app,
            "/v1/messages",
            request,
            |_, Extension(tenant), _| async move {
                assert!(!handler_panics, "the handler failed");
                Response::new(tenant.name.as_deref().unwrap_or("-").to_string().into())
            },
        )
        .await;
        let status = response.status().as_u16();
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn a_direct_route_resolves_the_tenant_and_answers_a_panic_as_the_router_does() {
        let keys = format!("alice {}", super::super::gateway_keys::hash_key("sk-alice"));
        assert_eq!(
            answer(Some(&keys), "sk-alice", false).await,
            (200, "alice".into())
        );
        // An unknown key: 401 in the shape of the path's client (Anthropic's here).
        let (status, body) = answer(Some(&keys), "sk-bob", false).await;
        assert_eq!(status, 401);
        assert!(body.contains("authentication_error"), "{body}");
        // A handler that panics: 500 with an error body in the path's client's shape, not a
        // dropped connection.
        let (status, body) = answer(None, "k", true).await;
        assert_eq!(status, 500);
        let body: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["type"], "error", "{body}");
        assert!(body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("internal error")));
    }

    /// Hyper keeps room for a connection's service future as long as the connection lives, and
    /// every layer around a handler copies what it holds: the handler's kilobytes stay in its
    /// box, whichever route it is.
    #[tokio::test]
    async fn a_served_request_holds_its_handler_boxed() {
        let app = crate::server::build(&Config::default()).await.unwrap();
        for route in Direct::ALL {
            let request = http::Request::post(route.path())
                .body(axum::body::Body::empty())
                .unwrap();
            let served = serve(app.clone(), route, request);
            let size = std::mem::size_of_val(&served);
            assert!(size < 2048, "{}: {size} bytes", route.path());
        }
    }

    /// The router serves the same table: a POST reaches the compacting handler (a body that is
    /// not JSON answered 400 in the path's client's shape), any other method is passed through
    /// (to an upstream that refuses connections here: 502, not 405).
    #[tokio::test]
    async fn the_router_serves_every_compacting_route_and_passes_other_methods_through() {
        use tower::ServiceExt;
        let config = Config {
            upstream: "http://127.0.0.1:9/v1".into(),
            anthropic_upstream: "http://127.0.0.1:9".into(),
            ..Config::default()
        };
        let app = crate::server::build(&config).await.unwrap();
        let router = super::super::router(app);
        for route in Direct::ALL {
            let send = |method: Method, body: &'static str| {
                let request = http::Request::builder()
                    .method(method)
                    .uri(route.path())
                    .header("authorization", "Bearer k")
                    .header("content-type", "application/json")
                    .body(axum::body::Body::from(body))
                    .unwrap();
                router.clone().oneshot(request)
            };
            let refused = send(Method::POST, "not json").await.unwrap();
            assert_eq!(refused.status(), 400, "POST {}", route.path());
            let body = axum::body::to_bytes(refused.into_body(), 1 << 16)
                .await
                .unwrap();
            let body = String::from_utf8_lossy(&body);
            let anthropic = super::super::error::is_messages_path(route.path());
            assert_eq!(
                body.contains("invalid_request_error") && body.contains("\"type\":\"error\""),
                anthropic,
                "{}: {body}",
                route.path()
            );
            let passed = send(Method::GET, "").await.unwrap();
            assert_eq!(passed.status(), 502, "GET {}", route.path());
        }
    }

    #[test]
    fn only_a_post_to_a_compacting_path_skips_the_router() {
        for route in Direct::ALL {
            assert_eq!(Direct::of(&Method::POST, route.path()), Some(route));
        }
        assert_eq!(
            Direct::of(&Method::POST, "/v1/chat/completions"),
            Some(Direct::Chat)
        );
        assert_eq!(
            Direct::of(&Method::POST, "/v1/messages/count_tokens"),
            Some(Direct::CountTokens)
        );
        // Other methods fall back to pass-through in the router; other paths are the router's.
        for (method, path) in [
            (Method::GET, "/v1/chat/completions"),
            (Method::POST, "/v1/chat/completions/"),
            (Method::POST, "/v1/embeddings"),
            (Method::POST, "/v1/messages/batches"),
        ] {
            assert_eq!(Direct::of(&method, path), None, "{method} {path}");
        }
    }
}
