//! Gateway keys: the client keys a team gateway accepts, each belonging to a named tenant.
//!
//! Keys are never stored: the key file (and the environment variable) hold `name hash` entries,
//! where the hash is `compactor hash-key`'s output for the key. A presented key is hashed and
//! looked up. The file is re-read when it changes (checked at most once a second, on the
//! request path, so a removed key stops working with the next request after the check).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

/// How often the key file's modification time is looked at.
const RELOAD_CHECK_EVERY: Duration = Duration::from_secs(1);

/// The hash a key is stored as (hex).
pub fn hash_key(key: &str) -> String {
    blake3::Hash::from(blake3::derive_key(
        "compactor gateway key v1",
        key.as_bytes(),
    ))
    .to_hex()
    .to_string()
}

/// Accepted keys by hash, with their tenant names.
type KeyTable = HashMap<String, Arc<str>>;

/// The configured gateway keys, reloaded from their file when it changes.
pub struct GatewayKeys {
    file: Option<PathBuf>,
    from_env: KeyTable,
    keys: RwLock<Arc<KeyTable>>,
    /// When the file was last looked at, and its modification time and length then.
    checked: Mutex<(Instant, Option<(SystemTime, u64)>)>,
}

impl GatewayKeys {
    /// Loads keys from a file and/or the text of an environment variable; `None` when neither
    /// is configured (the gateway is then open, as a plain proxy is).
    pub fn load(
        file: Option<PathBuf>,
        env_text: Option<&str>,
    ) -> Result<Option<GatewayKeys>, String> {
        if file.is_none() && env_text.is_none() {
            return Ok(None);
        }
        let from_env = match env_text {
            Some(text) => parse(text).map_err(|e| format!("gateway keys variable: {e}"))?,
            None => KeyTable::new(),
        };
        let stamp = file.as_ref().and_then(|f| stamp_of(f));
        let keys = GatewayKeys {
            file,
            from_env,
            keys: RwLock::new(Arc::new(KeyTable::new())),
            checked: Mutex::new((Instant::now(), stamp)),
        };
        let table = keys.read_all()?;
        *keys
            .keys
            .write()
            .map_err(|_| "gateway keys lock poisoned")? = Arc::new(table);
        Ok(Some(keys))
    }

    /// The tenant name of a presented key, if it is accepted.
    pub fn tenant_of(&self, presented: &str) -> Option<Arc<str>> {
        self.reload_if_changed();
        let table = self.keys.read().ok()?.clone();
        table.get(&hash_key(presented)).cloned()
    }

    /// How many keys are accepted now.
    pub fn len(&self) -> usize {
        self.keys.read().map(|k| k.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn read_all(&self) -> Result<KeyTable, String> {
        let mut table = self.from_env.clone();
        if let Some(path) = &self.file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("gateway keys file {}: {e}", path.display()))?;
            let from_file =
                parse(&text).map_err(|e| format!("gateway keys file {}: {e}", path.display()))?;
            for (hash, name) in from_file {
                if table.values().any(|n| *n == name) && !table.contains_key(&hash) {
                    return Err(format!(
                        "gateway keys file {}: tenant `{name}` is also in the variable",
                        path.display()
                    ));
                }
                table.insert(hash, name);
            }
        }
        Ok(table)
    }

    fn reload_if_changed(&self) {
        let Some(path) = &self.file else { return };
        let Ok(mut checked) = self.checked.lock() else {
            return;
        };
        if checked.0.elapsed() < RELOAD_CHECK_EVERY {
            return;
        }
        let stamp = stamp_of(path);
        checked.0 = Instant::now();
        if stamp == checked.1 {
            return;
        }
        checked.1 = stamp;
        match self.read_all() {
            Ok(table) => {
                tracing::info!(keys = table.len(), "Reloaded the gateway keys.");
                if let Ok(mut keys) = self.keys.write() {
                    *keys = Arc::new(table);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "Gateway keys not reloaded; keeping the previous set.")
            }
        }
    }
}

fn stamp_of(path: &std::path::Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// Parses `name hash` entries, one per line (or separated by commas); `#` starts a comment.
fn parse(text: &str) -> Result<KeyTable, String> {
    let mut table = KeyTable::new();
    for (i, entry) in text
        .lines()
        .flat_map(|l| l.split('#').next().unwrap_or("").split(','))
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .enumerate()
    {
        let mut parts = entry.split_whitespace();
        let (Some(name), Some(hash), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(format!("entry {}: expected `name hash`", i + 1));
        };
        let name_ok = name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c));
        if !name_ok {
            return Err(format!(
                "entry {}: a tenant name may hold letters, digits and - _ . @",
                i + 1
            ));
        }
        if hash.len() != 64 || !hash.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(format!(
                "entry {} (`{name}`): the hash must be 64 hex digits from `compactor hash-key`",
                i + 1
            ));
        }
        if table.values().any(|n| n.as_ref() == name) {
            return Err(format!("entry {}: tenant `{name}` appears twice", i + 1));
        }
        table.insert(hash.to_ascii_lowercase(), Arc::from(name));
    }
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_matched_by_hash_and_named() {
        let text = format!(
            "# team\nalice {}\n\nbob {}  # laptop\n",
            hash_key("sk-alice"),
            hash_key("sk-bob")
        );
        let keys = GatewayKeys::load(None, Some(&text)).unwrap().unwrap();
        assert_eq!(keys.tenant_of("sk-alice").as_deref(), Some("alice"));
        assert_eq!(keys.tenant_of("sk-bob").as_deref(), Some("bob"));
        assert_eq!(keys.tenant_of("sk-carol"), None);
        assert_eq!(keys.len(), 2);
    }

    #[test]
    fn malformed_entries_are_refused() {
        for text in [
            "alice".to_string(),
            "alice sk-plain-key".to_string(),
            format!("al ice {}", hash_key("k")),
            format!("a {},a {}", hash_key("k1"), hash_key("k2")),
        ] {
            assert!(GatewayKeys::load(None, Some(&text)).is_err(), "{text}");
        }
        assert!(GatewayKeys::load(None, None).unwrap().is_none());
    }
}
