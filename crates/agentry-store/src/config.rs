//! Configuration documents (models, tools, MCP servers, skills, templates, agents) and secrets.
//!
//! Configuration values are JSON documents the store keeps as they are. Secrets are sealed with
//! the store's [`SecretKey`](crate::SecretKey) before they reach the database; only
//! [`Store::reveal_secret`] returns a value, and listing shows a masked form.

use crate::db::{RowExt, from_db, in_write_tx, to_db, with_reader, with_writer};
use crate::model::{now_millis, validate_name};
use crate::secret::{OpenedSecret, mask};
use crate::store::{from_json_text, to_json_text};
use crate::{ConfigKind, ConfigReplaced, SecretInfo, Store, StoreError};

/// Stores a configuration (`$1` kind, `$2` name, `$3` value, `$4` now), replacing the one of
/// that name.
pub(crate) const PUT_CONFIG_SQL: &str = "INSERT INTO config (kind, name, value, updated_at, \
     created_seq) VALUES ($1, $2, $3, $4, (SELECT COALESCE(MAX(created_seq), 0) + 1 FROM config)) \
     ON CONFLICT (kind, name) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at";

impl Store {
    /// Stores `value` as the configuration `name` of `kind`, replacing what was there (which
    /// keeps its place in [`Store::list_config_registered`]). Names have 1 to 64 characters of
    /// `A-Z a-z 0-9 _ . -`.
    pub async fn put_config(
        &self,
        kind: ConfigKind,
        name: &str,
        value: &serde_json::Value,
    ) -> Result<(), StoreError> {
        validate_name("configuration", name)?;
        let text = to_json_text(value)?;
        let now = to_db(now_millis());
        with_writer!(self, |pool, d| {
            sqlx::query(PUT_CONFIG_SQL)
                .bind(kind.as_str())
                .bind(name)
                .bind(&text)
                .bind(now)
                .execute(pool)
                .await?;
        });
        Ok(())
    }

    /// Stores `value` as the new configuration `name` of `kind`, unless one is stored under that
    /// name already: `false` then, and nothing is written. The check and the write are one
    /// statement, so two writers racing for a name cannot both win.
    pub async fn insert_config(
        &self,
        kind: ConfigKind,
        name: &str,
        value: &serde_json::Value,
    ) -> Result<bool, StoreError> {
        validate_name("configuration", name)?;
        let text = to_json_text(value)?;
        let now = to_db(now_millis());
        let inserted = with_writer!(self, |pool, d| {
            sqlx::query(
                "INSERT INTO config (kind, name, value, updated_at, created_seq) \
                 VALUES ($1, $2, $3, $4, (SELECT COALESCE(MAX(created_seq), 0) + 1 FROM config)) \
                 ON CONFLICT (kind, name) DO NOTHING",
            )
            .bind(kind.as_str())
            .bind(name)
            .bind(&text)
            .bind(now)
            .execute(pool)
            .await?
            .rows_affected()
        });
        Ok(inserted > 0)
    }

    /// Replaces the stored configuration `name` of `kind` with `value`, stored under `new_name`
    /// (the same name, or a free one: a rename keeps its place in
    /// [`Store::list_config_registered`]). One transaction: nothing is written unless the
    /// outcome is [`ConfigReplaced::Replaced`].
    pub async fn replace_config(
        &self,
        kind: ConfigKind,
        name: &str,
        new_name: &str,
        value: &serde_json::Value,
    ) -> Result<ConfigReplaced, StoreError> {
        validate_name("configuration", name)?;
        validate_name("configuration", new_name)?;
        let text = to_json_text(value)?;
        let now = to_db(now_millis());
        in_write_tx!(self, |tx, d| {
            let exists = |name: &str| {
                sqlx::query("SELECT 1 FROM config WHERE kind = $1 AND name = $2")
                    .bind(kind.as_str())
                    .bind(name.to_owned())
            };
            if exists(name).fetch_optional(&mut *tx).await?.is_none() {
                return Ok(ConfigReplaced::Missing);
            }
            if new_name != name && exists(new_name).fetch_optional(&mut *tx).await?.is_some() {
                return Ok(ConfigReplaced::NameTaken);
            }
            sqlx::query(
                "UPDATE config SET name = $3, value = $4, updated_at = $5 \
                 WHERE kind = $1 AND name = $2",
            )
            .bind(kind.as_str())
            .bind(name)
            .bind(new_name)
            .bind(&text)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        });
        Ok(ConfigReplaced::Replaced)
    }

    /// The configuration `name` of `kind`, if stored.
    pub async fn config(
        &self,
        kind: ConfigKind,
        name: &str,
    ) -> Result<Option<serde_json::Value>, StoreError> {
        validate_name("configuration", name)?;
        let text = with_reader!(self, |pool, d| {
            sqlx::query("SELECT value FROM config WHERE kind = $1 AND name = $2")
                .bind(kind.as_str())
                .bind(name)
                .fetch_optional(pool)
                .await?
                .map(|row| row.text("value"))
                .transpose()?
        });
        text.as_deref().map(from_json_text).transpose()
    }

    /// Every configuration of `kind`, by name.
    pub async fn list_config(
        &self,
        kind: ConfigKind,
    ) -> Result<Vec<(String, serde_json::Value)>, StoreError> {
        with_reader!(self, |pool, d| {
            sqlx::query("SELECT name, value FROM config WHERE kind = $1 ORDER BY name")
                .bind(kind.as_str())
                .fetch_all(pool)
                .await?
                .iter()
                .map(|row| Ok((row.text("name")?, from_json_text(&row.text("value")?)?)))
                .collect()
        })
    }

    /// Every configuration of `kind`, in the order they were first stored (replacing one keeps
    /// its place; deleting and storing it again moves it to the end).
    pub async fn list_config_registered(
        &self,
        kind: ConfigKind,
    ) -> Result<Vec<(String, serde_json::Value)>, StoreError> {
        with_reader!(self, |pool, d| {
            sqlx::query("SELECT name, value FROM config WHERE kind = $1 ORDER BY created_seq, name")
                .bind(kind.as_str())
                .fetch_all(pool)
                .await?
                .iter()
                .map(|row| Ok((row.text("name")?, from_json_text(&row.text("value")?)?)))
                .collect()
        })
    }

    /// Deletes the configuration `name` of `kind`; `false` if there was none.
    pub async fn delete_config(&self, kind: ConfigKind, name: &str) -> Result<bool, StoreError> {
        validate_name("configuration", name)?;
        let deleted = with_writer!(self, |pool, d| {
            sqlx::query("DELETE FROM config WHERE kind = $1 AND name = $2")
                .bind(kind.as_str())
                .bind(name)
                .execute(pool)
                .await?
                .rows_affected()
        });
        Ok(deleted > 0)
    }

    // --- secrets ---

    /// Stores the secret `name` (1 to 64 characters of `A-Z a-z 0-9 _ . -`), encrypted,
    /// replacing what was there. The value must not be empty.
    pub async fn put_secret(&self, name: &str, value: &str) -> Result<(), StoreError> {
        self.put_sealed_secret(name, value, None).await
    }

    /// Stores the secret `name` like [`Store::put_secret`], bound to `hosts`: the list is sealed
    /// with the value, so it changes only when the value is written again. The store keeps the
    /// list as given; the application checks and matches it.
    pub async fn put_bound_secret(
        &self,
        name: &str,
        value: &str,
        hosts: &[String],
    ) -> Result<(), StoreError> {
        self.put_sealed_secret(name, value, Some(hosts)).await
    }

    async fn put_sealed_secret(
        &self,
        name: &str,
        value: &str,
        hosts: Option<&[String]>,
    ) -> Result<(), StoreError> {
        validate_name("secret", name)?;
        if value.is_empty() {
            return Err(StoreError::InvalidInput(format!(
                "secret {name:?} needs a value"
            )));
        }
        let sealed = self.inner.key.seal(name, value, hosts)?;
        let now = to_db(now_millis());
        with_writer!(self, |pool, d| {
            sqlx::query(
                "INSERT INTO secrets (name, sealed, updated_at) VALUES ($1, $2, $3) \
                 ON CONFLICT (name) DO UPDATE \
                 SET sealed = excluded.sealed, updated_at = excluded.updated_at",
            )
            .bind(name)
            .bind(&sealed)
            .bind(now)
            .execute(pool)
            .await?;
        });
        Ok(())
    }

    /// The secret's value, decrypted. For wiring it into a provider or tool inside the process
    /// only: never return it to a client. A key other than the one it was stored with is
    /// [`StoreError::Crypto`].
    pub async fn reveal_secret(&self, name: &str) -> Result<Option<String>, StoreError> {
        validate_name("secret", name)?;
        let sealed = with_reader!(self, |pool, d| {
            sqlx::query("SELECT sealed FROM secrets WHERE name = $1")
                .bind(name)
                .fetch_optional(pool)
                .await?
                .map(|row| row.blob("sealed"))
                .transpose()?
        });
        sealed
            .map(|sealed| Ok(self.inner.key.open(name, &sealed)?.value))
            .transpose()
    }

    /// Every secret, decrypted, with the hosts it is bound to: for wiring them into providers
    /// and tools inside the process only, never for a client.
    pub async fn reveal_secrets(&self) -> Result<Vec<(String, OpenedSecret)>, StoreError> {
        self.sealed_secrets()
            .await?
            .into_iter()
            .map(|(name, sealed, _)| {
                let opened = self.inner.key.open(&name, &sealed)?;
                Ok((name, opened))
            })
            .collect()
    }

    async fn sealed_secrets(&self) -> Result<Vec<(String, Vec<u8>, i64)>, StoreError> {
        Ok(with_reader!(self, |pool, d| {
            sqlx::query("SELECT name, sealed, updated_at FROM secrets ORDER BY name")
                .fetch_all(pool)
                .await?
                .iter()
                .map(|row| {
                    Ok((
                        row.text("name")?,
                        row.blob("sealed")?,
                        row.int("updated_at")?,
                    ))
                })
                .collect::<Result<Vec<_>, StoreError>>()?
        }))
    }

    /// Every secret by name, with its value masked.
    pub async fn list_secrets(&self) -> Result<Vec<SecretInfo>, StoreError> {
        self.sealed_secrets()
            .await?
            .into_iter()
            .map(|(name, sealed, updated_at)| {
                let opened = self.inner.key.open(&name, &sealed)?;
                Ok(SecretInfo {
                    masked: mask(&opened.value),
                    hosts: opened.hosts,
                    name,
                    updated_at: from_db(updated_at),
                })
            })
            .collect()
    }

    /// A 32-byte key for `purpose` (say `"cluster-relay"`), derived from the secret key: the
    /// same on every node that shares the key file, never stored, never the key itself.
    pub fn derived_key(&self, purpose: &str) -> Result<[u8; 32], StoreError> {
        self.inner.key.derive(purpose)
    }

    /// Deletes the secret; `false` if there was none.
    pub async fn delete_secret(&self, name: &str) -> Result<bool, StoreError> {
        validate_name("secret", name)?;
        let deleted = with_writer!(self, |pool, d| {
            sqlx::query("DELETE FROM secrets WHERE name = $1")
                .bind(name)
                .execute(pool)
                .await?
                .rows_affected()
        });
        Ok(deleted > 0)
    }
}
