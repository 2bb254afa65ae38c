//! Conversation timelines in the SQLite file: one row per conversation (its entry, as JSON)
//! and one per kept request, numbered within its conversation. Both bounds are applied in the
//! transaction that adds a row, so the file never holds more than they allow.
//!
//! Rows wait in a bounded queue ([`Queue`]) and one writer at a time puts all that waits into
//! the file in one transaction, so a busy proxy pays one commit per batch, not per request, and
//! never holds more than [`QUEUE_MAX`] rows in memory. A batch that fails is not retried like a
//! checkpoint: the history is for people to look at, and losing rows of it costs nothing the
//! proxy needs.

use std::sync::{Arc, Mutex};

use rusqlite::{params, Connection, OptionalExtension, Transaction};

use super::sqlite_file::{unavailable, Database};
use super::timeline::newest_first;
use super::{ConversationEntry, Owner, RequestRow, StoreError, TimelineBounds};

fn encode<T: serde::Serialize>(value: &T) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|e| StoreError::Corrupt(e.to_string()))
}

fn decode<T: serde::de::DeserializeOwned>(body: &str) -> Result<T, StoreError> {
    serde_json::from_str(body).map_err(|e| StoreError::Corrupt(e.to_string()))
}

/// Rows waiting for the file at most; beyond this new rows are dropped until the writer catches
/// up.
pub(crate) const QUEUE_MAX: usize = 10_000;

/// One row on its way to the file.
pub(crate) struct Queued {
    pub id: String,
    pub owner: Owner,
    pub row: RequestRow,
    pub bounds: TimelineBounds,
}

/// The rows waiting, and whether a writer is taking them.
#[derive(Default)]
pub(crate) struct Queue {
    state: Mutex<(Vec<Queued>, bool)>,
}

impl Queue {
    /// Adds a row; true when the caller is to start the writer (none is running).
    pub(crate) fn push(&self, queued: Queued) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.0.len() < QUEUE_MAX {
            state.0.push(queued);
        }
        !std::mem::replace(&mut state.1, true)
    }

    /// Everything waiting, for the writer, which stops when nothing is (the next push starts
    /// one). Taken with the database locked, so batches reach the file in the order taken.
    pub(crate) fn take(&self) -> Vec<Queued> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let batch = std::mem::take(&mut state.0);
        if batch.is_empty() {
            state.1 = false;
        }
        batch
    }

    /// Everything waiting, for a reader that writes it first to read its own rows.
    pub(crate) fn drain(&self) -> Vec<Queued> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut state.0)
    }
}

/// Queues a row, and starts the writer unless one is running: it writes what waits, batch by
/// batch, until nothing does.
pub(crate) fn enqueue(database: &Arc<Mutex<Database>>, queue: &Arc<Queue>, queued: Queued) {
    if !queue.push(queued) {
        return; // the running writer takes it with its next batch
    }
    let (database, queue) = (database.clone(), queue.clone());
    tokio::task::spawn_blocking(move || loop {
        let mut db = database.lock().unwrap_or_else(|p| p.into_inner());
        let batch = queue.take();
        if batch.is_empty() {
            return;
        }
        let written = db.connection_mut().and_then(|c| record_all(c, &batch));
        if let Err(e) = written {
            tracing::debug!(error = %e, rows = batch.len(), "Timeline rows were not written.");
        }
    });
}

/// Runs `work` after writing the rows still queued, so a reader sees every request recorded
/// before it asked.
pub(crate) async fn read<T: Send + 'static>(
    database: &Arc<Mutex<Database>>,
    queue: &Arc<Queue>,
    work: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    let (database, queue) = (database.clone(), queue.clone());
    tokio::task::spawn_blocking(move || {
        let mut db = database.lock().unwrap_or_else(|p| p.into_inner());
        let batch = queue.drain();
        if !batch.is_empty() {
            record_all(db.connection_mut()?, &batch)?;
        }
        work(db.connection())
    })
    .await
    .map_err(unavailable)?
}

/// Writes `batch` in one transaction.
pub(crate) fn record_all(connection: &mut Connection, batch: &[Queued]) -> Result<(), StoreError> {
    let tx = connection.transaction().map_err(unavailable)?;
    for q in batch {
        record(&tx, &q.id, &q.owner, &q.row, q.bounds)?;
    }
    tx.commit().map_err(unavailable)
}

/// Adds `row` to conversation `id`, dropping rows and conversations beyond `bounds`.
fn record(
    tx: &Transaction<'_>,
    id: &str,
    owner: &Owner,
    row: &RequestRow,
    bounds: TimelineBounds,
) -> Result<(), StoreError> {
    let stored: Option<String> = tx
        .query_row(
            "SELECT body FROM timeline_conversations WHERE id = ?1",
            params![id],
            |r| r.get(0),
        )
        .optional()
        .map_err(unavailable)?;
    let entry = match stored {
        Some(body) => {
            let mut entry: ConversationEntry = decode(&body)?;
            entry.absorb(row);
            entry
        }
        None => ConversationEntry::first(id, owner, row),
    };
    tx.execute(
        "INSERT INTO timeline_conversations (id, last_ms, body) VALUES (?1, ?2, ?3)
         ON CONFLICT (id) DO UPDATE SET last_ms = excluded.last_ms, body = excluded.body",
        params![id, entry.last_ms as i64, encode(&entry)?],
    )
    .map_err(unavailable)?;
    let seq = entry.requests as i64;
    tx.execute(
        "INSERT OR REPLACE INTO timeline_requests (conversation, seq, body) VALUES (?1, ?2, ?3)",
        params![id, seq, encode(row)?],
    )
    .map_err(unavailable)?;
    tx.execute(
        "DELETE FROM timeline_requests WHERE conversation = ?1 AND seq <= ?2",
        params![id, seq - bounds.requests_per_conversation as i64],
    )
    .map_err(unavailable)?;
    // The tenant's own bound first, then the store's.
    tx.execute(
        "DELETE FROM timeline_requests WHERE conversation IN (
             SELECT id FROM timeline_conversations WHERE json_extract(body, '$.tenant') = ?1
             ORDER BY last_ms DESC, id LIMIT -1 OFFSET ?2)",
        params![entry.owner.tenant, bounds.conversations_per_tenant as i64],
    )
    .map_err(unavailable)?;
    tx.execute(
        "DELETE FROM timeline_conversations WHERE id IN (
             SELECT id FROM timeline_conversations WHERE json_extract(body, '$.tenant') = ?1
             ORDER BY last_ms DESC, id LIMIT -1 OFFSET ?2)",
        params![entry.owner.tenant, bounds.conversations_per_tenant as i64],
    )
    .map_err(unavailable)?;
    tx.execute(
        "DELETE FROM timeline_requests WHERE conversation IN (
             SELECT id FROM timeline_conversations ORDER BY last_ms DESC, id LIMIT -1 OFFSET ?1)",
        params![bounds.conversations as i64],
    )
    .map_err(unavailable)?;
    tx.execute(
        "DELETE FROM timeline_conversations WHERE id IN (
             SELECT id FROM timeline_conversations ORDER BY last_ms DESC, id LIMIT -1 OFFSET ?1)",
        params![bounds.conversations as i64],
    )
    .map_err(unavailable)?;
    Ok(())
}

/// Every conversation's entry, the most recently active first.
pub(crate) fn conversations(connection: &Connection) -> Result<Vec<ConversationEntry>, StoreError> {
    let mut stmt = connection
        .prepare_cached("SELECT body FROM timeline_conversations")
        .map_err(unavailable)?;
    let bodies = stmt
        .query_map([], |r| r.get::<_, String>(0))
        .map_err(unavailable)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(unavailable)?;
    let entries = bodies
        .iter()
        .map(|b| decode(b))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(newest_first(entries))
}

/// One conversation's entry and its kept rows, oldest first.
pub(crate) fn timeline(
    connection: &Connection,
    id: &str,
) -> Result<Option<(ConversationEntry, Vec<RequestRow>)>, StoreError> {
    let stored: Option<String> = connection
        .query_row(
            "SELECT body FROM timeline_conversations WHERE id = ?1",
            params![id],
            |r| r.get(0),
        )
        .optional()
        .map_err(unavailable)?;
    let Some(body) = stored else {
        return Ok(None);
    };
    let mut stmt = connection
        .prepare_cached("SELECT body FROM timeline_requests WHERE conversation = ?1 ORDER BY seq")
        .map_err(unavailable)?;
    let rows = stmt
        .query_map(params![id], |r| r.get::<_, String>(0))
        .map_err(unavailable)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(unavailable)?;
    let rows = rows
        .iter()
        .map(|b| decode(b))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some((decode(&body)?, rows)))
}

/// Forgets conversations last active before `cutoff` (ms since the Unix epoch), as checkpoints
/// expire.
pub(crate) fn prune(connection: &Connection, cutoff: u64) -> rusqlite::Result<()> {
    connection.execute(
        "DELETE FROM timeline_requests WHERE conversation IN (
             SELECT id FROM timeline_conversations WHERE last_ms < ?1)",
        params![cutoff as i64],
    )?;
    connection.execute(
        "DELETE FROM timeline_conversations WHERE last_ms < ?1",
        params![cutoff as i64],
    )?;
    Ok(())
}
