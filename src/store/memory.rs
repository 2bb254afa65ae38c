//! In-process store: everything in maps (the shared secret too), lost on exit. For tests and
//! throwaway runs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quick_cache::sync::Cache;

use super::lease::LeaseTable;
use super::timeline::MemoryTimelines;
use super::{
    insert_newest_first, now_ms, Checkpoint, CheckpointStore, ConversationEntry, ModelFacts, Owner,
    RequestRow, StoreError, TimelineBounds, MODEL_FACTS_IN_MEMORY,
};

pub struct MemoryStore {
    inner: Mutex<Inner>,
    /// Bounded: it is also the Redis store's local copy, which lives as long as the process.
    models: Cache<String, ModelFacts>,
    leases: LeaseTable,
    timelines: MemoryTimelines,
}

impl Default for MemoryStore {
    fn default() -> MemoryStore {
        MemoryStore {
            inner: Mutex::default(),
            models: Cache::new(MODEL_FACTS_IN_MEMORY),
            leases: LeaseTable::default(),
            timelines: MemoryTimelines::default(),
        }
    }
}

#[derive(Default)]
struct Inner {
    by_anchor: HashMap<String, Arc<Vec<Checkpoint>>>,
    secrets: HashMap<String, String>,
}

impl MemoryStore {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the maps half-updated in a harmful way.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait::async_trait]
impl CheckpointStore for MemoryStore {
    async fn put(&self, checkpoint: &Checkpoint) -> Result<(), StoreError> {
        let mut inner = self.lock();
        let entry = inner
            .by_anchor
            .entry(checkpoint.anchor.clone())
            .or_default();
        let mut list = (**entry).clone();
        insert_newest_first(&mut list, checkpoint);
        *entry = Arc::new(list);
        Ok(())
    }

    async fn for_anchor(&self, anchor: &str) -> Result<Arc<Vec<Checkpoint>>, StoreError> {
        Ok(self
            .lock()
            .by_anchor
            .get(anchor)
            .cloned()
            .unwrap_or_default())
    }

    async fn get(&self, id: &str) -> Result<Option<Checkpoint>, StoreError> {
        Ok(self
            .lock()
            .by_anchor
            .values()
            .flat_map(|l| l.iter())
            .find(|c| c.id == id)
            .cloned())
    }

    async fn model_facts(&self, model: &str) -> Result<ModelFacts, StoreError> {
        Ok(self
            .models
            .get(model)
            .filter(|f| !f.is_expired(now_ms()))
            .unwrap_or_default())
    }

    async fn put_model_facts(&self, model: &str, facts: ModelFacts) -> Result<(), StoreError> {
        self.models.insert(model.to_string(), facts);
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
        self.timelines.record(id, owner, row, bounds);
        Ok(())
    }

    async fn conversations(&self) -> Result<Vec<ConversationEntry>, StoreError> {
        Ok(self.timelines.conversations())
    }

    async fn timeline(
        &self,
        id: &str,
    ) -> Result<Option<(ConversationEntry, Vec<RequestRow>)>, StoreError> {
        Ok(self.timelines.timeline(id))
    }

    async fn shared_secret(&self, name: &str, candidate: &str) -> Result<String, StoreError> {
        Ok(self
            .lock()
            .secrets
            .entry(name.to_string())
            .or_insert_with(|| candidate.to_string())
            .clone())
    }

    fn kind(&self) -> &'static str {
        "memory"
    }
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn meets_the_store_contract() {
        super::super::contract::check(&super::MemoryStore::default()).await;
    }
}
