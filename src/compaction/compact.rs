//! Stage `summarize`, the engine's side of it: how much to keep verbatim (the plan's budget),
//! asking the summarizer for the covered span (in chunks folded oldest first when it is larger
//! than the summarizer's window; none for a plan that only cuts the newest step in place), and
//! storing the checkpoint only when it frees tokens. How a summary is written, chunk by chunk,
//! is [`writing`]'s.

mod writing;

use std::sync::Arc;
use std::time::SystemTime;

use tokio::time::Instant;

use crate::dialect::{MessageView, Role};
use crate::identity;
use crate::metrics::GaugeHeld;
use crate::store::Checkpoint;
use crate::tokenizer::{Encoding, REPLY_PRIMING};

use super::conversation::{Conversation, View};
use super::plan::{self, PlanError, PlanInput};
use super::{
    files, record, summarizer, Engine, Mode, Outcome, Prepared, Status, SummaryError,
    SummaryReport, Trigger,
};

/// The summary of a checkpoint that only cuts the newest step in place, with nothing before it.
const NOTHING_SUMMARIZED: &str = "Nothing earlier was summarized: the longest contents of the \
newest messages below were cut in the middle to fit the context window.";

/// One fold: the summary of `span` (elements of the conversation, with their `views`) into
/// `base`'s summary, for `plan`.
#[derive(Clone, Copy)]
pub(super) struct Fold<'a> {
    base: Option<&'a Checkpoint>,
    /// The checkpoint the conversation's requests were forwarded through when it is not
    /// `base`: a clearing alone, which a summary does not extend but a summary request that
    /// continues the conversation renders its prefix through.
    sent_through: Option<&'a Checkpoint>,
    plan: &'a plan::Plan,
    span: &'a [usize],
    views: &'a [(Role, MessageView)],
    trigger: Trigger,
}

/// A summary to write: over `base`, through `plan`, for `trigger`, given up at `deadline` (the
/// request's, which may have spent part of its time waiting for another request's summary).
#[derive(Clone, Copy)]
pub(super) struct SummaryOrder<'a> {
    pub base: Option<&'a Checkpoint>,
    /// See [`Fold::sent_through`].
    pub sent_through: Option<&'a Checkpoint>,
    pub plan: &'a plan::Plan,
    pub trigger: Trigger,
    pub deadline: Instant,
}

/// How far a fold in chunks has come: `folded` of its span's elements summarized into `text`,
/// and the budget of the record attached to it.
struct Progress<'a> {
    folded: usize,
    text: &'a str,
    encoding: Encoding,
    max_tokens: u64,
}

impl Engine {
    /// Stage `summarize`: makes (or waits for) a checkpoint that covers more of the
    /// conversation, then rewrites the request through it; serves a fallback when that fails.
    pub(super) async fn summarize(
        self: &Arc<Self>,
        conversation: &Conversation,
        view: &View<'_>,
        trigger: Trigger,
        mut outcome: Outcome,
    ) -> Prepared {
        let started = Instant::now();
        let started_at = SystemTime::now();
        let result = self
            .compact(conversation, view.checkpoint, trigger, started)
            .await;
        outcome.summary_time = started.elapsed();
        let mut report = SummaryReport {
            trigger,
            started: started_at,
            duration: outcome.summary_time,
            model: self.summary_model(conversation),
            written: false,
            checkpoint_id: None,
            tokens_before: outcome.tokens_before,
            tokens_after: outcome.tokens_before,
            failure: None,
        };
        match result {
            Ok((checkpoint, summarized)) => {
                report.written = summarized;
                report.checkpoint_id = Some(checkpoint.id.clone());
                report.tokens_before = checkpoint.tokens_before;
                report.tokens_after = checkpoint.tokens_after;
                outcome.summary = Some(Box::new(report));
                if summarized {
                    self.count_compaction(trigger);
                    outcome.summarized = true;
                } else {
                    // Another request's summary, made ahead of time, may have finished while
                    // this one waited for it.
                    self.note_ready_used(Some(&checkpoint), &mut outcome);
                }
                let view = self.view(conversation, Some(&checkpoint));
                let fits = self.fits(conversation, &view);
                self.note_progress(conversation.anchor, fits);
                if fits {
                    self.rewrite(conversation, &view, outcome)
                } else {
                    self.fit_beside_new_summary(conversation, &view, outcome)
                }
            }
            Err(e) => {
                // Not starting a summary while the proxy shuts down is not this conversation's
                // failure: nothing to back off from.
                if !matches!(e, SummaryError::Draining) {
                    self.metrics.compaction_failures.inc();
                    self.note_progress(conversation.anchor, false);
                }
                tracing::warn!(
                    reason = %e,
                    cause = %summarizer::with_causes(&e),
                    "Compaction failed; serving the request without it."
                );
                report.failure = Some(e.to_string());
                outcome.summary = Some(Box::new(report));
                outcome.status = Some(Status::Failed {
                    reason: e.to_string(),
                    fallback: "original",
                });
                self.fallback(conversation, view, outcome)
            }
        }
    }

    pub(super) fn plan(
        &self,
        conversation: &Conversation,
        base: Option<&Checkpoint>,
        trigger: Trigger,
    ) -> Result<plan::Plan, SummaryError> {
        let fixed = Self::instruction_tokens(conversation)
            + conversation.measured.head_tokens
            + REPLY_PRIMING;
        let summary_allowance = self.summary_allowance(conversation.window);
        let (keep_share, step_share) = self.keep_share(conversation, fixed + summary_allowance);
        let mut keep = conversation.correction.unscale(keep_share);
        keep = keep.min(self.config.keep_recent_tokens);
        let mut step = conversation.correction.unscale(step_share);
        step = step.min(self.config.keep_recent_tokens);
        if trigger.harder() {
            keep /= 2;
            step /= 2;
        }
        if conversation.context.mode == Mode::Force {
            // Asked to compact now (`/compact`): keep only the newest quarter of the conversation.
            keep = keep.min(conversation.measured.total() / 4);
        }
        // The tail a summary written now would keep, before any room is left for growth.
        let turn_budget = keep;
        if trigger.ahead_of_time() {
            // Written now, applied later: leave room for what the conversation adds until then.
            let current = self.view(conversation, base).tokens;
            let growth = conversation
                .correction
                .unscale(conversation.limit.saturating_sub(conversation.reserve));
            keep = keep.saturating_sub(growth.saturating_sub(current));
        }
        let input = PlanInput {
            roles: &conversation.roles,
            tokens: &conversation.message_tokens,
            start: base.map_or(0, |b| b.covered),
            pinned: base.and_then(|b| b.pinned_user),
            keep_budget: keep,
            step_budget: step,
        };
        if conversation.context.mode == Mode::Whole {
            let whole = plan::Plan {
                cut: conversation.roles.len(),
                pinned_user: None,
                truncations: vec![],
            };
            if whole.newly_covered(&input).is_empty() {
                return Err(SummaryError::Nothing);
            }
            return Ok(whole);
        }
        let chosen = plan::plan(&input).and_then(|chosen| {
            if conversation.request.keeps_last_turn_whole() {
                plan::keep_last_turn_whole(&input, chosen)
            } else if trigger.ahead_of_time() {
                plan::leave_newest_turn_out(&input, chosen, turn_budget)
            } else {
                Ok(chosen)
            }
        });
        chosen.map_err(|PlanError::NothingToSummarize| SummaryError::Nothing)
    }

    /// The model a conversation's summaries are asked of: the configured one, or the
    /// conversation's own.
    fn summary_model(&self, conversation: &Conversation) -> String {
        if self.summarizer.model.is_empty() {
            conversation.request.model().to_string()
        } else {
            self.summarizer.model.clone()
        }
    }

    /// Corrected tokens the verbatim tail may take after a compaction, beside `fixed` raw tokens
    /// (instructions, tools, summary): half of the room below the soft threshold that starts
    /// the next ahead-of-time summary, so the compacted request lands halfway between its fixed
    /// part and that threshold (at most half the window when the fixed part and the output
    /// reserve take a quarter) and the conversation grows by as much as it kept before the next
    /// summary starts. Never more than half of the room below the limit (the rule without
    /// ahead-of-time summaries), nor less than a quarter of it, so a large fixed part still
    /// leaves a tail.
    ///
    /// Second: what the newest step (the one the model answers) may take before it is cut in
    /// the middle: that half of the room below the limit whatever the cadence, since cutting
    /// what the model has just read to delay the next summary costs more than the summary.
    fn keep_share(&self, conversation: &Conversation, fixed: u64) -> (u64, u64) {
        let taken = conversation.correction.apply(fixed) + conversation.reserve;
        let usable = conversation.limit.saturating_sub(taken);
        if !self.config.ahead_of_time {
            return (usable / 2, usable / 2);
        }
        let soft = self.soft_limit(conversation);
        let below_soft = soft.saturating_sub(taken);
        ((below_soft / 2).clamp(usable / 4, usable / 2), usable / 2)
    }

    /// Corrected tokens a request of `conversation` would cost through a summary written now:
    /// its fixed part, the summary's allowance and the tail a compaction keeps. What
    /// [`Engine::clear_tail`] weighs a clearing against.
    pub(super) fn after_summary(&self, conversation: &Conversation) -> u64 {
        let fixed = Self::instruction_tokens(conversation)
            + conversation.measured.head_tokens
            + REPLY_PRIMING
            + self.summary_allowance(conversation.window);
        let (keep, _) = self.keep_share(conversation, fixed);
        let keep = keep.min(
            conversation
                .correction
                .apply(self.config.keep_recent_tokens),
        );
        conversation.correction.apply(fixed) + keep
    }

    pub(super) fn summary_allowance(&self, window: u64) -> u64 {
        self.config.summary_max_tokens.min(window / 8).max(128)
    }

    /// Writes the summary `order` asks for, checks it helps, and stores the checkpoint.
    pub(super) async fn summarize_and_store(
        &self,
        conversation: &Conversation,
        order: SummaryOrder<'_>,
    ) -> Result<Checkpoint, SummaryError> {
        let SummaryOrder {
            base,
            sent_through,
            plan,
            trigger,
            deadline,
        } = order;
        let request = &conversation.request;
        let input = PlanInput {
            roles: &conversation.roles,
            tokens: &conversation.message_tokens,
            start: base.map_or(0, |b| b.covered),
            pinned: base.and_then(|b| b.pinned_user),
            keep_budget: 0,
            step_budget: 0,
        };
        let span = plan.newly_covered(&input);
        let views: Vec<(Role, MessageView)> = span
            .iter()
            .map(|&i| (request.role(i), request.view(i)))
            .collect();
        let started = Instant::now();
        let fold = Fold {
            base,
            sent_through,
            plan,
            span: &span,
            views: &views,
            trigger,
        };
        let summary = if span.is_empty() {
            // A plan of cuts alone (the newest step shortened in place, nothing new before it):
            // no model call; the summary stays what it was.
            base.map_or_else(|| NOTHING_SUMMARIZED.to_string(), |b| b.summary.clone())
        } else {
            let summary = tokio::time::timeout_at(deadline, async {
                // Waiting for a slot counts toward the timeout, like the summary itself.
                let _slots = self.summary_slots(&conversation.context.tenant).await;
                let _in_progress = GaugeHeld::hold(&self.metrics.summaries_in_progress);
                self.write_summary(conversation, fold).await
            })
            .await
            .map_err(|_| SummaryError::Timeout)??;
            self.metrics
                .summary_seconds
                .observe(started.elapsed().as_secs_f64());
            summary
        };
        let mut checkpoint = self.new_checkpoint(conversation, &fold, summary)?;
        let saved = match self.fill_figures(conversation, base, &mut checkpoint) {
            Some(saved) => saved,
            // Asked for by the client, which replaces its history with it: stored even when it
            // frees nothing (a short conversation).
            None if conversation.context.mode == Mode::Whole => 0,
            None => return Err(SummaryError::NoReduction),
        };
        self.metrics.tokens_saved.inc_by(saved);
        if let Err(e) = self.store.put(&checkpoint).await {
            self.metrics.store_errors.inc();
            tracing::warn!(error = %e, "Storing the checkpoint failed; it serves this request only.");
        }
        tracing::info!(
            conversation = checkpoint.anchor.get(..16).unwrap_or(&checkpoint.anchor),
            checkpoint = %checkpoint.id,
            replaces = base.map_or("-", |b| b.id.as_str()),
            covered = checkpoint.covered,
            tokens_before = checkpoint.tokens_before,
            tokens_after = checkpoint.tokens_after,
            trigger = trigger.label(),
            "Compacted a conversation."
        );
        Ok(checkpoint)
    }

    /// Fills in `checkpoint`'s token figures and returns the raw tokens it saves against `base`;
    /// `None` when it saves nothing.
    fn fill_figures(
        &self,
        conversation: &Conversation,
        base: Option<&Checkpoint>,
        checkpoint: &mut Checkpoint,
    ) -> Option<u64> {
        let before = self.view(conversation, base).tokens;
        let after = self.view(conversation, Some(checkpoint)).tokens;
        checkpoint.tokens_before = conversation.correction.apply(conversation.measured.total());
        checkpoint.tokens_after = conversation.correction.apply(after);
        (after < before).then(|| before - after)
    }

    /// A checkpoint of this conversation through the fold's plan, with `summary` and the file
    /// lists of its base and of the elements it summarized (token figures not yet filled in).
    fn new_checkpoint(
        &self,
        conversation: &Conversation,
        fold: &Fold<'_>,
        summary: String,
    ) -> Result<Checkpoint, SummaryError> {
        let Fold {
            base,
            plan,
            views,
            trigger,
            ..
        } = *fold;
        let mut files = match base {
            Some(b) => files::FileOps::from_lists(&b.files_read, &b.files_modified),
            None => files::FileOps::default(),
        };
        files.collect(views.iter().map(|(_, view)| view));
        let (files_read, files_modified) = files.into_lists();
        let prefix_hash = identity::hex(&conversation.chain[plan.cut - 1]);
        let created_ms = crate::store::now_ms();
        let id = identity::hex(
            blake3::hash(format!("{prefix_hash}/{created_ms}/{}", self.replica).as_bytes())
                .as_bytes(),
        )[..24]
            .to_string();
        Ok(Checkpoint {
            id,
            tenant: identity::hex(&conversation.context.tenant),
            anchor: identity::hex(&conversation.anchor.ok_or(SummaryError::Nothing)?),
            covered: plan.cut,
            prefix_hash,
            pinned_user: plan.pinned_user,
            truncations: plan.truncations.clone(),
            summary,
            files_read,
            files_modified,
            tokens_before: 0,
            tokens_after: 0,
            created_ms,
            model: conversation.request.model().to_string(),
            ahead_of_time: trigger.ahead_of_time(),
            cleared: None,
        })
    }

    /// Stores what a fold has summarized so far as a checkpoint of its own, when it ends at a
    /// place the conversation may be cut and frees tokens: a fold cut short (a timeout, a client
    /// gone, a failing summarizer) leaves it behind, and the next request continues from there
    /// instead of starting over.
    async fn store_progress(
        &self,
        conversation: &Conversation,
        fold: &Fold<'_>,
        progress: Progress<'_>,
    ) {
        let folded = progress.folded;
        let Some(&last) = fold.span.get(folded.wrapping_sub(1)) else {
            return;
        };
        let cut = last + 1;
        let n = conversation.roles.len();
        let starts_a_unit = cut < n && !matches!(conversation.roles[cut], Role::Tool | Role::Other);
        if !starts_a_unit || cut <= fold.base.map_or(0, |b| b.covered) || cut >= fold.plan.cut {
            return;
        }
        let partial = plan::Plan {
            cut,
            pinned_user: fold.plan.pinned_user.filter(|&u| u < cut),
            truncations: vec![],
        };
        let previous = fold.base.map(|b| b.summary.as_str());
        let summary = record::attach(
            progress.text,
            &fold.views[..folded],
            previous,
            progress.encoding,
            progress.max_tokens,
        );
        let so_far = Fold {
            plan: &partial,
            span: &fold.span[..folded],
            views: &fold.views[..folded],
            ..*fold
        };
        let Ok(mut checkpoint) = self.new_checkpoint(conversation, &so_far, summary) else {
            return;
        };
        if self
            .fill_figures(conversation, fold.base, &mut checkpoint)
            .is_none()
        {
            return;
        }
        match self.store.put(&checkpoint).await {
            Ok(()) => tracing::info!(
                checkpoint = %checkpoint.id,
                covered = checkpoint.covered,
                "Kept the progress of a summary in chunks."
            ),
            Err(e) => {
                self.metrics.store_errors.inc();
                tracing::warn!(error = %e, "Storing the progress of a summary failed.");
            }
        }
    }
}
