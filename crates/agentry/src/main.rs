//! The `agentry` command line.
//!
//! `agentry run` runs a task through the engine and saves it as a session, `agentry chat` is the
//! interactive form, `agentry sessions` manages what was saved.

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // A sandbox's PID 1 is this binary re-executed: it must take over before anything else
    // (threads, the async runtime) starts.
    agentry_sandbox::init::maybe_run_init();
    let args = cli::Cli::parse();
    init_tracing(args.verbose);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("agentry: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli::execute(args)) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("agentry: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Logs go to stderr, filtered by `RUST_LOG` (default: warnings; `-v` for info, `-vv` debug).
fn init_tracing(verbosity: u8) {
    let default = match verbosity {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
