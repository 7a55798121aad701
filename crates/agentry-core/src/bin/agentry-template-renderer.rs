//! A template renderer on its own: the executable tests and embedders without an `agentry`
//! binary point [`agentry_core::template::isolation`] at. Started by the runtime, not by hand.

fn main() {
    agentry_core::template::renderer::maybe_run_renderer();
    eprintln!("agentry-template-renderer: run by the runtime as a template renderer, not by hand");
    std::process::exit(2);
}
