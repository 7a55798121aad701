//! Escape probes for this crate's tests (not shipped).
//!
//! - `int80`: an i386 `getpid` through `int 0x80`; a sandbox must kill it with SIGSYS.
//! - `hold <init-exe> <workspace>`: a stand-in runtime that creates a native sandbox, starts a
//!   daemon and a long `sleep` in it (`sleep 1001<pid>`, `sleep 1002<pid>`), prints the host
//!   pid of its PID 1 and waits to be killed.

fn main() {
    agentry_sandbox::init::maybe_run_init();
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("int80") => int80(),
        Some("hold") if args.len() == 4 => hold(&args[2], &args[3]),
        _ => {
            eprintln!("usage: agentry-sandbox-probe int80 | hold <init-exe> <workspace>");
            std::process::exit(2);
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn int80() {
    let mut eax: u32 = 20; // i386 getpid
    // SAFETY: the i386 getpid system call takes no arguments and touches no memory; only eax is
    // clobbered (it returns the pid there).
    unsafe { std::arch::asm!("int 0x80", inout("eax") eax) };
    println!("survived: int 0x80 returned {eax}");
}

#[cfg(not(target_arch = "x86_64"))]
fn int80() {
    println!("survived: no i386 ABI on this architecture");
}

fn hold(init_exe: &str, workspace: &str) {
    use agentry_sandbox::{BackendKind, ExecRequest, SandboxConfig, SandboxSpec};
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("runtime: {e}");
            std::process::exit(1);
        }
    };
    rt.block_on(async {
        let config = SandboxConfig {
            backend: BackendKind::Native,
            init_exe: Some(init_exe.into()),
            ..SandboxConfig::default()
        };
        let sb = match agentry_sandbox::backend(config) {
            Ok(b) => b.create(SandboxSpec::new(workspace)).await,
            Err(e) => Err(e),
        };
        let sb = match sb {
            Ok(sb) => sb,
            Err(e) => {
                eprintln!("create: {e}");
                std::process::exit(1);
            }
        };
        // The sleeps carry this process's pid in their argument, for the test to find them.
        let me = std::process::id();
        let script = format!("setsid sleep 1001{me} & sleep 1002{me}");
        if let Err(e) = sb.exec(ExecRequest::shell(script)).await {
            eprintln!("exec: {e}");
            std::process::exit(1);
        }
        println!("pid1 {}", sb.pid1().unwrap_or(0));
        std::future::pending::<()>().await;
    });
}
