//! Summary slots: how many summaries the proxy, and each tenant, write at once
//! (`max_concurrent_summaries`, `max_concurrent_summaries_per_tenant`). A summary waits for one
//! of each before it asks the summarizer, and gives them back when it ends.

use std::sync::Arc;

use crate::identity;

use super::Engine;

impl Engine {
    /// A slot to write one summary in: one of the proxy's and one of the tenant's, waited for
    /// when all are taken.
    pub(super) async fn summary_slots(&self, tenant: &identity::Hash) -> SummarySlots<'_> {
        let tenant_slots = self
            .tenant_slots
            .entry(*tenant)
            .or_insert_with(|| {
                Arc::new(tokio::sync::Semaphore::new(
                    self.config.max_concurrent_summaries_per_tenant.max(1),
                ))
            })
            .clone();
        let waits =
            tenant_slots.available_permits() == 0 || self.summary_slots.available_permits() == 0;
        if waits {
            self.metrics.summary_slot_waits.inc();
        }
        // Neither semaphore is ever closed.
        let tenant_permit = tenant_slots.clone().acquire_owned().await.ok();
        let permit = self.summary_slots.clone().acquire_owned().await.ok();
        SummarySlots {
            engine: self,
            tenant: *tenant,
            tenant_slots,
            permits: (tenant_permit, permit),
        }
    }
}

/// The slots one summary holds, given back when it ends; the tenant's entry goes with its last
/// summary, so the map stays as small as the summaries in progress.
pub(super) struct SummarySlots<'a> {
    engine: &'a Engine,
    tenant: identity::Hash,
    tenant_slots: Arc<tokio::sync::Semaphore>,
    permits: (
        Option<tokio::sync::OwnedSemaphorePermit>,
        Option<tokio::sync::OwnedSemaphorePermit>,
    ),
}

impl Drop for SummarySlots<'_> {
    fn drop(&mut self) {
        let _ = self.permits.0.take();
        let full = self
            .engine
            .config
            .max_concurrent_summaries_per_tenant
            .max(1);
        let tenant_slots = &self.tenant_slots;
        self.engine
            .tenant_slots
            .remove_if(&self.tenant, |_, slots| {
                Arc::ptr_eq(slots, tenant_slots)
                    && Arc::strong_count(slots) == 2
                    && slots.available_permits() == full
            });
    }
}
