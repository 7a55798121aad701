//! The usage ledger: what each model call used and cost, for reports and budgets.
//!
//! An event appended with a [`UsageEntry`] ([`NewEvent::with_usage`](crate::NewEvent::with_usage))
//! writes one row of `usage_records` in the same transaction as the event, keyed by the event's
//! session and seq: the ledger holds exactly the calls the log holds. The row keeps the run,
//! its agent, the session's owner (the API key it is charged to), the model, the token counts
//! and the cost in billionths of a dollar (none when the model had no price); it outlives the
//! session. A run without a session records its calls with [`Store::record_run_usage`], charged
//! to the key that started it. [`Store::usage_report`] sums both over a time range grouped by up
//! to three dimensions; [`Store::spent`] is what a budget compares against.

use serde::{Deserialize, Serialize};

use agentry_types::{RunId, SessionId, Usage};

use crate::StoreError;
use crate::db::{RowExt, from_db, to_db, with_reader, with_writer};
use crate::store::Store;

/// The most groups one report returns.
pub const MAX_USAGE_GROUPS: usize = 10_000;

/// One model call's usage, recorded with its event.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageEntry {
    /// The run that made the call.
    pub run_id: RunId,
    /// The saved agent the run runs as.
    pub agent_id: Option<String>,
    /// The model called (its id in the catalogue).
    pub model: String,
    /// The tokens.
    pub usage: Usage,
    /// What it cost in dollars; `None` when the model had no price.
    pub cost_usd: Option<f64>,
}

/// Dollars as billionths (the ledger's integer unit); negative and non-finite amounts are 0.
pub(crate) fn nanos_of(usd: f64) -> i64 {
    if usd.is_finite() && usd > 0.0 {
        (usd * 1e9).round().min(i64::MAX as f64) as i64
    } else {
        0
    }
}

/// What a usage report groups by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UsageDimension {
    /// The saved agent (none: runs without one).
    Agent,
    /// The model called.
    Model,
    /// The session.
    Session,
    /// The API key charged (none: the operator).
    Key,
    /// The UTC day, `YYYY-MM-DD`.
    Day,
}

impl UsageDimension {
    /// Every dimension.
    pub const ALL: [Self; 5] = [
        Self::Agent,
        Self::Model,
        Self::Session,
        Self::Key,
        Self::Day,
    ];

    /// Its name in queries and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Agent => "agent",
            Self::Model => "model",
            Self::Session => "session",
            Self::Key => "key",
            Self::Day => "day",
        }
    }

    /// The dimension a name names.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.as_str() == name)
    }

    /// The column (or expression) it groups by: fixed text, never from input.
    fn column(self) -> &'static str {
        match self {
            Self::Agent => "agent_id",
            Self::Model => "model",
            Self::Session => "session_id",
            Self::Key => "owner",
            Self::Day => "(created_at / 86400000)",
        }
    }
}

/// A usage report to compute.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct UsageQuery {
    /// From this time on, Unix milliseconds (inclusive).
    pub from: u64,
    /// Up to this time, Unix milliseconds (exclusive).
    pub to: u64,
    /// The dimensions to group by, in order (none: one total).
    pub group_by: Vec<UsageDimension>,
    /// Only this agent's calls.
    pub agent: Option<String>,
    /// Only this model's calls.
    pub model: Option<String>,
    /// Only this session's calls.
    pub session: Option<SessionId>,
    /// Only the calls charged to this API key (`Some(None)`: the operator's).
    pub key: Option<Option<String>>,
}

/// One group of a usage report.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct UsageGroup {
    /// The group's value of each dimension, in the query's order (`None`: no agent, or the
    /// operator).
    pub key: Vec<Option<String>>,
    /// Distinct runs.
    pub runs: u64,
    /// Model calls.
    pub calls: u64,
    /// Tokens, summed.
    pub usage: Usage,
    /// Dollars, summed over the calls that had a price.
    pub cost_usd: f64,
    /// Calls whose model had no price (their cost is not in `cost_usd`).
    pub unpriced_calls: u64,
}

/// Whose spending a budget counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpendScope<'a> {
    /// Every run of a saved agent.
    Agent(&'a str),
    /// Every run charged to an API key.
    Key(&'a str),
}

/// `YYYY-MM-DD` of UTC day `day` (days since the Unix epoch).
fn day_text(day: i64) -> String {
    // Howard Hinnant's days-to-civil.
    let z = day + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

impl Store {
    /// Records one model call (`round`) of a run without a session, charged to `owner` (the API
    /// key that started it; `None`: the operator). Recording a round twice keeps the first.
    pub async fn record_run_usage(
        &self,
        owner: Option<&str>,
        round: u32,
        entry: &UsageEntry,
        at: u64,
    ) -> Result<(), StoreError> {
        let sql = match self.backend() {
            crate::Backend::Sqlite => {
                "INSERT OR IGNORE INTO run_usage (run_id, round, agent_id, owner, model, \
                 input_tokens, cached_input_tokens, cache_creation_input_tokens, output_tokens, \
                 reasoning_tokens, cost_nanos, created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
            }
            crate::Backend::Postgres => {
                "INSERT INTO run_usage (run_id, round, agent_id, owner, model, input_tokens, \
                 cached_input_tokens, cache_creation_input_tokens, output_tokens, \
                 reasoning_tokens, cost_nanos, created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) \
                 ON CONFLICT (run_id, round) DO NOTHING"
            }
        };
        let usage = &entry.usage;
        with_writer!(self, |pool, d| {
            sqlx::query(sql)
                .bind(entry.run_id.to_string())
                .bind(i64::from(round))
                .bind(entry.agent_id.clone())
                .bind(owner.map(str::to_owned))
                .bind(entry.model.clone())
                .bind(to_db(usage.input_tokens))
                .bind(to_db(usage.cached_input_tokens))
                .bind(to_db(usage.cache_creation_input_tokens))
                .bind(to_db(usage.output_tokens))
                .bind(to_db(usage.reasoning_tokens))
                .bind(entry.cost_usd.map(nanos_of))
                .bind(to_db(at))
                .execute(pool)
                .await?;
        });
        Ok(())
    }

    /// Sums the usage ledger over `query`'s time range, grouped by its dimensions (ordered by
    /// them; at most [`MAX_USAGE_GROUPS`] groups).
    pub async fn usage_report(&self, query: &UsageQuery) -> Result<Vec<UsageGroup>, StoreError> {
        if query.from > query.to {
            return Err(StoreError::InvalidInput(
                "the report's range ends before it starts".into(),
            ));
        }
        let mut dims: Vec<UsageDimension> = Vec::new();
        for dim in &query.group_by {
            if dims.contains(dim) {
                return Err(StoreError::InvalidInput(format!(
                    "`{}` is grouped by twice",
                    dim.as_str()
                )));
            }
            dims.push(*dim);
        }
        let columns: Vec<String> = dims
            .iter()
            .enumerate()
            .map(|(index, dim)| format!("{} AS g{index}", dim.column()))
            .collect();
        let mut filters = vec!["created_at >= $1".to_owned(), "created_at < $2".to_owned()];
        let mut binds: Vec<Option<String>> = Vec::new();
        let mut filter = |column: &str, value: Option<&str>| {
            let index = binds.len() + 3;
            match value {
                Some(value) => {
                    filters.push(format!("{column} = ${index}"));
                    binds.push(Some(value.to_owned()));
                }
                None => filters.push(format!("{column} IS NULL")),
            }
        };
        if let Some(agent) = &query.agent {
            filter("agent_id", Some(agent));
        }
        if let Some(model) = &query.model {
            filter("model", Some(model));
        }
        let session = query.session.map(|s| s.to_string());
        if let Some(session) = &session {
            filter("session_id", Some(session));
        }
        if let Some(key) = &query.key {
            filter("owner", key.as_deref());
        }
        let mut sql = String::from("SELECT ");
        for column in &columns {
            sql.push_str(column);
            sql.push_str(", ");
        }
        sql.push_str(
            "COUNT(DISTINCT run_id) AS runs, COUNT(*) AS calls, \
             CAST(SUM(input_tokens) AS BIGINT) AS input_tokens, \
             CAST(SUM(cached_input_tokens) AS BIGINT) AS cached_input_tokens, \
             CAST(SUM(cache_creation_input_tokens) AS BIGINT) AS cache_creation_input_tokens, \
             CAST(SUM(output_tokens) AS BIGINT) AS output_tokens, \
             CAST(SUM(reasoning_tokens) AS BIGINT) AS reasoning_tokens, \
             CAST(COALESCE(SUM(cost_nanos), 0) AS BIGINT) AS cost_nanos, \
             CAST(SUM(CASE WHEN cost_nanos IS NULL THEN 1 ELSE 0 END) AS BIGINT) AS unpriced \
             FROM usage_ledger WHERE ",
        );
        sql.push_str(&filters.join(" AND "));
        if !dims.is_empty() {
            let positions: Vec<String> = (1..=dims.len()).map(|p| p.to_string()).collect();
            sql.push_str(" GROUP BY ");
            sql.push_str(&positions.join(", "));
            sql.push_str(" ORDER BY ");
            sql.push_str(&positions.join(", "));
        } else {
            sql.push_str(" HAVING COUNT(*) > 0");
        }
        sql.push_str(&format!(" LIMIT {MAX_USAGE_GROUPS}"));
        let mut rows = with_reader!(self, |pool, d| {
            // Only fixed column names and numbered placeholders are spelled into the text.
            let mut statement = sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
                .bind(to_db(query.from))
                .bind(to_db(query.to));
            for value in &binds {
                statement = statement.bind(value.clone());
            }
            let mut groups = Vec::new();
            for row in statement.fetch_all(pool).await? {
                let mut key = Vec::with_capacity(dims.len());
                for (index, dim) in dims.iter().enumerate() {
                    let column = format!("g{index}");
                    key.push(match dim {
                        UsageDimension::Day => row.opt_int(&column)?.map(day_text),
                        _ => row.opt_text(&column)?,
                    });
                }
                let count = |column: &str| -> Result<u64, StoreError> {
                    Ok(from_db(row.opt_int(column)?.unwrap_or(0)))
                };
                groups.push(UsageGroup {
                    key,
                    runs: count("runs")?,
                    calls: count("calls")?,
                    usage: Usage {
                        input_tokens: count("input_tokens")?,
                        output_tokens: count("output_tokens")?,
                        cached_input_tokens: count("cached_input_tokens")?,
                        cache_creation_input_tokens: count("cache_creation_input_tokens")?,
                        reasoning_tokens: count("reasoning_tokens")?,
                    },
                    cost_usd: count("cost_nanos")? as f64 / 1e9,
                    unpriced_calls: count("unpriced")?,
                });
            }
            groups
        });
        // The same order on both backends (they place NULLs differently): none first.
        rows.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(rows)
    }

    /// Dollars spent by `scope` from `since` (Unix milliseconds) on.
    pub async fn spent(&self, scope: SpendScope<'_>, since: u64) -> Result<f64, StoreError> {
        let (sql, value) = match scope {
            SpendScope::Agent(agent) => (
                "SELECT CAST(COALESCE(SUM(cost_nanos), 0) AS BIGINT) AS spent \
                 FROM usage_ledger WHERE agent_id = $1 AND created_at >= $2",
                agent,
            ),
            SpendScope::Key(key) => (
                "SELECT CAST(COALESCE(SUM(cost_nanos), 0) AS BIGINT) AS spent \
                 FROM usage_ledger WHERE owner = $1 AND created_at >= $2",
                key,
            ),
        };
        let nanos = with_reader!(self, |pool, d| {
            sqlx::query(sql)
                .bind(value)
                .bind(to_db(since))
                .fetch_one(pool)
                .await?
                .int("spent")?
        });
        Ok(from_db(nanos) as f64 / 1e9)
    }
}

#[cfg(test)]
mod tests {
    use super::{day_text, nanos_of};

    #[test]
    fn days_since_the_epoch_are_calendar_dates() {
        assert_eq!(day_text(0), "1970-01-01");
        assert_eq!(day_text(19_723), "2024-01-01");
        assert_eq!(day_text(19_782), "2024-02-29");
        assert_eq!(day_text(20_784), "2026-11-27");
        assert_eq!(day_text(-1), "1969-12-31");
    }

    #[test]
    fn dollars_become_whole_billionths() {
        assert_eq!(nanos_of(0.000_015), 15_000);
        assert_eq!(nanos_of(1.5), 1_500_000_000);
        assert_eq!(nanos_of(-1.0), 0);
        assert_eq!(nanos_of(f64::NAN), 0);
    }
}
