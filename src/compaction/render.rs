//! Stage `rewrite`: the body that goes upstream, through a checkpoint ([`Engine::rewrite`]) or,
//! when no summary could be made and the request does not fit, with its oldest turns dropped
//! under a marker ([`Engine::fallback`]).

use crate::dialect::edits::{ClearedResult, Clearing};
use crate::dialect::{Role, Through};
use crate::store::{Checkpoint, Cleared};
use crate::tokenizer::REPLY_PRIMING;

use super::conversation::{sends_only_counted, Conversation, View};
use super::{Engine, Outcome, Prepared};

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
    ) -> Vec<u8> {
        let cleared = checkpoint
            .cleared
            .as_ref()
            .and_then(|cleared| conversation.request.cleared_copy(&clearing_of(cleared)));
        let request = cleared.as_deref().unwrap_or(conversation.request.as_ref());
        if checkpoint.covered == 0 {
            return request.original_body();
        }
        request.render(&Through {
            checkpoint,
            tokens: &conversation.message_tokens,
            merge_into_user,
            text,
        })
    }

    /// Serves a request without a new summary: through the checkpoint it already had if that
    /// fits, else with its oldest turns dropped under a marker.
    ///
    /// Dropping works on whole turns: the tail sent starts at a user element, after the
    /// instructions, so no tool result loses its call. The previous summary (if any) goes
    /// first, then the oldest kept turns, until the request fits or only the last user turn is
    /// left.
    pub(super) fn fallback(
        &self,
        conversation: &Conversation,
        view: &View<'_>,
        mut outcome: Outcome,
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
        let budget = conversation
            .limit
            .saturating_sub(conversation.reserve)
            .saturating_sub(
                conversation
                    .correction
                    .apply(conversation.measured.head_tokens + REPLY_PRIMING + MARKER_TOKENS),
            );
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
            instructions + kept
        };
        let candidates = (kept_from..=last_user).filter(|&i| roles[i] == Role::User);
        let mut start = last_user;
        for candidate in candidates {
            if conversation.correction.scale(sent_from(candidate)) <= budget {
                start = candidate;
                break;
            }
        }
        let dropped = (kept_from..start)
            .filter(|&i| !roles[i].is_instruction())
            .count();
        if dropped == 0 && view.checkpoint.is_none_or(|cp| cp.covered == 0) {
            return self.rewrite(conversation, view, outcome);
        }
        let omitted = match (dropped, view.checkpoint.is_some_and(|cp| cp.covered > 0)) {
            (0, _) => "the summary of its earlier turns".to_string(),
            (n, true) => format!("the summary of its earlier turns and the {n} messages after it"),
            (n, false) => format!("its {n} earliest messages"),
        };
        let marker = format!(
            "[Context trimmed] Part of this conversation was omitted because it did not fit in the model's context window and could not be summarized: {omitted}."
        );
        // Covers the dropped turns with the marker in place of a summary.
        let trimmed = Checkpoint {
            id: String::new(),
            tenant: String::new(),
            anchor: String::new(),
            covered: start,
            prefix_hash: String::new(),
            pinned_user: None,
            truncations: view
                .checkpoint
                .map(|cp| cp.truncations.clone())
                .unwrap_or_default(),
            summary: String::new(),
            files_read: vec![],
            files_modified: vec![],
            tokens_before: 0,
            tokens_after: 0,
            created_ms: 0,
            model: String::new(),
            ahead_of_time: false,
            cleared: None,
        };
        if let Some(status) = &mut outcome.status {
            status.served_by("dropped-oldest");
        }
        let raw = sent_from(start) + conversation.measured.head_tokens + REPLY_PRIMING;
        outcome.compacted = true;
        outcome.tokens_after = conversation.correction.apply(raw);
        outcome.sent_raw_tokens.raw = raw;
        outcome.sent_raw_tokens.countable = sends_only_counted(conversation, Some(&trimmed));
        Prepared {
            body: self.render(conversation, &trimmed, &marker, false),
            outcome,
        }
    }
}
