//! One test's isolated world (database, topic prefix, connector name, server id) with the
//! relay's binary, plus small generators and checks shared by the resume, lease and
//! dead-letter tests.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

use anyhow::{anyhow, ensure, Context, Result};
use mysql_async::prelude::*;
use mysql_async::Conn;

use crate::binlog::{compare_positions, is_transaction_boundary, BinlogPosition};
use crate::checkpoint::{read_checkpoint, Checkpoint, DEFAULT_CHECKPOINT_TABLE};
use crate::db::TestDb;
use crate::kafka::Record;
use crate::outbox::{recent_created_at_base, OutboxRow};
use crate::relay::{describe_exit, RelayConfigSpec, RelayProcess};
use crate::state::{read_state_row, StateRow};
use crate::unique::{next_server_id, unique_suffix};
use crate::wait::wait_until;

/// Declares `struct $name(World)` for a test file's own fixture methods: it dereferences to the
/// [`World`] (so `f.uid`, `f.db`, `f.spec`, `f.start(…)` work) and `$name::new(name)` creates
/// the world of the binary `$binary` with its database named `<$db_prefix>_<name>…`
/// ([`World::with_db_prefix`]); `f.drop_database()` drops that database (`f.db` cannot be moved
/// out through the dereference).
#[macro_export]
macro_rules! world_fixture {
    ($(#[$meta:meta])* $name:ident, $binary:expr, $db_prefix:literal) => {
        $(#[$meta])*
        struct $name($crate::World);

        impl ::std::ops::Deref for $name {
            type Target = $crate::World;
            fn deref(&self) -> &$crate::World {
                &self.0
            }
        }

        impl ::std::ops::DerefMut for $name {
            fn deref_mut(&mut self) -> &mut $crate::World {
                &mut self.0
            }
        }

        impl $name {
            async fn new(name: &str) -> ::anyhow::Result<Self> {
                Ok(Self($crate::World::with_db_prefix($binary, $db_prefix, name).await?))
            }

            /// Drops the world's database and closes its pool.
            async fn drop_database(self) -> ::anyhow::Result<()> {
                self.0.db.drop_database().await
            }
        }
    };
}

/// A test's own database, topic prefix `t_<uid>`, connector name `<name>-<uid>` and replica
/// server id, and the relay binary to run against them.
pub struct World {
    /// The unique suffix in every name of this world.
    pub uid: String,
    /// The test database (outbox and checkpoint table).
    pub db: TestDb,
    /// The relay configuration; tests tune it before starting relays.
    pub spec: RelayConfigSpec,
    /// Path of the `outbox-relay` binary.
    pub binary: PathBuf,
}

impl World {
    /// A fresh world named after the test (`name`: a few characters of `[a-z0-9_]`).
    ///
    /// # Errors
    /// The database cannot be created.
    pub async fn new(binary: &str, name: &str) -> Result<Self> {
        Self::with_db_prefix(binary, "rs", name).await
    }

    /// Like [`World::new`], with the database named after `<db_prefix>_<name>` (the suites that
    /// name their databases `e2e_…`).
    ///
    /// # Errors
    /// The database cannot be created.
    pub async fn with_db_prefix(binary: &str, db_prefix: &str, name: &str) -> Result<Self> {
        let db = TestDb::create(&format!("{db_prefix}_{name}")).await?;
        let uid = unique_suffix();
        let spec = RelayConfigSpec::new(
            &db,
            &format!("{name}-{uid}"),
            next_server_id(),
            &format!("t_{uid}"),
        );
        Ok(Self {
            uid,
            db,
            spec,
            binary: PathBuf::from(binary),
        })
    }

    /// The connector name.
    pub fn connector(&self) -> &str {
        &self.spec.connector_name
    }

    /// Every topic of this world starts with this.
    pub fn topic_prefix(&self) -> String {
        format!("t_{}.", self.uid)
    }

    /// The topic of `aggregate_type`.
    pub fn topic(&self, aggregate_type: &str) -> String {
        self.spec.topic_for(aggregate_type)
    }

    /// Starts a relay with [`World::spec`].
    ///
    /// # Errors
    /// The process cannot be started.
    pub fn spawn(&self) -> Result<RelayProcess> {
        self.spawn_with(&self.spec)
    }

    /// Starts a relay with another spec (e.g. a second instance with its own server id).
    ///
    /// # Errors
    /// The process cannot be started.
    pub fn spawn_with(&self, spec: &RelayConfigSpec) -> Result<RelayProcess> {
        RelayProcess::spawn(&self.binary, &spec.to_toml(), &[])
    }

    /// Starts a relay and waits (up to `timeout`) until its checkpoint row holds a position.
    ///
    /// # Errors
    /// The relay exits or the row does not appear in time.
    pub async fn start(&self, timeout: Duration) -> Result<(RelayProcess, Checkpoint)> {
        let relay = self.spawn()?;
        let cp = relay
            .wait_for_checkpoint_row(self.db.pool(), self.connector(), timeout)
            .await?;
        Ok((relay, cp))
    }

    /// The stored checkpoint (a row with a position).
    ///
    /// # Errors
    /// There is none, or the query fails.
    pub async fn checkpoint(&self) -> Result<Checkpoint> {
        read_checkpoint(self.db.pool(), DEFAULT_CHECKPOINT_TABLE, self.connector())
            .await?
            .context("the checkpoint row is gone")
    }

    /// The whole state row (lease columns included).
    ///
    /// # Errors
    /// There is none, or the query fails.
    pub async fn state(&self) -> Result<StateRow> {
        read_state_row(self.db.pool(), DEFAULT_CHECKPOINT_TABLE, self.connector())
            .await?
            .context("the state row is gone")
    }

    /// Waits until the stored checkpoint is at or after `pos` (e.g. the end of the last
    /// transaction the test wrote), failing at once if `relay` exits.
    ///
    /// # Errors
    /// Timeout or relay exit.
    pub async fn wait_checkpoint_covers(
        &self,
        relay: &RelayProcess,
        pos: &BinlogPosition,
        timeout: Duration,
    ) -> Result<Checkpoint> {
        let mut conn = self.db.conn().await?;
        wait_until(
            &format!("the checkpoint to reach {pos}"),
            timeout,
            Duration::from_millis(100),
            async || {
                relay.ensure_running()?;
                let cp = self.checkpoint().await?;
                let order = compare_positions(&mut conn, &cp.position(), pos).await?;
                Ok(order.is_ge().then_some(cp))
            },
        )
        .await
        .map_err(|e| anyhow!("{e:#}\n--- relay stderr ---\n{}", relay.stderr_tail()))
    }

    /// Reads `topics` until a record of every event key in `wanted` is there, for at most
    /// `timeout`; returns the records read.
    ///
    /// # Errors
    /// Keys still missing at the end (up to ten named, with `relay`'s stderr tail), or Kafka
    /// cannot be read.
    pub async fn wait_for_keys(
        &self,
        topics: &[String],
        wanted: &HashSet<String>,
        relay: Option<&RelayProcess>,
        timeout: Duration,
    ) -> Result<Vec<Record>> {
        let seen = crate::kafka::collect_until(
            &self.spec.bootstrap_servers,
            topics,
            timeout,
            all_seen(wanted.clone()),
        )
        .await?;
        let have: HashSet<&str> = seen.iter().filter_map(|r| r.header("event_key")).collect();
        let mut missing: Vec<&String> = wanted
            .iter()
            .filter(|k| !have.contains(k.as_str()))
            .collect();
        missing.sort();
        ensure!(
            missing.is_empty(),
            "{} of {} rows did not reach Kafka within {timeout:?}, e.g. {:?}\n--- relay stderr \
             ---\n{}",
            missing.len(),
            wanted.len(),
            &missing[..missing.len().min(10)],
            relay.map(RelayProcess::stderr_tail).unwrap_or_default()
        );
        Ok(seen)
    }

    /// Checks that `cp` names a file of `SHOW BINARY LOGS` and is a transaction boundary.
    ///
    /// # Errors
    /// It is not.
    pub async fn ensure_boundary(&self, cp: &Checkpoint) -> Result<()> {
        let mut conn = self.db.conn().await?;
        ensure_boundary(&mut conn, cp, Some(self.db.created_at_binlog())).await
    }
}

/// Checks that `cp` names a file of `SHOW BINARY LOGS` and is the end of an Xid/COMMIT event.
///
/// # Errors
/// It is not, or a query fails.
pub async fn ensure_boundary(
    conn: &mut Conn,
    cp: &Checkpoint,
    scan_from: Option<&BinlogPosition>,
) -> Result<()> {
    let logs = crate::binlog::binary_logs(conn).await?;
    ensure!(
        logs.iter().any(|(name, _)| *name == cp.binlog_file),
        "checkpoint file {:?} is not a name from SHOW BINARY LOGS {logs:?}",
        cp.binlog_file
    );
    ensure!(
        is_transaction_boundary(conn, &cp.binlog_file, cp.binlog_pos, scan_from).await?,
        "checkpoint {} is not a transaction boundary (file start, or the end of an Xid, COMMIT or DDL event)",
        cp.position()
    );
    Ok(())
}

/// `Ok` when `status` is exit code `code`, else an error with the relay's stderr.
///
/// # Errors
/// Another exit status.
pub fn expect_exit_code(status: ExitStatus, code: i32, relay: &RelayProcess) -> Result<()> {
    ensure!(
        status.code() == Some(code),
        "the relay ended with {}, expected exit code {code}\n--- stderr ---\n{}",
        describe_exit(&status),
        relay.stderr_tail()
    );
    Ok(())
}

/// Simple outbox rows: aggregate type `Order`, ids spread over `keys` aggregates, event keys
/// `<uid>-<label>-<n>` and a JSON payload carrying the global and per-aggregate sequence
/// numbers.
pub struct RowGen {
    uid: String,
    label: String,
    keys: usize,
    next: usize,
    base_micros: i64,
}

impl RowGen {
    /// Rows labelled `label` over `keys` aggregate ids.
    pub fn new(uid: &str, label: &str, keys: usize) -> Self {
        Self {
            uid: uid.to_owned(),
            label: label.to_owned(),
            keys: keys.max(1),
            next: 0,
            base_micros: recent_created_at_base(),
        }
    }

    /// The next row.
    pub fn row(&mut self) -> OutboxRow {
        let n = self.next;
        self.next += 1;
        let agg = format!("o-{:02}", n % self.keys);
        OutboxRow {
            aggregate_type: "Order".into(),
            event_type: "OrderCreated".into(),
            event_key: format!("{}-{}-{n:06}", self.uid, self.label),
            payload: format!(
                r#"{{"agg":"{agg}","n":{n},"key_seq":{},"note":"crème ✓"}}"#,
                n / self.keys + 1
            ),
            aggregate_id: agg,
            created_at_micros: self.base_micros + i64::try_from(n).unwrap_or(0) * 1_000,
        }
    }

    /// The next `n` rows.
    pub fn rows(&mut self, n: usize) -> Vec<OutboxRow> {
        (0..n).map(|_| self.row()).collect()
    }
}

/// How often each `event_key` header occurs among `records`.
pub fn event_key_counts(records: &[Record]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for r in records {
        if let Some(ek) = r.header("event_key") {
            *counts.entry(ek.to_owned()).or_insert(0) += 1;
        }
    }
    counts
}

/// Checks that each of `expected` occurs exactly once among `records` and nothing else does.
///
/// # Errors
/// Lists missing, duplicated and unexpected event keys.
pub fn ensure_exactly_once(records: &[Record], expected: &HashSet<String>) -> Result<()> {
    let counts = event_key_counts(records);
    let missing: Vec<&String> = expected
        .iter()
        .filter(|k| !counts.contains_key(*k))
        .collect();
    let dup: Vec<(&String, &usize)> = counts.iter().filter(|(_, n)| **n > 1).collect();
    let extra: Vec<&String> = counts.keys().filter(|k| !expected.contains(*k)).collect();
    let no_key = records
        .iter()
        .filter(|r| r.header("event_key").is_none())
        .count();
    ensure!(
        missing.is_empty() && dup.is_empty() && extra.is_empty() && no_key == 0,
        "expected each of {} event keys exactly once in {} records: {} missing (e.g. {:?}), {} \
         duplicated (e.g. {:?}), {} unexpected (e.g. {:?}), {no_key} without event_key",
        expected.len(),
        records.len(),
        missing.len(),
        &missing[..missing.len().min(5)],
        dup.len(),
        &dup[..dup.len().min(5)],
        extra.len(),
        &extra[..extra.len().min(5)],
    );
    Ok(())
}

/// Checks that each of `expected` occurs at least once among `records`, and that nothing else
/// does. Returns the number of duplicates.
///
/// # Errors
/// Lists missing and unexpected event keys.
pub fn ensure_at_least_once(records: &[Record], expected: &HashSet<String>) -> Result<usize> {
    let counts = event_key_counts(records);
    let missing: Vec<&String> = expected
        .iter()
        .filter(|k| !counts.contains_key(*k))
        .collect();
    let extra: Vec<&String> = counts.keys().filter(|k| !expected.contains(*k)).collect();
    ensure!(
        missing.is_empty() && extra.is_empty(),
        "expected each of {} event keys at least once in {} records: {} missing (e.g. {:?}), {} \
         unexpected (e.g. {:?})",
        expected.len(),
        records.len(),
        missing.len(),
        &missing[..missing.len().min(5)],
        extra.len(),
        &extra[..extra.len().min(5)],
    );
    Ok(counts.values().map(|n| n - 1).sum())
}

/// Per key (topic, record key): the first occurrence of each event key, in offset order, must
/// follow `order` (commit order of each event key). Records of one key must share a partition.
///
/// # Errors
/// Lists the first violations.
pub fn ensure_per_key_order(records: &[Record], order: &HashMap<String, usize>) -> Result<()> {
    let mut by_key: BTreeMap<(String, Vec<u8>), Vec<&Record>> = BTreeMap::new();
    for r in records {
        by_key
            .entry((r.topic.clone(), r.key.clone().unwrap_or_default()))
            .or_default()
            .push(r);
    }
    let mut problems = Vec::new();
    for ((topic, key), mut recs) in by_key {
        let key = String::from_utf8_lossy(&key).into_owned();
        let partitions: HashSet<i32> = recs.iter().map(|r| r.partition).collect();
        if partitions.len() > 1 {
            problems.push(format!(
                "key {key:?} of {topic} is on partitions {partitions:?}"
            ));
            continue;
        }
        recs.sort_by_key(|r| r.offset);
        let mut seen = HashSet::new();
        let mut last: Option<(usize, &str, i64)> = None;
        for r in recs {
            let Some(ek) = r.header("event_key") else {
                continue;
            };
            if !seen.insert(ek) {
                continue;
            }
            let Some(&o) = order.get(ek) else { continue };
            if let Some((prev, prev_ek, prev_off)) = last {
                if o <= prev {
                    problems.push(format!(
                        "key {key:?} of {topic}: {ek} (commit #{o}) first appears at offset {} \
                         after {prev_ek} (commit #{prev}, offset {prev_off})",
                        r.offset
                    ));
                }
            }
            last = Some((o, ek, r.offset));
        }
    }
    ensure!(
        problems.is_empty(),
        "{} per-key order violations:\n  {}",
        problems.len(),
        problems[..problems.len().min(20)].join("\n  ")
    );
    Ok(())
}

/// The process list entry of connection `id`: (`State`, `Info`), if it exists.
///
/// # Errors
/// The query fails.
pub async fn connection_state(conn: &mut Conn, id: u64) -> Result<Option<(String, String)>> {
    let row: Option<(Option<String>, Option<String>)> = conn
        .exec_first(
            "SELECT STATE, INFO FROM information_schema.PROCESSLIST WHERE ID = ?",
            (id,),
        )
        .await?;
    Ok(row.map(|(s, i)| (s.unwrap_or_default(), i.unwrap_or_default())))
}

/// Server ids listed by `SHOW SLAVE HOSTS` (replicas registered with the server).
///
/// # Errors
/// The query fails.
pub async fn registered_replica_ids(conn: &mut Conn) -> Result<Vec<u32>> {
    let rows: Vec<mysql_async::Row> = conn.query("SHOW SLAVE HOSTS").await?;
    Ok(rows
        .into_iter()
        .filter_map(|r| r.get::<Option<u32>, _>(0).flatten())
        .collect())
}

/// A predicate for [`crate::collect_until`]: every event key of `wanted` has been read
/// (incremental over the growing record list).
pub fn all_seen(wanted: HashSet<String>) -> impl FnMut(&[Record]) -> bool + Send + 'static {
    let mut remaining = wanted;
    let mut done = 0;
    move |records: &[Record]| {
        for r in &records[done..] {
            if let Some(ek) = r.header("event_key") {
                remaining.remove(ek);
            }
        }
        done = records.len();
        remaining.is_empty()
    }
}

/// Commits `rows` as one transaction (one multi-row INSERT into `outbox`) and returns its
/// MariaDB GTID (see [`crate::find_transaction`]).
///
/// # Errors
/// The insert fails.
pub async fn commit_rows(conn: &mut Conn, rows: &[OutboxRow]) -> Result<String> {
    let mut tx = conn
        .start_transaction(mysql_async::TxOpts::default())
        .await?;
    crate::outbox::insert_outbox_rows(
        &mut tx,
        "outbox",
        rows,
        crate::outbox::InsertStyle::MultiRow,
    )
    .await?;
    tx.commit().await?;
    crate::binlog_scan::last_gtid(conn).await
}

/// A one-line, readable description of a record (text where the bytes are UTF-8).
pub fn describe_record(r: &Record) -> String {
    let text = |b: &Option<Vec<u8>>| match b {
        None => "null".to_owned(),
        Some(b) => match std::str::from_utf8(b) {
            Ok(s) if s.len() <= 200 => format!("{s:?}"),
            Ok(s) => {
                let mut cut = 200;
                while !s.is_char_boundary(cut) {
                    cut -= 1;
                }
                format!("{:?}… ({} bytes)", &s[..cut], s.len())
            }
            Err(_) => format!("{} bytes", b.len()),
        },
    };
    let headers: Vec<String> = r
        .headers
        .iter()
        .map(|(k, v)| format!("{k}={}", text(v)))
        .collect();
    format!(
        "{}/{}@{} key={} value={} headers[{}]",
        r.topic,
        r.partition,
        r.offset,
        text(&r.key),
        text(&r.value),
        headers.join(", ")
    )
}
