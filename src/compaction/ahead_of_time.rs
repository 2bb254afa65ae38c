//! Summaries made before they are needed: when a conversation passes the soft threshold, a
//! background task writes its next checkpoint, so no request waits for a summary. The next
//! request that fits through it is sent through it (or, with `apply_when_ready` off, the first
//! that no longer fits without it).

use std::sync::Arc;
use tokio::time::Instant;

use crate::identity;

use super::conversation::{matches_prefix, Conversation, View};
use super::{Engine, Mode, Trigger};

impl Engine {
    /// Starts a background summary when the conversation passed the soft threshold and no
    /// checkpoint is ready or being made for it.
    pub(super) fn maybe_start_background(
        self: &Arc<Self>,
        conversation: &Conversation,
        view: &View<'_>,
    ) {
        if !self.config.ahead_of_time
            || conversation.context.mode != Mode::Auto
            || self.is_draining()
        {
            return;
        }
        let Some(anchor) = conversation.anchor else {
            return;
        };
        let soft = self.soft_limit(conversation);
        let needed = conversation
            .correction
            .apply(view.tokens)
            .saturating_add(conversation.reserve);
        if needed <= soft {
            return;
        }
        if self.background.insert(anchor, ()).is_some() {
            return;
        }
        let engine = self.clone();
        // The summary outlives this request: it takes a copy of the conversation (counts and
        // chain, not counted or hashed again).
        let conversation = conversation.clone();
        let base = view.checkpoint.cloned();
        self.tasks.spawn(async move {
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
                    .compact(&conversation, base.as_ref(), Trigger::AheadOfTime, started)
                    .await
                {
                    // Only a summary this task wrote; not one it found, or waited for.
                    Ok((_, true)) => engine.count_compaction(Trigger::AheadOfTime),
                    Ok((_, false)) => {}
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

    /// The soft threshold in tokens, output reserve included as in the limit it is compared
    /// like: the reserve plus `soft_threshold` of the room left to input. A share of the whole
    /// limit started summaries early at small windows, where the reserve takes up to a quarter
    /// of the window, and left too little room between them
    /// (benches/results/2026-12-05-cost-input-room.md).
    pub(super) fn soft_limit(&self, conversation: &Conversation) -> u64 {
        let input_room = conversation.limit.saturating_sub(conversation.reserve);
        conversation.reserve + (input_room as f64 * self.config.soft_threshold) as u64
    }
}
