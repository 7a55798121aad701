//! Skills: folders of instructions (and files) a model can choose to use.
//!
//! A skill is a folder holding `SKILL.md`, which starts with YAML front matter between `---`
//! lines giving the skill's `name` and `description` (other keys are allowed and ignored), then
//! the instructions. A [`Skill`] is a [`Tool`]: the model first sees only its name and
//! description; calling it discloses the full instructions, lists the other files in the folder,
//! and makes the folder the run's working directory ([`ToolEffect::SetWorkingDir`]) — a value
//! passed to later tools, never a change to the process's directory.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agentry_types::ToolSpec;
use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::tool::{
    TOOL_NAME_RULE, Tool, ToolContext, ToolEffect, ToolError, ToolOutput, is_valid_tool_name,
};

/// The file that makes a folder a skill.
pub const SKILL_FILE: &str = "SKILL.md";

/// The largest `SKILL.md` read.
pub const MAX_SKILL_FILE_BYTES: u64 = 1024 * 1024;

/// At most this many other files of a skill's folder are listed.
const MAX_LISTED_FILES: usize = 500;

/// Folders nested deeper than this inside a skill are not listed.
const MAX_LISTING_DEPTH: usize = 8;

/// Why a skill could not be loaded. Every message names the path at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SkillError {
    /// The folder or a file in it could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The path being read.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The folder has no `SKILL.md`.
    #[error("{path} does not exist: a skill folder needs a SKILL.md")]
    MissingSkillFile {
        /// Where `SKILL.md` was expected.
        path: PathBuf,
    },
    /// `SKILL.md` is larger than [`MAX_SKILL_FILE_BYTES`].
    #[error("{path} is larger than {limit} bytes")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The limit in bytes.
        limit: u64,
    },
    /// `SKILL.md` does not start with front matter between `---` lines.
    #[error(
        "{path} does not start with YAML front matter (a `---` line, `name:` and `description:`, then a closing `---` line)"
    )]
    MissingFrontMatter {
        /// The file.
        path: PathBuf,
    },
    /// The front matter is not valid YAML (or not a mapping of the expected types).
    #[error("{path}: invalid front matter: {message}")]
    InvalidYaml {
        /// The file.
        path: PathBuf,
        /// What the YAML parser said.
        message: String,
    },
    /// A required front-matter field is missing.
    #[error("{path}: the front matter has no `{field}`")]
    MissingField {
        /// The file.
        path: PathBuf,
        /// The field's name.
        field: &'static str,
    },
    /// A front-matter field has an unacceptable value.
    #[error("{path}: invalid `{field}`: {reason}")]
    InvalidField {
        /// The file.
        path: PathBuf,
        /// The field's name.
        field: &'static str,
        /// Why it is rejected.
        reason: String,
    },
    /// The folder (or its `SKILL.md`) resolves outside every allowed skill root.
    #[error(
        "{path} is outside the allowed skill folders ({}): a skill folder must be inside one \
         of them, after symlinks are resolved",
        display_roots(roots)
    )]
    OutsideRoots {
        /// The path at fault.
        path: PathBuf,
        /// The allowed roots.
        roots: Vec<PathBuf>,
    },
    /// Two skills under one root have the same name.
    #[error("two skills are named {name:?}: {first} and {second}")]
    DuplicateName {
        /// The shared name.
        name: String,
        /// The first skill's folder.
        first: PathBuf,
        /// The second skill's folder.
        second: PathBuf,
    },
}

fn display_roots(roots: &[PathBuf]) -> String {
    if roots.is_empty() {
        return "none are configured".to_owned();
    }
    roots
        .iter()
        .map(|root| root.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether `path` (canonical) is inside one of `roots` (each canonicalised; a root that does
/// not exist holds nothing).
fn within(path: &Path, roots: &[PathBuf]) -> bool {
    roots
        .iter()
        .filter_map(|root| fs::canonicalize(root).ok())
        .any(|root| path.starts_with(&root))
}

/// The front matter's fields; unknown keys are ignored.
#[derive(Debug, Default, Deserialize)]
struct FrontMatter {
    name: Option<String>,
    description: Option<String>,
}

/// A loaded skill. As a [`Tool`], its spec is its name and description with no arguments, and
/// calling it returns its instructions and moves the run into its folder.
#[derive(Debug, Clone)]
pub struct Skill {
    description: String,
    body: String,
    dir: PathBuf,
    files: Vec<PathBuf>,
    spec: ToolSpec,
}

impl Skill {
    /// Loads the skill in `dir` like [`Skill::load`], only if the folder and its `SKILL.md`
    /// are inside one of `roots` once canonicalised (symlinks resolved, so a link cannot lead
    /// out): otherwise [`SkillError::OutsideRoots`], before anything is read.
    pub fn load_within(dir: &Path, roots: &[PathBuf]) -> Result<Skill, SkillError> {
        let outside = |path: &Path| SkillError::OutsideRoots {
            path: path.to_path_buf(),
            roots: roots.to_vec(),
        };
        let canonical = fs::canonicalize(dir).map_err(|source| SkillError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        if !within(&canonical, roots) {
            return Err(outside(dir));
        }
        let file = canonical.join(SKILL_FILE);
        if let Ok(real) = fs::canonicalize(&file)
            && !within(&real, roots)
        {
            return Err(outside(&file));
        }
        Self::load(&canonical)
    }

    /// Loads the skill in `dir` (the folder holding `SKILL.md`). The folder is canonicalised.
    pub fn load(dir: &Path) -> Result<Skill, SkillError> {
        let dir = fs::canonicalize(dir).map_err(|source| SkillError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let path = dir.join(SKILL_FILE);
        let text = read_skill_file(&path)?;
        let (yaml, body) = split_front_matter(&text)
            .ok_or_else(|| SkillError::MissingFrontMatter { path: path.clone() })?;
        let front: FrontMatter = if yaml.trim().is_empty() {
            FrontMatter::default()
        } else {
            serde_saphyr::from_str(yaml).map_err(|error| SkillError::InvalidYaml {
                path: path.clone(),
                // Plain text, with lines counted from the top of SKILL.md (the front matter
                // starts on its second line).
                message: error.render_with_options(serde_saphyr::render_options! {
                    snippets: serde_saphyr::SnippetMode::Off,
                    line_offset: 1,
                }),
            })?
        };
        let name = front.name.ok_or_else(|| SkillError::MissingField {
            path: path.clone(),
            field: "name",
        })?;
        if !is_valid_tool_name(&name) {
            return Err(SkillError::InvalidField {
                path,
                field: "name",
                reason: format!("{name:?} is not a valid name: a name is {TOOL_NAME_RULE}"),
            });
        }
        let description = front.description.ok_or_else(|| SkillError::MissingField {
            path: path.clone(),
            field: "description",
        })?;
        let description = description.trim().to_owned();
        if description.is_empty() {
            return Err(SkillError::InvalidField {
                path,
                field: "description",
                reason: "it is empty".to_owned(),
            });
        }
        let files = list_files(&dir)?;
        let spec = ToolSpec::new(
            name,
            description.clone(),
            json!({"type": "object", "properties": {}}),
        );
        Ok(Skill {
            description,
            body: body.to_owned(),
            dir,
            files,
            spec,
        })
    }

    /// The skill's name (also its tool name).
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// What the skill is for: all the model sees before choosing it.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// The instructions after the front matter.
    pub fn body(&self) -> &str {
        &self.body
    }

    /// The skill's folder, canonicalised.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The other files in the folder, relative to it, sorted (hidden files and folders are
    /// skipped; symbolic links are listed but not followed).
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// What calling the skill discloses: the instructions, then the folder and its files.
    pub fn disclosure(&self) -> String {
        let mut text = self.body.trim_end().to_owned();
        text.push_str("\n\n---\n");
        text.push_str(&format!(
            "Skill folder (now the working directory): {}\n",
            self.dir.display()
        ));
        if self.files.is_empty() {
            text.push_str("The folder holds no other files.\n");
        } else {
            text.push_str("Other files in the folder:\n");
            for file in &self.files {
                text.push_str(&format!("- {}\n", file.display()));
            }
        }
        text
    }
}

impl Tool for Skill {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn timeout(&self) -> Option<Duration> {
        None
    }

    fn idempotent(&self) -> bool {
        true
    }

    fn call(
        &self,
        _arguments: Value,
        _context: ToolContext,
    ) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        let output = ToolOutput::text(self.disclosure())
            .with_effect(ToolEffect::SetWorkingDir(self.dir.clone()));
        Box::pin(futures::future::ready(Ok(output)))
    }
}

/// Loads every skill under `root`: each direct subfolder holding a `SKILL.md`, sorted by name.
/// Subfolders without one are skipped; a skill that fails to load fails the whole call.
pub fn load_skills(root: &Path) -> Result<Vec<Skill>, SkillError> {
    let io_error = |source| SkillError::Io {
        path: root.to_path_buf(),
        source,
    };
    let mut dirs = Vec::new();
    for entry in fs::read_dir(root).map_err(io_error)? {
        let entry = entry.map_err(io_error)?;
        let path = entry.path();
        if path.is_dir() && path.join(SKILL_FILE).is_file() {
            dirs.push(path);
        }
    }
    dirs.sort();
    let mut skills = dirs
        .iter()
        .map(|dir| Skill::load(dir))
        .collect::<Result<Vec<_>, _>>()?;
    skills.sort_by(|a, b| a.name().cmp(b.name()));
    for pair in skills.windows(2) {
        if let [first, second] = pair
            && first.name() == second.name()
        {
            return Err(SkillError::DuplicateName {
                name: first.name().to_owned(),
                first: first.dir.clone(),
                second: second.dir.clone(),
            });
        }
    }
    Ok(skills)
}

fn read_skill_file(path: &Path) -> Result<String, SkillError> {
    let metadata = match fs::metadata(path) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            return Err(SkillError::MissingSkillFile {
                path: path.to_path_buf(),
            });
        }
        Err(source) => {
            return Err(SkillError::Io {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    if !metadata.is_file() {
        return Err(SkillError::MissingSkillFile {
            path: path.to_path_buf(),
        });
    }
    if metadata.len() > MAX_SKILL_FILE_BYTES {
        return Err(SkillError::TooLarge {
            path: path.to_path_buf(),
            limit: MAX_SKILL_FILE_BYTES,
        });
    }
    fs::read_to_string(path).map_err(|source| SkillError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Splits `---\n<yaml>\n---\n<body>` into the YAML and the body (leading blank lines dropped).
fn split_front_matter(text: &str) -> Option<(&str, &str)> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.split_inclusive('\n');
    let first = lines.next()?;
    if first.trim_end() != "---" {
        return None;
    }
    let yaml_start = first.len();
    let mut offset = yaml_start;
    for line in lines {
        if line.trim_end() == "---" {
            let yaml = &text[yaml_start..offset];
            let body = &text[offset + line.len()..];
            return Some((yaml, body.trim_start_matches(['\r', '\n'])));
        }
        offset += line.len();
    }
    None
}

/// The files under `dir` other than `SKILL.md`, relative and sorted.
fn list_files(dir: &Path) -> Result<Vec<PathBuf>, SkillError> {
    let mut files = Vec::new();
    let mut pending = vec![(dir.to_path_buf(), 0_usize)];
    while let Some((folder, depth)) = pending.pop() {
        let entries = fs::read_dir(&folder).map_err(|source| SkillError::Io {
            path: folder.clone(),
            source,
        })?;
        for entry in entries {
            let entry = entry.map_err(|source| SkillError::Io {
                path: folder.clone(),
                source,
            })?;
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let path = entry.path();
            let Ok(relative) = path.strip_prefix(dir) else {
                continue;
            };
            let relative = relative.to_path_buf();
            let file_type = entry.file_type().map_err(|source| SkillError::Io {
                path: path.clone(),
                source,
            })?;
            if file_type.is_dir() {
                if depth < MAX_LISTING_DEPTH {
                    pending.push((path, depth + 1));
                }
            } else if relative != Path::new(SKILL_FILE) {
                files.push(relative);
            }
        }
    }
    files.sort();
    files.truncate(MAX_LISTED_FILES);
    Ok(files)
}
