//! The Responses API's own context management (`context_management: [{"type": "compaction",
//! "compact_threshold": N}]`), served by Compactor where it answers client compaction
//! (`[responses] server_compaction`): when the input passes the threshold, it is compacted
//! into the same sealed `compaction` item a client-requested compaction returns
//! ([`super::client_compaction`]), the model answers from the compacted input, and the item
//! comes first in the answer's `output` (with its `response.output_item.added`,
//! `response.compaction.compacting` and `response.output_item.done` events when streamed), for
//! the client to send back in place of everything before it.
//!
//! A compaction that cannot be made leaves the request to be served as it came, and says so in
//! `x-compactor-compaction`.

use std::sync::Arc;

use bytes::Bytes;
use http::HeaderMap;
use serde_json::Value;

use super::app::App;
use super::client_compaction;
use super::context_edits::{map_events, map_whole};
use super::error::ApiError;
use super::tenant::Tenant;
use crate::dialect::anthropic::compaction::{answer::to_sse, BlockFirst};
use crate::dialect::responses::context::{stream_event_with_item, with_item_first};
use crate::dialect::responses::request::ResponsesRequest;
use crate::upstream::ByteStream;

/// What became of a request's threshold compaction (Responses' `compact_threshold`, or
/// Messages' `compact_20260112` edit without a pause).
pub(super) enum AtThreshold {
    /// Not asked for, or the input is under its threshold.
    Under,
    /// Compacted into the checkpoint named: what to put first in the answer.
    Compacted(FirstInAnswer, String),
    /// Over the threshold, but no compaction could be made.
    Failed,
}

/// What a compaction made at a threshold puts first in the model's answer.
pub(super) enum FirstInAnswer {
    /// A Responses `compaction` item, first in `output`.
    Item(Value),
    /// A Messages `compaction` block, first in `content`.
    Block(BlockFirst),
}

/// Serves the request's `context_management`: the field is taken off, items before the newest
/// compaction item Compactor minted (at `last_minted`, already expanded) are left out, and an
/// input past the threshold is compacted in place.
pub(super) async fn serve(
    app: &Arc<App>,
    tenant: &Tenant,
    headers: &HeaderMap,
    request: &mut ResponsesRequest,
    last_minted: Option<usize>,
) -> Result<AtThreshold, ApiError> {
    let threshold = request.compact_threshold()?;
    request.remove_context_management();
    let Some(threshold) = threshold else {
        return Ok(AtThreshold::Under);
    };
    if let Some(index) = last_minted {
        request.drop_before(index);
    }
    // Counted off this worker when large, as every request is.
    let counted: Arc<dyn crate::dialect::WireRequest> = Arc::new(request.clone());
    if app.engine.prompt_tokens(&counted).await <= threshold {
        return Ok(AtThreshold::Under);
    }
    // The request as it now stands (its body written again by every change above): what the
    // summary is made of.
    let whole = request.clone();
    match client_compaction::compact_whole(app, tenant, headers, whole).await {
        Ok((checkpoint, item)) => {
            request.compacted_to(&app.engine.summary_text(&checkpoint))?;
            tracing::info!(
                checkpoint = %checkpoint.id,
                covered = checkpoint.covered,
                "Compacted a Responses input at its compact_threshold."
            );
            Ok(AtThreshold::Compacted(
                FirstInAnswer::Item(item),
                checkpoint.id,
            ))
        }
        Err(e) => {
            tracing::warn!(error = %e, "A compaction at compact_threshold failed; serving the input as it came.");
            Ok(AtThreshold::Failed)
        }
    }
}

/// The provider's answer with `first` put first, whole or streamed.
pub(super) fn answer_with(body: ByteStream, streamed: bool, first: FirstInAnswer) -> ByteStream {
    match (first, streamed) {
        (FirstInAnswer::Item(item), false) => map_whole(body, move |held| {
            with_item_first(&held, &item).map_or(held, Bytes::from)
        }),
        (FirstInAnswer::Item(item), true) => {
            map_parsed_events(body, move |event| stream_event_with_item(event, &item))
        }
        (FirstInAnswer::Block(block), false) => map_whole(body, move |held| {
            block.whole(&held).map_or(held, Bytes::from)
        }),
        (FirstInAnswer::Block(mut block), true) => {
            map_parsed_events(body, move |event| block.event(event))
        }
    }
}

/// An SSE stream with the JSON of each event's `data` through `rewrite`, the events it returns
/// written named by their `type`; an event without JSON data goes on as it came.
fn map_parsed_events(
    body: ByteStream,
    mut rewrite: impl FnMut(&Value) -> Vec<Value> + Send + 'static,
) -> ByteStream {
    map_events(body, move |event| {
        let Ok(text) = std::str::from_utf8(event) else {
            return event.to_vec();
        };
        let data = text
            .lines()
            .find_map(|l| l.strip_prefix("data:"))
            .map(str::trim);
        let Some(value) = data.and_then(|d| serde_json::from_str::<Value>(d).ok()) else {
            return event.to_vec();
        };
        to_sse(&rewrite(&value)).into_bytes()
    })
}
