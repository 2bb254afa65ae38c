//! Where checkpoints and learned model facts live.
//!
//! [`CheckpointStore`] is the one interface; [`memory`] keeps everything in-process (tests),
//! [`sqlite`] is the embedded default that survives restarts, and [`redis`] is shared by the
//! replicas of a team gateway. Each also keeps the bounded [`timeline`] of every conversation's
//! requests (metadata only), which the conversation page reads. Checkpoints are looked up by conversation anchor, which is already
//! seeded with the tenant, so a store never needs to filter by tenant to stay isolated.
//! Model facts are keyed by a name the client chooses, so every store bounds what it holds of
//! them in memory (`MODEL_FACTS_IN_MEMORY`) and forgets them when they lapse
//! ([`ModelFacts::expires_ms`]); the SQLite file also keeps at most `MODEL_FACTS_ROWS` models.

mod lease;
pub mod memory;
pub mod redis;
pub mod sqlite;
mod sqlite_file;
mod sqlite_timeline;
pub mod timeline;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

pub use timeline::{ConversationEntry, Owner, RequestRow, TimelineBounds};

/// Models whose facts a store keeps in memory; beyond this the least recently used are dropped
/// from memory (not from the store). Client-chosen model names must not grow memory unbounded.
pub(crate) const MODEL_FACTS_IN_MEMORY: usize = 4096;

/// Models whose facts the SQLite file keeps; beyond this the least recently saved are deleted.
/// Redis needs no such bound: each model's key expires on its own.
pub(crate) const MODEL_FACTS_ROWS: usize = 10_000;

/// How many checkpoints are kept per conversation; older ones can no longer be the newest match
/// of a growing conversation.
pub const CHECKPOINTS_PER_CONVERSATION: usize = 8;

/// A stored summary of a conversation prefix.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Public identifier (hex), unique per checkpoint.
    pub id: String,
    /// Hash of the tenant's credential (hex); never the credential itself.
    pub tenant: String,
    /// The conversation's anchor (hex).
    pub anchor: String,
    /// Messages `[0..covered)` are represented by this checkpoint: instruction messages stay,
    /// `pinned_user` stays, everything else is replaced by the summary.
    pub covered: usize,
    /// Chain hash `h[covered-1]` (hex): the checkpoint applies to requests that share it.
    pub prefix_hash: String,
    /// A user message inside the covered span kept verbatim after the summary (the current turn's
    /// request, when that turn itself had to be split).
    pub pinned_user: Option<usize>,
    /// Kept messages whose content is cut in the middle to fit.
    pub truncations: Vec<Truncation>,
    pub summary: String,
    pub files_read: Vec<String>,
    pub files_modified: Vec<String>,
    /// Prompt tokens of the request that was compacted, before and after.
    pub tokens_before: u64,
    pub tokens_after: u64,
    /// Milliseconds since the Unix epoch.
    pub created_ms: u64,
    pub model: String,
    /// Whether this checkpoint was prepared ahead of time (in the background).
    #[serde(default)]
    pub ahead_of_time: bool,
    /// Tool results past `covered` replaced by one-line stubs, with no model call: cleared on
    /// every request through this checkpoint. `None` for a summary; a checkpoint of clearing
    /// alone (nothing summarized yet) covers nothing (`covered` 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleared: Option<Cleared>,
}

/// What a checkpoint clears of the verbatim part of its conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cleared {
    /// Chain hash of the last element a cleared result is in (hex): the clearing applies to
    /// requests that share it, so an edited history is never cleared by an old plan.
    pub through_hash: String,
    /// The results cleared, oldest first.
    pub results: Vec<ClearedUse>,
}

impl Cleared {
    /// The last element a cleared result is in.
    pub fn through(&self) -> Option<usize> {
        self.results.iter().map(|r| r.index).max()
    }
}

/// One tool result replaced by its stub.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClearedUse {
    /// The element that carries the result.
    pub index: usize,
    /// The id of the call it answers.
    pub call_id: String,
    /// The one line the model reads in its place.
    pub stub: String,
    /// Raw tokens the stub saves.
    pub freed_tokens: u64,
}

/// A kept message shortened to at most `keep_tokens` of content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Truncation {
    pub index: usize,
    pub keep_tokens: u64,
}

/// One accepted prompt, our count against the provider's: what the token-count correction is
/// estimated from (`measure::calibration`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observation {
    /// Our raw count of the prompt sent.
    pub counted: u64,
    /// The provider's count of it (`usage.prompt_tokens`).
    pub reported: u64,
    /// Who sent it: a tag derived from the tenant's hash, only ever compared for equality.
    pub tenant: u64,
    /// When it was seen (ms since the Unix epoch).
    pub at_ms: u64,
}

/// An upper bound on a model's window (`measure::windows`): a prompt of `tokens` (the provider's likely count of it,
/// with the output budget the client asked for) was refused as too long, and the error did not
/// say what the window is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowBound {
    /// Whose request it was: a tag derived from the tenant's hash, only compared for equality.
    pub tenant: u64,
    pub tokens: u64,
    /// When it was learned (ms since the Unix epoch).
    pub at_ms: u64,
}

/// What was learned about a model from its provider.
///
/// Rows written by earlier versions stay readable: every field added since is optional, and
/// their single `calibration` factor (which one request could set for everyone) is ignored.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ModelFacts {
    /// The real window, as the provider stated it in an overflow error (or raised by a larger
    /// prompt that was accepted).
    pub window: Option<u64>,
    /// When `window` was learned (ms since the Unix epoch); it is believed for the facts' TTL.
    #[serde(default)]
    pub window_learned_ms: Option<u64>,
    /// Upper bounds on the window from overflow errors that stated none, at most one per
    /// tenant.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub window_bounds: Vec<WindowBound>,
    /// Recent prompts the provider accepted, our count against its own: what the token-count
    /// correction is estimated from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub observations: Vec<Observation>,
    /// The largest prompt the provider accepted, by its own count (`usage.prompt_tokens`): the
    /// window is at least that.
    #[serde(default)]
    pub accepted_prompt: Option<u64>,
    /// When `accepted_prompt` was seen (ms since the Unix epoch).
    #[serde(default)]
    pub accepted_ms: Option<u64>,
    /// When the stored record lapses (ms since the Unix epoch; `None`: never). Set when it is
    /// saved; stores forget it after that (SQLite prunes the row, Redis expires the key).
    #[serde(default)]
    pub expires_ms: Option<u64>,
}

impl ModelFacts {
    /// Whether the stored record has lapsed at `now_ms`.
    pub fn is_expired(&self, now_ms: u64) -> bool {
        self.expires_ms.is_some_and(|e| e <= now_ms)
    }

    /// These facts with what was learned longer than `ttl` before `now_ms` forgotten (a zero
    /// `ttl`: nothing is). A window stored without the time it was learned counts as expired.
    /// Window bounds age sooner, each on its own (`measure::windows::bound_for`).
    pub fn current(mut self, now_ms: u64, ttl: Duration) -> ModelFacts {
        let ttl_ms = ttl.as_millis().min(u64::MAX as u128) as u64;
        let alive = |at: Option<u64>| {
            ttl.is_zero() || at.is_some_and(|t| now_ms.saturating_sub(t) < ttl_ms)
        };
        if !alive(self.window_learned_ms) {
            self.window = None;
            self.window_learned_ms = None;
        }
        if !alive(self.accepted_ms) {
            self.accepted_prompt = None;
            self.accepted_ms = None;
        }
        self.observations
            .retain(|o| ttl.is_zero() || now_ms.saturating_sub(o.at_ms) < ttl_ms);
        self
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store unavailable: {0}")]
    Unavailable(String),
    #[error("store data is corrupt: {0}")]
    Corrupt(String),
}

#[async_trait::async_trait]
pub trait CheckpointStore: Send + Sync + 'static {
    /// Saves a checkpoint, keeping only the newest few of its conversation.
    async fn put(&self, checkpoint: &Checkpoint) -> Result<(), StoreError>;
    /// Checkpoints of a conversation, newest first.
    async fn for_anchor(&self, anchor: &str) -> Result<Arc<Vec<Checkpoint>>, StoreError>;
    /// One checkpoint by id.
    async fn get(&self, id: &str) -> Result<Option<Checkpoint>, StoreError>;
    async fn model_facts(&self, model: &str) -> Result<ModelFacts, StoreError>;
    async fn put_model_facts(&self, model: &str, facts: ModelFacts) -> Result<(), StoreError>;
    /// Takes the lease `key` for `holder` unless someone else holds it; it lapses after `ttl`.
    async fn try_lease(&self, key: &str, holder: &str, ttl: Duration) -> Result<bool, StoreError>;
    /// Gives the lease back, if `holder` still has it.
    async fn release_lease(&self, key: &str, holder: &str) -> Result<(), StoreError>;
    /// Who holds the lease `key` now, if anyone.
    async fn lease_holder(&self, key: &str) -> Result<Option<String>, StoreError>;
    /// Adds `row` to the timeline of conversation `id` (an anchor, in hex), within `bounds`.
    async fn record_request(
        &self,
        id: &str,
        owner: &Owner,
        row: &RequestRow,
        bounds: TimelineBounds,
    ) -> Result<(), StoreError>;
    /// Every conversation with a timeline, the most recently active first (callers filter by
    /// tenant).
    async fn conversations(&self) -> Result<Vec<ConversationEntry>, StoreError>;
    /// One conversation's entry and its kept rows, oldest first.
    async fn timeline(
        &self,
        id: &str,
    ) -> Result<Option<(ConversationEntry, Vec<RequestRow>)>, StoreError>;
    /// The secret kept under `name`: `candidate` is kept unless a secret is kept already, and
    /// the kept one is returned. The first writer wins, also between replicas starting at once
    /// on one shared store; the secret never expires.
    async fn shared_secret(&self, name: &str, candidate: &str) -> Result<String, StoreError>;
    /// Whether the store is currently working as intended (false: degraded).
    fn healthy(&self) -> bool {
        true
    }
    /// Counts in `errors` the failures the store absorbs itself, which its callers never see
    /// (a write kept in memory because the file failed): callers count the errors returned.
    fn count_absorbed_errors(&self, errors: prometheus_client::metrics::counter::Counter) {
        let _ = errors;
    }
    /// Short name for logs and `/readyz`.
    fn kind(&self) -> &'static str;
}

/// Opens the store a config string names: `memory`, `redis://…` (or `redis+cluster://…`), or a
/// file path (optionally prefixed `sqlite:`).
pub async fn open(spec: &str, ttl: Duration) -> Result<Arc<dyn CheckpointStore>, StoreError> {
    if spec == "memory" {
        return Ok(Arc::new(memory::MemoryStore::default()));
    }
    if redis::is_redis_url(spec) {
        return Ok(Arc::new(redis::RedisStore::open(spec, ttl).await?));
    }
    let path = spec.strip_prefix("sqlite:").unwrap_or(spec);
    Ok(Arc::new(sqlite::SqliteStore::open(
        std::path::Path::new(path),
        ttl,
    )?))
}

/// Milliseconds since the Unix epoch: checkpoints' `created_ms` and their expiry.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis().min(u64::MAX as u128) as u64)
        .unwrap_or(0)
}

/// The oldest `created_ms` still alive under `ttl`; `None` when checkpoints never expire (zero).
pub(crate) fn expiry_cutoff(ttl: Duration) -> Option<u64> {
    (!ttl.is_zero()).then(|| now_ms().saturating_sub(ttl.as_millis().min(u64::MAX as u128) as u64))
}

/// Whether `checkpoint` is still alive under `ttl`.
pub(crate) fn is_fresh(checkpoint: &Checkpoint, ttl: Duration) -> bool {
    expiry_cutoff(ttl).is_none_or(|cutoff| checkpoint.created_ms >= cutoff)
}

/// `list` without its expired checkpoints (the same list when none expired).
pub(crate) fn without_expired(list: Arc<Vec<Checkpoint>>, ttl: Duration) -> Arc<Vec<Checkpoint>> {
    let Some(cutoff) = expiry_cutoff(ttl) else {
        return list;
    };
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

/// Inserts `checkpoint` into a newest-first list, replacing one with the same id and trimming.
pub(crate) fn insert_newest_first(list: &mut Vec<Checkpoint>, checkpoint: &Checkpoint) {
    list.retain(|c| c.id != checkpoint.id);
    list.insert(0, checkpoint.clone());
    list.sort_by(|a, b| {
        b.covered
            .cmp(&a.covered)
            .then(b.created_ms.cmp(&a.created_ms))
    });
    list.truncate(CHECKPOINTS_PER_CONVERSATION);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_of_earlier_versions_are_read_and_their_single_factor_is_ignored() {
        let old = r#"{"window":8192,"window_learned_ms":5,"calibration":4.0,"accepted_prompt":900,"accepted_ms":6,"expires_ms":7}"#;
        let facts: ModelFacts = serde_json::from_str(old).unwrap();
        assert_eq!(
            facts,
            ModelFacts {
                window: Some(8192),
                window_learned_ms: Some(5),
                accepted_prompt: Some(900),
                accepted_ms: Some(6),
                expires_ms: Some(7),
                ..ModelFacts::default()
            }
        );
        assert!(facts.observations.is_empty() && facts.window_bounds.is_empty());
        let minimal: ModelFacts =
            serde_json::from_str(r#"{"window":64,"calibration":null}"#).unwrap();
        assert_eq!(minimal.window, Some(64));
    }
}

#[cfg(test)]
pub(crate) mod contract;
