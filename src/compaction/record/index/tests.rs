use super::*;
use crate::dialect::chat::request::ChatRequest;

fn views(body: &str) -> Vec<(Role, MessageView)> {
    let request = ChatRequest::parse(body.as_bytes()).unwrap();
    request
        .messages
        .iter()
        .map(|m| (m.role, m.view().clone()))
        .collect()
}

fn span() -> Vec<(Role, MessageView)> {
    views(
        r#"{"model":"m","messages":[
        {"role":"user","content":"Bump serde to 1.0.210, see https://docs.rs/serde/latest/serde/."},
        {"role":"assistant","content":null,"tool_calls":[
          {"id":"1","type":"function","function":{"name":"read","arguments":"{\"path\":\"src/a.rs\"}"}},
          {"id":"2","type":"function","function":{"name":"edit","arguments":"{\"path\":\"src/a.rs\",\"oldText\":\"fn old_name() {}\",\"newText\":\"pub fn retry_budget() -> u32 { 7 }\"}"}},
          {"id":"3","type":"function","function":{"name":"write","arguments":"{\"path\":\"config/app.toml\",\"content\":\"max_retries = 7\\n[server]\\nlisten_port = 80\\n\"}"}},
          {"id":"4","type":"function","function":{"name":"bash","arguments":"{\"command\":\"cargo test -q\"}"}},
          {"id":"5","type":"function","function":{"name":"edit","arguments":"{\"path\":\"src/b.rs\",\"oldText\":\"x\",\"newText\":\"y\"}"}}]},
        {"role":"tool","tool_call_id":"1","content":"error: in a file read, not an error"},
        {"role":"tool","tool_call_id":"2","content":"Edited."},
        {"role":"tool","tool_call_id":"3","content":"Written."},
        {"role":"tool","tool_call_id":"4","content":"error[E0425]: cannot find value `x`\nmore\nProcess exited with code 101"},
        {"role":"tool","tool_call_id":"5","content":"Could not find the exact text in src/b.rs"},
        {"role":"assistant","content":null,"tool_calls":[
          {"id":"6","type":"function","function":{"name":"bash","arguments":"{\"command\":\"cargo test -q\"}"}}]},
        {"role":"tool","tool_call_id":"6","content":"test result: ok. 3 passed; 0 failed"}
        ]}"#,
    )
}

fn lines(index: &Index) -> Vec<String> {
    index
        .entries
        .iter()
        .map(|e| e.line(COMMAND_CHARS, OUTCOME_CHARS, usize::MAX))
        .collect()
}

#[test]
fn takes_the_exact_names_of_a_span() {
    let index = Index::collect(&span());
    assert_eq!(
        lines(&index),
        [
            "$ cargo test -q ×2 → exit 101: error[E0425]: cannot find value `x`",
            "edited src/b.rs",
            "wrote config/app.toml: max_retries, listen_port",
            "edited src/a.rs: retry_budget, old_name",
            "error: Could not find the exact text in src/b.rs",
            "version: 1.0.210",
            "url: https://docs.rs/serde/latest/serde/",
        ],
        "most used first, then newest; a file read is not an error; the newest non-empty \
         outcome of a command is kept; a config file's symbols are its keys; both sides of an \
         edit name the symbols it edited"
    );
}

#[test]
fn lines_parse_back_to_their_entries() {
    let index = Index::collect(&span());
    let parsed = Index::parse(lines(&index).iter().map(String::as_str));
    assert_eq!(parsed, index);
}

#[test]
fn carried_entries_add_their_uses_and_the_newest_rank_first_among_equals() {
    let older = Index::parse(["$ npm test ×3 → exit 1", "$ ls", "edited src/a.rs: parse"]);
    let newer = Index::parse([
        "$ cargo build",
        "$ npm test → exit 0",
        "edited src/a.rs: lex",
    ]);
    let merged = newer.then(older);
    let got: Vec<String> = merged
        .entries
        .iter()
        .map(|e| e.line(COMMAND_CHARS, OUTCOME_CHARS, usize::MAX))
        .collect();
    assert_eq!(
        got,
        [
            "$ npm test ×4 → exit 0",
            "edited src/a.rs ×2: lex, parse",
            "$ cargo build",
            "$ ls",
        ],
        "uses add up; the newer outcome and symbols come first; a new entry outranks an old one \
         of the same use"
    );
}

#[test]
fn fit_shortens_before_it_leaves_out_the_least_ranked() {
    let long = format!("$ {} → exit 1: {}", "x".repeat(300), "y".repeat(300));
    let mut lines = vec![long.as_str()];
    let names: Vec<String> = (0..40).map(|i| format!("$ step_{i}")).collect();
    lines.extend(names.iter().map(String::as_str));
    let index = Index::parse(lines);
    let (kept, used) = index.fit(Encoding::O200k, 150, 10);
    assert!(used <= 150, "{used}");
    assert!(kept[0].len() < 150, "the long command is cut: {}", kept[0]);
    assert!(
        kept[1..].iter().zip(&names).all(|(k, n)| k == n),
        "in rank order"
    );
    assert!(kept.len() < 41 && kept.len() > 10, "{}", kept.len());
    let (all, _) = index.fit(Encoding::O200k, 100_000, 10);
    assert_eq!(all.len(), 41);
}

#[test]
fn prose_declares_nothing_and_methods_are_declared() {
    let prose = serde_json::json!({"path": "docs/plan.md", "content": "the type that we use"});
    assert!(declared_names(&prose).is_empty());
    let code = serde_json::json!({"path": "src/a.ts",
        "newText": "private reconnect(): void {}\nconst MAX_RETRIES = 7;\ntype Mode = 'a';"});
    assert_eq!(declared_names(&code), ["reconnect", "MAX_RETRIES", "Mode"]);
}
