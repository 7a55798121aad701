//! `agentry files …`: a session's workspace from the terminal (`ls`, `get`, `put`, `rm`), on the
//! data folder's workspaces (`<data folder>/workspaces/<session>`), confined to the workspace
//! like the HTTP file manager (the same `Workspace`).

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};

use agentry_app::workspace_files::{Sort, Workspace, WorkspaceLimits};
use agentry_types::SessionId;

use super::app_error;
use super::data::DataArgs;

#[derive(Debug, Args)]
pub(crate) struct FilesArgs {
    #[command(subcommand)]
    command: FilesCommand,
}

#[derive(Debug, Subcommand)]
enum FilesCommand {
    /// List a folder of a session's workspace (default: its root).
    Ls {
        /// The session.
        session: String,
        /// The folder, relative to the workspace root.
        #[arg(default_value = "")]
        path: String,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Copy a file out of a session's workspace.
    Get {
        /// The session.
        session: String,
        /// The file, relative to the workspace root.
        path: String,
        /// Where to write it (`-`: standard output; default: its name, here).
        dest: Option<PathBuf>,
    },
    /// Copy a local file into a session's workspace (an existing file there is replaced).
    Put {
        /// The session.
        session: String,
        /// The local file.
        local: PathBuf,
        /// Where it goes, relative to the workspace root (default: its name, at the root).
        path: Option<String>,
    },
    /// Delete a file or a folder (with everything in it) from a session's workspace.
    Rm {
        /// The session.
        session: String,
        /// The file or folder, relative to the workspace root.
        path: String,
    },
}

/// Runs `agentry files …`.
pub(crate) async fn files(args: FilesArgs, data: &DataArgs) -> anyhow::Result<ExitCode> {
    let session = match &args.command {
        FilesCommand::Ls { session, .. }
        | FilesCommand::Get { session, .. }
        | FilesCommand::Put { session, .. }
        | FilesCommand::Rm { session, .. } => session.clone(),
    };
    let id: SessionId = session
        .parse()
        .map_err(|_| anyhow::anyhow!("{session:?} is not a session id"))?;
    let store = data.open_store().await?;
    store
        .session(id)
        .await?
        .with_context(|| format!("no session {id}"))?;
    let folder = data.home()?.join("workspaces").join(id.to_string());
    tokio::task::spawn_blocking(move || {
        let workspace = Workspace::open(&folder).map_err(app_error)?;
        run(&workspace, args.command)
    })
    .await
    .context("the file task failed")?
}

fn run(workspace: &Workspace, command: FilesCommand) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    match command {
        FilesCommand::Ls { path, json, .. } => {
            let mut page = 1;
            loop {
                let listing = workspace
                    .list(
                        &path,
                        page,
                        agentry_app::workspace_files::MAX_PAGE_SIZE,
                        Sort::Name,
                        None,
                    )
                    .map_err(app_error)?;
                for entry in &listing.files {
                    if json {
                        writeln!(out, "{}", serde_json::to_string(entry)?)?;
                    } else if entry.is_dir {
                        writeln!(out, "{:>12}  {}/", "-", entry.name)?;
                    } else {
                        writeln!(out, "{:>12}  {}", entry.size, entry.name)?;
                    }
                }
                if !listing.has_more {
                    break;
                }
                page += 1;
            }
        }
        FilesCommand::Get { path, dest, .. } => {
            let mut opened = workspace.open_file(&path).map_err(app_error)?;
            match dest {
                Some(dest) if dest.as_os_str() == "-" => {
                    std::io::copy(&mut opened.file, &mut out)?;
                }
                dest => {
                    let dest = dest.unwrap_or_else(|| PathBuf::from(&opened.name));
                    let mut file = std::fs::File::create(&dest)
                        .with_context(|| format!("cannot create {}", dest.display()))?;
                    std::io::copy(&mut opened.file, &mut file)?;
                    eprintln!("{} bytes → {}", opened.size, dest.display());
                }
            }
        }
        FilesCommand::Put { local, path, .. } => {
            let mut file = std::fs::File::open(&local)
                .with_context(|| format!("cannot open {}", local.display()))?;
            let size = file.metadata()?.len();
            let path = match path {
                Some(path) => path,
                None => local
                    .file_name()
                    .map(|name| name.to_string_lossy().into_owned())
                    .context("the local path names no file")?,
            };
            let entry = workspace
                .put(&path, &mut file, size, WorkspaceLimits::default())
                .map_err(app_error)?;
            eprintln!("{} bytes → {}", entry.size, entry.path);
        }
        FilesCommand::Rm { path, .. } => {
            let removed = workspace.delete(&path).map_err(app_error)?;
            eprintln!("removed {removed}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
