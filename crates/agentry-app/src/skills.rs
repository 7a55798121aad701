//! Skills registered on their own (`POST /v1/skills`, the seed's `POST /v1/tools/skill`): a
//! skill folder on the server (holding `SKILL.md`, whose front-matter names and describes it),
//! offered to runs by its name like any tool, beside the skills saved agents bring. The folder
//! must be inside the server's skill roots (symlinks resolved); registering a folder whose
//! skill has the name of a registered skill replaces it, as the seed does.

use serde::{Deserialize, Serialize};

use crate::App;
use crate::config::{ConfigRepo, check_name};
use crate::error::AppError;

/// A registered skill.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SkillConfig {
    /// Its name (from `SKILL.md`), which runs name it by.
    pub name: String,
    /// What it does (from `SKILL.md`).
    pub description: String,
    /// Its folder on the server: absolute, symlinks resolved.
    pub path: String,
}

impl crate::config::ConfigDoc for SkillConfig {
    const KIND: agentry_store::ConfigKind = agentry_store::ConfigKind::Skill;
    const NOUN: &'static str = "skill";
}

/// `GET /v1/skills`.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SkillList {
    /// The registered skills, by name.
    pub skills: Vec<SkillConfig>,
}

/// What registering did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    /// The skill as stored.
    pub skill: SkillConfig,
    /// Whether it replaced a skill of the same name.
    pub replaced: bool,
}

/// The skills agents may load: registered, listed and removed.
pub struct Skills<'a> {
    app: &'a App,
}

impl App {
    /// The skills agents may load: registered, listed and removed.
    pub fn skills(&self) -> Skills<'_> {
        Skills { app: self }
    }
}

impl Skills<'_> {
    /// Registers the skill folder at `path` (see the module docs): 400 when it holds no valid
    /// `SKILL.md` or lies outside the skill roots, 409 when a tool of another kind has the
    /// skill's name.
    pub async fn register(&self, path: &str) -> Result<Registered, AppError> {
        let loaded = crate::agents::load_skill(path, self.app.parts.tools.skill_roots.as_deref())?;
        let name = loaded.name().to_owned();
        check_name("skill", &name)?;
        let repo = ConfigRepo::<SkillConfig>::new(&self.app.parts.store);
        let replaced = repo.get(&name).await?.is_some();
        if !replaced
            && self
                .app
                .tools()
                .list()
                .await?
                .tools
                .iter()
                .any(|tool| tool.name == name)
        {
            return Err(AppError::conflict(format!(
                "a tool named {name:?} already exists"
            )));
        }
        let skill = SkillConfig {
            name,
            description: loaded.description().to_owned(),
            path: loaded.dir().display().to_string(),
        };
        repo.put(&skill.name, &skill).await?;
        self.app.reload_runtime().await?;
        Ok(Registered { skill, replaced })
    }

    /// The registered skills.
    pub async fn list(&self) -> Result<SkillList, AppError> {
        let skills = ConfigRepo::<SkillConfig>::new(&self.app.parts.store)
            .list()
            .await?
            .into_iter()
            .map(|(_, skill)| skill)
            .collect();
        Ok(SkillList { skills })
    }

    /// Unregisters a skill (its folder stays).
    pub async fn delete(&self, name: &str) -> Result<(), AppError> {
        check_name("skill", name)?;
        if !ConfigRepo::<SkillConfig>::new(&self.app.parts.store)
            .delete(name)
            .await?
        {
            return Err(AppError::not_found(format!("no skill named {name:?}")));
        }
        self.app.reload_runtime().await
    }
}
