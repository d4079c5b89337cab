//! The operator commands `check`, `status`, `reset`, `migrate`, `prune` and `republish` against
//! the shared MariaDB (3306) and Kafka (9092). Nothing here changes a global server variable: the
//! evaluation of server settings is unit-tested on values (`ops::check` tests).
//!
//! Expected values come from SQL the tests run themselves (SHOW BINARY LOGS, BINLOG_GTID_POS
//! or on MySQL the binlog's GTID events, information_schema) and from the rows they wrote.

use std::process::ExitStatus;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use mysql_async::prelude::*;
use mysql_async::Conn;
use outbox_relay_testkit::{
    binary_logs, canonical_gtid_set, column_type_as_shown, create_topic, current_binlog_position,
    describe_exit, gtid_set_at, insert_outbox_rows, lease_lock_name, mysql_url,
    recent_created_at_base, unique_suffix, BinlogPosition, InsertStyle, RelayConfigSpec,
    RelayProcess, RowGen, World, DEFAULT_CHECKPOINT_TABLE,
};

/// The relay binary under test (built on first use).
fn bin() -> &'static str {
    outbox_relay_testkit::relay_bin()
}
const EXIT: Duration = Duration::from_secs(90);
const START: Duration = Duration::from_secs(60);

/// Runs `outbox-relay <args> --config <spec>` to its end.
async fn run(spec: &RelayConfigSpec, args: &[&str]) -> Result<(ExitStatus, String, String)> {
    let mut all: Vec<&str> = args.to_vec();
    all.push("--config");
    let p = RelayProcess::spawn_args(bin(), &all, &spec.to_toml(), &[])?;
    let status = p.wait_exit(EXIT).await?;
    Ok((status, p.stdout_text(), p.stderr_text()))
}

fn expect(status: &ExitStatus, code: i32, out: &str, err: &str) -> Result<()> {
    ensure!(
        status.code() == Some(code),
        "expected exit code {code}, got {}\n--- stdout ---\n{out}\n--- stderr ---\n{err}",
        describe_exit(status)
    );
    Ok(())
}

fn has(text: &str, needle: &str) -> Result<()> {
    ensure!(text.contains(needle), "{needle:?} not in:\n{text}");
    Ok(())
}

/// The server's GTID state at `p` (testkit `gtid_set_at`: MariaDB `BINLOG_GTID_POS`, MySQL
/// from the binlog's GTID events), canonical.
async fn gtid_at(conn: &mut Conn, p: &BinlogPosition) -> Result<Option<String>> {
    gtid_set_at(conn, p).await
}

/// A stored GTID state in the canonical form of [`gtid_at`] (MySQL sets may be printed with
/// newlines after commas).
fn canonical(gtid: Option<&str>) -> Result<Option<String>> {
    gtid.map(canonical_gtid_set).transpose()
}

/// Binlog bytes from `from` to `to`, from SHOW BINARY LOGS.
async fn lag(conn: &mut Conn, from: &BinlogPosition, to: &BinlogPosition) -> Result<u64> {
    let logs = binary_logs(conn).await?;
    let a = logs
        .iter()
        .position(|(f, _)| *f == from.file)
        .context("from")?;
    let b = logs.iter().position(|(f, _)| *f == to.file).context("to")?;
    if a == b {
        return Ok(to.pos - from.pos);
    }
    Ok(logs[a].1 - from.pos + logs[a + 1..b].iter().map(|(_, s)| s).sum::<u64>() + to.pos)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_passes_on_a_good_setup_and_names_fixes_on_a_bad_one() -> Result<()> {
    let w = World::new(bin(), "opscheck").await?;
    let db = w.db.name().to_owned();
    let (status, out, err) = run(&w.spec, &["check"]).await?;
    expect(&status, 0, &out, &err)?;
    for line in [
        "OK    binlog_format: ROW".to_owned(),
        "OK    binlog_row_image: FULL".to_owned(),
        format!(
            "OK    outbox table {db}.outbox: has the mapped columns id, aggregate_type, \
             aggregate_id, event_type, event_key, payload, created_at"
        ),
        format!("OK    {db}.outbox.created_at (outbox.columns.created_at): datetime(6)"),
        format!(
            "OK    checkpoint table {db}.outbox_relay_checkpoint: exists with the expected columns"
        ),
        format!("OK    privileges on {db}.outbox_relay_checkpoint: SELECT, INSERT, UPDATE"),
        "OK    Kafka: ".to_owned(),
        " 0 FAIL".to_owned(),
    ] {
        has(&out, &line)?;
    }
    ensure!(!out.contains("FAIL "), "{out}");

    // Break it: a missing column, a wrong type, a missing outbox table, no checkpoint table.
    let mut conn = w.db.conn().await?;
    conn.query_drop(
        "ALTER TABLE outbox DROP COLUMN event_type, MODIFY created_at VARCHAR(32) NULL",
    )
    .await?;
    conn.query_drop("DROP TABLE outbox_relay_checkpoint")
        .await?;
    let mut spec = w.spec.clone();
    spec.tables.push(format!("{db}.no_such_outbox"));
    let (status, out, err) = run(&spec, &["check"]).await?;
    expect(&status, 3, &out, &err)?;
    for line in [
        format!(
            "FAIL  outbox table {db}.outbox: expected the mapped columns, found no column \
             \"event_type\" (outbox.columns.event_type); it has id, aggregate_type, aggregate_id, \
             event_key, payload, created_at\n      fix: map the table's column names in \
             [outbox.columns] (or the table's [[outbox.table]] entry), or add the columns"
        ),
        format!(
            "FAIL  {db}.outbox.created_at (outbox.columns.created_at): expected DATETIME or \
             TIMESTAMP, found varchar(32)\n      fix: ALTER TABLE `{db}`.`outbox` MODIFY \
             `created_at` DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) (converting the \
             existing values), or set outbox.columns.created_at = \"\" (records carry the commit time)"
        ),
        format!(
            "FAIL  outbox table {db}.no_such_outbox: expected an existing table, found no such \
             table (or no SELECT privilege on it)\n      fix: create it (migrations/0001_outbox.sql"
        ),
        format!(
            "FAIL  checkpoint table {db}.outbox_relay_checkpoint: expected the outbox-relay state \
             table, found no such table\n      fix: create it"
        ),
        " 4 FAIL".to_owned(),
    ] {
        has(&out, &line)?;
    }
    // The server settings are still fine.
    has(&out, "OK    binlog_format: ROW")?;
    drop(conn);
    w.db.drop_database().await
}

/// `check` compares the topics' `max.message.bytes` with the producer's limits: a fixed topic
/// that takes smaller batches than the producer builds fails (the fix names `batch.size`);
/// with `batch.size` lowered to fit, it only warns that single large records will be
/// dead-lettered; with `message.max.bytes` lowered too, it passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_compares_topic_max_message_bytes_with_the_producer() -> Result<()> {
    let w = World::new(bin(), "opslimit").await?;
    let db = w.db.name().to_owned();
    let topic = format!("t_{}.orders", w.uid);
    create_topic(&w.spec.bootstrap_servers, &topic, 100_000).await?;
    let mut spec = w.spec.clone();
    spec.topic = topic.clone();
    let name = format!("max.message.bytes of topic of {db}.outbox {topic}");

    let (status, out, err) = run(&spec, &["check"]).await?;
    expect(&status, 3, &out, &err)?;
    has(
        &out,
        &format!(
            "FAIL  {name}: expected at least the producer's batch limit, 1000000 bytes, found \
             max.message.bytes = 100000\n      fix: set \"batch.size\" in [kafka.properties] to \
             at most 100000, or raise the topic's max.message.bytes"
        ),
    )?;
    has(
        &out,
        &format!("otherwise topic {topic} takes record batches of at most 100000 bytes"),
    )?;

    spec.kafka_properties
        .push(("batch.size".into(), "100000".into()));
    let (status, out, err) = run(&spec, &["check"]).await?;
    expect(&status, 0, &out, &err)?;
    has(
        &out,
        &format!(
            "WARN  {name}: expected at least the producer's message.max.bytes + 61 (a record \
             batch's header) = 1000061, found max.message.bytes = 100000\n      fix: a row \
             whose record batch is over 100000 bytes is dead-lettered"
        ),
    )?;
    has(
        &out,
        "set \"message.max.bytes\" in [kafka.properties] to at most 99939",
    )?;

    spec.kafka_properties
        .push(("message.max.bytes".into(), "99939".into()));
    let (status, out, err) = run(&spec, &["check"]).await?;
    expect(&status, 0, &out, &err)?;
    has(
        &out,
        &format!("OK    {name}: max.message.bytes = 100000 takes"),
    )?;
    w.db.drop_database().await
}

/// `binlog_file` and `binlog_pos` of an object of `status --json`.
fn json_position(v: &serde_json::Value) -> Result<BinlogPosition> {
    Ok(BinlogPosition {
        file: v["binlog_file"].as_str().context("binlog_file")?.to_owned(),
        pos: v["binlog_pos"].as_u64().context("binlog_pos")?,
    })
}

/// A caught-up relay's checkpoint stays before its own last checkpoint write: `status` counts
/// only what the relay has still to read, so it reports lag 0 (as `/metrics` does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_of_a_caught_up_relay_reports_lag_0() -> Result<()> {
    let w = World::new(bin(), "opscaught").await?;
    let (relay, _) = w.start(Duration::from_secs(60)).await?;
    let mut conn = w.db.conn().await?;
    let mut gen = outbox_relay_testkit::RowGen::new(&w.uid, "caught", 2);
    outbox_relay_testkit::commit_rows(&mut conn, &gen.rows(3)).await?;
    let end = current_binlog_position(&mut conn).await?;
    w.wait_checkpoint_covers(&relay, &end, Duration::from_secs(60))
        .await?;
    // Other tests of this binary write to the shared server meanwhile: wait for a moment when
    // the relay has read everything.
    let v = outbox_relay_testkit::wait_until(
        "status to report lag 0",
        Duration::from_secs(90),
        Duration::from_millis(500),
        async || {
            let (status, out, err) = run(&w.spec, &["status", "--json"]).await?;
            expect(&status, 0, &out, &err)?;
            let v: serde_json::Value = serde_json::from_str(out.trim()).context(out.clone())?;
            Ok((v["lag"]["bytes"] == 0).then_some(v))
        },
    )
    .await?;
    ensure!(v["lag"]["seconds"] == 0.0, "{v}");
    let (at, server) = (
        json_position(&v["checkpoint"])?,
        json_position(&v["server"])?,
    );
    ensure!(
        at != server,
        "the relay's own checkpoint write follows its checkpoint, so the two differ: {v}"
    );
    outbox_relay_testkit::expect_exit_code(relay.stop(Duration::from_secs(60)).await?, 0, &relay)?;
    drop(conn);
    w.db.drop_database().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reports_the_checkpoint_row_lag_and_lease() -> Result<()> {
    let w = World::new(bin(), "opsstatus").await?;
    let mut conn = w.db.conn().await?;
    let cp = w.db.created_at_binlog().clone();
    let gtid = gtid_at(&mut conn, &cp)
        .await?
        .context("the server has GTIDs")?;
    conn.query_drop("SET time_zone = '+00:00'").await?;
    conn.exec_drop(
        "INSERT INTO outbox_relay_checkpoint (connector_name, binlog_file, binlog_pos, \
         rows_acked, gtid_set, source_server_id, lease_token, lease_owner, updated_at) \
         VALUES (?, ?, ?, 3, ?, @@server_id, 7, 'opshost:4242', UTC_TIMESTAMP(6) - INTERVAL 90 SECOND)",
        (w.connector(), &cp.file, cp.pos, &gtid),
    )
    .await?;
    // A row the relay has not read: lag that is not the checkpoint table's own writes.
    let unread = current_binlog_position(&mut conn).await?;
    conn.query_drop(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, event_key, payload) \
         VALUES ('Order', 'o-1', 'Created', 'unread', '{}')",
    )
    .await?;
    let before = current_binlog_position(&mut conn).await?;
    // rows_acked 3 of the transaction after the checkpoint (it has no outbox row): its bytes
    // are not lag, the unread row's are.
    let lag_before = lag(&mut conn, &unread, &before).await?;
    let (status, out, err) = run(&w.spec, &["status"]).await?;
    expect(&status, 0, &out, &err)?;
    for line in [
        format!("connector         {}", w.connector()),
        format!("checkpoint        {}:{} (rows_acked 3)", cp.file, cp.pos),
        format!("checkpoint gtid   {gtid}"),
        "lease             free (last owner opshost:4242, token 7)".to_owned(),
        " (1 min 30 s ago)".to_owned(),
    ] {
        has(&out, &line)?;
    }

    // Hold the lease as a relay would: --json says who.
    let mut holder = Conn::from_url(mysql_url(None)).await?;
    let lock = lease_lock_name(w.db.name(), DEFAULT_CHECKPOINT_TABLE, w.connector());
    let got: Option<i64> = holder.exec_first("SELECT GET_LOCK(?, 5)", (&lock,)).await?;
    ensure!(got == Some(1), "GET_LOCK {lock}");
    let holder_id: u64 = holder
        .query_first("SELECT CONNECTION_ID()")
        .await?
        .context("id")?;
    let (status, out, err) = run(&w.spec, &["status", "--json"]).await?;
    let after = current_binlog_position(&mut conn).await?;
    let lag_after = lag(&mut conn, &cp, &after).await?;
    holder.exec_drop("DO RELEASE_LOCK(?)", (&lock,)).await.ok();
    drop(holder);
    expect(&status, 0, &out, &err)?;
    let v: serde_json::Value = serde_json::from_str(out.trim()).context(out.clone())?;
    ensure!(v["connector"] == w.connector(), "{v}");
    ensure!(
        v["checkpoint_table"] == format!("{}.outbox_relay_checkpoint", w.db.name()),
        "{v}"
    );
    let c = &v["checkpoint"];
    ensure!(
        c["binlog_file"] == cp.file.as_str() && c["binlog_pos"] == cp.pos,
        "{v}"
    );
    ensure!(
        c["rows_acked"] == 3 && c["gtid_set"] == gtid.as_str(),
        "{v}"
    );
    ensure!(c["available"] == true, "{v}");
    let age = c["age_seconds"].as_f64().context("age")?;
    ensure!((90.0..150.0).contains(&age), "age {age}: {v}");
    let lease = &v["lease"];
    ensure!(
        lease["held"] == true && lease["holder_connection_id"] == holder_id,
        "{v}"
    );
    ensure!(
        lease["owner"] == "opshost:4242" && lease["token"] == 7,
        "{v}"
    );
    let bytes = v["lag"]["bytes"].as_u64().context("lag bytes")?;
    ensure!(
        (lag_before..=lag_after).contains(&bytes),
        "lag {bytes} not within [{lag_before}, {lag_after}]: {v}"
    );
    ensure!(
        bytes == 0 || v["lag"]["seconds"].as_f64() == Some(age),
        "{v}"
    );
    let server_pos = json_position(&v["server"])?;
    ensure!(
        lag(&mut conn, &before, &server_pos).await.is_ok()
            && lag(&mut conn, &server_pos, &after).await.is_ok(),
        "server position {server_pos} not between {before} and {after}"
    );
    drop(conn);
    w.db.drop_database().await
}

/// An outbox INSERT logged as a statement stops a relay without dead letters (exit 1), and
/// the message's own directions get past it: the `SHOW BINLOG EVENTS` it names leads to the
/// transaction's COMMIT, `reset --to` there moves the checkpoint, and the next rows arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_logged_insert_stops_with_directions_that_get_past_it() -> Result<()> {
    let w = World::new(bin(), "opsstmt").await?;
    let (relay, _) = w.start(START).await?;
    let mut conn = w.db.conn().await?;
    conn.query_drop("SET SESSION binlog_format = STATEMENT")
        .await?;
    conn.query_drop(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, event_key, payload) \
         VALUES ('Order', 'o-1', 'Created', 'as-statement', '{}')",
    )
    .await?;
    conn.query_drop("SET SESSION binlog_format = ROW").await?;
    let status = relay.wait_exit(EXIT).await?;
    outbox_relay_testkit::expect_exit_code(status, 1, &relay)?;
    let err = relay.stderr_text();
    has(&err, "logged as a statement")?;
    has(&err, "[dead_letter] enabled = true")?;
    // The message names `SHOW BINLOG EVENTS IN 'file' FROM pos LIMIT 3`: follow it.
    let shown = err
        .split("SHOW BINLOG EVENTS IN '")
        .nth(1)
        .context("no SHOW BINLOG EVENTS in the message")?;
    let (file, rest) = shown.split_once("' FROM ").context("no FROM")?;
    let pos: u64 = rest
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .context("no position after FROM")?;
    let events: Vec<mysql_async::Row> = conn
        .query(format!("SHOW BINLOG EVENTS IN '{file}' FROM {pos} LIMIT 3"))
        .await?;
    let commit_end: u64 = events
        .iter()
        .find(|r| {
            let kind: String = r.get(2).unwrap_or_default();
            let info: String = r.get(5).unwrap_or_default();
            kind == "Xid" || (kind == "Query" && info.trim() == "COMMIT")
        })
        .and_then(|r| r.get(4))
        .context("no COMMIT or Xid among the events the message points at")?;
    let to = format!("{file}:{commit_end}");
    let (status, out, e) = run(&w.spec, &["reset", "--to", &to, "--yes"]).await?;
    expect(&status, 0, &out, &e)?;

    let relay = w.spawn()?;
    let mut gen = RowGen::new(&w.uid, "after", 1);
    let rows = gen.rows(2);
    outbox_relay_testkit::commit_rows(&mut conn, &rows).await?;
    let topic = w.topic(&rows[0].aggregate_type);
    let records = outbox_relay_testkit::collect_records(
        &w.spec.bootstrap_servers,
        std::slice::from_ref(&topic),
        rows.len(),
        EXIT,
    )
    .await
    .with_context(|| relay.stderr_tail())?;
    outbox_relay_testkit::expect_exit_code(relay.stop(EXIT).await?, 0, &relay)?;
    let keys: Vec<_> = records
        .iter()
        .filter_map(|r| r.header("event_key"))
        .collect();
    ensure!(
        keys == rows
            .iter()
            .map(|r| r.event_key.as_str())
            .collect::<Vec<_>>(),
        "after the reset only the new rows arrive, in order: {keys:?}"
    );
    drop(conn);
    w.db.drop_database().await
}

async fn state(w: &World) -> Result<outbox_relay_testkit::StateRow> {
    w.state().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_moves_the_checkpoint_and_refuses_what_the_server_lacks() -> Result<()> {
    let w = World::new(bin(), "opsreset").await?;
    let mut conn = w.db.conn().await?;
    let logs = binary_logs(&mut conn).await?;
    let (first, _) = logs.first().context("binlogs")?.clone();
    let (last, last_size) = logs.last().context("binlogs")?.clone();

    // A file the server does not have (before the first one), a position past the end.
    let (base, seq) = first.rsplit_once('.').context("name")?;
    let gone = format!(
        "{base}.{:0width$}",
        seq.parse::<u64>()? - 1,
        width = seq.len()
    );
    let (status, out, err) =
        run(&w.spec, &["reset", "--to", &format!("{gone}:4"), "--yes"]).await?;
    expect(&status, 2, &out, &err)?;
    has(
        &err,
        &format!("the server no longer has (or never had) binlog file {gone:?}"),
    )?;
    let past = format!("{last}:{}", last_size + 100_000_000);
    let (status, out, err) = run(&w.spec, &["reset", "--to", &past, "--yes"]).await?;
    expect(&status, 2, &out, &err)?;
    has(&err, "is outside the file")?;

    // A position inside a transaction: the end of the table map event of our insert.
    let start = current_binlog_position(&mut conn).await?;
    let mut gen = RowGen::new(&w.uid, "r", 2);
    let rows = gen.rows(2);
    let mut tx = conn.start_transaction(Default::default()).await?;
    insert_outbox_rows(&mut tx, "outbox", &rows, InsertStyle::MultiRow).await?;
    tx.commit().await?;
    let events: Vec<mysql_async::Row> = conn
        .query(format!(
            "SHOW BINLOG EVENTS IN '{}' FROM {} LIMIT 2000",
            start.file, start.pos
        ))
        .await?;
    // Where our table map event ends: where the next event starts (MariaDB 11.4 shows
    // End_log_pos 0 for the events inside a transaction).
    let table_map_end = events
        .windows(2)
        .find_map(|pair| {
            let kind: String = pair[0].get(2)?;
            let info: String = pair[0].get(5)?;
            (kind == "Table_map" && info.contains(&format!("({}.outbox)", w.db.name())))
                .then(|| pair[1].get::<u64, _>(1))
                .flatten()
        })
        .context("our table map event")?;
    let inside = format!("{}:{table_map_end}", start.file);
    let (status, out, err) = run(&w.spec, &["reset", "--to", &inside, "--yes"]).await?;
    expect(&status, 2, &out, &err)?;
    has(
        &err,
        &format!("{inside} is not a transaction boundary: it is inside a transaction"),
    )?;
    ensure!(
        outbox_relay_testkit::read_state_row(w.db.pool(), DEFAULT_CHECKPOINT_TABLE, w.connector())
            .await?
            .is_none_or(|r| r.is_placeholder()),
        "a refused reset wrote a position"
    );

    // FILE:POS (a transaction boundary: the server's end after our commit), dry run first.
    let target = current_binlog_position(&mut conn).await?;
    let to = target.to_string();
    let (status, out, err) = run(&w.spec, &["reset", "--to", &to]).await?;
    expect(&status, 4, &out, &err)?;
    has(
        &out,
        "not applied: nothing changed (run again with --yes to write it)",
    )?;
    has(&out, &format!("new         {to} (rows_acked 0, gtid "))?;
    let unchanged = state(&w).await?;
    let (status, out, err) = run(&w.spec, &["reset", "--to", &to, "--dry-run"]).await?;
    expect(&status, 0, &out, &err)?;
    has(&out, "not applied: nothing changed")?;
    let after_plans = state(&w).await?;
    ensure!(
        after_plans.position() == unchanged.position()
            && after_plans.lease_token == unchanged.lease_token,
        "a plan changed the checkpoint: {unchanged:?} -> {after_plans:?}"
    );
    let (status, out, err) = run(&w.spec, &["reset", "--to", &to, "--yes"]).await?;
    expect(&status, 0, &out, &err)?;
    let row = state(&w).await?;
    let server_id: u32 = conn
        .query_first("SELECT @@server_id")
        .await?
        .context("id")?;
    ensure!(row.position() == target, "{row:?}");
    ensure!(
        row.rows_acked == 0 && row.source_server_id == server_id,
        "{row:?}"
    );
    ensure!(
        canonical(row.gtid_set.as_deref())? == gtid_at(&mut conn, &target).await?,
        "{row:?}"
    );
    has(
        &out,
        &format!(
            "done        checkpoint written under lease token {}",
            row.lease_token
        ),
    )?;
    let token = row.lease_token;

    // latest, past rows the relay never relayed: the plan counts and names them.
    let late = gen.rows(3);
    let mut tx = conn.start_transaction(Default::default()).await?;
    insert_outbox_rows(&mut tx, "outbox", &late[..2], InsertStyle::SingleRow).await?;
    tx.commit().await?;
    insert_outbox_rows(&mut conn, "outbox", &late[2..], InsertStyle::SingleRow).await?;
    let skipped = format!(
        "skipped     3 outbox rows: {}, {}, {}",
        late[0].event_key, late[1].event_key, late[2].event_key
    );
    let (status, out, err) = run(&w.spec, &["reset", "--to", "latest"]).await?;
    eprintln!("--- reset --to latest ---\n{out}{err}");
    expect(&status, 4, &out, &err)?;
    has(&out, "moves FORWARD")?;
    has(&out, &skipped)?;
    let before = current_binlog_position(&mut conn).await?;
    let (status, out, err) = run(&w.spec, &["reset", "--to", "latest", "--yes"]).await?;
    expect(&status, 0, &out, &err)?;
    has(&out, &skipped)?;
    let after = current_binlog_position(&mut conn).await?;
    let row = state(&w).await?;
    ensure!(
        row.lease_token == token + 1,
        "the reset must take a new lease token: {row:?}"
    );
    lag(&mut conn, &before, &row.position())
        .await
        .context("latest before the command")?;
    lag(&mut conn, &row.position(), &after)
        .await
        .context("latest after the command")?;
    ensure!(
        canonical(row.gtid_set.as_deref())? == gtid_at(&mut conn, &row.position()).await?,
        "{row:?}"
    );

    // A GTID position (a move back from latest, so the plan reads no binlog): kept as given;
    // the position is where the binlog goes on after it.
    let gtid = gtid_at(&mut conn, &target).await?.context("gtid")?;
    let (status, out, err) = run(&w.spec, &["reset", "--to", &gtid, "--yes"]).await?;
    expect(&status, 0, &out, &err)?;
    let row = state(&w).await?;
    ensure!(
        canonical(row.gtid_set.as_deref())?.as_deref() == Some(gtid.as_str()),
        "{row:?}"
    );
    let next_gtid: Vec<mysql_async::Row> = conn
        .query(format!(
            "SHOW BINLOG EVENTS IN '{}' FROM {} LIMIT 50",
            target.file, target.pos
        ))
        .await?;
    if let Some(pos) = next_gtid.iter().find_map(|r| {
        (r.get::<String, _>(2)? == "Gtid")
            .then(|| r.get::<u64, _>(1))
            .flatten()
    }) {
        ensure!(
            row.position()
                == BinlogPosition {
                    file: target.file.clone(),
                    pos
                },
            "GTID {gtid}: {row:?}, expected {}:{pos}",
            target.file
        );
    }

    // earliest (last: a forward move from it would count the rows of the whole binlog)
    let (status, out, err) = run(&w.spec, &["reset", "--to", "earliest", "--yes"]).await?;
    expect(&status, 0, &out, &err)?;
    let row = state(&w).await?;
    let first_now = binary_logs(&mut conn)
        .await?
        .first()
        .context("logs")?
        .0
        .clone();
    ensure!(
        row.binlog_file == first_now && row.binlog_pos == 4,
        "{row:?}"
    );
    has(&out, "moves BACK")?;

    // While a relay holds the lease: refused, nothing written.
    let relay = w.spawn()?;
    let held = outbox_relay_testkit::wait_until(
        "the relay to take the lease",
        START,
        Duration::from_millis(100),
        async || {
            relay.ensure_running()?;
            let row = state(&w).await?;
            Ok((row.lease_owner_pid() == Some(relay.pid())).then_some(row))
        },
    )
    .await?;
    let (status, out, err) = run(&w.spec, &["reset", "--to", "latest", "--yes"]).await?;
    expect(&status, 3, &out, &err)?;
    has(&err, &format!("lease of connector {:?}", w.connector()))?;
    has(&err, "held by connection")?;
    let now = state(&w).await?;
    ensure!(now.lease_token == held.lease_token, "{held:?} -> {now:?}");
    relay.stop(EXIT).await?;
    drop(conn);
    w.db.drop_database().await
}

/// The columns of a table, in order, with their types.
async fn columns(conn: &mut Conn, db: &str, table: &str) -> Result<Vec<(String, String)>> {
    Ok(conn
        .exec(
            "SELECT COLUMN_NAME, COLUMN_TYPE FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION",
            (db, table),
        )
        .await?)
}

/// The collation of `db`.outbox's event_key column.
async fn event_key_collation(conn: &mut Conn, db: &str) -> Result<Option<String>> {
    Ok(conn
        .exec_first(
            "SELECT COLLATION_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? \
             AND TABLE_NAME = 'outbox' AND COLUMN_NAME = 'event_key'",
            (db,),
        )
        .await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_creates_then_changes_nothing_and_upgrades_old_layouts() -> Result<()> {
    let db = format!("ops_migrate_{}", unique_suffix());
    let mut admin = Conn::from_url(mysql_url(None)).await?;
    admin.query_drop(format!("CREATE DATABASE `{db}`")).await?;
    let uid = unique_suffix();
    let spec = RelayConfigSpec {
        kafka_properties: Vec::new(),
        unknown_xa_commit: None,
        http_listen: None,
        ..RelayConfigSpec::for_tables(
            &format!("mig-{uid}"),
            &mysql_url(Some(&db)),
            outbox_relay_testkit::next_server_id(),
            vec![format!("{db}.outbox")],
            &format!("t_{uid}.outbox.event.{{aggregate_type}}"),
        )
    };
    let (status, out, err) = run(&spec, &["migrate", "--outbox"]).await?;
    expect(&status, 0, &out, &err)?;
    ensure!(
        out.trim() == format!("{db}.outbox_relay_checkpoint: created\n{db}.outbox: created"),
        "{out}"
    );
    // The layouts of migrations/0002_checkpoint.sql and 0001_outbox.sql (integer types as the
    // server shows them: MySQL 8.0 without display widths).
    let expected_cp = [
        ("connector_name", "varchar(191)"),
        ("binlog_file", "varchar(255)"),
        ("binlog_pos", "bigint(20) unsigned"),
        ("rows_acked", "bigint(20) unsigned"),
        ("gtid_set", "text"),
        ("source_server_id", "int(10) unsigned"),
        ("source_server_uuid", "varchar(64)"),
        ("lease_token", "bigint(20) unsigned"),
        ("lease_owner", "varchar(255)"),
        ("table_layouts", "mediumtext"),
        ("updated_at", "timestamp(6)"),
    ]
    .map(|(a, b)| (a.to_owned(), column_type_as_shown(b)))
    .to_vec();
    let have = columns(&mut admin, &db, "outbox_relay_checkpoint").await?;
    ensure!(have == expected_cp, "{have:?}, expected {expected_cp:?}");
    let outbox_cols: Vec<String> = columns(&mut admin, &db, "outbox")
        .await?
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    ensure!(
        outbox_cols
            == [
                "id",
                "aggregate_type",
                "aggregate_id",
                "event_type",
                "event_key",
                "payload",
                "created_at"
            ],
        "{outbox_cols:?}"
    );
    let show = |t: &'static str| format!("SHOW CREATE TABLE `{db}`.`{t}`");
    let cp_before: Option<(String, String)> =
        admin.query_first(show("outbox_relay_checkpoint")).await?;
    let ob_before: Option<(String, String)> = admin.query_first(show("outbox")).await?;

    let (status, out, err) = run(&spec, &["migrate", "--outbox"]).await?;
    expect(&status, 0, &out, &err)?;
    ensure!(
        out.trim()
            == format!(
                "{db}.outbox_relay_checkpoint: up to date (unchanged)\n{db}.outbox: up to date (unchanged)"
            ),
        "{out}"
    );
    ensure!(
        admin
            .query_first::<(String, String), _>(show("outbox_relay_checkpoint"))
            .await?
            == cp_before
    );
    ensure!(
        admin
            .query_first::<(String, String), _>(show("outbox"))
            .await?
            == ob_before
    );

    // The first layout (before rows_acked and the lease) is upgraded in place, rows kept.
    admin
        .query_drop(format!("DROP TABLE `{db}`.outbox_relay_checkpoint"))
        .await?;
    admin
        .query_drop(format!(
            "CREATE TABLE `{db}`.outbox_relay_checkpoint (connector_name VARCHAR(191) NOT NULL, \
             binlog_file VARCHAR(255) NOT NULL, binlog_pos BIGINT UNSIGNED NOT NULL, \
             gtid_set TEXT NULL, source_server_id INT UNSIGNED NOT NULL, \
             source_server_uuid VARCHAR(64) NULL, updated_at TIMESTAMP(6) NOT NULL DEFAULT \
             CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6), PRIMARY KEY (connector_name)) \
             ENGINE = InnoDB DEFAULT CHARSET = utf8mb4; \
             INSERT INTO `{db}`.outbox_relay_checkpoint (connector_name, binlog_file, binlog_pos, \
             source_server_id) VALUES ('old', 'bin.000007', 1234, 1)"
        ))
        .await?;
    let (status, out, err) = run(&spec, &["migrate"]).await?;
    expect(&status, 0, &out, &err)?;
    ensure!(
        out.trim()
            == format!("{db}.outbox_relay_checkpoint: upgraded (added rows_acked, lease_token, lease_owner, table_layouts)"),
        "{out}"
    );
    let have = columns(&mut admin, &db, "outbox_relay_checkpoint").await?;
    ensure!(have == expected_cp, "{have:?}, expected {expected_cp:?}");
    let kept: Option<(String, u64, u64, u64)> = admin
        .query_first(format!(
            "SELECT binlog_file, binlog_pos, rows_acked, lease_token FROM `{db}`.outbox_relay_checkpoint"
        ))
        .await?;
    ensure!(kept == Some(("bin.000007".into(), 1234, 0, 0)), "{kept:?}");
    let (status, out, err) = run(&spec, &["migrate"]).await?;
    expect(&status, 0, &out, &err)?;
    has(&out, "up to date (unchanged)")?;

    // A state table of the releases before MEDIUMTEXT layouts is widened in place.
    admin
        .query_drop(format!(
            "ALTER TABLE `{db}`.outbox_relay_checkpoint MODIFY table_layouts TEXT NULL"
        ))
        .await?;
    let (status, out, err) = run(&spec, &["migrate"]).await?;
    expect(&status, 0, &out, &err)?;
    ensure!(
        out.trim()
            == format!("{db}.outbox_relay_checkpoint: upgraded (widened table_layouts mediumtext)"),
        "{out}"
    );
    let have = columns(&mut admin, &db, "outbox_relay_checkpoint").await?;
    ensure!(have == expected_cp, "{have:?}, expected {expected_cp:?}");

    // An outbox created by the older 0001_outbox.sql (event_key in the database's default,
    // case-insensitive collation): `migrate --outbox` makes its unique key byte-exact, keeping
    // the rows, and a key differing only in case is then a new event.
    let nopad = if outbox_relay_testkit::env::test_server().is_mysql() {
        "utf8mb4_0900_bin"
    } else {
        "utf8mb4_nopad_bin"
    };
    ensure!(event_key_collation(&mut admin, &db).await?.as_deref() == Some(nopad));
    admin
        .query_drop(format!(
            "ALTER TABLE `{db}`.outbox MODIFY event_key VARCHAR(255) CHARACTER SET utf8mb4 \
             COLLATE utf8mb4_general_ci NOT NULL; \
             INSERT INTO `{db}`.outbox (aggregate_type, aggregate_id, event_type, event_key) \
             VALUES ('Order', 'o-1', 'Created', 'evt-a')"
        ))
        .await?;
    let (status, out, err) = run(&spec, &["migrate", "--outbox"]).await?;
    expect(&status, 0, &out, &err)?;
    ensure!(
        out.trim()
            == format!(
                "{db}.outbox_relay_checkpoint: up to date (unchanged)\n{db}.outbox: upgraded \
                 (compares event_key {nopad} byte for byte)"
            ),
        "{out}"
    );
    ensure!(event_key_collation(&mut admin, &db).await?.as_deref() == Some(nopad));
    admin
        .query_drop(format!(
            "INSERT INTO `{db}`.outbox (aggregate_type, aggregate_id, event_type, event_key) \
             VALUES ('Order', 'o-1', 'Created', 'evt-A')"
        ))
        .await?;
    let keys: Vec<String> = admin
        .query(format!("SELECT event_key FROM `{db}`.outbox ORDER BY id"))
        .await?;
    ensure!(keys == ["evt-a", "evt-A"], "{keys:?}");
    let (status, out, err) = run(&spec, &["migrate", "--outbox"]).await?;
    expect(&status, 0, &out, &err)?;
    has(&out, &format!("{db}.outbox: up to date (unchanged)"))?;
    admin.query_drop(format!("DROP DATABASE `{db}`")).await?;
    Ok(())
}

/// Inserts `row` alone, stamped now as an application writes it (RowGen's rows are an hour
/// old); returns it as inserted.
async fn insert_now(
    conn: &mut Conn,
    mut row: outbox_relay_testkit::OutboxRow,
) -> Result<outbox_relay_testkit::OutboxRow> {
    row.created_at_micros = chrono::Utc::now().timestamp_micros();
    insert_outbox_rows(
        conn,
        "outbox",
        std::slice::from_ref(&row),
        InsertStyle::SingleRow,
    )
    .await?;
    Ok(row)
}

async fn outbox_ids(conn: &mut Conn) -> Result<Vec<u64>> {
    Ok(conn.query("SELECT id FROM outbox ORDER BY id").await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_deletes_only_rows_that_are_old_and_relayed() -> Result<()> {
    let w = World::new(bin(), "opsprune").await?;
    let mut conn = w.db.conn().await?;
    let now = recent_created_at_base() + 3_600_000_000;
    let mut gen = RowGen::new(&w.uid, "p", 3);
    let day = 86_400_000_000i64;
    let mut rows = gen.rows(6);
    for (i, r) in rows.iter_mut().enumerate() {
        // ids 1..=3 are 10 days old, 4 is 6 days old, 5..=6 an hour old.
        r.created_at_micros = match i {
            0..=2 => now - 10 * day,
            3 => now - 6 * day,
            _ => now - 3_600_000_000,
        };
    }
    let (relay, _) = w.start(START).await?;
    insert_outbox_rows(&mut conn, "outbox", &rows, InsertStyle::SingleRow).await?;
    let end = current_binlog_position(&mut conn).await?;
    w.wait_checkpoint_covers(&relay, &end, START).await?;
    relay.stop(EXIT).await?;

    // Two more old rows the stopped relay has not relayed: ids 7, 8.
    let mut late = gen.rows(2);
    for r in &mut late {
        r.created_at_micros = now - 10 * day;
    }
    insert_outbox_rows(&mut conn, "outbox", &late, InsertStyle::SingleRow).await?;
    let all = outbox_ids(&mut conn).await?;
    ensure!(all == (1..=8).collect::<Vec<u64>>(), "{all:?}");

    let (status, out, err) = run(
        &w.spec,
        &[
            "prune",
            "--yes",
            "--older-than",
            "7d",
            "--max-wait-ms",
            "1500",
        ],
    )
    .await?;
    expect(&status, 1, &out, &err)?;
    has(&err, "does not cover the binlog up to")?;
    has(&err, "Write_rows")?;
    ensure!(
        outbox_ids(&mut conn).await? == all,
        "nothing may be deleted while rows are unrelayed"
    );

    // The relay catches up; then the old rows go, in batches of 2, and the others stay.
    let relay = w.spawn()?;
    let end = current_binlog_position(&mut conn).await?;
    w.wait_checkpoint_covers(&relay, &end, START).await?;
    // Without --yes: the counts, exit 4, nothing deleted; --dry-run: the same, exit 0.
    let (status, out, err) = run(&w.spec, &["prune", "--older-than", "7d"]).await?;
    expect(&status, 4, &out, &err)?;
    has(
        &out,
        &format!("{}.outbox: 5 rows would be deleted", w.db.name()),
    )?;
    has(
        &out,
        "not confirmed: nothing changed; run again with --yes to delete them",
    )?;
    ensure!(outbox_ids(&mut conn).await? == all);
    let (status, out, err) = run(&w.spec, &["prune", "--older-than", "7d", "--dry-run"]).await?;
    expect(&status, 0, &out, &err)?;
    has(
        &out,
        &format!("{}.outbox: 5 rows would be deleted", w.db.name()),
    )?;
    has(&out, "dry run: nothing changed")?;
    ensure!(outbox_ids(&mut conn).await? == all);
    let (status, out, err) = run(
        &w.spec,
        &[
            "prune",
            "--yes",
            "--older-than",
            "7d",
            "--batch-size",
            "2",
            "--pause-ms",
            "10",
        ],
    )
    .await?;
    expect(&status, 0, &out, &err)?;
    has(&out, &format!("{}.outbox: deleted 5 rows", w.db.name()))?;
    let left = outbox_ids(&mut conn).await?;
    ensure!(left == vec![4, 5, 6], "{left:?}");
    relay.stop(EXIT).await?;

    // A mapping without created_at cannot be pruned.
    let mut spec = w.spec.clone();
    spec.outbox_extra = "[outbox.columns]\ncreated_at = \"\"\n".into();
    spec.timestamp = None; // "column" needs created_at
    let (status, out, err) = run(&spec, &["prune", "--older-than", "7d"]).await?;
    expect(&status, 2, &out, &err)?;
    has(&err, "has no created_at column mapped")?;
    drop(conn);
    w.db.drop_database().await
}

/// `republish` (issue 17): rows selected by event_key, by a created_at range and by a WHERE
/// clause go to Kafka again as the records `run` sent (same topic, key, value, headers) plus
/// `republished_at`, in id order per key; without --yes only the plan is printed and nothing
/// is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn republish_sends_selected_rows_again_as_run_sent_them() -> Result<()> {
    let w = World::new(bin(), "opsrepub").await?;
    let mut conn = w.db.conn().await?;
    let base = recent_created_at_base() - 3_600_000_000;
    let mut gen = RowGen::new(&w.uid, "r", 2);
    let mut rows = gen.rows(6);
    for (i, r) in rows.iter_mut().enumerate() {
        // A minute apart, so whole-second bounds select exactly.
        r.created_at_micros = base + i64::try_from(i)? * 60_000_000;
    }
    let (relay, _) = w.start(START).await?;
    insert_outbox_rows(&mut conn, "outbox", &rows, InsertStyle::SingleRow).await?;
    let topics = vec![w.topic("Order")];
    let keys: std::collections::HashSet<String> =
        rows.iter().map(|r| r.event_key.clone()).collect();
    let originals = w
        .wait_for_keys(&topics, &keys, Some(&relay), Duration::from_secs(120))
        .await?;
    relay.stop(EXIT).await?;
    let bootstrap = w.spec.bootstrap_servers.clone();
    let count = async || -> Result<usize> {
        Ok(
            outbox_relay_testkit::read_all_records(&bootstrap, &topics, Duration::from_secs(60))
                .await?
                .len(),
        )
    };
    ensure!(count().await? == 6, "the relay sent other than 6 records");

    // The plan: nothing sent.
    let by_key = [
        "--event-key",
        &rows[1].event_key,
        "--event-key",
        &rows[3].event_key,
    ];
    let mut args = vec!["republish"];
    args.extend(by_key);
    let (status, out, err) = run(&w.spec, &args).await?;
    eprintln!("--- republish (plan) ---\n{out}");
    expect(&status, 4, &out, &err)?;
    has(&out, "2 rows would be republished")?;
    has(
        &out,
        &format!("event_key={} -> {}", rows[1].event_key, topics[0]),
    )?;
    ensure!(count().await? == 6, "the plan sent records");
    let mut dry = args.clone();
    dry.push("--dry-run");
    let (status, out, err) = run(&w.spec, &dry).await?;
    expect(&status, 0, &out, &err)?;
    has(&out, "2 rows would be republished")?;
    ensure!(count().await? == 6, "the dry run sent records");

    // By event_key.
    args.push("--yes");
    let (status, out, err) = run(&w.spec, &args).await?;
    expect(&status, 0, &out, &err)?;
    has(&out, "republished 2 of 2 selected rows")?;
    // By created_at: rows 3 and 4 (since is inclusive, until exclusive).
    let at = |i: usize| -> Result<String> {
        let t = chrono::DateTime::from_timestamp_micros(rows[i].created_at_micros)
            .context("created_at")?;
        Ok(t.format("%Y-%m-%d %H:%M:%S").to_string())
    };
    let (since, until) = (at(3)?, at(5)?);
    let (status, out, err) = run(
        &w.spec,
        &["republish", "--since", &since, "--until", &until, "--yes"],
    )
    .await?;
    expect(&status, 0, &out, &err)?;
    has(&out, "republished 2 of 2 selected rows")?;
    // By a WHERE clause: the rows of aggregate o-00 (0, 2, 4).
    let (status, out, err) = run(
        &w.spec,
        &[
            "republish",
            "--where",
            "aggregate_id = 'o-00'",
            "--rate",
            "50",
            "--yes",
        ],
    )
    .await?;
    expect(&status, 0, &out, &err)?;
    has(&out, "republished 3 of 3 selected rows")?;

    let all = outbox_relay_testkit::read_all_records(
        &w.spec.bootstrap_servers,
        &topics,
        Duration::from_secs(60),
    )
    .await?;
    ensure!(
        all.len() == 13,
        "{} records, expected 6 + 2 + 2 + 3",
        all.len()
    );
    let republished: Vec<_> = all
        .iter()
        .filter(|r| r.header("republished_at").is_some())
        .collect();
    let mut sent: Vec<&str> = republished
        .iter()
        .filter_map(|r| r.header("event_key"))
        .collect();
    sent.sort_unstable();
    let mut expected: Vec<&str> = [1, 3, 3, 4, 0, 2, 4]
        .iter()
        .map(|i| rows[*i].event_key.as_str())
        .collect();
    expected.sort_unstable();
    ensure!(
        sent == expected,
        "republished {sent:?}, expected {expected:?}"
    );
    for r in &republished {
        let k = r.header("event_key").unwrap_or_default();
        let original = originals
            .iter()
            .find(|o| o.header("event_key") == Some(k))
            .context("no original record")?;
        let same_headers = original
            .headers
            .iter()
            .all(|(name, v)| r.headers.iter().any(|(n2, v2)| n2 == name && v2 == v));
        ensure!(
            r.key == original.key
                && r.value == original.value
                && r.partition == original.partition
                && same_headers
                && r.headers.len() == original.headers.len() + 1,
            "republished {k}: {:?} / {:?}\noriginal: {:?} / {:?}",
            r.key_str(),
            r.headers,
            original.key_str(),
            original.headers
        );
    }
    // Per key, each run's records follow the rows' order (o-00: rows 0, 2, 4 of the WHERE run).
    let o00: Vec<&str> = republished
        .iter()
        .filter(|r| r.key_str() == Some("o-00"))
        .filter_map(|r| r.header("event_key"))
        .collect();
    let tail: Vec<&str> = o00.iter().rev().take(3).rev().copied().collect();
    ensure!(
        tail == [
            rows[0].event_key.as_str(),
            rows[2].event_key.as_str(),
            rows[4].event_key.as_str()
        ],
        "o-00 records in offset order: {o00:?}"
    );
    Ok(())
}

/// `trace` (issue 17): one event followed from its outbox row to its consumers. A relayed row:
/// its binlog transaction (the positions and GTID the server logged for it), the checkpoint
/// past it, the record the relay produced (topic, partition, offset as a consumer read them),
/// the consumer group that committed past it and the consumer's inbox row. A dead-lettered
/// row: its dead letter and reason (exit 3). A row committed while the relay was stopped: not
/// yet relayed, the checkpoint behind it (exit 5). An unknown event_key: no row (exit 6).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_follows_an_event_to_its_offset_groups_and_inbox() -> Result<()> {
    use outbox_relay_testkit::rdkafka::consumer::{BaseConsumer, Consumer};
    use outbox_relay_testkit::rdkafka::{ClientConfig, Offset, TopicPartitionList};
    use outbox_relay_testkit::{find_transaction, last_gtid, TestDb};

    let mut w = World::new(bin(), "opstrace").await?;
    let dlq = format!("t_{}.dlq", w.uid);
    w.spec.dead_letter_topic = Some(dlq.clone());
    let mut conn = w.db.conn().await?;
    let mut gen = RowGen::new(&w.uid, "t", 2);
    let now = || chrono::Utc::now().timestamp_micros();
    let mut relayed = gen.row();
    let mut bad = gen.row();
    bad.aggregate_type = "Bad Type!".into();
    let mut later = gen.row();
    // Rows of other aggregates, on a topic of 8 partitions: the partition trace computes from
    // the key must be the one each record is on.
    let mut spread = gen.rows(5);
    for (i, r) in spread.iter_mut().enumerate() {
        r.aggregate_id = format!("order-{}", 1001 + i);
    }
    let topic = w.topic("Order");
    {
        use outbox_relay_testkit::rdkafka::admin::{
            AdminClient, AdminOptions, NewTopic, TopicReplication,
        };
        use outbox_relay_testkit::rdkafka::client::DefaultClientContext;
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &w.spec.bootstrap_servers)
            .create()?;
        for r in admin
            .create_topics(
                &[NewTopic::new(&topic, 8, TopicReplication::Fixed(1))],
                &AdminOptions::new(),
            )
            .await?
        {
            r.map_err(|(t, e)| anyhow::anyhow!("creating topic {t}: {e}"))?;
        }
    }
    let (relay, _) = w.start(START).await?;

    relayed.created_at_micros = now();
    let before = current_binlog_position(&mut conn).await?;
    insert_outbox_rows(
        &mut conn,
        "outbox",
        std::slice::from_ref(&relayed),
        InsertStyle::SingleRow,
    )
    .await?;
    let gtid = last_gtid(&mut conn).await?;
    let tx = find_transaction(&mut conn, &before, &gtid)
        .await?
        .context("the relayed row's transaction is not in the binlog")?;
    bad.created_at_micros = now();
    for r in &mut spread {
        r.created_at_micros = now();
    }
    insert_outbox_rows(
        &mut conn,
        "outbox",
        std::slice::from_ref(&bad),
        InsertStyle::SingleRow,
    )
    .await?;
    insert_outbox_rows(&mut conn, "outbox", &spread, InsertStyle::SingleRow).await?;
    let mut keys: std::collections::HashSet<String> =
        spread.iter().map(|r| r.event_key.clone()).collect();
    keys.insert(relayed.event_key.clone());
    let records = w
        .wait_for_keys(
            std::slice::from_ref(&topic),
            &keys,
            Some(&relay),
            Duration::from_secs(120),
        )
        .await?;
    let record = records
        .iter()
        .find(|r| r.header("event_key") == Some(relayed.event_key.as_str()))
        .context("no record of the relayed row")?
        .clone();
    let dead = w
        .wait_for_keys(
            std::slice::from_ref(&dlq),
            &std::collections::HashSet::from([bad.event_key.clone()]),
            Some(&relay),
            Duration::from_secs(120),
        )
        .await?;
    let dead_letter = dead
        .iter()
        .find(|r| r.header("event_key") == Some(bad.event_key.as_str()))
        .context("no dead letter of the bad row")?
        .clone();
    relay.stop(EXIT).await?;

    // A consumer group that consumed the record, and one consumer's inbox row for it.
    let group = format!("trace-g-{}", w.uid);
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &w.spec.bootstrap_servers)
        .set("group.id", &group)
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&topic, record.partition, Offset::Offset(record.offset + 1))?;
    consumer.commit(
        &tpl,
        outbox_relay_testkit::rdkafka::consumer::CommitMode::Sync,
    )?;
    drop(consumer);
    let inbox_db = TestDb::create("trinbox").await?;
    let migrated = tokio::process::Command::new(bin())
        .args(["migrate", "--inbox", "--database-url", &inbox_db.url()])
        .output()
        .await?;
    ensure!(
        migrated.status.success(),
        "migrate --inbox: {}",
        String::from_utf8_lossy(&migrated.stderr)
    );
    let mut inbox_conn = inbox_db.conn().await?;
    inbox_conn
        .exec_drop(
            "INSERT INTO outbox_inbox (consumer, event_key, topic, kafka_partition, kafka_offset) \
             VALUES ('fulfilment', ?, ?, ?, ?)",
            (&relayed.event_key, &topic, record.partition, record.offset),
        )
        .await?;
    // Another consumer (billing) parked the same record: it holds version 5 of the aggregate,
    // the record says 7 (inbox/CONTRACT.md, "Parked versions").
    inbox_conn
        .exec_drop(
            "INSERT INTO outbox_inbox_version (consumer, aggregate_type, aggregate_id, version) \
             VALUES ('billing', 'order', ?, 5)",
            (&relayed.aggregate_id,),
        )
        .await?;
    inbox_conn
        .exec_drop(
            "INSERT INTO outbox_inbox_parked (consumer, aggregate_type, aggregate_id, version, \
             event_key, topic, kafka_partition, kafka_offset, record_key, record_value, \
             record_headers, reason, parked_at, expires_at) VALUES ('billing', 'order', ?, 7, ?, \
             ?, ?, ?, ?, NULL, '[]', 'version gap: expected 6, got 7', \
             '2026-01-02 03:04:05.000006', '2099-01-02 03:04:05.000006')",
            (
                &relayed.aggregate_id,
                &relayed.event_key,
                &topic,
                record.partition,
                record.offset,
                relayed.aggregate_id.as_bytes(),
            ),
        )
        .await?;
    // Committed while the relay is stopped.
    later.created_at_micros = now();
    insert_outbox_rows(
        &mut conn,
        "outbox",
        std::slice::from_ref(&later),
        InsertStyle::SingleRow,
    )
    .await?;

    // The relayed row, as JSON.
    let inbox_url = inbox_db.url();
    let (status, out, err) = run(
        &w.spec,
        &[
            "trace",
            &relayed.event_key,
            "--inbox-url",
            &inbox_url,
            "--json",
        ],
    )
    .await?;
    expect(&status, 0, &out, &err)?;
    let report: serde_json::Value = serde_json::from_str(&out).context("trace --json")?;
    let row = &report["rows"][0];
    ensure!(
        report["rows"].as_array().map(Vec::len) == Some(1),
        "one row expected: {out}"
    );
    let id: u64 = conn
        .exec_first(
            "SELECT id FROM outbox WHERE event_key = ?",
            (&relayed.event_key,),
        )
        .await?
        .context("no id")?;
    ensure!(
        row["table"] == format!("{}.outbox", w.db.name()).as_str()
            && row["id"] == id.to_string().as_str()
            && row["topic"] == topic.as_str()
            && row["key"] == relayed.aggregate_id.as_str()
            && row["partition"] == record.partition,
        "row: {row:#}"
    );
    let b = &row["binlog"];
    ensure!(
        b["end"] == tx.end.to_string().as_str() && b["gtid"] == gtid.as_str(),
        "binlog {b:#}, expected end {} and GTID {gtid}",
        tx.end
    );
    let after: BinlogPosition = b["after"]
        .as_str()
        .and_then(|s| s.rsplit_once(':'))
        .map(|(f, p)| BinlogPosition {
            file: f.to_owned(),
            pos: p.parse().unwrap_or(0),
        })
        .context("binlog.after")?;
    ensure!(
        after.file == tx.start.file && after.pos <= tx.start.pos && after.pos >= before.pos
            || after.file != before.file,
        "binlog.after {after} is not the boundary before the transaction ({} .. {})",
        tx.start,
        tx.end
    );
    ensure!(row["checkpoint"]["relayed"] == true, "checkpoint: {row:#}");
    let k = &row["records"];
    ensure!(
        k.as_array().map(Vec::len) == Some(1)
            && k[0]["topic"] == topic.as_str()
            && k[0]["partition"] == record.partition
            && k[0]["offset"] == record.offset
            && k[0]["timestamp_ms"] == record.timestamp_ms.context("timestamp")?,
        "records {k:#}, consumed {}/{}@{}",
        record.topic,
        record.partition,
        record.offset
    );
    let groups = row["groups"].as_array().context("groups")?;
    ensure!(
        groups.iter().any(|g| g["group"] == group.as_str()
            && g["committed"] == record.offset + 1
            && g["past"] == true),
        "group {group} not listed as past the record: {groups:?}"
    );
    let inbox = &row["inbox"];
    ensure!(
        inbox.as_array().map(Vec::len) == Some(1)
            && inbox[0]["consumer"] == "fulfilment"
            && inbox[0]["offset"] == record.offset,
        "inbox {inbox:#}"
    );
    let parked = &row["parked"];
    ensure!(
        parked.as_array().map(Vec::len) == Some(1)
            && parked[0]["consumer"] == "billing"
            && parked[0]["aggregate_type"] == "order"
            && parked[0]["aggregate_id"] == relayed.aggregate_id.as_str()
            && parked[0]["version"] == 7
            && parked[0]["waits_for"] == 6
            && parked[0]["offset"] == record.offset
            && parked[0]["parked_at"] == "2026-01-02 03:04:05.000006"
            && parked[0]["expires_at"] == "2099-01-02 03:04:05.000006"
            && parked[0]["expired"] == false
            && parked[0]["reason"] == "version gap: expected 6, got 7",
        "parked {parked:#}"
    );

    // Each record where the key's partition says.
    let mut partitions = std::collections::HashSet::new();
    for r in &spread {
        let consumed = records
            .iter()
            .find(|c| c.header("event_key") == Some(r.event_key.as_str()))
            .context("no record")?;
        partitions.insert(consumed.partition);
        let (status, out, err) = run(&w.spec, &["trace", &r.event_key, "--json"]).await?;
        expect(&status, 0, &out, &err)?;
        let report: serde_json::Value = serde_json::from_str(&out).context("trace --json")?;
        let row = &report["rows"][0];
        ensure!(
            row["partition"] == consumed.partition
                && row["records"][0]["partition"] == consumed.partition
                && row["records"][0]["offset"] == consumed.offset,
            "{}: consumed at {}@{}, trace says {row:#}",
            r.aggregate_id,
            consumed.partition,
            consumed.offset
        );
    }
    ensure!(
        partitions.len() > 1,
        "the keys all went to one partition: the check proves little"
    );

    // The same, as text.
    let (status, out, err) = run(
        &w.spec,
        &["trace", &relayed.event_key, "--inbox-url", &inbox_url],
    )
    .await?;
    expect(&status, 0, &out, &err)?;
    eprintln!("--- trace (relayed) ---\n{out}");
    has(
        &out,
        &format!("kafka       {topic}/{}@{}", record.partition, record.offset),
    )?;
    has(&out, "past the transaction, relayed")?;
    has(&out, &format!("group       {group}: committed"))?;
    has(&out, "consumer fulfilment processed")?;
    has(
        &out,
        &format!(
            "consumer billing: order {} version 7, waits for version 6; received {topic}/{}@{}, \
             parked at 2026-01-02 03:04:05.000006, expires at 2099-01-02 03:04:05.000006: \
             version gap: expected 6, got 7",
            relayed.aggregate_id, record.partition, record.offset
        ),
    )?;

    // The dead-lettered row.
    let (status, out, err) = run(&w.spec, &["trace", &bad.event_key, "--json"]).await?;
    expect(&status, 3, &out, &err)?;
    let report: serde_json::Value = serde_json::from_str(&out).context("trace --json")?;
    let row = &report["rows"][0];
    let d = &row["dead_letters"];
    ensure!(
        d.as_array().map(Vec::len) == Some(1)
            && d[0]["record"]["topic"] == dlq.as_str()
            && d[0]["record"]["partition"] == dead_letter.partition
            && d[0]["record"]["offset"] == dead_letter.offset
            && d[0]["reason"] == dead_letter.header("dlq_reason").unwrap_or("?")
            && row["route_error"].is_string()
            && row["records"].as_array().map(Vec::len) == Some(0),
        "dead-lettered row: {row:#}"
    );
    let (_, out, _) = run(&w.spec, &["trace", &bad.event_key]).await?;
    eprintln!("--- trace (dead-lettered) ---\n{out}");
    has(&out, &format!("dead letter {dlq}/"))?;

    // Not yet relayed.
    let (status, out, err) = run(&w.spec, &["trace", &later.event_key, "--json"]).await?;
    expect(&status, 5, &out, &err)?;
    let report: serde_json::Value = serde_json::from_str(&out).context("trace --json")?;
    let row = &report["rows"][0];
    ensure!(
        row["checkpoint"]["relayed"] == false
            && row["checkpoint"]["behind_bytes"].as_u64().unwrap_or(0) > 0
            && row["binlog"]["end"].is_string()
            && row["records"].as_array().map(Vec::len) == Some(0),
        "not-yet-relayed row: {row:#}"
    );
    let (_, out, _) = run(&w.spec, &["trace", &later.event_key]).await?;
    eprintln!("--- trace (not yet relayed) ---\n{out}");
    has(&out, "NOT YET RELAYED")?;

    // The options: one table, a chosen dump server_id, a narrower window and scan.
    let table = format!("{}.outbox", w.db.name());
    let (status, out, err) = run(
        &w.spec,
        &[
            "trace",
            &relayed.event_key,
            "--table",
            &table,
            "--server-id",
            "4000000123",
            "--window",
            "120",
            "--max-scan",
            "1000",
            "--json",
        ],
    )
    .await?;
    expect(&status, 0, &out, &err)?;
    let report: serde_json::Value = serde_json::from_str(&out).context("trace --json")?;
    ensure!(
        report["rows"][0]["records"][0]["offset"] == record.offset
            && report["rows"][0]["binlog"]["end"] == tx.end.to_string().as_str(),
        "with options: {report:#}"
    );
    let (status, out, err) = run(
        &w.spec,
        &["trace", &relayed.event_key, "--table", "nope.outbox"],
    )
    .await?;
    expect(&status, 2, &out, &err)?;
    has(&err, "is not one of the outbox tables")?;

    // No such row.
    let (status, out, err) = run(&w.spec, &["trace", "no-such-event-key"]).await?;
    expect(&status, 6, &out, &err)?;
    has(&out, "pruned, or never written")?;
    drop(inbox_conn);
    inbox_db.drop_database().await?;
    drop(conn);
    w.db.drop_database().await
}

/// A least-privileged relay user of `w`'s database (the book's grants; `prefix` and a unique
/// suffix, at most 30 characters) created with `password`, and `w`'s spec logging in as it with
/// `url_password`. The caller drops the user.
async fn relay_user(
    w: &World,
    prefix: &str,
    password: &str,
    url_password: &str,
) -> Result<(String, RelayConfigSpec)> {
    let mut user = format!("{prefix}{}", unique_suffix().replace('_', ""));
    user.truncate(30);
    w.db.create_relay_user(&user, password, "NONE").await?;
    let mut spec = w.spec.clone();
    spec.mysql_url =
        mysql_url(Some(w.db.name())).replacen("root@", &format!("{user}:{url_password}@"), 1);
    Ok((user, spec))
}

/// `migrate` and `prune` run as the README's least-privileged relay user (issue 31): an
/// up-to-date checkpoint table needs no statement, so `migrate` succeeds; a missing table names
/// the refused statement, CREATE and ALTER on it, the account and the GRANT line, and that GRANT
/// makes the next run work; `prune --yes` names DELETE on the outbox table the same way and
/// deletes nothing until it is granted. Never "check the user and password": the user logged in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_and_prune_name_the_privilege_the_relay_user_lacks() -> Result<()> {
    let w = World::new(bin(), "opsgrant").await?;
    let db = w.db.name().to_owned();
    let mut admin = w.db.conn().await?;
    let (user, spec) = relay_user(&w, "rg", "grant-test", "grant-test").await?;
    let user = user.as_str();
    let never = "check the user and password";

    let (status, out, err) = run(&spec, &["migrate"]).await?;
    expect(&status, 0, &out, &err)?;
    ensure!(
        out.trim() == format!("{db}.outbox_relay_checkpoint: up to date (unchanged)"),
        "{out}"
    );

    admin
        .query_drop("DROP TABLE outbox_relay_checkpoint")
        .await?;
    let (status, out, err) = run(&spec, &["migrate"]).await?;
    expect(&status, 3, &out, &err)?;
    let grant = format!("GRANT CREATE, ALTER ON `{db}`.`outbox_relay_checkpoint` TO '{user}'@'%'");
    for needle in [
        format!("privileges of '{user}'@'%' for `outbox-relay migrate --config "),
        format!(
            "expected CREATE, ALTER on `{db}`.`outbox_relay_checkpoint` to create the checkpoint \
             table {db}.outbox_relay_checkpoint"
        ),
        format!(
            "the server refused the statement CREATE TABLE IF NOT EXISTS \
             `{db}`.`outbox_relay_checkpoint` (…) with error 1142"
        ),
        "run it as a user that may create and alter tables".to_owned(),
        "OUTBOX_RELAY__MYSQL__URL='mysql://ADMIN:PASSWORD@".to_owned(),
        format!("or, as an administrator: {grant}"),
    ] {
        has(&err, &needle)?;
    }
    ensure!(!err.contains(never), "{err}");
    admin.query_drop(&grant).await?;
    let (status, out, err) = run(&spec, &["migrate"]).await?;
    expect(&status, 0, &out, &err)?;
    ensure!(
        out.trim() == format!("{db}.outbox_relay_checkpoint: created"),
        "{out}"
    );

    // prune: three relayed rows, ten days old.
    let mut rows = RowGen::new(&w.uid, "g", 1).rows(3);
    let old = recent_created_at_base() - 10 * 86_400_000_000;
    for r in &mut rows {
        r.created_at_micros = old;
    }
    let (relay, _) = w.start(START).await?;
    insert_outbox_rows(&mut admin, "outbox", &rows, InsertStyle::SingleRow).await?;
    let end = current_binlog_position(&mut admin).await?;
    w.wait_checkpoint_covers(&relay, &end, START).await?;
    relay.stop(EXIT).await?;
    let all = outbox_ids(&mut admin).await?;
    ensure!(all.len() == 3, "{all:?}");

    let (status, out, err) = run(&spec, &["prune", "--yes", "--older-than", "7d"]).await?;
    expect(&status, 3, &out, &err)?;
    let grant = format!("GRANT DELETE ON `{db}`.`outbox` TO '{user}'@'%'");
    for needle in [
        format!("privileges of '{user}'@'%' for `outbox-relay prune --yes --older-than 7d"),
        format!("expected DELETE on `{db}`.`outbox` to delete relayed rows of {db}.outbox"),
        format!(
            "the server refused the statement DELETE FROM `{db}`.`outbox` WHERE `id` IN (…) AND \
             `created_at` < ? with error 1142"
        ),
        format!("run it as a user that may delete rows of {db}.outbox"),
        format!("or, as an administrator: {grant}"),
    ] {
        has(&err, &needle)?;
    }
    ensure!(!err.contains(never), "{err}");
    ensure!(outbox_ids(&mut admin).await? == all, "rows went");
    admin.query_drop(&grant).await?;
    let (status, out, err) = run(&spec, &["prune", "--yes", "--older-than", "7d"]).await?;
    expect(&status, 0, &out, &err)?;
    has(&out, &format!("{db}.outbox: deleted 3 rows"))?;
    ensure!(outbox_ids(&mut admin).await?.is_empty());

    admin.query_drop(format!("DROP USER '{user}'@'%'")).await?;
    drop(admin);
    w.db.drop_database().await
}

/// `trace` and `run` ignore DDL that cannot touch the outbox table (issue 31): a stored
/// procedure of several statements that inserts into `outbox` in another database, an ALTER
/// of that database's own `outbox` table, a view and a grant naming ours. Neither warns
/// "outbox table layout unknown after DDL", and both go on relaying and tracing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_and_run_ignore_ddl_that_cannot_touch_the_outbox() -> Result<()> {
    let w = World::new(bin(), "opsddl").await?;
    let other = outbox_relay_testkit::TestDb::create("opsddl_other").await?;
    let (db, other_db) = (w.db.name().to_owned(), other.name().to_owned());
    let mut conn = w.db.conn().await?;
    let (relay, _) = w.start(START).await?;
    let mut admin = other.conn().await?;
    for sql in [
        "CREATE PROCEDURE archive_outbox() BEGIN INSERT INTO outbox (aggregate_type, \
         aggregate_id, event_type, event_key) VALUES ('a', 'b', 'c', 'd'); DELETE FROM outbox \
         WHERE id < 0; END"
            .to_owned(),
        "ALTER TABLE outbox ADD COLUMN archived_at DATETIME NULL".to_owned(),
        format!("CREATE VIEW recent AS SELECT id FROM `{db}`.outbox"),
    ] {
        admin.query_drop(&sql).await.with_context(|| sql.clone())?;
    }
    let row = insert_now(&mut conn, RowGen::new(&w.uid, "ddl", 1).row()).await?;
    let end = current_binlog_position(&mut conn).await?;
    let keys = std::collections::HashSet::from([row.event_key.clone()]);
    w.wait_for_keys(&[w.topic(&row.aggregate_type)], &keys, Some(&relay), START)
        .await?;
    w.wait_checkpoint_covers(&relay, &end, START).await?;
    let (status, out, err) = run(&w.spec, &["trace", &row.event_key]).await?;
    expect(&status, 0, &out, &err)?;
    has(&out, "relayed")?;
    relay.stop(EXIT).await?;
    for (who, text) in [("trace", err), ("run", relay.stderr_text())] {
        ensure!(
            !text.contains("layout unknown"),
            "{who} warned about DDL in {other_db}:\n{text}"
        );
    }
    drop((conn, admin));
    other.drop_database().await?;
    w.db.drop_database().await
}

/// `check` on the README's own setup (issue 31): its least-privileged user, its outbox table
/// (a JSON payload: LONGTEXT on MariaDB, 4 GB; MySQL's JSON, bounded by max_allowed_packet),
/// small rows, and the topic its quick start creates. The payload-size line is OK and says why
/// (the column can hold more than the largest record, the newest rows do not come near it,
/// what a larger row would do); the topic lines say whether the brokers auto-create topics and
/// name the existing topic the template routes to; the outbox's unique event_key compares byte
/// for byte (migrations/0001_outbox.sql), so nothing warns. A payload near the producer's
/// limit, a template that names no existing topic and a missing fixed topic warn, with the
/// numbers and the `kafka-topics.sh` line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_on_the_readme_setup_warns_only_where_a_row_or_topic_is_at_risk() -> Result<()> {
    let w = World::new(bin(), "opsreadme").await?;
    let db = w.db.name().to_owned();
    let (user, spec) = relay_user(&w, "rr", "readme", "readme").await?;
    let user = user.as_str();
    let topic = w.topic("Order");
    create_topic(&spec.bootstrap_servers, &topic, 1_048_588).await?;
    let mut conn = w.db.conn().await?;
    let mut row = RowGen::new(&w.uid, "readme", 1).row();
    row.aggregate_type = "Order".into();
    let row = insert_now(&mut conn, row).await?;
    // As the server counts it (MySQL stores JSON normalized).
    let payload: u64 = conn
        .exec_first(
            "SELECT LENGTH(payload) FROM outbox WHERE event_key = ?",
            (&row.event_key,),
        )
        .await?
        .context("the row")?;

    let (status, out, err) = run(&spec, &["check"]).await?;
    expect(&status, 0, &out, &err)?;
    let size = out
        .lines()
        .find(|l| l.contains(&format!("message size of {db}.outbox")))
        .context("no message size line")?;
    ensure!(
        size.starts_with("OK    ")
            && size.contains(
                "more than the largest record, 1000000 bytes (the producer's \
                              message.max.bytes = 1000000)"
            )
            && size.contains(&format!(
                "the largest payload of the newest 1 rows is {payload} bytes"
            ))
            && size
                .contains("stops the relay with the row's position (dead_letter.enabled = false"),
        "{size}"
    );
    has(&out, "OK    topic auto-creation: the brokers create")?;
    has(
        &out,
        &format!(
            "OK    topics of {db}.outbox: {} names 1 existing topic(s): {topic};",
            w.topic("{aggregate_type}")
        ),
    )?;
    // The test MySQL 8.0 runs with MySQL's default binlog_row_metadata=MINIMAL (a server
    // setting the README recommends changing, not part of its setup): that warning is the
    // server's.
    let warnings: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("WARN") && !l.starts_with("WARN  binlog_row_metadata"))
        .collect();
    ensure!(
        warnings.is_empty(),
        "warnings on the README's setup:\n{out}"
    );
    let nopad = if outbox_relay_testkit::env::test_server().is_mysql() {
        "utf8mb4_0900_bin"
    } else {
        "utf8mb4_nopad_bin"
    };
    has(
        &out,
        &format!(
            "OK    {db}.outbox.event_key (unique event key): event_key varchar(255) (byte for byte)"
        ),
    )?;
    let collation = event_key_collation(&mut conn, &db).await?;
    ensure!(collation.as_deref() == Some(nopad), "{collation:?}");

    // A row near a lowered producer limit, a template naming no topic, a missing fixed topic.
    let mut near = w.spec.clone();
    near.kafka_properties
        .push(("message.max.bytes".into(), "20000".into()));
    near.topic = format!("t_{}.none.{{aggregate_type}}", w.uid);
    let mut big = RowGen::new(&w.uid, "big", 1).row();
    big.payload = format!("\"{}\"", "x".repeat(17_000));
    insert_now(&mut conn, big).await?;
    let (status, out, err) = run(&near, &["check"]).await?;
    expect(&status, 0, &out, &err)?;
    has(
        &out,
        &format!(
            "WARN  message size of {db}.outbox: expected payloads well within the largest \
             record, 20000 bytes (the producer's message.max.bytes = 20000), less 4096 for the \
             key and headers, found the largest payload of the newest 2 rows is 17002 bytes: \
             over it"
        ),
    )?;
    has(
        &out,
        "fix: a row over the limit is a row error that stops the relay",
    )?;
    has(
        &out,
        &format!(
            "WARN  topics of {db}.outbox: expected the topics t_{}.none.{{aggregate_type}} \
             names, created beforehand, found none exists yet",
            w.uid
        ),
    )?;
    has(
        &out,
        &format!(
            "--create --topic t_{}.none.<aggregate_type> --partitions N --replication-factor R",
            w.uid
        ),
    )?;
    let mut fixed = w.spec.clone();
    fixed.topic = format!("t_{}.fixed", w.uid);
    let (status, out, err) = run(&fixed, &["check"]).await?;
    expect(&status, 0, &out, &err)?;
    has(
        &out,
        &format!(
            "WARN  topic of {db}.outbox t_{0}.fixed: expected a topic created with the \
             partitions and replication it needs, found no such topic yet: the brokers create \
             it on its first record with num.partitions = ",
            w.uid
        ),
    )?;
    let mut admin = w.db.conn().await?;
    admin.query_drop(format!("DROP USER '{user}'@'%'")).await?;
    drop((conn, admin));
    w.db.drop_database().await
}

/// Our transaction's place in the binlog after `from`, from the server's own `SHOW BINLOG
/// EVENTS` (other tests write to the shared server meanwhile): where it starts (the boundary
/// before it: the start of its GTID event, or of its BEGIN without one), where each of its rows
/// events (`Write_rows…`) starts, and where it ends. It is the transaction of the first table
/// map of `db`.outbox.
async fn our_transaction(
    conn: &mut Conn,
    from: &BinlogPosition,
    db: &str,
) -> Result<(BinlogPosition, Vec<BinlogPosition>, BinlogPosition)> {
    let events: Vec<mysql_async::Row> = conn
        .exec(
            format!("SHOW BINLOG EVENTS IN '{}' FROM {}", from.file, from.pos),
            (),
        )
        .await?;
    let at = |pos: u64| BinlogPosition::new(&from.file, pos);
    let mut start = None;
    let mut writes = Vec::new();
    let mut ours = false;
    for (i, e) in events.iter().enumerate() {
        let kind: String = e.get("Event_type").context("Event_type")?;
        let info: String = e.get("Info").unwrap_or_default();
        let pos: u64 = e.get("Pos").context("Pos")?;
        if !ours {
            if kind.contains("Gtid") && kind != "Gtid_list" || (kind == "Query" && info == "BEGIN")
            {
                // MySQL writes its GTID event before BEGIN: keep the first of the two.
                if !(kind == "Query" && start.is_some()) {
                    start = Some(pos);
                }
            } else if kind == "Xid" || (kind == "Query" && info == "COMMIT") {
                start = None;
            }
            if kind == "Table_map" && info.contains(&format!("({db}.outbox)")) {
                ours = true;
            }
            continue;
        }
        if kind.starts_with("Write_rows") {
            writes.push(at(pos));
        }
        if kind == "Xid" || (kind == "Query" && info == "COMMIT") {
            // Where it ends: where the next event starts (MariaDB 11.4 shows End_log_pos 0
            // inside transactions).
            let end = match events.get(i + 1) {
                Some(next) => next.get::<u64, _>("Pos").context("Pos")?,
                None => e.get::<u64, _>("End_log_pos").context("End_log_pos")?,
            };
            return Ok((at(start.context("its start")?), writes, at(end)));
        }
    }
    anyhow::bail!("no committed transaction on {db}.outbox after {from}")
}

/// `status --json`: its JSON, its lag in bytes, and the bytes from `from` to the server's end
/// before and after it ran (other tests write to the shared server meanwhile).
async fn status_lag_from(
    spec: &RelayConfigSpec,
    conn: &mut Conn,
    from: &BinlogPosition,
) -> Result<(serde_json::Value, u64, u64, u64)> {
    let end_before = current_binlog_position(conn).await?;
    let (status, out, err) = run(spec, &["status", "--json"]).await?;
    eprintln!("--- status --json ---\n{out}{err}");
    let end_after = current_binlog_position(conn).await?;
    expect(&status, 0, &out, &err)?;
    let v: serde_json::Value = serde_json::from_str(out.trim()).context(out.clone())?;
    let bytes = v["lag"]["bytes"].as_u64().context("lag bytes")?;
    let low = lag(conn, from, &end_before).await?;
    let high = lag(conn, from, &end_after).await?;
    Ok((v, bytes, low, high))
}

/// A checkpoint inside a transaction (issue 31: a SIGTERM between the acknowledgement of a
/// transaction's rows and its end stores `rows_acked`): with `rows_acked` = 1 of its 2 rows,
/// `trace` calls the first row relayed and the second not, `status` counts the lag from the
/// second row's event and says the transaction is partly acknowledged, `prune` waits; with
/// `rows_acked` = 2 the whole transaction is covered (its lag is gone, prune proceeds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_inside_a_transaction_covers_its_acknowledged_rows() -> Result<()> {
    let w = World::new(bin(), "opsrowsacked").await?;
    let mut conn = w.db.conn().await?;
    let from = current_binlog_position(&mut conn).await?;
    let mut rows = RowGen::new(&w.uid, "ra", 1).rows(2);
    let created = chrono::Utc::now().timestamp_micros() - 20_000_000;
    for r in &mut rows {
        r.created_at_micros = created;
    }
    let mut tx = conn.start_transaction(Default::default()).await?;
    insert_outbox_rows(&mut tx, "outbox", &rows, InsertStyle::SingleRow).await?;
    tx.commit().await?;
    let (base, writes, tx_end) = our_transaction(&mut conn, &from, w.db.name()).await?;
    ensure!(writes.len() == 2, "two rows events: {writes:?}");
    // Where status counts the unrelayed rows from: the second row's event. MariaDB 11.4 leaves
    // the events inside a transaction without their end positions by default
    // (`binlog_legacy_event_pos=OFF`), so a dump cannot tell where inside the transaction an
    // event starts: there it counts from the transaction's start (the end of its GTID event),
    // which over-counts by the acknowledged rows' events, never under.
    let legacy_pos: Option<(String, String)> = conn
        .query_first("SHOW GLOBAL VARIABLES LIKE 'binlog_legacy_event_pos'")
        .await?;
    let second = if legacy_pos.is_some_and(|(_, v)| v.eq_ignore_ascii_case("OFF")) {
        let gtid: Option<mysql_async::Row> = conn
            .exec_first(
                format!(
                    "SHOW BINLOG EVENTS IN '{}' FROM {} LIMIT 1",
                    base.file, base.pos
                ),
                (),
            )
            .await?;
        let gtid = gtid.context("the transaction's first event")?;
        let end: u64 = gtid.get("End_log_pos").context("End_log_pos")?;
        BinlogPosition::new(&base.file, end)
    } else {
        writes[1].clone()
    };
    // The checkpoint a stop after the first row's acknowledgement leaves.
    let set_acked = async |conn: &mut Conn, n: u64| {
        conn.exec_drop(
            "REPLACE INTO outbox_relay_checkpoint (connector_name, binlog_file, binlog_pos, \
             rows_acked, source_server_id) VALUES (?, ?, ?, ?, @@server_id)",
            (w.connector(), &base.file, base.pos, n),
        )
        .await
    };
    set_acked(&mut conn, 1).await?;

    // rows_acked = 1: the first row is relayed, the second not.
    let (status, out, err) = run(&w.spec, &["trace", &rows[0].event_key]).await?;
    eprintln!("--- {:?} ---\n{out}{err}", &["trace", &rows[0].event_key]);
    expect(&status, 5, &out, &err)?;
    has(&out, &format!("checkpoint  {base} rows_acked 1 ("))?;
    has(
        &out,
        "inside the transaction, its row 1 acknowledged, relayed",
    )?;
    let (status, out, err) = run(&w.spec, &["trace", &rows[1].event_key]).await?;
    eprintln!("--- {:?} ---\n{out}{err}", &["trace", &rows[1].event_key]);
    expect(&status, 5, &out, &err)?;
    has(&out, "NOT YET RELAYED")?;

    let (v, bytes, low, high) = status_lag_from(&w.spec, &mut conn, &second).await?;
    ensure!(
        (low..=high).contains(&bytes),
        "lag {bytes}: expected the bytes from the second row's event {second} to the end, \
         within [{low}, {high}]: {v}"
    );
    let p = &v["lag"]["partly_acknowledged"];
    ensure!(
        p["rows_acked"] == 1 && p["rows"] == 2 && p["unrelayed_from"] == second.to_string(),
        "{v}"
    );
    let (status, out, err) = run(&w.spec, &["status"]).await?;
    eprintln!("--- {:?} ---\n{out}{err}", &["status"]);
    expect(&status, 0, &out, &err)?;
    has(
        &out,
        &format!(
            "the transaction after the checkpoint is partly acknowledged: 1 of its 2 outbox \
             rows; the lag counts from {second}"
        ),
    )?;
    let prune = [
        "prune",
        "--dry-run",
        "--older-than",
        "5s",
        "--max-wait-ms",
        "500",
    ];
    let (status, out, err) = run(&w.spec, &prune).await?;
    eprintln!("--- {:?} ---\n{out}{err}", &prune);
    expect(&status, 1, &out, &err)?;
    has(&err, "does not cover the binlog up to")?;

    // rows_acked = 2: the whole transaction.
    set_acked(&mut conn, 2).await?;
    let (status, out, err) = run(&w.spec, &["trace", &rows[1].event_key]).await?;
    eprintln!("--- {:?} ---\n{out}{err}", &["trace", &rows[1].event_key]);
    expect(&status, 5, &out, &err)?;
    has(
        &out,
        "inside the transaction, its row 2 acknowledged, relayed",
    )?;
    let (v, bytes, low, high) = status_lag_from(&w.spec, &mut conn, &tx_end).await?;
    // 0 when only checkpoint writes follow (no other test wrote meanwhile).
    ensure!(
        bytes == 0 || (low..=high).contains(&bytes),
        "lag {bytes}: expected the bytes after our transaction's end {tx_end}, within \
         [{low}, {high}], or 0: {v}"
    );
    ensure!(v["lag"]["partly_acknowledged"].is_null(), "{v}");
    let (status, out, err) = run(&w.spec, &prune).await?;
    eprintln!("--- {:?} ---\n{out}{err}", &prune);
    expect(&status, 0, &out, &err)?;
    has(
        &out,
        &format!("{}.outbox: 2 rows would be deleted", w.db.name()),
    )?;
    drop(conn);
    w.db.drop_database().await
}

/// `check` with a wrong password (issue 31): one plain FAIL naming the user, the server and where
/// the password comes from (the URL, or the environment variable that overrides it), exit 3,
/// and no privilege list (the user may hold every privilege).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_with_a_wrong_password_says_access_denied_for_the_user() -> Result<()> {
    let w = World::new(bin(), "opslogin").await?;
    let (user, spec) = relay_user(&w, "rl", "right-one", "wrong-one").await?;
    let user = user.as_str();
    let opts = mysql_async::Opts::from_url(&spec.mysql_url)?;
    let server = format!("{}:{}", opts.ip_or_hostname(), opts.tcp_port());
    let failed = format!(
        "FAIL  MySQL login: expected the server at {server} to accept user {user:?}, found \
         access denied for user {user:?} at {server} (error 1045: Access denied for user '{user}'@"
    );

    let (status, out, err) = run(&spec, &["check"]).await?;
    eprintln!("--- {:?} ---\n{out}{err}", &["check"]);
    expect(&status, 3, &out, &err)?;
    has(&out, &failed)?;
    has(
        &out,
        "fix: check the user and password: the user is mysql.url's, the password comes from the \
         password in mysql.url",
    )?;
    ensure!(!out.contains("REPLICATION"), "a privilege list:\n{out}");
    ensure!(!out.contains("MySQL connection"), "{out}");

    // The password from the environment: named as such.
    let p = RelayProcess::spawn_args(
        bin(),
        &["check", "--config"],
        &spec.to_toml(),
        &[("OUTBOX_RELAY__MYSQL__PASSWORD", "also-wrong")],
    )?;
    let status = p.wait_exit(EXIT).await?;
    let (out, err) = (p.stdout_text(), p.stderr_text());
    expect(&status, 3, &out, &err)?;
    has(&out, &failed)?;
    has(
        &out,
        "the password comes from the environment variable OUTBOX_RELAY__MYSQL__PASSWORD",
    )?;
    let mut admin = w.db.conn().await?;
    admin.query_drop(format!("DROP USER '{user}'@'%'")).await?;
    drop(admin);
    w.db.drop_database().await
}
