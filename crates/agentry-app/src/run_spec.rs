//! What to run, as the application keeps it: a [`RunSpec`]. Every front-end builds one from its
//! own request (`POST /v1/infer` and `/v1/runs`, OpenAI chat and Responses, A2A, the seed API,
//! MCP, the CLI); `runs::prepare` checks it for a caller and turns it into the engine's
//! request. The queue, schedules and workflows store the spec, versioned
//! ([`RunSpec::to_stored`]), never the engine's request: a stored run is checked again when it
//! is taken up, under its owner's key as it is then.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use agentry_core::Input;
use agentry_core::approval::ApprovalPolicy;
use agentry_core::context::CompactionSettings;
use agentry_core::session::BusyPolicy;
use agentry_llm::GenerationParams;
use agentry_types::{Message, SessionId, ToolSpec};

use crate::error::AppError;

/// The version of a stored spec's shape; a store written by a newer release is refused by name.
pub(crate) const RUN_SPEC_VERSION: u32 = 1;

/// Which session a run goes to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionChoice {
    /// None: an ephemeral run, nothing stored.
    #[default]
    Ephemeral,
    /// A new session.
    New,
    /// This existing session.
    Existing(SessionId),
}

/// What a front-end asks to run, before it is checked.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSpec {
    /// Run as this saved agent: its settings, under what the fields below say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// The model (a request naming its own does not use the agent's fallbacks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_id: Option<String>,
    /// The system prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// Exactly these tools (`["*"]`: all); none when neither this nor the agent names any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_ids: Option<Vec<String>>,
    /// Generation parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<GenerationParams>,
    /// Tool rounds allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tool_rounds: Option<u32>,
    /// Which tool calls wait for approval (merged over the agent's, per tool).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approvals: Option<ApprovalPolicy>,
    /// How the run compacts its context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction: Option<CompactionSettings>,
    /// The user the run is for (their memories join the agent's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Earlier conversation: an ephemeral run's or a new session's; for an existing session
    /// (whose conversation comes from its log) only tool results answering the calls its last
    /// run ended on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<Message>,
    /// The new input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Input>,
    /// Where it runs.
    #[serde(default)]
    pub session: SessionChoice,
    /// Tools the caller runs itself: calling one ends the run for the caller to answer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_tools: Vec<ToolSpec>,
    /// What to do when the session has a run in progress.
    #[serde(default)]
    pub policy: BusyPolicy,
    /// Background runs only: where to POST, signed, when the run stops (the agent's own when
    /// absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_url: Option<String>,
}

/// A spec as it is stored: its shape's version beside it.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Stored {
    version: u32,
    spec: RunSpec,
}

impl RunSpec {
    /// The spec as the store keeps it (`{"version": 1, "spec": …}`).
    pub fn to_stored(&self) -> Result<Value, AppError> {
        serde_json::to_value(Stored {
            version: RUN_SPEC_VERSION,
            spec: self.clone(),
        })
        .map_err(|error| AppError::internal(format!("cannot store a run: {error}")))
    }

    /// A stored spec; `None` when `value` is not one (a row written before specs were stored,
    /// which its reader knows the older shape of). A newer version is an error naming it.
    pub fn from_stored(value: &Value) -> Result<Option<Self>, AppError> {
        let Some(version) = value.get("version").and_then(Value::as_u64) else {
            return Ok(None);
        };
        if version != u64::from(RUN_SPEC_VERSION) {
            return Err(AppError::internal(format!(
                "a run stored in version {version} of its shape, which this release (version \
                 {RUN_SPEC_VERSION}) does not read: it was written by a newer Agentry"
            )));
        }
        let stored = Stored::deserialize(value)
            .map_err(|error| AppError::internal(format!("a stored run is unreadable: {error}")))?;
        Ok(Some(stored.spec))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_reads_back_as_it_was_stored_and_a_newer_version_is_refused_by_name() {
        let spec = RunSpec {
            agent_id: Some("helper".into()),
            tool_ids: Some(vec!["current_time".into()]),
            max_tool_rounds: Some(3),
            user: Some("alice".into()),
            input: Some(Input::Text {
                text: "hello".into(),
            }),
            session: SessionChoice::Existing(SessionId::new()),
            policy: BusyPolicy::Enqueue,
            webhook_url: Some("https://example.com/hook".into()),
            ..RunSpec::default()
        };
        let stored = spec.to_stored().unwrap();
        assert_eq!(stored["version"], 1);
        assert_eq!(RunSpec::from_stored(&stored).unwrap(), Some(spec));

        // A row of the older shape is not a spec; its reader handles it.
        let older = serde_json::json!({"request": {"input": null}, "policy": "reject"});
        assert_eq!(RunSpec::from_stored(&older).unwrap(), None);

        let mut newer = stored;
        newer["version"] = 2.into();
        let error = RunSpec::from_stored(&newer).unwrap_err();
        assert!(error.message.contains("version 2"), "{}", error.message);
    }
}
