//! Stage `clear`: the engine's cheapest step, tried before every summary (`compaction.
//! clear_tool_results_first`). A request that nears its budget through the checkpoint it has (or
//! with none) has the oldest tool results of its verbatim part replaced by one-line stubs (the
//! call and its arguments stay), the newest `clear_keep_tool_uses` kept whole, when that alone
//! brings it under and frees at least `clear_min_share` of what a summary would; a summary is
//! written only when it does not.
//!
//! A clearing is a checkpoint like a summary: the same summary (or none, before the first) with
//! what was cleared ([`crate::store::Cleared`]), stored, found by the next request of the
//! conversation on any replica, and applied to it as it is, so the forwarded prefix stays byte
//! for byte the same until the next step. It is pinned by the chain hash of the last element it
//! cleared, so an edited history is never cleared by an old plan; the chain is seeded with the
//! tenant, so no tenant's clearing is applied to another's conversation. Only the verbatim part
//! of a request past its budget is read for it: a request served through a stored clearing reads
//! nothing more.

use std::collections::BTreeSet;

use crate::dialect::edits::{ClearInputs, Clearable};
use crate::identity;
use crate::store::{Checkpoint, Cleared, ClearedUse};

use super::clearing::tool_uses;
use super::conversation::{Conversation, View};
use super::{Engine, Mode};

impl Engine {
    /// Whether the engine clears before it summarizes this request: configured so, an automatic
    /// request, and no context edits the client asked for (those are served as asked, by the
    /// provider or by [`Engine::clear_context`], and nothing more is cleared).
    fn clears_first(&self, conversation: &Conversation) -> bool {
        self.config.clear_tool_results_first
            && conversation.context.mode == Mode::Auto
            && !conversation.context.edits_served
            && matches!(conversation.request.context_edits(), Ok(None))
    }

    /// The soft threshold, when summaries are made ahead of time: a request through its
    /// checkpoint past it would start one.
    pub(super) fn soft_budget(&self, conversation: &Conversation) -> Option<u64> {
        self.config
            .ahead_of_time
            .then_some(self.soft_limit(conversation))
    }

    /// Stage `clear`: a checkpoint that clears the oldest tool results past `view`'s cut so that
    /// the request fits in `budget` (calibrated tokens, output reserve included), stored; `None`
    /// when clearing is off here or is not enough alone.
    pub(super) async fn clear_tail(
        &self,
        conversation: &Conversation,
        view: &View<'_>,
        budget: u64,
    ) -> Option<Checkpoint> {
        if !self.clears_first(conversation) {
            return None;
        }
        conversation.anchor?;
        let request = &conversation.request;
        let n = request.len();
        let base = view.checkpoint;
        let start = base.map_or(0, |b| b.covered).min(n);
        let encoding = conversation.measured.encoding;
        let clearable: Vec<Clearable> =
            (start..n).map(|i| request.clearable(encoding, i)).collect();
        let uses = tool_uses(&clearable, &ClearInputs::None, &|text| encoding.count(text));
        let already: BTreeSet<&str> = base
            .and_then(|b| b.cleared.as_ref())
            .into_iter()
            .flat_map(|c| c.results.iter().map(|r| r.call_id.as_str()))
            .collect();
        let keep = usize::try_from(self.config.clear_keep_tool_uses).unwrap_or(usize::MAX);
        let older = uses.len().saturating_sub(keep);
        let fresh: Vec<ClearedUse> = uses[..older]
            .iter()
            .filter(|u| !already.contains(u.call_id) && u.freed > 0)
            .map(|u| ClearedUse {
                index: start + u.result_at,
                call_id: u.call_id.to_string(),
                stub: u.stub.clone(),
                freed_tokens: u.freed,
            })
            .collect();
        let gain: u64 = fresh.iter().map(|u| u.freed_tokens).sum();
        let after = view.tokens.saturating_sub(gain);
        let needed = conversation
            .correction
            .apply(after)
            .saturating_add(conversation.reserve);
        if fresh.is_empty() || needed > budget {
            return None;
        }
        // A clearing that frees far less than a summary would leaves the request large: every
        // later request reads that size again from the provider's cache, and the next crossing
        // comes sooner. Below `clear_min_share` of what a summary would free, summarize.
        let now = conversation.correction.apply(view.tokens);
        let freed = now.saturating_sub(conversation.correction.apply(after));
        let summary_frees = now.saturating_sub(self.after_summary(conversation));
        if (freed as f64) < self.config.clear_min_share * summary_frees as f64 {
            return None;
        }
        let count = fresh.len();
        let mut results: Vec<ClearedUse> = base
            .and_then(|b| b.cleared.as_ref())
            .map_or_else(Vec::new, |c| c.results.clone());
        results.extend(fresh);
        let through = results.iter().map(|r| r.index).max()?;
        let cleared = Cleared {
            through_hash: identity::hex(conversation.chain.get(through)?),
            results,
        };
        let checkpoint = self.clearing_checkpoint(conversation, base, cleared, after);
        if let Err(e) = self.store.put(&checkpoint).await {
            self.metrics.store_errors.inc();
            tracing::warn!(error = %e, "Storing the clearing failed; it serves this request only.");
        }
        self.metrics.clearings_applied.inc();
        tracing::info!(
            conversation = checkpoint.anchor.get(..16).unwrap_or(&checkpoint.anchor),
            checkpoint = %checkpoint.id,
            over = base.map_or("-", |b| b.id.as_str()),
            cleared_tool_uses = count,
            tokens_before = checkpoint.tokens_before,
            tokens_after = checkpoint.tokens_after,
            "Cleared old tool results instead of summarizing."
        );
        Some(checkpoint)
    }

    /// `base` (a summary, or nothing before the first) with `cleared`, as a checkpoint of its
    /// own; `after` is what the request costs through it (raw tokens).
    fn clearing_checkpoint(
        &self,
        conversation: &Conversation,
        base: Option<&Checkpoint>,
        cleared: Cleared,
        after: u64,
    ) -> Checkpoint {
        // Later than its base, even within a millisecond: stores list the newest first among
        // checkpoints that cover as much.
        let created_ms = crate::store::now_ms().max(base.map_or(0, |b| b.created_ms + 1));
        let id = identity::hex(
            blake3::hash(
                format!(
                    "{}/cleared/{created_ms}/{}",
                    cleared.through_hash, self.replica
                )
                .as_bytes(),
            )
            .as_bytes(),
        )[..24]
            .to_string();
        let tokens_before = conversation.correction.apply(conversation.measured.total());
        let tokens_after = conversation.correction.apply(after);
        match base {
            Some(base) => Checkpoint {
                id,
                tokens_before,
                tokens_after,
                created_ms,
                ahead_of_time: false,
                cleared: Some(cleared),
                ..base.clone()
            },
            None => Checkpoint {
                id,
                tenant: identity::hex(&conversation.context.tenant),
                anchor: conversation
                    .anchor
                    .map(|a| identity::hex(&a))
                    .unwrap_or_default(),
                covered: 0,
                prefix_hash: String::new(),
                pinned_user: None,
                truncations: vec![],
                summary: String::new(),
                files_read: vec![],
                files_modified: vec![],
                tokens_before,
                tokens_after,
                created_ms,
                model: conversation.request.model().to_string(),
                ahead_of_time: false,
                cleared: Some(cleared),
            },
        }
    }
}
