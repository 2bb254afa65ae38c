//! Leases held in-process: the whole of single flight for the memory and SQLite stores (one
//! process to coordinate), and the Redis store's fallback while Redis is away.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Lease key → (holder, expiry).
#[derive(Default)]
pub(crate) struct LeaseTable {
    leases: Mutex<HashMap<String, (String, Instant)>>,
}

impl LeaseTable {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, (String, Instant)>> {
        // A panic while holding the lock cannot leave the map half-updated in a harmful way.
        self.leases.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes `key` for `holder` (or renews it) unless someone else holds it unexpired.
    pub(crate) fn try_take(&self, key: &str, holder: &str, ttl: Duration) -> bool {
        let now = Instant::now();
        let mut leases = self.lock();
        match leases.get(key) {
            Some((current, until)) if *until > now && current != holder => false,
            _ => {
                leases.insert(key.to_string(), (holder.to_string(), now + ttl));
                true
            }
        }
    }

    /// Gives `key` back, if `holder` still has it.
    pub(crate) fn release(&self, key: &str, holder: &str) {
        let mut leases = self.lock();
        if leases.get(key).is_some_and(|(h, _)| h == holder) {
            leases.remove(key);
        }
    }

    /// Who holds `key` now, if anyone.
    pub(crate) fn holder(&self, key: &str) -> Option<String> {
        self.lock()
            .get(key)
            .filter(|(_, until)| *until > Instant::now())
            .map(|(holder, _)| holder.clone())
    }
}
