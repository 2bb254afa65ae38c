//! Conversation timelines: what each request of a conversation did, as metadata only (sizes,
//! the window, the checkpoint it went through, waits, status; never a message), kept by the
//! store so that every replica shows the same history.
//!
//! Bounded three times ([`TimelineBounds`]): a conversation keeps only its newest rows, a tenant
//! only its most recently active conversations, and the store only the most recently active of
//! all, forgetting the others whole. Every store
//! applies the same arithmetic ([`ConversationEntry::absorb`]) to its rows.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// How much history a store keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimelineBounds {
    /// Request rows kept per conversation (the newest).
    pub requests_per_conversation: usize,
    /// Conversations kept (the most recently active).
    pub conversations: usize,
    /// Conversations kept per tenant (the most recently active of each), so that one busy
    /// tenant cannot push every other tenant's history out of the shared bound.
    pub conversations_per_tenant: usize,
}

/// One request of a conversation, as served.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestRow {
    /// When it was answered (ms since the Unix epoch).
    pub at_ms: u64,
    /// The route it came in on (`/v1/chat/completions`, …).
    pub path: String,
    pub model: String,
    /// The provider's status.
    pub status: u16,
    /// The prompt as the client sent it, by the proxy's (calibrated) count.
    pub tokens_sent: u64,
    /// The prompt as forwarded, after any checkpoint was applied.
    pub tokens_forwarded: u64,
    /// The window the request was planned against.
    pub window: u64,
    /// Whether what was forwarded differs from what was sent.
    pub compacted: bool,
    /// Whether a summary was written for this request (not only applied).
    pub summarized: bool,
    /// Whether a checkpoint prepared ahead of time was applied.
    pub ahead_of_time: bool,
    /// The checkpoint the request went through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
    /// Time spent waiting for summaries.
    pub summary_ms: u64,
    /// Time spent waiting for the provider's first bytes.
    pub upstream_ms: u64,
    /// Why compaction failed or was skipped (`x-compactor-compaction`), when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction_status: Option<String>,
}

/// Who a conversation belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    /// The tenant's hash (hex), as checkpoints carry it.
    pub tenant: String,
    /// The gateway key's name, when gateway keys are in use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_name: Option<String>,
}

/// A conversation as the list shows it: its owner, its span, and its latest request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConversationEntry {
    /// The conversation's anchor (hex), as its checkpoints carry it.
    pub id: String,
    #[serde(flatten)]
    pub owner: Owner,
    pub first_ms: u64,
    pub last_ms: u64,
    /// Requests seen, including those whose rows were dropped by the bound.
    pub requests: u64,
    /// Times a new checkpoint took effect.
    pub compactions: u64,
    pub last: RequestRow,
}

impl ConversationEntry {
    /// The entry of a conversation whose first recorded request is `row`.
    pub fn first(id: &str, owner: &Owner, row: &RequestRow) -> ConversationEntry {
        ConversationEntry {
            id: id.to_string(),
            owner: owner.clone(),
            first_ms: row.at_ms,
            last_ms: row.at_ms,
            requests: 1,
            compactions: u64::from(row.checkpoint.is_some()),
            last: row.clone(),
        }
    }

    /// The entry after one more request. A row served before the newest one known (replicas
    /// record off the request's path, so rows can arrive out of order) is counted, but neither
    /// becomes the last row nor counts as a compaction against it.
    pub fn absorb(&mut self, row: &RequestRow) {
        self.requests += 1;
        self.first_ms = self.first_ms.min(row.at_ms);
        if row.at_ms < self.last_ms {
            return;
        }
        if is_compaction(Some(&self.last), row) {
            self.compactions += 1;
        }
        self.last_ms = row.at_ms;
        self.last = row.clone();
    }
}

/// Whether `row` is where a new checkpoint took effect: it went through one that the request
/// before it (`previous`, when known) did not.
pub fn is_compaction(previous: Option<&RequestRow>, row: &RequestRow) -> bool {
    row.checkpoint.is_some()
        && previous.and_then(|p| p.checkpoint.as_ref()) != row.checkpoint.as_ref()
}

/// Timelines in process memory: the memory store's, and the Redis store's while Redis is away.
#[derive(Default)]
pub struct MemoryTimelines {
    conversations: Mutex<HashMap<String, (ConversationEntry, VecDeque<RequestRow>)>>,
}

impl MemoryTimelines {
    pub fn record(&self, id: &str, owner: &Owner, row: &RequestRow, bounds: TimelineBounds) {
        let mut all = self.conversations.lock().unwrap_or_else(|p| p.into_inner());
        match all.get_mut(id) {
            Some((entry, rows)) => {
                entry.absorb(row);
                rows.push_back(row.clone());
                while rows.len() > bounds.requests_per_conversation {
                    rows.pop_front();
                }
            }
            None => {
                let mine = |e: &ConversationEntry| e.owner.tenant == owner.tenant;
                while all.values().filter(|(e, _)| mine(e)).count()
                    >= bounds.conversations_per_tenant.max(1)
                {
                    let Some(oldest) = all
                        .iter()
                        .filter(|(_, (e, _))| mine(e))
                        .min_by_key(|(_, (e, _))| e.last_ms)
                        .map(|(id, _)| id.clone())
                    else {
                        break;
                    };
                    all.remove(&oldest);
                }
                while all.len() >= bounds.conversations.max(1) {
                    let Some(oldest) = all
                        .iter()
                        .min_by_key(|(_, (e, _))| e.last_ms)
                        .map(|(id, _)| id.clone())
                    else {
                        break;
                    };
                    all.remove(&oldest);
                }
                let rows = VecDeque::from([row.clone()]);
                all.insert(
                    id.to_string(),
                    (ConversationEntry::first(id, owner, row), rows),
                );
            }
        }
    }

    /// Every conversation, the most recently active first.
    pub fn conversations(&self) -> Vec<ConversationEntry> {
        let all = self.conversations.lock().unwrap_or_else(|p| p.into_inner());
        newest_first(all.values().map(|(e, _)| e.clone()).collect())
    }

    pub fn timeline(&self, id: &str) -> Option<(ConversationEntry, Vec<RequestRow>)> {
        let all = self.conversations.lock().unwrap_or_else(|p| p.into_inner());
        all.get(id)
            .map(|(e, rows)| (e.clone(), rows.iter().cloned().collect()))
    }
}

/// `entries` sorted the most recently active first.
pub(crate) fn newest_first(mut entries: Vec<ConversationEntry>) -> Vec<ConversationEntry> {
    entries.sort_by(|a, b| b.last_ms.cmp(&a.last_ms).then_with(|| a.id.cmp(&b.id)));
    entries
}
