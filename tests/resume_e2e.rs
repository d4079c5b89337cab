//! End-to-end tests of resumption, leases, dead letters and start-up position checks of the
//! `outbox-relay` binary against the real MariaDB and Kafka of the test machine
//! (`tests/services/mariadb.sh up`, `tests/services/kafka.sh up`).
//!
//! Each test has its own database, topic prefix, connector name and replica server id
//! ([`World`]), so the tests run in parallel. They wait only on observable state (records on
//! Kafka, the state row, the binlog, the process's exit and stderr) with timeouts, and check the
//! real outcome: what reached Kafka, what the state table holds, the exit code and stderr.
//!
//! Transactions are located in the binlog by their GTID ([`last_gtid`] after the commit: MariaDB
//! `@@last_gtid`, MySQL `performance_schema`; then `SHOW BINLOG EVENTS`), so positions stay
//! exact while other tests write to the same server concurrently. Record values are compared
//! with the payload text the server itself returns ([`stored_payloads`]): MySQL stores JSON in
//! binary form and prints it normalised.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use mysql_async::prelude::*;
use mysql_async::{Conn, TxOpts};
use outbox_relay_testkit::{
    binary_logs, collect_records, commit_rows, compare_positions, connection_state,
    current_binlog_position, describe_record, ensure_at_least_once, ensure_exactly_once,
    ensure_per_key_order, expect_exit_code, find_transaction, high_watermark_total,
    integer_sequence, last_gtid, lease_lock_name, list_topics, mysql_url, newest_binlog_file,
    next_server_id, read_all_records, read_checkpoint, registered_replica_ids, stored_payloads,
    unreached_gtid_state, wait_for_stderr, wait_until, write_rows_event_ending_at, BinlogPosition,
    BinlogTransaction, Checkpoint, Record, RelayConfigSpec, RelayProcess, RowGen, World,
    DEFAULT_CHECKPOINT_TABLE,
};
use tokio::sync::watch;

/// The relay binary under test (built on first use).
fn bin() -> &'static str {
    outbox_relay_testkit::relay_bin()
}

/// Relay start-up until its checkpoint row holds a position.
const STARTUP: Duration = Duration::from_secs(60);
/// Records reaching Kafka.
const RELAY_WAIT: Duration = Duration::from_secs(180);
/// A graceful stop until the process has exited.
const STOP: Duration = Duration::from_secs(60);
/// A relay that must give up (exit code 1 or 3).
const FAIL_EXIT: Duration = Duration::from_secs(60);
/// Reading topics that are no longer written.
const READ_ALL: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------------------------
// Writers
// ---------------------------------------------------------------------------------------------

/// One `INSERT … SELECT` of `rows` outbox rows from [`integer_sequence`] (portable: no
/// SEQUENCE engine, no recursion limit): a single transaction. Row `seq` (1-based, commit order) has event key `<uid>-<label>-<seq:06>`,
/// aggregate `o-<seq mod keys>`, and a ~100-byte JSON payload with `seq` and the per-aggregate
/// sequence number `key_seq`. Returns the transaction's GTID.
async fn insert_big_transaction(
    conn: &mut Conn,
    uid: &str,
    label: &str,
    rows: u64,
    keys: u64,
) -> Result<String> {
    conn.exec_drop(
        format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, event_key, payload, \
             created_at) \
             SELECT 'Order', CONCAT('o-', LPAD(seq MOD {keys}, 2, '0')), 'OrderCreated', \
             CONCAT(?, LPAD(seq, 6, '0')), \
             CONCAT('{{\"seq\":', seq, ',\"key_seq\":', (seq + {keys} - 1) DIV {keys}, \
             ',\"pad\":\"', REPEAT('x', 60), '\"}}'), UTC_TIMESTAMP(6) \
             FROM {} ORDER BY seq",
            integer_sequence(rows)
        ),
        (format!("{uid}-{label}-"),),
    )
    .await
    .with_context(|| format!("inserting {rows} rows in one transaction"))?;
    last_gtid(conn).await
}

fn big_event_key(uid: &str, label: &str, seq: u64) -> String {
    format!("{uid}-{label}-{seq:06}")
}

/// Checks the records of [`insert_big_transaction`]: the key matches the row's `seq`, the value
/// is the payload text the server stores for the row (`stored`, from [`stored_payloads`]: MySQL
/// normalises JSON) and holds the row's `seq` and `key_seq`.
fn check_big_records(
    records: &[Record],
    stored: &HashMap<String, Option<String>>,
    uid: &str,
    label: &str,
    keys: u64,
) -> Result<()> {
    let prefix = format!("{uid}-{label}-");
    let mut problems = Vec::new();
    for r in records {
        let Some(seq) = r
            .header("event_key")
            .and_then(|ek| ek.strip_prefix(&prefix))
            .and_then(|s| s.parse::<u64>().ok())
        else {
            problems.push(format!("unexpected record {r:?}"));
            continue;
        };
        let key = format!("o-{:02}", seq % keys);
        if r.key_str() != Some(key.as_str()) {
            problems.push(format!(
                "seq {seq}: key {:?}, expected {key:?}",
                r.key_str()
            ));
        }
        let event_key = big_event_key(uid, label, seq);
        let want = stored.get(&event_key).cloned().flatten();
        let parsed: Option<serde_json::Value> =
            r.value_str().and_then(|v| serde_json::from_str(v).ok());
        let numbers = parsed
            .as_ref()
            .map(|v| (v["seq"].as_u64(), v["key_seq"].as_u64()));
        if want.is_none()
            || r.value_str() != want.as_deref()
            || numbers != Some((Some(seq), Some(seq.div_ceil(keys))))
        {
            problems.push(format!(
                "seq {seq}: value {:?}, the server stores {want:?}",
                r.value_str()
            ));
        }
        if problems.len() > 20 {
            break;
        }
    }
    ensure!(
        problems.is_empty(),
        "records differ from the rows:\n  {}",
        problems.join("\n  ")
    );
    Ok(())
}

/// Commit order of the big transaction's event keys (their `seq`).
fn big_order(uid: &str, label: &str, rows: u64) -> HashMap<String, usize> {
    (1..=rows)
        .map(|s| {
            (
                big_event_key(uid, label, s),
                usize::try_from(s).unwrap_or(usize::MAX),
            )
        })
        .collect()
}

/// The first half of [`insert_big_transaction`]'s callers: the binlog position before it, then
/// the transaction of `rows` rows labelled `big`; returns (that position, its GTID).
async fn insert_big(
    conn: &mut Conn,
    uid: &str,
    rows: u64,
    keys: u64,
) -> Result<(BinlogPosition, String)> {
    let before = current_binlog_position(conn).await?;
    let gtid = insert_big_transaction(conn, uid, "big", rows, keys).await?;
    Ok((before, gtid))
}

/// The event keys of [`insert_big`]'s transaction of `rows` rows.
fn big_keys(uid: &str, rows: u64) -> HashSet<String> {
    (1..=rows).map(|s| big_event_key(uid, "big", s)).collect()
}

/// [`check_big_records`] against the payloads the server stores, and the per-key commit order
/// of [`insert_big`]'s transaction of `rows` rows.
async fn check_big_transaction_records(
    conn: &mut Conn,
    records: &[Record],
    uid: &str,
    rows: u64,
    keys: u64,
) -> Result<()> {
    let stored = stored_payloads(conn, "outbox").await?;
    check_big_records(records, &stored, uid, "big", keys)?;
    ensure_per_key_order(records, &big_order(uid, "big", rows))
}

/// Inserts one outbox row with explicit (possibly NULL) aggregate columns as its own
/// transaction; returns its GTID.
async fn insert_one(
    conn: &mut Conn,
    aggregate_type: Option<&str>,
    aggregate_id: Option<&str>,
    event_key: &str,
    payload: &str,
) -> Result<String> {
    conn.exec_drop(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, event_key, payload, \
         created_at) VALUES (?, ?, 'OrderCreated', ?, ?, UTC_TIMESTAMP(6))",
        (aggregate_type, aggregate_id, event_key, payload),
    )
    .await
    .with_context(|| format!("inserting {event_key}"))?;
    last_gtid(conn).await
}

/// Lets the outbox take rows the relay cannot route (NULL aggregate columns).
async fn allow_null_aggregates(conn: &mut Conn) -> Result<()> {
    conn.query_drop(
        "ALTER TABLE outbox MODIFY aggregate_type VARCHAR(255) NULL, \
         MODIFY aggregate_id VARCHAR(255) NULL",
    )
    .await?;
    Ok(())
}

/// The transaction with `gtid`, searched from `from`.
async fn transaction(
    conn: &mut Conn,
    from: &BinlogPosition,
    gtid: &str,
) -> Result<BinlogTransaction> {
    find_transaction(conn, from, gtid)
        .await?
        .with_context(|| format!("transaction {gtid} not found in the binlog after {from}"))
}

/// Commits `batches` transactions of `rows_per_tx` rows from `gen`; returns their event keys,
/// commit order, and the last transaction.
async fn write_batches(
    conn: &mut Conn,
    gen: &mut RowGen,
    batches: usize,
    rows_per_tx: usize,
    order: &mut HashMap<String, usize>,
) -> Result<(HashSet<String>, BinlogTransaction)> {
    let mut keys = HashSet::new();
    let mut last = None;
    for _ in 0..batches {
        let before = current_binlog_position(conn).await?;
        let rows = gen.rows(rows_per_tx);
        let gtid = commit_rows(conn, &rows).await?;
        for r in &rows {
            let n = order.len();
            order.insert(r.event_key.clone(), n);
            keys.insert(r.event_key.clone());
        }
        last = Some((before, gtid));
    }
    let (before, gtid) = last.context("no batches")?;
    let tx = transaction(conn, &before, &gtid).await?;
    Ok((keys, tx))
}

/// Reads `topics` until every key of `wanted` is there ([`World::wait_for_keys`]).
async fn wait_for_keys(
    w: &World,
    topics: &[String],
    wanted: &HashSet<String>,
    relay: Option<&RelayProcess>,
) -> Result<Vec<Record>> {
    w.wait_for_keys(topics, wanted, relay, RELAY_WAIT).await
}

/// A graceful stop that must exit 0.
async fn stop_cleanly(relay: &RelayProcess) -> Result<()> {
    let status = relay.stop(STOP).await?;
    expect_exit_code(status, 0, relay)
}

/// Waits until `relay`'s checkpoint covers `end` ([`World::wait_checkpoint_covers`]), then
/// [`stop_cleanly`].
async fn covered_then_stop(w: &World, relay: &RelayProcess, end: &BinlogPosition) -> Result<()> {
    w.wait_checkpoint_covers(relay, end, RELAY_WAIT).await?;
    stop_cleanly(relay).await
}

/// The start of the streaming tests ([`streaming`]): the world, its `Order` topic, a
/// connection, a row generator and the commit order of the rows written.
type Streaming = (World, Vec<String>, Conn, RowGen, HashMap<String, usize>);

/// World `name` whose relay checkpoints every 200 ms; rows labelled `label` over `keys`
/// aggregates.
async fn streaming(name: &str, label: &str, keys: usize) -> Result<Streaming> {
    let mut w = World::new(bin(), name).await?;
    w.spec.checkpoint_interval_ms = 200;
    let topics = vec![w.topic("Order")];
    let conn = w.db.conn().await?;
    let gen = RowGen::new(&w.uid, label, keys);
    Ok((w, topics, conn, gen, HashMap::new()))
}

/// Every record on `topics` of `w`'s broker ([`read_all_records`]).
async fn read_all(w: &World, topics: &[String]) -> Result<Vec<Record>> {
    read_all_records(&w.spec.bootstrap_servers, topics, READ_ALL).await
}

/// `(a.position, a.rows_acked) <= (b.position, b.rows_acked)`.
async fn checkpoint_le(conn: &mut Conn, a: &Checkpoint, b: &Checkpoint) -> Result<bool> {
    let order = compare_positions(conn, &a.position(), &b.position()).await?;
    Ok(order.then(a.rows_acked.cmp(&b.rows_acked)).is_le())
}

// ---------------------------------------------------------------------------------------------
// Large transactions
// ---------------------------------------------------------------------------------------------

/// One transaction of 100,000 outbox rows; kill -9 while 20–80 % of its records are on Kafka.
/// The state row then holds a mid-transaction checkpoint (the boundary before the transaction
/// plus `rows_acked` > 0). After a restart every row is on Kafka, per key in commit order, and
/// the duplicates are at most what relay 1 had produced past its stored `rows_acked`:
///
///   duplicates ≤ (records on Kafka at the kill − rows_acked stored at the kill) + max_in_flight
///
/// (relay 1 can have had at most `max_in_flight` more records in flight that the broker still
/// appended after the kill). Once the relay has read the commit, its final checkpoint after
/// SIGTERM is the transaction's end (or a later boundary) with `rows_acked` = 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_transaction_resumes_exactly_after_kill_9() -> Result<()> {
    const ROWS: u64 = 100_000;
    const KEYS: u64 = 50;
    const MAX_IN_FLIGHT: u64 = 2_000;
    let mut w = World::new(bin(), "bigkill").await?;
    w.spec.max_in_flight = usize::try_from(MAX_IN_FLIGHT)?;
    w.spec.checkpoint_interval_ms = 200;
    let bs = w.spec.bootstrap_servers.clone();
    let topics = vec![w.topic("Order")];
    let (relay1, _) = w.start(STARTUP).await?;
    let mut conn = w.db.conn().await?;

    let inserting = Instant::now();
    let (before, gtid) = insert_big(&mut conn, &w.uid, ROWS, KEYS).await?;
    eprintln!(
        "{ROWS} rows committed in {:.1} s as {gtid}",
        inserting.elapsed().as_secs_f64()
    );

    let (low, high) = (ROWS / 5, ROWS * 4 / 5);
    // Kill once 20 % of the records are on Kafka AND a checkpoint inside the transaction is
    // stored: what the test checks needs both, and on a loaded machine the first mid-transaction
    // checkpoint can come after the 20 % mark.
    let reached = wait_until(
        "20 % of the transaction's records on Kafka and a mid-transaction checkpoint",
        RELAY_WAIT,
        Duration::from_millis(10),
        async || {
            relay1.ensure_running()?;
            let n = high_watermark_total(&bs, &topics).await?;
            if n < low {
                return Ok(None);
            }
            Ok((w.checkpoint().await?.rows_acked > 0).then_some(n))
        },
    )
    .await?;
    relay1.kill9()?;
    let on_kafka_at_kill = high_watermark_total(&bs, &topics).await?;
    let stored = w.checkpoint().await?;
    eprintln!(
        "killed at {reached}..{on_kafka_at_kill} records on Kafka; stored checkpoint {} + {} rows",
        stored.position(),
        stored.rows_acked
    );
    ensure!(
        on_kafka_at_kill <= high,
        "the relay got {on_kafka_at_kill} of {ROWS} records to Kafka before the kill landed (the \
         test needs it between {low} and {high}): cannot check a mid-transaction resume"
    );
    ensure!(
        stored.rows_acked > 0,
        "with {on_kafka_at_kill} of the transaction's records on Kafka and checkpoints every \
         200 ms, the stored checkpoint has rows_acked = 0 ({}): no mid-transaction checkpoint",
        stored.position()
    );
    ensure!(
        stored.rows_acked <= on_kafka_at_kill,
        "the checkpoint claims {} rows acknowledged but only {on_kafka_at_kill} records are on Kafka",
        stored.rows_acked
    );
    let tx = transaction(&mut conn, &before, &gtid).await?;
    ensure!(
        compare_positions(&mut conn, &stored.position(), &tx.start)
            .await?
            .is_le(),
        "a checkpoint with rows_acked = {} must be the boundary before the transaction \
         (which starts at {}), is {}",
        stored.rows_acked,
        tx.start,
        stored.position()
    );
    w.ensure_boundary(&stored).await?;

    let relay2 = w.spawn()?;
    let wanted = big_keys(&w.uid, ROWS);
    wait_for_keys(&w, &topics, &wanted, Some(&relay2)).await?;
    relay2.ensure_running()?;
    covered_then_stop(&w, &relay2, &tx.end).await?;
    let last = w.checkpoint().await?;
    w.ensure_boundary(&last).await?;
    ensure!(
        last.rows_acked == 0,
        "after the transaction's commit was read, the final checkpoint {} has rows_acked = {} \
         (expected 0: it is a transaction boundary after everything)",
        last.position(),
        last.rows_acked
    );
    ensure!(
        compare_positions(&mut conn, &last.position(), &tx.end)
            .await?
            .is_ge(),
        "final checkpoint {} is before the transaction's end {}",
        last.position(),
        tx.end
    );

    let records = read_all_records(&bs, &topics, READ_ALL).await?;
    let duplicates = u64::try_from(ensure_at_least_once(&records, &wanted)?)?;
    let bound = on_kafka_at_kill - stored.rows_acked + MAX_IN_FLIGHT;
    eprintln!(
        "{} records for {ROWS} rows: {duplicates} duplicates (bound {bound})",
        records.len()
    );
    ensure!(
        duplicates <= bound,
        "{duplicates} duplicates after the kill; at most (records on Kafka at the kill \
         {on_kafka_at_kill} − rows_acked stored at the kill {}) + max_in_flight {MAX_IN_FLIGHT} \
         = {bound} may be sent again",
        stored.rows_acked
    );
    check_big_transaction_records(&mut conn, &records, &w.uid, ROWS, KEYS).await?;

    drop(conn);
    w.db.drop_database().await
}

/// One transaction of 30,000 rows; SIGTERM while part of it is on Kafka. The relay exits 0
/// with a mid-transaction checkpoint whose `rows_acked` is exactly the number of records it
/// produced; a restart sends every row exactly once in total.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_stop_inside_a_large_transaction_has_no_duplicates() -> Result<()> {
    const ROWS: u64 = 30_000;
    const KEYS: u64 = 50;
    let mut w = World::new(bin(), "bigterm").await?;
    // A small window keeps relaying the transaction (a few seconds) slower than noticing 10 %
    // of it on Kafka and signalling: with 1,000 the relay once sent all 30,000 rows before the
    // SIGTERM arrived (MariaDB 11.4, 2026-12-05), and the stop then had no transaction to land
    // inside.
    w.spec.max_in_flight = 20;
    w.spec.checkpoint_interval_ms = 200;
    let bs = w.spec.bootstrap_servers.clone();
    let topics = vec![w.topic("Order")];
    let (relay1, _) = w.start(STARTUP).await?;
    let mut conn = w.db.conn().await?;

    let (before, gtid) = insert_big(&mut conn, &w.uid, ROWS, KEYS).await?;
    let reached = wait_until(
        "10 % of the transaction's records on Kafka",
        RELAY_WAIT,
        Duration::from_millis(10),
        async || {
            relay1.ensure_running()?;
            let n = high_watermark_total(&bs, &topics).await?;
            Ok((n >= ROWS / 10).then_some(n))
        },
    )
    .await?;
    let stopping = Instant::now();
    stop_cleanly(&relay1).await?;
    eprintln!(
        "SIGTERM at {reached} records on Kafka; stopped in {:.2} s",
        stopping.elapsed().as_secs_f64()
    );
    let on_kafka = high_watermark_total(&bs, &topics).await?;
    let stored = w.checkpoint().await?;
    eprintln!(
        "after the stop: {on_kafka} records on Kafka, checkpoint {} + {} rows",
        stored.position(),
        stored.rows_acked
    );
    ensure!(
        stored.rows_acked > 0 && stored.rows_acked < ROWS,
        "the stop landed at {reached} of {ROWS} records on Kafka, but the final checkpoint is {} \
         with rows_acked = {} (expected a mid-transaction checkpoint, 0 < rows_acked < {ROWS})",
        stored.position(),
        stored.rows_acked
    );
    ensure!(
        stored.rows_acked == on_kafka,
        "after a graceful stop every produced record is acknowledged and counted: {on_kafka} \
         records on Kafka but rows_acked = {}",
        stored.rows_acked
    );
    let tx = transaction(&mut conn, &before, &gtid).await?;
    ensure!(
        compare_positions(&mut conn, &stored.position(), &tx.start)
            .await?
            .is_le(),
        "the mid-transaction checkpoint {} is not the boundary before the transaction (starts at {})",
        stored.position(),
        tx.start
    );
    w.ensure_boundary(&stored).await?;

    // Resumed by file and position, skipping the rows_acked rows of the transaction after it
    // (the kill -9 test resumes by GTID, the default).
    let relay2 = w.spawn_with(&RelayConfigSpec {
        resume: Some("position".into()),
        ..w.spec.clone()
    })?;
    let wanted = big_keys(&w.uid, ROWS);
    wait_for_keys(&w, &topics, &wanted, Some(&relay2)).await?;
    covered_then_stop(&w, &relay2, &tx.end).await?;

    let records = read_all_records(&bs, &topics, READ_ALL).await?;
    ensure_exactly_once(&records, &wanted)?;
    check_big_transaction_records(&mut conn, &records, &w.uid, ROWS, KEYS).await?;
    let last = w.checkpoint().await?;
    ensure!(
        last.rows_acked == 0,
        "final checkpoint {} has rows_acked = {}",
        last.position(),
        last.rows_acked
    );
    w.ensure_boundary(&last).await?;

    drop(conn);
    w.db.drop_database().await
}

// ---------------------------------------------------------------------------------------------
// Binlog rotation
// ---------------------------------------------------------------------------------------------

/// `FLUSH BINARY LOGS` between transactions while the relay runs (twice in a row once), and
/// while it is stopped: every row exactly once; once the relay has seen the last transaction
/// its checkpoint is in the newest binlog file, exactly as `SHOW BINARY LOGS` names it, at a
/// transaction boundary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binlog_rotation_mid_stream() -> Result<()> {
    let (w, topics, mut conn, mut gen, mut order) = streaming("rotate", "rot", 5).await?;
    let mut all = HashSet::new();

    let (relay1, _) = w.start(STARTUP).await?;
    for i in 0..8 {
        let (keys, _) = write_batches(&mut conn, &mut gen, 1, 5, &mut order).await?;
        all.extend(keys);
        if i % 2 == 1 {
            conn.query_drop("FLUSH BINARY LOGS").await?;
        }
        if i == 3 {
            conn.query_drop("FLUSH BINARY LOGS").await?;
        }
    }
    let (keys, last_tx) = write_batches(&mut conn, &mut gen, 1, 5, &mut order).await?;
    all.extend(keys);
    wait_for_keys(&w, &topics, &all, Some(&relay1)).await?;
    let cp = w
        .wait_checkpoint_covers(&relay1, &last_tx.end, RELAY_WAIT)
        .await?;
    let newest = newest_binlog_file(&mut conn).await?;
    ensure!(
        cp.binlog_file == last_tx.end.file && cp.binlog_file == newest,
        "after the last transaction ({} .. {}) the checkpoint is in {:?}; the newest binlog is {newest:?}",
        last_tx.start,
        last_tx.end,
        cp.binlog_file
    );
    w.ensure_boundary(&cp).await?;

    // Stopped across rotations: the relay resumes in an older file and reads through them.
    stop_cleanly(&relay1).await?;
    conn.query_drop("FLUSH BINARY LOGS").await?;
    let (keys, _) = write_batches(&mut conn, &mut gen, 2, 5, &mut order).await?;
    all.extend(keys);
    conn.query_drop("FLUSH BINARY LOGS").await?;
    conn.query_drop("FLUSH BINARY LOGS").await?;
    let (keys, _) = write_batches(&mut conn, &mut gen, 2, 5, &mut order).await?;
    all.extend(keys);

    // Resumed by file and position (the default resumes by GTID).
    let relay2 = w.spawn_with(&RelayConfigSpec {
        resume: Some("position".into()),
        ..w.spec.clone()
    })?;
    wait_for_keys(&w, &topics, &all, Some(&relay2)).await?;
    let (keys, _) = write_batches(&mut conn, &mut gen, 2, 5, &mut order).await?;
    all.extend(keys);
    conn.query_drop("FLUSH BINARY LOGS").await?;
    let (keys, last_tx) = write_batches(&mut conn, &mut gen, 2, 5, &mut order).await?;
    all.extend(keys);
    wait_for_keys(&w, &topics, &all, Some(&relay2)).await?;
    let cp = w
        .wait_checkpoint_covers(&relay2, &last_tx.end, RELAY_WAIT)
        .await?;
    let newest = newest_binlog_file(&mut conn).await?;
    ensure!(
        cp.binlog_file == last_tx.end.file && cp.binlog_file == newest,
        "after the restart and more rotations the checkpoint is in {:?}; the last transaction \
         ends at {}, the newest binlog is {newest:?}",
        cp.binlog_file,
        last_tx.end
    );
    w.ensure_boundary(&cp).await?;
    stop_cleanly(&relay2).await?;

    let records = read_all(&w, &topics).await?;
    ensure_exactly_once(&records, &all)?;
    ensure_per_key_order(&records, &order)?;
    let last = w.checkpoint().await?;
    w.ensure_boundary(&last).await?;

    drop(conn);
    w.db.drop_database().await
}

// ---------------------------------------------------------------------------------------------
// One active instance per connector
// ---------------------------------------------------------------------------------------------

/// Records every checkpoint the state row shows (polling every 50 ms) until told to stop.
fn sample_checkpoints(
    w: &World,
    mut stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<Result<Vec<Checkpoint>>> {
    let pool = w.db.pool().clone();
    let connector = w.connector().to_owned();
    tokio::spawn(async move {
        let mut seen: Vec<Checkpoint> = Vec::new();
        loop {
            if let Some(cp) = read_checkpoint(&pool, DEFAULT_CHECKPOINT_TABLE, &connector).await? {
                if seen.last() != Some(&cp) {
                    seen.push(cp);
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                _ = stop.changed() => break,
            }
        }
        Ok(seen)
    })
}

/// Checks that the sampled checkpoints never went backwards.
async fn ensure_no_regression(conn: &mut Conn, samples: &[Checkpoint]) -> Result<()> {
    for pair in samples.windows(2) {
        ensure!(
            checkpoint_le(conn, &pair[0], &pair[1]).await?,
            "the checkpoint went backwards: {} + {} rows, then {} + {} rows",
            pair[0].position(),
            pair[0].rows_acked,
            pair[1].position(),
            pair[1].rows_acked
        );
    }
    Ok(())
}

/// A second instance of the same connector (own server id) stands by while the first streams
/// (it does not even register as a replica); after kill -9 of the first it takes the lease
/// within 10 s (new lease token, its own `lease_owner`) and relays on from the stored
/// checkpoint. Every row arrives; the checkpoint never goes backwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_instance_waits_and_takes_over_after_kill_9() -> Result<()> {
    let (w, topics, mut conn, mut gen, mut order) = streaming("lease", "ls", 4).await?;
    let spec_b = RelayConfigSpec {
        server_id: next_server_id(),
        ..w.spec.clone()
    };

    let (relay_a, _) = w.start(STARTUP).await?;
    let st_a = w.state().await?;
    ensure!(
        st_a.lease_owner_pid() == Some(relay_a.pid()),
        "lease_owner {:?} is not relay A (pid {})",
        st_a.lease_owner,
        relay_a.pid()
    );
    let (stop_tx, stop_rx) = watch::channel(false);
    let sampler = sample_checkpoints(&w, stop_rx);

    let relay_b = w.spawn_with(&spec_b)?;
    wait_for_stderr(&relay_b, "standing by", STARTUP).await?;
    let st = w.state().await?;
    ensure!(
        st.lease_owner_pid() == Some(relay_a.pid()) && st.lease_token == st_a.lease_token,
        "while B stands by the row must stay A's: {st:?} (A is pid {}, token {})",
        relay_a.pid(),
        st_a.lease_token
    );
    let replicas = registered_replica_ids(&mut conn).await?;
    ensure!(
        !replicas.contains(&spec_b.server_id),
        "B (server_id {}) is registered as a replica while standing by: {replicas:?}",
        spec_b.server_id
    );

    let (batch1, last1) = write_batches(&mut conn, &mut gen, 5, 4, &mut order).await?;
    wait_for_keys(&w, &topics, &batch1, Some(&relay_a)).await?;
    w.wait_checkpoint_covers(&relay_a, &last1.end, RELAY_WAIT)
        .await?;
    let records = read_all(&w, &topics).await?;
    ensure_exactly_once(&records, &batch1).context("while only A streams")?;
    relay_b.ensure_running()?;
    ensure!(
        !relay_b.stderr_text().contains("lease acquired"),
        "B acquired the lease while A holds it:\n{}",
        relay_b.stderr_tail()
    );

    relay_a.kill9()?;
    let killed = Instant::now();
    let st_b = wait_until(
        "B to take the lease",
        Duration::from_secs(30),
        Duration::from_millis(50),
        async || {
            relay_b.ensure_running()?;
            let st = w.state().await?;
            Ok(
                (st.lease_token > st_a.lease_token && st.lease_owner_pid() == Some(relay_b.pid()))
                    .then_some(st),
            )
        },
    )
    .await?;
    let takeover = killed.elapsed();
    wait_for_stderr(&relay_b, "lease acquired", Duration::from_secs(10)).await?;
    eprintln!(
        "B took over {:.2} s after kill -9 of A (token {} → {})",
        takeover.as_secs_f64(),
        st_a.lease_token,
        st_b.lease_token
    );
    ensure!(
        takeover <= Duration::from_secs(10),
        "B needed {:.1} s to take over after A died (expected within ~10 s)",
        takeover.as_secs_f64()
    );

    let (batch2, last2) = write_batches(&mut conn, &mut gen, 5, 4, &mut order).await?;
    let all: HashSet<String> = batch1.union(&batch2).cloned().collect();
    wait_for_keys(&w, &topics, &all, Some(&relay_b)).await?;
    covered_then_stop(&w, &relay_b, &last2.end).await?;
    stop_tx.send_replace(true);
    let samples = sampler.await??;
    ensure_no_regression(&mut conn, &samples).await?;

    let records = read_all(&w, &topics).await?;
    let dups = ensure_at_least_once(&records, &all)?;
    ensure_per_key_order(&records, &order)?;
    eprintln!(
        "{} records for {} rows ({dups} duplicates); {} distinct checkpoints sampled",
        records.len(),
        all.len(),
        samples.len()
    );
    let last = w.checkpoint().await?;
    w.ensure_boundary(&last).await?;

    drop(conn);
    w.db.drop_database().await
}

/// Another instance takes over (simulated: the test bumps `lease_token` in the row and holds
/// the lease lock). The old instance's next checkpoint write matches no row: it logs "lease
/// lost", releases the lease lock and goes back to waiting, and the row keeps the position and
/// token the test left. When the test releases the lock, the instance takes the lease again,
/// resumes from the stored position and relays the rows committed meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_instance_cannot_overwrite_a_newer_checkpoint() -> Result<()> {
    let (w, topics, mut conn, mut gen, mut order) = streaming("fence", "fn", 4).await?;

    let (relay, _) = w.start(STARTUP).await?;
    let (warmup, warm_tx) = write_batches(&mut conn, &mut gen, 2, 3, &mut order).await?;
    wait_for_keys(&w, &topics, &warmup, Some(&relay)).await?;
    w.wait_checkpoint_covers(&relay, &warm_tx.end, RELAY_WAIT)
        .await?;

    // The "other instance": waits for the lease lock on its own connection.
    let lock = lease_lock_name(w.db.name(), DEFAULT_CHECKPOINT_TABLE, w.connector());
    let mut holder = Conn::from_url(mysql_url(None)).await?;
    let holder_id = u64::from(holder.id());
    let lock_for_task = lock.clone();
    let lock_task = tokio::spawn(async move {
        let got: Option<i64> = holder
            .exec_first("SELECT GET_LOCK(?, 120)", (lock_for_task,))
            .await?;
        anyhow::Ok((holder, got))
    });
    wait_until(
        "the test's GET_LOCK to wait for the relay's lease",
        Duration::from_secs(10),
        Duration::from_millis(20),
        async || {
            let st = connection_state(&mut conn, holder_id).await?;
            Ok(st.filter(|(state, _)| state == "User lock").map(|_| ()))
        },
    )
    .await?;

    conn.exec_drop(
        format!(
            "UPDATE {DEFAULT_CHECKPOINT_TABLE} SET lease_token = lease_token + 1, \
             lease_owner = 'usurper:1' WHERE connector_name = ?"
        ),
        (w.connector(),),
    )
    .await?;
    let usurped = w.state().await?;
    let (batch, batch_tx) = write_batches(&mut conn, &mut gen, 3, 3, &mut order).await?;

    let stderr = wait_for_stderr(&relay, "lease lost", Duration::from_secs(60)).await?;
    let (holder, got) = tokio::time::timeout(Duration::from_secs(30), lock_task)
        .await
        .context("the relay did not release its lease lock after losing the lease")???;
    ensure!(
        got == Some(1),
        "GET_LOCK returned {got:?}; expected 1 once the relay released the lease"
    );
    let lost_at = stderr.find("lease lost").unwrap_or(0);
    wait_until(
        "the relay to stand by after losing the lease",
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || {
            relay.ensure_running()?;
            Ok(relay.stderr_text()[lost_at..]
                .contains("standing by")
                .then_some(()))
        },
    )
    .await?;
    // How much of the batch the relay produced before its write was refused depends on when
    // its next checkpoint tick came (other tests' transactions make it write too); the row
    // must not have moved either way.
    let now = w.state().await?;
    ensure!(
        now.position() == usurped.position()
            && now.rows_acked == usurped.rows_acked
            && now.lease_token == usurped.lease_token
            && now.lease_owner == usurped.lease_owner,
        "the stale instance changed the row after losing the lease: it was {usurped:?}, is {now:?}"
    );
    ensure!(
        compare_positions(&mut conn, &now.position(), &batch_tx.end)
            .await?
            .is_lt(),
        "the row's position {} should still be before the batch (ends at {})",
        now.position(),
        batch_tx.end
    );

    // The other instance goes away: the relay takes the lease back and resumes from the
    // stored position.
    let mut holder = holder;
    holder
        .exec_drop("DO RELEASE_LOCK(?)", (lock.as_str(),))
        .await?;
    holder.disconnect().await?;
    wait_until(
        "the relay to take the lease back",
        Duration::from_secs(30),
        Duration::from_millis(50),
        async || {
            relay.ensure_running()?;
            let st = w.state().await?;
            Ok(
                (st.lease_token > usurped.lease_token && st.lease_owner_pid() == Some(relay.pid()))
                    .then_some(()),
            )
        },
    )
    .await?;
    wait_for_keys(&w, &topics, &batch, Some(&relay)).await?;
    covered_then_stop(&w, &relay, &batch_tx.end).await?;

    let all: HashSet<String> = warmup.union(&batch).cloned().collect();
    let records = read_all(&w, &topics).await?;
    ensure_at_least_once(&records, &all)?;
    ensure_per_key_order(&records, &order)?;

    drop(conn);
    w.db.drop_database().await
}

// ---------------------------------------------------------------------------------------------
// Rows that cannot be relayed
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bad {
    NullAggregateType,
    TopicWithSpace,
    NullAggregateId,
    TooLarge,
}

struct BadRow {
    kind: Bad,
    aggregate_type: Option<&'static str>,
    aggregate_id: Option<&'static str>,
    event_key: String,
    payload: String,
    tx: BinlogTransaction,
}

/// Good rows, then rows with a NULL aggregate type, an aggregate type with a space (no valid
/// topic), a NULL aggregate id and a payload over `message.max.bytes` (2000), then more good
/// rows. With `[dead_letter] enabled`, the good rows arrive on their topic exactly once, each bad
/// row arrives once on the dead-letter topic with the record's key and headers, its value
/// unless its size was the problem, and `dlq_*` headers naming the reason, the intended topic,
/// the table and the exact end of its Write_rows event; the relay keeps going.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_topic_receives_unrelayable_rows() -> Result<()> {
    let mut w = World::new(bin(), "dlq").await?;
    let dlq = format!("t_{}.dead_letter", w.uid);
    w.spec.dead_letter_topic = Some(dlq.clone());
    w.spec
        .kafka_properties
        .push(("message.max.bytes".into(), "2000".into()));
    let order_topic = w.topic("Order");
    let table = w.db.outbox_table();
    let mut conn = w.db.conn().await?;
    allow_null_aggregates(&mut conn).await?;

    let (relay, _) = w.start(STARTUP).await?;
    let mut good = HashSet::new();
    let mut bad = Vec::new();
    let good_payload = |i: usize| format!(r#"{{"good":{i}}}"#);
    let plan: [(Option<Bad>, Option<&'static str>, Option<&'static str>); 7] = [
        (None, Some("Order"), Some("o-1")),
        (Some(Bad::NullAggregateType), None, Some("o-2")),
        (Some(Bad::TopicWithSpace), Some("Bad Type"), Some("o-3")),
        (None, Some("Order"), Some("o-1")),
        (Some(Bad::NullAggregateId), Some("Order"), None),
        (Some(Bad::TooLarge), Some("Order"), Some("o-4")),
        (None, Some("Order"), Some("o-2")),
    ];
    let mut last_tx = None;
    for (i, (kind, agg_type, agg_id)) in plan.into_iter().enumerate() {
        let event_key = format!("{}-dl-{i}", w.uid);
        let payload = match kind {
            Some(Bad::TooLarge) => format!(r#"{{"blob":"{}"}}"#, "x".repeat(5_000)),
            _ => good_payload(i),
        };
        let before = current_binlog_position(&mut conn).await?;
        let gtid = insert_one(&mut conn, agg_type, agg_id, &event_key, &payload).await?;
        let tx = transaction(&mut conn, &before, &gtid).await?;
        match kind {
            None => {
                good.insert(event_key);
            }
            Some(kind) => bad.push(BadRow {
                kind,
                aggregate_type: agg_type,
                aggregate_id: agg_id,
                event_key,
                payload,
                tx: tx.clone(),
            }),
        }
        last_tx = Some(tx);
    }
    let last_tx = last_tx.context("nothing written")?;

    wait_for_keys(&w, std::slice::from_ref(&order_topic), &good, Some(&relay)).await?;
    let dead = collect_records(
        &w.spec.bootstrap_servers,
        std::slice::from_ref(&dlq),
        bad.len(),
        RELAY_WAIT,
    )
    .await?;
    relay.ensure_running()?;
    covered_then_stop(&w, &relay, &last_tx.end).await?;

    let records = read_all(&w, std::slice::from_ref(&order_topic)).await?;
    ensure_exactly_once(&records, &good)?;
    let topics = list_topics(&w.spec.bootstrap_servers, &w.topic_prefix()).await?;
    let expected_topics: std::collections::BTreeSet<String> =
        [order_topic.clone(), dlq.clone()].into_iter().collect();
    ensure!(
        topics == expected_topics,
        "topics of this test: {topics:?}, expected {expected_topics:?}"
    );
    let dead = read_all(&w, std::slice::from_ref(&dlq))
        .await
        .unwrap_or(dead);

    let stored = stored_payloads(&mut conn, "outbox").await?;
    let mut problems = Vec::new();
    ensure!(
        dead.len() == bad.len(),
        "{} dead letters for {} bad rows:\n{}",
        dead.len(),
        bad.len(),
        dead.iter()
            .map(describe_record)
            .collect::<Vec<_>>()
            .join("\n")
    );
    for b in &bad {
        let writes = b.tx.write_rows_events(w.db.name(), "outbox");
        let [wr] = writes.as_slice() else {
            bail!("expected one Write_rows event in {:?}", b.tx);
        };
        // The rows event's end, or where the server logs none (MariaDB 11.4+) the start of
        // its transaction: see BinlogTransaction::relay_row_position.
        let named = b.tx.relay_row_position(wr);
        let at = format!("{}:{}", named.file, named.pos);
        let Some(d) = dead.iter().find(|d| {
            d.header("dlq_binlog_file") == Some(named.file.as_str())
                && d.header("dlq_binlog_pos") == Some(named.pos.to_string().as_str())
        }) else {
            problems.push(format!(
                "{:?} ({}): no dead letter with dlq_binlog_file/dlq_binlog_pos = {at}; dead \
                 letters name {:?}",
                b.kind,
                b.event_key,
                dead.iter()
                    .map(|d| (d.header("dlq_binlog_file"), d.header("dlq_binlog_pos")))
                    .collect::<Vec<_>>()
            ));
            continue;
        };
        let mut check = |what: &str, ok: bool, got: String| {
            if !ok {
                problems.push(format!(
                    "{:?} ({}) at {at}: {what}; got {got}",
                    b.kind, b.event_key
                ));
            }
        };
        if wr.end_logged {
            let ev =
                write_rows_event_ending_at(&mut conn, &wr.log_name, wr.end_log_pos, None).await?;
            check(
                "dlq_binlog_pos must be the End_log_pos of a Write_rows event",
                ev.is_some(),
                format!("{ev:?}"),
            );
        } else {
            check(
                "dlq_binlog_pos must be the start of the row's transaction (the server logs no \
                 end for its rows event)",
                named.pos < b.tx.end.pos && named.pos > b.tx.start.pos,
                format!(
                    "{named:?} for a transaction {:?}..{:?}",
                    b.tx.start, b.tx.end
                ),
            );
        }
        check(
            "dlq_table must be the outbox table",
            d.header("dlq_table") == Some(table.as_str()),
            format!("{:?}", d.header("dlq_table")),
        );
        let reason = d
            .header("dlq_reason")
            .unwrap_or_default()
            .to_ascii_lowercase();
        let reason_word = match b.kind {
            Bad::NullAggregateType => "aggregate_type",
            Bad::TopicWithSpace => "topic",
            Bad::NullAggregateId => "aggregate_id",
            Bad::TooLarge => "size",
        };
        check(
            &format!("dlq_reason must say why (mention {reason_word:?})"),
            reason.contains(reason_word),
            format!("{:?}", d.header("dlq_reason")),
        );
        check(
            "a dlq_topic header",
            d.header_count("dlq_topic") == 1,
            format!("{:?}", d.headers),
        );
        if b.kind == Bad::TooLarge {
            check(
                "dlq_topic must be the topic the record was meant for",
                d.header("dlq_topic") == Some(order_topic.as_str()),
                format!("{:?}", d.header("dlq_topic")),
            );
            check(
                "the value must be dropped (its size was the problem)",
                d.value.is_none(),
                format!("{} bytes", d.value.as_ref().map_or(0, Vec::len)),
            );
        } else {
            let want = stored.get(&b.event_key).cloned().flatten();
            let as_json = |t: &str| serde_json::from_str::<serde_json::Value>(t).ok();
            check(
                "the server stores the inserted JSON",
                want.as_deref().and_then(as_json).is_some()
                    && want.as_deref().and_then(as_json) == as_json(&b.payload),
                format!("{want:?} for {:?}", b.payload),
            );
            check(
                "the value must be the row's payload as the server stores it (only a size \
                 problem drops it)",
                want.is_some() && d.value_str() == want.as_deref(),
                format!("{:?}, the server stores {want:?}", d.value_str()),
            );
        }
        check(
            "the record's event_key header",
            d.header("event_key") == Some(b.event_key.as_str()),
            format!("{:?}", d.header("event_key")),
        );
        if let Some(agg_type) = b.aggregate_type {
            check(
                "the record's aggregate_type header",
                d.header("aggregate_type") == Some(agg_type),
                format!("{:?}", d.header("aggregate_type")),
            );
        }
        if let Some(agg_id) = b.aggregate_id {
            check(
                "the record's key (aggregate_id)",
                d.key_str() == Some(agg_id),
                format!("{:?}", d.key_str()),
            );
        }
    }
    ensure!(
        problems.is_empty(),
        "{} problems with the dead letters:\n  {}\n--- dead letters ---\n{}",
        problems.len(),
        problems.join("\n  "),
        dead.iter()
            .map(describe_record)
            .collect::<Vec<_>>()
            .join("\n")
    );

    drop(conn);
    w.db.drop_database().await
}

/// Without a dead-letter topic, a row with a NULL aggregate type stops the relay: exit code 1
/// within a timeout, stderr naming the row's `FILE:POS` (the end of its Write_rows event) and
/// the table. The checkpoint stays before the row's transaction (the good rows before it in the
/// same transaction may be counted in `rows_acked`, the bad one never), nothing after the row
/// is produced, and a restart fails the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unrelayable_row_stops_the_relay_with_its_position() -> Result<()> {
    let w = World::new(bin(), "badrow").await?;
    let order_topic = w.topic("Order");
    let table = w.db.outbox_table();
    let mut conn = w.db.conn().await?;
    allow_null_aggregates(&mut conn).await?;
    let mut gen = RowGen::new(&w.uid, "ok", 3);
    let mut order = HashMap::new();

    let (relay1, _) = w.start(STARTUP).await?;
    let (first, first_tx) = write_batches(&mut conn, &mut gen, 1, 3, &mut order).await?;
    wait_for_keys(
        &w,
        std::slice::from_ref(&order_topic),
        &first,
        Some(&relay1),
    )
    .await?;

    // One transaction: two good rows (one statement), the bad row, one more good row.
    let before = current_binlog_position(&mut conn).await?;
    let good_before = gen.rows(2);
    let good_after = gen.rows(1);
    let bad_key = format!("{}-bad-0", w.uid);
    {
        let mut tx = conn.start_transaction(TxOpts::default()).await?;
        outbox_relay_testkit::insert_outbox_rows(
            &mut tx,
            "outbox",
            &good_before,
            outbox_relay_testkit::InsertStyle::MultiRow,
        )
        .await?;
        tx.exec_drop(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, event_key, payload, \
             created_at) VALUES (NULL, 'o-9', 'OrderCreated', ?, '{\"bad\":true}', UTC_TIMESTAMP(6))",
            (&bad_key,),
        )
        .await?;
        outbox_relay_testkit::insert_outbox_rows(
            &mut tx,
            "outbox",
            &good_after,
            outbox_relay_testkit::InsertStyle::MultiRow,
        )
        .await?;
        tx.commit().await?;
    }
    let gtid = last_gtid(&mut conn).await?;
    let bad_tx = transaction(&mut conn, &before, &gtid).await?;
    let later = gen.rows(2);
    commit_rows(&mut conn, &later).await?;

    let writes = bad_tx.write_rows_events(w.db.name(), "outbox");
    ensure!(
        writes.len() == 3,
        "expected 3 Write_rows events in the transaction, found {writes:?}"
    );
    let named = bad_tx.relay_row_position(writes[1]);
    let bad_at = format!("{}:{}", named.file, named.pos);

    let status = relay1.wait_exit(FAIL_EXIT).await?;
    expect_exit_code(status, 1, &relay1)?;
    let stderr = relay1.stderr_text();
    for needle in [bad_at.as_str(), table.as_str()] {
        ensure!(
            stderr.contains(needle),
            "stderr does not name {needle:?} (the bad row's position is {bad_at}):\n{stderr}"
        );
    }
    let check_checkpoint = async |conn: &mut Conn, when: &str| -> Result<()> {
        let cp = w.checkpoint().await?;
        let order = compare_positions(conn, &cp.position(), &bad_tx.start).await?;
        ensure!(
            order.is_lt() || (order.is_eq() && cp.rows_acked <= 2),
            "{when}: the checkpoint {} + {} rows is not before the bad row (its transaction \
             starts at {} and the bad row is its 3rd outbox row)",
            cp.position(),
            cp.rows_acked,
            bad_tx.start
        );
        ensure!(
            compare_positions(conn, &cp.position(), &first_tx.end)
                .await?
                .is_ge(),
            "{when}: the checkpoint {} went back before the relayed transaction ending at {}",
            cp.position(),
            first_tx.end
        );
        w.ensure_boundary(&cp).await
    };
    check_checkpoint(&mut conn, "after the first failure").await?;

    // A restart hits the same row again.
    let relay2 = w.spawn()?;
    let status = relay2.wait_exit(FAIL_EXIT).await?;
    expect_exit_code(status, 1, &relay2)?;
    let stderr2 = relay2.stderr_text();
    for needle in [bad_at.as_str(), table.as_str()] {
        ensure!(
            stderr2.contains(needle),
            "after a restart stderr does not name {needle:?}:\n{stderr2}"
        );
    }
    check_checkpoint(&mut conn, "after the restart").await?;

    let records = read_all(&w, std::slice::from_ref(&order_topic)).await?;
    let keys: HashSet<&str> = records
        .iter()
        .filter_map(|r| r.header("event_key"))
        .collect();
    for r in good_after.iter().chain(&later) {
        ensure!(
            !keys.contains(r.event_key.as_str()),
            "{} (after the bad row) reached Kafka: the relay went past the row",
            r.event_key
        );
    }
    ensure!(
        !keys.contains(bad_key.as_str()),
        "the bad row reached Kafka"
    );
    let mut expected = first.clone();
    expected.extend(good_before.iter().map(|r| r.event_key.clone()));
    ensure!(
        keys.iter().all(|k| expected.contains(*k)),
        "unexpected records: {keys:?}"
    );
    ensure!(
        first.iter().all(|k| keys.contains(k.as_str())),
        "the rows before the bad transaction are missing"
    );

    drop(conn);
    w.db.drop_database().await
}

// ---------------------------------------------------------------------------------------------
// Unavailable positions and server_id collisions
// ---------------------------------------------------------------------------------------------

/// Sets the stored checkpoint of `w`'s connector.
async fn set_checkpoint(
    conn: &mut Conn,
    w: &World,
    file: &str,
    pos: u64,
    gtid_set: Option<&str>,
) -> Result<()> {
    conn.exec_drop(
        format!(
            "UPDATE {DEFAULT_CHECKPOINT_TABLE} SET binlog_file = ?, binlog_pos = ?, rows_acked = 0, \
             gtid_set = ? WHERE connector_name = ?"
        ),
        (file, pos, gtid_set, w.connector()),
    )
    .await?;
    ensure!(conn.affected_rows() == 1, "no checkpoint row to change");
    Ok(())
}

/// Starts a relay with `spec` that must fail with exit code 1 and leave the stored position
/// alone (no silent jump); returns its stderr.
async fn expect_failure(w: &World, spec: &RelayConfigSpec, needles: &[&str]) -> Result<String> {
    let before = w.state().await?;
    let relay = w.spawn_with(spec)?;
    let status = relay.wait_exit(FAIL_EXIT).await?;
    expect_exit_code(status, 1, &relay)?;
    let stderr = relay.stderr_text();
    for needle in needles {
        ensure!(
            stderr.contains(needle),
            "stderr does not contain {needle:?}:\n{stderr}"
        );
    }
    let after = w.state().await?;
    ensure!(
        (after.position(), after.rows_acked, &after.gtid_set)
            == (before.position(), before.rows_acked, &before.gtid_set),
        "the failed relay changed the stored checkpoint from {before:?} to {after:?}"
    );
    Ok(stderr)
}

/// `stderr` names what binlog history the server has (from its oldest file of `logs`) and the
/// `reset` commands that move the checkpoint there or to the end.
fn ensure_history_and_recovery(stderr: &str, logs: &[(String, u64)]) -> Result<()> {
    let oldest = &logs.first().context("no binary logs")?.0;
    ensure!(
        stderr.contains(&format!("The server has: binlog files {oldest}:4 to ")),
        "stderr does not name the history the server has (from {oldest}:4):\n{stderr}"
    );
    ensure!(
        stderr.contains("outbox-relay reset --config <file> --to earliest")
            && stderr.contains("`--to latest`"),
        "stderr gives no recovery command:\n{stderr}"
    );
    Ok(())
}

/// A checkpoint in a binlog file the server does not have, past the end of a file it has, or
/// (resume = "gtid") at a GTID the server never wrote: each stops the relay with exit code 1
/// and a message naming the position and how to recover; nothing is produced (rows committed
/// after the real checkpoint wait). With the real checkpoint back, those rows arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purged_or_unknown_position_is_a_definite_error() -> Result<()> {
    let w = World::new(bin(), "purged").await?;
    let order_topic = w.topic("Order");
    let mut conn = w.db.conn().await?;
    let mut gen = RowGen::new(&w.uid, "wait", 3);
    let mut order = HashMap::new();

    let (relay, _) = w.start(STARTUP).await?;
    stop_cleanly(&relay).await?;
    let real = w.checkpoint().await?;
    let (pending, _) = write_batches(&mut conn, &mut gen, 2, 3, &mut order).await?;

    let logs = binary_logs(&mut conn).await?;
    let (newest, size) = logs.last().cloned().context("no binary logs")?;
    let base = newest
        .rsplit_once('.')
        .map(|(b, _)| b.to_owned())
        .context("binlog name without a dot")?;
    let missing_file = format!("{base}.999999");

    // A file the server does not have: default resume mode (auto) without a GTID position,
    // and resume = "position" with one (position mode ignores it).
    for (resume, gtid) in [(None, None), (Some("position"), real.gtid_set.as_deref())] {
        set_checkpoint(&mut conn, &w, &missing_file, 4, gtid).await?;
        let spec = RelayConfigSpec {
            resume: resume.map(str::to_owned),
            ..w.spec.clone()
        };
        let at = format!("cannot resume from the checkpoint's binlog position {missing_file}:4");
        let stderr = expect_failure(&w, &spec, &[&at]).await?;
        ensure_history_and_recovery(&stderr, &logs)?;
    }

    // Past the end of a file the server has, and past any size it can grow to while the test
    // runs (other tests write meanwhile; `max_binlog_size` is at most 1 GiB): a position inside
    // the file would be refused by the server mid-event instead, with another message.
    let past = (size + 1_000_000).max(2_000_000_000);
    set_checkpoint(&mut conn, &w, &newest, past, None).await?;
    let spec = RelayConfigSpec {
        resume: Some("position".into()),
        ..w.spec.clone()
    };
    let at = format!("cannot resume from the checkpoint's binlog position {newest}:{past}");
    expect_failure(&w, &spec, &[&at]).await?;

    // A GTID the server never wrote (MariaDB position or MySQL set): error 1236, never a
    // silent jump.
    let unreached = unreached_gtid_state(&mut conn).await?;
    set_checkpoint(
        &mut conn,
        &w,
        &real.binlog_file,
        real.binlog_pos,
        Some(&unreached),
    )
    .await?;
    let spec = RelayConfigSpec {
        resume: Some("gtid".into()),
        ..w.spec.clone()
    };
    let stderr = expect_failure(&w, &spec, &["1236"]).await?;
    // Files may have rotated meanwhile: the oldest is what the message must start from.
    let logs = binary_logs(&mut conn).await?;
    ensure_history_and_recovery(&stderr, &logs)?;
    let gtids = if outbox_relay_testkit::test_server().is_mysql() {
        "; GTIDs purged "
    } else {
        "; GTID position at the start of "
    };
    ensure!(
        stderr.contains(gtids),
        "the 1236 error does not say which GTIDs the server has ({gtids:?}):\n{stderr}"
    );

    let topics = list_topics(&w.spec.bootstrap_servers, &w.topic_prefix()).await?;
    ensure!(
        topics.is_empty(),
        "a relay that could not resume produced to {topics:?}"
    );

    // The real checkpoint back: the waiting rows arrive, once.
    set_checkpoint(
        &mut conn,
        &w,
        &real.binlog_file,
        real.binlog_pos,
        real.gtid_set.as_deref(),
    )
    .await?;
    let relay = w.spawn()?;
    wait_for_keys(
        &w,
        std::slice::from_ref(&order_topic),
        &pending,
        Some(&relay),
    )
    .await?;
    stop_cleanly(&relay).await?;
    let records = read_all(&w, std::slice::from_ref(&order_topic)).await?;
    ensure_exactly_once(&records, &pending)?;

    drop(conn);
    w.db.drop_database().await
}

/// Relay B (another connector and database) configured with relay A's server_id: B exits with
/// code 3 naming `mysql.server_id` and stores no position; A keeps streaming undisturbed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_id_collision_is_reported() -> Result<()> {
    let a = World::new(bin(), "sida").await?;
    let mut b = World::new(bin(), "sidb").await?;
    b.spec.server_id = a.spec.server_id;
    let topics = vec![a.topic("Order")];
    let mut conn = a.db.conn().await?;
    let mut gen = RowGen::new(&a.uid, "sid", 3);
    let mut order = HashMap::new();

    let (relay_a, _) = a.start(STARTUP).await?;
    let (batch1, _) = write_batches(&mut conn, &mut gen, 2, 3, &mut order).await?;
    wait_for_keys(&a, &topics, &batch1, Some(&relay_a)).await?;

    let relay_b = b.spawn()?;
    let status = relay_b.wait_exit(FAIL_EXIT).await?;
    expect_exit_code(status, 3, &relay_b)?;
    let stderr = relay_b.stderr_text();
    ensure!(
        stderr.contains("mysql.server_id"),
        "stderr does not mention mysql.server_id:\n{stderr}"
    );
    ensure!(
        read_checkpoint(b.db.pool(), DEFAULT_CHECKPOINT_TABLE, b.connector())
            .await?
            .is_none(),
        "B stored a position despite the collision"
    );

    let (batch2, last) = write_batches(&mut conn, &mut gen, 2, 3, &mut order).await?;
    let all: HashSet<String> = batch1.union(&batch2).cloned().collect();
    wait_for_keys(&a, &topics, &all, Some(&relay_a)).await?;
    a.wait_checkpoint_covers(&relay_a, &last.end, RELAY_WAIT)
        .await?;
    relay_a.ensure_running()?;
    ensure!(
        !relay_a.stderr_text().contains("relay interrupted"),
        "A was interrupted while B tried its server_id:\n{}",
        relay_a.stderr_tail()
    );
    stop_cleanly(&relay_a).await?;
    let records = read_all(&a, &topics).await?;
    ensure_exactly_once(&records, &all)?;

    drop(conn);
    b.db.drop_database().await?;
    a.db.drop_database().await
}

/// Port of the private server of [`purged_resume_point_is_a_definite_error`]
/// (`PURGE_SERVER_PORT`): one per flavor, so the three suites never share it.
fn purge_server_port() -> u16 {
    std::env::var("PURGE_SERVER_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(match outbox_relay_testkit::test_server().name() {
            "mariadb10" => 3466,
            "mariadb11" => 3476,
            _ => 3486,
        })
}

/// A checkpoint whose binlog the server purged (FLUSH + PURGE BINARY LOGS on a private server
/// of the test flavor, so the shared one keeps its history): resumed by GTID and by position,
/// the relay exits 1 naming the checkpoint, what the server still has and the `reset`
/// commands, and leaves the stored checkpoint alone. The binlog dump itself, started from that
/// GTID position, ends with the same definite error: MariaDB may close the dump connection
/// instead of answering error 1236, which the relay used to retry forever as "the server
/// closed the connection".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purged_resume_point_is_a_definite_error() -> Result<()> {
    use outbox_relay_core::error::RelayError;
    use outbox_relay_mysql::binlog::source::{BinlogSource, StartFrom};
    use outbox_relay_mysql::server::Flavor;
    use outbox_relay_testkit::{PrivateService, ServiceSpec, TestDb};

    let server = outbox_relay_testkit::test_server();
    let port = purge_server_port();
    let _service = PrivateService::acquire(
        ServiceSpec {
            name: format!("{}-purge", server.name()),
            script: "server.sh".into(),
            args: vec![server.name().into()],
            env: vec![(server.port_var().into(), port.to_string())],
        },
        |_| Ok(()),
    )?;
    let server_url = format!("mysql://root@127.0.0.1:{port}");
    let db = TestDb::create_on(&server_url, "purge").await?;
    let mut conn = db.conn().await?;
    let uid = outbox_relay_testkit::unique_suffix();
    let connector = format!("purge-{uid}");
    let mut spec = RelayConfigSpec::new(&db, &connector, next_server_id(), &format!("p_{uid}"));
    spec.resume = Some("gtid".into());
    let topic = spec.topic_for("Order");
    let mut gen = RowGen::new(&uid, "purge", 3);
    let mut order = HashMap::new();

    let relay = RelayProcess::spawn(bin(), &spec.to_toml(), &[])?;
    relay
        .wait_for_checkpoint_row(db.pool(), &connector, STARTUP)
        .await?;
    let (first, _) = write_batches(&mut conn, &mut gen, 2, 3, &mut order).await?;
    collect_records(
        &spec.bootstrap_servers,
        std::slice::from_ref(&topic),
        first.len(),
        RELAY_WAIT,
    )
    .await?;
    stop_cleanly(&relay).await?;
    let stored = read_checkpoint(db.pool(), DEFAULT_CHECKPOINT_TABLE, &connector)
        .await?
        .context("no checkpoint after a clean stop")?;
    let gtid = stored
        .gtid_set
        .clone()
        .filter(|g| !g.is_empty())
        .context("the checkpoint holds no GTID position")?;

    // Rows the relay has not read, then every binlog file up to a new one purged: the
    // transactions right after the checkpoint are gone.
    write_batches(&mut conn, &mut gen, 2, 3, &mut order).await?;
    conn.query_drop("FLUSH BINARY LOGS").await?;
    let newest = newest_binlog_file(&mut conn).await?;
    // The server keeps a file a dump thread still reads (the stopped relay's, until the
    // server notices the closed connection): purge until it is gone.
    let logs = wait_until(
        "the checkpoint's binlog file purged",
        STOP,
        Duration::from_millis(200),
        async || {
            let mut conn = db.conn().await?;
            conn.query_drop(format!("PURGE BINARY LOGS TO '{newest}'"))
                .await?;
            let logs = binary_logs(&mut conn).await?;
            Ok(logs
                .iter()
                .all(|(f, _)| *f != stored.binlog_file)
                .then_some(logs))
        },
    )
    .await?;

    let definite = |stderr: &str, needle: &str| -> Result<()> {
        ensure!(
            stderr.contains(needle),
            "stderr does not name the checkpoint ({needle:?}):\n{stderr}"
        );
        ensure_history_and_recovery(stderr, &logs)
    };
    let run_failing = async |spec: &RelayConfigSpec| -> Result<String> {
        let relay = RelayProcess::spawn(bin(), &spec.to_toml(), &[])?;
        let status = relay.wait_exit(FAIL_EXIT).await?;
        expect_exit_code(status, 1, &relay)?;
        Ok(relay.stderr_text())
    };
    // By GTID.
    let stderr = run_failing(&spec).await?;
    let needle = if server.is_mysql() {
        format!("cannot resume from the checkpoint's GTID set {gtid}")
    } else {
        format!("cannot resume from the checkpoint's GTID position {gtid}")
    };
    definite(&stderr, &needle)?;
    ensure!(
        stderr.contains("purged"),
        "stderr does not say the binlog was purged:\n{stderr}"
    );
    // By position.
    let by_position = RelayConfigSpec {
        resume: Some("position".into()),
        ..spec.clone()
    };
    let stderr = run_failing(&by_position).await?;
    definite(
        &stderr,
        &format!(
            "cannot resume from the checkpoint's binlog position {}",
            stored.position()
        ),
    )?;
    let after = read_checkpoint(db.pool(), DEFAULT_CHECKPOINT_TABLE, &connector)
        .await?
        .context("the checkpoint row is gone")?;
    ensure!(
        (after.position(), &after.gtid_set) == (stored.position(), &stored.gtid_set),
        "a relay that could not resume moved the checkpoint from {stored:?} to {after:?}"
    );
    let records = read_all_records(
        &spec.bootstrap_servers,
        std::slice::from_ref(&topic),
        READ_ALL,
    )
    .await?;
    ensure!(
        records.len() == first.len(),
        "a relay that could not resume produced: {} records on {topic}, {} expected",
        records.len(),
        first.len()
    );

    // The dump itself, past the start-up checks.
    let (flavor, start) = if server.is_mysql() {
        (Flavor::MySql, StartFrom::MysqlGtid(gtid.parse()?))
    } else {
        (Flavor::MariaDb, StartFrom::MariadbGtid(gtid.parse()?))
    };
    let opts = mysql_async::Opts::from_url(&server_url)?;
    let dump = async {
        let mut source = BinlogSource::connect(
            opts,
            next_server_id(),
            "purge-test",
            flavor,
            &start,
            Duration::from_secs(1),
            Duration::from_secs(20),
        )
        .await?;
        loop {
            source.next().await?;
        }
    };
    let outcome: Result<(), RelayError> = tokio::time::timeout(FAIL_EXIT, dump)
        .await
        .context("the dump from a purged GTID position neither failed nor ended")?;
    match outcome {
        Err(RelayError::Binlog(message)) => {
            ensure!(
                message.contains("purged") && message.contains("--to earliest"),
                "the dump's error does not say the binlog was purged and how to go on: {message}"
            );
        }
        other => bail!("the dump from a purged GTID position gave {other:?}, not a definite error"),
    }

    drop(conn);
    db.drop_database().await
}
