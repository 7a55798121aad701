//! The store's typed errors.
//!
//! Every failure is a [`StoreError`] that says what went wrong, maps to a stable [`ErrorCode`]
//! and says whether trying again may help. Database errors keep the driver's own text.

use agentry_types::{ErrorCode, ErrorInfo};

/// A failure of a store operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The session (or other named thing) does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// The operation conflicts with the current state: a stale `expected_last_seq`, an id that
    /// already exists.
    #[error("conflict: {0}")]
    Conflict(String),
    /// The input was refused before reaching the database: a bad event kind, status, name,
    /// sequence number or URL.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The database driver failed (connection, query, constraint); the driver's text is kept.
    #[error("database error: {0}")]
    Database(#[source] sqlx::Error),
    /// SQLite's group-commit connection failed (see `sqlite_commit`); SQLite's text is kept.
    #[error("database error: {0}")]
    Sqlite(#[source] rusqlite::Error),
    /// The schema could not be brought up to date, or the database is newer than this build.
    #[error("schema migration failed: {0}")]
    Migration(String),
    /// A secret could not be encrypted or decrypted (for example: the key is not the one it was
    /// stored with), or the key file is unusable.
    #[error("secret encryption failed: {0}")]
    Crypto(String),
    /// A file operation failed (the home folder, the key file).
    #[error("{context}: {source}")]
    Io {
        /// What was being done, with the path.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The database holds a value this build cannot read (a malformed id or JSON document).
    #[error("corrupt stored data: {0}")]
    Corrupt(String),
    /// A write fenced by a run's lease came from a worker that no longer holds it.
    #[error("stale lease: {0}")]
    StaleLease(String),
}

impl StoreError {
    /// The stable error code.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::NotFound(_) => ErrorCode::NotFound,
            Self::Conflict(_) | Self::StaleLease(_) => ErrorCode::Conflict,
            Self::InvalidInput(_) => ErrorCode::InvalidRequest,
            _ if self.is_storage_full() => ErrorCode::StorageFull,
            Self::Database(error) if is_transient(error) => ErrorCode::Connection,
            Self::Sqlite(error) if is_busy(error) => ErrorCode::Connection,
            Self::Database(_) | Self::Sqlite(_) | Self::Io { .. } | Self::Corrupt(_) => {
                ErrorCode::Internal
            }
            Self::Migration(_) | Self::Crypto(_) => ErrorCode::Configuration,
        }
    }

    /// Whether the database had no room for the write: SQLite's `SQLITE_FULL`, PostgreSQL's
    /// `disk_full` (53100), or the file system's `ENOSPC` / `EDQUOT`. Nothing of the failed
    /// write is kept; the same write may succeed once there is room.
    pub fn is_storage_full(&self) -> bool {
        match self {
            Self::Sqlite(error) => {
                error.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull)
                    || matches!(error, rusqlite::Error::SqliteFailure(_, Some(message))
                        if message.contains("disk is full"))
            }
            Self::Database(sqlx::Error::Database(error)) => {
                // PostgreSQL's SQLSTATE, or SQLite's (extended) result code through sqlx.
                matches!(error.code().as_deref(), Some("53100" | "13"))
                    || error.message().contains("database or disk is full")
            }
            Self::Database(sqlx::Error::Io(error)) | Self::Io { source: error, .. } => {
                is_out_of_space(error)
            }
            _ => false,
        }
    }

    /// Whether the same operation may succeed if tried again unchanged.
    ///
    /// A [`StoreError::Conflict`] is not: the caller must read the current state first.
    pub fn is_retryable(&self) -> bool {
        if self.is_storage_full() {
            return true;
        }
        match self {
            Self::Database(error) => is_transient(error),
            Self::Sqlite(error) => is_busy(error),
            _ => false,
        }
    }

    /// The error as it leaves the process.
    pub fn info(&self) -> ErrorInfo {
        ErrorInfo {
            code: self.code(),
            message: self.to_string(),
            retryable: self.is_retryable(),
            status: None,
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }
}

/// The file system's "no space left" (`ENOSPC`) or "quota exceeded" (`EDQUOT`).
fn is_out_of_space(error: &std::io::Error) -> bool {
    error.kind() == std::io::ErrorKind::StorageFull
        || error.kind() == std::io::ErrorKind::QuotaExceeded
        || matches!(error.raw_os_error(), Some(28 | 122))
}

/// Connection-level failures that a later attempt may not hit.
fn is_transient(error: &sqlx::Error) -> bool {
    matches!(
        error,
        sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::WorkerCrashed
    )
}

/// SQLite's lock was held by another process past the busy timeout: a later try may get it.
fn is_busy(error: &rusqlite::Error) -> bool {
    matches!(
        error.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

impl From<rusqlite::Error> for StoreError {
    fn from(error: rusqlite::Error) -> Self {
        Self::Sqlite(error)
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(error: sqlx::Error) -> Self {
        Self::Database(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_retry_decisions() {
        assert_eq!(
            StoreError::NotFound("session x".into()).code(),
            ErrorCode::NotFound
        );
        assert_eq!(
            StoreError::InvalidInput("bad".into()).code(),
            ErrorCode::InvalidRequest
        );
        assert_eq!(
            StoreError::Conflict("stale".into()).code(),
            ErrorCode::Conflict
        );
        assert_eq!(
            StoreError::Crypto("wrong key".into()).code(),
            ErrorCode::Configuration
        );
        let timed_out = StoreError::from(sqlx::Error::PoolTimedOut);
        assert_eq!(timed_out.code(), ErrorCode::Connection);
        assert!(timed_out.is_retryable());
        let missing = StoreError::from(sqlx::Error::RowNotFound);
        assert_eq!(missing.code(), ErrorCode::Internal);
        assert!(!missing.is_retryable());
        assert!(!StoreError::Conflict("stale".into()).is_retryable());
        let full = StoreError::Sqlite(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(13),
            Some("database or disk is full".into()),
        ));
        assert!(full.is_storage_full());
        assert_eq!(full.code(), ErrorCode::StorageFull);
        assert!(full.is_retryable());
        let no_space = StoreError::io("writing", std::io::Error::from_raw_os_error(28));
        assert!(no_space.is_storage_full());
        assert!(!missing.is_storage_full());
        let info = StoreError::NotFound("session x".into()).info();
        assert_eq!(info.message, "not found: session x");
        assert!(!info.retryable);
    }
}
