//! `make bench`: outbox-relay's backlog drain and steady-state latency, measured on one database
//! server and this machine's Kafka, side by side with the machine's limit (bare binlog read, bare
//! producer), a polling relay and Debezium embedded. tests/bench/bench.sh runs it once per server
//! in `BENCH_SERVERS` and then combines the servers' figures:
//!
//! - `outbox-relay-bench measure FILE`: measures the server `OUTBOX_TEST_SERVER` names
//!   (`mariadb10` (default), `mariadb11` or `mysql8`, as `tests/services/server.sh` names them;
//!   its port from `MARIADB_PORT`, `MARIADB11_PORT` or `MYSQL8_PORT`) and writes its figures to
//!   FILE (one JSON object, `"server"` naming it);
//! - `outbox-relay-bench report FILE...`: combines such files (or earlier `latest.json` files)
//!   into `tests/bench/results/latest.json` (`{"servers": {"<server>": {...}}, ...}`),
//!   `latest.md`, `latency-<server>.png` and the book's benchmark page's bench section;
//! - `outbox-relay-bench` alone: both, for the one server.
//!
//! Settings (environment): `BENCH_ROWS` (1000000), `BENCH_STEADY_SECS` (60), `BENCH_RATES`
//! (`1000,5000,20000`), `BENCH_TXN_SIZES` (`1,10`), `BENCH_SYSTEMS` (`relay,relay_eos,polling,debezium`;
//! `relay_eos` is the relay with `kafka.delivery = "exactly_once"`),
//! `BENCH_RELAY_BIN` (`target/release/outbox-relay`), `BENCH_REF_BIN` (the binary of the
//! `relay_ref` system: another build to compare with, e.g. an earlier commit's; `relay_ref` is
//! not in the default systems), `BENCH_RELAY_NICE` (unset: the nice value every relay the bench
//! starts runs at, -20 to 19; negative needs root), `BENCH_PAIR_CONTROL` (0; 1: a second bare
//! producer beside each at-least-once relay run, the `pair_floor` stage), `BENCH_DEBEZIUM_LIBS` (jars folder of the
//! server's Debezium connector, from tests/bench/debezium.sh; no Debezium when unset or empty),
//! `BENCH_STEADY_REPEAT` (1: steady runs per system, rate and transaction size; more give
//! min/median/max of the p99s), `BENCH_WARMUP_SECS` (0: a run of that length at the highest
//! rate before each system's measured runs, not reported), `BENCH_MAX_BUSY` (25: a steady run starting while more than this
//! share of the CPUs, in %, is busy is flagged busy), `BENCH_OUT` (`tests/bench/results`), `BENCH_README` (`docs/src/benchmark.md`, empty: leave it),
//! `BENCH_PHASES` (`drain,steady,tenants`: run one for profiling; `tenants`, with the mariadb10
//! server's run only, is the table-pattern phase of [`tenants`]: its own private MariaDB on
//! `BENCH_TENANTS_PORT` (3596), `BENCH_TENANTS` schemas (1000) × `BENCH_TENANT_TABLES` (10)), `BENCH_DRAIN_REPEAT` (5: relay drains,
//! each after its own bare-produce measurement, the median reported; with `relay_eos`, each is
//! followed by an exactly-once drain and the ratio is the median pair's), `OUTBOX_TEST_SERVER`
//! and the server's port variable, `KAFKA_PORT`. tests/bench/bench.sh adds `BENCH_SERVERS`
//! (`mariadb10,mysql8`).

mod binlog;
mod debezium;
mod kafka;
mod polling;
mod procs;
mod report;
mod sampler;
mod sources;
mod stages;
mod tenants;
mod txn_bare;
mod workload;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use mysql_async::prelude::*;
use mysql_async::Pool;
use outbox_relay_testkit::binlog::{current_binlog_position, BinlogPosition};
use outbox_relay_testkit::{
    kafka_bootstrap, mysql_port, next_server_id, test_server, unique_suffix, RelayProcess, TestDb,
    TestServer,
};
use serde_json::{json, Map, Value};

use crate::workload::{now_micros, Written};

/// `kafka.transaction_interval_ms` of the exactly-once relay: what the book (docs/src/exactly-once.md) names for p99
/// commit → visible within 50 ms at 5k rows/s.
const EOS_INTERVAL_MS: u64 = 20;

/// One of the compared relays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum System {
    Relay,
    /// The relay with `kafka.delivery = "exactly_once"`.
    RelayEos,
    /// Another build of the relay (`BENCH_REF_BIN`, e.g. an earlier commit's), at-least-once,
    /// without `[audit] timings` (an older binary may not know the key): compared with `relay`
    /// on commit → broker append in the same run.
    RelayRef,
    Polling,
    Debezium,
}

impl System {
    fn name(self) -> &'static str {
        match self {
            System::Relay => "relay",
            System::RelayEos => "relay_eos",
            System::RelayRef => "relay_ref",
            System::Polling => "polling",
            System::Debezium => "debezium",
        }
    }
}

struct Settings {
    rows: u64,
    steady_secs: u64,
    rates: Vec<u64>,
    txns: Vec<u64>,
    systems: Vec<System>,
    drain: bool,
    steady: bool,
    /// The `tenants` phase ([`tenants`]): pattern relay start-up and memory on many schemas.
    tenants: bool,
    drain_repeat: usize,
    /// `BENCH_STEADY_REPEAT` (1): steady runs per system, rate and transaction size; with more
    /// than one, min/median/max of their p99s.
    steady_repeat: usize,
    /// `BENCH_WARMUP_SECS` (0): a steady run of this many seconds at the highest rate before
    /// each system's measured runs, not reported (a broker's JVM compiles its hot paths in its
    /// first minutes: without it the first system measured gets a slower broker).
    warmup_secs: u64,
    relay_bin: PathBuf,
    /// `BENCH_RELAY_NICE` (unset): the nice value (-20..=19) every relay the bench starts runs
    /// at (through `nice -n`), for the experiment that tells a relay's own work from its wait
    /// for a core on a machine it shares with the broker and the database; negative values need
    /// root.
    relay_nice: Option<i32>,
    /// `BENCH_PAIR_CONTROL=1`: beside each at-least-once relay run's bare producer, a second
    /// one sending the same rows (the `pair_floor` stage: the noise floor of `relay_excess`). Off by default:
    /// it adds a producer's CPU to the machine the relay is measured on.
    pair_control: bool,
    /// `BENCH_REF_BIN`: the binary of [`System::RelayRef`].
    ref_bin: Option<PathBuf>,
    debezium_libs: Option<PathBuf>,
    out: PathBuf,
    readme: Option<PathBuf>,
    bootstrap: String,
    /// The database server measured (`OUTBOX_TEST_SERVER`).
    server: TestServer,
}

/// `BENCH_RELAY_NICE`: unset or empty is none; else an integer in -20..=19.
fn relay_nice() -> Result<Option<i32>> {
    let Some(v) = std::env::var("BENCH_RELAY_NICE")
        .ok()
        .filter(|v| !v.trim().is_empty())
    else {
        return Ok(None);
    };
    let n: i32 = v
        .trim()
        .parse()
        .with_context(|| format!("BENCH_RELAY_NICE={v}: expected an integer from -20 to 19"))?;
    anyhow::ensure!(
        (-20..=19).contains(&n),
        "BENCH_RELAY_NICE={n}: expected an integer from -20 to 19"
    );
    Ok(Some(n))
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

fn list(name: &str, default: &str) -> Result<Vec<u64>> {
    env_or(name, default)
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .with_context(|| format!("{name}: {s:?} is not a number"))
        })
        .collect()
}

impl Settings {
    fn from_env() -> Result<Self> {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let systems = env_or("BENCH_SYSTEMS", "relay,relay_eos,polling,debezium")
            .split(',')
            .map(|s| match s.trim() {
                "relay" => Ok(System::Relay),
                "relay_eos" => Ok(System::RelayEos),
                "relay_ref" => Ok(System::RelayRef),
                "polling" => Ok(System::Polling),
                "debezium" => Ok(System::Debezium),
                other => anyhow::bail!(
                    "BENCH_SYSTEMS: unknown system {other:?} (relay, relay_eos, relay_ref, polling, debezium)"
                ),
            })
            .collect::<Result<Vec<_>>>()?;
        let readme = env_or(
            "BENCH_README",
            &root.join("docs/src/benchmark.md").display().to_string(),
        );
        let phases = env_or("BENCH_PHASES", "drain,steady,tenants");
        let phases: Vec<&str> = phases.split(',').map(str::trim).collect();
        if let Some(p) = phases
            .iter()
            .find(|p| !["drain", "steady", "tenants"].contains(p))
        {
            anyhow::bail!("BENCH_PHASES: unknown phase {p:?} (drain, steady, tenants)");
        }
        Ok(Self {
            tenants: phases.contains(&"tenants"),
            drain: phases.contains(&"drain"),
            drain_repeat: env_or("BENCH_DRAIN_REPEAT", "5")
                .parse()
                .context("BENCH_DRAIN_REPEAT")?,
            steady_repeat: env_or("BENCH_STEADY_REPEAT", "1")
                .parse::<usize>()
                .context("BENCH_STEADY_REPEAT")?
                .max(1),
            warmup_secs: env_or("BENCH_WARMUP_SECS", "0")
                .parse()
                .context("BENCH_WARMUP_SECS")?,
            steady: phases.contains(&"steady"),
            rows: env_or("BENCH_ROWS", "1000000")
                .parse()
                .context("BENCH_ROWS")?,
            steady_secs: env_or("BENCH_STEADY_SECS", "60")
                .parse()
                .context("BENCH_STEADY_SECS")?,
            rates: list("BENCH_RATES", "1000,5000,20000")?,
            txns: list("BENCH_TXN_SIZES", "1,10")?,
            systems,
            relay_bin: PathBuf::from(env_or(
                "BENCH_RELAY_BIN",
                &root
                    .join("target/release/outbox-relay")
                    .display()
                    .to_string(),
            )),
            relay_nice: relay_nice()?,
            pair_control: env_or("BENCH_PAIR_CONTROL", "0") == "1",
            ref_bin: std::env::var("BENCH_REF_BIN")
                .ok()
                .filter(|b| !b.is_empty())
                .map(PathBuf::from),
            debezium_libs: std::env::var("BENCH_DEBEZIUM_LIBS")
                .ok()
                .filter(|l| !l.is_empty())
                .map(PathBuf::from),
            out: PathBuf::from(env_or(
                "BENCH_OUT",
                &root.join("tests/bench/results").display().to_string(),
            )),
            readme: (!readme.is_empty()).then(|| PathBuf::from(readme)),
            bootstrap: kafka_bootstrap(),
            server: test_server(),
        })
    }
}

/// Everything one run shares.
struct Bench {
    s: Settings,
    /// Prefix of every topic and connector name of this run.
    prefix: String,
    scratch: PathBuf,
    runner: PathBuf,
    db_pid: Option<u32>,
    topics: Vec<String>,
    /// `wait_ready` calls so far (names each call's topic).
    ready_calls: u32,
    /// Suffix of the relay's connector and topics in repeated drains (`_r1`, …; empty first).
    run_tag: String,
    /// The backlog's records for the bare producer, built once.
    prepared: Option<Arc<Vec<kafka::Prepared>>>,
}

fn log(msg: impl AsRef<str>) {
    eprintln!("[bench] {}", msg.as_ref());
}

fn relay_toml(connector: &str, db: &TestDb, topic_prefix: &str) -> String {
    format!(
        "connector_name = \"{connector}\"\n\n[mysql]\nurl = \"{url}\"\nserver_id = {sid}\n\n\
         [outbox]\ntables = [\"{table}\"]\ntopic = \"{topic_prefix}{{aggregate_type}}\"\n\n\
         [kafka]\nbootstrap_servers = \"{bs}\"\n",
        url = db.url(),
        sid = next_server_id(),
        table = db.outbox_table(),
        bs = kafka_bootstrap(),
    )
}

/// A running system under test.
enum Running {
    /// A relay process and the port of its `/metrics`.
    Relay(RelayProcess, u16),
    Polling {
        stop: Arc<AtomicBool>,
        counters: Arc<polling::Counters>,
        task: tokio::task::JoinHandle<Result<()>>,
    },
    Debezium(debezium::Debezium),
}

impl Running {
    fn pid(&self) -> Option<u32> {
        match self {
            Running::Relay(r, _) => Some(r.pid()),
            Running::Debezium(d) => Some(d.pid()),
            Running::Polling { .. } => None,
        }
    }

    fn check(&mut self) -> Result<()> {
        match self {
            Running::Relay(r, _) => r.ensure_running(),
            Running::Debezium(d) => d.ensure_running(),
            Running::Polling { task, .. } => {
                anyhow::ensure!(!task.is_finished(), "the polling relay stopped");
                Ok(())
            }
        }
    }

    fn usage(&self) -> Option<procs::Usage> {
        self.pid().and_then(|p| procs::usage(p).ok())
    }

    async fn stop(self) -> Result<()> {
        match self {
            Running::Relay(r, _) => {
                r.stop(Duration::from_secs(60)).await?;
            }
            Running::Debezium(mut d) => d.stop().await,
            Running::Polling { stop, task, .. } => {
                stop.store(true, Ordering::Relaxed);
                task.await.context("polling task")??;
            }
        }
        Ok(())
    }
}

impl Bench {
    fn topic(&mut self, sys: &str, agg: &str) -> String {
        let t = format!("{}.{sys}.{agg}", self.prefix);
        self.topics.push(t.clone());
        t
    }

    fn topic_prefix(&self, sys: System) -> String {
        format!("{}.{}.", self.prefix, self.system_tag(sys))
    }

    /// `sys`'s name in topic and log names: the relay's carries the repetition's tag.
    fn system_tag(&self, sys: System) -> String {
        match sys {
            System::Relay | System::RelayEos | System::RelayRef => {
                format!("{}{}", sys.name(), self.run_tag)
            }
            _ => sys.name().to_owned(),
        }
    }

    /// The audit file (`[audit] timings`) of `sys`'s runs in this bench.
    fn audit_path(&self, sys: System) -> PathBuf {
        self.scratch
            .join(format!("audit-{}.jsonl", self.system_tag(sys)))
    }

    /// The relay's connector name on `db` (with the repetition's tag).
    fn connector(&self, db: &TestDb) -> String {
        format!("{}_{}{}", self.prefix, db.name(), self.run_tag)
    }

    /// The exactly-once relay's connector name on `db` (its own checkpoint and progress).
    fn connector_eos(&self, db: &TestDb) -> String {
        format!("{}_{}_eos{}", self.prefix, db.name(), self.run_tag)
    }

    /// Starts `sys` on `db`. The relay starts where its checkpoint says (or at the binlog end);
    /// Debezium where its offsets file (named `dbz_name`) says (or at the binlog end).
    /// `timed`: the relay writes `[audit] timings` for the latency budget (steady runs only: a
    /// drain measures throughput, which a line per record would lower).
    async fn start(
        &self,
        sys: System,
        db: &TestDb,
        dbz_name: &str,
        timed: bool,
    ) -> Result<Running> {
        Ok(match sys {
            System::Relay | System::RelayEos | System::RelayRef => {
                let connector = match sys {
                    System::RelayEos => self.connector_eos(db),
                    System::RelayRef => format!("{}_ref", self.connector(db)),
                    _ => self.connector(db),
                };
                let mut toml = relay_toml(&connector, db, &self.topic_prefix(sys));
                if sys == System::RelayEos {
                    // Appended to the [kafka] section, the last one.
                    toml.push_str(&format!(
                        "delivery = \"exactly_once\"\nprogress_topic = \"{}.progress\"\n\
                         transaction_interval_ms = {EOS_INTERVAL_MS}\n",
                        self.prefix
                    ));
                }
                // BENCH_RELAY_LOG (default `warn`): the relays' RUST_LOG, for profiling (their
                // logs are in the temp folder's outbox-relay-tests/relay_*.stderr.log).
                let log = std::env::var("BENCH_RELAY_LOG").unwrap_or_else(|_| "warn".into());
                // `[audit] timings`: the relay's points of the latency budget (stages.rs).
                let audit = self.audit_path(sys).display().to_string();
                let overrides = relay_overrides();
                // A free port (another relay on the machine may hold the default), known
                // here for the drain's sampler.
                let port = outbox_relay_testkit::free_local_port()?;
                let listen = format!("127.0.0.1:{port}");
                let mut env = vec![
                    ("RUST_LOG", log.as_str()),
                    ("OUTBOX_RELAY__HTTP__LISTEN", listen.as_str()),
                ];
                // The harness's own OUTBOX_RELAY__* settings reach its relays (the test kit
                // clears the caller's, so that a test runs the configuration it writes).
                env.extend(overrides.iter().map(|(k, v)| (k.as_str(), v.as_str())));
                let bin = if sys == System::RelayRef {
                    self.s
                        .ref_bin
                        .as_deref()
                        .context("BENCH_REF_BIN is not set (the relay binary to compare with)")?
                } else {
                    if timed {
                        env.push(("OUTBOX_RELAY__AUDIT__ACKS_FILE", &audit));
                        env.push(("OUTBOX_RELAY__AUDIT__TIMINGS", "true"));
                    }
                    &self.s.relay_bin
                };
                let r = match self.s.relay_nice {
                    // `nice` execs the relay: the pid the bench samples stays the relay's,
                    // and every thread it starts inherits the value.
                    Some(n) => {
                        let n = n.to_string();
                        let bin = bin.display().to_string();
                        RelayProcess::spawn_args(
                            "nice",
                            &["-n", &n, &bin, "run", "--config"],
                            &toml,
                            &env,
                        )?
                    }
                    None => RelayProcess::spawn(bin, &toml, &env)?,
                };
                r.wait_for_checkpoint_row(db.pool(), &connector, Duration::from_secs(60))
                    .await?;
                Running::Relay(r, port)
            }
            System::Polling => {
                let stop = Arc::new(AtomicBool::new(false));
                let counters = Arc::new(polling::Counters::default());
                let task = tokio::spawn(polling::run(
                    db.pool().clone(),
                    self.s.bootstrap.clone(),
                    self.topic_prefix(sys),
                    stop.clone(),
                    counters.clone(),
                ));
                Running::Polling {
                    stop,
                    counters,
                    task,
                }
            }
            System::Debezium => {
                let libs = self.s.debezium_libs.as_deref().context(
                    "BENCH_DEBEZIUM_LIBS is not set (tests/bench/debezium.sh resolves the jars)",
                )?;
                let prefix = self.topic_prefix(sys);
                let spec = debezium::Spec {
                    libs,
                    runner: &self.runner,
                    dir: &self.scratch,
                    name: dbz_name,
                    database: db.name(),
                    topic_prefix: &prefix,
                    server_id: next_server_id(),
                    mysql_port: mysql_port(),
                    mariadb: self.s.server.is_mariadb(),
                    bootstrap: &self.s.bootstrap,
                };
                Running::Debezium(debezium::Debezium::start(&spec).await?)
            }
        })
    }

    /// Commits one row of workload `ready` and waits until `sys` relayed it: the system is
    /// streaming (and, for Debezium, has an offset to commit).
    async fn wait_ready(&mut self, sys: System, db: &TestDb, run: &mut Running) -> Result<()> {
        // A topic of its own per call: a record left by an earlier phase must not count.
        self.ready_calls += 1;
        let agg = format!("ready{}", self.ready_calls);
        let topic = self.topic(sys.name(), &agg);
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut last_insert: Option<Instant> = None;
        loop {
            // Again every 3 s: Debezium reports its task started before it fixes the binlog
            // position it streams from, so a row committed right then can be before it.
            if last_insert.is_none_or(|t| t.elapsed() >= Duration::from_secs(3)) {
                let seq = u64::try_from(now_micros()).unwrap_or_default();
                let ts = now_micros();
                let key = workload::key_of(seq);
                db.pool()
                    .get_conn()
                    .await?
                    .exec_drop(
                        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, event_key, payload, created_at) VALUES (?, ?, 'Ready', ?, ?, ?)",
                        (agg.clone(), key.clone(), workload::event_key(&agg, seq), workload::payload(ts, seq, &key), workload::datetime6(ts)),
                    )
                    .await?;
                last_insert = Some(Instant::now());
            }
            run.check()?;
            // The topic is auto-created by the first record: missing means not yet.
            let n = kafka::wait_for_count(&self.s.bootstrap, &topic, 1, Duration::ZERO, || Ok(()))
                .await
                .unwrap_or(0);
            if n >= 1 {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{} relayed no row within 120 s",
                sys.name()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn db_cpu(&self) -> Option<f64> {
        self.db_pid
            .and_then(|p| procs::usage(p).ok())
            .map(|u| u.cpu_s)
    }

    /// Phase 1, 2, 4, 5 (drain part): one backlog, drained by each system in turn, plus the
    /// limit measured on the same binlog range and records.
    async fn drain(&mut self) -> Result<Value> {
        let db = TestDb::create("bench_drain").await?;
        db.pool()
            .get_conn()
            .await?
            .query_drop(polling::SCHEMA)
            .await?;
        let mut out = Map::new();
        let mut started = Vec::new();
        // Each binlog reader starts once before the backlog and stops: its position is before it.
        for sys in self.s.systems.clone() {
            if sys == System::Polling {
                continue;
            }
            log(format!(
                "drain: starting {} once to fix its position",
                sys.name()
            ));
            match self.start(sys, &db, "dbz_drain", false).await {
                Ok(mut run) => {
                    let r = self.wait_ready(sys, &db, &mut run).await;
                    run.stop().await?;
                    match r {
                        Ok(()) => started.push(sys),
                        Err(e) => {
                            out.insert(sys.name().into(), json!({"error": format!("{e:#}")}));
                        }
                    }
                }
                Err(e) => {
                    log(format!("{} cannot run: {e:#}", sys.name()));
                    out.insert(sys.name().into(), json!({"error": format!("{e:#}")}));
                }
            }
        }
        // The repeated relay drains start where the first one does: a copy of its checkpoint
        // row (taken before the backlog) per repetition. (An exactly-once copy has no point in
        // the progress topic yet, so it starts from that row too.)
        let firsts = [
            (System::Relay, self.connector(&db)),
            (System::RelayEos, self.connector_eos(&db)),
        ];
        for (_, first) in firsts.iter().filter(|(s, _)| started.contains(s)) {
            for rep in 1..self.s.drain_repeat {
                db.pool()
                    .get_conn()
                    .await?
                    .exec_drop(
                        "INSERT INTO outbox_relay_checkpoint (connector_name, binlog_file, binlog_pos, rows_acked, gtid_set, source_server_id, source_server_uuid, table_layouts) \
                         SELECT ?, binlog_file, binlog_pos, rows_acked, gtid_set, source_server_id, source_server_uuid, table_layouts FROM outbox_relay_checkpoint WHERE connector_name = ?",
                        (format!("{first}_r{rep}"), first),
                    )
                    .await?;
            }
        }
        if self.s.systems.contains(&System::Polling) {
            started.push(System::Polling);
            // Rows written so far (the ready rows) are not part of the backlog.
            db.pool()
                .get_conn()
                .await?
                .query_drop("UPDATE outbox SET status = 'SENT'")
                .await?;
        }
        let mut conn = db.conn().await?;
        let from = current_binlog_position(&mut conn).await?;
        log(format!("drain: writing {} rows", self.s.rows));
        let written = workload::write_backlog(db.pool(), "drain", self.s.rows, 4).await?;
        let to = current_binlog_position(&mut conn).await?;
        drop(conn);
        log(format!(
            "drain: wrote {} rows ({} transactions, {:.1} MB payload) in {:.1} s; binlog {}:{} .. {}:{}",
            written.rows,
            written.txns,
            written.payload_bytes as f64 / 1e6,
            written.secs,
            from.file,
            from.pos,
            to.file,
            to.pos
        ));
        out.insert(
            "backlog".into(),
            json!({
                "rows": written.rows, "transactions": written.txns,
                "payload_mb": written.payload_bytes as f64 / 1e6, "write_secs": written.secs,
            }),
        );

        // InnoDB keeps flushing and purging for a while after a million-row write: every
        // measured phase starts on a quiet machine.
        settle().await;
        // The limit: (a) bare binlog read of the same range, (b) bare produce of the same records.
        log("drain: limit (a) bare binlog read");
        let cpu0 = own_cpu();
        let b0 = procs::machine_busy_s().ok();
        let raw = binlog::raw_read(
            &db.url(),
            next_server_id(),
            self.s.server.is_mariadb(),
            &from,
            &to,
            None,
        )
        .await?;
        let read_busy = busy_share(b0, raw.secs);
        let read_cpu = own_cpu().zip(cpu0).map(|(b, a)| b - a);
        let read_rate = written.rows as f64 / raw.secs;
        let read = json!({"secs": raw.secs, "events": raw.events, "mb": raw.bytes as f64 / 1e6,
                          "rows_per_s": read_rate, "mb_per_s": raw.bytes as f64 / 1e6 / raw.secs,
                          "cpu_s_per_million": per_million(read_cpu, written.rows),
                          "machine_busy": read_busy});
        log(format!("drain: limit (a): {read}"));
        settle().await;

        // The relay drains the backlog `drain_repeat` times, each right after a bare-produce
        // measurement of its own (this machine's produce rate drifts by tens of percent between
        // minutes) and between two measurements of (c); the median run by fraction of its
        // limit is reported, all runs are kept.
        let relay = started.contains(&System::Relay);
        let eos = started.contains(&System::RelayEos);
        let reps = if relay { self.s.drain_repeat.max(1) } else { 1 };
        let mut limits = Vec::new();
        let mut relay_runs: Vec<Map<String, Value>> = Vec::new();
        // Exactly-once drains, each right after the at-least-once one of its repetition (the
        // same minute's machine): the reported ratio is the median of the paired ratios.
        let mut eos_runs: Vec<Map<String, Value>> = Vec::new();
        for rep in 0..reps {
            let (produce, produce_rate) = self.bare_produce(rep).await?;
            let (both, both_rate) = self
                .both_at_once(&format!("both{rep}"), &db, &from, &to, raw.bytes)
                .await?;
            let (mut limit_rate, bound_by) = drain_limit(read_rate, produce_rate, both_rate);
            let mut limit = json!({
                "binlog_read": read, "produce": produce, "both_at_once": both,
                "rows_per_s": limit_rate, "bound_by": bound_by,
            });
            if relay {
                self.run_tag = if rep == 0 {
                    String::new()
                } else {
                    format!("_r{rep}")
                };
                let mut r = self
                    .drain_one(System::Relay, &db, &written, limit_rate)
                    .await?;
                let rate = compared_rate(&r);
                r.insert(
                    "fraction_of_bare_producer".into(),
                    json!(rate / produce_rate.max(1.0)),
                );
                relay_runs.push(r);
                if eos {
                    let r = self
                        .drain_one(System::RelayEos, &db, &written, limit_rate)
                        .await?;
                    eos_runs.push(r);
                }
                // (c) again right after: this machine's rate drifts by up to 2x between
                // minutes, so the relay's drains are taken against the mean of the two
                // measurements around them rather than the one before.
                let (after, after_rate) = self
                    .both_at_once(&format!("after{rep}"), &db, &from, &to, raw.bytes)
                    .await?;
                let around = (both_rate + after_rate) / 2.0;
                let bound_by;
                (limit_rate, bound_by) = drain_limit(read_rate, produce_rate, around);
                limit["both_at_once_after"] = after;
                limit["both_at_once_mean_rows_per_s"] = json!(around);
                limit["rows_per_s"] = json!(limit_rate);
                limit["bound_by"] = json!(bound_by);
                for r in relay_runs.last_mut().into_iter().chain(eos_runs.last_mut()) {
                    let rate = compared_rate(r);
                    r.insert("fraction_of_limit".into(), json!(rate / limit_rate));
                }
            }
            limits.push((limit, limit_rate));
        }
        self.run_tag = String::new();
        let fraction = |r: &Map<String, Value>| r["fraction_of_limit"].as_f64().unwrap_or(0.0);
        let mut order: Vec<usize> = (0..relay_runs.len()).collect();
        order.sort_by(|&a, &b| fraction(&relay_runs[a]).total_cmp(&fraction(&relay_runs[b])));
        let median = order.get(order.len() / 2).copied().unwrap_or(0);
        let (limit, limit_rate) = limits[median].clone();
        out.insert("limit".into(), limit);
        if relay {
            out.insert(
                "relay_runs".into(),
                Value::Array(
                    relay_runs
                        .iter()
                        .zip(&limits)
                        .map(|(r, (_, l))| {
                            json!({"rows_per_s": r["rows_per_s"], "limit_rows_per_s": l,
                                   "streaming_rows_per_s": r["streaming_rows_per_s"],
                                   "startup_secs": r["startup_secs"],
                                   "fraction_of_limit": r["fraction_of_limit"],
                                   "fraction_of_bare_producer": r["fraction_of_bare_producer"],
                                   "cpu_s_per_million": r["cpu_s_per_million"],
                                   "peak_rss_mb": r["peak_rss_mb"]})
                        })
                        .collect(),
                ),
            );
            out.insert("relay".into(), Value::Object(relay_runs[median].clone()));
            if eos_runs.len() == relay_runs.len() && !eos_runs.is_empty() {
                let rate = |r: &Map<String, Value>| r["rows_per_s"].as_f64().unwrap_or(0.0);
                let ratios: Vec<f64> = eos_runs
                    .iter()
                    .zip(&relay_runs)
                    .map(|(e, r)| rate(e) / rate(r).max(1.0))
                    .collect();
                let mut by_ratio: Vec<usize> = (0..ratios.len()).collect();
                by_ratio.sort_by(|&a, &b| ratios[a].total_cmp(&ratios[b]));
                let mid = by_ratio[by_ratio.len() / 2];
                out.insert(
                    "relay_eos_runs".into(),
                    Value::Array(
                        eos_runs
                            .iter()
                            .zip(&ratios)
                            .map(|(e, q)| json!({"rows_per_s": e["rows_per_s"], "ratio_to_relay": q}))
                            .collect(),
                    ),
                );
                out.insert("eos_paired_ratio".into(), json!(ratios[mid]));
                out.insert("relay_eos".into(), Value::Object(eos_runs[mid].clone()));
            }
        }
        for sys in started
            .into_iter()
            .filter(|s| *s != System::Relay && !(relay && *s == System::RelayEos))
        {
            let r = self.drain_one(sys, &db, &written, limit_rate).await?;
            out.insert(sys.name().into(), Value::Object(r));
        }
        db.drop_database().await?;
        Ok(Value::Object(out))
    }

    /// Bare produce of the backlog's records to a fresh topic: the limit's produce side.
    /// Returns its figures and its rate (records/s).
    async fn bare_produce(&mut self, rep: usize) -> Result<(Value, f64)> {
        let limit_topic = self.topic("limit", &format!("drain{rep}"));
        kafka::create_topics(&self.s.bootstrap, std::slice::from_ref(&limit_topic)).await?;
        log("drain: limit (b) bare produce");
        let records = self.drain_records();
        let cpu0 = own_cpu();
        let b0 = procs::machine_busy_s().ok();
        let produced = kafka::raw_produce(
            &self.s.bootstrap,
            &limit_topic,
            "drain",
            records,
            10_000,
            None,
        )
        .await?;
        let busy = busy_share(b0, produced.secs);
        let cpu = own_cpu().zip(cpu0).map(|(b, a)| b - a);
        let rate = produced.records as f64 / produced.secs;
        let v = json!({"secs": produced.secs, "records": produced.records, "rows_per_s": rate,
                       "mb_per_s": produced.payload_bytes as f64 / 1e6 / produced.secs,
                       "cpu_s_per_million": per_million(cpu, produced.records),
                       "machine_busy": busy});
        log(format!("drain: limit (b): {v}"));
        settle().await;
        Ok((v, rate))
    }

    /// The backlog's records for the bare producers (built once, before the first one runs).
    fn drain_records(&mut self) -> Arc<Vec<kafka::Prepared>> {
        let rows = self.s.rows;
        Arc::clone(
            self.prepared
                .get_or_insert_with(|| Arc::new(kafka::prepare("drain", rows))),
        )
    }

    /// The limit's third side, (c): the bare binlog read and the bare produce of the same rows
    /// at once on this machine, each record sent only after the read reached it
    /// ([`kafka::ReadGate`]): what a relay that spends no CPU of its own could reach here,
    /// since on these cores reading the binlog takes CPU from producing. `range_bytes` is the
    /// range's size as limit (a) read it. Returns its figures and its rate (rows/s, from the
    /// dump request to the last acknowledgement).
    async fn both_at_once(
        &mut self,
        tag: &str,
        db: &TestDb,
        from: &BinlogPosition,
        to: &BinlogPosition,
        range_bytes: u64,
    ) -> Result<(Value, f64)> {
        let topic = self.topic("limit", tag);
        kafka::create_topics(&self.s.bootstrap, std::slice::from_ref(&topic)).await?;
        log("drain: limit (c) bare binlog read and bare produce at once");
        let records = self.drain_records();
        let read_bytes = Arc::new(AtomicU64::new(0));
        let gate = kafka::ReadGate {
            read_bytes: Arc::clone(&read_bytes),
            total_bytes: range_bytes,
        };
        let cpu0 = own_cpu();
        let b0 = procs::machine_busy_s().ok();
        let started = Instant::now();
        let url = db.url();
        let read = async {
            let r = binlog::raw_read(
                &url,
                next_server_id(),
                self.s.server.is_mariadb(),
                from,
                to,
                Some(&read_bytes),
            )
            .await;
            // Opens the gate whatever happened, so that a failed read cannot hold the producer.
            read_bytes.store(u64::MAX, Ordering::Relaxed);
            r
        };
        let produce = kafka::raw_produce(
            &self.s.bootstrap,
            &topic,
            "drain",
            records,
            10_000,
            Some(gate),
        );
        let (read, produced) = tokio::join!(read, produce);
        let (read, produced) = (read?, produced?);
        let secs = started.elapsed().as_secs_f64();
        let busy = busy_share(b0, secs);
        let cpu = own_cpu().zip(cpu0).map(|(b, a)| b - a);
        let rate = produced.records as f64 / secs;
        let v = json!({"secs": secs, "read_secs": read.secs, "produce_secs": produced.secs,
                       "records": produced.records, "rows_per_s": rate,
                       "mb_per_s": produced.payload_bytes as f64 / 1e6 / secs,
                       "cpu_s_per_million": per_million(cpu, produced.records),
                       "machine_busy": busy});
        log(format!("drain: limit (c): {v}"));
        settle().await;
        Ok((v, rate))
    }

    /// One drain of the backlog by `sys`, from its stored position (or offsets) before the
    /// backlog, until every record is on its topic.
    async fn drain_one(
        &mut self,
        sys: System,
        db: &TestDb,
        written: &Written,
        limit_rate: f64,
    ) -> Result<Map<String, Value>> {
        let topic = self.topic(&self.system_tag(sys), "drain");
        kafka::create_topics(&self.s.bootstrap, std::slice::from_ref(&topic)).await?;
        log(format!("drain: {}", self.system_tag(sys)));
        let db_cpu0 = self.db_cpu();
        let broker_cpu0 = broker_cpu();
        let b0 = procs::machine_busy_s().ok();
        // Exactly-once: records count once committed (visible to read_committed readers); the
        // topic also holds transaction markers, so its offsets are no count.
        let live = match sys {
            System::RelayEos => Some(kafka::LiveReader::start(&self.s.bootstrap, &topic)?),
            _ => None,
        };
        let t0 = now_micros();
        let clock = Instant::now();
        let mut run = self.start(sys, db, "dbz_drain", false).await?;
        let sampler = match &run {
            Running::Relay(r, port) => Some(sampler::Sampler::start(
                r.pid(),
                *port,
                max_in_flight(),
                self.db_pid,
            )),
            _ => None,
        };
        let timeout = Duration::from_secs((self.s.rows / 500).max(600));
        let n = match &live {
            Some(live) => live.wait_for(written.rows, timeout, || run.check()).await?,
            None => {
                kafka::wait_for_count(&self.s.bootstrap, &topic, written.rows, timeout, || {
                    run.check()
                })
                .await?
            }
        };
        let usage = run.usage();
        let sampled = match sampler {
            Some(s) => s.finish().await.summary(max_in_flight()),
            None => Value::Null,
        };
        // Where the relay's CPU went, by thread (the reader, the pipeline, librdkafka).
        let (threads, waits) = match (&run, run.pid()) {
            (Running::Relay(..), Some(pid)) => (
                procs::thread_cpu(pid).ok(),
                procs::thread_runq_wait(pid).ok(),
            ),
            _ => (None, None),
        };
        let wall = clock.elapsed().as_secs_f64();
        let db_cpu1 = self.db_cpu();
        let broker_cpu1 = broker_cpu();
        let machine_busy = busy_share(b0, wall);
        let counters = match &run {
            Running::Polling { counters, .. } => Some((
                counters.queries.load(Ordering::Relaxed),
                counters.rows_updated.load(Ordering::Relaxed),
            )),
            _ => None,
        };
        run.stop().await?;
        let mut r = Map::new();
        if n < written.rows {
            r.insert(
                "error".into(),
                json!(format!(
                    "only {n} of {} records within {timeout:?}",
                    written.rows
                )),
            );
        }
        let end_us = match live {
            // When the last record became visible here.
            Some(live) => live.finish()?.1,
            None => kafka::append_ms(&self.s.bootstrap, &topic, kafka::Edge::Last).await? * 1000,
        };
        let secs = ((end_us - t0) as f64 / 1e6).max(1e-3);
        let rate = n as f64 / secs;
        // From the start to the first record on its topic: the process start, the checks and
        // connections before the dump request, the first row's read and produce. The limit's
        // clock starts with its tools' connections and producer already being made, not with a
        // process start, so the system's share of the limit takes its rate from its first
        // record on (`streaming`): timed from the start, a relay's ~0.3 s of startup was a
        // tenth of a 1M-row drain. Without a readable first record (an empty topic, a drain
        // that timed out inside a transaction) the share falls back to the rate from the start.
        let first_us = kafka::append_ms(&self.s.bootstrap, &topic, kafka::Edge::First)
            .await
            .ok()
            .map(|ms| ms * 1000)
            .filter(|first| *first < end_us);
        if let Some(first) = first_us {
            let streaming = n.saturating_sub(1) as f64 / ((end_us - first) as f64 / 1e6);
            r.insert("startup_secs".into(), json!((first - t0) as f64 / 1e6));
            r.insert("streaming_rows_per_s".into(), json!(streaming));
        }
        r.insert("records".into(), json!(n));
        r.insert("secs".into(), json!(secs));
        r.insert("rows_per_s".into(), json!(rate));
        r.insert(
            "mb_per_s".into(),
            json!(written.payload_bytes as f64 / 1e6 / secs),
        );
        r.insert(
            "fraction_of_limit".into(),
            json!(compared_rate(&r) / limit_rate),
        );
        r.insert("machine_busy".into(), json!(machine_busy));
        if !sampled.is_null() {
            r.insert("sampled".into(), sampled);
        }
        if let Some(u) = usage {
            r.insert("cpu_s".into(), json!(u.cpu_s));
            r.insert(
                "cpu_s_per_million".into(),
                json!(u.cpu_s / (n as f64 / 1e6)),
            );
            r.insert("records_per_cpu_s".into(), json!(n as f64 / u.cpu_s));
            r.insert("peak_rss_mb".into(), json!(u.peak_rss_mb));
        }
        if let (Some(a), Some(b)) = (db_cpu0, db_cpu1) {
            r.insert("db_cpu_s".into(), json!(b - a));
        }
        if let (Some(a), Some(b)) = (broker_cpu0, broker_cpu1) {
            r.insert("broker_cpu_s".into(), json!(b - a));
        }
        if let Some(threads) = threads {
            r.insert("cpu_s_by_thread".into(), json!(threads));
        }
        if let Some(waits) = waits {
            r.insert("runq_wait_s_by_thread".into(), json!(waits));
        }
        if let Some((q, u)) = counters {
            r.insert("db_queries".into(), json!(q));
            r.insert("db_queries_per_s".into(), json!(q as f64 / wall));
            r.insert("db_rows_updated".into(), json!(u));
        }
        log(format!(
            "drain: {}: {}",
            self.system_tag(sys),
            Value::Object(r.clone())
        ));
        settle().await;
        Ok(r)
    }

    /// Phase 3, 4, 5 (steady part): each system in turn on a database of its own, every rate and
    /// transaction size.
    async fn steady(&mut self) -> Result<Vec<Value>> {
        let mut out = Vec::new();
        for sys in self.s.systems.clone() {
            let db = TestDb::create("bench_steady").await?;
            if sys == System::Polling {
                db.pool()
                    .get_conn()
                    .await?
                    .query_drop(polling::SCHEMA)
                    .await?;
            }
            if sys == System::RelayRef {
                // An earlier build may not know the byte-exact collation of today's event_key
                // (migrations/0001_outbox.sql): the one from before, same character set.
                db.pool()
                    .get_conn()
                    .await?
                    .query_drop(
                        "ALTER TABLE outbox MODIFY event_key VARCHAR(255) \
                         CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci NOT NULL",
                    )
                    .await?;
            }
            log(format!("steady: {}", sys.name()));
            let mut run = match self.start(sys, &db, "dbz_steady", true).await {
                Ok(r) => r,
                Err(e) => {
                    log(format!("steady: {} cannot run: {e:#}", sys.name()));
                    out.push(json!({"system": sys.name(), "error": format!("{e:#}")}));
                    db.drop_database().await?;
                    continue;
                }
            };
            if let Err(e) = self.wait_ready(sys, &db, &mut run).await {
                out.push(json!({"system": sys.name(), "error": format!("{e:#}")}));
                run.stop().await.ok();
                db.drop_database().await?;
                continue;
            }
            if let (true, Some(&rate), Some(&txn)) = (
                self.s.warmup_secs > 0,
                self.s.rates.iter().max(),
                self.s.txns.first(),
            ) {
                let r = self
                    .steady_one(sys, &db, &mut run, rate, txn, Run::Warmup)
                    .await;
                log(format!(
                    "steady: {} warm-up at {rate}/s (not reported): {}",
                    sys.name(),
                    match r {
                        Ok(v) => format!("p99 {} ms", v["p99_ms"]),
                        Err(e) => format!("{e:#}"),
                    }
                ));
            }
            for &rate in &self.s.rates.clone() {
                for &txn in &self.s.txns.clone() {
                    let mut runs = Vec::new();
                    for rep in 0..self.s.steady_repeat {
                        let r = self
                            .steady_one(sys, &db, &mut run, rate, txn, Run::Measured(rep))
                            .await;
                        match r {
                            Ok(mut v) => {
                                log(format!("steady: {v}"));
                                v["repetition"] = json!(rep);
                                runs.push(v.clone());
                                out.push(v);
                            }
                            Err(e) => {
                                log(format!("steady: {} {rate}/s x{txn}: {e:#}", sys.name()));
                                out.push(json!({"system": sys.name(), "rate": rate, "txn": txn, "error": format!("{e:#}")}));
                            }
                        }
                    }
                    if runs.len() > 1 {
                        out.push(repeats(sys, rate, txn, &runs));
                    }
                }
            }
            if let Some(u) = run.usage() {
                out.push(json!({"system": sys.name(), "steady_peak_rss_mb": u.peak_rss_mb}));
            }
            run.stop().await?;
            db.drop_database().await?;
        }
        Ok(out)
    }

    async fn steady_one(
        &mut self,
        sys: System,
        db: &TestDb,
        run: &mut Running,
        rate: u64,
        txn: u64,
        which: Run,
    ) -> Result<Value> {
        // Repetitions get workloads (event keys, topics) of their own.
        let (agg, secs) = match which {
            Run::Measured(0) => (format!("s{rate}x{txn}"), self.s.steady_secs),
            Run::Measured(rep) => (format!("s{rate}x{txn}r{rep}"), self.s.steady_secs),
            Run::Warmup => (format!("w{rate}x{txn}"), self.s.warmup_secs),
        };
        let topic = self.topic(sys.name(), &agg);
        kafka::create_topics(&self.s.bootstrap, std::slice::from_ref(&topic)).await?;
        let cpu0 = run.usage().map(|u| u.cpu_s);
        let db_cpu0 = self.db_cpu();
        let q0 = polling_queries(run);
        // The relay in both modes is also timed by a live read_committed reader: commit →
        // visible, the figure exactly-once is judged by.
        let live = match sys {
            System::Relay | System::RelayEos => {
                Some(kafka::LiveReader::start(&self.s.bootstrap, &topic)?)
            }
            _ => None,
        };
        let relay = matches!(sys, System::Relay | System::RelayEos | System::RelayRef);
        // A topic in use, not one the relay meets with the first measured row (a new topic's
        // first record waits for its metadata: ~0.5-1 s, and an exactly-once relay stops
        // reading until it is acknowledged).
        let primed = u64::from(relay);
        if relay {
            workload::write_prime(db.pool(), &agg).await?;
            kafka::wait_for_count(
                &self.s.bootstrap,
                &topic,
                1,
                Duration::from_secs(60),
                || run.check(),
            )
            .await?;
        }
        // The budget's limits on the same rows: a bare replica and a bare producer.
        let (tail, bare_live) = if relay {
            let (tail, bare_live) = self.start_tail(db, sys, &agg).await?;
            (Some(tail), bare_live)
        } else {
            (None, None)
        };
        let machine = machine_state().await;
        log(format!(
            "steady: {} {rate}/s x{txn}: machine {machine}",
            sys.name()
        ));
        let busy0 = procs::machine_busy_s().ok();
        let started_ms = stages::unix_ms();
        let w: Written = workload::write_steady(db.pool(), &agg, rate, txn, secs).await?;
        // The machine while the rows were written: near 1.0, every core was busy (writer,
        // database, relay, bare replica and producer, broker together) and a tail may be just
        // that.
        let busy_during = busy_share(busy0, w.secs);
        let writer_end = Instant::now();
        let wait = Duration::from_secs(60);
        let want = w.rows + primed;
        let n = match (&live, sys) {
            (Some(live), System::RelayEos) => live.wait_for(want, wait, || run.check()).await?,
            _ => {
                kafka::wait_for_count(&self.s.bootstrap, &topic, want, wait, || run.check()).await?
            }
        };
        let visible = match live {
            Some(live) => {
                if sys == System::Relay {
                    live.wait_for(want, wait, || Ok(())).await?;
                }
                Some(live.finish()?.0)
            }
            None => None,
        };
        let catch_up = writer_end.elapsed().as_secs_f64();
        // BENCH_KAFKA_GC_LOG (make bench-budget): the broker's GC pauses while this run's rows
        // were written and relayed.
        let broker_gc = std::env::var("BENCH_KAFKA_GC_LOG")
            .ok()
            .map(|path| stages::gc_pauses(Path::new(&path), started_ms, stages::unix_ms()));
        let cpu = run.usage().map(|u| u.cpu_s).zip(cpu0).map(|(b, a)| b - a);
        let db_cpu = self.db_cpu().zip(db_cpu0).map(|(b, a)| b - a);
        let queries = polling_queries(run).zip(q0).map(|(b, a)| b - a);
        // Broker append time − commit for the others; the exactly-once relay's records are
        // appended before their transaction commits, so only visibility counts for it.
        let committed = (sys == System::RelayEos).then_some(n);
        let appended = kafka::latencies(&self.s.bootstrap, &topic, committed).await?;
        let lat = match (&visible, sys) {
            (Some(v), System::RelayEos) => v.clone(),
            _ => appended.clone(),
        };
        let budget = match tail {
            Some(tail) => {
                let mut out = tail.finish().await?;
                let bare_error = out.bare_error.take();
                // The bare transactional producer committed everything it sent before
                // `finish` returned; its reader gets the last of it within a fetch or two.
                let bare_visible = match bare_live {
                    Some(live) => {
                        if let Some(e) = &bare_error {
                            log(format!(
                                "steady: the bare transactional producer stopped: {e}"
                            ));
                        }
                        // And its priming record.
                        let sent = out.committed_by_row.len() as u64 + 1;
                        live.wait_for(sent, wait, || Ok(())).await?;
                        live.finish()?.0.by_seq.into_iter().collect()
                    }
                    None => std::collections::HashMap::new(),
                };
                let points = stages::Points {
                    txn,
                    commits: w.commits.clone(),
                    arrivals: out.arrivals,
                    bare_by_row: out.produce_by_row,
                    control_by_row: out.control_by_row,
                    bare_committed: out.committed_by_row,
                    bare_visible,
                    audit: stages::read_audit(&self.audit_path(sys), &agg),
                    appended: appended.by_seq.iter().copied().collect(),
                    visible: visible
                        .as_ref()
                        .map(|v| v.by_seq.iter().copied().collect())
                        .unwrap_or_default(),
                };
                let mut budget = stages::budget(&points);
                // Its figures then cover only the rows before it stopped.
                if let Some(e) = bare_error {
                    budget["bare_error"] = json!(e);
                }
                Some(budget)
            }
            None => None,
        };
        let mut v = json!({
            "system": sys.name(), "rate": rate, "txn": txn,
            "rows": w.rows, "writer_rows_per_s": w.rows as f64 / w.secs,
            "writer_deadlocks": w.deadlocks,
            "delivered": n - primed.min(n), "catch_up_s": catch_up,
            // Kept up: everything delivered within 5 s of the writer's last commit.
            "kept_up": n >= want && catch_up <= 5.0,
            // The primed row has no writer's timestamp.
            "latency_samples": lat.micros.len(), "unusable": lat.unusable.saturating_sub(primed),
            "machine": machine, "machine_busy": busy_during,
        });
        if let Some(gc) = broker_gc {
            v["broker_gc"] = gc;
        }
        if let Some(b) = budget {
            v["budget"] = b;
        }
        for (k, x) in kafka::summary(&lat.micros) {
            v[k] = json!(x);
        }
        if let Some(vis) = &visible {
            for (k, x) in kafka::summary(&vis.micros) {
                v[format!("visible_{k}")] = json!(x);
            }
        }
        if let Some(c) = cpu {
            v["cpu_s"] = json!(c);
            v["cpu_pct"] = json!(100.0 * c / (w.secs + catch_up));
        }
        if let Some(c) = db_cpu {
            v["db_cpu_s"] = json!(c);
        }
        if let Some(q) = queries {
            v["db_queries_per_s"] = json!(q as f64 / (w.secs + catch_up));
            v["db_rows_updated"] = json!(n);
        }
        Ok(v)
    }
}

impl Bench {
    /// Starts the bare tail of `db`'s outbox (from the binlog's current end), producing to a
    /// topic of its own.
    /// Exactly-once: the bare producer is transactional, and a `read_committed` reader of its
    /// topic (returned too) times each row's arrival → visible.
    async fn start_tail(
        &mut self,
        db: &TestDb,
        sys: System,
        agg: &str,
    ) -> Result<(binlog::Tail, Option<kafka::LiveReader>)> {
        let bare = self.topic(&format!("bare_{}", sys.name()), agg);
        kafka::create_topics(&self.s.bootstrap, std::slice::from_ref(&bare)).await?;
        let bare_live = if sys == System::RelayEos {
            Some(kafka::LiveReader::start(&self.s.bootstrap, &bare)?)
        } else {
            None
        };
        let mut conn = db.pool().get_conn().await?;
        let column: Option<u64> = conn
            .exec_first(
                "SELECT ORDINAL_POSITION FROM information_schema.COLUMNS \
                 WHERE TABLE_SCHEMA = ? AND TABLE_NAME = 'outbox' AND COLUMN_NAME = 'event_key'",
                (db.name(),),
            )
            .await?;
        let column = column.context("the outbox table has no event_key column")?;
        let from = current_binlog_position(&mut conn).await?;
        drop(conn);
        binlog::Tail::start(
            &db.url(),
            next_server_id(),
            self.s.server.is_mariadb(),
            &from,
            binlog::TailTarget {
                database: db.name().to_owned(),
                table: "outbox".into(),
                event_key_column: usize::try_from(column.saturating_sub(1))?,
            },
            binlog::BareProducers {
                bootstrap: &self.s.bootstrap,
                topic: &bare,
                control: self.s.pair_control,
                transactional: sys == System::RelayEos,
            },
        )
        .await
        .map(|tail| (tail, bare_live))
    }
}

/// Which steady run of a system, rate and transaction size.
#[derive(Debug, Clone, Copy)]
enum Run {
    /// Before the measured ones, not reported (`BENCH_WARMUP_SECS`).
    Warmup,
    /// Repetition `n` (0-based) of `BENCH_STEADY_REPEAT`.
    Measured(usize),
}

/// min/median/max over repeated steady runs of one system, rate and transaction size: the
/// p99s (commit → ack, or visible for exactly-once), visible p99 and the relay's share of the
/// p99. An entry `{"system", "rate", "txn", "repeats": {figure: {"min", "median", "max", "runs"}}}`.
fn repeats(sys: System, rate: u64, txn: u64, runs: &[Value]) -> Value {
    let mut figures = Map::new();
    for (name, get) in [
        (
            "p99_ms",
            (|v: &Value| v["p99_ms"].as_f64()) as fn(&Value) -> Option<f64>,
        ),
        ("visible_p99_ms", |v: &Value| v["visible_p99_ms"].as_f64()),
        ("relay_share_p99_ms", |v: &Value| {
            v["budget"]["relay_share_p99_ms"].as_f64()
        }),
        ("relay_excess_p99_ms", |v: &Value| {
            v["budget"]["relay_excess_p99_ms"].as_f64()
        }),
        ("pair_floor_p99_ms", |v: &Value| {
            v["budget"]["pair_floor_p99_ms"].as_f64()
        }),
    ] {
        let mut xs: Vec<f64> = runs.iter().filter_map(get).collect();
        if xs.is_empty() {
            continue;
        }
        xs.sort_by(f64::total_cmp);
        figures.insert(
            name.to_owned(),
            json!({"min": xs[0], "median": xs[xs.len() / 2], "max": xs[xs.len() - 1], "runs": xs.len()}),
        );
    }
    json!({"system": sys.name(), "rate": rate, "txn": txn, "repeats": figures})
}

/// CPU seconds of the Kafka broker so far, when `BENCH_KAFKA_PIDFILE` (set by
/// tests/bench/bench.sh) names a readable pid file.
fn broker_cpu() -> Option<f64> {
    let file = std::env::var("BENCH_KAFKA_PIDFILE").ok()?;
    procs::usage(procs::pid_from_file(&file)?)
        .ok()
        .map(|u| u.cpu_s)
}

/// The machine before a measurement: load averages, and over one second the share of CPU time
/// stolen by the hypervisor and spent busy (all cores). A run that starts while more than
/// `BENCH_MAX_BUSY` % (default 25) of the CPUs are busy (something besides the idle relay,
/// broker and database is running) is flagged `busy`: its tail says more about the machine than
/// about the relay. The 1-minute load is recorded but flags nothing here: it remembers the
/// bench's own warm-up and previous run for minutes (tests/bench/budget.sh waits for it to fall
/// below `BENCH_MAX_LOAD` before each server's runs).
async fn machine_state() -> Value {
    fn cpu() -> Option<(u64, u64, u64)> {
        // cpu  user nice system idle iowait irq softirq steal ...
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let v: Vec<u64> = stat
            .lines()
            .next()?
            .split_whitespace()
            .skip(1)
            .filter_map(|x| x.parse().ok())
            .collect();
        let total: u64 = v.iter().take(8).sum();
        let idle = v.get(3)? + v.get(4)?;
        Some((total, idle, *v.get(7)?))
    }
    let load: Vec<f64> = std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .filter_map(|x| x.parse().ok())
        .collect();
    let a = cpu();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let b = cpu();
    let (busy, steal) = match (a, b) {
        (Some(a), Some(b)) if b.0 > a.0 => {
            let total = (b.0 - a.0) as f64;
            (
                json!(100.0 * (total - (b.1 - a.1) as f64) / total),
                json!(100.0 * (b.2 - a.2) as f64 / total),
            )
        }
        _ => (Value::Null, Value::Null),
    };
    let max: f64 = env_or("BENCH_MAX_BUSY", "25").parse().unwrap_or(25.0);
    json!({
        "load1": load.first(), "load5": load.get(1), "load15": load.get(2),
        "busy_pct": busy, "steal_pct": steal,
        "busy": busy.as_f64().is_some_and(|b| b > max),
    })
}

/// CPU seconds this process has used so far.
fn own_cpu() -> Option<f64> {
    procs::usage(std::process::id()).map(|u| u.cpu_s).ok()
}

/// The `OUTBOX_RELAY__*` variables the bench was started with (`OUTBOX_RELAY__KAFKA__MAX_IN_FLIGHT=40000
/// make bench`), passed to every relay it starts and recorded with the figures; the harness
/// sets `OUTBOX_RELAY__HTTP__LISTEN` and the audit file itself.
fn relay_overrides() -> Vec<(String, String)> {
    std::env::vars()
        .filter(|(k, _)| k.starts_with("OUTBOX_RELAY__"))
        .collect()
}

/// The drain's limit, the lowest of (a) the bare binlog read's rate, (b) the bare producer's and
/// (c) both at once (rows/s), and which of them it is (`binlog_read`, `produce`,
/// `both_at_once`).
fn drain_limit(read: f64, produce: f64, both: f64) -> (f64, &'static str) {
    let limit = read.min(produce).min(both);
    // Exact comparisons: the limit is one of the three values.
    let by = if limit == both {
        "both_at_once"
    } else if limit == read {
        "binlog_read"
    } else {
        "produce"
    };
    (limit, by)
}

/// The relays' `kafka.max_in_flight`: the bench's override, or the relay's default (10,000).
fn max_in_flight() -> f64 {
    relay_overrides()
        .iter()
        .find(|(k, _)| k == "OUTBOX_RELAY__KAFKA__MAX_IN_FLIGHT")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(10_000.0)
}

/// Busy share of all the machine's cores (relay or harness, database server, Kafka together) since
/// `busy0` (from [`procs::machine_busy_s`]) over `secs`: near 1.0 means the phase was bound by
/// this machine's CPUs.
fn busy_share(busy0: Option<f64>, secs: f64) -> Option<f64> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    procs::machine_busy_s()
        .ok()
        .zip(busy0)
        .map(|(b, a)| (b - a) / (secs * cores))
}

/// CPU seconds per million of `n` items.
fn per_million(cpu: Option<f64>, n: u64) -> Option<f64> {
    cpu.map(|c| c / (n as f64 / 1e6))
}

/// The rate of a drain's figures that its limit is compared with: from its first record on
/// (`streaming_rows_per_s`), or from its start when the first record could not be read.
fn compared_rate(r: &Map<String, Value>) -> f64 {
    r.get("streaming_rows_per_s")
        .or_else(|| r.get("rows_per_s"))
        .and_then(Value::as_f64)
        .unwrap_or(0.0)
}

/// Waits (at most 120 s) until the machine is quiet: less than 15% of its CPUs busy over a
/// second, twice in a row.
async fn settle() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut quiet = 0;
    while quiet < 2 && Instant::now() < deadline {
        let Ok(a) = procs::machine_busy_s() else {
            return;
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        let Ok(b) = procs::machine_busy_s() else {
            return;
        };
        quiet = if (b - a) / cores < 0.15 { quiet + 1 } else { 0 };
    }
}

fn polling_queries(run: &Running) -> Option<u64> {
    match run {
        Running::Polling { counters, .. } => Some(counters.queries.load(Ordering::Relaxed)),
        _ => None,
    }
}

/// The server's version for the report and its pid (for its CPU time). The version is the
/// running binary's own `--version` line (found through `/proc/<pid>/exe`: `mariadbd` from
/// Debian, or the unpacked `mysqld`/`mariadbd` of `tests/services/server.sh`), with the version
/// the server reports when that differs (the bench has MariaDB report a MySQL version for
/// Debezium's MySQL connector, tests/bench/bench.sh); `@@version (@@version_comment)` when the
/// binary cannot be run.
async fn db_info() -> Result<(String, Option<u32>)> {
    let pool = Pool::new(outbox_relay_testkit::mysql_url(None).as_str());
    let mut c = pool.get_conn().await?;
    let row: Option<(String, String, String)> = c
        .query_first("SELECT @@version, @@version_comment, @@pid_file")
        .await?;
    drop(c);
    pool.disconnect().await.ok();
    let (version, comment, pid_file) = row.unwrap_or_default();
    let pid = procs::pid_from_file(&pid_file);
    let binary = pid.and_then(binary_version);
    let version = match binary {
        Some(b) if !b.contains(&version) => format!("{b} (reporting version {version})"),
        Some(b) => b,
        None => format!("{version} ({comment})"),
    };
    Ok((version, pid))
}

/// `<binary> --version` of process `pid`'s executable, run with the process's
/// `LD_LIBRARY_PATH` (the unpacked MariaDB 11.4 needs its own libraries); the binary's folder is
/// left out of the line.
fn binary_version(pid: u32) -> Option<String> {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    let libs = environ
        .split(|b| *b == 0)
        .find_map(|v| v.strip_prefix(b"LD_LIBRARY_PATH="))
        .map(|v| String::from_utf8_lossy(v).into_owned());
    let mut cmd = std::process::Command::new(&exe);
    cmd.arg("--version");
    if let Some(libs) = libs {
        cmd.env("LD_LIBRARY_PATH", libs);
    }
    let out = cmd.output().ok().filter(|o| o.status.success())?;
    let line = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let dir = exe.parent().map(|d| format!("{}/", d.display()));
    let line = match dir {
        Some(d) => line.strip_prefix(&d).map_or(line.clone(), str::to_owned),
        None => line,
    };
    (!line.is_empty()).then_some(line)
}

fn machine(server: TestServer, db_version: &str) -> Value {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        .unwrap_or_default();
    let mem_gb = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map(|kb| kb / 1024.0 / 1024.0);
    let git = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    json!({
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu_model": model,
        "mem_gb": mem_gb,
        "kernel": read("/proc/sys/kernel/osrelease").trim(),
        "loadavg_at_start": read("/proc/loadavg").trim(),
        "server": server.name(),
        "db": db_version,
        "kafka": env_or("KAFKA_VERSION", "4.1.1"),
        "relay_commit": git,
    })
}

fn steady_p99(steady: &[Value], sys: &str, rate: u64) -> Option<f64> {
    steady
        .iter()
        .filter(|v| v["system"] == sys && v["rate"] == rate)
        .filter_map(|v| v["p99_ms"].as_f64())
        .reduce(f64::max)
}

/// The figures of `files` (what `measure` wrote, or combined files), combined
/// ([`report::combine`]).
fn combined(files: &[String]) -> Result<Value> {
    let mut runs = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).with_context(|| format!("reading {file}"))?;
        runs.push(serde_json::from_str(&text).with_context(|| format!("parsing {file}"))?);
    }
    report::combine(runs)
}

/// The relay's allocator (crates/cli/src/main.rs), so the bare producer limit is measured with
/// the same librdkafka allocation costs as the relay.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let s = Settings::from_env()?;
    match args.first().map(String::as_str) {
        None => {
            let (out, readme) = (s.out.clone(), s.readme.clone());
            let one = measure(s).await?;
            let all = report::combine(vec![one])?;
            report::write_all(&all, &out, readme.as_deref())?;
            print!("{}", report::markdown_all(&all, ""));
        }
        Some("measure") if args.len() == 2 => {
            let one = measure(s).await?;
            print!("{}", report::markdown(&one, None));
            std::fs::write(&args[1], serde_json::to_string_pretty(&one)? + "\n")
                .with_context(|| format!("writing {}", args[1]))?;
        }
        Some("sources") if args.len() == 1 => {
            sources::measure(&s.relay_bin, &s.out, s.readme.as_deref()).await?;
        }
        Some("report") if args.len() > 1 => {
            let all = combined(&args[1..])?;
            report::write_all(&all, &s.out, s.readme.as_deref())?;
            print!("{}", report::markdown_all(&all, ""));
        }
        // `make bench-budget`: steady-only runs, into BENCH_OUT and the page's budget section.
        Some("budget-report") if args.len() > 1 => {
            let all = combined(&args[1..])?;
            report::write_budget(&all, &s.out, s.readme.as_deref())?;
            print!("{}", report::budget_markdown(&all, ""));
        }
        _ => anyhow::bail!(
            "usage: outbox-relay-bench [measure FILE | report FILE... | budget-report FILE... | sources] (see crates/bench/src/main.rs)"
        ),
    }
    Ok(())
}

/// Measures the server `s.server`: drain, steady state, the summary and the targets, as one
/// JSON object (`"server"` names it).
async fn measure(s: Settings) -> Result<Value> {
    anyhow::ensure!(
        s.relay_bin.exists(),
        "{} does not exist: build it with `cargo build --release -p outbox-relay` (make bench does)",
        s.relay_bin.display()
    );
    let server = s.server;
    let (db_version, db_pid) = db_info()
        .await
        .with_context(|| format!("the {server} server (tests/services/server.sh {server} up)"))?;
    let sfx = unique_suffix();
    let scratch = std::env::temp_dir().join(format!("outbox-relay-bench-{sfx}"));
    std::fs::create_dir_all(&scratch)?;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut b = Bench {
        prefix: format!("bench_{sfx}"),
        scratch,
        runner: root.join("tests/bench/debezium/Runner.java"),
        db_pid,
        topics: Vec::new(),
        ready_calls: 0,
        run_tag: String::new(),
        prepared: None,
        s,
    };
    let started = Instant::now();
    let machine = machine(server, &db_version);
    log(format!("machine: {machine}"));
    let result = async {
        let drain = if b.s.drain {
            b.drain().await?
        } else {
            json!({})
        };
        let steady = if b.s.steady {
            b.steady().await?
        } else {
            Vec::new()
        };
        // The tenants phase runs its own private MariaDB 10.11: once per bench, with the
        // mariadb10 server's run.
        let tenants = if b.s.tenants && server == TestServer::MariaDb10 {
            tenants::measure(&b.s.relay_bin, &b.s.bootstrap).await?
        } else {
            Value::Null
        };
        anyhow::Ok((drain, steady, tenants))
    }
    .await;
    kafka::delete_topics(&b.s.bootstrap, &b.topics).await;
    std::fs::remove_dir_all(&b.scratch).ok();
    let (drain, steady, tenants) = result?;
    // min/median/max of repeated steady runs: beside the runs, not among them.
    let (steady_repeats, steady): (Vec<Value>, Vec<Value>) =
        steady.into_iter().partition(|v| v.get("repeats").is_some());

    let f = |v: &Value| v.as_f64();
    let relay_rate = f(&drain["relay"]["rows_per_s"]);
    let summary = json!({
        "drain_fraction_of_limit": f(&drain["relay"]["fraction_of_limit"]),
        "drain_ratio_to_debezium": relay_rate.zip(f(&drain["debezium"]["rows_per_s"])).map(|(a, b)| a / b),
        "drain_ratio_to_polling": relay_rate.zip(f(&drain["polling"]["rows_per_s"])).map(|(a, b)| a / b),
        "p99_ms_at_5k": steady_p99(&steady, "relay", 5000),
        // Paired with the at-least-once drain of the same repetition when both ran.
        "eos_drain_ratio": f(&drain["eos_paired_ratio"])
            .or_else(|| f(&drain["relay_eos"]["rows_per_s"]).zip(relay_rate).map(|(a, b)| a / b)),
        "eos_visible_p99_ms_at_5k": steady_p99(&steady, "relay_eos", 5000),
        "visible_p99_ms_at_5k": steady
            .iter()
            .filter(|v| v["system"] == "relay" && v["rate"] == 5000)
            .filter_map(|v| v["visible_p99_ms"].as_f64())
            .reduce(f64::max),
    });
    let mut all = json!({
        "server": server.name(),
        "machine": machine,
        "settings": {
            "rows": b.s.rows, "steady_secs": b.s.steady_secs, "rates": b.s.rates,
            "txn_sizes": b.s.txns, "payload_bytes": workload::PAYLOAD_BYTES, "keys": workload::KEYS,
            "partitions": kafka::PARTITIONS, "polling_batch": polling::BATCH,
            "polling_interval_ms": polling::INTERVAL.as_millis() as u64,
            "relay_nice": b.s.relay_nice,
            "pair_control": b.s.pair_control,
            "relay_overrides": relay_overrides()
                .into_iter()
                .map(|(k, v)| (k, Value::String(v)))
                .collect::<Map<String, Value>>(),
        },
        "drain": drain,
        "steady": steady,
        "steady_repeats": steady_repeats,
        "tenants": tenants,
        "duration_s": started.elapsed().as_secs_f64(),
    });
    for (k, v) in summary.as_object().into_iter().flatten() {
        all[k] = v.clone();
    }
    all["targets"] = report::targets(&all);
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_drain_limit_is_the_lowest_rate_and_names_it() {
        assert_eq!(
            drain_limit(1_700_000.0, 400_000.0, 350_000.0),
            (350_000.0, "both_at_once")
        );
        assert_eq!(
            drain_limit(1_700_000.0, 300_000.0, 350_000.0),
            (300_000.0, "produce")
        );
        assert_eq!(
            drain_limit(200_000.0, 300_000.0, 350_000.0),
            (200_000.0, "binlog_read")
        );
    }

    #[test]
    fn repeats_give_min_median_max_of_each_figure() {
        let runs = [
            json!({"p99_ms": 30.0, "budget": {"relay_share_p99_ms": 2.0}}),
            json!({"p99_ms": 10.0, "budget": {"relay_share_p99_ms": 4.0}}),
            json!({"p99_ms": 20.0, "budget": {"relay_share_p99_ms": 3.0}}),
        ];
        let r = repeats(System::Relay, 5000, 1, &runs);
        assert_eq!(r["system"], "relay");
        assert_eq!(r["rate"], 5000);
        let p99 = &r["repeats"]["p99_ms"];
        assert_eq!(
            (
                p99["min"].as_f64(),
                p99["median"].as_f64(),
                p99["max"].as_f64()
            ),
            (Some(10.0), Some(20.0), Some(30.0))
        );
        assert_eq!(p99["runs"], 3);
        assert_eq!(r["repeats"]["relay_share_p99_ms"]["median"], 3.0);
        // A figure no run has is left out.
        assert!(r["repeats"].get("visible_p99_ms").is_none());
    }
}
