//! The identifier index: the exact names later turns refer to, taken from the tool calls and
//! messages by code. Files edited or written with the symbols each edit defined or changed (a
//! config file's: the keys it set), commands with their outcome (an exit code or the first error line), error lines of other
//! tools, URLs and versions. Ranked by use (an entry met again counts once more,
//! also across compactions) and recency (what the newest span met ranks above an older entry
//! of the same use); rendered one line each and parsed back from the previous summary, so it is
//! carried from summary to summary like the record's other sections.

use std::collections::HashMap;
use std::sync::LazyLock;

use regex::Regex;
use serde_json::Value;

use crate::dialect::{MessageView, Role};
use crate::tokenizer::Encoding;

use super::super::files;

mod entry;
mod reading;

pub use entry::Entry;
use entry::{cut, displaced_error, merge_detail, same_name};

use reading::config_keys;
pub use reading::{declared_names, error_lines, failure_lines, first_failure, shell_command};

/// What an entry names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A file an edit changed; its detail lists the symbols edited there (a config file's:
    /// the keys set).
    Edited,
    /// A file written whole; its detail lists the symbols it defines.
    Wrote,
    /// A shell command; its detail is its outcome.
    Command,
    /// An error line of a tool that is not a shell command.
    Error,
    Url,
    Version,
}

/// How each kind opens its line.
const PREFIXES: [(Kind, &str); 6] = [
    (Kind::Edited, "edited "),
    (Kind::Wrote, "wrote "),
    (Kind::Command, "$ "),
    (Kind::Error, "error: "),
    (Kind::Url, "url: "),
    (Kind::Version, "version: "),
];

/// Longest command kept, in characters (its first line): the program and what it was asked
/// come first; a heredoc's body is not worth its tokens every turn.
const COMMAND_CHARS: usize = 100;
/// What a command is cut to when the index is over its share.
const SHORT_COMMAND_CHARS: usize = 64;
/// Longest outcome or error line kept, in characters.
const OUTCOME_CHARS: usize = 90;
/// What an outcome or error line is cut to when the index is over its share.
const SHORT_OUTCOME_CHARS: usize = 64;
/// Symbols listed for one file once the index is over its share.
const SHORT_SYMBOLS: usize = 8;

static EXIT_CODE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)\b(?:exit(?:ed)?(?: with)?(?: code| status)?|exit_code|exit code)[\s:=]+(-?\d+)",
    )
    .unwrap()
});
static URL: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r#"https?://[^\s<>"'`)\]]+[^\s<>"'`)\].,;:]"#).unwrap());
static VERSION: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\bv?\d+\.\d+\.\d+(?:-[0-9A-Za-z.]+)?\b").unwrap());
const CONFIG_FILES: &[&str] = &[".toml", ".json", ".yaml", ".yml", ".ini", ".env", ".cfg"];

/// The entries, most worth keeping first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Index {
    pub entries: Vec<Entry>,
}

impl Index {
    /// The index of `span` (its elements' roles and views), ranked.
    pub fn collect(span: &[(Role, MessageView)]) -> Index {
        let mut index = Index::default();
        let mut calls: HashMap<&str, (&str, Value)> = HashMap::new();
        for (_, view) in span {
            for call in &view.tool_calls {
                let args = serde_json::from_str(&call.arguments).unwrap_or(Value::Null);
                calls.insert(call.id.as_str(), (call.name.as_str(), args));
            }
        }
        // Outcomes by tool call: read from the results, attached to the commands.
        let mut outcomes: HashMap<&str, String> = HashMap::new();
        for (role, view) in span {
            match role {
                Role::Tool => {
                    let Some(id) = view.tool_call_id.as_deref() else {
                        continue;
                    };
                    let Some((name, args)) = calls.get(id) else {
                        continue;
                    };
                    if files::reads(name, args) {
                        continue;
                    }
                    let command = shell_command(name, args);
                    let first_error = first_failure(name, args, &view.text);
                    if command.is_some() {
                        let exit = EXIT_CODE
                            .captures(&view.text)
                            .map(|c| format!("exit {}", &c[1]));
                        let outcome = match (exit, first_error) {
                            (Some(exit), Some(line)) if exit != "exit 0" => {
                                format!("{exit}: {}", cut(line, OUTCOME_CHARS))
                            }
                            (Some(exit), _) => exit,
                            (None, Some(line)) => cut(line, OUTCOME_CHARS),
                            (None, None) => String::new(),
                        };
                        outcomes.insert(id, outcome);
                    } else if let Some(line) = first_error {
                        index.add(Kind::Error, cut(line, OUTCOME_CHARS), String::new());
                    }
                }
                Role::User | Role::Assistant if !view.text.contains("<summary>") => {
                    for url in URL.find_iter(&view.text) {
                        index.add(Kind::Url, url.as_str().to_string(), String::new());
                    }
                    for version in VERSION.find_iter(&view.text) {
                        index.add(Kind::Version, version.as_str().to_string(), String::new());
                    }
                }
                _ => {}
            }
        }
        for (_, view) in span {
            for call in &view.tool_calls {
                let Some((name, args)) = calls.get(call.id.as_str()) else {
                    continue;
                };
                if let Some(command) = shell_command(name, args) {
                    let first = command.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
                    let outcome = outcomes.get(call.id.as_str()).cloned().unwrap_or_default();
                    index.add(Kind::Command, cut(first, COMMAND_CHARS), outcome);
                }
                if files::modifies(name, args) {
                    let whole = !args.as_object().is_some_and(|m| {
                        m.keys().any(|k| k.to_ascii_lowercase().starts_with("old"))
                    });
                    let kind = if whole { Kind::Wrote } else { Kind::Edited };
                    for path in files::paths_in(args) {
                        // A config file's symbols are the keys it sets.
                        let names = if CONFIG_FILES.iter().any(|ext| path.ends_with(ext)) {
                            config_keys(args)
                        } else {
                            declared_names(args)
                        };
                        index.add(kind, path, names.join(", "));
                    }
                }
            }
        }
        // Newest first among equals: the span was read oldest first.
        index.entries.reverse();
        index.rank();
        index
    }

    /// Counts `name` once more, or adds it: a command's newest outcome wins; a file's symbols
    /// gather, the newest first.
    fn add(&mut self, kind: Kind, name: String, detail: String) {
        if name.trim().is_empty() {
            return;
        }
        match self
            .entries
            .iter_mut()
            .find(|e| e.kind == kind && same_name(&e.name, &name))
        {
            Some(entry) => {
                // A name repeated within one span (a config file rewritten, a URL quoted
                // again) is one use; what ran or was edited again is another.
                if matches!(
                    kind,
                    Kind::Command | Kind::Edited | Kind::Wrote | Kind::Error
                ) {
                    entry.uses += 1;
                }
                let displaced = displaced_error(kind, &detail, &entry.detail);
                entry.detail = merge_detail(kind, &detail, &entry.detail);
                if let Some(line) = displaced {
                    self.add(Kind::Error, line, String::new());
                }
            }
            None => self.entries.push(Entry {
                kind,
                name,
                detail,
                uses: 1,
            }),
        }
    }

    /// Most used first; of equal use, the order they came in (newest first).
    fn rank(&mut self) {
        self.entries.sort_by_key(|e| std::cmp::Reverse(e.uses));
    }

    /// The index as [`Index::lines`] wrote it, one entry a line (without the `- `).
    pub fn parse<'a>(lines: impl IntoIterator<Item = &'a str>) -> Index {
        Index {
            entries: lines.into_iter().filter_map(Entry::parse).collect(),
        }
    }

    /// This (newer) index merged with an older one: an entry of both counts the uses of both,
    /// with the newer detail first; then ranked, the newer first among equals. Recency counts
    /// as one use: an entry of the newest span ranks above an older one used as often.
    pub fn then(self, older: Index) -> Index {
        let mut merged: Vec<(Entry, bool)> = self.entries.into_iter().map(|e| (e, true)).collect();
        let mut displaced: Vec<String> = Vec::new();
        for entry in older.entries {
            match merged
                .iter_mut()
                .find(|(e, _)| e.kind == entry.kind && same_name(&e.name, &entry.name))
            {
                Some((newer, _)) => {
                    if let Some(line) = displaced_error(entry.kind, &newer.detail, &entry.detail) {
                        displaced.push(line);
                    }
                    newer.uses += entry.uses;
                    // The whole name wins over a form carried cut.
                    if entry.name.len() > newer.name.len() {
                        newer.name = entry.name;
                    }
                    newer.detail = merge_detail(entry.kind, &newer.detail, &entry.detail);
                }
                None => merged.push((entry, false)),
            }
        }
        // An older run's failure a newer outcome replaced stays, as an error line of its own.
        for line in displaced {
            if !merged
                .iter()
                .any(|(e, _)| e.kind == Kind::Error && same_name(&e.name, &line))
            {
                merged.push((
                    Entry {
                        kind: Kind::Error,
                        name: line,
                        detail: String::new(),
                        uses: 1,
                    },
                    false,
                ));
            }
        }
        merged.sort_by_key(|(e, fresh)| std::cmp::Reverse(e.uses + u32::from(*fresh)));
        Index {
            entries: merged.into_iter().map(|(e, _)| e).collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries' lines that fit in `allowance` tokens besides `title_cost`, and the tokens
    /// they take: all whole when they fit; else, commands that read the same once cut folded
    /// into one ([`Index::folded`]), commands and outcomes cut, the longest first;
    /// else the least ranked commands, errors, URLs and versions left out; else the files'
    /// symbol lists cut to their newest few, the longest first; else the least ranked files
    /// left out. A file's symbols go last because a name costs a few tokens where a command
    /// costs tens, and the names are what later turns ask for most.
    pub fn fit(&self, encoding: Encoding, allowance: u64, title_cost: u64) -> (Vec<String>, u64) {
        let cost = |line: &str| encoding.count(line) + 2;
        let whole: Vec<String> = self
            .entries
            .iter()
            .map(|e| e.line(COMMAND_CHARS, OUTCOME_CHARS, usize::MAX))
            .collect();
        let total = title_cost + whole.iter().map(|l| cost(l)).sum::<u64>();
        if total <= allowance {
            return (whole, total);
        }
        self.folded().fit_cut(encoding, allowance, title_cost)
    }

    /// The index with the commands and error lines that read the same once cut to their short
    /// form made one entry: the first (best ranked) in its place, with the uses of all and its
    /// own outcome. The same command run with other trailing arguments (another file to grep,
    /// another `tail -n`) is then listed once, not as lines that say the same.
    fn folded(&self) -> Index {
        let mut entries: Vec<Entry> = Vec::with_capacity(self.entries.len());
        for entry in &self.entries {
            let mut entry = entry.clone();
            entry.name = match entry.kind {
                Kind::Command => cut(&entry.name, SHORT_COMMAND_CHARS),
                Kind::Error => cut(&entry.name, SHORT_OUTCOME_CHARS),
                _ => entry.name,
            };
            match entries
                .iter_mut()
                .find(|e| e.kind == entry.kind && e.name == entry.name)
            {
                Some(first) => {
                    first.uses += entry.uses;
                    first.detail = merge_detail(entry.kind, &first.detail, &entry.detail);
                }
                None => entries.push(entry),
            }
        }
        Index { entries }
    }

    /// [`Index::fit`] past its first step.
    fn fit_cut(&self, encoding: Encoding, allowance: u64, title_cost: u64) -> (Vec<String>, u64) {
        let cost = |line: &str| encoding.count(line) + 2;
        let mut kept: Vec<Option<(String, u64)>> = self
            .entries
            .iter()
            .map(|e| {
                let line = e.line(COMMAND_CHARS, OUTCOME_CHARS, usize::MAX);
                let c = cost(&line);
                Some((line, c))
            })
            .collect();
        let mut total = title_cost + kept.iter().flatten().map(|(_, c)| c).sum::<u64>();
        let is_file = |e: &Entry| matches!(e.kind, Kind::Edited | Kind::Wrote);
        let steps: [(usize, bool); 2] = [(usize::MAX, false), (SHORT_SYMBOLS, true)];
        for (symbols, files_too) in steps {
            let mut longest: Vec<usize> = (0..kept.len()).collect();
            longest.sort_by_key(|&i| std::cmp::Reverse(kept[i].as_ref().map_or(0, |k| k.1)));
            for i in longest {
                if total <= allowance {
                    break;
                }
                let Some((_, old)) = kept[i] else { continue };
                let line = self.entries[i].line(SHORT_COMMAND_CHARS, SHORT_OUTCOME_CHARS, symbols);
                let c = cost(&line);
                if c < old {
                    total = total - old + c;
                    kept[i] = Some((line, c));
                }
            }
            for i in (0..kept.len()).rev() {
                if total <= allowance {
                    break;
                }
                if files_too || !is_file(&self.entries[i]) {
                    if let Some((_, c)) = kept[i].take() {
                        total -= c;
                    }
                }
            }
        }
        let lines = kept.into_iter().flatten().map(|(line, _)| line).collect();
        (lines, total)
    }
}

#[cfg(test)]
mod tests;
