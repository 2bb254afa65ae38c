//! Redis store for team gateways: every replica behind the load balancer reads and writes the
//! same checkpoints, model facts and leases.
//!
//! Works against a single server (`redis://…`) or a Redis Cluster (`redis+cluster://…`), Redis
//! or Valkey alike: [`connection`] opens either, [`layout`] says where everything is kept (one
//! hash tag per conversation, every script's keys declared) and moves checkpoints written by the
//! previous layout.
//!
//! Redis being down never makes a request fail or wait: see [`degraded`] for how calls are
//! bounded, served locally while Redis is away, and copied over when it returns. Redis losing
//! what it held (a restart, a flush, a failover) costs no summary either: see [`write_back`].

mod connection;
mod degraded;
mod layout;
mod timeline;
mod write_back;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use quick_cache::sync::Cache;
use redis::{AsyncCommands, RedisError};

use super::memory::MemoryStore;
use super::{
    is_fresh, without_expired, Checkpoint, CheckpointStore, ConversationEntry, ModelFacts, Owner,
    RequestRow, StoreError, TimelineBounds,
};
use connection::{Connection, Target, Timeouts};
use degraded::{probe, ListWeight, Pending, CONNECT_TIMEOUT, LOCAL_BYTES};
use layout::{lease_key, model_key, secret_key, ttl_ms, Scripts};

pub use connection::is_redis_url;

pub use degraded::CALL_TIMEOUT;

pub struct RedisStore {
    shared: Arc<Shared>,
}

struct Shared {
    target: Target,
    /// `None` until the first connection succeeds.
    manager: RwLock<Option<Connection>>,
    healthy: AtomicBool,
    ttl: Duration,
    scripts: Scripts,
    /// Conversations recently read or written, served while degraded.
    conversations: Cache<String, Arc<Vec<Checkpoint>>, ListWeight>,
    /// Serializes read-modify-write of `conversations`.
    local_writes: Mutex<()>,
    /// Model facts and leases while degraded.
    local: MemoryStore,
    /// Writes Redis has not seen, copied over on recovery.
    pending: Mutex<Pending>,
    /// Whether checkpoints of the previous layout may still be waiting to be moved.
    legacy: AtomicBool,
    /// Where each fall to degraded is counted (callers never see those failures).
    errors: OnceLock<Counter>,
}

fn corrupt(e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(e.to_string())
}

impl RedisStore {
    /// Connects to `url`: `redis://[user][:password@]host[:port][/db]` for one server, or
    /// `redis+cluster://[user][:password@]host:port,host:port,…` for a cluster. An unparsable URL
    /// is an error; an unreachable server is not: the store starts degraded and connects in the
    /// background. Checkpoints expire after `ttl` (zero: never).
    pub async fn open(url: &str, ttl: Duration) -> Result<RedisStore, StoreError> {
        let timeouts = Timeouts {
            connect: CONNECT_TIMEOUT,
            response: CALL_TIMEOUT,
        };
        let target = Target::parse(url, timeouts)?;
        let address = target.address();
        // The previous layout only ever worked on a single server.
        let legacy = !target.is_cluster();
        let shared = Arc::new(Shared {
            target,
            manager: RwLock::new(None),
            healthy: AtomicBool::new(false),
            ttl,
            scripts: Scripts::default(),
            conversations: Cache::with_weighter(16_384, LOCAL_BYTES, ListWeight),
            local_writes: Mutex::new(()),
            local: MemoryStore::default(),
            pending: Mutex::new(Pending::default()),
            legacy: AtomicBool::new(legacy),
            errors: OnceLock::new(),
        });
        match shared.connect().await {
            Ok(()) => {
                shared.healthy.store(true, Ordering::SeqCst);
                tracing::info!(store = "redis", %address, "checkpoint store connected");
            }
            Err(e) => tracing::warn!(
                store = "redis",
                %address,
                error = %e,
                "checkpoint store degraded: redis unreachable at startup; serving from local memory \
                 without sharing and retrying in the background"
            ),
        }
        tokio::spawn(probe(Arc::downgrade(&shared)));
        if legacy {
            tokio::spawn(move_legacy(Arc::downgrade(&shared)));
        }
        Ok(RedisStore { shared })
    }
}

impl Shared {
    async fn redis_put(
        &self,
        conn: &mut Connection,
        checkpoint: &Checkpoint,
    ) -> Result<(), RedisError> {
        self.scripts.put(conn, checkpoint, self.ttl).await
    }

    async fn redis_put_facts(
        manager: &mut Connection,
        model: &str,
        facts: &ModelFacts,
    ) -> Result<(), RedisError> {
        let body = serde_json::to_string(facts).map_err(|e| {
            RedisError::from((redis::ErrorKind::TypeError, "facts encoding", e.to_string()))
        })?;
        match facts.expires_ms {
            None => manager.set(model_key(model), body).await,
            Some(expires) => match expires.saturating_sub(super::now_ms()) {
                0 => manager.del(model_key(model)).await,
                ms => manager.pset_ex(model_key(model), body, ms).await,
            },
        }
    }
}

/// Moves what the previous layout holds into the current one, once Redis is reachable; ends
/// when done or with the store.
async fn move_legacy(shared: Weak<Shared>) {
    /// A whole pass over the keyspace may take longer than a request-path call.
    const PASS_TIMEOUT: Duration = Duration::from_secs(120);
    loop {
        let Some(s) = shared.upgrade() else {
            return;
        };
        if let (true, Some(mut conn)) = (s.is_healthy(), s.manager()) {
            let pass = layout::migrate_all(&mut conn, &s.scripts, s.ttl);
            match tokio::time::timeout(PASS_TIMEOUT, pass).await {
                Ok(Ok(moved)) => {
                    s.legacy.store(false, Ordering::SeqCst);
                    if moved > 0 {
                        tracing::info!(
                            store = "redis",
                            conversations = moved,
                            "moved checkpoints of the previous key layout to the current one"
                        );
                    }
                    return;
                }
                Ok(Err(e)) => {
                    tracing::warn!(store = "redis", error = %e, "moving checkpoints of the previous key layout failed; retrying")
                }
                Err(_) => tracing::warn!(
                    store = "redis",
                    "moving checkpoints of the previous key layout timed out; retrying"
                ),
            }
        }
        drop(s);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[async_trait::async_trait]
impl CheckpointStore for RedisStore {
    async fn put(&self, checkpoint: &Checkpoint) -> Result<(), StoreError> {
        let s = &self.shared;
        s.remember(checkpoint);
        loop {
            let stored = s
                .call("put", |mut m| async move {
                    s.redis_put(&mut m, checkpoint).await
                })
                .await;
            if stored.is_some() || s.queue(|p| p.checkpoints.push_back(checkpoint.clone())) {
                return Ok(());
            }
        }
    }

    async fn for_anchor(&self, anchor: &str) -> Result<Arc<Vec<Checkpoint>>, StoreError> {
        let s = &self.shared;
        let bodies = s
            .call("for_anchor", |mut m| async move {
                let bodies = layout::conversation(&mut m, anchor).await?;
                if bodies.is_empty() && s.legacy.load(Ordering::SeqCst) {
                    // Moved here, or by the background move between the two reads: a move
                    // writes the new layout before it deletes the old, so reading again finds it.
                    layout::migrate(&mut m, &s.scripts, anchor, s.ttl).await?;
                    return layout::conversation(&mut m, anchor).await;
                }
                Ok(bodies)
            })
            .await;
        match bodies {
            Some(bodies) => {
                let stored = layout::arrange(&bodies, s.ttl)?;
                let list = Arc::new(s.with_lost_restored(anchor, stored).await);
                if list.is_empty() {
                    s.conversations.remove(anchor);
                } else {
                    s.conversations.insert(anchor.to_string(), list.clone());
                }
                Ok(list)
            }
            None => Ok(s
                .conversations
                .get(anchor)
                .map(|l| without_expired(l, s.ttl))
                .unwrap_or_default()),
        }
    }

    async fn get(&self, id: &str) -> Result<Option<Checkpoint>, StoreError> {
        let s = &self.shared;
        let body = s
            .call("get", |mut m| async move {
                match layout::checkpoint(&mut m, id).await? {
                    None if s.legacy.load(Ordering::SeqCst) => {
                        match layout::legacy::checkpoint(&mut m, id).await? {
                            // The background move may have taken it between the two reads; it
                            // writes the new layout before deleting the old one.
                            None => layout::checkpoint(&mut m, id).await,
                            found => Ok(found),
                        }
                    }
                    found => Ok(found),
                }
            })
            .await;
        match body {
            Some(None) => Ok(s.restore_lost(id).await),
            Some(Some(body)) => Ok(Some(layout::decode(&body)?).filter(|c| is_fresh(c, s.ttl))),
            None => Ok(s
                .conversations
                .iter()
                .find_map(|(_, list)| list.iter().find(|c| c.id == id).cloned())
                .filter(|c| is_fresh(c, s.ttl))),
        }
    }

    async fn model_facts(&self, model: &str) -> Result<ModelFacts, StoreError> {
        let s = &self.shared;
        let body = s
            .call("model_facts", |mut m| async move {
                m.get::<_, Option<String>>(model_key(model)).await
            })
            .await;
        match body {
            Some(Some(body)) => {
                let facts: ModelFacts = serde_json::from_str(&body).map_err(corrupt)?;
                if facts.is_expired(super::now_ms()) {
                    return Ok(ModelFacts::default());
                }
                s.local.put_model_facts(model, facts.clone()).await?;
                Ok(facts)
            }
            Some(None) => Ok(ModelFacts::default()),
            None => s.local.model_facts(model).await,
        }
    }

    async fn put_model_facts(&self, model: &str, facts: ModelFacts) -> Result<(), StoreError> {
        let s = &self.shared;
        s.local.put_model_facts(model, facts.clone()).await?;
        let facts = &facts;
        loop {
            let stored = s
                .call("put_model_facts", |mut m| async move {
                    Shared::redis_put_facts(&mut m, model, facts).await
                })
                .await;
            if stored.is_some()
                || s.queue(|p| {
                    p.facts.insert(model.to_string(), facts.clone());
                })
            {
                return Ok(());
            }
        }
    }

    async fn try_lease(&self, key: &str, holder: &str, ttl: Duration) -> Result<bool, StoreError> {
        let s = &self.shared;
        let ms = ttl_ms(ttl).max(1);
        let taken = s
            .call("try_lease", |mut m| async move {
                s.scripts.lease(&mut m, key, holder, ms).await
            })
            .await;
        match taken {
            Some(true) => {
                // Mirror it locally, so that single flight within this replica survives Redis
                // going away before the lease is released.
                s.local.try_lease(key, holder, ttl).await?;
                Ok(true)
            }
            Some(false) => Ok(false),
            None => s.local.try_lease(key, holder, ttl).await,
        }
    }

    async fn release_lease(&self, key: &str, holder: &str) -> Result<(), StoreError> {
        let s = &self.shared;
        s.local.release_lease(key, holder).await?;
        s.call("release_lease", |mut m| async move {
            s.scripts.release(&mut m, key, holder).await
        })
        .await;
        // Unreleased in Redis (unreachable): the lease lapses by its expiry.
        Ok(())
    }

    async fn lease_holder(&self, key: &str) -> Result<Option<String>, StoreError> {
        let s = &self.shared;
        let holder = s
            .call("lease_holder", |mut m| async move {
                m.get::<_, Option<String>>(lease_key(key)).await
            })
            .await;
        match holder {
            Some(holder) => Ok(holder),
            None => s.local.lease_holder(key).await,
        }
    }

    /// Recorded locally while Redis is away; those rows are not copied over later (the
    /// history is for looking at, and checkpoints come first).
    async fn record_request(
        &self,
        id: &str,
        owner: &Owner,
        row: &RequestRow,
        bounds: TimelineBounds,
    ) -> Result<(), StoreError> {
        let s = &self.shared;
        let recorded = s
            .call("record_request", |mut m| async move {
                let to = timeline::Destination {
                    id,
                    owner,
                    bounds,
                    ttl: s.ttl,
                };
                timeline::record(&mut m, &to, row).await
            })
            .await;
        match recorded {
            Some(()) => Ok(()),
            None => s.local.record_request(id, owner, row, bounds).await,
        }
    }

    async fn conversations(&self) -> Result<Vec<ConversationEntry>, StoreError> {
        let s = &self.shared;
        match s
            .call("conversations", |mut m| async move {
                timeline::conversations(&mut m, s.ttl).await
            })
            .await
        {
            Some(entries) => Ok(entries),
            None => s.local.conversations().await,
        }
    }

    async fn timeline(
        &self,
        id: &str,
    ) -> Result<Option<(ConversationEntry, Vec<RequestRow>)>, StoreError> {
        let s = &self.shared;
        match s
            .call("timeline", |mut m| async move {
                timeline::timeline(&mut m, id).await
            })
            .await
        {
            Some(found) => Ok(found),
            None => s.local.timeline(id).await,
        }
    }

    async fn shared_secret(&self, name: &str, candidate: &str) -> Result<String, StoreError> {
        let s = &self.shared;
        // SET NX, then GET: whichever replica's SET lands first is the secret every one reads.
        let kept = s
            .call("shared_secret", |mut m| async move {
                let key = secret_key(name);
                let _: bool = m.set_nx(&key, candidate).await?;
                m.get::<_, Option<String>>(&key).await
            })
            .await;
        match kept {
            Some(Some(kept)) => Ok(kept),
            Some(None) => Err(StoreError::Unavailable(
                "the secret written to redis was not read back".into(),
            )),
            // Not served from local memory: a secret no other replica holds is not shared.
            None => Err(StoreError::Unavailable("redis is unreachable".into())),
        }
    }

    fn healthy(&self) -> bool {
        self.shared.is_healthy()
    }

    fn count_absorbed_errors(&self, errors: Counter) {
        let _ = self.shared.errors.set(errors);
    }

    fn kind(&self) -> &'static str {
        if self.shared.target.is_cluster() {
            "redis-cluster"
        } else {
            "redis"
        }
    }
}

// Shared with the integration tests, which start real servers the same way.
#[cfg(test)]
#[path = "../../tests/common/redis_server.rs"]
pub(crate) mod redis_server;

#[cfg(test)]
#[path = "../../tests/common/redis_cluster.rs"]
pub(crate) mod redis_cluster;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod cluster_tests;
