//! The record: the part of a summary no model writes. The user's constraints (oldest first),
//! the span's user requests, the commands its tools ran, the error lines those commands printed
//! and the names its edits wrote are copied from the messages themselves (newest first), within
//! a token budget, and carried into the next summary of the same conversation. A small
//! summarizer may drop or garble them; the record cannot. Pure: the engine appends it after the
//! model's text.
//!
//! How the budget is shared (stated for users beside `summary_max_tokens` in
//! `config/compactor.toml`): the model writes at most half of a summary's budget
//! ([`model_allowance`]); the record takes what the model's text leaves. Within that, each
//! section has its share ([`SECTIONS`]); what one leaves unused is shared among those after it by
//! their shares, and what all leave goes round once more. A section whose
//! items do not all fit shortens them, the longest first (a long request to its first sentence
//! and its distinctive words, [`user_words::shorten`]), before it leaves any out, and then leaves
//! out the least worth keeping: the oldest request, command or error, the newest constraint. So a
//! large item never pushes out a small one, and a constraint, once set, stays. What a client
//! injects into user messages is taken out before they are read ([`user_words::own_words`]).

use std::collections::{BTreeSet, HashMap};
use std::sync::LazyLock;

use regex::Regex;
use serde_json::Value;

use crate::dialect::{MessageView, Role};
use crate::tokenizer::Encoding;

use super::files;
use super::user_words::{self, one_line};

/// The heading the record starts under; everything above it is the model's text.
pub const HEADING: &str = "## Record (copied from the conversation)";

const CONSTRAINTS: usize = 0;
const REQUESTS: usize = 1;
const NOTE: usize = 2;
const COMMANDS: usize = 3;
const ERRORS: usize = 4;
const NAMES: usize = 5;
/// Section titles, and each one's share of the budget in percent (what one leaves unused goes
/// to the next).
pub const SECTIONS: [(&str, u64); 6] = [
    // First, so that what the few constraints of most conversations leave goes to the requests.
    ("### User constraints, oldest first", 40),
    ("### User requests, newest first", 25),
    // The assistant's newest words usually state where the work stands and what comes next.
    ("### Last assistant message", 12),
    ("### Commands run, newest first", 10),
    ("### Errors seen, newest first", 5),
    ("### Names in edits", 8),
];

/// Longest user request copied whole, in characters; a longer one is shortened to its first
/// sentence and its distinctive words in as many.
const REQUEST_CHARS: usize = 400;
/// What an item is shortened to when its section is over its share, in characters: first
/// this, then [`SHORTEST_CHARS`].
const SHORT_CHARS: usize = 200;
const SHORTEST_CHARS: usize = 80;
/// What a command or an error line is cut to when its section is over its share.
const CUT_LINE_CHARS: usize = 120;
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

/// Items of each section, most worth keeping first: constraints oldest first, the others
/// newest first.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Record {
    sections: [Vec<String>; 6],
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
        // Constraints oldest first: a rule set early is the one later turns lose.
        let own_words: Vec<Option<String>> = span
            .iter()
            .map(|(role, view)| {
                (*role == Role::User && !view.text.contains("<summary>"))
                    .then(|| user_words::own_words(&view.text))
            })
            .collect();
        for words in own_words.iter().flatten() {
            for constraint in user_words::constraints(words) {
                record.push(CONSTRAINTS, constraint);
            }
        }
        for ((role, view), words) in span.iter().zip(&own_words).rev() {
            match role {
                Role::User => {
                    let Some(words) = words else { continue };
                    // A message that is nothing but constraints is listed once, among them.
                    let constraints = user_words::constraints(words);
                    if normalized(&constraints.join(" ")) != normalized(words) {
                        record.push(REQUESTS, user_words::shorten(words, REQUEST_CHARS));
                    }
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
        if item.is_empty() || self.sections[section].contains(&item) {
            return;
        }
        if section == CONSTRAINTS {
            // Restated or carried shortened, a constraint is still the same one: the first kept.
            let key = normalized(&item);
            let seen = self.sections[section].iter().any(|kept| {
                let kept = normalized(kept);
                kept.starts_with(&key) || key.starts_with(&kept)
            });
            if seen {
                return;
            }
        }
        self.sections[section].push(item);
    }

    /// This (newer) record merged with an older one, without repeats: the older constraints
    /// before the newer, the newer items of every other section before the older.
    pub fn then(mut self, older: Record) -> Record {
        let newer_constraints = std::mem::take(&mut self.sections[CONSTRAINTS]);
        for (section, items) in older.sections.into_iter().enumerate() {
            for item in items {
                self.push(section, item);
            }
        }
        for item in newer_constraints {
            self.push(CONSTRAINTS, item);
        }
        self
    }

    /// The constraints, oldest first.
    pub fn constraints(&self) -> &[String] {
        &self.sections[CONSTRAINTS]
    }

    /// The user requests, newest first.
    pub fn requests(&self) -> &[String] {
        &self.sections[REQUESTS]
    }

    /// The record under its heading, newest items first, in at most `budget` tokens; empty when
    /// nothing fits. Each section has its share of the budget; what one leaves goes to those after
    /// it, and what all leave goes round once more, so a record of one kind of item still fills
    /// the budget.
    pub fn render(&self, encoding: Encoding, budget: u64) -> String {
        let budget = budget.saturating_sub(encoding.count(HEADING) + 2);
        let (mut body, unused) = self.render_sections(encoding, budget, 0);
        let mut extra = unused;
        // A few tries: items fill a section in steps, so the round given all of `unused` may
        // overshoot by the last item's tokens; the next gives that much less.
        for _ in 0..3 {
            if extra == 0 {
                break;
            }
            // This round had `budget + extra` tokens to hand out: it fits only when it leaves at
            // least `extra` of them.
            let (fuller, left) = self.render_sections(encoding, budget, extra);
            if left >= extra {
                body = fuller;
                break;
            }
            extra = left;
        }
        if body.is_empty() {
            return body;
        }
        format!("{HEADING}\n\n{}", body.trim_end())
    }

    /// The sections in `budget` tokens, with `extra` tokens besides their shares; with the
    /// tokens left unused. What a section leaves is shared among the sections after it that have
    /// items, by their shares, so that the constraints most conversations barely use do not all
    /// go to the requests.
    fn render_sections(&self, encoding: Encoding, budget: u64, extra: u64) -> (String, u64) {
        let mut body = String::new();
        let mut left_over = extra;
        let weight = |section: usize| {
            let share = SECTIONS[section].1;
            if self.sections[section].is_empty() {
                0
            } else {
                share
            }
        };
        let mut weights_left: u64 = (0..SECTIONS.len()).map(weight).sum();
        for (section, (title, share)) in SECTIONS.iter().enumerate() {
            // The last section with items takes all that is left over.
            let passed = left_over * weight(section) / weights_left.max(1);
            weights_left -= weight(section);
            left_over -= passed;
            let allowance = budget * share / 100 + passed;
            let title_cost = encoding.count(title) + 2;
            let (kept, used) = if section == NOTE {
                fit_note(&self.sections[section], encoding, allowance, title_cost)
            } else {
                fit(
                    &self.sections[section],
                    section,
                    encoding,
                    allowance,
                    title_cost,
                )
            };
            if kept.is_empty() {
                left_over += allowance;
                continue;
            }
            left_over += allowance - used;
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

/// The newest note (the assistant's last words) with `title_cost`, cut to `allowance` tokens.
fn fit_note(
    items: &[String],
    encoding: Encoding,
    allowance: u64,
    title_cost: u64,
) -> (Vec<String>, u64) {
    let Some(note) = items.first() else {
        return (Vec::new(), title_cost);
    };
    let mut item = note.clone();
    let mut cost = encoding.count(&item) + 2;
    while title_cost + cost > allowance && item.len() > 80 {
        let chars = item.chars().count() * 4 / 5;
        item = format!("{} …", item.chars().take(chars).collect::<String>());
        cost = encoding.count(&item) + 2;
    }
    if title_cost + cost > allowance {
        return (Vec::new(), title_cost);
    }
    (vec![item], title_cost + cost)
}

/// A shorter form of an item of `section`, at `level` (0, then 1), when it has one: the user's
/// words keep their first sentences and distinctive words; a command or an error line keeps its
/// beginning, where what ran and what failed are named, and only once, since a probe asks for
/// them exactly; a name is as short as it gets.
fn shorter(section: usize, level: usize, item: &str) -> Option<String> {
    match (section, level) {
        (CONSTRAINTS | REQUESTS, 0) => Some(user_words::shorten(item, SHORT_CHARS)),
        (CONSTRAINTS | REQUESTS, 1) => Some(user_words::shorten(item, SHORTEST_CHARS)),
        (COMMANDS | ERRORS, 0) => Some(one_line(item, CUT_LINE_CHARS)),
        _ => None,
    }
}

/// The items of `section` (most worth keeping first) that fit in `allowance` tokens with
/// `title_cost`, and the tokens they take: all of them when they fit; else the longest
/// shortened first ([`shorter`], level by level) until they fit; else, all shortened, the last
/// left out until they fit. An item is never left out while a shorter form of it would fit.
fn fit(
    items: &[String],
    section: usize,
    encoding: Encoding,
    allowance: u64,
    title_cost: u64,
) -> (Vec<String>, u64) {
    let cost = |item: &str| encoding.count(item) + 2;
    let mut kept: Vec<(String, u64)> = items
        .iter()
        .map(|item| (item.clone(), cost(item)))
        .collect();
    let mut total = title_cost + kept.iter().map(|(_, c)| c).sum::<u64>();
    for level in 0..2 {
        let mut longest: Vec<usize> = (0..kept.len()).collect();
        longest.sort_by_key(|&i| std::cmp::Reverse(kept[i].1));
        for i in longest {
            if total <= allowance {
                break;
            }
            let Some(short) = shorter(section, level, &kept[i].0) else {
                continue;
            };
            let short_cost = cost(&short);
            if short_cost < kept[i].1 {
                total = total - kept[i].1 + short_cost;
                kept[i] = (short, short_cost);
            }
        }
    }
    while total > allowance {
        let Some((_, c)) = kept.pop() else { break };
        total -= c;
    }
    (kept.into_iter().map(|(item, _)| item).collect(), total)
}

/// Lowercased words, for telling two wordings of one constraint apart from two constraints.
fn normalized(text: &str) -> String {
    let text = text.split(user_words::ALSO).next().unwrap_or(text);
    text.to_lowercase()
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
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
                    "fn parse_step(input: &str) -> Result<Step, Error> {\n    todo!()\n}\n"
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
        let request = conversation(messages);
        let all = views(&request);
        let per_round = all.len().div_ceil(rounds);
        let mut summary: Option<String> = None;
        for span in all.chunks(per_round) {
            let stored = attach(
                "## Goal\nContinue the work.",
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
            sections: [
                vec!["Prefer tabs.".to_string()],
                vec![],
                vec![],
                vec![],
                vec![],
                vec![],
            ],
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
        let docs = include_str!("../../config/compactor.toml").replace("\n# ", " ");
        let names = [
            "constraints",
            "requests",
            "last assistant message",
            "commands run",
            "errors seen",
            "names in edits",
        ];
        for ((_, share), name) in SECTIONS.iter().zip(names) {
            assert!(
                docs.contains(&format!("{name} {share}%")),
                "{name} {share}%"
            );
        }
        assert!(docs.contains("at most half") && FLOOR == 50);
    }
}
