//! `GET /compactor/ui`: the conversation page, and the script and style it loads, all built into
//! the binary. The page reads the JSON endpoints of [`super::conversations`] with the key the
//! person types into it (kept in the tab's `sessionStorage`), so it shows what that key's tenant
//! may read and nothing else; it loads nothing from anywhere but the proxy, which its
//! content security policy enforces.

use axum::response::{IntoResponse, Response};
use http::header;

const PAGE: &str = include_str!("ui/index.html");
const SCRIPT: &str = include_str!("ui/app.js");
const STYLE: &str = include_str!("ui/app.css");

/// Only the proxy's own script, style and endpoints; no frames, no forms sent elsewhere.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                      connect-src 'self'; img-src 'self' data:; base-uri 'none'; \
                      form-action 'none'; frame-ancestors 'none'";

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        body,
    )
        .into_response()
}

pub(super) async fn page() -> Response {
    asset("text/html; charset=utf-8", PAGE)
}

pub(super) async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

pub(super) async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}
