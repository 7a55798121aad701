//! `agentry usage` (tokens and cost over a time range, grouped, as a table or JSON) and
//! `agentry budgets list|add|rm` (spending budgets of agents and API keys), on the data
//! folder's store. The report and the checks are the app's, exactly as `GET /v1/usage` and
//! `/v1/budgets` give them.

use std::process::ExitCode;

use clap::{Args, Subcommand, ValueEnum};

use agentry_app::App;
use agentry_app::auth::Principal;
use agentry_app::usage::{BudgetConfig, BudgetPeriod, UsageReport, UsageRequest, UsageRow};

use super::app_error;
use super::data::DataArgs;

#[derive(Debug, Args)]
pub(crate) struct UsageArgs {
    /// From this time: Unix milliseconds, RFC 3339 or a UTC date YYYY-MM-DD (default: 30 days
    /// ago).
    #[arg(long)]
    from: Option<String>,
    /// Up to this time, excluded (default: now).
    #[arg(long)]
    to: Option<String>,
    /// Group by up to three of agent, model, session, key, day (comma-separated).
    #[arg(long, value_name = "DIMS", default_value = "day")]
    by: String,
    /// Only this agent's calls.
    #[arg(long)]
    agent: Option<String>,
    /// Only this model's calls.
    #[arg(long)]
    model: Option<String>,
    /// Only the calls charged to this API key (its id).
    #[arg(long)]
    key: Option<String>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// The cells of one row of the table: its groups' values, then the counts.
fn cells(report: &UsageReport, row: &UsageRow, label: Option<&str>) -> Vec<String> {
    let mut cells: Vec<String> = report
        .group_by
        .iter()
        .enumerate()
        .map(|(index, dim)| match label {
            Some(label) if index == 0 => label.to_owned(),
            Some(_) => String::new(),
            None => row
                .group
                .get(dim)
                .cloned()
                .flatten()
                .unwrap_or_else(|| "-".to_owned()),
        })
        .collect();
    if cells.is_empty() {
        cells.push(label.unwrap_or_default().to_owned());
    }
    cells.extend([
        row.runs.to_string(),
        row.calls.to_string(),
        row.input_tokens.to_string(),
        row.cached_input_tokens.to_string(),
        row.output_tokens.to_string(),
        format!("${:.6}", row.cost_usd),
        row.unpriced_calls.to_string(),
    ]);
    cells
}

/// The report as an aligned table, the total last.
fn table(report: &UsageReport) -> String {
    let mut header: Vec<String> = report.group_by.clone();
    if header.is_empty() {
        header.push(String::new());
    }
    header.extend(
        [
            "runs", "calls", "input", "cached", "output", "cost", "unpriced",
        ]
        .map(str::to_owned),
    );
    let mut rows = vec![header];
    rows.extend(report.groups.iter().map(|row| cells(report, row, None)));
    rows.push(cells(report, &report.total, Some("total")));
    let columns = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

pub(crate) async fn usage(args: UsageArgs, data: &DataArgs) -> anyhow::Result<ExitCode> {
    let store = data.open_store().await?;
    // A report runs nothing: no MCP server starts for it.
    let app = App::builder(store)
        .mcp(agentry_app::McpStart::None)
        .build()
        .await
        .map_err(app_error)?;
    let request = UsageRequest {
        from: args.from,
        to: args.to,
        group_by: Some(args.by),
        agent: args.agent,
        model: args.model,
        session: None,
        key: args.key,
    };
    let report = app.usage(&Principal::operator(), request).await;
    app.shut_down();
    let report = report.map_err(app_error)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", table(&report));
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, Args)]
pub(crate) struct BudgetsArgs {
    #[command(subcommand)]
    command: BudgetsCommand,
}

/// `--period` on the command line.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum PeriodArg {
    Day,
    Week,
    Month,
    Total,
}

#[derive(Debug, Subcommand)]
enum BudgetsCommand {
    /// List the budgets with what their period spent.
    List,
    /// Add a budget for an agent's runs (`--agent`) or an API key's (`--key`).
    Add {
        /// Its name.
        name: String,
        /// The saved agent whose runs it counts.
        #[arg(long, required_unless_present = "key", conflicts_with = "key")]
        agent: Option<String>,
        /// The id of the API key whose runs it counts.
        #[arg(long)]
        key: Option<String>,
        /// US dollars the period may spend.
        #[arg(long, value_name = "USD")]
        limit: f64,
        /// The period it counts over (UTC).
        #[arg(long, value_enum, default_value = "month")]
        period: PeriodArg,
    },
    /// Delete a budget.
    Rm {
        /// Its name.
        name: String,
    },
}

pub(crate) async fn budgets(args: BudgetsArgs, data: &DataArgs) -> anyhow::Result<ExitCode> {
    let store = data.open_store().await?;
    // A report runs nothing: no MCP server starts for it.
    let app = App::builder(store)
        .mcp(agentry_app::McpStart::None)
        .build()
        .await
        .map_err(app_error)?;
    let outcome = budget_command(&app, args.command).await;
    app.shut_down();
    outcome?;
    Ok(ExitCode::SUCCESS)
}

async fn budget_command(app: &App, command: BudgetsCommand) -> anyhow::Result<()> {
    match command {
        BudgetsCommand::List => {
            for budget in app.budgets().list().await.map_err(app_error)?.budgets {
                let whose = match (&budget.agent, &budget.key) {
                    (Some(agent), _) => format!("agent {agent}"),
                    (_, Some(key)) => format!("key {key}"),
                    _ => String::new(),
                };
                println!(
                    "{}  {whose}  ${:.4} of ${:.4} per {}{}",
                    budget.name,
                    budget.spent_usd,
                    budget.limit_usd,
                    serde_json::to_value(budget.period)?
                        .as_str()
                        .unwrap_or_default(),
                    if budget.exceeded { "  EXCEEDED" } else { "" }
                );
            }
        }
        BudgetsCommand::Add {
            name,
            agent,
            key,
            limit,
            period,
        } => {
            let budget = BudgetConfig {
                name,
                agent,
                key,
                limit_usd: limit,
                period: match period {
                    PeriodArg::Day => BudgetPeriod::Day,
                    PeriodArg::Week => BudgetPeriod::Week,
                    PeriodArg::Month => BudgetPeriod::Month,
                    PeriodArg::Total => BudgetPeriod::Total,
                },
            };
            let view = app.budgets().create(budget).await.map_err(app_error)?;
            eprintln!(
                "added {} (${:.4} spent of ${:.4} this period)",
                view.name, view.spent_usd, view.limit_usd
            );
        }
        BudgetsCommand::Rm { name } => {
            app.budgets().delete(&name).await.map_err(app_error)?;
            eprintln!("deleted {name}");
        }
    }
    Ok(())
}
