//! Which requests may reach the API at all: the `Host` and `Origin` checks that keep web pages
//! the user happens to visit from driving a local Agentry.
//!
//! A page served from `evil.example` can make the browser send requests to 127.0.0.1 in two
//! ways. Through **DNS rebinding** its own name starts resolving to 127.0.0.1, so the browser
//! treats the API as same-origin — but it still sends `Host: evil.example`. Every request whose
//! `Host` is not a loopback name, an IP address, or a name the operator allowed
//! (`--allowed-host`) is therefore refused before any handler runs. A page can also send a
//! **cross-origin** request (a form post, `fetch` with `no-cors`, a WebSocket): the browser then
//! names the page in `Origin`, so a request that changes anything (every method but
//! GET/HEAD/OPTIONS, and WebSocket upgrades) carrying an `Origin` that is neither the server's
//! own nor a configured CORS origin is refused. Programs that are not browsers send no `Origin`
//! and are not affected.

use axum::http::{HeaderMap, Method, StatusCode, header};

use crate::error::ApiError;

/// Which `Host` names and browser origins the server answers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccessPolicy {
    /// Names accepted in `Host` besides `localhost` and IP addresses: exact names, `*.example.com`
    /// for a domain's subdomains, or `*` for any name (behind a proxy that checks it).
    pub allowed_hosts: Vec<String>,
    /// Browser origins allowed besides the server's own (the CORS origins).
    pub allowed_origins: Vec<String>,
    /// Proxies whose `X-Forwarded-For` is believed (`--trusted-proxy`): behind one, the client
    /// a request comes from (what the login throttle counts) is the one it names.
    pub trusted_proxies: Vec<TrustedProxy>,
}

/// A reverse proxy whose `X-Forwarded-For` is believed: an address, or a network
/// (`10.0.0.0/8`, `fd00::/8`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrustedProxy(ipnet::IpNet);

impl std::str::FromStr for TrustedProxy {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if let Ok(address) = text.parse::<std::net::IpAddr>() {
            return Ok(Self(ipnet::IpNet::from(address.to_canonical())));
        }
        text.parse::<ipnet::IpNet>()
            .map(|network| Self(network.trunc()))
            .map_err(|_| format!("{text:?} is not an IP address or a network like 10.0.0.0/8"))
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// The `Host` header names a host the server does not answer to.
    #[error(
        "the Host `{0}` is not allowed: this server answers loopback names and IP addresses; \
         allow another name with `agentry serve --allowed-host NAME`"
    )]
    Host(String),
    /// The `Host` header is not a valid host.
    #[error("the Host header is not a valid host name")]
    BadHost,
    /// A browser page of another origin tried to change something.
    #[error(
        "requests from the web page at `{0}` are not allowed to change anything here: allow the \
         origin with `agentry serve --cors-origin ORIGIN`"
    )]
    Origin(String),
}

impl AccessError {
    /// The 403 answering it.
    pub fn into_api_error(self) -> ApiError {
        let code = match self {
            Self::Host(_) | Self::BadHost => "host_not_allowed",
            Self::Origin(_) => "origin_not_allowed",
        };
        let setting = match self {
            Self::Host(_) | Self::BadHost => "--allowed-host",
            Self::Origin(_) => "--cors-origin",
        };
        ApiError::new(StatusCode::FORBIDDEN, code, self.to_string())
            .with_details(serde_json::json!({ "setting": setting }))
    }
}

impl AccessPolicy {
    /// Whether `address` is one of the trusted proxies.
    fn trusts(&self, address: std::net::IpAddr) -> bool {
        let address = address.to_canonical();
        self.trusted_proxies
            .iter()
            .any(|proxy| proxy.0.contains(&address))
    }

    /// The client a request comes from: its peer, unless the peer is a trusted proxy; then the
    /// last address in `X-Forwarded-For` that is not one (each proxy appends the address it
    /// was reached from, so only what trusted proxies appended is believed — a client cannot
    /// pass for another by sending the header itself). `None` without a peer.
    pub fn client_address(
        &self,
        peer: Option<std::net::IpAddr>,
        headers: &HeaderMap,
    ) -> Option<std::net::IpAddr> {
        let mut client = peer?.to_canonical();
        if !self.trusts(client) {
            return Some(client);
        }
        let forwarded: Vec<&str> = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .map(str::trim)
            .collect();
        for hop in forwarded.iter().rev() {
            // A hop that is not an address ends what can be believed.
            let Ok(address) = hop.parse::<std::net::IpAddr>() else {
                break;
            };
            client = address.to_canonical();
            if !self.trusts(client) {
                break;
            }
        }
        Some(client)
    }

    /// Checks a request's headers.
    pub fn check(&self, method: &Method, headers: &HeaderMap) -> Result<(), AccessError> {
        let host = match headers.get(header::HOST) {
            Some(value) => Some(value.to_str().map_err(|_| AccessError::BadHost)?),
            None => None,
        };
        if let Some(host) = host {
            let name = host_name(host).ok_or(AccessError::BadHost)?;
            if !self.allows_host(&name) {
                return Err(AccessError::Host(host.to_owned()));
            }
        }
        let changes = !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
            || headers.contains_key(header::UPGRADE);
        if !changes {
            return Ok(());
        }
        self.check_origin(headers)
    }

    /// Checks a request's `Origin` whatever its method (the MCP endpoint, whose specification
    /// asks for it on every request): absent, the server's own, or a configured one.
    pub fn check_origin(&self, headers: &HeaderMap) -> Result<(), AccessError> {
        let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
        if let Some(origin) = headers.get(header::ORIGIN) {
            let origin = origin.to_str().unwrap_or("(not text)");
            if !self.allows_origin(origin, host) {
                return Err(AccessError::Origin(origin.to_owned()));
            }
        } else if headers
            .get("sec-fetch-site")
            .is_some_and(|site| site.as_bytes() == b"cross-site")
        {
            return Err(AccessError::Origin("(another site)".to_owned()));
        }
        Ok(())
    }

    /// Whether `name` (lower case, no port, IPv6 without brackets) may be the `Host`.
    fn allows_host(&self, name: &str) -> bool {
        if name == "localhost" || name.parse::<std::net::IpAddr>().is_ok() {
            return true;
        }
        self.allowed_hosts.iter().any(|allowed| {
            let allowed = allowed.trim().trim_end_matches('.').to_ascii_lowercase();
            if allowed == "*" {
                return true;
            }
            match allowed.strip_prefix("*.") {
                Some(domain) => name
                    .strip_suffix(domain)
                    .is_some_and(|rest| rest.ends_with('.')),
                None => name == allowed,
            }
        })
    }

    /// Whether a browser page at `origin` may change something: the server's own origin (the
    /// same host and port as the request's `Host`) or a configured one.
    fn allows_origin(&self, origin: &str, host: Option<&str>) -> bool {
        let origin = origin.trim_end_matches('/');
        if self
            .allowed_origins
            .iter()
            .any(|allowed| allowed.trim_end_matches('/').eq_ignore_ascii_case(origin))
        {
            return true;
        }
        let Some(host) = host else {
            return false;
        };
        let authority = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"));
        authority.is_some_and(|authority| authority.eq_ignore_ascii_case(host))
    }
}

/// The host part of a `Host` header: lower case, without the port, IPv6 without brackets.
/// `None` when it is not a plausible host.
fn host_name(host: &str) -> Option<String> {
    let host = host.trim();
    let name = if let Some(rest) = host.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        if !(after.is_empty() || after.strip_prefix(':').is_some_and(is_port)) {
            return None;
        }
        inside
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if is_port(port) => name,
            Some(_) => return None,
            None => host,
        }
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    let valid = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b':' | b'_'));
    valid.then_some(name)
}

fn is_port(text: &str) -> bool {
    !text.is_empty() && text.len() <= 5 && text.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_client_behind_a_trusted_proxy_is_the_one_it_names() {
        let headers = |forwarded: &str| {
            let mut headers = HeaderMap::new();
            headers.insert("x-forwarded-for", forwarded.parse().unwrap());
            headers
        };
        let ip = |text: &str| text.parse::<std::net::IpAddr>().unwrap();
        let policy = AccessPolicy {
            trusted_proxies: vec!["127.0.0.1".parse().unwrap(), "10.0.0.0/8".parse().unwrap()],
            ..AccessPolicy::default()
        };
        // Through two trusted proxies: the first address not one of them.
        assert_eq!(
            policy.client_address(
                Some(ip("127.0.0.1")),
                &headers("198.51.100.7, 203.0.113.5, 10.1.2.3")
            ),
            Some(ip("203.0.113.5"))
        );
        // An IPv4 peer seen over IPv6 is the same proxy.
        assert_eq!(
            policy.client_address(Some(ip("::ffff:127.0.0.1")), &headers("203.0.113.5")),
            Some(ip("203.0.113.5"))
        );
        // A peer that is no trusted proxy is the client, whatever it says.
        assert_eq!(
            policy.client_address(Some(ip("192.0.2.1")), &headers("203.0.113.5")),
            Some(ip("192.0.2.1"))
        );
        // Nothing believable beyond the proxy: the proxy.
        assert_eq!(
            policy.client_address(Some(ip("127.0.0.1")), &headers("not-an-address")),
            Some(ip("127.0.0.1"))
        );
        assert_eq!(
            AccessPolicy::default().client_address(Some(ip("127.0.0.1")), &headers("203.0.113.5")),
            Some(ip("127.0.0.1"))
        );
        assert!("10.0.0.0/33".parse::<TrustedProxy>().is_err());
        assert!("proxy.example".parse::<TrustedProxy>().is_err());
    }

    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(
                *name,
                HeaderValue::from_str(value).unwrap_or(HeaderValue::from_static("x")),
            );
        }
        map
    }

    #[test]
    fn loopback_names_and_addresses_are_hosts() {
        let policy = AccessPolicy::default();
        for host in [
            "localhost",
            "localhost:7988",
            "127.0.0.1:7988",
            "127.0.0.1",
            "[::1]:7988",
            "[::1]",
            "LOCALHOST:1",
            "192.168.1.20:7988",
        ] {
            assert_eq!(
                policy.check(&Method::POST, &headers(&[("host", host)])),
                Ok(()),
                "{host}"
            );
        }
    }

    #[test]
    fn other_names_are_refused_unless_allowed() {
        let policy = AccessPolicy::default();
        for host in [
            "evil.example",
            "evil.example:7988",
            "localhost.evil.example",
            "127.0.0.1.nip.io:7988",
            "sub.localhost",
        ] {
            assert!(
                matches!(
                    policy.check(&Method::GET, &headers(&[("host", host)])),
                    Err(AccessError::Host(_))
                ),
                "{host}"
            );
        }
        assert_eq!(
            policy.check(&Method::GET, &headers(&[("host", "a b")])),
            Err(AccessError::BadHost)
        );
        let allowed = AccessPolicy {
            allowed_hosts: vec!["agents.example.com".into(), "*.corp.example".into()],
            ..AccessPolicy::default()
        };
        assert_eq!(
            allowed.check(&Method::GET, &headers(&[("host", "agents.example.com")])),
            Ok(())
        );
        assert_eq!(
            allowed.check(&Method::GET, &headers(&[("host", "x.corp.example:443")])),
            Ok(())
        );
        assert!(
            allowed
                .check(&Method::GET, &headers(&[("host", "corp.example")]))
                .is_err()
        );
        assert!(
            allowed
                .check(&Method::GET, &headers(&[("host", "xcorp.example")]))
                .is_err()
        );
    }

    #[test]
    fn foreign_origins_may_read_but_not_change() {
        let policy = AccessPolicy {
            allowed_origins: vec!["http://localhost:3000".into()],
            ..AccessPolicy::default()
        };
        let foreign = [
            ("host", "127.0.0.1:7988"),
            ("origin", "http://evil.example"),
        ];
        assert_eq!(policy.check(&Method::GET, &headers(&foreign)), Ok(()));
        for method in [Method::POST, Method::PUT, Method::DELETE, Method::PATCH] {
            assert!(matches!(
                policy.check(&method, &headers(&foreign)),
                Err(AccessError::Origin(_))
            ));
        }
        let websocket = [
            ("host", "127.0.0.1:7988"),
            ("origin", "http://evil.example"),
            ("upgrade", "websocket"),
        ];
        assert!(policy.check(&Method::GET, &headers(&websocket)).is_err());
        // Another port on the same machine is another origin.
        let other_port = [
            ("host", "127.0.0.1:7988"),
            ("origin", "http://127.0.0.1:3000"),
        ];
        assert!(policy.check(&Method::POST, &headers(&other_port)).is_err());
        let null = [("host", "127.0.0.1:7988"), ("origin", "null")];
        assert!(policy.check(&Method::POST, &headers(&null)).is_err());
        let own = [
            ("host", "127.0.0.1:7988"),
            ("origin", "http://127.0.0.1:7988"),
        ];
        assert_eq!(policy.check(&Method::POST, &headers(&own)), Ok(()));
        let configured = [
            ("host", "127.0.0.1:7988"),
            ("origin", "http://localhost:3000"),
        ];
        assert_eq!(policy.check(&Method::POST, &headers(&configured)), Ok(()));
        let cross_site = [("host", "127.0.0.1:7988"), ("sec-fetch-site", "cross-site")];
        assert!(policy.check(&Method::POST, &headers(&cross_site)).is_err());
        let program = [("host", "127.0.0.1:7988")];
        assert_eq!(policy.check(&Method::DELETE, &headers(&program)), Ok(()));
    }
}
