//! Client-chosen values as they appear in logs.
//!
//! The text log format writes `%`-formatted fields as they are, so a `model` of `"x\nFORGED …"`
//! would start a log line of the client's making. Every client value that reaches a log goes
//! through [`Escaped`], which writes control characters as escapes (`\n`, `\u{1b}`).

use std::fmt;

/// Displays a value with its control characters escaped.
pub struct Escaped<T>(pub T);

impl<T: fmt::Display> fmt::Display for Escaped<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = self.0.to_string();
        if !text.chars().any(char::is_control) {
            return f.write_str(&text);
        }
        for c in text.chars() {
            if c.is_control() {
                write!(f, "{}", c.escape_default())?;
            } else {
                write!(f, "{c}")?;
            }
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
            "gpt\\n2026-01-01T00:00:00Z  INFO forged\\r\\u{1b}[31m"
        );
        assert_eq!(Escaped("gpt-4o é").to_string(), "gpt-4o é");
    }
}
