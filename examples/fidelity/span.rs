//! The span a compaction summarizes, chosen by Compactor's own planner, and its cap.
//!
//! A summarizer on a laptop-class CPU reads a 100k-token span in most of an hour, so the
//! benchmark may cap the span to its newest tokens. A capped span starts at a user message, so
//! that it opens with the request its tool calls answer: the first user message within the
//! newest `cap` tokens, or, when there is none, the newest user message before them (the span is
//! then larger than the cap, and says so).

use compactor::compaction::plan::{self, PlanInput};
use compactor::dialect::Role;

/// The messages a summary replaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    /// Indices of the summarized messages, oldest first (instructions excluded).
    pub messages: Vec<usize>,
    /// Where the verbatim part starts: messages from here on are kept as they are.
    pub cut: usize,
    /// Tokens of the summarized messages.
    pub tokens: u64,
    /// Tokens of the whole span the planner chose, before the cap.
    pub full_tokens: u64,
    /// Messages of that whole span the cap left out (the oldest).
    pub dropped: usize,
}

/// The span a compaction keeping the newest `keep_tokens` verbatim would summarize, capped to
/// its newest `cap` tokens when given. `None` when there is nothing to summarize.
pub fn choose(roles: &[Role], tokens: &[u64], keep_tokens: u64, cap: Option<u64>) -> Option<Span> {
    let input = PlanInput {
        roles,
        tokens,
        start: 0,
        pinned: None,
        keep_budget: keep_tokens,
        step_budget: 0,
    };
    let chosen = plan::plan(&input).ok()?;
    let covered = chosen.newly_covered(&input);
    let full_tokens: u64 = covered.iter().map(|&i| tokens[i]).sum();
    let first = match cap {
        Some(cap) if cap < full_tokens => capped_start(&covered, roles, tokens, cap),
        _ => 0,
    };
    let messages = covered[first..].to_vec();
    Some(Span {
        tokens: messages.iter().map(|&i| tokens[i]).sum(),
        messages,
        cut: chosen.cut,
        full_tokens,
        dropped: first,
    })
}

/// Position in `covered` where the capped span starts.
fn capped_start(covered: &[usize], roles: &[Role], tokens: &[u64], cap: u64) -> usize {
    // The oldest position whose suffix still fits in the cap.
    let mut fits_from = covered.len();
    let mut total = 0;
    while fits_from > 0 && total + tokens[covered[fits_from - 1]] <= cap {
        fits_from -= 1;
        total += tokens[covered[fits_from]];
    }
    let is_user = |p: &usize| roles[covered[*p]] == Role::User;
    (fits_from..covered.len())
        .find(is_user)
        .or_else(|| (0..fits_from).rev().find(is_user))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Role::*;

    #[test]
    fn uncapped_span_is_what_the_planner_summarizes() {
        let roles = [
            System, User, Assistant, Tool, User, Assistant, User, Assistant,
        ];
        let tokens = [50, 10, 10, 100, 10, 10, 10, 10];
        let span = choose(&roles, &tokens, 40, None).unwrap();
        assert_eq!(span.cut, 4);
        assert_eq!(span.messages, vec![1, 2, 3]);
        assert_eq!((span.tokens, span.full_tokens, span.dropped), (120, 120, 0));
    }

    #[test]
    fn cap_keeps_the_newest_tokens_from_a_user_message() {
        let roles = [
            System, User, Assistant, Tool, User, Assistant, Tool, User, Assistant,
        ];
        let tokens = [50, 10, 10, 500, 10, 10, 20, 10, 10];
        // Newest 60 tokens of the span [1..7) are messages 4..7 (40 tokens); 4 is a user.
        let span = choose(&roles, &tokens, 20, Some(60)).unwrap();
        assert_eq!(span.cut, 7);
        assert_eq!(span.messages, vec![4, 5, 6]);
        assert_eq!((span.tokens, span.full_tokens, span.dropped), (40, 560, 3));
    }

    #[test]
    fn cap_without_a_user_inside_reaches_back_to_the_previous_user() {
        let roles = [User, Assistant, Tool, Assistant, Tool, User, Assistant];
        let tokens = [10, 10, 300, 10, 30, 10, 10];
        let span = choose(&roles, &tokens, 20, Some(50)).unwrap();
        assert_eq!(span.cut, 5);
        assert_eq!(span.messages, vec![0, 1, 2, 3, 4]);
        assert!(span.tokens > 50);
    }

    #[test]
    fn nothing_to_summarize() {
        assert_eq!(choose(&[System, User], &[10, 10], 100, Some(10)), None);
    }
}
