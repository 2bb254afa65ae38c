//! Compaction a Responses client asks for, answered by Compactor when the provider does not offer
//! it (`[responses] server_compaction`; llama.cpp, vLLM and most gateways do not).
//!
//! - An `input` ending in `{"type":"compaction_trigger"}` and `POST /v1/responses/compact` are
//!   answered from a checkpoint that covers the whole input ([`Engine::compact_whole`]), handed
//!   to the client as a `compaction` item whose `encrypted_content` is sealed for that client
//!   ([`Sealer`]).
//! - Such items coming back in later requests are opened and replaced by the checkpoint's summary
//!   message before anything else reads the request. An item that does not open for this client
//!   (forged, edited, another client's) or whose checkpoint is gone is refused with a 400: the
//!   history it stands for cannot be served, and sending it on would only fail at the provider.
//!
//! [`Engine::compact_whole`]: crate::compaction::Engine::compact_whole

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use bytes::Bytes;
use http::{HeaderMap, Method, Uri};
use serde_json::Value;

use super::counting::measure_on_blocking_pool;
use super::request_headers::{instructions, refuse_encoded_body};
use super::{credential_headers, set, tenant::Tenant, ApiError, App};
use crate::compaction::summary_text::summary_text;
use crate::compaction::{RequestContext, SummaryError};
use crate::dialect::responses::request::summary_item;
use crate::dialect::responses::sealed::Sealer;
use crate::dialect::responses::{answers, ResponsesRequest};
use crate::dialect::WireRequest;
use crate::identity;
use crate::metrics::Route;
use crate::store::Checkpoint;

/// Whether Compactor answers client-requested compaction, and the key its items are sealed with.
#[derive(Debug, Clone)]
pub struct ClientCompaction {
    pub emulate: bool,
    pub sealer: Sealer,
}

/// What becomes of a Responses request once its compaction items are read.
pub(super) enum Intercepted {
    /// Answered here: the input ended in a compaction trigger.
    Answer(Response),
    /// To be served as usual, with these bytes (the minted items expanded), and the id of the
    /// checkpoint whose summary now stands in the input, if an item was expanded.
    Forward(Bytes, Option<String>),
}

/// Expands the minted compaction items of a Responses body and, when `answer_trigger` is set and
/// the input ends in a compaction trigger, answers it.
pub(super) async fn intercept(
    app: &Arc<App>,
    tenant: &Tenant,
    headers: &HeaderMap,
    bytes: Bytes,
    answer_trigger: bool,
) -> Result<Intercepted, ApiError> {
    // Neither an item nor a trigger can be there without the word: most requests stop here.
    if std::str::from_utf8(&bytes).is_ok_and(|text| !text.contains("compaction")) {
        return Ok(Intercepted::Forward(bytes, None));
    }
    let sent = ResponsesRequest::parse(&bytes)?;
    let (request, bytes, expanded) = match expand(app, tenant, &sent).await? {
        Some((body, id)) => (ResponsesRequest::parse(&body)?, Bytes::from(body), Some(id)),
        None => (sent, bytes, None),
    };
    if answer_trigger && request.ends_in_trigger() {
        return trigger(app, tenant, headers, &request)
            .await
            .map(Intercepted::Answer);
    }
    Ok(Intercepted::Forward(bytes, expanded))
}

/// The body with every compaction item Compactor minted replaced by its checkpoint's summary
/// message, and the last such checkpoint's id; `None` when it holds none.
async fn expand(
    app: &App,
    tenant: &Tenant,
    request: &ResponsesRequest,
) -> Result<Option<(Vec<u8>, String)>, ApiError> {
    let minted = request.minted_compactions();
    if minted.is_empty() {
        return Ok(None);
    }
    let mut replacements = Vec::with_capacity(minted.len());
    let mut last = String::new();
    for (index, content) in minted {
        let refused = |message: String| ApiError::BadRequest {
            message,
            param: Some(format!("input[{index}]")),
            code: Some("invalid_compaction_item"),
        };
        let id = app
            .client_compaction
            .sealer
            .open(&tenant.seed, &content)
            .map_err(|e| refused(format!("this compaction item cannot be used: {e}")))?;
        let checkpoint = app
            .engine
            .store()
            .get(&id)
            .await
            .map_err(|e| ApiError::Internal(format!("checkpoint store: {e}")))?
            .filter(|cp| cp.tenant == identity::hex(&tenant.seed))
            .ok_or_else(|| {
                refused(
                    "the summary this compaction item stands for is no longer stored; \
                     start the conversation again"
                        .into(),
                )
            })?;
        let text = summary_text(
            &checkpoint.summary,
            &checkpoint.files_read,
            &checkpoint.files_modified,
        );
        replacements.push((index, summary_item(&text)));
        last = checkpoint.id;
    }
    Ok(Some((request.with_items_replaced(&replacements), last)))
}

/// Summarizes the whole conversation of `request` (its compaction triggers left out) into one
/// checkpoint, and the `compaction` item that stands for it, sealed for `tenant`.
async fn compact_whole(
    app: &Arc<App>,
    tenant: &Tenant,
    headers: &HeaderMap,
    request: &ResponsesRequest,
) -> Result<(Checkpoint, Value), ApiError> {
    let conversation: Arc<dyn WireRequest> =
        Arc::new(ResponsesRequest::parse(&request.without_triggers())?);
    // Counted off the async workers, once: the engine takes the count.
    let measured = measure_on_blocking_pool(app, &conversation).await?;
    let context = RequestContext {
        tenant: tenant.seed,
        credentials: credential_headers(headers),
        instructions: instructions(headers)?,
        ..RequestContext::default()
    };
    let checkpoint = app
        .engine
        .compact_whole(&context, &conversation, measured)
        .await
        .map_err(|e| match e {
            SummaryError::Nothing | SummaryError::NoReduction => ApiError::BadRequest {
                message: format!("there is nothing to compact in this input ({e})"),
                param: Some("input".into()),
                code: Some("nothing_to_compact"),
            },
            other => {
                ApiError::UpstreamBroken(format!("the compaction could not be written: {other}"))
            }
        })?;
    let sealed = app
        .client_compaction
        .sealer
        .seal(&tenant.seed, &checkpoint.id);
    let item = answers::compaction_item(&checkpoint.id, &sealed);
    Ok((checkpoint, item))
}

/// Answers an input ending in a compaction trigger with a response whose only output is the
/// `compaction` item, streamed when the request streams.
async fn trigger(
    app: &Arc<App>,
    tenant: &Tenant,
    headers: &HeaderMap,
    request: &ResponsesRequest,
) -> Result<Response, ApiError> {
    let (checkpoint, item) = compact_whole(app, tenant, headers, request).await?;
    let stream = request.stream();
    let body = answers::trigger_answer(
        request.model(),
        &checkpoint.id,
        &item,
        checkpoint.tokens_before,
        stream,
    );
    let content_type = if stream {
        "text/event-stream"
    } else {
        "application/json"
    };
    let response = ([(http::header::CONTENT_TYPE, content_type)], body).into_response();
    Ok(answered("/v1/responses", &checkpoint, response))
}

/// `response`, the answer to a compaction the client asked for at `path`, marked and logged.
fn answered(path: &'static str, checkpoint: &Checkpoint, mut response: Response) -> Response {
    tracing::info!(
        method = "POST",
        path,
        checkpoint = %checkpoint.id,
        covered = checkpoint.covered,
        "Answered a compaction the client asked for."
    );
    set(
        response.headers_mut(),
        "x-compactor-checkpoint",
        &checkpoint.id,
    );
    response
}

/// `POST /v1/responses/compact`: the compacted window (the input's user messages, then the
/// `compaction` item), made here when Compactor emulates it, passed through otherwise.
pub(super) async fn compact(
    State(app): State<Arc<App>>,
    Extension(tenant): Extension<Tenant>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if !app.client_compaction.emulate {
        return super::passthrough(State(app), method, uri, headers, body).await;
    }
    let result = async {
        refuse_encoded_body(&headers)?;
        let (bytes, _budget) = app.limits.read_body(&headers, body).await?;
        let sent = ResponsesRequest::parse(&bytes)?;
        let expanded = match expand(&app, &tenant, &sent).await? {
            Some((body, _)) => Some(ResponsesRequest::parse(&body)?),
            None => None,
        };
        let request = expanded.as_ref().unwrap_or(&sent);
        let (checkpoint, item) = compact_whole(&app, &tenant, &headers, request).await?;
        // The user messages as the client sent them: a summary expanded from an earlier item
        // is in the new checkpoint already, and its item is not handed back twice.
        let answer = answers::compact_answer(
            &checkpoint.id,
            sent.user_messages(),
            &item,
            checkpoint.tokens_before,
        );
        let response = axum::Json(answer).into_response();
        Ok::<_, ApiError>(answered("/v1/responses/compact", &checkpoint, response))
    }
    .await;
    let response = result.unwrap_or_else(IntoResponse::into_response);
    super::measured::count_request(&app, Route::Responses, &response);
    response
}
