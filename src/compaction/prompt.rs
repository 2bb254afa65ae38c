//! The wording of a summary request: its own system prompt, the older turns as a labelled
//! transcript, the previous summary when there is one, and chunking when the span is larger
//! than the summarizer's window. Pure; each dialect writes the request in its own format
//! ([`crate::dialect::Dialect::summary_request`]) and sending it is the engine's job.

use crate::dialect::text::cut_middle;
use crate::tokenizer::Encoding;

/// The summarizer's system prompt in [`Wording::Sections`].
pub const SYSTEM_PROMPT: &str = "Summarize the conversation transcript you are given so that an AI \
coding assistant can continue the same work without it. Do not answer, continue or comment on the \
conversation; only summarize it.

Use exactly these Markdown headings, in this order:
## Goal
## Constraints and preferences
## Progress
### Done
### In progress
### Blocked
## Key decisions
## Next steps
## Critical context

Fill every heading with facts taken from the transcript, or write None. Goal: what the user wants. \
Constraints and preferences: requirements and conventions the user stated. Progress: work finished, \
under way, and blocked. Key decisions: each decision with its reason. Next steps: what to do next, \
in order. Critical context: exact file paths, function names, commands, error messages and values, \
copied verbatim. Be specific; never invent anything.";

/// Instructions for a first summary.
const FIRST: &str = "Write the summary of the transcript above.";
/// Instructions for folding a new span into an existing summary.
const UPDATE: &str = "The previous summary above covers the conversation before this transcript. \
Write one updated summary under the same headings that keeps what still matters from the previous \
summary and adds what the transcript shows.";

/// The system prompt in [`Wording::Outline`]: only the role. A small model echoes descriptive
/// text it sees in a prompt, so nothing here reads like summary content.
const OUTLINE_SYSTEM: &str = "You write summaries of conversations between a user and an AI \
coding assistant. You never continue the conversation and never repeat your instructions.";
/// The task in [`Wording::Outline`], after the transcript, where a small model still reads it.
const OUTLINE_TASK: &str = "Summarize the transcript for the assistant that continues this work \
without it. Use only facts from the transcript, and copy file paths, function names, commands, \
error messages and numbers exactly.";
/// The update task in [`Wording::Outline`].
const OUTLINE_UPDATE: &str = "The previous summary covers the conversation before the transcript. \
Write one summary of both: keep every fact of the previous summary that still holds and add the \
transcript's.";
/// The headings a [`Wording::Outline`] answer fills, given bare at the very end.
const OUTLINE_HEADINGS: &str = "## Goal\n## Done\n## In progress\n## Next steps\n## Key facts";

/// How a summary request is worded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Wording {
    /// [`SYSTEM_PROMPT`]: the headings and what each holds, before the transcript.
    #[default]
    Sections,
    /// For small models: a system prompt that only states the role, and after the transcript a
    /// short task and five bare headings.
    Outline,
}

/// How the previous summary (of earlier chunks or an earlier compaction) enters the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Carry {
    /// Given before the transcript; the model rewrites it with the transcript into one summary.
    Rewrite,
    /// Not shown to the model: each chunk is summarized alone and the texts are joined, oldest
    /// first, the oldest cut when they outgrow the summary's budget ([`join`]).
    ///
    /// The proxy's choice between the chunks of one span (a summary from before the span is
    /// still rewritten with its first chunk). Measured with the 0.5B end-to-end model
    /// (`scripts/fidelity`, `benches/results/fidelity-2026-12-01.md`): asked to rewrite, a small
    /// model echoed the headings and repeated itself, and its longer text left the record less
    /// room: 79% of the reference's salient entities as stored, against 85% appending.
    #[default]
    Append,
}

/// The wording and carry of summary requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Style {
    pub wording: Wording,
    pub carry: Carry,
}

impl Style {
    /// The system prompt of this style's requests.
    pub fn system_prompt(&self) -> &'static str {
        match self.wording {
            Wording::Sections => SYSTEM_PROMPT,
            Wording::Outline => OUTLINE_SYSTEM,
        }
    }

    /// The previous summary as the model should see it: none when summaries are appended.
    pub fn shown<'a>(&self, previous: Option<&'a str>) -> Option<&'a str> {
        match self.carry {
            Carry::Rewrite => previous,
            Carry::Append => None,
        }
    }

    /// The running summary after a chunk answered `answer`.
    pub fn fold(
        &self,
        running: Option<&str>,
        answer: String,
        encoding: Encoding,
        max_tokens: u64,
    ) -> String {
        match (self.carry, running) {
            (Carry::Append, Some(older)) => join(older, &answer, encoding, max_tokens),
            _ => answer,
        }
    }
}

/// The tags the summary request wraps its parts in, and the record's heading: markup of the
/// request, not of the conversation, that a model may echo.
const MARKUP: &[&str] = &[
    "<previous-summary>",
    "</previous-summary>",
    "<transcript>",
    "</transcript>",
    "<summary>",
    "</summary>",
    super::record::HEADING,
];

/// A model's answer without the summary request's own markup: its tags ([`MARKUP`]), its
/// instructions and the `Headings:` label echoed as lines, and headings left with nothing under
/// them (a small model repeats the heading list at the end). What is stored is sent to the
/// model on every later request, so an echo would be paid for, and read, each time.
pub fn clean_answer(answer: &str) -> String {
    // A tag alone on its line goes with its line; one inside a line, alone.
    let mut text = answer
        .lines()
        .filter(|l| !MARKUP.contains(&l.trim()))
        .collect::<Vec<_>>()
        .join("\n");
    for tag in MARKUP {
        text = text.replace(tag, "");
    }
    let instructions = [
        FIRST,
        UPDATE,
        OUTLINE_TASK,
        OUTLINE_UPDATE,
        OUTLINE_SYSTEM,
        CONTINUATION,
        CONTINUATION_UPDATE,
    ];
    let echoed = |line: &str| {
        let line = line.trim();
        line == "Headings:"
            || line.starts_with("Additional instructions:")
            || line.starts_with("Keep the whole summary under ")
            || (line.len() > 20 && instructions.iter().any(|i| i.starts_with(line)))
            || (line.len() > 20
                && SYSTEM_PROMPT
                    .lines()
                    .any(|l| l.trim() == line && !l.starts_with('#')))
    };
    let lines: Vec<&str> = text.lines().filter(|l| !echoed(l)).collect();
    let level = |line: &str| {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        (hashes > 0 && line[hashes..].starts_with(' ')).then_some(hashes)
    };
    let mut kept = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        if let Some(depth) = level(line) {
            // Empty when nothing but blank lines and empty subheadings comes before the next
            // heading of its level or above, or the end.
            let body = lines[i + 1..]
                .iter()
                .take_while(|l| level(l).is_none_or(|d| d > depth))
                .any(|l| !l.trim().is_empty() && level(l).is_none());
            if !body {
                continue;
            }
        }
        kept.push(*line);
    }
    let mut out = kept.join("\n");
    while out.contains("\n\n\n") {
        out = out.replace("\n\n\n", "\n\n");
    }
    out.trim().to_string()
}

/// `older` then `newer`, within `max_tokens`: `newer` whole when it fits, `older` cut from its
/// beginning (its oldest facts go first).
pub fn join(older: &str, newer: &str, encoding: Encoding, max_tokens: u64) -> String {
    let room = max_tokens.saturating_sub(encoding.count(newer) + 2);
    let older = older.trim();
    let mut kept = older;
    while !kept.is_empty() && encoding.count(kept) > room {
        // Drop whole paragraphs (or lines) from the front until it fits.
        kept = match kept.split_once("\n\n").or_else(|| kept.split_once('\n')) {
            Some((_, rest)) => rest.trim_start(),
            None => "",
        };
    }
    if kept.is_empty() {
        newer.trim().to_string()
    } else {
        format!("{kept}\n\n{}", newer.trim())
    }
}

/// The user message of a summary request: the previous summary (unless `style` appends), the
/// transcript, what to do.
pub fn user_prompt(
    style: Style,
    previous: Option<&str>,
    transcript: &str,
    instructions: &[&str],
    max_tokens: u64,
) -> String {
    let previous = style.shown(previous);
    let mut user = String::new();
    if let Some(previous) = previous {
        user.push_str("<previous-summary>\n");
        user.push_str(previous.trim());
        user.push_str("\n</previous-summary>\n\n");
    }
    user.push_str("<transcript>\n");
    user.push_str(transcript);
    user.push_str("</transcript>\n\n");
    user.push_str(match (style.wording, previous.is_some()) {
        (Wording::Sections, false) => FIRST,
        (Wording::Sections, true) => UPDATE,
        (Wording::Outline, false) => OUTLINE_TASK,
        (Wording::Outline, true) => OUTLINE_UPDATE,
    });
    user.push(' ');
    push_budget_and_extras(&mut user, max_tokens, instructions);
    if style.wording == Wording::Outline {
        user.push_str("\n\nHeadings:\n");
        user.push_str(OUTLINE_HEADINGS);
    }
    user
}

/// The request's closing instructions when it continues the conversation instead of
/// quoting it: the work stops, and the model summarizes what it sees above.
const CONTINUATION: &str = "Stop the work here: do not answer the last message, do not \
continue the task and do not call any tool. This conversation is about to be replaced by a \
summary of it. Write that summary, so that an AI coding assistant can continue the same work \
from the summary alone.";
/// Added when the conversation above opens with an earlier summary.
const CONTINUATION_UPDATE: &str = "The conversation above opens with a summary of its earlier \
turns: keep what still matters from it, and add what the turns after it show.";

/// The one user message of a summary request that continues the conversation: what to do,
/// the headings of [`SYSTEM_PROMPT`], the budget and any additional instructions.
pub fn continuation_prompt(previous: bool, instructions: &[&str], max_tokens: u64) -> String {
    let mut user = String::from(CONTINUATION);
    if previous {
        user.push_str("\n\n");
        user.push_str(CONTINUATION_UPDATE);
    }
    // The headings and what each holds: the system prompt after its first paragraph (which
    // speaks of a transcript).
    let guide = SYSTEM_PROMPT
        .split_once("\n\n")
        .map_or(SYSTEM_PROMPT, |(_, rest)| rest);
    user.push_str("\n\n");
    user.push_str(guide);
    // On a line of its own, like every part above, so that an answer echoing the request
    // cleans away whole ([`clean_answer`]).
    user.push_str("\n\n");
    push_budget_and_extras(&mut user, max_tokens, instructions);
    user
}

/// The close of every summary request: the length asked for (the answer is cut off at
/// `max_tokens`; a model told its budget finishes every section), then each additional
/// instruction in a paragraph of its own.
fn push_budget_and_extras(user: &mut String, max_tokens: u64, instructions: &[&str]) {
    let words = max_tokens * 3 / 5;
    user.push_str(&format!(
        "Keep the whole summary under {words} words so that every section is complete."
    ));
    for extra in instructions.iter().filter(|s| !s.trim().is_empty()) {
        user.push_str("\n\nAdditional instructions: ");
        user.push_str(extra.trim());
    }
}

/// Tokens a summary request costs apart from its transcript and previous summary.
pub fn fixed_cost(encoding: Encoding) -> u64 {
    encoding.count(SYSTEM_PROMPT) + encoding.count(UPDATE) + 64
}

/// Splits transcript entries into chunks of at most `budget` tokens, oldest first. An entry
/// larger than the budget is cut in the middle to fit.
pub fn chunk(entries: Vec<String>, encoding: Encoding, budget: u64) -> Vec<String> {
    chunk_counted(entries, encoding, budget)
        .into_iter()
        .map(|(chunk, _)| chunk)
        .collect()
}

/// Like [`chunk`], with the number of entries in each chunk.
pub fn chunk_counted(
    entries: Vec<String>,
    encoding: Encoding,
    budget: u64,
) -> Vec<(String, usize)> {
    let budget = budget.max(256);
    let mut chunks = Vec::new();
    let mut current = String::new();
    let mut current_tokens = 0;
    let mut current_entries = 0;
    for entry in entries {
        let mut tokens = encoding.count(&entry);
        let entry = if tokens > budget {
            let cut = cut_middle(&entry, tokens, budget * 9 / 10);
            tokens = encoding.count(&cut);
            cut
        } else {
            entry
        };
        if current_tokens + tokens > budget && !current.is_empty() {
            chunks.push((std::mem::take(&mut current), current_entries));
            current_tokens = 0;
            current_entries = 0;
        }
        current.push_str(&entry);
        current.push('\n');
        current_tokens += tokens;
        current_entries += 1;
    }
    if !current.is_empty() {
        chunks.push((current, current_entries));
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_continuation_echoed_back_cleans_away_whole() {
        for previous in [false, true] {
            let prompt = continuation_prompt(previous, &["keep names"], 500);
            assert!(prompt.contains("## Critical context") && prompt.contains("keep names"));
            assert_eq!(clean_answer(&prompt), "", "{prompt}");
        }
    }

    #[test]
    fn update_requests_carry_the_previous_summary() {
        let rewrite = Style {
            carry: Carry::Rewrite,
            ..Style::default()
        };
        let user = user_prompt(
            rewrite,
            Some("## Goal\nold"),
            "[user]\nhi\n",
            &["keep names"],
            500,
        );
        assert!(user.contains("<previous-summary>\n## Goal\nold") && user.contains("keep names"));
        assert!(user.contains("under 300 words"));
    }

    #[test]
    fn outline_wording_puts_the_task_and_bare_headings_after_the_transcript() {
        let style = Style {
            wording: Wording::Outline,
            carry: Carry::Rewrite,
        };
        let user = user_prompt(style, Some("## Goal\nold"), "[user]\nhi\n", &[], 500);
        let system = style.system_prompt();
        assert_eq!(system, OUTLINE_SYSTEM);
        assert!(!system.contains("## "), "no heading for the model to echo");
        let transcript_end = user.find("</transcript>").unwrap();
        assert!(user.find(OUTLINE_UPDATE).unwrap() > transcript_end);
        assert!(user.trim_end().ends_with("## Key facts"));
        assert!(user.starts_with("<previous-summary>\n## Goal\nold"));
    }

    #[test]
    fn appending_hides_the_previous_summary_and_joins_within_the_budget() {
        let style = Style {
            carry: Carry::Append,
            ..Style::default()
        };
        let user = user_prompt(style, Some("## Goal\nold"), "[user]\nhi\n", &[], 500);
        assert!(!user.contains("old") && user.contains(FIRST));
        let joined = style.fold(
            Some("first facts"),
            "second facts".into(),
            Encoding::O200k,
            500,
        );
        assert_eq!(joined, "first facts\n\nsecond facts");
        // Too long together: the oldest paragraphs go, the newest answer stays whole.
        let older = (0..40)
            .map(|i| format!("paragraph {i} {}", "word ".repeat(20)))
            .collect::<Vec<_>>()
            .join("\n\n");
        let joined = style.fold(Some(&older), "newest".into(), Encoding::O200k, 200);
        assert!(Encoding::O200k.count(&joined) <= 200);
        assert!(joined.ends_with("\n\nnewest") && joined.contains("paragraph 39 "));
        assert!(!joined.contains("paragraph 0 "));
        // Rewriting keeps only the model's answer.
        let rewrite = Style {
            carry: Carry::Rewrite,
            ..Style::default()
        };
        assert_eq!(
            rewrite.fold(Some("old"), "new".into(), Encoding::O200k, 500),
            "new"
        );
    }

    #[test]
    fn the_requests_markup_never_reaches_the_summary() {
        let answer = "<previous-summary>\n## Goal\nFix the parser in src/parse.rs.\n\
                      </previous-summary>\n<transcript>\n## Progress\n### Done\n- added \
                      a test\n### Blocked\n</transcript>\nWrite the summary of the transcript \
                      above.\nKeep the whole summary under 300 words so that every section is \
                      complete.\n\nHeadings:\n## Goal\n## Done\n## In progress\n## Next \
                      steps\n## Key facts";
        let clean = clean_answer(answer);
        assert_eq!(
            clean,
            "## Goal\nFix the parser in src/parse.rs.\n## Progress\n### Done\n- added a test"
        );
        for markup in MARKUP {
            assert!(!clean.contains(markup), "{markup}");
        }
        let plain = "## Goal\nFix it.\n\n## Next steps\nNone";
        assert_eq!(
            clean_answer(plain),
            plain,
            "a clean answer is left as it is"
        );
    }

    #[test]
    fn chunks_respect_the_budget_in_order() {
        let entries: Vec<String> = (0..50)
            .map(|i| format!("[user]\nmessage number {i} {}\n", "word ".repeat(40)))
            .collect();
        let chunks = chunk(entries, Encoding::O200k, 300);
        assert!(chunks.len() > 5);
        assert!(chunks.iter().all(|c| Encoding::O200k.count(c) <= 300 + 10));
        assert!(
            chunks[0].contains("message number 0 ")
                && chunks.last().unwrap().contains("message number 49 ")
        );
    }
}
