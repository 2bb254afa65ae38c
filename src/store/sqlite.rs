//! The embedded default store: one SQLite file, created on first use, that survives restarts.
//!
//! The file belongs to one proxy process, so reads are served from a write-through cache of
//! each conversation's checkpoints; SQLite is touched on writes and on the first read of a
//! conversation. Leases are in-process (there is only one process to coordinate).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quick_cache::sync::Cache;
use rusqlite::{params, Connection, OptionalExtension};

use super::lease::LeaseTable;
use super::{
    expiry_cutoff, insert_newest_first, is_fresh, without_expired, Checkpoint, CheckpointStore,
    ModelFacts, StoreError, CHECKPOINTS_PER_CONVERSATION,
};

pub struct SqliteStore {
    connection: Arc<Mutex<Connection>>,
    conversations: Cache<String, Arc<Vec<Checkpoint>>>,
    models: Mutex<HashMap<String, ModelFacts>>,
    leases: LeaseTable,
    ttl: Duration,
}

fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path`, and prunes checkpoints older than `ttl`
    /// (zero: keep forever).
    pub fn open(path: &Path, ttl: Duration) -> Result<SqliteStore, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| unavailable(format!("{}: {e}", dir.display())))?;
        }
        let connection =
            Connection::open(path).map_err(|e| unavailable(format!("{}: {e}", path.display())))?;
        connection
            .execute_batch(
                "PRAGMA journal_mode = WAL;
                 PRAGMA synchronous = NORMAL;
                 CREATE TABLE IF NOT EXISTS checkpoints (
                     id TEXT PRIMARY KEY,
                     anchor TEXT NOT NULL,
                     covered INTEGER NOT NULL,
                     created_ms INTEGER NOT NULL,
                     body TEXT NOT NULL
                 );
                 CREATE INDEX IF NOT EXISTS checkpoints_by_anchor ON checkpoints (anchor, covered DESC, created_ms DESC);
                 CREATE TABLE IF NOT EXISTS model_facts (model TEXT PRIMARY KEY, body TEXT NOT NULL);",
            )
            .map_err(unavailable)?;
        if let Some(cutoff) = expiry_cutoff(ttl) {
            connection
                .execute(
                    "DELETE FROM checkpoints WHERE created_ms < ?1",
                    params![cutoff as i64],
                )
                .map_err(unavailable)?;
        }
        Ok(SqliteStore {
            connection: Arc::new(Mutex::new(connection)),
            conversations: Cache::new(10_000),
            models: Mutex::new(HashMap::new()),
            leases: LeaseTable::default(),
            ttl,
        })
    }

    /// Runs `work` on the connection off the async runtime.
    async fn with_connection<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let connection = self.connection.clone();
        tokio::task::spawn_blocking(move || {
            let guard = connection.lock().unwrap_or_else(|p| p.into_inner());
            work(&guard)
        })
        .await
        .map_err(unavailable)?
    }
}

fn decode(body: String) -> Result<Checkpoint, StoreError> {
    serde_json::from_str(&body).map_err(|e| StoreError::Corrupt(e.to_string()))
}

#[async_trait::async_trait]
impl CheckpointStore for SqliteStore {
    async fn put(&self, checkpoint: &Checkpoint) -> Result<(), StoreError> {
        let mut list = (*self.for_anchor(&checkpoint.anchor).await?).clone();
        insert_newest_first(&mut list, checkpoint);
        let body =
            serde_json::to_string(checkpoint).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let cp = checkpoint.clone();
        let keep: Vec<String> = list.iter().map(|c| c.id.clone()).collect();
        self.with_connection(move |c| {
            c.execute(
                "INSERT OR REPLACE INTO checkpoints (id, anchor, covered, created_ms, body) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![cp.id, cp.anchor, cp.covered as i64, cp.created_ms as i64, body],
            )
            .map_err(unavailable)?;
            // Drop what fell off the newest-N list.
            let placeholders = vec!["?"; keep.len()].join(",");
            let sql = format!("DELETE FROM checkpoints WHERE anchor = ? AND id NOT IN ({placeholders})");
            let mut values: Vec<&dyn rusqlite::ToSql> = vec![&cp.anchor];
            values.extend(keep.iter().map(|k| k as &dyn rusqlite::ToSql));
            c.execute(&sql, values.as_slice()).map_err(unavailable)?;
            Ok(())
        })
        .await?;
        self.conversations
            .insert(checkpoint.anchor.clone(), Arc::new(list));
        Ok(())
    }

    async fn for_anchor(&self, anchor: &str) -> Result<Arc<Vec<Checkpoint>>, StoreError> {
        if let Some(list) = self.conversations.get(anchor) {
            return Ok(list);
        }
        let key = anchor.to_string();
        let bodies = self
            .with_connection(move |c| {
                let mut stmt = c
                    .prepare_cached(
                        "SELECT body FROM checkpoints WHERE anchor = ?1 ORDER BY covered DESC, created_ms DESC LIMIT ?2",
                    )
                    .map_err(unavailable)?;
                let rows = stmt
                    .query_map(params![key, CHECKPOINTS_PER_CONVERSATION as i64], |r| r.get::<_, String>(0))
                    .map_err(unavailable)?;
                rows.collect::<Result<Vec<_>, _>>().map_err(unavailable)
            })
            .await?;
        let list = without_expired(
            Arc::new(bodies.into_iter().map(decode).collect::<Result<_, _>>()?),
            self.ttl,
        );
        self.conversations.insert(anchor.to_string(), list.clone());
        Ok(list)
    }

    async fn get(&self, id: &str) -> Result<Option<Checkpoint>, StoreError> {
        let key = id.to_string();
        let body = self
            .with_connection(move |c| {
                c.query_row(
                    "SELECT body FROM checkpoints WHERE id = ?1",
                    params![key],
                    |r| r.get::<_, String>(0),
                )
                .optional()
                .map_err(unavailable)
            })
            .await?;
        Ok(body
            .map(decode)
            .transpose()?
            .filter(|c| is_fresh(c, self.ttl)))
    }

    async fn model_facts(&self, model: &str) -> Result<ModelFacts, StoreError> {
        if let Some(f) = self
            .models
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(model)
        {
            return Ok(*f);
        }
        let key = model.to_string();
        let body = self
            .with_connection(move |c| {
                c.query_row(
                    "SELECT body FROM model_facts WHERE model = ?1",
                    params![key],
                    |r| r.get::<_, String>(0),
                )
                .optional()
                .map_err(unavailable)
            })
            .await?;
        let facts: ModelFacts = match body {
            Some(b) => serde_json::from_str(&b).map_err(|e| StoreError::Corrupt(e.to_string()))?,
            None => ModelFacts::default(),
        };
        self.models
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(model.to_string(), facts);
        Ok(facts)
    }

    async fn put_model_facts(&self, model: &str, facts: ModelFacts) -> Result<(), StoreError> {
        self.models
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(model.to_string(), facts);
        let key = model.to_string();
        let body = serde_json::to_string(&facts).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        self.with_connection(move |c| {
            c.execute(
                "INSERT OR REPLACE INTO model_facts (model, body) VALUES (?1, ?2)",
                params![key, body],
            )
            .map(|_| ())
            .map_err(unavailable)
        })
        .await
    }

    async fn try_lease(&self, key: &str, holder: &str, ttl: Duration) -> Result<bool, StoreError> {
        Ok(self.leases.try_take(key, holder, ttl))
    }

    async fn release_lease(&self, key: &str, holder: &str) -> Result<(), StoreError> {
        self.leases.release(key, holder);
        Ok(())
    }

    async fn lease_holder(&self, key: &str) -> Result<Option<String>, StoreError> {
        Ok(self.leases.holder(key))
    }

    fn kind(&self) -> &'static str {
        "sqlite"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn meets_the_store_contract() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("sub/c.db"), Duration::ZERO).unwrap();
        super::super::contract::check(&store).await;
    }

    #[tokio::test]
    async fn survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        let cp = super::super::contract::sample("a", 5, super::super::now_ms());
        {
            let store = SqliteStore::open(&path, Duration::from_secs(3600)).unwrap();
            store.put(&cp).await.unwrap();
            store
                .put_model_facts(
                    "m",
                    ModelFacts {
                        window: Some(2048),
                        calibration: None,
                    },
                )
                .await
                .unwrap();
        }
        let store = SqliteStore::open(&path, Duration::from_secs(3600)).unwrap();
        assert_eq!(store.for_anchor("a").await.unwrap()[0], cp);
        assert_eq!(store.get(&cp.id).await.unwrap(), Some(cp));
        assert_eq!(store.model_facts("m").await.unwrap().window, Some(2048));
    }

    #[tokio::test]
    async fn expired_checkpoints_are_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        let old = super::super::contract::sample("a", 5, 1);
        SqliteStore::open(&path, Duration::ZERO)
            .unwrap()
            .put(&old)
            .await
            .unwrap();
        let store = SqliteStore::open(&path, Duration::from_secs(60)).unwrap();
        assert!(store.for_anchor("a").await.unwrap().is_empty());
    }
}
