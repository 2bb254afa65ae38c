//! Counting a request's tokens before the engine sees it: small bodies at once, large ones on
//! the blocking pool, so that an odd body never holds up the async workers.

use std::sync::Arc;

use super::error::ApiError;
use super::App;
use crate::dialect::WireRequest;
use crate::measure::Measured;
use crate::tokenizer::Cancel;

/// Bodies up to this size are counted on the async worker that has them. Counting is linear
/// in the text, so that is a fraction of a millisecond (a few at worst, for a run without
/// whitespace), less than the thread hand-offs of the blocking pool cost the small requests
/// most clients send.
const COUNT_INLINE_MAX_BYTES: usize = 4 * 1024;

/// Counts the request's tokens, a large body on the blocking pool: it never holds up the async
/// workers (health checks, other clients), and the count stops when the client leaves (this
/// future is dropped). Counts land in the meter's cache either way.
pub(super) async fn measure(
    app: &App,
    request: &Arc<dyn WireRequest>,
    body_bytes: usize,
) -> Result<Measured, ApiError> {
    if body_bytes <= COUNT_INLINE_MAX_BYTES {
        return Ok(app.engine.meter().measure(request.as_ref()));
    }
    measure_on_blocking_pool(app, request).await
}

/// Counts the request's tokens on the blocking pool, cancelled when this future is dropped.
pub(super) async fn measure_on_blocking_pool(
    app: &App,
    request: &Arc<dyn WireRequest>,
) -> Result<Measured, ApiError> {
    let cancel = Cancel::default();
    let _cancel_when_dropped = cancel.on_drop();
    let (meter, request) = (app.engine.meter().clone(), request.clone());
    let counted =
        tokio::task::spawn_blocking(move || meter.measure_cancellable(request.as_ref(), &cancel))
            .await;
    match counted {
        Ok(Some(measured)) => Ok(measured),
        // Cancelled: only when this future is dropped, so nobody reads this.
        Ok(None) => Err(ApiError::Internal("the count was cancelled".into())),
        Err(e) => {
            tracing::warn!(error = %e, "Counting tokens on the blocking pool failed.");
            Err(ApiError::Internal(
                "counting the request's tokens failed".into(),
            ))
        }
    }
}
