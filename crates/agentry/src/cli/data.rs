//! Where Agentry keeps its data: the data folder and the database.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use agentry_app::domain::store::{Durability, SecretKey, Store, StoreOptions};

/// Data folder and database flags, shared by every command.
#[derive(Debug, Clone, Args)]
pub(crate) struct DataArgs {
    /// The data folder (database, secret key, chat history) [default: ~/.agentry].
    #[arg(long, global = true, env = "AGENTRY_HOME", value_name = "DIR")]
    home: Option<PathBuf>,
    /// Use this database instead of the embedded SQLite (`postgres://…`).
    #[arg(long, global = true, env = "AGENTRY_DATABASE_URL", value_name = "URL")]
    database_url: Option<String>,
    /// How SQLite keeps a commit: `normal` survives a crash of the process (the last commits
    /// may be lost if the machine loses power), `full` also survives power loss at the cost of
    /// an fsync per commit. PostgreSQL follows its server's `synchronous_commit`.
    #[arg(
        long,
        global = true,
        env = "AGENTRY_SQLITE_SYNC",
        value_enum,
        default_value = "normal",
        value_name = "MODE"
    )]
    sqlite_sync: SqliteSync,
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

/// SQLite's `synchronous` setting, as the command line spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum SqliteSync {
    /// `synchronous = NORMAL`.
    Normal,
    /// `synchronous = FULL`.
    Full,
}

impl SqliteSync {
    fn durability(self) -> Durability {
        match self {
            Self::Normal => Durability::Normal,
            Self::Full => Durability::Full,
        }
    }
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
                let mut options = StoreOptions::new(key);
                options.durability = self.sqlite_sync.durability();
                Ok(Store::connect(url, options).await?)
            }
            None => Ok(Store::open_home_with(&home, self.sqlite_sync.durability()).await?),
        }
    }
}
