//! Reading tool calls and their output for the index: the shell command a call ran, the lines
//! of its output that report a failure (not what a command that only prints files printed), the
//! names an edit or a write declared, the keys a config file set.

use std::sync::LazyLock;

use regex::Regex;
use serde_json::Value;

use super::super::super::files;

static ERROR_LINE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)\b(error|errors|failed|failure|fatal|exception|traceback|panicked|cannot|could not|not found|denied|undefined)\b")
        .unwrap()
});
static NO_ERRORS: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?i)\b(0|no|zero) (errors?|failures?|failed)\b").unwrap());
static DECLARED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"\b(?:fn|function|class|const|let|var|def|interface|type|struct|enum|trait|mod|static|private|public|protected|async)\s+([A-Za-z_][A-Za-z0-9_]{2,})\s*(?:[=(<{:;,]|extends\b|implements\b)",
    )
    .unwrap()
});
static CONFIG_KEY: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r#"(?m)^\s*"?([A-Za-z_][A-Za-z0-9_.-]{2,})"?\s*[:=]"#).unwrap());
const PROSE_FILES: &[&str] = &[".md", ".txt", ".rst", ".adoc"];
/// The lines of a tool's output that report a failure, in order (`0 errors` is none).
pub fn error_lines(output: &str) -> impl Iterator<Item = &str> {
    output
        .lines()
        .filter(|l| ERROR_LINE.is_match(l) && !NO_ERRORS.is_match(l))
}

/// Programs whose output is the content of files, as a file read's is.
const PRINTERS: &[&str] = &[
    "cat", "head", "tail", "grep", "egrep", "rg", "ag", "sed", "awk", "find", "ls", "wc", "nl",
    "less", "bat",
];
/// `git` sub-commands that print files or history.
const GIT_PRINTERS: &[&str] = &["diff", "show", "log", "grep", "blame"];
/// A line of a numbered code frame (`216 │ …`, `12 | …`): quoted code, not a report.
static CODE_FRAME: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^\s*\d+\s*[│|]").unwrap());

/// The lines of a tool's output that report a failure of what ran ([`error_lines`], less the
/// lines of code frames): when `command` only prints files (`grep`, `cat`, `git diff`, … after
/// any `cd …&&`), what it printed is their content, and only its program's own complaints
/// count (`grep: …`, `No such file or directory`).
pub fn failure_lines<'a>(command: Option<&str>, output: &'a str) -> impl Iterator<Item = &'a str> {
    let printer = command.and_then(printing_program);
    error_lines(output).filter(move |line| {
        !CODE_FRAME.is_match(line)
            && printer.as_ref().is_none_or(|program| {
                line.starts_with(&format!("{program}:"))
                    || line.contains("No such file or directory")
            })
    })
}

/// The program of `command` when it only prints files: its first, after any `cd …&&` and
/// variable assignments.
fn printing_program(command: &str) -> Option<String> {
    let first = command.lines().find(|l| !l.trim().is_empty())?;
    let mut rest = first.trim();
    while let Some((head, tail)) = rest.split_once("&&") {
        if head.trim() != "cd" && !head.trim_start().starts_with("cd ") {
            break;
        }
        rest = tail.trim();
    }
    let mut words = rest
        .split_whitespace()
        .skip_while(|w| w.contains('=') && !w.starts_with('-'));
    let program = words.next()?.rsplit('/').next()?;
    let prints = PRINTERS.contains(&program)
        || (program == "git" && words.next().is_some_and(|w| GIT_PRINTERS.contains(&w)));
    prints.then(|| program.to_string())
}

/// The shell command a tool call ran, if it ran one.
pub fn shell_command(tool: &str, args: &Value) -> Option<String> {
    let command = args.get("command").or_else(|| args.get("cmd"))?;
    let command = match command {
        Value::String(s) => s.clone(),
        Value::Array(parts) => {
            let parts: Vec<&str> = parts.iter().filter_map(Value::as_str).collect();
            parts.join(" ")
        }
        _ => return None,
    };
    // Editor tools take one-word sub-commands (`view`, `str_replace`): not shell commands.
    let shell_tool = ["bash", "shell", "exec", "run", "terminal", "command"]
        .iter()
        .any(|t| tool.to_ascii_lowercase().contains(t));
    (shell_tool || command.trim().contains(char::is_whitespace)).then_some(command)
}

/// The names declared in what a tool call wrote or replaced (either side of an edit: what it
/// replaced is a symbol it edited), in order, once each.
pub fn declared_names(args: &Value) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    // Prose says "the type of …" and "a class that …": only code declares.
    let paths = files::paths_in(args);
    if !paths.is_empty()
        && paths
            .iter()
            .all(|p| PROSE_FILES.iter().any(|ext| p.ends_with(ext)))
    {
        return names;
    }
    for text in argument_texts(args) {
        for m in DECLARED.captures_iter(text) {
            let name = &m[1];
            if !names.iter().any(|n| n == name) {
                names.push(name.to_string());
            }
        }
    }
    names
}

/// The string arguments of a tool call that are not paths.
fn argument_texts(args: &Value) -> Vec<&str> {
    let Value::Object(map) = args else {
        return Vec::new();
    };
    map.iter()
        .filter(|(key, _)| !files::is_path_key(key))
        .filter_map(|(_, value)| value.as_str())
        .collect()
}

/// The keys set on the new side of an edit or in a write of a config file.
pub(super) fn config_keys(args: &Value) -> Vec<String> {
    let Value::Object(map) = args else {
        return Vec::new();
    };
    let mut keys: Vec<String> = Vec::new();
    let new_side = map
        .iter()
        .filter(|(key, _)| !files::is_path_key(key) && !key.to_ascii_lowercase().starts_with("old"))
        .filter_map(|(_, value)| value.as_str());
    for text in new_side {
        for m in CONFIG_KEY.captures_iter(text) {
            if !keys.iter().any(|k| k == &m[1]) {
                keys.push(m[1].to_string());
            }
        }
    }
    keys
}

/// The first line of a tool call's result that reports a failure of what it did, if any:
/// none for a file read (its output is the file), the first of [`failure_lines`] for a shell
/// command or another tool, and for an edit or a write only its result's first line, since
/// what follows it is the edited text echoed back (a diff, the new content), not a report.
pub fn first_failure<'a>(tool: &str, args: &Value, output: &'a str) -> Option<&'a str> {
    if files::reads(tool, args) {
        return None;
    }
    let command = shell_command(tool, args);
    if command.is_none() && files::modifies(tool, args) {
        let first = output.lines().find(|l| !l.trim().is_empty())?;
        return failure_lines(None, first).next();
    }
    failure_lines(command.as_deref(), output).next()
}
