//! Workspace files and terminals benchmark. Prints tables; asserts nothing.
//!
//! `cargo bench -p agentry-server --bench files` (the terminal part needs the sandbox's agent:
//! `cargo build --release -p agentry-sandbox --bins` first; it is skipped without it).
//!
//! 1. Throughput of a 256 MiB file through the API against a plain file copy on the same disk:
//!    a chunked upload (the seed's `upload/init` → `PUT chunk/{n}` × n, two at a time →
//!    `complete`) and a download (`GET /linglong/v1/workspace/content`), each measured as the
//!    time from the first byte sent to the file complete on the other side, beside
//!    `std::fs::copy` of the same bytes.
//! 2. Terminal echo: one byte written to a `cat` on a PTY in the session's sandbox through the
//!    WebSocket, until it comes back (p50/p99 over 500 round trips).

// They await whole futures on purpose: nothing keeps them per request in flight, as a
// handler's is (the crate's 2 KiB `future-size-threshold`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::large_futures)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use agentry_server::{AppState, router};
use agentry_store::Store;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};

const SIZE: usize = 256 * 1024 * 1024;

fn init_exe() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let release = exe.parent()?.parent()?;
    let init = release.join("agentry-sandbox-init");
    init.is_file().then_some(init)
}

fn mib_per_s(bytes: usize, took: Duration) -> f64 {
    bytes as f64 / (1024.0 * 1024.0) / took.as_secs_f64()
}

#[tokio::main]
async fn main() {
    let home = tempfile::tempdir().unwrap();
    let store = Store::open_home(home.path()).await.unwrap();
    let sandboxes = init_exe().map(|init| {
        let backend = agentry_sandbox::backend(agentry_sandbox::SandboxConfig {
            backend: agentry_sandbox::BackendKind::Native,
            init_exe: Some(init),
            ..Default::default()
        })
        .unwrap();
        agentry_sandbox::SandboxPool::new(
            backend,
            agentry_sandbox::SandboxSpec::new(home.path().join("placeholder")),
        )
    });
    let tools = agentry_app::ToolEnvironment {
        workspaces: Some(home.path().join("workspaces")),
        sandboxes,
        ..Default::default()
    };
    let state = AppState::with_tools(store, tools).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let app = router(state.clone());
    tokio::spawn(async move {
        axum::serve(
            agentry_server::without_delay(listener),
            app.into_make_service(),
        )
        .await
        .unwrap()
    });
    let http = reqwest::Client::new();
    // A session (its workspace) to work in.
    let session = state
        .app
        .parts()
        .store
        .create_session(agentry_store::NewSession::new())
        .await
        .unwrap()
        .id
        .to_string();
    let workspace = state
        .app
        .parts()
        .sessions
        .workspace(session.parse().unwrap())
        .unwrap();
    std::fs::create_dir_all(&workspace).unwrap();

    let data: Vec<u8> = (0..SIZE).map(|i| (i * 31 % 251) as u8).collect();
    let source = home.path().join("source.bin");
    std::fs::write(&source, &data).unwrap();

    // A plain copy on the same disk, synced like the API's writes.
    let started = Instant::now();
    std::fs::copy(&source, home.path().join("copy.bin")).unwrap();
    std::fs::File::open(home.path().join("copy.bin"))
        .unwrap()
        .sync_all()
        .unwrap();
    let copy = started.elapsed();

    // Upload.
    let started = Instant::now();
    let plan: Value = http
        .post(format!("{url}/linglong/v1/workspace/upload/init"))
        .json(
            &json!({"workspace_id": session, "file_name": "up.bin", "file_size": SIZE,
                      "target_path": "up.bin"}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = plan["upload_id"].as_str().unwrap().to_owned();
    let chunks = plan["chunks"].as_array().unwrap().clone();
    futures::stream::iter(chunks.iter().enumerate())
        .for_each_concurrent(2, |(n, chunk)| {
            let offset = chunk["offset"].as_u64().unwrap() as usize;
            let len = chunk["size"].as_u64().unwrap() as usize;
            let body = data[offset..offset + len].to_vec();
            let request = http
                .put(format!("{url}/linglong/v1/workspace/upload/{id}/chunk/{n}"))
                .body(body)
                .send();
            async move {
                assert!(request.await.unwrap().status().is_success());
            }
        })
        .await;
    let done = http
        .post(format!("{url}/linglong/v1/workspace/upload/{id}/complete"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert!(done.status().is_success(), "{}", done.text().await.unwrap());
    let upload = started.elapsed();
    assert_eq!(
        std::fs::metadata(workspace.join("up.bin")).unwrap().len() as usize,
        SIZE
    );

    // Download.
    let started = Instant::now();
    let mut response = http
        .get(format!(
            "{url}/linglong/v1/workspace/content?session_id={session}&path=up.bin"
        ))
        .send()
        .await
        .unwrap();
    let mut received = 0usize;
    while let Some(chunk) = response.chunk().await.unwrap() {
        received += chunk.len();
    }
    let download = started.elapsed();
    assert_eq!(received, SIZE);

    println!(
        "Workspace files: {} MiB on this machine",
        SIZE / (1024 * 1024)
    );
    println!(
        "{:<34} | {:>10} | {:>10} | {:>12}",
        "path", "seconds", "MiB/s", "vs copy"
    );
    println!("{}", "-".repeat(74));
    for (name, took) in [
        ("plain file copy (std::fs::copy)", copy),
        ("chunked upload (seed API)", upload),
        ("download (GET content)", download),
    ] {
        println!(
            "{:<34} | {:>10.3} | {:>10.1} | {:>11.0}%",
            name,
            took.as_secs_f64(),
            mib_per_s(SIZE, took),
            copy.as_secs_f64() / took.as_secs_f64() * 100.0
        );
    }

    if state.app.parts().tools.sandboxes.is_none() {
        println!("\nTerminal echo: skipped (build agentry-sandbox-init in release first)");
        return;
    }
    let opened: Value = http
        .post(format!("{url}/v1/terminals"))
        .json(&json!({"session_id": session, "command": ["/bin/cat"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let terminal = opened["terminal_id"].as_str().unwrap();
    let ws = format!(
        "{}/v1/terminals/{terminal}/ws",
        url.replacen("http", "ws", 1)
    );
    let (mut socket, _) = tokio_tungstenite::connect_async_with_config(ws, None, true)
        .await
        .unwrap();
    // Raw mode: no line buffering, no echo by the terminal itself (cat's own output comes back).
    let _attached = socket.next().await;
    let mut samples = Vec::new();
    for i in 0..500u32 {
        let byte = b'a' + (i % 26) as u8;
        let started = Instant::now();
        socket
            .send(tokio_tungstenite::tungstenite::Message::Binary(
                vec![byte, b'\n'].into(),
            ))
            .await
            .unwrap();
        // The terminal echoes the keystrokes, then cat writes the line back: wait for both.
        let mut seen = 0usize;
        while seen < 2 {
            if let Some(Ok(tokio_tungstenite::tungstenite::Message::Binary(bytes))) =
                socket.next().await
            {
                seen += bytes.iter().filter(|b| **b == byte).count();
            }
        }
        samples.push(started.elapsed());
    }
    samples.sort();
    let at = |p: f64| samples[((samples.len() - 1) as f64 * p).round() as usize];
    println!(
        "\nTerminal echo through the WebSocket (a line to `cat` on a PTY in the sandbox and back), 500 round trips"
    );
    println!(
        "p50 {:.3} ms | p99 {:.3} ms | max {:.3} ms",
        at(0.5).as_secs_f64() * 1e3,
        at(0.99).as_secs_f64() * 1e3,
        at(1.0).as_secs_f64() * 1e3
    );
    if let Some(pool) = &state.app.parts().tools.sandboxes {
        pool.close_all().await;
    }
}
