//! The generated workload: concurrent writer connections committing outbox rows in transactions
//! of 1–50 rows, straight to the server (the application's side; never through the proxy).
//!
//! * Every aggregate id (the Kafka key) belongs to exactly one writer, so the commit order of a
//!   key's rows is that writer's order. Each row carries the key's sequence number (1, 2, …) in
//!   its `event_key` (`<run>.<writer>.<key>.<seq>`) and payload.
//! * A transaction whose COMMIT failed with a lost connection is *uncertain*. The writer
//!   reconnects and runs the very same rows again: a duplicate-key error on `event_key` proves
//!   the first COMMIT went through; success means it did not. Either way the key's sequence has
//!   no gap. (The final truth is still the outbox table itself.)
//! * A few transactions are rolled back on purpose (`event_key` `<run>.rb.…`): they must never
//!   reach Kafka.
//! * Rows are never deleted or updated.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use mysql_async::prelude::*;
use mysql_async::{Conn, Opts};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::rng::Rng;

/// MySQL error code of a duplicate key.
const ER_DUP_ENTRY: u16 = 1062;

/// Aggregate type of writer key `j` (two topics for writers, a third for probes).
pub fn aggregate_type(j: usize) -> &'static str {
    if j.is_multiple_of(2) {
        "Order"
    } else {
        "Payment"
    }
}

/// Aggregate type of the probe rows.
pub const PROBE_TYPE: &str = "Probe";
/// Aggregate id (Kafka key) of the probe rows.
pub const PROBE_KEY: &str = "probe";

/// Aggregate type of fresh-topic row `n`: a topic nobody wrote before, auto-created by the
/// broker when the relay first produces to it (`Fresh<n>`).
pub fn fresh_type(n: u64) -> String {
    format!("Fresh{n}")
}

/// `event_key` of the row on fresh topic `n` (its only row: sequence 1).
pub fn fresh_event_key(run: &str, n: u64) -> String {
    format!("{run}.n{n}.0.1")
}

/// Aggregate id (Kafka key) of writer `w`'s key `j`.
pub fn aggregate_id(w: usize, j: usize) -> String {
    format!("w{w}-k{j}")
}

/// The payload of a row, a pure function of its identity so the checker can recompute it.
///
/// Written as MySQL prints a JSON document (keys ordered by length, then bytes; `": "` and
/// `", "` separators), so every test server gives back exactly this text: MariaDB stores JSON
/// as the text inserted, MySQL stores binary JSON and prints it normalised (`aggregate_id` is
/// plain ASCII without quotes or backslashes). The relay relays what the server gives back.
pub fn payload(aggregate_id: &str, seq: u64) -> String {
    let pad = "abcdefghijklmnopqrstuvwxyz0123456789".repeat(1 + (seq % 5) as usize);
    format!(r#"{{"key": "{aggregate_id}", "pad": "{pad}", "seq": {seq}}}"#)
}

/// What an `event_key` of this run names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventRef {
    /// A writer row: aggregate id and its sequence number.
    Row {
        /// Aggregate id (the record key).
        aggregate_id: String,
        /// Aggregate type (selects the topic).
        aggregate_type: String,
        /// Sequence number of the row within its key, from 1.
        seq: u64,
    },
    /// A row of a transaction that was rolled back on purpose.
    RolledBack,
}

/// `event_key` of writer `w`, key `j`, sequence `seq`.
pub fn event_key(run: &str, w: usize, j: usize, seq: u64) -> String {
    format!("{run}.{w}.{j}.{seq}")
}

/// `event_key` of probe number `seq`.
pub fn probe_event_key(run: &str, seq: u64) -> String {
    format!("{run}.p.0.{seq}")
}

/// Parses an `event_key` of run `run`.
pub fn parse_event_key(run: &str, event_key: &str) -> Option<EventRef> {
    let rest = event_key.strip_prefix(run)?.strip_prefix('.')?;
    let mut parts = rest.split('.');
    let (a, b, c) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    if a == "rb" {
        return Some(EventRef::RolledBack);
    }
    let seq: u64 = c.parse().ok()?;
    if let Some(n) = a.strip_prefix('n').and_then(|n| n.parse::<u64>().ok()) {
        return Some(EventRef::Row {
            aggregate_id: format!("fresh-{n}"),
            aggregate_type: fresh_type(n),
            seq,
        });
    }
    if a == "p" {
        return Some(EventRef::Row {
            aggregate_id: PROBE_KEY.to_owned(),
            aggregate_type: PROBE_TYPE.to_owned(),
            seq,
        });
    }
    let w: usize = a.parse().ok()?;
    let j: usize = b.parse().ok()?;
    Some(EventRef::Row {
        aggregate_id: aggregate_id(w, j),
        aggregate_type: aggregate_type(j).to_owned(),
        seq,
    })
}

/// One generated outbox row.
#[derive(Debug, Clone)]
pub struct GenRow {
    /// `event_key`.
    pub event_key: String,
    /// `aggregate_type`.
    pub aggregate_type: String,
    /// `aggregate_id`.
    pub aggregate_id: String,
    /// `payload`.
    pub payload: String,
}

fn quote(s: &str) -> String {
    // Only the characters this workload generates; anything else would be a harness bug.
    debug_assert!(s
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "{}\":,.-_ ".contains(c)));
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "''"))
}

/// One `INSERT` of `rows` (text protocol: no prepared statements to lose on reconnects).
fn insert_sql(rows: &[GenRow]) -> String {
    let values: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "({}, {}, 'Event', {}, {}, UTC_TIMESTAMP(6))",
                quote(&r.aggregate_type),
                quote(&r.aggregate_id),
                quote(&r.event_key),
                quote(&r.payload)
            )
        })
        .collect();
    format!(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, event_key, payload, \
         created_at) VALUES {}",
        values.join(", ")
    )
}

/// Why a transaction attempt failed.
#[derive(Debug)]
pub enum TxError {
    /// Before COMMIT was sent: the transaction did not commit.
    BeforeCommit(mysql_async::Error),
    /// COMMIT was sent and failed (typically the connection died): outcome unknown.
    AtCommit(mysql_async::Error),
    /// An `event_key` already exists: an earlier attempt of these rows committed.
    Duplicate,
}

fn is_duplicate(e: &mysql_async::Error) -> bool {
    matches!(e, mysql_async::Error::Server(s) if s.code == ER_DUP_ENTRY)
}

/// Runs one transaction: BEGIN, the inserts (one multi-row statement or one per row), COMMIT
/// (or ROLLBACK when `rollback`).
///
/// # Errors
/// See [`TxError`].
pub async fn run_tx(
    conn: &mut Conn,
    rows: &[GenRow],
    multi_row: bool,
    rollback: bool,
) -> std::result::Result<(), TxError> {
    let before = |e: mysql_async::Error| {
        if is_duplicate(&e) {
            TxError::Duplicate
        } else {
            TxError::BeforeCommit(e)
        }
    };
    conn.query_drop("BEGIN").await.map_err(before)?;
    let inserted = async {
        if multi_row {
            conn.query_drop(insert_sql(rows)).await?;
        } else {
            for r in rows {
                conn.query_drop(insert_sql(std::slice::from_ref(r))).await?;
            }
        }
        Ok::<(), mysql_async::Error>(())
    }
    .await;
    if let Err(e) = inserted {
        let _ = conn.query_drop("ROLLBACK").await;
        return Err(before(e));
    }
    if rollback {
        return conn.query_drop("ROLLBACK").await.map_err(before);
    }
    conn.query_drop("COMMIT").await.map_err(TxError::AtCommit)
}

/// Counters of one writer (or of all, summed).
#[derive(Debug, Default, Clone)]
pub struct WriterStats {
    /// Transactions committed.
    pub transactions: u64,
    /// Outbox rows committed (as far as the writer knows; the outbox table is the truth).
    pub rows_committed: u64,
    /// Rows of transactions rolled back on purpose.
    pub rows_rolled_back: u64,
    /// Transactions whose COMMIT failed with an unknown outcome.
    pub uncertain_commits: u64,
    /// …of which the retry proved the first COMMIT had gone through.
    pub uncertain_committed: u64,
    /// Failed attempts (any error), retried.
    pub failed_attempts: u64,
    /// New connections after a failure.
    pub reconnects: u64,
    /// Longest time from a failure to the next successful transaction.
    pub max_outage: Duration,
}

impl WriterStats {
    fn add(&mut self, o: &Self) {
        self.transactions += o.transactions;
        self.rows_committed += o.rows_committed;
        self.rows_rolled_back += o.rows_rolled_back;
        self.uncertain_commits += o.uncertain_commits;
        self.uncertain_committed += o.uncertain_committed;
        self.failed_attempts += o.failed_attempts;
        self.reconnects += o.reconnects;
        self.max_outage = self.max_outage.max(o.max_outage);
    }
}

/// A connection that is re-established after failures, and the logic that makes a transaction
/// happen exactly once despite them.
pub struct Committer {
    opts: Opts,
    conn: Option<Conn>,
    /// Give up when no transaction succeeds for this long.
    pub patience: Duration,
    /// Counters.
    pub stats: WriterStats,
}

impl Committer {
    /// A committer for `url` (connects lazily).
    ///
    /// # Errors
    /// `url` is not a MySQL URL.
    pub fn new(url: &str) -> Result<Self> {
        Ok(Self {
            opts: Opts::from_url(url).context("parsing the MySQL URL")?,
            conn: None,
            patience: Duration::from_secs(300),
            stats: WriterStats::default(),
        })
    }

    async fn conn(&mut self, deadline: Instant) -> Result<&mut Conn> {
        if self.conn.is_none() {
            let mut delay = Duration::from_millis(100);
            loop {
                match Conn::new(self.opts.clone()).await {
                    Ok(c) => {
                        self.conn = Some(c);
                        break;
                    }
                    Err(e) if Instant::now() >= deadline => {
                        return Err(e).context("no connection to the server within the patience");
                    }
                    Err(_) => {
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(1));
                    }
                }
            }
        }
        self.conn.as_mut().context("no connection")
    }

    /// Commits `rows` in one transaction, retrying on failures until it is certain that they
    /// are committed exactly once (or, with `rollback`, that the transaction ran and was rolled
    /// back at least once: a rolled-back transaction is not retried after an error since it
    /// cannot have committed).
    ///
    /// # Errors
    /// No success within [`Committer::patience`], or a duplicate `event_key` on the first
    /// attempt (a harness bug).
    pub async fn commit(&mut self, rows: &[GenRow], multi_row: bool, rollback: bool) -> Result<()> {
        let started = Instant::now();
        let deadline = started + self.patience;
        let mut uncertain = false;
        let mut failed_at: Option<Instant> = None;
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let conn = self.conn(deadline).await?;
            let result = run_tx(conn, rows, multi_row, rollback).await;
            let outage_end = |stats: &mut WriterStats, failed_at: Option<Instant>| {
                if let Some(t) = failed_at {
                    stats.max_outage = stats.max_outage.max(t.elapsed());
                }
            };
            match result {
                Ok(()) => {
                    outage_end(&mut self.stats, failed_at);
                    if rollback {
                        self.stats.rows_rolled_back += rows.len() as u64;
                    } else {
                        self.stats.transactions += 1;
                        self.stats.rows_committed += rows.len() as u64;
                    }
                    return Ok(());
                }
                Err(TxError::Duplicate) if attempt > 1 => {
                    // The earlier attempt committed after all.
                    outage_end(&mut self.stats, failed_at);
                    if uncertain {
                        self.stats.uncertain_committed += 1;
                    }
                    self.stats.transactions += 1;
                    self.stats.rows_committed += rows.len() as u64;
                    return Ok(());
                }
                Err(TxError::Duplicate) => {
                    bail!(
                        "duplicate event_key on the first attempt of a transaction (harness bug): {}",
                        rows.first().map(|r| r.event_key.as_str()).unwrap_or("")
                    );
                }
                Err(TxError::AtCommit(e)) | Err(TxError::BeforeCommit(e))
                    if Instant::now() >= deadline =>
                {
                    return Err(e)
                        .context("the server did not accept the transaction within the patience");
                }
                Err(e) => {
                    if matches!(e, TxError::AtCommit(_)) && !uncertain && !rollback {
                        uncertain = true;
                        self.stats.uncertain_commits += 1;
                    }
                    self.stats.failed_attempts += 1;
                    failed_at.get_or_insert_with(Instant::now);
                    // Drop the connection: it is dead or in an unknown state.
                    if let Some(c) = self.conn.take() {
                        drop(tokio::time::timeout(Duration::from_secs(1), c.disconnect()).await);
                    }
                    self.stats.reconnects += 1;
                    if rollback {
                        return Ok(()); // nothing can have committed
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// Closes the connection.
    pub async fn close(mut self) -> WriterStats {
        if let Some(c) = self.conn.take() {
            let _ = tokio::time::timeout(Duration::from_secs(2), c.disconnect()).await;
        }
        self.stats
    }
}

/// Shape of the workload.
#[derive(Debug, Clone)]
pub struct WorkloadConfig {
    /// Prefix of every `event_key` of this run.
    pub run_id: String,
    /// MySQL URL of the database with the outbox table.
    pub url: String,
    /// Concurrent writer connections.
    pub writers: usize,
    /// Aggregate ids per writer.
    pub keys_per_writer: usize,
    /// Pause between two transactions of a writer, in ms (uniform in the range).
    pub pause_ms: (u64, u64),
    /// Probability that a transaction is rolled back on purpose.
    pub rollback_chance: f64,
    /// Seed of the writers' generators.
    pub seed: u64,
}

/// Live totals, readable while the writers run.
#[derive(Debug, Default)]
pub struct LiveTotals {
    /// Rows committed so far.
    pub rows_committed: AtomicU64,
}

/// Running writers.
pub struct Workload {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<Result<WriterStats>>>,
    /// Live totals.
    pub live: Arc<LiveTotals>,
}

/// Transaction size: mostly small, sometimes up to 50 rows.
fn tx_size(rng: &mut Rng) -> usize {
    let r = rng.range(0, 99);
    let n = if r < 55 {
        rng.range(1, 3)
    } else if r < 85 {
        rng.range(4, 15)
    } else {
        rng.range(16, 50)
    };
    n as usize
}

impl Workload {
    /// Starts `config.writers` writers.
    ///
    /// # Errors
    /// The URL is invalid.
    pub fn start(config: &WorkloadConfig) -> Result<Self> {
        let (stop, stop_rx) = watch::channel(false);
        let live = Arc::new(LiveTotals::default());
        let mut seeds = Rng::new(config.seed);
        let mut tasks = Vec::new();
        for w in 0..config.writers {
            let committer = Committer::new(&config.url)?;
            let cfg = config.clone();
            let rng = Rng::new(seeds.next_u64());
            let stop_rx = stop_rx.clone();
            let live = Arc::clone(&live);
            tasks.push(tokio::spawn(writer(w, cfg, rng, committer, stop_rx, live)));
        }
        Ok(Self { stop, tasks, live })
    }

    /// Stops the writers after their current transaction and sums their counters.
    ///
    /// # Errors
    /// A writer failed (gave up on the server, or a harness bug).
    pub async fn stop(self) -> Result<WriterStats> {
        let _ = self.stop.send(true);
        let mut total = WriterStats::default();
        let mut first_error = None;
        for t in self.tasks {
            match t.await {
                Ok(Ok(s)) => total.add(&s),
                Ok(Err(e)) => {
                    first_error.get_or_insert(e);
                }
                Err(e) => {
                    first_error.get_or_insert(anyhow::anyhow!("writer task panicked: {e}"));
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(total),
        }
    }

    /// Whether every writer still runs (a writer that ended early failed).
    pub fn all_running(&self) -> bool {
        self.tasks.iter().all(|t| !t.is_finished())
    }
}

async fn writer(
    w: usize,
    cfg: WorkloadConfig,
    mut rng: Rng,
    mut committer: Committer,
    stop: watch::Receiver<bool>,
    live: Arc<LiveTotals>,
) -> Result<WriterStats> {
    let keys = cfg.keys_per_writer.max(1);
    let mut next_seq = vec![1u64; keys];
    let mut rolled_back = 0u64;
    while !*stop.borrow() {
        let n = tx_size(&mut rng);
        let rollback = rng.chance(cfg.rollback_chance);
        let multi_row = rng.chance(0.5);
        let mut seqs = next_seq.clone();
        let mut rows = Vec::with_capacity(n);
        for _ in 0..n {
            let j = rng.index(keys);
            let aggregate_id = aggregate_id(w, j);
            let event_key = if rollback {
                rolled_back += 1;
                format!("{}.rb.{w}.{rolled_back}", cfg.run_id)
            } else {
                event_key(&cfg.run_id, w, j, seqs[j])
            };
            rows.push(GenRow {
                payload: payload(&aggregate_id, seqs[j]),
                event_key,
                aggregate_type: aggregate_type(j).to_owned(),
                aggregate_id,
            });
            seqs[j] += 1;
        }
        committer
            .commit(&rows, multi_row, rollback)
            .await
            .with_context(|| format!("writer {w}"))?;
        if !rollback {
            next_seq = seqs;
            live.rows_committed
                .fetch_add(rows.len() as u64, Ordering::Relaxed);
        }
        let pause = rng.range(cfg.pause_ms.0, cfg.pause_ms.1);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    Ok(committer.close().await)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_keys_round_trip() {
        let run = "r1_2_x";
        assert_eq!(
            parse_event_key(run, &event_key(run, 3, 4, 17)),
            Some(EventRef::Row {
                aggregate_id: "w3-k4".into(),
                aggregate_type: "Order".into(),
                seq: 17
            })
        );
        assert_eq!(
            parse_event_key(run, &probe_event_key(run, 2)),
            Some(EventRef::Row {
                aggregate_id: PROBE_KEY.into(),
                aggregate_type: PROBE_TYPE.to_owned(),
                seq: 2
            })
        );
        assert_eq!(
            parse_event_key(run, &format!("{run}.rb.1.9")),
            Some(EventRef::RolledBack)
        );
        assert_eq!(parse_event_key(run, "other.1.2.3"), None);
        assert_eq!(parse_event_key(run, &format!("{run}.1.2")), None);
    }

    #[test]
    fn insert_sql_quotes_values() {
        let row = GenRow {
            event_key: "r.1.0.1".into(),
            aggregate_type: "Order".into(),
            aggregate_id: "w1-k0".into(),
            payload: payload("w1-k0", 1),
        };
        let sql = insert_sql(&[row.clone(), row]);
        assert!(
            sql.contains(
                "('Order', 'w1-k0', 'Event', 'r.1.0.1', '{\"key\": \"w1-k0\", \"pad\": \"abc"
            ),
            "{sql}"
        );
        assert_eq!(sql.matches("UTC_TIMESTAMP(6)").count(), 2);
    }

    #[test]
    fn tx_sizes_stay_within_1_to_50() {
        let mut rng = Rng::new(7);
        let sizes: Vec<usize> = (0..10_000).map(|_| tx_size(&mut rng)).collect();
        assert!(sizes.iter().all(|n| (1..=50).contains(n)));
        assert!(sizes.contains(&1) && sizes.contains(&50));
    }
}
