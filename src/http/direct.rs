//! The compacting routes reached without the router: a POST to one of their exact paths goes
//! straight from the connection to its handler, with the same tenant resolution (gateway keys
//! included), span and panic guard the router's layers give it. Those layers (path matching,
//! the middleware's boxed futures, the extractors' copies) cost every request a few
//! microseconds of the proxy's own time. Everything else, other methods on these paths
//! included, still goes through [`router`](super::router).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::Response;
use axum::Extension;
use futures::FutureExt;
use http::Method;
use tracing::Instrument;

use super::app::App;
use super::{client_compaction, error, routes, tenant};

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
    /// The compacting route a request is for, when it is a POST to one of their paths.
    pub fn of(method: &Method, path: &str) -> Option<Direct> {
        if method != Method::POST {
            return None;
        }
        Some(match path {
            "/v1/chat/completions" => Direct::Chat,
            "/v1/messages" => Direct::Messages,
            "/v1/messages/count_tokens" => Direct::CountTokens,
            "/v1/responses" => Direct::Responses,
            "/v1/responses/input_tokens" => Direct::InputTokens,
            "/v1/responses/compact" => Direct::Compact,
            _ => return None,
        })
    }
}

/// Serves `request` on `route`, as the router would.
pub async fn serve(app: Arc<App>, route: Direct, mut request: Request) -> Response {
    let handled = AssertUnwindSafe(async move {
        let Ok((tenant, span)) = tenant::resolve(&app, &mut request) else {
            return tenant::unauthorized(request.uri().path());
        };
        let (app, tenant) = (State(app), Extension(tenant));
        let handler = async move {
            match route {
                Direct::Chat => routes::chat(app, tenant, request).await,
                Direct::Messages => routes::messages(app, tenant, request).await,
                Direct::CountTokens => routes::count_tokens(app, tenant, request).await,
                Direct::Responses => routes::responses(app, tenant, request).await,
                Direct::InputTokens => routes::input_tokens(app, tenant, request).await,
                Direct::Compact => client_compaction::compact(app, tenant, request).await,
            }
        };
        handler.instrument(span).await
    });
    handled
        .catch_unwind()
        .await
        .unwrap_or_else(error::panic_response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_post_to_a_compacting_path_skips_the_router() {
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
