//! The Redis store against a real server: the store contract, sharing between replicas, key
//! expiry and trimming.

use std::future::Future;
use std::time::Instant;

use super::*;

use crate::store::contract::{check, sample};
use crate::store::CHECKPOINTS_PER_CONVERSATION;

use super::redis_server::RedisServer;

#[tokio::test]
async fn meets_the_store_contract() {
    let server = RedisServer::start();
    let store = RedisStore::open(&server.url(), Duration::ZERO)
        .await
        .unwrap();
    assert!(store.healthy());
    check(&store).await;
    assert!(store.healthy());
}

#[tokio::test]
async fn bad_urls_are_refused_without_echoing_them() {
    let Err(e) = RedisStore::open("redis://:secret@[nope", Duration::ZERO).await else {
        panic!("accepted")
    };
    assert!(!e.to_string().contains("secret"), "{e}");
    assert!(
        RedisStore::open("rediss://:secret@localhost/", Duration::ZERO)
            .await
            .is_err()
    );
}

#[tokio::test]
async fn replicas_share_checkpoints_facts_and_leases() {
    let server = RedisServer::start();
    let one = RedisStore::open(&server.url(), Duration::from_secs(3600))
        .await
        .unwrap();
    let two = RedisStore::open(&server.url(), Duration::from_secs(3600))
        .await
        .unwrap();
    let cp = sample("a", 5, crate::store::now_ms());
    one.put(&cp).await.unwrap();
    assert_eq!(*two.for_anchor("a").await.unwrap(), vec![cp.clone()]);
    assert_eq!(two.get(&cp.id).await.unwrap(), Some(cp));
    let facts = ModelFacts {
        window: Some(8192),
        ..ModelFacts::default()
    };
    two.put_model_facts("m", facts.clone()).await.unwrap();
    assert_eq!(one.model_facts("m").await.unwrap(), facts);

    let ttl = Duration::from_secs(30);
    assert!(one.try_lease("conv", "r1", ttl).await.unwrap());
    assert!(!two.try_lease("conv", "r2", ttl).await.unwrap());
    one.release_lease("conv", "r1").await.unwrap();
    assert!(two.try_lease("conv", "r2", ttl).await.unwrap());
}

#[tokio::test]
async fn trimmed_checkpoints_are_deleted_and_keys_expire() {
    let server = RedisServer::start();
    // Long enough that the writes below finish before it on a loaded machine.
    let store = RedisStore::open(&server.url(), Duration::from_millis(2000))
        .await
        .unwrap();
    for i in 0..12 {
        store
            .put(&sample("c", i, crate::store::now_ms() + i as u64))
            .await
            .unwrap();
    }
    let list = store.for_anchor("c").await.unwrap();
    assert_eq!(
        list.iter().map(|c| c.covered).collect::<Vec<_>>(),
        (4..12).rev().collect::<Vec<_>>()
    );
    let client = redis::Client::open(server.url()).unwrap();
    let mut raw = client.get_multiplexed_async_connection().await.unwrap();
    let indexed: Vec<String> = raw.keys("compactor:id:*").await.unwrap();
    assert_eq!(indexed.len(), CHECKPOINTS_PER_CONVERSATION);
    let kept: usize = raw.hlen("compactor:{c}:checkpoints").await.unwrap();
    assert_eq!(kept, CHECKPOINTS_PER_CONVERSATION);
    tokio::time::sleep(Duration::from_millis(2300)).await;
    assert!(store.for_anchor("c").await.unwrap().is_empty());
    let keys: Vec<String> = raw.keys("compactor:*").await.unwrap();
    assert!(keys.is_empty(), "left behind: {keys:?}");
}

#[tokio::test]
async fn checkpoints_in_the_previous_layout_are_found_and_moved() {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let mut raw = client.get_multiplexed_async_connection().await.unwrap();
    // What a replica of the previous version wrote: a sorted set per conversation, member
    // `{created_ms:020}:{id}` scored by `covered`, and one JSON key per checkpoint.
    let old = [sample("a", 4, 1), sample("a", 9, 2), sample("b", 3, 3)];
    for checkpoint in &old {
        let member = format!("{:020}:{}", checkpoint.created_ms, checkpoint.id);
        raw.zadd::<_, _, _, ()>(
            format!("compactor:conv:{}", checkpoint.anchor),
            member,
            checkpoint.covered,
        )
        .await
        .unwrap();
        raw.set::<_, _, ()>(
            format!("compactor:cp:{}", checkpoint.id),
            serde_json::to_string(checkpoint).unwrap(),
        )
        .await
        .unwrap();
    }
    let store = RedisStore::open(&server.url(), Duration::ZERO)
        .await
        .unwrap();
    // On first use (the move at startup may not have reached it yet) and afterwards alike.
    assert_eq!(
        *store.for_anchor("a").await.unwrap(),
        vec![old[1].clone(), old[0].clone()]
    );
    assert_eq!(store.get(&old[2].id).await.unwrap(), Some(old[2].clone()));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left: Vec<String> = raw.keys("compactor:c*:*").await.unwrap();
        if left.is_empty() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not moved: {left:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let other = RedisStore::open(&server.url(), Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(*other.for_anchor("b").await.unwrap(), vec![old[2].clone()]);
    assert_eq!(other.get(&old[0].id).await.unwrap(), Some(old[0].clone()));
}

#[tokio::test]
async fn checkpoints_redis_lost_are_written_back_from_a_replicas_copy() {
    let server = RedisServer::start();
    let ttl = Duration::from_secs(3600);
    let writer = RedisStore::open(&server.url(), ttl).await.unwrap();
    let reader = RedisStore::open(&server.url(), ttl).await.unwrap();
    let now = crate::store::now_ms();
    let (older, newer) = (sample("a", 4, now), sample("a", 9, now + 1));
    writer.put(&older).await.unwrap();
    writer.put(&newer).await.unwrap();
    let other = sample("b", 3, now);
    writer.put(&other).await.unwrap();

    let client = redis::Client::open(server.url()).unwrap();
    let mut raw = client.get_multiplexed_async_connection().await.unwrap();
    redis::cmd("FLUSHALL")
        .query_async::<()>(&mut raw)
        .await
        .unwrap();
    assert!(reader.for_anchor("a").await.unwrap().is_empty());
    assert_eq!(
        *writer.for_anchor("a").await.unwrap(),
        vec![newer.clone(), older.clone()],
        "served from the copy"
    );
    assert!(writer.healthy());
    assert_eq!(
        *reader.for_anchor("a").await.unwrap(),
        vec![newer, older],
        "and written back for every replica"
    );
    // Found by id alone too.
    assert_eq!(reader.get(&other.id).await.unwrap(), None);
    assert_eq!(writer.get(&other.id).await.unwrap(), Some(other.clone()));
    assert_eq!(reader.get(&other.id).await.unwrap(), Some(other));
}

#[tokio::test]
async fn a_checkpoint_trimmed_by_another_replica_is_not_written_back() {
    let server = RedisServer::start();
    let ttl = Duration::from_secs(3600);
    let stale = RedisStore::open(&server.url(), ttl).await.unwrap();
    let busy = RedisStore::open(&server.url(), ttl).await.unwrap();
    let now = crate::store::now_ms();
    let first = sample("c", 1, now);
    stale.put(&first).await.unwrap();
    for covered in 2..=(CHECKPOINTS_PER_CONVERSATION + 1) {
        busy.put(&sample("c", covered, now + covered as u64))
            .await
            .unwrap();
    }
    let list = stale.for_anchor("c").await.unwrap();
    assert_eq!(list.len(), CHECKPOINTS_PER_CONVERSATION);
    assert!(
        list.iter().all(|c| c.id != first.id),
        "trimmed stays trimmed"
    );
    assert_eq!(stale.get(&first.id).await.unwrap(), None);
    let client = redis::Client::open(server.url()).unwrap();
    let mut raw = client.get_multiplexed_async_connection().await.unwrap();
    let kept: usize = raw.hlen("compactor:{c}:checkpoints").await.unwrap();
    assert_eq!(kept, CHECKPOINTS_PER_CONVERSATION);
}

/// Quick timing against the SQLite store (µs per call, averaged over 1000 calls):
/// `cargo test --release --lib store::redis::tests::latency -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "timing report, not a test"]
async fn latency_against_sqlite() {
    const N: usize = 1000;
    async fn per_call<F: Future>(mut f: impl FnMut(usize) -> F) -> f64 {
        let started = Instant::now();
        for i in 0..N {
            f(i).await;
        }
        started.elapsed().as_secs_f64() * 1e6 / N as f64
    }
    let server = RedisServer::start();
    let redis = RedisStore::open(&server.url(), Duration::from_secs(3600))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sqlite = crate::store::sqlite::SqliteStore::open(
        &dir.path().join("t.db"),
        Duration::from_secs(3600),
    )
    .unwrap();
    let stores: [(&str, &dyn CheckpointStore); 2] = [("redis", &redis), ("sqlite", &sqlite)];
    for (name, store) in stores {
        let base = crate::store::now_ms();
        // 100 conversations with 8 checkpoints each (after trimming), 100 with one.
        let put = per_call(|i| async move {
            store
                .put(&sample(&format!("full{}", i % 100), i, base + i as u64))
                .await
                .unwrap()
        })
        .await;
        for i in 0..100 {
            store
                .put(&sample(&format!("one{i}"), 3, base))
                .await
                .unwrap();
        }
        let hit8 = per_call(|i| async move {
            assert_eq!(
                store
                    .for_anchor(&format!("full{}", i % 100))
                    .await
                    .unwrap()
                    .len(),
                8
            )
        })
        .await;
        let hit1 = per_call(|i| async move {
            assert_eq!(
                store
                    .for_anchor(&format!("one{}", i % 100))
                    .await
                    .unwrap()
                    .len(),
                1
            )
        })
        .await;
        let miss = per_call(|i| async move {
            assert!(store
                .for_anchor(&format!("none{i}"))
                .await
                .unwrap()
                .is_empty())
        })
        .await;
        store
            .put_model_facts(
                "m",
                ModelFacts {
                    window: Some(1),
                    ..ModelFacts::default()
                },
            )
            .await
            .unwrap();
        let facts = per_call(|_| async { store.model_facts("m").await.unwrap() }).await;
        println!(
            "{name:>6}: put {put:6.1}  for_anchor 8 checkpoints {hit8:6.1}, 1 checkpoint {hit1:6.1}, \
             none {miss:6.1}  model_facts {facts:6.1}  (µs per call)"
        );
    }
}

#[tokio::test]
async fn replicas_starting_at_once_keep_one_secret() {
    let server = RedisServer::start();
    let mut replicas = Vec::new();
    for _ in 0..4 {
        replicas.push(
            RedisStore::open(&server.url(), Duration::ZERO)
                .await
                .unwrap(),
        );
    }
    let kept = futures::future::join_all(
        replicas
            .iter()
            .enumerate()
            .map(|(n, r)| async move { r.shared_secret("s", &format!("candidate {n}")).await }),
    )
    .await;
    let kept: Vec<String> = kept.into_iter().map(Result::unwrap).collect();
    assert!(kept[0].starts_with("candidate "), "{kept:?}");
    assert!(kept.iter().all(|k| *k == kept[0]), "{kept:?}");
}

#[tokio::test]
async fn no_secret_is_handed_out_while_redis_is_away() {
    let mut server = RedisServer::start();
    let store = RedisStore::open(&server.url(), Duration::ZERO)
        .await
        .unwrap();
    server.stop();
    // The first call after the loss finds it; from then on the store is degraded.
    let _ = store.shared_secret("s", "local").await;
    assert!(store.shared_secret("s", "local").await.is_err());
}
