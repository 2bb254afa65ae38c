//! Which pass-through paths may leave for the upstream.
//!
//! A client path `/v1/X` is sent to `{upstream}/X`, and the URL library that builds the upstream
//! URL resolves dot segments (`..`, and their encoded forms `%2e%2e`) the way browsers do. Left
//! alone, `/v1/../X` would reach any path of the upstream host, with the proxy's own key when one
//! is configured. So the path is normalised here first, and forwarded only when it stays under
//! the base path.

/// Why a path was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathRefused {
    #[error("path leaves the API's base path")]
    Escapes,
    #[error("path contains an encoded or backslash path separator")]
    HiddenSeparator,
}

/// The part of `path` after `/v1`, with `.` and `..` segments resolved, when it stays under
/// `/v1`. Segments keep their original encoding.
pub fn confine(path: &str) -> Result<String, PathRefused> {
    let rest = path.strip_prefix("/v1").unwrap_or(path);
    let mut kept: Vec<&str> = Vec::new();
    let segments: Vec<&str> = rest.split('/').skip(1).collect();
    let last = segments.len().saturating_sub(1);
    for (i, segment) in segments.into_iter().enumerate() {
        let lower = segment.to_ascii_lowercase();
        // Separators hidden from this parser could be decoded into real ones further on.
        if lower.contains("%2f") || lower.contains("%5c") || segment.contains('\\') {
            return Err(PathRefused::HiddenSeparator);
        }
        let resolved = lower.replace("%2e", ".");
        match resolved.as_str() {
            "." | ".." => {
                if resolved == ".." {
                    kept.pop().ok_or(PathRefused::Escapes)?;
                }
                // `/v1/models/.` names the directory, like `/v1/models/`.
                if i == last {
                    kept.push("");
                }
            }
            _ => kept.push(segment),
        }
    }
    if kept.is_empty() {
        return Ok(String::new());
    }
    Ok(format!("/{}", kept.join("/")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_paths_are_unchanged() {
        assert_eq!(confine("/v1/models").unwrap(), "/models");
        assert_eq!(
            confine("/v1/files/abc/content").unwrap(),
            "/files/abc/content"
        );
        assert_eq!(confine("/v1/models/").unwrap(), "/models/");
        assert_eq!(confine("/v1/a%20b").unwrap(), "/a%20b");
    }

    #[test]
    fn dot_segments_inside_the_base_are_resolved() {
        assert_eq!(confine("/v1/a/../models").unwrap(), "/models");
        assert_eq!(confine("/v1/./models").unwrap(), "/models");
        assert_eq!(confine("/v1/a/%2E%2e/models").unwrap(), "/models");
        assert_eq!(confine("/v1/models/..").unwrap(), "/");
    }

    #[test]
    fn paths_that_leave_the_base_are_refused() {
        for path in [
            "/v1/../x",
            "/v1/%2e%2e/x",
            "/v1/%2E%2E/x",
            "/v1/.%2e/x",
            "/v1/a/../../x",
            "/v1/..",
        ] {
            assert_eq!(confine(path), Err(PathRefused::Escapes), "{path}");
        }
        for path in ["/v1/..%2fx", "/v1/..%2Fx", "/v1/..%5cx", "/v1/..\\x"] {
            assert_eq!(confine(path), Err(PathRefused::HiddenSeparator), "{path}");
        }
    }
}
