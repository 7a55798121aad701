//! Code interpreter benchmark. Prints a table; asserts nothing.
//!
//! `cargo bench -p agentry-tools --bench kernel` (after `scripts/install-mcp-servers`, which
//! makes the kernel's venv)
//!
//! The first call of a sandbox's kernel (sandbox, `ipykernel` start, connection, the code) and
//! warm calls, each beside the kernel's own time for the same call (its `busy` to `idle`, by its
//! clock): what the Jupyter client, ZeroMQ and the sandbox add. This binary is its own sandbox
//! agent.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use agentry_sandbox::{BackendKind, SandboxConfig, SandboxPool, SandboxSpec};
use agentry_tools::shell::kernel::{self, CodeCall, KernelHome, KernelSlot};

const COLD: usize = 5;
const WARM: usize = 200;

fn percentile(samples: &mut [f64], p: usize) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[(samples.len() - 1) * p / 100]
}

fn main() {
    // A sandbox's agent is this binary re-executed: it takes over before any thread starts.
    agentry_sandbox::init::maybe_run_init();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(bench());
}

async fn bench() {
    let venv = agentry_testkit::mcp::McpServers::locate()
        .expect("run scripts/install-mcp-servers first")
        .root()
        .canonicalize()
        .unwrap()
        .join("kernel");
    let python = venv.join("bin/python").to_string_lossy().into_owned();
    let backend = agentry_sandbox::backend(SandboxConfig {
        backend: BackendKind::Native,
        init_exe: Some(std::env::current_exe().unwrap()),
        ..SandboxConfig::default()
    })
    .unwrap();
    let mut template = SandboxSpec::new("/unused");
    template.ro_mounts.push(venv);
    let pool = SandboxPool::new(backend, template);
    let temp = tempfile::tempdir().unwrap();
    let call = |code: &str| CodeCall {
        code: code.to_owned(),
        timeout: Duration::from_secs(60),
        live: None,
    };

    let mut cold = Vec::new();
    for i in 0..COLD {
        let workspace = temp.path().join(format!("cold{i}"));
        std::fs::create_dir(&workspace).unwrap();
        let slot = KernelSlot::default();
        let started = Instant::now();
        let sandbox = pool.get(&workspace).await.unwrap();
        let home = KernelHome {
            sandbox: &sandbox,
            workspace: &workspace,
            mount: "/workspace",
            python: &python,
        };
        let result = kernel::run(home, &slot, call("1 + 1")).await.unwrap();
        assert!(result.kernel_started);
        cold.push(started.elapsed().as_secs_f64() * 1e3);
        pool.close(&workspace).await;
    }

    let workspace = temp.path().join("warm");
    std::fs::create_dir(&workspace).unwrap();
    let sandbox = pool.get(&workspace).await.unwrap();
    let slot = KernelSlot::default();
    let home = || KernelHome {
        sandbox: &sandbox,
        workspace: &workspace,
        mount: "/workspace",
        python: &python,
    };
    kernel::run(home(), &slot, call("import numpy as np"))
        .await
        .unwrap();
    println!("Code interpreter: ipykernel in a native sandbox, {WARM} warm calls, {COLD} cold");
    println!(
        "{:<34} | {:>10} | {:>10} | {:>13} | {:>13} | {:>15}",
        "", "call p50", "call p99", "kernel p50", "kernel p99", "overhead p50"
    );
    println!("{}", "-".repeat(110));
    for (name, code) in [
        ("warm `1 + 1`", "1 + 1"),
        ("warm print", "print('hello')"),
        ("warm numpy sum of 1e6", "np.arange(1_000_000).sum()"),
    ] {
        let mut calls = Vec::new();
        let mut kernel = Vec::new();
        let mut overhead = Vec::new();
        for _ in 0..WARM {
            let started = Instant::now();
            let result = kernel::run(home(), &slot, call(code)).await.unwrap();
            let took = started.elapsed().as_secs_f64() * 1e3;
            let own = result.kernel_ms.unwrap_or(f64::NAN);
            calls.push(took);
            kernel.push(own);
            overhead.push(took - own);
        }
        println!(
            "{name:<34} | {:>7.2} ms | {:>7.2} ms | {:>10.2} ms | {:>10.2} ms | {:>12.2} ms",
            percentile(&mut calls, 50),
            percentile(&mut calls, 99),
            percentile(&mut kernel, 50),
            percentile(&mut kernel, 99),
            percentile(&mut overhead, 50),
        );
    }
    println!(
        "cold first call (sandbox, kernel start, connect, `1 + 1`): p50 {:.0} ms, max {:.0} ms",
        percentile(&mut cold, 50),
        percentile(&mut cold, 100)
    );
    pool.close_all().await;
}
