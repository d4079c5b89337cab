//! End-to-end tests of the `outbox-relay` binary against the real MariaDB and Kafka of the test
//! machine (`tests/services/mariadb.sh up`, `tests/services/kafka.sh up`; ports from
//! `MARIADB_PORT` / `KAFKA_PORT`).
//!
//! Each test has its own database, topic prefix, connector name and replica server id, so the
//! tests run in parallel. They wait only on observable state (the checkpoint row, records on
//! Kafka, process exit) with generous timeouts, and compare what reached Kafka with what the
//! test's own writer inserted.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use mysql_async::prelude::*;
use mysql_async::{Conn, TxOpts};
use outbox_relay_testkit::{
    binary_logs, collect_records, collect_until, compare_positions, create_topic,
    current_binlog_position, deleted_record_count, describe_exit, high_watermark_total,
    insert_outbox_rows, is_transaction_boundary, list_topics, read_all_records, read_checkpoint,
    recent_created_at_base, server_json_text, stored_payload, unique_suffix, wait_until,
    BinlogPosition, Checkpoint, InsertStyle, OutboxRow, Record, RelayConfigSpec, RelayProcess,
    TestDb, DEFAULT_CHECKPOINT_TABLE,
};
use tokio::sync::watch;

/// The relay binary under test (built on first use).
fn bin() -> &'static str {
    outbox_relay_testkit::relay_bin()
}

/// Relay start-up until its checkpoint row exists.
const STARTUP: Duration = Duration::from_secs(60);
/// Records reaching Kafka.
const RELAY_WAIT: Duration = Duration::from_secs(120);
/// A graceful stop (SIGTERM/SIGINT) until the process has exited.
const STOP: Duration = Duration::from_secs(30);
/// Reading topics that are no longer written.
const READ_ALL: Duration = Duration::from_secs(60);

/// Aggregate types, the short prefix of their ids, and their event types.
const AGGREGATES: [(&str, &str, [&str; 3]); 3] = [
    (
        "Order",
        "o",
        ["OrderCreated", "OrderPaid", "OrderCancelled"],
    ),
    (
        "Payment",
        "p",
        ["PaymentAuthorized", "PaymentCaptured", "PaymentRefunded"],
    ),
    (
        "Shipment",
        "s",
        ["ShipmentPacked", "ShipmentSent", "ShipmentDelivered"],
    ),
];
const AGGREGATE_TYPES: [&str; 3] = ["Order", "Payment", "Shipment"];
/// Aggregate ids per type (10 × 3 = 30 keys).
const IDS_PER_TYPE: usize = 10;

// ---------------------------------------------------------------------------------------------
// Test fixture and writer-side data
// ---------------------------------------------------------------------------------------------

outbox_relay_testkit::world_fixture!(
    /// One test's isolated world ([`World`]: database `e2e_<name>…`, topic prefix, connector name,
    /// server id).
    Fixture,
    bin(),
    "e2e"
);

/// Reads `topics` until every event key of `wanted` is there ([`collect_until`] with
/// [`all_seen`], up to [`RELAY_WAIT`]), then checks that `relay` still runs.
async fn seen_while_running(
    f: &Fixture,
    topics: &[String],
    wanted: HashSet<String>,
    relay: &RelayProcess,
) -> Result<Vec<Record>> {
    let seen = collect_until(
        &f.spec.bootstrap_servers,
        topics,
        RELAY_WAIT,
        all_seen(wanted),
    )
    .await?;
    relay.ensure_running()?;
    Ok(seen)
}

/// Every record on the dead-letter topic `dlq`, which must hold exactly one: that one.
async fn the_one_dead_letter(f: &Fixture, dlq: &str) -> Result<Record> {
    let dead = read_all_records(&f.spec.bootstrap_servers, &[dlq.to_owned()], READ_ALL).await?;
    ensure!(dead.len() == 1, "{} dead letters: {dead:?}", dead.len());
    dead.into_iter().next().context("no dead letter")
}

impl Fixture {
    fn topics(&self) -> Vec<String> {
        AGGREGATE_TYPES
            .iter()
            .map(|t| self.spec.topic_for(t))
            .collect()
    }

    fn spawn_relay(&self) -> Result<RelayProcess> {
        self.spawn()
    }

    /// Starts a relay and waits for its checkpoint row: from then on, commits are relayed.
    async fn start_relay(&self) -> Result<(RelayProcess, Checkpoint)> {
        self.start(STARTUP).await
    }

    /// Everything in this test's topics, including topics of unexpected aggregate types.
    async fn read_everything(&self) -> Result<(BTreeSet<String>, Vec<Record>)> {
        let topics = list_topics(&self.spec.bootstrap_servers, &self.topic_prefix()).await?;
        let list: Vec<String> = topics.iter().cloned().collect();
        let records = read_all_records(&self.spec.bootstrap_servers, &list, READ_ALL).await?;
        let deleted = deleted_record_count(&self.spec.bootstrap_servers, &list).await?;
        ensure!(
            deleted == 0,
            "the broker already deleted {deleted} records of {list:?} (time retention? record \
             timestamps must be recent): the topics cannot be checked completely"
        );
        Ok((topics, records))
    }
}

/// Generates outbox rows in commit order: several aggregate types, ~30 aggregate ids (one
/// non-ASCII), a per-aggregate sequence number in the payload, varied JSON text.
struct EventGen {
    uid: String,
    /// `created_at` of the first row (recent: see [`recent_created_at_base`]).
    base_micros: i64,
    label: String,
    next: usize,
    seq: HashMap<String, u64>,
}

impl EventGen {
    fn new(uid: &str, label: &str) -> Self {
        Self {
            uid: uid.to_owned(),
            base_micros: recent_created_at_base(),
            label: label.to_owned(),
            next: 0,
            seq: HashMap::new(),
        }
    }

    fn row(&mut self) -> OutboxRow {
        let g = self.next;
        self.next += 1;
        let (aggregate_type, short, event_types) = AGGREGATES[(g * 7 + g / 5) % 3];
        let n = (g * 13 + g / 3) % IDS_PER_TYPE;
        let aggregate_id = if n == 7 {
            format!("{short}-{n:02}-ü")
        } else {
            format!("{short}-{n:02}")
        };
        let seq = self
            .seq
            .entry(format!("{aggregate_type}/{aggregate_id}"))
            .or_insert(0);
        *seq += 1;
        let seq = *seq;
        OutboxRow {
            aggregate_type: aggregate_type.to_owned(),
            event_type: event_types[(seq % 3) as usize].to_owned(),
            event_key: format!("{}-{}-{g:05}", self.uid, self.label),
            payload: payload(g, &aggregate_id, seq),
            aggregate_id,
            // Sub-millisecond parts vary, so truncation to ms is exercised.
            created_at_micros: self.base_micros + i64::try_from(g).unwrap_or(0) * 1_000_123,
        }
    }

    fn rows(&mut self, n: usize) -> Vec<OutboxRow> {
        (0..n).map(|_| self.row()).collect()
    }
}

/// JSON text as an application would write it; must arrive on Kafka byte for byte.
fn payload(g: usize, agg: &str, seq: u64) -> String {
    match g % 4 {
        0 => format!(
            r#"{{"order":"{agg}","seq":{seq},"note":"crème brûlée ✓","items":[{{"sku":"A","qty":2}},{{"sku":"B-{g}","qty":{}}}]}}"#,
            g % 5 + 1
        ),
        1 => format!(
            "{{ \"agg\" : \"{agg}\",\n  \"seq\" : {seq},\n  \"nested\": {{\"a\": [1, 2.50, -3e2, null, true], \"b\": {{}} }},\n  \"emoji\": \"🚀 日本語\" }}"
        ),
        2 => format!(
            r#"{{"agg":"{agg}","seq":{seq},"quote":"she said \"hi\"","escapes":"\u00e9\\n\t","path":"C:\\tmp"}}"#
        ),
        _ => format!(
            r#"{{"agg":"{agg}","seq":{seq},"blob":"{}"}}"#,
            "xyz0123456789".repeat(150)
        ),
    }
}

/// What the writer committed, in commit order.
#[derive(Default)]
struct Committed {
    /// event_key → (commit order, row).
    rows: BTreeMap<String, (usize, OutboxRow)>,
}

impl Committed {
    fn add(&mut self, rows: &[OutboxRow]) {
        for r in rows {
            let order = self.rows.len();
            self.rows.insert(r.event_key.clone(), (order, r.clone()));
        }
    }

    fn len(&self) -> usize {
        self.rows.len()
    }
}

/// `id` of every row now in the outbox, by event_key.
async fn ids_by_event_key(conn: &mut Conn) -> Result<HashMap<String, u64>> {
    let rows: Vec<(u64, String)> = conn.query("SELECT id, event_key FROM outbox").await?;
    Ok(rows.into_iter().map(|(id, ek)| (ek, id)).collect())
}

/// One transaction of `rows` in one of four shapes (single-row INSERTs, one multi-row INSERT,
/// a mix), with writes to the non-outbox table `business` in the same transaction when
/// `with_business` is set, and in shape 3 an UPDATE of an outbox row inserted in the same
/// transaction (ignored by the relay: the record carries the inserted values).
async fn write_tx(
    conn: &mut Conn,
    shape: usize,
    rows: &[OutboxRow],
    with_business: bool,
) -> Result<()> {
    let mut tx = conn.start_transaction(TxOpts::default()).await?;
    let business = async |tx: &mut mysql_async::Transaction<'_>, i: usize| -> Result<()> {
        if with_business {
            tx.exec_drop(
                "INSERT INTO business (note, amount) VALUES (?, ?)",
                (format!("shape {shape} step {i} — crème"), i),
            )
            .await?;
        }
        Ok(())
    };
    let split = rows.len().min(3);
    match shape % 4 {
        0 => {
            for (i, r) in rows.iter().enumerate() {
                insert_outbox_rows(
                    &mut tx,
                    "outbox",
                    std::slice::from_ref(r),
                    InsertStyle::SingleRow,
                )
                .await?;
                if i % 3 == 0 {
                    business(&mut tx, i).await?;
                }
            }
        }
        1 => insert_outbox_rows(&mut tx, "outbox", rows, InsertStyle::MultiRow).await?,
        2 => {
            business(&mut tx, 0).await?;
            let a = rows.len().min(4);
            let b = rows.len().min(5);
            insert_outbox_rows(&mut tx, "outbox", &rows[..a], InsertStyle::MultiRow).await?;
            insert_outbox_rows(&mut tx, "outbox", &rows[a..b], InsertStyle::SingleRow).await?;
            insert_outbox_rows(&mut tx, "outbox", &rows[b..], InsertStyle::MultiRow).await?;
            if with_business {
                tx.query_drop("UPDATE business SET amount = amount + 1 ORDER BY id DESC LIMIT 3")
                    .await?;
            }
        }
        _ => {
            insert_outbox_rows(&mut tx, "outbox", &rows[..split], InsertStyle::SingleRow).await?;
            if let Some(first) = rows.first() {
                tx.exec_drop(
                    "UPDATE outbox SET event_type = CONCAT(event_type, '-updated'), \
                     payload = '{\"updated\":true}' WHERE event_key = ?",
                    (&first.event_key,),
                )
                .await?;
            }
            insert_outbox_rows(&mut tx, "outbox", &rows[split..], InsertStyle::MultiRow).await?;
            business(&mut tx, 1).await?;
        }
    }
    tx.commit().await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Checks
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Delivery {
    /// Every committed row exactly once.
    ExactlyOnce,
    /// Every committed row at least once (duplicates allowed after a crash).
    AtLeastOnce,
}

/// Where a record of a key was read: (partition, offset, commit order, event_key).
type Occurrence<'a> = (i32, i64, usize, &'a str);

/// Commits 40 transactions of 5 rows from `gen` (shapes `t % 4`, see [`write_tx`]), recorded in
/// `committed`; returns their event keys and the binlog position before the last of them.
async fn write_40_transactions(
    conn: &mut Conn,
    gen: &mut EventGen,
    committed: &mut Committed,
) -> Result<(HashSet<String>, BinlogPosition)> {
    let mut batch = HashSet::new();
    let mut before_last = None;
    for t in 0..40 {
        if t == 39 {
            before_last = Some(current_binlog_position(conn).await?);
        }
        let rows = gen.rows(5);
        write_tx(conn, t % 4, &rows, false).await?;
        batch.extend(rows.iter().map(|r| r.event_key.clone()));
        committed.add(&rows);
    }
    Ok((batch, before_last.context("no last transaction")?))
}

/// As many records as committed rows, and [`verify_records`] with [`Delivery::ExactlyOnce`].
async fn verify_exactly_once(
    conn: &mut Conn,
    records: &[Record],
    committed: &Committed,
    ids: &HashMap<String, u64>,
    spec: &RelayConfigSpec,
) -> Result<()> {
    ensure!(
        records.len() == committed.len(),
        "{} records in the topics for {} committed rows, expected exactly one each",
        records.len(),
        committed.len()
    );
    verify_records(conn, records, committed, ids, spec, Delivery::ExactlyOnce).await?;
    Ok(())
}

/// Compares the records with what the writer committed: content of every record, each
/// committed row present (exactly once or at least once), nothing else, and per key (topic +
/// aggregate id) the first occurrences in commit order. Returns the number of duplicates.
/// Values are compared with the payloads as the server gives them back (`server_json_text`:
/// MySQL normalises JSON text), read through `conn`.
async fn verify_records(
    conn: &mut Conn,
    records: &[Record],
    committed: &Committed,
    ids: &HashMap<String, u64>,
    spec: &RelayConfigSpec,
    delivery: Delivery,
) -> Result<usize> {
    let mut payloads: HashMap<&str, String> = HashMap::new();
    for (ek, (_, row)) in &committed.rows {
        payloads.insert(ek, server_json_text(conn, &row.payload).await?);
    }
    let mut problems: Vec<String> = Vec::new();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    let mut by_key: BTreeMap<(String, Vec<u8>), Vec<Occurrence<'_>>> = BTreeMap::new();

    for r in records {
        let at = format!("{}/{}@{}", r.topic, r.partition, r.offset);
        let Some(ek) = r.header("event_key") else {
            problems.push(format!("{at}: no UTF-8 event_key header: {r:?}"));
            continue;
        };
        let Some((order, row)) = committed.rows.get(ek) else {
            problems.push(format!(
                "{at}: record that no committed INSERT explains: event_key {ek:?}, value {:?}",
                r.value_str()
            ));
            continue;
        };
        *seen.entry(ek).or_default() += 1;
        let mut diff = |what: &str, got: String, want: String| {
            if got != want {
                problems.push(format!("{at} ({ek}): {what} is {got}, expected {want}"));
            }
        };
        diff(
            "topic",
            r.topic.clone(),
            spec.topic_for(&row.aggregate_type),
        );
        diff(
            "key",
            format!("{:?}", r.key.as_deref()),
            format!("{:?}", Some(row.aggregate_id.as_bytes())),
        );
        diff(
            "value",
            format!("{:?}", r.value_str()),
            format!("{:?}", payloads.get(ek).map(String::as_str)),
        );
        diff(
            "timestamp",
            format!("{:?}", r.timestamp_ms),
            format!("{:?}", Some(row.expected_timestamp_ms())),
        );
        let want_id = ids.get(ek).map(u64::to_string);
        for (name, want) in [
            ("id", want_id),
            ("event_key", Some(row.event_key.clone())),
            ("event_type", Some(row.event_type.clone())),
            ("aggregate_type", Some(row.aggregate_type.clone())),
        ] {
            diff(
                &format!("header {name}"),
                format!("{:?} (×{})", r.header(name), r.header_count(name)),
                format!("{:?} (×1)", want.as_deref()),
            );
        }
        by_key
            .entry((r.topic.clone(), r.key.clone().unwrap_or_default()))
            .or_default()
            .push((r.partition, r.offset, *order, ek));
    }

    let mut missing = Vec::new();
    let mut duplicates = 0;
    for ek in committed.rows.keys() {
        match seen.get(ek.as_str()).copied().unwrap_or(0) {
            0 => missing.push(ek.as_str()),
            1 => {}
            n => {
                duplicates += n - 1;
                if delivery == Delivery::ExactlyOnce {
                    problems.push(format!("{ek} was produced {n} times"));
                }
            }
        }
    }
    if !missing.is_empty() {
        problems.push(format!(
            "{} of {} committed rows never reached Kafka, e.g. {:?}",
            missing.len(),
            committed.len(),
            &missing[..missing.len().min(10)]
        ));
    }

    for ((topic, key), mut recs) in by_key {
        let key = String::from_utf8_lossy(&key);
        let partitions: BTreeSet<i32> = recs.iter().map(|r| r.0).collect();
        if partitions.len() > 1 {
            problems.push(format!(
                "key {key:?} of {topic} is spread over partitions {partitions:?}"
            ));
            continue;
        }
        recs.sort_by_key(|r| r.1);
        let mut first_seen = HashSet::new();
        let mut last: Option<(usize, &str)> = None;
        for (_, offset, order, ek) in recs {
            if !first_seen.insert(ek) {
                continue;
            }
            if let Some((prev_order, prev_ek)) = last {
                if order <= prev_order {
                    problems.push(format!(
                        "key {key:?} of {topic}: {ek} (commit #{order}) at offset {offset} \
                         comes after {prev_ek} (commit #{prev_order})"
                    ));
                }
            }
            last = Some((order, ek));
        }
    }

    if !problems.is_empty() {
        let shown = problems.len().min(40);
        bail!(
            "{} problems in {} records (expected {} rows, {:?}):\n  {}{}",
            problems.len(),
            records.len(),
            committed.len(),
            delivery,
            problems[..shown].join("\n  "),
            if problems.len() > shown {
                "\n  …"
            } else {
                ""
            }
        );
    }
    Ok(duplicates)
}

/// Event keys (header `event_key`) among `records`.
fn event_keys(records: &[Record]) -> HashSet<String> {
    records
        .iter()
        .filter_map(|r| r.header("event_key").map(str::to_owned))
        .collect()
}

/// A predicate for [`collect_until`]: every key of `wanted` has been read (incremental).
fn all_seen(wanted: HashSet<String>) -> impl FnMut(&[Record]) -> bool + Send + 'static {
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

fn ensure_exit_code(status: ExitStatus, code: i32, relay: &RelayProcess) -> Result<()> {
    ensure!(
        status.code() == Some(code),
        "the relay ended with {}, expected exit code {code}\n--- stderr ---\n{}",
        describe_exit(&status),
        relay.stderr_tail()
    );
    Ok(())
}

/// Checks the stored checkpoint: a file listed by SHOW BINARY LOGS, at a transaction boundary
/// (or still where the relay started), and not before `not_before` (a position taken before the
/// last relayed transaction was committed).
async fn verify_checkpoint(
    f: &Fixture,
    initial: &Checkpoint,
    not_before: &BinlogPosition,
) -> Result<Checkpoint> {
    let cp = f.checkpoint().await?;
    let mut conn = f.db.conn().await?;
    let logs = binary_logs(&mut conn).await?;
    ensure!(
        logs.iter().any(|(name, _)| *name == cp.binlog_file),
        "checkpoint file {:?} is not in SHOW BINARY LOGS {logs:?}",
        cp.binlog_file
    );
    let boundary = is_transaction_boundary(
        &mut conn,
        &cp.binlog_file,
        cp.binlog_pos,
        Some(f.db.created_at_binlog()),
    )
    .await?;
    ensure!(
        boundary || cp.position() == initial.position(),
        "checkpoint {} is not a transaction boundary (end of an Xid/COMMIT event) nor the start \
         position {}",
        cp.position(),
        initial.position()
    );
    let order = compare_positions(&mut conn, &cp.position(), not_before).await?;
    ensure!(
        order.is_gt(),
        "checkpoint {} does not cover the last relayed transaction (committed after {})",
        cp.position(),
        not_before
    );
    Ok(cp)
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

/// 1,000 outbox rows in 100 transactions, mixed with other tables, UPDATEs, DELETEs, a rolled
/// back transaction and an outbox table the relay does not follow: exactly the committed
/// INSERTs reach Kafka, each with the inserted key, value, headers and timestamp, in commit
/// order per key; a graceful stop exits 0 and leaves the checkpoint at a transaction boundary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_exactly_the_committed_inserts() -> Result<()> {
    let f = Fixture::new("exact").await?;
    // An outbox of the same shape in another database: not configured, never relayed.
    let other = TestDb::create("e2e_exact_other").await?;
    let mut conn = f.db.conn().await?;
    conn.query_drop(
        "CREATE TABLE business (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, \
         note VARCHAR(255) NOT NULL, amount INT NOT NULL) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
    )
    .await?;

    let (relay, cp0) = f.start_relay().await?;

    let mut gen = EventGen::new(&f.uid, "ek");
    let mut committed = Committed::default();
    for t in 0..99 {
        let rows = gen.rows(10);
        write_tx(&mut conn, t, &rows, true).await?;
        committed.add(&rows);
        if t % 10 == 5 {
            conn.exec_drop(
                "INSERT INTO business (note, amount) VALUES (?, ?)",
                ("business only", 0),
            )
            .await?;
        }
    }
    let mut ids = ids_by_event_key(&mut conn).await?;

    // UPDATEs and DELETEs of relayed rows produce nothing (an UPDATE to a new aggregate type
    // would show up as an extra topic).
    conn.query_drop(
        "UPDATE outbox SET aggregate_type = 'Invoice', payload = '{\"updated\":true}' \
         WHERE id % 7 = 0",
    )
    .await?;
    {
        let mut tx = conn.start_transaction(TxOpts::default()).await?;
        tx.query_drop("DELETE FROM outbox WHERE id % 11 = 0")
            .await?;
        tx.query_drop("INSERT INTO business (note, amount) VALUES ('after delete', 1)")
            .await?;
        tx.commit().await?;
    }
    // A rolled-back transaction produces nothing.
    let mut rolled_back = EventGen::new(&f.uid, "rolledback");
    let mut rb_rows = rolled_back.rows(5);
    for r in rb_rows.iter_mut().take(3) {
        r.aggregate_type = "Refund".into();
    }
    {
        let mut tx = conn.start_transaction(TxOpts::default()).await?;
        tx.query_drop("INSERT INTO business (note, amount) VALUES ('rolled back', 2)")
            .await?;
        insert_outbox_rows(&mut tx, "outbox", &rb_rows[..2], InsertStyle::SingleRow).await?;
        insert_outbox_rows(&mut tx, "outbox", &rb_rows[2..], InsertStyle::MultiRow).await?;
        tx.rollback().await?;
    }
    // Rows in an outbox that is not configured produce nothing.
    let mut other_gen = EventGen::new(&f.uid, "otherdb");
    let other_rows = other_gen.rows(6);
    insert_outbox_rows(
        &mut other.conn().await?,
        "outbox",
        &other_rows,
        InsertStyle::MultiRow,
    )
    .await?;

    // The last transaction comes after all of that: once it is on Kafka, the relay has read
    // past every event above.
    let before_last = current_binlog_position(&mut conn).await?;
    let rows = gen.rows(10);
    write_tx(&mut conn, 99, &rows, true).await?;
    committed.add(&rows);
    ids.extend(ids_by_event_key(&mut conn).await?);
    ensure!(
        committed.len() == 1000,
        "the writer made {} rows",
        committed.len()
    );

    let seen = collect_records(
        &f.spec.bootstrap_servers,
        &f.topics(),
        committed.len(),
        RELAY_WAIT,
    )
    .await?;
    relay.ensure_running()?;
    ensure!(
        seen.len() >= committed.len(),
        "only {} of {} records reached Kafka within {RELAY_WAIT:?}; missing e.g. {:?}",
        seen.len(),
        committed.len(),
        committed
            .rows
            .keys()
            .filter(|k| !event_keys(&seen).contains(*k))
            .take(10)
            .collect::<Vec<_>>()
    );

    let status = relay.stop(STOP).await?;
    ensure_exit_code(status, 0, &relay)?;

    // After the graceful stop every produced record is acknowledged: read everything.
    let (topics, records) = f.read_everything().await?;
    let expected_topics: BTreeSet<String> = f.topics().into_iter().collect();
    ensure!(
        topics == expected_topics,
        "the relay produced to topics {topics:?}, expected exactly {expected_topics:?}"
    );
    let keys = event_keys(&records);
    for r in rb_rows.iter().chain(&other_rows) {
        ensure!(
            !keys.contains(&r.event_key),
            "{} (rolled back or in an unconfigured table) reached Kafka",
            r.event_key
        );
    }
    verify_exactly_once(&mut conn, &records, &committed, &ids, &f.spec).await?;
    verify_checkpoint(&f, &cp0, &before_last).await?;

    other.drop_database().await?;
    drop(conn);
    f.drop_database().await
}

/// Which stage of the crash test the writer may go on to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Stage {
    FirstRelayRunning,
    FirstRelayKilled,
    SecondRelayStarted,
}

/// kill -9 in the middle of a stream of small transactions, rows written while the relay is
/// down, and a restart with the same config: every committed row reaches Kafka (duplicates are
/// allowed), per key the first occurrences follow commit order, and the checkpoint is a
/// transaction boundary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumes_after_kill_9_without_loss() -> Result<()> {
    const TXS: usize = 200;
    const ROWS_PER_TX: usize = 5;
    /// The writer waits for the kill before this transaction…
    const KILL_BEFORE: usize = 100;
    /// …and for the restart before this one.
    const RESTART_BEFORE: usize = 150;

    let f = Fixture::new("crash").await?;
    let (relay1, cp0) = f.start_relay().await?;

    let mut gen = EventGen::new(&f.uid, "ek");
    let batches: Vec<Vec<OutboxRow>> = (0..TXS).map(|_| gen.rows(ROWS_PER_TX)).collect();
    let mut committed = Committed::default();
    for b in &batches {
        committed.add(b);
    }

    let (stage_tx, mut stage_rx) = watch::channel(Stage::FirstRelayRunning);
    let (progress_tx, mut progress_rx) = watch::channel(0usize);
    let pool = f.db.pool().clone();
    let writer = tokio::spawn(async move {
        let mut conn = pool.get_conn().await?;
        let mut before_last = None;
        for (t, rows) in batches.iter().enumerate() {
            let wait_for = match t {
                KILL_BEFORE => Some(Stage::FirstRelayKilled),
                RESTART_BEFORE => Some(Stage::SecondRelayStarted),
                _ => None,
            };
            if let Some(stage) = wait_for {
                tokio::time::timeout(RELAY_WAIT, stage_rx.wait_for(|s| *s >= stage))
                    .await
                    .with_context(|| format!("writer waited too long for {stage:?}"))?
                    .map(|_| ())?;
            }
            if t == TXS - 1 {
                before_last = Some(current_binlog_position(&mut conn).await?);
            }
            let style = if t % 2 == 0 {
                InsertStyle::MultiRow
            } else {
                InsertStyle::SingleRow
            };
            let mut tx = conn.start_transaction(TxOpts::default()).await?;
            insert_outbox_rows(&mut tx, "outbox", rows, style).await?;
            tx.commit().await?;
            progress_tx.send_replace(t + 1);
            // Pacing only, so the kill lands in the middle of the stream.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        before_last.context("no last transaction")
    });

    // Some records are on Kafka: the first relay is mid-stream. Crash it.
    let topics = f.topics();
    wait_until(
        "the first relay to produce 100 records",
        RELAY_WAIT,
        Duration::from_millis(100),
        async || {
            relay1.ensure_running()?;
            let n = high_watermark_total(&f.spec.bootstrap_servers, &topics).await?;
            Ok((n >= 100).then_some(()))
        },
    )
    .await?;
    relay1.kill9()?;
    stage_tx.send_replace(Stage::FirstRelayKilled);

    // Rows committed while no relay runs.
    tokio::time::timeout(RELAY_WAIT, progress_rx.wait_for(|n| *n >= RESTART_BEFORE))
        .await
        .context("the writer did not get through the downtime")?
        .map(|_| ())?;

    let relay2 = f.spawn_relay()?;
    stage_tx.send_replace(Stage::SecondRelayStarted);
    let before_last = tokio::time::timeout(RELAY_WAIT, writer)
        .await
        .context("the writer did not finish")???;

    let wanted: HashSet<String> = committed.rows.keys().cloned().collect();
    let seen = seen_while_running(&f, &topics, wanted.clone(), &relay2).await?;
    let seen_keys = event_keys(&seen);
    let missing: Vec<&String> = wanted.iter().filter(|k| !seen_keys.contains(*k)).collect();
    ensure!(
        missing.is_empty(),
        "{} of {} committed rows did not reach Kafka within {RELAY_WAIT:?}, e.g. {:?}",
        missing.len(),
        wanted.len(),
        &missing[..missing.len().min(10)]
    );

    let status = relay2.stop(STOP).await?;
    ensure_exit_code(status, 0, &relay2)?;

    let mut conn = f.db.conn().await?;
    let ids = ids_by_event_key(&mut conn).await?;
    let (all_topics, records) = f.read_everything().await?;
    let expected_topics: BTreeSet<String> = topics.iter().cloned().collect();
    ensure!(
        all_topics == expected_topics,
        "the relay produced to topics {all_topics:?}, expected {expected_topics:?}"
    );
    let duplicates = verify_records(
        &mut conn,
        &records,
        &committed,
        &ids,
        &f.spec,
        Delivery::AtLeastOnce,
    )
    .await?;
    eprintln!(
        "{} records for {} committed rows ({duplicates} duplicates after the crash)",
        records.len(),
        committed.len()
    );
    verify_checkpoint(&f, &cp0, &before_last).await?;

    drop(conn);
    f.drop_database().await
}

/// A graceful stop (SIGTERM), rows written while the relay is down, and a restart: every row
/// exactly once, none lost, none duplicated. The second relay is stopped with SIGINT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_stop_then_restart_has_no_duplicates_or_losses() -> Result<()> {
    let f = Fixture::new("graceful").await?;
    let mut conn = f.db.conn().await?;
    let topics = f.topics();
    let mut gen = EventGen::new(&f.uid, "ek");
    let mut committed = Committed::default();

    // Batch 1 while the relay runs.
    let (relay1, cp0) = f.start_relay().await?;
    let (batch1, before_last1) = write_40_transactions(&mut conn, &mut gen, &mut committed).await?;
    let seen = seen_while_running(&f, &topics, batch1.clone(), &relay1).await?;
    ensure!(
        batch1.is_subset(&event_keys(&seen)),
        "batch 1 did not fully reach Kafka within {RELAY_WAIT:?}"
    );

    let stopping = Instant::now();
    let status = relay1.stop(STOP).await?;
    ensure_exit_code(status, 0, &relay1)?;
    eprintln!(
        "first relay stopped in {:.2} s",
        stopping.elapsed().as_secs_f64()
    );
    // The final checkpoint covers batch 1.
    let cp1 = verify_checkpoint(&f, &cp0, &before_last1).await?;

    // Batch 2 while no relay runs.
    let (batch2, before_last2) = write_40_transactions(&mut conn, &mut gen, &mut committed).await?;

    let relay2 = f.spawn_relay()?;
    let seen = seen_while_running(&f, &topics, batch2.clone(), &relay2).await?;
    ensure!(
        batch2.is_subset(&event_keys(&seen)),
        "batch 2 did not fully reach Kafka within {RELAY_WAIT:?} after the restart"
    );
    relay2.sigint()?;
    let status = relay2.wait_exit(STOP).await?;
    ensure_exit_code(status, 0, &relay2)?;

    let ids = ids_by_event_key(&mut conn).await?;
    let (all_topics, records) = f.read_everything().await?;
    let expected_topics: BTreeSet<String> = topics.iter().cloned().collect();
    ensure!(
        all_topics == expected_topics,
        "the relay produced to topics {all_topics:?}, expected {expected_topics:?}"
    );
    let mut counts: HashMap<String, usize> = HashMap::new();
    for r in &records {
        if let Some(ek) = r.header("event_key") {
            *counts.entry(ek.to_owned()).or_default() += 1;
        }
    }
    let dup: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    ensure!(
        dup.is_empty(),
        "{} event keys were produced more than once, e.g. {:?}",
        dup.len(),
        &dup[..dup.len().min(10)]
    );
    verify_exactly_once(&mut conn, &records, &committed, &ids, &f.spec).await?;
    let cp2 = verify_checkpoint(&f, &cp0, &before_last2).await?;
    let mut conn2 = f.db.conn().await?;
    ensure!(
        compare_positions(&mut conn2, &cp2.position(), &cp1.position())
            .await?
            .is_gt(),
        "the checkpoint did not advance across the restart ({} → {})",
        cp1.position(),
        cp2.position()
    );

    drop((conn, conn2));
    f.drop_database().await
}

/// A typo in the config file is a config error: exit code 2, and stderr names the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejects_unknown_config_key() -> Result<()> {
    let f = Fixture::new("badkey").await?;
    let toml = f
        .spec
        .to_toml()
        .replace("max_in_flight = 10000", "max_inflight = 10000");
    ensure!(toml.contains("max_inflight"), "template changed: {toml}");
    let relay = RelayProcess::spawn(bin(), &toml, &[])?;
    let status = relay.wait_exit(STARTUP).await?;
    ensure_exit_code(status, 2, &relay)?;
    let stderr = relay.stderr_text();
    ensure!(
        stderr.contains("max_inflight"),
        "stderr does not name the unknown key max_inflight:\n{stderr}"
    );
    f.drop_database().await
}

/// `OUTBOX_RELAY__…` variables override the file: a file with an invalid server_id and another
/// connector name runs with the values from the environment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn environment_overrides_the_config_file() -> Result<()> {
    let f = Fixture::new("envcfg").await?;
    let mut file_spec = f.spec.clone();
    file_spec.server_id = 0; // invalid on its own
    file_spec.connector_name = format!("from-file-{}", f.uid);
    let server_id = f.spec.server_id.to_string();
    let relay = RelayProcess::spawn(
        bin(),
        &file_spec.to_toml(),
        &[
            ("OUTBOX_RELAY__MYSQL__SERVER_ID", server_id.as_str()),
            ("OUTBOX_RELAY__CONNECTOR_NAME", f.connector()),
        ],
    )?;
    relay
        .wait_for_checkpoint_row(f.db.pool(), f.connector(), STARTUP)
        .await?;
    ensure!(
        read_checkpoint(
            f.db.pool(),
            DEFAULT_CHECKPOINT_TABLE,
            &file_spec.connector_name
        )
        .await?
        .is_none(),
        "the connector name from the file was used despite the override"
    );
    let status = relay.stop(STOP).await?;
    ensure_exit_code(status, 0, &relay)?;

    // A value of the wrong type in the environment is a config error.
    let relay = RelayProcess::spawn(
        bin(),
        &f.spec.to_toml(),
        &[("OUTBOX_RELAY__MYSQL__SERVER_ID", "not-a-number")],
    )?;
    let status = relay.wait_exit(STARTUP).await?;
    ensure_exit_code(status, 2, &relay)?;
    // The key may be reported as spelled in the variable (MYSQL.SERVER_ID).
    let stderr = relay.stderr_text();
    ensure!(
        stderr.to_ascii_lowercase().contains("server_id"),
        "stderr does not name server_id:\n{stderr}"
    );
    f.drop_database().await
}

// ---------------------------------------------------------------------------------------------
// Rows larger than one MySQL protocol packet (16 MiB - 1)
// ---------------------------------------------------------------------------------------------

/// Inserts `rows` into the test's outbox, each in a transaction of its own (autocommit).
async fn commit_each(conn: &mut Conn, rows: &[OutboxRow]) -> Result<()> {
    for r in rows {
        insert_outbox_rows(
            conn,
            "outbox",
            std::slice::from_ref(r),
            InsertStyle::SingleRow,
        )
        .await?;
    }
    Ok(())
}

/// A JSON payload of about `bytes` bytes: one string of varied characters, non-ASCII included,
/// so a single misplaced byte (e.g. at a 16 MiB packet boundary) changes it.
fn big_payload(bytes: usize, seed: u64) -> String {
    const CHARS: [&str; 8] = ["a", "Z", "7", " ", "ü", "€", "-", "日"];
    let mut out = String::with_capacity(bytes + 16);
    out.push_str("{\"blob\":\"");
    let mut x = seed | 1;
    while out.len() < bytes {
        // xorshift64: a fixed pseudo-random sequence.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.push_str(CHARS[(x % 8) as usize]);
    }
    out.push_str("\"}");
    out
}

/// One outbox row of `aggregate_type` with `payload`, committed on its own.
fn single_row(uid: &str, n: usize, payload: String) -> OutboxRow {
    OutboxRow {
        aggregate_type: "Archive".into(),
        aggregate_id: format!("archive-{n}"),
        event_type: "ArchiveStored".into(),
        event_key: format!("{uid}-big-{n}"),
        payload,
        created_at_micros: recent_created_at_base() + i64::try_from(n).unwrap_or(0) * 1_000,
    }
}

/// A row of about 20 MiB (its rows event is sent in two MySQL packets: more than 16 MiB - 1)
/// reaches Kafka byte for byte when the topic and the producer allow it, and the stream goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_a_row_larger_than_one_protocol_packet() -> Result<()> {
    const LIMIT: usize = 25 * 1024 * 1024;
    let mut f = Fixture::new("big").await?;
    let topic = f.spec.topic_for("Archive");
    create_topic(&f.spec.bootstrap_servers, &topic, LIMIT).await?;
    f.spec
        .kafka_properties
        .push(("message.max.bytes".into(), LIMIT.to_string()));
    let mut conn = f.db.conn().await?;
    let (relay, _) = f.start_relay().await?;

    let rows = [
        single_row(&f.uid, 0, big_payload(20 * 1024 * 1024, 0x5eed)),
        single_row(&f.uid, 1, r#"{"after":"the big one"}"#.into()),
    ];
    ensure!(rows[0].payload.len() > 16 * 1024 * 1024 + 1024);
    commit_each(&mut conn, &rows).await?;
    let ids = ids_by_event_key(&mut conn).await?;
    let wanted: HashSet<String> = rows.iter().map(|r| r.event_key.clone()).collect();
    let seen = seen_while_running(&f, std::slice::from_ref(&topic), wanted, &relay).await?;
    ensure!(
        seen.len() == rows.len(),
        "{} records on {topic}, expected {}\n{}",
        seen.len(),
        rows.len(),
        relay.stderr_tail()
    );
    for (r, row) in seen.iter().zip(&rows) {
        ensure!(
            r.header("event_key") == Some(row.event_key.as_str()),
            "records out of order: {:?} where {} was expected",
            r.header("event_key"),
            row.event_key
        );
        let value = r.value.as_deref().unwrap_or_default();
        // The payload as the server gives it back (MySQL normalises JSON text).
        let stored = stored_payload(&mut conn, "outbox", &row.event_key)
            .await?
            .with_context(|| format!("{} is not in the outbox", row.event_key))?;
        ensure!(
            value == stored.as_bytes(),
            "{}: the value differs from the stored payload ({} bytes on Kafka, {} stored, {} \
             inserted; first difference at byte {:?})",
            row.event_key,
            value.len(),
            stored.len(),
            row.payload.len(),
            value
                .iter()
                .zip(stored.as_bytes())
                .position(|(a, b)| a != b)
        );
        ensure!(r.key.as_deref() == Some(row.aggregate_id.as_bytes()));
        let want_id = ids.get(&row.event_key).map(u64::to_string);
        ensure!(
            r.header("id") == want_id.as_deref()
                && r.header("event_type") == Some(row.event_type.as_str())
                && r.header("aggregate_type") == Some(row.aggregate_type.as_str())
                && r.timestamp_ms == Some(row.expected_timestamp_ms()),
            "{}: headers {:?}, timestamp {:?}",
            row.event_key,
            r.headers,
            r.timestamp_ms
        );
    }
    let status = relay.stop(STOP).await?;
    ensure_exit_code(status, 0, &relay)?;
    drop(conn);
    f.drop_database().await
}

/// A row over the producer's `message.max.bytes` (and over 16 MiB) goes to the dead-letter
/// topic with a reason saying it is too large for Kafka (without its value), and the row after
/// it is relayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_too_large_for_kafka_is_dead_lettered_and_the_stream_goes_on() -> Result<()> {
    const LIMIT: usize = 10 * 1024 * 1024;
    let mut f = Fixture::new("toobig").await?;
    let topic = f.spec.topic_for("Archive");
    let dlq = format!("t_{}.dlq", f.uid);
    f.spec.dead_letter_topic = Some(dlq.clone());
    f.spec
        .kafka_properties
        .push(("message.max.bytes".into(), LIMIT.to_string()));
    let mut conn = f.db.conn().await?;
    let (relay, _) = f.start_relay().await?;

    let rows = [
        single_row(&f.uid, 0, big_payload(17 * 1024 * 1024, 0xb16)),
        single_row(&f.uid, 1, r#"{"after":"the refused one"}"#.into()),
    ];
    commit_each(&mut conn, &rows).await?;
    let ids = ids_by_event_key(&mut conn).await?;
    let next = seen_while_running(
        &f,
        std::slice::from_ref(&topic),
        HashSet::from([rows[1].event_key.clone()]),
        &relay,
    )
    .await?;
    let status = relay.stop(STOP).await?;
    ensure_exit_code(status, 0, &relay)?;
    let keys: Vec<Option<&str>> = next.iter().map(|r| r.header("event_key")).collect();
    ensure!(
        keys == [Some(rows[1].event_key.as_str())],
        "records on {topic}: {keys:?}, expected only the row after the refused one\n{}",
        relay.stderr_tail()
    );
    let stored = stored_payload(&mut conn, "outbox", &rows[1].event_key).await?;
    ensure!(next[0].value.as_deref() == stored.as_deref().map(str::as_bytes));

    let d = &the_one_dead_letter(&f, &dlq).await?;
    let reason = d.header("dlq_reason").unwrap_or_default();
    ensure!(
        reason.contains("too large for Kafka"),
        "dlq_reason {reason:?} does not say the record is too large for Kafka"
    );
    let want_id = ids.get(&rows[0].event_key).map(u64::to_string);
    for (name, want) in [
        ("event_key", Some(rows[0].event_key.clone())),
        ("id", want_id),
        ("event_type", Some(rows[0].event_type.clone())),
        ("aggregate_type", Some(rows[0].aggregate_type.clone())),
        ("dlq_topic", Some(topic.clone())),
        ("dlq_table", Some(f.db.outbox_table())),
    ] {
        ensure!(
            d.header(name) == want.as_deref(),
            "dead letter header {name} is {:?}, expected {want:?}",
            d.header(name)
        );
    }
    ensure!(d.key.as_deref() == Some(rows[0].aggregate_id.as_bytes()));
    ensure!(
        d.value.is_none() && d.header("dlq_value_dropped") == Some("true"),
        "the dead letter carries the too-large value, or does not say it was dropped: {:?}",
        d.headers
    );
    let logs = binary_logs(&mut conn).await?;
    ensure!(
        logs.iter()
            .any(|(name, _)| Some(name.as_str()) == d.header("dlq_binlog_file")),
        "dlq_binlog_file {:?} is not in SHOW BINARY LOGS",
        d.header("dlq_binlog_file")
    );
    drop(conn);
    f.drop_database().await
}

// ---------------------------------------------------------------------------------------------
// Topics with a max.message.bytes below the producer's message.max.bytes
// ---------------------------------------------------------------------------------------------

/// `batch_size_alone` (what the relay compares with a topic's `max.message.bytes`) is exactly
/// what the broker compares: a record whose batch is that size is taken by a topic of that
/// limit, one byte more is refused. Produced without the relay, one record per batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_size_alone_matches_the_brokers_max_message_bytes_check() -> Result<()> {
    use outbox_relay_kafka::sink::batch_size_alone;
    use outbox_relay_testkit::rdkafka::error::{KafkaError, RDKafkaErrorCode};
    use outbox_relay_testkit::rdkafka::message::{Header, OwnedHeaders};
    use outbox_relay_testkit::rdkafka::producer::{FutureProducer, FutureRecord};
    use outbox_relay_testkit::rdkafka::ClientConfig;
    const LIMIT: usize = 5_000;
    let bootstrap = outbox_relay_testkit::env::kafka_bootstrap();
    let topic = format!("t_{}.limit", unique_suffix());
    create_topic(&bootstrap, &topic, LIMIT).await?;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("linger.ms", "0")
        .create()
        .context("creating a producer")?;
    let key = b"order-42".as_slice();
    let headers = [
        ("event_key", b"3f2a-17".to_vec()),
        ("id", b"123456".to_vec()),
        ("event_type", b"OrderPlaced".to_vec()),
    ];
    // The value length whose one-record batch is exactly LIMIT bytes.
    let fits = (0..LIMIT)
        .find(|n| batch_size_alone(key, Some(&vec![b'x'; *n]), &headers) == LIMIT as u64)
        .context("no value length gives a batch of exactly LIMIT bytes")?;
    let mut outcomes = Vec::new();
    for len in [fits, fits + 1] {
        let value = vec![b'x'; len];
        let mut owned = OwnedHeaders::new();
        for (name, v) in &headers {
            owned = owned.insert(Header {
                key: name,
                value: Some(v.as_slice()),
            });
        }
        let record = FutureRecord::to(&topic)
            .key(key)
            .payload(&value)
            .headers(owned);
        outcomes.push(
            producer
                .send(record, Duration::from_secs(30))
                .await
                .map(|_| ())
                .map_err(|(e, _)| e),
        );
    }
    ensure!(
        outcomes[0].is_ok(),
        "a batch of exactly max.message.bytes = {LIMIT} was refused: {:?}",
        outcomes[0]
    );
    ensure!(
        matches!(
            outcomes[1],
            Err(KafkaError::MessageProduction(
                RDKafkaErrorCode::MessageSizeTooLarge
            ))
        ),
        "a batch of max.message.bytes + 1 was not refused as too large: {:?}",
        outcomes[1]
    );
    Ok(())
}

/// A row whose record is over its topic's `max.message.bytes` (but under the producer's
/// `message.max.bytes`) goes to the dead-letter topic, without its value and with a reason
/// naming the topic's limit; the rows around it are relayed in order and the relay keeps
/// running (the broker never sees it: refused there, it would be a fatal producer error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_over_the_topics_max_message_bytes_is_dead_lettered_and_the_stream_goes_on(
) -> Result<()> {
    const TOPIC_LIMIT: usize = 20_000;
    let mut f = Fixture::new("topiclimit").await?;
    let topic = f.spec.topic_for("Archive");
    create_topic(&f.spec.bootstrap_servers, &topic, TOPIC_LIMIT).await?;
    let dlq = format!("t_{}.dlq", f.uid);
    f.spec.dead_letter_topic = Some(dlq.clone());
    let mut conn = f.db.conn().await?;
    let (relay, _) = f.start_relay().await?;

    let rows = [
        single_row(&f.uid, 0, r#"{"before":"the big one"}"#.into()),
        single_row(&f.uid, 1, big_payload(50_000, 0x7091c)),
        single_row(&f.uid, 2, r#"{"after":"the big one"}"#.into()),
    ];
    commit_each(&mut conn, &rows).await?;
    let wanted = [&rows[0], &rows[2]];
    let seen = seen_while_running(
        &f,
        std::slice::from_ref(&topic),
        wanted.iter().map(|r| r.event_key.clone()).collect(),
        &relay,
    )
    .await?;
    let keys: Vec<Option<&str>> = seen.iter().map(|r| r.header("event_key")).collect();
    ensure!(
        keys == wanted
            .iter()
            .map(|r| Some(r.event_key.as_str()))
            .collect::<Vec<_>>(),
        "records on {topic}: {keys:?}, expected the rows before and after the big one\n{}",
        relay.stderr_tail()
    );
    let d = &the_one_dead_letter(&f, &dlq).await?;
    let reason = d.header("dlq_reason").unwrap_or_default();
    ensure!(
        reason.contains(&format!("max.message.bytes = {TOPIC_LIMIT}")) && reason.contains(&topic),
        "dlq_reason {reason:?} does not name the topic and its max.message.bytes"
    );
    ensure!(
        d.header("event_key") == Some(rows[1].event_key.as_str())
            && d.header("dlq_topic") == Some(topic.as_str()),
        "dead letter headers: {:?}",
        d.headers
    );
    ensure!(
        d.value.is_none() && d.header("dlq_value_dropped") == Some("true"),
        "the dead letter carries the too-large value, or does not say it was dropped: {:?}",
        d.headers
    );
    // The topic also takes batches smaller than the producer builds: the relay says so.
    ensure!(
        relay.stderr_text().contains("set \"batch.size\""),
        "no warning that the topic's limit is below the producer's batch size\n{}",
        relay.stderr_tail()
    );
    let status = relay.stop(STOP).await?;
    ensure_exit_code(status, 0, &relay)?;
    drop(conn);
    f.drop_database().await
}

/// Raising a topic's `max.message.bytes` while the relay runs takes effect without a restart:
/// a row over the old limit (read when the relay first sent to the topic) but under the new one
/// is read again before being refused, and reaches the topic whole; nothing is dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raised_topic_limit_is_read_again_before_a_row_is_refused() -> Result<()> {
    use outbox_relay_testkit::rdkafka::admin::{
        AdminClient, AdminOptions, AlterConfig, ResourceSpecifier,
    };
    use outbox_relay_testkit::rdkafka::client::DefaultClientContext;
    use outbox_relay_testkit::rdkafka::ClientConfig;
    let mut f = Fixture::new("topicraise").await?;
    let topic = f.spec.topic_for("Archive");
    create_topic(&f.spec.bootstrap_servers, &topic, 20_000).await?;
    let dlq = format!("t_{}.dlq", f.uid);
    f.spec.dead_letter_topic = Some(dlq.clone());
    let mut conn = f.db.conn().await?;
    let (relay, _) = f.start_relay().await?;

    // The relay reads the topic's limit (20000) with its first record.
    let first = single_row(&f.uid, 0, r#"{"first":true}"#.into());
    commit_each(&mut conn, std::slice::from_ref(&first)).await?;
    collect_until(
        &f.spec.bootstrap_servers,
        std::slice::from_ref(&topic),
        RELAY_WAIT,
        all_seen(HashSet::from([first.event_key.clone()])),
    )
    .await?;

    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &f.spec.bootstrap_servers)
        .create()
        .context("creating a Kafka admin client")?;
    let raise =
        AlterConfig::new(ResourceSpecifier::Topic(&topic)).set("max.message.bytes", "200000");
    for r in admin
        .alter_configs([&raise], &AdminOptions::new())
        .await
        .context("altering the topic's config")?
    {
        r.map_err(|(_, e)| anyhow::anyhow!("altering {topic}: {e}"))?;
    }
    // The relay reads a topic's limit again at most every 10 s.
    tokio::time::sleep(Duration::from_secs(11)).await;

    let big = single_row(&f.uid, 1, big_payload(50_000, 0x4a15e));
    commit_each(&mut conn, std::slice::from_ref(&big)).await?;
    let seen = seen_while_running(
        &f,
        std::slice::from_ref(&topic),
        HashSet::from([big.event_key.clone()]),
        &relay,
    )
    .await?;
    let copies: Vec<&Record> = seen
        .iter()
        .filter(|r| r.header("event_key") == Some(big.event_key.as_str()))
        .collect();
    ensure!(
        copies.len() == 1,
        "the big row is on its topic {} times",
        copies.len()
    );
    let got = copies[0];
    let stored = stored_payload(&mut conn, "outbox", &big.event_key).await?;
    ensure!(
        got.value.is_some() && got.value.as_deref() == stored.as_deref().map(str::as_bytes),
        "the big row's value differs ({} bytes on Kafka)\n{}",
        got.value.as_ref().map_or(0, Vec::len),
        relay.stderr_tail()
    );
    let status = relay.stop(STOP).await?;
    ensure_exit_code(status, 0, &relay)?;
    let topics = list_topics(&f.spec.bootstrap_servers, &dlq).await?;
    let dead = if topics.contains(&dlq) {
        read_all_records(
            &f.spec.bootstrap_servers,
            std::slice::from_ref(&dlq),
            READ_ALL,
        )
        .await?
    } else {
        Vec::new()
    };
    ensure!(dead.is_empty(), "dead letters: {dead:?}");
    drop(conn);
    f.drop_database().await
}
