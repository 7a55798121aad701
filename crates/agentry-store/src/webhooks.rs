//! The webhook outbox: one delivery per run (a run's or a workflow run's id), event and URL,
//! with one id for good; due
//! deliveries are claimed (held for a while, so two processes never send one at once) and every
//! attempt is logged with its outcome.

use crate::StoreError;
use crate::db::{Dialect, RowExt, from_db, in_write_tx, to_db, with_reader, with_writer};
use crate::model::now_millis;
use crate::store::{Store, from_json_text, to_json_text};

/// A delivery as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryRecord {
    /// Its id: the `webhook-id` every attempt sends.
    pub id: String,
    /// The run it tells of: a run's id, or a workflow run's.
    pub run_id: String,
    /// What happened (`run.succeeded`, …).
    pub event: String,
    /// Where it goes.
    pub url: String,
    /// The body it sends.
    pub payload: serde_json::Value,
    /// `pending`, `delivered` or `failed`.
    pub state: String,
    /// Attempts made.
    pub attempts: u32,
    /// When the next attempt is due, Unix milliseconds.
    pub next_attempt_at: u64,
    /// The HTTP status of the last attempt, if it got one.
    pub last_status: Option<u16>,
    /// Why the last attempt failed.
    pub last_error: Option<String>,
    /// When it was created.
    pub created_at: u64,
    /// When it was delivered.
    pub delivered_at: Option<u64>,
}

/// One attempt of a delivery.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptRecord {
    /// 1, 2, 3…
    pub attempt: u32,
    /// When it was made, Unix milliseconds.
    pub at: u64,
    /// The HTTP status the receiver answered.
    pub status: Option<u16>,
    /// Why it failed.
    pub error: Option<String>,
    /// How long it took.
    pub duration_ms: u64,
}

/// What became of an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// The receiver took it.
    Delivered,
    /// Try again at this time (Unix milliseconds).
    RetryAt(u64),
    /// Give up.
    GaveUp,
}

macro_rules! delivery_columns {
    () => {
        "id, run_id, event, url, payload, state, attempts, next_attempt_at, last_status, \
         last_error, created_at, delivered_at"
    };
}

fn delivery_from_row(row: &impl RowExt) -> Result<DeliveryRecord, StoreError> {
    Ok(DeliveryRecord {
        id: row.text("id")?,
        run_id: row.text("run_id")?,
        event: row.text("event")?,
        url: row.text("url")?,
        payload: from_json_text(&row.text("payload")?)?,
        state: row.text("state")?,
        attempts: u32::try_from(row.int("attempts")?).unwrap_or(u32::MAX),
        next_attempt_at: from_db(row.int("next_attempt_at")?),
        last_status: row
            .opt_int("last_status")?
            .and_then(|status| u16::try_from(status).ok()),
        last_error: row.opt_text("last_error")?,
        created_at: from_db(row.int("created_at")?),
        delivered_at: row.opt_int("delivered_at")?.map(from_db),
    })
}

impl Dialect {
    fn claim_deliveries_sql(self) -> &'static str {
        match self {
            Self::Sqlite => concat!(
                "UPDATE webhook_deliveries SET next_attempt_at = $1 WHERE id IN \
                 (SELECT id FROM webhook_deliveries WHERE state = 'pending' \
                 AND next_attempt_at <= $2 ORDER BY next_attempt_at, id LIMIT CAST($3 AS BIGINT)) RETURNING ",
                delivery_columns!()
            ),
            Self::Postgres => concat!(
                "UPDATE webhook_deliveries SET next_attempt_at = $1 WHERE id IN \
                 (SELECT id FROM webhook_deliveries WHERE state = 'pending' \
                 AND next_attempt_at <= $2 ORDER BY next_attempt_at, id LIMIT CAST($3 AS BIGINT) \
                 FOR UPDATE SKIP LOCKED) RETURNING ",
                delivery_columns!()
            ),
        }
    }
}

impl Store {
    /// Adds a delivery to the outbox, due now, unless the run already has one for this event
    /// and URL: `false` then, and nothing changes (its id stays the first one's).
    pub async fn enqueue_delivery(
        &self,
        id: &str,
        run_id: &str,
        event: &str,
        url: &str,
        payload: &serde_json::Value,
    ) -> Result<bool, StoreError> {
        let payload = to_json_text(payload)?;
        let now = to_db(now_millis());
        let inserted = with_writer!(self, |pool, d| {
            sqlx::query(
                "INSERT INTO webhook_deliveries (id, run_id, event, url, payload, \
                 next_attempt_at, created_at) VALUES ($1, $2, $3, $4, $5, $6, $6) \
                 ON CONFLICT (run_id, event, url) DO NOTHING",
            )
            .bind(id)
            .bind(run_id)
            .bind(event)
            .bind(url)
            .bind(&payload)
            .bind(now)
            .execute(pool)
            .await?
            .rows_affected()
        });
        Ok(inserted > 0)
    }

    /// Claims up to `limit` due deliveries, holding each for `hold_ms` (another process skips
    /// it meanwhile; if this one dies, it is due again after that).
    pub async fn claim_deliveries(
        &self,
        limit: usize,
        hold_ms: u64,
    ) -> Result<Vec<DeliveryRecord>, StoreError> {
        let now = now_millis();
        // Most looks find nothing: a read says so without taking the write lock.
        let due = with_reader!(self, |pool, d| {
            sqlx::query(
                "SELECT 1 AS found FROM webhook_deliveries WHERE state = 'pending' \
                 AND next_attempt_at <= $1 LIMIT 1",
            )
            .bind(to_db(now))
            .fetch_optional(pool)
            .await?
            .is_some()
        });
        if !due {
            return Ok(Vec::new());
        }
        in_write_tx!(self, |tx, d| {
            let rows = sqlx::query(d.claim_deliveries_sql())
                .bind(to_db(now.saturating_add(hold_ms)))
                .bind(to_db(now))
                .bind(to_db(limit as u64))
                .fetch_all(&mut *tx)
                .await?;
            rows.iter()
                .map(delivery_from_row)
                .collect::<Result<Vec<_>, StoreError>>()
        })
    }

    /// Logs an attempt and moves the delivery on: delivered, due again later, or given up.
    pub async fn record_attempt(
        &self,
        delivery: &str,
        attempt: &AttemptRecord,
        outcome: AttemptOutcome,
    ) -> Result<(), StoreError> {
        let (state, next, delivered) = match outcome {
            AttemptOutcome::Delivered => ("delivered", attempt.at, Some(attempt.at)),
            AttemptOutcome::RetryAt(at) => ("pending", at, None),
            AttemptOutcome::GaveUp => ("failed", attempt.at, None),
        };
        in_write_tx!(self, |tx, d| {
            sqlx::query(
                "INSERT INTO webhook_attempts (delivery_id, attempt, at, status, error, \
                 duration_ms) VALUES ($1, $2, $3, $4, $5, $6) \
                 ON CONFLICT (delivery_id, attempt) DO NOTHING",
            )
            .bind(delivery)
            .bind(i64::from(attempt.attempt))
            .bind(to_db(attempt.at))
            .bind(attempt.status.map(i64::from))
            .bind(attempt.error.as_deref())
            .bind(to_db(attempt.duration_ms))
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "UPDATE webhook_deliveries SET state = $2, attempts = $3, next_attempt_at = $4, \
                 last_status = $5, last_error = $6, delivered_at = $7 WHERE id = $1",
            )
            .bind(delivery)
            .bind(state)
            .bind(i64::from(attempt.attempt))
            .bind(to_db(next))
            .bind(attempt.status.map(i64::from))
            .bind(attempt.error.as_deref())
            .bind(delivered.map(to_db))
            .execute(&mut *tx)
            .await?;
            Ok::<(), StoreError>(())
        })
    }

    /// A run's deliveries, oldest first, each with its attempts.
    pub async fn deliveries_of_run(
        &self,
        run_id: &str,
    ) -> Result<Vec<(DeliveryRecord, Vec<AttemptRecord>)>, StoreError> {
        with_reader!(self, |pool, d| {
            let rows = sqlx::query(concat!(
                "SELECT ",
                delivery_columns!(),
                " FROM webhook_deliveries WHERE run_id = $1 ORDER BY created_at, id"
            ))
            .bind(run_id)
            .fetch_all(pool)
            .await?;
            let mut deliveries = Vec::with_capacity(rows.len());
            for row in &rows {
                let delivery = delivery_from_row(row)?;
                let attempts = sqlx::query(
                    "SELECT attempt, at, status, error, duration_ms FROM webhook_attempts \
                     WHERE delivery_id = $1 ORDER BY attempt",
                )
                .bind(&delivery.id)
                .fetch_all(pool)
                .await?
                .iter()
                .map(|row| {
                    Ok(AttemptRecord {
                        attempt: u32::try_from(row.int("attempt")?).unwrap_or(u32::MAX),
                        at: from_db(row.int("at")?),
                        status: row
                            .opt_int("status")?
                            .and_then(|status| u16::try_from(status).ok()),
                        error: row.opt_text("error")?,
                        duration_ms: from_db(row.int("duration_ms")?),
                    })
                })
                .collect::<Result<Vec<_>, StoreError>>()?;
                deliveries.push((delivery, attempts));
            }
            Ok(deliveries)
        })
    }
}
