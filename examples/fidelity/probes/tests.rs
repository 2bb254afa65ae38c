use super::*;
use compactor::dialect::chat::request::ChatRequest;

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
        {"role":"user","content":"Refactor the session listeners in the parser. Never push to main."},
        {"role":"assistant","content":"I'll rename `oldName` to `reconnectAgent` in agent.ts.","tool_calls":[
          {"id":"1","type":"function","function":{"name":"read","arguments":"{\"path\":\"src/a.ts\"}"}},
          {"id":"2","type":"function","function":{"name":"edit","arguments":"{\"path\":\"src/b.ts\",\"oldText\":\"oldName()\",\"newText\":\"function reconnectAgent() { this.agentSession = null; }\"}"}},
          {"id":"3","type":"function","function":{"name":"bash","arguments":"{\"command\":\"npm   run check\\nsecond line\"}"}}]},
        {"role":"tool","tool_call_id":"1","content":"error in a file read is not an error"},
        {"role":"tool","tool_call_id":"2","content":"Edited."},
        {"role":"tool","tool_call_id":"3","content":"src/b.ts(3,1): error TS2304: Cannot find name 'x'.\nmore error"},
        {"role":"user","content":"Run the parser listeners tests again"}
        ]}"#,
    )
}

fn answers(probes: &[Probe], category: Category) -> Vec<String> {
    probes
        .iter()
        .filter(|p| p.category == category)
        .map(Probe::label)
        .collect()
}

#[test]
fn draws_each_category_from_the_span() {
    let probes = draw(&span());
    assert_eq!(answers(&probes, Category::Paths), ["src/b.ts", "src/a.ts"]);
    assert_eq!(answers(&probes, Category::Commands), ["npm run check"]);
    assert_eq!(
        answers(&probes, Category::Identifiers),
        ["reconnectAgent"],
        "declared; a name merely used is not"
    );
    assert_eq!(
        answers(&probes, Category::Errors),
        ["src/b.ts(3,1): error TS2304: Cannot find name 'x'."],
        "the first line of a result that ran; a file read is not an error"
    );
    assert_eq!(
        answers(&probes, Category::Constraints),
        ["Never push to main."]
    );
    assert_eq!(answers(&probes, Category::Requests).len(), 2);
    assert_eq!(
        answers(&probes, Category::Decisions),
        ["oldName / reconnectAgent / agent.ts"]
    );
}

#[test]
fn an_answer_must_occur_whole() {
    let probes = draw(&span());
    let command = probes
        .iter()
        .find(|p| p.category == Category::Commands)
        .unwrap();
    assert!(Haystack::new("ran NPM run\n check twice").answers(command));
    assert!(!Haystack::new("ran npm run checked").answers(command));
    let name = probes
        .iter()
        .find(|p| p.category == Category::Identifiers)
        .unwrap();
    assert!(!Haystack::new("reconnectAgents").answers(name));
    let path = probes
        .iter()
        .find(|p| p.category == Category::Paths)
        .unwrap();
    assert!(Haystack::new("edited /repo/src/b.ts").answers(path));
}

#[test]
fn tally_counts_per_category() {
    let probes = draw(&span());
    let tally = Tally::score(&probes, &Haystack::new("src/a.ts src/b.ts npm run check"));
    assert_eq!(tally.get(Category::Paths), (2, 2));
    assert_eq!(tally.get(Category::Commands), (1, 1));
    assert_eq!(tally.get(Category::Identifiers), (0, 1));
    assert_eq!(tally.all().1, probes.len());
}

#[test]
fn an_answer_cut_inside_a_word_may_be_continued() {
    let long = format!("ls -la /repo/{}/src", "packages-coding-agent".repeat(3));
    let body = serde_json::json!({"model": "m", "messages": [
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "bash",
             "arguments": serde_json::json!({"command": long}).to_string()}}]},
        {"role": "tool", "tool_call_id": "1", "content": "total 0"}
    ]});
    let probes = draw(&views(&body.to_string()));
    let command = probes
        .iter()
        .find(|p| p.category == Category::Commands)
        .unwrap();
    assert_eq!(command.answer[0].chars().count(), ANSWER_CHARS);
    assert!(command.open_end, "cut inside a word");
    assert!(
        Haystack::new(&format!("ran {long}")).answers(command),
        "the whole command answers its cut answer"
    );
    assert!(!Haystack::new("ran xls -la /repo/").answers(command));
}

#[test]
fn what_a_printing_command_prints_is_not_its_failure() {
    let body = r#"{"model":"m","messages":[
        {"role":"assistant","content":null,"tool_calls":[
          {"id":"1","type":"function","function":{"name":"bash","arguments":"{\"command\":\"cd /repo && grep -n error src/a.ts\"}"}},
          {"id":"2","type":"function","function":{"name":"bash","arguments":"{\"command\":\"git diff src/a.ts\"}"}},
          {"id":"3","type":"function","function":{"name":"bash","arguments":"{\"command\":\"ls missing\"}"}},
          {"id":"4","type":"function","function":{"name":"bash","arguments":"{\"command\":\"npm run check 2>&1 | grep error\"}"}},
          {"id":"5","type":"function","function":{"name":"bash","arguments":"{\"command\":\"npm run lint\"}"}}]},
        {"role":"tool","tool_call_id":"1","content":"12:  } catch (error) {"},
        {"role":"tool","tool_call_id":"2","content":"-  return undefined;"},
        {"role":"tool","tool_call_id":"3","content":"ls: cannot access 'missing': No such file or directory"},
        {"role":"tool","tool_call_id":"4","content":"src/a.ts(3,1): error TS2304: Cannot find name 'x'."},
        {"role":"tool","tool_call_id":"5","content":"  216 │ * @throws Error if no model\nsrc/b.ts:4:1 lint/style failed"}
        ]}"#;
    let probes = draw(&views(body));
    assert_eq!(
        answers(&probes, Category::Errors),
        [
            "ls: cannot access 'missing': No such file or directory",
            "src/a.ts(3,1): error TS2304: Cannot find name 'x'.",
            "src/b.ts:4:1 lint/style failed",
        ],
        "grep hits and diff lines are content; a code frame quotes code; a piped build's errors \
         and a printer's own complaint are failures"
    );
}
