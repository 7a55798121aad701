//! Approval policies: which tool calls wait for a person before they run.
//!
//! An [`ApprovalPolicy`] gives each tool (by name, with a `default` for the others) one of:
//!
//! - `"always"`: every call waits for approval;
//! - `"never"`: calls run at once (the default);
//! - a rule on the arguments, `{"ask_if": {…}}` (wait when a matcher matches) or
//!   `{"allow_if": {…}}` (run at once only when every checked argument matches, wait
//!   otherwise). Matchers: `commands` (glob patterns with `*` and `?`, or regular expressions
//!   written `re:<regex>`, on `command`-like arguments: `command`, `cmd`, `script`),
//!   `path_prefixes` (on path-like arguments: `path`, `file`, `dir`, `directory`, `cwd`,
//!   `source`, `destination`, `paths` and any `*_path`; paths are normalised lexically first,
//!   so `src/../etc` is not under `src`), and `domains` (on `url`-like arguments: `url`,
//!   `uri`, `urls`, `href`, `endpoint`; `example.com` is that host, `*.example.com` its
//!   subdomains).
//!
//! `unknown_outcome: "ask"` sends a non-idempotent call whose outcome a crash left unknown to
//! a person instead of giving it an "outcome unknown" result.
//!
//! The policy is plain data in the run's state ([`crate::RunState::approvals`]) and in the
//! log's `run_started`, so a run waiting for approval survives a restart.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use agentry_types::{ApprovalVerdict, ToolCall};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Why a policy or a decision is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ApprovalError {
    /// The policy cannot be used as written.
    #[error("invalid approval policy: {0}")]
    InvalidPolicy(String),
    /// No call of the run waits for a decision under this id.
    #[error("no tool call {0:?} is waiting for approval")]
    UnknownCall(String),
    /// The call was decided already.
    #[error("tool call {0:?} was decided already")]
    AlreadyDecided(String),
    /// The decision is incomplete or contradictory.
    #[error("invalid decision: {0}")]
    InvalidDecision(String),
    /// The run is not waiting for approvals.
    #[error("the run is not waiting for approvals")]
    NotWaiting,
}

/// `always` or `never`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalMode {
    /// Every call waits for approval.
    Always,
    /// Calls run at once.
    Never,
}

/// What decides whether one tool's calls wait.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum ToolPolicy {
    /// `always` or `never`.
    Mode(ApprovalMode),
    /// A rule on the arguments.
    Rule(ApprovalRule),
}

impl<'de> Deserialize<'de> for ToolPolicy {
    /// `"always"`, `"never"` or a rule object, with an error that says so (an untagged enum
    /// would only say that nothing matched).
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match Value::deserialize(deserializer)? {
            Value::String(mode) => match mode.as_str() {
                "always" => Ok(Self::Mode(ApprovalMode::Always)),
                "never" => Ok(Self::Mode(ApprovalMode::Never)),
                other => Err(D::Error::custom(format!(
                    "unknown approval policy {other:?}: use \"always\", \"never\" or a rule \
                     ({{\"ask_if\": …}} or {{\"allow_if\": …}})"
                ))),
            },
            rule @ Value::Object(_) => serde_json::from_value(rule)
                .map(Self::Rule)
                .map_err(|error| D::Error::custom(format!("invalid approval rule: {error}"))),
            other => Err(D::Error::custom(format!(
                "an approval policy is \"always\", \"never\" or a rule object, not {other}"
            ))),
        }
    }
}

/// A rule on a call's arguments: give exactly one of `ask_if` and `allow_if`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalRule {
    /// Wait for approval when any checked argument matches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ask_if: Option<Matchers>,
    /// Run at once only when every checked argument matches (and at least one was checked);
    /// wait otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_if: Option<Matchers>,
}

/// Matchers on arguments.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Matchers {
    /// Patterns for `command`-like arguments: globs (`*`, `?`) or `re:<regex>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub commands: Vec<String>,
    /// Path prefixes for path-like arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub path_prefixes: Vec<String>,
    /// Domains for `url`-like arguments (`*.example.com` for subdomains).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub domains: Vec<String>,
}

/// A person's decision on one call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalDecision {
    /// The call decided on.
    pub call_id: String,
    /// `approve`, `reject` or `edit`.
    pub decision: ApprovalVerdict,
    /// Why; for a rejection the model reads it as the call's error result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The arguments to run the call with (required for `edit`, refused otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Value>,
}

impl ApprovalDecision {
    /// Checks that the decision is complete: `edit` has an object of arguments, the others
    /// have none.
    pub fn check(&self) -> Result<(), ApprovalError> {
        match (self.decision, &self.arguments) {
            (ApprovalVerdict::Edit, Some(Value::Object(_))) => Ok(()),
            (ApprovalVerdict::Edit, _) => Err(ApprovalError::InvalidDecision(
                "`edit` needs `arguments`, a JSON object".into(),
            )),
            (_, Some(_)) => Err(ApprovalError::InvalidDecision(format!(
                "`arguments` go with `edit`, not `{}`",
                self.decision.as_str()
            ))),
            (_, None) => Ok(()),
        }
        .and_then(|()| match &self.reason {
            Some(reason) if reason.len() > 4096 => Err(ApprovalError::InvalidDecision(
                "a reason has at most 4096 bytes".into(),
            )),
            _ => Ok(()),
        })
    }
}

/// What to do, after a crash, with a non-idempotent call whose outcome is unknown.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnknownOutcome {
    /// Give it an explicit "outcome unknown" error result (the default).
    #[default]
    Interrupt,
    /// Ask a person: approve runs it again, reject gives the reason as its result.
    Ask,
}

/// Which tool calls wait for a person. Empty by default: nothing waits.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalPolicy {
    /// Policies by tool name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tools: BTreeMap<String, ToolPolicy>,
    /// The policy of tools not named in `tools` (default: `never`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<ToolPolicy>,
    /// After a crash, a non-idempotent call whose outcome is unknown (default: `interrupt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unknown_outcome: Option<UnknownOutcome>,
}

const COMMAND_KEYS: &[&str] = &["command", "cmd", "script"];
const PATH_KEYS: &[&str] = &[
    "path",
    "file",
    "dir",
    "directory",
    "cwd",
    "source",
    "destination",
    "paths",
];
const URL_KEYS: &[&str] = &["url", "uri", "urls", "href", "endpoint"];

/// Most entries one policy may hold (tools, and patterns per matcher).
const MAX_ENTRIES: usize = 256;

impl ApprovalPolicy {
    /// Whether the policy asks for nothing (no tool rules, no default, no unknown-outcome
    /// option).
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty() && self.default.is_none() && self.unknown_outcome.is_none()
    }

    /// Whether any call could ever wait under this policy.
    pub fn may_ask(&self) -> bool {
        self.tools
            .values()
            .chain(self.default.as_ref())
            .any(|policy| !matches!(policy, ToolPolicy::Mode(ApprovalMode::Never)))
            || self.unknown_outcome == Some(UnknownOutcome::Ask)
    }

    /// `other` over `self`: its tool entries replace these, its default and unknown-outcome
    /// option win where given (a request's policy over its agent's).
    #[must_use]
    pub fn merged(mut self, other: &ApprovalPolicy) -> Self {
        for (tool, policy) in &other.tools {
            self.tools.insert(tool.clone(), policy.clone());
        }
        if other.default.is_some() {
            self.default.clone_from(&other.default);
        }
        if other.unknown_outcome.is_some() {
            self.unknown_outcome = other.unknown_outcome;
        }
        self
    }

    /// What happens to a call whose outcome a crash left unknown.
    pub fn unknown_outcome(&self) -> UnknownOutcome {
        self.unknown_outcome.unwrap_or_default()
    }

    /// Checks every rule: patterns compile, prefixes and domains are well formed.
    pub fn validate(&self) -> Result<(), ApprovalError> {
        if self.tools.len() > MAX_ENTRIES {
            return Err(invalid(format!(
                "at most {MAX_ENTRIES} tools may have a policy"
            )));
        }
        for (name, policy) in &self.tools {
            if name.is_empty() || name.len() > 128 {
                return Err(invalid("a tool name has 1 to 128 characters"));
            }
            validate_policy(policy).map_err(|e| invalid(format!("tool {name:?}: {e}")))?;
        }
        if let Some(policy) = &self.default {
            validate_policy(policy).map_err(|e| invalid(format!("default: {e}")))?;
        }
        Ok(())
    }

    /// Why `call` needs approval, or `None` when it may run at once.
    pub fn check(&self, call: &ToolCall) -> Option<String> {
        let policy = self.tools.get(&call.name).or(self.default.as_ref())?;
        match policy {
            ToolPolicy::Mode(ApprovalMode::Never) => None,
            ToolPolicy::Mode(ApprovalMode::Always) => {
                Some(format!("every call of {:?} needs approval", call.name))
            }
            ToolPolicy::Rule(rule) => rule.check(&call.arguments),
        }
    }
}

fn invalid(message: impl Into<String>) -> ApprovalError {
    ApprovalError::InvalidPolicy(message.into())
}

fn validate_policy(policy: &ToolPolicy) -> Result<(), String> {
    let ToolPolicy::Rule(rule) = policy else {
        return Ok(());
    };
    let matchers = match (&rule.ask_if, &rule.allow_if) {
        (Some(m), None) | (None, Some(m)) => m,
        _ => return Err("a rule has exactly one of `ask_if` and `allow_if`".into()),
    };
    if matchers.commands.is_empty()
        && matchers.path_prefixes.is_empty()
        && matchers.domains.is_empty()
    {
        return Err("a rule needs `commands`, `path_prefixes` or `domains`".into());
    }
    for list in [
        &matchers.commands,
        &matchers.path_prefixes,
        &matchers.domains,
    ] {
        if list.len() > MAX_ENTRIES {
            return Err(format!("at most {MAX_ENTRIES} entries per matcher"));
        }
        if list
            .iter()
            .any(|entry| entry.trim().is_empty() || entry.len() > 1024)
        {
            return Err("matcher entries have 1 to 1024 characters".into());
        }
    }
    for pattern in &matchers.commands {
        command_regex(pattern)?;
    }
    for domain in &matchers.domains {
        let bare = domain.strip_prefix("*.").unwrap_or(domain);
        if bare.is_empty()
            || bare.contains(['/', ':', '*', ' ', '@'])
            || bare.starts_with('.')
            || bare.ends_with('.')
        {
            return Err(format!(
                "{domain:?} is not a domain (write `example.com` or `*.example.com`)"
            ));
        }
    }
    Ok(())
}

/// A command pattern as a regular expression anchored on the whole command.
fn command_regex(pattern: &str) -> Result<regex::Regex, String> {
    let source = match pattern.strip_prefix("re:") {
        Some(regex) => regex.to_owned(),
        None => {
            let mut source = String::from("(?s)^");
            for c in pattern.chars() {
                match c {
                    '*' => source.push_str(".*"),
                    '?' => source.push('.'),
                    other => source.push_str(&regex::escape(&other.to_string())),
                }
            }
            source.push('$');
            source
        }
    };
    regex::RegexBuilder::new(&source)
        .size_limit(1 << 20)
        .build()
        .map_err(|error| format!("the command pattern {pattern:?} is invalid: {error}"))
}

/// What a matcher found in a call's arguments.
#[derive(Debug, Default)]
struct Findings {
    /// Arguments of a kind the matchers check.
    checked: usize,
    /// Of those, the ones that matched.
    matched: Vec<String>,
    /// Of those, the ones that did not.
    unmatched: Vec<String>,
}

impl ApprovalRule {
    fn check(&self, arguments: &Value) -> Option<String> {
        if let Some(matchers) = &self.ask_if {
            let found = matchers.inspect(arguments);
            return found
                .matched
                .first()
                .map(|what| format!("{what} matches a rule that asks for approval"));
        }
        if let Some(matchers) = &self.allow_if {
            let found = matchers.inspect(arguments);
            if found.checked == 0 {
                return Some("the call has no argument the rule's allow-list can check".to_owned());
            }
            return found
                .unmatched
                .first()
                .map(|what| format!("{what} is outside what the rule allows without approval"));
        }
        // An invalid rule (never validated) asks, rather than letting anything through.
        Some("the tool's approval rule is incomplete".to_owned())
    }
}

impl Matchers {
    fn inspect(&self, arguments: &Value) -> Findings {
        let mut found = Findings::default();
        let Some(object) = arguments.as_object() else {
            return found;
        };
        for (key, value) in object {
            let key_lower = key.to_ascii_lowercase();
            let strings = strings_of(value);
            if !self.commands.is_empty() && COMMAND_KEYS.contains(&key_lower.as_str()) {
                let patterns: Vec<regex::Regex> = self
                    .commands
                    .iter()
                    .filter_map(|p| command_regex(p).ok())
                    .collect();
                for command in &strings {
                    found.checked += 1;
                    let what = format!("the command {:?}", truncate(command));
                    if patterns.iter().any(|p| p.is_match(command.trim())) {
                        found.matched.push(what);
                    } else {
                        found.unmatched.push(what);
                    }
                }
            }
            if !self.path_prefixes.is_empty()
                && (PATH_KEYS.contains(&key_lower.as_str()) || key_lower.ends_with("_path"))
            {
                for path in &strings {
                    found.checked += 1;
                    let what = format!("the path {:?}", truncate(path));
                    if self
                        .path_prefixes
                        .iter()
                        .any(|prefix| path_under(path, prefix))
                    {
                        found.matched.push(what);
                    } else {
                        found.unmatched.push(what);
                    }
                }
            }
            if !self.domains.is_empty() && URL_KEYS.contains(&key_lower.as_str()) {
                for url in &strings {
                    found.checked += 1;
                    let what = format!("the URL {:?}", truncate(url));
                    let host = host_of(url);
                    if host
                        .as_deref()
                        .is_some_and(|host| self.domains.iter().any(|d| domain_matches(host, d)))
                    {
                        found.matched.push(what);
                    } else {
                        found.unmatched.push(what);
                    }
                }
            }
        }
        found
    }
}

fn truncate(text: &str) -> String {
    let mut short: String = text.chars().take(200).collect();
    if short.len() < text.len() {
        short.push('…');
    }
    short
}

/// The strings of an argument: itself, or the strings of a list.
fn strings_of(value: &Value) -> Vec<String> {
    match value {
        Value::String(text) => vec![text.clone()],
        Value::Array(items) => items
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    }
}

/// `path` with `.` and `..` resolved lexically (a `..` above the start is kept).
fn normalise(path: &Path) -> PathBuf {
    let mut out: Vec<Component<'_>> = Vec::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => match out.last() {
                Some(Component::Normal(_)) => {
                    out.pop();
                }
                Some(Component::RootDir | Component::Prefix(_)) => {}
                _ => out.push(component),
            },
            other => out.push(other),
        }
    }
    out.iter().collect()
}

/// Whether `path` is `prefix` or lies under it, after lexical normalisation.
pub fn path_under(path: &str, prefix: &str) -> bool {
    let path = normalise(Path::new(path));
    let prefix = normalise(Path::new(prefix));
    if prefix.as_os_str().is_empty() {
        // `.` or `./`: anything relative that does not climb out.
        return path.is_relative()
            && !matches!(path.components().next(), Some(Component::ParentDir));
    }
    path.starts_with(&prefix)
}

/// The host of a URL, lowercase, without a trailing dot.
fn host_of(url: &str) -> Option<String> {
    let parsed = url::Url::parse(url.trim()).ok()?;
    let host = parsed.host_str()?;
    Some(host.trim_end_matches('.').to_ascii_lowercase())
}

/// Whether `host` is `domain`, or a subdomain of it for `*.domain`.
pub fn domain_matches(host: &str, domain: &str) -> bool {
    let domain = domain.trim().trim_end_matches('.').to_ascii_lowercase();
    match domain.strip_prefix("*.") {
        Some(parent) => host
            .strip_suffix(parent)
            .is_some_and(|rest| rest.ends_with('.') && rest.len() > 1),
        None => host == domain,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(name: &str, arguments: Value) -> ToolCall {
        ToolCall::new("c1", name, arguments)
    }

    fn policy(value: Value) -> ApprovalPolicy {
        let policy: ApprovalPolicy = serde_json::from_value(value).unwrap();
        policy.validate().unwrap();
        policy
    }

    #[test]
    fn always_never_and_the_default() {
        let p = policy(json!({"tools": {"exec": "always", "read_file": "never"}}));
        assert!(p.check(&call("exec", json!({"command": "ls"}))).is_some());
        assert!(p.check(&call("read_file", json!({"path": "a"}))).is_none());
        assert!(p.check(&call("other", json!({}))).is_none());
        let p = policy(json!({"default": "always", "tools": {"read_file": "never"}}));
        assert!(p.check(&call("other", json!({}))).is_some());
        assert!(p.check(&call("read_file", json!({"path": "a"}))).is_none());
        assert!(ApprovalPolicy::default().is_empty());
        assert!(!ApprovalPolicy::default().may_ask());
    }

    #[test]
    fn command_patterns_glob_and_regex() {
        let p = policy(
            json!({"tools": {"exec": {"ask_if": {"commands": ["rm *", "re:^git\\s+push"]}}}}),
        );
        assert!(
            p.check(&call("exec", json!({"command": "rm -rf /tmp/x"})))
                .is_some()
        );
        assert!(
            p.check(&call("exec", json!({"command": "git  push origin"})))
                .is_some()
        );
        assert!(
            p.check(&call("exec", json!({"command": "ls -la"})))
                .is_none()
        );
        assert!(
            p.check(&call("exec", json!({"command": "echo rm x"})))
                .is_none()
        );
        let p = policy(json!({"tools": {"exec": {"allow_if": {"commands": ["ls*", "cat ?"]}}}}));
        assert!(
            p.check(&call("exec", json!({"command": "ls -la"})))
                .is_none()
        );
        assert!(
            p.check(&call("exec", json!({"command": "cat a"})))
                .is_none()
        );
        assert!(
            p.check(&call("exec", json!({"command": "cat ab"})))
                .is_some()
        );
        // Nothing to check under an allow-list: ask.
        assert!(p.check(&call("exec", json!({"other": "x"}))).is_some());
        let bad: ApprovalPolicy =
            serde_json::from_value(json!({"tools": {"exec": {"ask_if": {"commands": ["re:("]}}}}))
                .unwrap();
        assert!(matches!(
            bad.validate(),
            Err(ApprovalError::InvalidPolicy(_))
        ));
    }

    #[test]
    fn path_prefixes_are_normalised() {
        let p = policy(
            json!({"tools": {"write_file": {"allow_if": {"path_prefixes": ["src", "/tmp/out"]}}}}),
        );
        assert!(
            p.check(&call("write_file", json!({"path": "src/main.rs"})))
                .is_none()
        );
        assert!(
            p.check(&call("write_file", json!({"path": "./src/a/../b.rs"})))
                .is_none()
        );
        assert!(
            p.check(&call("write_file", json!({"path": "src/../etc/passwd"})))
                .is_some()
        );
        assert!(
            p.check(&call("write_file", json!({"path": "srcx/a"})))
                .is_some()
        );
        assert!(
            p.check(&call("write_file", json!({"file_path": "/tmp/out/x"})))
                .is_none()
        );
        assert!(
            p.check(&call("write_file", json!({"path": "/tmp/outside"})))
                .is_some()
        );
        let p = policy(json!({"tools": {"edit_file": {"ask_if": {"path_prefixes": [".git"]}}}}));
        assert!(
            p.check(&call("edit_file", json!({"path": ".git/config"})))
                .is_some()
        );
        assert!(
            p.check(&call("edit_file", json!({"path": "a/../.git/hooks/x"})))
                .is_some()
        );
        assert!(
            p.check(&call("edit_file", json!({"path": "src/git"})))
                .is_none()
        );
    }

    #[test]
    fn url_domains() {
        let p = policy(
            json!({"tools": {"fetch": {"allow_if": {"domains": ["docs.rs", "*.example.com"]}}}}),
        );
        assert!(
            p.check(&call("fetch", json!({"url": "https://docs.rs/serde"})))
                .is_none()
        );
        assert!(
            p.check(&call("fetch", json!({"url": "https://API.example.com./x"})))
                .is_none()
        );
        assert!(
            p.check(&call("fetch", json!({"url": "https://example.com/"})))
                .is_some()
        );
        assert!(
            p.check(&call("fetch", json!({"url": "https://evil-docs.rs/"})))
                .is_some()
        );
        assert!(
            p.check(&call("fetch", json!({"url": "https://docs.rs@evil.com/"})))
                .is_some()
        );
        assert!(
            p.check(&call("fetch", json!({"url": "not a url"})))
                .is_some()
        );
        let bad: ApprovalPolicy = serde_json::from_value(
            json!({"tools": {"fetch": {"ask_if": {"domains": ["https://x.com"]}}}}),
        )
        .unwrap();
        assert!(bad.validate().is_err());
    }

    #[test]
    fn bad_policies_say_what_is_wrong() {
        let error = serde_json::from_value::<ApprovalPolicy>(json!({"tools": {"t": "sometimes"}}))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("sometimes") && error.contains("always"),
            "{error}"
        );
        let error = serde_json::from_value::<ApprovalPolicy>(
            json!({"tools": {"t": {"ask_if": {"commandz": ["x"]}}}}),
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("commandz"), "{error}");
        assert!(serde_json::from_value::<ApprovalPolicy>(json!({"tools": {"t": 3}})).is_err());
    }

    #[test]
    fn rules_need_exactly_one_side_and_merge_per_tool() {
        let both: ApprovalPolicy = serde_json::from_value(json!({"tools": {"t": {
            "ask_if": {"commands": ["x"]}, "allow_if": {"commands": ["y"]}}}}))
        .unwrap();
        assert!(both.validate().is_err());
        let agent = policy(json!({"tools": {"exec": "always", "fetch": "always"}}));
        let request = policy(json!({"tools": {"exec": "never"}, "unknown_outcome": "ask"}));
        let merged = agent.merged(&request);
        assert!(merged.check(&call("exec", json!({}))).is_none());
        assert!(merged.check(&call("fetch", json!({}))).is_some());
        assert_eq!(merged.unknown_outcome(), UnknownOutcome::Ask);
    }
}
