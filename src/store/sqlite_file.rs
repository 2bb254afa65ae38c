//! The database file behind [`super::sqlite::SqliteStore`]: opening it, writing batches to it,
//! and noticing when the file has been removed underneath the process.
//!
//! The database uses a rollback journal, not a write-ahead log: the log's index is a
//! memory-mapped `-shm` file, and when that file cannot grow (a full disk, an unwritable file)
//! the process dies of SIGBUS. Checkpoints are written rarely and read from memory, so the
//! journal costs nothing that matters, and a restarting process may open the file while the old
//! one still drains.

use std::path::{Path, PathBuf};

use rusqlite::{params, Connection, OptionalExtension};

use super::{StoreError, MODEL_FACTS_ROWS};

pub(crate) fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

/// What identifies the file on disk: a new file at the same path is a different file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId {
    device: u64,
    inode: u64,
}

fn file_id(path: &Path) -> Option<FileId> {
    let metadata = std::fs::metadata(path).ok()?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        Some(FileId {
            device: metadata.dev(),
            inode: metadata.ino(),
        })
    }
    #[cfg(not(unix))]
    {
        let _ = metadata;
        Some(FileId {
            device: 0,
            inode: 0,
        })
    }
}

/// One write, kept until it is on disk.
#[derive(Debug, Clone)]
pub(crate) enum Write {
    /// A checkpoint, and the ids its conversation keeps (older ones are deleted).
    Checkpoint {
        id: String,
        anchor: String,
        covered: usize,
        created_ms: u64,
        body: String,
        keep: Vec<String>,
    },
    /// A model's facts, kept until `expires_ms` (ms since the Unix epoch).
    ModelFacts {
        model: String,
        body: String,
        expires_ms: i64,
    },
}

/// `expires_ms` of facts that never lapse.
pub(crate) const NEVER: i64 = i64::MAX;

/// The open database and the file it was opened on.
pub(crate) struct Database {
    path: PathBuf,
    connection: Connection,
    file: Option<FileId>,
}

impl Database {
    /// Opens (creating if needed) the database at `path`.
    pub(crate) fn open(path: &Path) -> Result<Database, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| unavailable(format!("{}: {e}", dir.display())))?;
        }
        let connection =
            Connection::open(path).map_err(|e| unavailable(format!("{}: {e}", path.display())))?;
        connection
            .execute_batch(
                "PRAGMA journal_mode = TRUNCATE;
                 PRAGMA synchronous = NORMAL;
                 CREATE TABLE IF NOT EXISTS checkpoints (
                     id TEXT PRIMARY KEY,
                     anchor TEXT NOT NULL,
                     covered INTEGER NOT NULL,
                     created_ms INTEGER NOT NULL,
                     body TEXT NOT NULL
                 );
                 CREATE INDEX IF NOT EXISTS checkpoints_by_anchor ON checkpoints (anchor, covered DESC, created_ms DESC);
                 CREATE TABLE IF NOT EXISTS model_facts (model TEXT PRIMARY KEY, body TEXT NOT NULL);
                 CREATE TABLE IF NOT EXISTS timeline_conversations (
                     id TEXT PRIMARY KEY,
                     last_ms INTEGER NOT NULL,
                     body TEXT NOT NULL
                 );
                 CREATE INDEX IF NOT EXISTS timeline_conversations_by_activity ON timeline_conversations (last_ms);
                 CREATE TABLE IF NOT EXISTS timeline_requests (
                     conversation TEXT NOT NULL,
                     seq INTEGER NOT NULL,
                     body TEXT NOT NULL,
                     PRIMARY KEY (conversation, seq)
                 );
                 CREATE TABLE IF NOT EXISTS secrets (name TEXT PRIMARY KEY, value TEXT NOT NULL);",
            )
            .map_err(|e| unavailable(format!("{}: {e}", path.display())))?;
        add_facts_expiry(&connection)
            .map_err(|e| unavailable(format!("{}: {e}", path.display())))?;
        Ok(Database {
            path: path.to_path_buf(),
            file: file_id(path),
            connection,
        })
    }

    pub(crate) fn connection(&self) -> &Connection {
        &self.connection
    }

    /// The connection for a transaction of its own, after putting the file back if it was
    /// removed.
    pub(crate) fn connection_mut(&mut self) -> Result<&mut Connection, StoreError> {
        self.restore_file()?;
        Ok(&mut self.connection)
    }

    /// Whether the file this database was opened on is still at its path.
    pub(crate) fn file_is_in_place(&self) -> bool {
        file_id(&self.path).is_some() && file_id(&self.path) == self.file
    }

    /// Puts the database back at its path after the file was removed: the open connection still
    /// reads the removed file, so everything in it is copied to a new file, which is then used.
    pub(crate) fn restore_file(&mut self) -> Result<(), StoreError> {
        if self.file_is_in_place() {
            return Ok(());
        }
        let target = self.path.to_string_lossy().into_owned();
        if file_id(&self.path).is_none() {
            self.connection
                .execute("VACUUM INTO ?1", params![target])
                .map_err(|e| unavailable(format!("restoring {target}: {e}")))?;
        }
        *self = Database::open(&self.path)?;
        tracing::warn!(path = %target, "The checkpoint database file had been removed; it has been written again.");
        Ok(())
    }

    /// Applies `writes` in one transaction, after putting the file back if it was removed.
    pub(crate) fn apply(&mut self, writes: &[Write]) -> Result<(), StoreError> {
        self.restore_file()?;
        let tx = self.connection.transaction().map_err(unavailable)?;
        for write in writes {
            match write {
                Write::Checkpoint {
                    id,
                    anchor,
                    covered,
                    created_ms,
                    body,
                    keep,
                } => {
                    tx.execute(
                        "INSERT OR REPLACE INTO checkpoints (id, anchor, covered, created_ms, body) VALUES (?1, ?2, ?3, ?4, ?5)",
                        params![id, anchor, *covered as i64, *created_ms as i64, body],
                    )
                    .map_err(unavailable)?;
                    // Drop what fell off the newest-N list.
                    let placeholders = vec!["?"; keep.len()].join(",");
                    let sql = format!(
                        "DELETE FROM checkpoints WHERE anchor = ? AND id NOT IN ({placeholders})"
                    );
                    let mut values: Vec<&dyn rusqlite::ToSql> = vec![anchor];
                    values.extend(keep.iter().map(|k| k as &dyn rusqlite::ToSql));
                    tx.execute(&sql, values.as_slice()).map_err(unavailable)?;
                }
                Write::ModelFacts {
                    model,
                    body,
                    expires_ms,
                } => {
                    tx.execute(
                        "INSERT OR REPLACE INTO model_facts (model, body, expires_ms) VALUES (?1, ?2, ?3)",
                        params![model, body, expires_ms],
                    )
                    .map_err(unavailable)?;
                }
            }
        }
        if writes.iter().any(|w| matches!(w, Write::ModelFacts { .. })) {
            prune_facts(&tx, MODEL_FACTS_ROWS).map_err(unavailable)?;
        }
        tx.commit().map_err(unavailable)
    }
}

/// Keeps `candidate` as the secret `name` unless one is kept already, and returns the kept one.
pub(crate) fn shared_secret(
    connection: &Connection,
    name: &str,
    candidate: &str,
) -> rusqlite::Result<String> {
    let inserted = connection.execute(
        "INSERT OR IGNORE INTO secrets (name, value) VALUES (?1, ?2)",
        params![name, candidate],
    );
    let kept = connection
        .query_row(
            "SELECT value FROM secrets WHERE name = ?1",
            params![name],
            |r| r.get::<_, String>(0),
        )
        .optional()?;
    match (kept, inserted) {
        (Some(kept), _) => Ok(kept),
        // Nothing kept, and the write failed (a read-only or full file): that failure.
        (None, Err(e)) => Err(e),
        (None, Ok(_)) => Err(rusqlite::Error::QueryReturnedNoRows),
    }
}

/// Gives `model_facts` its expiry column (files of earlier versions lack it). Their rows get 0,
/// so they are pruned: they were learned before overflow errors were checked.
fn add_facts_expiry(connection: &Connection) -> rusqlite::Result<()> {
    let has_column: bool = connection.query_row(
        "SELECT COUNT(*) FROM pragma_table_info('model_facts') WHERE name = 'expires_ms'",
        [],
        |r| r.get::<_, i64>(0).map(|n| n > 0),
    )?;
    if !has_column {
        connection.execute_batch(
            "ALTER TABLE model_facts ADD COLUMN expires_ms INTEGER NOT NULL DEFAULT 0;",
        )?;
    }
    connection.execute_batch(
        "CREATE INDEX IF NOT EXISTS model_facts_by_expiry ON model_facts (expires_ms);",
    )
}

/// Deletes the facts that have lapsed, then, beyond `max_rows`, those that lapse soonest: a
/// record's expiry is renewed each time it is saved, so these are the models least recently
/// learned about (model names are the client's choice; the file must not grow with them).
pub(crate) fn prune_facts(connection: &Connection, max_rows: usize) -> rusqlite::Result<usize> {
    let lapsed = connection.execute(
        "DELETE FROM model_facts WHERE expires_ms <= ?1",
        params![super::now_ms() as i64],
    )?;
    // A negative LIMIT means none in SQLite, hence the MAX.
    let beyond = connection.execute(
        "DELETE FROM model_facts WHERE model IN (
             SELECT model FROM model_facts ORDER BY expires_ms ASC
             LIMIT MAX(0, (SELECT COUNT(*) FROM model_facts) - ?1))",
        params![max_rows.min(i64::MAX as usize) as i64],
    )?;
    Ok(lapsed + beyond)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn models(db: &Database) -> Vec<String> {
        let mut stmt = db
            .connection()
            .prepare("SELECT model FROM model_facts ORDER BY model")
            .unwrap();
        let rows = stmt.query_map([], |r| r.get(0)).unwrap();
        rows.collect::<Result<_, _>>().unwrap()
    }

    fn facts(model: &str, expires_ms: i64) -> Write {
        Write::ModelFacts {
            model: model.into(),
            body: "{}".into(),
            expires_ms,
        }
    }

    #[test]
    fn facts_of_earlier_files_are_dropped_and_lapsed_facts_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        // A file of an earlier version: facts without an expiry, possibly learned from an echo.
        Connection::open(&path)
            .unwrap()
            .execute_batch(
                "CREATE TABLE model_facts (model TEXT PRIMARY KEY, body TEXT NOT NULL);
                 INSERT INTO model_facts VALUES ('old', '{\"window\":64,\"calibration\":null}');",
            )
            .unwrap();
        let mut db = Database::open(&path).unwrap();
        prune_facts(db.connection(), MODEL_FACTS_ROWS).unwrap();
        assert!(models(&db).is_empty(), "{:?}", models(&db));

        let now = super::super::now_ms() as i64;
        db.apply(&[
            facts("soon", now + 100),
            facts("later", now + 3_600_000),
            facts("kept", NEVER),
        ])
        .unwrap();
        assert_eq!(models(&db), ["kept", "later", "soon"]);
        std::thread::sleep(std::time::Duration::from_millis(150));
        // The next write of facts prunes what has lapsed.
        db.apply(&[facts("new", NEVER)]).unwrap();
        assert_eq!(models(&db), ["kept", "later", "new"]);
    }

    #[test]
    fn facts_beyond_the_row_cap_are_pruned_least_recently_saved_first() {
        let dir = tempfile::tempdir().unwrap();
        let mut db = Database::open(&dir.path().join("c.db")).unwrap();
        let now = super::super::now_ms() as i64;
        let names: Vec<String> = (0..MODEL_FACTS_ROWS + 50)
            .map(|i| format!("m{i:05}"))
            .collect();
        let writes: Vec<Write> = names
            .iter()
            .enumerate()
            .map(|(i, name)| facts(name, now + 3_600_000 + i as i64))
            .collect();
        db.apply(&writes).unwrap();
        let kept = models(&db);
        assert_eq!(kept.len(), MODEL_FACTS_ROWS);
        assert_eq!(kept[0], names[50], "the 50 saved longest ago went");
        // Saving one again renews it: the next to go is the oldest of the others.
        db.apply(&[
            facts(&names[50], now + 7_200_000),
            facts("new", now + 7_200_000),
        ])
        .unwrap();
        let kept = models(&db);
        assert_eq!(kept.len(), MODEL_FACTS_ROWS);
        assert!(kept.contains(&names[50]) && kept.contains(&"new".to_string()));
        assert!(!kept.contains(&names[51]));
    }
}
