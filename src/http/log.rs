//! Client-chosen values as they appear in logs.
//!
//! The text log format writes `%`-formatted fields as they are, so a `model` of `"x\nFORGED …"`
//! would start a log line of the client's making. Every client value that reaches a log goes
//! through [`Escaped`], which writes control characters as escapes (`\n`, `\u{1b}`), and
//! shortens it to [`MAX_LOGGED_CHARS`]: a megabyte `model` would otherwise cost a megabyte of log
//! for every request that names it.

use std::fmt;

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
        if shown.chars().any(char::is_control) {
            for c in shown.chars() {
                if c.is_control() {
                    write!(f, "{}", c.escape_default())?;
                } else {
                    write!(f, "{c}")?;
                }
            }
        } else {
            f.write_str(shown)?;
        }
        if cut < text.len() {
            write!(f, "…(+{} bytes)", text.len() - cut)?;
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
