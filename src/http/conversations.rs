//! Conversation timelines: each served request recorded in the store as one row of metadata
//! ([`record`]), and the endpoints the conversation page reads, each answering only what the
//! caller's tenant made (the admin token: everything; see [`Reader`]):
//!
//! - `GET /compactor/v1/conversations`: the conversations, the most recently active first;
//! - `GET /compactor/v1/conversations/{id}`: one conversation's kept request rows, oldest
//!   first, each marked where a new checkpoint took effect;
//! - `GET /compactor/v1/conversations/{id}/checkpoints`: its stored checkpoints, oldest first,
//!   each summary split into the model's text and the sections code wrote.
//!
//! Another tenant's conversation is reported as absent, as its checkpoints are.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::Json;
use http::HeaderMap;
use serde::Serialize;
use serde_json::{json, Value};

use super::app::App;
use super::error::ApiError;
use super::reader::Reader;
use super::tenant::Tenant;
use crate::compaction::{record, Outcome, Status};
use crate::identity;
use crate::store::timeline::is_compaction;
use crate::store::{now_ms, Checkpoint, ConversationEntry, Owner, RequestRow};

/// What one served request adds to its conversation's timeline.
pub(super) struct Served<'a> {
    pub path: &'static str,
    pub model: &'a str,
    pub status: u16,
    pub outcome: &'a Outcome,
    pub upstream_time: Duration,
}

/// Records `served` in its conversation's timeline, off the request's path: the client's answer
/// never waits for the store, and a failed write only loses a row of history.
pub(super) fn record(app: &App, tenant: &Tenant, served: Served<'_>) {
    let (Some(bounds), Some(id)) = (app.timeline, served.outcome.anchor.clone()) else {
        return;
    };
    let outcome = served.outcome;
    let row = RequestRow {
        at_ms: now_ms(),
        path: served.path.to_string(),
        model: served.model.to_string(),
        status: served.status,
        tokens_sent: outcome.prompt_tokens,
        tokens_forwarded: outcome.tokens_after,
        window: outcome.window,
        compacted: outcome.compacted,
        summarized: outcome.summarized,
        ahead_of_time: outcome.ready_checkpoint_used,
        checkpoint: outcome.checkpoint_id.clone(),
        summary_ms: outcome.summary_time.as_millis() as u64,
        upstream_ms: served.upstream_time.as_millis() as u64,
        compaction_status: outcome.status.as_ref().map(Status::header_value),
    };
    let owner = Owner {
        tenant: identity::hex(&tenant.seed),
        tenant_name: tenant.name.as_deref().map(str::to_string),
    };
    let store = app.engine.store().clone();
    let mut recording = Box::pin(async move {
        if let Err(e) = store.record_request(&id, &owner, &row, bounds).await {
            tracing::debug!(error = %e, "A request was not added to its conversation's timeline.");
        }
    });
    // The memory and SQLite stores take the row at once (SQLite queues it for a writer of its
    // own): a task of its own would cost more than the row. A store that waits on the network
    // (Redis) goes on in one.
    if futures::FutureExt::now_or_never(&mut recording).is_none() {
        tokio::spawn(recording);
    }
}

fn store_error(e: crate::store::StoreError) -> ApiError {
    ApiError::Internal(format!("checkpoint store: {e}"))
}

/// `GET /compactor/v1/conversations`.
pub(super) async fn list(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let reader = Reader::of(&app, &headers, "conversations")?;
    let entries: Vec<ConversationEntry> = app
        .engine
        .store()
        .conversations()
        .await
        .map_err(store_error)?
        .into_iter()
        .filter(|e| reader.may_read(&e.owner.tenant))
        .collect();
    let limits = app.timeline.map(|b| {
        json!({
            "requests_per_conversation": b.requests_per_conversation,
            "conversations": b.conversations,
        })
    });
    Ok(Json(json!({
        "conversations": entries,
        "enabled": app.timeline.is_some(),
        "limits": limits,
    })))
}

/// A request row as the timeline shows it.
#[derive(Serialize)]
struct TimelineRow {
    #[serde(flatten)]
    row: RequestRow,
    /// Whether a new checkpoint took effect at this request.
    new_checkpoint: bool,
}

/// The entry of conversation `id`, when the reader may see it.
async fn readable(
    app: &App,
    reader: &Reader,
    id: &str,
) -> Result<(ConversationEntry, Vec<RequestRow>), ApiError> {
    match app.engine.store().timeline(id).await.map_err(store_error)? {
        Some(found) if reader.may_read(&found.0.owner.tenant) => Ok(found),
        _ => Err(ApiError::NotFound(format!("no conversation {id}"))),
    }
}

/// `GET /compactor/v1/conversations/{id}`.
pub(super) async fn timeline(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let reader = Reader::of(&app, &headers, "a conversation")?;
    let (entry, rows) = readable(&app, &reader, &id).await?;
    let dropped = entry.requests.saturating_sub(rows.len() as u64);
    let mut previous: Option<&RequestRow> = None;
    let mut shown = Vec::with_capacity(rows.len());
    for row in &rows {
        // The first kept row of a trimmed timeline has no known predecessor: it is marked only
        // when it wrote the summary itself.
        let new_checkpoint = match previous {
            None if dropped > 0 => row.summarized,
            _ => is_compaction(previous, row),
        };
        shown.push(TimelineRow {
            row: row.clone(),
            new_checkpoint,
        });
        previous = Some(row);
    }
    Ok(Json(json!({
        "conversation": entry,
        "requests": shown,
        "dropped_requests": dropped,
    })))
}

/// A checkpoint as the page shows it: what it covered, the summary split by who wrote it.
#[derive(Serialize)]
struct ShownCheckpoint {
    #[serde(flatten)]
    checkpoint: Checkpoint,
    /// The summary's part the summarizer model wrote.
    model_text: String,
    /// The sections code copied from the conversation (the record), in order.
    code_sections: Vec<Section>,
}

#[derive(Serialize)]
struct Section {
    title: String,
    text: String,
}

/// The record's sections, each under its `### ` title.
fn sections(record: &str) -> Vec<Section> {
    let mut out: Vec<Section> = vec![];
    for line in record.lines() {
        if let Some(title) = line.strip_prefix("### ") {
            out.push(Section {
                title: title.trim().to_string(),
                text: String::new(),
            });
        } else if let Some(section) = out.last_mut() {
            section.text.push_str(line);
            section.text.push('\n');
        }
    }
    for section in &mut out {
        section.text = section.text.trim().to_string();
    }
    out
}

/// `GET /compactor/v1/conversations/{id}/checkpoints`.
pub(super) async fn checkpoints(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let reader = Reader::of(&app, &headers, "a conversation")?;
    let stored = app
        .engine
        .store()
        .for_anchor(&id)
        .await
        .map_err(store_error)?;
    let mut shown: Vec<ShownCheckpoint> = stored
        .iter()
        .filter(|c| reader.may_read(&c.tenant))
        .map(|c| {
            let (model_text, record_text) = record::split(&c.summary);
            ShownCheckpoint {
                model_text: model_text.trim().to_string(),
                code_sections: record_text.map(sections).unwrap_or_default(),
                checkpoint: c.clone(),
            }
        })
        .collect();
    if shown.is_empty() {
        // Nothing stored (or nothing of the reader's): absent unless its timeline is readable.
        readable(&app, &reader, &id).await?;
    }
    shown.sort_by(|a, b| {
        (a.checkpoint.created_ms, a.checkpoint.covered)
            .cmp(&(b.checkpoint.created_ms, b.checkpoint.covered))
    });
    Ok(Json(json!({ "checkpoints": shown })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_is_split_into_its_titled_sections() {
        let record = "\n\n### User constraints, oldest first\n- never push\n\n### Commands run, newest first\n- cargo test\n- ls\n";
        let found = sections(record);
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].title, "User constraints, oldest first");
        assert_eq!(found[0].text, "- never push");
        assert_eq!(found[1].text, "- cargo test\n- ls");
    }
}
