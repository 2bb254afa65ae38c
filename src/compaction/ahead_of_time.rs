//! Summaries made before they are needed: when a conversation passes the soft threshold, a
//! background task writes its next checkpoint, so the request that crosses the window finds it
//! ready instead of waiting for a summary.

use std::sync::Arc;
use tokio::time::Instant;

use crate::identity;

use super::conversation::{matches_prefix, Conversation, View};
use super::{Engine, Mode, RequestContext};
use crate::measure::calibration;

impl Engine {
    /// Starts a background summary when the conversation passed the soft threshold and no
    /// checkpoint is ready or being made for it.
    pub(super) fn maybe_start_background(
        self: &Arc<Self>,
        context: &RequestContext,
        conversation: &Conversation,
        view: &View<'_>,
    ) {
        if !self.config.ahead_of_time || context.mode != Mode::Auto {
            return;
        }
        let Some(anchor) = conversation.anchor else {
            return;
        };
        let soft = (conversation.limit as f64 * self.config.soft_threshold) as u64;
        let needed = calibration::apply(view.tokens, conversation.factor)
            .saturating_add(conversation.reserve);
        if needed <= soft {
            return;
        }
        if self.background.insert(anchor, ()).is_some() {
            return;
        }
        let engine = self.clone();
        let context = context.clone();
        let request = conversation.request.clone();
        let base = view.checkpoint.cloned();
        tokio::spawn(async move {
            let (facts, _) = engine.model_facts(request.model()).await;
            let conversation = engine.identify(&context, &request, facts);
            // A ready checkpoint that covers more than the one in use already exists: done.
            let existing = engine.store.for_anchor(&identity::hex(&anchor)).await.ok();
            let ready = existing.is_some_and(|list| {
                list.iter().any(|c| {
                    c.ahead_of_time
                        && matches_prefix(c, &conversation.chain)
                        && c.covered > base.as_ref().map_or(0, |b| b.covered)
                })
            });
            if !ready {
                let started = Instant::now();
                match engine
                    .compact(&context, &conversation, base.as_ref(), false, true, started)
                    .await
                {
                    Ok(_) => {
                        engine
                            .metrics
                            .compactions
                            .get_or_create(&crate::metrics::TriggerLabel {
                                trigger: "ahead_of_time",
                            })
                            .inc();
                    }
                    Err(e) => tracing::info!(
                        reason = %e,
                        cause = %super::summarizer::with_causes(&e),
                        "Ahead-of-time summary not made."
                    ),
                }
            }
            engine.background.remove(&anchor);
        });
    }
}
