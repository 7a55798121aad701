//! What a run may use: the [`Grant`] its caller holds (a limited API key's agents, models and
//! tools), carried by the run so that every model and tool it reaches — its own, its fallbacks
//! and stand-ins, and those of the sub-agents it starts — is checked against the same lists.
//!
//! A run without a grant (an administrator's, the operator's) may use everything. The grant is
//! checked once the run is resolved ([`Grant::check_run`], called by
//! [`Runtime::prepare`](crate::Runtime::prepare)): on the model the run will really call (the
//! default included), every fallback and every stand-in it names, and every tool it is offered
//! after `"*"` is expanded. A request can therefore only narrow what its caller holds, never
//! replace it.

use serde::{Deserialize, Serialize};

use crate::engine::RunState;
use crate::tool::names_all_tools;

/// The agents, models and tools a run may use (`None`: any).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// The saved agents it may run as (and start as sub-agents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agents: Option<Vec<String>>,
    /// The models it may call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<String>>,
    /// The tools it may be offered (`"*"` in the list: any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// No tool that runs commands, whatever the lists say: the server runs commands without
    /// isolation (`--sandbox local`), where a command is a shell on the host.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_commands: bool,
}

/// Why a run was refused: what it named that its grant does not hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessDenied {
    /// An agent outside the grant.
    #[error("this API key may not run as the agent {0:?}")]
    Agent(String),
    /// A model outside the grant.
    #[error("this API key may not use the model {0:?}")]
    Model(String),
    /// Tools outside the grant.
    #[error("this API key may not use the tools: {}", .0.join(", "))]
    Tools(Vec<String>),
    /// Tools that run commands, on a server that runs them without isolation.
    #[error(
        "this server runs commands without isolation (`--sandbox local`), so this API key may \
         not use the tools that run them: {}",
        .0.join(", ")
    )]
    Commands(Vec<String>),
}

fn listed(list: Option<&[String]>, name: &str) -> bool {
    list.is_none_or(|list| list.iter().any(|entry| entry == name))
}

impl Grant {
    /// Whether it limits nothing.
    pub fn is_unlimited(&self) -> bool {
        self.agents.is_none() && self.models.is_none() && self.tools.is_none() && !self.no_commands
    }

    /// The same grant for a run as `agent`, whose own tools (`None`: none) are the tools it
    /// may be offered: an allowed agent brings its tools, and a request may only narrow them.
    #[must_use]
    pub fn running_as(mut self, agent_tools: Option<Vec<String>>) -> Self {
        self.tools = Some(agent_tools.unwrap_or_default());
        self
    }

    /// Checks that it may run as `agent`.
    pub fn check_agent(&self, agent: &str) -> Result<(), AccessDenied> {
        if listed(self.agents.as_deref(), agent) {
            Ok(())
        } else {
            Err(AccessDenied::Agent(agent.to_owned()))
        }
    }

    /// Checks that none of `tools` (each with whether it runs commands) runs commands, when it
    /// may not.
    pub fn check_commands<'a>(
        &self,
        tools: impl IntoIterator<Item = (&'a str, bool)>,
    ) -> Result<(), AccessDenied> {
        if !self.no_commands {
            return Ok(());
        }
        let refused: Vec<String> = tools
            .into_iter()
            .filter(|(_, runs_commands)| *runs_commands)
            .map(|(name, _)| name.to_owned())
            .collect();
        if refused.is_empty() {
            Ok(())
        } else {
            Err(AccessDenied::Commands(refused))
        }
    }

    /// Checks that it may call `model`.
    pub fn check_model(&self, model: &str) -> Result<(), AccessDenied> {
        if listed(self.models.as_deref(), model) {
            Ok(())
        } else {
            Err(AccessDenied::Model(model.to_owned()))
        }
    }

    /// Checks that it may be offered each of `tools` (`"*"` only when it may use any tool).
    pub fn check_tools<'a>(
        &self,
        tools: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), AccessDenied> {
        let Some(allowed) = self.tools.as_deref() else {
            return Ok(());
        };
        if names_all_tools(allowed) {
            return Ok(());
        }
        let refused: Vec<String> = tools
            .into_iter()
            .filter(|tool| !listed(Some(allowed), tool))
            .map(str::to_owned)
            .collect();
        if refused.is_empty() {
            Ok(())
        } else {
            Err(AccessDenied::Tools(refused))
        }
    }

    /// The one decision over a resolved run: its agent, the model it calls, its fallbacks, the
    /// stand-ins it names (`named_models`: vision, speech, summary) and every tool it is offered
    /// (the client's own tools run at the client and are not the server's to grant).
    pub fn check_run<'a>(
        &self,
        state: &RunState,
        named_models: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), AccessDenied> {
        if let Some(agent) = &state.agent_id {
            self.check_agent(agent)?;
        }
        self.check_model(&state.model)?;
        for model in &state.fallback_models {
            self.check_model(model)?;
        }
        for model in named_models {
            self.check_model(model)?;
        }
        self.check_tools(
            state
                .tools
                .iter()
                .map(|spec| spec.name.as_str())
                .filter(|name| !state.client_tools.iter().any(|client| client == name)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentry_llm::GenerationParams;
    use agentry_types::ToolSpec;

    fn state(model: &str, tools: &[&str]) -> RunState {
        RunState::new(
            model,
            Vec::new(),
            tools
                .iter()
                .map(|name| ToolSpec::new(*name, "", serde_json::json!({"type": "object"})))
                .collect(),
            GenerationParams::default(),
            crate::RunLimits::default(),
        )
    }

    fn limited() -> Grant {
        Grant {
            agents: Some(vec!["helper".into()]),
            models: Some(vec!["mock".into()]),
            tools: Some(vec!["current_time".into()]),
            no_commands: false,
        }
    }

    #[test]
    fn a_resolved_run_is_held_to_every_list() {
        let grant = limited();
        assert_eq!(
            grant.check_run(&state("mock", &["current_time"]), []),
            Ok(())
        );
        assert_eq!(
            grant.check_run(&state("other", &[]), []),
            Err(AccessDenied::Model("other".into()))
        );
        assert_eq!(
            grant.check_run(&state("mock", &["current_time", "exec", "write_file"]), []),
            Err(AccessDenied::Tools(vec![
                "exec".into(),
                "write_file".into()
            ]))
        );
        let mut fallback = state("mock", &[]);
        fallback.fallback_models = vec!["anth".into()];
        assert_eq!(
            grant.check_run(&fallback, []),
            Err(AccessDenied::Model("anth".into()))
        );
        assert_eq!(
            grant.check_run(&state("mock", &[]), ["eyes"]),
            Err(AccessDenied::Model("eyes".into()))
        );
        let mut agent = state("mock", &[]);
        agent.agent_id = Some("shared".into());
        assert_eq!(
            grant.check_run(&agent, []),
            Err(AccessDenied::Agent("shared".into()))
        );
        // The client's own tools are not the server's.
        let mut client = state("mock", &["lookup"]);
        client.client_tools = vec!["lookup".into()];
        assert_eq!(grant.check_run(&client, []), Ok(()));
    }

    #[test]
    fn an_agent_brings_its_tools_and_a_request_only_narrows_them() {
        let grant = limited().running_as(Some(vec!["current_time".into(), "delegate".into()]));
        assert_eq!(grant.check_tools(["delegate"]), Ok(()));
        assert_eq!(
            grant.check_tools(["write_file"]),
            Err(AccessDenied::Tools(vec!["write_file".into()]))
        );
        // An agent offered every tool by its administrator brings every tool.
        let all = limited().running_as(Some(vec!["*".into()]));
        assert_eq!(all.check_tools(["exec"]), Ok(()));
        // An agent without tools brings none.
        let none = limited().running_as(None);
        assert_eq!(
            none.check_tools(["current_time"]),
            Err(AccessDenied::Tools(vec!["current_time".into()]))
        );
        assert!(Grant::default().is_unlimited());
        assert!(!limited().is_unlimited());
        // Where commands run without isolation, no tool that runs them is offered.
        let local = Grant {
            no_commands: true,
            ..Grant::default()
        };
        assert!(!local.is_unlimited());
        assert_eq!(
            local.check_commands([("exec", true), ("current_time", false)]),
            Err(AccessDenied::Commands(vec!["exec".into()]))
        );
        assert_eq!(Grant::default().check_commands([("exec", true)]), Ok(()));
    }
}
