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
use crate::dialect::responses::context::{stream_event_with_item, with_item_first};
use crate::dialect::responses::request::ResponsesRequest;
use crate::upstream::ByteStream;

/// What became of a request's threshold compaction.
pub(super) enum AtThreshold {
    /// Not asked for, or the input is under its threshold.
    Under,
    /// Compacted: the item to put first in the answer.
    Compacted(Value),
    /// Over the threshold, but no compaction could be made.
    Failed,
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
    if app.engine.meter().measure(request).total() <= threshold {
        return Ok(AtThreshold::Under);
    }
    let whole = ResponsesRequest::parse(&crate::dialect::WireRequest::original_body(request))?;
    match client_compaction::compact_whole(app, tenant, headers, whole).await {
        Ok((checkpoint, item)) => {
            request.compacted_to(&app.engine.summary_text(&checkpoint))?;
            tracing::info!(
                checkpoint = %checkpoint.id,
                covered = checkpoint.covered,
                "Compacted a Responses input at its compact_threshold."
            );
            Ok(AtThreshold::Compacted(item))
        }
        Err(e) => {
            tracing::warn!(error = %e, "A compaction at compact_threshold failed; serving the input as it came.");
            Ok(AtThreshold::Failed)
        }
    }
}

/// The provider's answer with `item` first in its output, whole or streamed.
pub(super) fn answer_with_item(body: ByteStream, streamed: bool, item: Value) -> ByteStream {
    if !streamed {
        return map_whole(body, move |held| {
            with_item_first(&held, &item).map_or(held, Bytes::from)
        });
    }
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
        let mut out = String::new();
        for event in stream_event_with_item(&value, &item) {
            let kind = event.get("type").and_then(Value::as_str).unwrap_or("");
            out.push_str(&format!("event: {kind}\ndata: {event}\n\n"));
        }
        out.into_bytes()
    })
}
