//! A minimal executable serving as the sandbox agent for this crate's tests and benchmark (the
//! `agentry` binary plays this part in production).

fn main() {
    agentry_sandbox::init::maybe_run_init();
    eprintln!("agentry-sandbox-init: run by the runtime as a sandbox agent, not by hand");
    std::process::exit(2);
}
