use super::*;
use compactor::dialect::chat::request::ChatRequest;

fn conversation() -> ChatRequest {
    ChatRequest::parse(
        br#"{"model":"m","messages":[
        {"role":"system","content":"be brief"},
        {"role":"user","content":"Please refactor the session listeners so unsubscribe keeps them alive"},
        {"role":"assistant","content":null,"tool_calls":[
          {"id":"1","type":"function","function":{"name":"read","arguments":"{\"path\":\"/repo/src/core/agent-session.ts\"}"}},
          {"id":"2","type":"function","function":{"name":"edit","arguments":"{\"path\":\"src/modes/rpc-mode.ts\",\"oldText\":\"_disconnectFromAgent()\"}"}}]},
        {"role":"tool","tool_call_id":"1","content":"class AgentSession { subscribe() } // 885 lines, WP14"},
        {"role":"tool","tool_call_id":"2","content":"error TS2345: Argument of type"},
        {"role":"user","content":"continue"}
        ]}"#,
    )
    .unwrap()
}

fn facts() -> SpanFacts {
    let request = conversation();
    SpanFacts::of(&request.messages, &[1, 2, 3, 4, 5])
}

#[test]
fn span_facts_hold_tool_paths_and_judgeable_requests() {
    let facts = facts();
    assert_eq!(
        facts.paths,
        vec!["/repo/src/core/agent-session.ts", "src/modes/rpc-mode.ts"]
    );
    assert_eq!(facts.requests.len(), 1);
    assert_eq!(facts.requests[0].message, 1);
    assert!(facts.requests[0]
        .key_words
        .contains(&"unsubscribe".to_string()));
    assert!(!facts.requests[0].key_words.contains(&"please".to_string()));
    assert_eq!(facts.unscored_requests, 1, "`continue` is not judged");
    assert!(
        facts.text.contains("_disconnectfromagent()"),
        "argument values are span text"
    );
}

#[test]
fn paths_match_whole_or_by_last_two_components() {
    let facts = facts();
    let score = score(
        "Edited `modes/rpc-mode.ts`; read agent-session.ts",
        &facts,
        None,
    );
    assert_eq!((score.paths.found, score.paths.total), (1, 2));
    assert_eq!(score.paths.missing, vec!["/repo/src/core/agent-session.ts"]);
    assert!(mentions(
        "see core/agent-session.ts.",
        "/repo/src/core/agent-session.ts"
    ));
    assert!(!mentions(
        "see core/agent-session.tsx",
        "/repo/src/core/agent-session.ts"
    ));
}

#[test]
fn entities_are_the_references_code_like_words_found_in_the_span() {
    let reference = "## Goal\nKeep `AgentSession` listeners; `_disconnectFromAgent()` is private. \
        WP14 next, file is 885 lines. Fix error TS2345 in src/modes/rpc-mode.ts. \
        Use `npm run check` and the Session object with thinkingLevel (WP99 missing).";
    let facts = facts();
    let entities = salient_entities(reference, &facts);
    assert_eq!(
        entities,
        vec![
            "AgentSession",
            "_disconnectFromAgent",
            "WP14",
            "885",
            "TS2345",
            "src/modes/rpc-mode.ts"
        ],
        "`npm run check`, thinkingLevel and WP99 are not in the span; plain words are not entities"
    );
    let ours = "AgentSession keeps listeners. Next: wp14. Edited rpc-mode.ts in modes/rpc-mode.ts";
    let scored = score(ours, &facts, Some(&entities));
    let entities = scored.entities.unwrap();
    assert_eq!((entities.found, entities.total), (3, 6));
    assert_eq!(
        entities.missing,
        vec!["_disconnectFromAgent", "885", "TS2345"]
    );
}

#[test]
fn tokens_match_only_whole() {
    assert!(!mentions("finished wp10 and wp12", "WP1"));
    assert!(mentions("finished wp1, then wp2", "WP1"));
    assert!(!mentions("mainly", "main"));
}

#[test]
fn a_request_is_present_when_half_its_key_words_are() {
    let facts = facts();
    let keys = &facts.requests[0].key_words;
    assert_eq!(keys.len(), 6, "{keys:?}");
    let half: Vec<&str> = keys.iter().take(3).map(String::as_str).collect();
    let summary = format!("The user asked: {}.", half.join(" "));
    assert_eq!(score(&summary, &facts, None).requests.found, 1);
    let fewer = format!("The user asked: {}.", keys[..2].join(" "));
    let missed = score(&fewer, &facts, None).requests;
    assert_eq!((missed.found, missed.total), (0, 1));
    assert_eq!(missed.missing, vec!["message 1"]);
    // Stems: "refactoring listener" finds "refactor" and "listeners".
    assert!(keys.contains(&"refactor".to_string()) && keys.contains(&"listeners".to_string()));
}

#[test]
fn key_words_are_the_requests_words_the_span_uses_elsewhere() {
    let request = ChatRequest::parse(
        br#"{"model":"m","messages":[
        {"role":"user","content":"why does unsubscribe clear the listeners, whatevr lsiteners"},
        {"role":"assistant","content":"unsubscribe() removes listeners; unsubscribe is called twice"}]}"#,
    )
    .unwrap();
    let facts = SpanFacts::of(&request.messages, &[0, 1]);
    assert_eq!(
        facts.requests[0].key_words,
        vec!["listeners", "unsubscribe"]
    );
}

#[test]
fn summaries_of_earlier_turns_are_not_requests() {
    let request = ChatRequest::parse(
        br#"{"model":"m","messages":[{"role":"user","content":"Earlier work was compacted: <summary>refactor everything carefully</summary>"}]}"#,
    )
    .unwrap();
    let facts = SpanFacts::of(&request.messages, &[0]);
    assert!(facts.requests.is_empty() && facts.unscored_requests == 0);
}

#[test]
fn shares_add_and_report_percent() {
    let mut total = Share::default();
    assert_eq!(total.percent(), None);
    total.add(&Share {
        found: 1,
        total: 2,
        missing: vec![],
    });
    total.add(&Share {
        found: 2,
        total: 2,
        missing: vec![],
    });
    assert_eq!(total.percent(), Some(75.0));
}
