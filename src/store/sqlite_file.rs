//! The database file behind [`super::sqlite::SqliteStore`]: opening it, writing batches to it,
//! and noticing when the file has been removed underneath the process.
//!
//! The database uses a rollback journal, not a write-ahead log: the log's index is a
//! memory-mapped `-shm` file, and when that file cannot grow (a full disk, an unwritable file)
//! the process dies of SIGBUS. Checkpoints are written rarely and read from memory, so the
//! journal costs nothing that matters, and a restarting process may open the file while the old
//! one still drains.

use std::path::{Path, PathBuf};

use rusqlite::{params, Connection};

use super::StoreError;

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
    ModelFacts {
        model: String,
        body: String,
    },
}

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
                 CREATE TABLE IF NOT EXISTS model_facts (model TEXT PRIMARY KEY, body TEXT NOT NULL);",
            )
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
                Write::ModelFacts { model, body } => {
                    tx.execute(
                        "INSERT OR REPLACE INTO model_facts (model, body) VALUES (?1, ?2)",
                        params![model, body],
                    )
                    .map_err(unavailable)?;
                }
            }
        }
        tx.commit().map_err(unavailable)
    }
}
