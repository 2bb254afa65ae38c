//! Where to cut: which messages the summary replaces and which stay verbatim. A pure function of
//! roles and token counts, so it is property-tested without any I/O.
//!
//! Rules:
//! - keep the newest messages up to `keep_budget` tokens, preferring whole turns (a turn starts
//!   at a user message);
//! - never start the kept part with a tool result, so no result is separated from the assistant
//!   message that called it;
//! - the last user message always stays verbatim: when its turn alone is over budget, the turn is
//!   split: the user message is pinned after the summary and the turn's early steps are
//!   summarized;
//! - the conversation sent ends where the client's does: the newest step (an assistant message
//!   with the results of its calls) is never summarized, since a summary stands before the pinned
//!   user message and the model would read the request as unanswered and do the work again.
//!   When it is too large to keep whole, its largest elements are cut in the middle to fit (tool
//!   results, and tool-call arguments or assistant text when they are what is large), never
//!   below [`MIN_TRUNCATED_TOKENS`] each; a step that cannot fit even so is kept over budget;
//! - such cuts alone, with nothing earlier to summarize, are a plan too (a checkpoint that
//!   clears without summarizing);
//! - instruction (system/developer) messages are never summarized.

use crate::dialect::Role;
use crate::store::Truncation;

/// Smallest share of an element of the newest step kept when it must be cut to fit.
pub const MIN_TRUNCATED_TOKENS: u64 = 48;

/// The conversation as the planner sees it.
#[derive(Debug, Clone)]
pub struct PlanInput<'a> {
    pub roles: &'a [Role],
    /// Tokens per message (same length as `roles`).
    pub tokens: &'a [u64],
    /// Messages `[0..start)` are already covered by the checkpoint being extended (0: none).
    pub start: usize,
    /// The pinned user message of that checkpoint, if any.
    pub pinned: Option<usize>,
    /// Most tokens the verbatim part may take (pinned user message included).
    pub keep_budget: u64,
    /// Most tokens the newest step may take, pinned user message included, before its elements
    /// are cut in the middle; below `keep_budget` (0, say) it is `keep_budget`. Larger than the
    /// keep budget when that one is sized for the cadence of summaries: the step the model is
    /// answering is cut only when it does not fit, never to make room for turns to come.
    pub step_budget: u64,
}

impl PlanInput<'_> {
    fn step_room(&self) -> u64 {
        self.step_budget.max(self.keep_budget)
    }
}

/// The cut chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Messages `[0..cut)` become the summary (except instructions and `pinned_user`).
    pub cut: usize,
    pub pinned_user: Option<usize>,
    pub truncations: Vec<Truncation>,
}

impl Plan {
    /// Indices of the messages the summary must cover, beyond those of the previous checkpoint.
    pub fn newly_covered(&self, input: &PlanInput) -> Vec<usize> {
        let previous_pinned = input.pinned.filter(|p| Some(*p) != self.pinned_user);
        previous_pinned
            .into_iter()
            .chain(input.start..self.cut)
            .filter(|&i| !input.roles[i].is_instruction() && Some(i) != self.pinned_user)
            .collect()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("no earlier messages to summarize")]
    NothingToSummarize,
}

/// Chooses the cut. Fails when no message could be moved into the summary.
pub fn plan(input: &PlanInput) -> Result<Plan, PlanError> {
    let chosen = choose_cut(input)?;
    if chosen.newly_covered(input).is_empty() && chosen.truncations.is_empty() {
        return Err(PlanError::NothingToSummarize);
    }
    Ok(chosen)
}

/// `chosen`, or when it cuts inside the last turn (a pinned user message, a cut after the last
/// user message), the cut at the start of that turn instead: the turn stays whole even over
/// budget. For a tool loop whose steps carry signed reasoning that must reach the model as it was
/// made (Anthropic's thinking blocks).
pub fn keep_last_turn_whole(input: &PlanInput, chosen: Plan) -> Result<Plan, PlanError> {
    let roles = input.roles;
    let Some(last_user) = roles.iter().rposition(|r| *r == Role::User) else {
        return Ok(chosen);
    };
    if chosen.pinned_user.is_none() && chosen.cut <= last_user {
        return Ok(chosen);
    }
    let moves_something = (input.start..last_user).any(|i| !roles[i].is_instruction());
    if last_user <= input.start || !moves_something {
        return Err(PlanError::NothingToSummarize);
    }
    Ok(Plan {
        cut: last_user,
        pinned_user: None,
        truncations: vec![],
    })
}

/// `chosen` for a checkpoint written ahead of time, which must match the client's next request:
/// clients re-serialize their newest message on the next turn (a marker dropped, an added note
/// removed), so the summarized prefix stops before the newest user turn. Only when that turn is
/// all there is (a long tool loop) does the cut go inside it, and then only when the newest user
/// message is not the request's last element (a step follows it, so that message is no longer
/// the newest one on the next request); or when that turn, a tool loop, has outgrown
/// `turn_budget` already: kept whole, it would leave the next request past the point that
/// starts another summary, one summary per request for the rest of the loop.
pub fn leave_newest_turn_out(
    input: &PlanInput,
    chosen: Plan,
    turn_budget: u64,
) -> Result<Plan, PlanError> {
    let step_follows = input.roles.last() != Some(&Role::User);
    let newest_turn = || -> u64 {
        input
            .roles
            .iter()
            .rposition(|r| *r == Role::User)
            .map_or(0, |user| input.tokens[user..].iter().sum())
    };
    if step_follows && newest_turn() > turn_budget {
        return Ok(chosen);
    }
    // Where the whole-turn cut is refused, `chosen` cuts inside the newest turn.
    keep_last_turn_whole(input, chosen.clone()).or_else(|e| {
        if step_follows {
            Ok(chosen)
        } else {
            Err(e)
        }
    })
}

fn choose_cut(input: &PlanInput) -> Result<Plan, PlanError> {
    let n = input.roles.len();
    let roles = input.roles;
    let tokens = |i: usize| {
        if roles[i].is_instruction() {
            0
        } else {
            input.tokens[i]
        }
    };
    // tail[c] = verbatim tokens of messages [c..n).
    let mut tail = vec![0u64; n + 1];
    for i in (0..n).rev() {
        tail[i] = tail[i + 1].saturating_add(tokens(i));
    }
    let last_user = (input.start..n)
        .rev()
        .find(|&i| roles[i] == Role::User)
        .or(input.pinned);

    // Whole turns: the earliest user message after `start` whose turn and everything after fits.
    if let Some(u) = last_user.filter(|&u| u > input.start) {
        let moves_something = |c: usize| (input.start..c).any(|i| !roles[i].is_instruction());
        if let Some(cut) = (input.start + 1..=u)
            .find(|&c| roles[c] == Role::User && tail[c] <= input.keep_budget && moves_something(c))
        {
            return Ok(Plan {
                cut,
                pinned_user: None,
                truncations: vec![],
            });
        }
    }

    // Split turn: pin the last user message, keep the newest steps of its turn that fit.
    let pinned_cost = last_user.map(tokens).unwrap_or(0);
    let lowest = last_user.map_or(input.start, |u| u.max(input.start)) + 1;
    // A cut never lands inside a unit: not at a tool result, nor at what joins the step before
    // it (a parallel call of the same step, what follows a reasoning item).
    let is_valid_cut = |c: usize| c == n || !matches!(roles[c], Role::Tool | Role::Other);
    let candidates: Vec<usize> = (lowest..=n).filter(|&c| is_valid_cut(c)).collect();
    let pinned_user = last_user.filter(|&u| u < lowest);
    let budget_left = input.keep_budget.saturating_sub(pinned_cost);
    if let Some(&cut) = candidates
        .iter()
        .find(|&&c| tail[c] <= budget_left && c < n)
    {
        return Ok(Plan {
            cut,
            pinned_user,
            truncations: vec![],
        });
    }
    // Even the newest step does not fit the keep budget: kept whole when it fits the step's
    // own room, else with its largest elements cut in the middle. Summarizing it instead would
    // end the request at the pinned user message. It may start where the checkpoint being
    // extended ends (its cut already pinned the user message).
    let step_from = last_user
        .map_or(input.start, |u| (u + 1).max(input.start))
        .max(1);
    if let Some(cut) = (step_from..n).rev().find(|&c| is_valid_cut(c)) {
        let step_room = input.step_room().saturating_sub(pinned_cost);
        let truncations = if tail[cut] <= step_room {
            vec![]
        } else {
            truncate_to_fit(input, cut, step_room)
        };
        return Ok(Plan {
            cut,
            pinned_user,
            truncations,
        });
    }
    // Nothing after the last user message: the request ends with it, and it stays.
    if candidates.contains(&n) && (n > input.start || input.pinned != pinned_user) {
        return Ok(Plan {
            cut: n,
            pinned_user,
            truncations: vec![],
        });
    }
    Err(PlanError::NothingToSummarize)
}

/// Cuts the largest elements of `[cut..n)` so the kept part fits `budget`: every element above a
/// common cap is cut down to it and the rest stay whole, so a short result beside a huge call (a
/// `write` of a whole file, answered "done") is kept as it is. The cap never goes below
/// [`MIN_TRUNCATED_TOKENS`]: what is left of an element must still say what it was.
fn truncate_to_fit(input: &PlanInput, cut: usize, budget: u64) -> Vec<Truncation> {
    let n = input.roles.len();
    let cuttable = |i: usize| !input.roles[i].is_instruction() && input.roles[i] != Role::User;
    let fixed: u64 = (cut..n)
        .filter(|&i| !cuttable(i) && !input.roles[i].is_instruction())
        .map(|i| input.tokens[i])
        .sum();
    let mut sizes: Vec<(usize, u64)> = (cut..n)
        .filter(|&i| cuttable(i))
        .map(|i| (i, input.tokens[i]))
        .collect();
    sizes.sort_by_key(|&(_, tokens)| tokens);
    // Water-filling: the smallest elements take their whole size while the rest of the room,
    // shared equally among the larger ones, still exceeds it.
    let mut room = budget.saturating_sub(fixed);
    let mut cap = u64::MAX;
    for (k, &(_, tokens)) in sizes.iter().enumerate() {
        let sharing = (sizes.len() - k) as u64;
        if tokens.saturating_mul(sharing) <= room {
            room -= tokens;
        } else {
            cap = room / sharing;
            break;
        }
    }
    let cap = cap.max(MIN_TRUNCATED_TOKENS);
    let mut truncations: Vec<Truncation> = sizes
        .iter()
        .filter(|&&(_, tokens)| tokens > cap)
        .map(|&(index, _)| Truncation {
            index,
            keep_tokens: cap,
        })
        .collect();
    truncations.sort_by_key(|t| t.index);
    truncations
}

#[cfg(test)]
mod tests;
