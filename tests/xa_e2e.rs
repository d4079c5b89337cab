//! End-to-end tests of XA transactions on the outbox, against the real MariaDB and Kafka of the
//! test machine (`tests/services/mariadb.sh up`, `tests/services/kafka.sh up`).
//!
//! The XA transactions are session-level (`XA START` … `XA PREPARE` on a connection of their
//! own, which then disconnects: MariaDB 10.5+ keeps a prepared XA transaction after its session
//! ends) and are decided by `XA COMMIT`/`XA ROLLBACK` from another connection, as a transaction
//! manager would. What is expected comes from the SQL the test runs and from the binlog
//! (`SHOW BINLOG EVENTS`; XA groups located by their XID, ordinary transactions by their GTID),
//! never from the relay's code. Both servers log XA the same way (an `XA START … XA PREPARE`
//! group, then an `XA COMMIT`/`XA ROLLBACK` group, each with its own GTID):
//!
//! * a prepared-then-rolled-back XA transaction produces no record;
//! * a committed one produces exactly its rows, where its `XA COMMIT` is in the binlog (after
//!   everything committed before the `XA COMMIT`, even if the `XA PREPARE` was earlier);
//! * while an XA transaction is prepared and undecided, the stored checkpoint never passes its
//!   `XA PREPARE`, so a relay stopped (SIGTERM) or killed (kill -9) in between still delivers
//!   its rows after the restart;
//! * an `XA COMMIT` whose `XA PREPARE` precedes the relay's first start stops the relay with an
//!   error naming the XID; moving the checkpoint before the `XA PREPARE` as the error says
//!   delivers the rows.
//!
//! Each test has its own database, topics, connector name and XIDs ([`World`]); a test that
//! fails still rolls back its XA transactions, so none stays prepared on the shared server.
//! The relays here use `outbox.unknown_xa_commit = "stop"` (the relay's default), and the tests
//! run one at a time: a relay started while another test's XA transaction is prepared would
//! stop at its XA COMMIT. (Relays of the other test files use `skip`, see
//! [`RelayConfigSpec::new`].)

use std::collections::{HashMap, HashSet};
use std::ops::ControlFlow;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use mysql_async::prelude::*;
use mysql_async::{Conn, Opts};
use outbox_relay_testkit::{
    commit_rows, compare_positions, ensure_at_least_once, ensure_exactly_once,
    ensure_per_key_order, expect_exit_code, gtid_of_event, gtid_state_includes,
    high_watermark_total, insert_outbox_rows, read_all_records, scan_binlog, stored_payloads,
    wait_until, xa_statement_gtid, xid_literal, BinlogPosition, Checkpoint, InsertStyle, OutboxRow,
    Record, RelayConfigSpec, RelayProcess, RowGen, World,
};

/// The relay binary under test (built on first use).
fn bin() -> &'static str {
    outbox_relay_testkit::relay_bin()
}

/// Serialises the tests of this file (see the module documentation).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A world whose relays stop at an unknown XA COMMIT, with checkpoints every 200 ms.
async fn xa_world(name: &str) -> Result<World> {
    let mut w = World::new(bin(), name).await?;
    w.spec.checkpoint_interval_ms = 200;
    w.spec.unknown_xa_commit = Some("stop".into());
    Ok(w)
}

/// Relay start-up until its checkpoint row holds a position.
const STARTUP: Duration = Duration::from_secs(60);
/// Records reaching Kafka, checkpoints reaching a position.
const RELAY_WAIT: Duration = Duration::from_secs(120);
/// A graceful stop until the process has exited.
const STOP: Duration = Duration::from_secs(60);
/// Reading topics that are no longer written.
const READ_ALL: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------------------------
// Writers
// ---------------------------------------------------------------------------------------------

/// A connection of its own (not from the pool, which would reset it) to the test database.
async fn own_conn(w: &World) -> Result<Conn> {
    let opts = Opts::from_url(&w.db.url()).context("database url")?;
    Conn::new(opts).await.context("connecting for XA")
}

/// `XA START`, one INSERT per row, `XA END`, `XA PREPARE` on a connection of its own, which then
/// disconnects. Returns the prepared group's GTID (found by its XID in the binlog,
/// [`xa_statement_gtid`]).
async fn xa_prepare(w: &World, gtrid: &str, rows: &[OutboxRow]) -> Result<String> {
    let mut conn = own_conn(w).await?;
    conn.query_drop(format!("XA START '{gtrid}'")).await?;
    insert_outbox_rows(&mut conn, "outbox", rows, InsertStyle::SingleRow).await?;
    conn.query_drop(format!("XA END '{gtrid}'")).await?;
    conn.query_drop(format!("XA PREPARE '{gtrid}'")).await?;
    let gtid = xa_statement_gtid(&mut conn, w.db.created_at_binlog(), "XA PREPARE", gtrid).await?;
    conn.disconnect().await?;
    Ok(gtid)
}

/// `XA COMMIT` (or `XA ROLLBACK`) of `gtrid` from a new connection; returns the outcome's GTID.
async fn xa_decide(w: &World, gtrid: &str, commit: bool) -> Result<String> {
    let mut conn = own_conn(w).await?;
    let verb = if commit { "COMMIT" } else { "ROLLBACK" };
    conn.query_drop(format!("XA {verb} '{gtrid}'"))
        .await
        .with_context(|| format!("XA {verb} '{gtrid}'"))?;
    // Not `last_gtid`: MySQL's performance_schema has no GTID for an XA COMMIT/ROLLBACK of a
    // transaction another session prepared.
    let gtid = xa_statement_gtid(
        &mut conn,
        w.db.created_at_binlog(),
        &format!("XA {verb}"),
        gtrid,
    )
    .await?;
    conn.disconnect().await?;
    Ok(gtid)
}

/// Rolls back whichever of `gtrids` is still prepared (cleanup after a failed test).
async fn rollback_leftovers(w: &World, gtrids: &[String]) {
    let Ok(mut conn) = own_conn(w).await else {
        return;
    };
    for g in gtrids {
        let _ = conn.query_drop(format!("XA ROLLBACK '{g}'")).await;
    }
    let _ = conn.disconnect().await;
}

/// An event group in the binlog: where its GTID event starts and where its last event ends.
#[derive(Debug, Clone)]
struct Group {
    start: BinlogPosition,
    end: BinlogPosition,
}

/// The group of GTID `gtid` (MariaDB `0-1-42` or MySQL `uuid:42`), searched from `from`: it
/// ends with its Xid event, its XA_prepare event, or its `COMMIT`/`XA COMMIT`/`XA ROLLBACK`
/// query (`SHOW BINLOG EVENTS`).
async fn group(conn: &mut Conn, from: &BinlogPosition, gtid: &str) -> Result<Group> {
    let mut start: Option<BinlogPosition> = None;
    let found = scan_binlog(conn, from, |ev| {
        match &start {
            None => {
                if gtid_of_event(ev).as_deref() == Some(gtid) {
                    start = Some(BinlogPosition {
                        file: ev.log_name.clone(),
                        pos: ev.pos,
                    });
                }
            }
            Some(s) => {
                let info = ev.info.trim().to_ascii_uppercase();
                let ends = ev.event_type == "Xid"
                    || ev.event_type == "XA_prepare"
                    || (ev.event_type == "Query"
                        && (info == "COMMIT"
                            || info.starts_with("XA COMMIT")
                            || info.starts_with("XA ROLLBACK")));
                if ends {
                    return ControlFlow::Break(Group {
                        start: s.clone(),
                        end: BinlogPosition {
                            file: ev.log_name.clone(),
                            pos: ev.end_log_pos,
                        },
                    });
                }
            }
        }
        ControlFlow::Continue(())
    })
    .await?;
    found.with_context(|| format!("group {gtid} not found in the binlog after {from}"))
}

/// Commits `rows` in one ordinary transaction; returns its group.
async fn commit(conn: &mut Conn, from: &BinlogPosition, rows: &[OutboxRow]) -> Result<Group> {
    let gtid = commit_rows(conn, rows).await?;
    group(conn, from, &gtid).await
}

/// What the server stores for the committed outbox rows, by `event_key`.
struct Stored {
    /// `id` (the `id` header).
    ids: HashMap<String, u64>,
    /// `payload` as the server returns it ([`stored_payloads`]).
    payloads: HashMap<String, Option<String>>,
}

/// The committed outbox rows' ids and payloads.
async fn stored_rows(conn: &mut Conn) -> Result<Stored> {
    let rows: Vec<(String, u64)> = conn.query("SELECT event_key, id FROM outbox").await?;
    Ok(Stored {
        ids: rows.into_iter().collect(),
        payloads: stored_payloads(conn, "outbox").await?,
    })
}

fn keys(rows: &[&[OutboxRow]]) -> HashSet<String> {
    rows.iter()
        .flat_map(|r| r.iter().map(|r| r.event_key.clone()))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Checks
// ---------------------------------------------------------------------------------------------

/// Every record is one of `rows` with exactly its topic, key, value (the payload text the server
/// returns for the row: MySQL normalises JSON), timestamp and headers.
fn ensure_contents(
    records: &[Record],
    rows: &[OutboxRow],
    stored: &Stored,
    spec: &RelayConfigSpec,
) -> Result<()> {
    let by_key: HashMap<&str, &OutboxRow> =
        rows.iter().map(|r| (r.event_key.as_str(), r)).collect();
    let mut problems = Vec::new();
    for r in records {
        let ek = r.header("event_key").unwrap_or_default();
        let Some(row) = by_key.get(ek) else {
            problems.push(format!("unexpected record with event_key {ek:?}"));
            continue;
        };
        let want_id = stored.ids.get(ek).map(u64::to_string);
        let checks = [
            (
                "topic",
                Some(r.topic.clone()),
                Some(spec.topic_for(&row.aggregate_type)),
            ),
            (
                "key",
                r.key_str().map(str::to_owned),
                Some(row.aggregate_id.clone()),
            ),
            (
                "value (the payload as the server stores it)",
                r.value_str().map(str::to_owned),
                stored.payloads.get(ek).cloned().flatten(),
            ),
            (
                "timestamp",
                r.timestamp_ms.map(|t| t.to_string()),
                Some(row.expected_timestamp_ms().to_string()),
            ),
            ("header id", r.header("id").map(str::to_owned), want_id),
            (
                "header event_type",
                r.header("event_type").map(str::to_owned),
                Some(row.event_type.clone()),
            ),
            (
                "header aggregate_type",
                r.header("aggregate_type").map(str::to_owned),
                Some(row.aggregate_type.clone()),
            ),
        ];
        for (what, got, want) in checks {
            if got != want {
                problems.push(format!("{ek}: {what} is {got:?}, expected {want:?}"));
            }
        }
    }
    ensure!(
        problems.is_empty(),
        "records differ from the rows:\n  {}",
        problems.join("\n  ")
    );
    Ok(())
}

/// Event keys of `records` in offset order (all on one partition: the tests use one key).
fn offset_order(records: &[Record]) -> Result<Vec<String>> {
    let partitions: HashSet<(&str, i32)> = records
        .iter()
        .map(|r| (r.topic.as_str(), r.partition))
        .collect();
    ensure!(
        partitions.len() <= 1,
        "records of one key are on several partitions: {partitions:?}"
    );
    let mut sorted: Vec<&Record> = records.iter().collect();
    sorted.sort_by_key(|r| r.offset);
    Ok(sorted
        .iter()
        .map(|r| r.header("event_key").unwrap_or_default().to_owned())
        .collect())
}

/// Reads `topics` until every key of `wanted` is there ([`World::wait_for_keys`]).
async fn wait_for_keys(
    w: &World,
    topics: &[String],
    wanted: &HashSet<String>,
    relay: &RelayProcess,
) -> Result<()> {
    w.wait_for_keys(topics, wanted, Some(relay), RELAY_WAIT)
        .await
        .map(drop)
}

/// The stored checkpoint is at or before `limit` (the start of the undecided XA transaction's
/// prepared group), and not before `floor` (the end of the last ordinary transaction before the
/// XA PREPARE: the relay has read and acknowledged it).
async fn ensure_held(
    w: &World,
    conn: &mut Conn,
    cp: &Checkpoint,
    floor: &BinlogPosition,
    limit: &BinlogPosition,
) -> Result<()> {
    ensure!(
        compare_positions(conn, &cp.position(), limit)
            .await?
            .is_le(),
        "while an XA transaction is prepared and undecided, the checkpoint {} (rows_acked {}) \
         passed its XA PREPARE group, which starts at {limit}",
        cp.position(),
        cp.rows_acked
    );
    ensure!(
        compare_positions(conn, &cp.position(), floor)
            .await?
            .is_ge(),
        "checkpoint {} is before {floor}, the end of a transaction the relay had already relayed",
        cp.position()
    );
    w.ensure_boundary(cp).await
}

/// Waits until the stored checkpoint has `rows_acked` ≥ `n` (the rows after the held boundary
/// are acknowledged), checking on every read that it never passes `limit`, and at the end that
/// it is held at or after `floor` ([`ensure_held`]). (Not `floor` on every read: a checkpoint
/// written before the relay's last acknowledgements may still be behind it.)
async fn wait_rows_acked(
    w: &World,
    relay: &RelayProcess,
    n: u64,
    floor: &BinlogPosition,
    limit: &BinlogPosition,
) -> Result<Checkpoint> {
    let mut conn = w.db.conn().await?;
    let cp = wait_until(
        &format!("a checkpoint with rows_acked >= {n}"),
        RELAY_WAIT,
        Duration::from_millis(100),
        async || {
            relay.ensure_running()?;
            let cp = w.checkpoint().await?;
            ensure!(
                compare_positions(&mut conn, &cp.position(), limit)
                    .await?
                    .is_le(),
                "while an XA transaction is prepared and undecided, the checkpoint {} \
                 (rows_acked {}) passed its XA PREPARE group, which starts at {limit}",
                cp.position(),
                cp.rows_acked
            );
            Ok((cp.rows_acked >= n).then_some(cp))
        },
    )
    .await?;
    ensure_held(w, &mut conn, &cp, floor, limit).await?;
    Ok(cp)
}

/// What [`around_a_prepared_xa`] wrote, saw and read.
struct AroundXa {
    conn: Conn,
    a: Vec<OutboxRow>,
    b: Vec<OutboxRow>,
    c: Vec<OutboxRow>,
    /// The XA transaction's rows.
    x: Vec<OutboxRow>,
    /// The XA START … XA PREPARE group.
    prepared: Group,
    /// The XA COMMIT or XA ROLLBACK group.
    decided: Group,
    /// The checkpoint held before the XA PREPARE with B's rows acknowledged.
    held: Checkpoint,
    /// Every record on the `Order` topic after the stop.
    records: Vec<Record>,
}

/// Rows labelled `label` over `keys` aggregates: A (2 rows), [XA `gtrid` of 3 rows prepared],
/// B (`b_rows` rows); once A and B are on Kafka and the checkpoint, held before the XA PREPARE,
/// has B's `b_rows` rows acknowledged, the XA transaction is committed (`commit`) or rolled
/// back, then C (2 rows). Waits for C's rows (and the XA's if committed) and a checkpoint at a
/// boundary covering C, stops the relay (exit 0) and reads the topic.
async fn around_a_prepared_xa(
    w: &World,
    gtrid: &str,
    label: &str,
    keys_n: usize,
    b_rows: usize,
    commit_xa: bool,
) -> Result<AroundXa> {
    let topics = vec![w.topic("Order")];
    let mut gen = RowGen::new(&w.uid, label, keys_n);
    let (relay, start) = w.start(STARTUP).await?;
    let mut conn = w.db.conn().await?;
    let from = start.position();

    let a = gen.rows(2);
    let tx_a = commit(&mut conn, &from, &a).await?;
    let x = gen.rows(3);
    let prepared = xa_prepare(w, gtrid, &x).await?;
    let prepared = group(&mut conn, &from, &prepared).await?;
    let b = gen.rows(b_rows);
    commit(&mut conn, &from, &b).await?;
    wait_for_keys(w, &topics, &keys(&[&a, &b]), &relay).await?;
    let held = wait_rows_acked(
        w,
        &relay,
        u64::try_from(b_rows)?,
        &tx_a.end,
        &prepared.start,
    )
    .await?;

    let decided = xa_decide(w, gtrid, commit_xa).await?;
    let decided = group(&mut conn, &from, &decided).await?;
    let c = gen.rows(2);
    let tx_c = commit(&mut conn, &from, &c).await?;
    let arriving = if commit_xa {
        keys(&[&x, &c])
    } else {
        keys(&[&c])
    };
    wait_for_keys(w, &topics, &arriving, &relay).await?;
    let cp = w
        .wait_checkpoint_covers(&relay, &tx_c.end, RELAY_WAIT)
        .await?;
    w.ensure_boundary(&cp).await?;
    let status = relay.stop(STOP).await?;
    expect_exit_code(status, 0, &relay)?;

    let records = read_all_records(&w.spec.bootstrap_servers, &topics, READ_ALL).await?;
    Ok(AroundXa {
        conn,
        a,
        b,
        c,
        x,
        prepared,
        decided,
        held,
        records,
    })
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

/// Ordinary transactions around a prepared XA transaction that is then rolled back: their rows
/// are relayed, exactly once; the XA transaction's rows never reach Kafka.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_then_rolled_back_xa_produces_nothing() -> Result<()> {
    let _serial = ONE_AT_A_TIME.lock().await;
    let w = xa_world("xarb").await?;
    let gtrid = format!("xa-{}-rb", w.uid);
    let result = async {
        let AroundXa {
            mut conn,
            a,
            b,
            c,
            x,
            prepared,
            decided: rolled_back,
            held: _,
            records,
        } = around_a_prepared_xa(&w, &gtrid, "rb", 2, 2, false).await?;
        ensure_exactly_once(&records, &keys(&[&a, &b, &c]))?;
        let ids = stored_rows(&mut conn).await?;
        ensure!(
            x.iter().all(|r| !ids.ids.contains_key(&r.event_key)),
            "the rolled-back rows are in the table"
        );
        let all: Vec<OutboxRow> = [a, b, c].concat();
        ensure_contents(&records, &all, &ids, &w.spec)?;
        eprintln!(
            "XA prepared at {}..{}, rolled back at {}..{}: {} records, none of the XA's",
            prepared.start,
            prepared.end,
            rolled_back.start,
            rolled_back.end,
            records.len()
        );
        Ok(())
    }
    .await;
    rollback_leftovers(&w, &[gtrid]).await;
    result?;
    w.db.drop_database().await
}

/// A prepared XA transaction committed later: its rows reach Kafka exactly once, with their
/// content, and after the rows committed before the `XA COMMIT` (one aggregate, so one
/// partition shows the whole order): A, [XA prepared], B, [XA COMMIT], C gives A, B, XA, C.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_then_committed_xa_follows_its_commit() -> Result<()> {
    let _serial = ONE_AT_A_TIME.lock().await;
    let w = xa_world("xacm").await?;
    let gtrid = format!("xa-{}-cm", w.uid);
    let result = async {
        let AroundXa {
            mut conn,
            a,
            b,
            c,
            x,
            prepared,
            decided: committed,
            held,
            records,
        } = around_a_prepared_xa(&w, &gtrid, "cm", 1, 1, true).await?;
        ensure_exactly_once(&records, &keys(&[&a, &b, &x, &c]))?;
        let ids = stored_rows(&mut conn).await?;
        let expected: Vec<OutboxRow> = [a, b, x, c].concat();
        ensure_contents(&records, &expected, &ids, &w.spec)?;
        let want: Vec<String> = expected.iter().map(|r| r.event_key.clone()).collect();
        let got = offset_order(&records)?;
        ensure!(
            got == want,
            "records are not in commit order (the XA transaction's rows belong where its XA \
             COMMIT is, {}):\n  got  {got:?}\n  want {want:?}",
            committed.end
        );
        eprintln!(
            "checkpoint held at {} + {} rows while the XA (prepared {}) was undecided; \
             committed at {}",
            held.position(),
            held.rows_acked,
            prepared.start,
            committed.end
        );
        Ok(())
    }
    .await;
    rollback_leftovers(&w, &[gtrid]).await;
    result?;
    w.db.drop_database().await
}

/// How the relay is interrupted between the XA PREPARE and the XA COMMIT.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Interrupt {
    /// SIGTERM: zero duplicates expected.
    Sigterm,
    /// kill -9 after a checkpoint covering everything on Kafka: duplicates bounded by the
    /// records past the stored `rows_acked`.
    Kill9,
}

/// A, [XA 1 prepared], binlog rotation, B, [XA 2 prepared], D relayed; the relay is
/// interrupted; while it is down C, [XA 1 COMMIT], rotation, E, [XA 2 COMMIT], F are committed. After the restart every row is on
/// Kafka, the XA rows after their commits, and the checkpoint never passed XA 1's PREPARE while
/// it was undecided (its GTID position, used to resume, is the held boundary's).
async fn interrupted_between_prepare_and_commit(how: Interrupt) -> Result<()> {
    let name = match how {
        Interrupt::Sigterm => "xaterm",
        Interrupt::Kill9 => "xakill",
    };
    let _serial = ONE_AT_A_TIME.lock().await;
    let w = xa_world(name).await?;
    let gtrids = [format!("xa-{}-1", w.uid), format!("xa-{}-2", w.uid)];
    let result = async {
        let topics = vec![w.topic("Order")];
        let mut gen = RowGen::new(&w.uid, "int", 1);
        let (relay1, start) = w.start(STARTUP).await?;
        let mut conn = w.db.conn().await?;
        let from = start.position();

        let a = gen.rows(2);
        let tx_a = commit(&mut conn, &from, &a).await?;
        let x1 = gen.rows(2);
        let prepared1 = xa_prepare(&w, &gtrids[0], &x1).await?;
        let prepared1_gtid = prepared1.clone();
        let prepared1 = group(&mut conn, &from, &prepared1).await?;
        // A rotation while XA 1 is undecided: the checkpoint stays in the older file.
        conn.query_drop("FLUSH BINARY LOGS").await?;
        let b = gen.rows(2);
        commit(&mut conn, &from, &b).await?;
        let x2 = gen.rows(1);
        let prepared2 = xa_prepare(&w, &gtrids[1], &x2).await?;
        let prepared2 = group(&mut conn, &from, &prepared2).await?;
        let d = gen.rows(1);
        commit(&mut conn, &from, &d).await?;
        wait_for_keys(&w, &topics, &keys(&[&a, &b, &d]), &relay1).await?;
        // B and D (3 rows) acknowledged after the boundary before XA 1's PREPARE.
        let held = wait_rows_acked(&w, &relay1, 3, &tx_a.end, &prepared1.start).await?;
        let on_kafka = high_watermark_total(&w.spec.bootstrap_servers, &topics).await?;
        match how {
            Interrupt::Sigterm => {
                let status = relay1.stop(STOP).await?;
                expect_exit_code(status, 0, &relay1)?;
            }
            Interrupt::Kill9 => {
                relay1.kill9()?;
            }
        }
        let stored = w.checkpoint().await?;
        ensure_held(&w, &mut conn, &stored, &tx_a.end, &prepared1.start).await?;
        ensure!(
            stored.rows_acked == 3,
            "after B and D were acknowledged and the relay {how:?}, the checkpoint is {} with \
             rows_acked {} (expected 3: B and D, the rows after the boundary before XA 1's \
             PREPARE at {})",
            stored.position(),
            stored.rows_acked,
            prepared1.start
        );
        let stored_gtids = stored
            .gtid_set
            .as_deref()
            .context("the checkpoint has a GTID position")?;
        ensure!(
            !gtid_state_includes(stored_gtids, &prepared1_gtid)?,
            "the checkpoint's GTID state {stored_gtids:?} includes XA 1's PREPARE \
             ({prepared1_gtid}): a GTID resume would skip its rows"
        );
        eprintln!(
            "{how:?} with XA 1 (prepared {}..{}) and XA 2 (prepared {}) undecided: checkpoint \
             {} + {} rows, gtid {:?} (held during the run at {} + {})",
            prepared1.start,
            prepared1.end,
            prepared2.start,
            stored.position(),
            stored.rows_acked,
            stored.gtid_set,
            held.position(),
            held.rows_acked
        );

        // While the relay is down.
        let c = gen.rows(1);
        commit(&mut conn, &from, &c).await?;
        xa_decide(&w, &gtrids[0], true).await?;
        conn.query_drop("FLUSH BINARY LOGS").await?;
        let e = gen.rows(1);
        commit(&mut conn, &from, &e).await?;
        xa_decide(&w, &gtrids[1], true).await?;
        let f = gen.rows(1);
        let tx_f = commit(&mut conn, &from, &f).await?;

        // SIGTERM resumes by GTID (the default), kill -9 by file and position.
        let relay2 = match how {
            Interrupt::Sigterm => w.spawn()?,
            Interrupt::Kill9 => w.spawn_with(&RelayConfigSpec {
                resume: Some("position".into()),
                ..w.spec.clone()
            })?,
        };
        let all = keys(&[&a, &b, &d, &c, &x1, &e, &x2, &f]);
        wait_for_keys(&w, &topics, &all, &relay2).await?;
        let cp = w
            .wait_checkpoint_covers(&relay2, &tx_f.end, RELAY_WAIT)
            .await?;
        w.ensure_boundary(&cp).await?;
        let status = relay2.stop(STOP).await?;
        expect_exit_code(status, 0, &relay2)?;
        let last = w.checkpoint().await?;
        ensure!(
            last.rows_acked == 0,
            "final checkpoint {} has rows_acked {}",
            last.position(),
            last.rows_acked
        );

        let records = read_all_records(&w.spec.bootstrap_servers, &topics, READ_ALL).await?;
        let expected: Vec<OutboxRow> = [a, b, d, c, x1, e, x2, f].concat();
        let order: HashMap<String, usize> = expected
            .iter()
            .enumerate()
            .map(|(i, r)| (r.event_key.clone(), i))
            .collect();
        match how {
            Interrupt::Sigterm => ensure_exactly_once(&records, &all)?,
            Interrupt::Kill9 => {
                let dups = u64::try_from(ensure_at_least_once(&records, &all)?)?;
                let bound = on_kafka - stored.rows_acked;
                ensure!(
                    dups <= bound,
                    "{dups} duplicates after kill -9; at most {bound} (records on Kafka {on_kafka} \
                     − rows_acked {}) may be sent again",
                    stored.rows_acked
                );
            }
        }
        let ids = stored_rows(&mut conn).await?;
        ensure_contents(&records, &expected, &ids, &w.spec)?;
        ensure_per_key_order(&records, &order)?;
        Ok(())
    }
    .await;
    rollback_leftovers(&w, &gtrids).await;
    result?;
    w.db.drop_database().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_between_prepare_and_commit_loses_and_repeats_nothing() -> Result<()> {
    interrupted_between_prepare_and_commit(Interrupt::Sigterm).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_between_prepare_and_commit_loses_nothing() -> Result<()> {
    interrupted_between_prepare_and_commit(Interrupt::Kill9).await
}

/// An XA transaction prepared before the relay's first start (which begins at the end of the
/// binlog) and committed afterwards: the relay cannot know its rows and stops (exit code 1)
/// naming the XID. Moving the checkpoint to the start of the XA PREPARE group, as the error
/// says, relays them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_of_an_xa_prepared_before_the_start_stops_the_relay() -> Result<()> {
    let _serial = ONE_AT_A_TIME.lock().await;
    let w = xa_world("xaunk").await?;
    let gtrid = format!("xa-{}-un", w.uid);
    let result = async {
        let topics = vec![w.topic("Order")];
        let mut gen = RowGen::new(&w.uid, "un", 1);
        let mut conn = w.db.conn().await?;
        let from = w.db.created_at_binlog().clone();
        let x = gen.rows(2);
        let prepared = xa_prepare(&w, &gtrid, &x).await?;
        let prepared = group(&mut conn, &from, &prepared).await?;

        let (relay1, start) = w.start(STARTUP).await?;
        ensure!(
            compare_positions(&mut conn, &start.position(), &prepared.end)
                .await?
                .is_ge(),
            "the first start {} is before the XA PREPARE ({})",
            start.position(),
            prepared.end
        );
        let a = gen.rows(1);
        commit(&mut conn, &from, &a).await?;
        wait_for_keys(&w, &topics, &keys(&[&a]), &relay1).await?;
        xa_decide(&w, &gtrid, true).await?;
        let status = relay1.wait_exit(RELAY_WAIT).await?;
        expect_exit_code(status, 1, &relay1)?;
        let stderr = relay1.stderr_text();
        // Both servers log the XID as hex literals: 'xa-…' is X'78612d…',X'',1.
        let xid = format!("XA COMMIT {}", xid_literal(&gtrid));
        ensure!(
            stderr.contains(&xid) && stderr.contains("before that XA PREPARE"),
            "the relay's error does not name {xid} and the way out:\n{}",
            relay1.stderr_tail()
        );

        // The fix the error describes: the checkpoint before the XA PREPARE, rows_acked = 0,
        // gtid_set = NULL (resume by position).
        conn.exec_drop(
            "UPDATE outbox_relay_checkpoint SET binlog_file = ?, binlog_pos = ?, rows_acked = 0, \
             gtid_set = NULL WHERE connector_name = ?",
            (&prepared.start.file, prepared.start.pos, w.connector()),
        )
        .await?;
        let relay2 = w.spawn()?;
        wait_for_keys(&w, &topics, &keys(&[&a, &x]), &relay2).await?;
        let status = relay2.stop(STOP).await?;
        expect_exit_code(status, 0, &relay2)?;
        let records = read_all_records(&w.spec.bootstrap_servers, &topics, READ_ALL).await?;
        // A was relayed before the stop and again after the move: at least once; XA rows once.
        ensure_at_least_once(&records, &keys(&[&a, &x]))?;
        let counts = outbox_relay_testkit::event_key_counts(&records);
        for r in &x {
            ensure!(
                counts.get(&r.event_key) == Some(&1),
                "XA row {} is on Kafka {:?} times",
                r.event_key,
                counts.get(&r.event_key)
            );
        }
        let ids = stored_rows(&mut conn).await?;
        ensure_contents(&records, &[a, x].concat(), &ids, &w.spec)?;
        Ok(())
    }
    .await;
    rollback_leftovers(&w, &[gtrid]).await;
    result?;
    w.db.drop_database().await
}
