//! `fetch`: an HTTP GET under a network policy, HTML reduced to text.
//!
//! The fetch runs on the host, so the policy guards the host's network: by default only public
//! addresses may be reached (no loopback, private, link-local, CGNAT, multicast or unique-local
//! address, which covers cloud metadata endpoints). The tool owns its HTTP client because the
//! checks must hold for every connection: a DNS resolver filters the addresses a name resolves
//! to (so a name cannot rebind to a private address after a check), redirects are followed one
//! by one with the policy applied to each, and no proxy from the environment is used.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::header::{CONTENT_TYPE, LOCATION};
use reqwest::{Client, Url};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::FETCH;
use crate::tool::function::FunctionTool;
use crate::tool::http::read_capped;
use crate::tool::result::{decode_cut_utf8, truncation_note};
use crate::tool::{ToolContext, ToolError, ToolOutput};

/// The width HTML is wrapped to when reduced to text.
const HTML_WIDTH: usize = 100;

/// How much of an error response's body an error quotes.
const ERROR_SNIPPET_BYTES: usize = 512;

/// Which hosts `fetch` may reach.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkPolicy {
    /// No fetching at all.
    Off,
    /// Any host whose addresses are all public: loopback, private, link-local, CGNAT,
    /// unique-local and multicast addresses are refused.
    #[default]
    Public,
    /// Only these domains and their subdomains (or these IP addresses, written exactly), at any
    /// address, private and loopback included.
    Allow(Vec<String>),
    /// Anything, private networks and loopback included.
    Any,
}

impl NetworkPolicy {
    /// Whether `host` (a domain, lower case, or an IP address as text) is on the allow-list.
    fn allows_host(&self, host: &str) -> bool {
        match self {
            Self::Allow(domains) => domains.iter().any(|domain| {
                let domain = domain.trim().trim_end_matches('.').to_ascii_lowercase();
                let domain = domain.trim_start_matches('[').trim_end_matches(']');
                !domain.is_empty()
                    && (host == domain
                        || host
                            .strip_suffix(domain)
                            .is_some_and(|rest| rest.ends_with('.')))
            }),
            Self::Any => true,
            Self::Off | Self::Public => false,
        }
    }
}

/// The configuration of the `fetch` tool.
#[derive(Debug, Clone)]
pub struct FetchConfig {
    /// Which hosts it may reach.
    pub policy: NetworkPolicy,
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
            max_bytes: 2 * 1024 * 1024,
            timeout: Duration::from_secs(30),
            max_redirects: 5,
        }
    }
}

/// Arguments of `fetch`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct FetchArguments {
    /// The `http` or `https` URL to GET.
    url: String,
}

struct Fetcher {
    config: FetchConfig,
    client: Result<Client, String>,
}

/// The `fetch` tool.
pub(super) fn fetch(config: FetchConfig) -> FunctionTool {
    let client = build_client(&config);
    let fetcher = Arc::new(Fetcher { config, client });
    let timeout = fetcher.config.timeout;
    FunctionTool::new(
        FETCH,
        "Fetches a web page or text document with HTTP GET and returns it as text (HTML is \
         reduced to readable text; long pages are cut). Only the hosts the network policy \
         allows can be reached.",
        move |arguments: FetchArguments, context: ToolContext| {
            let fetcher = Arc::clone(&fetcher);
            async move {
                tokio::select! {
                    () = context.cancel.cancelled() => Err(ToolError::Cancelled),
                    outcome = tokio::time::timeout(timeout, fetcher.fetch(&arguments.url)) => {
                        outcome.unwrap_or(Err(ToolError::Timeout(timeout)))
                    }
                }
            }
        },
    )
    .with_timeout(timeout + Duration::from_secs(1))
    .idempotent()
}

fn build_client(config: &FetchConfig) -> Result<Client, String> {
    // The process-wide TLS provider, as the model layer installs it; a second install is a
    // harmless no-op error.
    let _ = rustls::crypto::ring::default_provider().install_default();
    Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .dns_resolver(Arc::new(PolicyResolver {
            policy: config.policy.clone(),
        }))
        .connect_timeout(Duration::from_secs(10))
        .user_agent(concat!("agentry/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|error| format!("the fetch tool's HTTP client cannot be built: {error}"))
}

impl Fetcher {
    async fn fetch(&self, url: &str) -> Result<ToolOutput, ToolError> {
        let client = self
            .client
            .as_ref()
            .map_err(|e| ToolError::Failed(e.clone()))?;
        if self.config.policy == NetworkPolicy::Off {
            return Err(ToolError::Failed(
                "fetching is turned off by the network policy".into(),
            ));
        }
        let mut url = Url::parse(url.trim()).map_err(|error| {
            ToolError::InvalidArguments(format!("invalid URL {url:?}: {error}"))
        })?;
        let mut redirects = 0;
        loop {
            self.check_url(&url)?;
            let response = client
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
                url = url.join(location).map_err(|_| {
                    ToolError::Failed(format!("{url} redirected to an invalid URL {location:?}"))
                })?;
                continue;
            }
            return self.read(url, response).await;
        }
    }

    /// The policy's checks that need no DNS: scheme, credentials, the allow-list, and IP
    /// literals (which the resolver never sees).
    fn check_url(&self, url: &Url) -> Result<(), ToolError> {
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
        let address = name.parse::<IpAddr>().ok();
        let policy = &self.config.policy;
        match policy {
            NetworkPolicy::Any => Ok(()),
            NetworkPolicy::Allow(_) if policy.allows_host(&name) => Ok(()),
            NetworkPolicy::Allow(_) => Err(ToolError::Failed(format!(
                "refused: {name} is not on the network policy's allow-list"
            ))),
            NetworkPolicy::Public | NetworkPolicy::Off => {
                if let Some(address) = address
                    && !is_public(address)
                {
                    return Err(refused_address(&name));
                }
                if name == "localhost" || name.ends_with(".localhost") {
                    return Err(refused_address(&name));
                }
                Ok(())
            }
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

fn refused_address(host: &str) -> ToolError {
    ToolError::Failed(format!(
        "refused: {host} is a loopback, private or link-local address, which the network \
         policy does not allow"
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

/// Resolves names and drops the addresses the policy does not allow.
struct PolicyResolver {
    policy: NetworkPolicy,
}

/// Why a name was not resolved.
#[derive(Debug)]
struct Refused(String);

impl fmt::Display for Refused {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            formatter,
            "refused: {} resolves only to loopback, private or link-local addresses, which the \
             network policy does not allow",
            self.0
        )
    }
}

impl std::error::Error for Refused {}

impl Resolve for PolicyResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_ascii_lowercase();
        let unrestricted = self.policy.allows_host(&host);
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
    fn allow_list_matches_domains_and_subdomains() {
        let policy = NetworkPolicy::Allow(vec!["example.com".into(), "127.0.0.1".into()]);
        assert!(policy.allows_host("example.com"));
        assert!(policy.allows_host("docs.example.com"));
        assert!(!policy.allows_host("badexample.com"));
        assert!(!policy.allows_host("example.com.evil.net"));
        assert!(policy.allows_host("127.0.0.1"));
        assert!(!policy.allows_host("127.0.0.2"));
    }
}
