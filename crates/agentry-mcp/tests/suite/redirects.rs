//! A streamable-HTTP server's redirect is not followed: its configured headers (secrets among
//! them) reach only the configured URL.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use agentry_mcp::{McpManager, McpServerConfig, ServerState, ValueSource};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

/// Reads a request head (and whatever came with it) from `stream`.
async fn read_head(stream: &mut tokio::net::TcpStream) -> String {
    let mut head = Vec::new();
    let mut buffer = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buffer[..n]),
        }
    }
    String::from_utf8_lossy(&head).to_ascii_lowercase()
}

#[tokio::test]
async fn an_http_servers_redirect_is_not_followed_with_its_headers() -> anyhow::Result<()> {
    // The second listener counts connections; the first answers every request with a 307 to it
    // and keeps the heads it was sent.
    let second = TcpListener::bind("127.0.0.1:0").await?;
    let target = format!("http://{}/mcp", second.local_addr()?);
    let reached = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&reached);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = second.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            let _ = read_head(&mut stream).await;
        }
    });
    let first = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/mcp", first.local_addr()?);
    let heads = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = Arc::clone(&heads);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = first.accept().await {
            let seen = Arc::clone(&seen);
            let target = target.clone();
            tokio::spawn(async move {
                let head = read_head(&mut stream).await;
                if let Ok(mut heads) = seen.lock() {
                    heads.push(head);
                }
                let response = format!(
                    "HTTP/1.1 307 Temporary Redirect\r\nlocation: {target}\r\ncontent-length: 0\r\n\
                     connection: close\r\n\r\n"
                );
                let _ = stream.write_all(response.as_bytes()).await;
            });
        }
    });

    let mut config = McpServerConfig::http(url);
    config.headers.insert(
        "x-api-key".into(),
        ValueSource::Literal("s3cr3t-mcp-key".into()),
    );
    let manager = McpManager::new();
    manager.add("moved", config, &|_| None).await?;
    let status = manager.wait_ready("moved", super::support::READY).await?;
    assert_ne!(status.state, ServerState::Connected, "{status:?}");
    assert_ne!(status.state, ServerState::Starting, "{status:?}");
    let heads = heads.lock().map(|heads| heads.clone()).unwrap_or_default();
    assert!(
        heads
            .iter()
            .any(|head| head.contains("x-api-key: s3cr3t-mcp-key")),
        "the first server got the header: {heads:?}"
    );
    assert_eq!(
        reached.load(Ordering::SeqCst),
        0,
        "the redirect target was reached"
    );
    Ok(())
}
