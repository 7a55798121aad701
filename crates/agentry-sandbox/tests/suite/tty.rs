//! Commands on a pseudo-terminal: a REPL sees a terminal, is driven by keystrokes, follows a
//! resize, takes ^C as an interrupt, and ends with its exit code.

use std::time::Duration;

use agentry_sandbox::{Backend, ExecRequest, SandboxSpec, TtyProcess, TtySize};

use super::common::{local, native};

/// Reads until `needle` shows up (or ten seconds pass); answers everything read.
async fn read_until(tty: &TtyProcess, seen: &mut String, needle: &str) {
    let mut buf = vec![0u8; 4096];
    let wait = async {
        while !seen.contains(needle) {
            let read = tty.read(&mut buf).await.unwrap();
            assert!(read > 0, "the terminal ended before {needle:?}: {seen:?}");
            seen.push_str(&String::from_utf8_lossy(&buf[..read]));
        }
    };
    tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .unwrap_or_else(|_| panic!("no {needle:?} in {seen:?}"));
}

/// Python with `args` on a 100×30 terminal in a new sandbox of `backend` (the sandbox and its
/// workspace are kept alive by the returned guards).
async fn python_on_a_terminal(
    backend: std::sync::Arc<dyn Backend>,
    args: &[&str],
) -> (TtyProcess, agentry_sandbox::Sandbox, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = backend.create(SandboxSpec::new(dir.path())).await.unwrap();
    let argv: Vec<&str> = std::iter::once("/usr/bin/python3")
        .chain(args.iter().copied())
        .collect();
    let tty = sandbox
        .exec_tty(
            ExecRequest::new(argv),
            TtySize {
                cols: 100,
                rows: 30,
            },
        )
        .await
        .unwrap();
    (tty, sandbox, dir)
}

async fn drive_python(backend: std::sync::Arc<dyn Backend>) {
    let (tty, sandbox, _dir) = python_on_a_terminal(backend, &["-i", "-q"]).await;
    let mut seen = String::new();
    read_until(&tty, &mut seen, ">>> ").await;
    tty.write_all(
        b"import os, sys; print(sys.stdin.isatty(), os.get_terminal_size(), os.environ['TERM'])\n",
    )
    .await
    .unwrap();
    read_until(&tty, &mut seen, "xterm-256color").await;
    assert!(
        seen.contains("True os.terminal_size(columns=100, lines=30)"),
        "{seen}"
    );
    tty.resize(TtySize {
        cols: 132,
        rows: 43,
    })
    .unwrap();
    // The size reaches the program as soon as the backend passes it on (the local backend
    // relays it): ask until it shows, a bounded number of times.
    let mut followed = false;
    for _ in 0..50 {
        seen.clear();
        tty.write_all(b"print(os.get_terminal_size())\n")
            .await
            .unwrap();
        read_until(&tty, &mut seen, "lines=").await;
        read_until(&tty, &mut seen, ">>> ").await;
        if seen.contains("columns=132, lines=43") {
            followed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(followed, "the resize never reached the program: {seen}");
    // ^C interrupts what runs, and the REPL goes on.
    seen.clear();
    tty.write_all(b"import time; time.sleep(30)\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    tty.write_all(b"\x03").await.unwrap();
    read_until(&tty, &mut seen, "KeyboardInterrupt").await;
    tty.write_all(b"6 * 7\n").await.unwrap();
    read_until(&tty, &mut seen, "42").await;
    tty.write_all(b"exit(3)\n").await.unwrap();
    let status = tokio::time::timeout(Duration::from_secs(10), tty.wait())
        .await
        .unwrap();
    assert_eq!(status.code, Some(3), "{status:?}");
    let mut rest = vec![0u8; 4096];
    while tty.read(&mut rest).await.unwrap() > 0 {}
    sandbox.close().await;
}

#[tokio::test]
async fn a_repl_on_a_terminal_in_the_native_sandbox() {
    drive_python(native()).await;
}

#[tokio::test]
async fn a_repl_on_a_terminal_in_the_local_backend() {
    drive_python(local()).await;
}

/// A program that writes the old size back over a resize (GNU readline does, when the resize
/// lands while it readies the terminal for a prompt) gets the new size again.
#[tokio::test]
async fn a_resize_the_program_undoes_is_set_again() {
    let script = "import fcntl, os, signal, sys, termios\n\
        old = fcntl.ioctl(0, termios.TIOCGWINSZ, bytes(8))\n\
        undone = []\n\
        def on_winch(*_):\n\
        \x20   if not undone:\n\
        \x20       undone.append(1)\n\
        \x20       fcntl.ioctl(0, termios.TIOCSWINSZ, old)\n\
        \x20       os.write(1, b'undone\\n')\n\
        signal.signal(signal.SIGWINCH, on_winch)\n\
        os.write(1, b'ready\\n')\n\
        sys.stdin.readline()\n\
        print('now', os.get_terminal_size(), flush=True)\n";
    let (tty, sandbox, _dir) = python_on_a_terminal(native(), &["-c", script]).await;
    let mut seen = String::new();
    read_until(&tty, &mut seen, "ready").await;
    let wanted = TtySize {
        cols: 132,
        rows: 43,
    };
    tty.resize(wanted).unwrap();
    read_until(&tty, &mut seen, "undone").await;
    // The program wrote 100x30 back; the terminal sets 132x43 again within a second or so.
    let mut kept = false;
    for _ in 0..40 {
        if tty.size().unwrap() == wanted {
            kept = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(kept, "the resize stayed undone: {:?}", tty.size());
    tty.write_all(b"\n").await.unwrap();
    read_until(
        &tty,
        &mut seen,
        "now os.terminal_size(columns=132, lines=43)",
    )
    .await;
    let status = tokio::time::timeout(Duration::from_secs(10), tty.wait())
        .await
        .unwrap();
    assert_eq!(status.code, Some(0), "{status:?} {seen}");
    sandbox.close().await;
}

/// A terminal killed on request ends, and says so.
#[tokio::test]
async fn a_killed_terminal_ends() {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = native().create(SandboxSpec::new(dir.path())).await.unwrap();
    let tty = sandbox
        .exec_tty(
            ExecRequest::new(["/bin/bash", "--norc", "-i"]),
            TtySize::default(),
        )
        .await
        .unwrap();
    tty.kill();
    let status = tokio::time::timeout(Duration::from_secs(10), tty.wait())
        .await
        .unwrap();
    assert!(status.killed, "{status:?}");
    assert!(tty.exit_status().is_some());
    sandbox.close().await;
}
