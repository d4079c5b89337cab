//! The fault matrix: the relay under a concurrent workload while faults are injected at random
//! (seeded) moments, then a complete comparison of Kafka with the outbox table.
//!
//! Run by `make faults` (profile `short`) and `make faults-full` through the `faults` binary of
//! this crate, or as a library function ([`run`]).
//!
//! # Setup
//! * Services: `tests/services/server.sh <OUTBOX_TEST_SERVER> up` and `kafka.sh up` (idempotent; ports from
//!   `MARIADB_PORT`, `KAFKA_PORT`, …). Faults restart them through the same scripts, so run this
//!   only against servers nobody else uses at the same time.
//! * An own database (`faults_<suffix>`, both migrations), own topics (`f_<uid>.outbox.event.*`),
//!   connector name and replica `server_id`.
//! * The relay connects to the database server through a [`TcpProxy`] (for connection cuts), with
//!   `heartbeat_interval_ms = 1000`, `read_timeout_ms = 4000`, and straight to Kafka (its
//!   advertised listener makes proxying Kafka pointless: broker faults are broker restarts).
//! * Writers: see [`workload`]. They connect to the server through a second proxy (cut together
//!   with the relay's, so some COMMITs end with an unknown outcome); the recovery probes connect
//!   directly.
//!
//! # Faults
//! `kill -9` of the relay and a restart; broker stop/start (`kafka.sh down`, `up`); database
//! stop/start (`server.sh <server> down`, `up`); a cut of every relay and writer connection at the
//! proxies (sometimes with the relay's proxy refusing new connections for a few seconds, or
//! with a writer's connection closed just before or just after its COMMIT reaches the server: an
//! uncertain commit); optionally (`--freezes N`) a freeze of the relay's proxy (half-open
//! connections) for a few seconds; with `--exactly-once` and a Kafka proxy
//! ([`Options::kafka_proxy_port`]: a [`TcpProxy::start_kafka`] on a port the broker advertises
//! as its listener, so every client of the broker goes through it) the answer to one EndTxn
//! request (Kafka API key 26) of the relay is dropped or held back for up to 15 s: a commit
//! whose outcome the relay cannot know (librdkafka has no KIP-890). The order is a seeded shuffle; before each fault a random
//! pause. After each fault a probe row is committed; the time from the end of the fault until
//! it is read from Kafka is the recovery time. The checkpoint is sampled after each fault and at
//! the end: it must be a transaction boundary of a binlog file the server lists, and never move
//! backwards.
//!
//! # Checks at the end
//! Writers stop; the relay must deliver every row of the outbox table (the truth: rows whose
//! COMMIT outcome was uncertain count as committed exactly when they are in the table); then a
//! graceful stop (exit 0), and everything in the topics is compared with the table: nothing
//! missing, no record of a rolled-back or unknown row, content byte for byte, per key the first
//! occurrences in sequence order and replays without holes. Duplicates are counted (allowed:
//! at-least-once).

pub mod fleet;
pub mod probe;
pub mod rng;
pub mod services;
pub mod verify;
pub mod workload;

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use mysql_async::prelude::*;

use crate::audit::{check_ack_audit, read_ack_audit, AuditCheck};
use crate::binlog::{
    binary_logs, binlog_event_ending_at, compare_positions, is_transaction_boundary, BinlogPosition,
};
use crate::checkpoint::{read_checkpoint, Checkpoint, DEFAULT_CHECKPOINT_TABLE};
use crate::db::TestDb;
use crate::env::{kafka_bootstrap, mysql_port, mysql_url};
use crate::kafka::{collect_until, read_all_records, read_committed_records, Record};
use crate::proxy::{KafkaFault, TcpProxy, Trip, END_TXN};
use crate::relay::{describe_exit, RelayConfigSpec, RelayProcess};
use crate::unique::{next_server_id, unique_suffix};

use probe::ProbeWatcher;
use rng::Rng;
use services::{Service, Services};
use verify::Verification;
use workload::{Committer, GenRow, Workload, WorkloadConfig, WriterStats};

/// The kinds of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultKind {
    /// SIGKILL of the relay, then a new relay process.
    RelayKill,
    /// `kafka.sh down`, a pause, `kafka.sh up`.
    BrokerRestart,
    /// `server.sh <server> down`, a pause, `server.sh <server> up`.
    ServerRestart,
    /// Every relay ↔ server connection closed at the proxy.
    ConnectionCut,
    /// The relay's proxy stops forwarding (sockets stay open: half-open connections) for a few
    /// seconds, then resumes. Not in the standard profiles (`--freezes N`).
    ProxyFreeze,
    /// Busy threads, twice as many as the machine has cores, for a few seconds: the relay, the
    /// broker and the server fight for CPU (a noisy neighbour, a throttled container). In the
    /// `soak` profile.
    CpuStarvation,
    /// Exactly-once with a Kafka proxy ([`Options::kafka_proxy_port`]): the answer to the
    /// relay's next EndTxn request is dropped or delayed (an unknown commit outcome).
    EndTxnLoss,
}

impl FaultKind {
    /// Name in the report.
    pub fn label(self) -> &'static str {
        match self {
            Self::RelayKill => "relay kill -9",
            Self::BrokerRestart => "broker restart",
            Self::ServerRestart => "server restart",
            Self::ConnectionCut => "connection cut",
            Self::ProxyFreeze => "proxy freeze",
            Self::CpuStarvation => "cpu starvation",
            Self::EndTxnLoss => "EndTxn answer lost",
        }
    }

    const ALL: [FaultKind; 7] = [
        Self::RelayKill,
        Self::BrokerRestart,
        Self::ServerRestart,
        Self::ConnectionCut,
        Self::ProxyFreeze,
        Self::CpuStarvation,
        Self::EndTxnLoss,
    ];
}

/// How much of everything.
#[derive(Debug, Clone)]
pub struct Profile {
    /// `short`, `medium`, `full` or `custom`.
    pub name: String,
    /// Relay kills.
    pub kills: usize,
    /// Broker restarts.
    pub broker_restarts: usize,
    /// server restarts.
    pub server_restarts: usize,
    /// Connection cuts.
    pub cuts: usize,
    /// Proxy freezes (half-open connections for `freeze_ms`, then thawed).
    pub freezes: usize,
    /// EndTxn answers lost or late (only with [`Options::exactly_once`] and
    /// [`Options::kafka_proxy_port`]; otherwise none are injected).
    pub endtxn_losses: usize,
    /// How long a freeze lasts (ms, uniform).
    pub freeze_ms: (u64, u64),
    /// Concurrent writers.
    pub writers: usize,
    /// Aggregate ids per writer.
    pub keys_per_writer: usize,
    /// Pause between two transactions of one writer (ms, uniform).
    pub writer_pause_ms: (u64, u64),
    /// Pause before each fault (ms, uniform).
    pub fault_gap_ms: (u64, u64),
    /// Extra time a server stays down in a restart (ms, uniform).
    pub downtime_ms: (u64, u64),
    /// Longest wait for the relay to deliver a probe after a fault.
    pub recovery_timeout: Duration,
    /// CPU starvations.
    pub starvations: usize,
    /// How long a CPU starvation lasts (ms, uniform).
    pub starve_ms: (u64, u64),
    /// `Some`: the faults above are one round; rounds follow one another (each a new shuffle)
    /// until this much time has passed (the `soak` profile). `None`: one round.
    pub duration: Option<Duration>,
}

impl Profile {
    /// CI (`make test` runs it in both delivery modes against each of three servers): 8 kills,
    /// 3 cuts, 2 broker restarts, 2 server restarts, 2 lost EndTxn answers (about 2–3 minutes).
    /// Kept small so that CI stays within its budget; `faults-full` and `soak` go further.
    pub fn short() -> Self {
        Self {
            name: "short".into(),
            kills: 8,
            broker_restarts: 2,
            server_restarts: 2,
            cuts: 3,
            freezes: 0,
            endtxn_losses: 2,
            freeze_ms: (2_000, 8_000),
            writers: 4,
            keys_per_writer: 6,
            writer_pause_ms: (10, 120),
            fault_gap_ms: (1_000, 6_000),
            downtime_ms: (0, 2_000),
            recovery_timeout: Duration::from_secs(180),
            starvations: 0,
            starve_ms: (3_000, 15_000),
            duration: None,
        }
    }

    /// `make soak`: rounds of 6 kills, 1 broker restart, 1 server restart, 2 cuts, 1 freeze and
    /// 2 CPU starvations, 5–30 s apart, for `minutes` (at least 60 for the soak docs/src/fault-matrix.md
    /// reports); writes go on throughout.
    pub fn soak(minutes: u64) -> Self {
        Self {
            name: format!("soak ({minutes} min)"),
            kills: 6,
            broker_restarts: 1,
            server_restarts: 1,
            cuts: 2,
            freezes: 1,
            starvations: 2,
            endtxn_losses: 1,
            fault_gap_ms: (5_000, 30_000),
            duration: Some(Duration::from_secs(minutes * 60)),
            ..Self::short()
        }
    }

    /// 30 kills, 5 of each other fault.
    pub fn medium() -> Self {
        Self {
            name: "medium".into(),
            kills: 30,
            broker_restarts: 5,
            server_restarts: 5,
            cuts: 5,
            ..Self::short()
        }
    }

    /// 100 kills, 20 broker restarts, 10 server restarts, 10 cuts.
    pub fn full() -> Self {
        Self {
            name: "full".into(),
            kills: 100,
            broker_restarts: 20,
            server_restarts: 10,
            cuts: 10,
            ..Self::short()
        }
    }

    /// A profile by name.
    pub fn named(name: &str) -> Option<Self> {
        match name {
            "short" => Some(Self::short()),
            "medium" => Some(Self::medium()),
            "full" => Some(Self::full()),
            "soak" => Some(Self::soak(
                std::env::var("SOAK_MINUTES")
                    .ok()
                    .and_then(|m| m.parse().ok())
                    .unwrap_or(60),
            )),
            _ => None,
        }
    }

    fn count(&self, kind: FaultKind) -> usize {
        match kind {
            FaultKind::RelayKill => self.kills,
            FaultKind::BrokerRestart => self.broker_restarts,
            FaultKind::ServerRestart => self.server_restarts,
            FaultKind::ConnectionCut => self.cuts,
            FaultKind::ProxyFreeze => self.freezes,
            FaultKind::CpuStarvation => self.starvations,
            FaultKind::EndTxnLoss => self.endtxn_losses,
        }
    }
}

/// Everything a run needs.
#[derive(Debug, Clone)]
pub struct Options {
    /// What to inject and how much to write.
    pub profile: Profile,
    /// Seed of the workload and the fault plan.
    pub seed: u64,
    /// The `outbox-relay` binary.
    pub relay_bin: PathBuf,
    /// Repository root (for `tests/services/*.sh` and `migrations/`).
    pub repo_root: PathBuf,
    /// Run `server.sh <server> up` and `kafka.sh up` first.
    pub start_services: bool,
    /// The relay's `kafka.delivery = "exactly_once"`: the topics are read `read_committed` and
    /// any duplicate fails the run.
    pub exactly_once: bool,
    /// Exactly-once: the port of a Kafka-aware proxy ([`TcpProxy::start_kafka`]) the run
    /// starts on 127.0.0.1 in front of the broker, which must advertise this port as its
    /// listener (`KAFKA_ADVERTISED_PORT` of `tests/services/kafka.sh`); the relay's bootstrap
    /// server. Enables [`FaultKind::EndTxnLoss`]. `None`: no Kafka proxy, no such fault.
    pub kafka_proxy_port: Option<u16>,
}

impl Options {
    /// `profile` with a seed from the clock, the relay binary from [`default_relay_bin`] and
    /// the repository this crate was built from.
    pub fn new(profile: Profile) -> Self {
        Self {
            profile,
            seed: Rng::seed_from_time(),
            relay_bin: default_relay_bin(),
            repo_root: services::default_repo_root(),
            start_services: true,
            exactly_once: false,
            kafka_proxy_port: None,
        }
    }
}

/// The short profile as a test (`tests/faults.rs`, `tests/faults_eos.rs`): runs it with
/// `relay_bin` (seed from `FAULTS_SEED` when set) against the server under test and a private
/// Kafka broker of its own, prints the table, fails unless it passed.
///
/// The private broker (127.0.0.1:`FAULTS_KAFKA_PORT`, default 9992, its controller on the next
/// port; folder `.services/private/faults-kafka`) starts with empty storage and is stopped at
/// the end. Its broker restarts then load only the matrix's own topics: by the time the matrix
/// runs, the shared broker carries thousands of partitions from the other suites, and on a
/// loaded machine its restart took over two minutes ("Kafka did not become ready in 120 s").
///
/// Call it from a plain `#[test]`: it sets the Kafka variables of the service scripts
/// (`KAFKA_PORT`, `KAFKA_CONTROLLER_PORT`, `KAFKA_DIR`, `KAFKA_LIBS_DIR`) in this process's
/// environment before any thread of its own starts, then runs the matrix on a new runtime.
///
/// # Errors
/// The harness could not run, or the run failed (the message names the seed and the counts).
pub fn short_matrix_test(relay_bin: &str, exactly_once: bool) -> Result<()> {
    let _watchdog = crate::Watchdog::arm();
    let port: u16 = std::env::var("FAULTS_KAFKA_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(9992);
    let dir = crate::private::private_services_dir("faults-kafka");
    let libs = services::default_repo_root()
        .join(".services")
        .join("kafka-libs-4.1.1");
    let vars = [
        ("KAFKA_PORT", port.to_string()),
        ("KAFKA_CONTROLLER_PORT", (port + 1).to_string()),
        ("KAFKA_DIR", dir.join("kafka").display().to_string()),
        ("KAFKA_LIBS_DIR", libs.display().to_string()),
        // Exactly-once: every client reaches the broker through the run's Kafka proxy on
        // port + 2 (EndTxn answers lost); otherwise the broker advertises its own port.
        (
            "KAFKA_ADVERTISED_PORT",
            if exactly_once { port + 2 } else { port }.to_string(),
        ),
    ];
    for (k, v) in &vars {
        std::env::set_var(k, v);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let scripts = Services::new(&services::default_repo_root());
        // A broker a killed run left behind, then fresh storage.
        scripts
            .run(Service::Kafka, "down", Duration::from_secs(120))
            .await?;
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
        }
        let proxy_port = exactly_once.then_some(port + 2);
        let result = short_matrix(relay_bin, exactly_once, proxy_port).await;
        let stopped = scripts
            .run(Service::Kafka, "down", Duration::from_secs(120))
            .await;
        result?;
        stopped.map(|_| ())
    })
}

async fn short_matrix(
    relay_bin: &str,
    exactly_once: bool,
    kafka_proxy_port: Option<u16>,
) -> Result<()> {
    let mut opts = Options::new(Profile::short());
    opts.relay_bin = relay_bin.into();
    opts.exactly_once = exactly_once;
    opts.kafka_proxy_port = kafka_proxy_port;
    if let Some(seed) = std::env::var("FAULTS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        opts.seed = seed;
    }
    let report = run(&opts).await?;
    println!("{}", report.render());
    anyhow::ensure!(
        report.passed(),
        "the fault matrix failed (seed {}): {} missing, {} duplicates, see the table above",
        report.seed,
        report.verification.missing.len(),
        report.verification.duplicates
    );
    Ok(())
}

/// The relay binary: `$OUTBOX_RELAY_BIN`, else `<target dir>/debug/outbox-relay` where the
/// target dir is `$CARGO_TARGET_DIR` or `<repo>/target`.
pub fn default_relay_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("OUTBOX_RELAY_BIN") {
        return PathBuf::from(p);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| services::default_repo_root().join("target"));
    target.join("debug").join("outbox-relay")
}

/// One injected fault.
#[derive(Debug, Clone)]
pub struct FaultRecord {
    /// Kind.
    pub kind: FaultKind,
    /// Seconds since the start of the run when it began.
    pub at_s: f64,
    /// What exactly was done.
    pub detail: String,
    /// How long the fault itself took (e.g. the broker's stop and start).
    pub duration: Duration,
    /// From the end of the fault until a row committed after it was read from Kafka; `None`
    /// when it did not arrive within the profile's recovery timeout.
    pub recovery: Option<Duration>,
}

/// One look at the stored checkpoint.
#[derive(Debug, Clone)]
pub struct CheckpointSample {
    /// When (label).
    pub when: String,
    /// The stored row.
    pub checkpoint: Checkpoint,
    /// A transaction boundary (or the relay's start position) in a listed binlog file.
    pub boundary: bool,
    /// Moved backwards since the previous sample.
    pub backwards: bool,
}

/// Everything a run found.
#[derive(Debug, Clone)]
pub struct Report {
    /// The relay ran exactly-once: a duplicate is a failure.
    pub exactly_once: bool,
    /// Profile name.
    pub profile: String,
    /// Concurrent writers.
    pub writer_count: usize,
    /// Seed.
    pub seed: u64,
    /// Faults in the order they were injected.
    pub faults: Vec<FaultRecord>,
    /// Writer counters.
    pub writers: WriterStats,
    /// Checkpoint samples.
    pub checkpoints: Vec<CheckpointSample>,
    /// The comparison of Kafka with the outbox table.
    pub verification: Verification,
    /// Every offset the relays were told was stored (`[audit] acks_file`), read back.
    pub audit: AuditCheck,
    /// Relay processes that exited without being asked to (with their stderr tail).
    pub unexpected_exits: Vec<String>,
    /// Other failures (a fault that could not be injected, a graceful stop that failed, …).
    pub failures: Vec<String>,
    /// Relay processes started.
    pub relays_started: usize,
    /// Where their logs are.
    pub relay_logs: Vec<PathBuf>,
    /// Wall time of the whole run.
    pub duration: Duration,
    /// Time from the writers' stop until every committed row was on Kafka.
    pub drain: Duration,
    /// Topics created during the run (one row each, auto-created by the broker).
    pub fresh_topics: u64,
}

impl Report {
    /// Nothing missing, out of order or unexplained; every fault recovered; checkpoints sane;
    /// no unexpected relay exit.
    pub fn passed(&self) -> bool {
        self.verification.passed()
            && self.audit.passed()
            && self.audit.acknowledged > 0
            && (!self.exactly_once || self.verification.duplicates == 0)
            && self.unexpected_exits.is_empty()
            && self.failures.is_empty()
            && self.faults.iter().all(|f| f.recovery.is_some())
            && self.checkpoints.iter().all(|c| c.boundary && !c.backwards)
    }

    /// Longest recovery.
    pub fn max_recovery(&self) -> Option<Duration> {
        self.faults.iter().filter_map(|f| f.recovery).max()
    }

    /// The result table; its last line is exactly `missing: N duplicates: M`.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let v = &self.verification;
        let _ = writeln!(
            s,
            "\n=== fault matrix: profile {}{}, seed {}, {:.0} s ===",
            self.profile,
            if self.exactly_once {
                ", exactly-once (read_committed)"
            } else {
                ""
            },
            self.seed,
            self.duration.as_secs_f64()
        );
        let _ = writeln!(
            s,
            "{:<18} {:>8} {:>14} {:>14} {:>14}",
            "fault", "injected", "recovery max", "recovery mean", "fault takes"
        );
        let mut by_kind: BTreeMap<FaultKind, Vec<&FaultRecord>> = BTreeMap::new();
        for f in &self.faults {
            by_kind.entry(f.kind).or_default().push(f);
        }
        for kind in FaultKind::ALL {
            let list = by_kind.get(&kind).cloned().unwrap_or_default();
            if list.is_empty()
                && matches!(
                    kind,
                    FaultKind::ProxyFreeze | FaultKind::EndTxnLoss | FaultKind::CpuStarvation
                )
            {
                continue; // optional kinds (a flag, or exactly-once with a Kafka proxy)
            }
            let recs: Vec<f64> = list
                .iter()
                .filter_map(|f| f.recovery.map(|d| d.as_secs_f64()))
                .collect();
            let max = recs
                .iter()
                .copied()
                .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
            let mean = (!recs.is_empty()).then(|| recs.iter().sum::<f64>() / recs.len() as f64);
            let took = (!list.is_empty()).then(|| {
                list.iter().map(|f| f.duration.as_secs_f64()).sum::<f64>() / list.len() as f64
            });
            let fmt = |x: Option<f64>| x.map_or("-".to_owned(), |x| format!("{x:.1} s"));
            let timeouts = list.len() - recs.len();
            let _ = writeln!(
                s,
                "{:<18} {:>8} {:>14} {:>14} {:>14}{}",
                kind.label(),
                list.len(),
                fmt(max),
                fmt(mean),
                fmt(took),
                if timeouts > 0 {
                    format!("  ({timeouts} NOT RECOVERED)")
                } else {
                    String::new()
                }
            );
        }
        let w = &self.writers;
        let rows: Vec<(&str, String)> = vec![
            (
                "writers / keys",
                format!("{} / {}", self.writer_count, v.keys),
            ),
            ("transactions committed", w.transactions.to_string()),
            ("rows written (outbox table)", v.committed.to_string()),
            (
                "rows rolled back on purpose",
                w.rows_rolled_back.to_string(),
            ),
            (
                "uncertain commits (committed)",
                format!("{} ({})", w.uncertain_commits, w.uncertain_committed),
            ),
            ("writer retries", w.failed_attempts.to_string()),
            ("records on Kafka", v.records.to_string()),
            ("fresh topics (auto-created)", self.fresh_topics.to_string()),
            ("distinct delivered", v.distinct_delivered.to_string()),
            ("missing", v.missing.len().to_string()),
            (
                "duplicates (max copies)",
                format!("{} ({})", v.duplicates, v.max_copies),
            ),
            (
                "acknowledgements audited",
                format!(
                    "{} ({} offsets)",
                    self.audit.acknowledged, self.audit.offsets
                ),
            ),
            (
                "acknowledged, not in the log",
                (self.audit.missing.len() + self.audit.mismatched.len()).to_string(),
            ),
            ("phantom records", v.phantoms.len().to_string()),
            ("content mismatches", v.content_mismatches.len().to_string()),
            (
                "per-key order violations",
                v.order_violations.len().to_string(),
            ),
            ("replay gaps", v.replay_gaps.len().to_string()),
            (
                "checkpoint samples ok",
                format!(
                    "{}/{}",
                    self.checkpoints
                        .iter()
                        .filter(|c| c.boundary && !c.backwards)
                        .count(),
                    self.checkpoints.len()
                ),
            ),
            ("relay processes", self.relays_started.to_string()),
            (
                "unexpected relay exits",
                self.unexpected_exits.len().to_string(),
            ),
            (
                "max recovery time",
                self.max_recovery()
                    .map_or("-".into(), |d| format!("{:.1} s", d.as_secs_f64())),
            ),
            ("final drain", format!("{:.1} s", self.drain.as_secs_f64())),
        ];
        let _ = writeln!(s, "{}", "-".repeat(74));
        for (k, val) in rows {
            let _ = writeln!(s, "{k:<32} {val:>12}");
        }
        let problems = v.problems(10);
        let bad_samples = self.checkpoints.iter().any(|c| !c.boundary || c.backwards);
        let mut audit_problems: Vec<String> = self
            .audit
            .missing
            .iter()
            .map(|m| format!("acknowledged but not in the log: {m}"))
            .chain(
                self.audit
                    .mismatched
                    .iter()
                    .map(|m| format!("acknowledged offset holds another record: {m}")),
            )
            .take(20)
            .collect();
        if self.audit.acknowledged == 0 {
            audit_problems.push("the acknowledgement audit is empty (was it on?)".into());
        }
        let problems: Vec<String> = problems.into_iter().chain(audit_problems).collect();
        if !problems.is_empty()
            || !self.failures.is_empty()
            || !self.unexpected_exits.is_empty()
            || bad_samples
        {
            let _ = writeln!(s, "{}", "-".repeat(74));
            for p in problems.iter().chain(&self.failures) {
                let _ = writeln!(s, "FAIL {p}");
            }
            for c in self
                .checkpoints
                .iter()
                .filter(|c| !c.boundary || c.backwards)
            {
                let _ = writeln!(
                    s,
                    "FAIL checkpoint {}: {}:{} (rows_acked {}){}",
                    c.when,
                    c.checkpoint.binlog_file,
                    c.checkpoint.binlog_pos,
                    c.checkpoint.rows_acked,
                    if c.backwards {
                        " moved backwards"
                    } else {
                        " is not a transaction boundary"
                    }
                );
            }
            for e in &self.unexpected_exits {
                let _ = writeln!(s, "FAIL unexpected relay exit: {e}");
            }
        }
        let _ = writeln!(s, "result: {}", if self.passed() { "PASS" } else { "FAIL" });
        let _ = write!(
            s,
            "missing: {} duplicates: {}",
            v.missing.len(),
            v.duplicates
        );
        s
    }
}

/// Prints progress lines with the time since the start.
pub(crate) struct Log {
    pub(crate) start: Instant,
}

impl Log {
    pub(crate) fn say(&self, msg: impl AsRef<str>) {
        println!(
            "[{:7.1} s] {}",
            self.start.elapsed().as_secs_f64(),
            msg.as_ref()
        );
    }
}

/// The relay processes of a run: one at a time, restarted after kills or unexpected exits.
struct Relays {
    bin: PathBuf,
    toml: String,
    env: Vec<(String, String)>,
    current: Option<RelayProcess>,
    started: usize,
    logs: Vec<PathBuf>,
    unexpected_exits: Vec<String>,
}

impl Relays {
    fn spawn(&mut self) -> Result<()> {
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let relay = RelayProcess::spawn(&self.bin, &self.toml, &env)?;
        self.logs.push(relay.stderr_path().to_path_buf());
        self.started += 1;
        self.current = Some(relay);
        Ok(())
    }

    fn current(&self) -> Result<&RelayProcess> {
        self.current.as_ref().context("no relay process")
    }

    /// Retires a process that ended (killed and reaped): no stderr dump on drop.
    fn retire(&mut self) {
        if let Some(r) = self.current.take() {
            // Its logs stay on disk (see `logs`); RelayProcess's Drop would print them.
            std::mem::forget(r);
        }
    }

    /// If the relay exited on its own, records it and starts a new one. Returns whether it had.
    fn check_alive(&mut self, log: &Log) -> Result<bool> {
        let relay = self.current()?;
        match relay.try_exit_status()? {
            None => Ok(false),
            Some(status) => {
                let msg = format!(
                    "{} ({}), stderr {}:\n{}",
                    describe_exit(&status),
                    relay.config_path().display(),
                    relay.stderr_path().display(),
                    tail(&relay.stderr_text(), 4_000)
                );
                log.say(format!("UNEXPECTED: the relay exited: {msg}"));
                self.unexpected_exits.push(msg);
                self.retire();
                self.spawn()?;
                Ok(true)
            }
        }
    }

    fn kill9_and_restart(&mut self) -> Result<()> {
        let relay = self.current()?;
        relay.kill9()?;
        self.retire();
        self.spawn()
    }
}

/// The last `max` bytes of `text` (at a char boundary).
pub(crate) fn tail(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut cut = text.len() - max;
    while !text.is_char_boundary(cut) {
        cut += 1;
    }
    &text[cut..]
}

/// Retries `f` (a query that may meet a restarting server) until it succeeds or
/// `timeout` passes.
pub(crate) async fn retry<T>(
    timeout: Duration,
    mut f: impl AsyncFnMut() -> Result<T>,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

/// State of the checkpoint checks.
pub(crate) struct CheckpointChecker {
    pub(crate) connector: String,
    /// Where the relay started (the first stored position, not necessarily an Xid end).
    pub(crate) start: BinlogPosition,
    pub(crate) last: Option<BinlogPosition>,
}

impl CheckpointChecker {
    pub(crate) async fn sample(&mut self, db: &TestDb, when: &str) -> Result<CheckpointSample> {
        let connector = self.connector.clone();
        let cp = retry(Duration::from_secs(120), async || {
            read_checkpoint(db.pool(), DEFAULT_CHECKPOINT_TABLE, &connector)
                .await?
                .context("no checkpoint row")
        })
        .await?;
        let pos = cp.position();
        if self.last.as_ref() == Some(&pos) {
            // Unchanged since the last sample, which found it a boundary. (Checked again, the
            // scan would start at the hint, which is this position itself, past the event
            // ending there, and call it no boundary: seen in CI on MySQL 8.)
            return Ok(CheckpointSample {
                when: when.to_owned(),
                checkpoint: cp,
                boundary: true,
                backwards: false,
            });
        }
        let hint = self
            .last
            .clone()
            .filter(|l| l.file == pos.file && l.pos < pos.pos);
        let (boundary, backwards) = retry(Duration::from_secs(120), async || {
            let mut conn = db.conn().await?;
            let listed = binary_logs(&mut conn)
                .await?
                .iter()
                .any(|(name, _)| *name == pos.file);
            let mut boundary = listed
                && (pos == self.start
                    || is_transaction_boundary(&mut conn, &pos.file, pos.pos, hint.as_ref())
                        .await?);
            if listed && !boundary {
                // A DDL statement (its own transaction) of another database also ends a group.
                if let Some(ev) =
                    binlog_event_ending_at(&mut conn, &pos.file, pos.pos, hint.as_ref()).await?
                {
                    boundary = ev.event_type == "Query"
                        && !ev.info.trim().to_ascii_uppercase().starts_with("BEGIN");
                }
            }
            let backwards = match &self.last {
                Some(last) if listed => {
                    compare_positions(&mut conn, &pos, last).await? == std::cmp::Ordering::Less
                }
                _ => false,
            };
            Ok((boundary, backwards))
        })
        .await?;
        if boundary && !backwards {
            self.last = Some(pos);
        }
        Ok(CheckpointSample {
            when: when.to_owned(),
            checkpoint: cp,
            boundary,
            backwards,
        })
    }
}

/// Longest wait for one of the end-of-run reads: a soak's topics hold millions of records, read
/// on a machine that may be busy (a read ends as soon as it is complete).
const FINAL_READ: Duration = Duration::from_secs(3_600);

/// The end-of-run checks: everything in `topics` (read `read_committed` for exactly-once)
/// compared with `committed` ([`verify::verify`]), and every acknowledgement of `audit_file`
/// read back ([`check_ack_audit`]).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn final_checks(
    log: &Log,
    bootstrap: &str,
    topics: &[String],
    committed: &HashSet<String>,
    uid: &str,
    topic_for: impl Fn(&str) -> String,
    audit_file: &std::path::Path,
    exactly_once: bool,
) -> Result<(Verification, AuditCheck)> {
    // Exactly-once: what a read_committed consumer sees (transaction markers and aborted
    // records take offsets, so the count is not the watermarks' sum).
    let records = if exactly_once {
        read_committed_records(bootstrap, topics, FINAL_READ).await?
    } else {
        read_all_records(bootstrap, topics, FINAL_READ).await?
    };
    let verification = verify::verify(uid, &records, committed, topic_for);
    log.say(format!(
        "{} records compared with {} committed rows: {} missing, {} duplicates",
        records.len(),
        committed.len(),
        verification.missing.len(),
        verification.duplicates
    ));
    drop(records);
    // Every acknowledgement of every relay process, read back with a fresh consumer.
    let (acks, unparsed) = read_ack_audit(audit_file)?;
    let mut audit = check_ack_audit(bootstrap, acks, FINAL_READ).await?;
    audit.unparsed = unparsed;
    log.say(format!(
        "acknowledgement audit {}: {} acknowledgements ({} offsets) read back, {} not in the \
         log, {} holding another record, {} unparsed lines",
        audit_file.display(),
        audit.acknowledged,
        audit.offsets,
        audit.missing.len(),
        audit.mismatched.len(),
        audit.unparsed
    ));
    Ok((verification, audit))
}

/// A finished run's end-of-run checks again ([`final_checks`]), for a run whose own ended in a
/// harness error (a read timed out on a busy machine): run `uid`'s database `database` on the
/// server under test, its topics (`f_<uid>.outbox.event.*` with `fresh` fresh topics) on
/// `KAFKA_PORT`, its audit file. Prints what it found; `Ok(true)` when nothing is missing,
/// altered or out of order and every acknowledgement is in the log.
///
/// # Errors
/// The database, the topics or the audit file cannot be read.
pub async fn verify_run(uid: &str, database: &str, fresh: u64, exactly_once: bool) -> Result<bool> {
    let log = Log {
        start: Instant::now(),
    };
    let committed: HashSet<String> = {
        let mut conn = mysql_async::Conn::new(
            mysql_async::Opts::from_url(&mysql_url(Some(database))).context("database URL")?,
        )
        .await?;
        let keys: Vec<String> = conn.query("SELECT event_key FROM outbox").await?;
        keys.into_iter().collect()
    };
    let topic_for = |t: &str| format!("f_{uid}.outbox.event.{t}");
    let topics: Vec<String> = ["Order", "Payment", workload::PROBE_TYPE]
        .iter()
        .map(|t| topic_for(t))
        .chain((1..=fresh).map(|n| topic_for(&workload::fresh_type(n))))
        .collect();
    let (v, audit) = final_checks(
        &log,
        &kafka_bootstrap(),
        &topics,
        &committed,
        uid,
        topic_for,
        &audit_file_of(uid),
        exactly_once,
    )
    .await?;
    println!(
        "rows {} records {} distinct {} missing {} duplicates {} (max copies {}) phantoms {} \
         content mismatches {} order violations {} replay gaps {}",
        v.committed,
        v.records,
        v.distinct_delivered,
        v.missing.len(),
        v.duplicates,
        v.max_copies,
        v.phantoms.len(),
        v.content_mismatches.len(),
        v.order_violations.len(),
        v.replay_gaps.len()
    );
    for p in v.problems(10) {
        println!("FAIL {p}");
    }
    println!(
        "acknowledgements audited {} ({} offsets), not in the log {}, holding another record {}",
        audit.acknowledged,
        audit.offsets,
        audit.missing.len(),
        audit.mismatched.len()
    );
    Ok(v.passed() && audit.passed() && audit.acknowledged > 0)
}

/// The acknowledgement audit file of run `uid`.
fn audit_file_of(uid: &str) -> PathBuf {
    std::env::temp_dir()
        .join("outbox-relay-tests")
        .join(format!("faults-{uid}-acks.jsonl"))
}

/// Busy threads (twice the cores) until `length` has passed; how many ran.
async fn starve_cpu(length: Duration) -> Result<usize> {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()) * 2;
    let until = Instant::now() + length;
    let busy: Vec<std::thread::JoinHandle<()>> = (0..threads)
        .map(|_| {
            std::thread::spawn(move || {
                let mut x = 1u64;
                while Instant::now() < until {
                    for _ in 0..10_000 {
                        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                    }
                    std::hint::black_box(x);
                }
            })
        })
        .collect();
    tokio::task::spawn_blocking(move || {
        for t in busy {
            let _ = t.join();
        }
    })
    .await?;
    Ok(threads)
}

/// Commits probe rows (single-row transactions on the probe key).
pub(crate) struct Prober {
    pub(crate) run: String,
    pub(crate) committer: Committer,
    pub(crate) next: u64,
}

impl Prober {
    /// Commits the one row of fresh topic `n` ([`workload::fresh_type`]).
    async fn write_fresh(&mut self, n: u64) -> Result<()> {
        let aggregate_id = format!("fresh-{n}");
        let row = GenRow {
            event_key: workload::fresh_event_key(&self.run, n),
            aggregate_type: workload::fresh_type(n),
            payload: workload::payload(&aggregate_id, 1),
            aggregate_id,
        };
        self.committer
            .commit(std::slice::from_ref(&row), false, false)
            .await
    }

    pub(crate) async fn write(&mut self) -> Result<String> {
        let seq = self.next;
        self.next += 1;
        let row = GenRow {
            event_key: workload::probe_event_key(&self.run, seq),
            aggregate_type: workload::PROBE_TYPE.to_owned(),
            aggregate_id: workload::PROBE_KEY.to_owned(),
            payload: workload::payload(workload::PROBE_KEY, seq),
        };
        self.committer
            .commit(std::slice::from_ref(&row), false, false)
            .await?;
        Ok(row.event_key)
    }
}

/// Reads `topics` from their beginning until every event key of `keys` was seen or `timeout`
/// passed; returns what was read (check it for keys still missing).
///
/// # Errors
/// Kafka could not be read.
pub(crate) async fn read_until_delivered(
    bootstrap: &str,
    topics: &[String],
    keys: &HashSet<String>,
    timeout: Duration,
) -> Result<Vec<Record>> {
    let mut remaining = keys.clone();
    let mut done = 0usize;
    collect_until(bootstrap, topics, timeout, move |recs: &[Record]| {
        for r in &recs[done..] {
            if let Some(ek) = r.header("event_key") {
                remaining.remove(ek);
            }
        }
        done = recs.len();
        remaining.is_empty()
    })
    .await
}

/// Commits a probe and waits until a fresh reader finds it on `probe_topic` (which the broker
/// creates on the relay's first record), then returns a [`ProbeWatcher`] of that topic.
///
/// # Errors
/// The probe was not delivered within `timeout`, or Kafka could not be read.
pub(crate) async fn first_probe(
    prober: &mut Prober,
    bootstrap: &str,
    probe_topic: &str,
    timeout: Duration,
) -> Result<ProbeWatcher> {
    let warm = prober.write().await?;
    let want = warm.clone();
    let got = collect_until(
        bootstrap,
        &[probe_topic.to_owned()],
        timeout,
        move |recs: &[Record]| {
            recs.iter()
                .any(|r| r.header("event_key") == Some(want.as_str()))
        },
    )
    .await?;
    if !got
        .iter()
        .any(|r| r.header("event_key") == Some(warm.as_str()))
    {
        bail!(
            "the first probe was not delivered to {probe_topic} within {} s",
            timeout.as_secs()
        );
    }
    let watcher = ProbeWatcher::start(bootstrap, probe_topic)?;
    watcher.wait_for(&warm, Duration::from_secs(30)).await?;
    Ok(watcher)
}

/// Runs the fault matrix and returns its report (print it with [`Report::render`]).
///
/// # Errors
/// Set-up failed (services, database, relay binary), or the harness itself failed. Problems of
/// the relay are in the report, not errors.
pub async fn run(opts: &Options) -> Result<Report> {
    let log = Log {
        start: Instant::now(),
    };
    let p = &opts.profile;
    let mut rng = Rng::new(opts.seed);
    log.say(format!(
        "fault matrix, profile {}: {} kills, {} broker restarts, {} server restarts, {} cuts, \
         {} freezes, {} EndTxn answers lost; {} writers; seed {} (repeat with --seed {}); {} \
         127.0.0.1:{}, Kafka {}",
        p.name,
        p.kills,
        p.broker_restarts,
        p.server_restarts,
        p.cuts,
        p.freezes,
        if opts.exactly_once && opts.kafka_proxy_port.is_some() {
            p.endtxn_losses
        } else {
            0
        },
        p.writers,
        opts.seed,
        opts.seed,
        crate::env::test_server().name(),
        mysql_port(),
        kafka_bootstrap()
    ));
    if !opts.relay_bin.is_file() {
        bail!(
            "relay binary {} not found: build it (cargo build -p outbox-relay) or pass --relay-bin / OUTBOX_RELAY_BIN",
            opts.relay_bin.display()
        );
    }
    let services = Services::new(&opts.repo_root);
    // Started before the broker: the broker reaches itself (transaction markers) through the
    // listener it advertises, this proxy.
    let kafka_proxy = match opts.kafka_proxy_port {
        Some(port) if opts.exactly_once => Some(
            TcpProxy::start_kafka(&format!("127.0.0.1:{port}"), kafka_bootstrap())
                .await
                .context("starting the Kafka proxy")?,
        ),
        _ => None,
    };
    if opts.start_services {
        services.up_all().await.context("starting the services")?;
    }

    // Own database, topics, connector, server id; the relay behind a proxy.
    let db = TestDb::create("faults").await?;
    let uid = unique_suffix();
    let proxy = TcpProxy::start(format!("127.0.0.1:{}", mysql_port())).await?;
    let mut spec = RelayConfigSpec::new(
        &db,
        &format!("faults-{uid}"),
        next_server_id(),
        &format!("f_{uid}"),
    );
    // prefer_socket=false: mysql_async would otherwise switch a loopback TCP connection to the
    // server's unix socket right after connecting, bypassing the proxy.
    spec.mysql_url = format!(
        "mysql://root@127.0.0.1:{}/{}?prefer_socket=false",
        proxy.port(),
        db.name()
    );
    spec.initial_backoff_ms = 200;
    spec.max_backoff_ms = 2_000;
    if let Some(kp) = &kafka_proxy {
        spec.bootstrap_servers = kp.addr().to_string();
    }
    if opts.exactly_once {
        spec.kafka_extra =
            format!("delivery = \"exactly_once\"\nprogress_topic = \"f_{uid}.progress\"\n");
        if kafka_proxy.is_some() {
            // commit_transaction gives up on a lost EndTxn answer after max(this, 10 s), not
            // after the default's 60 s.
            spec.kafka_extra
                .push_str("transaction_timeout_ms = 15000\n");
        }
    }
    let topics: Vec<String> = ["Order", "Payment", workload::PROBE_TYPE]
        .iter()
        .map(|t| spec.topic_for(t))
        .collect();
    let probe_topic = spec.topic_for(workload::PROBE_TYPE);
    // The writers reach the server through a proxy of their own, cut together with the relay's:
    // a COMMIT in flight then has an unknown outcome (see `workload`).
    let writer_proxy = TcpProxy::start(format!("127.0.0.1:{}", mysql_port())).await?;
    let writer_url = format!(
        "mysql://root@127.0.0.1:{}/{}?prefer_socket=false",
        writer_proxy.port(),
        db.name()
    );
    log.say(format!(
        "database {}, connector {}, server_id {}, topics {}, proxy 127.0.0.1:{} -> {}",
        db.name(),
        spec.connector_name,
        spec.server_id,
        spec.topic,
        proxy.port(),
        proxy.target()
    ));
    let audit_file = audit_file_of(&uid);
    if let Some(dir) = audit_file.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut relays = Relays {
        bin: opts.relay_bin.clone(),
        toml: spec.to_toml(),
        env: vec![
            (
                "OUTBOX_RELAY__AUDIT__ACKS_FILE".into(),
                audit_file.display().to_string(),
            ),
            (
                "OUTBOX_RELAY__MYSQL__HEARTBEAT_INTERVAL_MS".into(),
                "1000".into(),
            ),
            ("OUTBOX_RELAY__MYSQL__READ_TIMEOUT_MS".into(), "4000".into()),
        ],
        current: None,
        started: 0,
        logs: Vec::new(),
        unexpected_exits: Vec::new(),
    };
    relays.spawn()?;
    let first = relays
        .current()?
        .wait_for_checkpoint_row(db.pool(), &spec.connector_name, Duration::from_secs(120))
        .await?;
    let mut checker = CheckpointChecker {
        connector: spec.connector_name.clone(),
        start: first.position(),
        last: None,
    };
    log.say(format!("relay streaming from {}", first.position()));

    // Workload and probes.
    let workload = Workload::start(&WorkloadConfig {
        run_id: uid.clone(),
        url: writer_url,
        writers: p.writers,
        keys_per_writer: p.keys_per_writer,
        pause_ms: p.writer_pause_ms,
        rollback_chance: 0.04,
        seed: rng.next_u64(),
    })?;
    let mut prober = Prober {
        run: uid.clone(),
        committer: Committer::new(&mysql_url(Some(db.name())))?,
        next: 1,
    };
    let bootstrap = kafka_bootstrap();
    let first = first_probe(
        &mut prober,
        &bootstrap,
        &probe_topic,
        Duration::from_secs(120),
    )
    .await;
    let mut watcher = match first {
        Ok(w) => w,
        Err(e) => bail!(
            "{e:#}\n--- relay stderr ---\n{}",
            relays.current()?.stderr_tail()
        ),
    };
    log.say("workload running, first probe delivered; injecting faults");

    // The plan: a seeded shuffle of every fault.
    let round = |rng: &mut Rng| {
        let mut plan: Vec<FaultKind> = FaultKind::ALL
            .iter()
            .filter(|k| **k != FaultKind::EndTxnLoss || kafka_proxy.is_some())
            .flat_map(|k| std::iter::repeat_n(*k, p.count(*k)))
            .collect();
        rng.shuffle(&mut plan);
        plan
    };
    let mut plan = round(&mut rng);
    let mut faults = Vec::new();
    let mut checkpoints = Vec::new();
    let mut failures = Vec::new();
    // Fresh topics: after each fault one row of a new aggregate type, so the broker
    // auto-creates its topic while the relay produces to it (the path of the one
    // acknowledged-but-missing record ever seen).
    let mut fresh = 0u64;
    let mut i = 0;
    loop {
        if i == plan.len() {
            match p.duration {
                Some(d) if log.start.elapsed() < d => {
                    let next = round(&mut rng);
                    plan.extend(next);
                }
                _ => break,
            }
        }
        let kind = plan[i];
        i += 1;
        // This fault's index in the body below (`continue` must not skip the increment).
        let i = i - 1;
        tokio::time::sleep(Duration::from_millis(
            rng.range(p.fault_gap_ms.0, p.fault_gap_ms.1),
        ))
        .await;
        relays.check_alive(&log)?;
        if !workload.all_running() {
            failures.push("a writer stopped early (see the error at the end)".into());
            break;
        }
        let at_s = log.start.elapsed().as_secs_f64();
        let begun = Instant::now();
        let injected: Result<String> = match kind {
            FaultKind::RelayKill => relays
                .kill9_and_restart()
                .map(|()| format!("relay #{} started", relays.started)),
            FaultKind::BrokerRestart => {
                let downtime = Duration::from_millis(rng.range(p.downtime_ms.0, p.downtime_ms.1));
                services
                    .restart(Service::Kafka, downtime)
                    .await
                    .map(|(d, u)| {
                        format!(
                            "down {:.1} s + {:.1} s + up {:.1} s",
                            d.as_secs_f64(),
                            downtime.as_secs_f64(),
                            u.as_secs_f64()
                        )
                    })
            }
            FaultKind::ServerRestart => {
                let downtime = Duration::from_millis(rng.range(p.downtime_ms.0, p.downtime_ms.1));
                services
                    .restart(Service::Server, downtime)
                    .await
                    .map(|(d, u)| {
                        format!(
                            "down {:.1} s + {:.1} s + up {:.1} s",
                            d.as_secs_f64(),
                            downtime.as_secs_f64(),
                            u.as_secs_f64()
                        )
                    })
            }
            FaultKind::ConnectionCut => {
                let before = proxy.active();
                let writers_before = writer_proxy.active();
                match rng.range(0, 2) {
                    0 => {
                        proxy.cut();
                        writer_proxy.cut();
                        Ok(format!(
                            "{before} relay + {writers_before} writer conns cut"
                        ))
                    }
                    1 => {
                        let refuse = Duration::from_millis(rng.range(500, 3_000));
                        proxy.set_down(true);
                        proxy.cut();
                        writer_proxy.cut();
                        tokio::time::sleep(refuse).await;
                        proxy.set_down(false);
                        Ok(format!(
                            "{before} relay + {writers_before} writer conns cut, relay refused {:.1} s",
                            refuse.as_secs_f64()
                        ))
                    }
                    _ => {
                        // A writer's connection dies while its COMMIT is on the way: an
                        // uncertain commit, committed (`After`) or not (`Before`).
                        let trip = if rng.chance(0.5) {
                            Trip::After
                        } else {
                            Trip::Before
                        };
                        writer_proxy.arm_tripwire(b"\x03COMMIT", trip);
                        let armed = Instant::now();
                        while writer_proxy.tripwire_armed()
                            && armed.elapsed() < Duration::from_secs(5)
                        {
                            tokio::time::sleep(Duration::from_millis(2)).await;
                        }
                        let fired = !writer_proxy.disarm_tripwire();
                        proxy.cut();
                        Ok(format!(
                            "{before} relay conns cut + a writer cut {} its COMMIT{}",
                            if trip == Trip::After {
                                "after"
                            } else {
                                "before"
                            },
                            if fired { "" } else { " (no COMMIT seen)" }
                        ))
                    }
                }
            }
            FaultKind::CpuStarvation => {
                let length = Duration::from_millis(rng.range(p.starve_ms.0, p.starve_ms.1));
                starve_cpu(length).await.map(|threads| {
                    format!("{threads} busy threads for {:.1} s", length.as_secs_f64())
                })
            }
            FaultKind::EndTxnLoss => match &kafka_proxy {
                None => Ok("no Kafka proxy: nothing done".to_owned()),
                Some(kp) => {
                    let fault = if rng.chance(0.5) {
                        KafkaFault::Drop
                    } else {
                        KafkaFault::Delay(Duration::from_millis(rng.range(1_000, 15_000)))
                    };
                    let before = kp.kafka_faults_fired();
                    kp.arm_kafka_fault(END_TXN, fault);
                    let armed = Instant::now();
                    while kp.kafka_faults_fired() == before
                        && armed.elapsed() < Duration::from_secs(10)
                    {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    let fired = kp.kafka_faults_fired() > before;
                    if !fired {
                        kp.disarm_kafka_fault();
                    }
                    Ok(format!(
                        "EndTxn answer {}{}",
                        match fault {
                            KafkaFault::Drop => "dropped".to_owned(),
                            KafkaFault::Delay(d) => format!("held {:.1} s", d.as_secs_f64()),
                        },
                        if fired {
                            ""
                        } else {
                            " (no EndTxn seen in 10 s)"
                        }
                    ))
                }
            },
            FaultKind::ProxyFreeze => {
                let frozen = Duration::from_millis(rng.range(p.freeze_ms.0, p.freeze_ms.1));
                let before = proxy.active();
                proxy.freeze();
                tokio::time::sleep(frozen).await;
                proxy.thaw();
                Ok(format!(
                    "{before} relay conns half-open for {:.1} s",
                    frozen.as_secs_f64()
                ))
            }
        };
        let duration = begun.elapsed();
        let detail = match injected {
            Ok(d) => d,
            Err(e) => {
                let msg = format!(
                    "fault {} ({}) could not be injected: {e:#}",
                    i + 1,
                    kind.label()
                );
                log.say(&msg);
                failures.push(msg);
                // Make sure the services are back before going on.
                let _ = services.up_all().await;
                continue;
            }
        };
        let fault_end = Instant::now();
        if matches!(kind, FaultKind::BrokerRestart) {
            // A probe reader kept across the broker's restart was seen stuck after it on a
            // loaded machine (every later probe "did not arrive" while a fresh reader found all
            // rows): read the probe topic anew, from its beginning.
            match ProbeWatcher::start(&bootstrap, &probe_topic) {
                Ok(w) => watcher = w,
                Err(e) => log.say(format!("the probe reader was not renewed: {e:#}")),
            }
        }
        let probe = prober.write().await?;
        fresh += 1;
        prober.write_fresh(fresh).await?;
        let recovery = match watcher.wait_for(&probe, p.recovery_timeout).await {
            Ok(t) => Some(t.saturating_duration_since(fault_end)),
            Err(e) => {
                let msg = format!(
                    "fault {} ({}): {e:#}\n--- relay stderr ---\n{}",
                    i + 1,
                    kind.label(),
                    tail(&relays.current()?.stderr_text(), 4_000)
                );
                log.say(&msg);
                failures.push(msg);
                None
            }
        };
        let sample = checker
            .sample(&db, &format!("after fault {} ({})", i + 1, kind.label()))
            .await?;
        log.say(format!(
            "fault {:>3}/{}: {:<16} {:<52} recovered in {} | checkpoint {}{} | rows {}",
            i + 1,
            plan.len(),
            kind.label(),
            detail,
            recovery.map_or("NEVER".into(), |d| format!("{:.1} s", d.as_secs_f64())),
            sample.checkpoint.position(),
            if sample.boundary && !sample.backwards {
                ""
            } else {
                " NOT OK"
            },
            workload
                .live
                .rows_committed
                .load(std::sync::atomic::Ordering::Relaxed)
        ));
        checkpoints.push(sample);
        faults.push(FaultRecord {
            kind,
            at_s,
            detail,
            duration,
            recovery,
        });
    }

    // The end: stop writing, let the relay deliver everything, stop it gracefully, compare.
    let writer_result = workload.stop().await;
    let writers = match writer_result {
        Ok(w) => w,
        Err(e) => {
            failures.push(format!("a writer failed: {e:#}"));
            WriterStats::default()
        }
    };
    let mut writers = writers;
    let probe_stats = prober.committer.close().await;
    writers.failed_attempts += probe_stats.failed_attempts;
    writers.uncertain_commits += probe_stats.uncertain_commits;
    writers.uncertain_committed += probe_stats.uncertain_committed;
    relays.check_alive(&log)?;
    let committed: HashSet<String> = retry(Duration::from_secs(120), async || {
        let mut conn = db.conn().await?;
        let keys: Vec<String> = conn.query("SELECT event_key FROM outbox").await?;
        Ok(keys.into_iter().collect())
    })
    .await?;
    log.say(format!(
        "writers stopped: {} rows in the outbox table; waiting for the relay to deliver them",
        committed.len()
    ));
    let topics: Vec<String> = topics
        .into_iter()
        .chain((1..=fresh).map(|n| spec.topic_for(&workload::fresh_type(n))))
        .collect();
    let drain_start = Instant::now();
    let read =
        read_until_delivered(&bootstrap, &topics, &committed, Duration::from_secs(300)).await?;
    let drain = drain_start.elapsed();
    let seen: HashSet<&str> = read.iter().filter_map(|r| r.header("event_key")).collect();
    let not_yet = committed
        .iter()
        .filter(|k| !seen.contains(k.as_str()))
        .count();
    log.say(format!(
        "{} records read in {:.1} s; {} committed rows not delivered",
        read.len(),
        drain.as_secs_f64(),
        not_yet
    ));
    drop(read);

    relays.check_alive(&log)?;
    let relay = relays.current()?;
    match relay.stop(Duration::from_secs(60)).await {
        Ok(status) if status.success() => {}
        Ok(status) => failures.push(format!(
            "graceful stop ended with {}\n{}",
            describe_exit(&status),
            tail(&relay.stderr_text(), 4_000)
        )),
        Err(e) => failures.push(format!("graceful stop failed: {e:#}")),
    }
    let final_sample = checker.sample(&db, "at the end").await?;
    log.say(format!(
        "relay stopped; final checkpoint {} (rows_acked {})",
        final_sample.checkpoint.position(),
        final_sample.checkpoint.rows_acked
    ));
    checkpoints.push(final_sample);
    drop(watcher);

    let topic_template = spec.clone();
    let (verification, audit) = final_checks(
        &log,
        &bootstrap,
        &topics,
        &committed,
        &uid,
        |t| topic_template.topic_for(t),
        &audit_file,
        opts.exactly_once,
    )
    .await?;
    let unexpected_exits = std::mem::take(&mut relays.unexpected_exits);
    let report = Report {
        exactly_once: opts.exactly_once,
        profile: p.name.clone(),
        writer_count: p.writers,
        seed: opts.seed,
        faults,
        writers,
        checkpoints,
        verification,
        audit,
        unexpected_exits,
        failures,
        relays_started: relays.started,
        relay_logs: relays.logs.clone(),
        duration: log.start.elapsed(),
        drain,
        fresh_topics: fresh,
    };
    if report.passed() {
        // Clean up what a passing run leaves on the server; topics stay (cheap, and useful).
        let _ = db.drop_database().await;
    } else {
        log.say(format!(
            "database {} kept for inspection; relay logs: {}",
            spec.mysql_url,
            relays
                .logs
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" ")
        ));
    }
    relays.retire();
    Ok(report)
}
