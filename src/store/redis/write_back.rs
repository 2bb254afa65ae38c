//! Checkpoints Redis lost, written back from this replica's copy.
//!
//! Redis can lose what it held without the store noticing an outage: a server restarted
//! without persistence, a `FLUSHALL`, a cluster failover to a replica that had not caught up.
//! Every replica keeps the conversations it recently read or wrote (the same copy it serves
//! while degraded), so when Redis answers with less than that copy holds, the missing
//! checkpoints are put back in Redis and served, instead of the conversation being summarized
//! again. Nothing else removes a checkpoint from Redis but trimming and expiry, and the copy is
//! trimmed and expired by the same rules, so a checkpoint the copy has and Redis lacks was lost.

use super::super::{insert_newest_first, is_fresh, Checkpoint};
use super::Shared;

impl Shared {
    /// `stored` (what Redis holds of conversation `anchor`, newest first) with the checkpoints
    /// of this replica's copy that Redis lost, which are written back.
    pub(super) async fn with_lost_restored(
        &self,
        anchor: &str,
        stored: Vec<Checkpoint>,
    ) -> Vec<Checkpoint> {
        let Some(copy) = self.conversations.get(anchor) else {
            return stored;
        };
        let mut merged = stored.clone();
        for checkpoint in copy.iter().filter(|c| is_fresh(c, self.ttl)) {
            if !merged.iter().any(|m| m.id == checkpoint.id) {
                insert_newest_first(&mut merged, checkpoint);
            }
        }
        let lost: Vec<&Checkpoint> = merged
            .iter()
            .filter(|c| !stored.iter().any(|s| s.id == c.id))
            .collect();
        if !lost.is_empty() {
            self.write_back(&lost).await;
        }
        merged
    }

    /// Checkpoint `id` from this replica's copy, written back to Redis, which no longer has it.
    pub(super) async fn restore_lost(&self, id: &str) -> Option<Checkpoint> {
        let checkpoint = self
            .conversations
            .iter()
            .find_map(|(_, list)| list.iter().find(|c| c.id == id).cloned())
            .filter(|c| is_fresh(c, self.ttl))?;
        self.write_back(&[&checkpoint]).await;
        Some(checkpoint)
    }

    /// Puts `lost` back in Redis. One that does not make it (Redis gone again) is still served
    /// from the copy, and written back on a later read.
    async fn write_back(&self, lost: &[&Checkpoint]) {
        let mut written = 0;
        for &checkpoint in lost {
            let put = self
                .call("write_back", |mut m| async move {
                    self.redis_put(&mut m, checkpoint).await
                })
                .await;
            if put.is_none() {
                break;
            }
            written += 1;
        }
        if let Some(first) = lost.first() {
            tracing::info!(
                store = "redis",
                conversation = first.anchor.get(..16).unwrap_or(&first.anchor),
                lost = lost.len(),
                written,
                "Wrote back checkpoints redis had lost, from this replica's copy."
            );
        }
    }
}
