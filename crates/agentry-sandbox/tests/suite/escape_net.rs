//! Network escapes: every attempt to reach the host or the outside fails.

use std::net::{TcpListener, UdpSocket};
use std::os::linux::net::SocketAddrExt;
use std::time::Duration;

use super::common::*;

/// Runs a Python connect attempt and returns what it printed ("ok" or the error).
const CONNECT: &str = r#"
import socket, sys
fam = socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET
s = socket.socket(fam, socket.SOCK_STREAM)
s.settimeout(2)
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
    print("ok")
except OSError as e:
    print("blocked", e.errno)
"#;

async fn connect(sb: &agentry_sandbox::Sandbox, host: &str, port: u16) -> String {
    let req = agentry_sandbox::ExecRequest::new([
        "/usr/bin/python3",
        "-c",
        CONNECT,
        host,
        &port.to_string(),
    ])
    .timeout(Duration::from_secs(20));
    sb.run(req).await.unwrap().stdout_str()
}

#[tokio::test]
async fn tcp_to_host_loopback_fails() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let (sb, _dir) = sandbox().await;
    let out = connect(&sb, "127.0.0.1", port).await;
    assert!(out.starts_with("blocked"), "{out}");
    assert!(
        listener.accept().is_err(),
        "the host listener got no connection"
    );
    // Control: the same probe reaches a listener inside the sandbox's own loopback.
    let out = sh(
        &sb,
        "/usr/bin/python3 -c 'import socket,time; s=socket.socket(); s.bind((\"127.0.0.1\", 7777)); s.listen(); time.sleep(3)' & sleep 0.5; \
         /usr/bin/python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 7777)); print(\"inner ok\")'",
    )
    .await;
    assert_eq!(out.stdout_str(), "inner ok\n", "{}", out.stderr_str());
    sb.close().await;
}

#[tokio::test]
async fn ipv6_to_host_loopback_fails() {
    let Ok(listener) = TcpListener::bind("[::1]:0") else {
        panic!("the host has no IPv6 loopback: this test needs one");
    };
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let (sb, _dir) = sandbox().await;
    let out = connect(&sb, "::1", port).await;
    assert!(out.starts_with("blocked"), "{out}");
    assert!(listener.accept().is_err());
    sb.close().await;
}

#[tokio::test]
async fn udp_to_host_loopback_never_arrives() {
    let host = UdpSocket::bind("127.0.0.1:0").unwrap();
    host.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let port = host.local_addr().unwrap().port();
    let (sb, _dir) = sandbox().await;
    let out = py(
        &sb,
        &format!(
            "import socket\ns=socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
             for i in range(20):\n    s.sendto(b'escape', ('127.0.0.1', {port}))\nprint('sent')"
        ),
    )
    .await;
    assert_eq!(out.stdout_str(), "sent\n", "{}", out.stderr_str());
    let mut buf = [0u8; 64];
    assert!(
        host.recv_from(&mut buf).is_err(),
        "no datagram reached the host"
    );
    // Outside addresses are unreachable altogether.
    let out = py(
        &sb,
        "import socket\ns=socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         try:\n    s.sendto(b'x', ('8.8.8.8', 53)); print('sent')\nexcept OSError as e:\n    print('blocked', e.errno)",
    )
    .await;
    assert_eq!(
        out.stdout_str().trim(),
        format!("blocked {}", libc::ENETUNREACH)
    );
    sb.close().await;
}

#[tokio::test]
async fn abstract_unix_socket_of_the_host_is_unreachable() {
    let name = format!("agentry-sandbox-test-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let listener = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    listener.set_nonblocking(true).unwrap();
    let (sb, _dir) = sandbox().await;
    let out = py(
        &sb,
        &format!(
            "import socket\ns=socket.socket(socket.AF_UNIX)\n\
             try:\n    s.connect('\\0{name}'); print('ok')\nexcept OSError as e:\n    print('blocked', e.errno)"
        ),
    )
    .await;
    assert!(
        out.stdout_str().starts_with("blocked"),
        "{}{}",
        out.stdout_str(),
        out.stderr_str()
    );
    assert!(listener.accept().is_err());
    sb.close().await;
}

#[tokio::test]
async fn dns_resolution_fails() {
    let (sb, _dir) = sandbox().await;
    let out = py(
        &sb,
        "import socket\ntry:\n    print(socket.getaddrinfo('example.com', 443)); print('resolved')\n\
         except OSError as e:\n    print('blocked')",
    )
    .await;
    assert_eq!(out.stdout_str(), "blocked\n", "{}", out.stderr_str());
    let out = sh(&sb, "cat /etc/resolv.conf; ls /sys 2>&1 | head -1").await;
    assert!(
        !out.stdout_str().contains("nameserver"),
        "no resolver is configured"
    );
    sb.close().await;
}

/// Netlink: routing information (what `getifaddrs` reads, and ZeroMQ needs) shows only the
/// sandbox's own loopback, and cannot be changed (no capability); every other netlink protocol
/// (audit, netfilter, uevents…) is refused.
#[tokio::test]
async fn netlink_reads_only_the_sandboxs_loopback() {
    let (sb, _dir) = sandbox().await;
    let out = py(
        &sb,
        "import socket\nprint(sorted(name for _, name in socket.if_nameindex()))",
    )
    .await;
    assert_eq!(out.stdout_str(), "['lo']\n", "{}", out.stderr_str());
    let out = sh(
        &sb,
        "ip link set lo down 2>&1; ip addr add 10.9.9.9/32 dev lo 2>&1; ip -o addr",
    )
    .await;
    let text = out.stdout_str();
    assert!(!text.contains("10.9.9.9"), "{text}");
    assert!(text.contains("Operation not permitted"), "{text}");
    for protocol in [9, 12, 15, 16] {
        // NETLINK_AUDIT, NETLINK_NETFILTER, NETLINK_KOBJECT_UEVENT, NETLINK_GENERIC.
        let out = py(
            &sb,
            &format!(
                "import socket\ntry:\n    socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, {protocol})\n    print('open')\nexcept OSError as e:\n    print('refused', e.errno)"
            ),
        )
        .await;
        assert_eq!(
            out.stdout_str(),
            format!("refused {}\n", libc::EPERM),
            "netlink protocol {protocol}"
        );
    }
    sb.close().await;
}
