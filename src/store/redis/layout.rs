//! Where the Redis store keeps things: key names, and the commands and scripts that read and
//! change them, laid out so that the same calls work on a single server and on a Redis Cluster.
//!
//! Keys (all start with `compactor:`):
//! - `compactor:{<anchor>}:checkpoints`: hash of a conversation's checkpoints, id → JSON;
//! - `compactor:{<anchor>}:order`: sorted set of the same checkpoints, score `covered`, member
//!   `{created_ms:020}:{id}`, so that trimming to [`CHECKPOINTS_PER_CONVERSATION`] drops the
//!   lowest `covered` (oldest on ties);
//! - `compactor:id:<id>`: the anchor of checkpoint `<id>`, to find it by id alone;
//! - `compactor:model:<model>`: learned [`ModelFacts`] as JSON, expiring when they lapse
//!   ([`ModelFacts::expires_ms`]);
//! - `compactor:lease:<key>`: the holder of a lease, with `PX` expiry;
//! - `compactor:secret:<name>`: a secret the replicas share (written once, `SET NX`; no expiry).
//!
//! The `{<anchor>}` hash tag puts a conversation's two keys in one cluster slot, so the script
//! that updates them (declaring both in `KEYS`, touching nothing else) runs atomically in one
//! round trip on either deployment. Everything else is a single-key command. With a TTL, a
//! conversation's keys expire that long after its newest write, and checkpoints created longer
//! ago than the TTL are dropped on write and never returned.
//!
//! The previous layout (`compactor:conv:<anchor>` and `compactor:cp:<id>`, single server only) is
//! read by [`legacy`], which moves such checkpoints into this layout.

use std::time::Duration;

use redis::{AsyncCommands, RedisResult, Script};

use super::super::{expiry_cutoff, Checkpoint, StoreError, CHECKPOINTS_PER_CONVERSATION};
use super::connection::Connection;

fn order_key(anchor: &str) -> String {
    format!("compactor:{{{anchor}}}:order")
}
fn checkpoints_key(anchor: &str) -> String {
    format!("compactor:{{{anchor}}}:checkpoints")
}
fn id_key(id: &str) -> String {
    format!("compactor:id:{id}")
}
pub(super) fn model_key(model: &str) -> String {
    format!("compactor:model:{model}")
}
pub(super) fn lease_key(key: &str) -> String {
    format!("compactor:lease:{key}")
}
pub(super) fn secret_key(name: &str) -> String {
    format!("compactor:secret:{name}")
}
/// Sorted-set member: zero-padded creation time (so ties on `covered` order by time), then id.
fn member(checkpoint: &Checkpoint) -> String {
    format!("{:020}:{}", checkpoint.created_ms, checkpoint.id)
}

/// KEYS: order, checkpoints. ARGV: body, covered, member, id, ttl ms (0: none), how many to
/// keep, cutoff (creation time in ms below which checkpoints have expired; 0: none).
/// Members are `{20 digits}:{id}`, so the id starts at 22. Returns the ids it removed.
const PUT_SCRIPT: &str = r#"
local order, checkpoints = KEYS[1], KEYS[2]
local id, ttl, keep, cutoff = ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local removed = {}
local function drop(m)
  redis.call('ZREM', order, m)
  local other = string.sub(m, 22)
  if other ~= id then
    redis.call('HDEL', checkpoints, other)
    removed[#removed + 1] = other
  end
end
for _, m in ipairs(redis.call('ZRANGE', order, 0, -1)) do
  if (m ~= ARGV[3] and string.sub(m, 22) == id) or tonumber(string.sub(m, 1, 20)) < cutoff then
    drop(m)
  end
end
redis.call('HSET', checkpoints, id, ARGV[1])
redis.call('ZADD', order, ARGV[2], ARGV[3])
local n = redis.call('ZCARD', order)
if n > keep then
  for _, m in ipairs(redis.call('ZRANGE', order, 0, n - keep - 1)) do drop(m) end
end
if ttl > 0 then
  redis.call('PEXPIRE', order, ttl)
  redis.call('PEXPIRE', checkpoints, ttl)
end
return removed
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

/// The layout's scripts (each sent by hash once loaded).
pub(super) struct Scripts {
    put: Script,
    lease: Script,
    release: Script,
}

impl Default for Scripts {
    fn default() -> Scripts {
        Scripts {
            put: Script::new(PUT_SCRIPT),
            lease: Script::new(LEASE_SCRIPT),
            release: Script::new(RELEASE_SCRIPT),
        }
    }
}

pub(super) fn ttl_ms(ttl: Duration) -> u64 {
    ttl.as_millis().min(u64::MAX as u128) as u64
}

/// Creation time (ms) before which a checkpoint has expired; 0 without a TTL.
fn cutoff_ms(ttl: Duration) -> u64 {
    expiry_cutoff(ttl).unwrap_or(0)
}

fn encoding_error(e: serde_json::Error) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::TypeError,
        "checkpoint encoding",
        e.to_string(),
    ))
}

impl Scripts {
    /// Stores a checkpoint, trims its conversation, and indexes it by id.
    pub(super) async fn put(
        &self,
        conn: &mut Connection,
        checkpoint: &Checkpoint,
        ttl: Duration,
    ) -> RedisResult<()> {
        let body = serde_json::to_string(checkpoint).map_err(encoding_error)?;
        let ttl = ttl_ms(ttl);
        let removed: Vec<String> = self
            .put
            .key(order_key(&checkpoint.anchor))
            .key(checkpoints_key(&checkpoint.anchor))
            .arg(body)
            .arg(checkpoint.covered as u64)
            .arg(member(checkpoint))
            .arg(&checkpoint.id)
            .arg(ttl)
            .arg(CHECKPOINTS_PER_CONVERSATION)
            .arg(cutoff_ms(Duration::from_millis(ttl)))
            .invoke_async(conn)
            .await?;
        // The id index lives in the id's own slot, so it is written apart from the script.
        let index = id_key(&checkpoint.id);
        if ttl > 0 {
            conn.pset_ex::<_, _, ()>(index, &checkpoint.anchor, ttl)
                .await?;
        } else {
            conn.set::<_, _, ()>(index, &checkpoint.anchor).await?;
        }
        if !removed.is_empty() {
            let keys: Vec<String> = removed.iter().map(|id| id_key(id)).collect();
            conn.del::<_, ()>(keys).await?;
        }
        Ok(())
    }

    /// Takes the lease for `holder` unless someone else has it.
    pub(super) async fn lease(
        &self,
        conn: &mut Connection,
        key: &str,
        holder: &str,
        ttl_millis: u64,
    ) -> RedisResult<bool> {
        let taken: i64 = self
            .lease
            .key(lease_key(key))
            .arg(holder)
            .arg(ttl_millis)
            .invoke_async(conn)
            .await?;
        Ok(taken == 1)
    }

    /// Gives the lease back if `holder` still has it.
    pub(super) async fn release(
        &self,
        conn: &mut Connection,
        key: &str,
        holder: &str,
    ) -> RedisResult<()> {
        self.release
            .key(lease_key(key))
            .arg(holder)
            .invoke_async::<i64>(conn)
            .await
            .map(drop)
    }
}

/// The stored bodies of a conversation's checkpoints, in no particular order (see [`arrange`]).
pub(super) async fn conversation(conn: &mut Connection, anchor: &str) -> RedisResult<Vec<String>> {
    conn.hvals(checkpoints_key(anchor)).await
}

/// The stored body of checkpoint `id`, found through the id index.
pub(super) async fn checkpoint(conn: &mut Connection, id: &str) -> RedisResult<Option<String>> {
    let anchor: Option<String> = conn.get(id_key(id)).await?;
    match anchor {
        Some(anchor) => conn.hget(checkpoints_key(&anchor), id).await,
        None => Ok(None),
    }
}

/// Decodes stored bodies into a conversation's list: unexpired, newest first (most covered,
/// then most recent).
pub(super) fn arrange(bodies: &[String], ttl: Duration) -> Result<Vec<Checkpoint>, StoreError> {
    let cutoff = cutoff_ms(ttl);
    let mut list = bodies
        .iter()
        .map(|b| decode(b))
        .collect::<Result<Vec<_>, _>>()?;
    list.retain(|c| c.created_ms >= cutoff);
    list.sort_by(|a, b| {
        b.covered
            .cmp(&a.covered)
            .then(b.created_ms.cmp(&a.created_ms))
    });
    list.truncate(CHECKPOINTS_PER_CONVERSATION);
    Ok(list)
}

pub(super) fn decode(body: &str) -> Result<Checkpoint, StoreError> {
    serde_json::from_str(body).map_err(|e| StoreError::Corrupt(e.to_string()))
}

/// Moves one conversation from the legacy layout into this one (unexpired checkpoints only);
/// returns whether the legacy layout had it.
pub(super) async fn migrate(
    conn: &mut Connection,
    scripts: &Scripts,
    anchor: &str,
    ttl: Duration,
) -> RedisResult<bool> {
    let (bodies, keys) = legacy::conversation(conn, anchor).await?;
    if keys.is_empty() {
        return Ok(false);
    }
    let cutoff = cutoff_ms(ttl);
    // An entry that no longer decodes is dropped with its key: it could never be served.
    for checkpoint in bodies.iter().filter_map(|b| decode(b).ok()) {
        if checkpoint.created_ms >= cutoff {
            scripts.put(conn, &checkpoint, ttl).await?;
        }
    }
    legacy::remove(conn, keys).await?;
    Ok(true)
}

/// Moves every conversation still in the legacy layout; returns how many there were.
pub(super) async fn migrate_all(
    conn: &mut Connection,
    scripts: &Scripts,
    ttl: Duration,
) -> RedisResult<usize> {
    let anchors = legacy::anchors(conn).await?;
    for anchor in &anchors {
        migrate(conn, scripts, anchor, ttl).await?;
    }
    Ok(anchors.len())
}

/// The layout before cluster support: `compactor:conv:<anchor>` (sorted set, members
/// `{created_ms:020}:{id}`) and `compactor:cp:<id>` (the checkpoint's JSON). It only ever worked
/// on a single server, so it is read on single servers only.
pub(super) mod legacy {
    use redis::{AsyncCommands, AsyncIter, RedisResult};

    use super::Connection;

    const CONVERSATION_PREFIX: &str = "compactor:conv:";

    fn conversation_key(anchor: &str) -> String {
        format!("{CONVERSATION_PREFIX}{anchor}")
    }
    fn checkpoint_key(id: &str) -> String {
        format!("compactor:cp:{id}")
    }

    /// The bodies of a conversation kept in the old layout (newest first) and the keys holding
    /// them, to delete once they are stored anew.
    pub async fn conversation(
        conn: &mut Connection,
        anchor: &str,
    ) -> RedisResult<(Vec<String>, Vec<String>)> {
        let conversation = conversation_key(anchor);
        let members: Vec<String> = conn.zrevrange(&conversation, 0, -1).await?;
        if members.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        let mut keys: Vec<String> = members
            .iter()
            .filter_map(|m| m.get(21..))
            .map(checkpoint_key)
            .collect();
        let bodies: Vec<Option<String>> = redis::cmd("MGET").arg(&keys).query_async(conn).await?;
        keys.push(conversation);
        Ok((bodies.into_iter().flatten().collect(), keys))
    }

    /// One checkpoint's body by id, if the old layout has it.
    pub async fn checkpoint(conn: &mut Connection, id: &str) -> RedisResult<Option<String>> {
        conn.get(checkpoint_key(id)).await
    }

    /// Anchors of every conversation still in the old layout.
    pub async fn anchors(conn: &mut Connection) -> RedisResult<Vec<String>> {
        let mut keys: AsyncIter<String> =
            conn.scan_match(format!("{CONVERSATION_PREFIX}*")).await?;
        let mut anchors = Vec::new();
        while let Some(key) = keys.next_item().await {
            if let Some(anchor) = key.strip_prefix(CONVERSATION_PREFIX) {
                anchors.push(anchor.to_string());
            }
        }
        Ok(anchors)
    }

    pub async fn remove(conn: &mut Connection, keys: Vec<String>) -> RedisResult<()> {
        conn.del(keys).await
    }
}
