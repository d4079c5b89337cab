//! Network and topology faults of the `outbox-relay` binary on the real database server
//! (`OUTBOX_TEST_SERVER`: MariaDB 10.11, MariaDB 11.4 or MySQL 8.0) and Kafka.
//!
//! * Half-open connections: the relay reaches the server through a [`TcpProxy`] that stops
//!   forwarding bytes without closing anything. The relay must notice the silent connections
//!   within `mysql.read_timeout_ms`, and lose nothing once the network is back.
//! * GTID failover: the relay follows a GTID replica of the same flavor
//!   (`tests/services/replica.sh <server>`), then is moved to the primary with
//!   `mysql.resume = "gtid"`; every committed row arrives.
//!
//! The tests use the shared services (the server's port variable, `KAFKA_PORT`) without
//! restarting them; the failover tests start a replica of the primary on `REPLICA_PORT`
//! (default the primary's port + 1) that replicates only the `failover_*` databases, and stop it
//! at the end.
//!
//! # Where the checkpoint lives in the failover tests
//! The relay stores its checkpoint on the server it reads (one `mysql.url`). On the replica that
//! is a local write, so:
//! * its local transactions get GTIDs of their own that cannot collide with the primary's:
//!   MariaDB's replica runs with `gtid_domain_id = 2` (`2-2-N` next to the primary's `0-1-N`;
//!   with `gtid_strict_mode` a local `0-2-N` would stop replication at the primary's next
//!   transaction), MySQL's carry the replica's own `server_uuid` (`replica-uuid:N` next to
//!   `primary-uuid:1-M` in `@@gtid_executed`);
//! * the checkpoint table is in a database of its own (`rstate_*`) that exists on both servers
//!   and is not replicated (the replica's `replicate_wild_do_table` covers only `failover_*`), so
//!   neither server's relay state overwrites the other's.
//!
//! Moving the relay to the primary is what an operator does: stop it, copy its checkpoint row
//! from the replica's state table to the primary's, start it with `mysql.url` pointing at the
//! primary and `mysql.resume = "gtid"`.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use mysql_async::prelude::*;
use mysql_async::{Conn, Pool};
use outbox_relay_testkit::faults::verify::{verify, Verification};
use outbox_relay_testkit::faults::workload::{
    aggregate_id, aggregate_type, event_key, payload, Committer, GenRow, Workload, WorkloadConfig,
};
use outbox_relay_testkit::{
    canonical_gtid_set, collect_records, collect_until, describe_exit, gtid_state_variable,
    mysql_port, next_server_id, read_all_records, read_checkpoint, read_committed_records,
    replica_port, replica_script, unique_suffix, wait_until, Checkpoint, Record, RelayConfigSpec,
    RelayProcess, TcpProxy, TestDb, Watchdog, DEFAULT_CHECKPOINT_TABLE,
};

/// The relay binary under test (built on first use).
fn bin() -> &'static str {
    outbox_relay_testkit::relay_bin()
}

const HEARTBEAT_MS: u64 = 1_000;
const READ_TIMEOUT_MS: u64 = 4_000;
/// Records reaching Kafka.
const RELAY_WAIT: Duration = Duration::from_secs(120);
/// A graceful stop until the process has exited.
const STOP: Duration = Duration::from_secs(60);

/// `[mysql]` settings the config file of [`RelayConfigSpec`] does not write.
fn relay_env(resume: Option<&'static str>) -> Vec<(&'static str, String)> {
    let mut env = vec![
        (
            "OUTBOX_RELAY__MYSQL__HEARTBEAT_INTERVAL_MS",
            HEARTBEAT_MS.to_string(),
        ),
        (
            "OUTBOX_RELAY__MYSQL__READ_TIMEOUT_MS",
            READ_TIMEOUT_MS.to_string(),
        ),
    ];
    if let Some(r) = resume {
        env.push(("OUTBOX_RELAY__MYSQL__RESUME", r.to_owned()));
    }
    env
}

fn spawn_relay(spec: &RelayConfigSpec, resume: Option<&'static str>) -> Result<RelayProcess> {
    let env = relay_env(resume);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    RelayProcess::spawn(bin(), &spec.to_toml(), &env)
}

fn topics(spec: &RelayConfigSpec) -> Vec<String> {
    ["Order", "Payment"]
        .iter()
        .map(|t| spec.topic_for(t))
        .collect()
}

/// A sequential writer: transactions of `rows_per_tx` rows over `keys` keys of writer 0, each
/// key with its own sequence.
struct SeqWriter {
    run: String,
    committer: Committer,
    next_seq: Vec<u64>,
    next_key: usize,
}

impl SeqWriter {
    fn new(run: &str, url: &str, keys: usize) -> Result<Self> {
        Ok(Self {
            run: run.to_owned(),
            committer: Committer::new(url)?,
            next_seq: vec![1; keys],
            next_key: 0,
        })
    }

    /// Commits `n` rows in transactions of up to 3 rows.
    async fn write(&mut self, n: usize) -> Result<()> {
        let mut left = n;
        while left > 0 {
            let take = left.min(3);
            let mut rows = Vec::with_capacity(take);
            for _ in 0..take {
                let j = self.next_key % self.next_seq.len();
                self.next_key += 1;
                let seq = self.next_seq[j];
                self.next_seq[j] += 1;
                let agg = aggregate_id(0, j);
                rows.push(GenRow {
                    event_key: event_key(&self.run, 0, j, seq),
                    aggregate_type: aggregate_type(j).to_owned(),
                    payload: payload(&agg, seq),
                    aggregate_id: agg,
                });
            }
            self.committer.commit(&rows, take > 1, false).await?;
            left -= take;
        }
        Ok(())
    }
}

async fn outbox_event_keys(pool: &Pool) -> Result<HashSet<String>> {
    let mut conn = pool.get_conn().await?;
    let keys: Vec<String> = conn.query("SELECT event_key FROM outbox").await?;
    Ok(keys.into_iter().collect())
}

/// Reads `topics` until every key of `wanted` has arrived (or `timeout`).
async fn read_until_all(
    bootstrap: &str,
    topics: &[String],
    wanted: &HashSet<String>,
    timeout: Duration,
) -> Result<Vec<Record>> {
    let mut remaining = wanted.clone();
    let mut done = 0;
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

fn describe(v: &Verification) -> String {
    format!(
        "{} committed, {} records, {} distinct delivered, {} missing, {} duplicates; problems:\n  {}",
        v.committed,
        v.records,
        v.distinct_delivered,
        v.missing.len(),
        v.duplicates,
        v.problems(15).join("\n  ")
    )
}

/// The lines of the relay's stderr that contain `needle`.
fn log_lines(relay: &RelayProcess, needle: &str) -> Vec<String> {
    relay
        .stderr_text()
        .lines()
        .filter(|l| l.contains(needle))
        .map(str::to_owned)
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Half-open connections
// ---------------------------------------------------------------------------------------------

/// What [`through_proxy`] sets up: the database, its unique suffix, the proxy, the relay's
/// spec, its topics, the relay and a writer.
type ThroughProxy = (
    TestDb,
    String,
    TcpProxy,
    RelayConfigSpec,
    Vec<String>,
    RelayProcess,
    SeqWriter,
);

/// A relay whose MySQL connections all go through a [`TcpProxy`], started and holding its
/// checkpoint row, and a writer of 4 keys on its database; database, connector and topics
/// named after `name`.
async fn through_proxy(name: &str) -> Result<ThroughProxy> {
    let db = TestDb::create(name).await?;
    let uid = unique_suffix();
    let proxy = TcpProxy::start(format!("127.0.0.1:{}", mysql_port())).await?;
    let mut spec = RelayConfigSpec::new(
        &db,
        &format!("{name}-{uid}"),
        next_server_id(),
        &format!("t_{uid}"),
    );
    // prefer_socket=false: mysql_async would otherwise move a loopback TCP connection to the
    // server's unix socket right after connecting, around the proxy.
    spec.mysql_url = format!(
        "mysql://root@127.0.0.1:{}/{}?prefer_socket=false",
        proxy.port(),
        db.name()
    );
    let topics = topics(&spec);
    let relay = spawn_relay(&spec, None)?;
    relay
        .wait_for_checkpoint_row(db.pool(), &spec.connector_name, Duration::from_secs(60))
        .await?;
    let writer = SeqWriter::new(&uid, &db.url(), 4)?;
    Ok((db, uid, proxy, spec, topics, relay, writer))
}

/// What the relay logs when a connection it waits on stays silent for `mysql.read_timeout_ms`:
/// the binlog stream (`outbox_relay_mysql::binlog::source`), the lease connection
/// (`state::lease`), any other statement such as a checkpoint write
/// (`outbox_relay_core::error::with_timeout`).
const FROZEN_CONNECTION_DETECTED: [&str; 3] = [
    "no binlog event or heartbeat",
    "did not answer within",
    "no answer within",
];

/// Rows flow through a proxy; the proxy freezes (every socket stays open, no byte moves, new
/// connections hang) for twice the read timeout while rows are written; then it thaws and more
/// rows are written. The relay must notice the silent connections within the read timeout (one
/// of [`FROZEN_CONNECTION_DETECTED`] in its log) and every row must arrive, in order per key.
///
/// Note: the relay's lease connection and its checkpoint pool go through the proxy too, so
/// they are frozen as well; that is the realistic case (one network path to the server).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_connection_is_detected_within_read_timeout_and_nothing_is_lost() -> Result<()> {
    let (db, uid, proxy, spec, topics, relay, mut writer) = through_proxy("halfopen").await?;

    // A: before the freeze.
    writer.write(30).await?;
    let wanted = outbox_event_keys(db.pool()).await?;
    let got = read_until_all(&spec.bootstrap_servers, &topics, &wanted, RELAY_WAIT).await?;
    relay.ensure_running()?;
    ensure!(
        got.len() >= wanted.len(),
        "before the freeze only {} of {} rows arrived",
        got.len(),
        wanted.len()
    );
    let connections_before = proxy.active();

    // B: written while the relay's connections are half-open.
    proxy.freeze();
    let frozen_at = Instant::now();
    // With every connection frozen, whichever the relay waits on first gives up after
    // read_timeout: the binlog stream, the lease connection or a checkpoint write (CI of
    // 2026-12-07 on MySQL: a checkpoint written just after the freeze timed out first).
    let detections = |relay: &RelayProcess| {
        FROZEN_CONNECTION_DETECTED
            .iter()
            .map(|m| log_lines(relay, m).len())
            .sum::<usize>()
    };
    let log_before = detections(&relay);
    writer.write(30).await?;
    let detected = wait_until(
        "the relay to report the dead connection",
        Duration::from_millis(READ_TIMEOUT_MS * 2),
        Duration::from_millis(50),
        async || {
            relay.ensure_running()?;
            Ok((detections(&relay) > log_before).then(|| frozen_at.elapsed()))
        },
    )
    .await
    .ok();
    // Stay frozen for twice the read timeout in any case: reconnects meet a dead network too.
    let frozen_for = Duration::from_millis(READ_TIMEOUT_MS * 2);
    if let Some(rest) = frozen_for.checked_sub(frozen_at.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    let during_freeze: Vec<String> = relay
        .stderr_text()
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .map(str::to_owned)
        .collect();
    proxy.thaw();
    let thawed_at = Instant::now();

    // C: after the thaw.
    writer.write(30).await?;
    let committed = outbox_event_keys(db.pool()).await?;
    ensure!(
        committed.len() == 90,
        "the writer committed {}",
        committed.len()
    );
    let got = read_until_all(&spec.bootstrap_servers, &topics, &committed, RELAY_WAIT).await?;
    let delivered_after_thaw = thawed_at.elapsed();
    let seen: HashSet<&str> = got.iter().filter_map(|r| r.header("event_key")).collect();
    relay.ensure_running()?;
    let status = relay.stop(STOP).await?;
    ensure!(
        status.success(),
        "graceful stop: {}\n{}",
        describe_exit(&status),
        relay.stderr_tail()
    );
    let records = read_all_records(&spec.bootstrap_servers, &topics, RELAY_WAIT).await?;
    let v = verify(&uid, &records, &committed, |t| spec.topic_for(t));
    eprintln!(
        "half-open: {connections_before} relay connections frozen; detection after {:?}; all \
         rows delivered {:.1} s after the thaw ({} of {} before the final read); {} duplicates; \
         relay warnings while frozen:\n  {}",
        detected,
        delivered_after_thaw.as_secs_f64(),
        seen.len(),
        committed.len(),
        v.duplicates,
        during_freeze.join("\n  ")
    );
    ensure!(v.passed(), "after the freeze: {}", describe(&v));
    let Some(after) = detected else {
        bail!(
            "the relay did not notice the half-open connections: none of {:?} within {:?} of the \
             freeze (read_timeout_ms = {READ_TIMEOUT_MS}, heartbeat_interval_ms = \
             {HEARTBEAT_MS}). It recovered only because the network came back (all rows arrived \
             {:.1} s after the thaw).\nrelay warnings/errors while frozen:\n  {}\n--- relay \
             stderr ---\n{}",
            FROZEN_CONNECTION_DETECTED,
            Duration::from_millis(READ_TIMEOUT_MS * 2),
            delivered_after_thaw.as_secs_f64(),
            during_freeze.join("\n  "),
            relay.stderr_tail()
        );
    };
    ensure!(
        after <= Duration::from_millis(READ_TIMEOUT_MS + 2_000),
        "the half-open connection was detected only after {after:?} (read_timeout_ms = \
         {READ_TIMEOUT_MS})"
    );
    db.drop_database().await
}

/// Only the binlog dump connection goes half-open (the proxy freezes the connection that
/// carried the most bytes to the relay; the lease and checkpoint connections keep working): the
/// relay must notice within the read timeout, open a new dump connection and deliver the rows
/// written meanwhile, without the frozen connection ever coming back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_binlog_connection_alone_is_replaced_within_read_timeout() -> Result<()> {
    let (db, uid, proxy, spec, topics, relay, mut writer) = through_proxy("halfopen1").await?;
    writer.write(150).await?;
    let wanted = outbox_event_keys(db.pool()).await?;
    read_until_all(&spec.bootstrap_servers, &topics, &wanted, RELAY_WAIT).await?;
    relay.ensure_running()?;

    // The binlog stream carried every row event: by far the most bytes towards the relay.
    let conns = proxy.connections();
    let binlog = conns
        .iter()
        .max_by_key(|c| c.bytes_down)
        .context("no connection through the proxy")?
        .clone();
    ensure!(
        proxy.freeze_connection(binlog.id),
        "connection {} closed",
        binlog.id
    );
    let frozen_at = Instant::now();
    let log_before = log_lines(&relay, "no binlog event or heartbeat").len();
    writer.write(30).await?;
    let detected = wait_until(
        "the relay to log \"no binlog event or heartbeat\"",
        Duration::from_millis(READ_TIMEOUT_MS * 3),
        Duration::from_millis(50),
        async || {
            relay.ensure_running()?;
            Ok(
                (log_lines(&relay, "no binlog event or heartbeat").len() > log_before)
                    .then(|| frozen_at.elapsed()),
            )
        },
    )
    .await;
    let committed = outbox_event_keys(db.pool()).await?;
    // Still frozen: the rows must come over a new connection.
    let got = read_until_all(
        &spec.bootstrap_servers,
        &topics,
        &committed,
        Duration::from_millis(READ_TIMEOUT_MS * 5),
    )
    .await?;
    let seen: HashSet<&str> = got.iter().filter_map(|r| r.header("event_key")).collect();
    let delivered = committed
        .iter()
        .filter(|k| seen.contains(k.as_str()))
        .count();
    let delivered_after = frozen_at.elapsed();
    eprintln!(
        "binlog connection {} ({} bytes down of {:?}) frozen; detection: {:?}; {delivered} of {} \
         rows delivered {:.1} s after the freeze; connections now {:?}",
        binlog.id,
        binlog.bytes_down,
        conns.iter().map(|c| c.bytes_down).collect::<Vec<_>>(),
        detected.as_ref().map_err(|e| e.to_string()),
        committed.len(),
        delivered_after.as_secs_f64(),
        proxy
            .connections()
            .iter()
            .map(|c| (c.id, c.bytes_down, c.frozen))
            .collect::<Vec<_>>()
    );
    proxy.thaw_connection(binlog.id);
    let after = detected.map_err(|e| {
        anyhow::anyhow!(
            "{e:#}: a half-open binlog connection was not detected (read_timeout_ms = \
             {READ_TIMEOUT_MS})\n--- relay stderr ---\n{}",
            relay.stderr_tail()
        )
    })?;
    ensure!(
        after <= Duration::from_millis(READ_TIMEOUT_MS + 2_000),
        "detected only after {after:?} (read_timeout_ms = {READ_TIMEOUT_MS})"
    );
    ensure!(
        delivered == committed.len(),
        "only {delivered} of {} rows arrived while the old binlog connection stayed frozen\n{}",
        committed.len(),
        relay.stderr_tail()
    );
    let status = relay.stop(STOP).await?;
    ensure!(
        status.success(),
        "graceful stop: {}",
        describe_exit(&status)
    );
    let records = read_all_records(&spec.bootstrap_servers, &topics, RELAY_WAIT).await?;
    let v = verify(&uid, &records, &committed, |t| spec.topic_for(t));
    ensure!(v.passed(), "{}", describe(&v));
    db.drop_database().await
}

// ---------------------------------------------------------------------------------------------
// GTID failover
// ---------------------------------------------------------------------------------------------

fn replica_url(db: Option<&str>) -> String {
    let base = format!("mysql://root@127.0.0.1:{}", replica_port());
    match db {
        Some(db) => format!("{base}/{db}"),
        None => base,
    }
}

fn primary_url(db: Option<&str>) -> String {
    let base = format!("mysql://root@127.0.0.1:{}", mysql_port());
    match db {
        Some(db) => format!("{base}/{db}"),
        None => base,
    }
}

/// Tests of this binary that currently use the replica; the last one stops it.
static REPLICA_USERS: Mutex<usize> = Mutex::new(0);

/// The replica of the primary (`tests/services/replica.sh <server>`), started by the first test
/// that needs it and stopped when the last guard is dropped.
struct ReplicaGuard;

impl ReplicaGuard {
    fn up() -> Result<Self> {
        tokio::task::block_in_place(|| {
            let mut users = REPLICA_USERS.lock().unwrap_or_else(|e| e.into_inner());
            if *users == 0 {
                // A second try from a stopped replica: a stuck or failed start (the script is
                // killed after its limit) is printed, not hidden, and costs one test's time.
                if let Err(first) = replica_script("up") {
                    eprintln!(
                        "starting the replica failed; stopping it and trying once more: {first:#}"
                    );
                    let _ = replica_script("down");
                    replica_script("up").with_context(|| {
                        format!("starting the replica, second try (the first: {first:#})")
                    })?;
                }
            }
            *users += 1;
            Ok(Self)
        })
    }
}

impl Drop for ReplicaGuard {
    fn drop(&mut self) {
        tokio::task::block_in_place(|| {
            let mut users = REPLICA_USERS.lock().unwrap_or_else(|e| e.into_inner());
            *users -= 1;
            if *users == 0 {
                if let Err(e) = replica_script("down") {
                    eprintln!("stopping the replica: {e:#}");
                }
            }
        });
    }
}

/// Creates `db` with the checkpoint table (`migrations/0002_checkpoint.sql`) on the server at
/// `server_url`.
async fn create_state_db(server_url: &str, db: &str) -> Result<()> {
    let mut conn = Conn::from_url(server_url).await?;
    conn.query_drop(format!(
        "CREATE DATABASE `{db}` DEFAULT CHARACTER SET utf8mb4"
    ))
    .await?;
    conn.query_drop(format!("USE `{db}`")).await?;
    let sql = std::fs::read_to_string(
        outbox_relay_testkit::db::migrations_dir().join("0002_checkpoint.sql"),
    )?;
    conn.query_drop(sql).await?;
    conn.disconnect().await?;
    Ok(())
}

async fn global(url: &str, expr: &str) -> Result<String> {
    let mut conn = Conn::from_url(url).await?;
    let v: Option<String> = conn
        .query_first(format!("SELECT CAST({expr} AS CHAR)"))
        .await?;
    conn.disconnect().await?;
    v.with_context(|| format!("{expr} is NULL"))
}

/// Binlog file sequence number (`mariadb-bin.000042`, `mysql-bin.000042` → 42) of
/// `SHOW MASTER STATUS`.
async fn binlog_index(url: &str) -> Result<u64> {
    let mut conn = Conn::from_url(url).await?;
    let pos = outbox_relay_testkit::current_binlog_position(&mut conn).await?;
    conn.disconnect().await?;
    pos.file
        .rsplit_once('.')
        .and_then(|(_, n)| n.parse().ok())
        .with_context(|| format!("binlog file name {}", pos.file))
}

#[derive(Debug, Clone, Copy)]
struct FailoverCase {
    /// Stop the relay on the replica with kill -9 instead of SIGTERM.
    kill9: bool,
    /// Rotate the replica's binlog until its file number is above the primary's (same base
    /// name, `mariadb-bin` or `mysql-bin`), as after a replica that rotated more often.
    replica_binlog_ahead: bool,
    /// After the failover: stop the relay on the primary gracefully, start it again, write more
    /// rows: nothing may be sent twice (docs/src/concepts/guarantees.md: a graceful stop leaves no duplicates).
    graceful_restart_after: bool,
    /// `kafka.delivery = "exactly_once"`: no checkpoint is copied (the progress topic holds the
    /// point, GTID set included), and a read_committed reader must see no duplicate.
    exactly_once: bool,
}

/// Replica → primary failover under a continuous workload; see the module docs for the setup.
async fn gtid_failover(name: &str, case: FailoverCase) -> Result<()> {
    // Armed before the replica: starting it waits on a script and on the other tests' use of it,
    // before this test's database (which arms its own) exists.
    let _watchdog = Watchdog::arm();
    let _replica = ReplicaGuard::up()?;
    let uid = unique_suffix();
    // The database is created on the primary after the replica started: it replicates.
    let db = TestDb::create("failover").await?;
    let replica_pool = Pool::new(replica_url(Some(db.name())).as_str());
    wait_until(
        "the test database to reach the replica",
        Duration::from_secs(60),
        Duration::from_millis(100),
        async || {
            let mut conn = match replica_pool.get_conn().await {
                Ok(c) => c,
                Err(_) => return Ok(None),
            };
            let n: Option<u64> = conn
                .query_first(
                    "SELECT COUNT(*) FROM information_schema.TABLES \
                     WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox'",
                )
                .await?;
            Ok((n == Some(1)).then_some(()))
        },
    )
    .await?;
    let state_db = format!("rstate_{uid}");
    create_state_db(&replica_url(None), &state_db).await?;
    create_state_db(&primary_url(None), &state_db).await?;
    let replica_state = Pool::new(replica_url(Some(&state_db)).as_str());
    let primary_state = Pool::new(primary_url(Some(&state_db)).as_str());

    if case.replica_binlog_ahead {
        let primary_idx = binlog_index(&primary_url(None)).await?;
        let mut conn = Conn::from_url(replica_url(None)).await?;
        while binlog_index(&replica_url(None)).await? <= primary_idx {
            conn.query_drop("FLUSH BINARY LOGS").await?;
        }
        conn.disconnect().await?;
    }

    let mut spec = RelayConfigSpec::new(
        &db,
        &format!("{name}-{uid}"),
        next_server_id(),
        &format!("t_{uid}"),
    );
    spec.mysql_url = replica_url(Some(&state_db));
    if case.exactly_once {
        spec.kafka_extra =
            format!("delivery = \"exactly_once\"\nprogress_topic = \"t_{uid}.progress\"\n");
    }
    let topics = topics(&spec);
    let relay_a = spawn_relay(&spec, None)?;
    let cp0 = wait_until(
        "the relay on the replica to store its start position",
        Duration::from_secs(60),
        Duration::from_millis(100),
        async || {
            relay_a.ensure_running()?;
            read_checkpoint(
                &replica_state,
                DEFAULT_CHECKPOINT_TABLE,
                &spec.connector_name,
            )
            .await
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e:#}\n--- relay stderr ---\n{}", relay_a.stderr_tail()))?;

    let workload = Workload::start(&WorkloadConfig {
        run_id: uid.clone(),
        url: db.url(),
        writers: 2,
        keys_per_writer: 4,
        pause_ms: (5, 40),
        rollback_chance: 0.05,
        seed: u64::from(std::process::id()),
    })?;
    let some = collect_records(&spec.bootstrap_servers, &topics, 300, RELAY_WAIT).await?;
    relay_a.ensure_running()?;
    ensure!(
        some.len() >= 300,
        "the relay on the replica delivered only {} records\n{}",
        some.len(),
        relay_a.stderr_tail()
    );

    // The relay has stored a checkpoint of its own (so a kill -9 resumes from a relayed point).
    wait_until(
        "the relay on the replica to store a checkpoint past its start",
        Duration::from_secs(60),
        Duration::from_millis(100),
        async || {
            relay_a.ensure_running()?;
            let cp = read_checkpoint(
                &replica_state,
                DEFAULT_CHECKPOINT_TABLE,
                &spec.connector_name,
            )
            .await?;
            Ok(cp.filter(|cp| cp.position() != cp0.position()).map(|_| ()))
        },
    )
    .await?;

    // Stop the relay on the replica; the workload goes on.
    if case.kill9 {
        relay_a.kill9()?;
    } else {
        let status = relay_a.stop(STOP).await?;
        ensure!(
            status.success(),
            "stop on the replica: {}",
            describe_exit(&status)
        );
    }
    let gtid_var = gtid_state_variable();
    let cp_a: Checkpoint = read_checkpoint(
        &replica_state,
        DEFAULT_CHECKPOINT_TABLE,
        &spec.connector_name,
    )
    .await?
    .context("no checkpoint on the replica")?;
    eprintln!(
        "{name}: start {} ; checkpoint on the replica after the stop: {}:{} rows_acked {} gtid {:?} \
         (replica {gtid_var} {:?}, primary {:?})",
        cp0.position(),
        cp_a.binlog_file,
        cp_a.binlog_pos,
        cp_a.rows_acked,
        cp_a.gtid_set,
        global(&replica_url(None), gtid_var).await.ok(),
        global(&primary_url(None), gtid_var).await.ok(),
    );
    ensure!(
        cp_a.gtid_set.is_some(),
        "the checkpoint on the replica has no GTID position: {cp_a:?}"
    );

    // The operator's step: copy the checkpoint row to the primary's state table, with the
    // outbox layouts it stores (without binlog_row_metadata=FULL, MySQL's default MINIMAL,
    // the relay needs them to name the columns of the rows after the checkpoint). Exactly-once
    // needs no copy: the progress topic's point carries the GTID set and the layouts.
    if !case.exactly_once {
        let table_layouts: Option<String> = replica_state
            .get_conn()
            .await?
            .exec_first(
                "SELECT table_layouts FROM outbox_relay_checkpoint WHERE connector_name = ?",
                (&cp_a.connector_name,),
            )
            .await?
            .flatten();
        let mut conn = primary_state.get_conn().await?;
        conn.exec_drop(
            "INSERT INTO outbox_relay_checkpoint (connector_name, binlog_file, binlog_pos, \
             rows_acked, gtid_set, source_server_id, source_server_uuid, table_layouts) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                &cp_a.connector_name,
                &cp_a.binlog_file,
                cp_a.binlog_pos,
                cp_a.rows_acked,
                &cp_a.gtid_set,
                cp_a.source_server_id,
                &cp_a.source_server_uuid,
                &table_layouts,
            ),
        )
        .await?;
    }
    let mut spec_b = spec.clone();
    spec_b.mysql_url = primary_url(Some(&state_db));
    let relay_b = spawn_relay(&spec_b, Some("gtid"))?;
    wait_until(
        "the relay on the primary to stream",
        Duration::from_secs(60),
        Duration::from_millis(100),
        async || {
            relay_b.ensure_running()?;
            Ok((!log_lines(&relay_b, "streaming binlog").is_empty()).then_some(()))
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e:#}\n--- relay stderr ---\n{}", relay_b.stderr_tail()))?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let stats = workload.stop().await?;
    let committed = outbox_event_keys(db.pool()).await?;
    let got = read_until_all(&spec.bootstrap_servers, &topics, &committed, RELAY_WAIT).await?;
    let seen: HashSet<&str> = got.iter().filter_map(|r| r.header("event_key")).collect();
    let missing_now = committed
        .iter()
        .filter(|k| !seen.contains(k.as_str()))
        .count();
    relay_b
        .ensure_running()
        .map_err(|e| anyhow::anyhow!("after the failover, {missing_now} rows missing: {e:#}"))?;
    let status = relay_b.stop(STOP).await?;
    ensure!(
        status.success(),
        "stop on the primary: {}\n{}",
        describe_exit(&status),
        relay_b.stderr_tail()
    );
    let records = if case.exactly_once {
        read_committed_records(&spec.bootstrap_servers, &topics, RELAY_WAIT).await?
    } else {
        read_all_records(&spec.bootstrap_servers, &topics, RELAY_WAIT).await?
    };
    let v = verify(&uid, &records, &committed, |t| spec.topic_for(t));
    ensure!(
        !case.exactly_once || v.duplicates == 0,
        "exactly-once failover: {} duplicates for a read_committed reader ({})\n--- relay on \
         the primary ---\n{}",
        v.duplicates,
        describe(&v),
        relay_b.stderr_tail()
    );
    let cp_b = read_checkpoint(
        &primary_state,
        DEFAULT_CHECKPOINT_TABLE,
        &spec.connector_name,
    )
    .await?
    .context("no checkpoint on the primary")?;
    let primary_id: u32 = global(&primary_url(None), "@@GLOBAL.server_id")
        .await?
        .parse()?;
    eprintln!(
        "{name}: {} transactions, {} rows committed ({} rolled back); {}; checkpoint on the \
         primary after the stop: {}:{} rows_acked {} gtid {:?} source_server_id {}",
        stats.transactions,
        committed.len(),
        stats.rows_rolled_back,
        describe(&v),
        cp_b.binlog_file,
        cp_b.binlog_pos,
        cp_b.rows_acked,
        cp_b.gtid_set,
        cp_b.source_server_id
    );
    ensure!(
        v.passed(),
        "failover lost or mangled rows: {}\n--- relay on the primary ---\n{}",
        describe(&v),
        relay_b.stderr_tail()
    );

    if case.graceful_restart_after {
        let stale = cp_b.source_server_id != primary_id || cp_b == cp_a;
        let before = records.len();
        let relay_c = spawn_relay(&spec_b, Some("gtid"))?;
        wait_until(
            "the restarted relay to stream",
            Duration::from_secs(60),
            Duration::from_millis(100),
            async || {
                relay_c.ensure_running()?;
                Ok((!log_lines(&relay_c, "streaming binlog").is_empty()).then_some(()))
            },
        )
        .await?;
        let mut writer = SeqWriter::new(&format!("{uid}x"), &db.url(), 2)?;
        writer.write(10).await?;
        let all = outbox_event_keys(db.pool()).await?;
        read_until_all(&spec.bootstrap_servers, &topics, &all, RELAY_WAIT).await?;
        let status = relay_c.stop(STOP).await?;
        ensure!(status.success(), "second stop: {}", describe_exit(&status));
        let after = read_all_records(&spec.bootstrap_servers, &topics, RELAY_WAIT).await?;
        let resent = after.len().saturating_sub(before + 10);
        eprintln!(
            "{name}: graceful restart on the primary: {resent} records sent again; resumed with: {:?}",
            log_lines(&relay_c, "resuming from stored checkpoint")
        );
        ensure!(
            !stale && resent == 0,
            "after relaying {} rows from the primary and a graceful stop, the checkpoint on the \
             primary is {} the one copied from the replica ({}:{} gtid {:?}, source_server_id {}; \
             the primary is server_id {primary_id}, its binlog {}), and a graceful restart sent \
             {resent} records again (before {before} records, 10 new rows, now {}).\n--- relay on \
             the primary (first run) ---\n{}\n--- after the restart ---\n{}",
            committed.len(),
            if stale { "still" } else { "no longer" },
            cp_b.binlog_file,
            cp_b.binlog_pos,
            cp_b.gtid_set,
            cp_b.source_server_id,
            global(&primary_url(None), gtid_state_variable())
                .await
                .unwrap_or_default(),
            after.len(),
            relay_b.stderr_tail(),
            relay_c.stderr_tail()
        );
    }
    drop(replica_pool);
    replica_state.disconnect().await?;
    primary_state.disconnect().await?;
    for url in [replica_url(None), primary_url(None)] {
        let mut conn = Conn::from_url(url).await?;
        conn.query_drop(format!("DROP DATABASE IF EXISTS `{state_db}`"))
            .await?;
        conn.disconnect().await?;
    }
    db.drop_database().await
}

/// The relay follows the replica while a writer commits on the primary; it is stopped
/// (SIGTERM) and started against the primary with `resume = "gtid"` from the copied
/// checkpoint; rows written before, during and after the switch all arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gtid_failover_from_replica_to_primary_loses_nothing() -> Result<()> {
    gtid_failover(
        "failover",
        FailoverCase {
            kill9: false,
            replica_binlog_ahead: false,
            graceful_restart_after: false,
            exactly_once: false,
        },
    )
    .await
}

/// The same with kill -9 of the relay on the replica (the checkpoint may be inside a
/// transaction: rows_acked must map to the same transaction on the primary).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gtid_failover_after_kill_9_loses_nothing() -> Result<()> {
    gtid_failover(
        "failover-kill",
        FailoverCase {
            kill9: true,
            replica_binlog_ahead: false,
            graceful_restart_after: false,
            exactly_once: false,
        },
    )
    .await
}

/// Failover when the replica's binlog file numbers are above the primary's (same base name,
/// `mariadb-bin.*` or `mysql-bin.*`): after relaying from the primary and a graceful stop, the
/// checkpoint must be the primary's, and a restart must send nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gtid_failover_checkpoint_moves_to_the_primary_and_restart_sends_nothing_twice(
) -> Result<()> {
    gtid_failover(
        "failover-ahead",
        FailoverCase {
            kill9: false,
            replica_binlog_ahead: true,
            graceful_restart_after: true,
            exactly_once: false,
        },
    )
    .await
}

/// A checkpoint written inside a transaction on another server (`rows_acked` > 0, another
/// `source_server_id`), resumed by GTID: its `rows_acked` is not trusted, every row is sent.
/// That transaction is "the one after the GTID set" on the old server only: the new one may log
/// transactions the old one never had before it (filtered out by its replication) or lack it
/// (an asynchronous failover), and skipping rows there could lose some. A local `make test` run
/// stopped with "the checkpoint says 1 outbox rows of the transaction after … were
/// acknowledged, but it has only 0" in `gtid_failover_after_kill_9_loses_nothing` this way.
/// Built here on the primary alone, deterministically: a checkpoint "from server 4242" at the
/// primary's current GTID position with `rows_acked = 2`, then a transaction without outbox rows,
/// then a 5-row transaction, then one more row: all 6 rows arrive, once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gtid_resume_on_another_server_sends_the_rows_the_old_server_counted_as_acked() -> Result<()>
{
    use outbox_relay_testkit::{insert_outbox_rows, InsertStyle, RowGen};
    let uid = unique_suffix();
    let db = TestDb::create("failover").await?;
    let state_db = format!("rstate_{uid}");
    create_state_db(&primary_url(None), &state_db).await?;
    let mut spec = RelayConfigSpec::new(
        &db,
        &format!("gtidskip-{uid}"),
        next_server_id(),
        &format!("t_{uid}"),
    );
    spec.mysql_url = primary_url(Some(&state_db));
    let mut conn = db.conn().await?;
    conn.query_drop("CREATE TABLE notes (id INT PRIMARY KEY)")
        .await?;

    // The primary's GTID state now (MySQL's `@@gtid_executed` printed canonically, without the
    // newlines it puts after commas).
    let gtid = canonical_gtid_set(&global(&primary_url(None), gtid_state_variable()).await?)?;
    let mut gen = RowGen::new(&uid, "gtidskip", 3);
    let partly = gen.rows(5);
    let after = gen.rows(1);
    conn.query_drop("INSERT INTO notes VALUES (1)").await?;
    insert_outbox_rows(&mut conn, "outbox", &partly, InsertStyle::MultiRow).await?;
    insert_outbox_rows(&mut conn, "outbox", &after, InsertStyle::SingleRow).await?;
    {
        // The outbox's layout, as a relay's checkpoint stores it (`{"db.outbox": [columns]}`):
        // without binlog_row_metadata=FULL (MySQL's default MINIMAL) the relay needs it to name
        // the columns of the rows after the checkpoint. The table is not altered in this test.
        let columns: Vec<String> = conn
            .exec(
                "SELECT COLUMN_NAME FROM information_schema.COLUMNS \
                 WHERE TABLE_SCHEMA = ? AND TABLE_NAME = 'outbox' ORDER BY ORDINAL_POSITION",
                (db.name(),),
            )
            .await?;
        let layouts = serde_json::json!({ format!("{}.outbox", db.name()): columns }).to_string();
        let state = Pool::new(primary_url(Some(&state_db)).as_str());
        let mut s = state.get_conn().await?;
        s.exec_drop(
            "INSERT INTO outbox_relay_checkpoint (connector_name, binlog_file, binlog_pos, \
             rows_acked, gtid_set, source_server_id, table_layouts) \
             VALUES (?, 'mariadb-bin.000001', 4, 2, ?, 4242, ?)",
            (&spec.connector_name, &gtid, &layouts),
        )
        .await?;
        drop(s);
        state.disconnect().await?;
    }

    let relay = spawn_relay(&spec, Some("gtid"))?;
    let all: Vec<&outbox_relay_testkit::OutboxRow> = partly.iter().chain(&after).collect();
    let wanted: HashSet<String> = all.iter().map(|r| r.event_key.clone()).collect();
    let topics = vec![spec.topic_for("Order")];
    read_until_all(&spec.bootstrap_servers, &topics, &wanted, RELAY_WAIT).await?;
    relay
        .ensure_running()
        .map_err(|e| anyhow::anyhow!("{e:#}\n{}", relay.stderr_tail()))?;
    let status = relay.stop(STOP).await?;
    ensure!(
        status.success(),
        "stop: {}\n{}",
        describe_exit(&status),
        relay.stderr_tail()
    );
    ensure!(
        !log_lines(&relay, "written inside a transaction on another server").is_empty(),
        "no warning that rows_acked is not trusted on this server\n{}",
        relay.stderr_tail()
    );
    let records = read_all_records(&spec.bootstrap_servers, &topics, RELAY_WAIT).await?;
    // Partitions are read one after the other: compare sorted (each key once, none missing).
    let mut keys: Vec<&str> = records
        .iter()
        .filter_map(|r| r.header("event_key"))
        .collect();
    keys.sort_unstable();
    let mut expected: Vec<&str> = all.iter().map(|r| r.event_key.as_str()).collect();
    expected.sort_unstable();
    ensure!(
        keys == expected,
        "records {keys:?}, expected every row once: {expected:?}\n{}",
        relay.stderr_tail()
    );
    drop(conn);
    let mut conn = Conn::from_url(primary_url(None)).await?;
    conn.query_drop(format!("DROP DATABASE IF EXISTS `{state_db}`"))
        .await?;
    conn.disconnect().await?;
    db.drop_database().await
}

/// Exactly-once: kill -9 of the relay on the replica, then the same connector on the primary
/// with `resume = "gtid"` and no checkpoint copied: it resumes from the progress topic's GTID set;
/// a read_committed reader sees every row once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gtid_failover_exactly_once_after_kill_9_has_no_duplicates() -> Result<()> {
    gtid_failover(
        "failover-eos",
        FailoverCase {
            kill9: true,
            replica_binlog_ahead: false,
            graceful_restart_after: false,
            exactly_once: true,
        },
    )
    .await
}
