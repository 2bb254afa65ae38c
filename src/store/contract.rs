//! Behaviour every store must have, run against each implementation.
use super::*;

pub fn sample(anchor: &str, covered: usize, created_ms: u64) -> Checkpoint {
    Checkpoint {
        id: format!("{anchor}-{covered}-{created_ms}"),
        tenant: "t".into(),
        anchor: anchor.into(),
        covered,
        prefix_hash: format!("h{covered}"),
        pinned_user: None,
        truncations: vec![Truncation {
            index: covered + 1,
            keep_tokens: 10,
        }],
        summary: "## Goal\nship it".into(),
        files_read: vec!["src/a.rs".into()],
        files_modified: vec![],
        tokens_before: 1000,
        tokens_after: 200,
        created_ms,
        model: "m".into(),
        ahead_of_time: false,
        // Every store keeps what a checkpoint clears, as it keeps its summary.
        cleared: Some(Cleared {
            through_hash: format!("h{}", covered + 2),
            results: vec![ClearedUse {
                index: covered + 2,
                call_id: "call_1".into(),
                stub: "[result of read cleared to save context: 900 tokens]".into(),
                freed_tokens: 880,
            }],
        }),
    }
}

pub async fn check(store: &dyn CheckpointStore) {
    assert!(store.for_anchor("a").await.unwrap().is_empty());
    store.put(&sample("a", 4, 1)).await.unwrap();
    store.put(&sample("a", 9, 2)).await.unwrap();
    store.put(&sample("b", 3, 3)).await.unwrap();
    let list = store.for_anchor("a").await.unwrap();
    assert_eq!(
        list.iter().map(|c| c.covered).collect::<Vec<_>>(),
        vec![9, 4]
    );
    assert_eq!(store.get("a-4-1").await.unwrap(), Some(sample("a", 4, 1)));
    assert_eq!(store.get("nope").await.unwrap(), None);
    for i in 0..20 {
        store.put(&sample("c", i, 100 + i as u64)).await.unwrap();
    }
    assert_eq!(
        store.for_anchor("c").await.unwrap().len(),
        CHECKPOINTS_PER_CONVERSATION
    );

    assert_eq!(store.model_facts("m").await.unwrap(), ModelFacts::default());
    let facts = ModelFacts {
        window: Some(4096),
        window_learned_ms: Some(now_ms()),
        window_bounds: vec![WindowBound {
            tenant: 3,
            tokens: 2000,
            at_ms: now_ms(),
        }],
        observations: vec![Observation {
            counted: 100,
            reported: 120,
            tenant: 3,
            at_ms: now_ms(),
        }],
        ..ModelFacts::default()
    };
    store.put_model_facts("m", facts.clone()).await.unwrap();
    assert_eq!(store.model_facts("m").await.unwrap(), facts);
    let lapsed = ModelFacts {
        expires_ms: Some(now_ms() - 1),
        ..facts
    };
    store.put_model_facts("m", lapsed).await.unwrap();
    assert_eq!(
        store.model_facts("m").await.unwrap(),
        ModelFacts::default(),
        "lapsed facts are forgotten"
    );

    // Long enough that no lease below lapses between two calls, however loaded the machine;
    // expiry is checked with a short one of its own.
    let ttl = Duration::from_secs(60);
    assert!(store.try_lease("k", "one", ttl).await.unwrap());
    assert!(!store.try_lease("k", "two", ttl).await.unwrap());
    store.release_lease("k", "two").await.unwrap();
    assert!(
        !store.try_lease("k", "two", ttl).await.unwrap(),
        "only the holder releases"
    );
    assert_eq!(
        store.lease_holder("k").await.unwrap().as_deref(),
        Some("one")
    );
    store.release_lease("k", "one").await.unwrap();
    assert_eq!(store.lease_holder("k").await.unwrap(), None);
    assert!(store
        .try_lease("k", "two", Duration::from_millis(300))
        .await
        .unwrap());
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        store.try_lease("k", "three", ttl).await.unwrap(),
        "leases expire"
    );
    assert_eq!(store.shared_secret("s", "first").await.unwrap(), "first");
    assert_eq!(
        store.shared_secret("s", "second").await.unwrap(),
        "first",
        "the first secret kept stays"
    );
    assert_eq!(store.shared_secret("t", "other").await.unwrap(), "other");
    check_timelines(store).await;
}

pub fn row(at_ms: u64, checkpoint: Option<&str>) -> RequestRow {
    RequestRow {
        at_ms,
        path: "/v1/chat/completions".into(),
        model: "m".into(),
        status: 200,
        tokens_sent: 1000 + at_ms,
        tokens_forwarded: 500,
        window: 4000,
        compacted: checkpoint.is_some(),
        summarized: false,
        ahead_of_time: false,
        checkpoint: checkpoint.map(str::to_string),
        summary_ms: 0,
        upstream_ms: 3,
        compaction_status: None,
    }
}

/// Rows are kept newest within their bound, conversations within theirs (the least recently
/// active forgotten whole), compactions counted where the checkpoint changes.
async fn check_timelines(store: &dyn CheckpointStore) {
    let bounds = TimelineBounds {
        requests_per_conversation: 3,
        conversations: 2,
        conversations_per_tenant: 2,
    };
    let alice = Owner {
        tenant: "ta".into(),
        tenant_name: Some("alice".into()),
    };
    let bob = Owner {
        tenant: "tb".into(),
        tenant_name: None,
    };
    assert!(store.timeline("x").await.unwrap().is_none());
    let checkpoints = [None, None, Some("c1"), Some("c1"), Some("c2")];
    for (i, cp) in checkpoints.into_iter().enumerate() {
        let row = row(10 + i as u64, cp);
        store
            .record_request("x", &alice, &row, bounds)
            .await
            .unwrap();
    }
    store
        .record_request("y", &bob, &row(20, None), bounds)
        .await
        .unwrap();
    let (entry, rows) = store.timeline("x").await.unwrap().unwrap();
    assert_eq!(entry.owner, alice);
    assert_eq!((entry.first_ms, entry.last_ms), (10, 14));
    assert_eq!((entry.requests, entry.compactions), (5, 2));
    assert_eq!(entry.last, row(14, Some("c2")));
    assert_eq!(
        rows.iter().map(|r| r.at_ms).collect::<Vec<_>>(),
        vec![12, 13, 14],
        "the newest rows, oldest first"
    );
    let listed = store.conversations().await.unwrap();
    assert_eq!(
        listed.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(),
        vec!["y", "x"]
    );
    assert_eq!(listed[0].owner, bob);
    store
        .record_request("z", &bob, &row(30, None), bounds)
        .await
        .unwrap();
    let listed = store.conversations().await.unwrap();
    assert_eq!(
        listed.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(),
        vec!["z", "y"],
        "the least recently active conversation is forgotten"
    );
    assert!(store.timeline("x").await.unwrap().is_none());

    // A busy tenant is trimmed to its own bound before it pushes out another's history.
    let bounds = TimelineBounds {
        conversations: 4,
        ..bounds
    };
    let (carol, dave) = (
        Owner {
            tenant: "tc".into(),
            tenant_name: None,
        },
        Owner {
            tenant: "td".into(),
            tenant_name: None,
        },
    );
    let record = |id: &'static str, owner: &Owner, at: u64| {
        let (owner, row) = (owner.clone(), row(at, None));
        async move {
            store
                .record_request(id, &owner, &row, bounds)
                .await
                .unwrap()
        }
    };
    record("d1", &dave, 39).await;
    for (i, id) in ["c1", "c2", "c3", "c4"].into_iter().enumerate() {
        record(id, &carol, 40 + i as u64).await;
    }
    let listed = store.conversations().await.unwrap();
    assert_eq!(
        listed.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(),
        vec!["c4", "c3", "d1", "z"],
        "carol keeps her newest two; dave's older one stays"
    );
    assert!(store.timeline("c1").await.unwrap().is_none());
    assert!(store.timeline("c2").await.unwrap().is_none());

    // Replicas record off the request's path: a row served earlier may arrive after a newer
    // one. It is counted, but the newest row stays the last, and nothing is counted twice.
    for (at, cp) in [(60, None), (62, Some("c3")), (61, None)] {
        store
            .record_request("late", &alice, &row(at, cp), bounds)
            .await
            .unwrap();
    }
    let (entry, _) = store.timeline("late").await.unwrap().unwrap();
    assert_eq!((entry.first_ms, entry.last_ms), (60, 62));
    assert_eq!((entry.requests, entry.compactions), (3, 1));
    assert_eq!(entry.last, row(62, Some("c3")));
}
