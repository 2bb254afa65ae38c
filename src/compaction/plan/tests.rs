//! The planner's cases: whole turns, split turns, the newest step cut or kept, extensions of a
//! checkpoint.

use super::*;
use Role::*;

fn run(roles: &[Role], tokens: &[u64], budget: u64) -> Plan {
    plan(&PlanInput {
        roles,
        tokens,
        start: 0,
        pinned: None,
        keep_budget: budget,
        step_budget: 0,
    })
    .unwrap()
}

#[test]
fn a_split_turn_is_never_cut_between_parallel_calls_of_one_step() {
    // Responses: two parallel `function_call`s (the second joins the first's step) and
    // their outputs; a budget that the second call and the outputs alone would fit.
    let roles = [
        System, User, Assistant, Tool, User, Assistant, Other, Tool, Tool,
    ];
    let tokens = [5, 10, 10, 10, 10, 400, 10, 10, 10];
    let p = run(&roles, &tokens, 100);
    assert_ne!(p.cut, 6, "{p:?}");
    assert!(!matches!(roles.get(p.cut), Some(Tool | Other)), "{p:?}");
}

#[test]
fn the_last_turn_can_be_kept_whole_over_budget() {
    let roles = [
        System, User, Assistant, User, Assistant, Tool, Assistant, Tool,
    ];
    let tokens = [5, 10, 10, 10, 10, 100, 10, 100];
    let input = PlanInput {
        roles: &roles,
        tokens: &tokens,
        start: 0,
        pinned: None,
        keep_budget: 50,
        step_budget: 0,
    };
    let split = plan(&input).unwrap();
    assert!(split.pinned_user == Some(3) || split.cut > 3, "{split:?}");
    let whole = keep_last_turn_whole(&input, split).unwrap();
    assert_eq!((whole.cut, whole.pinned_user), (3, None));
    assert!(whole.truncations.is_empty());
    // A plan that already keeps whole turns is left alone.
    let roomy = PlanInput {
        keep_budget: 10_000,
        step_budget: 0,
        ..input.clone()
    };
    let kept = plan(&roomy).unwrap();
    assert_eq!(keep_last_turn_whole(&roomy, kept.clone()).unwrap(), kept);
    // Nothing before the last turn: nothing to summarize.
    let alone = [User, Assistant, Tool];
    let only = PlanInput {
        roles: &alone,
        tokens: &[10, 10, 500],
        start: 0,
        pinned: None,
        keep_budget: 50,
        step_budget: 0,
    };
    let split = plan(&only).unwrap();
    assert!(keep_last_turn_whole(&only, split).is_err());
}

#[test]
fn an_ahead_of_time_cut_stops_before_the_newest_user_turn() {
    // The newest user message alone is over budget: the plan pins it, which the next
    // request's re-serialized message would not match.
    let roles = [System, User, Assistant, User, Assistant, User];
    let tokens = [5, 10, 10, 10, 10, 500];
    let input = PlanInput {
        roles: &roles,
        tokens: &tokens,
        start: 0,
        pinned: None,
        keep_budget: 100,
        step_budget: 0,
    };
    let pinned = plan(&input).unwrap();
    assert_eq!(pinned.pinned_user, Some(5));
    let out = leave_newest_turn_out(&input, pinned, 100).unwrap();
    assert_eq!((out.cut, out.pinned_user), (5, None));
    // One long tool loop: the cut goes inside it, since a step follows its user message.
    let roles = [System, User, Assistant, Tool, Assistant, Tool];
    let input = PlanInput {
        roles: &roles,
        tokens: &[5, 10, 300, 300, 10, 10],
        start: 0,
        pinned: None,
        keep_budget: 100,
        step_budget: 0,
    };
    let inside = plan(&input).unwrap();
    assert!(inside.cut > 1, "{inside:?}");
    assert_eq!(
        leave_newest_turn_out(&input, inside.clone(), 100),
        Ok(inside)
    );
}

#[test]
fn a_tool_loop_past_the_kept_tail_is_cut_inside_ahead_of_time() {
    // Earlier turns to summarize, and a newest turn of tool steps larger than the tail a
    // compaction keeps: kept whole, the next request would be past the soft threshold again.
    let roles = [
        System, User, Assistant, User, Assistant, Tool, Assistant, Tool, Assistant, Tool,
    ];
    let input = PlanInput {
        roles: &roles,
        tokens: &[5, 10, 200, 10, 10, 400, 10, 400, 10, 40],
        start: 0,
        pinned: None,
        keep_budget: 100,
        step_budget: 0,
    };
    let inside = plan(&input).unwrap();
    assert_eq!(inside.pinned_user, Some(3), "{inside:?}");
    assert_eq!(
        leave_newest_turn_out(&input, inside.clone(), 500),
        Ok(inside.clone())
    );
    // The same turn within the tail a compaction keeps: left out whole, as before.
    let whole = leave_newest_turn_out(&input, inside.clone(), 1_000).unwrap();
    assert_eq!((whole.cut, whole.pinned_user), (3, None));
    // The newest user message last (nothing follows it yet): never cut inside.
    let asked = [System, User, Assistant, User];
    let input = PlanInput {
        roles: &asked,
        tokens: &[5, 10, 200, 900],
        ..input
    };
    let chosen = plan(&input).unwrap();
    let out = leave_newest_turn_out(&input, chosen, 100).unwrap();
    assert_eq!((out.cut, out.pinned_user), (3, None));
}

#[test]
fn keeps_whole_turns_within_budget() {
    let roles = [
        System, User, Assistant, User, Assistant, Tool, Assistant, User,
    ];
    let tokens = [50, 10, 10, 10, 10, 10, 10, 10];
    let p = run(&roles, &tokens, 55);
    assert_eq!(
        p,
        Plan {
            cut: 3,
            pinned_user: None,
            truncations: vec![]
        }
    );
    let p = run(&roles, &tokens, 30);
    assert_eq!(p.cut, 7);
}

#[test]
fn splits_an_oversized_turn_pinning_its_user_message() {
    let roles = [
        User, Assistant, User, Assistant, Tool, Assistant, Tool, Tool,
    ];
    let tokens = [10, 10, 10, 10, 100, 10, 30, 30];
    let p = run(&roles, &tokens, 100);
    // The last turn (from index 2) is 200 tokens; keep user 2 pinned plus 5..8 (70 tokens).
    assert_eq!(
        p,
        Plan {
            cut: 5,
            pinned_user: Some(2),
            truncations: vec![]
        }
    );
}

#[test]
fn truncates_a_huge_newest_tool_result() {
    let roles = [User, Assistant, Tool, User, Assistant, Tool];
    let tokens = [10, 10, 10, 10, 10, 5000];
    let p = run(&roles, &tokens, 1000);
    assert_eq!(p.cut, 4);
    assert_eq!(p.pinned_user, Some(3));
    assert_eq!(
        p.truncations,
        vec![Truncation {
            index: 5,
            keep_tokens: 980
        }]
    );
}

#[test]
fn cuts_the_newest_step_only_past_its_own_room() {
    // The turn in progress (a question, a call, a file read) is over the keep budget, which
    // is sized for the cadence of summaries, but within the step's room: it stays whole.
    let roles = [User, Assistant, Tool, User, Assistant, Tool];
    let tokens = [300, 300, 300, 30, 20, 600];
    let input = |step_budget| PlanInput {
        roles: &roles,
        tokens: &tokens,
        start: 0,
        pinned: None,
        keep_budget: 500,
        step_budget,
    };
    let p = plan(&input(750)).unwrap();
    assert_eq!((p.cut, p.pinned_user), (4, Some(3)));
    assert!(p.truncations.is_empty());
    // Past the step's room, it is cut to that room, not to the keep budget.
    let p = plan(&input(600)).unwrap();
    assert_eq!((p.cut, p.pinned_user), (4, Some(3)));
    assert_eq!(
        p.truncations,
        vec![Truncation {
            index: 5,
            keep_tokens: 550
        }]
    );
}

#[test]
fn keeps_the_newest_step_cutting_what_is_large() {
    // A `write` call carrying a whole file, answered in a few tokens.
    let roles = [System, User, Assistant, User, Assistant, Tool];
    let tokens = [5, 10, 10, 10, 12_000, 8];
    let p = run(&roles, &tokens, 1000);
    assert_eq!((p.cut, p.pinned_user), (4, Some(3)));
    assert_eq!(
        p.truncations,
        vec![Truncation {
            index: 4,
            keep_tokens: 982
        }]
    );
    // A budget too small even for the cut step: kept at the floor, over budget, rather
    // than summarized.
    let p = run(&roles, &tokens, 30);
    assert_eq!((p.cut, p.pinned_user), (4, Some(3)));
    assert_eq!(
        p.truncations,
        vec![Truncation {
            index: 4,
            keep_tokens: MIN_TRUNCATED_TOKENS
        }]
    );
    // The only turn: nothing earlier to summarize; the cuts alone are the plan.
    let roles = [User, Assistant, Tool];
    let input = PlanInput {
        roles: &roles,
        tokens: &[10, 12_000, 8],
        start: 0,
        pinned: None,
        keep_budget: 1000,
        step_budget: 0,
    };
    let p = plan(&input).unwrap();
    assert_eq!((p.cut, p.pinned_user), (1, Some(0)));
    assert!(p.newly_covered(&input).is_empty());
    assert_eq!(p.truncations.len(), 1);
}

#[test]
fn extends_a_previous_checkpoint() {
    let roles = [
        System, User, Assistant, User, Assistant, User, Assistant, User,
    ];
    let tokens = [5, 10, 10, 10, 10, 10, 10, 10];
    let p = plan(&PlanInput {
        roles: &roles,
        tokens: &tokens,
        start: 3,
        pinned: None,
        keep_budget: 25,
        step_budget: 0,
    })
    .unwrap();
    assert_eq!(p.cut, 7);
    let input = PlanInput {
        roles: &roles,
        tokens: &tokens,
        start: 3,
        pinned: None,
        keep_budget: 25,
        step_budget: 0,
    };
    assert_eq!(p.newly_covered(&input), vec![3, 4, 5, 6]);
}

#[test]
fn refuses_when_nothing_can_move() {
    let roles = [System, User];
    // The only user message must stay verbatim, and nothing else exists to summarize.
    let err = plan(&PlanInput {
        roles: &roles,
        tokens: &[5, 10],
        start: 0,
        pinned: None,
        keep_budget: 5,
        step_budget: 0,
    });
    assert_eq!(err, Err(PlanError::NothingToSummarize));
    let err = plan(&PlanInput {
        roles: &roles,
        tokens: &[5, 10],
        start: 2,
        pinned: Some(1),
        keep_budget: 5,
        step_budget: 0,
    });
    assert_eq!(err, Err(PlanError::NothingToSummarize));
}
