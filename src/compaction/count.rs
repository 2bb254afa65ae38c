//! Stage 1 of the engine: the request's tokens, counted on the async worker when little is left
//! to count, on the blocking pool otherwise.

use std::sync::Arc;

use super::Engine;
use crate::dialect::WireRequest;
use crate::measure::Measured;
use crate::tokenizer::{Cancel, Encoding};

/// Requests with up to this much left to count (elements not counted before, and the head) are
/// counted on the async worker that has them. Counting is linear in the text, so that is a
/// fraction of a millisecond (a few at worst, for a run without whitespace), less than the
/// thread hand-offs of the blocking pool cost the small requests most clients send.
const COUNT_INLINE_MAX_BYTES: usize = 4 * 1024;
/// Largest pinned head (tools, system) measured on the async worker when every element already
/// carries its count: a head seen before costs a hash (about a microsecond per 10 KB), a new one
/// is counted once per distinct head.
const HEAD_INLINE_MAX_BYTES: usize = 64 * 1024;

impl Engine {
    /// The prompt's tokens by our count, counted as [`Engine::count`] does (a large request on
    /// the blocking pool): for a threshold a client set.
    pub async fn prompt_tokens(&self, request: &Arc<dyn WireRequest>) -> u64 {
        self.count(request).await.total()
    }

    /// Counts the request's tokens: one with little left to count (a small request, or a long
    /// conversation whose elements were all counted before) on this worker, the rest on the
    /// blocking pool, so that an odd body never holds up the async workers (health checks,
    /// other clients); the count stops when this future is dropped (the client left). Counts
    /// land in the meter's cache either way.
    pub(super) async fn count(&self, request: &Arc<dyn WireRequest>) -> Measured {
        // What is left to hash or count: elements measured before carry their facts.
        let encoding = Encoding::for_model(request.model());
        let uncounted: usize = (0..request.len())
            .filter(|&i| request.counted(i).and_then(|c| c.get(encoding)).is_none())
            .map(|i| request.raw(i).len())
            .sum();
        let head: usize = request.head_parts().iter().map(|p| p.len()).sum();
        if uncounted + head <= COUNT_INLINE_MAX_BYTES
            || (uncounted <= COUNT_INLINE_MAX_BYTES && head <= HEAD_INLINE_MAX_BYTES)
        {
            return self.meter.measure(request.as_ref());
        }
        let cancel = Cancel::default();
        let _cancel_when_dropped = cancel.on_drop();
        let (meter, counted_request) = (self.meter.clone(), request.clone());
        let counted = tokio::task::spawn_blocking(move || {
            meter.measure_cancellable(counted_request.as_ref(), &cancel)
        })
        .await;
        match counted {
            Ok(Some(measured)) => measured,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Cancelled only when this future is dropped, or the runtime is shutting down: what
            // was counted is cached, and the rest is counted here.
            Ok(None) | Err(_) => self.meter.measure(request.as_ref()),
        }
    }
}
