//! Secrets inside the process: their values, and where each may be sent.
//!
//! A secret may be bound to hosts when it is written (`POST /v1/env {"name", "value", "hosts"}`).
//! A bound secret reaches only a model, HTTP tool or MCP server whose URL's host matches one of
//! its patterns, and never a process (a stdio MCP server's environment), which could send it
//! anywhere. The list is sealed with the value ([`agentry_store::Store::put_bound_secret`]), so
//! an administrator who does not know the value cannot widen it, and pointing a model's
//! `base_url` elsewhere makes the model unusable instead of sending the key away. An unbound
//! secret goes wherever it is named, as before.

use std::collections::HashMap;

use agentry_core::approval::domain_matches;
use agentry_core::network::NetworkPolicy;
use agentry_mcp::McpServerConfig;
use agentry_store::{OpenedSecret, Store};
use agentry_tools::{HeaderDefinition, StaticSecrets, ToolDefinition};

use crate::error::{AppError, Failure};

/// The most host patterns one secret may be bound to.
pub const MAX_SECRET_HOSTS: usize = 16;

/// Checks and normalizes the host patterns a secret is bound to: 1 to [`MAX_SECRET_HOSTS`]
/// entries in the grammar of `fetch`'s allow-lists — host names (`api.openai.com`), IP
/// addresses (`127.0.0.1`, `[::1]`) or `*.` and a domain (`*.openai.azure.com`: any name under
/// it, not the domain itself) — lowercased, without duplicates.
pub fn check_hosts(secret: &str, hosts: &[String]) -> Result<Vec<String>, AppError> {
    if hosts.is_empty() || hosts.len() > MAX_SECRET_HOSTS {
        return Err(AppError::bad_request(format!(
            "secret {secret:?}: \"hosts\" lists 1 to {MAX_SECRET_HOSTS} hosts"
        )));
    }
    let mut checked: Vec<String> = Vec::with_capacity(hosts.len());
    for host in hosts {
        let pattern = host.trim().trim_end_matches('.').to_ascii_lowercase();
        if !checked.contains(&pattern) {
            checked.push(pattern);
        }
    }
    agentry_tools::validate_network_policy(&NetworkPolicy::Allow(checked.clone())).map_err(
        |error| {
            AppError::bad_request(format!(
                "secret {secret:?}: {error} (give host names, IP addresses or \"*.\" and a \
                 domain, without a scheme, port or path)"
            ))
        },
    )?;
    Ok(checked)
}

/// Where a secret is about to be sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretUse {
    /// In a request to this host (lowercase, IPv6 in brackets).
    Host(String),
    /// Into a process's environment (a stdio MCP server).
    Process,
}

impl SecretUse {
    /// The host of `url`; a URL without one is refused.
    pub fn of_url(url: &str) -> Result<Self, AppError> {
        let parsed = reqwest::Url::parse(url)
            .map_err(|error| AppError::bad_request(format!("invalid URL {url:?}: {error}")))?;
        let host = parsed
            .host_str()
            .ok_or_else(|| AppError::bad_request(format!("the URL {url:?} names no host")))?;
        Ok(Self::Host(host.trim_end_matches('.').to_ascii_lowercase()))
    }

    fn allowed_by(&self, hosts: &[String]) -> bool {
        match self {
            Self::Host(host) => hosts.iter().any(|pattern| domain_matches(host, pattern)),
            Self::Process => false,
        }
    }
}

impl std::fmt::Display for SecretUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Host(host) => write!(f, "to {host}"),
            Self::Process => f.write_str("into a process's environment"),
        }
    }
}

/// The stored secrets, decrypted, with their bindings. Values leave only through a check of
/// where they go.
#[derive(Debug, Default)]
pub struct Secrets {
    by_name: HashMap<String, OpenedSecret>,
}

impl Secrets {
    /// Every stored secret.
    pub async fn load(store: &Store) -> Result<Self, AppError> {
        Ok(Self {
            by_name: store.reveal_secrets().await?.into_iter().collect(),
        })
    }

    /// Whether a secret called `name` is set.
    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// The value of `name` for `user` (a phrase naming who sends it: `model "gpt"`) sending it
    /// `to`: `None` when it is not set; a 403 `secret_host_not_allowed` when it is bound and
    /// `to` is not among its hosts.
    pub fn value_for(
        &self,
        name: &str,
        user: &str,
        to: &SecretUse,
    ) -> Result<Option<&str>, AppError> {
        let Some(secret) = self.by_name.get(name) else {
            return Ok(None);
        };
        if let Some(hosts) = &secret.hosts
            && !to.allowed_by(hosts)
        {
            return Err(AppError::new(
                Failure::Forbidden,
                "secret_host_not_allowed",
                format!(
                    "{user} would send the secret {name:?} {to}, but it may only be sent to {} \
                     (the hosts it was set with; set it again with other \"hosts\" to change them)",
                    hosts.join(", ")
                ),
            ));
        }
        Ok(Some(secret.value.as_str()))
    }

    /// A resolver for `user` sending to `to`, holding each secret of `names`: each must be set
    /// and allowed there (an error names the first that is not). Only those secrets are in it.
    pub fn resolver_for<'a>(
        &self,
        names: impl IntoIterator<Item = &'a str>,
        user: &str,
        to: &SecretUse,
    ) -> Result<StaticSecrets, AppError> {
        let mut values = HashMap::new();
        for name in names {
            let value = self.value_for(name, user, to)?.ok_or_else(|| {
                AppError::bad_request(format!(
                    "{user} uses the secret {name:?}, which is not set (POST /v1/env)"
                ))
            })?;
            values.insert(name.to_owned(), value.to_owned());
        }
        Ok(StaticSecrets(values))
    }

    /// The secrets a saved tool's definition names, for its URL (an HTTP tool's headers; a
    /// command tool names none).
    pub fn for_tool(&self, definition: &ToolDefinition) -> Result<StaticSecrets, AppError> {
        match definition {
            ToolDefinition::Http {
                name, url, headers, ..
            } => {
                let names = headers.values().filter_map(|header| match header {
                    HeaderDefinition::Secret { secret } => Some(secret.as_str()),
                    HeaderDefinition::Literal(_) => None,
                });
                self.resolver_for(names, &format!("tool {name:?}"), &SecretUse::of_url(url)?)
            }
            ToolDefinition::Command { .. } => Ok(StaticSecrets::default()),
        }
    }

    /// The secrets an MCP server's configuration names: for its URL, or for its process's
    /// environment when it is a stdio server.
    pub fn for_mcp_server(
        &self,
        name: &str,
        config: &McpServerConfig,
    ) -> Result<StaticSecrets, AppError> {
        let to = match &config.url {
            Some(url) => SecretUse::of_url(url)?,
            None => SecretUse::Process,
        };
        self.resolver_for(config.secret_names(), &format!("MCP server {name:?}"), &to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(list: &[&str]) -> Vec<String> {
        list.iter().map(|host| (*host).to_owned()).collect()
    }

    #[test]
    fn patterns_are_checked_and_normalized() {
        assert_eq!(
            check_hosts(
                "k",
                &hosts(&["API.OpenAI.com.", "*.example.com", "127.0.0.1", "[::1]"])
            )
            .unwrap(),
            hosts(&["api.openai.com", "*.example.com", "127.0.0.1", "[::1]"])
        );
        for bad in [
            "https://api.openai.com",
            "api.openai.com:443",
            "api.openai.com/v1",
            "*",
            "*.",
            "a.*.com",
            "-a.com",
            "",
            "[not-v6]",
        ] {
            assert!(
                check_hosts("k", &hosts(&[bad])).is_err(),
                "{bad:?} accepted"
            );
        }
        assert!(check_hosts("k", &[]).is_err());
        assert!(check_hosts("k", &vec!["a.com".to_owned(); MAX_SECRET_HOSTS + 1]).is_err());
    }

    #[test]
    fn a_wildcard_matches_names_under_the_domain_only() {
        assert!(domain_matches("a.example.com", "*.example.com"));
        assert!(domain_matches("a.b.example.com", "*.example.com"));
        assert!(!domain_matches("example.com", "*.example.com"));
        assert!(!domain_matches("evilexample.com", "*.example.com"));
        assert!(domain_matches("api.openai.com", "api.openai.com"));
        assert!(!domain_matches(
            "api.openai.com.evil.example",
            "api.openai.com"
        ));
    }

    #[test]
    fn a_bound_secret_goes_only_to_its_hosts_and_never_to_a_process() {
        let mut secrets = Secrets::default();
        secrets.by_name.insert(
            "KEY".into(),
            OpenedSecret {
                value: "sk-1".into(),
                hosts: Some(hosts(&["api.example.com"])),
            },
        );
        secrets.by_name.insert(
            "FREE".into(),
            OpenedSecret {
                value: "v".into(),
                hosts: None,
            },
        );
        let good = SecretUse::of_url("https://API.example.com/v1").unwrap();
        let evil = SecretUse::of_url("http://127.0.0.1:9/").unwrap();
        assert_eq!(secrets.value_for("KEY", "m", &good).unwrap(), Some("sk-1"));
        let refused = secrets.value_for("KEY", "model \"m\"", &evil).unwrap_err();
        assert_eq!(refused.code, "secret_host_not_allowed");
        assert!(!refused.message.contains("sk-1"));
        assert!(secrets.value_for("KEY", "m", &SecretUse::Process).is_err());
        assert_eq!(secrets.value_for("FREE", "m", &evil).unwrap(), Some("v"));
        assert_eq!(secrets.value_for("ABSENT", "m", &evil).unwrap(), None);
        let resolver = secrets.resolver_for(["FREE"], "t", &evil).unwrap();
        assert_eq!(resolver.0.len(), 1);
        assert!(secrets.resolver_for(["FREE", "KEY"], "t", &evil).is_err());
        assert!(secrets.resolver_for(["ABSENT"], "t", &good).is_err());
    }
}
