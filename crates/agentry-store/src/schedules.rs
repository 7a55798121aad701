//! Schedules: when to submit a run (a cron expression in a time zone, or an interval) and what
//! to submit. The store keeps each schedule's next fire time; the app computes it. Moving a
//! schedule past a fire ([`Store::advance_schedule`]) is conditional on the fire time it saw, so
//! of several processes that find one slot due, one advances it; the run each submits carries
//! the slot in its idempotency key, so even a race submits it once.

use agentry_types::RunId;

use crate::StoreError;
use crate::db::{RowExt, from_db, to_db, with_reader, with_writer};
use crate::model::now_millis;
use crate::store::{Store, from_json_text, to_json_text};

/// A schedule to create, or a schedule's new settings.
#[derive(Debug, Clone, PartialEq)]
pub struct NewSchedule {
    /// Its id.
    pub id: String,
    /// A name for people.
    pub name: String,
    /// The API key that created it.
    pub owner: Option<String>,
    /// A cron expression (with `timezone`), or `None` for an interval.
    pub cron: Option<String>,
    /// The IANA time zone the cron expression is read in.
    pub timezone: String,
    /// Seconds between fires, or `None` for a cron expression.
    pub interval_secs: Option<u64>,
    /// What each fire submits.
    pub request: serde_json::Value,
    /// Whether it fires.
    pub enabled: bool,
    /// `skip` or `once`.
    pub catch_up: String,
    /// `skip`, `queue` or `cancel`.
    pub overlap: String,
    /// When it fires next, Unix milliseconds (`None`: never, or disabled).
    pub next_fire_at: Option<u64>,
}

/// A stored schedule.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleRecord {
    /// Its id.
    pub id: String,
    /// A name for people.
    pub name: String,
    /// The API key that created it.
    pub owner: Option<String>,
    /// Its cron expression.
    pub cron: Option<String>,
    /// The time zone of the cron expression.
    pub timezone: String,
    /// Its interval, seconds.
    pub interval_secs: Option<u64>,
    /// What each fire submits.
    pub request: serde_json::Value,
    /// Whether it fires.
    pub enabled: bool,
    /// `skip` or `once`.
    pub catch_up: String,
    /// `skip`, `queue` or `cancel`.
    pub overlap: String,
    /// When it fires next, Unix milliseconds.
    pub next_fire_at: Option<u64>,
    /// When it last fired.
    pub last_fire_at: Option<u64>,
    /// The run it last submitted.
    pub last_run_id: Option<RunId>,
    /// When it was created.
    pub created_at: u64,
    /// When it was last changed.
    pub updated_at: u64,
}

macro_rules! schedule_columns {
    () => {
        "id, name, owner, cron, timezone, interval_secs, request, enabled, catch_up, overlap, \
         next_fire_at, last_fire_at, last_run_id, created_at, updated_at"
    };
}

fn schedule_from_row(row: &impl RowExt) -> Result<ScheduleRecord, StoreError> {
    Ok(ScheduleRecord {
        id: row.text("id")?,
        name: row.text("name")?,
        owner: row.opt_text("owner")?,
        cron: row.opt_text("cron")?,
        timezone: row.text("timezone")?,
        interval_secs: row.opt_int("interval_secs")?.map(from_db),
        request: from_json_text(&row.text("request")?)?,
        enabled: row.int("enabled")? != 0,
        catch_up: row.text("catch_up")?,
        overlap: row.text("overlap")?,
        next_fire_at: row.opt_int("next_fire_at")?.map(from_db),
        last_fire_at: row.opt_int("last_fire_at")?.map(from_db),
        last_run_id: row
            .opt_text("last_run_id")?
            .map(|id| RunId::parse(&id).map_err(|e| StoreError::Corrupt(e.to_string())))
            .transpose()?,
        created_at: from_db(row.int("created_at")?),
        updated_at: from_db(row.int("updated_at")?),
    })
}

fn check(schedule: &NewSchedule) -> Result<(), StoreError> {
    if schedule.cron.is_some() == schedule.interval_secs.is_some() {
        return Err(StoreError::InvalidInput(
            "a schedule has a cron expression or an interval, not both".into(),
        ));
    }
    Ok(())
}

impl Store {
    /// Stores a new schedule.
    pub async fn create_schedule(
        &self,
        schedule: &NewSchedule,
    ) -> Result<ScheduleRecord, StoreError> {
        check(schedule)?;
        let request = to_json_text(&schedule.request)?;
        let now = to_db(now_millis());
        with_writer!(self, |pool, d| {
            let row = sqlx::query(concat!(
                "INSERT INTO schedules (id, name, owner, cron, timezone, interval_secs, request, \
                 enabled, catch_up, overlap, next_fire_at, created_at, updated_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $12) RETURNING ",
                schedule_columns!()
            ))
            .bind(&schedule.id)
            .bind(&schedule.name)
            .bind(schedule.owner.as_deref())
            .bind(schedule.cron.as_deref())
            .bind(&schedule.timezone)
            .bind(schedule.interval_secs.map(to_db))
            .bind(&request)
            .bind(i64::from(schedule.enabled))
            .bind(&schedule.catch_up)
            .bind(&schedule.overlap)
            .bind(schedule.next_fire_at.map(to_db))
            .bind(now)
            .fetch_one(pool)
            .await?;
            schedule_from_row(&row)
        })
    }

    /// Replaces a schedule's settings (its history stays). `None` when there is no such
    /// schedule.
    pub async fn update_schedule(
        &self,
        schedule: &NewSchedule,
    ) -> Result<Option<ScheduleRecord>, StoreError> {
        check(schedule)?;
        let request = to_json_text(&schedule.request)?;
        let now = to_db(now_millis());
        with_writer!(self, |pool, d| {
            let row = sqlx::query(concat!(
                "UPDATE schedules SET name = $2, cron = $3, timezone = $4, interval_secs = $5, \
                 request = $6, enabled = $7, catch_up = $8, overlap = $9, next_fire_at = $10, \
                 updated_at = $11 WHERE id = $1 RETURNING ",
                schedule_columns!()
            ))
            .bind(&schedule.id)
            .bind(&schedule.name)
            .bind(schedule.cron.as_deref())
            .bind(&schedule.timezone)
            .bind(schedule.interval_secs.map(to_db))
            .bind(&request)
            .bind(i64::from(schedule.enabled))
            .bind(&schedule.catch_up)
            .bind(&schedule.overlap)
            .bind(schedule.next_fire_at.map(to_db))
            .bind(now)
            .fetch_optional(pool)
            .await?;
            row.as_ref().map(schedule_from_row).transpose()
        })
    }

    /// One schedule.
    pub async fn schedule(&self, id: &str) -> Result<Option<ScheduleRecord>, StoreError> {
        with_reader!(self, |pool, d| {
            let row = sqlx::query(concat!(
                "SELECT ",
                schedule_columns!(),
                " FROM schedules WHERE id = $1"
            ))
            .bind(id)
            .fetch_optional(pool)
            .await?;
            row.as_ref().map(schedule_from_row).transpose()
        })
    }

    /// Every schedule (`owner`: only that key's), oldest first.
    pub async fn list_schedules(
        &self,
        owner: Option<&str>,
    ) -> Result<Vec<ScheduleRecord>, StoreError> {
        with_reader!(self, |pool, d| {
            let rows = sqlx::query(concat!(
                "SELECT ",
                schedule_columns!(),
                " FROM schedules WHERE ($1 IS NULL OR owner = $1) ORDER BY created_at, id"
            ))
            .bind(owner)
            .fetch_all(pool)
            .await?;
            rows.iter().map(schedule_from_row).collect()
        })
    }

    /// Deletes a schedule (the runs it fired stay). `false` when there was none.
    pub async fn delete_schedule(&self, id: &str) -> Result<bool, StoreError> {
        let deleted = with_writer!(self, |pool, d| {
            sqlx::query("DELETE FROM schedules WHERE id = $1")
                .bind(id)
                .execute(pool)
                .await?
                .rows_affected()
        });
        Ok(deleted > 0)
    }

    /// The enabled schedules whose next fire time is at or before `now`, most overdue first.
    pub async fn due_schedules(&self, now: u64) -> Result<Vec<ScheduleRecord>, StoreError> {
        with_reader!(self, |pool, d| {
            let rows = sqlx::query(concat!(
                "SELECT ",
                schedule_columns!(),
                " FROM schedules WHERE enabled = 1 AND next_fire_at IS NOT NULL \
                 AND next_fire_at <= $1 ORDER BY next_fire_at, id LIMIT 100"
            ))
            .bind(to_db(now))
            .fetch_all(pool)
            .await?;
            rows.iter().map(schedule_from_row).collect()
        })
    }

    /// Moves a schedule past the fire at `expected` to `next` (`None`: it never fires again),
    /// recording the run it submitted (if any). Conditional on `next_fire_at` still being
    /// `expected`: `false` when another process moved it first.
    pub async fn advance_schedule(
        &self,
        id: &str,
        expected: u64,
        next: Option<u64>,
        fired: Option<RunId>,
    ) -> Result<bool, StoreError> {
        let now = to_db(now_millis());
        let advanced = with_writer!(self, |pool, d| {
            sqlx::query(
                "UPDATE schedules SET next_fire_at = $3, \
                 last_fire_at = CASE WHEN $4 IS NULL THEN last_fire_at ELSE $5 END, \
                 last_run_id = COALESCE($4, last_run_id) \
                 WHERE id = $1 AND next_fire_at = $2",
            )
            .bind(id)
            .bind(to_db(expected))
            .bind(next.map(to_db))
            .bind(fired.map(|run| run.to_string()))
            .bind(now)
            .execute(pool)
            .await?
            .rows_affected()
        });
        Ok(advanced > 0)
    }
}
