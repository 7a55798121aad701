//! `agentry run`: one task, run to its answer, streamed to the terminal, saved as a session.

use std::process::ExitCode;

use clap::Args;

use agentry_app::domain::core::session::BusyPolicy;
use agentry_types::SessionId;

use agentry_app::auth::Principal;
use agentry_app::runs::{RunSpec, SessionChoice, Target, prepare};

use super::agents;
use super::app_error;
use super::data::DataArgs;
use super::output::{print_followed, print_run, print_stateless};
use super::profile::Profile;
use super::sessions::session_with_manager;

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// The task.
    prompt: String,
    #[command(flatten)]
    profile: Profile,
    /// Print one JSON object per line for every event instead of text.
    #[arg(long)]
    json: bool,
    /// Continue this session instead of starting a new one.
    #[arg(long, value_name = "ID", conflicts_with = "ephemeral")]
    session: Option<SessionId>,
    /// Keep nothing: no session is saved.
    #[arg(long)]
    ephemeral: bool,
    /// What to do if the session already has a run in progress in this process.
    #[arg(long, value_enum, default_value = "reject")]
    policy: Policy,
    /// Delete the new session after this many days (`agentry sessions prune`).
    #[arg(long, value_name = "DAYS", env = "AGENTRY_SESSION_TTL_DAYS")]
    ttl_days: Option<u64>,
    /// Run as this saved agent (`agentry agents`): its model and fallbacks, tools, skills, MCP
    /// servers, system prompt or template and limits, with the models of the data folder.
    #[arg(long, value_name = "ID", conflicts_with_all = ["model_name", "provider", "base_url"])]
    agent: Option<String>,
}

/// The busy policy, as a flag.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum Policy {
    Reject,
    Enqueue,
    Interrupt,
}

impl From<Policy> for BusyPolicy {
    fn from(policy: Policy) -> Self {
        match policy {
            Policy::Reject => BusyPolicy::Reject,
            Policy::Enqueue => BusyPolicy::Enqueue,
            Policy::Interrupt => BusyPolicy::Interrupt,
        }
    }
}

pub(crate) async fn run(args: RunArgs, data: &DataArgs) -> anyhow::Result<ExitCode> {
    if let Some(id) = args.agent.clone() {
        return run_agent(args, data, &id).await;
    }
    let stream = if args.ephemeral {
        let store = if args.profile.uses_store() {
            Some(data.open_store().await?)
        } else {
            None
        };
        let runtime = args.profile.runtime(store.as_ref(), None).await?;
        runtime.stream(args.profile.request(&args.prompt))?
    } else {
        let store = data.open_store().await?;
        let (session, profile, manager) = session_with_manager(
            &store,
            args.session,
            args.profile,
            &args.prompt,
            args.ttl_days,
            data,
            None,
        )
        .await?;
        eprintln!("session: {session}");
        manager
            .send(session, profile.request(&args.prompt), args.policy.into())
            .await?
    };
    print_run(stream, args.json).await
}

/// `agentry run --agent ID`: the run as the saved agent, in a new or given session, or in none
/// with `--ephemeral`. It goes through the application exactly as `POST /v1/infer` does (the
/// agent's checks, sandbox and shared workspace, the fenced log, the app's hub for its
/// sub-agents; a stateless run whose calls may wait for approval is refused, as over HTTP).
async fn run_agent(args: RunArgs, data: &DataArgs, id: &str) -> anyhow::Result<ExitCode> {
    let store = data.open_store().await?;
    let agent = agents::load(&store, id).await?;
    let app = agents::agent_app(store, &agent, &args.profile, data, None).await?;
    let input = RunSpec {
        agent_id: Some(agent.id.clone()),
        input: Some(agentry_app::domain::core::Input::Text {
            text: args.prompt.clone(),
        }),
        session: match (args.ephemeral, args.session) {
            (true, _) => SessionChoice::Ephemeral,
            (false, Some(session)) => SessionChoice::Existing(session),
            (false, None) => SessionChoice::New,
        },
        ..RunSpec::default()
    };
    let (target, request) = prepare(&app, &Principal::operator(), input)
        .await
        .map_err(app_error)?;
    let Target::Session(session) = target else {
        let run = app.stream_stateless(request).map_err(app_error)?;
        let code = print_stateless(run, args.json).await;
        app.close().await;
        return code;
    };
    eprintln!("session: {session}");
    let events = app
        .start_followed(session, request, args.policy.into())
        .await
        .map_err(app_error)?;
    if let (None, Some(days)) = (args.session, args.ttl_days) {
        let expires = agentry_app::clock::now_ms() + days * 24 * 3600 * 1000;
        app.sessions()
            .expire(session, expires)
            .await
            .map_err(app_error)?;
    }
    let stopper = app.clone();
    let code = print_followed(events, args.json, move || {
        super::output::stop_session(&stopper, session);
    })
    .await;
    app.close().await;
    code
}
