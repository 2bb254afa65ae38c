//! The Redis store against a real three-master Redis Cluster: the store contract, sharing
//! between replicas with conversations spread over every master, and one master's outage and
//! recovery.

use std::future::Future;
use std::time::Instant;

use redis::AsyncCommands;

use super::redis_cluster::RedisCluster;
use super::*;
use crate::store::contract::{check, sample};
use crate::store::now_ms;

/// `f`, which must finish within a second (the store never waits on an unreachable master).
async fn promptly<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(1), f)
        .await
        .expect("answered within a second")
}

async fn until_healthy(store: &RedisStore) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !store.healthy() {
        assert!(Instant::now() < deadline, "the store did not recover");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn meets_the_store_contract_on_a_cluster() {
    let cluster = RedisCluster::start();
    let store = RedisStore::open(&cluster.url(), Duration::ZERO)
        .await
        .unwrap();
    assert!(store.healthy());
    assert_eq!(store.kind(), "redis-cluster");
    check(&store).await;
    // A script touching keys of two slots fails (CROSSSLOT), which would have degraded it.
    assert!(store.healthy());
}

#[tokio::test]
async fn replicas_share_conversations_spread_over_every_master() {
    let cluster = RedisCluster::start();
    let one = RedisStore::open(&cluster.url(), Duration::from_secs(3600))
        .await
        .unwrap();
    let two = RedisStore::open(&cluster.url(), Duration::from_secs(3600))
        .await
        .unwrap();
    let written: Vec<Checkpoint> = (0..30)
        .map(|i| sample(&format!("conversation-{i}"), 5, now_ms()))
        .collect();
    for checkpoint in &written {
        one.put(checkpoint).await.unwrap();
    }
    for checkpoint in &written {
        assert_eq!(
            *two.for_anchor(&checkpoint.anchor).await.unwrap(),
            vec![checkpoint.clone()]
        );
        assert_eq!(
            two.get(&checkpoint.id).await.unwrap().as_ref(),
            Some(checkpoint)
        );
    }
    for node in 0..cluster.len() {
        let client = redis::Client::open(cluster.node_url(node)).unwrap();
        let mut raw = client.get_multiplexed_async_connection().await.unwrap();
        let orders: Vec<String> = raw.keys("compactor:{*}:order").await.unwrap();
        assert!(!orders.is_empty(), "master {node} holds no conversation");
        for order in orders {
            let checkpoints = order.replace(":order", ":checkpoints");
            assert!(
                raw.exists::<_, bool>(&checkpoints).await.unwrap(),
                "{checkpoints} is on the same master as {order}"
            );
        }
    }

    let facts = ModelFacts {
        window: Some(8192),
        accepted_prompt: Some(4000),
        ..ModelFacts::default()
    };
    two.put_model_facts("m", facts.clone()).await.unwrap();
    assert_eq!(one.model_facts("m").await.unwrap(), facts);
    let ttl = Duration::from_secs(30);
    assert!(one
        .try_lease("lease:conversation-1", "r1", ttl)
        .await
        .unwrap());
    assert!(!two
        .try_lease("lease:conversation-1", "r2", ttl)
        .await
        .unwrap());
    assert_eq!(
        two.lease_holder("lease:conversation-1")
            .await
            .unwrap()
            .as_deref(),
        Some("r1")
    );
    one.release_lease("lease:conversation-1", "r1")
        .await
        .unwrap();
    assert!(two
        .try_lease("lease:conversation-1", "r2", ttl)
        .await
        .unwrap());
    assert!(one.healthy() && two.healthy());
}

#[tokio::test]
async fn serves_through_a_master_outage_and_recovers_without_reopening() {
    let mut cluster = RedisCluster::start();
    let store = RedisStore::open(&cluster.url(), Duration::ZERO)
        .await
        .unwrap();
    let before = sample("a", 4, 1);
    store.put(&before).await.unwrap();

    cluster.stop(1);
    cluster.wait_until_down();
    let during: Vec<Checkpoint> = (0..6)
        .map(|i| sample(&format!("outage-{i}"), 9, 2))
        .collect();
    for checkpoint in &during {
        promptly(store.put(checkpoint)).await.unwrap();
        assert_eq!(
            *promptly(store.for_anchor(&checkpoint.anchor))
                .await
                .unwrap(),
            vec![checkpoint.clone()]
        );
    }
    let ttl = Duration::from_secs(30);
    assert!(promptly(store.try_lease("k", "one", ttl)).await.unwrap());
    assert!(
        !promptly(store.try_lease("k", "two", ttl)).await.unwrap(),
        "single flight locally"
    );
    assert!(!store.healthy());

    cluster.restart(1); // the same slots, empty
    until_healthy(&store).await;
    let other = RedisStore::open(&cluster.url(), Duration::ZERO)
        .await
        .unwrap();
    for checkpoint in &during {
        assert_eq!(
            *other.for_anchor(&checkpoint.anchor).await.unwrap(),
            vec![checkpoint.clone()],
            "outage writes are copied over"
        );
    }
    let after = sample("b", 7, 3);
    store.put(&after).await.unwrap();
    assert_eq!(*other.for_anchor("b").await.unwrap(), vec![after]);
    assert!(store.healthy() && other.healthy());
}
