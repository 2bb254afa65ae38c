//! The text the model reads in place of the turns a checkpoint replaced: a preamble that says
//! what it is, the summary, and what code carries beside it (the files read and modified).

/// The words around a summary that tell the model what it is reading.
pub const SUMMARY_PREAMBLE: &str = "[Context compacted] The earlier part of this conversation was \
replaced by the summary below to fit the model's context window. Treat it as the record of \
what was said and done before; the messages after it continue the conversation verbatim.";

/// The summary message's text, with the file lists appended deterministically.
pub fn summary_text(summary: &str, files_read: &[String], files_modified: &[String]) -> String {
    let mut text = format!("{SUMMARY_PREAMBLE}\n\n<summary>\n{}\n", summary.trim());
    if !files_read.is_empty() {
        text.push_str("\n<files-read>\n");
        for f in files_read {
            text.push_str(f);
            text.push('\n');
        }
        text.push_str("</files-read>\n");
    }
    if !files_modified.is_empty() {
        text.push_str("\n<files-modified>\n");
        for f in files_modified {
            text.push_str(f);
            text.push('\n');
        }
        text.push_str("</files-modified>\n");
    }
    text.push_str("</summary>");
    text
}
