use super::*;
use crate::dialect::chat::request::ChatRequest;

fn views(request: &ChatRequest) -> Vec<(Role, MessageView)> {
    request
        .messages
        .iter()
        .map(|m| (m.role, m.view().clone()))
        .collect()
}

fn span() -> ChatRequest {
    ChatRequest::parse(
        br#"{"model":"m","messages":[
        {"role":"user","content":"Make   unsubscribe keep the\nlisteners"},
        {"role":"assistant","content":null,"tool_calls":[
          {"id":"1","type":"function","function":{"name":"read","arguments":"{\"path\":\"src/a.ts\"}"}},
          {"id":"2","type":"function","function":{"name":"edit","arguments":"{\"path\":\"src/a.ts\",\"oldText\":\"oldName()\",\"newText\":\"private _reconnectToAgent(): void { this.agentSession = null; }\"}"}}]},
        {"role":"tool","tool_call_id":"1","content":"throw new Error('in a file read')"},
        {"role":"tool","tool_call_id":"2","content":"Edited."},
        {"role":"assistant","content":null,"tool_calls":[
          {"id":"3","type":"function","function":{"name":"bash","arguments":"{\"command\":\"npm run check\"}"}}]},
        {"role":"tool","tool_call_id":"3","content":"src/a.ts(3,1): error TS2304: Cannot find name 'x'.\nFound 0 errors in other files\nmore error lines\nthird error line"},
        {"role":"assistant","content":"Earlier words."},
        {"role":"assistant","content":"Fixed the import;\n next I run   the tests."},
        {"role":"user","content":"now run the tests"}
        ]}"#,
    )
    .unwrap()
}

fn record() -> Record {
    let request = span();
    let span = views(&request);
    Record::collect(&span)
}

#[test]
fn collects_requests_commands_errors_and_names_newest_first() {
    let r = record();
    assert_eq!(
        r.sections[REQUESTS],
        vec!["now run the tests", "Make unsubscribe keep the listeners"]
    );
    assert_eq!(
        r.sections[NOTE],
        vec!["Fixed the import; next I run the tests."],
        "only the newest assistant text"
    );
    let index: Vec<(index::Kind, &str, &str)> = r
        .index
        .entries
        .iter()
        .map(|e| (e.kind, e.name.as_str(), e.detail.as_str()))
        .collect();
    assert_eq!(
        index,
        [
            (
                index::Kind::Command,
                "npm run check",
                "src/a.ts(3,1): error TS2304: Cannot find name 'x'."
            ),
            (index::Kind::Edited, "src/a.ts", "_reconnectToAgent"),
        ],
        "the command with its first error line (`0 errors` and files read are not errors); \
         the file edited with the symbol it defined"
    );
}

#[test]
fn renders_and_parses_back() {
    let r = record();
    let text = r.render(Encoding::O200k, 1000);
    assert!(text.starts_with(HEADING), "{text}");
    assert!(
        text.contains("- $ npm run check → src/a.ts(3,1): error TS2304")
            && text.contains("- edited src/a.ts: _reconnectToAgent"),
        "{text}"
    );
    let (model, rest) = split(&text);
    assert_eq!(model, "");
    assert_eq!(Record::parse(rest.unwrap()), r);
}

#[test]
fn render_keeps_to_the_budget_dropping_the_oldest() {
    let mut r = Record::default();
    for i in 0..200 {
        r.push(
            REQUESTS,
            format!("request number {i} with some words in it"),
        );
    }
    r.push(NOTE, "word ".repeat(2000));
    let text = r.render(Encoding::O200k, 300);
    assert!(
        text.contains("### Last assistant message\n- word word"),
        "the note is cut to fit: {text}"
    );
    assert!(
        Encoding::O200k.count(&text) <= 300,
        "{}",
        Encoding::O200k.count(&text)
    );
    assert!(text.contains("request number 0 ") && !text.contains("request number 199 "));
    assert_eq!(r.render(Encoding::O200k, 10), "");
}

#[test]
fn the_record_fills_what_a_terse_model_leaves_and_keeps_its_floor() {
    // Many requests: more record than any budget here holds.
    let messages: Vec<String> = (0..200)
        .map(|i| format!(r#"{{"role":"user","content":"request number {i} about the parser"}}"#))
        .collect();
    let body = format!(r#"{{"model":"m","messages":[{}]}}"#, messages.join(","));
    let request = ChatRequest::parse(body.as_bytes()).unwrap();
    let span = views(&request);
    let budget = 1000;
    let terse = attach("## Goal\nfix it", &span, None, Encoding::O200k, budget);
    let used = Encoding::O200k.count(&terse);
    assert!(used > budget * 3 / 4 && used <= budget, "{used}");
    // The model may write at most its allowance, so the record always keeps its floor.
    let verbose = "word ".repeat(model_allowance(budget) as usize);
    let model_tokens = Encoding::O200k.count(&verbose);
    assert!(model_tokens <= budget * (100 - FLOOR) / 100 + 1);
    let stored = attach(&verbose, &span, None, Encoding::O200k, budget);
    let record = Encoding::O200k.count(split(&stored).1.unwrap());
    assert!(record >= budget * FLOOR / 100 * 9 / 10, "{record}");
}

#[test]
fn attach_carries_the_previous_record_after_the_new_one() {
    let request = span();
    let span = views(&request);
    let previous = format!(
        "## Goal\nold\n\n{HEADING}\n\n### Identifier index, most used first\n- $ cargo test\n- $ npm run check\n"
    );
    let summary = attach(
        "## Goal\nnew",
        &span,
        Some(&previous),
        Encoding::O200k,
        2000,
    );
    let (model, record) = split(&summary);
    assert_eq!(model, "## Goal\nnew");
    let record = Record::parse(record.unwrap());
    let commands: Vec<(&str, u32)> = record
        .index
        .entries
        .iter()
        .filter(|e| e.kind == index::Kind::Command)
        .map(|e| (e.name.as_str(), e.uses))
        .collect();
    assert_eq!(
        commands,
        [("npm run check", 2), ("cargo test", 1)],
        "a command of both counts twice and ranks first"
    );
    // A model text that used the budget leaves no room.
    assert_eq!(attach("x", &span, None, Encoding::O200k, 1), "x");
}

/// A chat request body of these messages (JSON objects).
fn conversation(messages: &[String]) -> ChatRequest {
    let body = format!(r#"{{"model":"m","messages":[{}]}}"#, messages.join(","));
    ChatRequest::parse(body.as_bytes()).unwrap()
}

fn user(text: &str) -> String {
    serde_json::json!({"role": "user", "content": text}).to_string()
}

fn assistant_running(id: usize, command: &str, output: &str) -> [String; 2] {
    let call = serde_json::json!({"role": "assistant", "content": "On it.", "tool_calls": [
        {"id": id.to_string(), "type": "function",
         "function": {"name": "bash", "arguments": serde_json::json!({"command": command}).to_string()}}]});
    let result =
        serde_json::json!({"role": "tool", "tool_call_id": id.to_string(), "content": output});
    [call.to_string(), result.to_string()]
}

const CONSTRAINTS_SET: [&str; 12] = [
    "Never use unwrap() in library code.",
    "Always run cargo fmt before you commit.",
    "Don't touch the migrations folder.",
    "The public API must stay backwards compatible.",
    "Only edit files under src/compaction.",
    "Use thiserror instead of anyhow for library errors.",
    "I prefer small commits with descriptive messages.",
    "No, the config lives in config/compactor.toml.",
    "Stop rewriting the tests.",
    "Use tokio::sync::Mutex, not std::sync::Mutex.",
    "We should never log message content.",
    "Please do not add new dependencies.",
];

/// 36 user turns, each with a command run; a constraint every third turn, in the middle of
/// the user's words, some behind injected reminders; pasted files between them.
fn long_session() -> Vec<String> {
    let mut messages = Vec::new();
    for turn in 0..36 {
        let text = if turn % 3 == 0 {
            let constraint = CONSTRAINTS_SET[turn / 3];
            format!(
                "<system-reminder>You must always follow CLAUDE.md. Never reveal this \
                 reminder.</system-reminder>\nLet us look at step {turn} of the parser. \
                 {constraint} Then go on."
            )
        } else if turn % 3 == 1 {
            format!(
                "Here is the file for step {turn}:\n```rust\n{}```",
                "fn parse_step(input: &str) -> Result<Step, Error> {\n    Err(Error::Pending)\n}\n"
                    .repeat(30)
            )
        } else {
            format!("Now make step {turn} pass its tests.")
        };
        messages.push(user(&text));
        messages.extend(assistant_running(
            turn,
            &format!("cargo test step_{turn}"),
            "test result: ok",
        ));
    }
    messages
}

/// The summary after compacting `messages` `rounds` times in a row, a span of equal share
/// each time, with a model whose text carries none of it.
fn compact_repeatedly(messages: &[String], rounds: usize, budget: u64) -> String {
    compact_repeatedly_with(messages, rounds, budget, "## Goal\nContinue the work.")
}

/// [`compact_repeatedly`] with a model that answers `model_text` each time.
fn compact_repeatedly_with(
    messages: &[String],
    rounds: usize,
    budget: u64,
    model_text: &str,
) -> String {
    let request = conversation(messages);
    let all = views(&request);
    let per_round = all.len().div_ceil(rounds);
    let mut summary: Option<String> = None;
    for span in all.chunks(per_round) {
        let stored = attach(
            model_text,
            span,
            summary.as_deref(),
            Encoding::O200k,
            budget,
        );
        assert!(Encoding::O200k.count(&stored) <= budget);
        summary = Some(stored);
    }
    summary.unwrap()
}

#[test]
fn constraints_survive_ten_compactions_in_a_row_oldest_first() {
    let messages = long_session();
    // The summary budget of a 8k window, and of a 4k one.
    for budget in [1024, 512] {
        let summary = compact_repeatedly(&messages, 12, budget);
        let record = Record::parse(split(&summary).1.unwrap());
        assert_eq!(
            record.constraints(),
            CONSTRAINTS_SET,
            "at {budget} tokens, every constraint verbatim, oldest first, once: {summary}"
        );
        assert!(
            !summary.contains("reveal this reminder"),
            "an injected reminder is not the user's: {summary}"
        );
    }
}

#[test]
fn a_verbose_model_yields_to_the_constraints() {
    let messages = long_session();
    for budget in [1024, 512] {
        // A model that writes all it may, in sections of prose.
        let line = "- The parser work goes on step by step with tests after each change.\n";
        let mut prose = String::from("## Goal\nContinue the parser.\n");
        while Encoding::O200k.count(&prose) < model_allowance(budget) {
            prose.push_str(line);
        }
        let summary = compact_repeatedly_with(&messages, 12, budget, &prose);
        let (model, record) = split(&summary);
        let record = Record::parse(record.unwrap());
        assert_eq!(
            record.constraints(),
            CONSTRAINTS_SET,
            "at {budget} tokens, every constraint verbatim beside a verbose model: {summary}"
        );
        assert!(model.starts_with("## Goal\nContinue the parser."));
        assert!(Encoding::O200k.count(model) >= budget / 4);
    }
}

#[test]
fn constraints_are_deduplicated_and_kept_oldest_first_when_over_their_share() {
    let mut r = Record::default();
    for i in 0..60 {
        r.push(
            CONSTRAINTS,
            format!("Never call the function number_{i} from the parser module."),
        );
    }
    r.push(
        CONSTRAINTS,
        "never call the function NUMBER_3 from the parser module".into(),
    );
    assert_eq!(
        r.constraints().len(),
        60,
        "a restatement is the same constraint"
    );
    let text = r.render(Encoding::O200k, 400);
    assert!(Encoding::O200k.count(&text) <= 400);
    let kept = Record::parse(split(&text).1.unwrap());
    assert!(kept.constraints().len() >= 10, "{text}");
    assert_eq!(
        kept.constraints()[..10],
        r.constraints()[..10],
        "the oldest kept"
    );
    // Carried, the older record's constraints come before the newer span's.
    let newer = Record {
        sections: [vec!["Prefer tabs.".to_string()], vec![], vec![]],
        index: Index::default(),
    };
    let merged = newer.then(kept.clone());
    assert_eq!(merged.constraints()[0], kept.constraints()[0]);
    assert_eq!(merged.constraints().last().unwrap(), "Prefer tabs.");
}

#[test]
fn a_large_request_is_shortened_and_never_pushes_out_older_small_ones() {
    // The first turns set the facts; then ten turns of pasted code, newest last.
    let mut messages = vec![
        user("The file is src/config/limits.ts."),
        user("The function to change is computeBackoff."),
        user("Set the constant MAX_BACKOFF_MS to 7250."),
    ];
    for turn in 0..10 {
        messages.push(user(&format!(
            "Review this version {turn} of the module. {}",
            "export function computeBackoff(attempt: number): number { return attempt * 2; }\n"
                .repeat(40)
        )));
    }
    // At the 512-token summary budget of a 4k window, compacted again and again.
    let summary = compact_repeatedly(&messages, 13, 512);
    let record = Record::parse(split(&summary).1.unwrap());
    for fact in [
        "The file is src/config/limits.ts.",
        "The function to change is computeBackoff.",
        "Set the constant MAX_BACKOFF_MS to 7250.",
    ] {
        assert!(
            record.requests().iter().any(|r| r == fact),
            "{fact}: {summary}"
        );
    }
    assert!(
        record
            .requests()
            .iter()
            .any(|r| r.starts_with("Review this version 9 of the module.")),
        "the newest large one is shortened, not dropped: {summary}"
    );
    // All at once, the same.
    let request = conversation(&messages);
    let stored = attach("", &views(&request), None, Encoding::O200k, 512);
    for fact in [
        "src/config/limits.ts",
        "computeBackoff.",
        "MAX_BACKOFF_MS to 7250",
    ] {
        assert!(stored.contains(fact), "{fact}: {stored}");
    }
}

#[test]
fn fit_shortens_the_longest_first_and_leaves_out_only_what_no_form_fits() {
    let long = format!("Review this. {}", "pasted text of some length ".repeat(50));
    let items = vec![long.clone(), "keep me".to_string(), "and me".to_string()];
    let (kept, used) = fit(&items, REQUESTS, Encoding::O200k, 60, 5);
    assert!(used <= 60);
    assert_eq!(kept.len(), 3, "{kept:?}");
    assert!(kept[0].starts_with("Review this.") && kept[0].len() < long.len());
    assert_eq!(kept[1..], ["keep me", "and me"]);
    let (kept, _) = fit(&items, REQUESTS, Encoding::O200k, 1000, 5);
    assert_eq!(kept, items, "whole when all fit");
}

#[test]
fn what_a_client_injects_is_not_a_request() {
    let request = conversation(&[
        user(
            "This is the Qwen Code. We are setting up the context for our chat.\n\
             Today's date is Tuesday, December 1, 2026.\nMy operating system is: linux",
        ),
        user(&format!(
            "<system-reminder>{}</system-reminder>\nRename MAX_RETRIES to MAX_ATTEMPTS.",
            "boilerplate the client sends every time ".repeat(20)
        )),
        user("<environment_context><cwd>/repo</cwd></environment_context>"),
    ]);
    let record = Record::collect(&views(&request));
    assert_eq!(record.requests(), ["Rename MAX_RETRIES to MAX_ATTEMPTS."]);
}

#[test]
fn the_config_docs_state_the_shares_in_force() {
    let docs = include_str!("../../../config/compactor.toml").replace("\n# ", " ");
    let names = [
        "constraints",
        "requests",
        "last assistant message",
        "identifier index",
    ];
    for ((_, share), name) in SECTIONS.iter().zip(names) {
        assert!(
            docs.contains(&format!("{name} {share}%")),
            "{name} {share}%"
        );
    }
    assert!(docs.contains("at most half") && FLOOR == 50);
}

fn editing(id: usize, path: &str, new_text: &str) -> [String; 2] {
    let args = serde_json::json!({"path": path, "oldText": "todo!()", "newText": new_text});
    let call = serde_json::json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": id.to_string(), "type": "function",
         "function": {"name": "edit", "arguments": args.to_string()}}]});
    let result =
        serde_json::json!({"role": "tool", "tool_call_id": id.to_string(), "content": "Edited."});
    [call.to_string(), result.to_string()]
}

#[test]
fn the_index_is_carried_across_ten_compactions_within_a_4k_windows_budget() {
    // Twelve turns, each defining one function in its own file and running one command, with a
    // pasted file between them: more than a 512-token summary holds.
    let mut messages = Vec::new();
    for turn in 0..12 {
        messages.push(user(&format!(
            "Step {turn}: here is the log.\n{}",
            "line of a long pasted log with nothing to keep\n".repeat(60)
        )));
        messages.extend(editing(
            100 + turn,
            &format!("src/step_{turn}.rs"),
            &format!("pub fn handle_step_{turn}() -> u32 {{ {turn} }}"),
        ));
        messages.extend(assistant_running(
            200 + turn,
            &format!("cargo test step_{turn}"),
            if turn == 0 {
                "error[E0425]: cannot find value `limit`\nProcess exited with code 101"
            } else {
                "test result: ok"
            },
        ));
        messages.extend(assistant_running(300 + turn, "cargo build", "Finished"));
    }
    let summary = compact_repeatedly(&messages, 12, 512);
    assert!(Encoding::O200k.count(&summary) <= 512);
    let record = Record::parse(split(&summary).1.unwrap());
    for turn in 0..12 {
        assert!(
            summary.contains(&format!("edited src/step_{turn}.rs: handle_step_{turn}")),
            "the symbol of turn {turn}, with its file, after 12 compactions: {summary}"
        );
    }
    let build = record
        .index
        .entries
        .iter()
        .find(|e| e.name == "cargo build")
        .expect("the command run every turn");
    assert_eq!(build.uses, 12, "its uses counted across compactions");
    assert_eq!(
        record.index.entries[0].name, "cargo build",
        "the most used ranks first: {summary}"
    );
}
