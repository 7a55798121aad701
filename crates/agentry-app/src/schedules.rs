//! Schedules: a cron expression in an IANA time zone (`croner`, `chrono-tz`) or an interval,
//! and the run each fire submits to the queue ([`crate::queue`]).
//!
//! A schedule is checked when saved: the expression and the zone parse, the run body passes the
//! same checks a submitted run does (without creating anything). Instead of a run, a schedule
//! may start a workflow (`workflow`: its id and input, checked against its input schema): each
//! fire starts a workflow run whose id is derived from the schedule and the slot, so a slot
//! starts one run whatever restarts happen; `overlap` then looks at the previous workflow run
//! (`queue` starts the new one beside it: workflow runs do not queue). The worker's loop fires due
//! schedules (`Schedules::fire_due`): each fire submits the run with the idempotency key
//! `schedule:<id>:<slot>`, so a slot is submitted once however many processes see it due and
//! whatever restarts happen in between, and moves the schedule to its next slot (a compare-and-
//! set on the fire time it saw). After downtime the missed slots follow the schedule's
//! `catch_up`: `skip` them, or run `once` for the latest. When the previous fire's run is still
//! queued or running, `overlap` says what happens: `skip` the slot, `queue` the new run anyway,
//! or `cancel` the previous one. A run that waits for a person (an approval) does not count as
//! running: it waits durably in its own session and never holds back the later slots.

use std::str::FromStr;

use chrono::{TimeZone, Utc};
use chrono_tz::Tz;
use croner::Cron;
use serde::{Deserialize, Serialize};

use agentry_store::{NewSchedule, RunQuery, RunState, ScheduleRecord};
use agentry_types::RunId;

use crate::App;
use crate::auth::Principal;
use crate::clock::{millis, now_ms};
use crate::error::AppError;
use crate::queue::RunList;
use crate::run_spec::RunSpec;

/// How late a slot may be found and still count as on time (not missed during downtime).
const ON_TIME: u64 = 60_000;

/// The longest interval: a year.
const MAX_INTERVAL_SECS: u64 = 366 * 24 * 3600;

/// What to do with the slots missed while no process ran.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum CatchUp {
    /// Skip them: the schedule goes on from the next slot.
    #[default]
    Skip,
    /// Run once for them (the latest), then go on.
    Once,
}

/// What to do when a slot comes while the previous fire's run is still queued or running.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Overlap {
    /// Skip this slot.
    #[default]
    Skip,
    /// Submit the run anyway: it waits in the queue (and for its session) like any other.
    Queue,
    /// Cancel the previous run, then submit.
    Cancel,
}

impl CatchUp {
    fn as_str(self) -> &'static str {
        match self {
            Self::Skip => "skip",
            Self::Once => "once",
        }
    }
}

impl Overlap {
    fn as_str(self) -> &'static str {
        match self {
            Self::Skip => "skip",
            Self::Queue => "queue",
            Self::Cancel => "cancel",
        }
    }
}

/// A schedule as a front-end read it from its request (`POST /v1/schedules`, `agentry schedules
/// add`): when it fires, and the run or workflow each fire starts.
#[derive(Debug, Clone)]
pub struct ScheduleSpec {
    /// A name for people (default: the expression or the interval).
    pub name: Option<String>,
    /// A cron expression (5 fields, or 6 with seconds first). This or `interval_secs`.
    pub cron: Option<String>,
    /// The IANA time zone the expression is read in (default `UTC`).
    pub timezone: Option<String>,
    /// Seconds between fires, counted from the schedule's creation. This or `cron`.
    pub interval_secs: Option<u64>,
    /// The run each fire submits (without a session each run gets a new one). This or
    /// `workflow`.
    pub run: Option<ScheduledRun>,
    /// The workflow each fire starts instead of a run.
    pub workflow: Option<ScheduledWorkflow>,
    /// Whether it fires.
    pub enabled: bool,
    /// After downtime: skip the missed slots or run once for them.
    pub catch_up: CatchUp,
    /// When the previous run still goes.
    pub overlap: Overlap,
}

/// A schedule's run: what each fire runs, and the request as its client wrote it (what the
/// schedule shows back; the app does not read it).
#[derive(Debug, Clone)]
pub struct ScheduledRun {
    /// What each fire runs.
    pub spec: RunSpec,
    /// The request as its client wrote it.
    pub request: serde_json::Value,
}

/// The workflow a schedule starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ScheduledWorkflow {
    /// The saved workflow.
    #[cfg_attr(feature = "openapi", schema(max_length = 64))]
    pub workflow_id: String,
    /// Its input (checked against its input schema when saved and at each fire).
    #[serde(default = "empty_input")]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub input: serde_json::Value,
}

fn empty_input() -> serde_json::Value {
    serde_json::Value::Object(serde_json::Map::new())
}

/// The run a schedule's fires submit, from what the schedule stored: `{"spec": <a stored
/// spec>, "request": <as the client wrote it>}`. A schedule stored before specs were (its
/// client's request alone) is rewritten at start-up by `Schedules::upgrade`.
fn scheduled_spec(request: &serde_json::Value) -> Result<RunSpec, AppError> {
    request
        .get("spec")
        .map(RunSpec::from_stored)
        .transpose()?
        .flatten()
        .ok_or_else(|| {
            AppError::internal(
                "the schedule's run is stored in a shape this release no longer reads",
            )
        })
}

/// The request a stored schedule's run was made from, as its client wrote it.
fn shown_run(request: &serde_json::Value) -> serde_json::Value {
    match request.get("spec") {
        Some(_) => request
            .get("request")
            .cloned()
            .unwrap_or(serde_json::Value::Null),
        None => request.clone(),
    }
}

/// The workflow a stored schedule starts, if it starts one.
fn stored_workflow(request: &serde_json::Value) -> Option<ScheduledWorkflow> {
    serde_json::from_value(request.get("workflow")?.clone()).ok()
}

/// The workflow run id of a schedule's slot: the same slot, the same run (a time-ordered id
/// whose time is the slot's, its other bits from the schedule and the slot).
fn slot_run_id(schedule: &str, slot: u64) -> Result<RunId, AppError> {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(format!("schedule\0{schedule}\0{slot}").as_bytes());
    let mut bytes = [0u8; 10];
    bytes.copy_from_slice(&digest[..10]);
    let uuid = uuid::Builder::from_unix_timestamp_millis(slot, &bytes).into_uuid();
    RunId::parse(&uuid.to_string()).map_err(|error| AppError::internal(error.to_string()))
}

/// A schedule as clients see it.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ScheduleView {
    /// Its id.
    pub id: String,
    /// Its name.
    pub name: String,
    /// Its cron expression.
    pub cron: Option<String>,
    /// The time zone of the expression.
    pub timezone: String,
    /// Its interval, seconds.
    pub interval_secs: Option<u64>,
    /// What each fire submits (a run's body), unless it starts a workflow.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub run: Option<serde_json::Value>,
    /// The workflow each fire starts (`workflow_id`, `input`), if it starts one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workflow: Option<ScheduledWorkflow>,
    /// Whether it fires.
    pub enabled: bool,
    /// `skip` or `once`.
    pub catch_up: String,
    /// `skip`, `queue` or `cancel`.
    pub overlap: String,
    /// The next fire times, Unix milliseconds (up to 5; empty when disabled or over).
    pub next_fires: Vec<u64>,
    /// When it last fired.
    pub last_fire_at: Option<u64>,
    /// The run it last submitted.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub last_run_id: Option<RunId>,
    /// When it was created, Unix milliseconds.
    pub created_at: u64,
    /// When it was last changed.
    pub updated_at: u64,
}

/// `GET /v1/schedules`.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ScheduleList {
    /// The schedules, oldest first.
    pub schedules: Vec<ScheduleView>,
}

/// When a schedule fires.
enum Timing {
    Cron(Box<Cron>, Tz),
    Interval { every_ms: u64, anchor: u64 },
}

impl Timing {
    fn of(
        cron: Option<&str>,
        timezone: &str,
        interval_secs: Option<u64>,
        anchor: u64,
    ) -> Result<Self, AppError> {
        let zone = Tz::from_str(timezone).map_err(|_| {
            AppError::bad_request(format!(
                "unknown time zone {timezone:?}: give an IANA name such as `Europe/Paris` or `UTC`"
            ))
        })?;
        match (cron, interval_secs) {
            (Some(expression), None) => {
                if expression.len() > 200 {
                    return Err(AppError::bad_request("the cron expression is too long"));
                }
                let parsed = Cron::from_str(expression).map_err(|error| {
                    AppError::bad_request(format!(
                        "invalid cron expression {expression:?}: {error}"
                    ))
                })?;
                Ok(Self::Cron(Box::new(parsed), zone))
            }
            (None, Some(secs)) if (1..=MAX_INTERVAL_SECS).contains(&secs) => Ok(Self::Interval {
                every_ms: secs * 1000,
                anchor,
            }),
            (None, Some(_)) => Err(AppError::bad_request(
                "`interval_secs` must be between 1 and 31622400 (a year)",
            )),
            _ => Err(AppError::bad_request(
                "give a `cron` expression or an `interval_secs`, one of them",
            )),
        }
    }

    /// A stored schedule's timing; an interval steps from its next slot (or, with none, from
    /// its creation), so every later slot keeps the same alignment.
    fn of_record(record: &ScheduleRecord) -> Result<Self, AppError> {
        Self::of(
            record.cron.as_deref(),
            &record.timezone,
            record.interval_secs,
            record.next_fire_at.unwrap_or(record.created_at),
        )
    }

    /// The shortest time between two of its fires, milliseconds: an interval's length, or the
    /// shortest gap between a cron expression's next [`GAPS_SAMPLED`] fires after `from`.
    fn shortest_gap(&self, from: u64) -> Option<u64> {
        if let Self::Interval { every_ms, .. } = self {
            return Some(*every_ms);
        }
        let mut at = self.next_after(from)?;
        let mut shortest: Option<u64> = None;
        for _ in 0..GAPS_SAMPLED {
            let Some(next) = self.next_after(at) else {
                break;
            };
            let gap = next.saturating_sub(at);
            shortest = Some(shortest.map_or(gap, |shortest| shortest.min(gap)));
            at = next;
        }
        shortest
    }

    /// The first slot strictly after `after` (Unix milliseconds).
    fn next_after(&self, after: u64) -> Option<u64> {
        match self {
            Self::Interval { every_ms, anchor } => {
                let steps = after.saturating_sub(*anchor) / every_ms + 1;
                Some(anchor.saturating_add(steps.saturating_mul(*every_ms)))
            }
            Self::Cron(cron, zone) => {
                let millis = i64::try_from(after).ok()?;
                let start = zone.timestamp_millis_opt(millis).single()?;
                let next = cron.find_next_occurrence(&start, false).ok()?;
                u64::try_from(next.with_timezone(&Utc).timestamp_millis()).ok()
            }
        }
    }

    /// The latest slot at or before `now`, starting from the slot `from` (itself due).
    fn latest_due(&self, from: u64, now: u64) -> u64 {
        match self {
            Self::Interval { every_ms, .. } => {
                let steps = now.saturating_sub(from) / every_ms;
                from.saturating_add(steps.saturating_mul(*every_ms))
            }
            Self::Cron(..) => {
                let mut latest = from;
                // Bounded: a second-by-second schedule down for a day stops looking here.
                for _ in 0..100_000 {
                    match self.next_after(latest) {
                        Some(next) if next <= now => latest = next,
                        _ => break,
                    }
                }
                latest
            }
        }
    }

    fn next_fires(&self, after: u64, count: usize) -> Vec<u64> {
        let mut fires = Vec::with_capacity(count);
        let mut at = after;
        while fires.len() < count {
            match self.next_after(at) {
                Some(next) => {
                    fires.push(next);
                    at = next;
                }
                None => break,
            }
        }
        fires
    }
}

fn view(record: ScheduleRecord) -> ScheduleView {
    let next_fires = match (record.enabled, record.next_fire_at) {
        (true, Some(next)) => {
            let mut fires = vec![next];
            if let Ok(timing) = Timing::of_record(&record) {
                fires.extend(timing.next_fires(next, 4));
            }
            fires
        }
        _ => Vec::new(),
    };
    ScheduleView {
        id: record.id,
        name: record.name,
        cron: record.cron,
        timezone: record.timezone,
        interval_secs: record.interval_secs,
        workflow: stored_workflow(&record.request),
        run: stored_workflow(&record.request)
            .is_none()
            .then(|| shown_run(&record.request)),
        enabled: record.enabled,
        catch_up: record.catch_up,
        overlap: record.overlap,
        next_fires,
        last_fire_at: record.last_fire_at,
        last_run_id: record.last_run_id,
        created_at: record.created_at,
        updated_at: record.updated_at,
    }
}

/// How many of a cron expression's gaps between fires are looked at for its shortest one (a
/// day of hourly fires, or every minute of one hour, say).
const GAPS_SAMPLED: usize = 64;

/// How many runs one schedule may have waiting in the queue (`overlap: "queue"`): a slot that
/// finds this many is skipped, so a schedule cannot fill the queue behind a slow run.
pub const MAX_QUEUED_FIRES: usize = 10;

fn no_schedule(id: &str) -> AppError {
    AppError::not_found(format!("no schedule {id:?}"))
}

/// The schedules: runs and workflows started on a cron or an interval.
pub struct Schedules<'a> {
    app: &'a App,
}

impl App {
    /// The schedules: runs and workflows started on a cron or an interval.
    pub fn schedules(&self) -> Schedules<'_> {
        Schedules { app: self }
    }
}

impl Schedules<'_> {
    /// Checks a schedule's settings and its run or workflow; answers what to store.
    async fn checked(
        &self,
        caller: &Principal,
        id: String,
        request: ScheduleSpec,
        anchor: u64,
    ) -> Result<NewSchedule, AppError> {
        let timezone = request.timezone.unwrap_or_else(|| "UTC".to_owned());
        let timing = Timing::of(
            request.cron.as_deref(),
            &timezone,
            request.interval_secs,
            anchor,
        )?;
        let floor = self.app.queue_settings().min_schedule_interval;
        if let Some(gap) = timing.shortest_gap(now_ms())
            && gap < millis(floor)
        {
            return Err(AppError::bad_request(format!(
                "this schedule fires every {} s; schedules fire at most every {} s on this \
                 server (`agentry serve --min-schedule-interval-secs`)",
                gap.div_ceil(1000),
                floor.as_secs()
            )));
        }
        // What each fire does, as stored, and what it starts (for the default name).
        let (stored, subject) = match (request.run, request.workflow) {
            (Some(run), None) => (self.checked_scheduled_run(caller, run).await?, None),
            (None, Some(workflow)) => {
                let definition = self.app.workflows().get(&workflow.workflow_id).await?;
                definition.check_input(&workflow.input)?;
                let subject = workflow.workflow_id.clone();
                (serde_json::json!({ "workflow": workflow }), Some(subject))
            }
            _ => {
                return Err(AppError::bad_request(
                    "a schedule fires a `run` or starts a `workflow`: give one of them",
                ));
            }
        };
        let when = match (&request.cron, request.interval_secs) {
            (Some(cron), _) => format!("{cron} ({timezone})"),
            (None, Some(secs)) => format!("every {secs} s"),
            (None, None) => "schedule".to_owned(),
        };
        let name = request.name.unwrap_or_else(|| match subject {
            Some(subject) if request.cron.is_some() => format!("{subject} at {when}"),
            Some(subject) => format!("{subject} {when}"),
            None => when,
        });
        if name.chars().count() > 100 || name.trim().is_empty() {
            return Err(AppError::bad_request(
                "a schedule's name has 1 to 100 characters",
            ));
        }
        let next_fire_at = if request.enabled {
            timing.next_after(now_ms())
        } else {
            None
        };
        Ok(NewSchedule {
            id,
            name,
            owner: caller.owner(),
            cron: request.cron,
            timezone,
            interval_secs: request.interval_secs,
            request: stored,
            enabled: request.enabled,
            catch_up: request.catch_up.as_str().to_owned(),
            overlap: request.overlap.as_str().to_owned(),
            next_fire_at,
        })
    }

    /// Rewrites the schedules an earlier release stored as their client's request alone into the
    /// stored spec beside that request, reading each request with `read` (the front-end's: it
    /// owns that format). A request `read` refuses disables its schedule, with a warning. Runs at
    /// start-up, before the worker fires anything; answers how many were rewritten.
    pub async fn upgrade(
        &self,
        read: impl Fn(&serde_json::Value) -> Result<RunSpec, AppError>,
    ) -> Result<usize, AppError> {
        let mut upgraded = 0;
        for record in self.app.parts.store.list_schedules(None).await? {
            if record.request.get("spec").is_some() || stored_workflow(&record.request).is_some() {
                continue;
            }
            let (request, enabled) = match read(&record.request) {
                Ok(spec) => (
                    serde_json::json!({"spec": spec.to_stored()?, "request": record.request}),
                    record.enabled,
                ),
                Err(error) => {
                    tracing::warn!(
                        schedule = %record.id,
                        "a schedule's stored run cannot be read, so it is disabled: {}",
                        error.message
                    );
                    (record.request.clone(), false)
                }
            };
            let schedule = NewSchedule {
                id: record.id,
                name: record.name,
                owner: record.owner,
                cron: record.cron,
                timezone: record.timezone,
                interval_secs: record.interval_secs,
                request,
                enabled,
                catch_up: record.catch_up,
                overlap: record.overlap,
                next_fire_at: record.next_fire_at.filter(|_| enabled),
            };
            self.app.parts.store.update_schedule(&schedule).await?;
            upgraded += 1;
        }
        Ok(upgraded)
    }

    /// A scheduled run's own checks, creating nothing (as an ephemeral run: approvals need a
    /// session, so they are checked when it fires); the run as stored.
    async fn checked_scheduled_run(
        &self,
        caller: &Principal,
        run: ScheduledRun,
    ) -> Result<serde_json::Value, AppError> {
        if let Some(url) = &run.spec.webhook_url {
            self.app.check_webhook(url, None).await?;
        }
        let mut dry = run.spec.clone();
        dry.approvals = None;
        dry.policy = Default::default();
        dry.webhook_url = None;
        if let crate::run_spec::SessionChoice::Existing(session) = dry.session {
            self.app.check_session_access(caller, session).await?;
            if self.app.parts.store.session(session).await?.is_none() {
                return Err(AppError::not_found(format!("no session {session}")));
            }
        }
        dry.session = crate::run_spec::SessionChoice::Ephemeral;
        crate::runs::prepare(self.app, caller, dry).await?;
        Ok(serde_json::json!({"spec": run.spec.to_stored()?, "request": run.request}))
    }

    /// Starts a workflow schedule's run for `slot` (once per slot: its id comes from the slot),
    /// after `overlap` had its say about the previous one. The run started, if any.
    async fn fire_workflow(
        &self,
        schedule: &ScheduleRecord,
        workflow: ScheduledWorkflow,
        slot: u64,
    ) -> Result<Option<RunId>, AppError> {
        // As its owner's key is now: a revoked key's schedule starts nothing.
        let owner = self
            .app
            .principal_of_owner(schedule.owner.as_deref())
            .await?;
        if let Some(previous) = schedule.last_run_id
            && let Some(run) = self
                .app
                .workflows()
                .stored_run(&previous.to_string())
                .await?
            && !run.state.is_final()
        {
            match schedule.overlap.as_str() {
                "queue" => {}
                "cancel" => self.app.workflows().cancel(&owner, &run.run_id).await?,
                _ => return Ok(None),
            }
        }
        let run_id = slot_run_id(&schedule.id, slot)?;
        match self
            .app
            .workflows()
            .start_run(
                &owner,
                &workflow.workflow_id,
                workflow.input,
                None,
                Some(run_id.to_string()),
            )
            .await
        {
            Ok(_) => Ok(Some(run_id)),
            // Started before a restart: the slot's run exists.
            Err(error) if error.failure == crate::error::Failure::Conflict => Ok(Some(run_id)),
            Err(error) => Err(error),
        }
    }

    /// Creates a schedule.
    pub async fn create(
        &self,
        caller: &Principal,
        request: ScheduleSpec,
    ) -> Result<ScheduleView, AppError> {
        let schedule = self
            .checked(caller, RunId::new().to_string(), request, now_ms())
            .await?;
        Ok(view(self.app.parts.store.create_schedule(&schedule).await?))
    }

    /// Replaces a schedule's settings (its history stays); its next fire is counted anew.
    pub async fn replace(
        &self,
        caller: &Principal,
        id: &str,
        request: ScheduleSpec,
    ) -> Result<ScheduleView, AppError> {
        let existing = self.stored(id).await?;
        let schedule = self
            .checked(caller, existing.id, request, existing.created_at)
            .await?;
        let updated = self
            .app
            .parts
            .store
            .update_schedule(&schedule)
            .await?
            .ok_or_else(|| no_schedule(id))?;
        Ok(view(updated))
    }

    async fn stored(&self, id: &str) -> Result<ScheduleRecord, AppError> {
        if id.len() > 64 {
            return Err(AppError::bad_request(
                "a schedule id has at most 64 characters",
            ));
        }
        self.app
            .parts
            .store
            .schedule(id)
            .await?
            .ok_or_else(|| no_schedule(id))
    }

    /// How many runs schedule `id` fired that still wait in the queue.
    async fn queued_fires(&self, id: &str) -> Result<u64, AppError> {
        let query = RunQuery {
            schedule_id: Some(id.to_owned()),
            state: Some(RunState::Queued),
            ..RunQuery::default()
        };
        Ok(self.app.parts.store.count_runs(&query).await?)
    }

    /// One schedule.
    pub async fn get(&self, id: &str) -> Result<ScheduleView, AppError> {
        Ok(view(self.stored(id).await?))
    }

    /// Every schedule, oldest first.
    pub async fn list(&self) -> Result<ScheduleList, AppError> {
        let records = self.app.parts.store.list_schedules(None).await?;
        Ok(ScheduleList {
            schedules: records.into_iter().map(view).collect(),
        })
    }

    /// Deletes a schedule (the runs it fired stay).
    pub async fn delete(&self, id: &str) -> Result<(), AppError> {
        if !self.app.parts.store.delete_schedule(id).await? {
            return Err(no_schedule(id));
        }
        Ok(())
    }

    /// The runs a schedule fired, newest first.
    pub async fn runs(&self, id: &str, limit: usize) -> Result<RunList, AppError> {
        let schedule = self.stored(id).await?;
        self.app
            .background_runs()
            .list(&RunQuery {
                schedule_id: Some(schedule.id),
                limit,
                ..RunQuery::default()
            })
            .await
    }

    /// Fires every schedule due now (see the module's documentation). Failures are logged; a
    /// schedule whose run cannot be submitted moves on to its next slot.
    pub async fn fire_due(&self) {
        let now = now_ms();
        let due = match self.app.parts.store.due_schedules(now).await {
            Ok(due) => due,
            Err(error) => {
                tracing::warn!("reading due schedules failed: {error}");
                return;
            }
        };
        for schedule in due {
            if let Err(error) = self.fire(&schedule, now).await {
                tracing::warn!(schedule = %schedule.id, "a schedule could not fire: {}", error.message);
            }
        }
    }

    async fn fire(&self, schedule: &ScheduleRecord, now: u64) -> Result<(), AppError> {
        let Some(slot) = schedule.next_fire_at else {
            return Ok(());
        };
        let timing = Timing::of_record(schedule)?;
        let latest = timing.latest_due(slot, now);
        let on_time = now.saturating_sub(latest) <= ON_TIME;
        let fire = on_time || schedule.catch_up == CatchUp::Once.as_str();
        if let Some(workflow) = stored_workflow(&schedule.request) {
            let fired = if fire {
                match self.fire_workflow(schedule, workflow, latest).await {
                    Ok(fired) => fired,
                    Err(error) => {
                        tracing::warn!(
                            schedule = %schedule.id,
                            "a scheduled workflow was refused: {}",
                            error.message
                        );
                        None
                    }
                }
            } else {
                None
            };
            let next = timing.next_after(latest.max(now));
            self.app
                .parts
                .store
                .advance_schedule(&schedule.id, slot, next, fired)
                .await?;
            return Ok(());
        }
        let mut fire = fire;
        if fire
            && let Some(previous) = schedule.last_run_id
            && let Some(record) = self.app.parts.store.run_record(previous).await?
            && matches!(record.state, RunState::Queued | RunState::Running)
        {
            match schedule.overlap.as_str() {
                "queue" => {}
                "cancel" => {
                    self.app.background_runs().cancel(previous).await?;
                }
                _ => fire = false,
            }
        }
        // However they overlap, a schedule's runs never pile up in the queue past a bound.
        if fire && self.queued_fires(&schedule.id).await? >= MAX_QUEUED_FIRES as u64 {
            tracing::warn!(
                schedule = %schedule.id,
                "a slot is skipped: {MAX_QUEUED_FIRES} of the schedule's runs wait in the queue"
            );
            fire = false;
        }
        let mut fired = None;
        if fire {
            let key = format!("schedule:{}:{latest}", schedule.id);
            // Submitted as its owner's key allows now: a key revoked or narrowed since the
            // schedule was made does not fire what it may no longer run.
            let submitted = match self.app.principal_of_owner(schedule.owner.as_deref()).await {
                Ok(owner) => {
                    let spec = scheduled_spec(&schedule.request)?;
                    self.app
                        .submit_queued(&owner, spec, Some(key), 0, Some(schedule.id.clone()))
                        .await
                }
                Err(error) => Err(error),
            };
            match submitted {
                Ok((run, _)) => fired = Some(run.run_id),
                Err(error) => tracing::warn!(
                    schedule = %schedule.id,
                    "a scheduled run was refused: {}",
                    error.message
                ),
            }
        }
        let next = timing.next_after(latest.max(now));
        self.app
            .parts
            .store
            .advance_schedule(&schedule.id, slot, next, fired)
            .await?;
        Ok(())
    }
}
