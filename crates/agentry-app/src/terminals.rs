//! Real terminals: PTY-backed shells in a session's sandbox, several per session, that people
//! attach to (the console's terminal panel, over a WebSocket) and re-attach to after a dropped
//! connection without losing what was shown. The registry is the tools' ([`PtyTerminals`], in
//! [`ToolEnvironment::terminals`](crate::ToolEnvironment::terminals)), so the shells the
//! `terminal` tool opens for the agent are listed and can be watched here too.
//!
//! A terminal lives until its shell exits, it is deleted, or it has had no attachment and no
//! input for [`IDLE_TIMEOUT`]; the sandbox stays up while it does.

use std::sync::Arc;
use std::time::Duration;

use agentry_sandbox::{ExecRequest, TtySize};
pub use agentry_tools::shell::pty::{Attachment, Opener, PtyTerminal, PtyTerminals};
use agentry_types::SessionId;
use serde::Serialize;

use crate::App;
use crate::auth::Principal;
use crate::error::{AppError, Failure};

/// The most terminals one session may have open (people's; the agent's are the tool's).
pub const MAX_PER_SESSION: usize = 8;
/// The most terminals open on the server.
pub const MAX_TERMINALS: usize = 64;
/// A terminal with no attachment and no input for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60 * 60);

/// What a terminal is, for listings.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TerminalInfo {
    /// Its id (`term_…`).
    pub terminal_id: String,
    /// The session whose sandbox it runs in.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub session_id: SessionId,
    /// Who opened it: `person` (through the API) or `agent` (the `terminal` tool).
    pub opened_by: &'static str,
    /// A short name to show: the program, or `agent: <the tool's terminal name>`.
    pub label: String,
    /// The program it runs.
    pub command: Vec<String>,
    /// When it was opened (Unix ms).
    pub created_at: u64,
    /// Its size.
    pub cols: u16,
    /// Its size.
    pub rows: u16,
    /// Attachments right now.
    pub clients: usize,
    /// Whether its program still runs.
    pub alive: bool,
    /// The program's exit code, once it exited.
    pub exit_code: Option<i32>,
}

/// A terminal as listings show it (`None` for one outside any session).
pub fn info(terminal: &PtyTerminal) -> Option<TerminalInfo> {
    let session = terminal.session()?;
    let size = terminal.size();
    let ended = terminal.exit_status();
    let (opened_by, label) = match terminal.opener() {
        Opener::Person => (
            "person",
            terminal
                .command()
                .first()
                .and_then(|program| program.rsplit('/').next())
                .unwrap_or("shell")
                .to_owned(),
        ),
        Opener::Agent(name) => ("agent", format!("agent: {name}")),
    };
    Some(TerminalInfo {
        terminal_id: terminal.id().to_owned(),
        session_id: session,
        opened_by,
        label,
        command: terminal.command().to_vec(),
        created_at: terminal.created_at(),
        cols: size.cols,
        rows: size.rows,
        clients: terminal.clients(),
        alive: ended.is_none(),
        exit_code: ended.and_then(|status| status.code),
    })
}

/// The interactive terminals opened in sessions' sandboxes.
pub struct Terminals<'a> {
    app: &'a App,
}

impl App {
    /// The interactive terminals opened in sessions' sandboxes.
    pub fn terminals(&self) -> Terminals<'_> {
        Terminals { app: self }
    }
}

impl Terminals<'_> {
    fn registry(&self) -> &PtyTerminals {
        &self.app.parts.tools.terminals
    }

    /// Opens a terminal in `session`'s sandbox running `command` (default: an interactive
    /// `bash -l`), of `cols`×`rows` (default 80×24).
    pub async fn open(
        &self,
        caller: &Principal,
        session: &str,
        cols: Option<u16>,
        rows: Option<u16>,
        command: Option<Vec<String>>,
    ) -> Result<Arc<PtyTerminal>, AppError> {
        let session = self.app.sessions().record(session).await?.id;
        self.app.check_session_access(caller, session).await?;
        self.app.check_commands_isolated(caller)?;
        self.app.check_terminal_quota(caller).await?;
        let command = command.unwrap_or_else(|| vec!["/bin/bash".into(), "-l".into()]);
        if command.is_empty() || command.iter().any(|arg| arg.contains('\0')) {
            return Err(AppError::bad_request(
                "command must be a non-empty list of arguments without NUL bytes",
            ));
        }
        self.registry().sweep(IDLE_TIMEOUT);
        let open = self.registry().all();
        if open.len() >= MAX_TERMINALS {
            return Err(AppError::new(
                Failure::TooMany,
                "too_many_terminals",
                format!("{MAX_TERMINALS} terminals are open on this server: close one first"),
            ));
        }
        let mine = open
            .iter()
            .filter(|t| t.session() == Some(session) && *t.opener() == Opener::Person)
            .count();
        if mine >= MAX_PER_SESSION {
            return Err(AppError::new(
                Failure::TooMany,
                "too_many_terminals",
                format!("session {session} has {MAX_PER_SESSION} terminals open: close one first"),
            ));
        }
        let (Some(pool), Some(workspace)) = (
            self.app.parts.tools.command_sandboxes(),
            self.app.parts.sessions.workspace(session),
        ) else {
            return Err(AppError::new(
                Failure::Unavailable,
                "terminals_off",
                "terminals run in the session's sandbox, and this server has none (start it \
                 with --sandbox native or local)",
            ));
        };
        std::fs::create_dir_all(&workspace)
            .map_err(|error| AppError::internal(format!("the session's workspace: {error}")))?;
        let unavailable = |error: agentry_sandbox::SandboxError| {
            AppError::new(Failure::Unavailable, "sandbox_failed", error.to_string())
        };
        let sandbox = pool.get(&workspace).await.map_err(unavailable)?;
        let size = TtySize::clamped(cols.unwrap_or(80), rows.unwrap_or(24));
        self.registry()
            .open(
                &sandbox,
                Some(session),
                Opener::Person,
                ExecRequest::new(command),
                size,
            )
            .await
            .map_err(unavailable)
    }

    /// The terminals `caller` may see (of `session` only, when named), oldest first.
    pub async fn list(
        &self,
        caller: &Principal,
        session: Option<&str>,
    ) -> Result<Vec<TerminalInfo>, AppError> {
        self.registry().sweep(IDLE_TIMEOUT);
        let only = match session {
            Some(session) => {
                let id = self.app.sessions().record(session).await?.id;
                self.app.check_session_access(caller, id).await?;
                Some(id)
            }
            None => None,
        };
        let mut listed = Vec::new();
        for terminal in self.registry().all() {
            let Some(shown) = info(&terminal) else {
                continue;
            };
            if only.is_some_and(|id| id != shown.session_id) {
                continue;
            }
            if self
                .app
                .check_session_access(caller, shown.session_id)
                .await
                .is_ok()
            {
                listed.push(shown);
            }
        }
        Ok(listed)
    }

    /// The terminal `id`, if `caller` may use it (404 otherwise, as if it did not exist).
    pub async fn get(&self, caller: &Principal, id: &str) -> Result<Arc<PtyTerminal>, AppError> {
        let missing = || AppError::not_found(format!("no terminal {id:?}"));
        let terminal = self.registry().get(id).ok_or_else(missing)?;
        let session = terminal.session().ok_or_else(missing)?;
        self.app
            .check_session_access(caller, session)
            .await
            .map_err(|_| missing())?;
        Ok(terminal)
    }

    /// Kills the terminal `id`'s program and forgets it.
    pub async fn close(&self, caller: &Principal, id: &str) -> Result<(), AppError> {
        let terminal = self.get(caller, id).await?;
        self.registry().close(terminal.id());
        Ok(())
    }

    /// The seed's one terminal per session (`<session>:auto`): the session's oldest live
    /// terminal a person opened, or a new one.
    pub async fn of_session(
        &self,
        caller: &Principal,
        session: &str,
        cols: Option<u16>,
        rows: Option<u16>,
    ) -> Result<Arc<PtyTerminal>, AppError> {
        let id = self.app.sessions().record(session).await?.id;
        self.app.check_session_access(caller, id).await?;
        self.app.check_commands_isolated(caller)?;
        let existing = self.registry().all().into_iter().find(|t| {
            t.session() == Some(id) && *t.opener() == Opener::Person && t.exit_status().is_none()
        });
        match existing {
            Some(terminal) => {
                if let (Some(cols), Some(rows)) = (cols, rows) {
                    terminal
                        .resize(cols, rows)
                        .map_err(|error| AppError::internal(format!("resizing: {error}")))?;
                }
                Ok(terminal)
            }
            None => self.open(caller, &id.to_string(), cols, rows, None).await,
        }
    }
}
