//! How a saved agent is published to other agents over A2A: what its agent card says beyond
//! its id and name (a description, skills, whether it is the server's default agent), checked
//! when the agent is saved. The protocol itself (cards, JSON-RPC, tasks) is the HTTP crate's.

use serde::{Deserialize, Serialize};

use crate::error::AppError;

/// The most skills a card lists, and the longest text of a card's fields.
const MAX_SKILLS: usize = 32;
const MAX_TEXT: usize = 4096;

/// An agent's A2A publication: what its card says beyond its id and name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct A2aPublication {
    /// What the agent does, for other agents choosing it (default: its nickname or id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// What it can do (default: one skill, the agent itself, tagged with its labels).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skills: Vec<A2aSkill>,
    /// Whether it is the server's default agent: its card is served at the server's root too
    /// (`/.well-known/agent-card.json`), where clients given only the server's address look.
    /// One agent at most.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub default: bool,
}

/// A skill on an agent card.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct A2aSkill {
    /// Its id, unique on the card.
    pub id: String,
    /// Its name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// Keywords.
    #[serde(default)]
    pub tags: Vec<String>,
    /// Example requests.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub examples: Vec<String>,
}

impl A2aPublication {
    /// Checks lengths and that skill ids are unique.
    pub fn check(&self) -> Result<(), AppError> {
        let too_long = |text: &str| text.chars().count() > MAX_TEXT;
        if self.description.as_deref().is_some_and(too_long) {
            return Err(AppError::bad_request(format!(
                "`a2a.description` has at most {MAX_TEXT} characters"
            )));
        }
        if self.skills.len() > MAX_SKILLS {
            return Err(AppError::bad_request(format!(
                "`a2a.skills` lists at most {MAX_SKILLS} skills"
            )));
        }
        for (index, skill) in self.skills.iter().enumerate() {
            if skill.id.trim().is_empty() || skill.name.trim().is_empty() {
                return Err(AppError::bad_request(format!(
                    "`a2a.skills[{index}]` needs an `id` and a `name`"
                )));
            }
            let texts = [&skill.id, &skill.name, &skill.description];
            if texts.into_iter().any(|text| too_long(text))
                || skill.tags.len() + skill.examples.len() > MAX_SKILLS
                || skill
                    .tags
                    .iter()
                    .chain(&skill.examples)
                    .any(|t| too_long(t))
            {
                return Err(AppError::bad_request(format!(
                    "`a2a.skills[{index}]` is too long"
                )));
            }
            if self.skills[..index]
                .iter()
                .any(|other| other.id == skill.id)
            {
                return Err(AppError::bad_request(format!(
                    "`a2a.skills` has the id {:?} twice",
                    skill.id
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publications_are_checked() {
        let skill = |id: &str| A2aSkill {
            id: id.into(),
            name: "n".into(),
            description: "d".into(),
            tags: vec![],
            examples: vec![],
        };
        let ok = A2aPublication {
            description: Some("does things".into()),
            skills: vec![skill("a"), skill("b")],
            default: false,
        };
        ok.check().unwrap();
        let twice = A2aPublication {
            skills: vec![skill("a"), skill("a")],
            ..ok.clone()
        };
        assert!(twice.check().is_err());
        let long = A2aPublication {
            description: Some("x".repeat(MAX_TEXT + 1)),
            ..ok
        };
        assert!(long.check().is_err());
    }
}
