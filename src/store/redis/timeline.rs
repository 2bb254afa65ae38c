//! Conversation timelines in Redis, shared by every replica.
//!
//! Keys:
//! - `compactor:{<anchor>}:timeline`: a list of the conversation's request rows (JSON), capped
//!   to the newest `requests_per_conversation`;
//! - `compactor:{<anchor>}:entry`: a hash of what the list shows of it (owner, first and last
//!   request times, counts, the newest row), updated with the rows in one script;
//! - `compactor:{timeline}:entries`: every conversation's entry as JSON, a copy the list reads
//!   in one call, and `compactor:{timeline}:index`, a sorted set of the same conversations by
//!   last activity, trimmed to `conversations` (the trimmed ones' keys are deleted); and
//!   `compactor:{timeline}:tenant:<tenant>`, the same per tenant, trimmed to
//!   `conversations_per_tenant` first.
//!
//! A conversation's two keys share its hash tag, and the list's two share theirs, so each
//! script touches one slot: the same calls work on a single server and on a cluster. With a
//! TTL, a conversation's keys expire that long after its newest request, like its checkpoints,
//! and the list forgets it then too.

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Duration;

use redis::{AsyncCommands, RedisError, RedisResult, Script};

use super::super::timeline::newest_first;
use super::super::{expiry_cutoff, ConversationEntry, Owner, RequestRow, TimelineBounds};
use super::connection::Connection;
use super::layout::ttl_ms;

const INDEX: &str = "compactor:{timeline}:index";
/// A tenant's index is this and the tenant's hash; under the list's hash tag, so the index
/// script may name another tenant's index it trims from (same slot).
const TENANT_INDEX_PREFIX: &str = "compactor:{timeline}:tenant:";
const ENTRIES: &str = "compactor:{timeline}:entries";

fn rows_key(id: &str) -> String {
    format!("compactor:{{{id}}}:timeline")
}
fn entry_key(id: &str) -> String {
    format!("compactor:{{{id}}}:entry")
}

/// KEYS: rows, entry. ARGV: row (JSON), owner (JSON), at_ms, checkpoint ('' for none), rows to
/// keep, ttl ms (0: none). As [`ConversationEntry::absorb`]: a new checkpoint counts as a
/// compaction, and a row served before the newest known is counted but does not become the last.
const RECORD_SCRIPT: &str = r#"
local rows, entry = KEYS[1], KEYS[2]
local row, owner, at, checkpoint = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local keep, ttl = tonumber(ARGV[5]), tonumber(ARGV[6])
local first = tonumber(redis.call('HGET', entry, 'first_ms') or '')
if (not first) or at < first then redis.call('HSET', entry, 'first_ms', ARGV[3]) end
redis.call('HSETNX', entry, 'owner', owner)
redis.call('HINCRBY', entry, 'requests', 1)
local last = tonumber(redis.call('HGET', entry, 'last_ms') or '0')
if at >= last then
  local previous = redis.call('HGET', entry, 'checkpoint') or ''
  if checkpoint ~= '' and checkpoint ~= previous then
    redis.call('HINCRBY', entry, 'compactions', 1)
  end
  redis.call('HSET', entry, 'last_ms', ARGV[3], 'checkpoint', checkpoint, 'last', row)
end
redis.call('RPUSH', rows, row)
redis.call('LTRIM', rows, -keep, -1)
if ttl > 0 then
  redis.call('PEXPIRE', rows, ttl)
  redis.call('PEXPIRE', entry, ttl)
end
return redis.call('HGETALL', entry)
"#;

/// KEYS: index, entries, the tenant's index. ARGV: id, last_ms, entry (JSON), conversations to
/// keep, the tenant's conversations to keep, the tenant index prefix. An entry older than the
/// one held (a replica that was slower to copy) is not written. Trims the tenant's index, then
/// the whole one (taking each trimmed conversation out of its tenant's index too). Returns the
/// ids of the conversations trimmed.
const INDEX_SCRIPT: &str = r#"
local index, entries, mine = KEYS[1], KEYS[2], KEYS[3]
local id, at, keep, keep_mine = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[4]), tonumber(ARGV[5])
local held = redis.call('ZSCORE', index, id)
if (not held) or tonumber(held) <= at then
  redis.call('ZADD', index, at, id)
  redis.call('ZADD', mine, at, id)
  redis.call('HSET', entries, id, ARGV[3])
end
local gone = {}
local m = redis.call('ZCARD', mine)
if m > keep_mine then
  for _, old in ipairs(redis.call('ZRANGE', mine, 0, m - keep_mine - 1)) do
    redis.call('ZREM', mine, old)
    redis.call('ZREM', index, old)
    redis.call('HDEL', entries, old)
    table.insert(gone, old)
  end
end
local n = redis.call('ZCARD', index)
if n > keep then
  for _, old in ipairs(redis.call('ZRANGE', index, 0, n - keep - 1)) do
    local body = redis.call('HGET', entries, old)
    local ok, entry = pcall(cjson.decode, body or '')
    if ok and type(entry) == 'table' and type(entry.tenant) == 'string' then
      redis.call('ZREM', ARGV[6] .. entry.tenant, old)
    end
    redis.call('ZREM', index, old)
    redis.call('HDEL', entries, old)
    table.insert(gone, old)
  end
end
return gone
"#;

static RECORD: LazyLock<Script> = LazyLock::new(|| Script::new(RECORD_SCRIPT));
static INDEX_UPDATE: LazyLock<Script> = LazyLock::new(|| Script::new(INDEX_SCRIPT));

fn encoding_error(e: serde_json::Error) -> RedisError {
    RedisError::from((
        redis::ErrorKind::TypeError,
        "timeline encoding",
        e.to_string(),
    ))
}

/// Where a row goes: its conversation, who owns it, and how much is kept for how long.
pub(super) struct Destination<'a> {
    pub id: &'a str,
    pub owner: &'a Owner,
    pub bounds: TimelineBounds,
    pub ttl: Duration,
}

/// Adds `row` to its conversation and trims the index to `bounds.conversations`.
pub(super) async fn record(
    conn: &mut Connection,
    to: &Destination<'_>,
    row: &RequestRow,
) -> RedisResult<()> {
    let Destination {
        id,
        owner,
        bounds,
        ttl,
    } = *to;
    let fields: HashMap<String, String> = RECORD
        .key(rows_key(id))
        .key(entry_key(id))
        .arg(serde_json::to_string(row).map_err(encoding_error)?)
        .arg(serde_json::to_string(owner).map_err(encoding_error)?)
        .arg(row.at_ms)
        .arg(row.checkpoint.as_deref().unwrap_or(""))
        .arg(bounds.requests_per_conversation.max(1))
        .arg(ttl_ms(ttl))
        .invoke_async(conn)
        .await?;
    let Some(entry) = entry(id, &fields) else {
        return Ok(());
    };
    let gone: Vec<String> = INDEX_UPDATE
        .key(INDEX)
        .key(ENTRIES)
        .key(format!("{TENANT_INDEX_PREFIX}{}", owner.tenant))
        .arg(id)
        .arg(entry.last_ms)
        .arg(serde_json::to_string(&entry).map_err(encoding_error)?)
        .arg(bounds.conversations.max(1))
        .arg(bounds.conversations_per_tenant.max(1))
        .arg(TENANT_INDEX_PREFIX)
        .invoke_async(conn)
        .await?;
    for id in gone {
        let _: i64 = conn.del(&[rows_key(&id), entry_key(&id)]).await?;
    }
    Ok(())
}

/// Every conversation still held, the most recently active first; those whose keys expired
/// under `ttl` are dropped from the list.
pub(super) async fn conversations(
    conn: &mut Connection,
    ttl: Duration,
) -> RedisResult<Vec<ConversationEntry>> {
    let held: HashMap<String, String> = conn.hgetall(ENTRIES).await?;
    let cutoff = expiry_cutoff(ttl).unwrap_or(0);
    let mut entries = Vec::with_capacity(held.len());
    for (id, body) in held {
        match serde_json::from_str::<ConversationEntry>(&body) {
            Ok(entry) if entry.last_ms >= cutoff => entries.push(entry),
            _ => {
                let _: i64 = conn.hdel(ENTRIES, &id).await?;
                let _: i64 = conn.zrem(INDEX, &id).await?;
            }
        }
    }
    Ok(newest_first(entries))
}

/// One conversation's entry and kept rows, oldest first.
pub(super) async fn timeline(
    conn: &mut Connection,
    id: &str,
) -> RedisResult<Option<(ConversationEntry, Vec<RequestRow>)>> {
    let fields: HashMap<String, String> = conn.hgetall(entry_key(id)).await?;
    let Some(entry) = entry(id, &fields) else {
        return Ok(None);
    };
    let bodies: Vec<String> = conn.lrange(rows_key(id), 0, -1).await?;
    let mut rows: Vec<RequestRow> = bodies
        .iter()
        .filter_map(|b| serde_json::from_str(b).ok())
        .collect();
    // Replicas record rows off the request's path, so the list holds them in the order their
    // writes reached Redis, which can differ from the order the requests were served in.
    rows.sort_by_key(|row| row.at_ms);
    Ok(Some((entry, rows)))
}

/// The entry a hash holds; `None` when it is gone or was written by something else.
fn entry(id: &str, fields: &HashMap<String, String>) -> Option<ConversationEntry> {
    let number = |name: &str| fields.get(name)?.parse::<u64>().ok();
    Some(ConversationEntry {
        id: id.to_string(),
        owner: serde_json::from_str(fields.get("owner")?).ok()?,
        first_ms: number("first_ms")?,
        last_ms: number("last_ms")?,
        requests: number("requests")?,
        compactions: number("compactions").unwrap_or(0),
        last: serde_json::from_str(fields.get("last")?).ok()?,
    })
}
