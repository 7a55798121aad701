//! Network policies: which hosts the `fetch` tool may reach, as a run narrows them.
//!
//! The policy is data the run carries ([`RunRequest::network`](crate::RunRequest::network),
//! [`RunState::network`](crate::RunState::network), [`ToolContext::network`]): a saved agent's
//! `network` setting and a delegating run's narrowings. The tool that enforces it (`fetch`, in
//! the `agentry-tools` crate) owns the allow-list grammar and checks it; the [`Runtime`] checks
//! a run's narrowings before it starts with the [`NetworkCheck`] its builder was given
//! ([`RuntimeBuilder::network_check`]).
//!
//! [`ToolContext::network`]: crate::tool::ToolContext::network
//! [`Runtime`]: crate::Runtime
//! [`RuntimeBuilder::network_check`]: crate::RuntimeBuilder::network_check

use serde::{Deserialize, Serialize};

/// The most entries one allow-list may have.
pub const MAX_ALLOW_ENTRIES: usize = 256;

/// Which hosts `fetch` may reach.
///
/// Serialised as `"off"`, `"public"`, `"any"` or `{"allow": ["docs.rs", "*.python.org"]}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkPolicy {
    /// No fetching at all (the default).
    #[default]
    Off,
    /// Any host at a public address.
    Public,
    /// Only these hosts: `example.com` (that name exactly), `*.example.com` (its subdomains at
    /// any depth, not the name itself), or an IP address written exactly (`203.0.113.7`,
    /// `[::1]`). Matching ignores case and a trailing dot. The hosts must still be at public
    /// addresses unless the fetch tool's configuration names them as private hosts.
    Allow(Vec<String>),
    /// Anything, private networks and loopback included.
    Any,
}

/// Why a network policy is not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetworkPolicyError {
    /// An allow-list entry is not a host name, a `*.` wildcard name or an IP address.
    #[error("{0}")]
    InvalidEntry(String),
    /// An allow-list is longer than [`MAX_ALLOW_ENTRIES`].
    #[error("a network allow-list has at most {MAX_ALLOW_ENTRIES} entries, not {0}")]
    TooManyEntries(usize),
}

/// Checks a network policy (its allow-list's entries and length), as the tool that enforces
/// policies reads them: `agentry_tools::validate_network_policy`.
pub type NetworkCheck = fn(&NetworkPolicy) -> Result<(), NetworkPolicyError>;
