//! The summary request: its own system prompt, the older turns as a labelled transcript, the
//! previous summary when there is one, and chunking when the span is larger than the
//! summarizer's window. Building requests and reading answers is pure; sending them is the
//! engine's job.

use serde_json::Value;

use crate::dialect::chat::Chat;
use crate::dialect::{Dialect, SummaryRequest};
use crate::measure::Encoding;
use crate::request::{Message, Role};

use super::rewrite::cut_middle;

/// The summarizer's system prompt.
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

/// Longest tool result, in characters, copied into a transcript whole.
pub const TRANSCRIPT_RESULT_CHARS: usize = 4000;
/// Longest other message, in characters, copied whole.
pub const TRANSCRIPT_MESSAGE_CHARS: usize = 16000;

/// One message rendered for the transcript.
pub fn transcript_entry(message: &Message) -> String {
    let limit = if matches!(message.role, Role::Tool | Role::Other) {
        TRANSCRIPT_RESULT_CHARS
    } else {
        TRANSCRIPT_MESSAGE_CHARS
    };
    let view = message.view();
    let text = shorten(&view.text, limit);
    let mut entry = String::new();
    match message.role {
        Role::Tool | Role::Other => {
            let label = view
                .name
                .as_deref()
                .or(view.tool_call_id.as_deref())
                .unwrap_or("tool");
            entry.push_str(&format!("[tool result {label}]\n{text}\n"));
        }
        role => {
            if !text.is_empty() {
                entry.push_str(&format!("[{}]\n{text}\n", role.as_str()));
            }
            if view.media_parts > 0 {
                entry.push_str(&format!(
                    "[{} attached {} image(s)]\n",
                    role.as_str(),
                    view.media_parts
                ));
            }
            for call in &view.tool_calls {
                let args = shorten(&call.arguments, TRANSCRIPT_RESULT_CHARS);
                entry.push_str(&format!(
                    "[assistant calls {} ({})]\n{args}\n",
                    call.name, call.id
                ));
            }
        }
    }
    entry
}

fn shorten(text: &str, limit: usize) -> String {
    let chars = text.chars().count();
    if chars <= limit {
        return text.to_string();
    }
    // Token figures are unknown here; characters stand in for both sides of the ratio.
    cut_middle(text, chars as u64, limit as u64)
}

/// The body of one summary request, in chat completions form.
pub fn request_body(
    model: &str,
    previous: Option<&str>,
    transcript: &str,
    instructions: &[&str],
    max_tokens: u64,
) -> Value {
    let user = user_prompt(previous, transcript, instructions, max_tokens);
    Chat.summary_request(&SummaryRequest {
        model,
        system: SYSTEM_PROMPT,
        user: &user,
        max_tokens,
    })
}

/// The user message of a summary request: the previous summary, the transcript, what to do.
pub fn user_prompt(
    previous: Option<&str>,
    transcript: &str,
    instructions: &[&str],
    max_tokens: u64,
) -> String {
    let mut user = String::new();
    if let Some(previous) = previous {
        user.push_str("<previous-summary>\n");
        user.push_str(previous.trim());
        user.push_str("\n</previous-summary>\n\n");
    }
    user.push_str("<transcript>\n");
    user.push_str(transcript);
    user.push_str("</transcript>\n\n");
    user.push_str(if previous.is_some() { UPDATE } else { FIRST });
    // The answer is cut off at `max_tokens`; a model told its budget finishes every section.
    let words = max_tokens * 3 / 5;
    user.push_str(&format!(
        " Keep the whole summary under {words} words so that every section is complete."
    ));
    for extra in instructions.iter().filter(|s| !s.trim().is_empty()) {
        user.push_str("\n\nAdditional instructions: ");
        user.push_str(extra.trim());
    }
    user
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

/// Why a summary answer cannot be used.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum AnswerError {
    #[error("summary response is not a chat completion")]
    Malformed,
    #[error("summarizer returned an empty summary")]
    Empty,
    #[error("summary was cut off by the token limit")]
    Truncated,
}

/// The summary text of a chat completion response.
pub fn read_answer(body: &[u8]) -> Result<String, AnswerError> {
    let value: Value = serde_json::from_slice(body).map_err(|_| AnswerError::Malformed)?;
    let choice = value
        .get("choices")
        .and_then(|c| c.get(0))
        .ok_or(AnswerError::Malformed)?;
    let content = choice
        .get("message")
        .and_then(|m| m.get("content"))
        .and_then(|c| c.as_str())
        .unwrap_or("")
        .trim();
    if content.is_empty() {
        return Err(AnswerError::Empty);
    }
    // A summary cut off mid-sentence is still better than none when it has its first sections;
    // only an answer that ended before saying anything useful is refused.
    if choice.get("finish_reason").and_then(|f| f.as_str()) == Some("length") && content.len() < 200
    {
        return Err(AnswerError::Truncated);
    }
    Ok(content.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::ChatRequest;

    #[test]
    fn transcript_labels_roles_calls_and_cuts_long_results() {
        let long = "x".repeat(10_000);
        let body = format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"fix it"}},
            {{"role":"assistant","content":"ok","tool_calls":[{{"id":"c1","type":"function","function":{{"name":"read","arguments":"{{\"path\":\"a.rs\"}}"}}}}]}},
            {{"role":"tool","tool_call_id":"c1","content":"{long}"}}]}}"#
        );
        let req = ChatRequest::parse(body.as_bytes()).unwrap();
        let entries: Vec<String> = req.messages.iter().map(transcript_entry).collect();
        assert_eq!(entries[0], "[user]\nfix it\n");
        assert!(entries[1].contains("[assistant calls read (c1)]\n{\"path\":\"a.rs\"}"));
        assert!(
            entries[2].starts_with("[tool result c1]")
                && entries[2].contains("cut from the middle")
        );
        assert!(entries[2].len() < 5000);
    }

    #[test]
    fn update_requests_carry_the_previous_summary() {
        let body = request_body(
            "m",
            Some("## Goal\nold"),
            "[user]\nhi\n",
            &["keep names"],
            500,
        );
        let user = body["messages"][1]["content"].as_str().unwrap();
        assert!(user.contains("<previous-summary>\n## Goal\nold") && user.contains("keep names"));
        assert_eq!(body["max_tokens"], 500);
        assert!(user.contains("under 300 words"));
        assert!(body.get("tools").is_none());
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

    #[test]
    fn reads_answers() {
        assert_eq!(
            read_answer(br#"{"choices":[{"message":{"content":" ## Goal\nx "}}]}"#).unwrap(),
            "## Goal\nx"
        );
        assert_eq!(
            read_answer(br#"{"choices":[{"message":{"content":""}}]}"#),
            Err(AnswerError::Empty)
        );
        assert_eq!(read_answer(b"nope"), Err(AnswerError::Malformed));
    }
}
