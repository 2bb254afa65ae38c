//! The Redis store's degraded mode: Redis being down never makes a request fail or wait.
//!
//! Every call is bounded by [`CALL_TIMEOUT`]; the first failure marks the store degraded, after
//! which calls skip Redis and are served locally (a bounded in-process copy of recently seen
//! conversations, plus a [`MemoryStore`](super::MemoryStore) for model facts and leases), so
//! compaction keeps working without sharing and single flight holds within the replica. A
//! background [`probe`] pings Redis, reconnecting (and rebuilding the connection when it
//! hangs); when Redis answers again, what was written locally meanwhile is copied to Redis and
//! the store reports healthy again.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use quick_cache::Weighter;
use redis::RedisError;

use super::super::{insert_newest_first, Checkpoint, ModelFacts};
use super::connection::Connection;
use super::Shared;

/// Longest any request-path Redis call may take before the store falls back to local state.
pub const CALL_TIMEOUT: Duration = Duration::from_millis(250);
/// Time allowed to establish a connection (at startup and when the probe rebuilds it).
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// How often the background probe pings Redis while it is healthy / while degraded.
const PROBE_HEALTHY: Duration = Duration::from_secs(2);
const PROBE_DEGRADED: Duration = Duration::from_millis(250);
/// Failed probes in a row after which the connection is rebuilt from scratch (covers a
/// connection that hangs instead of failing, which the connection manager does not replace).
const REBUILD_AFTER: u32 = 3;
/// Local copy of conversations, by approximate bytes.
pub(super) const LOCAL_BYTES: u64 = 64 * 1024 * 1024;
/// Writes made while degraded that are copied to Redis on recovery (oldest dropped beyond this).
const PENDING_MAX: usize = 10_000;

/// Writes Redis has not seen yet.
#[derive(Default)]
pub(super) struct Pending {
    pub(super) checkpoints: VecDeque<Checkpoint>,
    pub(super) facts: HashMap<String, ModelFacts>,
}

#[derive(Clone)]
pub(super) struct ListWeight;

impl Weighter<String, Arc<Vec<Checkpoint>>> for ListWeight {
    fn weight(&self, key: &String, list: &Arc<Vec<Checkpoint>>) -> u64 {
        let body: usize = list.iter().map(|c| c.summary.len() + 512).sum();
        (key.len() + body + 64) as u64
    }
}

/// What went wrong with a Redis call, for the log (never the URL, which may hold a password).
pub(super) enum Failure {
    Timeout,
    Redis(RedisError),
    NotConnected,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Timeout => write!(f, "no answer within {} ms", CALL_TIMEOUT.as_millis()),
            Failure::Redis(e) => write!(f, "{e}"),
            Failure::NotConnected => write!(f, "not connected"),
        }
    }
}

impl Shared {
    /// Opens a fresh connection and swaps it in.
    pub(super) async fn connect(&self) -> Result<(), Failure> {
        let connection = tokio::time::timeout(CONNECT_TIMEOUT * 2, self.target.connect())
            .await
            .map_err(|_| Failure::Timeout)?
            .map_err(Failure::Redis)?;
        *self.manager.write().unwrap_or_else(|p| p.into_inner()) = Some(connection);
        Ok(())
    }

    pub(super) fn manager(&self) -> Option<Connection> {
        self.manager
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(super) fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::SeqCst)
    }

    /// Runs `op` against Redis within [`CALL_TIMEOUT`]. `None` (and the store degraded) when Redis
    /// is already known to be down, or fails now.
    pub(super) async fn call<T, F, Fut>(&self, op: &'static str, f: F) -> Option<T>
    where
        F: FnOnce(Connection) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        if !self.is_healthy() {
            return None;
        }
        match self.try_call(f).await {
            Ok(v) => Some(v),
            Err(e) => {
                self.degrade(op, &e);
                None
            }
        }
    }

    pub(super) async fn try_call<T, F, Fut>(&self, f: F) -> Result<T, Failure>
    where
        F: FnOnce(Connection) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        let manager = self.manager().ok_or(Failure::NotConnected)?;
        match tokio::time::timeout(CALL_TIMEOUT, f(manager)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(Failure::Redis(e)),
            Err(_) => Err(Failure::Timeout),
        }
    }

    pub(super) fn degrade(&self, op: &'static str, failure: &Failure) {
        if self.healthy.swap(false, Ordering::SeqCst) {
            // Once per outage: while degraded, calls are not tried, and the probe keeps failing.
            if let Some(errors) = self.errors.get() {
                errors.inc();
            }
            tracing::warn!(
                store = "redis",
                op,
                error = %failure,
                "checkpoint store degraded: redis unavailable; serving from local memory without \
                 sharing until it returns"
            );
        }
    }

    pub(super) fn remember(&self, checkpoint: &Checkpoint) {
        let _guard = self.local_writes.lock().unwrap_or_else(|p| p.into_inner());
        let mut list = self
            .conversations
            .get(&checkpoint.anchor)
            .map(|l| (*l).clone())
            .unwrap_or_default();
        insert_newest_first(&mut list, checkpoint);
        self.conversations
            .insert(checkpoint.anchor.clone(), Arc::new(list));
    }

    /// Queues a write for Redis unless the store has become healthy meanwhile (then `false`: the
    /// caller writes to Redis itself). Checked under the lock the probe takes to flip health, so
    /// nothing queued is left behind.
    pub(super) fn queue(&self, item: impl FnOnce(&mut Pending)) -> bool {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if self.is_healthy() {
            return false;
        }
        item(&mut pending);
        while pending.checkpoints.len() > PENDING_MAX {
            pending.checkpoints.pop_front();
        }
        // Facts are re-learned cheaply: beyond the bound, any one of them is dropped.
        while pending.facts.len() > PENDING_MAX {
            let Some(model) = pending.facts.keys().next().cloned() else {
                break;
            };
            pending.facts.remove(&model);
        }
        true
    }

    /// Copies writes made while degraded to Redis, then flips to healthy once nothing is left.
    async fn recover(&self) -> Result<(), Failure> {
        loop {
            let batch = {
                let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
                if pending.checkpoints.is_empty() && pending.facts.is_empty() {
                    self.healthy.store(true, Ordering::SeqCst);
                    return Ok(());
                }
                std::mem::take(&mut *pending)
            };
            let mut rest = batch;
            let result = self.replay(&mut rest).await;
            if result.is_err() {
                // Put back what did not make it, ahead of anything queued meanwhile.
                let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
                let newer = std::mem::take(&mut *pending);
                rest.checkpoints.extend(newer.checkpoints);
                rest.facts.extend(newer.facts);
                *pending = rest;
                return result;
            }
        }
    }

    async fn replay(&self, batch: &mut Pending) -> Result<(), Failure> {
        while let Some(checkpoint) = batch.checkpoints.front().cloned() {
            self.try_call(|mut m| async move { self.redis_put(&mut m, &checkpoint).await })
                .await?;
            batch.checkpoints.pop_front();
        }
        let models: Vec<String> = batch.facts.keys().cloned().collect();
        for model in models {
            let facts = &batch.facts[&model];
            let name = model.as_str();
            self.try_call(|mut m| async move { Self::redis_put_facts(&mut m, name, facts).await })
                .await?;
            batch.facts.remove(&model);
        }
        Ok(())
    }
}

/// Keeps the connection alive and the health flag true to Redis; ends with the store.
pub(super) async fn probe(shared: Weak<Shared>) {
    let mut failures = 0u32;
    loop {
        let period = match shared.upgrade() {
            Some(s) if s.is_healthy() => PROBE_HEALTHY,
            Some(_) => PROBE_DEGRADED,
            None => return,
        };
        tokio::time::sleep(period).await;
        let Some(store) = shared.upgrade() else {
            return;
        };
        if store.manager().is_none() || failures >= REBUILD_AFTER {
            failures = 0;
            if store.connect().await.is_err() {
                failures += 1;
                continue;
            }
        }
        let ping = store
            .try_call(|mut m| async move { redis::cmd("PING").query_async::<String>(&mut m).await })
            .await;
        let result = match ping {
            Ok(_) if store.is_healthy() => Ok(()),
            Ok(_) => store.recover().await.inspect(|()| {
                tracing::info!(
                    store = "redis",
                    "checkpoint store recovered: redis reachable again, sharing resumed"
                );
            }),
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => failures = 0,
            Err(e) => {
                failures += 1;
                store.degrade("ping", &e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::store::contract::sample;
    use crate::store::redis::redis_server::RedisServer;
    use crate::store::redis::RedisStore;
    use crate::store::CheckpointStore;

    async fn eventually(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + limit;
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for: {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Runs `f`, asserting it returns quickly.
    async fn quick<T>(what: &str, f: impl Future<Output = T>) -> T {
        let started = Instant::now();
        let out = f.await;
        let took = started.elapsed();
        assert!(took < Duration::from_millis(1000), "{what} took {took:?}");
        out
    }

    #[tokio::test]
    async fn starts_degraded_without_redis_and_connects_when_it_appears() {
        let mut server = RedisServer::start();
        server.stop();
        let store = quick("open", RedisStore::open(&server.url(), Duration::ZERO))
            .await
            .unwrap();
        assert!(!store.healthy());
        let early = sample("a", 3, 1);
        quick("put", store.put(&early)).await.unwrap();
        assert_eq!(*store.for_anchor("a").await.unwrap(), vec![early.clone()]);
        server.restart();
        eventually(
            "healthy after redis starts",
            Duration::from_secs(10),
            || store.healthy(),
        )
        .await;
        let other = RedisStore::open(&server.url(), Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(
            *other.for_anchor("a").await.unwrap(),
            vec![early],
            "degraded writes are copied over"
        );
    }

    #[tokio::test]
    async fn survives_redis_going_away_and_recovers_without_reopening() {
        let mut server = RedisServer::start();
        let store = RedisStore::open(&server.url(), Duration::ZERO)
            .await
            .unwrap();
        let before = sample("a", 4, 1);
        store.put(&before).await.unwrap();
        store
            .put_model_facts(
                "m",
                ModelFacts {
                    window: Some(1000),
                    ..ModelFacts::default()
                },
            )
            .await
            .unwrap();
        assert!(store.healthy());

        server.stop();
        // Every call still succeeds, quickly, from local state.
        let during = sample("a", 9, 2);
        quick("put", store.put(&during)).await.unwrap();
        let list = quick("for_anchor", store.for_anchor("a")).await.unwrap();
        assert_eq!(
            list.iter().map(|c| c.covered).collect::<Vec<_>>(),
            vec![9, 4]
        );
        assert_eq!(
            quick("get", store.get(&during.id)).await.unwrap(),
            Some(during.clone())
        );
        assert_eq!(
            quick("model_facts", store.model_facts("m"))
                .await
                .unwrap()
                .window,
            Some(1000)
        );
        let facts = ModelFacts {
            window: Some(2000),
            accepted_prompt: Some(1200),
            ..ModelFacts::default()
        };
        quick("put_model_facts", store.put_model_facts("m", facts.clone()))
            .await
            .unwrap();
        let ttl = Duration::from_secs(30);
        assert!(quick("try_lease", store.try_lease("k", "one", ttl))
            .await
            .unwrap());
        assert!(
            !quick("try_lease", store.try_lease("k", "two", ttl))
                .await
                .unwrap(),
            "single flight locally"
        );
        quick("release_lease", store.release_lease("k", "one"))
            .await
            .unwrap();
        assert!(!store.healthy());
        for _ in 0..20 {
            quick("for_anchor", store.for_anchor("a")).await.unwrap();
        }

        server.restart(); // same port, empty data
        eventually(
            "healthy after redis returns",
            Duration::from_secs(10),
            || store.healthy(),
        )
        .await;
        let after = sample("b", 7, 3);
        store.put(&after).await.unwrap();
        let other = RedisStore::open(&server.url(), Duration::ZERO)
            .await
            .unwrap();
        assert!(other.healthy());
        assert_eq!(*other.for_anchor("b").await.unwrap(), vec![after]);
        assert_eq!(
            *other.for_anchor("a").await.unwrap(),
            vec![during],
            "outage writes are copied over"
        );
        assert_eq!(other.model_facts("m").await.unwrap(), facts);
    }

    #[tokio::test]
    async fn a_hanging_redis_costs_at_most_the_call_timeout() {
        let server = RedisServer::start();
        let store = RedisStore::open(&server.url(), Duration::ZERO)
            .await
            .unwrap();
        let cp = sample("a", 4, 1);
        store.put(&cp).await.unwrap();
        server.freeze(true);
        let started = Instant::now();
        assert_eq!(*store.for_anchor("a").await.unwrap(), vec![cp.clone()]);
        let took = started.elapsed();
        // Bounded by the call timeout; the margin is for a loaded machine's scheduling.
        assert!(
            took < CALL_TIMEOUT + Duration::from_millis(500),
            "first call took {took:?}"
        );
        assert!(!store.healthy());
        for _ in 0..10 {
            let started = Instant::now();
            store.put(&sample("a", 5, 2)).await.unwrap();
            store.for_anchor("a").await.unwrap();
            // A call that went to the frozen server would wait out the call timeout.
            assert!(
                started.elapsed() < CALL_TIMEOUT,
                "degraded calls skip redis"
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await; // the probe rebuilds the connection meanwhile
        server.freeze(false);
        eventually("healthy after redis thaws", Duration::from_secs(10), || {
            store.healthy()
        })
        .await;
        let other = RedisStore::open(&server.url(), Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(other.for_anchor("a").await.unwrap().len(), 2);
    }
}
