//! The proxy's own errors, each with its status, written in the shape of the client's API:
//! OpenAI's `{"error": {"message", "type", "param", "code"}}` by default, Anthropic's
//! `{"type": "error", "error": {…}}` on `/v1/messages` ([`ApiError::for_path`],
//! [`ApiError::into_response_in`]). An upstream's own error answers are forwarded verbatim; only
//! failures to reach it ([`crate::upstream::UpstreamError`]) become errors here.

use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde_json::json;

use crate::dialect::{ClientError, Dialect};

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{message}")]
    BadRequest {
        message: String,
        param: Option<String>,
        code: Option<&'static str>,
    },
    #[error("request body is larger than the limit of {limit} bytes")]
    TooLarge { limit: usize },
    #[error("{0}")]
    ContextLength(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    MethodNotAllowed(String),
    #[error("{0}")]
    UnsupportedEncoding(String),
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    UpstreamUnreachable(String),
    #[error("{0}")]
    UpstreamBroken(String),
    #[error("{0}")]
    UpstreamTimeout(String),
    #[error("{0}")]
    Internal(String),
    #[error("{message}")]
    Busy {
        message: String,
        retry_after_secs: u64,
    },
    #[error("{0}")]
    RequestTimeout(String),
    /// A compaction the client asked for could not be written for a transient reason: 529, as
    /// Anthropic answers it, for the client to retry.
    #[error("{0}")]
    CompactionUnavailable(String),
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::BadRequest {
            message: message.into(),
            param: None,
            code: None,
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest { .. } | ApiError::ContextLength(_) => StatusCode::BAD_REQUEST,
            ApiError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::UnsupportedEncoding(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::UpstreamUnreachable(_) | ApiError::UpstreamBroken(_) => {
                StatusCode::BAD_GATEWAY
            }
            ApiError::UpstreamTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Busy { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::CompactionUnavailable(_) => {
                StatusCode::from_u16(529).unwrap_or(StatusCode::SERVICE_UNAVAILABLE)
            }
        }
    }

    fn kind_and_code(&self) -> (&'static str, Option<&'static str>) {
        match self {
            ApiError::BadRequest { code, .. } => ("invalid_request_error", *code),
            ApiError::TooLarge { .. } => ("invalid_request_error", Some("request_too_large")),
            ApiError::ContextLength(_) => {
                ("invalid_request_error", Some("context_length_exceeded"))
            }
            ApiError::NotFound(_) => ("invalid_request_error", Some("not_found")),
            ApiError::MethodNotAllowed(_) => ("invalid_request_error", Some("method_not_allowed")),
            ApiError::UnsupportedEncoding(_) => (
                "invalid_request_error",
                Some("unsupported_content_encoding"),
            ),
            ApiError::Unauthorized(_) => ("invalid_request_error", Some("invalid_api_key")),
            ApiError::UpstreamUnreachable(_) => ("upstream_error", Some("upstream_unreachable")),
            ApiError::UpstreamBroken(_) => ("upstream_error", Some("upstream_no_response")),
            ApiError::UpstreamTimeout(_) => ("upstream_error", Some("upstream_timeout")),
            ApiError::Internal(_) => ("server_error", Some("internal_error")),
            ApiError::Busy { .. } => ("server_error", Some("overloaded")),
            ApiError::RequestTimeout(_) => ("invalid_request_error", Some("request_timeout")),
            ApiError::CompactionUnavailable(_) => ("server_error", Some("compaction_unavailable")),
        }
    }

    pub fn body(&self) -> serde_json::Value {
        let e = self.client_error();
        json!({"error": {"message": e.message, "type": e.kind, "param": e.param, "code": e.code}})
    }

    /// The error as a dialect writes it.
    pub fn client_error(&self) -> ClientError {
        let (kind, code) = self.kind_and_code();
        let param = match self {
            ApiError::BadRequest { param, .. } => param.clone(),
            ApiError::ContextLength(_) => Some("messages".into()),
            _ => None,
        };
        ClientError {
            status: self.status().as_u16(),
            kind,
            code,
            param,
            message: self.to_string(),
        }
    }

    /// The response in `dialect`'s error shape (Anthropic's on `/v1/messages`).
    pub fn into_response_in(self, dialect: &dyn Dialect) -> Response {
        let body = dialect.error_body(&self.client_error());
        self.respond_with(body)
    }

    /// The response in the error shape of the API `path` belongs to ([`is_messages_path`]).
    pub fn for_path(self, path: &str) -> Response {
        self.in_shape_of(is_messages_path(path))
    }

    /// The response in Anthropic's error shape when `messages`, OpenAI's otherwise.
    pub fn in_shape_of(self, messages: bool) -> Response {
        if messages {
            self.into_response_in(&crate::dialect::anthropic::Messages)
        } else {
            self.into_response()
        }
    }

    fn respond_with(self, body: serde_json::Value) -> Response {
        let mut response = (self.status(), axum::Json(body)).into_response();
        response
            .headers_mut()
            .insert("x-compactor-error", http::HeaderValue::from_static("true"));
        if let ApiError::Busy {
            retry_after_secs, ..
        } = &self
        {
            response
                .headers_mut()
                .insert(http::header::RETRY_AFTER, (*retry_after_secs).into());
        }
        response
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = self.body();
        self.respond_with(body)
    }
}

impl From<crate::dialect::RequestError> for ApiError {
    fn from(e: crate::dialect::RequestError) -> ApiError {
        ApiError::BadRequest {
            param: e.param(),
            message: e.to_string(),
            code: None,
        }
    }
}

impl From<crate::upstream::UpstreamError> for ApiError {
    fn from(e: crate::upstream::UpstreamError) -> ApiError {
        match e {
            crate::upstream::UpstreamError::Unreachable(m) => {
                ApiError::UpstreamUnreachable(format!("upstream unreachable: {m}"))
            }
            crate::upstream::UpstreamError::Broken(m) => ApiError::UpstreamBroken(format!(
                "upstream accepted the connection but sent no valid response: {m}"
            )),
            crate::upstream::UpstreamError::Timeout(m) => {
                ApiError::UpstreamTimeout(format!("upstream timed out: {m}"))
            }
            crate::upstream::UpstreamError::Refused(m) => ApiError::BadRequest {
                message: format!("request refused: {m}"),
                param: None,
                code: Some("invalid_path"),
            },
        }
    }
}

/// Whether `path` belongs to Anthropic's Messages API (`/v1/messages` and below), whose
/// clients read Anthropic's error shape; every other path's clients read OpenAI's.
pub fn is_messages_path(path: &str) -> bool {
    path.starts_with("/v1/messages")
}

/// The answer to a handler panic: a 500 in its client's shape ([`ApiError::in_shape_of`]),
/// nothing of the panic's text.
pub fn panic_response(messages: bool) -> Response {
    tracing::error!("A request handler panicked.");
    ApiError::Internal("internal error in the proxy".into()).in_shape_of(messages)
}

/// The router's panic guard: a handler that panics is answered [`panic_response`] for its path.
pub async fn guard_panics(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    use futures::FutureExt;
    let messages = is_messages_path(request.uri().path());
    std::panic::AssertUnwindSafe(next.run(request))
        .catch_unwind()
        .await
        .unwrap_or_else(|_| panic_response(messages))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use tower::ServiceExt;

    /// The body a router with a panicking handler at `path` answers, after checking its status.
    async fn panicked_at(path: &str) -> serde_json::Value {
        async fn boom() -> &'static str {
            panic!("handler bug")
        }
        let app = axum::Router::new()
            .route(path, get(boom))
            .layer(axum::middleware::from_fn(guard_panics));
        let response = app
            .oneshot(
                http::Request::get(path)
                    .body(axum::body::Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        let value: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert!(!value.to_string().contains("handler bug"), "{value}");
        value
    }

    #[tokio::test]
    async fn a_panicking_handler_answers_500_in_its_clients_shape() {
        let openai = panicked_at("/v1/models").await;
        assert_eq!(openai["error"]["type"], "server_error");
        assert!(openai.get("type").is_none(), "{openai}");
        let anthropic = panicked_at("/v1/messages/batches").await;
        assert_eq!(anthropic["type"], "error");
        assert_eq!(anthropic["error"]["type"], "api_error");
    }
}
