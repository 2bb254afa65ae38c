//! Probes: questions about a replaced span whose answers are literal strings, drawn by code,
//! and whether the request the model receives next still holds each answer.
//!
//! A probe is answerable when its answer occurs in that request, outside its instructions (the
//! system messages and tools say nothing about the conversation). [`PROBE_RULES`] states the
//! extraction rules in words for the results file.

use std::collections::{BTreeSet, HashMap};
use std::sync::LazyLock;

use regex::Regex;
use serde_json::Value;

use compactor::compaction::files::{self, FileOps};
use compactor::compaction::{record, user_words};
use compactor::dialect::{MessageView, Role};

use crate::score;

/// The extraction rules, as stated in the results file.
pub const PROBE_RULES: &str = "\
- **paths**: each path a tool call of the span read or modified (Compactor's file tracking), \
with what was done to it; answered when the path, or its last two components, occurs.
- **commands**: each distinct shell command a tool call ran; the answer is its first line, \
whitespace collapsed, cut to 60 characters (at a word's end when there is one past the 30th; an \
answer cut inside a word may be continued by the rest of that word).
- **identifiers**: the symbols an edit or a write of a code file (not `.md`, `.txt`) defined or \
edited: each name after a declaration keyword (`fn`, `function`, `class`, `const`, `let`, \
`def`, `interface`, `type`, `struct`, `enum`, `trait`, …) and before `=`, `(`, `<`, `{`, `:`, \
`extends`, on either side of an edit or in what a write wrote (`record::declared_names`); \
answered when the name occurs whole.
- **errors**: the first line reporting a failure (error, failed, cannot, not found, …, not `0 \
errors`) of each result of a tool that ran something (not a file read), cut to 60 characters. \
What a command that prints files (`cat`, `head`, `tail`, `grep`, `rg`, `sed`, `awk`, `find`, \
`ls`, `wc`, `git diff`/`show`/`log`/`grep`, after any `cd …&&`) printed is their content, as \
a file read's is: only its program's own complaints (`grep: …`, `No such file or directory`) \
are failures; nor is a line of a numbered code frame (`216 │ …`, `12 | …`).
- **constraints**: each sentence of the user's own words (client injections removed) that binds \
later work, as `user_words::constraints` finds them; the answer is its first 60 characters.
- **requests**: each user message with two or more distinctive words, judged by its key words \
as in `score::RULES`; answered when half of them occur.
- **decisions**: each assistant sentence announcing what it will do or chose (`I'll`, `I will`, \
`we'll`, `I'm going to`, `decided`, `instead`, `the fix is`, `the plan is`) that names at least \
one code-like token; answered when half of those tokens occur.
- Each answer is counted once per conversation (the first span it appears in); matching is \
case-insensitive, whitespace-collapsed, and a match may not continue a longer word.";

/// What a probe asks about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Category {
    Paths,
    Commands,
    Identifiers,
    Errors,
    Constraints,
    Requests,
    Decisions,
}

impl Category {
    pub const ALL: [Category; 7] = [
        Category::Paths,
        Category::Commands,
        Category::Identifiers,
        Category::Errors,
        Category::Constraints,
        Category::Requests,
        Category::Decisions,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Category::Paths => "paths",
            Category::Commands => "commands",
            Category::Identifiers => "identifiers",
            Category::Errors => "errors",
            Category::Constraints => "constraints",
            Category::Requests => "requests",
            Category::Decisions => "decisions",
        }
    }
}

/// One question about the span and the strings that answer it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    pub category: Category,
    /// Strings the answer is made of; `need` of them must occur.
    pub answer: Vec<String>,
    pub need: usize,
    /// Whether the answer was cut inside a word: then what follows it may continue that word.
    pub open_end: bool,
}

impl Probe {
    fn exact(category: Category, answer: String) -> Probe {
        Probe {
            category,
            answer: vec![answer],
            need: 1,
            open_end: false,
        }
    }

    /// A probe whose answer is `text` cut to [`ANSWER_CHARS`].
    fn cut(category: Category, text: &str) -> Probe {
        let (answer, open_end) = cut(text, ANSWER_CHARS);
        Probe {
            open_end,
            ..Probe::exact(category, answer)
        }
    }

    /// A label for listing what is missing.
    pub fn label(&self) -> String {
        self.answer.join(" / ")
    }
}

/// Longest answer of a command, error or constraint probe, in characters.
const ANSWER_CHARS: usize = 60;

static DECISION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)\b(i'll|i will|we'll|we will|i'm going to|i am going to|decided|instead|the fix is|the plan is)\b",
    )
    .unwrap()
});
/// Where a sentence ends: `.`, `!` or `?` before a space or the end, or a line break (not the
/// dot of `agent.ts`).
static SENTENCE_END: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"[.!?](?:\s+|$)|\n").unwrap());
static CODE_TOKEN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"[A-Za-z0-9_./:~-]*[A-Za-z0-9_]").unwrap());

/// The probes of a span (its messages' roles and views), in order, without repeats.
pub fn draw(span: &[(Role, MessageView)]) -> Vec<Probe> {
    let mut probes = Vec::new();
    let mut calls: HashMap<&str, (&str, Value)> = HashMap::new();
    for (_, view) in span {
        for call in &view.tool_calls {
            let args = serde_json::from_str(&call.arguments).unwrap_or(Value::Null);
            calls.insert(call.id.as_str(), (call.name.as_str(), args));
        }
    }
    let mut files = FileOps::default();
    files.collect(span.iter().map(|(_, v)| v));
    let (read, modified) = files.into_lists();
    for path in modified.into_iter().chain(read) {
        probes.push(Probe::exact(Category::Paths, path));
    }
    let texts: Vec<String> = span.iter().map(|(_, v)| v.text.to_lowercase()).collect();
    let frequency = score::word_frequency_of(&texts.join("\n"));
    for (role, view) in span {
        match role {
            Role::User if !view.text.contains("<summary>") => {
                let words = user_words::own_words(&view.text);
                for constraint in user_words::constraints(&words) {
                    probes.push(Probe::cut(Category::Constraints, &constraint));
                }
                let key = score::key_words(&words.to_lowercase(), &frequency);
                if key.len() >= 2 {
                    probes.push(Probe {
                        category: Category::Requests,
                        need: key.len().div_ceil(2),
                        answer: key,
                        open_end: false,
                    });
                }
            }
            Role::Assistant => {
                for sentence in SENTENCE_END.split(&view.text) {
                    if !DECISION.is_match(sentence) {
                        continue;
                    }
                    let mut tokens: Vec<String> = Vec::new();
                    for t in CODE_TOKEN.find_iter(sentence) {
                        let t = t.as_str().trim_start_matches(['.', '-', ':', '~']);
                        if score::looks_like_code(t) && !tokens.iter().any(|k| k == t) {
                            tokens.push(t.to_string());
                        }
                    }
                    if !tokens.is_empty() {
                        probes.push(Probe {
                            category: Category::Decisions,
                            need: tokens.len().div_ceil(2),
                            answer: tokens,
                            open_end: false,
                        });
                    }
                }
            }
            Role::Tool => {
                let call = view.tool_call_id.as_deref().and_then(|id| calls.get(id));
                let failure = match call {
                    Some((name, args)) => record::first_failure(name, args, &view.text),
                    None => record::failure_lines(None, &view.text).next(),
                };
                if let Some(line) = failure {
                    probes.push(Probe::cut(Category::Errors, line));
                }
            }
            _ => {}
        }
        for call in &view.tool_calls {
            let Some((name, args)) = calls.get(call.id.as_str()) else {
                continue;
            };
            if let Some(command) = record::shell_command(name, args) {
                let first = command.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
                probes.push(Probe::cut(Category::Commands, first));
            }
            if files::modifies(name, args) {
                for name in record::declared_names(args) {
                    probes.push(Probe::exact(Category::Identifiers, name));
                }
            }
        }
    }
    let mut seen = BTreeSet::new();
    probes.retain(|p| !p.answer.is_empty() && seen.insert((p.category, p.answer.clone())));
    probes
}

/// `text` on one line, cut to `chars` characters at a word's end when one is past the half (no
/// ellipsis: an answer is a prefix); with whether it was cut inside a word.
fn cut(text: &str, chars: usize) -> (String, bool) {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() <= chars {
        return (line, false);
    }
    let head: String = line.chars().take(chars).collect();
    match head.rfind(' ') {
        Some(at) if at > chars / 2 => (head[..at].to_string(), false),
        _ => {
            let word = |c: char| c.is_alphanumeric() || c == '_';
            let next = line.chars().nth(chars);
            let inside = head.chars().next_back().is_some_and(word) && next.is_some_and(word);
            (head, inside)
        }
    }
}

/// A request's text prepared for probing: lowercased, whitespace collapsed, and the stems of
/// its words.
pub struct Haystack {
    text: String,
    stems: BTreeSet<String>,
}

impl Haystack {
    pub fn new(text: &str) -> Haystack {
        let text = text
            .to_lowercase()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let stems = score::stems_of(&text);
        Haystack { text, stems }
    }

    /// Whether `probe`'s answer occurs here.
    pub fn answers(&self, probe: &Probe) -> bool {
        let found = probe
            .answer
            .iter()
            .filter(|a| match probe.category {
                Category::Requests => self.stems.contains(&score::stem(a)),
                Category::Paths => score::mentions(&self.text, a),
                _ => contains_bounded(
                    &self.text,
                    &cut(&a.to_lowercase(), usize::MAX).0,
                    probe.open_end,
                ),
            })
            .count();
        found >= probe.need
    }
}

/// Whether `needle` occurs in `text` without continuing a longer word at either end (an end
/// that is itself not a word character may touch anything; with `open_end`, the needle was cut
/// inside a word and its end may be continued).
fn contains_bounded(text: &str, needle: &str, open_end: bool) -> bool {
    let word = |c: char| c.is_alphanumeric() || c == '_';
    let starts_word = needle.chars().next().is_some_and(word);
    let ends_word = needle.chars().next_back().is_some_and(word);
    !needle.is_empty()
        && text.match_indices(needle).any(|(at, _)| {
            let before = text[..at].chars().next_back();
            let after = text[at + needle.len()..].chars().next();
            let joins_before = starts_word && before.is_some_and(word);
            let joins_after = !open_end && ends_word && after.is_some_and(word);
            !joins_before && !joins_after
        })
}

/// Answered probes out of all, per category.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    pub per: HashMap<Category, (usize, usize)>,
    pub missing: HashMap<Category, Vec<String>>,
}

impl Tally {
    pub fn score(probes: &[Probe], haystack: &Haystack) -> Tally {
        let mut tally = Tally::default();
        for probe in probes {
            let entry = tally.per.entry(probe.category).or_default();
            entry.1 += 1;
            if haystack.answers(probe) {
                entry.0 += 1;
            } else {
                tally
                    .missing
                    .entry(probe.category)
                    .or_default()
                    .push(probe.label());
            }
        }
        tally
    }

    pub fn add(&mut self, other: &Tally) {
        for (category, (found, total)) in &other.per {
            let entry = self.per.entry(*category).or_default();
            entry.0 += found;
            entry.1 += total;
        }
        for (category, missing) in &other.missing {
            self.missing
                .entry(*category)
                .or_default()
                .extend(missing.iter().cloned());
        }
    }

    pub fn get(&self, category: Category) -> (usize, usize) {
        self.per.get(&category).copied().unwrap_or_default()
    }

    pub fn all(&self) -> (usize, usize) {
        self.per
            .values()
            .fold((0, 0), |(f, t), (a, b)| (f + a, t + b))
    }
}

#[cfg(test)]
mod tests;
