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

/// `agentry serve` on `home` and `port` with `extra` arguments: no API key or database URL
/// from the environment, stdout and stderr piped, killed when dropped.
pub(crate) fn serve_command(home: &Path, port: u16, extra: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"));
    command
        .arg("--home")
        .arg(home)
        .args(["serve", &format!("127.0.0.1:{port}")])
        .args(extra)
        .env_remove("OPENAI_API_KEY")
        .env_remove("AGENTRY_DATABASE_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

pub(crate) fn serve(home: &Path, port: u16, extra: &[&str]) -> tokio::process::Child {
    serve_command(home, port, extra).spawn().unwrap()
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
