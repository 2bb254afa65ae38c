use super::*;
use std::time::Instant;

#[tokio::test]
async fn meets_the_store_contract() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("sub/c.db"), Duration::ZERO).unwrap();
    super::super::contract::check(&store).await;
}

#[tokio::test]
async fn survives_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.db");
    let cp = super::super::contract::sample("a", 5, now_ms());
    {
        let store = SqliteStore::open(&path, Duration::from_secs(3600)).unwrap();
        store.put(&cp).await.unwrap();
        store
            .put_model_facts(
                "m",
                ModelFacts {
                    window: Some(2048),
                    ..ModelFacts::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(store.shared_secret("s", "kept").await.unwrap(), "kept");
    }
    let store = SqliteStore::open(&path, Duration::from_secs(3600)).unwrap();
    assert_eq!(store.shared_secret("s", "new").await.unwrap(), "kept");
    assert_eq!(store.for_anchor("a").await.unwrap()[0], cp);
    assert_eq!(store.get(&cp.id).await.unwrap(), Some(cp));
    assert_eq!(store.model_facts("m").await.unwrap().window, Some(2048));
}

#[tokio::test]
async fn expired_checkpoints_are_pruned() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.db");
    let old = super::super::contract::sample("a", 5, 1);
    SqliteStore::open(&path, Duration::ZERO)
        .unwrap()
        .put(&old)
        .await
        .unwrap();
    let store = SqliteStore::open(&path, Duration::from_secs(60)).unwrap();
    assert!(store.for_anchor("a").await.unwrap().is_empty());
}

/// Makes every later write that needs a new page fail as on a full disk (`SQLITE_FULL`).
fn fill_the_disk(store: &SqliteStore, full: bool) {
    let db = store.database.lock().unwrap();
    let pages: i64 = db
        .connection()
        .query_row("PRAGMA page_count", [], |r| r.get(0))
        .unwrap();
    let limit = if full { pages } else { 1 << 30 };
    db.connection()
        .query_row(&format!("PRAGMA max_page_count = {limit}"), [], |_| Ok(()))
        .unwrap();
}

fn large(anchor: &str, covered: usize) -> Checkpoint {
    let mut cp = super::super::contract::sample(anchor, covered, now_ms());
    cp.summary = "a long summary ".repeat(2_000);
    cp
}

#[tokio::test]
async fn a_full_disk_keeps_checkpoints_in_memory_and_reports_degraded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.db");
    let store = SqliteStore::open(&path, Duration::ZERO).unwrap();
    let errors = Counter::default();
    store.count_absorbed_errors(errors.clone());
    store.put(&large("a", 4)).await.unwrap();
    assert!(store.healthy());
    assert_eq!(errors.get(), 0);
    fill_the_disk(&store, true);
    let unsaved = large("b", 6);
    store.put(&unsaved).await.unwrap();
    assert!(!store.healthy(), "a failed write degrades the store");
    assert_eq!(errors.get(), 1, "and is counted, though put answered Ok");
    store.conversations.clear();
    assert_eq!(store.for_anchor("b").await.unwrap()[0], unsaved);
    assert_eq!(store.get(&unsaved.id).await.unwrap(), Some(unsaved.clone()));
    // Space again: the next write takes the pending one with it.
    fill_the_disk(&store, false);
    store.put(&large("c", 2)).await.unwrap();
    assert!(store.healthy());
    drop(store);
    let reopened = SqliteStore::open(&path, Duration::ZERO).unwrap();
    assert_eq!(reopened.for_anchor("b").await.unwrap()[0], unsaved);
}

#[tokio::test]
async fn an_unusable_shm_file_does_not_stop_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.db");
    // Not a file SQLite could map: the store must not depend on it.
    std::fs::create_dir(dir.path().join("c.db-shm")).unwrap();
    let store = SqliteStore::open(&path, Duration::ZERO).unwrap();
    let cp = large("a", 3);
    store.put(&cp).await.unwrap();
    assert!(store.healthy());
    store.conversations.clear();
    assert_eq!(store.for_anchor("a").await.unwrap()[0], cp);
}

#[tokio::test]
async fn a_removed_database_file_is_noticed_and_written_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.db");
    let store = SqliteStore::open(&path, Duration::ZERO).unwrap();
    let cp = large("a", 3);
    store.put(&cp).await.unwrap();
    assert!(store.healthy());
    std::fs::remove_file(&path).unwrap();
    store.health.last_check_ms.store(0, Ordering::SeqCst);
    assert!(!store.healthy(), "a removed file degrades the store");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !path.exists() || store.health.flushing.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "the file was not written again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    store.health.last_check_ms.store(0, Ordering::SeqCst);
    assert!(store.healthy(), "healthy again once the file is back");
    drop(store);
    let reopened = SqliteStore::open(&path, Duration::ZERO).unwrap();
    assert_eq!(reopened.for_anchor("a").await.unwrap()[0], cp);
}
