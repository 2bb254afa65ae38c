//! Client-chosen values as they appear in logs.
//!
//! The text log format writes `%`-formatted fields as they are, so a `model` of `"x\nFORGED …"`
//! would start a log line of the client's making. Every client value that reaches a log goes
//! through [`Escaped`], which writes control characters as escapes (`\n`, `\u{1b}`), and
//! shortens it to [`MAX_LOGGED_CHARS`]: a megabyte `model` would otherwise cost a megabyte of log
//! for every request that names it. In the text format a line is `key=value` fields separated by
//! spaces, so a `model` of `x compacted=true` would add a field of the client's making: there,
//! a value with whitespace, `=` or a quote is written in quotes (with `"` and `\` escaped). The
//! JSON format quotes every value itself, so it gets the value as it is ([`set_json_format`]).

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether logs are written as JSON (set once, when logging starts).
static JSON_FORMAT: AtomicBool = AtomicBool::new(false);

/// Tells [`Escaped`] whether logs are JSON, where values need no quotes of their own.
pub fn set_json_format(json: bool) {
    JSON_FORMAT.store(json, Ordering::Relaxed);
}

/// Characters of a client value written to a log; the rest is left out and counted.
pub const MAX_LOGGED_CHARS: usize = 200;

/// Displays a value with its control characters escaped, shortened to [`MAX_LOGGED_CHARS`].
pub struct Escaped<T>(pub T);

impl<T: fmt::Display> fmt::Display for Escaped<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = self.0.to_string();
        let cut = text
            .char_indices()
            .nth(MAX_LOGGED_CHARS)
            .map_or(text.len(), |(at, _)| at);
        let shown = &text[..cut];
        let quoted = !JSON_FORMAT.load(Ordering::Relaxed)
            && shown
                .chars()
                .any(|c| c.is_whitespace() || c == '=' || c == '"');
        if quoted {
            f.write_str("\"")?;
        }
        // Plain runs are written whole: this runs on every request's log line.
        let escaped = |c: char| c.is_control() || (quoted && (c == '"' || c == '\\'));
        let mut rest = shown;
        while let Some((at, c)) = rest.char_indices().find(|&(_, c)| escaped(c)) {
            f.write_str(&rest[..at])?;
            if c.is_control() {
                write!(f, "{}", c.escape_default())?;
            } else {
                write!(f, "\\{c}")?;
            }
            rest = &rest[at + c.len_utf8()..];
        }
        f.write_str(rest)?;
        if cut < text.len() {
            write!(f, "…(+{} bytes)", text.len() - cut)?;
        }
        if quoted {
            f.write_str("\"")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(
            Escaped("gpt\n2026-01-01T00:00:00Z  INFO forged\r\u{1b}[31m").to_string(),
            "\"gpt\\n2026-01-01T00:00:00Z  INFO forged\\r\\u{1b}[31m\""
        );
        assert_eq!(Escaped("gpt-4o-é").to_string(), "gpt-4o-é");
    }

    #[test]
    fn values_that_could_pass_for_more_fields_are_quoted() {
        assert_eq!(
            Escaped("gpt-4o compacted=true").to_string(),
            "\"gpt-4o compacted=true\""
        );
        assert_eq!(Escaped("a=b").to_string(), "\"a=b\"");
        assert_eq!(
            Escaped(r#"x" status="500"#).to_string(),
            r#""x\" status=\"500""#
        );
        assert_eq!(Escaped(r"a\b c").to_string(), r#""a\\b c""#);
        assert_eq!(Escaped("gpt-4o\tx").to_string(), "\"gpt-4o\\tx\"");
        assert_eq!(Escaped(r"plain\path").to_string(), r"plain\path");
    }

    #[test]
    fn long_values_are_shortened() {
        let long = format!("{}{}", "é".repeat(MAX_LOGGED_CHARS), "m".repeat(1_000_000));
        let shown = Escaped(&long).to_string();
        assert_eq!(
            shown,
            format!("{}…(+1000000 bytes)", "é".repeat(MAX_LOGGED_CHARS))
        );
        let exact = "m".repeat(MAX_LOGGED_CHARS);
        assert_eq!(Escaped(&exact).to_string(), exact);
    }
}
