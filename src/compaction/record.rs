//! The record: the part of a summary no model writes. The span's user requests, the commands
//! its tools ran, the error lines those commands printed and the names its edits wrote are
//! copied from the messages themselves, newest first, within a token budget, and carried into
//! the next summary of the same conversation. A small summarizer may drop or garble them; the
//! record cannot. Pure: the engine appends it after the model's text.

use std::collections::{BTreeSet, HashMap};
use std::sync::LazyLock;

use regex::Regex;
use serde_json::Value;

use crate::dialect::{MessageView, Role};
use crate::tokenizer::Encoding;

use super::files;

/// The heading the record starts under; everything above it is the model's text.
pub const HEADING: &str = "## Record (copied from the conversation)";

const REQUESTS: usize = 0;
const NOTE: usize = 1;
const COMMANDS: usize = 2;
const ERRORS: usize = 3;
const NAMES: usize = 4;
/// Section titles, and each one's share of the budget in percent (what one leaves unused goes
/// to the next).
const SECTIONS: [(&str, u64); 5] = [
    ("### User requests, newest first", 35),
    // The assistant's newest words usually state where the work stands and what comes next.
    ("### Last assistant message", 25),
    ("### Commands run, newest first", 15),
    ("### Errors seen, newest first", 10),
    ("### Names in edits", 15),
];

/// Longest user request copied, in characters (longer ones keep their beginning).
const REQUEST_CHARS: usize = 400;
/// Longest command or error line copied, in characters.
const LINE_CHARS: usize = 200;
/// Error lines taken from one tool result.
const ERRORS_PER_RESULT: usize = 2;

static ERROR_LINE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)\b(error|errors|failed|failure|fatal|exception|traceback|panicked|cannot|could not|not found|denied|undefined)\b")
        .unwrap()
});
static NO_ERRORS: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?i)\b(0|no|zero) (errors?|failures?|failed)\b").unwrap());
static IDENTIFIER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"[A-Za-z_][A-Za-z0-9_]{3,}").unwrap());

/// Items of each section, newest first.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Record {
    sections: [Vec<String>; 5],
}

impl Record {
    /// The record of `span`: its elements' roles and views, in order.
    pub fn collect(span: &[(Role, MessageView)]) -> Record {
        let mut record = Record::default();
        let mut calls: HashMap<&str, (&str, Value)> = HashMap::new();
        for (_, view) in span {
            for call in &view.tool_calls {
                let args = serde_json::from_str(&call.arguments).unwrap_or(Value::Null);
                calls.insert(call.id.as_str(), (call.name.as_str(), args));
            }
        }
        for (role, view) in span.iter().rev() {
            match role {
                Role::User if !view.text.contains("<summary>") => {
                    let text = one_line(&view.text, REQUEST_CHARS);
                    record.push(REQUESTS, text);
                }
                Role::Assistant
                    if record.sections[NOTE].is_empty() && !view.text.trim().is_empty() =>
                {
                    record.push(NOTE, one_line(&view.text, usize::MAX));
                }
                Role::Tool => {
                    let call = view.tool_call_id.as_deref().and_then(|id| calls.get(id));
                    // Files read may hold the word "error" anywhere; only what ran can fail.
                    if call.is_some_and(|(name, args)| files::reads(name, args)) {
                        continue;
                    }
                    let lines = view
                        .text
                        .lines()
                        .filter(|l| ERROR_LINE.is_match(l) && !NO_ERRORS.is_match(l));
                    for line in lines.take(ERRORS_PER_RESULT) {
                        record.push(ERRORS, one_line(line, LINE_CHARS));
                    }
                }
                _ => {}
            }
            for call in view.tool_calls.iter().rev() {
                let Some((name, args)) = calls.get(call.id.as_str()) else {
                    continue;
                };
                if let Some(command) = shell_command(name, args) {
                    record.push(COMMANDS, one_line(&command, LINE_CHARS));
                }
                if files::modifies(name, args) {
                    for name in written_names(args) {
                        record.push(NAMES, name);
                    }
                }
            }
        }
        record
    }

    /// A record as [`Record::render`] wrote it (the text after [`HEADING`]).
    pub fn parse(text: &str) -> Record {
        let mut record = Record::default();
        let mut section = None;
        for line in text.lines() {
            if let Some(i) = SECTIONS.iter().position(|(title, _)| line.trim() == *title) {
                section = Some(i);
            } else if let (Some(i), Some(item)) = (section, line.strip_prefix("- ")) {
                if i == NAMES {
                    for name in item.split(", ") {
                        record.push(i, name.to_string());
                    }
                } else {
                    record.push(i, item.to_string());
                }
            }
        }
        record
    }

    fn push(&mut self, section: usize, item: String) {
        let item = item.trim().to_string();
        if !item.is_empty() && !self.sections[section].contains(&item) {
            self.sections[section].push(item);
        }
    }

    /// This (newer) record followed by an older one, without repeats.
    pub fn then(mut self, older: Record) -> Record {
        for (section, items) in older.sections.into_iter().enumerate() {
            for item in items {
                self.push(section, item);
            }
        }
        self
    }

    /// The record under its heading, newest items first, in at most `budget` tokens; empty when
    /// nothing fits. Each section has its share of the budget; what one leaves goes to the next,
    /// and what all leave goes round once more from the first, so a record of one kind of item
    /// still fills the budget.
    pub fn render(&self, encoding: Encoding, budget: u64) -> String {
        let budget = budget.saturating_sub(encoding.count(HEADING) + 2);
        let (mut body, unused) = self.render_sections(encoding, budget, 0);
        if unused > 0 {
            // The second round had `budget + unused` tokens to hand out: it fits only when it
            // leaves at least `unused` of them.
            let (fuller, left) = self.render_sections(encoding, budget, unused);
            if left >= unused {
                body = fuller;
            }
        }
        if body.is_empty() {
            return body;
        }
        format!("{HEADING}\n\n{}", body.trim_end())
    }

    /// The sections in `budget` tokens, the first given `extra` tokens besides its share; with
    /// the tokens left unused.
    fn render_sections(&self, encoding: Encoding, budget: u64, extra: u64) -> (String, u64) {
        let mut body = String::new();
        let mut left_over = extra;
        for (section, (title, share)) in SECTIONS.iter().enumerate() {
            let allowance = budget * share / 100 + left_over;
            let title_cost = encoding.count(title) + 2;
            let mut used = title_cost;
            let mut kept: Vec<String> = Vec::new();
            for item in &self.sections[section] {
                let mut item = item.clone();
                let mut cost = encoding.count(&item) + 2;
                if section == NOTE {
                    // Only the newest note counts, cut to what is left for it.
                    while used + cost > allowance && item.len() > 80 {
                        let chars = item.chars().count() * 4 / 5;
                        item = format!("{} …", item.chars().take(chars).collect::<String>());
                        cost = encoding.count(&item) + 2;
                    }
                }
                if used + cost > allowance {
                    break;
                }
                used += cost;
                kept.push(item);
                if section == NOTE {
                    break;
                }
            }
            if kept.is_empty() {
                left_over = allowance;
                continue;
            }
            left_over = allowance - used;
            body.push_str(title);
            body.push('\n');
            if section == NAMES {
                body.push_str(&format!("- {}\n", kept.join(", ")));
            } else {
                kept.iter()
                    .for_each(|item| body.push_str(&format!("- {item}\n")));
            }
            body.push('\n');
        }
        (body, left_over)
    }
}

/// Splits a stored summary into the model's text and the record text after [`HEADING`].
pub fn split(summary: &str) -> (&str, Option<&str>) {
    match summary.find(HEADING) {
        Some(at) => (
            summary[..at].trim_end(),
            Some(&summary[at + HEADING.len()..]),
        ),
        None => (summary, None),
    }
}

/// Least of a summary's budget kept for the record, in percent: the model's answer is capped at
/// the rest ([`model_allowance`]), so a verbose model cannot crowd out what no model may lose.
pub const FLOOR: u64 = 50;
/// Most of a summary's budget the record takes, in percent: all the model's text leaves.
pub const SHARE: u64 = 100;

/// The longest answer the model may write within a summary budget of `budget` tokens.
pub fn model_allowance(budget: u64) -> u64 {
    budget * (100 - FLOOR) / 100
}

/// The summary to store: the model's text, then the record of `span` followed by the record of
/// the previous summary, in what the model's text left of `budget`.
pub fn attach(
    model_text: &str,
    span: &[(Role, MessageView)],
    previous: Option<&str>,
    encoding: Encoding,
    budget: u64,
) -> String {
    let room = RecordRoom {
        encoding,
        budget,
        share: SHARE,
    };
    attach_share(model_text, span, previous, room)
}

/// How much of a summary's budget the record may take.
#[derive(Debug, Clone, Copy)]
pub struct RecordRoom {
    pub encoding: Encoding,
    /// The whole summary's budget, in tokens.
    pub budget: u64,
    /// The record's largest share of it, in percent.
    pub share: u64,
}

/// [`attach`] with the record taking at most `room.share` percent of the budget.
pub fn attach_share(
    model_text: &str,
    span: &[(Role, MessageView)],
    previous: Option<&str>,
    room: RecordRoom,
) -> String {
    let RecordRoom {
        encoding,
        budget,
        share,
    } = room;
    let older = previous
        .and_then(|p| split(p).1)
        .map(Record::parse)
        .unwrap_or_default();
    let room =
        (budget * share.min(100) / 100).min(budget.saturating_sub(encoding.count(model_text)));
    let record = Record::collect(span).then(older).render(encoding, room);
    if record.is_empty() {
        model_text.to_string()
    } else {
        format!("{}\n\n{record}", model_text.trim_end())
    }
}

/// Whitespace collapsed, cut to `limit` characters.
fn one_line(text: &str, limit: usize) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() <= limit {
        return line;
    }
    let cut: String = line.chars().take(limit).collect();
    format!("{cut} …")
}

/// The shell command a tool call ran, if it ran one.
fn shell_command(tool: &str, args: &Value) -> Option<String> {
    let command = args.get("command").or_else(|| args.get("cmd"))?;
    let command = match command {
        Value::String(s) => s.clone(),
        Value::Array(parts) => {
            let parts: Vec<&str> = parts.iter().filter_map(Value::as_str).collect();
            parts.join(" ")
        }
        _ => return None,
    };
    // Editor tools take one-word sub-commands (`view`, `str_replace`): not shell commands.
    let shell_tool = ["bash", "shell", "exec", "run", "terminal", "command"]
        .iter()
        .any(|t| tool.to_ascii_lowercase().contains(t));
    (shell_tool || command.trim().contains(char::is_whitespace)).then_some(command)
}

/// Code-like names (`camelCase`, `PascalCase`, `snake_case`) in what an edit wrote, in order.
fn written_names(args: &Value) -> Vec<String> {
    let mut texts = Vec::new();
    if let Value::Object(map) = args {
        for (key, value) in map {
            let old_side = key.to_ascii_lowercase().starts_with("old");
            if let (false, Some(text)) = (old_side || files::is_path_key(key), value.as_str()) {
                texts.push(text);
            }
        }
    }
    let mut seen = BTreeSet::new();
    texts
        .iter()
        .flat_map(|t| IDENTIFIER.find_iter(t))
        .map(|m| m.as_str())
        .filter(|name| looks_like_code_name(name) && seen.insert(name.to_string()))
        .map(str::to_string)
        .collect()
}

fn looks_like_code_name(name: &str) -> bool {
    let inner_capital = name
        .as_bytes()
        .windows(2)
        .any(|w| w[0].is_ascii_lowercase() && w[1].is_ascii_uppercase());
    let snake =
        name.trim_start_matches('_').contains('_') && name.chars().any(|c| c.is_ascii_lowercase());
    let private = name.starts_with('_') && name.len() > 4;
    inner_capital || snake || private
}

#[cfg(test)]
mod tests {
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
        assert_eq!(r.sections[COMMANDS], vec!["npm run check"]);
        assert_eq!(
            r.sections[ERRORS],
            vec![
                "src/a.ts(3,1): error TS2304: Cannot find name 'x'.",
                "more error lines"
            ],
            "two lines per result; `0 errors` and files read are not errors"
        );
        assert_eq!(r.sections[NAMES], vec!["_reconnectToAgent", "agentSession"]);
    }

    #[test]
    fn renders_and_parses_back() {
        let r = record();
        let text = r.render(Encoding::O200k, 1000);
        assert!(text.starts_with(HEADING), "{text}");
        assert!(
            text.contains("- npm run check\n")
                && text.contains("- _reconnectToAgent, agentSession")
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
            .map(|i| {
                format!(r#"{{"role":"user","content":"request number {i} about the parser"}}"#)
            })
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
        let previous = format!("## Goal\nold\n\n{HEADING}\n\n### Commands run, newest first\n- cargo test\n- npm run check\n");
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
        assert_eq!(
            record.sections[COMMANDS],
            vec!["npm run check", "cargo test"]
        );
        // A model text that used the budget leaves no room.
        assert_eq!(attach("x", &span, None, Encoding::O200k, 1), "x");
    }
}
