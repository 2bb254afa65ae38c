//! Redis store for team gateways: every replica behind the load balancer reads and writes the
//! same checkpoints, model facts and leases.
//!
//! Layout (all keys start with `compactor:`):
//! - `compactor:cp:{id}`: one checkpoint as JSON, expiring after the configured TTL;
//! - `compactor:conv:{anchor}`: sorted set of a conversation's checkpoints, score `covered`,
//!   member `{created_ms:020}:{id}`, so that reverse order is `covered` desc then `created` desc;
//!   trimmed to [`CHECKPOINTS_PER_CONVERSATION`] (trimmed checkpoints are deleted) and expiring
//!   with its newest checkpoint;
//! - `compactor:model:{model}`: learned [`ModelFacts`] as JSON, no expiry;
//! - `compactor:lease:{key}`: the holder of a lease, with `PX` expiry.
//!
//! Multi-key updates run as Lua scripts, so each call is atomic and costs one round trip. (The
//! scripts reach keys they compute, so this is for a single Redis or a primary with replicas, not
//! Redis Cluster.)
//!
//! Redis being down never makes a request fail or wait: every call is bounded by
//! [`CALL_TIMEOUT`]; the first failure marks the store degraded, after which calls skip Redis and
//! are served locally (a bounded in-process copy of recently seen conversations, plus a
//! [`MemoryStore`] for model facts and leases), so compaction keeps working without sharing and
//! single flight holds within the replica. A background probe pings Redis, reconnecting (and
//! rebuilding the connection when it hangs); when Redis answers again, what was written locally
//! meanwhile is copied to Redis and the store reports healthy again.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use quick_cache::sync::Cache;
use quick_cache::Weighter;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{AsyncCommands, Client, RedisError, Script};

use super::memory::MemoryStore;
use super::{
    insert_newest_first, Checkpoint, CheckpointStore, ModelFacts, StoreError,
    CHECKPOINTS_PER_CONVERSATION,
};

/// Longest any request-path Redis call may take before the store falls back to local state.
pub const CALL_TIMEOUT: Duration = Duration::from_millis(250);
/// Time allowed to establish a connection (at startup and when the probe rebuilds it).
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// How often the background probe pings Redis while it is healthy / while degraded.
const PROBE_HEALTHY: Duration = Duration::from_secs(2);
const PROBE_DEGRADED: Duration = Duration::from_millis(250);
/// Failed probes in a row after which the connection is rebuilt from scratch (covers a
/// connection that hangs instead of failing, which the connection manager does not replace).
const REBUILD_AFTER: u32 = 3;
/// Local copy of conversations, by approximate bytes.
const LOCAL_BYTES: u64 = 64 * 1024 * 1024;
/// Writes made while degraded that are copied to Redis on recovery (oldest dropped beyond this).
const PENDING_MAX: usize = 10_000;

const PREFIX: &str = "compactor:";

fn conv_key(anchor: &str) -> String {
    format!("{PREFIX}conv:{anchor}")
}
fn cp_prefix() -> String {
    format!("{PREFIX}cp:")
}
fn cp_key(id: &str) -> String {
    format!("{PREFIX}cp:{id}")
}
fn model_key(model: &str) -> String {
    format!("{PREFIX}model:{model}")
}
fn lease_key(key: &str) -> String {
    format!("{PREFIX}lease:{key}")
}
/// Sorted-set member: zero-padded creation time (so ties on `covered` order by time), then id.
fn member(checkpoint: &Checkpoint) -> String {
    format!("{:020}:{}", checkpoint.created_ms, checkpoint.id)
}

/// KEYS: conversation set, checkpoint key. ARGV: body, covered, member, id, ttl ms (0: none),
/// how many to keep, checkpoint key prefix. Members are `{20 digits}:{id}`, so the id starts at 22.
const PUT_SCRIPT: &str = r#"
local conv, ttl, keep = KEYS[1], tonumber(ARGV[5]), tonumber(ARGV[6])
for _, m in ipairs(redis.call('ZRANGE', conv, 0, -1)) do
  if m ~= ARGV[3] and string.sub(m, 22) == ARGV[4] then redis.call('ZREM', conv, m) end
end
if ttl > 0 then
  redis.call('SET', KEYS[2], ARGV[1], 'PX', ttl)
else
  redis.call('SET', KEYS[2], ARGV[1])
end
redis.call('ZADD', conv, ARGV[2], ARGV[3])
local n = redis.call('ZCARD', conv)
if n > keep then
  for _, m in ipairs(redis.call('ZRANGE', conv, 0, n - keep - 1)) do
    redis.call('DEL', ARGV[7] .. string.sub(m, 22))
  end
  redis.call('ZREMRANGEBYRANK', conv, 0, n - keep - 1)
end
if ttl > 0 then redis.call('PEXPIRE', conv, ttl) end
return 1
"#;

/// KEYS: conversation set. ARGV: how many, checkpoint key prefix. Returns bodies newest first.
const LIST_SCRIPT: &str = r#"
local out = {}
for _, m in ipairs(redis.call('ZREVRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)) do
  local body = redis.call('GET', ARGV[2] .. string.sub(m, 22))
  if body then out[#out + 1] = body end
end
return out
"#;

/// KEYS: lease. ARGV: holder, ttl ms. Same holder renews; anyone else waits for expiry.
const LEASE_SCRIPT: &str = r#"
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if current then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"#;

/// KEYS: lease. ARGV: holder. Deletes only if `holder` still has it.
const RELEASE_SCRIPT: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"#;

pub struct RedisStore {
    shared: Arc<Shared>,
}

struct Shared {
    client: Client,
    /// `None` until the first connection succeeds.
    manager: RwLock<Option<ConnectionManager>>,
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
}

struct Scripts {
    put: Script,
    list: Script,
    lease: Script,
    release: Script,
}

#[derive(Default)]
struct Pending {
    checkpoints: VecDeque<Checkpoint>,
    facts: HashMap<String, ModelFacts>,
}

#[derive(Clone)]
struct ListWeight;

impl Weighter<String, Arc<Vec<Checkpoint>>> for ListWeight {
    fn weight(&self, key: &String, list: &Arc<Vec<Checkpoint>>) -> u64 {
        let body: usize = list.iter().map(|c| c.summary.len() + 512).sum();
        (key.len() + body + 64) as u64
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn ttl_ms(ttl: Duration) -> u64 {
    ttl.as_millis().min(u64::MAX as u128) as u64
}

fn corrupt(e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(e.to_string())
}

/// What went wrong with a Redis call, for the log (never the URL, which may hold a password).
enum Failure {
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

impl RedisStore {
    /// Connects to `url` (`redis://[user][:password@]host[:port][/db]`). An unparsable URL is an
    /// error; an unreachable server is not: the store starts degraded and connects in the
    /// background. Checkpoints expire after `ttl` (zero: never).
    pub async fn open(url: &str, ttl: Duration) -> Result<RedisStore, StoreError> {
        let client = Client::open(url).map_err(|e| {
            if url.starts_with("rediss://") {
                StoreError::Unavailable(
                    "rediss:// (TLS) is not supported by this build; use redis://".into(),
                )
            } else {
                // The error's category only: a parse error must not echo the URL (and its password).
                StoreError::Unavailable(format!("invalid redis URL ({:?})", e.kind()))
            }
        })?;
        let address = client.get_connection_info().addr.to_string();
        let shared = Arc::new(Shared {
            client,
            manager: RwLock::new(None),
            healthy: AtomicBool::new(false),
            ttl,
            scripts: Scripts {
                put: Script::new(PUT_SCRIPT),
                list: Script::new(LIST_SCRIPT),
                lease: Script::new(LEASE_SCRIPT),
                release: Script::new(RELEASE_SCRIPT),
            },
            conversations: Cache::with_weighter(16_384, LOCAL_BYTES, ListWeight),
            local_writes: Mutex::new(()),
            local: MemoryStore::default(),
            pending: Mutex::new(Pending::default()),
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
        Ok(RedisStore { shared })
    }
}

impl Shared {
    /// Builds a fresh connection manager and swaps it in.
    async fn connect(&self) -> Result<(), Failure> {
        let config = ConnectionManagerConfig::new()
            // One attempt per (re)connect, no backoff: the manager's backoff starts at a full
            // second and grows by `factor`, which would hold a returning Redis off for minutes.
            // Instead the probe triggers a fresh attempt on each tick while degraded.
            .set_number_of_retries(0)
            .set_connection_timeout(CONNECT_TIMEOUT)
            .set_response_timeout(CALL_TIMEOUT);
        let manager = tokio::time::timeout(
            CONNECT_TIMEOUT * 2,
            ConnectionManager::new_with_config(self.client.clone(), config),
        )
        .await
        .map_err(|_| Failure::Timeout)?
        .map_err(Failure::Redis)?;
        *self.manager.write().unwrap_or_else(|p| p.into_inner()) = Some(manager);
        Ok(())
    }

    fn manager(&self) -> Option<ConnectionManager> {
        self.manager
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::SeqCst)
    }

    /// Runs `op` against Redis within [`CALL_TIMEOUT`]. `None` (and the store degraded) when Redis
    /// is already known to be down, or fails now.
    async fn call<T, F, Fut>(&self, op: &'static str, f: F) -> Option<T>
    where
        F: FnOnce(ConnectionManager) -> Fut,
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

    async fn try_call<T, F, Fut>(&self, f: F) -> Result<T, Failure>
    where
        F: FnOnce(ConnectionManager) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        let manager = self.manager().ok_or(Failure::NotConnected)?;
        match tokio::time::timeout(CALL_TIMEOUT, f(manager)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(Failure::Redis(e)),
            Err(_) => Err(Failure::Timeout),
        }
    }

    fn degrade(&self, op: &'static str, failure: &Failure) {
        if self.healthy.swap(false, Ordering::SeqCst) {
            tracing::warn!(
                store = "redis",
                op,
                error = %failure,
                "checkpoint store degraded: redis unavailable; serving from local memory without \
                 sharing until it returns"
            );
        }
    }

    fn remember(&self, checkpoint: &Checkpoint) {
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

    /// Drops expired checkpoints from a locally kept list.
    fn fresh(&self, list: Arc<Vec<Checkpoint>>) -> Arc<Vec<Checkpoint>> {
        if self.ttl.is_zero() {
            return list;
        }
        let cutoff = now_ms().saturating_sub(ttl_ms(self.ttl));
        if list.iter().all(|c| c.created_ms >= cutoff) {
            return list;
        }
        Arc::new(
            list.iter()
                .filter(|c| c.created_ms >= cutoff)
                .cloned()
                .collect(),
        )
    }

    /// Queues a write for Redis unless the store has become healthy meanwhile (then `false`: the
    /// caller writes to Redis itself). Checked under the lock the probe takes to flip health, so
    /// nothing queued is left behind.
    fn queue(&self, item: impl FnOnce(&mut Pending)) -> bool {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if self.is_healthy() {
            return false;
        }
        item(&mut pending);
        while pending.checkpoints.len() > PENDING_MAX {
            pending.checkpoints.pop_front();
        }
        true
    }

    async fn redis_put(
        &self,
        manager: &mut ConnectionManager,
        checkpoint: &Checkpoint,
    ) -> Result<(), RedisError> {
        let body = serde_json::to_string(checkpoint).map_err(|e| {
            RedisError::from((
                redis::ErrorKind::TypeError,
                "checkpoint encoding",
                e.to_string(),
            ))
        })?;
        self.scripts
            .put
            .key(conv_key(&checkpoint.anchor))
            .key(cp_key(&checkpoint.id))
            .arg(body)
            .arg(checkpoint.covered as u64)
            .arg(member(checkpoint))
            .arg(&checkpoint.id)
            .arg(ttl_ms(self.ttl))
            .arg(CHECKPOINTS_PER_CONVERSATION)
            .arg(cp_prefix())
            .invoke_async(manager)
            .await
    }

    async fn redis_put_facts(
        manager: &mut ConnectionManager,
        model: &str,
        facts: ModelFacts,
    ) -> Result<(), RedisError> {
        let body = serde_json::to_string(&facts).map_err(|e| {
            RedisError::from((redis::ErrorKind::TypeError, "facts encoding", e.to_string()))
        })?;
        manager.set(model_key(model), body).await
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
            let facts = batch.facts[&model];
            let name = model.as_str();
            self.try_call(|mut m| async move { Self::redis_put_facts(&mut m, name, facts).await })
                .await?;
            batch.facts.remove(&model);
        }
        Ok(())
    }
}

/// Keeps the connection alive and the health flag true to Redis; ends with the store.
async fn probe(shared: Weak<Shared>) {
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

fn decode(body: &str) -> Result<Checkpoint, StoreError> {
    serde_json::from_str(body).map_err(corrupt)
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
                s.scripts
                    .list
                    .key(conv_key(anchor))
                    .arg(CHECKPOINTS_PER_CONVERSATION)
                    .arg(cp_prefix())
                    .invoke_async::<Vec<String>>(&mut m)
                    .await
            })
            .await;
        match bodies {
            Some(bodies) => {
                let list = Arc::new(
                    bodies
                        .iter()
                        .map(|b| decode(b))
                        .collect::<Result<Vec<_>, _>>()?,
                );
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
                .map(|l| s.fresh(l))
                .unwrap_or_default()),
        }
    }

    async fn get(&self, id: &str) -> Result<Option<Checkpoint>, StoreError> {
        let s = &self.shared;
        let body = s
            .call("get", |mut m| async move {
                m.get::<_, Option<String>>(cp_key(id)).await
            })
            .await;
        match body {
            Some(body) => body.as_deref().map(decode).transpose(),
            None => Ok(s
                .conversations
                .iter()
                .find_map(|(_, list)| list.iter().find(|c| c.id == id).cloned())
                .filter(|c| {
                    s.ttl.is_zero() || c.created_ms >= now_ms().saturating_sub(ttl_ms(s.ttl))
                })),
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
                s.local.put_model_facts(model, facts).await?;
                Ok(facts)
            }
            Some(None) => Ok(ModelFacts::default()),
            None => s.local.model_facts(model).await,
        }
    }

    async fn put_model_facts(&self, model: &str, facts: ModelFacts) -> Result<(), StoreError> {
        let s = &self.shared;
        s.local.put_model_facts(model, facts).await?;
        loop {
            let stored = s
                .call("put_model_facts", |mut m| async move {
                    Shared::redis_put_facts(&mut m, model, facts).await
                })
                .await;
            if stored.is_some()
                || s.queue(|p| {
                    p.facts.insert(model.to_string(), facts);
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
                s.scripts
                    .lease
                    .key(lease_key(key))
                    .arg(holder)
                    .arg(ms)
                    .invoke_async::<i64>(&mut m)
                    .await
            })
            .await;
        match taken {
            Some(1) => {
                // Mirror it locally, so that single flight within this replica survives Redis
                // going away before the lease is released.
                s.local.try_lease(key, holder, ttl).await?;
                Ok(true)
            }
            Some(_) => Ok(false),
            None => s.local.try_lease(key, holder, ttl).await,
        }
    }

    async fn release_lease(&self, key: &str, holder: &str) -> Result<(), StoreError> {
        let s = &self.shared;
        s.local.release_lease(key, holder).await?;
        s.call("release_lease", |mut m| async move {
            s.scripts
                .release
                .key(lease_key(key))
                .arg(holder)
                .invoke_async::<i64>(&mut m)
                .await
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

    fn healthy(&self) -> bool {
        self.shared.is_healthy()
    }

    fn kind(&self) -> &'static str {
        "redis"
    }
}

// Shared with the integration tests, which start real servers the same way.
#[cfg(test)]
#[path = "../../tests/common/redis_server.rs"]
mod redis_server;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    use super::super::contract::{check, sample};

    use super::redis_server::RedisServer;

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
    async fn meets_the_store_contract() {
        let server = RedisServer::start();
        let store = RedisStore::open(&server.url(), Duration::ZERO)
            .await
            .unwrap();
        assert!(store.healthy());
        check(&store).await;
        assert!(store.healthy());
    }

    #[tokio::test]
    async fn bad_urls_are_refused_without_echoing_them() {
        let Err(e) = RedisStore::open("redis://:secret@[nope", Duration::ZERO).await else {
            panic!("accepted")
        };
        assert!(!e.to_string().contains("secret"), "{e}");
        assert!(
            RedisStore::open("rediss://:secret@localhost/", Duration::ZERO)
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn replicas_share_checkpoints_facts_and_leases() {
        let server = RedisServer::start();
        let one = RedisStore::open(&server.url(), Duration::from_secs(3600))
            .await
            .unwrap();
        let two = RedisStore::open(&server.url(), Duration::from_secs(3600))
            .await
            .unwrap();
        let cp = sample("a", 5, now_ms());
        one.put(&cp).await.unwrap();
        assert_eq!(*two.for_anchor("a").await.unwrap(), vec![cp.clone()]);
        assert_eq!(two.get(&cp.id).await.unwrap(), Some(cp));
        let facts = ModelFacts {
            window: Some(8192),
            calibration: None,
        };
        two.put_model_facts("m", facts).await.unwrap();
        assert_eq!(one.model_facts("m").await.unwrap(), facts);

        let ttl = Duration::from_secs(30);
        assert!(one.try_lease("conv", "r1", ttl).await.unwrap());
        assert!(!two.try_lease("conv", "r2", ttl).await.unwrap());
        one.release_lease("conv", "r1").await.unwrap();
        assert!(two.try_lease("conv", "r2", ttl).await.unwrap());
    }

    #[tokio::test]
    async fn trimmed_checkpoints_are_deleted_and_keys_expire() {
        let server = RedisServer::start();
        let store = RedisStore::open(&server.url(), Duration::from_millis(400))
            .await
            .unwrap();
        for i in 0..12 {
            store
                .put(&sample("c", i, now_ms() + i as u64))
                .await
                .unwrap();
        }
        let list = store.for_anchor("c").await.unwrap();
        assert_eq!(
            list.iter().map(|c| c.covered).collect::<Vec<_>>(),
            (4..12).rev().collect::<Vec<_>>()
        );
        let client = Client::open(server.url()).unwrap();
        let mut raw = client.get_multiplexed_async_connection().await.unwrap();
        let keys: Vec<String> = raw.keys("compactor:cp:*").await.unwrap();
        assert_eq!(keys.len(), CHECKPOINTS_PER_CONVERSATION);
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(store.for_anchor("c").await.unwrap().is_empty());
        let keys: Vec<String> = raw.keys("compactor:*").await.unwrap();
        assert!(keys.is_empty(), "left behind: {keys:?}");
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
                    calibration: None,
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
            calibration: Some(1.2),
        };
        quick("put_model_facts", store.put_model_facts("m", facts))
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
        assert!(
            took < CALL_TIMEOUT + Duration::from_millis(150),
            "first call took {took:?}"
        );
        assert!(!store.healthy());
        for _ in 0..10 {
            let started = Instant::now();
            store.put(&sample("a", 5, 2)).await.unwrap();
            store.for_anchor("a").await.unwrap();
            assert!(
                started.elapsed() < Duration::from_millis(50),
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

    /// Quick timing against the SQLite store (µs per call, averaged over 1000 calls):
    /// `cargo test --release --lib store::redis::tests::latency -- --ignored --nocapture`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "timing report, not a test"]
    async fn latency_against_sqlite() {
        const N: usize = 1000;
        async fn per_call<F: Future>(mut f: impl FnMut(usize) -> F) -> f64 {
            let started = Instant::now();
            for i in 0..N {
                f(i).await;
            }
            started.elapsed().as_secs_f64() * 1e6 / N as f64
        }
        let server = RedisServer::start();
        let redis = RedisStore::open(&server.url(), Duration::from_secs(3600))
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let sqlite = super::super::sqlite::SqliteStore::open(
            &dir.path().join("t.db"),
            Duration::from_secs(3600),
        )
        .unwrap();
        let stores: [(&str, &dyn CheckpointStore); 2] = [("redis", &redis), ("sqlite", &sqlite)];
        for (name, store) in stores {
            let base = now_ms();
            // 100 conversations with 8 checkpoints each (after trimming), 100 with one.
            let put = per_call(|i| async move {
                store
                    .put(&sample(&format!("full{}", i % 100), i, base + i as u64))
                    .await
                    .unwrap()
            })
            .await;
            for i in 0..100 {
                store
                    .put(&sample(&format!("one{i}"), 3, base))
                    .await
                    .unwrap();
            }
            let hit8 = per_call(|i| async move {
                assert_eq!(
                    store
                        .for_anchor(&format!("full{}", i % 100))
                        .await
                        .unwrap()
                        .len(),
                    8
                )
            })
            .await;
            let hit1 = per_call(|i| async move {
                assert_eq!(
                    store
                        .for_anchor(&format!("one{}", i % 100))
                        .await
                        .unwrap()
                        .len(),
                    1
                )
            })
            .await;
            let miss = per_call(|i| async move {
                assert!(store
                    .for_anchor(&format!("none{i}"))
                    .await
                    .unwrap()
                    .is_empty())
            })
            .await;
            store
                .put_model_facts(
                    "m",
                    ModelFacts {
                        window: Some(1),
                        calibration: None,
                    },
                )
                .await
                .unwrap();
            let facts = per_call(|_| async { store.model_facts("m").await.unwrap() }).await;
            println!(
                "{name:>6}: put {put:6.1}  for_anchor 8 checkpoints {hit8:6.1}, 1 checkpoint {hit1:6.1}, \
                 none {miss:6.1}  model_facts {facts:6.1}  (µs per call)"
            );
        }
    }
}
