//! Conversation timelines in the SQLite file: one row per conversation (its entry, as JSON)
//! and one per kept request, numbered within its conversation. Both bounds are applied in the
//! transaction that adds a row, so the file never holds more than they allow.
//!
//! A timeline write that fails is not queued like a checkpoint: the history is for people to
//! look at, and losing a row of it costs nothing the proxy needs.

use rusqlite::{params, Connection, OptionalExtension};

use super::sqlite_file::unavailable;
use super::timeline::newest_first;
use super::{ConversationEntry, Owner, RequestRow, StoreError, TimelineBounds};

fn encode<T: serde::Serialize>(value: &T) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|e| StoreError::Corrupt(e.to_string()))
}

fn decode<T: serde::de::DeserializeOwned>(body: &str) -> Result<T, StoreError> {
    serde_json::from_str(body).map_err(|e| StoreError::Corrupt(e.to_string()))
}

/// Adds `row` to conversation `id`, dropping rows and conversations beyond `bounds`.
pub(crate) fn record(
    connection: &mut Connection,
    id: &str,
    owner: &Owner,
    row: &RequestRow,
    bounds: TimelineBounds,
) -> Result<(), StoreError> {
    let tx = connection.transaction().map_err(unavailable)?;
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
    tx.commit().map_err(unavailable)
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
