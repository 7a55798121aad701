//! `agentry schedules list|add|show|rm|runs`: the schedules `agentry serve` fires, managed on
//! the data folder's store (a running server picks changes up at its next look, within a
//! second). Each is checked exactly as `POST /v1/schedules` checks it.

use std::process::ExitCode;

use clap::{Args, Subcommand, ValueEnum};

use agentry_app::App;
use agentry_app::auth::Principal;
use agentry_app::domain::core::Input;
use agentry_app::runs::RunSpec;
use agentry_app::schedules::{
    CatchUp, Overlap, ScheduleSpec, ScheduleView, ScheduledRun, ScheduledWorkflow,
};

use super::app_error;
use super::data::DataArgs;

#[derive(Debug, Args)]
pub(crate) struct SchedulesArgs {
    #[command(subcommand)]
    command: SchedulesCommand,
}

/// `--catch-up` on the command line.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum CatchUpArg {
    /// Skip the slots missed while no server ran.
    Skip,
    /// Run once for them.
    Once,
}

/// `--overlap` on the command line.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum OverlapArg {
    /// Skip a slot while the previous run still goes.
    Skip,
    /// Queue the run anyway.
    Queue,
    /// Cancel the previous run.
    Cancel,
}

#[derive(Debug, Subcommand)]
enum SchedulesCommand {
    /// List the schedules with their next fire.
    List,
    /// Add a schedule: a cron expression (`--cron`, read in `--timezone`) or an interval
    /// (`--every`), and the message each fire sends (to `--agent`, or `--model`) or the
    /// workflow each fire starts (`--workflow`, with `--input KEY=VALUE`).
    Add {
        /// The message each run starts with.
        #[arg(required_unless_present = "workflow", conflicts_with = "workflow")]
        text: Option<String>,
        /// Start this saved workflow at each fire instead of a run.
        #[arg(long, conflicts_with_all = ["agent", "model"])]
        workflow: Option<String>,
        /// An input of the workflow, `KEY=VALUE` (the value read as JSON when it is JSON;
        /// repeatable).
        #[arg(long = "input", value_name = "KEY=VALUE", requires = "workflow")]
        inputs: Vec<String>,
        /// A cron expression: 5 fields, or 6 with seconds first.
        #[arg(long, conflicts_with = "every")]
        cron: Option<String>,
        /// The IANA time zone of the expression.
        #[arg(long, default_value = "UTC")]
        timezone: String,
        /// Seconds between fires.
        #[arg(long, value_name = "SECS")]
        every: Option<u64>,
        /// Run as this saved agent.
        #[arg(long)]
        agent: Option<String>,
        /// The model (default: the default model).
        #[arg(long)]
        model: Option<String>,
        /// A name for people.
        #[arg(long)]
        name: Option<String>,
        /// After downtime.
        #[arg(long, value_enum, default_value = "skip")]
        catch_up: CatchUpArg,
        /// While the previous run still goes.
        #[arg(long, value_enum, default_value = "skip")]
        overlap: OverlapArg,
        /// Add it paused.
        #[arg(long)]
        disabled: bool,
    },
    /// Show a schedule and its next five fire times.
    Show {
        /// Its id.
        id: String,
    },
    /// Delete a schedule (the runs it fired stay).
    Rm {
        /// Its id.
        id: String,
    },
    /// The runs a schedule fired, newest first.
    Runs {
        /// Its id.
        id: String,
    },
}

fn timing(schedule: &ScheduleView) -> String {
    match (&schedule.cron, schedule.interval_secs) {
        (Some(cron), _) => format!("cron {cron} ({})", schedule.timezone),
        (None, Some(secs)) => format!("every {secs} s"),
        (None, None) => String::new(),
    }
}

fn next(schedule: &ScheduleView) -> String {
    match schedule.next_fires.first() {
        Some(at) => {
            let now = agentry_app::clock::now_ms();
            format!("next in {} s", at.saturating_sub(now).div_ceil(1000))
        }
        None if !schedule.enabled => "disabled".to_owned(),
        None => "no further fire".to_owned(),
    }
}

pub(crate) async fn schedules(args: SchedulesArgs, data: &DataArgs) -> anyhow::Result<ExitCode> {
    let store = data.open_store().await?;
    let app = App::new(store).await.map_err(app_error)?;
    match args.command {
        SchedulesCommand::List => {
            for schedule in app.schedules().list().await.map_err(app_error)?.schedules {
                println!(
                    "{}  {}  {}  {}",
                    schedule.id,
                    schedule.name,
                    timing(&schedule),
                    next(&schedule)
                );
            }
        }
        SchedulesCommand::Add {
            text,
            workflow,
            inputs,
            cron,
            timezone,
            every,
            agent,
            model,
            name,
            catch_up,
            overlap,
            disabled,
        } => {
            let (run, workflow) = match workflow {
                Some(workflow_id) => (
                    None,
                    Some(ScheduledWorkflow {
                        workflow_id,
                        input: super::workflows::input(&inputs, None)?,
                    }),
                ),
                None => {
                    // What the schedule shows back is what `POST /v1/schedules` would have
                    // been sent for it.
                    let request = serde_json::json!({
                        "text": text,
                        "agent_id": agent,
                        "model_id": model,
                    });
                    let spec = RunSpec {
                        agent_id: agent,
                        model_id: model,
                        input: text.map(|text| Input::Text { text }),
                        ..RunSpec::default()
                    };
                    (Some(ScheduledRun { spec, request }), None)
                }
            };
            let request = ScheduleSpec {
                name,
                cron,
                timezone: Some(timezone),
                interval_secs: every,
                run,
                workflow,
                enabled: !disabled,
                catch_up: match catch_up {
                    CatchUpArg::Skip => CatchUp::Skip,
                    CatchUpArg::Once => CatchUp::Once,
                },
                overlap: match overlap {
                    OverlapArg::Skip => Overlap::Skip,
                    OverlapArg::Queue => Overlap::Queue,
                    OverlapArg::Cancel => Overlap::Cancel,
                },
            };
            let schedule = app
                .schedules()
                .create(&Principal::operator(), request)
                .await
                .map_err(app_error)?;
            eprintln!(
                "added {} ({}, {})",
                schedule.name,
                timing(&schedule),
                next(&schedule)
            );
            println!("{}", schedule.id);
        }
        SchedulesCommand::Show { id } => {
            let schedule = app.schedules().get(&id).await.map_err(app_error)?;
            println!("{}", serde_json::to_string_pretty(&schedule)?);
        }
        SchedulesCommand::Rm { id } => {
            app.schedules().delete(&id).await.map_err(app_error)?;
            eprintln!("deleted {id}");
        }
        SchedulesCommand::Runs { id } => {
            for run in app
                .schedules()
                .runs(&id, 100)
                .await
                .map_err(app_error)?
                .runs
            {
                println!(
                    "{}  {}  session {}",
                    run.run_id,
                    run.state.as_str(),
                    run.session_id
                );
            }
        }
    }
    app.shut_down();
    Ok(ExitCode::SUCCESS)
}
