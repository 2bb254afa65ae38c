//! The embedded default store: one SQLite file, created on first use, that survives restarts.
//!
//! The file belongs to one proxy process, so reads are served from a write-through cache of
//! each conversation's checkpoints; SQLite is touched on writes and on the first read of a
//! conversation. Leases are in-process (there is only one process to coordinate). Secrets kept
//! in the file ([`CheckpointStore::shared_secret`]) are read and written directly, never from
//! memory: one that was not written must not be handed out as kept.
//!
//! A write that fails (a full disk, a read-only file) does not lose the checkpoint: it is kept in
//! memory and served from there, the store reports itself degraded (`x-compactor-store`,
//! `/readyz`) and counts the failure (`compactor_store_errors_total`), and the write is retried
//! with the next one, or when health is next checked.
//! A database file removed while the proxy runs is noticed and written again from the open
//! connection (see [`super::sqlite_file`]).

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use quick_cache::sync::Cache;
use rusqlite::{params, OptionalExtension};

use super::lease::LeaseTable;
use super::sqlite_file::{prune_facts, shared_secret, unavailable, Database, Write, NEVER};
use super::sqlite_timeline;
use super::{
    expiry_cutoff, insert_newest_first, is_fresh, now_ms, Checkpoint, CheckpointStore,
    ConversationEntry, ModelFacts, Owner, RequestRow, StoreError, TimelineBounds,
    CHECKPOINTS_PER_CONVERSATION, MODEL_FACTS_IN_MEMORY, MODEL_FACTS_ROWS,
};

/// Writes kept in memory while the file cannot take them (the oldest are dropped beyond this).
const MAX_PENDING_WRITES: usize = 10_000;
/// How often a health check looks at the file and retries pending writes.
const HEALTH_CHECK_INTERVAL_MS: u64 = 1_000;

pub struct SqliteStore {
    database: Arc<Mutex<Database>>,
    conversations: Cache<String, Arc<Vec<Checkpoint>>>,
    /// Facts read or written recently (bounded: model names are the client's choice).
    models: Cache<String, ModelFacts>,
    leases: LeaseTable,
    ttl: Duration,
    health: Arc<Health>,
    /// Timeline rows on their way to the file.
    timeline_queue: Arc<sqlite_timeline::Queue>,
}

/// Whether the file is keeping up, and what it has not taken yet.
#[derive(Default)]
struct Health {
    degraded: AtomicBool,
    /// Writes not yet on disk, oldest first, each with its sequence number.
    pending: Mutex<Vec<(u64, Write)>>,
    next_sequence: AtomicU64,
    last_check_ms: AtomicU64,
    flushing: AtomicBool,
    /// Where failures nobody else sees are counted, once the application has said.
    errors: OnceLock<Counter>,
}

impl Health {
    fn queue(&self, write: Write) {
        let sequence = self.next_sequence.fetch_add(1, Ordering::SeqCst);
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending.push((sequence, write));
        if pending.len() > MAX_PENDING_WRITES {
            pending.remove(0);
        }
    }

    fn snapshot(&self) -> Vec<(u64, Write)> {
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Records the outcome of writing everything up to sequence `upto`.
    fn written(&self, upto: Option<u64>, result: Result<(), StoreError>) {
        match result {
            Ok(()) => {
                if let Some(upto) = upto {
                    self.pending
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .retain(|(s, _)| *s > upto);
                }
                if self.degraded.swap(false, Ordering::SeqCst) {
                    tracing::info!(
                        "Checkpoint store recovered: the database file takes writes again."
                    );
                }
            }
            Err(e) => self.absorbed(&e),
        }
    }

    /// A failure the store keeps to itself (the write waits in memory): degraded, and counted.
    fn absorbed(&self, error: &StoreError) {
        if let Some(errors) = self.errors.get() {
            errors.inc();
        }
        self.degrade(error);
    }

    fn degrade(&self, error: &StoreError) {
        if !self.degraded.swap(true, Ordering::SeqCst) {
            tracing::error!(error = %error, "Checkpoint store degraded: the database file failed; serving checkpoints from memory.");
        }
    }
}

/// Writes every pending write, in order, in one transaction.
fn flush(database: &Mutex<Database>, health: &Health) {
    let pending = health.snapshot();
    let upto = pending.last().map(|(s, _)| *s);
    let writes: Vec<Write> = pending.into_iter().map(|(_, w)| w).collect();
    let mut db = database.lock().unwrap_or_else(|p| p.into_inner());
    let result = db.apply(&writes);
    health.written(upto, result);
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path`, and prunes checkpoints older than `ttl`
    /// (zero: keep forever).
    pub fn open(path: &Path, ttl: Duration) -> Result<SqliteStore, StoreError> {
        let database = Database::open(path)?;
        prune_facts(database.connection(), MODEL_FACTS_ROWS).map_err(unavailable)?;
        if let Some(cutoff) = expiry_cutoff(ttl) {
            database
                .connection()
                .execute(
                    "DELETE FROM checkpoints WHERE created_ms < ?1",
                    params![cutoff as i64],
                )
                .map_err(unavailable)?;
            sqlite_timeline::prune(database.connection(), cutoff).map_err(unavailable)?;
        }
        Ok(SqliteStore {
            database: Arc::new(Mutex::new(database)),
            conversations: Cache::new(10_000),
            models: Cache::new(MODEL_FACTS_IN_MEMORY),
            leases: LeaseTable::default(),
            ttl,
            health: Arc::new(Health::default()),
            timeline_queue: Arc::default(),
        })
    }

    /// Runs a read on the connection off the async runtime; a failure degrades the store.
    async fn read<T: Send + 'static>(
        &self,
        work: impl FnOnce(&rusqlite::Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let database = self.database.clone();
        let result = tokio::task::spawn_blocking(move || {
            let db = database.lock().unwrap_or_else(|p| p.into_inner());
            work(db.connection())
        })
        .await
        .map_err(unavailable)?;
        if let Err(e) = &result {
            self.health.degrade(e);
        }
        result
    }

    /// Queues `write` and writes everything pending. A failure keeps the writes in memory (they
    /// are served from there) and degrades the store; it is not the caller's failure.
    async fn write(&self, write: Write) {
        self.health.queue(write);
        let (database, health) = (self.database.clone(), self.health.clone());
        if let Err(e) = tokio::task::spawn_blocking(move || flush(&database, &health)).await {
            self.health.absorbed(&unavailable(e));
        }
    }

    /// Checkpoints written while the file failed, for one conversation or one id.
    fn pending_checkpoints(&self, wanted: impl Fn(&str, &str) -> bool) -> Vec<Checkpoint> {
        self.health
            .snapshot()
            .into_iter()
            .filter_map(|(_, w)| match w {
                Write::Checkpoint {
                    id, anchor, body, ..
                } if wanted(&id, &anchor) => decode(body).ok(),
                _ => None,
            })
            .collect()
    }

    fn fresh(&self, list: Vec<Checkpoint>) -> Vec<Checkpoint> {
        list.into_iter().filter(|c| is_fresh(c, self.ttl)).collect()
    }
}

fn decode(body: String) -> Result<Checkpoint, StoreError> {
    serde_json::from_str(&body).map_err(|e| StoreError::Corrupt(e.to_string()))
}

#[async_trait::async_trait]
impl CheckpointStore for SqliteStore {
    async fn put(&self, checkpoint: &Checkpoint) -> Result<(), StoreError> {
        let mut list = match self.for_anchor(&checkpoint.anchor).await {
            Ok(list) => (*list).clone(),
            Err(_) => vec![],
        };
        insert_newest_first(&mut list, checkpoint);
        let body =
            serde_json::to_string(checkpoint).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let keep = list.iter().map(|c| c.id.clone()).collect();
        self.conversations
            .insert(checkpoint.anchor.clone(), Arc::new(list));
        self.write(Write::Checkpoint {
            id: checkpoint.id.clone(),
            anchor: checkpoint.anchor.clone(),
            covered: checkpoint.covered,
            created_ms: checkpoint.created_ms,
            body,
            keep,
        })
        .await;
        Ok(())
    }

    async fn for_anchor(&self, anchor: &str) -> Result<Arc<Vec<Checkpoint>>, StoreError> {
        if let Some(list) = self.conversations.get(anchor) {
            return Ok(list);
        }
        let key = anchor.to_string();
        let bodies = self
            .read(move |c| {
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
        let mut list: Vec<Checkpoint> = bodies.into_iter().map(decode).collect::<Result<_, _>>()?;
        for pending in self.pending_checkpoints(|_, a| a == anchor) {
            insert_newest_first(&mut list, &pending);
        }
        let list = Arc::new(self.fresh(list));
        self.conversations.insert(anchor.to_string(), list.clone());
        Ok(list)
    }

    async fn get(&self, id: &str) -> Result<Option<Checkpoint>, StoreError> {
        if let Some(pending) = self.pending_checkpoints(|i, _| i == id).pop() {
            return Ok(self.fresh(vec![pending]).pop());
        }
        let key = id.to_string();
        let body = self
            .read(move |c| {
                c.query_row(
                    "SELECT body FROM checkpoints WHERE id = ?1",
                    params![key],
                    |r| r.get::<_, String>(0),
                )
                .optional()
                .map_err(unavailable)
            })
            .await?;
        Ok(self
            .fresh(body.map(decode).transpose()?.into_iter().collect())
            .pop())
    }

    async fn model_facts(&self, model: &str) -> Result<ModelFacts, StoreError> {
        let now = now_ms();
        if let Some(facts) = self.models.get(model) {
            return Ok(Some(facts)
                .filter(|f| !f.is_expired(now))
                .unwrap_or_default());
        }
        let key = model.to_string();
        let body = self
            .read(move |c| {
                c.query_row(
                    "SELECT body FROM model_facts WHERE model = ?1 AND expires_ms > ?2",
                    params![key, now as i64],
                    |r| r.get::<_, String>(0),
                )
                .optional()
                .map_err(unavailable)
            })
            .await?;
        // Only what is stored is remembered: unknown names leave nothing behind.
        let Some(body) = body else {
            return Ok(ModelFacts::default());
        };
        let facts: ModelFacts =
            serde_json::from_str(&body).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        self.models.insert(model.to_string(), facts.clone());
        Ok(facts)
    }

    async fn put_model_facts(&self, model: &str, facts: ModelFacts) -> Result<(), StoreError> {
        let body = serde_json::to_string(&facts).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let expires_ms = facts
            .expires_ms
            .map_or(NEVER, |e| e.min(NEVER as u64) as i64);
        self.models.insert(model.to_string(), facts);
        self.write(Write::ModelFacts {
            model: model.to_string(),
            body,
            expires_ms,
        })
        .await;
        Ok(())
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

    async fn record_request(
        &self,
        id: &str,
        owner: &Owner,
        row: &RequestRow,
        bounds: TimelineBounds,
    ) -> Result<(), StoreError> {
        let queued = sqlite_timeline::Queued {
            id: id.to_string(),
            owner: owner.clone(),
            row: row.clone(),
            bounds,
        };
        sqlite_timeline::enqueue(&self.database, &self.timeline_queue, queued);
        Ok(())
    }

    async fn conversations(&self) -> Result<Vec<ConversationEntry>, StoreError> {
        sqlite_timeline::read(
            &self.database,
            &self.timeline_queue,
            sqlite_timeline::conversations,
        )
        .await
    }

    async fn timeline(
        &self,
        id: &str,
    ) -> Result<Option<(ConversationEntry, Vec<RequestRow>)>, StoreError> {
        let id = id.to_string();
        sqlite_timeline::read(&self.database, &self.timeline_queue, move |c| {
            sqlite_timeline::timeline(c, &id)
        })
        .await
    }

    async fn shared_secret(&self, name: &str, candidate: &str) -> Result<String, StoreError> {
        let (name, candidate) = (name.to_string(), candidate.to_string());
        self.read(move |c| shared_secret(c, &name, &candidate).map_err(unavailable))
            .await
    }

    /// Degraded while writes wait in memory. At most once a second this also looks for the
    /// file (a removed one degrades the store) and, off the runtime, retries what is pending.
    fn healthy(&self) -> bool {
        let now = now_ms();
        let last = self.health.last_check_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= HEALTH_CHECK_INTERVAL_MS
            && self
                .health
                .last_check_ms
                .compare_exchange(last, now, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
        {
            self.check_file();
        }
        !self.health.degraded.load(Ordering::SeqCst)
    }

    fn count_absorbed_errors(&self, errors: Counter) {
        let _ = self.health.errors.set(errors);
    }

    fn kind(&self) -> &'static str {
        "sqlite"
    }
}

impl SqliteStore {
    fn check_file(&self) {
        let Ok(db) = self.database.try_lock() else {
            return; // busy writing: that write reports its own outcome
        };
        let missing = !db.file_is_in_place();
        drop(db);
        if missing {
            self.health
                .absorbed(&unavailable("the database file was removed"));
        }
        let needs_flush = missing || self.health.degraded.load(Ordering::SeqCst);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if needs_flush && !self.health.flushing.swap(true, Ordering::SeqCst) {
            let (database, health) = (self.database.clone(), self.health.clone());
            runtime.spawn_blocking(move || {
                flush(&database, &health);
                health.flushing.store(false, Ordering::SeqCst);
            });
        }
    }
}

#[cfg(test)]
mod tests;
