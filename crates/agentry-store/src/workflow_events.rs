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
        let texts = events
            .iter()
            .map(to_json_text)
            .collect::<Result<Vec<_>, _>>()?;
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
