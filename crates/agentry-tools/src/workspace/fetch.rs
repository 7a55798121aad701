//! `fetch`: an HTTP GET under a network policy, HTML reduced to text.
//!
//! The fetch runs on the host, so the policy guards the host's network. It is the operator's
//! choice ([`FetchConfig::policy`]), in the sandboxes' terms: off by default, an allow-list of
//! hosts (the same entries and matching as a sandbox's allow-list: `example.com` exactly,
//! `*.example.com` for its subdomains, an IP address written exactly), or every public host.
//! Whatever the policy, loopback, private, link-local, CGNAT, unique-local and multicast
//! addresses (which cover cloud metadata endpoints) are refused, except for the hosts named in
//! [`FetchConfig::private_hosts`] or under [`NetworkPolicy::Any`].
//!
//! A run may narrow the policy further, never widen it: [`ToolContext::network`] carries the
//! policies of the saved agent it runs as (and of a delegating run), and a host must pass each.
//!
//! The tool owns its HTTP clients because the checks must hold for every connection: a DNS
//! resolver filters the addresses a name resolves to and the connection goes to those (so a name
//! cannot rebind to a private address after a check), redirects are followed one by one with
//! every check applied to each hop, and no proxy from the environment is used. A refusal is a
//! tool error that names the rule and the setting that would allow the request.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use agentry_sandbox::AllowList;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::header::{CONTENT_TYPE, LOCATION};
use reqwest::{Client, Url};
use schemars::JsonSchema;
use serde::Deserialize;

use super::FETCH;
use crate::http::read_capped;
use agentry_core::network::{MAX_ALLOW_ENTRIES, NetworkPolicy, NetworkPolicyError};
use agentry_core::tool::result::{decode_cut_utf8, truncation_note};
use agentry_core::tool::{FunctionTool, ToolContext, ToolError, ToolOutput};

/// The width HTML is wrapped to when reduced to text.
const HTML_WIDTH: usize = 100;

/// How much of an error response's body an error quotes.
const ERROR_SNIPPET_BYTES: usize = 512;

/// Checks allow-list entries and builds their matcher.
fn allow_list(entries: &[String]) -> Result<AllowList, NetworkPolicyError> {
    if entries.len() > MAX_ALLOW_ENTRIES {
        return Err(NetworkPolicyError::TooManyEntries(entries.len()));
    }
    AllowList::new(entries, false).map_err(|error| match error {
        agentry_sandbox::SandboxError::InvalidRequest(message) => {
            NetworkPolicyError::InvalidEntry(message)
        }
        other => NetworkPolicyError::InvalidEntry(other.to_string()),
    })
}

/// Checks a network policy's allow-list entries (each a host name, a `*.` wildcard name or an
/// IP address; at most [`MAX_ALLOW_ENTRIES`]), as `fetch` reads them: the
/// [`NetworkCheck`](agentry_core::network::NetworkCheck) to give the runtime's builder.
pub fn validate_network_policy(policy: &NetworkPolicy) -> Result<(), NetworkPolicyError> {
    matcher(policy).map(drop)
}

/// A policy's allow-list matcher (`None` for the other policies).
fn matcher(policy: &NetworkPolicy) -> Result<Option<AllowList>, NetworkPolicyError> {
    match policy {
        NetworkPolicy::Allow(entries) => allow_list(entries).map(Some),
        NetworkPolicy::Off | NetworkPolicy::Public | NetworkPolicy::Any => Ok(None),
    }
}

/// The configuration of the `fetch` tool.
#[derive(Debug, Clone)]
pub struct FetchConfig {
    /// Which hosts it may reach (default: none).
    pub policy: NetworkPolicy,
    /// Hosts (in the allow-list's syntax) that may be reached at loopback, private, link-local
    /// and other non-public addresses, when the policy allows them at all. Empty by default, so
    /// an allowed name cannot be pointed at the host or its network (SSRF); meant for intranet
    /// services the operator names, tests and local development.
    pub private_hosts: Vec<String>,
    /// The most bytes of a response body read; the rest is cut with a note.
    pub max_bytes: usize,
    /// The timeout of the whole fetch, redirects included.
    pub timeout: Duration,
    /// How many redirects are followed.
    pub max_redirects: usize,
}

impl Default for FetchConfig {
    fn default() -> Self {
        Self {
            policy: NetworkPolicy::default(),
            private_hosts: Vec::new(),
            max_bytes: 2 * 1024 * 1024,
            timeout: Duration::from_secs(30),
            max_redirects: 5,
        }
    }
}

impl FetchConfig {
    /// Checks the policy's allow-list and [`private_hosts`](Self::private_hosts).
    pub fn validate(&self) -> Result<(), NetworkPolicyError> {
        validate_network_policy(&self.policy)?;
        allow_list(&self.private_hosts).map(drop)
    }
}

/// Arguments of `fetch`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct FetchArguments {
    /// The `http` or `https` URL to GET.
    url: String,
}

/// Which non-public addresses a client's resolver lets through.
#[derive(Clone)]
enum PrivateAccess {
    /// None.
    None,
    /// Those of these hosts.
    Hosts(Arc<AllowList>),
    /// All.
    All,
}

impl PrivateAccess {
    fn allows(&self, host: &str) -> bool {
        match self {
            Self::None => false,
            Self::Hosts(hosts) => hosts.allows_host(host),
            Self::All => true,
        }
    }
}

/// A client and the private access its resolver gives.
struct Channel {
    access: PrivateAccess,
    client: Client,
}

/// The operator's policy, checked, with the clients that enforce it.
struct Rules {
    policy: NetworkPolicy,
    allow: Option<AllowList>,
    /// The client for the operator's own private access.
    operator: Channel,
    /// The client for runs narrowed to public addresses.
    public_only: Channel,
}

struct Fetcher {
    config: FetchConfig,
    rules: Result<Rules, String>,
}

/// The `fetch` tool.
pub(super) fn fetch(config: FetchConfig) -> FunctionTool {
    let rules = Rules::new(&config);
    let fetcher = Arc::new(Fetcher { config, rules });
    let timeout = fetcher.config.timeout;
    FunctionTool::new(
        FETCH,
        "Fetches a web page or text document with HTTP GET and returns it as text (HTML is \
         reduced to readable text; long pages are cut). Only the hosts the network policy \
         allows can be reached.",
        move |arguments: FetchArguments, context: ToolContext| {
            let fetcher = Arc::clone(&fetcher);
            async move {
                let fetching = fetcher.fetch(&arguments.url, &context.network);
                tokio::select! {
                    () = context.cancel.cancelled() => Err(ToolError::Cancelled),
                    outcome = tokio::time::timeout(timeout, fetching) => {
                        outcome.unwrap_or(Err(ToolError::Timeout(timeout)))
                    }
                }
            }
        },
    )
    .with_timeout(timeout + Duration::from_secs(1))
    .idempotent()
}

impl Rules {
    fn new(config: &FetchConfig) -> Result<Rules, String> {
        let invalid =
            |error: NetworkPolicyError| format!("the fetch tool's configuration: {error}");
        let allow = matcher(&config.policy).map_err(invalid)?;
        let access = if config.policy == NetworkPolicy::Any {
            PrivateAccess::All
        } else if config.private_hosts.is_empty() {
            PrivateAccess::None
        } else {
            PrivateAccess::Hosts(Arc::new(
                allow_list(&config.private_hosts).map_err(invalid)?,
            ))
        };
        Ok(Rules {
            policy: config.policy.clone(),
            allow,
            operator: Channel::new(access)?,
            public_only: Channel::new(PrivateAccess::None)?,
        })
    }
}

impl Channel {
    fn new(access: PrivateAccess) -> Result<Channel, String> {
        // The process-wide TLS provider, as the model layer installs it; a second install is a
        // harmless no-op error.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .dns_resolver(Arc::new(PolicyResolver {
                access: access.clone(),
            }))
            .connect_timeout(Duration::from_secs(10))
            .user_agent(concat!("agentry/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|error| format!("the fetch tool's HTTP client cannot be built: {error}"))?;
        Ok(Channel { access, client })
    }
}

/// A run's narrowing of the policy, checked.
struct Narrowing {
    policy: NetworkPolicy,
    allow: Option<AllowList>,
}

/// The message naming the operator's settings that widen fetch's reach.
const OPERATOR_SETTINGS: &str = "the operator sets it with `agentry serve --allow-domain HOST` \
                                 (repeatable) or `--fetch-network public`";

impl Fetcher {
    async fn fetch(&self, url: &str, narrowing: &[NetworkPolicy]) -> Result<ToolOutput, ToolError> {
        let rules = self
            .rules
            .as_ref()
            .map_err(|e| ToolError::Failed(e.clone()))?;
        if rules.policy == NetworkPolicy::Off {
            return Err(ToolError::Failed(format!(
                "refused: fetching is off under the server's network policy ({OPERATOR_SETTINGS})"
            )));
        }
        let narrowing = narrowing
            .iter()
            .map(|policy| {
                Ok(Narrowing {
                    policy: policy.clone(),
                    allow: matcher(policy).map_err(|error| {
                        ToolError::Failed(format!("this agent's `network` setting: {error}"))
                    })?,
                })
            })
            .collect::<Result<Vec<_>, ToolError>>()?;
        if narrowing.iter().any(|n| n.policy == NetworkPolicy::Off) {
            return Err(ToolError::Failed(
                "refused: fetching is off for this agent (its `network` setting is \"off\")".into(),
            ));
        }
        // A run narrowed to public addresses gets the client that lets no private one through.
        let channel = if narrowing.iter().any(|n| n.policy == NetworkPolicy::Public) {
            &rules.public_only
        } else {
            &rules.operator
        };
        let mut url = Url::parse(url.trim()).map_err(|error| {
            ToolError::InvalidArguments(format!("invalid URL {url:?}: {error}"))
        })?;
        let mut redirects = 0;
        loop {
            check_url(rules, &narrowing, channel, &url)?;
            let response = channel
                .client
                .get(url.clone())
                .send()
                .await
                .map_err(request_error)?;
            if response.status().is_redirection()
                && let Some(location) = response.headers().get(LOCATION)
            {
                if redirects == self.config.max_redirects {
                    return Err(ToolError::Failed(format!(
                        "{url} redirected more than {} times",
                        self.config.max_redirects
                    )));
                }
                redirects += 1;
                let location = location.to_str().unwrap_or_default();
                let next = url.join(location).map_err(|_| {
                    ToolError::Failed(format!("{url} redirected to an invalid URL {location:?}"))
                })?;
                // Every hop is checked as a new request; a refusal says where it led.
                if let Err(error) = check_url(rules, &narrowing, channel, &next) {
                    return Err(ToolError::Failed(format!(
                        "{url} redirected to {next}: {error}"
                    )));
                }
                url = next;
                continue;
            }
            return self.read(url, response).await;
        }
    }

    async fn read(
        &self,
        url: Url,
        mut response: reqwest::Response,
    ) -> Result<ToolOutput, ToolError> {
        let status = response.status();
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase();
        let total = response
            .content_length()
            .and_then(|length| usize::try_from(length).ok());
        let (bytes, truncated) = read_capped(&mut response, self.config.max_bytes)
            .await
            .map_err(request_error)?;
        if !status.is_success() {
            let snippet = decode_cut_utf8(&bytes[..bytes.len().min(ERROR_SNIPPET_BYTES)]);
            return Err(ToolError::Failed(format!(
                "{url} answered HTTP {status}: {}",
                snippet.trim()
            )));
        }
        let is_html = content_type == "text/html" || content_type == "application/xhtml+xml";
        let is_text = content_type.is_empty()
            || content_type.starts_with("text/")
            || content_type.ends_with("+json")
            || content_type.ends_with("+xml")
            || matches!(
                content_type.as_str(),
                "application/json" | "application/xml" | "application/javascript"
            );
        let mut text = if is_html {
            html2text::from_read(bytes.as_slice(), HTML_WIDTH).map_err(|error| {
                ToolError::Failed(format!("{url}: the HTML could not be read: {error}"))
            })?
        } else if is_text {
            decode_cut_utf8(&bytes)
        } else {
            return Err(ToolError::Failed(format!(
                "{url} returned {content_type}, which fetch does not return as text"
            )));
        };
        let mut output = format!("{url}\n\n");
        if truncated {
            text.push_str(&truncation_note(bytes.len(), total));
        }
        output.push_str(&text);
        Ok(ToolOutput::text(output))
    }
}

/// The checks that need no DNS: scheme, credentials, the allow-lists, and IP literals (which the
/// resolver never sees). Names are checked against private addresses by the resolver.
fn check_url(
    rules: &Rules,
    narrowing: &[Narrowing],
    channel: &Channel,
    url: &Url,
) -> Result<(), ToolError> {
    if !matches!(url.scheme(), "http" | "https") {
        return Err(ToolError::InvalidArguments(format!(
            "{url}: only http and https URLs can be fetched"
        )));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(ToolError::InvalidArguments(format!(
            "{url}: URLs with credentials are not fetched"
        )));
    }
    let Some(host) = url.host_str() else {
        return Err(ToolError::InvalidArguments(format!("{url} has no host")));
    };
    let name = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    if let Some(allow) = &rules.allow
        && !allow.allows_host(&name)
    {
        return Err(ToolError::Failed(format!(
            "refused: {name} is not on the server's network allow-list ({OPERATOR_SETTINGS})"
        )));
    }
    for narrowing in narrowing {
        if let Some(allow) = &narrowing.allow
            && !allow.allows_host(&name)
        {
            return Err(ToolError::Failed(format!(
                "refused: {name} is not on this agent's network allow-list (its `network` \
                 setting)"
            )));
        }
    }
    if channel.access.allows(&name) {
        return Ok(());
    }
    let private_literal = name
        .parse::<IpAddr>()
        .is_ok_and(|address| !is_public(address));
    if private_literal || name == "localhost" || name.ends_with(".localhost") {
        return Err(refused_address(&name));
    }
    Ok(())
}

fn refused_address(host: &str) -> ToolError {
    ToolError::Failed(format!(
        "refused: {host} is a loopback, private or link-local address, which the network \
         policy does not allow (only hosts the operator names with `agentry serve \
         --allow-private` may be at such addresses)"
    ))
}

fn request_error(error: reqwest::Error) -> ToolError {
    let mut message = format!("the request failed: {error}");
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        message.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    ToolError::Failed(message)
}

/// Resolves names and drops the addresses the policy does not allow; the connection goes to
/// the addresses it returns (no second lookup).
struct PolicyResolver {
    access: PrivateAccess,
}

/// Why a name was not resolved.
#[derive(Debug)]
struct Refused(String);

impl fmt::Display for Refused {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            formatter,
            "refused: {} resolves only to loopback, private or link-local addresses, which the \
             network policy does not allow (only hosts the operator names with `agentry serve \
             --allow-private` may be at such addresses)",
            self.0
        )
    }
}

impl std::error::Error for Refused {}

/// A resolver that gives only public addresses: a client built with it connects to no
/// loopback, private or link-local address whatever a name resolves to when it connects (a name
/// checked earlier cannot be rebound to an internal address in between). What webhooks go out
/// with; `fetch` uses the same resolver under its policy.
pub fn public_only_resolver() -> Arc<dyn Resolve> {
    Arc::new(PolicyResolver {
        access: PrivateAccess::None,
    })
}

impl Resolve for PolicyResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_ascii_lowercase();
        let unrestricted = self.access.allows(&host);
        Box::pin(async move {
            let addresses: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0))
                .await?
                .filter(|address| unrestricted || is_public(address.ip()))
                .collect();
            if addresses.is_empty() {
                return Err(Box::new(Refused(host)) as Box<dyn std::error::Error + Send + Sync>);
            }
            let addresses: Addrs = Box::new(addresses.into_iter());
            Ok(addresses)
        })
    }
}

/// Whether an address is public (the sandbox's network proxy judges addresses the same way).
fn is_public(address: IpAddr) -> bool {
    agentry_sandbox::is_public_address(address)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_lists_match_as_the_sandboxes_do_and_bad_entries_are_named() {
        let policy = NetworkPolicy::Allow(vec!["example.com".into(), "127.0.0.1".into()]);
        let Ok(Some(list)) = matcher(&policy) else {
            panic!("a valid allow-list");
        };
        assert!(list.allows_host("example.com"));
        assert!(!list.allows_host("docs.example.com"));
        assert!(!list.allows_host("badexample.com"));
        assert!(list.allows_host("127.0.0.1"));
        assert!(!list.allows_host("127.0.0.2"));

        let bad = NetworkPolicy::Allow(vec!["exa mple.com".into()]);
        assert!(
            matches!(validate_network_policy(&bad), Err(NetworkPolicyError::InvalidEntry(m)) if m.contains("exa mple.com"))
        );
        let long = NetworkPolicy::Allow(vec!["a.com".into(); MAX_ALLOW_ENTRIES + 1]);
        assert_eq!(
            validate_network_policy(&long),
            Err(NetworkPolicyError::TooManyEntries(MAX_ALLOW_ENTRIES + 1))
        );
        let config = FetchConfig {
            private_hosts: vec!["*".into()],
            ..FetchConfig::default()
        };
        assert!(config.validate().is_err());
        assert_eq!(FetchConfig::default().policy, NetworkPolicy::Off);
    }
}
