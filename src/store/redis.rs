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
//! Redis being down never makes a request fail or wait: see [`degraded`] for how calls are
//! bounded, served locally while Redis is away, and copied over when it returns.

mod degraded;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use quick_cache::sync::Cache;
use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Client, RedisError, Script};

use super::memory::MemoryStore;
use super::{
    is_fresh, without_expired, Checkpoint, CheckpointStore, ModelFacts, StoreError,
    CHECKPOINTS_PER_CONVERSATION,
};
use degraded::{probe, ListWeight, Pending, LOCAL_BYTES};

pub use degraded::CALL_TIMEOUT;

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

fn ttl_ms(ttl: Duration) -> u64 {
    ttl.as_millis().min(u64::MAX as u128) as u64
}

fn corrupt(e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(e.to_string())
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
                .map(|l| without_expired(l, s.ttl))
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
pub(crate) mod redis_server;

#[cfg(test)]
mod tests;
