//! The `agentry` command line.
//!
//! `agentry run` runs a task through the engine and saves it as a session, `agentry chat` is the
//! interactive form, `agentry sessions` manages what was saved.

mod cli;
mod telemetry;

use std::process::ExitCode;

use agentry_app::domain::core::template::{isolation, renderer};
use clap::Parser;

fn main() -> ExitCode {
    // A sandbox's PID 1 is this binary re-executed: it must take over before anything else
    // (threads, the async runtime) starts.
    agentry_app::domain::sandbox::init::maybe_run_init();
    // So is a template renderer: templates render in this binary re-executed with a capped
    // address space, where a template that grows a value without bound cannot take the
    // server's memory (`/proc/self/exe` still starts it after an upgrade replaced the file).
    renderer::maybe_run_renderer();
    isolation::isolate(isolation::IsolationConfig::new("/proc/self/exe"));
    let args = cli::Cli::parse();
    let telemetry = match telemetry::init(&telemetry::Options {
        verbosity: args.verbose,
        format: args.log_format,
        otlp_endpoint: args.otlp_endpoint.clone(),
        capture_content: args.trace_content,
    }) {
        Ok(telemetry) => telemetry,
        Err(error) => {
            eprintln!("agentry: {error:#}");
            return ExitCode::FAILURE;
        }
    };
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
    let code = match runtime.block_on(cli::execute(args)) {
        Ok(code) => code,
        Err(error) => {
            telemetry::tell("ERROR", &format!("agentry: {error:#}"));
            ExitCode::FAILURE
        }
    };
    // The spans still buffered go out before the process ends.
    telemetry.shutdown();
    code
}
