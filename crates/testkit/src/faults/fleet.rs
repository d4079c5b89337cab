//! The fleet's fault profile: several relay processes sharing many sources through a Kafka
//! consumer group (`[fleet]`), under a concurrent workload on every source while processes are
//! killed and frozen and the broker and the database servers restart; then a complete
//! comparison of Kafka with every source's outbox table.
//!
//! Run by `make faults-fleet` through the `fleet_faults` binary of this crate.
//!
//! # Setup
//! * Services: `tests/services/server.sh <server> up` for MariaDB 10.11, MariaDB 11.4 and
//!   MySQL 8.0, and `kafka.sh up` (ports from `MARIADB_PORT`, `MARIADB11_PORT`, `MYSQL8_PORT`,
//!   `KAFKA_PORT`). Faults restart them through the same scripts: run this only against
//!   servers nobody else uses at the same time (the make target's private ports).
//! * [`FleetProfile::sources_per_server`] sources on each server, each its own database
//!   (`ff_<suffix>`, both migrations), topics (`ff_<uid>.outbox.event.*`), connector name (one
//!   control-topic partition per source), derived-free `server_id`, acknowledgement audit file
//!   and, with `--exactly-once`, progress topic. One file per source in a `sources_dir`.
//! * [`FleetProfile::processes`] relay processes with the same main file (their own HTTP
//!   port): the folder, the broker, and `[fleet]` with the defaults a user gets (session
//!   timeout 6 s, lease TTL 8 s) and as many partitions as sources.
//! * Writers: one [`Workload`] per source, straight to its server (server restarts make some
//!   commits uncertain: they count as committed exactly when the row is in the table).
//!
//! # Faults (a seeded shuffle, a random pause before each)
//! * `kill -9` of a random process; once every source delivers again (the recovery time,
//!   measured from the kill: the failover of its sources), a new process takes its place.
//! * SIGSTOP of a random process for longer than the lease TTL plus the session timeout; the
//!   recovery is measured from the SIGSTOP while it is still frozen (its sources must move);
//!   then SIGCONT: the resumed process must notice that it lost its sources and produce
//!   nothing for them (a second producer shows up as a duplicate with `--exactly-once`, as an
//!   order violation or a replay gap otherwise).
//! * A broker restart; a restart of one of the three database servers.
//!
//! After each fault a probe row is committed in every source; the recovery is the time until
//! the last of them is read from Kafka. Every source's checkpoint is sampled after each fault
//! (a transaction boundary of a listed binlog file, never backwards) and its lease owner noted.
//!
//! # Checks at the end
//! Writers stop; every source's rows must reach Kafka; every process stops gracefully (exit
//! 0); per source, the topics (read `read_committed` with `--exactly-once`) are compared with
//! the outbox table ([`super::verify::verify`]) and every acknowledgement of its audit file is
//! read back. At-least-once: 0 missing; exactly-once: 0 missing and 0 duplicates.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use mysql_async::prelude::*;

use crate::audit::AuditCheck;
use crate::checkpoint::{read_checkpoint, DEFAULT_CHECKPOINT_TABLE};
use crate::db::TestDb;
use crate::env::{kafka_bootstrap, TestServer};
use crate::relay::{describe_exit, free_local_port, RelayConfigSpec, RelayProcess};
use crate::state::read_state_row;
use crate::unique::unique_suffix;

use super::probe::ProbeWatcher;
use super::rng::Rng;
use super::services::{Service, Services};
use super::verify::Verification;
use super::workload::{self, Committer, Workload, WorkloadConfig, WriterStats};
use super::{
    final_checks, first_probe, read_until_delivered, retry, tail, CheckpointChecker,
    CheckpointSample, Log, Prober,
};

/// The fleet's session timeout and lease TTL (the `[fleet]` defaults): a frozen process is
/// frozen longer than their sum, so its sources must move.
const SESSION_TIMEOUT: Duration = Duration::from_millis(6_000);
const LEASE_TTL: Duration = Duration::from_millis(8_000);

/// The kinds of fault of the fleet's profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FleetFault {
    /// SIGKILL of one process; a new one is started once every source delivers again.
    ProcessKill,
    /// SIGSTOP of one process past the lease TTL plus the session timeout, then SIGCONT.
    ProcessFreeze,
    /// `kafka.sh down`, a pause, `kafka.sh up`.
    BrokerRestart,
    /// `server.sh <server> down`, a pause, `up`, for one of the three servers.
    ServerRestart,
}

impl FleetFault {
    const ALL: [FleetFault; 4] = [
        Self::ProcessKill,
        Self::ProcessFreeze,
        Self::BrokerRestart,
        Self::ServerRestart,
    ];

    /// Name in the report.
    pub fn label(self) -> &'static str {
        match self {
            Self::ProcessKill => "process kill -9",
            Self::ProcessFreeze => "process SIGSTOP",
            Self::BrokerRestart => "broker restart",
            Self::ServerRestart => "server restart",
        }
    }
}

/// How much of everything.
#[derive(Debug, Clone)]
pub struct FleetProfile {
    /// Relay processes.
    pub processes: usize,
    /// Sources on each of the three servers.
    pub sources_per_server: usize,
    /// Process kills.
    pub kills: usize,
    /// Process freezes.
    pub freezes: usize,
    /// Broker restarts.
    pub broker_restarts: usize,
    /// Database server restarts (spread over the three servers).
    pub server_restarts: usize,
    /// Time a freeze lasts beyond the lease TTL plus the session timeout (ms, uniform).
    pub freeze_extra_ms: (u64, u64),
    /// Aggregate ids of each source's writer.
    pub keys_per_source: usize,
    /// Pause between two transactions of a writer (ms, uniform).
    pub writer_pause_ms: (u64, u64),
    /// Pause before each fault (ms, uniform).
    pub fault_gap_ms: (u64, u64),
    /// Extra time a restarted service stays down (ms, uniform).
    pub downtime_ms: (u64, u64),
    /// Longest wait for every source's probe after a fault.
    pub recovery_timeout: Duration,
}

impl FleetProfile {
    /// `make faults-fleet`: 3 processes, 12 sources (4 per server), 6 kills, 3 freezes,
    /// 2 broker restarts, 3 server restarts (one per server, in a seeded order).
    pub fn standard() -> Self {
        Self {
            processes: 3,
            sources_per_server: 4,
            kills: 6,
            freezes: 3,
            broker_restarts: 2,
            server_restarts: 3,
            freeze_extra_ms: (2_000, 6_000),
            keys_per_source: 4,
            writer_pause_ms: (20, 300),
            fault_gap_ms: (2_000, 8_000),
            downtime_ms: (0, 2_000),
            recovery_timeout: Duration::from_secs(180),
        }
    }

    fn count(&self, kind: FleetFault) -> usize {
        match kind {
            FleetFault::ProcessKill => self.kills,
            FleetFault::ProcessFreeze => self.freezes,
            FleetFault::BrokerRestart => self.broker_restarts,
            FleetFault::ServerRestart => self.server_restarts,
        }
    }
}

/// Everything a run needs.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    /// What to inject.
    pub profile: FleetProfile,
    /// Seed of the workload and the fault plan.
    pub seed: u64,
    /// The `outbox-relay` binary.
    pub relay_bin: PathBuf,
    /// Repository root (for `tests/services/*.sh` and `migrations/`).
    pub repo_root: PathBuf,
    /// Run `server.sh <server> up` for the three servers and `kafka.sh up` first.
    pub start_services: bool,
    /// Every source with `kafka.delivery = "exactly_once"`: topics read `read_committed`, a
    /// duplicate fails the run.
    pub exactly_once: bool,
}

impl FleetOptions {
    /// `profile` with a seed from the clock, the default relay binary and this repository.
    pub fn new(profile: FleetProfile) -> Self {
        Self {
            profile,
            seed: Rng::seed_from_time(),
            relay_bin: super::default_relay_bin(),
            repo_root: super::services::default_repo_root(),
            start_services: true,
            exactly_once: false,
        }
    }
}

/// One injected fault.
#[derive(Debug, Clone)]
pub struct FleetFaultRecord {
    /// Kind.
    pub kind: FleetFault,
    /// What exactly was done.
    pub detail: String,
    /// Sources whose lease the affected process held when the fault began.
    pub sources_moved: usize,
    /// From the fault's start (kill, SIGSTOP) or end (restarts) until every source's probe
    /// was read; `None` when one did not arrive within the profile's recovery timeout.
    pub recovery: Option<Duration>,
}

/// What the run found for one source.
#[derive(Debug, Clone)]
pub struct SourceOutcome {
    /// Connector name.
    pub name: String,
    /// Its database server.
    pub server: TestServer,
    /// Writer counters.
    pub writers: WriterStats,
    /// Kafka compared with its outbox table.
    pub verification: Verification,
    /// Its acknowledgements read back.
    pub audit: AuditCheck,
    /// Its checkpoint samples.
    pub checkpoints: Vec<CheckpointSample>,
    /// Distinct processes (pids) seen holding its lease, in order.
    pub owners: Vec<u32>,
    /// Its final `lease_token` (how many times a process took its lease).
    pub lease_token: u64,
}

impl SourceOutcome {
    fn checkpoints_ok(&self) -> usize {
        self.checkpoints
            .iter()
            .filter(|c| c.boundary && !c.backwards)
            .count()
    }

    fn passed(&self, exactly_once: bool) -> bool {
        self.verification.passed()
            && self.audit.passed()
            && self.audit.acknowledged > 0
            && (!exactly_once || self.verification.duplicates == 0)
            && self.checkpoints_ok() == self.checkpoints.len()
    }
}

/// Everything a run found.
#[derive(Debug, Clone)]
pub struct FleetReport {
    /// Exactly-once sources.
    pub exactly_once: bool,
    /// Seed.
    pub seed: u64,
    /// Processes of the fleet at a time.
    pub processes: usize,
    /// Faults in the order they were injected.
    pub faults: Vec<FleetFaultRecord>,
    /// Per source.
    pub sources: Vec<SourceOutcome>,
    /// Processes that exited without being asked to (with their stderr tail).
    pub unexpected_exits: Vec<String>,
    /// Other failures.
    pub failures: Vec<String>,
    /// Processes started in all.
    pub processes_started: usize,
    /// Wall time.
    pub duration: Duration,
    /// From the writers' stop until every committed row was on Kafka.
    pub drain: Duration,
}

impl FleetReport {
    /// Every source passed, every fault recovered, no unexpected exit, no other failure.
    pub fn passed(&self) -> bool {
        self.sources.iter().all(|s| s.passed(self.exactly_once))
            && self.unexpected_exits.is_empty()
            && self.failures.is_empty()
            && self.faults.iter().all(|f| f.recovery.is_some())
    }

    fn missing(&self) -> usize {
        self.sources
            .iter()
            .map(|s| s.verification.missing.len())
            .sum()
    }

    fn duplicates(&self) -> usize {
        self.sources.iter().map(|s| s.verification.duplicates).sum()
    }

    /// The result table; its last line is exactly `missing: N duplicates: M`.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "\n=== fleet fault profile: {} processes, {} sources, {}, seed {}, {:.0} s ===",
            self.processes,
            self.sources.len(),
            if self.exactly_once {
                "exactly-once (read_committed)"
            } else {
                "at-least-once"
            },
            self.seed,
            self.duration.as_secs_f64()
        );
        let _ = writeln!(
            s,
            "{:<18} {:>8} {:>14} {:>14} {:>14}",
            "fault", "injected", "sources moved", "recovery max", "recovery mean"
        );
        for kind in FleetFault::ALL {
            let list: Vec<&FleetFaultRecord> =
                self.faults.iter().filter(|f| f.kind == kind).collect();
            let recs: Vec<f64> = list
                .iter()
                .filter_map(|f| f.recovery.map(|d| d.as_secs_f64()))
                .collect();
            let max = recs
                .iter()
                .copied()
                .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
            let mean = (!recs.is_empty()).then(|| recs.iter().sum::<f64>() / recs.len() as f64);
            let fmt = |x: Option<f64>| x.map_or("-".to_owned(), |x| format!("{x:.1} s"));
            let moved: usize = list.iter().map(|f| f.sources_moved).sum();
            let timeouts = list.len() - recs.len();
            let _ = writeln!(
                s,
                "{:<18} {:>8} {:>14} {:>14} {:>14}{}",
                kind.label(),
                list.len(),
                moved,
                fmt(max),
                fmt(mean),
                if timeouts > 0 {
                    format!("  ({timeouts} NOT RECOVERED)")
                } else {
                    String::new()
                }
            );
        }
        let _ = writeln!(s, "{}", "-".repeat(96));
        let _ = writeln!(
            s,
            "{:<24} {:<10} {:>8} {:>8} {:>8} {:>10} {:>7} {:>7} {:>11}",
            "source",
            "server",
            "rows",
            "records",
            "missing",
            "duplicates",
            "owners",
            "leases",
            "checkpoints"
        );
        for o in &self.sources {
            let v = &o.verification;
            let _ = writeln!(
                s,
                "{:<24} {:<10} {:>8} {:>8} {:>8} {:>10} {:>7} {:>7} {:>11}{}",
                o.name,
                o.server.name(),
                v.committed,
                v.records,
                v.missing.len(),
                v.duplicates,
                o.owners.len(),
                o.lease_token,
                format!("{}/{}", o.checkpoints_ok(), o.checkpoints.len()),
                if o.passed(self.exactly_once) {
                    ""
                } else {
                    "  FAIL"
                }
            );
        }
        let _ = writeln!(s, "{}", "-".repeat(96));
        let rows: u64 = self
            .sources
            .iter()
            .map(|o| o.verification.committed as u64)
            .sum();
        let records: u64 = self
            .sources
            .iter()
            .map(|o| o.verification.records as u64)
            .sum();
        let uncertain: u64 = self
            .sources
            .iter()
            .map(|o| o.writers.uncertain_commits)
            .sum();
        let acks: u64 = self
            .sources
            .iter()
            .map(|o| o.audit.acknowledged as u64)
            .sum();
        let max_recovery = self.faults.iter().filter_map(|f| f.recovery).max();
        for (k, v) in [
            ("rows written (outbox tables)", rows.to_string()),
            ("records on Kafka", records.to_string()),
            ("uncertain commits", uncertain.to_string()),
            ("acknowledgements audited", acks.to_string()),
            ("processes started", self.processes_started.to_string()),
            (
                "unexpected process exits",
                self.unexpected_exits.len().to_string(),
            ),
            (
                "max recovery time",
                max_recovery.map_or("-".into(), |d| format!("{:.1} s", d.as_secs_f64())),
            ),
            (
                "final read (every row found)",
                format!("{:.1} s", self.drain.as_secs_f64()),
            ),
        ] {
            let _ = writeln!(s, "{k:<32} {v:>12}");
        }
        let mut problems: Vec<String> = Vec::new();
        for o in &self.sources {
            for p in o.verification.problems(5) {
                problems.push(format!("{}: {p}", o.name));
            }
            for m in o.audit.missing.iter().chain(&o.audit.mismatched).take(5) {
                problems.push(format!("{}: acknowledged but not in the log: {m}", o.name));
            }
            if o.audit.acknowledged == 0 {
                problems.push(format!("{}: the acknowledgement audit is empty", o.name));
            }
            for c in o.checkpoints.iter().filter(|c| !c.boundary || c.backwards) {
                problems.push(format!(
                    "{}: checkpoint {} {}:{} {}",
                    o.name,
                    c.when,
                    c.checkpoint.binlog_file,
                    c.checkpoint.binlog_pos,
                    if c.backwards {
                        "moved backwards"
                    } else {
                        "is not a transaction boundary"
                    }
                ));
            }
        }
        for p in problems
            .iter()
            .chain(&self.failures)
            .chain(&self.unexpected_exits)
        {
            let _ = writeln!(s, "FAIL {p}");
        }
        let _ = writeln!(s, "result: {}", if self.passed() { "PASS" } else { "FAIL" });
        let _ = write!(
            s,
            "missing: {} duplicates: {}",
            self.missing(),
            self.duplicates()
        );
        s
    }
}

/// One source of the run.
struct Source {
    server: TestServer,
    db: TestDb,
    uid: String,
    spec: RelayConfigSpec,
    audit_file: PathBuf,
    workload: Option<Workload>,
    prober: Prober,
    watcher: Option<ProbeWatcher>,
    checker: CheckpointChecker,
    samples: Vec<CheckpointSample>,
    owners: Vec<u32>,
}

impl Source {
    fn name(&self) -> &str {
        &self.spec.connector_name
    }

    fn topics(&self) -> Vec<String> {
        ["Order", "Payment", workload::PROBE_TYPE]
            .iter()
            .map(|t| self.spec.topic_for(t))
            .collect()
    }

    fn probe_topic(&self) -> String {
        self.spec.topic_for(workload::PROBE_TYPE)
    }

    /// The pid holding its lease now, noted in `owners` when new.
    async fn note_owner(&mut self) -> Result<Option<u32>> {
        let pool = self.db.pool().clone();
        let name = self.name().to_owned();
        let row = retry(Duration::from_secs(120), async || {
            read_state_row(&pool, DEFAULT_CHECKPOINT_TABLE, &name).await
        })
        .await?;
        let pid = row.and_then(|r| r.lease_owner_pid());
        if let Some(pid) = pid {
            if self.owners.last() != Some(&pid) {
                self.owners.push(pid);
            }
        }
        Ok(pid)
    }
}

/// The processes of the fleet: one slot each, refilled after a kill or an unexpected exit.
struct Members {
    bin: PathBuf,
    dir: PathBuf,
    group: String,
    partitions: usize,
    slots: Vec<Option<(RelayProcess, u16)>>,
    started: usize,
    logs: Vec<PathBuf>,
    unexpected_exits: Vec<String>,
}

impl Members {
    fn main_file(&self, port: u16) -> String {
        format!(
            "sources_dir = {:?}\nsources_poll_ms = 0\n\n[kafka]\nbootstrap_servers = {:?}\n\n\
             [http]\nlisten = \"127.0.0.1:{port}\"\n\n[fleet]\nenabled = true\ngroup_id = {:?}\n\
             control_topic = {:?}\npartitions = {}\n",
            self.dir.display().to_string(),
            kafka_bootstrap(),
            self.group,
            format!("{}.control", self.group),
            self.partitions
        )
    }

    fn spawn(&mut self, slot: usize) -> Result<u32> {
        let port = free_local_port()?;
        let relay = RelayProcess::spawn(&self.bin, &self.main_file(port), &[])?;
        let pid = relay.pid();
        self.logs.push(relay.stderr_path().to_path_buf());
        self.started += 1;
        self.slots[slot] = Some((relay, port));
        Ok(pid)
    }

    fn get(&self, slot: usize) -> Result<&RelayProcess> {
        self.slots[slot]
            .as_ref()
            .map(|(r, _)| r)
            .with_context(|| format!("no process in slot {slot}"))
    }

    /// Forgets a process that ended (its logs stay on disk; RelayProcess's Drop would print
    /// them).
    fn retire(&mut self, slot: usize) {
        if let Some((r, _)) = self.slots[slot].take() {
            std::mem::forget(r);
        }
    }

    /// Records and replaces every process that exited on its own.
    fn check_alive(&mut self, log: &Log) -> Result<()> {
        for slot in 0..self.slots.len() {
            let Some((relay, _)) = &self.slots[slot] else {
                continue;
            };
            if let Some(status) = relay.try_exit_status()? {
                let msg = format!(
                    "process in slot {slot} {}, stderr {}:\n{}",
                    describe_exit(&status),
                    relay.stderr_path().display(),
                    tail(&relay.stderr_text(), 4_000)
                );
                log.say(format!("UNEXPECTED: {msg}"));
                self.unexpected_exits.push(msg);
                self.retire(slot);
                self.spawn(slot)?;
            }
        }
        Ok(())
    }

    fn stderr_tails(&self) -> String {
        self.slots
            .iter()
            .flatten()
            .map(|(r, _)| {
                format!(
                    "--- pid {} ({}) ---\n{}",
                    r.pid(),
                    r.stderr_path().display(),
                    tail(&r.stderr_text(), 3_000)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// A connector name for source `i` whose control-topic partition no other source has (so
/// `partitions` = the number of sources spreads them evenly).
fn connector_name(i: usize, partitions: usize, used: &mut HashSet<i32>) -> Result<String> {
    let base = format!("ff{i}-{}", unique_suffix());
    (0..10_000)
        .map(|k| format!("{base}-{k}"))
        .find(|name| {
            used.insert(outbox_relay_kafka::fleet::source_partition(
                name,
                i32::try_from(partitions).unwrap_or(i32::MAX),
            ))
        })
        .context("no connector name with a free control-topic partition")
}

/// Commits a probe in every source, then waits for all of them; the time from `since` until
/// the last arrived, or the first that did not within `timeout`.
async fn probe_all(sources: &mut [Source], since: Instant, timeout: Duration) -> Result<Duration> {
    let mut keys = Vec::new();
    for s in sources.iter_mut() {
        let key = s
            .prober
            .write()
            .await
            .with_context(|| format!("committing a probe in {}", s.name()))?;
        keys.push(key);
    }
    let deadline = Instant::now() + timeout;
    let mut last = since;
    for (s, key) in sources.iter().zip(&keys) {
        let watcher = s.watcher.as_ref().context("no probe watcher")?;
        let left = deadline.saturating_duration_since(Instant::now());
        let at = watcher
            .wait_for(key, left)
            .await
            .with_context(|| format!("source {} ({})", s.name(), s.server))?;
        last = last.max(at);
    }
    Ok(last.saturating_duration_since(since))
}

/// Runs the fleet's fault profile and returns its report (print it with
/// [`FleetReport::render`]).
///
/// # Errors
/// Set-up failed (services, databases, relay binary), or the harness itself failed. Problems of
/// the relay are in the report, not errors.
pub async fn run(opts: &FleetOptions) -> Result<FleetReport> {
    let log = Log {
        start: Instant::now(),
    };
    let p = &opts.profile;
    let mut rng = Rng::new(opts.seed);
    let servers = TestServer::ALL;
    let n_sources = p.sources_per_server * servers.len();
    log.say(format!(
        "fleet fault profile: {} processes, {} sources ({} on each of {}), {}; {} kills, {} \
         freezes, {} broker restarts, {} server restarts; seed {} (repeat with --seed {}); Kafka {}",
        p.processes,
        n_sources,
        p.sources_per_server,
        servers
            .iter()
            .map(|s| format!("{s} 127.0.0.1:{}", s.port()))
            .collect::<Vec<_>>()
            .join(", "),
        if opts.exactly_once {
            "exactly-once"
        } else {
            "at-least-once"
        },
        p.kills,
        p.freezes,
        p.broker_restarts,
        p.server_restarts,
        opts.seed,
        opts.seed,
        kafka_bootstrap()
    ));
    if !opts.relay_bin.is_file() {
        bail!(
            "relay binary {} not found: build it (cargo build -p outbox-relay) or pass --relay-bin / OUTBOX_RELAY_BIN",
            opts.relay_bin.display()
        );
    }
    let services = Services::new(&opts.repo_root);
    if opts.start_services {
        for s in servers {
            services
                .run(Service::Named(s), "up", Duration::from_secs(600))
                .await
                .with_context(|| format!("starting {s}"))?;
        }
        services
            .run(Service::Kafka, "up", Duration::from_secs(900))
            .await
            .context("starting Kafka")?;
    }

    // The sources: databases, source files, writers.
    let run_uid = unique_suffix();
    let dir = std::env::temp_dir()
        .join("outbox-relay-tests")
        .join(format!("fleet-faults-{run_uid}"));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut used = HashSet::new();
    let mut sources = Vec::new();
    for (i, server) in servers
        .iter()
        .flat_map(|s| std::iter::repeat_n(*s, p.sources_per_server))
        .enumerate()
    {
        let server_url = format!("mysql://root@127.0.0.1:{}", server.port());
        let db = TestDb::create_on(&server_url, "ff").await?;
        let uid = unique_suffix();
        let name = connector_name(i, n_sources, &mut used)?;
        // server_id 0: each process of the fleet derives its own.
        let mut spec = RelayConfigSpec::new(&db, &name, 0, &format!("ff_{uid}"));
        spec.heartbeat_interval_ms = Some(1_000);
        spec.read_timeout_ms = Some(4_000);
        if opts.exactly_once {
            spec.kafka_extra =
                format!("delivery = \"exactly_once\"\nprogress_topic = \"ff_{uid}.progress\"\n");
        }
        let audit_file = dir.join(format!("{name}-acks.jsonl"));
        let toml = format!(
            "{}\n[audit]\nacks_file = {:?}\n",
            spec.to_source_toml(),
            audit_file.display().to_string()
        );
        std::fs::write(dir.join(format!("{name}.toml")), toml)?;
        let prober = Prober {
            run: uid.clone(),
            committer: Committer::new(&db.url())?,
            next: 1,
        };
        let checker = CheckpointChecker {
            connector: name.clone(),
            start: db.created_at_binlog().clone(),
            last: None,
        };
        sources.push(Source {
            server,
            db,
            uid,
            spec,
            audit_file,
            workload: None,
            prober,
            watcher: None,
            checker,
            samples: Vec::new(),
            owners: Vec::new(),
        });
    }
    let group = format!("ff-{run_uid}");
    log.say(format!(
        "{} sources in {} (group {group}): {}",
        sources.len(),
        dir.display(),
        sources
            .iter()
            .map(|s| format!("{}@{}", s.name(), s.server))
            .collect::<Vec<_>>()
            .join(" ")
    ));
    let mut members = Members {
        bin: opts.relay_bin.clone(),
        dir: dir.clone(),
        group,
        partitions: n_sources,
        slots: (0..p.processes).map(|_| None).collect(),
        started: 0,
        logs: Vec::new(),
        unexpected_exits: Vec::new(),
    };
    for slot in 0..p.processes {
        members.spawn(slot)?;
    }

    // Every source streams: its first checkpoint row written (a source without one starts at
    // the end of the binlog, so rows committed before are not its to relay), then its first
    // probe on Kafka.
    let bootstrap = kafka_bootstrap();
    for s in &mut sources {
        let pool = s.db.pool().clone();
        let name = s.name().to_owned();
        let first = retry(Duration::from_secs(180), async || {
            read_checkpoint(&pool, DEFAULT_CHECKPOINT_TABLE, &name)
                .await?
                .filter(|c| !c.binlog_file.is_empty())
                .context("no checkpoint row yet")
        })
        .await
        .with_context(|| {
            format!(
                "source {name} stored no checkpoint\n{}",
                members.stderr_tails()
            )
        })?;
        s.checker.start = first.position();
    }
    for s in &mut sources {
        let topic = s.probe_topic();
        let watcher =
            match first_probe(&mut s.prober, &bootstrap, &topic, Duration::from_secs(180)).await {
                Ok(w) => w,
                Err(e) => bail!("source {}: {e:#}\n{}", s.name(), members.stderr_tails()),
            };
        s.watcher = Some(watcher);
        s.note_owner().await?;
        s.workload = Some(Workload::start(&WorkloadConfig {
            run_id: s.uid.clone(),
            url: s.db.url(),
            writers: 1,
            keys_per_writer: p.keys_per_source,
            pause_ms: p.writer_pause_ms,
            rollback_chance: 0.04,
            seed: rng.next_u64(),
        })?);
    }
    log.say("every source streams and is written to; injecting faults");

    let mut plan: Vec<FleetFault> = FleetFault::ALL
        .iter()
        .flat_map(|k| std::iter::repeat_n(*k, p.count(*k)))
        .collect();
    rng.shuffle(&mut plan);
    // Server restarts go round the three servers, from a seeded start.
    let mut next_server = rng.index(servers.len());
    let mut faults = Vec::new();
    let mut failures = Vec::new();
    for (i, kind) in plan.iter().copied().enumerate() {
        tokio::time::sleep(Duration::from_millis(
            rng.range(p.fault_gap_ms.0, p.fault_gap_ms.1),
        ))
        .await;
        members.check_alive(&log)?;
        if sources
            .iter()
            .any(|s| s.workload.as_ref().is_some_and(|w| !w.all_running()))
        {
            failures.push("a writer stopped early (see the error at the end)".into());
            break;
        }
        let slot = rng.index(p.processes);
        let pid = members.get(slot)?.pid();
        let mut moved = 0;
        if matches!(kind, FleetFault::ProcessKill | FleetFault::ProcessFreeze) {
            for s in &mut sources {
                if s.note_owner().await? == Some(pid) {
                    moved += 1;
                }
            }
        }
        let outcome: Result<(String, Duration)> = match kind {
            FleetFault::ProcessKill => {
                let began = Instant::now();
                let killed = members.get(slot)?.kill9();
                match killed {
                    Err(e) => Err(e),
                    Ok(_) => {
                        members.retire(slot);
                        let recovery = probe_all(&mut sources, began, p.recovery_timeout).await;
                        let new_pid = members.spawn(slot)?;
                        recovery.map(|r| {
                            (
                                format!("pid {pid} killed, pid {new_pid} started after recovery"),
                                r,
                            )
                        })
                    }
                }
            }
            FleetFault::ProcessFreeze => {
                let length = SESSION_TIMEOUT
                    + LEASE_TTL
                    + Duration::from_millis(rng.range(p.freeze_extra_ms.0, p.freeze_extra_ms.1));
                let relay = members.get(slot)?;
                let began = Instant::now();
                match relay.pause() {
                    Err(e) => Err(e),
                    Ok(()) => {
                        // Its sources must move while it is frozen.
                        let failover = probe_all(&mut sources, began, p.recovery_timeout).await;
                        let left = length.saturating_sub(began.elapsed());
                        tokio::time::sleep(left).await;
                        let frozen = began.elapsed();
                        let resumed = members.get(slot)?.resume();
                        match (failover, resumed) {
                            (Err(e), _) | (Ok(_), Err(e)) => Err(e),
                            (Ok(f), Ok(())) => {
                                // The resumed process has lost its sources: everything goes on.
                                let after = Instant::now();
                                probe_all(&mut sources, after, p.recovery_timeout)
                                    .await
                                    .map(|a| {
                                        (
                                            format!(
                                                "pid {pid} frozen {:.1} s; after SIGCONT all \
                                                 deliver in {:.1} s",
                                                frozen.as_secs_f64(),
                                                a.as_secs_f64()
                                            ),
                                            f,
                                        )
                                    })
                            }
                        }
                    }
                }
            }
            FleetFault::BrokerRestart | FleetFault::ServerRestart => {
                let (service, what) = if kind == FleetFault::BrokerRestart {
                    (Service::Kafka, "Kafka".to_owned())
                } else {
                    let s = servers[next_server % servers.len()];
                    next_server += 1;
                    (Service::Named(s), s.name().to_owned())
                };
                let downtime = Duration::from_millis(rng.range(p.downtime_ms.0, p.downtime_ms.1));
                match services.restart(service, downtime).await {
                    Err(e) => Err(e),
                    Ok((d, u)) => {
                        if kind == FleetFault::BrokerRestart {
                            // A reader kept across a broker restart was seen stuck after it:
                            // read the probe topics anew.
                            for s in &mut sources {
                                s.watcher =
                                    Some(ProbeWatcher::start(&bootstrap, &s.probe_topic())?);
                            }
                        }
                        let end = Instant::now();
                        probe_all(&mut sources, end, p.recovery_timeout)
                            .await
                            .map(|r| {
                                (
                                    format!(
                                        "{what} down {:.1} s + {:.1} s + up {:.1} s",
                                        d.as_secs_f64(),
                                        downtime.as_secs_f64(),
                                        u.as_secs_f64()
                                    ),
                                    r,
                                )
                            })
                    }
                }
            }
        };
        let (detail, recovery) = match outcome {
            Ok((d, r)) => (d, Some(r)),
            Err(e) => {
                let msg = format!(
                    "fault {} ({}): {e:#}\n{}",
                    i + 1,
                    kind.label(),
                    members.stderr_tails()
                );
                log.say(&msg);
                failures.push(msg);
                // Make sure everything is back before going on.
                for s in servers {
                    let _ = services
                        .run(Service::Named(s), "up", Duration::from_secs(300))
                        .await;
                }
                let _ = services
                    .run(Service::Kafka, "up", Duration::from_secs(300))
                    .await;
                for slot in 0..p.processes {
                    if let Some((r, _)) = &members.slots[slot] {
                        let _ = r.resume();
                    } else {
                        members.spawn(slot)?;
                    }
                }
                (String::new(), None)
            }
        };
        let mut bad = 0;
        for s in &mut sources {
            s.note_owner().await?;
            let sample = s
                .checker
                .sample(&s.db, &format!("after fault {} ({})", i + 1, kind.label()))
                .await?;
            if !sample.boundary || sample.backwards {
                bad += 1;
            }
            s.samples.push(sample);
        }
        log.say(format!(
            "fault {:>2}/{}: {:<16} {:<60} {} sources moved, recovered in {}{}",
            i + 1,
            plan.len(),
            kind.label(),
            detail,
            moved,
            recovery.map_or("NEVER".into(), |d| format!("{:.1} s", d.as_secs_f64())),
            if bad > 0 {
                format!(" | {bad} checkpoints NOT OK")
            } else {
                String::new()
            }
        ));
        faults.push(FleetFaultRecord {
            kind,
            detail,
            sources_moved: moved,
            recovery,
        });
    }

    // The end: stop writing, let the fleet deliver everything, stop it gracefully, compare.
    let mut writer_stats = Vec::new();
    for s in &mut sources {
        let mut stats = match s.workload.take() {
            Some(w) => w.stop().await.unwrap_or_else(|e| {
                failures.push(format!("{}: a writer failed: {e:#}", s.name()));
                WriterStats::default()
            }),
            None => WriterStats::default(),
        };
        let probe = std::mem::replace(&mut s.prober.committer, Committer::new(&s.db.url())?)
            .close()
            .await;
        stats.failed_attempts += probe.failed_attempts;
        stats.uncertain_commits += probe.uncertain_commits;
        stats.uncertain_committed += probe.uncertain_committed;
        writer_stats.push(stats);
    }
    members.check_alive(&log)?;
    let mut committed = Vec::new();
    for s in &sources {
        let pool = s.db.pool().clone();
        let keys: HashSet<String> = retry(Duration::from_secs(120), async || {
            let mut conn = pool.get_conn().await?;
            let keys: Vec<String> = conn.query("SELECT event_key FROM outbox").await?;
            Ok(keys.into_iter().collect())
        })
        .await?;
        committed.push(keys);
    }
    log.say(format!(
        "writers stopped: {} rows in the outbox tables; waiting for the fleet to deliver them",
        committed.iter().map(HashSet::len).sum::<usize>()
    ));
    let drain_start = Instant::now();
    for (s, keys) in sources.iter().zip(&committed) {
        let read =
            read_until_delivered(&bootstrap, &s.topics(), keys, Duration::from_secs(300)).await?;
        let seen: HashSet<&str> = read.iter().filter_map(|r| r.header("event_key")).collect();
        let not_yet = keys.iter().filter(|k| !seen.contains(k.as_str())).count();
        if not_yet > 0 {
            log.say(format!(
                "{}: {not_yet} committed rows not delivered within 300 s",
                s.name()
            ));
        }
    }
    let drain = drain_start.elapsed();
    log.say(format!("drained in {:.1} s", drain.as_secs_f64()));

    members.check_alive(&log)?;
    for (relay, _) in members.slots.iter().flatten() {
        if let Err(e) = relay.sigterm() {
            failures.push(format!("SIGTERM: {e:#}"));
        }
    }
    for (relay, _) in members.slots.iter().flatten() {
        match relay.wait_exit(Duration::from_secs(120)).await {
            Ok(status) if status.success() => {}
            Ok(status) => failures.push(format!(
                "graceful stop of pid {} ended with {}\n{}",
                relay.pid(),
                describe_exit(&status),
                tail(&relay.stderr_text(), 4_000)
            )),
            Err(e) => failures.push(format!("graceful stop of pid {}: {e:#}", relay.pid())),
        }
    }
    log.say("every process stopped; comparing Kafka with the outbox tables");

    let mut outcomes = Vec::new();
    for ((s, keys), writers) in sources.iter_mut().zip(&committed).zip(writer_stats) {
        let sample = s.checker.sample(&s.db, "at the end").await?;
        s.samples.push(sample);
        s.watcher = None;
        let spec = s.spec.clone();
        let (verification, audit) = final_checks(
            &log,
            &bootstrap,
            &s.topics(),
            keys,
            &s.uid,
            |t| spec.topic_for(t),
            &s.audit_file,
            opts.exactly_once,
        )
        .await?;
        let row = read_state_row(s.db.pool(), DEFAULT_CHECKPOINT_TABLE, s.name()).await?;
        outcomes.push(SourceOutcome {
            name: s.name().to_owned(),
            server: s.server,
            writers,
            verification,
            audit,
            checkpoints: std::mem::take(&mut s.samples),
            owners: s.owners.clone(),
            lease_token: row.map_or(0, |r| r.lease_token),
        });
    }
    let report = FleetReport {
        exactly_once: opts.exactly_once,
        seed: opts.seed,
        processes: p.processes,
        faults,
        sources: outcomes,
        unexpected_exits: std::mem::take(&mut members.unexpected_exits),
        failures,
        processes_started: members.started,
        duration: log.start.elapsed(),
        drain,
    };
    if report.passed() {
        for s in sources {
            let _ = s.db.drop_database().await;
        }
    } else {
        log.say(format!(
            "databases kept for inspection; sources in {}; process logs: {}",
            dir.display(),
            members
                .logs
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" ")
        ));
    }
    for slot in 0..p.processes {
        members.retire(slot);
    }
    Ok(report)
}
