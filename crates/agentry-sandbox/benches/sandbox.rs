//! Sandbox latency: create + exec `echo` + close in a fresh native sandbox, exec `echo` in a
//! warm one, and pausing and resuming it (and the same on the local backend for reference).
//! Prints a report; asserts nothing.
//!
//! `cargo bench -p agentry-sandbox --bench sandbox` (`SANDBOX_BENCH_RUNS`, default 200).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use agentry_sandbox::{BackendKind, ExecRequest, SandboxConfig, SandboxSpec};

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn report(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{name:<44} n={:<4} p50 {:>7.2} ms  p99 {:>7.2} ms  min {:>7.2} ms",
        samples.len(),
        ms(percentile(&samples, 0.50)),
        ms(percentile(&samples, 0.99)),
        ms(samples[0]),
    );
}

fn main() {
    agentry_sandbox::init::maybe_run_init();
    let runs: usize = std::env::var("SANDBOX_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let init_exe = std::path::PathBuf::from(env!("CARGO_BIN_EXE_agentry-sandbox-init"));
    rt.block_on(async move {
        let dir = tempfile::tempdir().unwrap();
        println!(
            "sandbox benchmark ({runs} runs each, running as uid {})",
            nix::unistd::geteuid()
        );
        for kind in [BackendKind::Native, BackendKind::Local] {
            let backend = agentry_sandbox::backend(SandboxConfig {
                backend: kind,
                init_exe: Some(init_exe.clone()),
                ..SandboxConfig::default()
            })
            .unwrap();
            let echo = || ExecRequest::new(["/bin/echo", "hi"]);
            let mut create_exec = Vec::new();
            let mut create_exec_close = Vec::new();
            let mut limits = None;
            for _ in 0..runs + 5 {
                let start = Instant::now();
                let sb = backend.create(SandboxSpec::new(dir.path())).await.unwrap();
                let out = sb.run(echo()).await.unwrap();
                let t1 = start.elapsed();
                sb.close().await;
                let t2 = start.elapsed();
                assert_eq!(out.stdout, b"hi\n");
                limits = Some(sb.report().limits);
                create_exec.push(t1);
                create_exec_close.push(t2);
            }
            let label = format!("{kind:?}").to_lowercase();
            report(
                &format!("{label}: create + exec echo ({limits:?})"),
                create_exec.split_off(5),
            );
            report(
                &format!("{label}: create + exec echo + close"),
                create_exec_close.split_off(5),
            );
            let sb = backend.create(SandboxSpec::new(dir.path())).await.unwrap();
            let mut warm = Vec::new();
            for _ in 0..runs + 5 {
                let start = Instant::now();
                let out = sb.run(echo()).await.unwrap();
                warm.push(start.elapsed());
                assert_eq!(out.stdout, b"hi\n");
            }
            report(
                &format!("{label}: exec echo in a warm sandbox"),
                warm.split_off(5),
            );
            if sb.can_pause() {
                // Pause and resume with a process running in it (a sleeping shell loop).
                let _busy = sb
                    .exec(ExecRequest::shell("while :; do sleep 0.01; done"))
                    .await
                    .unwrap();
                let (mut pause, mut resume, mut resume_exec) = (Vec::new(), Vec::new(), Vec::new());
                for _ in 0..runs + 5 {
                    let start = Instant::now();
                    sb.pause().await.unwrap();
                    pause.push(start.elapsed());
                    let start = Instant::now();
                    sb.resume().await.unwrap();
                    resume.push(start.elapsed());
                    let out = sb.run(echo()).await.unwrap();
                    resume_exec.push(start.elapsed());
                    assert_eq!(out.stdout, b"hi\n");
                }
                report(&format!("{label}: pause (freeze)"), pause.split_off(5));
                report(&format!("{label}: resume (thaw)"), resume.split_off(5));
                report(
                    &format!("{label}: resume + exec echo"),
                    resume_exec.split_off(5),
                );
            } else {
                println!("{label}: pause and resume: no cgroup freezer for this sandbox here");
            }
            sb.close().await;
        }
    });
}
