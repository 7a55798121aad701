//! `agentry keys create|list|revoke|reset`: the API keys of `agentry serve`.

use std::process::ExitCode;

use clap::{Args, Subcommand, ValueEnum};

use agentry_app::auth::{KeyLimits, KeyRole, create_key_with, list_keys, reset_keys, revoke_key};

use super::data::DataArgs;

#[derive(Debug, Args)]
pub(crate) struct KeysArgs {
    #[command(subcommand)]
    command: KeysCommand,
}

/// A key's role on the command line.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum Role {
    /// Everything: configuration, keys, secrets, every session.
    Admin,
    /// Runs, and only its own sessions, runs and sandboxes.
    User,
}

#[derive(Debug, Subcommand)]
enum KeysCommand {
    /// Create a key (printed once; only its hash is stored). The first key turns
    /// authentication on, and is always an admin.
    Create {
        /// A label to recognise it by.
        #[arg(long, default_value = "")]
        label: String,
        /// What it may do.
        #[arg(long, value_enum, default_value = "admin")]
        role: Role,
        /// A `user` key may run only as these saved agents (repeatable; default: any).
        #[arg(long = "agent", value_name = "ID")]
        agents: Vec<String>,
        /// A `user` key may use only these models (repeatable; default: any).
        #[arg(long = "model", value_name = "ID")]
        models: Vec<String>,
        /// A `user` key may name only these tools (repeatable; default: any).
        #[arg(long = "tool", value_name = "NAME")]
        tools: Vec<String>,
    },
    /// List keys (never their values).
    List,
    /// Revoke a key; it stops working at once. Authentication stays on.
    Revoke {
        /// The key's id (from `keys list`).
        id: String,
    },
    /// Delete every key, which turns authentication off (loopback only then).
    Reset {
        /// Confirm it.
        #[arg(long)]
        yes: bool,
    },
}

fn listed(names: Vec<String>) -> Option<Vec<String>> {
    (!names.is_empty()).then_some(names)
}

pub(crate) async fn keys(args: KeysArgs, data: &DataArgs) -> anyhow::Result<ExitCode> {
    let store = data.open_store().await?;
    match args.command {
        KeysCommand::Create {
            label,
            role,
            agents,
            models,
            tools,
        } => {
            let role = match role {
                Role::Admin => KeyRole::Admin,
                Role::User => KeyRole::User,
            };
            let limits = KeyLimits {
                agents: listed(agents),
                models: listed(models),
                tools: listed(tools),
                quotas: None,
            };
            let key = create_key_with(&store, &label, role, limits).await?;
            eprintln!(
                "Created key {}. It is shown only now; keep it safe:",
                key.id
            );
            println!("{}", key.key);
        }
        KeysCommand::List => {
            for key in list_keys(&store).await? {
                let role = match key.role {
                    KeyRole::Admin => "admin",
                    KeyRole::User => "user ",
                };
                println!(
                    "{}  {}  {role}  {}",
                    key.id,
                    if key.revoked { "revoked" } else { "active " },
                    key.label
                );
            }
        }
        KeysCommand::Revoke { id } => {
            if !revoke_key(&store, &id).await? {
                anyhow::bail!("no key {id}");
            }
            eprintln!("revoked {id} (authentication stays on; `agentry keys reset` turns it off)");
        }
        KeysCommand::Reset { yes } => {
            if !yes {
                anyhow::bail!(
                    "this deletes every API key and turns authentication off: run it again with --yes"
                );
            }
            let deleted = reset_keys(&store).await?;
            eprintln!("deleted {deleted} key(s): authentication is off (loopback only)");
        }
    }
    Ok(ExitCode::SUCCESS)
}
