use std::collections::BTreeSet;

use super::*;
use crate::dialect::edits::{ClearInputs, ClearableCall, ClearableResult};

/// A conversation built turn by turn: a user request, then tool steps.
#[derive(Default, Clone)]
struct Built {
    roles: Vec<Role>,
    tokens: Vec<u64>,
    clearable: Vec<Clearable>,
}

impl Built {
    fn user(mut self, tokens: u64) -> Built {
        self.roles.push(Role::User);
        self.tokens.push(tokens);
        self.clearable.push(Clearable::default());
        self
    }

    /// An assistant step calling `tool` (its input `input` tokens, reasoning `thinking`
    /// tokens), then its result of `result` tokens.
    fn step(mut self, tool: &str, input: u64, result: u64, thinking: u64) -> Built {
        let id = format!("call{}", self.roles.len());
        self.roles.push(Role::Assistant);
        self.tokens.push(input + thinking + 4);
        self.clearable.push(Clearable {
            calls: vec![ClearableCall {
                id: id.clone(),
                tool: tool.into(),
                input_tokens: input,
            }],
            results: vec![],
            thinking_tokens: thinking,
        });
        self.roles.push(Role::Tool);
        self.tokens.push(result + 4);
        self.clearable.push(Clearable {
            calls: vec![],
            results: vec![ClearableResult {
                call_id: id,
                tokens: result,
                is_error: false,
            }],
            thinking_tokens: 0,
        });
        self
    }

    fn plan(&self, edits: &ContextEdits) -> Planned {
        let conversation = Conversation {
            head_tokens: 10,
            roles: &self.roles,
            tokens: &self.tokens,
            clearable: &self.clearable,
        };
        plan(edits, &conversation, |text| text.len() as u64 / 4)
    }

    /// The prefix of the first `len` elements.
    fn prefix(&self, len: usize) -> Built {
        Built {
            roles: self.roles[..len].to_vec(),
            tokens: self.tokens[..len].to_vec(),
            clearable: self.clearable[..len].to_vec(),
        }
    }
}

fn tool_edit(trigger: ClearTrigger, keep: u64) -> ClearToolUses {
    ClearToolUses {
        trigger,
        keep,
        clear_at_least: 0,
        exclude_tools: BTreeSet::new(),
        clear_inputs: ClearInputs::None,
    }
}

fn only_tools(edit: ClearToolUses) -> ContextEdits {
    ContextEdits {
        tool_uses: Some(edit),
        thinking: None,
    }
}

fn cleared_ids(planned: &Planned) -> Vec<String> {
    planned
        .clearing
        .results
        .iter()
        .map(|r| r.call_id.clone())
        .collect()
}

fn six_reads() -> Built {
    (0..6).fold(Built::default().user(20), |b, _| b.step("Read", 10, 200, 0))
}

#[test]
fn over_the_trigger_every_use_but_the_newest_kept_ones_is_cleared() {
    let conversation = six_reads();
    let planned = conversation.plan(&only_tools(tool_edit(ClearTrigger::InputTokens(1_000), 2)));
    // The prompt passes 1,000 tokens at the fifth result: the three oldest are cleared there,
    // and the sixth brings it back under.
    assert_eq!(cleared_ids(&planned), ["call1", "call3", "call5"]);
    let stub = &planned.clearing.results[0].stub;
    assert_eq!(stub, "[result of Read cleared to save context: 200 tokens]");
    let freed = 3 * (200 - stub.len() as u64 / 4);
    assert_eq!(
        planned.applied,
        [AppliedEdit::ToolUses {
            cleared_tool_uses: 3,
            cleared_input_tokens: freed
        }]
    );
    assert!(planned.clearing.inputs.is_empty());
}

#[test]
fn under_the_trigger_nothing_is_cleared() {
    let planned = six_reads().plan(&only_tools(tool_edit(ClearTrigger::InputTokens(5_000), 0)));
    assert_eq!(planned, Planned::default());
}

#[test]
fn a_trigger_on_tool_uses_counts_the_uses_left() {
    let planned = six_reads().plan(&only_tools(tool_edit(ClearTrigger::ToolUses(3), 1)));
    // At the fourth use three are cleared (one kept); two more arrive, and two uncleared are
    // not more than three.
    assert_eq!(cleared_ids(&planned), ["call1", "call3", "call5"]);
}

#[test]
fn clearing_too_little_is_not_done() {
    let mut edit = tool_edit(ClearTrigger::InputTokens(1_000), 2);
    edit.clear_at_least = 10_000;
    assert!(six_reads().plan(&only_tools(edit)).clearing.is_empty());
}

#[test]
fn excluded_tools_stay_and_named_inputs_go() {
    let conversation = Built::default()
        .user(20)
        .step("Read", 300, 200, 0)
        .step("Memory", 10, 200, 0)
        .step("Bash", 300, 200, 0)
        .step("Read", 10, 200, 0);
    let mut edit = tool_edit(ClearTrigger::InputTokens(100), 1);
    edit.exclude_tools = ["Memory".to_string()].into();
    edit.clear_inputs = ClearInputs::Tools(["Read".to_string()].into());
    let planned = conversation.plan(&only_tools(edit));
    assert_eq!(cleared_ids(&planned), ["call1", "call5"]);
    assert_eq!(planned.clearing.inputs, ["call1".to_string()].into());
    let AppliedEdit::ToolUses {
        cleared_input_tokens,
        ..
    } = planned.applied[0]
    else {
        panic!("{:?}", planned.applied)
    };
    // Both results, and the Read call's input.
    assert!(
        cleared_input_tokens > 2 * 180 + 290,
        "{cleared_input_tokens}"
    );
}

/// The forwarded prefix stays the same from request to request until the trigger fires again:
/// every request of a growing conversation clears what the one before it cleared, and the
/// clearing changes at few points.
#[test]
fn each_request_clears_what_the_one_before_did() {
    let conversation = (0..40).fold(Built::default().user(20), |b, i| {
        b.step("Read", 10, 100 + (i % 7) * 40, 0)
    });
    let mut edit = tool_edit(ClearTrigger::InputTokens(3_000), 3);
    edit.clear_at_least = 1_000;
    let edits = only_tools(edit);
    let mut previous: Vec<String> = vec![];
    let mut changes = 0;
    for end in (3..=conversation.roles.len()).step_by(2) {
        let cleared = cleared_ids(&conversation.prefix(end).plan(&edits));
        assert!(
            cleared.starts_with(&previous),
            "at {end}: {previous:?} then {cleared:?}"
        );
        changes += usize::from(cleared != previous);
        previous = cleared;
    }
    assert!(!previous.is_empty());
    assert!(
        (2..=12).contains(&changes),
        "{changes} clearings in 40 requests"
    );
}

#[test]
fn thinking_is_cleared_from_all_but_the_newest_turns() {
    let conversation = Built::default()
        .user(20)
        .step("Read", 10, 50, 100)
        .step("Read", 10, 50, 100)
        .user(20)
        .step("Read", 10, 50, 100)
        .user(20)
        .step("Read", 10, 50, 100);
    let keep = |turns| ContextEdits {
        tool_uses: None,
        thinking: Some(ClearThinking { keep_turns: turns }),
    };
    let planned = conversation.plan(&keep(Some(1)));
    assert_eq!(planned.clearing.thinking, [1, 3, 6].into());
    assert_eq!(
        planned.applied,
        [AppliedEdit::Thinking {
            cleared_thinking_turns: 2,
            cleared_input_tokens: 300
        }]
    );
    assert_eq!(
        conversation.plan(&keep(Some(2))).clearing.thinking,
        [1, 3].into()
    );
    assert_eq!(conversation.plan(&keep(None)), Planned::default());
}

#[test]
fn cleared_thinking_counts_toward_the_tool_trigger() {
    let conversation = (0..6).fold(Built::default().user(20), |b, _| {
        b.step("Read", 10, 100, 300).user(5)
    });
    let tools = tool_edit(ClearTrigger::InputTokens(1_500), 1);
    let alone = conversation.plan(&only_tools(tools.clone()));
    let with_thinking = conversation.plan(&ContextEdits {
        tool_uses: Some(tools),
        thinking: Some(ClearThinking {
            keep_turns: Some(1),
        }),
    });
    assert!(!alone.clearing.results.is_empty());
    // With old reasoning gone the prompt stays under the trigger.
    assert!(with_thinking.clearing.results.is_empty());
    assert_eq!(with_thinking.clearing.thinking.len(), 5);
}
