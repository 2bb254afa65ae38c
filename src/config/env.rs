//! The environment's part of the configuration: `COMPACTOR_*` variables laid over the file's
//! table, each only when it names a key the configuration has.

use super::{Config, ConfigError};

/// Overlays `COMPACTOR_KEY` and `COMPACTOR_SECTION__KEY` variables onto the file's table. Values
/// are read as TOML (numbers, booleans) and fall back to plain strings.
pub(super) fn apply_env(
    table: &mut toml::Table,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<(), ConfigError> {
    for (name, value) in env {
        let Some(rest) = name.strip_prefix("COMPACTOR_") else {
            continue;
        };
        // Variables the process uses for other purposes (cache folders of scripts, etc.) are
        // not configuration; only names that map onto a known key are applied.
        let path: Vec<String> = rest.split("__").map(|s| s.to_ascii_lowercase()).collect();
        if !is_known_key(&path) {
            continue;
        }
        let parsed = toml::from_str::<toml::Table>(&format!("v = {value}"))
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(value.clone()));
        let mut slot = &mut *table;
        for section in &path[..path.len() - 1] {
            let entry = slot
                .entry(section.clone())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            slot = entry.as_table_mut().ok_or_else(|| {
                ConfigError::Invalid(format!("{name}: `{section}` is not a section"))
            })?;
        }
        let key = path[path.len() - 1].clone();
        // A string-typed key given a value that TOML reads as a number stays a string.
        let value = match (&parsed, is_string_key(&path)) {
            (toml::Value::String(_), _) | (_, false) => parsed,
            (_, true) => toml::Value::String(value),
        };
        slot.insert(key, value);
    }
    Ok(())
}

fn default_table() -> toml::Table {
    toml::Table::try_from(Config::default()).unwrap_or_default()
}

fn key_value(path: &[String]) -> Option<toml::Value> {
    let mut value = toml::Value::Table(default_table());
    for part in path {
        value = value.as_table()?.get(part)?.clone();
    }
    Some(value)
}

fn is_known_key(path: &[String]) -> bool {
    key_value(path).is_some_and(|v| !v.is_table())
}

fn is_string_key(path: &[String]) -> bool {
    key_value(path).is_some_and(|v| v.is_str())
}
