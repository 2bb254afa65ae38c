//! The keys Compactor's compaction items are sealed with ([`Sealer`]), and where they come from.
//!
//! A configured secret (`[responses] compaction_secret_env`) is used as given. Without one, the
//! secret is kept in the checkpoint store ([`CheckpointStore::shared_secret`]): the first start
//! writes a random one and every later start reads it back, as does every replica sharing the
//! store, so the items a client holds survive restarts and open on any replica. A configured
//! previous secret (`compaction_secret_previous_env`) is accepted as well, for rotations: its
//! items open, new items are sealed with the current secret.
//!
//! While the store cannot say (Redis away at start), items are sealed with a key of this process
//! alone. The store is asked again every [`RECHECK`]; once it answers, its secret seals and the
//! process key is still accepted. The same check follows a shared secret that changed (a Redis
//! that lost its data, written again by another replica), so the replicas agree again.

use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use crate::config::Config;
use crate::dialect::responses::sealed::Sealer;
use crate::store::CheckpointStore;

/// Under what name the store keeps the sealing secret.
const SECRET_NAME: &str = "compaction-items";

/// How often the store's secret is read again when it is the one sealing.
pub const RECHECK: Duration = Duration::from_secs(30);

/// The sealer in use; replaced when the store's secret takes over.
#[derive(Debug)]
pub struct SealingKeys {
    sealer: RwLock<Sealer>,
}

impl SealingKeys {
    /// Keys that never change: `sealer` as given.
    pub fn fixed(sealer: Sealer) -> Arc<SealingKeys> {
        Arc::new(SealingKeys {
            sealer: RwLock::new(sealer),
        })
    }

    /// The sealer to seal and open with now.
    pub fn current(&self) -> Sealer {
        self.sealer
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn replace(&self, sealer: Sealer) {
        *self.sealer.write().unwrap_or_else(|p| p.into_inner()) = sealer;
    }

    /// The keys `config` asks for: its secret, or the one kept in `store` (asked again in the
    /// background while this process lives). A named secret variable that is unset or empty is
    /// an error.
    pub async fn open(
        config: &Config,
        store: Arc<dyn CheckpointStore>,
    ) -> Result<Arc<SealingKeys>, String> {
        SealingKeys::open_rechecking(config, store, RECHECK).await
    }

    async fn open_rechecking(
        config: &Config,
        store: Arc<dyn CheckpointStore>,
        every: Duration,
    ) -> Result<Arc<SealingKeys>, String> {
        config
            .check_named_secrets(|var| std::env::var(var).ok())
            .map_err(|e| e.to_string())?;
        let previous = config.previous_compaction_secret();
        let with_previous = |sealer: Sealer| match &previous {
            Some(p) => sealer.accepting(p.as_bytes()),
            None => sealer,
        };
        if let Some(secret) = config.compaction_secret() {
            return Ok(SealingKeys::fixed(with_previous(Sealer::new(
                secret.as_bytes(),
            ))));
        }
        let candidate = random_secret();
        let mine = match store.shared_secret(SECRET_NAME, &candidate).await {
            Ok(kept) => kept,
            Err(e) => {
                tracing::warn!(
                    store = store.kind(),
                    error = %e,
                    "The sealing secret could not be read from the store; compaction items are \
                     sealed with a key of this process until it can be."
                );
                candidate
            }
        };
        let keys = SealingKeys::fixed(with_previous(Sealer::new(mine.as_bytes())));
        tokio::spawn(follow_store(Arc::downgrade(&keys), store, mine, every));
        Ok(keys)
    }
}

/// 32 random bytes, as hex (stored as text in every store).
fn random_secret() -> String {
    rand::random::<[u8; 32]>()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `every` so often, offers the store the secret this process seals with (`mine`) and, when the
/// store keeps another, seals with that one from then on (still opening what the old key
/// sealed). Ends with the keys.
async fn follow_store(
    keys: Weak<SealingKeys>,
    store: Arc<dyn CheckpointStore>,
    mut mine: String,
    every: Duration,
) {
    loop {
        tokio::time::sleep(every).await;
        let Some(keys) = keys.upgrade() else {
            return;
        };
        let Ok(kept) = store.shared_secret(SECRET_NAME, &mine).await else {
            continue;
        };
        let sealer = keys.current();
        if !sealer.seals_with(kept.as_bytes()) {
            tracing::info!(
                store = store.kind(),
                "Compaction items are now sealed with the secret kept in the store."
            );
            keys.replace(sealer.succeeded_by(kept.as_bytes()));
        }
        mine = kept;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::tenant;
    use crate::store::redis::redis_server::RedisServer;
    use crate::store::redis::RedisStore;

    async fn replica(url: &str, every: Duration) -> Arc<SealingKeys> {
        let store: Arc<dyn CheckpointStore> =
            Arc::new(RedisStore::open(url, Duration::ZERO).await.unwrap());
        let config = Config {
            store: url.into(),
            ..Config::default()
        };
        SealingKeys::open_rechecking(&config, store, every)
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_replica_started_while_redis_was_away_joins_the_shared_secret() {
        let alice = tenant("Bearer alice");
        let mut server = RedisServer::start();
        server.stop();
        let alone = replica(&server.url(), Duration::from_millis(100)).await;
        let sealed_alone = alone.current().seal(&alice, "a");
        server.restart();
        let joined = replica(&server.url(), RECHECK).await;
        let sealed_shared = joined.current().seal(&alice, "b");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while alone.current().open(&alice, &sealed_shared).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "the shared secret was never taken up"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(
            alone.current().seal(&alice, "c"),
            joined.current().seal(&alice, "c")
        );
        assert_eq!(
            alone.current().open(&alice, &sealed_alone),
            Ok("a".to_string()),
            "what it sealed alone still opens there"
        );
    }
}
