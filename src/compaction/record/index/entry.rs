//! One entry of the index (a name, what was done with it, how often it was met): its line in a
//! summary and back, and how an entry met again merges with the one already there.

use super::super::super::user_words::one_line;
use super::{Kind, EXIT_CODE, PREFIXES};

/// One name and what the conversation did with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub kind: Kind,
    pub name: String,
    /// The outcome of a command, the symbols of a file, the file of a config key; may be empty.
    pub detail: String,
    /// How many times the conversation met it, across compactions.
    pub uses: u32,
}

impl Entry {
    pub(super) fn line(
        &self,
        command_chars: usize,
        outcome_chars: usize,
        symbols: usize,
    ) -> String {
        let prefix = PREFIXES.iter().find(|(k, _)| *k == self.kind).unwrap().1;
        let name = match self.kind {
            Kind::Command => cut(&self.name, command_chars),
            Kind::Error => cut(&self.name, outcome_chars),
            _ => self.name.clone(),
        };
        let mut line = format!("{prefix}{name}");
        if self.uses > 1 {
            line.push_str(&format!(" ×{}", self.uses));
        }
        let detail = match self.kind {
            Kind::Edited | Kind::Wrote => {
                let all: Vec<&str> = self.detail.split(", ").filter(|s| !s.is_empty()).collect();
                let mut kept = all[..all.len().min(symbols)].join(", ");
                if all.len() > symbols {
                    kept.push_str(", …");
                }
                kept
            }
            // An exit code is kept whole before the line it failed with.
            Kind::Command => match self.detail.split_once(": ") {
                Some((exit, line)) if EXIT_CODE.is_match(exit) => {
                    format!("{exit}: {}", cut(line, outcome_chars))
                }
                _ => cut(&self.detail, outcome_chars),
            },
            _ => self.detail.clone(),
        };
        if !detail.is_empty() {
            let joint = match self.kind {
                Kind::Command => " → ",
                _ => ": ",
            };
            line.push_str(joint);
            line.push_str(&detail);
        }
        line
    }

    /// The entry a rendered line stands for.
    pub(super) fn parse(line: &str) -> Option<Entry> {
        let (kind, rest) = PREFIXES
            .iter()
            .find_map(|(kind, prefix)| line.strip_prefix(prefix).map(|rest| (*kind, rest)))?;
        let joint = match kind {
            Kind::Command => " → ",
            Kind::Edited | Kind::Wrote => ": ",
            _ => "\u{0}",
        };
        let (head, detail) = rest.split_once(joint).unwrap_or((rest, ""));
        let (name, uses) = match head.rsplit_once(" ×") {
            Some((name, n)) if n.parse::<u32>().is_ok() => (name, n.parse().unwrap()),
            _ => (head, 1),
        };
        let detail = detail.trim_end_matches(", …").to_string();
        Some(Entry {
            kind,
            name: name.to_string(),
            detail,
            uses,
        })
    }
}

/// `text` on one line in at most `chars` characters and a mark: when it is longer, cut at the
/// end of a word if one ends past the half (what ran and what failed are named first, and a
/// word cut in two names nothing), else inside the word, and marked ` …`.
pub(super) fn cut(text: &str, chars: usize) -> String {
    let line = one_line(text, usize::MAX);
    // Already cut to as much (carried from an earlier summary): as it is.
    let head = line.strip_suffix(" …").unwrap_or(&line);
    if head.chars().count() <= chars {
        return line;
    }
    let head: String = line.chars().take(chars).collect();
    let head = match head.rfind(' ') {
        Some(at) if at > chars / 2 => head[..at].trim_end(),
        _ => head.as_str(),
    };
    format!("{head} …")
}

/// Whether two names are one: equal, or one a form cut (`… …`) of the other, as a command or
/// an error line carried shortened from an earlier summary is the one run again.
pub(super) fn same_name(a: &str, b: &str) -> bool {
    let head = |name: &str| name.strip_suffix(" …").map(str::to_string);
    match (head(a), head(b)) {
        (None, None) => a == b,
        (Some(a), None) => b.starts_with(&a),
        (None, Some(b)) => a.starts_with(&b),
        (Some(a), Some(b)) => a.starts_with(&b) || b.starts_with(&a),
    }
}

/// The failure line of a command's older outcome when a newer, different outcome replaces it:
/// the error an earlier run met is still one the conversation saw.
pub(super) fn displaced_error(kind: Kind, newer: &str, older: &str) -> Option<String> {
    if kind != Kind::Command || older.is_empty() || newer.is_empty() || same_name(newer, older) {
        return None;
    }
    let line = match older.split_once(": ") {
        Some((exit, line)) if EXIT_CODE.is_match(exit) => line,
        _ if EXIT_CODE.is_match(older) => return None,
        _ => older,
    };
    Some(line.to_string())
}

/// A detail of `kind` from a newer and an older one.
pub(super) fn merge_detail(kind: Kind, newer: &str, older: &str) -> String {
    match kind {
        Kind::Edited | Kind::Wrote => {
            let mut names: Vec<&str> = Vec::new();
            for name in newer.split(", ").chain(older.split(", ")) {
                if !name.is_empty() && !names.contains(&name) {
                    names.push(name);
                }
            }
            names.join(", ")
        }
        _ if newer.is_empty() => older.to_string(),
        _ => newer.to_string(),
    }
}
