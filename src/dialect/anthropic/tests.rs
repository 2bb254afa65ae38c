//! The Messages dialect against Claude Code's recorded requests and hand-written edge cases.

use serde_json::{json, Value};

use super::*;
use crate::dialect::Dialect;
use crate::store::Checkpoint;

const SESSION: &str = include_str!("../../../tests/fixtures/claude-code/session.jsonl");
const ANTHROPIC_OVERFLOW: &str =
    include_str!("../../../tests/fixtures/anthropic/overflow-anthropic.json");
const LLAMA_OVERFLOW: &str = include_str!("../../../tests/fixtures/anthropic/overflow-llama.json");
const INVALID: &str = include_str!("../../../tests/fixtures/anthropic/invalid-request.json");

fn session() -> Vec<Box<dyn WireRequest>> {
    SESSION
        .lines()
        .map(|line| {
            let record: Value = serde_json::from_str(line).unwrap();
            Messages
                .parse(&Bytes::from(record["body"].to_string()))
                .unwrap()
        })
        .collect()
}

#[test]
fn claude_code_re_serialization_keeps_the_hash_chain() {
    let requests = session();
    for pair in requests.windows(2) {
        let (before, after) = (&pair[0], &pair[1]);
        assert!(after.len() > before.len());
        // The previous last message came back with other bytes, and the same meaning.
        let last = before.len() - 1;
        assert_ne!(before.raw(last), after.raw(last));
        for i in 0..before.len() {
            assert_eq!(before.canonical(i), after.canonical(i), "message {i}");
        }
    }
}

#[test]
fn tool_results_are_tool_elements_and_stay_with_their_call() {
    let requests = session();
    let last = requests.last().unwrap();
    let roles: Vec<Role> = (0..last.len()).map(|i| last.role(i)).collect();
    let results: Vec<usize> = (0..last.len())
        .filter(|&i| roles[i] == Role::Tool)
        .collect();
    assert_eq!(results.len(), 2, "two tool loops in the session");
    for unit in crate::dialect::units(&roles) {
        assert_ne!(
            roles[unit.start],
            Role::Tool,
            "a unit never starts at a result"
        );
    }
    assert!(last
        .transcript(results[0])
        .starts_with("[tool result toolu_stub"));
}

fn checkpoint(covered: usize, pinned_user: Option<usize>) -> Checkpoint {
    Checkpoint {
        pinned_user,
        truncations: vec![],
        summary: "## Goal\nkeep going".into(),
        ..crate::store::contract::sample("a", covered, 0)
    }
}

#[test]
fn render_puts_the_summary_first_and_keeps_the_rest_byte_for_byte() {
    let body = json!({
        "model": "m", "max_tokens": 5,
        "system": [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": "one"},
            {"role": "system", "content": "cwd: /repo"},
            {"role": "assistant", "content": "two"},
            {"role": "user", "content": [{"type": "text", "text": "three", "cache_control": {"type": "ephemeral"}}]},
        ],
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    });
    let request = Messages.parse(&Bytes::from(body.to_string())).unwrap();
    let cp = checkpoint(3, None);
    let tokens = vec![10; 4];
    let out = request.render(&Through {
        checkpoint: &cp,
        tokens: &tokens,
        merge_into_user: false,
        text: &format!("<summary>\n{}\n</summary>", cp.summary),
    });
    let sent: Value = serde_json::from_slice(&out).unwrap();
    let messages = sent["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 3);
    assert_eq!(messages[0]["role"], "user");
    assert!(messages[0]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("## Goal\nkeep going"));
    assert_eq!(
        messages[1], body["messages"][1],
        "system notes kept after the summary"
    );
    assert_eq!(messages[2], body["messages"][3]);
    for field in ["system", "context_management", "model", "max_tokens"] {
        assert_eq!(sent[field], body[field]);
    }
    assert!(String::from_utf8(out).unwrap().contains(request.raw(3)));
}

#[test]
fn merged_into_user_the_summary_opens_the_next_turn() {
    let body = json!({"model": "m", "messages": [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "two"},
        {"role": "system", "content": "cwd: /repo"},
        {"role": "user", "content": "three"},
        {"role": "assistant", "content": "four"},
    ]});
    let request = Messages.parse(&Bytes::from(body.to_string())).unwrap();
    let cp = checkpoint(3, None);
    let out = request.render(&Through {
        checkpoint: &cp,
        tokens: &[10; 5],
        merge_into_user: true,
        text: "SUMMARY",
    });
    let sent: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(
        sent["messages"],
        json!([
            {"role": "system", "content": "cwd: /repo"},
            {"role": "user", "content": [{"type": "text", "text": "SUMMARY"}, {"type": "text", "text": "three"}]},
            {"role": "assistant", "content": "four"},
        ])
    );
}

#[test]
fn overflows_of_both_providers_are_recognised() {
    let anthropic = Messages
        .overflow(400, ANTHROPIC_OVERFLOW.as_bytes())
        .unwrap();
    assert_eq!(
        (anthropic.requested, anthropic.limit),
        (Some(203284), Some(200000))
    );
    let llama = Messages.overflow(400, LLAMA_OVERFLOW.as_bytes()).unwrap();
    assert_eq!(llama.limit, Some(4096));
    assert_eq!(Messages.overflow(400, INVALID.as_bytes()), None);
    let stream = format!("event: error\ndata: {}\n\n", ANTHROPIC_OVERFLOW.trim());
    assert!(Messages.overflow_in_stream(stream.as_bytes()).is_some());
    let normal = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{}}\n\n";
    assert_eq!(Messages.overflow_in_stream(normal), None);
}

#[test]
fn errors_are_in_anthropics_shape() {
    let error = |status, code, message: &str| ClientError {
        status,
        kind: "invalid_request_error",
        code,
        param: None,
        message: message.into(),
    };
    let body = Messages.error_body(&error(400, None, "missing required parameter: 'model'"));
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert_eq!(
        body["error"]["message"],
        "missing required parameter: 'model'"
    );
    let too_long = Messages.error_body(&error(
        400,
        Some("context_length_exceeded"),
        "this request needs 5200 tokens but the model's window is 4096",
    ));
    assert_eq!(
        too_long["error"]["message"],
        "prompt is too long: 5200 tokens > 4096 maximum"
    );
    assert_eq!(
        Messages.error_body(&error(502, None, "x"))["error"]["type"],
        "api_error"
    );
    // The type the SDK reads as a gateway timeout.
    assert_eq!(
        Messages.error_body(&error(504, None, "x"))["error"]["type"],
        "timeout_error"
    );
    assert_eq!(
        Messages.error_body(&error(404, None, "x"))["error"]["type"],
        "not_found_error"
    );
    assert!(too_long["error"].get("details").is_none());
    let refused = Messages.error_body(&error(
        400,
        Some("compaction_signature_invalid"),
        "the compaction block's signature is invalid",
    ));
    assert_eq!(
        refused["error"]["details"],
        serde_json::json!({"error_code": "compaction_signature_invalid"})
    );
    let unavailable = Messages.error_body(&error(529, Some("compaction_unavailable"), "x"));
    assert_eq!(unavailable["error"]["type"], "overloaded_error");
    assert_eq!(
        unavailable["error"]["details"]["error_code"],
        "compaction_unavailable"
    );
}

#[test]
fn summary_requests_are_messages_requests() {
    let body = Messages.summary_request(&SummaryRequest {
        model: "m",
        system: "summarize",
        user: "<transcript>",
        max_tokens: 128,
        conversation: None,
    });
    assert_eq!(body["system"], "summarize");
    assert_eq!(
        body["messages"],
        json!([{"role": "user", "content": "<transcript>"}])
    );
    assert_eq!(body["max_tokens"], 128);
    let answer = br###"{"type":"message","content":[{"type":"text","text":" ## Goal\nx "}],"stop_reason":"end_turn"}"###;
    assert_eq!(Messages.summary_answer(answer).unwrap(), "## Goal\nx");
    assert!(Messages.summary_answer(b"{\"content\":[]}").is_err());
}

#[test]
fn a_continuation_marks_its_instructions_for_the_cache_and_asks_for_text() {
    let conversation = |extra: &str| {
        format!(
            r#"{{"model":"m","stream":true,"max_tokens":32000,"system":"rules",
            "tools":[{{"name":"read","input_schema":{{}}}}],"tool_choice":{{"type":"any"}},
            "context_management":{{"edits":[]}}{extra},
            "messages":[{{"role":"user","content":"hi"}},{{"role":"assistant","content":"hello"}}]}}"#
        )
    };
    let ask = |body: &str| {
        Messages.summary_request(&SummaryRequest {
            model: "m",
            system: "unused",
            user: "summarize it",
            max_tokens: 700,
            conversation: Some(body.as_bytes()),
        })
    };
    let body = ask(&conversation(""));
    let messages = body["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 3);
    assert_eq!(messages[1]["content"], "hello");
    assert_eq!(
        messages[2],
        json!({"role": "user", "content": [{"type": "text", "text": "summarize it",
            "cache_control": {"type": "ephemeral"}}]})
    );
    assert_eq!(body["system"], "rules");
    assert_eq!(body["max_tokens"], 700);
    assert_eq!(body["stream"], false);
    assert!(
        body.get("tool_choice").is_none(),
        "a forced tool is dropped"
    );
    assert!(body.get("context_management").is_none());
    // A choice that forces nothing stays (changing it would invalidate the cached messages);
    // thinking's budget is added to the summary's.
    let auto = conversation(r#","thinking":{"type":"enabled","budget_tokens":2000}"#)
        .replace(r#"{"type":"any"}"#, r#"{"type":"auto"}"#);
    let body = ask(&auto);
    assert_eq!(body["tool_choice"], json!({"type": "auto"}));
    assert_eq!(body["max_tokens"], 2700);
    // Adaptive thinking, whose length the model decides: the client's own budget.
    let adaptive = conversation(r#","thinking":{"type":"adaptive"}"#);
    assert_eq!(ask(&adaptive)["max_tokens"], 32000);
    assert_eq!(ask(&adaptive)["thinking"], json!({"type": "adaptive"}));
    // Four breakpoints already: none added, the request would be refused.
    let marked = conversation("").replace(
        r#""content":"hi""#,
        r#""content":[{"type":"text","text":"a","cache_control":{"type":"ephemeral"}},{"type":"text","text":"b","cache_control":{"type":"ephemeral"}},{"type":"text","text":"c","cache_control":{"type":"ephemeral"}},{"type":"text","text":"d","cache_control":{"type":"ephemeral"}}]"#,
    );
    let body = ask(&marked);
    assert!(body["messages"][2]["content"][0]
        .get("cache_control")
        .is_none());
}

#[test]
fn usage_adds_the_cached_part() {
    let usage = |event: Value| Messages.reported_usage(event.to_string().as_bytes());
    let start = usage(
        json!({"type": "message_start", "message": {"model": "claude-x",
        "content": [], "usage": {"input_tokens": 120, "cache_creation_input_tokens": 5,
        "cache_read_input_tokens": 800, "output_tokens": 1}}}),
    )
    .unwrap();
    assert_eq!(start.input_tokens, Some(925));
    assert_eq!(start.cache_read_tokens, Some(800));
    assert_eq!(start.cache_creation_tokens, Some(5));
    assert_eq!(start.model.as_deref(), Some("claude-x"));
    // `message_delta` carries it at the top, beside the stop reason.
    let delta = usage(
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
        "usage": {"output_tokens": 33}}),
    )
    .unwrap();
    assert_eq!((delta.input_tokens, delta.output_tokens), (None, Some(33)));
    // A whole answer: usage at the top, after content that mentions it.
    let whole = usage(json!({"model": "claude-y", "content": [{"type": "text",
        "text": "\"usage\": {\"input_tokens\": 1}"}], "usage": {"input_tokens": 40,
        "output_tokens": 2}}))
    .unwrap();
    assert_eq!(whole.input_tokens, Some(40));
    assert_eq!(whole.model.as_deref(), Some("claude-y"));
    assert!(usage(json!({"type": "message_stop"})).is_none());
    assert!(Messages.reported_usage(b"not json").is_none());
    assert!(Messages
        .reported_usage(b"{\"usage\": {\"input_tokens\": 4")
        .is_none());
}
