//! Compaction items minted by Compactor: the `encrypted_content` of a Responses `compaction`
//! item that stands for one of our checkpoints.
//!
//! A client (Codex's remote compaction, `POST /v1/responses/compact`) keeps such an item and
//! sends it back in later requests, where Compactor expands it into the checkpoint's summary. The
//! item must not let anyone pull a summary that is not theirs, so it carries the checkpoint id
//! and a MAC over (tenant, checkpoint id) under a key derived from the server's secret:
//! `cmpx1.<checkpoint id>.<mac hex>`. An edited id or MAC, or an item another tenant minted,
//! fails verification before the store is asked. BLAKE3's keyed mode is the MAC (the crate is
//! already the project's hash), compared in constant time.
//!
//! A sealer mints with one key and may accept items of a few others: the previous secret during
//! a rotation, or a key it used before the store's shared secret could be read.

use crate::identity::Hash;

const PREFIX: &str = "cmpx1";
const KEY_CONTEXT: &str = "compactor responses compaction item v1";
/// Most earlier keys a sealer goes on accepting (the newest are kept): each one is tried on
/// every item that does not open with the current key.
const MAX_ACCEPTED: usize = 4;

/// Why an item's `encrypted_content` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    #[error("the compaction item was not issued by this server")]
    NotOurs,
    #[error("the compaction item does not verify for this client")]
    BadSeal,
}

/// Mints compaction items with one server secret, and verifies them with it or with the secrets
/// it was told to go on accepting.
#[derive(Clone)]
pub struct Sealer {
    key: [u8; 32],
    /// Keys whose items still open, though no new item is sealed with them.
    accepted: Vec<[u8; 32]>,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sealer(..)")
    }
}

impl Sealer {
    /// A sealer keyed by `secret`; every replica that must accept another's items needs the same.
    pub fn new(secret: &[u8]) -> Sealer {
        Sealer {
            key: blake3::derive_key(KEY_CONTEXT, secret),
            accepted: Vec::new(),
        }
    }

    /// This sealer, also opening the items sealed with `secret` (a previous one).
    pub fn accepting(mut self, secret: &[u8]) -> Sealer {
        let key = blake3::derive_key(KEY_CONTEXT, secret);
        if key != self.key && !self.accepted.contains(&key) {
            self.accepted.insert(0, key);
            self.accepted.truncate(MAX_ACCEPTED);
        }
        self
    }

    /// A sealer that seals with `secret` and goes on opening every item this one opens.
    pub fn succeeded_by(&self, secret: &[u8]) -> Sealer {
        let next = Sealer::new(secret);
        let accepted: Vec<[u8; 32]> = std::iter::once(self.key)
            .chain(self.accepted.iter().copied())
            .filter(|k| *k != next.key)
            .take(MAX_ACCEPTED)
            .collect();
        Sealer { accepted, ..next }
    }

    /// Whether this sealer mints with the key `secret` derives.
    pub fn seals_with(&self, secret: &[u8]) -> bool {
        self.key == blake3::derive_key(KEY_CONTEXT, secret)
    }

    fn mac(key: &[u8; 32], tenant: &Hash, checkpoint_id: &str) -> blake3::Hash {
        let mut h = blake3::Hasher::new_keyed(key);
        h.update(tenant);
        h.update(&(checkpoint_id.len() as u64).to_le_bytes());
        h.update(checkpoint_id.as_bytes());
        h.finalize()
    }

    /// The `encrypted_content` of a compaction item standing for `checkpoint_id`, for `tenant`.
    pub fn seal(&self, tenant: &Hash, checkpoint_id: &str) -> String {
        format!(
            "{PREFIX}.{checkpoint_id}.{}",
            Sealer::mac(&self.key, tenant, checkpoint_id).to_hex()
        )
    }

    /// Whether `content` looks like an item this kind of server mints (whatever its key): such
    /// items are never forwarded to a provider, which could not read them anyway.
    pub fn is_ours(content: &str) -> bool {
        content.starts_with(PREFIX) && content[PREFIX.len()..].starts_with('.')
    }

    /// The checkpoint id `content` stands for, when it was sealed for `tenant` by this sealer's
    /// key or one it accepts.
    pub fn open(&self, tenant: &Hash, content: &str) -> Result<String, SealError> {
        let rest = content
            .strip_prefix(PREFIX)
            .and_then(|r| r.strip_prefix('.'))
            .ok_or(SealError::NotOurs)?;
        let (id, mac_hex) = rest.rsplit_once('.').ok_or(SealError::BadSeal)?;
        let mac = blake3::Hash::from_hex(mac_hex).map_err(|_| SealError::BadSeal)?;
        // blake3::Hash's equality is constant-time.
        let opens = std::iter::once(&self.key)
            .chain(&self.accepted)
            .any(|key| mac == Sealer::mac(key, tenant, id));
        if id.is_empty() || !opens {
            return Err(SealError::BadSeal);
        }
        Ok(id.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::tenant;

    #[test]
    fn an_item_opens_for_its_tenant_only() {
        let sealer = Sealer::new(b"server secret");
        let alice = tenant("Bearer alice");
        let item = sealer.seal(&alice, "3f2a");
        assert!(Sealer::is_ours(&item));
        assert_eq!(sealer.open(&alice, &item), Ok("3f2a".to_string()));
        assert_eq!(
            sealer.open(&tenant("Bearer mallory"), &item),
            Err(SealError::BadSeal)
        );
    }

    #[test]
    fn an_edited_id_or_mac_or_another_key_fails() {
        let sealer = Sealer::new(b"server secret");
        let alice = tenant("Bearer alice");
        let item = sealer.seal(&alice, "3f2a");
        let other_id = item.replacen("3f2a", "3f2b", 1);
        assert_eq!(sealer.open(&alice, &other_id), Err(SealError::BadSeal));
        let mut flipped = item.clone();
        let last = flipped.pop().unwrap();
        flipped.push(if last == '0' { '1' } else { '0' });
        assert_eq!(sealer.open(&alice, &flipped), Err(SealError::BadSeal));
        assert_eq!(
            Sealer::new(b"another secret").open(&alice, &item),
            Err(SealError::BadSeal)
        );
        assert_eq!(
            sealer.open(&alice, "cmpx1.3f2a.not-hex"),
            Err(SealError::BadSeal)
        );
        assert_eq!(sealer.open(&alice, "cmpx1.3f2a"), Err(SealError::BadSeal));
    }

    #[test]
    fn an_accepted_key_opens_its_items_but_seals_none() {
        let alice = tenant("Bearer alice");
        let old = Sealer::new(b"old secret").seal(&alice, "3f2a");
        let rotated = Sealer::new(b"new secret").accepting(b"old secret");
        assert_eq!(rotated.open(&alice, &old), Ok("3f2a".to_string()));
        assert_eq!(
            rotated.seal(&alice, "3f2a"),
            Sealer::new(b"new secret").seal(&alice, "3f2a")
        );
        assert_eq!(
            Sealer::new(b"new secret").open(&alice, &old),
            Err(SealError::BadSeal)
        );
        assert_eq!(
            rotated.open(&tenant("Bearer mallory"), &old),
            Err(SealError::BadSeal)
        );
    }

    #[test]
    fn a_successor_opens_what_its_predecessor_opened() {
        let alice = tenant("Bearer alice");
        let first = Sealer::new(b"local").accepting(b"previous");
        let by_previous = Sealer::new(b"previous").seal(&alice, "a");
        let by_local = first.seal(&alice, "b");
        let next = first.succeeded_by(b"shared");
        assert!(next.seals_with(b"shared") && !next.seals_with(b"local"));
        assert_eq!(next.open(&alice, &by_previous), Ok("a".to_string()));
        assert_eq!(next.open(&alice, &by_local), Ok("b".to_string()));
        assert_eq!(
            next.seal(&alice, "c"),
            Sealer::new(b"shared").seal(&alice, "c")
        );
    }

    #[test]
    fn items_from_elsewhere_are_not_ours() {
        let sealer = Sealer::new(b"server secret");
        let alice = tenant("Bearer alice");
        for content in [
            "gAAAAABo-openai-blob",
            "",
            "cmpx10.x.y",
            "stub-compaction-3",
        ] {
            assert!(!Sealer::is_ours(content), "{content}");
            assert_eq!(sealer.open(&alice, content), Err(SealError::NotOurs));
        }
    }
}
