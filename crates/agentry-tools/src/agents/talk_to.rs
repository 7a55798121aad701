//! `talk_to`: sends a message to one or more saved agents, run in parallel, each in its own
//! linked child session; their answers come back joined in the targets' order.
//!
//! Targets are agent ids, nicknames or labels (a label may name several agents). An agent
//! cannot address itself. A target that cannot run (unknown, misconfigured, or its run fails)
//! yields an error entry in the joined result; the call itself fails only when every target
//! failed.

use std::sync::Arc;
use std::time::Duration;

use agentry_types::{ToolResultPart, ToolSpec};
use futures::future::{BoxFuture, join_all};
use serde::Deserialize;
use serde_json::json;

use super::{DelegationConfig, TALK_TO, caller_of, child_depth, follow, title_of};
use agentry_core::Input;
use agentry_core::subrun::{AgentTarget, ChildLink, SubRuns};
use agentry_core::tool::{CallerInfo, Tool, ToolContext, ToolError, ToolOutput};

/// Longest message accepted, in bytes.
const MAX_MESSAGE: usize = 256 * 1024;

/// The `talk_to` tool.
pub struct TalkToTool {
    spec: ToolSpec,
    runs: Arc<dyn SubRuns>,
    config: DelegationConfig,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Arguments {
    agents: Vec<String>,
    message: String,
}

impl TalkToTool {
    /// The tool over `runs`.
    pub fn new(runs: Arc<dyn SubRuns>, config: DelegationConfig) -> Self {
        let max = config.max_targets.max(1);
        let spec = ToolSpec::new(
            TALK_TO,
            "Sends a message to other saved agents (by id, nickname or label) and returns their \
             answers, one per agent, in the order given. The agents run in parallel, each \
             without memory of this conversation: say everything they need in `message`. You \
             cannot message yourself; a name that matches no agent gets the list of agents.",
            json!({
                "type": "object",
                "properties": {
                    "agents": {
                        "type": "array", "minItems": 1, "maxItems": max, "uniqueItems": true,
                        "items": {"type": "string", "minLength": 1, "maxLength": 128},
                        "description": "The agents: ids, nicknames or labels."
                    },
                    "message": {
                        "type": "string", "minLength": 1, "maxLength": MAX_MESSAGE,
                        "description": "What to tell or ask them."
                    }
                },
                "required": ["agents", "message"],
                "additionalProperties": false
            }),
        );
        Self { spec, runs, config }
    }
}

impl Tool for TalkToTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn risk(&self) -> agentry_core::tool::ToolRisk {
        agentry_core::tool::ToolRisk::of(agentry_core::tool::RiskClass::Agents)
    }

    fn timeout(&self) -> Option<Duration> {
        Some(self.config.timeout)
    }

    fn call(
        &self,
        arguments: serde_json::Value,
        context: ToolContext,
    ) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        let runs = Arc::clone(&self.runs);
        let config = self.config;
        Box::pin(async move { talk_to(runs, config, arguments, context).await })
    }
}

/// One addressee of the call, or a target that named nobody.
enum Entry {
    Agent(Box<AgentTarget>),
    Unknown(String),
}

/// One entry of the joined result.
struct Answer {
    label: String,
    agent_id: Option<String>,
    text: Result<String, String>,
    link: serde_json::Value,
}

async fn talk_to(
    runs: Arc<dyn SubRuns>,
    config: DelegationConfig,
    arguments: serde_json::Value,
    context: ToolContext,
) -> Result<ToolOutput, ToolError> {
    let arguments: Arguments = serde_json::from_value(arguments)
        .map_err(|error| ToolError::InvalidArguments(error.to_string()))?;
    if arguments.message.trim().is_empty() {
        return Err(ToolError::InvalidArguments("`message` is blank".into()));
    }
    if arguments.agents.is_empty() || arguments.agents.iter().any(|a| a.trim().is_empty()) {
        return Err(ToolError::InvalidArguments(
            "`agents` names at least one agent, none blank".into(),
        ));
    }
    let caller = caller_of(&context, TALK_TO)?;
    let depth = child_depth(&runs, &caller, &config).await?;

    // Resolve every target in order; labels expand, each agent is addressed once.
    let mut entries: Vec<Entry> = Vec::new();
    for target in &arguments.agents {
        let found = runs.find_agents(target).await?;
        if found.is_empty() {
            entries.push(Entry::Unknown(target.clone()));
            continue;
        }
        let is_self = |agent: &AgentTarget| caller.agent_id.as_deref() == Some(agent.id.as_str());
        let others: Vec<AgentTarget> = found.iter().filter(|a| !is_self(a)).cloned().collect();
        if others.is_empty() {
            return Err(ToolError::Failed(format!(
                "an agent cannot talk_to itself: {target:?} is you ({})",
                caller.agent_id.as_deref().unwrap_or("?")
            )));
        }
        for agent in others {
            let seen = entries
                .iter()
                .any(|e| matches!(e, Entry::Agent(a) if a.id == agent.id));
            if !seen {
                entries.push(Entry::Agent(Box::new(agent)));
            }
        }
    }
    let addressed = entries
        .iter()
        .filter(|e| matches!(e, Entry::Agent(_)))
        .count();
    if addressed > config.max_targets {
        return Err(ToolError::InvalidArguments(format!(
            "the targets name {addressed} agents; at most {} per call",
            config.max_targets
        )));
    }

    let answers = join_all(entries.into_iter().map(|entry| {
        let runs = Arc::clone(&runs);
        let caller = Arc::clone(&caller);
        let context = context.clone();
        let message = arguments.message.clone();
        async move {
            match entry {
                Entry::Unknown(target) => {
                    let known = known_agents(&runs, caller.agent_id.as_deref()).await;
                    Answer {
                        label: target.clone(),
                        agent_id: None,
                        text: Err(format!("no agent matches {target:?}{known}")),
                        link: json!({"target": target, "error": "no agent matches"}),
                    }
                }
                Entry::Agent(agent) => ask(runs, &caller, &context, depth, *agent, message).await,
            }
        }
    }))
    .await;

    let failed = answers.iter().filter(|a| a.text.is_err()).count();
    let mut joined = String::new();
    for answer in &answers {
        if !joined.is_empty() {
            joined.push_str("\n\n");
        }
        let who = match &answer.agent_id {
            Some(id) => format!("**{}** ({id})", answer.label),
            None => format!("**{}**", answer.label),
        };
        match &answer.text {
            Ok(text) => joined.push_str(&format!("{who}: {text}")),
            Err(error) => joined.push_str(&format!("{who}: error: {error}")),
        }
    }
    let links: Vec<serde_json::Value> = answers.into_iter().map(|a| a.link).collect();
    Ok(ToolOutput::parts(
        vec![
            ToolResultPart::Text { text: joined },
            ToolResultPart::Json {
                value: json!({"children": links}),
            },
        ],
        failed == links.len(),
    ))
}

/// `"; the agents are: …"`, listing the saved agents other than the caller (empty if none is
/// known).
async fn known_agents(runs: &Arc<dyn SubRuns>, caller: Option<&str>) -> String {
    let Ok(agents) = runs.directory().await else {
        return String::new();
    };
    let listed: Vec<String> = agents
        .into_iter()
        .filter(|agent| Some(agent.id.as_str()) != caller)
        .take(50)
        .map(|agent| {
            let mut entry = agent.id;
            if let Some(nickname) = agent.nickname {
                entry.push_str(&format!(" ({nickname})"));
            }
            if !agent.labels.is_empty() {
                entry.push_str(&format!(" [labels: {}]", agent.labels.join(", ")));
            }
            entry
        })
        .collect();
    if listed.is_empty() {
        String::new()
    } else {
        format!("; the agents are: {}", listed.join("; "))
    }
}

/// Runs one agent on the message and waits for its answer.
async fn ask(
    runs: Arc<dyn SubRuns>,
    caller: &CallerInfo,
    context: &ToolContext,
    depth: u32,
    agent: AgentTarget,
    message: String,
) -> Answer {
    let label = agent.nickname.clone().unwrap_or_else(|| agent.id.clone());
    let failed = |error: String| Answer {
        label: label.clone(),
        agent_id: Some(agent.id.clone()),
        link: json!({"agent_id": agent.id, "error": error}),
        text: Err(error),
    };
    let mut request = match agent.request.clone() {
        Ok(request) => request,
        Err(error) => return failed(error),
    };
    let from = caller
        .agent_id
        .as_deref()
        .map_or_else(|| "another agent".to_owned(), |id| format!("agent {id:?}"));
    request.input = Some(Input::Text {
        text: format!("Message from {from} (your answer is returned to it):\n\n{message}"),
    });
    request.history = Vec::new();
    request.agent_id = Some(agent.id.clone());
    // Its caller's grant holds it: an agent outside it is refused before anything starts, and
    // an allowed one brings its own tools.
    request.grant = caller
        .grant
        .clone()
        .map(|grant| grant.running_as(request.tools.clone()));
    let link = ChildLink {
        parent_session_id: caller.session,
        parent_run_id: caller.run_id,
        call_id: context.call_id.clone(),
        depth,
        tool: TALK_TO.to_owned(),
        agent_id: Some(agent.id.clone()),
    };
    let child = match runs
        .start(link, request, title_of(TALK_TO, &message, 72))
        .await
    {
        Ok(child) => child,
        Err(error) => return failed(error.to_string()),
    };
    let outcome = follow(child, context, depth, Some(agent.id.clone())).await;
    let link = outcome.link(depth, Some(&agent.id));
    Answer {
        label,
        agent_id: Some(agent.id.clone()),
        text: if outcome.completed() {
            Ok(outcome.text)
        } else {
            Err(outcome.failure())
        },
        link,
    }
}
