//! The scenario consumer of `inbox/CONTRACT.md` ("The scenario consumer"): the inbox with the
//! coupon-granting handler, configured by `INBOX_*` environment variables, printing `READY`,
//! `OUTCOME …` and `BENCH …` lines. `tests/inbox_e2e.rs` and `make bench` drive it; it is also a
//! complete example of a consumer built on this crate.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use mysql_async::{OptsBuilder, Pool, Transaction};
use outbox_inbox::{
    GapPolicy, Handler, HandlerError, Hooks, Inbox, InboxConfig, InboxConsumer, InboxRecord,
    Outcome, Settled,
};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::Message;

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn required(name: &str) -> anyhow::Result<String> {
    env(name).ok_or_else(|| anyhow::anyhow!("{name} is not set (inbox/CONTRACT.md)"))
}

fn number<T: std::str::FromStr>(name: &str, default: T) -> anyhow::Result<T> {
    match env(name) {
        None => Ok(default),
        Some(v) => v
            .parse()
            .map_err(|_| anyhow::anyhow!("{name}={v:?} is not a number")),
    }
}

/// The contract's business handler: one coupon row per call, then the payload's failures.
struct GrantCoupon {
    consumer: String,
    /// Failures so far per event_key (`fail_times`), in this process.
    failures: Mutex<HashMap<String, u64>>,
}

impl GrantCoupon {
    fn check(&self, record: &InboxRecord) -> Result<(), HandlerError> {
        let payload: serde_json::Value =
            serde_json::from_slice(record.value.as_deref().unwrap_or(b"{}"))?;
        if payload.get("poison").and_then(|v| v.as_bool()) == Some(true) {
            return Err("poison record".into());
        }
        // Fails in every tier before tier N (the record's retry_count header; absent: 0).
        if let Some(n) = payload.get("fail_until_tier").and_then(|v| v.as_u64()) {
            let tier: u64 = record
                .header_str("retry_count")
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if tier < n {
                return Err(format!("failing until tier {n}").into());
            }
        }
        let fail_times = payload
            .get("fail_times")
            .and_then(|v| v.as_u64())
            .unwrap_or(0);
        if fail_times > 0 {
            let key = record
                .header_str("event_key")
                .unwrap_or_default()
                .to_owned();
            let mut failures = self.failures.lock().map_err(|_| "poisoned lock")?;
            let n = failures.entry(key).or_insert(0);
            if *n < fail_times {
                *n += 1;
                return Err(format!("transient failure {n} of {fail_times}").into());
            }
        }
        Ok(())
    }

    fn row(&self, record: &InboxRecord) -> (String, String, String, Option<i64>) {
        (
            self.consumer.clone(),
            record.key_str().unwrap_or_default().to_owned(),
            record
                .header_str("event_key")
                .unwrap_or_default()
                .to_owned(),
            record.header_str("version").and_then(|v| v.parse().ok()),
        )
    }
}

const INSERT_COUPON: &str =
    "INSERT INTO coupons (consumer, order_id, event_key, version) VALUES (?, ?, ?, ?)";

impl Handler for GrantCoupon {
    async fn handle(
        &self,
        tx: &mut Transaction<'_>,
        record: &InboxRecord,
    ) -> Result<(), HandlerError> {
        tx.exec_drop(INSERT_COUPON, self.row(record)).await?;
        self.check(record)
    }
}

/// Ends the process at the configured point, once (the marker file), as kill -9 would.
struct CrashHooks {
    point: Option<String>,
    event_key: Option<String>,
    marker: Option<PathBuf>,
}

impl CrashHooks {
    fn maybe_crash(&self, point: &str, record: &InboxRecord) {
        if self.point.as_deref() != Some(point)
            || record.header_str("event_key") != self.event_key.as_deref()
        {
            return;
        }
        if let Some(marker) = &self.marker {
            if marker.exists() {
                return;
            }
            if let Err(e) = std::fs::write(marker, point) {
                eprintln!("cannot write the crash marker {}: {e}", marker.display());
                std::process::exit(1);
            }
        }
        eprintln!("scenario crash at {point}");
        std::process::exit(137);
    }
}

impl Hooks for CrashHooks {
    fn before_commit(&self, record: &InboxRecord) {
        self.maybe_crash("after_handler", record);
    }
    fn after_commit(&self, record: &InboxRecord, settled: &Settled) {
        // Every settled record passes here once: those the runner polled, and those settled
        // later by themselves (resumed parked versions, a sweep's dead letters).
        // A retry copy is named by the original record (its original_* headers).
        let partition = record
            .header_str("original_partition")
            .map_or_else(|| record.partition.to_string(), str::to_owned);
        let offset = record
            .header_str("original_offset")
            .map_or_else(|| record.offset.to_string(), str::to_owned);
        println!(
            "OUTCOME {} {} {partition} {offset} {}",
            settled.outcome.as_str(),
            record.header_str("event_key").unwrap_or("-"),
            settled.attempts
        );
        match settled.outcome {
            Outcome::Processed => self.maybe_crash("after_db_commit", record),
            // The copy is on its tier; the record's offset is not committed yet.
            Outcome::Retried => self.maybe_crash("after_retry_copy", record),
            _ => {}
        }
    }
}

/// Latencies (ms) and the count for the `BENCH` line.
struct Bench {
    started: Option<Instant>,
    latencies: Vec<f64>,
    exit_after: Option<usize>,
}

impl Bench {
    fn record(&mut self, latency: Duration) -> ControlFlow<()> {
        self.started.get_or_insert_with(Instant::now);
        self.latencies.push(latency.as_secs_f64() * 1000.0);
        match self.exit_after {
            Some(n) if self.latencies.len() >= n => ControlFlow::Break(()),
            _ => ControlFlow::Continue(()),
        }
    }

    fn report(&mut self) {
        let Some(n) = self.exit_after else { return };
        let secs = self.started.map_or(0.0, |s| s.elapsed().as_secs_f64());
        self.latencies.sort_by(f64::total_cmp);
        let pick = |q: f64| {
            let i = ((self.latencies.len() as f64 * q).ceil() as usize).saturating_sub(1);
            self.latencies.get(i).copied().unwrap_or(0.0)
        };
        println!(
            "BENCH records={} seconds={secs:.3} p50_ms={:.3} p99_ms={:.3}",
            self.latencies.len().min(n),
            pick(0.50),
            pick(0.99)
        );
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {},
                _ = int.recv() => {},
            }
        }
        _ => std::future::pending().await,
    }
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    if let Err(e) = run().await {
        eprintln!("scenario consumer: {e:#}");
        std::process::exit(1);
    }
}

async fn run() -> anyhow::Result<()> {
    let bootstrap = required("INBOX_BOOTSTRAP")?;
    let topic = required("INBOX_TOPIC")?;
    let group = required("INBOX_GROUP")?;
    let consumer_name = required("INBOX_CONSUMER")?;
    let pool = Pool::new(
        OptsBuilder::default()
            .ip_or_hostname(env("INBOX_DB_HOST").unwrap_or_else(|| "127.0.0.1".into()))
            .tcp_port(number("INBOX_DB_PORT", 3306u16)?)
            .user(Some(env("INBOX_DB_USER").unwrap_or_else(|| "root".into())))
            .pass(env("INBOX_DB_PASSWORD"))
            .db_name(Some(required("INBOX_DB_NAME")?)),
    );
    let handler = GrantCoupon {
        consumer: consumer_name.clone(),
        failures: Mutex::new(HashMap::new()),
    };
    let mut bench = Bench {
        started: None,
        latencies: Vec::new(),
        exit_after: env("INBOX_EXIT_AFTER")
            .map(|v| v.parse())
            .transpose()
            .map_err(|_| anyhow::anyhow!("INBOX_EXIT_AFTER is not a number"))?,
    };
    let mut kafka = ClientConfig::new();
    kafka
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", &group)
        .set("auto.offset.reset", "earliest")
        // A restart after a crash gets its partitions back once the dead member's session
        // ended: 10 s instead of the default 45 s.
        .set("session.timeout.ms", "10000");

    if env("INBOX_MODE").as_deref() == Some("plain") {
        plain(kafka, &topic, &pool, &handler, &mut bench).await?;
        bench.report();
        pool.disconnect().await?;
        return Ok(());
    }

    let mut config = InboxConfig::new(consumer_name, required("INBOX_DLQ_TOPIC")?);
    config.max_attempts = number("INBOX_MAX_ATTEMPTS", 3u32)?;
    config.backoff_initial = Duration::from_millis(number("INBOX_BACKOFF_MS", 50u64)?);
    config.backoff_max = Duration::from_secs(1).max(config.backoff_initial);
    config.outage_budget = Duration::from_millis(number("INBOX_OUTAGE_BUDGET_MS", 300_000u64)?);
    config.version_header = env("INBOX_VERSION_HEADER");
    config.gap_policy = match env("INBOX_GAP_POLICY").as_deref() {
        None | Some("park") => GapPolicy::Park,
        Some("dead_letter") => GapPolicy::DeadLetter,
        Some("retry") => GapPolicy::Retry,
        Some(other) => anyhow::bail!("INBOX_GAP_POLICY={other:?}: use park, dead_letter or retry"),
    };
    config.gap_deadline = Duration::from_millis(number("INBOX_GAP_DEADLINE_MS", 3_600_000u64)?);
    config.park_sweep_interval = Duration::from_millis(number("INBOX_PARK_SWEEP_MS", 10_000u64)?);
    // Comma-separated delays in ms; absent or empty: no tiers.
    if let Some(tiers) = env("INBOX_RETRY_TIERS_MS") {
        config.retry_tiers = tiers
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(|t| {
                t.parse::<u64>().map(Duration::from_millis).map_err(|_| {
                    anyhow::anyhow!("INBOX_RETRY_TIERS_MS={tiers:?}: {t:?} is not a number of ms")
                })
            })
            .collect::<anyhow::Result<_>>()?;
    }
    // Batch mode (plain mode above ignores it): INBOX_BATCH records at most per transaction,
    // waiting INBOX_BATCH_WAIT_MS for more.
    config.batch_max_records = number("INBOX_BATCH", 1usize)?;
    config.batch_max_wait = Duration::from_millis(number("INBOX_BATCH_WAIT_MS", 20u64)?);
    let hooks = CrashHooks {
        point: env("INBOX_CRASH_POINT"),
        event_key: env("INBOX_CRASH_EVENT_KEY"),
        marker: env("INBOX_CRASH_MARKER").map(PathBuf::from),
    };
    let inbox = Inbox::new(pool.clone(), config, &bootstrap)?.with_hooks(hooks);
    let consumer = InboxConsumer::with_config(kafka, &[&topic], inbox, handler)?;
    println!("READY");
    consumer
        .run_with(shutdown_signal(), |_, _, latency| bench.record(latency))
        .await?;
    bench.report();
    pool.disconnect().await?;
    Ok(())
}

/// Bench baseline: the same handler in autocommit, no inbox; offsets committed as the runner does.
async fn plain(
    mut kafka: ClientConfig,
    topic: &str,
    pool: &Pool,
    handler: &GrantCoupon,
    bench: &mut Bench,
) -> anyhow::Result<()> {
    use futures::FutureExt;
    kafka
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false");
    let consumer: StreamConsumer = kafka.create()?;
    consumer.subscribe(&[topic])?;
    let mut conn = pool.get_conn().await?;
    println!("READY");
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    let mut uncommitted = false;
    loop {
        let next = match consumer.recv().now_or_never() {
            Some(m) => m,
            None => {
                if uncommitted {
                    consumer.commit_consumer_state(CommitMode::Sync)?;
                    uncommitted = false;
                }
                tokio::select! {
                    _ = &mut shutdown => break,
                    m = consumer.recv() => m,
                }
            }
        };
        let message = next?;
        let received = Instant::now();
        let record = InboxRecord::from_message(&message);
        conn.exec_drop(INSERT_COUPON, handler.row(&record)).await?;
        consumer.store_offset(message.topic(), message.partition(), message.offset())?;
        uncommitted = true;
        if bench.record(received.elapsed()).is_break() {
            break;
        }
    }
    if uncommitted {
        consumer.commit_consumer_state(CommitMode::Sync)?;
    }
    Ok(())
}
