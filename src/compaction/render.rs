//! Stage `rewrite`: the body that goes upstream, through a checkpoint ([`Engine::rewrite`]) or,
//! when no summary could be made and the request does not fit, with its oldest turns dropped
//! under a marker ([`Engine::fallback`]).

use bytes::Bytes;

use crate::dialect::edits::{ClearedResult, Clearing};
use crate::dialect::{Role, Through, WireRequest};
use crate::store::{Checkpoint, Cleared};
use crate::tokenizer::REPLY_PRIMING;

use super::conversation::{sends_only_counted, Conversation, View};
use super::{record, Engine, Outcome, Prepared};

/// Room kept for the marker that says turns were dropped.
const MARKER_TOKENS: u64 = 64;

/// What a stored clearing asks its dialect to write into the request.
fn clearing_of(cleared: &Cleared) -> Clearing {
    Clearing {
        results: cleared
            .results
            .iter()
            .map(|r| ClearedResult {
                call_id: r.call_id.clone(),
                stub: r.stub.clone(),
            })
            .collect(),
        ..Clearing::default()
    }
}

/// `request`'s body through `checkpoint` (whose summary message says `text`), with the tool
/// results it clears stubbed; `tokens` are the request's element counts.
pub(super) fn render_through(
    request: &dyn WireRequest,
    tokens: &[u64],
    checkpoint: &Checkpoint,
    text: &str,
    merge_into_user: bool,
) -> Bytes {
    let cleared = checkpoint
        .cleared
        .as_ref()
        .and_then(|cleared| request.cleared_copy(&clearing_of(cleared)));
    let request = cleared.as_deref().unwrap_or(request);
    if checkpoint.covered == 0 {
        return request.original_body();
    }
    Bytes::from(request.render(&Through {
        checkpoint,
        tokens,
        merge_into_user,
        text,
    }))
}

impl Engine {
    /// Stage `rewrite`: the body through `view`'s checkpoint, with the outcome filled in.
    pub(super) fn rewrite(
        &self,
        conversation: &Conversation,
        view: &View<'_>,
        mut outcome: Outcome,
    ) -> Prepared {
        let Some(cp) = view.checkpoint else {
            return Prepared {
                body: conversation.request.original_body(),
                outcome,
            };
        };
        let text = self.summary_text(cp);
        outcome.compacted = true;
        outcome.checkpoint_id = Some(cp.id.clone());
        outcome.tokens_after = conversation.correction.apply(view.tokens);
        outcome.sent_raw_tokens.raw = view.tokens;
        outcome.sent_raw_tokens.countable = sends_only_counted(conversation, Some(cp));
        Prepared {
            body: self.render(conversation, cp, &text, self.config.merge_summary_into_user),
            outcome,
        }
    }

    /// The body through `checkpoint`, with the tool results it clears stubbed (a checkpoint of
    /// clearing alone sends every element, cleared, and no summary message).
    fn render(
        &self,
        conversation: &Conversation,
        checkpoint: &Checkpoint,
        text: &str,
        merge_into_user: bool,
    ) -> Bytes {
        render_through(
            conversation.request.as_ref(),
            &conversation.message_tokens,
            checkpoint,
            text,
            merge_into_user,
        )
    }

    /// Serves a request without a new summary: through the checkpoint it already had if that
    /// fits, else with its oldest turns dropped under a marker.
    ///
    /// Dropping works on whole turns: the tail sent starts at a user element, after the
    /// instructions, so no tool result loses its call. The summary is the densest part of what
    /// is sent, so it goes last: first the oldest verbatim turns after it, until the request
    /// fits beside it or only the last user turn is left; then the summary is fitted again into
    /// the room left beside that turn ([`record::refit`]); only when not even a short summary
    /// fits is it dropped too, and the oldest turns with it.
    pub(super) fn fallback(
        &self,
        conversation: &Conversation,
        view: &View<'_>,
        outcome: Outcome,
    ) -> Prepared {
        self.trim_to_fit(conversation, view, outcome, SummaryKept::IfItFits)
    }

    /// The request through a summary just written that leaves it over the limit: brought
    /// under it as [`Engine::fallback`] does, but never by dropping that summary (sent over the
    /// limit instead, for the provider to judge: a summary costs more to make again than the
    /// output reserve it crowds).
    pub(super) fn fit_beside_new_summary(
        &self,
        conversation: &Conversation,
        view: &View<'_>,
        outcome: Outcome,
    ) -> Prepared {
        self.trim_to_fit(conversation, view, outcome, SummaryKept::Always)
    }

    fn trim_to_fit(
        &self,
        conversation: &Conversation,
        view: &View<'_>,
        outcome: Outcome,
        summary_kept: SummaryKept,
    ) -> Prepared {
        if self.fits(conversation, view) {
            return self.rewrite(conversation, view, outcome);
        }
        let roles = &conversation.roles;
        let tokens = &conversation.message_tokens;
        let kept_from = view.checkpoint.map_or(0, |cp| cp.covered.min(roles.len()));
        let Some(last_user) = roles.iter().rposition(|r| *r == Role::User) else {
            return self.rewrite(conversation, view, outcome);
        };
        let correction = conversation.correction;
        let budget = conversation
            .limit
            .saturating_sub(conversation.reserve)
            .saturating_sub(
                correction.apply(conversation.measured.head_tokens + REPLY_PRIMING + MARKER_TOKENS),
            );
        // The checkpoint's pinned user message, sent after its summary while the tail starts
        // where the checkpoint cut.
        let pinned = view
            .checkpoint
            .and_then(|cp| cp.pinned_user)
            .filter(|&p| p < kept_from);
        // What is sent from `start` on: instructions before it, every element after it.
        let sent_from = |start: usize| -> u64 {
            let instructions: u64 = (0..start)
                .filter(|&i| roles[i].is_instruction())
                .map(|i| tokens[i])
                .sum();
            let kept: u64 = (start..roles.len())
                .map(|i| {
                    match view
                        .checkpoint
                        .and_then(|cp| cp.truncations.iter().find(|t| t.index == i))
                    {
                        Some(t) => tokens[i].min(t.keep_tokens.saturating_add(40)),
                        None => tokens[i],
                    }
                })
                .sum();
            let pinned = pinned
                .filter(|_| start == kept_from)
                .map_or(0, |p| tokens[p]);
            instructions + kept + pinned
        };
        let fits_beside =
            |start: usize, extra: u64| correction.scale(sent_from(start) + extra) <= budget;
        // Where the tail may start: a user element at or after the checkpoint's cut (when the
        // checkpoint cut inside the last turn, at that cut, the pinned message kept).
        let starts: Vec<usize> = (kept_from..=last_user)
            .filter(|&i| roles[i] == Role::User)
            .collect();
        let newest_start = starts.last().copied().unwrap_or(kept_from);

        if let Some(cp) = view.checkpoint.filter(|cp| cp.covered > 0) {
            let summary_tokens = self.summary_tokens(conversation, cp);
            if let Some(&start) = starts
                .iter()
                .find(|&&start| start > kept_from && fits_beside(start, summary_tokens))
            {
                return self.trimmed(conversation, view, outcome, Trim::after_summary(cp, start));
            }
            // Not even beside the last turn: the summary in the room that turn leaves.
            let encoding = conversation.measured.encoding;
            let framing = summary_tokens.saturating_sub(encoding.count(&cp.summary));
            let room = correction
                .unscale(budget)
                .saturating_sub(sent_from(newest_start))
                .saturating_sub(framing);
            if room >= MIN_REFIT_TOKENS {
                let trim = Trim {
                    summary: Some(record::refit(&cp.summary, encoding, room)),
                    refitted: true,
                    ..Trim::after_summary(cp, newest_start)
                };
                return self.trimmed(conversation, view, outcome, trim);
            }
            if summary_kept == SummaryKept::Always {
                return self.rewrite(conversation, view, outcome);
            }
        }
        let start = starts
            .iter()
            .copied()
            .find(|&start| fits_beside(start, 0))
            .unwrap_or(newest_start);
        let drops_nothing = (kept_from..start).all(|i| roles[i].is_instruction());
        if drops_nothing && view.checkpoint.is_none_or(|cp| cp.covered == 0) {
            return self.rewrite(conversation, view, outcome);
        }
        let trim = Trim {
            start,
            summary: None,
            pinned_user: pinned.filter(|_| start == kept_from),
            files: (vec![], vec![]),
            refitted: false,
        };
        self.trimmed(conversation, view, outcome, trim)
    }

    /// The request with the elements before `trim.start` dropped under a marker, after the
    /// summary `trim` keeps, if any.
    fn trimmed(
        &self,
        conversation: &Conversation,
        view: &View<'_>,
        mut outcome: Outcome,
        trim: Trim,
    ) -> Prepared {
        let kept_from = view.checkpoint.map_or(0, |cp| cp.covered);
        let dropped = (kept_from..trim.start)
            .filter(|&i| !conversation.roles[i].is_instruction())
            .count();
        let had_summary = view.checkpoint.is_some_and(|cp| cp.covered > 0);
        let marker = match (&trim.summary, dropped) {
            (Some(_), 0) => {
                "[Context trimmed] This summary was shortened to fit in the model's context window."
                    .to_string()
            }
            (Some(_), n) if trim.refitted => format!(
                "[Context trimmed] This summary was shortened, and the {n} messages after it omitted, to fit in the model's context window."
            ),
            (Some(_), n) => format!(
                "[Context trimmed] The {n} messages after this summary were omitted because they did not fit in the model's context window."
            ),
            (None, 0) => omitted_marker("the summary of its earlier turns"),
            (None, n) if had_summary => omitted_marker(&format!(
                "the summary of its earlier turns and the {n} messages after it"
            )),
            (None, n) => omitted_marker(&format!("its {n} earliest messages")),
        };
        let (files_read, files_modified) = trim.files;
        // Covers the dropped turns, with the summary kept (and the marker after it) or the
        // marker in its place.
        let trimmed = Checkpoint {
            id: String::new(),
            tenant: String::new(),
            anchor: String::new(),
            covered: trim.start,
            prefix_hash: String::new(),
            pinned_user: trim.pinned_user,
            truncations: view
                .checkpoint
                .map(|cp| cp.truncations.clone())
                .unwrap_or_default(),
            summary: trim.summary.clone().unwrap_or_default(),
            files_read,
            files_modified,
            tokens_before: 0,
            tokens_after: 0,
            created_ms: 0,
            model: String::new(),
            ahead_of_time: false,
            cleared: None,
        };
        let (text, merge) = match &trim.summary {
            Some(_) => (
                format!("{}\n{marker}", self.summary_text(&trimmed)),
                self.config.merge_summary_into_user,
            ),
            None => (marker, false),
        };
        if let Some(status) = &mut outcome.status {
            status.served_by("dropped-oldest");
        }
        // What the view counts for the summary message, replaced by the text actually sent
        // (the summary with the marker after it, or the marker alone).
        let encoding = conversation.measured.encoding;
        let viewed = self.view(conversation, Some(&trimmed)).tokens;
        let raw = match trimmed.covered {
            0 => viewed,
            _ => (viewed + conversation.request.summary_tokens(encoding, &text))
                .saturating_sub(self.summary_tokens(conversation, &trimmed)),
        };
        outcome.compacted = true;
        outcome.tokens_after = conversation.correction.apply(raw);
        outcome.sent_raw_tokens.raw = raw;
        outcome.sent_raw_tokens.countable = sends_only_counted(conversation, Some(&trimmed));
        Prepared {
            body: self.render(conversation, &trimmed, &text, merge),
            outcome,
        }
    }
}

/// Whether a fallback may drop the checkpoint's summary when nothing else brings the request
/// under its limit.
#[derive(Clone, Copy, PartialEq, Eq)]
enum SummaryKept {
    IfItFits,
    Always,
}

/// Least room a summary is fitted again into when it does not fit whole: below it, the request
/// goes without the summary.
const MIN_REFIT_TOKENS: u64 = 128;

fn omitted_marker(omitted: &str) -> String {
    format!(
        "[Context trimmed] Part of this conversation was omitted because it did not fit in the model's context window and could not be summarized: {omitted}."
    )
}

/// What a fallback sends: the elements from `start` on (instructions always), after the summary
/// it keeps, if any.
struct Trim {
    start: usize,
    /// The summary kept before the tail: the checkpoint's, or fitted again into less room.
    summary: Option<String>,
    pinned_user: Option<usize>,
    /// Files read and modified, sent with a kept summary.
    files: (Vec<String>, Vec<String>),
    /// The summary was fitted again into less room than it was written for.
    refitted: bool,
}

impl Trim {
    /// `cp`'s summary kept whole, the tail from `start` on (its pinned user message kept only
    /// when the tail starts at its cut).
    fn after_summary(cp: &Checkpoint, start: usize) -> Trim {
        Trim {
            start,
            summary: Some(cp.summary.clone()),
            pinned_user: cp
                .pinned_user
                .filter(|&p| start == cp.covered && p < cp.covered),
            files: (cp.files_read.clone(), cp.files_modified.clone()),
            refitted: false,
        }
    }
}
