//! `agentry models`: the models saved in the data folder (registered with `agentry serve`'s
//! API or console), which `run` and `chat` use: the default one unless `--model ID` names
//! another.

use std::process::ExitCode;

use clap::{Args, Subcommand};

use agentry_app::config::ConfigRepo;
use agentry_app::model_config::ModelConfig;

use super::data::DataArgs;

#[derive(Debug, Args)]
pub(crate) struct ModelsArgs {
    #[command(subcommand)]
    command: Option<ModelsCommand>,
}

#[derive(Debug, Subcommand)]
enum ModelsCommand {
    /// List them (the default): id, protocol, the provider's model name, where it is called,
    /// and which one runs use by default.
    List {
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
}

pub(crate) async fn models(args: ModelsArgs, data: &DataArgs) -> anyhow::Result<ExitCode> {
    let json = match args.command {
        None => false,
        Some(ModelsCommand::List { json }) => json,
    };
    let store = data.open_store().await?;
    let models: Vec<ModelConfig> = ConfigRepo::<ModelConfig>::new(&store)
        .list_registered()
        .await
        .map_err(super::app_error)?
        .into_iter()
        .map(|(_, model)| model)
        .collect();
    if models.is_empty() {
        eprintln!(
            "no saved model: start `agentry serve` and add one (POST /v1/models, or the \
             console's Settings → Models)"
        );
        return Ok(ExitCode::SUCCESS);
    }
    let default = agentry_app::model_config::default_model(&store)
        .await
        .map_err(super::app_error)?
        .map(|model| model.id);
    for model in &models {
        let is_default = default.as_deref() == Some(model.id.as_str());
        if json {
            println!(
                "{}",
                serde_json::json!({
                    "id": model.id, "protocol": model.protocol, "model_name": model.model_name,
                    "base_url": model.base_url, "default": is_default,
                })
            );
        } else {
            println!(
                "{}{:<16} {:<18} {:<28} {}",
                if is_default { "* " } else { "  " },
                model.id,
                model.protocol.name(),
                model.model_name,
                model
                    .base_url
                    .as_deref()
                    .unwrap_or("(the provider's endpoint)")
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
