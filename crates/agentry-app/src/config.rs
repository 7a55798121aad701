//! Configuration documents: one typed repository ([`ConfigRepo`]) for every kind the store
//! keeps (models, tools, templates, agents, MCP servers, API keys), the checks every saved name
//! passes.
//!
//! Uniqueness is the store's: a create is one insert-if-absent statement, a replace (or rename)
//! one transaction, so two writers — two requests, the CLI and a server, two nodes — cannot
//! both win a name, and no lock is held in the process.

use std::marker::PhantomData;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use agentry_mcp::McpServerConfig;
use agentry_store::{ConfigKind, ConfigReplaced, Store};
use agentry_tools::ToolDefinition;

use crate::error::AppError;

/// A kind of configuration document: how the store files it and what people call it.
pub trait ConfigDoc: Serialize + DeserializeOwned + Send + Sync {
    /// The store's kind.
    const KIND: ConfigKind;
    /// Its name in messages (`model`, `tool`, …).
    const NOUN: &'static str;
}

impl ConfigDoc for ToolDefinition {
    const KIND: ConfigKind = ConfigKind::Tool;
    const NOUN: &'static str = "tool";
}

impl ConfigDoc for McpServerConfig {
    const KIND: ConfigKind = ConfigKind::McpServer;
    const NOUN: &'static str = "MCP server";
}

/// The stored documents of one kind, typed. Cheap to make: it holds the store.
pub struct ConfigRepo<T> {
    store: Store,
    kind: PhantomData<fn() -> T>,
}

impl<T: ConfigDoc> ConfigRepo<T> {
    /// The repository of `T`s in `store`.
    pub fn new(store: &Store) -> Self {
        Self {
            store: store.clone(),
            kind: PhantomData,
        }
    }

    fn read(name: &str, value: Value) -> Result<T, AppError> {
        serde_json::from_value(value).map_err(|error| {
            AppError::internal(format!(
                "the stored {} {name:?} is unreadable: {error}",
                T::NOUN
            ))
        })
    }

    /// The document `name`, if stored (an unreadable one is an internal error).
    pub async fn get(&self, name: &str) -> Result<Option<T>, AppError> {
        self.store
            .config(T::KIND, name)
            .await?
            .map(|value| Self::read(name, value))
            .transpose()
    }

    /// Every readable document with its name, by name; unreadable ones are logged and left out.
    pub async fn list(&self) -> Result<Vec<(String, T)>, AppError> {
        Ok(Self::readable(self.store.list_config(T::KIND).await?))
    }

    /// The same, in the order they were first stored.
    pub async fn list_registered(&self) -> Result<Vec<(String, T)>, AppError> {
        Ok(Self::readable(
            self.store.list_config_registered(T::KIND).await?,
        ))
    }

    fn readable(stored: Vec<(String, Value)>) -> Vec<(String, T)> {
        stored
            .into_iter()
            .filter_map(|(name, value)| match Self::read(&name, value) {
                Ok(document) => Some((name, document)),
                Err(error) => {
                    tracing::warn!("{}", error.message);
                    None
                }
            })
            .collect()
    }

    /// Stores `document` as the new `name`: a conflict if one is stored under it already.
    pub async fn create(&self, name: &str, document: &T) -> Result<(), AppError> {
        if self
            .store
            .insert_config(T::KIND, name, &to_document(document)?)
            .await?
        {
            Ok(())
        } else {
            Err(AppError::conflict(format!(
                "a {} {name:?} already exists",
                T::NOUN
            )))
        }
    }

    /// Replaces `name` with `document`, stored under `new_name` (a rename when it differs): not
    /// found if `name` is not stored, a conflict if `new_name` is another's.
    pub async fn replace(&self, name: &str, new_name: &str, document: &T) -> Result<(), AppError> {
        match self
            .store
            .replace_config(T::KIND, name, new_name, &to_document(document)?)
            .await?
        {
            ConfigReplaced::Replaced => Ok(()),
            ConfigReplaced::Missing => Err(AppError::not_found(format!("no {} {name:?}", T::NOUN))),
            ConfigReplaced::NameTaken => Err(AppError::conflict(format!(
                "a {} {new_name:?} already exists",
                T::NOUN
            ))),
        }
    }

    /// Stores `document` as `name`, whether or not one was there.
    pub async fn put(&self, name: &str, document: &T) -> Result<(), AppError> {
        Ok(self
            .store
            .put_config(T::KIND, name, &to_document(document)?)
            .await?)
    }

    /// Deletes `name`; `false` if nothing was stored under it.
    pub async fn delete(&self, name: &str) -> Result<bool, AppError> {
        Ok(self.store.delete_config(T::KIND, name).await?)
    }
}

/// Checks a model or secret name: 1 to 64 characters of `A-Z a-z 0-9 _ . -` (the store's rule).
pub fn check_name(what: &str, name: &str) -> Result<(), AppError> {
    let valid = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'.' | b'-'));
    if valid {
        Ok(())
    } else {
        let shown: String = name.chars().take(64).collect();
        Err(AppError::bad_request(format!(
            "invalid {what} name {shown:?}: use 1 to 64 characters of A-Z, a-z, 0-9, '_', '.' \
             and '-'"
        )))
    }
}

/// A value as the JSON document the store keeps.
pub fn to_document<T: Serialize>(value: &T) -> Result<Value, AppError> {
    serde_json::to_value(value).map_err(|error| AppError::internal(error.to_string()))
}
