//! The compacting routes, one handler per endpoint of each registered dialect: which dialect
//! parses the body, which provider it goes to and under which path. The path each request then
//! takes is [`exchange`](super::exchange)'s.
//!
//! Each handler takes the request whole and splits it, rather than through the `HeaderMap`
//! and `Uri` extractors, which copy them.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::Response;
use axum::Extension;
use http::Uri;

use super::app::App;
use super::exchange::{self, Target};
use super::tenant::Tenant;
use crate::dialect::{anthropic::Messages, chat::Chat, responses, responses::Responses};
use crate::metrics::Route;

/// `POST /v1/chat/completions`: the chat dialect, to the OpenAI-compatible provider.
pub(super) async fn chat(
    State(app): State<Arc<App>>,
    Extension(tenant): Extension<Tenant>,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let target = Target {
        dialect: &Chat,
        route: Route::ChatCompletions,
        path: "/v1/chat/completions",
        upstream: &app.upstream,
        upstream_path: "/chat/completions".into(),
        holds_server_state: None,
        client_compaction: false,
        context_edits: false,
    };
    exchange::serve(&app, &tenant, &parts.headers, body, target).await
}

/// `POST /v1/messages`: Anthropic's dialect, to the Anthropic provider. The query
/// (`?beta=true`) goes along.
pub(super) async fn messages(
    State(app): State<Arc<App>>,
    Extension(tenant): Extension<Tenant>,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let target = messages_target(&app, "/v1/messages", &parts.uri);
    exchange::serve(&app, &tenant, &parts.headers, body, target).await
}

/// `POST /v1/messages/count_tokens`: counted through the conversation's checkpoint.
pub(super) async fn count_tokens(
    State(app): State<Arc<App>>,
    Extension(tenant): Extension<Tenant>,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let target = messages_target(&app, "/v1/messages/count_tokens", &parts.uri);
    exchange::count_through_checkpoint(&app, &tenant, &parts.headers, body, target).await
}

/// A `/v1/messages…` route on the Anthropic provider, which keeps the whole path and query.
fn messages_target<'a>(app: &'a App, path: &'static str, uri: &Uri) -> Target<'a> {
    Target {
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
        context_edits: app.context_edits,
    }
}

/// `POST /v1/responses/input_tokens`: counted through the conversation's checkpoint.
pub(super) async fn input_tokens(
    State(app): State<Arc<App>>,
    Extension(tenant): Extension<Tenant>,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let target = responses_target(&app, "/v1/responses/input_tokens");
    exchange::count_through_checkpoint(&app, &tenant, &parts.headers, body, target).await
}

/// `POST /v1/responses`: the Responses dialect. A request that relies on state the provider
/// holds (`previous_response_id`, `conversation`) is forwarded untouched.
pub(super) async fn responses(
    State(app): State<Arc<App>>,
    Extension(tenant): Extension<Tenant>,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let target = Target {
        holds_server_state: Some(responses::uses_server_state),
        ..responses_target(&app, "/v1/responses")
    };
    exchange::serve(&app, &tenant, &parts.headers, body, target).await
}

/// A `/v1/responses…` route on the OpenAI-compatible provider, whose base already ends in `/v1`.
fn responses_target<'a>(app: &'a App, path: &'static str) -> Target<'a> {
    Target {
        dialect: &Responses,
        route: Route::Responses,
        path,
        upstream: &app.upstream,
        upstream_path: path.trim_start_matches("/v1").into(),
        holds_server_state: None,
        client_compaction: app.client_compaction.emulate,
        context_edits: false,
    }
}
