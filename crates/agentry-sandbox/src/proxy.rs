//! The host side of a sandbox's network allow-list ([`NetworkPolicy::AllowList`]): an HTTP proxy
//! that reaches only the allowed hosts.
//!
//! - Each allow-list sandbox gets its own proxy: a unix socket in a private temp folder
//!   (`agentry-proxy-<pid>-<n>-<x>`, mode 0700, owned by the sandbox's outer uid), served by one
//!   tokio task. The folder is bind-mounted read-only into the sandbox at [`INSIDE_DIR`], where
//!   the agent's bridge ([`crate::init`]) relays `127.0.0.1:3128` to it.
//! - It speaks HTTP/1.x: `CONNECT host:port` opens a tunnel (https, or anything else over TCP);
//!   an absolute `http://` URI is forwarded to its host with `Connection: close` (one request per
//!   connection), the `Host` header set from the URI and hop-by-hop headers dropped.
//! - A host that is not on the list is refused with 403 and a body naming it, as is an IP literal
//!   that is not listed itself. Names are resolved here, on the host, and the proxy connects only
//!   to the addresses it checked: loopback, private, link-local and other non-public addresses are
//!   refused unless the policy sets `allow_private` (tests, local development).
//! - Dropping the [`Proxy`] (when its sandbox closes) stops the task and every connection it
//!   serves, and removes the folder.
//!
//! [`NetworkPolicy::AllowList`]: crate::NetworkPolicy::AllowList

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener, UnixStream};
use tokio::task::{JoinHandle, JoinSet};

use crate::error::{Result, SandboxError};

/// Where the bridge listens inside the sandbox.
pub(crate) const BRIDGE_ADDR: &str = "127.0.0.1:3128";
/// The proxy URL the sandbox's commands get.
pub(crate) const PROXY_URL: &str = "http://127.0.0.1:3128";
/// What commands reach directly (the sandbox's own loopback).
const NO_PROXY: &str = "localhost,127.0.0.1,::1";
/// Where the proxy's folder appears inside the sandbox.
pub(crate) const INSIDE_DIR: &str = "/run/agentry-proxy";
/// The socket's name in its folder.
pub(crate) const SOCKET_NAME: &str = "proxy.sock";

/// The longest request head (request line and headers) read.
const MAX_HEAD: usize = 32 * 1024;
/// How long a client may take to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// How long resolving a name may take.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long connecting to one address may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The most connections one sandbox's proxy serves at once; more are closed at once.
const MAX_CONNECTIONS: usize = 256;

/// The environment that sends a sandbox's commands through its proxy (curl reads only the
/// lower-case `http_proxy`; most other clients read either).
pub(crate) fn proxy_env() -> Vec<(String, String)> {
    let mut env = Vec::new();
    for name in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
        env.push((name.to_string(), PROXY_URL.to_string()));
        env.push((name.to_ascii_lowercase(), PROXY_URL.to_string()));
    }
    env.push(("NO_PROXY".to_string(), NO_PROXY.to_string()));
    env.push(("no_proxy".to_string(), NO_PROXY.to_string()));
    env
}

/// A request's destination host.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Host {
    /// A DNS name: lower case, no trailing dot.
    Name(String),
    /// An IP literal.
    Ip(IpAddr),
}

impl std::fmt::Display for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// Checks a DNS name (lower case, no trailing dot): letters, digits, `-` and `_` in non-empty
/// labels; a numeric last label is refused (`127.1` and `0x7f.1` are addresses to the resolver).
fn check_name(name: &str) -> std::result::Result<(), String> {
    if name.is_empty() || name.len() > 253 {
        return Err("not a valid host name".into());
    }
    for label in name.split('.') {
        // Letters, digits, `-` and `_`, never a `-` at either end (RFC 1123).
        if label.is_empty()
            || label.len() > 63
            || label.starts_with('-')
            || label.ends_with('-')
            || !label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err("not a valid host name".into());
        }
    }
    let last = name.rsplit('.').next().unwrap_or(name);
    let hex = last
        .strip_prefix("0x")
        .is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
    if last.bytes().all(|b| b.is_ascii_digit()) || hex {
        return Err("a numeric address written as a name".into());
    }
    Ok(())
}

/// An IP literal: dotted IPv4, bare IPv6 or bracketed IPv6.
fn parse_ip(s: &str) -> Option<IpAddr> {
    if let Some(inner) = s.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
        return inner.parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    s.parse::<IpAddr>().ok()
}

impl Host {
    /// A host as a client wrote it (IPv6 in brackets).
    fn parse(s: &str) -> std::result::Result<Host, String> {
        if s.starts_with('[') {
            return parse_ip(s)
                .filter(IpAddr::is_ipv6)
                .map(Host::Ip)
                .ok_or_else(|| format!("{s:?} is not a valid IPv6 address"));
        }
        if let Ok(ip) = s.parse::<Ipv4Addr>() {
            return Ok(Host::Ip(IpAddr::V4(ip)));
        }
        let lower = s.to_ascii_lowercase();
        let name = lower.strip_suffix('.').unwrap_or(&lower);
        check_name(name).map_err(|e| format!("{s:?}: {e}"))?;
        Ok(Host::Name(name.to_string()))
    }
}

/// One allow-list entry.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    /// This name exactly.
    Exact(String),
    /// Every subdomain of this name (not the name itself).
    Subdomains(String),
    /// This address exactly.
    Ip(IpAddr),
}

/// An IPv4-mapped IPv6 address compares as its IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// A network allow-list, checked: the sandbox proxy's, and the host-side `fetch` tool's (one
/// syntax and one matching rule for both). Entries are `example.com` (that name exactly),
/// `*.example.com` (every subdomain, not the name itself) or an IP address written exactly.
#[derive(Debug, Clone)]
pub struct AllowList {
    patterns: Vec<Pattern>,
    domains: Vec<String>,
    allow_private: bool,
}

impl AllowList {
    /// Checks and normalises the policy's entries ([`SandboxError::InvalidRequest`] names a bad
    /// one).
    pub fn new(domains: &[String], allow_private: bool) -> Result<AllowList> {
        let mut patterns = Vec::new();
        let mut normalised = Vec::new();
        for entry in domains {
            let bad = |why: &str| {
                SandboxError::InvalidRequest(format!("network allow-list entry {entry:?}: {why}"))
            };
            let lower = entry.trim().to_ascii_lowercase();
            let (pattern, text) = if let Some(ip) = parse_ip(&lower) {
                (Pattern::Ip(canonical(ip)), canonical(ip).to_string())
            } else if let Some(suffix) = lower.strip_prefix("*.") {
                let suffix = suffix.strip_suffix('.').unwrap_or(suffix);
                check_name(suffix).map_err(|e| bad(&e))?;
                (Pattern::Subdomains(suffix.into()), format!("*.{suffix}"))
            } else {
                let name = lower.strip_suffix('.').unwrap_or(&lower);
                if name.contains('*') {
                    return Err(bad("a wildcard is allowed only as a leading `*.`"));
                }
                check_name(name).map_err(|e| bad(&e))?;
                (Pattern::Exact(name.into()), name.to_string())
            };
            if !patterns.contains(&pattern) {
                patterns.push(pattern);
                normalised.push(text);
            }
        }
        Ok(AllowList {
            patterns,
            domains: normalised,
            allow_private,
        })
    }

    /// Whether `host` (a name or an IP literal, as in a URL; IPv6 in brackets or bare) matches
    /// an entry. A host that is not a valid name or address matches nothing.
    pub fn allows_host(&self, host: &str) -> bool {
        let host = host.trim();
        let parsed = match parse_ip(host) {
            Some(ip) => Ok(Host::Ip(ip)),
            None => Host::parse(host),
        };
        parsed.is_ok_and(|host| self.allows(&host))
    }

    /// The entries, normalised.
    pub fn domains(&self) -> &[String] {
        &self.domains
    }

    /// Whether non-public addresses may be reached.
    pub fn allow_private(&self) -> bool {
        self.allow_private
    }

    fn allows(&self, host: &Host) -> bool {
        self.patterns.iter().any(|p| match (p, host) {
            (Pattern::Ip(allowed), Host::Ip(ip)) => *allowed == canonical(*ip),
            (Pattern::Exact(allowed), Host::Name(name)) => allowed == name,
            (Pattern::Subdomains(suffix), Host::Name(name)) => name
                .strip_suffix(suffix.as_str())
                .is_some_and(|rest| rest.len() > 1 && rest.ends_with('.')),
            _ => false,
        })
    }
}

/// Whether an address is public: loopback, private, link-local, CGNAT, unique-local, multicast,
/// documentation and reserved ranges are not (nor IPv6 forms carrying such an IPv4 address).
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || a == 0
        // Carrier-grade NAT, 100.64.0.0/10.
        || (a == 100 && (64..128).contains(&b))
        // IETF protocol assignments, 192.0.0.0/24; benchmarking, 198.18.0.0/15; reserved, 240/4.
        || (a == 192 && b == 0 && c == 0)
        || (a == 198 && (b == 18 || b == 19))
        || a >= 240)
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return is_public_v4(v4);
    }
    let s = ip.segments();
    // NAT64 (64:ff9b::/96) and 6to4 (2002::/16) carry an IPv4 address.
    if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] {
        return is_public_v4(Ipv4Addr::from((u32::from(s[6]) << 16) | u32::from(s[7])));
    }
    if s[0] == 0x2002 {
        return is_public_v4(Ipv4Addr::from((u32::from(s[1]) << 16) | u32::from(s[2])));
    }
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        // Unique local, fc00::/7.
        || (s[0] & 0xfe00) == 0xfc00
        // Link-local, fe80::/10, and the old site-local, fec0::/10.
        || (s[0] & 0xffc0) == 0xfe80
        || (s[0] & 0xffc0) == 0xfec0
        // Documentation, 2001:db8::/32.
        || (s[0] == 0x2001 && s[1] == 0x0db8)
        // IPv4-compatible (deprecated), ::/96.
        || s[..6] == [0, 0, 0, 0, 0, 0])
}

/// Why a request was not forwarded; the client gets it as an HTTP error with this text.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    /// The request is not one this proxy serves.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The host is not on the allow-list.
    #[error("refused: {host} is not on this sandbox's network allow-list")]
    NotAllowed { host: String },
    /// The host resolves only to addresses the policy does not allow.
    #[error(
        "refused: {host} resolves only to loopback, private or link-local addresses ({addresses}), \
         which this sandbox's network policy does not allow"
    )]
    Private { host: String, addresses: String },
    /// Resolving the host failed.
    #[error("could not resolve {host}: {reason}")]
    Resolve { host: String, reason: String },
    /// Connecting failed.
    #[error("could not connect to {target}: {reason}")]
    Connect { target: String, reason: String },
    /// The client or the network was too slow.
    #[error("timed out: {0}")]
    Timeout(String),
}

impl Refusal {
    fn status(&self) -> (u16, &'static str, &'static str) {
        match self {
            Refusal::BadRequest(_) => (400, "Bad Request", "bad_request"),
            Refusal::NotAllowed { .. } => (403, "Forbidden", "not_allowed"),
            Refusal::Private { .. } => (403, "Forbidden", "private_address"),
            Refusal::Resolve { .. } => (502, "Bad Gateway", "resolve_failed"),
            Refusal::Connect { .. } => (502, "Bad Gateway", "connect_failed"),
            Refusal::Timeout(_) => (504, "Gateway Timeout", "timeout"),
        }
    }
}

/// What a request asks for.
#[derive(Debug, PartialEq, Eq)]
enum Target {
    /// A tunnel.
    Connect { host: Host, port: u16 },
    /// A plain HTTP request, forwarded with this head.
    Forward {
        host: Host,
        port: u16,
        head: Vec<u8>,
    },
}

/// Splits `host[:port]` (IPv6 in brackets); `default` when there is no port (or an empty one).
fn split_authority(
    authority: &str,
    default: Option<u16>,
) -> std::result::Result<(Host, u16), String> {
    let (host, port) = if authority.starts_with('[') {
        match authority.find(']') {
            Some(end) => {
                let rest = &authority[end + 1..];
                let port = match rest.strip_prefix(':') {
                    Some(p) => Some(p),
                    None if rest.is_empty() => None,
                    None => return Err(format!("bad authority {authority:?}")),
                };
                (&authority[..=end], port)
            }
            None => return Err(format!("bad authority {authority:?}")),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let port = match port.filter(|p| !p.is_empty()) {
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("bad port in {authority:?}"))?,
        None => default.ok_or_else(|| format!("{authority:?} has no port"))?,
    };
    Ok((Host::parse(host)?, port))
}

/// Hop-by-hop headers, never forwarded (the `Host` header is rewritten from the URI).
const DROPPED: [&str; 8] = [
    "host",
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "upgrade",
    "te",
];

/// Parses a request head (up to and including the blank line).
fn parse_request(head: &[u8]) -> std::result::Result<Target, Refusal> {
    let bad = |m: &str| Refusal::BadRequest(m.to_string());
    let text = std::str::from_utf8(head).map_err(|_| bad("the request head is not UTF-8"))?;
    let mut lines = text.split("\r\n");
    let line = lines.next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad("malformed request line"));
    };
    if !version.starts_with("HTTP/1.") || method.is_empty() || target.is_empty() {
        return Err(bad("malformed request line"));
    }
    let mut headers = Vec::new();
    for l in lines.filter(|l| !l.is_empty()) {
        let (name, value) = l
            .split_once(':')
            .ok_or_else(|| bad("malformed header line"))?;
        if name.is_empty() || name.contains(|c: char| c.is_ascii_whitespace()) {
            return Err(bad("malformed header line"));
        }
        headers.push((name, value.trim()));
    }
    if method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = split_authority(target, None).map_err(Refusal::BadRequest)?;
        return Ok(Target::Connect { host, port });
    }
    let scheme_end = target.find("://").unwrap_or(0);
    let scheme = &target[..scheme_end];
    if scheme.eq_ignore_ascii_case("https") {
        return Err(bad(
            "https URLs go through CONNECT (this proxy does not decrypt TLS)",
        ));
    }
    if !scheme.eq_ignore_ascii_case("http") {
        return Err(bad(
            "this is a proxy: send an absolute http:// URI, or CONNECT host:port",
        ));
    }
    let rest = &target[scheme_end + 3..];
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    if authority.contains('@') {
        return Err(bad("URLs with credentials are not forwarded"));
    }
    let mut path = rest[end..]
        .split('#')
        .next()
        .unwrap_or_default()
        .to_string();
    if !path.starts_with('/') {
        path.insert(0, '/');
    }
    let (host, port) = split_authority(authority, Some(80)).map_err(Refusal::BadRequest)?;
    // Headers named in `Connection` are hop-by-hop too.
    let listed: Vec<String> = headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("connection"))
        .flat_map(|(_, v)| v.split(',').map(|t| t.trim().to_ascii_lowercase()))
        .collect();
    let mut out = format!("{method} {path} {version}\r\nHost: {authority}\r\n");
    for (name, value) in headers {
        let lower = name.to_ascii_lowercase();
        if DROPPED.contains(&lower.as_str()) || listed.contains(&lower) {
            continue;
        }
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.push_str("Connection: close\r\n\r\n");
    Ok(Target::Forward {
        host,
        port,
        head: out.into_bytes(),
    })
}

/// A running proxy. Dropping it stops it and removes its folder.
pub(crate) struct Proxy {
    dir: PathBuf,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy").field("dir", &self.dir).finish()
    }
}

/// Makes the proxy's private folder in the temp folder.
/// The prefix of every proxy folder's name, followed by the runtime's pid.
const DIR_PREFIX: &str = "agentry-proxy-";

/// Removes the proxy folders that runtimes no longer alive left in the temporary folder.
/// Returns how many were removed.
pub(crate) fn sweep_stale() -> usize {
    crate::sys::remove_stale_entries(&std::env::temp_dir(), DIR_PREFIX, |p| {
        std::fs::remove_dir_all(p)
    })
}

fn make_dir() -> std::io::Result<PathBuf> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let base = std::env::temp_dir();
    let mut last = None;
    for _ in 0..16 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let name = format!(
            "{DIR_PREFIX}{}-{}-{nanos:08x}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let dir = base.join(name);
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free name")))
}

impl Proxy {
    /// Starts a proxy for `allow` on the current tokio runtime. `owner`: the uid/gid its folder
    /// and socket are given to (the sandbox's outer ids, when the runtime is root).
    pub(crate) fn start(allow: AllowList, owner: Option<(u32, u32)>) -> Result<Proxy> {
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|_| SandboxError::Setup("the network proxy needs a tokio runtime".into()))?;
        let dir = make_dir().map_err(|e| SandboxError::Setup(format!("network proxy: {e}")))?;
        let listener = (|| -> std::io::Result<UnixListener> {
            let path = dir.join(SOCKET_NAME);
            let listener = std::os::unix::net::UnixListener::bind(&path)?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
            if let Some((uid, gid)) = owner {
                std::os::unix::fs::lchown(&path, Some(uid), Some(gid))?;
                std::os::unix::fs::lchown(&dir, Some(uid), Some(gid))?;
            }
            listener.set_nonblocking(true)?;
            let _entered = handle.enter();
            UnixListener::from_std(listener)
        })();
        let listener = match listener {
            Ok(l) => l,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(SandboxError::Setup(format!("network proxy: {e}")));
            }
        };
        let task = handle.spawn(serve(listener, Arc::new(allow)));
        Ok(Proxy { dir, task })
    }

    /// The folder holding the socket (bind-mounted into the sandbox).
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // Aborting the accept task drops its JoinSet, which aborts every connection.
        self.task.abort();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn serve(listener: UnixListener, allow: Arc<AllowList>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) if conns.len() < MAX_CONNECTIONS => {
                    conns.spawn(handle(stream, allow.clone()));
                }
                Ok(_) => tracing::warn!("sandbox network proxy: too many connections, one closed"),
                Err(e) => {
                    tracing::warn!(error = %e, "sandbox network proxy: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// Reads a request head; the bytes after it (a body, or the start of a tunnel) come back too.
/// `None`: the client went away.
async fn read_head(
    client: &mut UnixStream,
) -> std::result::Result<Option<(Vec<u8>, Vec<u8>)>, Refusal> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let n = match client.read(&mut chunk).await {
            Ok(0) | Err(_) => return Ok(None),
            Ok(n) => n,
        };
        let from = buf.len().saturating_sub(3);
        buf.extend_from_slice(&chunk[..n]);
        if let Some(at) = buf[from..].windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(from + at + 4);
            return Ok(Some((buf, rest)));
        }
        if buf.len() > MAX_HEAD {
            return Err(Refusal::BadRequest(format!(
                "the request head is over {MAX_HEAD} bytes"
            )));
        }
    }
}

async fn respond(client: &mut UnixStream, refusal: &Refusal) {
    let (code, reason, kind) = refusal.status();
    let body = format!("agentry sandbox proxy: {refusal}\n");
    let msg = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\nX-Agentry-Proxy: {kind}\r\n\r\n{body}",
        body.len()
    );
    let _ = client.write_all(msg.as_bytes()).await;
    let _ = client.shutdown().await;
}

/// The addresses `host` may be reached at under the policy.
async fn resolve(
    host: &Host,
    port: u16,
    allow_private: bool,
) -> std::result::Result<Vec<SocketAddr>, Refusal> {
    let all: Vec<SocketAddr> = match host {
        Host::Ip(ip) => vec![SocketAddr::new(*ip, port)],
        Host::Name(name) => tokio::time::timeout(
            RESOLVE_TIMEOUT,
            tokio::net::lookup_host((name.as_str(), port)),
        )
        .await
        .map_err(|_| Refusal::Timeout(format!("resolving {name}")))?
        .map_err(|e| Refusal::Resolve {
            host: name.clone(),
            reason: e.to_string(),
        })?
        .collect(),
    };
    if all.is_empty() {
        return Err(Refusal::Resolve {
            host: host.to_string(),
            reason: "no address".into(),
        });
    }
    if allow_private {
        return Ok(all);
    }
    let public: Vec<SocketAddr> = all.iter().copied().filter(|a| is_public(a.ip())).collect();
    if public.is_empty() {
        let addresses = all
            .iter()
            .map(|a| a.ip().to_string())
            .collect::<Vec<_>>()
            .join(", ");
        return Err(Refusal::Private {
            host: host.to_string(),
            addresses,
        });
    }
    Ok(public)
}

async fn connect(addrs: &[SocketAddr], target: &str) -> std::result::Result<TcpStream, Refusal> {
    let mut last = String::from("no address");
    for addr in addrs {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Ok(Err(e)) => last = format!("{addr}: {e}"),
            Err(_) => last = format!("{addr}: timed out"),
        }
    }
    Err(Refusal::Connect {
        target: target.to_string(),
        reason: last,
    })
}

/// Checks a request against the policy and opens its upstream connection.
async fn open(target: &Target, allow: &AllowList) -> std::result::Result<TcpStream, Refusal> {
    let (host, port) = match target {
        Target::Connect { host, port } | Target::Forward { host, port, .. } => (host, *port),
    };
    if !allow.allows(host) {
        return Err(Refusal::NotAllowed {
            host: host.to_string(),
        });
    }
    let addrs = resolve(host, port, allow.allow_private).await?;
    connect(&addrs, &format!("{host}:{port}")).await
}

async fn handle(mut client: UnixStream, allow: Arc<AllowList>) {
    let (head, rest) = match tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut client)).await {
        Ok(Ok(Some(v))) => v,
        Ok(Ok(None)) => return,
        Ok(Err(refusal)) => return respond(&mut client, &refusal).await,
        Err(_) => {
            let refusal = Refusal::Timeout("waiting for the request".into());
            return respond(&mut client, &refusal).await;
        }
    };
    let target = match parse_request(&head) {
        Ok(t) => t,
        Err(refusal) => return respond(&mut client, &refusal).await,
    };
    let mut upstream = match open(&target, &allow).await {
        Ok(s) => s,
        Err(refusal) => {
            tracing::info!(%refusal, "sandbox network proxy refused a request");
            return respond(&mut client, &refusal).await;
        }
    };
    let first = match &target {
        Target::Connect { host, port } => {
            tracing::debug!(%host, port, "sandbox network proxy: tunnel");
            let ok = b"HTTP/1.1 200 Connection Established\r\n\r\n";
            if client.write_all(ok).await.is_err() {
                return;
            }
            rest
        }
        Target::Forward { host, port, head } => {
            tracing::debug!(%host, port, "sandbox network proxy: http request");
            let mut first = head.clone();
            first.extend_from_slice(&rest);
            first
        }
    };
    if upstream.write_all(&first).await.is_err() {
        return;
    }
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn list(domains: &[&str]) -> AllowList {
        let d: Vec<String> = domains.iter().map(|s| s.to_string()).collect();
        AllowList::new(&d, false).unwrap()
    }

    fn name(s: &str) -> Host {
        Host::parse(s).unwrap()
    }

    #[test]
    fn matching() {
        let a = list(&["Example.COM.", "*.pypi.org", "203.0.113.7", "[::1]"]);
        assert_eq!(
            a.domains(),
            ["example.com", "*.pypi.org", "203.0.113.7", "::1"]
        );
        assert!(a.allows(&name("example.com")));
        assert!(a.allows(&name("EXAMPLE.com.")));
        assert!(!a.allows(&name("www.example.com")));
        assert!(!a.allows(&name("badexample.com")));
        assert!(a.allows(&name("files.pypi.org")));
        assert!(a.allows(&name("a.b.pypi.org")));
        assert!(!a.allows(&name("pypi.org")));
        assert!(!a.allows(&name("evilpypi.org")));
        assert!(a.allows(&name("203.0.113.7")));
        assert!(a.allows(&name("[::1]")));
        assert!(!a.allows(&name("203.0.113.8")));
        assert!(!a.allows(&name("[::ffff:203.0.113.8]")));
        assert!(a.allows(&name("[::ffff:203.0.113.7]")));
        // The same rules for a host taken from a URL (the `fetch` tool's check).
        assert!(a.allows_host("Example.com"));
        assert!(a.allows_host("::1") && a.allows_host("[::1]"));
        assert!(a.allows_host("files.pypi.org") && a.allows_host("203.0.113.7"));
        assert!(!a.allows_host("www.example.com") && !a.allows_host("pypi.org"));
        assert!(!a.allows_host("127.1") && !a.allows_host(""));
        // Numeric names the resolver would read as addresses are no names.
        assert!(Host::parse("127.1").is_err());
        assert!(Host::parse("0x7f.1").is_err());
        assert!(Host::parse("a b").is_err());
        for bad in [
            "",
            "*",
            "*.",
            "a.*.com",
            "foo..com",
            "ex ample.com",
            "1.2.3",
        ] {
            assert!(
                AllowList::new(&[bad.to_string()], false).is_err(),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn public_addresses() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "64:ff9b::a00:1",
            "2002:7f00:1::",
        ] {
            assert!(!is_public(private.parse().unwrap()), "{private}");
        }
        for public in ["1.1.1.1", "93.184.216.34", "2606:4700::1111"] {
            assert!(is_public(public.parse().unwrap()), "{public}");
        }
    }

    #[test]
    fn requests() {
        let t = parse_request(b"CONNECT Example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
            .unwrap();
        assert_eq!(
            t,
            Target::Connect {
                host: Host::Name("example.com".into()),
                port: 443
            }
        );
        let t = parse_request(b"CONNECT [::1]:8443 HTTP/1.1\r\n\r\n").unwrap();
        assert_eq!(
            t,
            Target::Connect {
                host: Host::Ip("::1".parse().unwrap()),
                port: 8443
            }
        );
        assert!(parse_request(b"CONNECT example.com HTTP/1.1\r\n\r\n").is_err());
        let t = parse_request(
            b"GET http://a.test:8080/x?y=1 HTTP/1.1\r\nHost: evil.test\r\nProxy-Connection: keep-alive\r\n\
              Connection: keep-alive, X-Secret\r\nX-Secret: 1\r\nAccept: */*\r\n\r\n",
        )
        .unwrap();
        let Target::Forward { host, port, head } = t else {
            panic!("not forwarded")
        };
        assert_eq!((host, port), (Host::Name("a.test".into()), 8080));
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "GET /x?y=1 HTTP/1.1\r\nHost: a.test:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
        let t = parse_request(b"GET http://a.test?q HTTP/1.0\r\n\r\n").unwrap();
        let Target::Forward { port, head, .. } = t else {
            panic!("not forwarded")
        };
        assert_eq!(port, 80);
        assert!(
            String::from_utf8(head)
                .unwrap()
                .starts_with("GET /?q HTTP/1.0\r\n")
        );
        for bad in [
            &b"GET /local HTTP/1.1\r\n\r\n"[..],
            b"GET https://a.test/ HTTP/1.1\r\n\r\n",
            b"GET http://user:pw@a.test/ HTTP/1.1\r\n\r\n",
            b"GET http://a.test:99999/ HTTP/1.1\r\n\r\n",
            b"GET http://a.test/ SPDY/3\r\n\r\n",
            b"GARBAGE\r\n\r\n",
        ] {
            assert!(
                parse_request(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
