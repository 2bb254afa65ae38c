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
    assert!(kept[0].len() < 200, "the long command is cut: {}", kept[0]);
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

#[test]
fn what_a_printing_command_prints_is_not_its_outcome() {
    let run = |command: &str, output: &str| {
        let body = serde_json::json!({"model": "m", "messages": [
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "1", "type": "function", "function": {"name": "bash",
                 "arguments": serde_json::json!({"command": command}).to_string()}}]},
            {"role": "tool", "tool_call_id": "1", "content": output}
        ]});
        let index = Index::collect(&views(&body.to_string()));
        index.entries[0].detail.clone()
    };
    assert_eq!(
        run(
            "cd /repo && grep -n error src/a.ts",
            "12:  } catch (error) {"
        ),
        ""
    );
    assert_eq!(run("git diff src/a.ts", "-  return undefined;"), "");
    assert_eq!(
        run(
            "ls missing",
            "ls: cannot access 'missing': No such file or directory"
        ),
        "ls: cannot access 'missing': No such file or directory",
        "a printer's own complaint is its failure"
    );
    assert_eq!(
        run(
            "npm run check 2>&1 | grep error",
            "src/a.ts(3,1): error TS2304: x"
        ),
        "src/a.ts(3,1): error TS2304: x",
        "a build's errors, filtered by grep, are the build's"
    );
    assert_eq!(
        run(
            "npm run lint",
            "  216 │ * @throws Error if none\nsrc/b.ts:4 failed"
        ),
        "src/b.ts:4 failed",
        "a code frame quotes code"
    );
}

#[test]
fn a_command_carried_cut_is_the_one_run_again() {
    let long = format!(
        "grep -rn pattern {}",
        "packages/coding-agent/src/".repeat(4)
    );
    let full = Index::parse([format!("$ {}", cut(&long, COMMAND_CHARS)).as_str()]);
    let short = Index::parse([format!("$ {} ×2", cut(&long, SHORT_COMMAND_CHARS)).as_str()]);
    let merged = full.then(short);
    assert_eq!(merged.entries.len(), 1, "{merged:?}");
    assert_eq!(merged.entries[0].uses, 3);
    assert_eq!(
        merged.entries[0].name,
        cut(&long, COMMAND_CHARS),
        "the whole name kept"
    );
}

#[test]
fn commands_that_read_the_same_once_cut_are_listed_once_when_short_of_room() {
    let head = "cd /Users/someone/workspaces/project && grep -n \"registerHandler\" ";
    let lines: Vec<String> = (0..6)
        .map(|i| format!("$ {head}packages/module-{i}/src/index.ts"))
        .chain((0..30).map(|i| format!("$ step_{i}")))
        .collect();
    let index = Index::parse(lines.iter().map(String::as_str));
    let (all, _) = index.fit(Encoding::O200k, 100_000, 10);
    assert_eq!(all.len(), 36, "all whole when they fit");
    let (kept, used) = index.fit(Encoding::O200k, 200, 10);
    assert!(used <= 200, "{used}");
    let greps: Vec<&String> = kept.iter().filter(|l| l.contains("grep -n")).collect();
    assert_eq!(greps.len(), 1, "{kept:?}");
    assert!(greps[0].contains("×6"), "{}", greps[0]);
    assert!(
        kept.len() > 12,
        "the room the repeats took goes to others: {kept:?}"
    );
}

#[test]
fn a_cut_ends_at_a_word_and_is_stable() {
    let command =
        "cd /Users/someone/workspaces/project && grep -n \"WP6:\" packages/coding-agent/src/x.ts";
    let short = cut(command, SHORT_COMMAND_CHARS);
    assert_eq!(
        short,
        "cd /Users/someone/workspaces/project && grep -n \"WP6:\" …"
    );
    assert_eq!(
        cut(&short, SHORT_COMMAND_CHARS),
        short,
        "cutting again changes nothing"
    );
    let path = format!("ls -la /repo/{}", "a".repeat(80));
    assert_eq!(
        cut(&path, SHORT_COMMAND_CHARS).chars().count(),
        SHORT_COMMAND_CHARS + 2
    );
    let outcome = Entry {
        kind: Kind::Command,
        name: "npm run check".into(),
        detail: format!("exit 2: src/a.ts(3,1): error TS2304: {}", "x ".repeat(60)),
        uses: 1,
    };
    assert!(
        outcome
            .line(SHORT_COMMAND_CHARS, SHORT_OUTCOME_CHARS, 8)
            .contains(&format!(
                "→ exit 2: src/a.ts(3,1): error TS2304: {}",
                "x ".repeat(16)
            )),
        "the exit code does not take the error line's room"
    );
}

#[test]
fn an_earlier_runs_failure_stays_when_a_newer_outcome_replaces_it() {
    let older = Index::parse(["$ npm run check → exit 2: src/a.ts(3,1): error TS2304: x"]);
    let newer = Index::parse(["$ npm run check → exit 2: src/b.ts(9,4): error TS2339: y"]);
    let got: Vec<String> = newer
        .then(older)
        .entries
        .iter()
        .map(|e| e.line(COMMAND_CHARS, OUTCOME_CHARS, usize::MAX))
        .collect();
    assert_eq!(
        got,
        [
            "$ npm run check ×2 → exit 2: src/b.ts(9,4): error TS2339: y",
            "error: src/a.ts(3,1): error TS2304: x",
        ]
    );
    let body = r#"{"model":"m","messages":[
        {"role":"assistant","content":null,"tool_calls":[
          {"id":"1","type":"function","function":{"name":"bash","arguments":"{\"command\":\"cargo build\"}"}},
          {"id":"2","type":"function","function":{"name":"bash","arguments":"{\"command\":\"cargo build\"}"}}]},
        {"role":"tool","tool_call_id":"1","content":"error[E0425]: cannot find value `x`"},
        {"role":"tool","tool_call_id":"2","content":"error[E0308]: mismatched types"}
        ]}"#;
    let index = Index::collect(&views(body));
    assert!(
        index
            .entries
            .iter()
            .any(|e| e.kind == Kind::Error && e.name == "error[E0425]: cannot find value `x`"),
        "within one span too: {index:?}"
    );
}

#[test]
fn an_edit_reports_a_failure_only_in_its_first_line() {
    let index = Index::collect(&views(
        r#"{"model":"m","messages":[
        {"role":"assistant","content":null,"tool_calls":[
          {"id":"1","type":"function","function":{"name":"edit","arguments":"{\"path\":\"src/a.ts\",\"oldText\":\"a\",\"newText\":\"b\"}"}},
          {"id":"2","type":"function","function":{"name":"edit","arguments":"{\"path\":\"src/b.ts\",\"oldText\":\"a\",\"newText\":\"b\"}"}}]},
        {"role":"tool","tool_call_id":"1","content":"Successfully replaced text in src/a.ts.\n  } catch (error: any) {\n    this.agent = undefined;"},
        {"role":"tool","tool_call_id":"2","content":"Error: could not find the text in src/b.ts\n  } catch (error: any) {"}
        ]}"#,
    ));
    let errors: Vec<String> = lines(&index)
        .into_iter()
        .filter(|l| l.starts_with("error: "))
        .collect();
    assert_eq!(
        errors,
        ["error: Error: could not find the text in src/b.ts"],
        "code an edit echoes back is not its failure"
    );
}
