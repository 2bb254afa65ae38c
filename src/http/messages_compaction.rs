//! Anthropic's on-demand compaction (`"compaction": {"type": "summarize"}`, beta
//! `compact-2026-09-04`), served by Compactor where it serves Messages context management
//! (`[messages] context_management`): the whole conversation is summarized into one checkpoint
//! and answered with a `compaction` block alone (`stop_reason: "compaction"`), whose
//! `signature` is a reference to that checkpoint sealed for the client, as Responses items are
//! ([`super::client_compaction`]). When the block comes back, first in `messages` or opening
//! the assistant message it was answered in (the history before it then left out, as
//! Anthropic does), it is replaced by the stored summary before anything else reads the
//! request; a block of a failed compaction (no content) is a no-op. A block that does not open
//! for this client (forged, another client's, another provider's), whose content was edited,
//! that stands anywhere else, or that comes with another, is refused with Anthropic's 400 and
//! its `error_code`.
//!
//! The `compact_20260112` context edit (beta `compact-2026-01-12`) compacts the same way once
//! the prompt passes its trigger: with `pause_after_compaction: true` the block is the whole
//! answer; without, the model answers from the summary and the turn in progress, and the
//! block comes first in that answer ([`super::threshold_compaction`] puts it there). A
//! compaction that cannot be made there leaves the request to be served as it came.

use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::HeaderMap;

use super::app::App;
use super::client_compaction::{open_sealed, Unsealed};
use super::error::ApiError;
use super::headers::{credential_headers, instructions, set};
use super::limits::check_model_name;
use super::tenant::Tenant;
use super::threshold_compaction::{AtThreshold, FirstInAnswer};
use crate::compaction::{RequestContext, SummaryError};
use crate::dialect::anthropic::compaction::{self, refusal, Issued};
use crate::dialect::anthropic::parse::{Author, MessagesRequest};
use crate::dialect::WireRequest;
use crate::store::Checkpoint;

/// What a Messages body became once its compaction blocks were read.
pub(super) enum Read {
    /// To be served, with the id of the checkpoint a block was expanded from, and the block to
    /// put first in the answer when the request was compacted at its edit's trigger.
    Request(Box<MessagesRequest>, Option<String>, AtThreshold),
    /// A compaction that pauses, answered.
    Answered(Response),
}

/// Parses a Messages body, expands the compaction block it carries, and serves the compaction
/// it asks for when `answer` (a token count only takes the field off).
pub(super) async fn read(
    app: &Arc<App>,
    tenant: &Tenant,
    headers: &HeaderMap,
    bytes: &Bytes,
    answer: bool,
) -> Result<Read, ApiError> {
    let mut request = MessagesRequest::parse_shared(bytes)?;
    check_model_name(request.model())?;
    compaction::drop_failed(&mut request)?;
    let expanded = expand(app, tenant, &mut request).await?;
    let asked = compaction::on_demand(&request)?;
    let edit = compaction::compact_edit(&request)?;
    compaction::remove_on_demand(&mut request);
    let unchanged = |request, expanded| {
        Ok(Read::Request(
            Box::new(request),
            expanded,
            AtThreshold::Under,
        ))
    };
    if !answer {
        return unchanged(request, expanded);
    }
    if let Some(asked) = asked {
        return Ok(Read::Answered(
            answer_paused(app, tenant, headers, request, asked.instructions).await?,
        ));
    }
    let Some(edit) = edit else {
        return unchanged(request, expanded);
    };
    let whole: Arc<dyn WireRequest> = Arc::new(request.clone());
    if app.engine.prompt_tokens(&whole).await <= edit.trigger_tokens {
        return unchanged(request, expanded);
    }
    if edit.pause_after_compaction {
        return Ok(Read::Answered(
            answer_paused(app, tenant, headers, request, edit.instructions).await?,
        ));
    }
    let model = request.model().to_string();
    let whole = compact(app, tenant, headers, whole, edit.instructions).await;
    let compacted = match whole {
        Ok((checkpoint, signature)) => {
            let summary = app.engine.summary_text(&checkpoint);
            compaction::compacted_to(&mut request, &summary)?;
            tracing::info!(
                checkpoint = %checkpoint.id,
                covered = checkpoint.covered,
                "Compacted a Messages conversation at its compact_20260112 trigger."
            );
            let first = issued(&model, &checkpoint, &summary, &signature).first_in_answer();
            return Ok(Read::Request(
                Box::new(request),
                expanded,
                AtThreshold::Compacted(FirstInAnswer::Block(first), checkpoint.id),
            ));
        }
        Err(e) => e,
    };
    tracing::warn!(error = %compacted, "A compaction at a compact_20260112 trigger failed; serving the messages as they came.");
    Ok(Read::Request(
        Box::new(request),
        expanded,
        AtThreshold::Failed,
    ))
}

fn refused(code: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::BadRequest {
        message: message.into(),
        param: Some("messages".into()),
        code: Some(code),
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
        return Err(refused(
            refusal::BLOCK_AMBIGUOUS,
            format!(
                "messages carry {} compaction blocks; send back only the newest, first",
                blocks.len()
            ),
        ));
    }
    // First in `messages` (sent back alone), or opening the assistant message an answer put
    // it in, with the history it stands for still before it (which is then left out).
    if (block.message, block.block) != (0, 0) && !block.opens_answer {
        return Err(refused(
            refusal::BLOCK_MISPLACED,
            format!(
                "messages.{}.content.{}: a compaction block must open the first message, or \
                 the assistant message it was answered in",
                block.message, block.block
            ),
        ));
    }
    let signature = block.signature.as_deref().unwrap_or("");
    let checkpoint = match open_sealed(app, tenant, signature).await? {
        Ok(checkpoint) => checkpoint,
        Err(Unsealed::Invalid(e)) => {
            return Err(refused(
                refusal::SIGNATURE_INVALID,
                format!("the compaction block's signature is invalid: {e}"),
            ))
        }
        Err(Unsealed::Gone) => {
            return Err(refused(
                refusal::SIGNATURE_INVALID,
                "the summary this compaction block stands for is no longer stored; start the \
                 conversation again",
            ))
        }
    };
    let summary = app.engine.summary_text(&checkpoint);
    if block.content.as_deref() != Some(&*summary) {
        return Err(refused(
            refusal::CONTENT_MISMATCH,
            "the compaction block's content differs from the summary it was issued with; send \
             the block back unchanged",
        ));
    }
    compaction::expand_at(request, block.message, &summary)?;
    Ok(Some(checkpoint.id))
}

/// Summarizes the whole conversation into one checkpoint, with its reference sealed for the
/// client (the block's signature).
async fn compact(
    app: &Arc<App>,
    tenant: &Tenant,
    headers: &HeaderMap,
    conversation: Arc<dyn WireRequest>,
    asked_instructions: Option<String>,
) -> Result<(Checkpoint, String), SummaryError> {
    let context = RequestContext {
        tenant: tenant.seed,
        credentials: credential_headers(headers),
        instructions: asked_instructions.or(instructions(headers).ok().flatten()),
        ..RequestContext::default()
    };
    let checkpoint = app.engine.compact_whole(&context, &conversation).await?;
    let sealed = app
        .client_compaction
        .sealer
        .current()
        .seal(&tenant.seed, &checkpoint.id);
    Ok((checkpoint, sealed))
}

fn issued<'a>(
    model: &'a str,
    checkpoint: &'a Checkpoint,
    summary: &'a str,
    signature: &'a str,
) -> Issued<'a> {
    Issued {
        model,
        id: &checkpoint.id,
        summary,
        signature,
        input_tokens: checkpoint.tokens_before,
        output_tokens: crate::tokenizer::Encoding::O200k.count(summary),
    }
}

/// Summarizes the whole conversation and answers with the compaction block alone.
async fn answer_paused(
    app: &Arc<App>,
    tenant: &Tenant,
    headers: &HeaderMap,
    request: MessagesRequest,
    asked_instructions: Option<String>,
) -> Result<Response, ApiError> {
    // Refused before any summary is asked for: these would only be refused after it.
    instructions(headers)?;
    if !request.messages.iter().any(|m| m.role != Author::System) {
        return Err(refused(
            refusal::NOTHING_TO_SUMMARIZE,
            "messages hold no user or assistant content to summarize",
        ));
    }
    if compaction::ends_unfinished(&request) {
        return Err(refused(
            refusal::INCOMPLETE_TURN,
            "the conversation ends on an assistant turn, which is not finished: compact after \
             the turn ends, with a user message last",
        ));
    }
    let (model, stream) = (request.model().to_string(), request.stream());
    let (checkpoint, sealed) = compact(app, tenant, headers, Arc::new(request), asked_instructions)
        .await
        .map_err(|e| match e {
            SummaryError::Nothing | SummaryError::NoReduction => refused(
                refusal::NOTHING_TO_SUMMARIZE,
                format!("there is nothing to summarize in these messages ({e})"),
            ),
            SummaryError::SpanTooLarge | SummaryError::SummarizerOverflow => ApiError::bad_request(
                format!("the conversation is too large to summarize in one compaction ({e})"),
            ),
            other => ApiError::CompactionUnavailable(format!(
                "the compaction could not be written ({other}); retry the request"
            )),
        })?;
    let summary = app.engine.summary_text(&checkpoint);
    let body = compaction::answer::paused(issued(&model, &checkpoint, &summary, &sealed), stream);
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
        "Answered a Messages compaction with its block."
    );
    Ok(response)
}
