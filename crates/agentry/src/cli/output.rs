//! Printing a run's events: text for people, JSON lines for programs.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use futures::StreamExt;

use agentry_app::domain::core::RunStream;
use agentry_types::{RunEvent, RunStopReason, SessionEvent, Usage};

const DIM: &str = "\x1b[2m";
const RESET: &str = "\x1b[0m";
/// Longest tool-result line shown.
const RESULT_PREVIEW: usize = 120;

/// Writes events as text (thinking dimmed on a terminal) or as JSON lines.
pub(crate) struct Printer {
    json: bool,
    styled: bool,
    in_thinking: bool,
    at_line_start: bool,
    out: std::io::Stdout,
}

impl Printer {
    pub(crate) fn new(json: bool) -> Self {
        let out = std::io::stdout();
        Self {
            json,
            // Dim thinking only on a terminal, and never when NO_COLOR is set (no-color.org).
            styled: out.is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
            in_thinking: false,
            at_line_start: true,
            out,
        }
    }

    pub(crate) fn event(&mut self, event: &RunEvent) -> std::io::Result<()> {
        if self.json {
            let mut out = self.out.lock();
            serde_json::to_writer(&mut out, event)?;
            out.write_all(b"\n")?;
            return out.flush();
        }
        match event {
            RunEvent::ThinkingDelta { text } => {
                if !self.in_thinking {
                    self.in_thinking = true;
                    if self.styled {
                        self.write(DIM)?;
                    }
                }
                self.write(text)?;
            }
            RunEvent::TextDelta { text } => {
                self.end_thinking()?;
                self.write(text)?;
            }
            RunEvent::ToolCallStarted { call } => {
                self.end_thinking()?;
                self.line_break()?;
                self.write(&format!("→ {}({})\n", call.name, call.arguments))?;
            }
            RunEvent::ToolResult {
                result,
                duration_ms,
            } => {
                let text = one_line(&result.text_content());
                let mark = if result.is_error { "✗" } else { "←" };
                self.write(&format!("{mark} {text} ({duration_ms} ms)\n"))?;
            }
            RunEvent::RunFinished {
                stop_reason,
                usage,
                rounds,
                ..
            } => {
                self.end_thinking()?;
                self.line_break()?;
                eprintln!("{}", usage_line(*stop_reason, usage, *rounds));
            }
            RunEvent::RunFailed { error, .. } => {
                self.end_thinking()?;
                self.line_break()?;
                eprintln!("agentry: {}: {}", error.code, error.message);
            }
            RunEvent::RunSuspended {
                run_id,
                status,
                pending,
                ..
            } => {
                self.end_thinking()?;
                self.line_break()?;
                match status {
                    agentry_types::SuspendStatus::Waiting => {
                        for waiting in pending {
                            eprintln!(
                                "⏸ {}({}) waits for approval: {}",
                                waiting.call.name, waiting.call.arguments, waiting.reason
                            );
                        }
                        eprintln!("run {run_id} waits for approval");
                    }
                    agentry_types::SuspendStatus::Paused => eprintln!("run {run_id} is paused"),
                }
            }
            RunEvent::RunStarted { .. }
            | RunEvent::Committed { .. }
            | RunEvent::ToolCallDelta { .. }
            | RunEvent::AssistantMessage { .. }
            | RunEvent::Nested { .. }
            | RunEvent::ElicitationRequested { .. }
            | RunEvent::ElicitationResolved { .. }
            | RunEvent::Usage { .. } => {}
        }
        self.out.flush()
    }

    fn end_thinking(&mut self) -> std::io::Result<()> {
        if self.in_thinking {
            self.in_thinking = false;
            if self.styled {
                self.write(RESET)?;
            }
            self.line_break()?;
            self.write("\n")?;
        }
        Ok(())
    }

    fn line_break(&mut self) -> std::io::Result<()> {
        if !self.at_line_start {
            self.write("\n")?;
        }
        Ok(())
    }

    fn write(&mut self, text: &str) -> std::io::Result<()> {
        if let Some(last) = text.chars().last() {
            self.at_line_start = last == '\n';
        }
        self.out.write_all(text.as_bytes())
    }
}

/// The first line of `text`, cut to [`RESULT_PREVIEW`] characters.
fn one_line(text: &str) -> String {
    let first = text.lines().next().unwrap_or_default();
    let mut line: String = first.chars().take(RESULT_PREVIEW).collect();
    if line.len() < first.len() || text.lines().nth(1).is_some() {
        line.push('…');
    }
    line
}

fn usage_line(reason: RunStopReason, usage: &Usage, rounds: u32) -> String {
    let mut line = format!("[{} in", usage.input_tokens);
    if usage.cached_input_tokens > 0 {
        line.push_str(&format!(" ({} cached)", usage.cached_input_tokens));
    }
    line.push_str(&format!(" · {} out", usage.output_tokens));
    if usage.reasoning_tokens > 0 {
        line.push_str(&format!(" ({} reasoning)", usage.reasoning_tokens));
    }
    line.push_str(&format!(" · {rounds} round"));
    if rounds != 1 {
        line.push('s');
    }
    line.push_str(&format!(" · {}]", reason.as_str()));
    line
}

/// The exit code for how a run ended: 0 completed, 1 failed, 3 stopped by a guard,
/// 130 cancelled.
pub(crate) fn exit_code(reason: RunStopReason) -> u8 {
    match reason {
        RunStopReason::Completed => 0,
        RunStopReason::Error => 1,
        RunStopReason::MaxRounds
        | RunStopReason::Deadline
        | RunStopReason::LoopDetected
        | RunStopReason::QuotaExceeded
        | RunStopReason::BudgetExceeded
        // (The CLI offers no client tools: a run never stops for them here.)
        | RunStopReason::ToolCalls => 3,
        RunStopReason::Cancelled => 130,
    }
}

/// Calls `cancel` when the user presses Ctrl-C.
/// Stops what runs in `session` (Ctrl-C), through the app's command: answered in a task of its
/// own, as a signal handler cannot wait.
pub(crate) fn stop_session(app: &agentry_app::App, session: agentry_types::SessionId) {
    let app = app.clone();
    tokio::spawn(async move {
        let stop = agentry_app::ops::StopSession {
            session_id: session,
        };
        if let Err(error) = app.submit(stop).await {
            tracing::warn!("cannot stop the session: {}", error.message);
        }
    });
}

fn on_ctrl_c(cancel: impl FnOnce() + Send + 'static) {
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            cancel();
        }
    });
}

/// Prints a session run's events as [`agentry_app::App::follow`] yields them (Ctrl-C calls
/// `cancel`) and returns the exit code for how it ended, as [`print_run`] does.
pub(crate) async fn print_followed(
    mut events: agentry_app::follow::Followed,
    json: bool,
    cancel: impl FnOnce() + Send + 'static,
) -> anyhow::Result<ExitCode> {
    on_ctrl_c(cancel);
    let mut printer = Printer::new(json);
    let mut note = None;
    let mut code = None;
    while let Some(event) = events.next().await {
        let event = event.map_err(super::app_error)?;
        printer.event(&event)?;
        match event.as_ref() {
            RunEvent::Committed {
                event: SessionEvent::RunFinished { note: stopped, .. },
                ..
            } => note.clone_from(stopped),
            RunEvent::RunFinished { stop_reason, .. } | RunEvent::RunFailed { stop_reason, .. } => {
                code = Some(exit_code(*stop_reason));
            }
            // Waiting for approvals or paused: not ended, not failed.
            RunEvent::RunSuspended { .. } => code = Some(4),
            _ => {}
        }
    }
    if let Some(note) = &note {
        eprintln!("agentry: stopped: {note}");
    }
    // A run whose end never came (its process went away): a failure.
    Ok(ExitCode::from(code.unwrap_or(1)))
}

/// Prints a run's events (Ctrl-C cancels it) and returns the exit code for how it ended.
pub(crate) async fn print_run(stream: RunStream, json: bool) -> anyhow::Result<ExitCode> {
    let cancel = stream.cancel_token();
    print_to_end(stream, json, move || cancel.cancel(), RunStream::finish).await
}

/// [`print_run`] for a stateless run the application started (its calls recorded as the
/// server's are).
pub(crate) async fn print_stateless(
    run: agentry_app::usage::StatelessRun,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let cancel = run.cancel_token();
    print_to_end(
        run,
        json,
        move || cancel.cancel(),
        agentry_app::usage::StatelessRun::finish,
    )
    .await
}

/// Prints the events of `stream` (`cancel` on Ctrl-C), then its output as `finish` answers it.
async fn print_to_end<S, F, Done>(
    mut stream: S,
    json: bool,
    cancel: impl FnOnce() + Send + 'static,
    finish: F,
) -> anyhow::Result<ExitCode>
where
    S: futures::Stream<Item = RunEvent> + Unpin,
    F: FnOnce(S) -> Done,
    Done: std::future::Future<
            Output = Result<
                agentry_app::domain::core::RunOutput,
                agentry_app::domain::core::RunError,
            >,
        >,
{
    on_ctrl_c(cancel);
    let mut printer = Printer::new(json);
    while let Some(event) = stream.next().await {
        printer.event(&event)?;
    }
    let output = finish(stream).await?;
    if let Some(note) = &output.note {
        eprintln!("agentry: stopped: {note}");
    }
    if output.suspended.is_some() {
        // Waiting for approvals or paused: not ended, not failed (the server's
        // /v1/runs/{run_id} routes or `agentry chat` go on with it).
        return Ok(ExitCode::from(4));
    }
    Ok(ExitCode::from(exit_code(output.stop_reason)))
}
