//! Long-term memory: short statements (facts, preferences, decisions) kept per agent, and per
//! user when one is named, de-duplicated and searchable with each backend's full-text index
//! (SQLite FTS5 with Porter stemming; PostgreSQL `tsvector` with English stemming).
//!
//! De-duplication folds case, runs of white space and final punctuation: remembering "Alice
//! prefers tea." twice, or "alice  prefers tea", keeps one memory and refreshes its time.

use serde::{Deserialize, Serialize};

use crate::db::{Dialect, RowExt, from_db, to_db, with_reader, with_writer};
use crate::model::{now_millis, validate_name};
use crate::{SessionId, Store, StoreError};

/// The longest memory text, in characters.
pub const MAX_MEMORY_CHARS: usize = 2_000;

/// The most memories one query returns.
pub const MAX_MEMORY_LIMIT: usize = 1_000;

/// What a memory records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryKind {
    /// Something true about the user, the project or the world.
    Fact,
    /// How someone likes things done.
    Preference,
    /// Something decided.
    Decision,
}

impl MemoryKind {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fact => "fact",
            Self::Preference => "preference",
            Self::Decision => "decision",
        }
    }

    fn parse(text: &str) -> Result<Self, StoreError> {
        match text {
            "fact" => Ok(Self::Fact),
            "preference" => Ok(Self::Preference),
            "decision" => Ok(Self::Decision),
            other => Err(StoreError::Corrupt(format!(
                "unknown memory kind {other:?}"
            ))),
        }
    }
}

/// Whose memory it is: an agent's, and optionally one user's of that agent.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MemoryScope {
    /// The agent (a configuration name).
    pub agent: String,
    /// The user, when the memory is about one user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

impl MemoryScope {
    /// The agent's own memories.
    pub fn agent(agent: impl Into<String>) -> Self {
        Self {
            agent: agent.into(),
            user: None,
        }
    }

    /// One user's memories with `agent`.
    pub fn user(agent: impl Into<String>, user: impl Into<String>) -> Self {
        Self {
            agent: agent.into(),
            user: Some(user.into()),
        }
    }

    fn validate(&self) -> Result<(), StoreError> {
        validate_name("agent", &self.agent)?;
        if let Some(user) = &self.user {
            // A name, or a key's end user `<key id>:<name>`.
            match user.split_once(':') {
                Some((key, name)) => {
                    validate_name("key id", key)?;
                    validate_name("user", name)?;
                }
                None => validate_name("user", user)?,
            }
        }
        Ok(())
    }

    fn user_column(&self) -> &str {
        self.user.as_deref().unwrap_or("")
    }
}

/// A memory to store.
#[derive(Debug, Clone, PartialEq)]
pub struct NewMemory {
    /// Whose.
    pub scope: MemoryScope,
    /// What it records.
    pub kind: MemoryKind,
    /// The statement (1 to [`MAX_MEMORY_CHARS`] characters).
    pub text: String,
    /// The session it was learnt in.
    pub source_session: Option<SessionId>,
}

/// A stored memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryRecord {
    /// Its id.
    pub id: u64,
    /// Whose.
    pub scope: MemoryScope,
    /// What it records.
    pub kind: MemoryKind,
    /// The statement.
    pub text: String,
    /// The session it was learnt in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_session: Option<SessionId>,
    /// When first stored (Unix ms).
    pub created_at: u64,
    /// When last stored again or edited (Unix ms).
    pub updated_at: u64,
}

/// The folded form two memories are compared by.
pub fn normalize_memory(text: &str) -> String {
    let folded = text
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase();
    folded
        .trim_end_matches(['.', '!', '?', ';', ',', ':'])
        .trim()
        .to_owned()
}

fn checked_text(text: &str) -> Result<String, StoreError> {
    let text = text.trim();
    if text.is_empty() || text.chars().count() > MAX_MEMORY_CHARS {
        return Err(StoreError::InvalidInput(format!(
            "a memory has 1 to {MAX_MEMORY_CHARS} characters"
        )));
    }
    if text.contains('\0') {
        return Err(StoreError::InvalidInput(
            "a memory may not contain NUL".into(),
        ));
    }
    Ok(text.to_owned())
}

/// The words of a search query, each made safe for both full-text syntaxes (letters and
/// digits only), at most 32.
fn query_words(query: &str) -> Vec<String> {
    query
        .split(|c: char| !c.is_alphanumeric())
        .filter(|word| !word.is_empty())
        .take(32)
        .map(str::to_lowercase)
        .collect()
}

/// The columns a memory is read from, for `concat!` (sqlx wants static SQL).
macro_rules! columns {
    () => {
        "id, agent, user_id, kind, text, source_session, created_at, updated_at"
    };
}

impl Dialect {
    fn memory_search_sql(self) -> &'static str {
        match self {
            // bm25 is lower for better matches.
            Self::Sqlite => {
                "SELECT m.id, m.agent, m.user_id, m.kind, m.text, m.source_session, \
                 m.created_at, m.updated_at FROM memories_fts f \
                 JOIN memories m ON m.id = f.rowid \
                 WHERE memories_fts MATCH $1 AND m.agent = $2 AND m.user_id = $3 \
                 ORDER BY bm25(memories_fts), m.updated_at DESC LIMIT CAST($4 AS BIGINT)"
            }
            Self::Postgres => {
                "SELECT id, agent, user_id, kind, text, source_session, created_at, updated_at \
                 FROM memories WHERE search @@ to_tsquery('english', $1) \
                 AND agent = $2 AND user_id = $3 \
                 ORDER BY ts_rank(search, to_tsquery('english', $1)) DESC, updated_at DESC \
                 LIMIT CAST($4 AS BIGINT)"
            }
        }
    }

    fn memory_query(self, words: &[String]) -> String {
        match self {
            // Each word a quoted FTS5 string; any may match.
            Self::Sqlite => words
                .iter()
                .map(|w| format!("\"{w}\""))
                .collect::<Vec<_>>()
                .join(" OR "),
            Self::Postgres => words.join(" | "),
        }
    }
}

macro_rules! memory_from_row {
    ($row:expr) => {{
        let row = $row;
        let user = row.text("user_id")?;
        Ok::<MemoryRecord, StoreError>(MemoryRecord {
            id: from_db(row.int("id")?),
            scope: MemoryScope {
                agent: row.text("agent")?,
                user: (!user.is_empty()).then_some(user),
            },
            kind: MemoryKind::parse(&row.text("kind")?)?,
            text: row.text("text")?,
            source_session: row
                .opt_text("source_session")?
                .and_then(|id| id.parse().ok()),
            created_at: from_db(row.int("created_at")?),
            updated_at: from_db(row.int("updated_at")?),
        })
    }};
}

impl Store {
    /// Stores a memory, or refreshes the one already saying the same thing in that scope.
    /// Returns the memory and whether it is new.
    pub async fn remember(&self, memory: NewMemory) -> Result<(MemoryRecord, bool), StoreError> {
        memory.scope.validate()?;
        let text = checked_text(&memory.text)?;
        let normalized = normalize_memory(&text);
        let now = to_db(now_millis());
        let source = memory.source_session.map(|id| id.to_string());
        let (record, created) = with_writer!(self, |pool, d| {
            // `created_at = updated_at` tells a fresh row from a refreshed one.
            let row = sqlx::query(concat!(
                "INSERT INTO memories (agent, user_id, kind, text, normalized, source_session, \
                 created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $7) \
                 ON CONFLICT (agent, user_id, normalized) DO UPDATE \
                 SET updated_at = excluded.updated_at + 1, kind = excluded.kind \
                 RETURNING ",
                columns!()
            ))
            .bind(&memory.scope.agent)
            .bind(memory.scope.user_column())
            .bind(memory.kind.as_str())
            .bind(&text)
            .bind(&normalized)
            .bind(&source)
            .bind(now)
            .fetch_one(pool)
            .await?;
            let record = memory_from_row!(&row)?;
            let created = record.created_at == record.updated_at;
            (record, created)
        });
        Ok((record, created))
    }

    /// The memory `id`, if stored.
    pub async fn memory(&self, id: u64) -> Result<Option<MemoryRecord>, StoreError> {
        with_reader!(self, |pool, d| {
            sqlx::query(concat!(
                "SELECT ",
                columns!(),
                " FROM memories WHERE id = $1"
            ))
            .bind(to_db(id))
            .fetch_optional(pool)
            .await?
            .map(|row| memory_from_row!(&row))
            .transpose()
        })
    }

    /// A scope's memories, most recently stored first.
    pub async fn memories(
        &self,
        scope: &MemoryScope,
        limit: usize,
    ) -> Result<Vec<MemoryRecord>, StoreError> {
        scope.validate()?;
        let limit = limit.clamp(1, MAX_MEMORY_LIMIT);
        with_reader!(self, |pool, d| {
            sqlx::query(concat!(
                "SELECT ",
                columns!(),
                " FROM memories WHERE agent = $1 AND user_id = $2 \
                 ORDER BY updated_at DESC, id DESC LIMIT CAST($3 AS BIGINT)"
            ))
            .bind(&scope.agent)
            .bind(scope.user_column())
            .bind(to_db(limit as u64))
            .fetch_all(pool)
            .await?
            .iter()
            .map(|row| memory_from_row!(row))
            .collect()
        })
    }

    /// A scope's memories matching any word of `query` (stemmed), best matches first.
    pub async fn search_memories(
        &self,
        scope: &MemoryScope,
        query: &str,
        limit: usize,
    ) -> Result<Vec<MemoryRecord>, StoreError> {
        scope.validate()?;
        let words = query_words(query);
        if words.is_empty() {
            return Err(StoreError::InvalidInput(
                "a memory search needs at least one word".into(),
            ));
        }
        let limit = limit.clamp(1, MAX_MEMORY_LIMIT);
        with_reader!(self, |pool, d| {
            sqlx::query(d.memory_search_sql())
                .bind(d.memory_query(&words))
                .bind(&scope.agent)
                .bind(scope.user_column())
                .bind(to_db(limit as u64))
                .fetch_all(pool)
                .await?
                .iter()
                .map(|row| memory_from_row!(row))
                .collect()
        })
    }

    /// Changes a memory's text and kind. Fails with `InvalidInput` when its scope already has
    /// a memory saying the new text; `Ok(None)` when there is no memory `id`.
    pub async fn update_memory(
        &self,
        id: u64,
        kind: MemoryKind,
        text: &str,
    ) -> Result<Option<MemoryRecord>, StoreError> {
        let text = checked_text(text)?;
        let normalized = normalize_memory(&text);
        let now = to_db(now_millis());
        with_writer!(self, |pool, d| {
            let result = sqlx::query(concat!(
                "UPDATE memories SET kind = $2, text = $3, normalized = $4, updated_at = $5 \
                 WHERE id = $1 RETURNING ",
                columns!()
            ))
            .bind(to_db(id))
            .bind(kind.as_str())
            .bind(&text)
            .bind(&normalized)
            .bind(now)
            .fetch_optional(pool)
            .await;
            match result {
                Ok(row) => row.map(|row| memory_from_row!(&row)).transpose(),
                Err(sqlx::Error::Database(error)) if error.is_unique_violation() => Err(
                    StoreError::InvalidInput("another memory of this scope says the same".into()),
                ),
                Err(error) => Err(error.into()),
            }
        })
    }

    /// Deletes a memory; `false` if there was none.
    pub async fn delete_memory(&self, id: u64) -> Result<bool, StoreError> {
        let deleted = with_writer!(self, |pool, d| {
            sqlx::query("DELETE FROM memories WHERE id = $1")
                .bind(to_db(id))
                .execute(pool)
                .await?
                .rows_affected()
        });
        Ok(deleted > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalisation_folds_case_space_and_final_punctuation() {
        assert_eq!(
            normalize_memory("  Alice  prefers\tTea. "),
            "alice prefers tea"
        );
        assert_eq!(normalize_memory("Ship it!?"), "ship it");
        assert_ne!(normalize_memory("v1.2"), normalize_memory("v12"));
    }

    #[test]
    fn query_words_are_safe_for_both_syntaxes() {
        assert_eq!(
            query_words("tea\" OR x:* & !(drop)"),
            ["tea", "or", "x", "drop"]
        );
        assert_eq!(
            Dialect::Sqlite.memory_query(&query_words("a b")),
            "\"a\" OR \"b\""
        );
        assert_eq!(Dialect::Postgres.memory_query(&query_words("a b")), "a | b");
        assert!(query_words("  ?! ").is_empty());
    }
}
