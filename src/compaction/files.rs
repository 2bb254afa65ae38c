//! Files the conversation read and modified, taken from the tool calls themselves, never from
//! the model: a path-like argument of a tool call counts, classified by the tool's name (or by
//! its `command` argument for multiplexed editor tools).

use std::collections::BTreeSet;

use serde_json::Value;

use crate::dialect::MessageView;

/// Argument names that hold one path.
const PATH_KEYS: &[&str] = &[
    "path",
    "file_path",
    "filepath",
    "file",
    "filename",
    "file_name",
    "target_file",
    "target_path",
    "source",
    "destination",
    "notebook_path",
];
/// Argument names that hold a list of paths.
const PATHS_KEYS: &[&str] = &["paths", "files", "file_paths"];

const MODIFYING: &[&str] = &[
    "write",
    "edit",
    "create",
    "patch",
    "replace",
    "insert",
    "append",
    "delete",
    "remove",
    "move",
    "rename",
    "save",
    "update_file",
    "apply",
];
const READING: &[&str] = &[
    "read", "view", "open", "cat", "grep", "search", "find", "glob", "list", "ls", "head", "tail",
    "show",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    Read,
    Modify,
}

/// Paths read and modified, each sorted and without duplicates; a modified file is not also
/// listed as read.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FileOps {
    pub read: BTreeSet<String>,
    pub modified: BTreeSet<String>,
}

impl FileOps {
    /// Starts from a previous checkpoint's lists.
    pub fn from_lists(read: &[String], modified: &[String]) -> FileOps {
        FileOps {
            read: read.iter().cloned().collect(),
            modified: modified.iter().cloned().collect(),
        }
    }

    /// Adds the files touched by the tool calls of `views` (elements read by their dialect).
    pub fn collect<'a>(&mut self, views: impl IntoIterator<Item = &'a MessageView>) {
        for view in views {
            for call in &view.tool_calls {
                let Ok(args) = serde_json::from_str::<Value>(&call.arguments) else {
                    continue;
                };
                let Some(access) = classify(&call.name, &args) else {
                    continue;
                };
                for path in paths_in(&args) {
                    match access {
                        Access::Read => self.read.insert(path),
                        Access::Modify => self.modified.insert(path),
                    };
                }
            }
        }
    }

    /// The lists as stored: read excludes what was modified.
    pub fn into_lists(self) -> (Vec<String>, Vec<String>) {
        let read = self.read.difference(&self.modified).cloned().collect();
        (read, self.modified.into_iter().collect())
    }
}

/// Whether a tool call with these arguments reads files.
pub fn reads(tool: &str, args: &Value) -> bool {
    classify(tool, args) == Some(Access::Read)
}

/// Whether a tool call with these arguments modifies files.
pub fn modifies(tool: &str, args: &Value) -> bool {
    classify(tool, args) == Some(Access::Modify)
}

/// Whether a tool argument of this name holds paths.
pub fn is_path_key(key: &str) -> bool {
    PATH_KEYS.contains(&key) || PATHS_KEYS.contains(&key)
}

fn classify(tool: &str, args: &Value) -> Option<Access> {
    let by_name = |name: &str| {
        let name = name.to_ascii_lowercase();
        if MODIFYING.iter().any(|w| name.contains(w)) {
            Some(Access::Modify)
        } else if READING.iter().any(|w| name.contains(w)) {
            Some(Access::Read)
        } else {
            None
        }
    };
    // Editor tools that take a sub-command (`view`, `create`, `str_replace`, …) say by it.
    if let Some(command) = args.get("command").and_then(|c| c.as_str()) {
        if !command.contains(char::is_whitespace) {
            if let Some(access) = by_name(command) {
                return Some(access);
            }
            if command == "undo_edit" {
                return Some(Access::Modify);
            }
        }
    }
    by_name(tool)
}

fn looks_like_path(s: &str) -> bool {
    !s.is_empty()
        && s.len() < 1024
        && !s.contains('\n')
        && !s.starts_with("http://")
        && !s.starts_with("https://")
        && (s.contains('/') || s.contains('.') || s.contains('\\'))
}

/// The paths a tool call's arguments name.
pub fn paths_in(args: &Value) -> Vec<String> {
    let mut found = Vec::new();
    for key in PATH_KEYS {
        if let Some(s) = args.get(*key).and_then(|v| v.as_str()) {
            if looks_like_path(s) {
                found.push(s.to_string());
            }
        }
    }
    for key in PATHS_KEYS {
        if let Some(list) = args.get(*key).and_then(|v| v.as_array()) {
            found.extend(
                list.iter()
                    .filter_map(|v| v.as_str())
                    .filter(|s| looks_like_path(s))
                    .map(str::to_string),
            );
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::chat::request::ChatRequest;

    #[test]
    fn classifies_by_tool_and_command() {
        let req = ChatRequest::parse(
            br#"{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[
            {"id":"1","type":"function","function":{"name":"read","arguments":"{\"path\":\"src/a.rs\"}"}},
            {"id":"2","type":"function","function":{"name":"edit","arguments":"{\"path\":\"src/b.rs\",\"oldText\":\"x\"}"}},
            {"id":"3","type":"function","function":{"name":"str_replace_editor","arguments":"{\"command\":\"view\",\"path\":\"/repo/c.py\"}"}},
            {"id":"4","type":"function","function":{"name":"str_replace_editor","arguments":"{\"command\":\"str_replace\",\"path\":\"/repo/d.py\"}"}},
            {"id":"5","type":"function","function":{"name":"write","arguments":"{\"path\":\"src/a.rs\"}"}},
            {"id":"6","type":"function","function":{"name":"bash","arguments":"{\"command\":\"cat x.txt\"}"}},
            {"id":"7","type":"function","function":{"name":"read","arguments":"not json"}}
            ]}]}"#,
        )
        .unwrap();
        let mut ops = FileOps::default();
        ops.collect(req.messages.iter().map(|m| m.view()));
        let (read, modified) = ops.into_lists();
        assert_eq!(read, vec!["/repo/c.py"]);
        assert_eq!(modified, vec!["/repo/d.py", "src/a.rs", "src/b.rs"]);
    }
}
