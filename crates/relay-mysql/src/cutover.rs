//! The cutover filter (`[cutover]`): the first runs after a polling relay skip the outbox rows
//! it already sent.
//!
//! A polling relay marks the rows it sent in the outbox table itself (`status = 'SENT'`). The
//! binlog still holds those rows' INSERTs, so a relay started from a point before the oldest row
//! the polling relay had not sent would send the others again. While this relay reads
//! transactions that committed at or before `cutover.until`, [`Cutover::skips`] looks at each
//! transaction's outbox rows in the table as they are *now*: one query per transaction and table
//! (`SELECT id FROM t WHERE id IN (…) AND (skip_if)`, in chunks of [`MAX_IDS_PER_QUERY`]), or
//! only the id watermark `skip_ids_through`. Matching rows are not produced; every other row is
//! (still `NEW`, `SENDING`, `DEAD` unless the condition says otherwise, deleted since, without an
//! id): the filter can cause a duplicate, never a loss.
//!
//! # Where it sits
//! Between the decoder and the router, in `Reader::stream`: the rows of a source transaction are
//! held until its boundary (or [`MAX_HELD_ROWS`]) so that one query covers them, then produced in
//! binlog order. A skipped row keeps its number in the transaction (`rows_acked` counts it), and
//! its transaction's boundary moves the checkpoint as any other; a restart inside a transaction
//! checks the rows after the checkpoint again. In exactly-once mode nothing changes either:
//! skipped rows are simply not in the Kafka transaction.
//!
//! # Errors
//! A query the server refuses (a syntax error in `skip_if`, an unknown column, a missing
//! privilege) stops the relay with [`RelayError::Config`] naming `cutover.skip_if`: the
//! condition is checked once per outbox table at start-up ([`Cutover::validate`]), so this only
//! happens when the table changed since. Lost connections and lock waits are retried
//! ([`CHECK_ATTEMPTS`] attempts, exponential backoff), then the run ends with
//! [`RelayError::Mysql`] and the supervisor resumes from the checkpoint (before the rows).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use mysql_async::prelude::Queryable;
use mysql_async::{Pool, Value};

use crate::decode::DecodedRow;
use outbox_relay_core::config::{CutoverConfig, TableName};
use outbox_relay_core::error::RelayError;
use outbox_relay_core::observe::metrics;
use outbox_relay_core::outbox::pattern::TablePattern;
use outbox_relay_core::outbox::OutboxEvent;

/// Most ids in one `IN (…)` list.
pub const MAX_IDS_PER_QUERY: usize = 1000;

/// Most rows of one source transaction held before they are checked and produced (a larger
/// transaction costs one query per this many rows).
pub const MAX_HELD_ROWS: usize = 1000;

/// Attempts of one check query before the run ends with a MySQL error.
pub const CHECK_ATTEMPTS: usize = 4;

/// MySQL errors a check query retries: lock wait timeout (1205), deadlock (1213), query
/// interrupted (1317), max_execution_time exceeded (3024).
const RETRIED_SERVER_ERRORS: [u16; 4] = [1205, 1213, 1317, 3024];

/// Integer column types (`information_schema.COLUMNS.DATA_TYPE`) `skip_ids_through` works on.
const INTEGER_TYPES: [&str; 5] = ["tinyint", "smallint", "mediumint", "int", "bigint"];

/// Column types whose values do not compare with their text form in the relay's records
/// (`binary_format`), so `skip_if` cannot look their rows up.
const BINARY_TYPES: [&str; 6] = [
    "binary",
    "varbinary",
    "tinyblob",
    "blob",
    "mediumblob",
    "longblob",
];

/// Counters of the filter, for the summary log lines.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CutoverStats {
    /// Outbox rows of transactions inside the window.
    pub checked: u64,
    /// Rows skipped (sent by the previous relay).
    pub skipped: u64,
    /// Queries of `skip_if`.
    pub queries: u64,
}

/// The cutover filter of one connector, kept by the supervisor across runs.
pub struct Cutover {
    pool: Pool,
    skip_if: Option<String>,
    skip_ids_through: Option<i64>,
    /// Transactions that committed at or before this (ms since the epoch) are checked.
    until_ms: i64,
    until: String,
    io_timeout: Duration,
    /// The `id` column of each outbox table (its mapping's `columns.id`); a pattern's entry
    /// (`tenant_*.outbox`) stands for its matching tables, whose rows name their id column in
    /// their mapping.
    id_columns: HashMap<TableName, String>,
    stats: CutoverStats,
    /// The first transaction after `until` was read (for the log line, once).
    window_ended: bool,
    /// The source's metrics, if any.
    metrics: Option<std::sync::Arc<metrics::Metrics>>,
}

impl Cutover {
    /// The filter of `config` over the outbox tables `id_columns` (table → its `id` column),
    /// querying through `pool`, each query bounded by `io_timeout`.
    ///
    /// # Errors
    /// [`RelayError::Config`] for an unusable `cutover.until`.
    pub fn new(
        config: &CutoverConfig,
        pool: Pool,
        id_columns: HashMap<TableName, String>,
        io_timeout: Duration,
    ) -> Result<Self, RelayError> {
        Ok(Self {
            pool,
            skip_if: config.skip_if.clone(),
            skip_ids_through: config.skip_ids_through,
            until_ms: config.until_ms()?,
            until: config.until.clone(),
            io_timeout,
            id_columns,
            stats: CutoverStats::default(),
            window_ended: false,
            metrics: None,
        })
    }

    /// The same filter, counting what it checks and skips in `metrics`.
    pub fn with_metrics(self, metrics: std::sync::Arc<metrics::Metrics>) -> Self {
        Self {
            metrics: Some(metrics),
            ..self
        }
    }

    /// What the filter did so far (all runs of this process).
    pub fn stats(&self) -> CutoverStats {
        self.stats
    }

    /// Start-up check of every outbox table: `skip_if` runs (`SELECT 1 FROM t WHERE (skip_if)
    /// LIMIT 0`) and the id column suits the filter (an integer column for `skip_ids_through`;
    /// not a binary one for `skip_if`).
    ///
    /// # Errors
    /// [`RelayError::Config`] naming `cutover.skip_if` / `cutover.skip_ids_through` and the
    /// table; [`RelayError::Mysql`] when the server cannot be reached.
    pub async fn validate(&self) -> Result<(), RelayError> {
        let mut conn = outbox_relay_core::error::with_timeout(
            self.io_timeout,
            "connecting for the cutover checks",
            self.pool.get_conn(),
        )
        .await??;
        // A pattern (`tenant_*.outbox`) stands for the tables that match it now; one created
        // later is checked by its first query (a refusal then stops the relay, as for a table
        // changed since start-up).
        let mut tables: Vec<(TableName, &String)> = Vec::new();
        for (name, column) in &self.id_columns {
            match TablePattern::of(name) {
                None => tables.push((name.clone(), column)),
                Some(pattern) => {
                    let found = outbox_relay_core::error::with_timeout(
                        self.io_timeout,
                        "listing the tables of an outbox table pattern",
                        crate::preflight::matching_tables(&mut conn, &pattern),
                    )
                    .await??;
                    tables.extend(found.into_iter().map(|t| (t, column)));
                }
            }
        }
        for (table, column) in &tables {
            let data_type: Option<String> = outbox_relay_core::error::with_timeout(
                self.io_timeout,
                "reading the outbox id column's type",
                conn.exec_first(
                    "SELECT LOWER(DATA_TYPE) FROM information_schema.COLUMNS \
                     WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND COLUMN_NAME = ?",
                    (&table.database, &table.table, column),
                ),
            )
            .await??;
            let data_type = data_type.unwrap_or_default();
            if self.skip_ids_through.is_some() && !INTEGER_TYPES.contains(&data_type.as_str()) {
                return Err(RelayError::Config(format!(
                    "cutover.skip_ids_through needs an integer id column, but {table}.{column} \
                     is {data_type:?}; use cutover.skip_if instead"
                )));
            }
            let Some(cond) = &self.skip_if else { continue };
            if BINARY_TYPES.contains(&data_type.as_str()) {
                return Err(RelayError::Config(format!(
                    "cutover.skip_if cannot look up rows of {table}: its id column {column} is \
                     {data_type}, which the relay only knows in its text form; use \
                     cutover.skip_ids_through, or an integer or character id column"
                )));
            }
            let sql = format!("SELECT 1 FROM {} WHERE ({cond}) LIMIT 0", table.quoted());
            let ran = outbox_relay_core::error::with_timeout(
                self.io_timeout,
                "checking cutover.skip_if",
                conn.query_drop(sql),
            )
            .await?;
            match ran {
                Ok(()) => {}
                Err(mysql_async::Error::Server(e)) => {
                    return Err(condition_refused(table, cond, &e));
                }
                Err(e) => return Err(e.into()),
            }
        }
        tracing::info!(skip_if = ?self.skip_if, skip_ids_through = ?self.skip_ids_through,
            until = %self.until, "cutover: rows the previous relay sent are skipped in \
            transactions committed at or before cutover.until");
        Ok(())
    }

    /// `true` when a transaction that committed at `commit_ms` (ms since the epoch) is checked.
    /// Logs the end of the window (with the counts) at the first transaction after it.
    pub fn covers(&mut self, commit_ms: i64) -> bool {
        let inside = commit_ms <= self.until_ms;
        if !inside && !self.window_ended {
            self.window_ended = true;
            let s = self.stats;
            tracing::info!(until = %self.until, rows_checked = s.checked,
                rows_skipped = s.skipped, queries = s.queries,
                "cutover window ended: transactions committed after cutover.until are relayed \
                 without checks ([cutover] can be removed from the configuration)");
        }
        inside
    }

    /// Which of `rows` (the held rows of one source transaction, in order) the previous relay
    /// sent: `true` at their index. Rows that are not `Ok` or have no id are never skipped.
    ///
    /// # Errors
    /// See the module documentation.
    pub async fn skips(&mut self, rows: &[(u64, DecodedRow)]) -> Result<Vec<bool>, RelayError> {
        let mut skip = vec![false; rows.len()];
        // Per table, the rows to look up: (index in `rows`, id text).
        let mut lookups: HashMap<Arc<TableName>, Vec<(usize, &[u8])>> = HashMap::new();
        let mut pattern_id_columns: HashMap<Arc<TableName>, String> = HashMap::new();
        for (i, (_, row)) in rows.iter().enumerate() {
            let Ok(event) = row else { continue };
            let Some(id) = event.id.as_deref() else {
                continue;
            };
            self.stats.checked += 1;
            if self
                .skip_ids_through
                .is_some_and(|w| integer(id).is_some_and(|n| n <= w))
            {
                skip[i] = true;
                continue;
            }
            if self.skip_if.is_some() {
                lookups
                    .entry(Arc::clone(&event.table))
                    .or_default()
                    .push((i, id));
                // A table of a pattern is not in `id_columns`: its mapping names its id column.
                if !self.id_columns.contains_key(&*event.table)
                    && !event.mapping.columns.id.is_empty()
                {
                    pattern_id_columns
                        .entry(Arc::clone(&event.table))
                        .or_insert_with(|| event.mapping.columns.id.clone());
                }
            }
        }
        for (table, ids) in lookups {
            let column = pattern_id_columns.get(&table).cloned();
            for chunk in ids.chunks(MAX_IDS_PER_QUERY) {
                let sent = self.sent_ids(&table, column.as_deref(), chunk).await?;
                for (i, id) in chunk {
                    if sent.contains(*id) {
                        skip[*i] = true;
                    }
                }
            }
        }
        let skipped = skip.iter().filter(|s| **s).count() as u64;
        self.stats.skipped += skipped;
        if let Some(m) = &self.metrics {
            m.cutover_skipped(skipped);
        }
        Ok(skip)
    }

    /// The ids (text form) among `ids` whose rows match `skip_if` now, retrying lost
    /// connections and lock waits. `pattern_column`: the id column of a table that a pattern
    /// matched (not in `id_columns`).
    async fn sent_ids(
        &mut self,
        table: &TableName,
        pattern_column: Option<&str>,
        ids: &[(usize, &[u8])],
    ) -> Result<HashSet<Vec<u8>>, RelayError> {
        let column = self
            .id_columns
            .get(table)
            .map(String::as_str)
            .or(pattern_column);
        let (Some(cond), Some(column)) = (&self.skip_if, column) else {
            return Ok(HashSet::new());
        };
        let column = format!("`{}`", column.replace('`', "``"));
        let marks = vec!["?"; ids.len()].join(",");
        let sql = format!(
            "SELECT CAST({column} AS CHAR) FROM {} WHERE {column} IN ({marks}) AND ({cond})",
            table.quoted()
        );
        let params: Vec<Value> = ids
            .iter()
            .map(|(_, id)| match integer(id) {
                Some(n) => Value::Int(n),
                None => Value::Bytes(id.to_vec()),
            })
            .collect();
        let pool = &self.pool;
        let timeout = self.io_timeout;
        let attempt = || async {
            let found: Vec<Option<Vec<u8>>> = outbox_relay_core::error::with_timeout(
                timeout,
                "querying cutover.skip_if",
                async {
                    let mut conn = pool.get_conn().await?;
                    conn.exec(sql.as_str(), params.clone()).await
                },
            )
            .await
            .map_err(Attempt::Retry)?
            .map_err(|e| match e {
                mysql_async::Error::Server(s) if !RETRIED_SERVER_ERRORS.contains(&s.code) => {
                    Attempt::Stop(condition_refused(table, cond, &s))
                }
                other => Attempt::Retry(RelayError::from(other)),
            })?;
            Ok::<_, Attempt>(found)
        };
        self.stats.queries += 1;
        if let Some(m) = &self.metrics {
            m.cutover_check();
        }
        let found = attempt
            .retry(
                ExponentialBuilder::default()
                    .with_min_delay(Duration::from_millis(100))
                    .with_max_delay(Duration::from_secs(2))
                    .with_jitter()
                    .with_max_times(CHECK_ATTEMPTS - 1),
            )
            .when(|e| matches!(e, Attempt::Retry(_)))
            .notify(|e, delay| {
                tracing::warn!(error = %e.error(), table = %table, retry_in_ms = delay.as_millis() as u64,
                    "cutover.skip_if query failed; retrying");
            })
            .await
            .map_err(|e| match e {
                Attempt::Stop(e) => e,
                Attempt::Retry(e) => RelayError::mysql(format!(
                    "the cutover.skip_if query on {table} failed {CHECK_ATTEMPTS} times: {e}"
                )),
            })?;
        // Only ids asked for count, whatever the condition selects.
        let asked: HashSet<&[u8]> = ids.iter().map(|(_, id)| *id).collect();
        Ok(found
            .into_iter()
            .flatten()
            .filter(|id| asked.contains(id.as_slice()))
            .collect())
    }
}

/// One failed attempt of a check query.
enum Attempt {
    /// Worth another attempt (a lost connection, a lock wait).
    Retry(RelayError),
    /// The server refused the query: the condition does not fit the table.
    Stop(RelayError),
}

impl Attempt {
    fn error(&self) -> &RelayError {
        match self {
            Self::Retry(e) | Self::Stop(e) => e,
        }
    }
}

/// The error for a `skip_if` the server refused on `table`.
fn condition_refused(table: &TableName, cond: &str, e: &mysql_async::ServerError) -> RelayError {
    RelayError::Config(format!(
        "cutover.skip_if {cond:?} does not work on {table}: the server refused \
         `SELECT … FROM {table} WHERE ({cond})` with error {}: {}",
        e.code,
        outbox_relay_core::error::redact_error(&e.message)
    ))
}

/// `id` as an integer, when its text form is one.
fn integer(id: &[u8]) -> Option<i64> {
    std::str::from_utf8(id).ok()?.parse().ok()
}

/// The commit time of the transaction `rows` belong to: that of its first decoded row.
pub fn commit_ms(rows: &[(u64, DecodedRow)]) -> Option<i64> {
    rows.iter()
        .find_map(|(_, r)| r.as_ref().ok().map(|e: &OutboxEvent| e.commit_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_integer_text_is_an_integer_id() {
        assert_eq!(integer(b"12345"), Some(12345));
        assert_eq!(integer(b"-3"), Some(-3));
        assert_eq!(integer(b"0b7f5e2c-1d"), None);
        assert_eq!(integer(b"99999999999999999999"), None);
        assert_eq!(integer(&[0xff, 0x31]), None);
    }
}
