//! The inbound side: the only module that knows axum. This file is the router; each route's
//! handler lives in the file that owns its job:
//!
//! - [`routes`]: the compacting routes (chat completions, Anthropic Messages, Responses, and
//!   their token-counting endpoints), each naming its dialect and provider;
//! - [`exchange`]: the path every compacting request takes, as one value carried through its
//!   stages (read, parse, prepare, send, retry once after an overflow, respond) to one closing
//!   phase that logs and counts; [`probe`] reads the start of an answer for an overflow,
//!   [`stream`] watches answers for `usage` on the way back (their events cut out by
//!   [`sse_events`]), [`spans`] writes its trace;
//! - [`client_compaction`]: the compaction a Responses client asks for, when Compactor answers
//!   it, and the items it minted coming back; [`threshold_compaction`]: the same made at a
//!   Responses `context_management` threshold;
//! - [`context_edits`]: the context edits a Messages client asks for, when Compactor serves
//!   them (beta flags taken off, `context_management` added to answers);
//!   [`messages_compaction`]: its on-demand compaction, and the blocks that come back;
//! - [`passthrough`]: everything else under `/v1/`;
//! - [`direct`]: the compacting routes reached from the connection without the router;
//! - [`status`] (health, readiness, metrics) and [`checkpoints`] (the checkpoint API);
//! - [`conversations`] (each request's row in its conversation's timeline, and the endpoints
//!   that read them) and [`ui`] (the page that shows them);
//! - beneath them: [`app`] (what handlers share), [`tenant`] and [`gateway_keys`] (who is
//!   calling), [`reader`] (who may read what), [`limits`], [`headers`], [`error`], [`path`],
//!   [`log`], [`parse_error_bodies`].

pub mod app;
mod checkpoints;
pub mod client_compaction;
mod context_edits;
mod conversations;
pub mod direct;
pub mod error;
mod exchange;
pub mod gateway_keys;
mod headers;
pub mod limits;
pub mod log;
mod messages_compaction;
pub mod parse_error_bodies;
mod passthrough;
pub mod path;
mod probe;
mod reader;
mod routes;
pub mod sealing;
pub mod served_line;
mod spans;
pub mod sse_events;
mod status;
pub mod stream;
pub mod tenant;
mod threshold_compaction;
mod ui;

use std::sync::Arc;

use axum::routing::{any, get, post};
use axum::Router;

pub use app::App;
pub use error::ApiError;

/// The router with every route and the panic guard.
pub fn router(app: Arc<App>) -> Router {
    let fallback = passthrough::passthrough;
    // The compacting routes (a POST; any other method is passed through), from the table the
    // connection also serves them from without the router.
    let provider_routes = direct::Direct::ALL
        .into_iter()
        .fold(Router::new(), |routes, route| {
            let handler = move |app, tenant, request| route.handle(app, tenant, request);
            routes.route(route.path(), post(handler).fallback(fallback))
        })
        .route("/v1/messages/{*rest}", any(fallback))
        .route("/v1/{*rest}", any(fallback))
        .route_layer(axum::middleware::from_fn_with_state(
            app.clone(),
            tenant::identify,
        ));
    Router::new()
        .merge(provider_routes)
        .route("/healthz", get(status::healthz))
        .route("/readyz", get(status::readyz))
        .route("/metrics", get(status::metrics))
        .route(
            "/compactor/v1/checkpoints/{id}",
            get(checkpoints::checkpoint),
        )
        .route("/compactor/v1/conversations", get(conversations::list))
        .route(
            "/compactor/v1/conversations/{id}",
            get(conversations::timeline),
        )
        .route(
            "/compactor/v1/conversations/{id}/checkpoints",
            get(conversations::checkpoints),
        )
        .route("/compactor/ui", get(ui::page))
        .route("/compactor/ui/app.js", get(ui::script))
        .route("/compactor/ui/app.css", get(ui::style))
        .fallback(status::not_found)
        .method_not_allowed_fallback(status::method_not_allowed)
        .layer(axum::middleware::from_fn(error::guard_panics))
        .with_state(app)
}
