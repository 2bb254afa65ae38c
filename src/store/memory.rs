//! In-process store: everything in maps, lost on exit. For tests and throwaway runs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{insert_newest_first, Checkpoint, CheckpointStore, ModelFacts, StoreError};

#[derive(Default)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    by_anchor: HashMap<String, Arc<Vec<Checkpoint>>>,
    models: HashMap<String, ModelFacts>,
    leases: HashMap<String, (String, Instant)>,
}

impl MemoryStore {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the maps half-updated in a harmful way.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Lease bookkeeping shared by the stores that keep leases in-process.
pub(crate) fn take_lease(
    leases: &mut HashMap<String, (String, Instant)>,
    key: &str,
    holder: &str,
    ttl: Duration,
) -> bool {
    let now = Instant::now();
    match leases.get(key) {
        Some((current, until)) if *until > now && current != holder => false,
        _ => {
            leases.insert(key.to_string(), (holder.to_string(), now + ttl));
            true
        }
    }
}

pub(crate) fn lease_holder(
    leases: &HashMap<String, (String, Instant)>,
    key: &str,
) -> Option<String> {
    leases
        .get(key)
        .filter(|(_, until)| *until > Instant::now())
        .map(|(holder, _)| holder.clone())
}

pub(crate) fn give_lease(leases: &mut HashMap<String, (String, Instant)>, key: &str, holder: &str) {
    if leases.get(key).is_some_and(|(h, _)| h == holder) {
        leases.remove(key);
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
        Ok(self.lock().models.get(model).copied().unwrap_or_default())
    }

    async fn put_model_facts(&self, model: &str, facts: ModelFacts) -> Result<(), StoreError> {
        self.lock().models.insert(model.to_string(), facts);
        Ok(())
    }

    async fn try_lease(&self, key: &str, holder: &str, ttl: Duration) -> Result<bool, StoreError> {
        Ok(take_lease(&mut self.lock().leases, key, holder, ttl))
    }

    async fn release_lease(&self, key: &str, holder: &str) -> Result<(), StoreError> {
        give_lease(&mut self.lock().leases, key, holder);
        Ok(())
    }

    async fn lease_holder(&self, key: &str) -> Result<Option<String>, StoreError> {
        Ok(lease_holder(&self.lock().leases, key))
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
