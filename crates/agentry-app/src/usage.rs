//! Usage, cost and budgets.
//!
//! Every model call's tokens and cost are recorded in the store's usage ledger with the call's
//! event ([`agentry_store::usage`]); the cost is the model's price ([`ModelConfig::pricing`],
//! else [`known_price`] by the provider's model name) times the call's tokens. [`App::usage`]
//! sums the ledger over a time range grouped by agent, model, session, API key and/or day (a
//! `user` key sees only its own calls).
//!
//! A budget ([`BudgetConfig`]) caps what an agent's runs, or an API key's, may spend in a
//! period (a UTC day, week or month, or in total). The runtime asks [`StoreBudgets`] before
//! each model call of each run; once the spending in the current period has reached the
//! limit, the run stops with `budget_exceeded` before the call (so a run can pass a limit by
//! at most the call in flight when it was reached). Without budgets nothing is asked.

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{Datelike, NaiveDate, TimeZone, Utc};
use futures::Stream;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use agentry_core::budget::{BudgetGate, BudgetQuery};
use agentry_core::{RunError, RunOutput, RunRequest, RunStream, Runtime};
use agentry_store::{SpendScope, Store, UsageDimension, UsageEntry, UsageGroup, UsageQuery};
use agentry_types::{ModelPrice, RunEvent, RunId, SessionId};

use crate::App;
use crate::auth::Principal;
use crate::config::{ConfigDoc, ConfigRepo, check_name};
use crate::error::AppError;
use crate::model_config::ModelConfig;

/// Published prices (US dollars per million tokens: input, cached input, cache write,
/// output) of well-known models, by the start of the provider's model name; the longest
/// match wins, so `gpt-4o-mini-2024-07-18` is `gpt-4o-mini`'s. A model's own `pricing`
/// overrides this.
const KNOWN_PRICES: &[(&str, f64, f64, f64, f64)] = &[
    // OpenAI (cache writes cost nothing extra).
    ("gpt-5", 1.25, 0.125, 1.25, 10.0),
    ("gpt-5-mini", 0.25, 0.025, 0.25, 2.0),
    ("gpt-5-nano", 0.05, 0.005, 0.05, 0.4),
    ("gpt-4.1", 2.0, 0.5, 2.0, 8.0),
    ("gpt-4.1-mini", 0.4, 0.1, 0.4, 1.6),
    ("gpt-4.1-nano", 0.1, 0.025, 0.1, 0.4),
    ("gpt-4o", 2.5, 1.25, 2.5, 10.0),
    ("gpt-4o-mini", 0.15, 0.075, 0.15, 0.6),
    ("o3", 2.0, 0.5, 2.0, 8.0),
    ("o3-mini", 1.1, 0.55, 1.1, 4.4),
    ("o4-mini", 1.1, 0.275, 1.1, 4.4),
    // Anthropic (5-minute cache writes at 1.25× input, reads at 0.1×).
    ("claude-opus-4-5", 5.0, 0.5, 6.25, 25.0),
    ("claude-opus-4", 15.0, 1.5, 18.75, 75.0),
    ("claude-sonnet-4", 3.0, 0.3, 3.75, 15.0),
    ("claude-3-7-sonnet", 3.0, 0.3, 3.75, 15.0),
    ("claude-3-5-sonnet", 3.0, 0.3, 3.75, 15.0),
    ("claude-haiku-4-5", 1.0, 0.1, 1.25, 5.0),
    ("claude-3-5-haiku", 0.8, 0.08, 1.0, 4.0),
    ("claude-3-haiku", 0.25, 0.03, 0.3, 1.25),
];

/// The published price of a well-known model, by the provider's model name (see
/// [`KNOWN_PRICES`]).
pub fn known_price(model_name: &str) -> Option<ModelPrice> {
    KNOWN_PRICES
        .iter()
        .filter(|(prefix, ..)| model_name.starts_with(prefix))
        .max_by_key(|(prefix, ..)| prefix.len())
        .map(|(_, input, cached, write, output)| ModelPrice {
            input: *input,
            cached_input: Some(*cached),
            cache_write: Some(*write),
            output: *output,
        })
}

/// What a model costs: its own `pricing`, else its well-known price, else unknown.
pub fn price_of(model: &ModelConfig) -> Option<ModelPrice> {
    model.pricing.or_else(|| known_price(&model.model_name))
}

/// The span a budget counts spending over; each starts anew at a UTC boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum BudgetPeriod {
    /// The UTC day.
    Day,
    /// The ISO week (from Monday, UTC).
    Week,
    /// The calendar month (UTC).
    #[default]
    Month,
    /// Everything ever spent.
    Total,
}

impl BudgetPeriod {
    /// When the period holding `now` (Unix milliseconds) began, Unix milliseconds.
    pub fn start(self, now: u64) -> u64 {
        let Some(now) = Utc.timestamp_millis_opt(now as i64).single() else {
            return 0;
        };
        let today = now.date_naive();
        let first = match self {
            Self::Day => today,
            Self::Week => {
                today - chrono::Days::new(u64::from(today.weekday().num_days_from_monday()))
            }
            Self::Month => NaiveDate::from_ymd_opt(today.year(), today.month(), 1).unwrap_or(today),
            Self::Total => return 0,
        };
        first
            .and_hms_opt(0, 0, 0)
            .map_or(0, |start| start.and_utc().timestamp_millis().max(0) as u64)
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Day => "day",
            Self::Week => "week",
            Self::Month => "month",
            Self::Total => "total",
        }
    }
}

/// A spending budget: what one agent's runs, or one API key's, may spend per period.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct BudgetConfig {
    /// Its name.
    #[cfg_attr(feature = "openapi", schema(pattern = "^[A-Za-z0-9_.-]{1,64}$"))]
    pub name: String,
    /// The saved agent whose runs it counts (exactly one of `agent` and `key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The id of the API key whose runs it counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// US dollars the period may spend.
    #[cfg_attr(feature = "openapi", schema(minimum = 0))]
    pub limit_usd: f64,
    /// The period (default `month`).
    #[serde(default)]
    pub period: BudgetPeriod,
}

impl ConfigDoc for BudgetConfig {
    const KIND: agentry_store::ConfigKind = agentry_store::ConfigKind::Budget;
    const NOUN: &'static str = "budget";
}

impl BudgetConfig {
    fn scope(&self) -> Option<SpendScope<'_>> {
        match (&self.agent, &self.key) {
            (Some(agent), None) => Some(SpendScope::Agent(agent)),
            (None, Some(key)) => Some(SpendScope::Key(key)),
            _ => None,
        }
    }

    fn check(&self) -> Result<(), AppError> {
        check_name("budget", &self.name)?;
        match (&self.agent, &self.key) {
            (Some(agent), None) => check_name("agent", agent)?,
            (None, Some(key)) if (1..=128).contains(&key.len()) => {}
            _ => {
                return Err(AppError::bad_request(
                    "a budget names exactly one of `agent` (an agent's runs) and `key` (an API \
                     key's id)",
                ));
            }
        }
        if !self.limit_usd.is_finite() || self.limit_usd < 0.0 {
            return Err(AppError::bad_request(
                "`limit_usd` is a number of dollars, zero or more",
            ));
        }
        Ok(())
    }

    /// Who it counts, for messages.
    fn whose(&self) -> String {
        match (&self.agent, &self.key) {
            (Some(agent), _) => format!("agent {agent:?}"),
            (_, Some(key)) => format!("API key {key:?}"),
            _ => "nobody".into(),
        }
    }
}

/// A budget with what its current period has spent.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BudgetView {
    /// Its name.
    pub name: String,
    /// The saved agent whose runs it counts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The id of the API key whose runs it counts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// US dollars the period may spend.
    pub limit_usd: f64,
    /// The period.
    pub period: BudgetPeriod,
    /// Dollars spent in the current period.
    pub spent_usd: f64,
    /// When the current period began, Unix milliseconds.
    pub period_start: u64,
    /// Whether runs it counts are stopped (`spent_usd` reached `limit_usd`).
    pub exceeded: bool,
}

/// The budgets, by name.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BudgetList {
    /// Each with its current spending.
    pub budgets: Vec<BudgetView>,
}

fn now_millis() -> u64 {
    Utc::now().timestamp_millis().max(0) as u64
}

async fn view_of(store: &Store, budget: BudgetConfig) -> Result<BudgetView, AppError> {
    let period_start = budget.period.start(now_millis());
    let spent_usd = match budget.scope() {
        Some(scope) => store.spent(scope, period_start).await?,
        None => 0.0,
    };
    Ok(BudgetView {
        exceeded: spent_usd >= budget.limit_usd,
        spent_usd,
        period_start,
        name: budget.name,
        agent: budget.agent,
        key: budget.key,
        limit_usd: budget.limit_usd,
        period: budget.period,
    })
}

fn no_budget(name: &str) -> AppError {
    AppError::not_found(format!("no budget named {name:?}"))
}

/// The gate the runtime asks before each model call: the saved budgets, checked against the
/// usage ledger.
pub struct StoreBudgets {
    store: Store,
    budgets: Vec<BudgetConfig>,
}

impl StoreBudgets {
    /// The gate over `budgets`, or none when there are none (then runs ask nothing).
    pub fn gate(store: &Store, budgets: Vec<BudgetConfig>) -> Option<Arc<dyn BudgetGate>> {
        if budgets.is_empty() {
            return None;
        }
        Some(Arc::new(Self {
            store: store.clone(),
            budgets,
        }))
    }

    async fn owner_of(&self, session: Option<SessionId>) -> Option<String> {
        let session = session?;
        match self.store.session(session).await {
            Ok(record) => record.and_then(|record| record.owner),
            Err(error) => {
                tracing::warn!(%session, "cannot read the session's owner for its budgets: {error}");
                None
            }
        }
    }

    async fn check(&self, run: BudgetQuery<'_>) -> Option<String> {
        let mut owner: Option<Option<String>> = None;
        let now = now_millis();
        for budget in &self.budgets {
            let applies = match budget.scope() {
                Some(SpendScope::Agent(agent)) => run.agent_id == Some(agent),
                Some(SpendScope::Key(key)) => {
                    if owner.is_none() {
                        owner = Some(self.owner_of(run.session).await);
                    }
                    owner.as_ref().and_then(Option::as_deref) == Some(key)
                }
                None => false,
            };
            let Some(scope) = budget.scope().filter(|_| applies) else {
                continue;
            };
            let since = budget.period.start(now);
            match self.store.spent(scope, since).await {
                Ok(spent) if spent >= budget.limit_usd => {
                    return Some(format!(
                        "the budget {:?} of {} is used up: ${spent:.4} spent of ${:.4} this {}",
                        budget.name,
                        budget.whose(),
                        budget.limit_usd,
                        budget.period.as_str()
                    ));
                }
                Ok(_) => {}
                Err(error) => tracing::warn!(
                    budget = %budget.name,
                    run_id = %run.run_id,
                    "cannot read what the budget spent; the run goes on: {error}"
                ),
            }
        }
        None
    }
}

impl BudgetGate for StoreBudgets {
    fn exceeded<'a>(&'a self, run: BudgetQuery<'a>) -> BoxFuture<'a, Option<String>> {
        Box::pin(self.check(run))
    }
}

/// A usage report to compute, as a request gives it.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
pub struct UsageRequest {
    /// From this time on: Unix milliseconds, an RFC 3339 time or a UTC date `YYYY-MM-DD`
    /// (default: 30 days before `to`).
    pub from: Option<String>,
    /// Up to this time, excluded (same forms; a date means its start; default: now).
    pub to: Option<String>,
    /// Up to three of `agent`, `model`, `session`, `key`, `day`, separated by commas (default:
    /// one total).
    pub group_by: Option<String>,
    /// Only this agent's calls.
    pub agent: Option<String>,
    /// Only this model's calls.
    pub model: Option<String>,
    /// Only this session's calls.
    pub session: Option<String>,
    /// Only the calls charged to this API key (admins only; a user key sees its own).
    pub key: Option<String>,
}

/// One group of a usage report.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UsageRow {
    /// The group's value of each dimension grouped by (`null`: runs without an agent, or the
    /// operator's).
    #[serde(flatten)]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub group: BTreeMap<String, Option<String>>,
    /// Distinct runs.
    pub runs: u64,
    /// Model calls.
    pub calls: u64,
    /// Prompt tokens, cached ones included.
    pub input_tokens: u64,
    /// Prompt tokens read from a provider's cache.
    pub cached_input_tokens: u64,
    /// Prompt tokens written to a provider's cache.
    pub cache_creation_input_tokens: u64,
    /// Generated tokens, reasoning included.
    pub output_tokens: u64,
    /// Generated tokens spent on reasoning.
    pub reasoning_tokens: u64,
    /// Dollars, over the calls whose model had a price.
    pub cost_usd: f64,
    /// Calls whose model had no price.
    pub unpriced_calls: u64,
}

/// A usage report.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UsageReport {
    /// Its range's start, Unix milliseconds.
    pub from: u64,
    /// Its range's end (excluded), Unix milliseconds.
    pub to: u64,
    /// The dimensions grouped by, in order.
    pub group_by: Vec<String>,
    /// The groups, ordered by their dimensions.
    pub groups: Vec<UsageRow>,
    /// Everything in the range.
    pub total: UsageRow,
}

fn row_of(dims: &[UsageDimension], group: UsageGroup) -> UsageRow {
    UsageRow {
        group: dims
            .iter()
            .map(|dim| dim.as_str().to_owned())
            .zip(group.key)
            .collect(),
        runs: group.runs,
        calls: group.calls,
        input_tokens: group.usage.input_tokens,
        cached_input_tokens: group.usage.cached_input_tokens,
        cache_creation_input_tokens: group.usage.cache_creation_input_tokens,
        output_tokens: group.usage.output_tokens,
        reasoning_tokens: group.usage.reasoning_tokens,
        cost_usd: group.cost_usd,
        unpriced_calls: group.unpriced_calls,
    }
}

/// A time as a request gives it: Unix milliseconds, RFC 3339, or a UTC date.
fn parse_time(what: &str, text: &str) -> Result<u64, AppError> {
    let text = text.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse::<u64>()
            .map_err(|_| AppError::bad_request(format!("`{what}` is out of range")));
    }
    if let Ok(date) = NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        return date
            .and_hms_opt(0, 0, 0)
            .map(|start| start.and_utc().timestamp_millis().max(0) as u64)
            .ok_or_else(|| AppError::bad_request(format!("`{what}` is out of range")));
    }
    chrono::DateTime::parse_from_rfc3339(text)
        .map(|time| time.timestamp_millis().max(0) as u64)
        .map_err(|_| {
            AppError::bad_request(format!(
                "`{what}` is Unix milliseconds, an RFC 3339 time or a date YYYY-MM-DD, not {:?}",
                text.chars().take(64).collect::<String>()
            ))
        })
}

/// The longest range one report covers.
const MAX_RANGE_MS: u64 = 5 * 366 * 86_400_000;

impl App {
    /// The usage ledger summed over `request`'s range, grouped by its dimensions; a `user`
    /// key's report holds only the calls charged to it.
    pub async fn usage(
        &self,
        caller: &Principal,
        request: UsageRequest,
    ) -> Result<UsageReport, AppError> {
        let to = match &request.to {
            Some(text) => parse_time("to", text)?,
            None => now_millis(),
        };
        let from = match &request.from {
            Some(text) => parse_time("from", text)?,
            None => to.saturating_sub(30 * 86_400_000),
        };
        if from > to {
            return Err(AppError::bad_request("`from` is after `to`"));
        }
        if to - from > MAX_RANGE_MS {
            return Err(AppError::bad_request(
                "a usage report covers at most five years",
            ));
        }
        let mut dims = Vec::new();
        for name in request
            .group_by
            .as_deref()
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|name| !name.is_empty())
        {
            let dim = UsageDimension::parse(name).ok_or_else(|| {
                AppError::bad_request(format!(
                    "cannot group usage by {:?}: agent, model, session, key or day",
                    name.chars().take(64).collect::<String>()
                ))
            })?;
            if dims.contains(&dim) {
                return Err(AppError::bad_request(format!("`{name}` is named twice")));
            }
            dims.push(dim);
        }
        if dims.len() > 3 {
            return Err(AppError::bad_request(
                "usage is grouped by at most three dimensions",
            ));
        }
        let session = request
            .session
            .as_deref()
            .map(|id| {
                SessionId::parse(id)
                    .map_err(|_| AppError::bad_request(format!("invalid session id {id:?}")))
            })
            .transpose()?;
        let key = if caller.is_admin() {
            request.key.clone().map(Some)
        } else {
            Some(caller.key_id.clone())
        };
        let mut query = UsageQuery {
            from,
            to,
            group_by: dims.clone(),
            agent: request.agent.clone(),
            model: request.model.clone(),
            session,
            key,
        };
        let groups = self.parts.store.usage_report(&query).await?;
        query.group_by.clear();
        let total = self
            .parts
            .store
            .usage_report(&query)
            .await?
            .pop()
            .unwrap_or_default();
        Ok(UsageReport {
            from,
            to,
            group_by: dims.iter().map(|dim| dim.as_str().to_owned()).collect(),
            groups: groups
                .into_iter()
                .map(|group| row_of(&dims, group))
                .collect(),
            total: row_of(&[], total),
        })
    }
}

/// A run without a session, started by [`App::stream_stateless`]: its events, and each model
/// call's usage recorded in the ledger (`run_usage`) as it comes by, charged to the key the
/// request names. A session's runs record theirs with their events instead.
pub struct StatelessRun {
    stream: RunStream,
    ledger: RunLedger,
}

/// What a stateless run's calls are recorded with.
struct RunLedger {
    store: Store,
    runtime: Runtime,
    owner: Option<String>,
    agent_id: Option<String>,
    run_id: Option<RunId>,
}

impl RunLedger {
    /// Notes one event: the run's id, or a call's usage to record.
    fn note(&mut self, event: &RunEvent) {
        match event {
            RunEvent::RunStarted { run_id } => self.run_id = Some(*run_id),
            RunEvent::Usage {
                round,
                usage,
                model,
                ..
            } => {
                let Some(run_id) = self.run_id else {
                    return;
                };
                let model = model.clone().unwrap_or_default();
                let entry = UsageEntry {
                    run_id,
                    agent_id: self.agent_id.clone(),
                    cost_usd: self.runtime.price_of(&model).map(|price| price.cost(usage)),
                    model,
                    usage: *usage,
                };
                let store = self.store.clone();
                let owner = self.owner.clone();
                let round = *round;
                // Recorded beside the run, not in its way: a ledger that cannot be written
                // loses this call's record (and says so), never the run.
                tokio::spawn(async move {
                    let at = crate::clock::now_ms();
                    if let Err(error) = store
                        .record_run_usage(owner.as_deref(), round, &entry, at)
                        .await
                    {
                        tracing::warn!(run = %entry.run_id, "cannot record a call's usage: {error}");
                    }
                });
            }
            _ => {}
        }
    }
}

impl StatelessRun {
    /// The token that cancels the run.
    pub fn cancel_token(&self) -> tokio_util::sync::CancellationToken {
        self.stream.cancel_token()
    }

    /// Waits for the run's end (reading whatever events are left) and answers its output.
    pub async fn finish(mut self) -> Result<RunOutput, RunError> {
        while let Some(event) = futures::StreamExt::next(&mut self.stream).await {
            self.ledger.note(&event);
        }
        self.stream.finish().await
    }
}

impl Stream for StatelessRun {
    type Item = RunEvent;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<RunEvent>> {
        let polled = std::pin::Pin::new(&mut self.stream).poll_next(cx);
        if let std::task::Poll::Ready(Some(event)) = &polled {
            self.ledger.note(event);
        }
        polled
    }
}

impl App {
    /// Starts `request`, a run without a session (`Target::Ephemeral`). Its model calls are
    /// charged to the key the request names (`owner`, set by `runs::prepare`): they count in
    /// usage reports and against the key's `tokens_per_day` like a session's.
    pub fn stream_stateless(&self, request: RunRequest) -> Result<StatelessRun, AppError> {
        let runtime = self.parts.sessions.runtime();
        let ledger = RunLedger {
            store: self.parts.store.clone(),
            runtime: runtime.clone(),
            owner: request.owner.clone(),
            agent_id: request.agent_id.clone(),
            run_id: None,
        };
        let stream = runtime.stream(request)?;
        Ok(StatelessRun { stream, ledger })
    }
}

/// The spending budgets: what runs may cost per period before they are refused.
pub struct Budgets<'a> {
    app: &'a App,
}

impl App {
    /// The spending budgets: what runs may cost per period before they are refused.
    pub fn budgets(&self) -> Budgets<'_> {
        Budgets { app: self }
    }
}

impl Budgets<'_> {
    /// The budgets, by name, each with its current spending.
    pub async fn list(&self) -> Result<BudgetList, AppError> {
        let mut budgets = Vec::new();
        for (_, budget) in ConfigRepo::<BudgetConfig>::new(&self.app.parts.store)
            .list()
            .await?
        {
            budgets.push(view_of(&self.app.parts.store, budget).await?);
        }
        Ok(BudgetList { budgets })
    }

    /// A budget with its current spending.
    pub async fn get(&self, name: &str) -> Result<BudgetView, AppError> {
        let budget = ConfigRepo::<BudgetConfig>::new(&self.app.parts.store)
            .get(name)
            .await?
            .ok_or_else(|| no_budget(name))?;
        view_of(&self.app.parts.store, budget).await
    }

    /// Saves a new budget; runs it counts are checked against it from their next model call.
    pub async fn create(&self, budget: BudgetConfig) -> Result<BudgetView, AppError> {
        budget.check()?;
        ConfigRepo::new(&self.app.parts.store)
            .create(&budget.name, &budget)
            .await?;
        self.app.reload_runtime().await?;
        view_of(&self.app.parts.store, budget).await
    }

    /// Replaces (or renames) a budget.
    pub async fn replace(&self, name: &str, budget: BudgetConfig) -> Result<BudgetView, AppError> {
        check_name("budget", name)?;
        budget.check()?;
        ConfigRepo::new(&self.app.parts.store)
            .replace(name, &budget.name, &budget)
            .await?;
        self.app.reload_runtime().await?;
        view_of(&self.app.parts.store, budget).await
    }

    /// Deletes a budget.
    pub async fn delete(&self, name: &str) -> Result<(), AppError> {
        if !ConfigRepo::<BudgetConfig>::new(&self.app.parts.store)
            .delete(name)
            .await?
        {
            return Err(no_budget(name));
        }
        self.app.reload_runtime().await
    }
}

#[cfg(test)]
mod tests {
    use super::{BudgetPeriod, known_price, parse_time};

    #[test]
    fn the_longest_known_name_wins() {
        let mini = known_price("gpt-4o-mini-2024-07-18").unwrap();
        assert_eq!((mini.input, mini.output), (0.15, 0.6));
        let full = known_price("gpt-4o-2024-08-06").unwrap();
        assert_eq!((full.input, full.output), (2.5, 10.0));
        let sonnet = known_price("claude-sonnet-4-20250514").unwrap();
        assert_eq!(sonnet.cache_write, Some(3.75));
        assert!(known_price("llama3.2:1b").is_none());
    }

    #[test]
    fn periods_start_at_utc_boundaries() {
        // 2026-11-27 (a Friday) 15:30 UTC.
        let now = parse_time("t", "2026-11-27T15:30:00Z").unwrap();
        let at = |text| parse_time("t", text).unwrap();
        assert_eq!(BudgetPeriod::Day.start(now), at("2026-11-27"));
        assert_eq!(BudgetPeriod::Week.start(now), at("2026-11-23"));
        assert_eq!(BudgetPeriod::Month.start(now), at("2026-11-01"));
        assert_eq!(BudgetPeriod::Total.start(now), 0);
        assert_eq!(at("1764257400000"), 1_764_257_400_000);
        assert!(parse_time("from", "yesterday").is_err());
    }
}
