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

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use http::HeaderMap;
use serde_json::value::RawValue;
use serde_json::Value;

use super::app::App;
use super::error::ApiError;
use super::headers::{credential_headers, instructions, refuse_encoded_body, set};
use super::passthrough::passthrough;
use super::tenant::Tenant;
use crate::compaction::{RequestContext, SummaryError};
use crate::dialect::responses::answers;
use crate::dialect::responses::request::{summary_item, ResponsesRequest};
use crate::dialect::responses::sealed::Sealer;
use crate::dialect::WireRequest;
use crate::identity;
use crate::metrics::Route;
use crate::store::Checkpoint;

/// What becomes of a Responses request once its compaction items are read.
pub(super) enum Intercepted {
    /// Its input ends in a compaction trigger: the client asks for a compaction.
    Trigger(ResponsesRequest),
    /// To be served as usual, with the minted items expanded, and the id of the checkpoint whose
    /// summary now stands in the input, if an item was expanded.
    Forward(ResponsesRequest, Option<String>),
}

/// Expands, in place, the compaction items Compactor minted in a parsed Responses request, and
/// says whether it asks for a compaction.
pub(super) async fn intercept(
    app: &App,
    tenant: &Tenant,
    mut request: ResponsesRequest,
) -> Result<Intercepted, ApiError> {
    let expanded = expand(app, tenant, &mut request).await?;
    if request.ends_in_trigger() {
        return Ok(Intercepted::Trigger(request));
    }
    Ok(Intercepted::Forward(request, expanded))
}

/// Most compaction items Compactor minted that one request may carry: a client sends back the
/// newest one (Codex), so a few leave room for clients that keep more, and bound what one
/// request can make the proxy read and expand.
const MAX_MINTED_ITEMS: usize = 8;

/// Replaces every compaction item Compactor minted by its checkpoint's summary message, and
/// returns the last such checkpoint's id; `None` when the request holds none.
///
/// Each item is expanded once: the same item twice, or more than [`MAX_MINTED_ITEMS`], is
/// refused, and so is a request whose expanded body outgrows the body limit.
pub(super) async fn expand(
    app: &App,
    tenant: &Tenant,
    request: &mut ResponsesRequest,
) -> Result<Option<String>, ApiError> {
    let minted = request.minted_compactions();
    if minted.is_empty() {
        return Ok(None);
    }
    if minted.len() > MAX_MINTED_ITEMS {
        return Err(ApiError::BadRequest {
            message: format!(
                "this input carries {} compaction items; at most {MAX_MINTED_ITEMS} are accepted",
                minted.len()
            ),
            param: Some("input".into()),
            code: Some("invalid_compaction_item"),
        });
    }
    for (n, (index, content)) in minted.iter().enumerate() {
        if let Some((first, _)) = minted[..n].iter().find(|(_, c)| c == content) {
            return Err(ApiError::BadRequest {
                message: format!(
                    "the compaction item at input[{index}] repeats the one at input[{first}]"
                ),
                param: Some(format!("input[{index}]")),
                code: Some("invalid_compaction_item"),
            });
        }
    }
    let mut replacements: Vec<(usize, Box<RawValue>)> = Vec::with_capacity(minted.len());
    let mut last = String::new();
    for (index, content) in minted {
        let refused = |message: String| ApiError::BadRequest {
            message,
            param: Some(format!("input[{index}]")),
            code: Some("invalid_compaction_item"),
        };
        let checkpoint = match open_sealed(app, tenant, &content).await? {
            Ok(checkpoint) => checkpoint,
            Err(Unsealed::Invalid(e)) => {
                return Err(refused(format!("this compaction item cannot be used: {e}")))
            }
            Err(Unsealed::Gone) => {
                return Err(refused(
                    "the summary this compaction item stands for is no longer stored; \
                     start the conversation again"
                        .into(),
                ))
            }
        };
        replacements.push((index, summary_item(&app.engine.summary_text(&checkpoint))));
        last = checkpoint.id;
    }
    request.replace_items(replacements)?;
    if request.original_body().len() > app.limits.max_body_bytes {
        return Err(ApiError::TooLarge {
            limit: app.limits.max_body_bytes,
        });
    }
    Ok(Some(last))
}

/// Why a sealed compaction reference gave no checkpoint.
pub(super) enum Unsealed {
    /// It does not open for this tenant (forged, another tenant's, damaged): why.
    Invalid(String),
    /// It opened, but its checkpoint is no longer stored for this tenant.
    Gone,
}

/// Opens a compaction reference Compactor sealed for `tenant` (a Responses item's content, a
/// Messages block's signature) and loads the checkpoint it names, which must be that tenant's.
pub(super) async fn open_sealed(
    app: &App,
    tenant: &Tenant,
    sealed: &str,
) -> Result<Result<crate::store::Checkpoint, Unsealed>, ApiError> {
    let id = match app
        .client_compaction
        .sealer
        .current()
        .open(&tenant.seed, sealed)
    {
        Ok(id) => id,
        Err(e) => return Ok(Err(Unsealed::Invalid(e.to_string()))),
    };
    let stored = app
        .engine
        .store()
        .get(&id)
        .await
        .map_err(|e| ApiError::Internal(format!("checkpoint store: {e}")))?
        .filter(|cp| cp.tenant == identity::hex(&tenant.seed));
    Ok(stored.ok_or(Unsealed::Gone))
}

/// Whether a body that is not a Responses request Compactor can read still carries one of the
/// compaction items it minted somewhere in its JSON: such an item must never reach a provider,
/// which could not read it anyway.
pub(super) fn carries_minted_item(bytes: &[u8]) -> bool {
    fn walk(value: &Value) -> bool {
        match value {
            Value::String(s) => Sealer::is_ours(s),
            Value::Array(items) => items.iter().any(walk),
            Value::Object(fields) => fields.values().any(walk),
            _ => false,
        }
    }
    serde_json::from_slice::<Value>(bytes).is_ok_and(|value| walk(&value))
}

/// Summarizes the whole conversation of `request` (its compaction triggers left out) into one
/// checkpoint, and the `compaction` item that stands for it, sealed for `tenant`.
pub(super) async fn compact_whole(
    app: &Arc<App>,
    tenant: &Tenant,
    headers: &HeaderMap,
    mut request: ResponsesRequest,
) -> Result<(Checkpoint, Value), ApiError> {
    request.remove_triggers();
    let conversation: Arc<dyn WireRequest> = Arc::new(request);
    let context = RequestContext {
        tenant: tenant.seed,
        credentials: credential_headers(headers),
        instructions: instructions(headers)?,
        ..RequestContext::default()
    };
    let checkpoint = app
        .engine
        .compact_whole(&context, &conversation)
        .await
        .map_err(|e| match e {
            SummaryError::Nothing | SummaryError::NoReduction => ApiError::BadRequest {
                message: format!("there is nothing to compact in this input ({e})"),
                param: Some("input".into()),
                code: Some("nothing_to_compact"),
            },
            SummaryError::SummarizerOverflow | SummaryError::SpanTooLarge => {
                ApiError::ContextLength(format!(
                    "this input is too long for the summarizer's context window, even in smaller \
                     chunks ({e})"
                ))
            }
            other => {
                ApiError::UpstreamBroken(format!("the compaction could not be written: {other}"))
            }
        })?;
    let sealed = app
        .client_compaction
        .sealer
        .current()
        .seal(&tenant.seed, &checkpoint.id);
    let item = answers::compaction_item(&checkpoint.id, &sealed);
    Ok((checkpoint, item))
}

/// Answers an input ending in a compaction trigger with a response whose only output is the
/// `compaction` item, streamed when the request streams.
pub(super) async fn answer_trigger(
    app: &Arc<App>,
    tenant: &Tenant,
    headers: &HeaderMap,
    request: ResponsesRequest,
) -> Result<Response, ApiError> {
    let stream = request.stream();
    let model = request.model().to_string();
    let (checkpoint, item) = compact_whole(app, tenant, headers, request).await?;
    let body = answers::trigger_answer(
        &model,
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
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let (method, uri, headers) = (parts.method, parts.uri, parts.headers);
    if !app.client_compaction.emulate {
        return passthrough(State(app), method, uri, headers, body).await;
    }
    let result = async {
        refuse_encoded_body(&headers)?;
        let (bytes, _budget) = app.limits.read_body(&headers, body).await?;
        let mut request = ResponsesRequest::parse_shared(&bytes)?;
        super::limits::check_model_name(request.model())?;
        // The user messages as the client sent them: a summary expanded from an earlier item
        // is in the new checkpoint already, and its item is not handed back twice.
        let user_messages: Vec<Box<RawValue>> =
            request.user_messages().map(|m| m.to_owned()).collect();
        expand(&app, &tenant, &mut request).await?;
        let (checkpoint, item) = compact_whole(&app, &tenant, &headers, request).await?;
        let answer = answers::compact_answer(
            &checkpoint.id,
            user_messages.iter().map(|m| &**m),
            &item,
            checkpoint.tokens_before,
        );
        let response = axum::Json(answer).into_response();
        Ok::<_, ApiError>(answered("/v1/responses/compact", &checkpoint, response))
    }
    .await;
    let response = result.unwrap_or_else(IntoResponse::into_response);
    app.count_request(Route::Responses, &response);
    response
}
