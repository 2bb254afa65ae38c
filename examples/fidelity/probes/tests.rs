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
