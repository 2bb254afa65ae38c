//! What a summary must keep from its span, and how much of it a summary keeps.
//!
//! Three measures, each a share of items found in the summary; [`RULES`] states them for
//! readers of the results:
//! - **paths**: the files the span's tool calls read or modified;
//! - **salient entities**: the identifiers, paths, commands, error strings and numbers that a
//!   reference summary took from the span;
//! - **user requests**: the span's user messages, each judged by its distinctive words.
//!
//! Matching is case-insensitive and respects token boundaries, so `WP1` is not found in `WP10`.

use std::collections::{BTreeSet, HashMap};
use std::sync::LazyLock;

use regex::Regex;
use serde_json::Value;

use compactor::compaction::files::FileOps;
use compactor::dialect::chat::request::Message;
use compactor::dialect::Role;

/// The extraction rules, as stated in the results file.
pub const RULES: &str = "\
- **paths**: every path argument of the span's tool calls that Compactor's file tracking \
classifies as read or modified (`path`, `file_path`, `paths`, … of `read`/`edit`/`write`-like \
tools). A path is present when the summary contains it, or its last two components \
(`core/agent-session.ts` for `/repo/src/core/agent-session.ts`).
- **salient entities**: candidate entities of the reference summary are its inline code spans \
of at most four words, and its words that look like code: containing `/`, `_`, `::`, a file \
extension, an inner capital (`agentSession`, `AgentSession`), `()`, or both letters and digits \
(`WP14`), or numbers of two or more digits. A candidate is salient when the span's text (message \
text, tool call names and argument values, tool results) contains it; the score is the share of \
salient entities the summary contains. Paths match as above.
- **user requests**: each user message of the span that is not itself a summary. Its \
distinctive words are its words of four or more letters outside a stop list, lowercased; \
those that also occur elsewhere in the span (when at least two do) are ranked by how rarely \
they do, and the eight rarest are its key words. A request is present when at least half of \
its key words occur in the summary, a word counting as found when a summary word shares its \
first five letters (`refactor` finds `refactoring`). Messages with fewer than two distinctive \
words (`continue`, `yes`) are not scored.
- Matching is case-insensitive; a match must not continue a longer word or path on either side.
- **size**: the summary's tokens (o200k) against the summary budget; time: wall-clock time of the \
summary requests.";

/// Key words judged per user message.
const KEY_WORDS: usize = 8;
/// Letters that make a word stem.
const STEM: usize = 5;
/// Longest inline code span taken whole as an entity, in words.
const CODE_SPAN_WORDS: usize = 4;

/// Found items out of expected ones, with the missing ones for diagnosis.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Share {
    pub found: usize,
    pub total: usize,
    pub missing: Vec<String>,
}

impl Share {
    fn count<T>(items: &[T], label: impl Fn(&T) -> String, present: impl Fn(&T) -> bool) -> Share {
        let missing: Vec<String> = items.iter().filter(|i| !present(i)).map(label).collect();
        Share {
            found: items.len() - missing.len(),
            total: items.len(),
            missing,
        }
    }

    /// Adds another share's counts (for totals over conversations).
    pub fn add(&mut self, other: &Share) {
        self.found += other.found;
        self.total += other.total;
    }

    /// The share in percent; `None` when nothing was expected.
    pub fn percent(&self) -> Option<f64> {
        (self.total > 0).then(|| self.found as f64 * 100.0 / self.total as f64)
    }
}

/// A user request of the span and the words it is judged by.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Index of the message in the conversation.
    pub message: usize,
    pub key_words: Vec<String>,
}

/// What a summary of the span must keep.
#[derive(Debug, Clone, Default)]
pub struct SpanFacts {
    /// Paths read or modified by the span's tool calls.
    pub paths: Vec<String>,
    pub requests: Vec<Request>,
    /// User messages with too few distinctive words to judge.
    pub unscored_requests: usize,
    /// Everything the span says, lowercased, for occurrence checks.
    pub text: String,
}

impl SpanFacts {
    /// Facts of the messages at `indices` of `messages`.
    pub fn of(messages: &[std::sync::Arc<Message>], indices: &[usize]) -> SpanFacts {
        let span: Vec<&Message> = indices.iter().map(|&i| &*messages[i]).collect();
        let mut files = FileOps::default();
        files.collect(span.iter().map(|m| m.view()));
        let paths = files.read.union(&files.modified).cloned().collect();
        let text = span.iter().map(|m| message_text(m)).collect::<Vec<_>>();
        let text = text.join("\n").to_lowercase();
        let frequency = word_frequency_of(&text);
        let mut requests = Vec::new();
        let mut unscored_requests = 0;
        for (&index, message) in indices.iter().zip(&span) {
            let content = message.view().text.to_lowercase();
            if message.role != Role::User || content.contains("<summary>") {
                continue;
            }
            let words = key_words(&content, &frequency);
            if words.len() < 2 {
                unscored_requests += 1;
                continue;
            }
            requests.push(Request {
                message: index,
                key_words: words,
            });
        }
        SpanFacts {
            paths,
            requests,
            unscored_requests,
            text,
        }
    }
}

/// The key words of one user message (`content`, lowercased) in a span whose word counts are
/// `frequency`: its distinctive words, those also used elsewhere in the span when at least two
/// are, rarest first, at most [`KEY_WORDS`].
pub fn key_words(content: &str, frequency: &HashMap<String, usize>) -> Vec<String> {
    let mut words = distinctive_words(content);
    // Words used nowhere else in the span (typos, asides) say little about the topic; of the
    // others, the rarest say most.
    let own = word_frequency(content);
    let elsewhere = |w: &String| {
        let all = frequency.get(w.as_str()).copied().unwrap_or(0);
        all.saturating_sub(own.get(w.as_str()).copied().unwrap_or(0))
    };
    if words.iter().filter(|w| elsewhere(w) > 0).count() >= 2 {
        words.retain(|w| elsewhere(w) > 0);
    }
    // Stable sort: equally rare words keep the order the user wrote them in.
    words.sort_by_key(|w| elsewhere(w));
    words.truncate(KEY_WORDS);
    words
}

/// The entities of `reference` that occur in the span.
pub fn salient_entities(reference: &str, facts: &SpanFacts) -> Vec<String> {
    candidate_entities(reference)
        .into_iter()
        .filter(|e| mentions(&facts.text, e))
        .collect()
}

/// How much of the span a summary keeps.
#[derive(Debug, Clone, Default)]
pub struct Score {
    pub paths: Share,
    /// `None` without a reference summary to take entities from.
    pub entities: Option<Share>,
    pub requests: Share,
}

/// Scores `summary` against the span's facts and the salient entities, if any.
pub fn score(summary: &str, facts: &SpanFacts, entities: Option<&[String]>) -> Score {
    let summary = summary.to_lowercase();
    let stems: BTreeSet<String> = words(&summary).map(|w| stem(&w)).collect();
    let named = |items: &[String]| Share::count(items, String::clone, |i| mentions(&summary, i));
    Score {
        paths: named(&facts.paths),
        entities: entities.map(named),
        requests: Share::count(
            &facts.requests,
            |r| format!("message {}", r.message),
            |r| {
                let found = r.key_words.iter().filter(|k| stems.contains(&stem(k)));
                found.count() * 2 >= r.key_words.len()
            },
        ),
    }
}

/// Whether `text` (lowercased) mentions `item`: the item itself or, for a path, its last two
/// components, bounded on both sides.
pub fn mentions(text: &str, item: &str) -> bool {
    let item = item.to_lowercase();
    let item = item.trim_end_matches('/');
    let parts: Vec<&str> = item.split(['/', '\\']).filter(|p| !p.is_empty()).collect();
    let needle = if parts.len() > 2 {
        parts[parts.len() - 2..].join("/")
    } else {
        item.to_string()
    };
    !needle.is_empty()
        && text.match_indices(needle.as_str()).any(|(at, _)| {
            let before = text[..at].chars().next_back();
            let after = text[at + needle.len()..].chars().next();
            !before.is_some_and(continues_word) && !after.is_some_and(continues_word)
        })
}

/// A character that would make a match part of a longer word.
fn continues_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Text, tool call names and argument values of one message.
fn message_text(message: &Message) -> String {
    let view = message.view();
    let mut text = view.text.clone();
    for call in &view.tool_calls {
        text.push('\n');
        text.push_str(&call.name);
        match serde_json::from_str::<Value>(&call.arguments) {
            Ok(args) => push_strings(&args, &mut text),
            Err(_) => {
                text.push('\n');
                text.push_str(&call.arguments);
            }
        }
    }
    text
}

fn push_strings(value: &Value, out: &mut String) {
    match value {
        Value::String(s) => {
            out.push('\n');
            out.push_str(s);
        }
        Value::Array(items) => items.iter().for_each(|v| push_strings(v, out)),
        Value::Object(map) => map.values().for_each(|v| push_strings(v, out)),
        other => {
            out.push('\n');
            out.push_str(&other.to_string());
        }
    }
}

static CODE_SPAN: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"`([^`\n]+)`").unwrap());
static TOKEN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"[A-Za-z0-9_./:~-]*[A-Za-z0-9_](?:\(\))?").unwrap());
static WORD: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"[a-z]+").unwrap());

/// Entities a summary names: inline code spans of a few words, and code-like words anywhere.
fn candidate_entities(summary: &str) -> Vec<String> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    let mut add = |entity: &str| {
        let entity = entity.trim().trim_end_matches("()");
        if entity.chars().count() >= 2 && seen.insert(entity.to_lowercase()) {
            out.push(entity.to_string());
        }
    };
    for span in CODE_SPAN.captures_iter(summary) {
        let inner = &span[1];
        if inner.split_whitespace().count() <= CODE_SPAN_WORDS {
            add(inner);
        }
    }
    for token in TOKEN.find_iter(summary) {
        let token = token.as_str().trim_start_matches(['.', '-', ':', '~']);
        if looks_like_code(token) {
            add(token);
        }
    }
    out
}

pub fn looks_like_code(token: &str) -> bool {
    let has_letter = token.chars().any(|c| c.is_ascii_alphabetic());
    let digits = token.chars().filter(char::is_ascii_digit).count();
    let inner_capital = token.char_indices().skip(1).any(|(i, c)| {
        c.is_ascii_uppercase() && token[..i].ends_with(|p: char| p.is_ascii_lowercase())
    }) || token.chars().filter(char::is_ascii_uppercase).count() >= 2
        && token.chars().any(|c| c.is_ascii_lowercase());
    let extension = token.rsplit_once('.').is_some_and(|(stem, ext)| {
        !stem.is_empty()
            && (1..=5).contains(&ext.len())
            && ext.chars().all(|c| c.is_ascii_alphabetic())
    });
    token.contains('/')
        || token.contains('_')
        || token.contains("::")
        || token.ends_with("()")
        || extension
        || inner_capital
        || (has_letter && digits > 0)
        || (!has_letter && digits >= 2 && token.chars().all(|c| c.is_ascii_digit()))
}

/// Lowercased words of four or more letters outside the stop list, once each, in order.
fn distinctive_words(text: &str) -> Vec<String> {
    let text = text.to_lowercase();
    let mut seen = BTreeSet::new();
    words(&text)
        .filter(|w| w.len() >= 4 && !STOP_WORDS.contains(&w.as_str()))
        .filter(|w| seen.insert(w.clone()))
        .collect()
}

fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    WORD.find_iter(text).map(|m| m.as_str().to_string())
}

/// The stems of the words of `text` (lowercased).
pub fn stems_of(text: &str) -> BTreeSet<String> {
    words(text).map(|w| stem(&w)).collect()
}

pub fn stem(word: &str) -> String {
    word.chars().take(STEM).collect()
}

/// How often each word occurs in `text` (lowercased).
pub fn word_frequency_of(text: &str) -> HashMap<String, usize> {
    word_frequency(text)
        .into_iter()
        .map(|(w, n)| (w.to_string(), n))
        .collect()
}

fn word_frequency(text: &str) -> HashMap<&str, usize> {
    let mut counts = HashMap::new();
    for w in WORD.find_iter(text) {
        *counts.entry(w.as_str()).or_insert(0) += 1;
    }
    counts
}

/// Words of four or more letters that say nothing about what was asked.
const STOP_WORDS: &[&str] = &[
    "about",
    "above",
    "actually",
    "after",
    "again",
    "also",
    "always",
    "anything",
    "because",
    "been",
    "before",
    "being",
    "both",
    "but",
    "cant",
    "could",
    "does",
    "doesnt",
    "doing",
    "done",
    "dont",
    "each",
    "else",
    "even",
    "every",
    "everything",
    "fine",
    "first",
    "from",
    "getting",
    "give",
    "going",
    "good",
    "great",
    "have",
    "having",
    "here",
    "into",
    "just",
    "know",
    "last",
    "like",
    "look",
    "looks",
    "made",
    "make",
    "many",
    "maybe",
    "more",
    "most",
    "much",
    "must",
    "need",
    "needs",
    "next",
    "nice",
    "none",
    "nothing",
    "okay",
    "once",
    "only",
    "other",
    "ours",
    "over",
    "please",
    "pretty",
    "really",
    "right",
    "same",
    "should",
    "since",
    "some",
    "something",
    "still",
    "such",
    "sure",
    "take",
    "than",
    "thank",
    "thanks",
    "that",
    "thats",
    "their",
    "them",
    "then",
    "there",
    "these",
    "they",
    "thing",
    "things",
    "think",
    "this",
    "those",
    "though",
    "through",
    "very",
    "want",
    "well",
    "were",
    "what",
    "when",
    "where",
    "which",
    "while",
    "will",
    "with",
    "without",
    "would",
    "yeah",
    "your",
    "youre",
];

#[cfg(test)]
mod tests;
