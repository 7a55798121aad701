//! Where Agentry keeps its data: the data folder and the database.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use agentry_store::{SecretKey, Store, StoreOptions};

/// Data folder and database flags, shared by every command.
#[derive(Debug, Clone, Args)]
pub(crate) struct DataArgs {
    /// The data folder (database, secret key, chat history) [default: ~/.agentry].
    #[arg(long, global = true, env = "AGENTRY_HOME", value_name = "DIR")]
    home: Option<PathBuf>,
    /// Use this database instead of the embedded SQLite (`postgres://…`).
    #[arg(long, global = true, env = "AGENTRY_DATABASE_URL", value_name = "URL")]
    database_url: Option<String>,
    /// Another folder saved agents' skill folders may be in, beside `<data folder>/skills`
    /// (repeatable; `AGENTRY_SKILL_ROOTS` takes a `:`-separated list).
    #[arg(
        long = "skill-root",
        global = true,
        env = "AGENTRY_SKILL_ROOTS",
        value_delimiter = ':',
        value_name = "DIR"
    )]
    skill_roots: Vec<PathBuf>,
}

impl DataArgs {
    /// The data folder.
    pub(crate) fn home(&self) -> anyhow::Result<PathBuf> {
        if let Some(home) = &self.home {
            return Ok(home.clone());
        }
        let user_home = std::env::var_os("HOME")
            .context("cannot find the data folder: set AGENTRY_HOME or HOME, or pass --home")?;
        Ok(PathBuf::from(user_home).join(".agentry"))
    }

    /// Where saved agents' skill folders may be: `<data folder>/skills` and every
    /// `--skill-root`.
    pub(crate) fn skill_roots(&self) -> anyhow::Result<Vec<PathBuf>> {
        let mut roots = vec![self.home()?.join("skills")];
        roots.extend(self.skill_roots.iter().cloned());
        Ok(roots)
    }

    /// Opens the database (running its migrations).
    pub(crate) async fn open_store(&self) -> anyhow::Result<Store> {
        let home = self.home()?;
        match &self.database_url {
            Some(url) => {
                std::fs::create_dir_all(&home)
                    .with_context(|| format!("cannot create {}", home.display()))?;
                let key = SecretKey::load_or_create(&home.join("secret.key"))?;
                Ok(Store::connect(url, StoreOptions::new(key)).await?)
            }
            None => Ok(Store::open_home(&home).await?),
        }
    }
}
