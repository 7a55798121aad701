//! What a tool can do, for least privilege: every tool has a [`RiskClass`] and says whether it
//! may act on the host outside any sandbox; an operator's [`ApprovalDefaults`] turn classes
//! (and host access) into approvals that runs get unless their own policy says otherwise.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::approval::{ApprovalMode, ApprovalPolicy, ToolPolicy};

/// What kind of thing a tool does, from the least to the most consequential.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum RiskClass {
    /// Reads or computes; changes nothing (`current_time`, `read_file`, `search`).
    #[default]
    ReadOnly,
    /// Writes files (`write_file`, `edit_file`).
    WritesFiles,
    /// Runs commands (`exec`, `terminal`, command tools).
    RunsCommands,
    /// Reaches the network (`fetch`, HTTP tools, MCP servers' tools).
    Network,
    /// Talks to other agents (`delegate`, `talk_to`).
    Agents,
}

impl RiskClass {
    /// Every class, in order.
    pub const ALL: [RiskClass; 5] = [
        Self::ReadOnly,
        Self::WritesFiles,
        Self::RunsCommands,
        Self::Network,
        Self::Agents,
    ];

    /// The class's name as the API and the CLI spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReadOnly => "read_only",
            Self::WritesFiles => "writes_files",
            Self::RunsCommands => "runs_commands",
            Self::Network => "network",
            Self::Agents => "agents",
        }
    }
}

impl std::str::FromStr for RiskClass {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|class| class.as_str() == text)
            .ok_or_else(|| {
                format!(
                    "unknown risk class {text:?}: one of {}",
                    Self::ALL.map(RiskClass::as_str).join(", ")
                )
            })
    }
}

/// A tool's risk: its class, and whether it acts on the host, outside any sandbox.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolRisk {
    /// What it does.
    pub class: RiskClass,
    /// Whether it runs on the host (a command tool or MCP server the operator allowed outside
    /// the sandbox).
    pub host: bool,
}

impl ToolRisk {
    /// A risk of `class`, confined (not on the host).
    pub const fn of(class: RiskClass) -> Self {
        Self { class, host: false }
    }

    /// The same class, on the host.
    #[must_use]
    pub const fn on_host(mut self) -> Self {
        self.host = true;
        self
    }
}

/// Which tools need a person's approval when a run's own policy does not say: an operator
/// setting. The shipped default asks for every tool that runs on the host and for nothing
/// confined to the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalDefaults {
    /// Classes whose tools always ask.
    pub classes: BTreeSet<RiskClass>,
    /// Whether tools that run on the host always ask.
    pub host: bool,
}

impl Default for ApprovalDefaults {
    fn default() -> Self {
        Self {
            classes: BTreeSet::new(),
            host: true,
        }
    }
}

impl ApprovalDefaults {
    /// Nothing asks by default (tests and embedders that decide per run).
    pub fn none() -> Self {
        Self {
            classes: BTreeSet::new(),
            host: false,
        }
    }

    /// Whether a tool of this risk asks by default.
    pub fn asks(&self, risk: ToolRisk) -> bool {
        (self.host && risk.host) || self.classes.contains(&risk.class)
    }

    /// `policy` with an `always` entry added for every offered tool (`name`, risk) that asks
    /// by default and that the policy names neither by itself nor through its `default`.
    pub fn apply<'a>(
        &self,
        mut policy: ApprovalPolicy,
        offered: impl IntoIterator<Item = (&'a str, ToolRisk)>,
    ) -> ApprovalPolicy {
        if policy.default.is_some() {
            return policy;
        }
        for (name, risk) in offered {
            if self.asks(risk) && !policy.tools.contains_key(name) {
                policy
                    .tools
                    .insert(name.to_owned(), ToolPolicy::Mode(ApprovalMode::Always));
            }
        }
        policy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_tools_ask_by_default_and_confined_ones_do_not() {
        let defaults = ApprovalDefaults::default();
        let policy = defaults.apply(
            ApprovalPolicy::default(),
            [
                ("exec", ToolRisk::of(RiskClass::RunsCommands)),
                ("deploy", ToolRisk::of(RiskClass::RunsCommands).on_host()),
                ("current_time", ToolRisk::of(RiskClass::ReadOnly)),
            ],
        );
        assert_eq!(policy.tools.keys().collect::<Vec<_>>(), ["deploy"]);
        assert!(policy.may_ask());
    }

    #[test]
    fn a_run_policy_that_names_the_tool_or_a_default_wins() {
        let defaults = ApprovalDefaults {
            classes: [RiskClass::Network].into(),
            host: true,
        };
        let mut own = ApprovalPolicy::default();
        own.tools
            .insert("deploy".into(), ToolPolicy::Mode(ApprovalMode::Never));
        let policy = defaults.apply(
            own,
            [
                ("deploy", ToolRisk::of(RiskClass::RunsCommands).on_host()),
                ("fetch", ToolRisk::of(RiskClass::Network)),
            ],
        );
        assert_eq!(
            policy.tools.get("deploy"),
            Some(&ToolPolicy::Mode(ApprovalMode::Never))
        );
        assert_eq!(
            policy.tools.get("fetch"),
            Some(&ToolPolicy::Mode(ApprovalMode::Always))
        );
        let with_default = ApprovalPolicy {
            default: Some(ToolPolicy::Mode(ApprovalMode::Never)),
            ..ApprovalPolicy::default()
        };
        let kept = defaults.apply(
            with_default.clone(),
            [("fetch", ToolRisk::of(RiskClass::Network))],
        );
        assert_eq!(kept, with_default);
        assert!(
            ApprovalDefaults::none()
                .apply(
                    ApprovalPolicy::default(),
                    [("x", ToolRisk::of(RiskClass::Network).on_host())]
                )
                .is_empty()
        );
    }

    #[test]
    fn classes_parse_from_their_names() {
        for class in RiskClass::ALL {
            assert_eq!(class.as_str().parse::<RiskClass>(), Ok(class));
        }
        assert!("root".parse::<RiskClass>().is_err());
    }
}
