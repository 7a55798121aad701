//! `delegate`: hands a task to a sub-agent with its own model and a subset of the caller's
//! tools, run in a linked child session; the sub-agent's final answer is the result.
//!
//! Arguments: `task` (required), `context` (background added to the sub-agent's system
//! prompt), `model` (default: the saved agent's, else the caller's), `agent` (a saved agent's
//! id or nickname: its model, system prompt and tools), `tools` (names; only tools the caller
//! has; default: the agent's tools the caller has, else all of the caller's). The sub-agent's
//! system prompt includes the caller's tool table (names and descriptions).

use std::sync::Arc;
use std::time::Duration;

use agentry_types::{ToolResultPart, ToolSpec};
use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::json;

use super::{DELEGATE, DelegationConfig, caller_of, child_depth, follow, title_of, tool_table};
use agentry_core::subrun::{ChildLink, SubRuns};
use agentry_core::tool::{Tool, ToolContext, ToolError, ToolOutput};
use agentry_core::{Input, RunRequest};

/// Longest task or context accepted, in bytes.
const MAX_TEXT: usize = 256 * 1024;

/// The `delegate` tool.
pub struct DelegateTool {
    spec: ToolSpec,
    runs: Arc<dyn SubRuns>,
    config: DelegationConfig,
}

/// The arguments, as validated by the schema.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Arguments {
    task: String,
    #[serde(default)]
    context: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    agent: Option<String>,
    #[serde(default)]
    tools: Option<Vec<String>>,
}

impl DelegateTool {
    /// The tool over `runs`.
    pub fn new(runs: Arc<dyn SubRuns>, config: DelegationConfig) -> Self {
        let spec = ToolSpec::new(
            DELEGATE,
            "Hands a self-contained task to a sub-agent and returns its final answer. The \
             sub-agent starts with no memory of this conversation: put everything it needs in \
             `task` and `context`. It may run on another `model` or as a saved `agent`, and gets \
             the `tools` you list (only tools you have; default: all of yours).",
            json!({
                "type": "object",
                "properties": {
                    "task": {
                        "type": "string", "minLength": 1, "maxLength": MAX_TEXT,
                        "description": "What the sub-agent should do and what to answer with."
                    },
                    "context": {
                        "type": "string", "maxLength": MAX_TEXT,
                        "description": "Background the sub-agent needs (added to its system prompt)."
                    },
                    "model": {
                        "type": "string", "minLength": 1, "maxLength": 128,
                        "description": "The model id to run it on (default: the agent's, else yours)."
                    },
                    "agent": {
                        "type": "string", "minLength": 1, "maxLength": 128,
                        "description": "A saved agent (id or nickname) to run as: its model, system prompt and tools."
                    },
                    "tools": {
                        "type": "array", "maxItems": 256, "uniqueItems": true,
                        "items": {"type": "string", "minLength": 1, "maxLength": 128},
                        "description": "The tools it gets, by name; only tools you have (default: the agent's tools you have, else all of yours)."
                    }
                },
                "required": ["task"],
                "additionalProperties": false
            }),
        );
        Self { spec, runs, config }
    }
}

impl Tool for DelegateTool {
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
        Box::pin(async move { delegate(runs, config, arguments, context).await })
    }
}

async fn delegate(
    runs: Arc<dyn SubRuns>,
    config: DelegationConfig,
    arguments: serde_json::Value,
    context: ToolContext,
) -> Result<ToolOutput, ToolError> {
    let arguments: Arguments = serde_json::from_value(arguments)
        .map_err(|error| ToolError::InvalidArguments(error.to_string()))?;
    if arguments.task.trim().is_empty() {
        return Err(ToolError::InvalidArguments("`task` is blank".into()));
    }
    let caller = caller_of(&context, DELEGATE)?;
    let depth = child_depth(&runs, &caller, &config).await?;
    let caller_tools: Vec<&str> = caller.tools.iter().map(|t| t.name.as_str()).collect();

    // The saved agent, if one is named: exactly one agent by id or nickname.
    let mut request = RunRequest::default();
    let mut agent_id = None;
    // What the sub-agent may use: its caller's grant (an allowed agent brings its own tools).
    let mut grant = caller.grant.clone();
    if let Some(name) = &arguments.agent {
        let mut found = runs.find_agents(name).await?;
        let agent = match found.len() {
            0 => {
                return Err(ToolError::Failed(format!(
                    "no saved agent is named {name:?}"
                )));
            }
            1 => found.remove(0),
            n => {
                return Err(ToolError::Failed(format!(
                    "{name:?} names {n} agents (a label?): give one agent's id"
                )));
            }
        };
        request = agent.request.map_err(ToolError::Failed)?;
        grant = grant.map(|grant| grant.running_as(request.tools.clone()));
        agent_id = Some(agent.id);
    }
    if let Some(model) = &arguments.model {
        if request.model.as_deref() != Some(model) {
            // The agent's fallbacks belong to its own model.
            request.fallback_models.clear();
        }
        request.model = Some(model.clone());
    }
    if request.model.is_none() {
        request.model = Some(caller.model.clone());
    }

    // Tools: only the caller's.
    let tools = match &arguments.tools {
        Some(names) if agentry_core::tool::names_all_tools(names) => {
            caller_tools.iter().map(|name| (*name).to_owned()).collect()
        }
        Some(names) => {
            let missing: Vec<&str> = names
                .iter()
                .map(String::as_str)
                .filter(|name| !caller_tools.contains(name))
                .collect();
            if !missing.is_empty() {
                return Err(ToolError::Failed(format!(
                    "a sub-agent can only get tools you have; you do not have: {}",
                    missing.join(", ")
                )));
            }
            names.clone()
        }
        None => match &request.tools {
            Some(agent_tools) if agentry_core::tool::names_all_tools(agent_tools) => {
                caller_tools.iter().map(|name| (*name).to_owned()).collect()
            }
            Some(agent_tools) => agent_tools
                .iter()
                .filter(|name| caller_tools.contains(&name.as_str()))
                .cloned()
                .collect(),
            None => caller_tools.iter().map(|name| (*name).to_owned()).collect(),
        },
    };
    request.tools = Some(tools);

    let mut system = String::from(
        "You are a sub-agent: another agent delegated a task to you. Do it with the tools you \
         have, then answer with the result; your final answer is returned to that agent.",
    );
    if let Some(own) = request.system.take() {
        system.push_str("\n\n");
        system.push_str(&own);
    }
    if let Some(background) = arguments
        .context
        .as_deref()
        .filter(|c| !c.trim().is_empty())
    {
        system.push_str("\n\n## Context from the delegating agent\n\n");
        system.push_str(background);
    }
    system.push_str(
        "\n\n## Tools of the delegating agent\n\nYou were given some of these (see your own \
         tools):\n\n",
    );
    system.push_str(&tool_table(&caller.tools));
    request.system = Some(system);
    request.input = Some(Input::Text {
        text: arguments.task.clone(),
    });
    request.history = Vec::new();
    request.workspace = context.workspace.clone();
    request.agent_id = agent_id.clone();
    request.grant = grant;
    // The caller's tools come with the caller's network narrowing: fetch reaches no more than
    // the caller's would.
    for policy in &caller.network {
        if !request.network.contains(policy) {
            request.network.push(policy.clone());
        }
    }
    // The caller's tools come with the caller's approvals: delegating never skips a person.
    if !caller.approvals.is_empty() {
        request.approvals = Some(match request.approvals.take() {
            Some(own) => own.merged(&caller.approvals),
            None => caller.approvals.clone(),
        });
    }

    let link = ChildLink {
        parent_session_id: caller.session,
        parent_run_id: caller.run_id,
        call_id: context.call_id.clone(),
        depth,
        tool: DELEGATE.to_owned(),
        agent_id: agent_id.clone(),
    };
    let child = runs
        .start(link, request, title_of(DELEGATE, &arguments.task, 72))
        .await?;
    let outcome = follow(child, &context, depth, agent_id.clone()).await;
    let links = json!({"children": [outcome.link(depth, agent_id.as_deref())]});
    if outcome.completed() {
        Ok(ToolOutput::parts(
            vec![
                ToolResultPart::Text { text: outcome.text },
                ToolResultPart::Json { value: links },
            ],
            false,
        ))
    } else {
        Ok(ToolOutput::parts(
            vec![
                ToolResultPart::Text {
                    text: outcome.failure(),
                },
                ToolResultPart::Json { value: links },
            ],
            true,
        ))
    }
}
