//! `agentry serve` as a process in tests: a free port, the server started on a data folder,
//! and waiting until it listens.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub(crate) fn serve(home: &Path, port: u16, extra: &[&str]) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
        .arg("--home")
        .arg(home)
        .args(["serve", &format!("127.0.0.1:{port}")])
        .args(extra)
        .env_remove("OPENAI_API_KEY")
        .env_remove("AGENTRY_DATABASE_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// Waits for the server's first line (it listens from then on).
pub(crate) async fn listening(child: &mut tokio::process::Child) {
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(20), stdout.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(first.starts_with("Agentry is listening"), "{first}");
    // Keep reading so the server never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = stdout.next_line().await {} });
}
