//! A chat message in the summarizer's transcript, and the summary read out of a chat
//! completion.

use serde_json::Value;

use crate::dialect::media::returned_by;
use crate::dialect::text::{shorten, TRANSCRIPT_MESSAGE_CHARS, TRANSCRIPT_RESULT_CHARS};
use crate::dialect::{AnswerError, Role};

use super::request::Message;

/// One message rendered for the transcript; `call_name` names the tool call a tool result
/// answers. Media appear as placeholders that name them, never as their bytes.
pub fn transcript_entry(message: &Message, call_name: Option<&str>) -> String {
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
            let id = view.tool_call_id.as_deref().unwrap_or("");
            for media in &view.media {
                entry.push_str(&returned_by(media, call_name, id));
            }
        }
        role => {
            if !text.is_empty() {
                entry.push_str(&format!("[{}]\n{text}\n", role.as_str()));
            }
            for media in &view.media {
                entry.push_str(&format!(
                    "[{} attached {}]\n",
                    role.as_str(),
                    media.describe()
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
    use crate::dialect::chat::request::ChatRequest;

    #[test]
    fn transcript_labels_roles_calls_and_cuts_long_results() {
        let long = "x".repeat(10_000);
        let body = format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"fix it"}},
            {{"role":"assistant","content":"ok","tool_calls":[{{"id":"c1","type":"function","function":{{"name":"read","arguments":"{{\"path\":\"a.rs\"}}"}}}}]}},
            {{"role":"tool","tool_call_id":"c1","content":"{long}"}}]}}"#
        );
        let req = ChatRequest::parse(body.as_bytes()).unwrap();
        let entries: Vec<String> = req
            .messages
            .iter()
            .map(|m| transcript_entry(m, None))
            .collect();
        assert_eq!(entries[0], "[user]\nfix it\n");
        assert!(entries[1].contains("[assistant calls read (c1)]\n{\"path\":\"a.rs\"}"));
        assert!(
            entries[2].starts_with("[tool result c1]")
                && entries[2].contains("cut from the middle")
        );
        assert!(entries[2].len() < 5000);
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
