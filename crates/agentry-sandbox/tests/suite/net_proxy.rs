//! The network allow-list: commands reach allowed hosts through the host-side proxy (plain HTTP
//! and CONNECT tunnels), everything else is refused, and nothing goes around the proxy.
//!
//! The only network here is loopback, so the upstreams are fake servers on the host's 127.0.0.1
//! and the policies set `allow_private` (except where the SSRF guard itself is tested). Inside,
//! `NO_PROXY` names localhost (the sandbox's own loopback), so the commands here clear it to send
//! `localhost` through the proxy.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentry_sandbox::{
    ExecOutput, ExecRequest, NetworkMode, NetworkPolicy, Sandbox, SandboxError, SandboxSpec,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::common::*;

/// A fake server on the host's loopback that records what reached it.
struct Upstream {
    port: u16,
    /// One entry per connection: the request head (HTTP) or "connection" (echo).
    seen: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Upstream {
    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An HTTP server answering every request with 200 and `body`.
async fn http_upstream(body: &'static str) -> Upstream {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            let log = log.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                log.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&head).into_owned());
                let reply = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
                     Connection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(reply.as_bytes()).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    Upstream { port, seen, task }
}

/// A raw TCP server that echoes everything back until the client's end of stream.
async fn echo_upstream() -> Upstream {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            log.lock().unwrap().push("connection".into());
            let log = log.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                loop {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if conn.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    }
                }
                log.lock().unwrap().push("closed".into());
                let _ = conn.shutdown().await;
            });
        }
    });
    Upstream { port, seen, task }
}

fn allow_list(domains: &[&str], allow_private: bool) -> NetworkPolicy {
    NetworkPolicy::AllowList {
        domains: domains.iter().map(|d| d.to_string()).collect(),
        allow_private,
    }
}

async fn proxied_sandbox(domains: &[&str], allow_private: bool) -> (Sandbox, tempfile::TempDir) {
    let policy = allow_list(domains, allow_private);
    sandbox_with(move |s| s.network = policy).await
}

/// An HTTP GET through urllib (which reads the proxy variables): prints the status, then the
/// body (of an error response too), or `error <type> <message>`.
const GET: &str = r#"
import sys, urllib.request, urllib.error
try:
    r = urllib.request.urlopen(sys.argv[1], timeout=10)
    print(r.status); print(r.read().decode(), end="")
except urllib.error.HTTPError as e:
    print(e.code); print(e.read().decode(), end="")
except Exception as e:
    print("error", type(e).__name__, e)
"#;

/// A `CONNECT host:port` by hand to the bridge: prints the proxy's status line, then what came
/// back through the tunnel after sending a line and the end of stream (or the error body).
const CONNECT: &str = r#"
import socket, sys
target = sys.argv[1]
s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
head = b""
while b"\r\n\r\n" not in head:
    c = s.recv(1)
    if not c:
        break
    head += c
print(head.split(b"\r\n")[0].decode())
if b" 200 " in head.split(b"\r\n")[0]:
    s.sendall(b"ping through the tunnel")
    s.shutdown(socket.SHUT_WR)
rest = b""
while True:
    c = s.recv(4096)
    if not c:
        break
    rest += c
print(rest.decode(), end="")
"#;

/// Runs a Python snippet with arguments, `NO_PROXY` cleared (so `localhost` goes through the
/// proxy too).
async fn py_args(sb: &Sandbox, code: &str, args: &[&str]) -> ExecOutput {
    let mut argv = vec!["/usr/bin/python3", "-c", code];
    argv.extend_from_slice(args);
    sb.run(
        ExecRequest::new(argv)
            .env("NO_PROXY", "")
            .env("no_proxy", "")
            .timeout(Duration::from_secs(30)),
    )
    .await
    .unwrap()
}

async fn get(sb: &Sandbox, url: &str) -> String {
    let out = py_args(sb, GET, &[url]).await;
    assert!(out.status.success(), "{}", out.stderr_str());
    out.stdout_str()
}

async fn connect(sb: &Sandbox, target: &str) -> String {
    let out = py_args(sb, CONNECT, &[target]).await;
    assert!(out.status.success(), "{}", out.stderr_str());
    out.stdout_str()
}

#[tokio::test]
async fn allowed_host_is_reached_through_the_proxy() {
    let upstream = http_upstream("hello from upstream").await;
    let (sb, _dir) = proxied_sandbox(&["localhost"], true).await;

    // The policy is reported, by the runtime and by the agent.
    let report = sb.report();
    assert_eq!(report.network.mode, NetworkMode::AllowList);
    assert_eq!(report.network.allowed_domains, ["localhost"]);
    assert!(report.network.allow_private);
    assert_eq!(
        report.network.proxy_url.as_deref(),
        Some("http://127.0.0.1:3128")
    );
    let policy = report.policy.as_ref().unwrap();
    assert_eq!(policy.network, "allow_list");
    assert!(!policy.network_off);
    assert_eq!(policy.proxy_bridge.as_deref(), Some("127.0.0.1:3128"));

    // The commands' environment points at the bridge.
    let env = sh(&sb, "env | grep -i _proxy= | sort").await.stdout_str();
    for var in [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
    ] {
        assert!(
            env.lines()
                .any(|l| l == format!("{var}=http://127.0.0.1:3128")),
            "{var} missing in {env}"
        );
    }
    assert!(
        env.lines().any(|l| l == "NO_PROXY=localhost,127.0.0.1,::1"),
        "{env}"
    );

    // Python's urllib, through the proxy variables.
    let out = get(
        &sb,
        &format!("http://localhost:{}/hello?x=1", upstream.port),
    )
    .await;
    assert_eq!(out, "200\nhello from upstream");
    let seen = upstream.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(
        seen[0].starts_with("GET /hello?x=1 HTTP/1.1\r\n"),
        "{}",
        seen[0]
    );
    assert!(
        seen[0].contains(&format!("Host: localhost:{}\r\n", upstream.port)),
        "{}",
        seen[0]
    );
    assert!(seen[0].contains("Connection: close\r\n"), "{}", seen[0]);
    assert!(
        !seen[0].to_ascii_lowercase().contains("proxy-"),
        "{}",
        seen[0]
    );

    // curl too (it reads the lower-case http_proxy).
    if std::path::Path::new("/usr/bin/curl").exists() {
        let out = sb
            .run(
                ExecRequest::new([
                    "/usr/bin/curl",
                    "-sS",
                    "--max-time",
                    "10",
                    &format!("http://localhost:{}/curl", upstream.port),
                ])
                .env("NO_PROXY", "")
                .env("no_proxy", "")
                .timeout(Duration::from_secs(30)),
            )
            .await
            .unwrap();
        assert_eq!(
            out.stdout_str(),
            "hello from upstream",
            "{}",
            out.stderr_str()
        );
        assert_eq!(upstream.seen().len(), 2);
        assert!(upstream.seen()[1].starts_with("GET /curl HTTP/1.1\r\n"));
    }
    sb.close().await;
}

#[tokio::test]
async fn hosts_off_the_list_are_refused() {
    let upstream = http_upstream("secret").await;
    let (sb, _dir) = proxied_sandbox(&["localhost", "*.allowed.test"], true).await;

    let out = get(&sb, &format!("http://blocked.example:{}/", upstream.port)).await;
    assert_eq!(
        out,
        "403\nagentry sandbox proxy: refused: blocked.example is not on this sandbox's network \
         allow-list\n"
    );
    // An IP literal is refused unless it is listed itself, even if a listed name resolves to it.
    let out = get(&sb, &format!("http://127.0.0.1:{}/", upstream.port)).await;
    assert!(out.starts_with("403\n"), "{out}");
    assert!(
        out.contains("127.0.0.1 is not on this sandbox's network allow-list"),
        "{out}"
    );
    // A wildcard covers subdomains, not the domain itself; the refusal comes before any lookup.
    let out = get(&sb, &format!("http://allowed.test:{}/", upstream.port)).await;
    assert!(
        out.starts_with("403\n") && out.contains("allowed.test is not on"),
        "{out}"
    );
    let out = get(
        &sb,
        &format!("http://localhost.evil.test:{}/", upstream.port),
    )
    .await;
    assert!(out.starts_with("403\n"), "{out}");
    assert!(
        upstream.seen().is_empty(),
        "the upstream saw no connection: {:?}",
        upstream.seen()
    );
    // Control: the listed host is reached.
    let out = get(&sb, &format!("http://LocalHost.:{}/ok", upstream.port)).await;
    assert_eq!(out, "200\nsecret");
    assert_eq!(upstream.seen().len(), 1);
    sb.close().await;
}

#[tokio::test]
async fn going_around_the_proxy_still_fails() {
    let upstream = http_upstream("direct").await;
    let (sb, _dir) = proxied_sandbox(&["localhost"], true).await;
    let port = upstream.port.to_string();

    // A raw socket to the host's loopback: the namespace has no route there.
    let out = py_args(
        &sb,
        "import socket, sys\ns = socket.socket(); s.settimeout(3)\n\
         try:\n    s.connect(('127.0.0.1', int(sys.argv[1]))); print('connected')\n\
         except OSError as e:\n    print('blocked', e.errno)",
        &[&port],
    )
    .await;
    assert!(
        out.stdout_str().starts_with("blocked"),
        "{}",
        out.stdout_str()
    );
    // urllib told to ignore the proxy variables.
    let out = py_args(
        &sb,
        "import sys, urllib.request\n\
         o = urllib.request.build_opener(urllib.request.ProxyHandler({}))\n\
         try:\n    print(o.open(sys.argv[1], timeout=5).status)\nexcept OSError as e:\n    print('failed', e)",
        &[&format!("http://localhost:{port}/")],
    )
    .await;
    assert!(
        out.stdout_str().starts_with("failed"),
        "{}",
        out.stdout_str()
    );
    // curl told to ignore them.
    if std::path::Path::new("/usr/bin/curl").exists() {
        let out = sh(
            &sb,
            &format!("curl -sS --noproxy '*' --max-time 5 http://localhost:{port}/; echo rc=$?"),
        )
        .await;
        assert!(!out.stdout_str().contains("direct"), "{}", out.stdout_str());
        assert!(!out.stdout_str().contains("rc=0"), "{}", out.stdout_str());
    }
    // Public addresses are unreachable altogether.
    let out = py_args(
        &sb,
        "import socket\ns = socket.socket(); s.settimeout(3)\n\
         try:\n    s.connect(('93.184.216.34', 80)); print('connected')\n\
         except OSError as e:\n    print('blocked', e.errno)",
        &[],
    )
    .await;
    assert_eq!(
        out.stdout_str().trim(),
        format!("blocked {}", libc::ENETUNREACH)
    );
    assert!(upstream.seen().is_empty(), "{:?}", upstream.seen());
    // Control: through the proxy, the same host answers.
    assert_eq!(
        get(&sb, &format!("http://localhost:{port}/")).await,
        "200\ndirect"
    );
    assert_eq!(upstream.seen().len(), 1);
    sb.close().await;
}

#[tokio::test]
async fn connect_tunnels_to_allowed_hosts_only() {
    let echo = echo_upstream().await;
    let (sb, _dir) = proxied_sandbox(&["localhost"], true).await;

    let out = connect(&sb, &format!("localhost:{}", echo.port)).await;
    assert_eq!(
        out,
        "HTTP/1.1 200 Connection Established\nping through the tunnel"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while echo.seen().len() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(echo.seen(), ["connection", "closed"]);

    let out = connect(&sb, "evil.example:443").await;
    assert!(out.starts_with("HTTP/1.1 403 Forbidden\n"), "{out}");
    assert!(
        out.contains("refused: evil.example is not on this sandbox's network allow-list"),
        "{out}"
    );
    let out = connect(&sb, &format!("127.0.0.1:{}", echo.port)).await;
    assert!(out.starts_with("HTTP/1.1 403 Forbidden\n"), "{out}");
    // Not a proxy request at all.
    let out = py_args(
        &sb,
        "import socket\ns = socket.create_connection(('127.0.0.1', 3128), timeout=10)\n\
         s.sendall(b'GET / HTTP/1.1\\r\\nHost: localhost\\r\\n\\r\\n')\n\
         print(s.recv(100).split(b'\\r\\n')[0].decode())",
        &[],
    )
    .await;
    assert_eq!(out.stdout_str(), "HTTP/1.1 400 Bad Request\n");
    assert_eq!(echo.seen().len(), 2, "{:?}", echo.seen());

    // curl's https goes through CONNECT: the tunnel opens to the echo server, the TLS handshake
    // then fails (it is no TLS server), but the upstream saw the connection.
    if std::path::Path::new("/usr/bin/curl").exists() {
        let out = sb
            .run(
                ExecRequest::new([
                    "/usr/bin/curl",
                    "-sS",
                    "--max-time",
                    "5",
                    &format!("https://localhost:{}/", echo.port),
                ])
                .env("NO_PROXY", "")
                .env("no_proxy", "")
                .timeout(Duration::from_secs(30)),
            )
            .await
            .unwrap();
        assert!(!out.status.success());
        assert_eq!(echo.seen().first().map(String::as_str), Some("connection"));
        assert!(echo.seen().len() >= 3, "{:?}", echo.seen());
        let out = sh(
            &sb,
            "NO_PROXY= no_proxy= curl -sS --max-time 5 https://evil.example/ 2>&1",
        )
        .await;
        assert!(out.stdout_str().contains("403"), "{}", out.stdout_str());
    }
    sb.close().await;
}

#[tokio::test]
async fn private_addresses_are_refused_without_allow_private() {
    let upstream = http_upstream("internal").await;
    let echo = echo_upstream().await;
    let (sb, _dir) = proxied_sandbox(&["localhost", "127.0.0.1"], false).await;
    assert!(!sb.report().network.allow_private);

    let out = get(&sb, &format!("http://localhost:{}/", upstream.port)).await;
    assert!(out.starts_with("403\n"), "{out}");
    assert!(
        out.contains("refused: localhost resolves only to loopback, private or link-local addresses (127.0.0.1"),
        "{out}"
    );
    // A listed IP literal is still a private address.
    let out = get(&sb, &format!("http://127.0.0.1:{}/", upstream.port)).await;
    assert!(
        out.starts_with("403\n") && out.contains("127.0.0.1 resolves only to loopback"),
        "{out}"
    );
    let out = connect(&sb, &format!("localhost:{}", echo.port)).await;
    assert!(out.starts_with("HTTP/1.1 403 Forbidden\n"), "{out}");
    assert!(out.contains("localhost resolves only to loopback"), "{out}");
    assert!(upstream.seen().is_empty(), "{:?}", upstream.seen());
    assert!(echo.seen().is_empty(), "{:?}", echo.seen());
    sb.close().await;
}

#[tokio::test]
async fn commands_cannot_stop_the_bridge() {
    let upstream = http_upstream("still here").await;
    let (sb, _dir) = proxied_sandbox(&["localhost"], true).await;
    // The bridge is a process of the sandbox, in a Landlock domain of its own: the commands'
    // signals cannot reach it, nor can they take its port.
    let out = sh(
        &sb,
        "for p in /proc/[0-9]*; do [ \"$(cat $p/comm)\" = agentry-sandbox ] && echo ${p#/proc/}; done",
    )
    .await;
    let pids: Vec<String> = out.stdout_str().lines().map(str::to_string).collect();
    assert!(pids.len() >= 2, "PID 1 and the bridge: {pids:?}");
    let bridge = pids.iter().find(|p| *p != "1").unwrap();
    let out = sh(
        &sb,
        &format!("kill -9 {bridge}; echo rc=$?; kill -9 -1; true"),
    )
    .await;
    assert!(
        out.stdout_str().contains("rc=1"),
        "{}{}",
        out.stdout_str(),
        out.stderr_str()
    );
    let out = py_args(
        &sb,
        "import socket\ns = socket.socket()\n\
         try:\n    s.bind(('127.0.0.1', 3128)); print('bound')\n\
         except OSError as e:\n    print('taken', e.errno)",
        &[],
    )
    .await;
    assert_eq!(
        out.stdout_str(),
        format!("taken {}\n", libc::EADDRINUSE),
        "{:?} {}",
        out.status,
        out.stderr_str()
    );
    let out = get(&sb, &format!("http://localhost:{}/", upstream.port)).await;
    assert_eq!(out, "200\nstill here");
    sb.close().await;
}

/// The proxy folders of this process still in the temp folder.
fn our_proxy_dirs() -> Vec<String> {
    let prefix = format!("agentry-proxy-{}-", std::process::id());
    std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&prefix))
        .collect()
}

fn fds() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .map(|e| {
            let target = std::fs::read_link(e.path()).unwrap_or_default();
            format!(
                "{} -> {}",
                e.file_name().to_string_lossy(),
                target.display()
            )
        })
        .collect();
    v.sort();
    v
}

fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[tokio::test]
async fn proxies_end_with_their_sandboxes() {
    let upstream = http_upstream("cycle").await;
    let echo = echo_upstream().await;
    let backend = native();
    let dir = tempfile::tempdir().unwrap();
    let spec = || {
        let mut s = SandboxSpec::new(dir.path());
        s.network = allow_list(&["localhost"], true);
        s
    };
    // Warm up once, then count (once the closed sandbox's connection reader let its socket go).
    backend.create(spec()).await.unwrap().close().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let fds_before = fd_count();
    let fd_list = fds();
    for _ in 0..10 {
        let sb = backend.create(spec()).await.unwrap();
        assert_eq!(our_proxy_dirs().len(), 1, "{:?}", our_proxy_dirs());
        assert_eq!(
            get(&sb, &format!("http://localhost:{}/", upstream.port)).await,
            "200\ncycle"
        );
        sb.close().await;
        assert!(our_proxy_dirs().is_empty(), "{:?}", our_proxy_dirs());
    }
    // A tunnel left open in the background ends when its sandbox closes.
    let sb = backend.create(spec()).await.unwrap();
    let hold = format!(
        "import socket, time\ns = socket.create_connection(('127.0.0.1', 3128))\n\
         s.sendall(b'CONNECT localhost:{} HTTP/1.1\\r\\n\\r\\n')\nprint(s.recv(100), flush=True)\ntime.sleep(1000)",
        echo.port
    );
    let mut handle = sb
        .exec(
            ExecRequest::new(["/usr/bin/python3", "-c", &hold])
                .env("NO_PROXY", "")
                .env("no_proxy", ""),
        )
        .await
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), handle.next())
        .await
        .unwrap();
    assert!(
        matches!(&first, Some(agentry_sandbox::ExecEvent::Stdout(b)) if String::from_utf8_lossy(b).contains("200 Connection Established")),
        "{first:?}"
    );
    assert_eq!(echo.seen(), ["connection"]);
    sb.close().await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while echo.seen().len() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(echo.seen(), ["connection", "closed"], "the tunnel ended");
    assert!(our_proxy_dirs().is_empty(), "{:?}", our_proxy_dirs());
    // The sandbox's connection lives as long as the sandbox value (and its command's handle).
    drop(handle);
    drop(sb);
    let deadline = Instant::now() + Duration::from_secs(2);
    while fd_count() != fds_before && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        fd_count(),
        fds_before,
        "no descriptor leaked: {fd_list:?} then {:?}",
        fds()
    );
}

#[tokio::test]
async fn bad_allow_lists_are_refused_and_leave_nothing() {
    let backend = native();
    let dir = tempfile::tempdir().unwrap();
    for bad in ["*", "exa mple.com", "a.*.test", "127.1"] {
        let mut spec = SandboxSpec::new(dir.path());
        spec.network = allow_list(&[bad], false);
        match backend.create(spec).await {
            Err(SandboxError::InvalidRequest(m)) => assert!(m.contains(bad), "{m}"),
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    assert!(our_proxy_dirs().is_empty(), "{:?}", our_proxy_dirs());
    // The default stays off.
    let (sb, _d) = sandbox().await;
    assert_eq!(sb.report().network.mode, NetworkMode::Off);
    assert_eq!(sb.report().policy.as_ref().unwrap().network, "off");
    assert!(sb.report().policy.as_ref().unwrap().proxy_bridge.is_none());
    let env = sh(&sb, "env").await.stdout_str();
    assert!(!env.to_ascii_lowercase().contains("_proxy="), "{env}");
    sb.close().await;
}

#[tokio::test]
async fn local_backend_says_the_allow_list_is_not_enforced() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = SandboxSpec::new(dir.path());
    spec.network = allow_list(&["example.com"], false);
    let sb = local().create(spec).await.unwrap();
    let report = sb.report();
    assert_eq!(report.network.mode, NetworkMode::Host);
    assert!(
        report
            .warnings
            .iter()
            .any(|w| w.contains("allow-list is not enforced")),
        "{:?}",
        report.warnings
    );
    sb.close().await;
}
