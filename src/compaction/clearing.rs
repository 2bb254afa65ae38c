//! Clearing old tool output and old reasoning in place, with no model call: which tool results
//! become one-line stubs (and which inputs are emptied), and which assistant turns lose their
//! thinking. One planner for every dialect, for the edits a client asks for (Anthropic's
//! `context_management`); the engine's own cheapest step before a summary ([`super::tail_clearing`])
//! finds the tool uses and writes their stubs with the same code, and stores what it cleared.
//!
//! ## Stable between clearings
//!
//! A provider's prompt cache hits only while the forwarded prefix stays the same, so a clearing,
//! once made, is made again identically on every later request until the next one is due. No
//! state is kept for that: a conversation only grows, so [`plan`] replays it from the start,
//! as if a request had ended after every user or tool turn, and clears wherever the trigger
//! fired on that replay. A later request replays the same prefix to the same clearings and adds
//! one only where its own new turns fire the trigger. Replicas agree without sharing anything,
//! and no tenant's clearing can be applied to another's conversation. (The engine's own clearing
//! is stored as a checkpoint instead, since it depends on the summaries before it.)

use std::collections::BTreeSet;

use crate::dialect::edits::{
    AppliedEdit, ClearInputs, ClearThinking, ClearToolUses, ClearTrigger, Clearable, ClearedResult,
    Clearing, ContextEdits,
};
use crate::dialect::{Role, WireRequest};
use crate::tokenizer::REPLY_PRIMING;

use super::Engine;

/// The one line a cleared tool result becomes: the tool, the size of what it returned and its
/// outcome, so the model knows something was there and may call the tool again.
pub fn result_stub(tool: &str, tokens: u64, is_error: bool) -> String {
    let outcome = if is_error { ", an error" } else { "" };
    format!("[result of {tool} cleared to save context: {tokens} tokens{outcome}]")
}

/// Tokens of an emptied tool input (`{}`).
const EMPTY_INPUT_TOKENS: u64 = 1;

/// The conversation as the planner reads it: per element its role, tokens and what may be
/// cleared, and the tokens of everything else the prompt holds (instructions, tools, priming).
pub struct Conversation<'a> {
    pub head_tokens: u64,
    pub roles: &'a [Role],
    pub tokens: &'a [u64],
    pub clearable: &'a [Clearable],
}

/// What to clear and what the answer reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Planned {
    pub clearing: Clearing,
    pub applied: Vec<AppliedEdit>,
}

/// One tool call with its result.
pub(super) struct ToolUse<'a> {
    pub(super) call_id: &'a str,
    pub(super) tool: &'a str,
    /// The element that carries the result (an index into the elements planned on).
    pub(super) result_at: usize,
    /// Tokens freed when it is cleared.
    pub(super) freed: u64,
    pub(super) stub: String,
    clears_input: bool,
}

/// Plans `edits` on `conversation`; `count` counts a text's tokens (for the stubs).
pub fn plan(
    edits: &ContextEdits,
    conversation: &Conversation<'_>,
    count: impl Fn(&str) -> u64,
) -> Planned {
    let n = conversation.roles.len();
    let mut planned = Planned::default();
    if n == 0 {
        return planned;
    }
    let thinking = edits
        .thinking
        .map(|edit| ThinkingTurns::new(conversation, edit));
    if let Some(turns) = &thinking {
        let (elements, cleared_turns, tokens) = turns.cleared_at(n - 1);
        if !elements.is_empty() {
            planned.clearing.thinking = elements;
            planned.applied.push(AppliedEdit::Thinking {
                cleared_thinking_turns: cleared_turns,
                cleared_input_tokens: tokens,
            });
        }
    }
    if let Some(edit) = &edits.tool_uses {
        let uses = tool_uses(conversation.clearable, &edit.clear_inputs, &count);
        let freed_thinking = |p: usize| thinking.as_ref().map_or(0, |t| t.tokens_at(p));
        let cleared = replay(conversation, edit, &uses, freed_thinking);
        let mut freed = 0;
        for use_ in cleared.iter().map(|&u| &uses[u]) {
            freed += use_.freed;
            planned.clearing.results.push(ClearedResult {
                call_id: use_.call_id.to_string(),
                stub: use_.stub.clone(),
            });
            if use_.clears_input {
                planned.clearing.inputs.insert(use_.call_id.to_string());
            }
        }
        if !cleared.is_empty() {
            planned.applied.push(AppliedEdit::ToolUses {
                cleared_tool_uses: cleared.len() as u64,
                cleared_input_tokens: freed,
            });
        }
    }
    planned
}

/// The tool uses whose results are among `clearable` (what each element of a conversation, or
/// of its verbatim tail, may clear), in the order they were called; `clear_inputs` says whose
/// inputs go with them.
pub(super) fn tool_uses<'a>(
    clearable: &'a [Clearable],
    clear_inputs: &ClearInputs,
    count: &impl Fn(&str) -> u64,
) -> Vec<ToolUse<'a>> {
    let mut uses = Vec::new();
    for (i, element) in clearable.iter().enumerate() {
        for call in &element.calls {
            // Results answer the calls of the step before them (a few elements on at most).
            let result = clearable[i + 1..]
                .iter()
                .enumerate()
                .find_map(|(d, later)| {
                    later
                        .results
                        .iter()
                        .find(|r| r.call_id == call.id)
                        .map(|r| (i + 1 + d, r))
                });
            let Some((result_at, result)) = result else {
                continue;
            };
            let stub = result_stub(&call.tool, result.tokens, result.is_error);
            let clears_input = clear_inputs.covers(&call.tool);
            let input_freed = if clears_input {
                call.input_tokens.saturating_sub(EMPTY_INPUT_TOKENS)
            } else {
                0
            };
            uses.push(ToolUse {
                call_id: &call.id,
                tool: &call.tool,
                result_at,
                freed: result.tokens.saturating_sub(count(&stub)) + input_freed,
                stub,
                clears_input,
            });
        }
    }
    uses
}

/// Replays the conversation turn by turn and returns the tool uses cleared by its end (indices
/// into `uses`, in order): at each point where a request may end, the trigger is checked on the
/// prompt as it would be sent then, and when it fires every older use but the newest `keep` is
/// cleared, if that frees at least `clear_at_least` tokens.
fn replay(
    conversation: &Conversation<'_>,
    edit: &ClearToolUses,
    uses: &[ToolUse<'_>],
    freed_thinking: impl Fn(usize) -> u64,
) -> Vec<usize> {
    let n = conversation.roles.len();
    let mut cleared = vec![false; uses.len()];
    let (mut sent, mut freed, mut complete, mut cleared_count) =
        (conversation.head_tokens, 0, 0, 0);
    for p in 0..n {
        sent += conversation.tokens[p];
        while complete < uses.len() && uses[complete].result_at <= p {
            complete += 1;
        }
        let ends_a_request =
            matches!(conversation.roles[p], Role::User | Role::Tool | Role::Other) || p == n - 1;
        if !ends_a_request {
            continue;
        }
        let fired = match edit.trigger {
            ClearTrigger::InputTokens(limit) => {
                sent.saturating_sub(freed + freed_thinking(p)) > limit
            }
            ClearTrigger::ToolUses(limit) => (complete - cleared_count) as u64 > limit,
        };
        if !fired {
            continue;
        }
        let older = complete.saturating_sub(edit.keep.min(complete as u64) as usize);
        let candidates: Vec<usize> = (0..older)
            .filter(|&u| !cleared[u] && !edit.exclude_tools.contains(uses[u].tool))
            .collect();
        let gain: u64 = candidates.iter().map(|&u| uses[u].freed).sum();
        if candidates.is_empty() || gain < edit.clear_at_least {
            continue;
        }
        for u in candidates {
            cleared[u] = true;
            cleared_count += 1;
        }
        freed += gain;
    }
    (0..uses.len()).filter(|&u| cleared[u]).collect()
}

/// Assistant turns (the assistant steps between two user requests) and the reasoning they
/// carry, for clearing all but the newest turns' thinking.
struct ThinkingTurns {
    keep: Option<u64>,
    /// The first element of each assistant turn.
    starts: Vec<usize>,
    /// Assistant turns begun at or before each element.
    begun: Vec<usize>,
    /// Reasoning tokens of the elements before each index.
    before: Vec<u64>,
    thinking: Vec<u64>,
}

impl ThinkingTurns {
    fn new(conversation: &Conversation<'_>, edit: ClearThinking) -> ThinkingTurns {
        let mut starts = Vec::new();
        let mut begun = Vec::with_capacity(conversation.roles.len());
        let mut before = vec![0];
        let mut in_turn = false;
        let thinking: Vec<u64> = conversation
            .clearable
            .iter()
            .map(|c| c.thinking_tokens)
            .collect();
        for (i, role) in conversation.roles.iter().enumerate() {
            match role {
                Role::User => in_turn = false,
                Role::Assistant if !in_turn => {
                    starts.push(i);
                    in_turn = true;
                }
                _ => {}
            }
            begun.push(starts.len());
            before.push(before[i] + thinking[i]);
        }
        ThinkingTurns {
            keep: edit.keep_turns,
            starts,
            begun,
            before,
            thinking,
        }
    }

    /// The end (exclusive) of the elements whose reasoning a request ending at element `p`
    /// clears; `None` when every turn keeps its thinking.
    fn end(&self, p: usize) -> Option<usize> {
        let keep = self.keep?;
        let cleared_turns = (self.begun[p] as u64).saturating_sub(keep) as usize;
        let start = self
            .starts
            .get(cleared_turns)
            .copied()
            .unwrap_or(usize::MAX);
        Some(start.min(p + 1))
    }

    /// Reasoning tokens a request ending at element `p` is spared.
    fn tokens_at(&self, p: usize) -> u64 {
        self.end(p).map_or(0, |end| self.before[end])
    }

    /// What is cleared of a request ending at element `p`: the elements that lose their
    /// reasoning, how many turns had some, and its tokens.
    fn cleared_at(&self, p: usize) -> (BTreeSet<usize>, u64, u64) {
        let Some(end) = self.end(p) else {
            return (BTreeSet::new(), 0, 0);
        };
        let elements: BTreeSet<usize> = (0..end).filter(|&i| self.thinking[i] > 0).collect();
        let turns: BTreeSet<usize> = elements.iter().map(|&i| self.begun[i]).collect();
        (elements, turns.len() as u64, self.before[end])
    }
}

impl Engine {
    /// Applies the context edits a client asked for to its request, in place, and returns what
    /// they cleared. The request's elements are counted as every request's are (cached), so
    /// the replay costs no more than a pass over the counts.
    pub fn clear_context(
        &self,
        request: &mut dyn WireRequest,
        edits: &ContextEdits,
    ) -> Vec<AppliedEdit> {
        let planned = self.plan_clearing(request, edits);
        request.apply_clearing(&planned.clearing);
        planned.applied
    }

    /// What `edits` clear of `request`, planned on its counted elements.
    fn plan_clearing(&self, request: &dyn WireRequest, edits: &ContextEdits) -> Planned {
        let measured = self.meter.measure(request);
        let encoding = measured.encoding;
        let roles: Vec<Role> = (0..request.len()).map(|i| request.role(i)).collect();
        let tokens: Vec<u64> = measured.elements.iter().map(|e| e.tokens).collect();
        let clearable: Vec<Clearable> = (0..request.len())
            .map(|i| request.clearable(encoding, i))
            .collect();
        let conversation = Conversation {
            head_tokens: measured.head_tokens + REPLY_PRIMING,
            roles: &roles,
            tokens: &tokens,
            clearable: &clearable,
        };
        plan(edits, &conversation, |text| encoding.count(text))
    }
}

#[cfg(test)]
mod tests;
