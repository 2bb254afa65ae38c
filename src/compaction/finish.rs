//! The last stage: the body that goes upstream, through a checkpoint ([`Engine::rewrite`]) or,
//! when no summary could be made and the request does not fit, with its oldest turns dropped
//! under a marker ([`Engine::fallback`]).

use std::borrow::Cow;

use serde_json::value::RawValue;

use crate::measure::{calibration, REPLY_PRIMING};
use crate::request::Role;

use super::conversation::{Conversation, View};
use super::{rewrite, Engine, Outcome, Prepared};

impl Engine {
    /// Stage `rewrite`: the body through `view`'s checkpoint, with the outcome filled in.
    pub(super) fn rewrite(
        &self,
        conversation: &Conversation<'_>,
        view: &View<'_>,
        mut outcome: Outcome,
    ) -> Prepared {
        let Some(cp) = view.checkpoint else {
            return Prepared {
                body: conversation.request.original_body(conversation.force_usage),
                outcome,
            };
        };
        let messages = rewrite::rewrite(
            conversation.request,
            cp,
            &conversation.message_tokens,
            self.config.merge_summary_into_user,
        );
        outcome.compacted = true;
        outcome.checkpoint_id = Some(cp.id.clone());
        outcome.tokens_after = calibration::apply(view.tokens, conversation.factor);
        outcome.sent_raw_tokens = view.tokens;
        Prepared {
            body: conversation
                .request
                .to_body(messages.iter().map(|m| &**m), conversation.force_usage),
            outcome,
        }
    }

    /// Serves a request without a new summary: through the checkpoint it already had if that
    /// fits, else with its oldest turns dropped under a marker.
    pub(super) fn fallback(
        &self,
        conversation: &Conversation<'_>,
        view: &View<'_>,
        mut outcome: Outcome,
    ) -> Prepared {
        if self.fits(conversation, view) {
            return self.rewrite(conversation, view, outcome);
        }
        let base: Vec<Cow<RawValue>> = match view.checkpoint {
            Some(cp) => rewrite::rewrite(
                conversation.request,
                cp,
                &conversation.message_tokens,
                false,
            ),
            None => conversation
                .request
                .messages
                .iter()
                .map(|m| Cow::Borrowed(&*m.raw))
                .collect(),
        };
        let parsed: Vec<crate::request::Message> = base
            .iter()
            .filter_map(|m| crate::request::Message::parse(m.as_ref().to_owned()).ok())
            .collect();
        let encoding = conversation.measured.encoding;
        let tokens: Vec<u64> = parsed
            .iter()
            .map(|m| self.meter.message(encoding, m).tokens)
            .collect();
        let budget = conversation
            .limit
            .saturating_sub(conversation.reserve)
            .saturating_sub(conversation.measured.tools_tokens + REPLY_PRIMING + 64);
        let total: u64 = tokens.iter().sum();
        let mut dropped = 0usize;
        let mut remaining = calibration::apply(total, conversation.factor);
        let mut start = parsed
            .iter()
            .position(|m| !m.role.is_instruction())
            .unwrap_or(parsed.len());
        let last_user = parsed
            .iter()
            .rposition(|m| m.role == Role::User)
            .unwrap_or(parsed.len());
        while remaining > budget && start < last_user {
            // Drop a whole turn: up to the next user message.
            let next = (start + 1..parsed.len())
                .find(|&i| parsed[i].role == Role::User)
                .unwrap_or(last_user);
            for i in start..next {
                if !parsed[i].role.is_instruction() {
                    remaining = remaining
                        .saturating_sub(calibration::apply(tokens[i], conversation.factor));
                    dropped += 1;
                }
            }
            start = next;
        }
        if dropped == 0 {
            return self.rewrite(conversation, view, outcome);
        }
        let marker = rewrite::summary_message(&format!(
            "[Context trimmed] {dropped} earlier messages of this conversation were omitted because they did not fit in the model's context window and could not be summarized."
        ));
        let first_turn = parsed
            .iter()
            .position(|m| !m.role.is_instruction())
            .unwrap_or(0);
        let mut messages: Vec<&RawValue> = Vec::new();
        messages.extend(parsed[..first_turn].iter().map(|m| &*m.raw));
        messages.push(&marker);
        messages.extend(
            parsed[start..]
                .iter()
                .filter(|m| !m.role.is_instruction())
                .map(|m| &*m.raw),
        );
        if let Some(status) = &mut outcome.status {
            status.served_by("dropped-oldest");
        }
        outcome.compacted = true;
        outcome.tokens_after = remaining;
        outcome.sent_raw_tokens = (remaining as f64 / conversation.factor) as u64;
        Prepared {
            body: conversation
                .request
                .to_body(messages, conversation.force_usage),
            outcome,
        }
    }
}
