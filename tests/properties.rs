//! Invariants of planning and rewriting, over random agent conversations with parallel tool
//! calls: tool results stay with their calls, the kept part fits its budget, instructions and
//! tools pass byte for byte, the last user message survives verbatim, the conversation sent ends
//! with the client's last message and keeps the client's order after the summary, and every
//! message that disappears is covered by the summary.

use compactor::compaction::plan::{plan, PlanInput, MIN_TRUNCATED_TOKENS};
use compactor::compaction::summary_text::summary_text;
use compactor::dialect::chat::render::messages_through;
use compactor::dialect::chat::request::ChatRequest;
use compactor::dialect::Through;
use compactor::dialect::{units, Role};
use compactor::store::Checkpoint;
use proptest::prelude::*;
use serde_json::{json, Value};

/// One step of a turn: an assistant message with `calls` parallel tool calls (0: a text reply).
#[derive(Debug, Clone)]
struct Step {
    calls: usize,
}

#[derive(Debug, Clone)]
struct Turn {
    steps: Vec<Step>,
}

fn conversation() -> impl Strategy<Value = (Vec<Turn>, Vec<u64>, u64, bool)> {
    let step = (0usize..4).prop_map(|calls| Step { calls });
    let turn = prop::collection::vec(step, 0..5).prop_map(|steps| Turn { steps });
    (
        prop::collection::vec(turn, 1..12),
        prop::collection::vec(1u64..3000, 200),
        50u64..6000,
        any::<bool>(),
    )
}

/// Builds the request and per-message token counts.
fn build(turns: &[Turn], sizes: &[u64], developer: bool) -> (ChatRequest, Vec<u64>, String) {
    let mut messages = vec![json!({"role":"system","content":"system rules"})];
    if developer {
        messages.push(json!({"role":"developer","content":"developer rules"}));
    }
    let mut id = 0;
    for (t, turn) in turns.iter().enumerate() {
        messages.push(json!({"role":"user","content": format!("request {t}")}));
        for step in &turn.steps {
            if step.calls == 0 {
                messages.push(json!({"role":"assistant","content": format!("reply {t}")}));
                continue;
            }
            let calls: Vec<Value> = (0..step.calls)
                .map(|k| json!({"id": format!("call{}", id + k), "type":"function","function":{"name":"edit","arguments": json!({"path": format!("f{}.rs", id + k)}).to_string()}}))
                .collect();
            messages.push(json!({"role":"assistant","content":null,"tool_calls": calls}));
            for k in 0..step.calls {
                messages.push(json!({"role":"tool","tool_call_id": format!("call{}", id + k),"content": "x".repeat(200)}));
            }
            id += step.calls;
        }
    }
    let tools =
        r#"[{"type":"function","function":{"name":"edit","parameters":{"type":"object"}}}]"#;
    let body = format!(
        r#"{{"model":"m","tools":{tools},"messages":{}}}"#,
        Value::Array(messages)
    );
    let request = ChatRequest::parse(body.as_bytes()).unwrap();
    let tokens = (0..request.messages.len())
        .map(|i| sizes[i % sizes.len()])
        .collect();
    (request, tokens, tools.to_string())
}

fn checkpoint(
    cut: usize,
    pinned: Option<usize>,
    truncations: Vec<compactor::store::Truncation>,
) -> Checkpoint {
    Checkpoint {
        id: "cp".into(),
        tenant: "t".into(),
        anchor: "a".into(),
        covered: cut,
        prefix_hash: String::new(),
        pinned_user: pinned,
        truncations,
        summary: "summary".into(),
        files_read: vec![],
        files_modified: vec![],
        tokens_before: 0,
        tokens_after: 0,
        created_ms: 0,
        model: "m".into(),
        ahead_of_time: false,
        cleared: None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn rewrites_keep_the_invariants((turns, sizes, budget, developer) in conversation(), second in any::<bool>()) {
        let (request, tokens, tools) = build(&turns, &sizes, developer);
        let roles: Vec<Role> = request.messages.iter().map(|m| m.role).collect();
        let mut start = 0;
        let mut pinned = None;
        let mut covered_before: Vec<usize> = vec![];
        // Optionally extend a first compaction, as a growing conversation would.
        if second {
            if let Ok(first) = plan(&PlanInput { roles: &roles, tokens: &tokens, start: 0, pinned: None, keep_budget: budget * 2, step_budget: 0 }) {
                covered_before = first.newly_covered(&PlanInput { roles: &roles, tokens: &tokens, start: 0, pinned: None, keep_budget: 0, step_budget: 0 });
                start = first.cut;
                pinned = first.pinned_user;
            }
        }
        let input = PlanInput { roles: &roles, tokens: &tokens, start, pinned, keep_budget: budget, step_budget: 0 };
        // A conversation with nothing to summarize is drawn again; too many such draws fail
        // the property, so it cannot hold by having checked nothing.
        let planned = plan(&input);
        prop_assume!(planned.is_ok(), "nothing to summarize");
        let chosen = planned.unwrap();
        let newly = chosen.newly_covered(&input);
        // Something is summarized, or the newest step is cut in place (a plan of cuts alone).
        prop_assert!(!newly.is_empty() || !chosen.truncations.is_empty());
        let cp = checkpoint(chosen.cut, chosen.pinned_user, chosen.truncations.clone());
        let text = summary_text(&cp.summary, &cp.files_read, &cp.files_modified);
        let out = messages_through(&request, &Through { checkpoint: &cp, tokens: &tokens, merge_into_user: false, text: &text });
        let out_raw: Vec<&str> = out.iter().map(|m| m.get()).collect();
        let parsed: Vec<Value> = out_raw.iter().map(|r| serde_json::from_str(r).unwrap()).collect();

        // Tool results follow an assistant message in the output that made their call.
        let mut seen_calls = std::collections::HashSet::new();
        for m in &parsed {
            if m["role"] == "assistant" {
                for c in m["tool_calls"].as_array().into_iter().flatten() {
                    seen_calls.insert(c["id"].as_str().unwrap().to_string());
                }
            }
            if m["role"] == "tool" {
                prop_assert!(seen_calls.contains(m["tool_call_id"].as_str().unwrap()), "orphaned tool result");
            }
        }
        // The kept part never starts with a tool result.
        let summary_at = parsed.iter().position(|m| m["content"].as_str().is_some_and(|c| c.contains("<summary>"))).unwrap();
        if let Some(first_kept) = parsed.get(summary_at + 1) {
            prop_assert_ne!(&first_kept["role"], "tool");
        }
        // Instructions byte for byte, first, in order; tools untouched in the body.
        let instructions: Vec<&str> = request.messages.iter().filter(|m| m.role.is_instruction()).map(|m| m.raw.get()).collect();
        prop_assert_eq!(&out_raw[..instructions.len()], &instructions[..]);
        let body = String::from_utf8(request.to_body(out.iter().map(|m| &**m), false)).unwrap();
        let expected_tools = format!(r#""tools":{}"#, tools);
        prop_assert!(body.contains(&expected_tools));
        // The last user message is there, verbatim.
        let last_user = request.messages.iter().rev().find(|m| m.role == Role::User).unwrap();
        prop_assert!(out_raw.contains(&last_user.raw.get()));
        // After the summary: the pinned user message and every kept message, in the client's
        // order, verbatim or cut in place; the last one is the client's last message.
        let n = request.messages.len();
        let expected: Vec<usize> = chosen.pinned_user.filter(|&p| p < chosen.cut).into_iter()
            .chain((chosen.cut..n).filter(|&i| !roles[i].is_instruction()))
            .collect();
        let after_summary = &parsed[summary_at + 1..];
        prop_assert_eq!(after_summary.len(), expected.len());
        for (sent, &i) in after_summary.iter().zip(&expected) {
            let client: Value = serde_json::from_str(request.messages[i].raw.get()).unwrap();
            let cut_in_place = chosen.truncations.iter().any(|t| t.index == i)
                && sent["role"] == client["role"]
                && sent["tool_call_id"] == client["tool_call_id"]
                && sent["tool_calls"].as_array().map(|c| c.iter().map(|c| c["id"].clone()).collect::<Vec<_>>())
                    == client["tool_calls"].as_array().map(|c| c.iter().map(|c| c["id"].clone()).collect::<Vec<_>>());
            prop_assert!(*sent == client || cut_in_place, "message {} out of place", i);
        }
        prop_assert_eq!(expected.last().copied(), Some(n - 1), "the request must end with the client's last message: {:?} {:?} {:?} start {} pinned {:?}", &roles, &tokens, &chosen, start, pinned);
        let last_user_index = roles.iter().rposition(|r| *r == Role::User).unwrap();
        prop_assert!(expected.contains(&last_user_index));
        // The kept part fits its budget, unless the last user message alone is larger, or the
        // newest step is kept cut to the floor (it is never summarized).
        let kept_cost: u64 = (0..n)
            .filter(|&i| (i >= chosen.cut || Some(i) == chosen.pinned_user) && !roles[i].is_instruction())
            .map(|i| chosen.truncations.iter().find(|t| t.index == i).map_or(tokens[i], |t| t.keep_tokens))
            .sum();
        let newest_step = units(&roles).pop().unwrap();
        let at_floor: u64 = chosen.pinned_user.map_or(0, |p| tokens[p])
            + newest_step.filter(|&i| roles[i] != Role::User).map(|i| tokens[i].min(MIN_TRUNCATED_TOKENS)).sum::<u64>();
        prop_assert!(kept_cost <= budget || tokens[last_user_index] > budget || kept_cost <= at_floor, "kept {} > budget {}", kept_cost, budget);
        // Every message that is gone is covered by this summary or the one it extends.
        for (i, m) in request.messages.iter().enumerate() {
            let present = out_raw.contains(&m.raw.get()) || chosen.truncations.iter().any(|t| t.index == i);
            if !present {
                prop_assert!(newly.contains(&i) || covered_before.contains(&i), "message {} dropped without cover", i);
            }
        }
    }
}
