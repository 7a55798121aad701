//! `agentry keys create|list|revoke`: the API keys of `agentry serve`.

use std::process::ExitCode;

use clap::{Args, Subcommand};

use agentry_server::auth::{create_key, list_keys, revoke_key};

use super::data::DataArgs;

#[derive(Debug, Args)]
pub(crate) struct KeysArgs {
    #[command(subcommand)]
    command: KeysCommand,
}

#[derive(Debug, Subcommand)]
enum KeysCommand {
    /// Create a key (printed once; only its hash is stored). Turns authentication on.
    Create {
        /// A label to recognise it by.
        #[arg(long, default_value = "")]
        label: String,
    },
    /// List keys (never their values).
    List,
    /// Revoke a key; it stops working at once.
    Revoke {
        /// The key's id (from `keys list`).
        id: String,
    },
}

pub(crate) async fn keys(args: KeysArgs, data: &DataArgs) -> anyhow::Result<ExitCode> {
    let store = data.open_store().await?;
    match args.command {
        KeysCommand::Create { label } => {
            let key = create_key(&store, &label).await?;
            eprintln!(
                "Created key {}. It is shown only now; keep it safe:",
                key.id
            );
            println!("{}", key.key);
        }
        KeysCommand::List => {
            for key in list_keys(&store).await? {
                println!(
                    "{}  {}  {}",
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
            eprintln!("revoked {id}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
