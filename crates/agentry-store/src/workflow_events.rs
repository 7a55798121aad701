//! The step events of workflow runs: appended in batches under the next sequence numbers (a
//! number taken already refuses the whole batch, so two drivers of one run cannot interleave),
//! read back after a snapshot's number.

use crate::StoreError;
use crate::db::{RowExt, from_db, in_write_tx, to_db, with_reader};
use crate::model::now_millis;
use crate::store::{Store, from_json_text, to_json_text};

impl Store {
    /// Appends `events` to workflow run `run_id` as numbers `first`, `first + 1`, … in one
    /// transaction. [`StoreError::Conflict`] when one of the numbers is taken (another driver
    /// appended first); nothing is written then.
    pub async fn append_workflow_events(
        &self,
        run_id: &str,
        first: u64,
        events: &[serde_json::Value],
    ) -> Result<(), StoreError> {
        self.append_workflow_events_and_snapshot(run_id, first, events, None)
            .await
    }

    /// Appends `events` as [`Store::append_workflow_events`] does and, in the same transaction,
    /// stores `snapshot` as the run's document (configuration kind `workflow_run`, named by the
    /// run's id): a driver whose events are refused writes no document either, so the snapshot
    /// is fenced by the same numbering.
    pub async fn append_workflow_events_and_snapshot(
        &self,
        run_id: &str,
        first: u64,
        events: &[serde_json::Value],
        snapshot: Option<&serde_json::Value>,
    ) -> Result<(), StoreError> {
        let texts = events
            .iter()
            .map(to_json_text)
            .collect::<Result<Vec<_>, _>>()?;
        let snapshot = snapshot.map(to_json_text).transpose()?;
        if snapshot.is_some() {
            crate::model::validate_name("configuration", run_id)?;
        }
        let now = to_db(now_millis());
        in_write_tx!(self, |tx, d| {
            for (offset, text) in texts.iter().enumerate() {
                let seq = first + offset as u64;
                let inserted = sqlx::query(
                    "INSERT INTO workflow_events (run_id, seq, at, event) \
                     VALUES ($1, $2, $3, $4) ON CONFLICT (run_id, seq) DO NOTHING",
                )
                .bind(run_id)
                .bind(to_db(seq))
                .bind(now)
                .bind(text)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                if inserted == 0 {
                    // Returning drops the transaction: the batch's earlier rows roll back.
                    return Err(StoreError::Conflict(format!(
                        "workflow run {run_id}: event {seq} was appended by another driver"
                    )));
                }
            }
            if let Some(snapshot) = &snapshot {
                sqlx::query(crate::config::PUT_CONFIG_SQL)
                    .bind(crate::ConfigKind::WorkflowRun.as_str())
                    .bind(run_id)
                    .bind(snapshot)
                    .bind(now)
                    .execute(&mut *tx)
                    .await?;
            }
        });
        Ok(())
    }

    /// The events of workflow run `run_id` numbered after `after`, in order, with their numbers.
    pub async fn workflow_events(
        &self,
        run_id: &str,
        after: u64,
    ) -> Result<Vec<(u64, serde_json::Value)>, StoreError> {
        with_reader!(self, |pool, d| {
            let rows = sqlx::query(
                "SELECT seq, event FROM workflow_events WHERE run_id = $1 AND seq > $2 \
                 ORDER BY seq",
            )
            .bind(run_id)
            .bind(to_db(after))
            .fetch_all(pool)
            .await?;
            rows.iter()
                .map(|row| {
                    Ok((
                        from_db(row.int("seq")?),
                        from_json_text(&row.text("event")?)?,
                    ))
                })
                .collect::<Result<Vec<_>, StoreError>>()
        })
    }
}
