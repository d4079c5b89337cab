//! End-to-end tests of `outbox-relay` that change GLOBAL server variables of the shared test
//! MariaDB, or that need the server to themselves (counting the relay's own writes while the
//! server is idle). They live in their own test binary: `cargo test` runs test binaries one
//! after another, so no other relay test sees the changed setting or adds binlog traffic. (A
//! runner that runs binaries in parallel, such as nextest, must keep this binary apart.)
//!
//! Tests in this file run one at a time (see [`SERIAL`]).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use mysql_async::prelude::*;
use mysql_async::Conn;
use outbox_relay_testkit::{
    binary_logs, binlog_transactions, commit_rows, count_other_transactions, count_table_writes,
    current_binlog_position, describe_record, ensure_at_least_once, ensure_exactly_once,
    ensure_per_key_order, expect_exit_code, find_transaction, global_variable, newest_binlog_file,
    read_all_records, stored_payloads, test_server, wait_until, BinlogPosition, BinlogTransaction,
    GlobalVariableGuard, RelayConfigSpec, RelayProcess, RowGen, World, DEFAULT_CHECKPOINT_TABLE,
};
use tokio::sync::Mutex;

/// The relay binary under test (built on first use).
fn bin() -> &'static str {
    outbox_relay_testkit::relay_bin()
}

/// Relay start-up until its checkpoint row holds a position.
const STARTUP: Duration = Duration::from_secs(60);
/// Records reaching Kafka.
const RELAY_WAIT: Duration = Duration::from_secs(120);
/// A graceful stop until the process has exited.
const STOP: Duration = Duration::from_secs(60);
/// Reading topics that are no longer written.
const READ_ALL: Duration = Duration::from_secs(60);

/// Serialises the tests of this binary: each changes or measures global server state.
static SERIAL: Mutex<()> = Mutex::const_new(());

/// Commits `n` transactions of 4 rows; returns their keys and the last transaction.
async fn write_batches(
    conn: &mut Conn,
    gen: &mut RowGen,
    n: usize,
    order: &mut HashMap<String, usize>,
) -> Result<(HashSet<String>, BinlogTransaction)> {
    let mut keys = HashSet::new();
    let mut last = None;
    for _ in 0..n {
        let before = current_binlog_position(conn).await?;
        let rows = gen.rows(4);
        let gtid = commit_rows(conn, &rows).await?;
        for r in &rows {
            let i = order.len();
            order.insert(r.event_key.clone(), i);
            keys.insert(r.event_key.clone());
        }
        last = Some((before, gtid));
    }
    let (before, gtid) = last.context("no transactions")?;
    let tx = find_transaction(conn, &before, &gtid)
        .await?
        .with_context(|| format!("transaction {gtid} not in the binlog after {before}"))?;
    Ok((keys, tx))
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

/// Checks that the stored checkpoint names a file exactly as `SHOW BINARY LOGS` does.
async fn ensure_checkpoint_file_listed(w: &World, conn: &mut Conn, when: &str) -> Result<()> {
    let cp = w.checkpoint().await?;
    let logs = binary_logs(conn).await?;
    ensure!(
        logs.iter().any(|(name, _)| *name == cp.binlog_file),
        "{when}: checkpoint file {:?} is not a name from SHOW BINARY LOGS {logs:?}",
        cp.binlog_file
    );
    Ok(())
}

/// `binlog_checksum` switched to NONE (which rotates the binlog) and back to CRC32 while the
/// relay runs, with kill -9 and restarts on both sides of the switch (one restart resumes by
/// file and position inside the file without checksums, one by GTID): every row arrives, and the checkpoint file is always exactly a
/// name from `SHOW BINARY LOGS` (no checksum bytes glued to it), at a transaction boundary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checksum_switch_mid_stream() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let mut w = World::new(bin(), "checksum").await?;
    w.spec.checkpoint_interval_ms = 200;
    let topics = vec![w.topic("Order")];
    let mut conn = w.db.conn().await?;
    let mut gen = RowGen::new(&w.uid, "ck", 4);
    let mut order = HashMap::new();
    let mut all = HashSet::new();

    let original = global_variable(&mut conn, "binlog_checksum").await?;
    ensure!(
        original == "CRC32",
        "the test server should run with binlog_checksum=CRC32, has {original}"
    );
    let (relay1, _) = w.start(STARTUP).await?;
    let (keys, _) = write_batches(&mut conn, &mut gen, 3, &mut order).await?;
    all.extend(keys);
    wait_for_keys(&w, &topics, &all, &relay1).await?;

    let file_before = newest_binlog_file(&mut conn).await?;
    let guard = GlobalVariableGuard::set("binlog_checksum", "NONE").await?;
    let outcome = async {
        let none_file = newest_binlog_file(&mut conn).await?;
        ensure!(
            none_file != file_before,
            "SET GLOBAL binlog_checksum did not rotate the binlog ({file_before})"
        );
        let (keys, none_tx) = write_batches(&mut conn, &mut gen, 3, &mut order).await?;
        all.extend(keys);
        wait_for_keys(&w, &topics, &all, &relay1).await?;
        let cp = w
            .wait_checkpoint_covers(&relay1, &none_tx.end, RELAY_WAIT)
            .await?;
        ensure!(
            cp.binlog_file == none_file,
            "checkpoint file {:?}, expected the checksum-less file {none_file:?}",
            cp.binlog_file
        );
        w.ensure_boundary(&cp).await?;
        relay1.kill9()?;

        // Written while no relay runs; the restart resumes inside the checksum-less file.
        // By file and position, so the dump starts with the artificial ROTATE of that file.
        let (keys, down_tx) = write_batches(&mut conn, &mut gen, 3, &mut order).await?;
        all.extend(keys);
        let relay2 = w.spawn_with(&RelayConfigSpec {
            resume: Some("position".into()),
            ..w.spec.clone()
        })?;
        wait_for_keys(&w, &topics, &all, &relay2).await?;
        let cp = w
            .wait_checkpoint_covers(&relay2, &down_tx.end, RELAY_WAIT)
            .await?;
        ensure!(
            cp.binlog_file == none_file,
            "after resuming in the checksum-less file the checkpoint file is {:?}, expected {none_file:?}",
            cp.binlog_file
        );
        w.ensure_boundary(&cp).await?;
        anyhow::Ok((none_file, relay2))
    }
    .await;
    // Back to CRC32 (rotates again) before asserting on the outcome.
    guard.restore().await?;
    let (none_file, relay2) = outcome?;
    ensure_checkpoint_file_listed(&w, &mut conn, "after switching back to CRC32").await?;

    let crc_file = newest_binlog_file(&mut conn).await?;
    ensure!(
        crc_file != none_file,
        "switching back to CRC32 did not rotate the binlog"
    );
    let (keys, crc_tx) = write_batches(&mut conn, &mut gen, 3, &mut order).await?;
    all.extend(keys);
    wait_for_keys(&w, &topics, &all, &relay2).await?;
    let cp = w
        .wait_checkpoint_covers(&relay2, &crc_tx.end, RELAY_WAIT)
        .await?;
    ensure!(
        cp.binlog_file == crc_file,
        "checkpoint file {:?}, expected {crc_file:?}",
        cp.binlog_file
    );
    w.ensure_boundary(&cp).await?;
    relay2.kill9()?;

    // By GTID this time.
    let (keys, last_tx) = write_batches(&mut conn, &mut gen, 3, &mut order).await?;
    all.extend(keys);
    let relay3 = w.spawn_with(&RelayConfigSpec {
        resume: Some("gtid".into()),
        ..w.spec.clone()
    })?;
    wait_for_keys(&w, &topics, &all, &relay3).await?;
    w.wait_checkpoint_covers(&relay3, &last_tx.end, RELAY_WAIT)
        .await?;
    let status = relay3.stop(STOP).await?;
    expect_exit_code(status, 0, &relay3)?;
    let cp = w.checkpoint().await?;
    ensure!(
        cp.binlog_file == crc_file,
        "final checkpoint file {:?}, expected {crc_file:?}",
        cp.binlog_file
    );
    w.ensure_boundary(&cp).await?;

    let records = read_all_records(&w.spec.bootstrap_servers, &topics, READ_ALL).await?;
    let dups = ensure_at_least_once(&records, &all)?;
    ensure_per_key_order(&records, &order)?;
    eprintln!(
        "{} records for {} rows ({dups} duplicates after two kill -9)",
        records.len(),
        all.len()
    );

    drop(conn);
    w.db.drop_database().await
}

/// The binlog cut into consecutive windows, counting the checkpoint writes of some relays
/// (by the database of their state table) in "quiet" windows: windows without any other
/// transaction that follow such a window (so a write caused by earlier traffic of others does
/// not count). Traffic from elsewhere on the shared server then neither hides nor fakes
/// writes the relays make on their own.
struct QuietWindows {
    from: BinlogPosition,
    databases: Vec<String>,
    previous_quiet: bool,
    windows: usize,
    quiet: usize,
    /// Checkpoint writes per database in quiet windows.
    writes: Vec<usize>,
}

impl QuietWindows {
    /// Starts the first window now. It does not count (it may carry writes caused by what
    /// came before).
    async fn start(conn: &mut Conn, databases: &[&str]) -> Result<Self> {
        Ok(Self {
            from: current_binlog_position(conn).await?,
            databases: databases.iter().map(|d| (*d).to_owned()).collect(),
            previous_quiet: false,
            windows: 0,
            quiet: 0,
            writes: vec![0; databases.len()],
        })
    }

    /// Ends the current window and starts the next.
    async fn close(&mut self, conn: &mut Conn) -> Result<()> {
        let to = current_binlog_position(conn).await?;
        let txs = binlog_transactions(conn, &self.from, &to).await?;
        let mut writes = vec![0; self.databases.len()];
        let mut others = 0;
        for tx in &txs {
            let mut own = false;
            for (i, db) in self.databases.iter().enumerate() {
                if tx.writes(db, DEFAULT_CHECKPOINT_TABLE) {
                    writes[i] += 1;
                    own = true;
                }
            }
            others += usize::from(!own);
        }
        let quiet = others == 0;
        if quiet && self.previous_quiet {
            self.quiet += 1;
            for (total, w) in self.writes.iter_mut().zip(writes) {
                *total += w;
            }
        }
        self.previous_quiet = quiet;
        self.windows += 1;
        self.from = to;
        Ok(())
    }
}

/// For `period`, polls the state row every 100 ms and closes a window of `windows` every
/// second; returns how often `updated_at` changed.
async fn watch_idle(
    w: &World,
    conn: &mut Conn,
    windows: &mut QuietWindows,
    period: Duration,
    relay: &RelayProcess,
) -> Result<usize> {
    let start = Instant::now();
    let mut window_start = Instant::now();
    let mut last = w.state().await?.updated_at;
    let mut changes = 0;
    while start.elapsed() < period {
        tokio::time::sleep(Duration::from_millis(100)).await;
        relay.ensure_running()?;
        let now = w.state().await?.updated_at;
        if now != last {
            changes += 1;
            last = now;
        }
        if window_start.elapsed() >= Duration::from_secs(1) {
            windows.close(conn).await?;
            window_start = Instant::now();
        }
    }
    Ok(changes)
}

/// Waits until the state row has not changed for `quiet`.
async fn wait_settled(w: &World, quiet: Duration, relay: &RelayProcess) -> Result<()> {
    let mut last = w.state().await?;
    let mut since = Instant::now();
    wait_until(
        "the checkpoint row to settle",
        Duration::from_secs(60),
        Duration::from_millis(100),
        async || {
            relay.ensure_running()?;
            let now = w.state().await?;
            if now != last {
                last = now;
                since = Instant::now();
            }
            Ok((since.elapsed() >= quiet).then_some(()))
        },
    )
    .await
}

/// The relay's writes to its checkpoint table and the server's other transactions since
/// `from`.
async fn writes_since(w: &World, conn: &mut Conn, from: &BinlogPosition) -> Result<(usize, usize)> {
    let writes = count_table_writes(conn, from, w.db.name(), DEFAULT_CHECKPOINT_TABLE).await?;
    let others =
        count_other_transactions(conn, from, w.db.name(), DEFAULT_CHECKPOINT_TABLE).await?;
    Ok((writes, others))
}

/// With `checkpoint.interval_ms = 200`, a relay whose server is idle for 30 s writes its
/// checkpoint at most twice (its own checkpoint transactions do not count as progress: no write
/// loop). Counted in the binlog (rows events on the checkpoint table) and by polling
/// `updated_at`. Heartbeats (every 1 s, read timeout 3 s) keep the idle stream from being
/// reconnected. Then a busy server with an idle outbox: writes to another table of the same
/// database every 200 ms for ~5 s move the stored checkpoint forward past them (so the binlog it
/// points into can be purged safely), with at most duration / interval + 2 writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_relay_writes_few_checkpoints() -> Result<()> {
    const IDLE: Duration = Duration::from_secs(30);
    const INTERVAL_MS: u64 = 200;
    let _serial = SERIAL.lock().await;
    let mut w = World::new(bin(), "idle").await?;
    w.spec.checkpoint_interval_ms = INTERVAL_MS;
    // Short heartbeats and read timeout: the idle 30 s span 10 read timeouts, which only the
    // server's heartbeats keep from being taken for a dead connection.
    w.spec.heartbeat_interval_ms = Some(1_000);
    w.spec.read_timeout_ms = Some(3_000);
    let topics = vec![w.topic("Order")];
    let mut conn = w.db.conn().await?;
    conn.query_drop(
        "CREATE TABLE business (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, \
         note VARCHAR(64) NOT NULL) ENGINE=InnoDB",
    )
    .await?;
    let mut gen = RowGen::new(&w.uid, "idle", 3);
    let mut order = HashMap::new();

    let (relay, _) = w.start(STARTUP).await?;
    let (keys, last_tx) = write_batches(&mut conn, &mut gen, 3, &mut order).await?;
    wait_for_keys(&w, &topics, &keys, &relay).await?;
    w.wait_checkpoint_covers(&relay, &last_tx.end, RELAY_WAIT)
        .await?;
    wait_settled(&w, Duration::from_secs(2), &relay).await?;

    // Part 1: an idle server for 30 s (a write loop would write ~150 times).
    let idle_from = current_binlog_position(&mut conn).await?;
    let mut windows = QuietWindows::start(&mut conn, &[w.db.name()]).await?;
    let polled = watch_idle(&w, &mut conn, &mut windows, IDLE, &relay).await?;
    let (writes, others) = writes_since(&w, &mut conn, &idle_from).await?;
    eprintln!(
        "idle {IDLE:?}: {writes} checkpoint writes in the binlog, {polled} updated_at changes \
         polled, {others} transactions of others; {} writes in {} quiet one-second windows of {}",
        windows.writes[0], windows.quiet, windows.windows
    );
    ensure!(
        polled <= writes,
        "updated_at changed {polled} times but the binlog shows {writes} checkpoint writes"
    );
    if others == 0 {
        ensure!(
            writes <= 2,
            "the relay wrote its checkpoint {writes} times during {IDLE:?} of an idle server \
             (at most 2 expected): its own checkpoint writes make it write again"
        );
    } else {
        // Others wrote to the shared server meanwhile: judge by the quiet windows.
        ensure!(
            windows.quiet >= 10,
            "the shared server was not idle: {others} transactions of others during {IDLE:?}, \
             only {} of {} one-second windows without them; cannot tell",
            windows.quiet,
            windows.windows
        );
        ensure!(
            windows.writes[0] <= 2,
            "the relay wrote its checkpoint {} times in {} s without any other transaction (at \
             most 2 expected): its own checkpoint writes make it write again",
            windows.writes[0],
            windows.quiet
        );
    }

    let stderr = relay.stderr_text();
    ensure!(
        !stderr.contains("relay interrupted") && stderr.matches("streaming binlog").count() == 1,
        "the relay reconnected while idle (heartbeat_interval_ms = 1000, read_timeout_ms = \
         3000): the server's heartbeats did not keep the stream alive\n{}",
        relay.stderr_tail()
    );

    // Part 2: an idle outbox on a busy server.
    let cp_before = w.checkpoint().await?;
    let busy_from = current_binlog_position(&mut conn).await?;
    let started = Instant::now();
    let mut last_gtid = String::new();
    let mut before_last = busy_from.clone();
    while started.elapsed() < Duration::from_secs(5) {
        before_last = current_binlog_position(&mut conn).await?;
        conn.query_drop("INSERT INTO business (note) VALUES ('not an outbox row')")
            .await?;
        last_gtid = outbox_relay_testkit::last_gtid(&mut conn).await?;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let last_business = find_transaction(&mut conn, &before_last, &last_gtid)
        .await?
        .context("the last business transaction is not in the binlog")?;
    let cp_after = w
        .wait_checkpoint_covers(&relay, &last_business.end, Duration::from_secs(10))
        .await?;
    let elapsed = started.elapsed();
    let (writes, others) = writes_since(&w, &mut conn, &busy_from).await?;
    let bound = usize::try_from(elapsed.as_millis() / u128::from(INTERVAL_MS))? + 2;
    eprintln!(
        "busy {:.1} s: checkpoint {} → {}, {writes} writes (bound {bound}), {others} other \
         transactions",
        elapsed.as_secs_f64(),
        cp_before.position(),
        cp_after.position()
    );
    ensure!(
        cp_after.position() != cp_before.position(),
        "the checkpoint did not move while other tables were written"
    );
    w.ensure_boundary(&cp_after).await?;
    ensure!(
        writes <= bound,
        "{writes} checkpoint writes in {:.1} s with checkpoint.interval_ms = {INTERVAL_MS} (at \
         most {bound} expected)",
        elapsed.as_secs_f64()
    );
    ensure!(
        writes >= 1,
        "no checkpoint write while the checkpoint moved?"
    );

    let status = relay.stop(STOP).await?;
    expect_exit_code(status, 0, &relay)?;
    let records = read_all_records(&w.spec.bootstrap_servers, &topics, READ_ALL).await?;
    ensure_exactly_once(&records, &keys)?;

    drop(conn);
    w.db.drop_database().await
}

/// Two connectors on one server, each with the state table in its own database (the default
/// `checkpoint.table` in each relay's `mysql.url` database). On an idle server neither may keep
/// writing: a checkpoint write of one is a transaction on a table the other does not know, and
/// must not make the other write, whose write would in turn make the first write again (a
/// write loop between two relays at `checkpoint.interval_ms`).
///
/// Measured in one-second windows of the binlog: only windows without any transaction of
/// others (other than the two relays' checkpoint writes), following such a window, count, so
/// traffic from elsewhere on the shared server neither hides nor fakes the loop. Ten such
/// windows are needed within a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_idle_relays_with_separate_state_tables_do_not_feed_each_other() -> Result<()> {
    const WINDOW: Duration = Duration::from_secs(1);
    const QUIET_WINDOWS: usize = 10;
    const GIVE_UP: Duration = Duration::from_secs(60);
    let _serial = SERIAL.lock().await;
    let mut a = World::new(bin(), "pair_a").await?;
    let mut b = World::new(bin(), "pair_b").await?;
    a.spec.checkpoint_interval_ms = 200;
    b.spec.checkpoint_interval_ms = 200;
    let mut conn = a.db.conn().await?;

    let (relay_a, _) = a.start(STARTUP).await?;
    let (relay_b, _) = b.start(STARTUP).await?;
    let mut order = HashMap::new();
    let mut gen = RowGen::new(&a.uid, "pair", 3);
    let (keys, last_tx) = write_batches(&mut conn, &mut gen, 2, &mut order).await?;
    wait_for_keys(&a, &[a.topic("Order")], &keys, &relay_a).await?;
    a.wait_checkpoint_covers(&relay_a, &last_tx.end, RELAY_WAIT)
        .await?;
    b.wait_checkpoint_covers(&relay_b, &last_tx.end, RELAY_WAIT)
        .await?;

    let started = Instant::now();
    let mut windows = QuietWindows::start(&mut conn, &[a.db.name(), b.db.name()]).await?;
    while windows.quiet < QUIET_WINDOWS && started.elapsed() < GIVE_UP {
        tokio::time::sleep(WINDOW).await; // a measurement window, not a synchronisation
        relay_a.ensure_running()?;
        relay_b.ensure_running()?;
        windows.close(&mut conn).await?;
    }
    let (writes_a, writes_b) = (windows.writes[0], windows.writes[1]);
    eprintln!(
        "{} quiet one-second windows of {}: relay A wrote {writes_a} checkpoints, relay B \
         {writes_b}",
        windows.quiet, windows.windows
    );
    ensure!(
        windows.quiet >= QUIET_WINDOWS,
        "the shared server was never idle long enough: {} of {} one-second windows without \
         other transactions (needed {QUIET_WINDOWS}); cannot tell",
        windows.quiet,
        windows.windows
    );
    ensure!(
        writes_a <= 2 && writes_b <= 2,
        "on an idle server two relays kept writing their checkpoints: A {writes_a} times, B \
         {writes_b} times in {} s without any other transaction; each relay's checkpoint write \
         counts as progress for the other (a write loop at checkpoint.interval_ms)",
        windows.quiet
    );

    for (relay, w) in [(&relay_a, &a), (&relay_b, &b)] {
        let status = relay.stop(STOP).await?;
        expect_exit_code(status, 0, relay)?;
        w.ensure_boundary(&w.checkpoint().await?).await?;
    }
    drop(conn);
    b.db.drop_database().await?;
    a.db.drop_database().await
}

/// Binlog compression, each server its own way:
///
/// * MariaDB (`log_bin_compress=ON`, threshold 10 bytes): the server writes Query_compressed and
///   Write_rows_compressed_v1 events, and the compressed DDL is a transaction boundary like any
///   other;
/// * MySQL 8 (`binlog_transaction_compression=ON`, set for the test's session only: the
///   shared server's other clients keep their setting): each DML transaction is one
///   Transaction_payload event (zstd); MySQL never compresses DDL.
///
/// Every row reaches Kafka exactly as stored (key, value bytes as the server returns the
/// payload, headers, timestamp), including a payload of several KB and non-ASCII text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_binlog_events_are_relayed() -> Result<()> {
    use outbox_relay_testkit::{
        insert_outbox_rows, recent_created_at_base, InsertStyle, OutboxRow,
    };

    let _serial = SERIAL.lock().await;
    let w = World::new(bin(), "compress").await?;
    let topic = w.topic("Bestellung");
    let mut conn = w.db.conn().await?;
    let mysql = test_server().is_mysql();
    let guards = if mysql {
        conn.query_drop("SET SESSION binlog_transaction_compression = ON")
            .await?;
        Vec::new()
    } else {
        vec![
            GlobalVariableGuard::set("log_bin_compress_min_len", "10").await?,
            GlobalVariableGuard::set("log_bin_compress", "ON").await?,
        ]
    };
    let outcome = async {
        let (relay, _) = w.start(STARTUP).await?;
        let from = current_binlog_position(&mut conn).await?;

        let base = recent_created_at_base();
        let big: String = (0..400)
            .map(|i| format!("{{\"zeile\":{i},\"text\":\"Grüße aus Köln – 日本語 ✓\"}}"))
            .collect::<Vec<_>>()
            .join(",");
        let row = |n: i64, id: &str, payload: String| OutboxRow {
            aggregate_type: "Bestellung".into(),
            aggregate_id: id.into(),
            event_type: "BestellungAufgegeben".into(),
            event_key: format!("{}-z{n}", w.uid),
            payload,
            created_at_micros: base + n * 1_000_123,
        };
        let rows = vec![
            row(0, "bestellung-ü-1", format!("[{big}]")),
            row(1, "b-2", r#"{"kurz":"ä"}"#.into()),
            row(2, "b-3", r#"{"menge":3,"preis":"12,50 €"}"#.into()),
        ];
        ensure!(
            rows[0].payload.len() > 8_000,
            "the big payload is several KB"
        );
        // One single-row transaction, then a DDL (a compressed QUERY), then two rows in one
        // multi-row statement.
        insert_outbox_rows(&mut conn, "outbox", &rows[..1], InsertStyle::SingleRow).await?;
        conn.query_drop(
            "CREATE TABLE after_first_row (id BIGINT PRIMARY KEY, note VARCHAR(200)) \
             DEFAULT CHARSET utf8mb4",
        )
        .await?;
        let mut tx = conn
            .start_transaction(mysql_async::TxOpts::default())
            .await?;
        insert_outbox_rows(&mut tx, "outbox", &rows[1..], InsertStyle::MultiRow).await?;
        tx.commit().await?;
        let end = current_binlog_position(&mut conn).await?;

        // The server really wrote compressed events (else this test proves nothing).
        let kinds: Vec<String> = conn
            .exec_map(
                format!("SHOW BINLOG EVENTS IN '{}' FROM {}", from.file, from.pos),
                (),
                |(_, _, kind, _, _, _): (String, u64, String, u32, u64, String)| kind,
            )
            .await?;
        let compressed: &[&str] = if mysql {
            &["Transaction_payload"]
        } else {
            &["Query_compressed", "Write_rows_compressed_v1"]
        };
        for wanted in compressed {
            ensure!(
                kinds.iter().any(|k| k == *wanted),
                "no {wanted} event in the binlog after {from}: {kinds:?}"
            );
        }

        let ids: HashMap<String, u64> = conn
            .query_map(
                "SELECT event_key, id FROM outbox",
                |(k, id): (String, u64)| (k, id),
            )
            .await?
            .into_iter()
            .collect();
        let stored = stored_payloads(&mut conn, "outbox").await?;
        let wanted: HashSet<String> = rows.iter().map(|r| r.event_key.clone()).collect();
        wait_for_keys(&w, std::slice::from_ref(&topic), &wanted, &relay).await?;
        w.wait_checkpoint_covers(&relay, &end, RELAY_WAIT).await?;
        relay.stop(STOP).await?;
        let records = read_all_records(
            &w.spec.bootstrap_servers,
            std::slice::from_ref(&topic),
            READ_ALL,
        )
        .await?;
        ensure!(
            records.len() == rows.len(),
            "{} records for {} rows: {records:?}",
            records.len(),
            rows.len()
        );
        let mut records = records;
        records.sort_by_key(|r| r.timestamp_ms);
        for (r, row) in records.iter().zip(&rows) {
            let id = ids
                .get(&row.event_key)
                .with_context(|| format!("no id for {}", row.event_key))?;
            let payload = stored
                .get(&row.event_key)
                .cloned()
                .flatten()
                .with_context(|| format!("no payload stored for {}", row.event_key))?;
            let headers: Vec<(String, Option<Vec<u8>>)> = [
                ("id", id.to_string()),
                ("event_key", row.event_key.clone()),
                ("event_type", row.event_type.clone()),
                ("aggregate_type", row.aggregate_type.clone()),
            ]
            .into_iter()
            .map(|(n, v)| (n.to_owned(), Some(v.into_bytes())))
            .collect();
            ensure!(
                r.key.as_deref() == Some(row.aggregate_id.as_bytes())
                    && r.value.as_deref() == Some(payload.as_bytes())
                    && r.headers == headers
                    && r.timestamp_ms == Some(row.expected_timestamp_ms()),
                "record {}@{} differs from row {}: key {:?}, {} value bytes, headers {:?}, \
                 timestamp {:?}",
                r.partition,
                r.offset,
                row.event_key,
                r.key_str(),
                r.value.as_ref().map_or(0, Vec::len),
                r.headers,
                r.timestamp_ms
            );
        }
        anyhow::Ok(())
    }
    .await;
    for guard in guards.into_iter().rev() {
        guard.restore().await?;
    }
    outcome?;
    drop(conn); // the pool waits for its connections when the database is dropped
    w.db.drop_database().await
}

/// With `binlog_row_metadata=MINIMAL` table maps carry no column names. The relay takes the
/// outbox layout from `information_schema` at its first start, stores it with the checkpoint,
/// and follows the DDL in the binlog: rows written before an `ALTER TABLE` that reorders the
/// columns are decoded with the old layout even though the relay reads them after the ALTER is
/// applied on the server (it was stopped meanwhile), rows after it with the new one. A DDL it
/// cannot follow, because it adds hidden columns (MariaDB's `ADD SYSTEM VERSIONING`, MySQL's
/// functional index), stops it at the next outbox row with the position, instead of a guess.
/// (MySQL 8 runs with `MINIMAL` by default; values are compared with the payload text the
/// server returns, as MySQL normalises JSON.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layouts_are_followed_through_ddl_without_column_names() -> Result<()> {
    use outbox_relay_testkit::{insert_outbox_rows, InsertStyle, OutboxRow};

    let _serial = SERIAL.lock().await;
    let w = World::new(bin(), "layouts").await?;
    let topic = w.topic("Order");
    let mut conn = w.db.conn().await?;
    let guard = GlobalVariableGuard::set("binlog_row_metadata", "MINIMAL").await?;
    let outcome = async {
        let mut gen = RowGen::new(&w.uid, "lay", 3);
        let mut all: Vec<OutboxRow> = Vec::new();
        let (relay, _) = w.start(STARTUP).await?;
        let before = gen.rows(2);
        commit_rows(&mut conn, &before).await?;
        let end = current_binlog_position(&mut conn).await?;
        all.extend(before);
        let wanted: HashSet<String> = all.iter().map(|r| r.event_key.clone()).collect();
        wait_for_keys(&w, std::slice::from_ref(&topic), &wanted, &relay).await?;
        w.wait_checkpoint_covers(&relay, &end, RELAY_WAIT).await?;
        relay.stop(STOP).await?;
        let stored: Option<String> = conn
            .query_first(format!(
                "SELECT table_layouts FROM {DEFAULT_CHECKPOINT_TABLE} WHERE connector_name = '{}'",
                w.connector()
            ))
            .await?
            .flatten();
        ensure!(
            stored.as_deref().is_some_and(|s| s.contains(
                r#"["id","aggregate_type","aggregate_id","event_type","event_key","payload","created_at"]"#
            )),
            "the checkpoint stores the layout: {stored:?}"
        );

        // While the relay is stopped: rows in the old layout, an ALTER that moves every column,
        // rows in the new layout.
        let old_layout = gen.rows(2);
        commit_rows(&mut conn, &old_layout).await?;
        conn.query_drop(
            "ALTER TABLE outbox ADD COLUMN tenant VARCHAR(20) NOT NULL DEFAULT 'acme' FIRST, \
             MODIFY payload JSON NULL AFTER tenant",
        )
        .await?;
        let new_layout = gen.rows(2);
        commit_rows(&mut conn, &new_layout).await?;
        all.extend(old_layout);
        all.extend(new_layout);
        let wanted: HashSet<String> = all.iter().map(|r| r.event_key.clone()).collect();
        let relay = w.spawn()?;
        wait_for_keys(&w, std::slice::from_ref(&topic), &wanted, &relay).await?;
        let records = read_all_records(
            &w.spec.bootstrap_servers,
            std::slice::from_ref(&topic),
            READ_ALL,
        )
        .await?;
        let stored = stored_payloads(&mut conn, "outbox").await?;
        for row in &all {
            let payload = stored.get(&row.event_key).cloned().flatten();
            let r = records
                .iter()
                .find(|r| r.header("event_key") == Some(row.event_key.as_str()))
                .with_context(|| format!("no record for {}", row.event_key))?;
            ensure!(
                r.key_str() == Some(row.aggregate_id.as_str())
                    && payload.is_some()
                    && r.value_str() == payload.as_deref()
                    && r.header("event_type") == Some(row.event_type.as_str())
                    && r.header("aggregate_type") == Some(row.aggregate_type.as_str())
                    && r.timestamp_ms == Some(row.expected_timestamp_ms()),
                "{} was decoded with the wrong layout: {}",
                row.event_key,
                describe_record(r)
            );
        }

        // A DDL the relay cannot follow: the next outbox row stops it, naming the position.
        let hidden_columns = if test_server().is_mysql() {
            "ALTER TABLE outbox ADD INDEX by_upper_type ((UPPER(event_type)))"
        } else {
            "ALTER TABLE outbox ADD SYSTEM VERSIONING"
        };
        conn.query_drop(hidden_columns).await?;
        let after = current_binlog_position(&mut conn).await?;
        insert_outbox_rows(&mut conn, "outbox", &gen.rows(1), InsertStyle::SingleRow).await?;
        let status = relay.wait_exit(STOP).await?;
        let stderr = relay.stderr_text();
        ensure!(
            status.code() == Some(1)
                && stderr.contains("layout is unknown")
                && stderr.contains(&after.file),
            "expected a stop naming the unknown layout; {}\n{stderr}",
            outbox_relay_testkit::describe_exit(&status)
        );
        anyhow::Ok(())
    }
    .await;
    guard.restore().await?;
    drop(conn);
    outcome?;
    w.db.drop_database().await?;
    Ok(())
}

/// `binlog_row_metadata=NO_LOG` (MariaDB's default): `run` and `check` both refuse it with the
/// fix (exit code 3), and `run` says nothing about following layouts first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_log_row_metadata_is_refused_by_run_and_check_alike() -> Result<()> {
    if test_server().is_mysql() {
        println!(
            "not on {}: MySQL's binlog_row_metadata is MINIMAL or FULL (NO_LOG is MariaDB's)",
            test_server().name()
        );
        return Ok(());
    }
    let _serial = SERIAL.lock().await;
    let w = World::new(bin(), "nolog").await?;
    let guard = GlobalVariableGuard::set("binlog_row_metadata", "NO_LOG").await?;
    let outcome = async {
        let relay = w.spawn()?;
        let status = relay.wait_exit(STARTUP).await?;
        expect_exit_code(status, 3, &relay)?;
        let stderr = relay.stderr_text();
        ensure!(
            stderr.contains("binlog_row_metadata")
                && stderr.contains("NO_LOG")
                && stderr.contains("SET GLOBAL binlog_row_metadata=FULL"),
            "{stderr}"
        );
        ensure!(
            !stderr.contains("follows the outbox tables' layouts"),
            "run promised to follow layouts before refusing NO_LOG:\n{stderr}"
        );
        let check =
            RelayProcess::spawn_args(bin(), &["check", "--config"], &w.spec.to_toml(), &[])?;
        let status = check.wait_exit(STARTUP).await?;
        expect_exit_code(status, 3, &check)?;
        let out = check.stdout_text();
        ensure!(
            out.lines().any(|l| l.starts_with("FAIL")
                && l.contains("binlog_row_metadata")
                && l.contains("NO_LOG")),
            "check does not fail binlog_row_metadata=NO_LOG:\n{out}"
        );
        anyhow::Ok(())
    }
    .await;
    guard.restore().await?;
    outcome?;
    w.db.drop_database().await
}

/// Temporal columns in the formats before MySQL 5.6 (a MariaDB table created with
/// `mysql56_temporal_format=OFF`, as tables upgraded from MariaDB 5.3–10.0 have them), with and
/// without fractional seconds, reach Kafka exactly as their 5.6-format twins added later do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pre_5_6_temporal_formats_decode_like_their_5_6_twins() -> Result<()> {
    if test_server().is_mysql() {
        println!(
            "not on {}: MySQL writes the pre-5.6 temporal formats only for tables upgraded from \
             MySQL 5.5, and has no setting to create one",
            test_server().name()
        );
        return Ok(());
    }
    let _serial = SERIAL.lock().await;
    let mut w = World::new(bin(), "oldtime").await?;
    let mut conn = w.db.conn().await?;
    let guard = GlobalVariableGuard::set("mysql56_temporal_format", "OFF").await?;
    let created = conn
        .query_drop(
            "CREATE TABLE old_outbox (
               id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
               aggregate_type VARCHAR(64) NOT NULL, aggregate_id VARCHAR(64) NOT NULL,
               event_type VARCHAR(64) NOT NULL, event_key VARCHAR(64) NOT NULL,
               payload LONGTEXT NOT NULL,
               d0 DATETIME NULL, d6 DATETIME(6) NULL, d3 DATETIME(3) NULL,
               t0 TIME NULL, t4 TIME(4) NULL, ts0 TIMESTAMP NULL, ts6 TIMESTAMP(6) NULL,
               tail VARCHAR(10) NOT NULL
             ) ENGINE=InnoDB",
        )
        .await;
    guard.restore().await?;
    created?;
    // The same columns in the 5.6 formats (ADD COLUMN leaves the old ones as they are).
    conn.query_drop(
        "ALTER TABLE old_outbox ADD COLUMN n_d0 DATETIME NULL, ADD COLUMN n_d6 DATETIME(6) NULL, \
         ADD COLUMN n_d3 DATETIME(3) NULL, ADD COLUMN n_t0 TIME NULL, ADD COLUMN n_t4 TIME(4) NULL, \
         ADD COLUMN n_ts0 TIMESTAMP NULL, ADD COLUMN n_ts6 TIMESTAMP(6) NULL",
    )
    .await?;
    let olds = ["d0", "d6", "d3", "t0", "t4", "ts0", "ts6"];
    let additional: Vec<String> = olds
        .iter()
        .flat_map(|c| [c.to_string(), format!("n_{c}")])
        .map(|c| format!("{{ column = \"{c}\", placement = \"envelope\" }}"))
        .collect();
    let db = w.db.name().to_owned();
    w.spec.tables = Vec::new();
    w.spec.outbox_extra = format!(
        "[[outbox.table]]\nname = \"{db}.old_outbox\"\ncolumns = {{ created_at = \"\" }}\n\
         timestamp = \"commit\"\nadditional = [{}]\n",
        additional.join(", ")
    );
    let topic = w.topic("Order");
    let (relay, _) = w.start(STARTUP).await?;
    let values = "'2026-01-02 03:04:05', '2026-01-02 03:04:05.123456', '1999-12-31 23:59:59.987', \
                  '-838:59:59', '12:34:56.7891', '2026-01-02 03:04:05', '2026-01-02 03:04:05.000001'";
    conn.query_drop("SET time_zone = '+00:00'").await?;
    conn.query_drop(format!(
        "INSERT INTO old_outbox (aggregate_type, aggregate_id, event_type, event_key, payload, \
         d0, d6, d3, t0, t4, ts0, ts6, n_d0, n_d6, n_d3, n_t0, n_t4, n_ts0, n_ts6, tail) \
         VALUES ('Order', 'o-1', 'Created', 'old-1', '{{}}', {values}, {values}, 'end'), \
                ('Order', 'o-1', 'Created', 'old-2', '{{}}', NULL, NULL, NULL, NULL, NULL, NULL, \
                 NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 'end')"
    ))
    .await?;
    let records = outbox_relay_testkit::collect_records(
        &w.spec.bootstrap_servers,
        std::slice::from_ref(&topic),
        2,
        RELAY_WAIT,
    )
    .await
    .with_context(|| relay.stderr_tail())?;
    relay.stop(STOP).await?;
    let envelope = |r: &outbox_relay_testkit::Record| -> Result<serde_json::Value> {
        serde_json::from_str(r.value_str().context("no value")?).context("envelope")
    };
    let first = envelope(&records[0])?;
    for c in olds {
        ensure!(
            first[c] == first[format!("n_{c}")] && !first[c].is_null(),
            "{c}: pre-5.6 {} vs 5.6 {} in {first}",
            first[c],
            first[format!("n_{c}")]
        );
    }
    ensure!(
        first["d6"] == "2026-01-02 03:04:05.123456" && first["t0"] == "-838:59:59",
        "{first}"
    );
    let second = envelope(&records[1])?;
    ensure!(olds.iter().all(|c| second[c].is_null()), "{second}");
    drop(conn);
    w.db.drop_database().await
}
