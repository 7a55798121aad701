//! `agentry serve`: the HTTP API on the embedded SQLite (or PostgreSQL) store.

use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;

use agentry_server::{AppState, ServerConfig, serve};

use super::data::DataArgs;

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// The address to listen on. Anything but loopback needs an API key (`agentry keys create`).
    #[arg(default_value = "127.0.0.1:7988")]
    addr: SocketAddr,
    /// Allow cross-origin requests from this origin (repeatable; CORS is off by default).
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    cors_origins: Vec<String>,
    /// Offer the registered tools through the MCP endpoint `/mcp` too (it always offers the
    /// saved agents).
    #[arg(long)]
    mcp_expose_tools: bool,
    #[command(flatten)]
    sandbox: super::sandbox::SandboxArgs,
}

pub(crate) async fn run(args: ServeArgs, data: &DataArgs) -> anyhow::Result<ExitCode> {
    let config = ServerConfig {
        addr: args.addr,
        ..ServerConfig::default()
    };
    let store = data.open_store().await?;
    let listener = agentry_server::serve::bind(&config, &store).await?;
    let imported = agentry_server::mcp::import_servers_file(&store, &data.home()?).await?;
    // Standalone sandboxes (`/v1/sandboxes`) never outlive the server that made them: the
    // workspaces a crashed one left behind go (after the bind, so a second server on the same
    // data folder, refused its port, removes nothing).
    let stale = data.home()?.join("sandboxes");
    if stale.exists() {
        std::fs::remove_dir_all(&stale)
            .with_context(|| format!("cannot clean {}", stale.display()))?;
    }
    let tools = args.sandbox.environment(&data.home()?)?;
    let sandbox_line = match &tools.sandboxes {
        Some(pool) => format!("sandbox: {:?}", pool.backend().kind()).to_lowercase(),
        None => "sandbox: off (exec, terminal and command tools are not offered)".to_owned(),
    };
    let fetch_line = super::sandbox::fetch_line(&tools.fetch);
    let mut state = AppState::with_tools(store.clone(), tools).await?;
    state.cors_origins = args.cors_origins;
    state.mcp_expose_tools = args.mcp_expose_tools;
    let shutdown = state.shutdown.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        shutdown.cancel();
    });
    let address = listener.local_addr()?;
    println!("Agentry is listening on http://{address}");
    println!(
        "data: {} ({})",
        data.home()?.display(),
        store.backend().as_str()
    );
    println!("{sandbox_line}");
    println!("{fetch_line}");
    if imported > 0 {
        println!(
            "mcp: {imported} server(s) imported from {}",
            data.home()?
                .join(agentry_server::mcp::SERVERS_FILE)
                .display()
        );
    }
    let models = store.list_config(agentry_store::ConfigKind::Model).await?;
    if models.is_empty() {
        println!("{}", first_model_hint(address, ollama_running().await));
    }
    serve(listener, state, &config).await?;
    eprintln!("agentry: stopped");
    Ok(ExitCode::SUCCESS)
}

/// Whether an Ollama server answers on its default port.
async fn ollama_running() -> bool {
    let connect = tokio::net::TcpStream::connect(("127.0.0.1", 11434));
    matches!(
        tokio::time::timeout(std::time::Duration::from_millis(200), connect).await,
        Ok(Ok(_))
    )
}

/// How to add a first model, offering what this machine seems to have.
fn first_model_hint(address: SocketAddr, ollama: bool) -> String {
    let mut hint = String::from("No model yet. Add one:\n");
    let has = |var: &str| std::env::var(var).is_ok_and(|v| !v.trim().is_empty());
    if has("OPENAI_API_KEY") {
        hint.push_str(&format!(
            "  curl -s http://{address}/v1/env -H 'content-type: application/json' -d '{{\"name\":\"OPENAI_API_KEY\",\"value\":\"'\"$OPENAI_API_KEY\"'\"}}'\n  curl -s http://{address}/v1/models -H 'content-type: application/json' -d '{{\"id\":\"gpt\",\"protocol\":\"openai\",\"model_name\":\"gpt-4o-mini\",\"api_key_secret\":\"OPENAI_API_KEY\"}}'\n"
        ));
    }
    if has("ANTHROPIC_API_KEY") {
        hint.push_str(&format!(
            "  curl -s http://{address}/v1/env -H 'content-type: application/json' -d '{{\"name\":\"ANTHROPIC_API_KEY\",\"value\":\"'\"$ANTHROPIC_API_KEY\"'\"}}'\n  curl -s http://{address}/v1/models -H 'content-type: application/json' -d '{{\"id\":\"claude\",\"protocol\":\"anthropic\",\"model_name\":\"claude-sonnet-4-5\",\"api_key_secret\":\"ANTHROPIC_API_KEY\"}}'\n"
        ));
    }
    let ollama_note = if ollama {
        "# Ollama is running here"
    } else {
        "# if you start Ollama"
    };
    hint.push_str(&format!(
        "  curl -s http://{address}/v1/models -H 'content-type: application/json' -d '{{\"id\":\"local\",\"protocol\":\"ollama\",\"model_name\":\"llama3.2\"}}'   {ollama_note}\n"
    ));
    hint.push_str(&format!(
        "Then: curl -s http://{address}/v1/infer -H 'content-type: application/json' -d '{{\"session_id\":\"new\",\"text\":\"Hello!\"}}'"
    ));
    hint
}

/// Waits for Ctrl-C (or SIGTERM on Unix).
pub(super) async fn wait_for_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(signal) => signal,
                Err(_) => {
                    let _ = interrupt.await;
                    return;
                }
            };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}
