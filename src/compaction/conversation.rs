//! The first stages of a request: identify the conversation, measure it, and look it up among
//! the stored checkpoints; plus what a request costs through a checkpoint (a [`View`]).

use std::sync::Arc;

use crate::dialect::{Role, WireRequest};
use crate::identity::{self, Hash};
use crate::measure::calibration::Correction;
use crate::measure::Measured;
use crate::store::Checkpoint;
use crate::tokenizer::REPLY_PRIMING;

use super::learn::LiveFacts;
use super::{Applied, CannotFit, Engine, Outcome, Refusal, RequestContext};

/// The conversation as seen through a checkpoint: which messages are sent and what they cost.
pub(super) struct View<'c> {
    pub(super) checkpoint: Option<&'c Checkpoint>,
    /// Raw tokens of what would be sent (messages, summary, tools, priming).
    pub(super) tokens: u64,
}

/// Everything about one request that the stages share.
#[derive(Clone)]
pub(super) struct Conversation {
    pub(super) request: Arc<dyn WireRequest>,
    pub(super) measured: Measured,
    pub(super) chain: Vec<Hash>,
    pub(super) anchor: Option<Hash>,
    pub(super) roles: Vec<Role>,
    pub(super) message_tokens: Vec<u64>,
    /// Which elements carry media whose cost is a guess for this request's model
    /// ([`WireRequest::media_cost`], [`WireRequest::media_rules_apply`]).
    pub(super) guessed_media: Vec<bool>,
    /// Whose request it is, as learned facts name tenants ([`super::learn::tenant_tag`]).
    pub(super) tenant: u64,
    pub(super) correction: Correction,
    pub(super) window: u64,
    /// `window - margin`.
    pub(super) limit: u64,
    pub(super) reserve: u64,
    /// Who asked, and how (tenant, credentials, mode, instructions).
    pub(super) context: RequestContext,
}

/// Whether `checkpoint` applies to the conversation whose chain is `chain`: it summarizes a
/// prefix of it, or clears tool results in it, or both, and the conversation holds every
/// element it read.
pub(super) fn matches_prefix(checkpoint: &Checkpoint, chain: &[Hash]) -> bool {
    let shares =
        |through: usize, hash: &str| chain.get(through).is_some_and(|h| identity::hex(h) == hash);
    let summary = match checkpoint.covered {
        0 => checkpoint.cleared.is_some(),
        covered => shares(covered - 1, &checkpoint.prefix_hash),
    };
    let cleared = checkpoint.cleared.as_ref().is_none_or(|cleared| {
        cleared
            .through()
            .is_some_and(|through| shares(through, &cleared.through_hash))
    });
    summary && cleared
}

/// Whether what is sent through `checkpoint` (instructions, the pinned user element, the kept
/// elements) is all counted: no media whose cost we could only guess.
pub(super) fn sends_only_counted(
    conversation: &Conversation,
    checkpoint: Option<&Checkpoint>,
) -> bool {
    let guessed = &conversation.guessed_media;
    let covered = checkpoint.map_or(0, |c| c.covered.min(guessed.len()));
    let pinned = checkpoint.and_then(|c| c.pinned_user);
    !guessed.iter().enumerate().any(|(i, &guess)| {
        guess && (i >= covered || conversation.roles[i].is_instruction() || Some(i) == pinned)
    })
}

/// Whether `checkpoint` summarizes all of the conversation, nothing left verbatim (what a
/// client-requested compaction makes).
pub(super) fn covers_all(checkpoint: &Checkpoint, conversation: &Conversation) -> bool {
    checkpoint.covered == conversation.roles.len()
        && checkpoint.pinned_user.is_none()
        && matches_prefix(checkpoint, &conversation.chain)
}

impl Engine {
    /// Stage `identify`: hashes the measured elements into the conversation's chain and finds
    /// the anchor; [`Engine::with_facts`] then gives it the model's window, margin and reserve.
    pub(super) fn identify(
        &self,
        context: &RequestContext,
        request: &Arc<dyn WireRequest>,
        measured: Measured,
    ) -> Conversation {
        let chain = identity::chain(
            &context.tenant,
            measured.elements.iter().map(|m| m.canonical),
        );
        let roles: Vec<Role> = (0..request.len()).map(|i| request.role(i)).collect();
        let first_turn = roles.iter().position(|r| !r.is_instruction());
        let anchor = identity::anchor(&chain, first_turn);
        let message_tokens = measured.elements.iter().map(|m| m.tokens).collect();
        let rules_apply = request.media_rules_apply();
        let guessed_media = measured
            .elements
            .iter()
            .map(|m| m.media.is_guess(rules_apply))
            .collect();
        Conversation {
            request: request.clone(),
            measured,
            chain,
            anchor,
            roles,
            message_tokens,
            guessed_media,
            tenant: super::learn::tenant_tag(&context.tenant),
            correction: Correction::NEUTRAL,
            window: 0,
            limit: 0,
            reserve: 0,
            context: context.clone(),
        }
    }

    /// `conversation` with the window, margin, output reserve and correction that `facts` give
    /// for its model (learned again after an overflow; nothing else changes).
    pub(super) fn with_facts(&self, conversation: Conversation, live: &LiveFacts) -> Conversation {
        let model = conversation.request.model();
        let window = self.window_of(model, &live.facts, Some(conversation.tenant));
        let correction = live.correction;
        let margin = self.config.margin_tokens.min(window / 16);
        let reserve = conversation
            .request
            .output_reserve(self.config.reserve_output_tokens.min(window / 4));
        Conversation {
            correction,
            window,
            limit: window.saturating_sub(margin),
            reserve,
            ..conversation
        }
    }

    /// Stage `stored_checkpoints`: those that match this conversation's prefix, newest first.
    pub(super) async fn stored_checkpoints(
        &self,
        conversation: &Conversation,
        outcome: &mut Outcome,
    ) -> Vec<Checkpoint> {
        let Some(anchor) = conversation.anchor else {
            return vec![];
        };
        match self.store.for_anchor(&identity::hex(&anchor)).await {
            Ok(list) => {
                let matching: Vec<Checkpoint> = list
                    .iter()
                    .filter(|c| matches_prefix(c, &conversation.chain))
                    .cloned()
                    .collect();
                let hit = if matching.is_empty() { "miss" } else { "hit" };
                self.metrics
                    .checkpoint_lookups
                    .get_or_create(&crate::metrics::ResultLabel { result: hit })
                    .inc();
                matching
            }
            Err(e) => {
                self.metrics.store_errors.inc();
                outcome.store_degraded = true;
                tracing::warn!(error = %e, "Reading checkpoints failed; continuing without them.");
                vec![]
            }
        }
    }

    /// Stage `apply_checkpoint`: sends the request through a checkpoint prepared ahead of time
    /// that covers more than the newest regular one, when it fits and `apply_when_ready` is on;
    /// else through the newest regular checkpoint when that fits; else through the one
    /// prepared ahead of time when that fits; otherwise reports the best view found. A `forced`
    /// request never stops here.
    pub(super) async fn apply_checkpoint<'c>(
        self: &Arc<Self>,
        conversation: &Conversation,
        checkpoints: &'c [Checkpoint],
        forced: bool,
        outcome: &mut Outcome,
    ) -> Applied<'c> {
        let regular = checkpoints.iter().find(|c| !c.ahead_of_time);
        let ready = checkpoints
            .iter()
            .find(|c| c.ahead_of_time && c.covered > regular.map_or(0, |r| r.covered));
        // The view through the ready checkpoint, once made: it is made at most once.
        let mut through_ready = None;
        if let Some(ready) = ready.filter(|_| self.config.apply_when_ready && !forced) {
            // Sent through the summary as soon as it is there: every request from here on is
            // smaller, and what follows its cut is written to the provider's cache once.
            let view = self.view(conversation, Some(ready));
            if self.fits(conversation, &view) {
                return self.through_ready(conversation, view, outcome);
            }
            through_ready = Some(view);
        }
        let view = self.view(conversation, regular);
        if !forced && self.fits(conversation, &view) {
            // Past the soft threshold a summary would start in the background: clearing old
            // tool results first may make it unneeded.
            if let Some(soft) = self.soft_budget(conversation) {
                if self.needed(conversation, &view) > soft {
                    if let Some(cleared) = self.clear_tail(conversation, &view, soft).await {
                        let view = self.view(conversation, Some(&cleared));
                        let prepared = self.rewrite(conversation, &view, std::mem::take(outcome));
                        return Applied::Ready(prepared);
                    }
                }
            }
            self.maybe_start_background(conversation, &view);
            return Applied::Ready(self.rewrite(conversation, &view, std::mem::take(outcome)));
        }
        // Over the limit: a checkpoint prepared ahead of time may be all that is needed.
        let Some(ready) = ready else {
            return Applied::OverLimit(view);
        };
        let view = through_ready.unwrap_or_else(|| self.view(conversation, Some(ready)));
        if !forced && self.fits(conversation, &view) {
            return self.through_ready(conversation, view, outcome);
        }
        Applied::OverLimit(view)
    }

    /// Sends the request through a checkpoint prepared ahead of time, which fits.
    fn through_ready<'c>(
        self: &Arc<Self>,
        conversation: &Conversation,
        view: View<'c>,
        outcome: &mut Outcome,
    ) -> Applied<'c> {
        self.note_ready_used(view.checkpoint, outcome);
        // The conversation keeps growing from here: prepare its next summary early too.
        self.maybe_start_background(conversation, &view);
        Applied::Ready(self.rewrite(conversation, &view, std::mem::take(outcome)))
    }

    /// Tokens of a checkpoint's summary message. A checkpoint never changes, so the message is
    /// rendered and counted once per checkpoint, not on every request that applies it; one
    /// without an id (made for one request, never stored) is counted each time.
    pub(super) fn summary_tokens(
        &self,
        conversation: &Conversation,
        checkpoint: &Checkpoint,
    ) -> u64 {
        let (request, encoding) = (&conversation.request, conversation.measured.encoding);
        if checkpoint.id.is_empty() {
            return request.summary_tokens(encoding, &self.summary_text(checkpoint));
        }
        let key = (request.dialect(), encoding, checkpoint.id.clone());
        if let Some(tokens) = self.summary_tokens.get(&key) {
            return tokens;
        }
        let text = self.summary_text(checkpoint);
        let tokens = request.summary_tokens(encoding, &text);
        self.summary_tokens.insert(key, tokens);
        tokens
    }

    /// Marks the request as served by a summary prepared ahead of time, and counts it, when
    /// `served_through` is one: applied as it is, as the base of a clearing or a fallback, or
    /// another request's that finished while this one waited; never a summary of its own.
    pub(super) fn note_ready_used(
        &self,
        served_through: Option<&Checkpoint>,
        outcome: &mut Outcome,
    ) {
        if served_through.is_some_and(|c| c.ahead_of_time) && !outcome.ready_checkpoint_used {
            outcome.ready_checkpoint_used = true;
            self.metrics.ready_checkpoints_used.inc();
        }
    }

    /// What the request costs when sent through `checkpoint`.
    pub(super) fn view<'c>(
        &self,
        conversation: &Conversation,
        checkpoint: Option<&'c Checkpoint>,
    ) -> View<'c> {
        let Some(cp) = checkpoint else {
            return View {
                checkpoint: None,
                tokens: conversation.measured.total(),
            };
        };
        self.view_until(conversation, cp, conversation.message_tokens.len())
    }

    /// What the request's first `end` elements cost when sent through `cp` (what a summary
    /// request that continues the conversation repeats of it). What the checkpoint's clearing
    /// freed is taken off whole: the results it cleared are old ones, before any cut.
    pub(super) fn view_until<'c>(
        &self,
        conversation: &Conversation,
        cp: &'c Checkpoint,
        end: usize,
    ) -> View<'c> {
        let fixed = conversation.measured.head_tokens + REPLY_PRIMING;
        let tokens = &conversation.message_tokens[..end.min(conversation.message_tokens.len())];
        let covered = cp.covered.min(tokens.len());
        let instructions: u64 = (0..covered)
            .filter(|&i| conversation.roles[i].is_instruction())
            .map(|i| tokens[i])
            .sum();
        let pinned = cp
            .pinned_user
            .filter(|&p| p < covered)
            .map_or(0, |p| tokens[p]);
        let kept: u64 = (covered..tokens.len())
            .map(|i| match cp.truncations.iter().find(|t| t.index == i) {
                Some(t) => tokens[i].min(t.keep_tokens.saturating_add(40)),
                None => tokens[i],
            })
            .sum();
        // A checkpoint of clearing alone has no summary message.
        let summary = match cp.covered {
            0 => 0,
            _ => self.summary_tokens(conversation, cp),
        };
        let freed: u64 = cp
            .cleared
            .iter()
            .flat_map(|c| &c.results)
            .map(|r| r.freed_tokens)
            .sum();
        View {
            checkpoint: Some(cp),
            tokens: (fixed + instructions + pinned + kept + summary).saturating_sub(freed),
        }
    }

    pub(super) fn fits(&self, conversation: &Conversation, view: &View<'_>) -> bool {
        self.needed(conversation, view) <= conversation.limit
    }

    /// Calibrated tokens the request takes through `view`, its output reserve included.
    pub(super) fn needed(&self, conversation: &Conversation, view: &View<'_>) -> u64 {
        // Saturating: a client may ask for any output budget, up to `u64::MAX`.
        conversation
            .correction
            .apply(view.tokens)
            .saturating_add(conversation.reserve)
    }

    /// Raw tokens of the instruction (system/developer) messages.
    pub(super) fn instruction_tokens(conversation: &Conversation) -> u64 {
        conversation
            .roles
            .iter()
            .zip(&conversation.message_tokens)
            .filter(|(r, _)| r.is_instruction())
            .map(|(_, t)| t)
            .sum()
    }

    /// Stage `check_fits_at_all`: refuses requests whose instructions, tools and last user
    /// message cannot fit whatever is summarized, alone or beside the output budget the client
    /// asked for (as reserved: capped at the configured share), saying which. Only our own
    /// count refuses: when only the learned correction says they do not fit, the request is
    /// sent (compacted as far as it goes) and the provider's answer teaches the correction, or
    /// shows it right.
    pub(super) fn check_fits_at_all(&self, conversation: &Conversation) -> Result<(), Refusal> {
        let instructions = Self::instruction_tokens(conversation);
        let last_user = conversation
            .roles
            .iter()
            .rposition(|r| *r == Role::User)
            .map_or(0, |i| conversation.message_tokens[i]);
        let raw = instructions + last_user + conversation.measured.head_tokens + REPLY_PRIMING;
        let prompt = conversation.correction.apply(raw).min(raw);
        if prompt > conversation.limit {
            return Err(Refusal::Prompt(CannotFit {
                needed: prompt,
                window: conversation.window,
            }));
        }
        // Only a budget the client asked for must fit; the configured share may shrink.
        let Some(asked) = conversation.request.max_output_tokens() else {
            return Ok(());
        };
        let needed = prompt.saturating_add(conversation.reserve);
        if needed > conversation.limit {
            return Err(Refusal::OutputBudget {
                needed,
                window: conversation.window,
                prompt,
                reserved: conversation.reserve,
                asked,
            });
        }
        Ok(())
    }
}
