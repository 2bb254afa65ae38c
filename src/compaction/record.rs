//! The record: the part of a summary no model writes. The user's constraints (oldest first),
//! the span's user requests (newest first), the assistant's last words and the identifier index
//! ([`index`]: files edited with their symbols, commands with their outcome, error lines, URLs,
//! versions, ranked by use and recency) are copied from the messages themselves, within a token
//! budget, and carried into the next summary of the same conversation. A small summarizer may
//! drop or garble them; the record cannot. Pure: the engine appends it after the model's text.
//!
//! How the budget is shared (stated for users beside `summary_max_tokens` in
//! `config/compactor.toml`): the model writes at most half of a summary's budget
//! ([`model_allowance`]); the record takes what the model's text leaves. Within that, each
//! section has its share ([`SECTIONS`]); what one leaves unused is shared among those after it by
//! their shares, and what all leave goes round once more. A section whose
//! items do not all fit shortens them, the longest first (a long request to its first sentence
//! and its distinctive words, [`user_words::shorten`]), before it leaves any out, and then leaves
//! out the least worth keeping: the oldest request, the least ranked index entry, the newest
//! constraint ([`Index::fit`] says how the index shortens). So a
//! large item never pushes out a small one, and a constraint, once set, stays: the constraints
//! take what they need whole up to [`CONSTRAINTS_MOST`] of the room, and the model's prose yields
//! to them first (cut at a line end, down to [`MODEL_LEAST`] of the budget). What a client
//! injects into user messages is taken out before they are read ([`user_words::own_words`]).

use crate::dialect::{MessageView, Role};
use crate::tokenizer::Encoding;

use super::user_words::{self, one_line};

/// The heading the record starts under; everything above it is the model's text.
pub const HEADING: &str = "## Record (copied from the conversation)";

mod fit;
mod index;

pub use fit::{attach, attach_share, model_allowance, refit, RecordRoom};

pub use index::{declared_names, error_lines, failure_lines, first_failure, shell_command, Index};

const CONSTRAINTS: usize = 0;
const REQUESTS: usize = 1;
const NOTE: usize = 2;
const INDEX: usize = 3;
/// Section titles, and each one's share of the budget in percent (what one leaves unused goes
/// to the next).
pub const SECTIONS: [(&str, u64); 4] = [
    // First, so that what the few constraints of most conversations leave goes on.
    ("### User constraints, oldest first", 30),
    ("### User requests, newest first", 15),
    // The assistant's newest words usually state where the work stands and what comes next.
    ("### Last assistant message", 8),
    // The exact names later turns ask for: many, and each a few tokens.
    ("### Identifier index, most used first", 47),
];

/// Longest user request copied whole, in characters; a longer one is shortened to its first
/// sentence and its distinctive words in as many.
const REQUEST_CHARS: usize = 400;
/// What an item is shortened to when its section is over its share, in characters: first
/// this, then [`SHORTEST_CHARS`].
const SHORT_CHARS: usize = 200;
const SHORTEST_CHARS: usize = 80;

/// Items of each section, most worth keeping first: constraints oldest first, the others
/// newest first.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Record {
    sections: [Vec<String>; 3],
    index: Index,
}

impl Record {
    /// The record of `span`: its elements' roles and views, in order.
    pub fn collect(span: &[(Role, MessageView)]) -> Record {
        let mut record = Record {
            index: Index::collect(span),
            ..Record::default()
        };
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
                _ => {}
            }
        }
        record
    }

    /// A record as [`Record::render`] wrote it (the text after [`HEADING`]).
    pub fn parse(text: &str) -> Record {
        let mut record = Record::default();
        let mut section = None;
        let mut index_lines = Vec::new();
        for line in text.lines() {
            if let Some(i) = SECTIONS.iter().position(|(title, _)| line.trim() == *title) {
                section = Some(i);
            } else if let (Some(i), Some(item)) = (section, line.strip_prefix("- ")) {
                if i == INDEX {
                    index_lines.push(item);
                } else {
                    record.push(i, item.to_string());
                }
            }
        }
        record.index = Index::parse(index_lines);
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
        self.index = std::mem::take(&mut self.index).then(older.index);
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

    /// Tokens the constraints section takes with every item whole; 0 when there is none.
    fn constraints_cost(&self, encoding: Encoding) -> u64 {
        let items = &self.sections[CONSTRAINTS];
        if items.is_empty() {
            return 0;
        }
        let title = encoding.count(SECTIONS[CONSTRAINTS].0) + 2;
        title + items.iter().map(|c| encoding.count(c) + 2).sum::<u64>()
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
            let empty = match section {
                INDEX => self.index.is_empty(),
                _ => self.sections[section].is_empty(),
            };
            if empty {
                0
            } else {
                share
            }
        };
        let mut weights_left: u64 = (0..SECTIONS.len()).map(weight).sum();
        // The constraints take what they need whole, up to their most; the other sections
        // share the rest by their shares (exactly their shares of `budget` when the
        // constraints take only theirs).
        let constraints_share = SECTIONS[CONSTRAINTS].1;
        let constraints_base = (budget * constraints_share / 100).max(
            self.constraints_cost(encoding)
                .min(budget * CONSTRAINTS_MOST / 100),
        );
        let rest = budget - constraints_base;
        for (section, (title, share)) in SECTIONS.iter().enumerate() {
            // The last section with items takes all that is left over.
            let passed = left_over * weight(section) / weights_left.max(1);
            weights_left -= weight(section);
            left_over -= passed;
            let base = if section == CONSTRAINTS {
                constraints_base
            } else {
                rest * share / (100 - constraints_share)
            };
            let allowance = base + passed;
            let title_cost = encoding.count(title) + 2;
            let (kept, used) = if section == NOTE {
                fit_note(&self.sections[section], encoding, allowance, title_cost)
            } else if section == INDEX {
                self.index.fit(encoding, allowance, title_cost)
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
            kept.iter()
                .for_each(|item| body.push_str(&format!("- {item}\n")));
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
/// Most of the record's room the constraints take to stay whole, in percent (their share is the
/// least they get).
const CONSTRAINTS_MOST: u64 = 60;
/// Least of a summary's budget the model's text keeps when it yields to the constraints, in
/// percent.
const MODEL_LEAST: u64 = 25;
/// Most of a summary's budget the record takes, in percent: all the model's text leaves.
pub const SHARE: u64 = 100;

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

#[cfg(test)]
mod tests;
