//! Metrics and health: the counters, gauges and histograms served at `/metrics` (Prometheus text
//! format 0.0.4, see [`crate::observe::http`]), the relay's state behind `/readyz`, and the progress log
//! line written while the relay catches up.
//!
//! One process-wide [`Metrics`] ([`global`]) is updated by the pipeline with one call per
//! site: events and rows read, records acknowledged, dead letters, checkpoint writes, errors and
//! reconnects. Every metric is named `outbox_relay_…` with its unit as suffix, by a constant of
//! [`super::names`]; docs/src/operations/metrics.md lists them all.
//!
//! # Label cardinality
//! Topics come from a template (`outbox.event.{aggregate_type}`), so their number depends on the
//! data. The first [`MAX_TOPIC_LABELS`] topics get their own `topic` label value; records of any
//! further topic are counted under `topic="_other"`. Tables are the configured outbox tables,
//! dead-letter kinds, error kinds and reconnect causes are fixed lists.
//!
//! # Lag and latency
//! Binlog event headers carry a timestamp in whole seconds (when the statement began on the
//! source). `outbox_relay_lag_seconds` is now minus the timestamp of the last event read, and 0
//! once a heartbeat arrived after it (the server sends heartbeats only when it has nothing else to
//! send, so the relay has read everything). `outbox_relay_binlog_to_ack_seconds` is the time from
//! a row's event timestamp to Kafka's acknowledgement, so it is up to 1 s too high;
//! `outbox_relay_read_to_ack_seconds` measures inside the relay, from reading the row to the
//! acknowledgement, with sub-millisecond resolution.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prometheus::local::{LocalHistogram, LocalIntCounter};
use prometheus::{
    Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

use super::names;
use crate::error::RelayError;
use crate::position::BinlogPosition;

/// The label every series of a source's metrics carries ([`Metrics::for_source`]): its
/// connector name.
pub const SOURCE_LABEL: &str = "source";

/// Most distinct `topic` label values; records of further topics count under
/// [`OTHER_TOPICS`].
pub const MAX_TOPIC_LABELS: usize = 100;

/// The `topic` label value of records beyond [`MAX_TOPIC_LABELS`] distinct topics.
pub const OTHER_TOPICS: &str = "_other";

/// Most distinct `table` label values of `outbox_relay_outbox_rows_read_total`; rows of
/// further tables count under [`OTHER_TABLES`].
pub const MAX_TABLE_LABELS: usize = 100;

/// The `table` label value of rows beyond [`MAX_TABLE_LABELS`] distinct tables.
pub const OTHER_TABLES: &str = "_other";

/// Interval of the progress log line while records flow or the relay lags behind.
pub const PROGRESS_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Buckets of `outbox_relay_binlog_to_ack_seconds` (event timestamps are whole seconds).
const BINLOG_TO_ACK_BUCKETS: [f64; 14] = [
    0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
];

/// Buckets of `outbox_relay_read_to_ack_seconds`.
const READ_TO_ACK_BUCKETS: [f64; 15] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Buckets of `outbox_relay_transaction_records`.
const TRANSACTION_RECORD_BUCKETS: [f64; 10] = [
    1.0, 10.0, 50.0, 100.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 50000.0,
];

/// What the relay is doing, for `/readyz`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Before the first connection attempt.
    Starting,
    /// Waiting for the connector's lease: another instance is active.
    WaitingForLease,
    /// Checking the server, loading the checkpoint, connecting to MySQL and Kafka.
    Connecting,
    /// The binlog stream is connected.
    Streaming,
    /// A run failed; the next attempt follows after a delay.
    Retrying {
        /// The error (already free of passwords).
        error: String,
        /// Consecutive failed attempts.
        attempt: usize,
        /// Delay before the next attempt, in ms.
        delay_ms: u64,
    },
    /// A stop was requested or the relay gave up.
    Stopping,
    /// One source of many stopped on an error that retrying cannot fix (configuration, a
    /// server prerequisite, a purged binlog, `retry.max_attempts`); the process and the other
    /// sources go on. It starts again on the next reload (SIGHUP or a changed config).
    Failed {
        /// The error (already free of passwords).
        error: String,
    },
}

/// Which row the dead-letter topic received, by why it could not be relayed
/// (`outbox_relay_records_dead_lettered_total{kind}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetterKind {
    /// `decode`: the row could not be read or mapped (a NULL aggregate id, an UPDATE with
    /// `on_update = "fail"`, a NULL payload with `null_payload = "dead_letter"`).
    Decode,
    /// `route`: no valid record could be built (a topic name Kafka forbids).
    Route,
    /// `producer`: the producer refused the record when it was queued (larger than
    /// `message.max.bytes`).
    Producer,
    /// `broker`: the broker refused the record for good (topic missing, not authorized, too
    /// large for the topic).
    Broker,
}

impl DeadLetterKind {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Decode => "decode",
            Self::Route => "route",
            Self::Producer => "producer",
            Self::Broker => "broker",
        }
    }
}

/// The `kind` label of `outbox_relay_errors_total`: the [`RelayError`] variant in snake case.
pub fn error_kind(e: &RelayError) -> &'static str {
    match e {
        RelayError::Config(_) => "config",
        RelayError::Prerequisite { .. } => "prerequisite",
        RelayError::Row { .. } => "row",
        RelayError::Mysql(_) => "mysql",
        RelayError::Kafka(_) => "kafka",
        RelayError::Binlog(_) => "binlog",
        RelayError::LeaseLost(_) => "lease_lost",
        RelayError::Fenced(_) => "fenced",
        RelayError::TransactionExpired(_) => "transaction_expired",
        RelayError::CommitUnknown { .. } => "commit_unknown",
        RelayError::Argument(_) => "argument",
    }
}

/// State behind the gauges computed at scrape time and `/readyz`.
#[derive(Debug)]
struct Live {
    state: State,
    /// When the last binlog event or heartbeat was read.
    last_activity: Option<Instant>,
    /// Source time (s since the epoch) up to which the relay has read everything: the
    /// timestamp of the last event read with a usable timestamp, or the time of a heartbeat
    /// that came after it.
    current_as_of: Option<f64>,
    /// A heartbeat arrived after the last event: everything was read.
    caught_up: bool,
    /// When the stored checkpoint was last known to include every acknowledged record.
    checkpoint_current_at: Option<Instant>,
    /// Since when, and why, no Kafka broker answered the readiness probe (`None`: the last
    /// probe succeeded, or none ran yet in this run).
    kafka_down: Option<(Instant, String)>,
    /// Exactly-once: since when the relay's Kafka transaction is open, and the age at which an
    /// open transaction makes the relay not ready (half of `kafka.transaction_timeout_ms`).
    transaction_open: Option<(Instant, Duration)>,
    /// Exactly-once: the partition whose last stable offset has not moved the longest while
    /// records follow it, as of the last sample.
    lso_stuck: Option<(String, i32, Duration)>,
    /// Outbox tables held because their topic is refused, each as `table (topic: error)`.
    held: Vec<String>,
}

/// The relay's metrics registry and health state. See the module documentation.
pub struct Metrics {
    registry: Registry,
    /// The `source` label's value (empty: none).
    source: String,
    binlog_events: IntCounter,
    heartbeats: IntCounter,
    unproven_acks: IntCounter,
    read_backs: IntCounterVec,
    rows_read: IntCounterVec,
    records_produced: IntCounterVec,
    bytes_produced: IntCounterVec,
    dead_lettered: IntCounterVec,
    in_flight: IntGauge,
    failed: IntGauge,
    checkpoint_file: IntGauge,
    checkpoint_pos: IntGauge,
    checkpoint_age: Gauge,
    checkpoint_writes: IntCounter,
    timestamp_fallbacks: IntCounter,
    held_records: IntGaugeVec,
    holds_started: IntCounter,
    hold_retries: IntCounter,
    cutover_skipped: IntCounter,
    cutover_checks: IntCounter,
    lag: Gauge,
    connected: IntGauge,
    binlog_to_ack: Histogram,
    read_to_ack: Histogram,
    reconnects: IntCounterVec,
    errors: IntCounterVec,
    transactions_committed: IntCounter,
    transactions_aborted: IntCounter,
    transaction_duration: Histogram,
    transaction_commit: Histogram,
    transaction_records: Histogram,
    transaction_open_age: Gauge,
    lso_lag: IntGauge,
    lso_stuck: Gauge,
    /// Exactly-once: the threshold of [`Live::transaction_open`], set by the sink.
    transaction_stall: Mutex<Duration>,
    rows_read_total: AtomicU64,
    /// Counters per topic label, so a record's acknowledgement costs one lookup (no label
    /// hashing in the registry, no allocation).
    topics: Mutex<HashMap<String, TopicCounters>>,
    /// `outbox_rows_read_total` per table (the configured outbox tables: a bounded set).
    tables: Mutex<HashMap<String, IntCounter>>,
    live: Mutex<Live>,
}

/// `records_produced_total` and `bytes_produced_total` of one `topic` label value, looked up
/// once ([`Metrics::topic_counters`]) and kept by an [`AckTally`] for the topic's next records.
#[derive(Clone)]
struct TopicCounters {
    records: IntCounter,
    bytes: IntCounter,
}

/// A run's acknowledgement series, counted on the pipeline's thread without atomics and added
/// to the shared series by [`AckTally::flush`]: `records_produced_total` and
/// `bytes_produced_total` of the last acknowledged record's topic, `read_to_ack_seconds` and
/// `binlog_to_ack_seconds` ([`Metrics::ack_tally`]).
///
/// Why: two counters and two histograms per record, each observation four atomic operations,
/// were about 5 % of the pipeline thread draining a backlog (issue 30's profile). The caller
/// flushes after each batch of delivery reports, so a scrape sees every acknowledgement filed
/// before it, as before.
pub struct AckTally {
    /// The topic of the counters in `topic` (compared by content: the router makes a new
    /// `Arc` when the topic changes back).
    topic: Option<(Arc<str>, LocalIntCounter, LocalIntCounter)>,
    read_to_ack: LocalHistogram,
    binlog_to_ack: LocalHistogram,
}

impl AckTally {
    /// Counts a record of `bytes` bytes on `topic` acknowledged at `clock`, whose row's binlog
    /// event has timestamp `event_time` (s since the epoch; 0 if unknown) and which was read
    /// at `read_at`. Shown once [`AckTally::flush`]ed.
    pub fn acked(
        &mut self,
        metrics: &Metrics,
        topic: &Arc<str>,
        bytes: u64,
        event_time: u32,
        read_at: Instant,
        clock: &AckClock,
    ) {
        let (_, records, bytes_total) = match &mut self.topic {
            Some(t) if *t.0 == **topic => t,
            current => {
                if let Some((_, records, bytes)) = current.as_mut() {
                    records.flush();
                    bytes.flush();
                }
                let c = metrics.topic_counters(topic);
                current.insert((Arc::clone(topic), c.records.local(), c.bytes.local()))
            }
        };
        records.inc();
        bytes_total.inc_by(bytes);
        self.read_to_ack
            .observe(clock.now.saturating_duration_since(read_at).as_secs_f64());
        if event_time != 0 {
            self.binlog_to_ack
                .observe((clock.unix_s - f64::from(event_time)).max(0.0));
        }
    }

    /// Adds what was counted since the last flush to the shared series.
    pub fn flush(&mut self) {
        if let Some((_, records, bytes)) = self.topic.as_mut() {
            records.flush();
            bytes.flush();
        }
        self.read_to_ack.flush();
        self.binlog_to_ack.flush();
    }
}

impl Drop for AckTally {
    fn drop(&mut self) {
        self.flush();
    }
}

/// `outbox_rows_read_total` of one table, looked up once ([`Metrics::table_rows`]).
#[derive(Clone)]
pub struct TableRows(IntCounter);

/// The time acknowledgements are counted at: read once per batch of delivery reports, not per
/// record (reading the clock was ~4 % of the relay's CPU while draining a backlog).
#[derive(Debug, Clone, Copy)]
pub struct AckClock {
    now: Instant,
    unix_s: f64,
}

impl AckClock {
    /// Now.
    pub fn now() -> Self {
        Self {
            now: Instant::now(),
            unix_s: now_unix(),
        }
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// The process's own metrics (not a source's): `outbox_relay_build_info`,
/// `outbox_relay_config_reloads_total` and, in a fleet, `outbox_relay_fleet_joined`.
#[derive(Clone)]
pub struct ProcessMetrics {
    reloads: IntCounterVec,
    registry: Registry,
    /// Registered by the first [`ProcessMetrics::fleet_joined`]: only a fleet's process has it.
    fleet_joined: Arc<OnceLock<IntGauge>>,
}

impl ProcessMetrics {
    /// Registers them in `registry`.
    pub fn register(registry: &Registry) -> Self {
        register_build_info(registry);
        let reloads = counter_vec(
            registry,
            names::CONFIG_RELOADS,
            "Reloads of a many-source configuration (SIGHUP, or a change found by \
             sources_poll_ms), by result: applied (sources added, changed, removed as the \
             configuration says; also when nothing changed) or failed (the new configuration is \
             invalid; the sources go on as before, the error is logged).",
            "result",
        );
        for result in ["applied", "failed"] {
            reloads.with_label_values(&[result]);
        }
        Self {
            reloads,
            registry: registry.clone(),
            fleet_joined: Arc::new(OnceLock::new()),
        }
    }

    /// Sets `outbox_relay_fleet_joined`: 1 once the process is a member of its fleet's group
    /// (a rebalance assigned it its share, possibly empty), 0 before and after it lost its
    /// membership. The gauge is registered by the first call, so a process without `[fleet]`
    /// has none.
    pub fn fleet_joined(&self, joined: bool) {
        self.fleet_joined
            .get_or_init(|| {
                gauge(
                    &self.registry,
                    names::FLEET_JOINED,
                    "1 while this process is a member of its fleet's consumer group (it was \
                     assigned its share of the sources, possibly none); 0 while it joins, retries \
                     or rejoins after losing its membership. Only with [fleet].",
                )
            })
            .set(i64::from(joined));
    }

    /// A reload was applied (`true`) or refused (`false`).
    pub fn config_reloaded(&self, applied: bool) {
        self.reloads
            .with_label_values(&[if applied { "applied" } else { "failed" }])
            .inc();
    }
}

/// Registers the `outbox_relay_build_info` gauge (one per process) in `registry`.
fn register_build_info(registry: &Registry) {
    let info = reg(
        registry,
        IntGaugeVec::new(
            Opts::new(
                names::BUILD_INFO,
                "Always 1; the label names the outbox-relay version.",
            ),
            &["version"],
        )
        .expect("valid gauge definition"),
    );
    info.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
}

/// Registers `metric` in `registry`; the definitions are constants, so a failure is a bug
/// caught by the unit tests.
fn reg<M: prometheus::core::Collector + Clone + 'static>(registry: &Registry, metric: M) -> M {
    registry
        .register(Box::new(metric.clone()))
        .expect("metric definitions are valid and unique");
    metric
}

fn counter(r: &Registry, name: &str, help: &str) -> IntCounter {
    reg(
        r,
        IntCounter::new(name, help).expect("valid counter definition"),
    )
}

fn counter_vec(r: &Registry, name: &str, help: &str, label: &str) -> IntCounterVec {
    reg(
        r,
        IntCounterVec::new(Opts::new(name, help), &[label]).expect("valid counter definition"),
    )
}

fn gauge(r: &Registry, name: &str, help: &str) -> IntGauge {
    reg(
        r,
        IntGauge::new(name, help).expect("valid gauge definition"),
    )
}

fn float_gauge(r: &Registry, name: &str, help: &str) -> Gauge {
    reg(r, Gauge::new(name, help).expect("valid gauge definition"))
}

fn histogram(r: &Registry, name: &str, help: &str, buckets: &[f64]) -> Histogram {
    reg(
        r,
        Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))
            .expect("valid histogram definition"),
    )
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Seconds since the Unix epoch, as a float.
fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The sequence number of a binlog file name (`mariadb-bin.000042` → 42).
fn file_sequence(file: &str) -> Option<i64> {
    file.rsplit_once('.')?.1.parse().ok()
}

impl Metrics {
    /// A fresh registry with every metric at zero (state [`State::Starting`]) and
    /// `outbox_relay_build_info`, without a `source` label: for tests and one-off tools.
    pub fn new() -> Self {
        let r = Registry::new();
        ProcessMetrics::register(&r);
        Self::in_registry(r, String::new())
    }

    /// The metrics of one source: every series carries the label `source="<name>"` (the
    /// source's connector name). [`crate::observe::hub::Hub`] serves them with the other
    /// sources' and the process's `outbox_relay_build_info`.
    pub fn for_source(name: &str) -> Self {
        let labels = HashMap::from([(SOURCE_LABEL.to_owned(), name.to_owned())]);
        let r = Registry::new_custom(None, Some(labels))
            .expect("a constant label name and any value are valid");
        Self::in_registry(r, name.to_owned())
    }

    /// The source these metrics belong to (empty for [`Metrics::new`]).
    pub fn source(&self) -> &str {
        &self.source
    }

    fn in_registry(r: Registry, source: String) -> Self {
        Self {
            source,
            binlog_events: counter(
                &r,
                names::BINLOG_EVENTS_READ,
                "Binlog events read from the source (heartbeats not included).",
            ),
            heartbeats: counter(
                &r,
                names::BINLOG_HEARTBEATS,
                "Heartbeats received from the source while it had no events to send.",
            ),
            unproven_acks: counter(
                &r,
                names::UNPROVEN_ACKS,
                "Delivery reports of success without an offset (the broker answered \
                 DUPLICATE_SEQUENCE_NUMBER): not trusted, the records are sent again from the \
                 last checkpoint.",
            ),
            read_backs: counter_vec(
                &r,
                names::READ_BACKS,
                "First acknowledgements of partitions new to the process read back from the log \
                 before the checkpoint passes them, by result (`stored`, or `missing`: the run \
                 restarts from its checkpoint and sends them again).",
                "result",
            ),
            rows_read: counter_vec(
                &r,
                names::OUTBOX_ROWS_READ,
                "Inserted outbox rows read from the binlog and handed to the producer, by outbox \
                 table (database.table). Rows acknowledged before a restart and skipped on \
                 resume are not counted.",
                "table",
            ),
            records_produced: counter_vec(
                &r,
                names::RECORDS_PRODUCED,
                "Records of outbox rows acknowledged by Kafka (acks=all), by topic; the first \
                 100 distinct topics have their own label value, later ones count as \
                 topic=\"_other\". Dead letters are counted by \
                 outbox_relay_records_dead_lettered_total instead.",
                "topic",
            ),
            bytes_produced: counter_vec(
                &r,
                names::BYTES_PRODUCED,
                "Bytes of the records counted by outbox_relay_records_produced_total: key, \
                 value, header names and header values (protocol overhead not included), by \
                 topic.",
                "topic",
            ),
            dead_lettered: counter_vec(
                &r,
                names::RECORDS_DEAD_LETTERED,
                "Rows sent to the dead-letter topic, by why: decode (the row cannot be read or \
                 mapped), route (no valid topic), producer (refused when queued, e.g. too \
                 large), broker (refused by the broker for good).",
                "kind",
            ),
            failed: gauge(
                &r,
                names::SOURCE_FAILED,
                "1 while the source is stopped on an error that retrying cannot fix (a \
                 configuration error, an unmet server prerequisite, a purged binlog, \
                 retry.max_attempts reached); the process and its other sources go on. The \
                 error is in the log and /readyz; a reload (SIGHUP) starts the source again.",
            ),
            in_flight: gauge(
                &r,
                names::RECORDS_IN_FLIGHT,
                "Records produced and not yet acknowledged by Kafka (at most \
                 kafka.max_in_flight).",
            ),
            checkpoint_file: gauge(
                &r,
                names::CHECKPOINT_BINLOG_FILE_SEQUENCE,
                "Sequence number of the stored checkpoint's binlog file (mariadb-bin.000042 is \
                 42).",
            ),
            checkpoint_pos: gauge(
                &r,
                names::CHECKPOINT_BINLOG_POSITION,
                "Byte offset of the stored checkpoint in its binlog file.",
            ),
            checkpoint_age: float_gauge(
                &r,
                names::CHECKPOINT_AGE,
                "Seconds since the stored checkpoint was last known to include every record \
                 Kafka acknowledged (a checkpoint write, or a check that found nothing new to \
                 write); grows while checkpoint writes fail. Computed at scrape time.",
            ),
            timestamp_fallbacks: counter(
                &r,
                names::TIMESTAMP_FALLBACKS,
                "Records sent with the transaction's commit time because their topic would \
                 refuse their created_at value (outbox.timestamp = \"column\", \
                 timestamp_refused = \"commit\"); each carries header timestamp_fallback.",
            ),
            held_records: reg(
                &r,
                IntGaugeVec::new(
                    Opts::new(
                        names::HELD_RECORDS,
                        "Records held in memory because their topic is refused \
                         (dead_letter.refused_topic = \"hold\"), by outbox table; the \
                         checkpoint stays before the first of them. Tables beyond the first 100 \
                         count as table=\"_other\".",
                    ),
                    &["table"],
                )
                .expect("valid gauge definition"),
            ),
            holds_started: counter(
                &r,
                names::HOLDS_STARTED,
                "Outbox tables held because the brokers refused a record's topic \
                 (dead_letter.refused_topic = \"hold\"); each hold is also logged once.",
            ),
            hold_retries: counter(
                &r,
                names::HOLD_RETRIES,
                "Retries of held tables, on the [retry] backoff: each asks the brokers about \
                 the topic again, or (a topic refused only when written to) sends the table's \
                 first held record alone with a producer of its own.",
            ),
            cutover_skipped: counter(
                &r,
                names::CUTOVER_SKIPPED,
                "Outbox rows not produced because [cutover] says the previous (polling) relay \
                 already sent them (cutover.skip_if matched, or the id is at most \
                 cutover.skip_ids_through). They still move the checkpoint.",
            ),
            cutover_checks: counter(
                &r,
                names::CUTOVER_CHECKS,
                "Queries of cutover.skip_if against an outbox table (one per source transaction \
                 and table, more for transactions over 1000 rows).",
            ),
            checkpoint_writes: counter(
                &r,
                names::CHECKPOINT_WRITES,
                "Checkpoint rows written to the state table.",
            ),
            lag: float_gauge(
                &r,
                names::LAG,
                "How far behind the source the relay reads: now minus the timestamp of the last \
                 binlog event read, 0 once a heartbeat came after it (all read). Event \
                 timestamps have 1 s resolution. Computed at scrape time.",
            ),
            connected: gauge(
                &r,
                names::SOURCE_CONNECTED,
                "1 while the binlog stream is connected, else 0.",
            ),
            binlog_to_ack: histogram(
                &r,
                names::BINLOG_TO_ACK,
                "Per record counted by outbox_relay_records_produced_total: from the binlog \
                 timestamp of the row's event (when its statement began on the source; for an XA \
                 transaction its XA COMMIT) to Kafka's acknowledgement. Binlog timestamps are \
                 whole seconds, so values are up to 1 s too high.",
                &BINLOG_TO_ACK_BUCKETS,
            ),
            read_to_ack: histogram(
                &r,
                names::READ_TO_ACK,
                "Per record counted by outbox_relay_records_produced_total: from reading its row \
                 in the relay to Kafka's acknowledgement.",
                &READ_TO_ACK_BUCKETS,
            ),
            reconnects: counter_vec(
                &r,
                names::RECONNECTS,
                "Reconnections of the relay to MySQL and Kafka after a failure, by the failure's \
                 cause: mysql, kafka or lease (the lease was lost).",
                "cause",
            ),
            errors: counter_vec(
                &r,
                names::ERRORS,
                "Errors that ended a run, by kind (the RelayError variant): config, \
                 prerequisite, row, mysql, kafka, binlog, lease_lost, fenced, \
                 transaction_expired, commit_unknown, argument.",
                "kind",
            ),
            transactions_committed: counter(
                &r,
                names::TRANSACTIONS_COMMITTED,
                "Exactly-once: Kafka transactions committed (records with their resume point).",
            ),
            transactions_aborted: counter(
                &r,
                names::TRANSACTIONS_ABORTED,
                "Exactly-once: Kafka transactions aborted (their records are sent again from the \
                 last committed resume point; read_committed consumers never see them).",
            ),
            transaction_duration: histogram(
                &r,
                names::TRANSACTION_DURATION,
                "Exactly-once: from a Kafka transaction's first record to its commit.",
                &READ_TO_ACK_BUCKETS,
            ),
            transaction_commit: histogram(
                &r,
                names::TRANSACTION_COMMIT,
                "Exactly-once: the commit call itself (EndTxn on the coordinator).",
                &READ_TO_ACK_BUCKETS,
            ),
            transaction_records: histogram(
                &r,
                names::TRANSACTION_RECORDS,
                "Exactly-once: records (dead letters included) per committed Kafka transaction.",
                &TRANSACTION_RECORD_BUCKETS,
            ),
            transaction_open_age: float_gauge(
                &r,
                names::TRANSACTION_OPEN,
                "Exactly-once: how long the relay's current Kafka transaction has been open (0 \
                 when none is): an open transaction holds back the last stable offset, so \
                 read_committed consumers see nothing after its first record. Computed at \
                 scrape time.",
            ),
            lso_lag: gauge(
                &r,
                names::LAST_STABLE_OFFSET_LAG,
                "Exactly-once: summed over the partitions of the topics the relay writes (the \
                 progress topic included), high watermark minus last stable offset: records \
                 read_committed consumers cannot see yet because a transaction before them is \
                 open. Sampled every few seconds.",
            ),
            lso_stuck: float_gauge(
                &r,
                names::LAST_STABLE_OFFSET_STUCK,
                "Exactly-once: the longest time a last stable offset of those partitions has not \
                 moved while records follow it: a hanging transaction (the relay's own, or \
                 another producer's) that read_committed consumers wait for. Sampled.",
            ),
            transaction_stall: Mutex::new(Duration::MAX),
            registry: r,
            rows_read_total: AtomicU64::new(0),
            topics: Mutex::new(HashMap::new()),
            tables: Mutex::new(HashMap::new()),
            live: Mutex::new(Live {
                state: State::Starting,
                last_activity: None,
                current_as_of: None,
                caught_up: false,
                checkpoint_current_at: None,
                kafka_down: None,
                transaction_open: None,
                lso_stuck: None,
                held: Vec::new(),
            }),
        }
    }

    fn live(&self) -> MutexGuard<'_, Live> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The Prometheus text exposition of every metric, after updating the gauges computed at
    /// scrape time (lag, checkpoint age).
    pub fn render(&self) -> String {
        TextEncoder::new()
            .encode_to_string(&self.gather())
            .unwrap_or_else(|e| format!("# encoding the metrics failed: {e}\n"))
    }

    /// Every metric family, after updating the gauges computed at scrape time (lag,
    /// checkpoint age), for [`crate::observe::hub::Hub::render`].
    pub fn gather(&self) -> Vec<prometheus::proto::MetricFamily> {
        {
            let live = self.live();
            self.lag.set(lag_of(&live, now_unix()));
            if let Some(at) = live.checkpoint_current_at {
                self.checkpoint_age.set(at.elapsed().as_secs_f64());
            }
            self.transaction_open_age.set(
                live.transaction_open
                    .map_or(0.0, |(since, _)| since.elapsed().as_secs_f64()),
            );
        }
        self.registry.gather()
    }

    /// `Ok(text)` when the relay is streaming, has read an event or heartbeat within `stall`,
    /// and Kafka has not been unreachable for `kafka` or longer; otherwise `Err(reason)`.
    pub fn readiness(&self, stall: Duration, kafka: Duration) -> Result<String, String> {
        let live = self.live();
        match &live.state {
            State::Streaming => {}
            State::Starting => return Err("starting".into()),
            State::WaitingForLease => {
                return Err("waiting for this connector's lease: another instance is \
                            active (it releases the lease when it stops)"
                    .into())
            }
            State::Connecting => {
                return Err(
                    "connecting: checking the server, loading the checkpoint and \
                            connecting to MySQL and Kafka"
                        .into(),
                )
            }
            State::Retrying {
                error,
                attempt,
                delay_ms,
            } => {
                return Err(format!(
                    "not streaming: attempt {attempt} failed, retrying in {delay_ms} ms: {}",
                    crate::error::redact_error(error)
                ))
            }
            State::Stopping => return Err("stopping".into()),
            State::Failed { error } => {
                return Err(format!(
                    "failed: {}. Fix the cause, then reload the configuration (SIGHUP) to \
                     start this source again",
                    crate::error::redact_error(error)
                ))
            }
        }
        if let Some((since, error)) = &live.kafka_down {
            let down = since.elapsed();
            if down >= kafka {
                return Err(format!(
                    "Kafka unreachable for {} ms (http.ready_kafka_ms = {}): {}",
                    down.as_millis(),
                    kafka.as_millis(),
                    crate::error::redact_error(error)
                ));
            }
        }
        if let Some((since, limit)) = live.transaction_open {
            let open = since.elapsed();
            if open >= limit {
                return Err(format!(
                    "a Kafka transaction has been open for {} ms (more than half of \
                     kafka.transaction_timeout_ms): it holds back the last stable offset, so \
                     read_committed consumers see nothing new",
                    open.as_millis()
                ));
            }
        }
        let limit = *self
            .transaction_stall
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some((topic, partition, age)) = &live.lso_stuck {
            if *age >= limit {
                return Err(format!(
                    "the last stable offset of {topic} [{partition}] has not moved for {} ms \
                     while records follow it: a transaction is hanging there (the relay's own, \
                     or another producer's), and read_committed consumers see nothing after it",
                    age.as_millis()
                ));
            }
        }
        let idle = live.last_activity.map_or(Duration::MAX, |t| t.elapsed());
        if idle > stall {
            let in_flight = self.in_flight.get();
            let why = if in_flight > 0 {
                format!("{in_flight} records in flight: reading waits for Kafka's acknowledgements")
            } else if !live.held.is_empty() {
                format!(
                    "reading may wait for held tables (dead_letter.hold_max_records): {}",
                    live.held.join("; ")
                )
            } else {
                "the source sends neither events nor heartbeats".to_owned()
            };
            return Err(format!(
                "stalled: no binlog event or heartbeat read for {} ms (http.ready_stall_ms = \
                 {}); {why}",
                idle.as_millis(),
                stall.as_millis()
            ));
        }
        if live.held.is_empty() {
            Ok("streaming".into())
        } else {
            Ok(format!("streaming; holding {}", live.held.join("; ")))
        }
    }

    /// The outbox tables held now because their topic is refused, each described as
    /// `table (topic: error)`; shown by `/readyz` (still ready: the other tables flow).
    pub fn set_held(&self, held: Vec<String>) {
        self.live().held = held;
    }

    /// The readiness probe sent at `asked` reached a Kafka broker (`Ok`), or no broker
    /// answered (`Err` with the probe's error): /readyz turns not ready once the cluster has
    /// been unreachable, counted from the first failed probe's start, for `http.ready_kafka_ms`.
    pub fn kafka_probe(&self, asked: Instant, result: Result<(), String>) {
        let mut live = self.live();
        match result {
            Ok(()) => live.kafka_down = None,
            Err(e) => match &mut live.kafka_down {
                Some((_, last)) => *last = e,
                None => live.kafka_down = Some((asked, e)),
            },
        }
    }

    /// Exactly-once: an open transaction makes the relay not ready after `limit`.
    pub fn set_transaction_stall(&self, limit: Duration) {
        *self
            .transaction_stall
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = limit;
    }

    /// Exactly-once: a Kafka transaction was begun.
    pub fn transaction_opened(&self) {
        let limit = *self
            .transaction_stall
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        self.live().transaction_open = Some((Instant::now(), limit));
    }

    /// Exactly-once: the open transaction ended (committed or aborted).
    pub fn transaction_closed(&self) {
        self.live().transaction_open = None;
    }

    /// Exactly-once: a transaction of `records` records, open for `age`, was committed by a
    /// commit call that took `commit`.
    pub fn transaction_committed(&self, age: Duration, records: u64, commit: Duration) {
        self.transactions_committed.inc();
        self.transaction_duration.observe(age.as_secs_f64());
        self.transaction_commit.observe(commit.as_secs_f64());
        self.transaction_records.observe(records as f64);
    }

    /// Exactly-once: a sample of the last stable offsets: the summed lag, and the partition whose
    /// offset has been stuck the longest.
    pub fn last_stable_offset(&self, lag: i64, stuck: Option<(String, i32, Duration)>) {
        self.lso_lag.set(lag);
        self.lso_stuck
            .set(stuck.as_ref().map_or(0.0, |s| s.2.as_secs_f64()));
        self.live().lso_stuck = stuck;
    }

    /// Exactly-once: a transaction was aborted.
    pub fn transaction_aborted(&self) {
        self.transactions_aborted.inc();
    }

    /// The current state.
    pub fn state(&self) -> State {
        self.live().state.clone()
    }

    /// Sets the state; any state but [`State::Streaming`] means the stream is not connected.
    pub fn set_state(&self, state: State) {
        let mut live = self.live();
        if state == State::Streaming {
            live.last_activity = Some(Instant::now());
            live.caught_up = false;
            live.kafka_down = None;
        }
        self.connected.set(i64::from(state == State::Streaming));
        self.failed
            .set(i64::from(matches!(state, State::Failed { .. })));
        live.state = state;
    }

    /// One binlog event was read from the source; `dated_at` is its timestamp (s since the
    /// epoch) when that says how current the stream is (`None` for the format description a
    /// dump starts with, which carries the file's creation time, and artificial events).
    pub fn event_read(&self, dated_at: Option<u32>) {
        self.binlog_events.inc();
        let mut live = self.live();
        live.last_activity = Some(Instant::now());
        if let Some(t) = dated_at {
            live.current_as_of = Some(f64::from(t));
            live.caught_up = false;
        }
    }

    /// A first acknowledgement of a partition was read back: `stored` or not.
    pub fn read_back(&self, stored: bool) {
        self.read_backs
            .with_label_values(&[if stored { "stored" } else { "missing" }])
            .inc();
    }

    /// Kafka reported a record delivered without an offset (not trusted: sent again).
    pub fn unproven_ack(&self) {
        self.unproven_acks.inc();
    }

    /// A heartbeat arrived: the source had nothing more to send.
    pub fn heartbeat(&self) {
        self.heartbeats.inc();
        let mut live = self.live();
        live.last_activity = Some(Instant::now());
        live.current_as_of = Some(now_unix().floor());
        live.caught_up = true;
    }

    /// An outbox row of `table` was read and is about to be produced.
    pub fn row_read(&self, table: &str) {
        self.row_read_in(&self.table_rows(table));
    }

    /// The `outbox_rows_read_total` counter of `table`, for [`Metrics::row_read_in`].
    pub fn table_rows(&self, table: &str) -> TableRows {
        let mut tables = self.tables.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = tables.get(table) {
            return TableRows(c.clone());
        }
        // Tables matched by a pattern (one per tenant) can be many: as for topics, the first
        // MAX_TABLE_LABELS get their own value, the others share OTHER_TABLES's.
        if tables.len() >= MAX_TABLE_LABELS {
            return TableRows(self.rows_read.with_label_values(&[OTHER_TABLES]));
        }
        let c = self.rows_read.with_label_values(&[table]);
        tables.insert(table.to_owned(), c.clone());
        TableRows(c)
    }

    /// An outbox row of the table of `rows` was read.
    pub fn row_read_in(&self, rows: &TableRows) {
        rows.0.inc();
        self.rows_read_total.fetch_add(1, Ordering::Relaxed);
    }

    /// Outbox rows read so far (every table).
    pub fn rows_read_total(&self) -> u64 {
        self.rows_read_total.load(Ordering::Relaxed)
    }

    /// Kafka acknowledged a record of `bytes` bytes on `topic`, whose row's binlog event has
    /// timestamp `event_time` (s since the epoch; 0 if unknown) and which was read at `read_at`:
    /// one record's [`AckTally`], flushed at once. The relay itself tallies per batch of
    /// delivery reports; this is the tests' shorthand.
    #[cfg(test)]
    fn record_acked(&self, topic: &str, bytes: u64, event_time: u32, read_at: Instant) {
        self.ack_tally().acked(
            self,
            &Arc::from(topic),
            bytes,
            event_time,
            read_at,
            &AckClock::now(),
        );
    }

    /// The counters of `topic`, for [`AckTally`].
    fn topic_counters(&self, topic: &str) -> TopicCounters {
        let mut topics = self.topics.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = topics.get(topic) {
            return c.clone();
        }
        // The first MAX_TOPIC_LABELS topics get their own label value (see MAX_TOPIC_LABELS);
        // the others share OTHER_TOPICS's entry.
        let label = if topics.len() < MAX_TOPIC_LABELS {
            topic
        } else {
            OTHER_TOPICS
        };
        let c = TopicCounters {
            records: self.records_produced.with_label_values(&[label]),
            bytes: self.bytes_produced.with_label_values(&[label]),
        };
        if topics.len() < MAX_TOPIC_LABELS {
            topics.insert(topic.to_owned(), c.clone());
        }
        c
    }

    /// The acknowledgement series of a run, counted on its pipeline's thread ([`AckTally`]).
    pub fn ack_tally(&self) -> AckTally {
        AckTally {
            topic: None,
            read_to_ack: self.read_to_ack.local(),
            binlog_to_ack: self.binlog_to_ack.local(),
        }
    }

    /// A record is sent with its commit time instead of a `created_at` value its topic
    /// would refuse.
    pub fn timestamp_fallback(&self) {
        self.timestamp_fallbacks.inc();
    }

    /// `rows` outbox rows were skipped by the cutover filter (`[cutover]`).
    pub fn cutover_skipped(&self, rows: u64) {
        self.cutover_skipped.inc_by(rows);
    }

    /// One query of `cutover.skip_if` ran.
    pub fn cutover_check(&self) {
        self.cutover_checks.inc();
    }

    /// `delta` more (or, negative, fewer) records of `table` are held
    /// ([`names::HELD_RECORDS`]; the label capped as `outbox_rows_read_total`'s).
    pub fn held_records(&self, table: &str, delta: i64) {
        let own = self
            .tables
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(table);
        let label = if own { table } else { OTHER_TABLES };
        self.held_records.with_label_values(&[label]).add(delta);
    }

    /// A table started to be held ([`names::HOLDS_STARTED`]).
    pub fn hold_started(&self) {
        self.holds_started.inc();
    }

    /// A held table was retried ([`names::HOLD_RETRIES`]).
    pub fn hold_retried(&self) {
        self.hold_retries.inc();
    }

    /// A row goes to the dead-letter topic.
    pub fn dead_lettered(&self, kind: DeadLetterKind) {
        self.dead_lettered.with_label_values(&[kind.as_str()]).inc();
    }

    /// Records produced and not acknowledged yet.
    pub fn set_in_flight(&self, records: usize) {
        self.in_flight
            .set(i64::try_from(records).unwrap_or(i64::MAX));
    }

    /// The stored checkpoint is at `position` (`written`: this process just wrote it, rather
    /// than read it).
    pub fn checkpoint_stored(&self, position: &BinlogPosition, written: bool) {
        if let Some(seq) = file_sequence(&position.file) {
            self.checkpoint_file.set(seq);
        }
        self.checkpoint_pos
            .set(i64::try_from(position.pos).unwrap_or(i64::MAX));
        if written {
            self.checkpoint_writes.inc();
        }
        self.checkpoint_current();
    }

    /// The stored checkpoint includes every acknowledged record.
    pub fn checkpoint_current(&self) {
        self.live().checkpoint_current_at = Some(Instant::now());
    }

    /// A run ended with `e`.
    pub fn error(&self, e: &RelayError) {
        self.errors.with_label_values(&[error_kind(e)]).inc();
    }

    /// The relay reconnects after `cause` ended the previous run.
    pub fn reconnect(&self, cause: &RelayError) {
        let label = match cause {
            RelayError::Kafka(_)
            | RelayError::TransactionExpired(_)
            | RelayError::CommitUnknown { .. } => "kafka",
            RelayError::LeaseLost(_) | RelayError::Fenced(_) => "lease",
            _ => "mysql",
        };
        self.reconnects.with_label_values(&[label]).inc();
    }

    /// The current lag behind the source, in seconds (see `outbox_relay_lag_seconds`).
    pub fn lag_seconds(&self) -> f64 {
        lag_of(&self.live(), now_unix())
    }
}

/// `outbox_relay_lag_seconds` at `now` (s since the epoch): whole seconds, like event
/// timestamps. While disconnected (or after a reconnect, until a heartbeat or event arrives) it
/// counts from the last point known to be current.
fn lag_of(live: &Live, now: f64) -> f64 {
    match live.current_as_of {
        Some(_) if live.caught_up && live.state == State::Streaming => 0.0,
        Some(t) => (now.floor() - t).max(0.0),
        None => 0.0,
    }
}

/// The progress line logged every [`PROGRESS_LOG_INTERVAL`] while records flow or the relay
/// lags behind the source (catching up after a pause or a restart).
#[derive(Debug)]
pub struct ProgressLog {
    metrics: std::sync::Arc<Metrics>,
    since: Instant,
    rows_read: u64,
    records_acked: u64,
}

impl ProgressLog {
    /// Counting from now, with `records_acked` acknowledged so far, from `metrics`'s rows read.
    pub fn new(metrics: std::sync::Arc<Metrics>, records_acked: u64) -> Self {
        Self {
            since: Instant::now(),
            rows_read: metrics.rows_read_total(),
            metrics,
            records_acked,
        }
    }

    /// Logs the progress since the last call if rows were read, records acknowledged, or the
    /// relay is at least 1 s behind. `position`: the acknowledged checkpoint.
    pub fn log(&mut self, records_acked: u64, position: &BinlogPosition) {
        let rows_read = self.metrics.rows_read_total();
        let lag = self.metrics.lag_seconds();
        let secs = self.since.elapsed().as_secs_f64().max(0.001);
        let rows = rows_read.saturating_sub(self.rows_read);
        let acked = records_acked.saturating_sub(self.records_acked);
        if rows > 0 || acked > 0 || lag >= 1.0 {
            tracing::info!(
                rows_per_second = (rows as f64 / secs * 10.0).round() / 10.0,
                rows_read = rows,
                records_acked = acked,
                records_acked_total = records_acked,
                lag_seconds = lag,
                position = %position,
                "progress"
            );
        }
        self.since = Instant::now();
        self.rows_read = rows_read;
        self.records_acked = records_acked;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// The registry holds exactly the metrics named in [`names::ALL`], each once, and `ALL`
    /// lists every constant of `names.rs`: a metric registered without a constant, or a
    /// constant never registered, fails here.
    #[test]
    fn every_metric_is_registered_once_under_a_name_constant() {
        let r = Registry::new();
        // A fleet's process: its gauge too.
        ProcessMetrics::register(&r).fleet_joined(false);
        let m = Metrics::in_registry(r, String::new());
        // A labelled metric is gathered only once it has a label value. A new labelled metric
        // belongs in this list, or the test reports its constant as not registered.
        for labelled in [
            &m.read_backs,
            &m.rows_read,
            &m.records_produced,
            &m.bytes_produced,
            &m.dead_lettered,
            &m.reconnects,
            &m.errors,
        ] {
            labelled.with_label_values(&["x"]);
        }
        m.held_records.with_label_values(&["x"]);
        let families = m.registry.gather();
        let registered: Vec<&str> = families.iter().map(|f| f.name()).collect();
        let not_registered: Vec<&str> = names::ALL
            .iter()
            .filter(|n| !registered.contains(n))
            .copied()
            .collect();
        let no_constant: Vec<&str> = registered
            .iter()
            .filter(|n| !names::ALL.contains(n))
            .copied()
            .collect();
        assert!(
            not_registered.is_empty() && no_constant.is_empty(),
            "constants not registered: {not_registered:?}; registered without a constant in \
             names::ALL: {no_constant:?}"
        );
        assert_eq!(
            registered.len(),
            names::ALL.len(),
            "a name is listed twice in names::ALL"
        );
        let declared = include_str!("names.rs")
            .lines()
            .filter(|l| l.starts_with("pub const ") && l.contains(": &str = "))
            .count();
        assert_eq!(
            declared,
            names::ALL.len(),
            "names::ALL lists every constant"
        );
    }

    #[test]
    fn an_ack_tally_shows_its_counts_once_flushed_and_at_each_change_of_topic() {
        let m = Metrics::new();
        let mut tally = m.ack_tally();
        let (order, payment): (Arc<str>, Arc<str>) = (Arc::from("t.Order"), Arc::from("t.Payment"));
        let clock = AckClock::now();
        let ten_s_ago = u32::try_from(now_unix() as u64 - 10).expect("fits");
        tally.acked(&m, &order, 10, ten_s_ago, Instant::now(), &clock);
        tally.acked(&m, &Arc::from("t.Order"), 15, 0, Instant::now(), &clock);
        let records = |text: &str, topic: &str| {
            value(
                text,
                &format!("outbox_relay_records_produced_total{{topic=\"{topic}\"}}"),
            )
        };
        let text = m.render();
        assert_eq!(
            records(&text, "t.Order"),
            Some(0.0),
            "not before a flush:\n{text}"
        );
        assert_eq!(
            value(&text, "outbox_relay_read_to_ack_seconds_count"),
            Some(0.0)
        );
        // Another topic: the first one's counters are flushed.
        tally.acked(&m, &payment, 7, 0, Instant::now(), &clock);
        let text = m.render();
        assert_eq!(records(&text, "t.Order"), Some(2.0), "{text}");
        assert_eq!(
            value(
                &text,
                "outbox_relay_bytes_produced_total{topic=\"t.Order\"}"
            ),
            Some(25.0)
        );
        assert_eq!(records(&text, "t.Payment"), Some(0.0));
        tally.flush();
        let text = m.render();
        assert_eq!(records(&text, "t.Payment"), Some(1.0), "{text}");
        assert_eq!(
            value(&text, "outbox_relay_read_to_ack_seconds_count"),
            Some(3.0)
        );
        // Only the record with an event time is in binlog → ack, at about 10 s.
        assert_eq!(
            value(&text, "outbox_relay_binlog_to_ack_seconds_count"),
            Some(1.0)
        );
        let sum = value(&text, "outbox_relay_binlog_to_ack_seconds_sum").expect("a sum");
        assert!((9.0..12.0).contains(&sum), "{sum}");
        // Dropped: what is left is flushed.
        tally.acked(&m, &payment, 1, 0, Instant::now(), &clock);
        drop(tally);
        assert_eq!(records(&m.render(), "t.Payment"), Some(2.0));
    }

    #[test]
    fn renders_counters_gauges_and_histograms_in_text_format() {
        let m = Metrics::new();
        m.row_read("shop.outbox");
        m.row_read("shop.outbox");
        let read_at = Instant::now();
        m.record_acked("t.Order", 10, 0, read_at);
        m.record_acked("t.Order", 15, 0, read_at);
        m.record_acked("t.Payment", 7, 0, read_at);
        m.dead_lettered(DeadLetterKind::Broker);
        m.set_in_flight(3);
        m.checkpoint_stored(&BinlogPosition::new("mariadb-bin.000042", 1234), true);
        m.error(&RelayError::mysql("gone"));
        m.reconnect(&RelayError::kafka("down"));
        let text = m.render();
        let expect = [
            (
                "outbox_relay_outbox_rows_read_total{table=\"shop.outbox\"}",
                2.0,
            ),
            (
                "outbox_relay_records_produced_total{topic=\"t.Order\"}",
                2.0,
            ),
            (
                "outbox_relay_records_produced_total{topic=\"t.Payment\"}",
                1.0,
            ),
            ("outbox_relay_bytes_produced_total{topic=\"t.Order\"}", 25.0),
            (
                "outbox_relay_records_dead_lettered_total{kind=\"broker\"}",
                1.0,
            ),
            ("outbox_relay_records_in_flight", 3.0),
            ("outbox_relay_checkpoint_binlog_file_sequence", 42.0),
            ("outbox_relay_checkpoint_binlog_position_bytes", 1234.0),
            ("outbox_relay_checkpoint_writes_total", 1.0),
            ("outbox_relay_errors_total{kind=\"mysql\"}", 1.0),
            ("outbox_relay_reconnects_total{cause=\"kafka\"}", 1.0),
            ("outbox_relay_read_to_ack_seconds_count", 3.0),
            // Unknown event times are not observed.
            ("outbox_relay_binlog_to_ack_seconds_count", 0.0),
            ("outbox_relay_source_connected", 0.0),
        ];
        for (series, want) in expect {
            assert_eq!(value(&text, series), Some(want), "{series} in\n{text}");
        }
        let info = format!(
            "outbox_relay_build_info{{version=\"{}\"}}",
            env!("CARGO_PKG_VERSION")
        );
        assert_eq!(value(&text, &info), Some(1.0), "{text}");
        assert!(
            text.contains("# TYPE outbox_relay_read_to_ack_seconds histogram"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE outbox_relay_records_produced_total counter"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE outbox_relay_checkpoint_age_seconds gauge"),
            "{text}"
        );
        let age = value(&text, "outbox_relay_checkpoint_age_seconds").expect("age");
        assert!((0.0..5.0).contains(&age), "{age}");
    }

    #[test]
    fn binlog_to_ack_uses_the_event_timestamp() {
        let m = Metrics::new();
        let ten_s_ago = (now_unix() as u32) - 10;
        m.record_acked("t", 1, ten_s_ago, Instant::now());
        let text = m.render();
        assert_eq!(
            value(&text, "outbox_relay_binlog_to_ack_seconds_count"),
            Some(1.0)
        );
        let sum = value(&text, "outbox_relay_binlog_to_ack_seconds_sum").expect("sum");
        assert!((10.0..12.0).contains(&sum), "{sum}");
        // 10 s lies in the 10 s bucket, not the 5 s one.
        assert_eq!(
            value(&text, "outbox_relay_binlog_to_ack_seconds_bucket{le=\"5\"}"),
            Some(0.0)
        );
        assert_eq!(
            value(
                &text,
                "outbox_relay_binlog_to_ack_seconds_bucket{le=\"30\"}"
            ),
            Some(1.0)
        );
    }

    #[test]
    fn topic_labels_are_capped() {
        let m = Metrics::new();
        for i in 0..MAX_TOPIC_LABELS + 5 {
            m.record_acked(&format!("topic{i}"), 1, 0, Instant::now());
        }
        m.record_acked("topic0", 1, 0, Instant::now());
        let text = m.render();
        assert_eq!(
            value(
                &text,
                "outbox_relay_records_produced_total{topic=\"_other\"}"
            ),
            Some(5.0)
        );
        assert_eq!(
            value(
                &text,
                "outbox_relay_records_produced_total{topic=\"topic0\"}"
            ),
            Some(2.0)
        );
        let series = text
            .lines()
            .filter(|l| l.starts_with("outbox_relay_records_produced_total{"))
            .count();
        assert_eq!(series, MAX_TOPIC_LABELS + 1);
    }

    #[test]
    fn table_labels_are_capped() {
        let m = Metrics::new();
        for i in 0..MAX_TABLE_LABELS + 7 {
            m.row_read(&format!("tenant_{i}.outbox"));
        }
        m.row_read("tenant_0.outbox");
        let text = m.render();
        let series = |name: &str| {
            value(
                &text,
                &format!("outbox_relay_outbox_rows_read_total{{table=\"{name}\"}}"),
            )
        };
        assert_eq!(series("_other"), Some(7.0));
        assert_eq!(series("tenant_0.outbox"), Some(2.0));
        let count = text
            .lines()
            .filter(|l| l.starts_with("outbox_relay_outbox_rows_read_total{"))
            .count();
        assert_eq!(count, MAX_TABLE_LABELS + 1);
        assert_eq!(m.rows_read_total(), MAX_TABLE_LABELS as u64 + 8);
    }

    #[test]
    fn lag_is_zero_after_a_heartbeat_and_grows_from_the_last_event() {
        let mut live = Live {
            state: State::Streaming,
            last_activity: None,
            current_as_of: None,
            caught_up: false,
            checkpoint_current_at: None,
            kafka_down: None,
            transaction_open: None,
            lso_stuck: None,
            held: Vec::new(),
        };
        assert_eq!(lag_of(&live, 1_000.5), 0.0, "nothing read yet");
        live.current_as_of = Some(990.0);
        assert_eq!(lag_of(&live, 1_000.5), 10.0);
        live.caught_up = true;
        assert_eq!(lag_of(&live, 1_000.5), 0.0, "a heartbeat came after it");
        live.state = State::Connecting;
        assert_eq!(lag_of(&live, 1_000.5), 10.0, "disconnected: not known");
    }

    #[test]
    fn a_heartbeat_marks_the_stream_current_until_the_next_event() {
        let m = Metrics::new();
        m.set_state(State::Streaming);
        m.heartbeat();
        assert_eq!(m.lag_seconds(), 0.0);
        // Disconnected since that heartbeat: the lag counts from it (0 or 1 s here).
        m.set_state(State::Connecting);
        assert!(m.lag_seconds() <= 1.0, "{}", m.lag_seconds());
    }

    #[test]
    fn readiness_needs_streaming_recent_activity_and_kafka() {
        let m = Metrics::new();
        let stall = Duration::from_secs(30);
        assert_eq!(m.readiness(stall, stall), Err("starting".to_owned()));
        m.set_state(State::Retrying {
            error: "MySQL: cannot connect to mysql://relay:pw@db:3306/shop".into(),
            attempt: 2,
            delay_ms: 400,
        });
        let reason = m.readiness(stall, stall).expect_err("retrying");
        assert_eq!(
            reason,
            "not streaming: attempt 2 failed, retrying in 400 ms: MySQL: cannot connect to \
             mysql://relay:***@db:3306/shop"
        );
        m.set_state(State::Streaming);
        assert_eq!(m.readiness(stall, stall), Ok("streaming".to_owned()));
        std::thread::sleep(Duration::from_millis(2));
        let reason = m.readiness(Duration::ZERO, stall).expect_err("stalled");
        assert!(
            reason.starts_with("stalled: no binlog event or heartbeat read for"),
            "{reason}"
        );
        // Kafka unreachable: ready until the bound, then not, and ready again once it answers.
        m.kafka_probe(Instant::now(), Err("no broker of k:9092 answered".into()));
        assert_eq!(m.readiness(stall, stall), Ok("streaming".to_owned()));
        let reason = m.readiness(stall, Duration::ZERO).expect_err("kafka down");
        assert!(
            reason.starts_with("Kafka unreachable for ")
                && reason.ends_with("(http.ready_kafka_ms = 0): no broker of k:9092 answered"),
            "{reason}"
        );
        m.kafka_probe(Instant::now(), Ok(()));
        assert_eq!(
            m.readiness(stall, Duration::ZERO),
            Ok("streaming".to_owned())
        );
        m.set_state(State::Stopping);
        assert_eq!(m.readiness(stall, stall), Err("stopping".to_owned()));
    }

    #[test]
    fn file_sequence_numbers() {
        assert_eq!(file_sequence("mariadb-bin.000042"), Some(42));
        assert_eq!(file_sequence("binlog.1000001"), Some(1_000_001));
        assert_eq!(file_sequence("weird"), None);
    }

    #[test]
    fn error_kinds_are_variant_names() {
        assert_eq!(error_kind(&RelayError::LeaseLost("x".into())), "lease_lost");
        assert_eq!(
            error_kind(&RelayError::TransactionExpired("x".into())),
            "transaction_expired"
        );
        assert_eq!(
            error_kind(&RelayError::CommitUnknown {
                detail: "x".into(),
                point: "b.1:4 (+0 rows)".into()
            }),
            "commit_unknown"
        );
        assert_eq!(
            error_kind(&RelayError::Prerequisite {
                setting: String::new(),
                expected: String::new(),
                found: String::new(),
                fix: String::new()
            }),
            "prerequisite"
        );
    }
}
