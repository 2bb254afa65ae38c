//! Anthropic's on-demand compaction (`"compaction": {"type": "summarize"}`, beta
//! `compact-2026-09-04`), served by Compactor where it serves Messages context management
//! (`[messages] context_management`): the whole conversation is summarized into one checkpoint
//! and answered with a `compaction` block alone (`stop_reason: "compaction"`), whose
//! `signature` is a reference to that checkpoint sealed for the client, as Responses items are
//! ([`super::client_compaction`]). When the block comes back first in `messages`, it is
//! replaced by the stored summary before anything else reads the request. A block that does
//! not open for this client (forged, another client's, another provider's), whose content was
//! edited, that stands anywhere but first, or that comes with another, is refused with
//! Anthropic's 400.
//!
//! The `compact_20260112` context edit (beta `compact-2026-01-12`) is answered the same way
//! once the prompt passes its trigger, with `pause_after_compaction: true`.

use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use http::HeaderMap;

use super::app::App;
use super::client_compaction::{open_sealed, Unsealed};
use super::error::ApiError;
use super::headers::{credential_headers, instructions, set};
use super::limits::check_model_name;
use super::tenant::Tenant;
use crate::compaction::{RequestContext, SummaryError};
use crate::dialect::anthropic::compaction::{self, OnDemand};
use crate::dialect::anthropic::parse::MessagesRequest;
use crate::dialect::WireRequest;

/// What a Messages body became once its compaction blocks were read.
pub(super) enum Read {
    /// To be served, with the id of the checkpoint a block was expanded from.
    Request(MessagesRequest, Option<String>),
    /// An on-demand compaction, answered.
    Answered(Response),
}

/// Parses a Messages body, expands the compaction block it carries, and answers an on-demand
/// compaction when `answer` (a token count only takes the field off).
pub(super) async fn read(
    app: &Arc<App>,
    tenant: &Tenant,
    headers: &HeaderMap,
    bytes: &[u8],
    answer: bool,
) -> Result<Read, ApiError> {
    let mut request = MessagesRequest::parse(bytes)?;
    check_model_name(request.model())?;
    let expanded = expand(app, tenant, &mut request).await?;
    let asked = compaction::on_demand(&request)?;
    let edit = compaction::compact_edit(&request)?;
    compaction::remove_on_demand(&mut request);
    if !answer {
        return Ok(Read::Request(request, expanded));
    }
    if let Some(asked) = asked {
        return Ok(Read::Answered(
            answer_on_demand(app, tenant, headers, request, asked).await?,
        ));
    }
    let Some(edit) = edit else {
        return Ok(Read::Request(request, expanded));
    };
    if app.engine.meter().measure(&request).total() <= edit.trigger_tokens {
        return Ok(Read::Request(request, expanded));
    }
    if !edit.pause_after_compaction {
        // Compacting and then sampling in one answer is not served yet: refusing says so,
        // where forwarding would silently leave the context unmanaged.
        return Err(ApiError::BadRequest {
            message: "the `compact_20260112` edit is served with `pause_after_compaction: true` \
                      only: send the compaction block back and ask again to continue"
                .into(),
            param: Some("context_management.edits".into()),
            code: Some("unsupported_compaction_mode"),
        });
    }
    let asked = OnDemand {
        instructions: edit.instructions,
    };
    Ok(Read::Answered(
        answer_on_demand(app, tenant, headers, request, asked).await?,
    ))
}

fn refused(message: impl Into<String>) -> ApiError {
    ApiError::BadRequest {
        message: message.into(),
        param: Some("messages".into()),
        code: Some("invalid_compaction_block"),
    }
}

/// Replaces the compaction block Compactor issued by its summary; the checkpoint's id.
async fn expand(
    app: &App,
    tenant: &Tenant,
    request: &mut MessagesRequest,
) -> Result<Option<String>, ApiError> {
    let blocks = compaction::sent_back(request);
    let Some(block) = blocks.first() else {
        return Ok(None);
    };
    if blocks.len() > 1 {
        return Err(refused(format!(
            "messages carry {} compaction blocks; send back only the newest, first",
            blocks.len()
        )));
    }
    if (block.message, block.block) != (0, 0) {
        return Err(refused(format!(
            "messages.{}.content.{}: a compaction block must open the first message",
            block.message, block.block
        )));
    }
    let signature = block.signature.as_deref().unwrap_or("");
    let checkpoint = match open_sealed(app, tenant, signature).await? {
        Ok(checkpoint) => checkpoint,
        Err(Unsealed::Invalid(e)) => {
            return Err(refused(format!(
                "the compaction block's signature is invalid: {e}"
            )))
        }
        Err(Unsealed::Gone) => {
            return Err(refused(
                "the summary this compaction block stands for is no longer stored; start the \
                 conversation again",
            ))
        }
    };
    let summary = app.engine.summary_text(&checkpoint);
    if block.content.as_deref() != Some(&*summary) {
        return Err(refused(
            "the compaction block's content differs from the summary it was issued with; send \
             the block back unchanged",
        ));
    }
    compaction::expand_first(request, &summary)?;
    Ok(Some(checkpoint.id))
}

/// Summarizes the whole conversation and answers with the compaction block alone.
async fn answer_on_demand(
    app: &Arc<App>,
    tenant: &Tenant,
    headers: &HeaderMap,
    request: MessagesRequest,
    asked: OnDemand,
) -> Result<Response, ApiError> {
    let (model, stream) = (request.model().to_string(), request.stream());
    let context = RequestContext {
        tenant: tenant.seed,
        credentials: credential_headers(headers),
        instructions: asked.instructions.or(instructions(headers)?),
        ..RequestContext::default()
    };
    let conversation: Arc<dyn WireRequest> = Arc::new(request);
    let checkpoint = app
        .engine
        .compact_whole(&context, &conversation)
        .await
        .map_err(|e| match e {
            SummaryError::Nothing | SummaryError::NoReduction => ApiError::BadRequest {
                message: format!("there is nothing to summarize in these messages ({e})"),
                param: Some("messages".into()),
                code: Some("nothing_to_summarize"),
            },
            other => {
                ApiError::UpstreamBroken(format!("the compaction could not be written: {other}"))
            }
        })?;
    let sealed = app
        .client_compaction
        .sealer
        .current()
        .seal(&tenant.seed, &checkpoint.id);
    let summary = app.engine.summary_text(&checkpoint);
    let issued = compaction::Issued {
        model: &model,
        id: &checkpoint.id,
        summary: &summary,
        signature: &sealed,
        input_tokens: checkpoint.tokens_before,
        output_tokens: crate::tokenizer::Encoding::O200k.count(&summary),
    };
    let body = compaction::answer(issued, stream);
    let content_type = if stream {
        "text/event-stream"
    } else {
        "application/json"
    };
    let mut response = ([(http::header::CONTENT_TYPE, content_type)], body).into_response();
    set(
        response.headers_mut(),
        "x-compactor-checkpoint",
        &checkpoint.id,
    );
    tracing::info!(
        checkpoint = %checkpoint.id,
        covered = checkpoint.covered,
        "Answered an on-demand Messages compaction."
    );
    Ok(response)
}
