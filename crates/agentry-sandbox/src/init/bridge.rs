//! Inside an allow-list sandbox: the bridge from `127.0.0.1:3128`, where the commands' proxy
//! variables point, to the host's proxy socket, bind-mounted at
//! `/run/agentry-proxy/proxy.sock` ([`crate::proxy`]).
//!
//! PID 1 binds the port, then forks the bridge before it confines itself, so PID 1 stays
//! single-threaded (it forks every command). The bridge confines itself in its own Landlock
//! domain (read-only everywhere, abstract sockets and signals scoped) and seccomp filter: the
//! sandbox's commands live in PID 1's later domain and so cannot signal it. It relays each
//! connection on two threads and never execs anything.

use std::io::Read;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::{FromRawFd, IntoRawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use nix::unistd::{ForkResult, fork};

use crate::init::SOCKET_FD;
use crate::proxy::{BRIDGE_ADDR, INSIDE_DIR, SOCKET_NAME};

/// Stack of a relay thread (it copies through an 8 KiB buffer).
const STACK: usize = 128 * 1024;

/// Binds the bridge's port (inside the sandbox's network namespace, loopback up).
pub(super) fn bind() -> Result<TcpListener, String> {
    TcpListener::bind(BRIDGE_ADDR).map_err(|e| format!("proxy bridge: bind {BRIDGE_ADDR}: {e}"))
}

/// Forks the bridge (PID 1 must be single-threaded) and waits until it has confined itself.
pub(super) fn spawn(listener: TcpListener) -> Result<(), String> {
    let (status_r, status_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| format!("proxy bridge: pipe: {e}"))?;
    // SAFETY: PID 1 is single-threaded, so the child may run arbitrary code after fork.
    match unsafe { fork() } {
        Err(e) => Err(format!("proxy bridge: fork: {e}")),
        Ok(ForkResult::Child) => {
            drop(status_r);
            let confined = confine();
            let report = match &confined {
                Ok(()) => "ok".to_string(),
                Err(e) => e.clone(),
            };
            let _ = nix::unistd::write(&status_w, report.as_bytes());
            if confined.is_err() {
                // SAFETY: leaving the forked child without running PID 1's destructors.
                unsafe { libc::_exit(1) };
            }
            // Keep only the listener, on the control socket's number: PID 1's descriptors (the
            // control socket, the workspace, the status pipe) are closed here.
            let fd = listener.into_raw_fd();
            // SAFETY: dup2 onto a descriptor number this process owns (its copy of the control
            // socket, which it closes atomically), then closing every other descriptor above.
            let listener = unsafe {
                if libc::dup2(fd, SOCKET_FD) < 0 {
                    libc::_exit(1);
                }
                crate::sys::close_from(SOCKET_FD as u32 + 1);
                TcpListener::from_raw_fd(SOCKET_FD)
            };
            serve(listener, &Path::new(INSIDE_DIR).join(SOCKET_NAME));
            // SAFETY: leaving the forked child without running PID 1's destructors.
            unsafe { libc::_exit(0) }
        }
        Ok(ForkResult::Parent { .. }) => {
            drop(status_w);
            drop(listener);
            let mut report = String::new();
            let mut file = std::fs::File::from(status_r);
            let _ = file.read_to_string(&mut report);
            if report == "ok" {
                Ok(())
            } else if report.is_empty() {
                Err("proxy bridge: exited during setup".into())
            } else {
                Err(format!("proxy bridge: {report}"))
            }
        }
    }
}

/// The bridge's own confinement: nothing to write anywhere, the same seccomp deny-list.
fn confine() -> Result<(), String> {
    super::confine::landlock(&[])?;
    super::confine::seccomp()
}

fn serve(listener: TcpListener, path: &Path) {
    loop {
        match listener.accept() {
            Ok((tcp, _)) => {
                let path: PathBuf = path.to_path_buf();
                // If the thread cannot start, the closure (and the connection) is dropped.
                let _ = std::thread::Builder::new()
                    .stack_size(STACK)
                    .spawn(move || relay(tcp, &path));
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // Out of descriptors or threads: wait for connections to end.
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(50)),
        }
    }
}

/// Relays one connection both ways, passing each side's end of stream on to the other.
fn relay(tcp: TcpStream, path: &Path) {
    let unix = match UnixStream::connect(path) {
        Ok(u) => u,
        Err(e) => {
            let body = format!("agentry sandbox proxy bridge: the proxy is unreachable: {e}\n");
            let msg = format!(
                "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain; charset=utf-8\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = std::io::Write::write_all(&mut &tcp, msg.as_bytes());
            return;
        }
    };
    let _ = tcp.set_nodelay(true);
    let (Ok(tcp_in), Ok(unix_out)) = (tcp.try_clone(), unix.try_clone()) else {
        return;
    };
    let up = std::thread::Builder::new()
        .stack_size(STACK)
        .spawn(move || {
            let _ = std::io::copy(&mut &tcp_in, &mut &unix_out);
            let _ = unix_out.shutdown(Shutdown::Write);
        });
    if up.is_err() {
        return;
    }
    let _ = std::io::copy(&mut &unix, &mut &tcp);
    let _ = tcp.shutdown(Shutdown::Write);
    if let Ok(up) = up {
        let _ = up.join();
    }
}
