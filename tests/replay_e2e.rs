//! End-to-end tests of `outbox-relay replay`: binlog files read from disk and produced to the
//! real Kafka of the test machine, compared with what the live `run` path produced from the same
//! transactions (on the test server; where it writes no column names, as MySQL 8 by default,
//! the replay must refuse instead), and with MySQL 8's own rendering of a MySQL 8 binlog file
//! (`tests/fixtures/binlogs/mysql8-json.000001`, written by the project's MySQL 8.0.31 with
//! `tests/fixtures/binlogs/generate.sh`; its `.sql`, `.events` and `.select` files hold the SQL,
//! the server's event list and the server's own text of the rows).
//!
//! Each test has its own topics (and database where it writes one). Replays are given a
//! `mysql.url` on which nothing listens, so a replay that tried to connect to MySQL would fail.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use mysql_async::prelude::*;
use mysql_async::TxOpts;
use outbox_relay_testkit::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use outbox_relay_testkit::rdkafka::client::DefaultClientContext;
use outbox_relay_testkit::rdkafka::config::ClientConfig;
use outbox_relay_testkit::{
    all_seen, binary_logs, binlog_event_ending_at, collect_records, collect_until, commit_rows,
    current_binlog_position, describe_record, ensure_exactly_once, expect_exit_code,
    global_variable, insert_outbox_rows, kafka_bootstrap, list_topics, read_all_records,
    stored_payloads, test_server, unique_suffix, InsertStyle, OutboxRow, Record, RelayConfigSpec,
    RelayProcess, RowGen, World,
};

/// The relay binary under test (built on first use).
fn bin() -> &'static str {
    outbox_relay_testkit::relay_bin()
}

/// Relay start-up until its checkpoint row holds a position.
const STARTUP: Duration = Duration::from_secs(60);
/// Records reaching Kafka.
const RELAY_WAIT: Duration = Duration::from_secs(120);
/// A graceful stop until the process has exited.
const STOP: Duration = Duration::from_secs(30);
/// A replay until it has exited.
const REPLAY: Duration = Duration::from_secs(120);
/// Reading topics that are no longer written.
const READ_ALL: Duration = Duration::from_secs(60);

/// A `mysql.url` nothing listens on: a replay must not need it.
const NO_MYSQL: &str = "mysql://root@127.0.0.1:1/nowhere";

/// Starts `outbox-relay replay --yes --binlog FILES… EXTRA… --config <toml>`.
fn spawn_replay(files: &[PathBuf], extra: &[&str], config_toml: &str) -> Result<RelayProcess> {
    let mut args: Vec<String> = vec!["replay".into(), "--yes".into(), "--binlog".into()];
    args.extend(files.iter().map(|f| f.display().to_string()));
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    args.push("--config".into());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    RelayProcess::spawn_args(bin(), &args, config_toml, &[])
}

/// The summary line's `key=value` fields.
fn summary(stderr: &str) -> Result<HashMap<String, String>> {
    let line = stderr
        .lines()
        .find(|l| l.contains("replay summary"))
        .with_context(|| format!("no summary line in\n{stderr}"))?;
    Ok(line
        .split_whitespace()
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect())
}

fn ensure_summary(stderr: &str, expected: &[(&str, &str)]) -> Result<()> {
    let fields = summary(stderr)?;
    for (k, v) in expected {
        ensure!(
            fields.get(*k).map(String::as_str) == Some(*v),
            "summary {k}: expected {v}, found {:?}\n{stderr}",
            fields.get(*k)
        );
    }
    Ok(())
}

/// Records ordered as Kafka holds them: by partition, then offset.
fn by_partition(records: &[Record]) -> BTreeMap<i32, Vec<&Record>> {
    let mut out: BTreeMap<i32, Vec<&Record>> = BTreeMap::new();
    for r in records {
        out.entry(r.partition).or_default().push(r);
    }
    for v in out.values_mut() {
        v.sort_by_key(|r| r.offset);
    }
    out
}

/// Key, value, headers and timestamp of a record.
type Content = (
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Vec<(String, Option<Vec<u8>>)>,
    Option<i64>,
);

/// What must be equal between a live record and its replay: key, value, headers, timestamp.
fn content(r: &Record) -> Content {
    (
        r.key.clone(),
        r.value.clone(),
        r.headers.clone(),
        r.timestamp_ms,
    )
}

// ---------------------------------------------------------------------------------------------
// (1) The server's binlog files, replayed: the same records as the live relay produced.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_of_the_servers_binlog_files_equals_the_live_records() -> Result<()> {
    let mut w = World::new(bin(), "replay_live").await?;
    w.spec.dead_letter_topic = Some(format!("t_{}.dlq", w.uid));
    let (relay, _) = w.start(STARTUP).await?;
    let mut conn = w.db.conn().await?;
    let mut gen = RowGen::new(&w.uid, "rp", 5);

    // Before the range.
    let before = gen.rows(3);
    commit_rows(&mut conn, &before).await?;
    let start = current_binlog_position(&mut conn).await?;
    // The range: multi-row transactions, autocommitted single rows, a rolled-back transaction,
    // an UPDATE and a DELETE (which produce nothing), and a row no topic can be made for (a
    // dead letter in both runs).
    let mut inside = Vec::new();
    for n in [1, 4, 2, 7] {
        let rows = gen.rows(n);
        commit_rows(&mut conn, &rows).await?;
        inside.extend(rows);
    }
    let single = gen.rows(3);
    insert_outbox_rows(&mut conn, "outbox", &single, InsertStyle::SingleRow).await?;
    inside.extend(single);
    // The payloads as the server stores them (MySQL normalises JSON), before the UPDATE and
    // DELETE below change them.
    let stored = stored_payloads(&mut conn, "outbox").await?;
    let mut tx = conn.start_transaction(TxOpts::default()).await?;
    insert_outbox_rows(&mut tx, "outbox", &gen.rows(2), InsertStyle::MultiRow).await?;
    tx.rollback().await?;
    conn.exec_drop(
        "UPDATE outbox SET payload = '{}' WHERE event_key = ?",
        (&inside[0].event_key,),
    )
    .await?;
    conn.exec_drop(
        "DELETE FROM outbox WHERE event_key = ?",
        (&inside[1].event_key,),
    )
    .await?;
    let mut bad = gen.row();
    bad.aggregate_type = "Bad Type!".into();
    commit_rows(&mut conn, std::slice::from_ref(&bad)).await?;
    let more = gen.rows(5);
    commit_rows(&mut conn, &more).await?;
    let stored_more = stored_payloads(&mut conn, "outbox").await?;
    let mut stored = stored;
    for r in &more {
        stored.insert(r.event_key.clone(), stored_more[&r.event_key].clone());
    }
    inside.extend(more);
    let stop = current_binlog_position(&mut conn).await?;
    // After the range.
    let after = gen.rows(3);
    commit_rows(&mut conn, &after).await?;

    // The live relay delivers everything, then stops gracefully.
    let bootstrap = kafka_bootstrap();
    let live_topic = w.topic("Order");
    let live_dlq = format!("t_{}.dlq", w.uid);
    let all: HashSet<String> = before
        .iter()
        .chain(&inside)
        .chain(&after)
        .map(|r| r.event_key.clone())
        .collect();
    collect_until(
        &bootstrap,
        std::slice::from_ref(&live_topic),
        RELAY_WAIT,
        all_seen(all),
    )
    .await?;
    collect_records(&bootstrap, std::slice::from_ref(&live_dlq), 1, RELAY_WAIT).await?;
    expect_exit_code(relay.stop(STOP).await?, 0, &relay)?;
    let state_before = w.state().await?;

    // The server's files from the start's to the stop's, read from its binlog directory.
    let basename: String = conn
        .query_first("SELECT @@log_bin_basename")
        .await?
        .context("@@log_bin_basename is NULL")?;
    let dir = Path::new(&basename)
        .parent()
        .context("@@log_bin_basename has no directory")?
        .to_owned();
    let logs = binary_logs(&mut conn).await?;
    let names: Vec<&String> = logs.iter().map(|(n, _)| n).collect();
    let first = names
        .iter()
        .position(|n| **n == start.file)
        .context("start file listed")?;
    let last = names
        .iter()
        .position(|n| **n == stop.file)
        .context("stop file listed")?;
    let files: Vec<PathBuf> = names[first..=last].iter().map(|n| dir.join(n)).collect();

    let mut spec = w.spec.clone();
    spec.mysql_url = NO_MYSQL.into();
    spec.topic = format!("t_{}.replay.{{aggregate_type}}", w.uid);
    spec.dead_letter_topic = Some(format!("t_{}.replay-dlq", w.uid));
    let (start_pos, stop_pos) = (start.pos.to_string(), stop.pos.to_string());
    let replay = spawn_replay(
        &files,
        &["--start-position", &start_pos, "--stop-position", &stop_pos],
        &spec.to_toml(),
    )?;
    // A replay has no server to ask for the outbox's layout, so it needs column names in the
    // table maps (docs/src/operations/replay.md). MySQL 8 writes none by default
    // (binlog_row_metadata=MINIMAL): there the right outcome is a stop at the first outbox row
    // naming the fix, and nothing produced.
    let metadata = global_variable(&mut conn, "binlog_row_metadata").await?;
    if !metadata.eq_ignore_ascii_case("FULL") {
        eprintln!(
            "not on {}: comparing replayed with live records needs binlog files with column \
             names (binlog_row_metadata=FULL); this server writes {metadata}, so the replay must \
             stop at the first outbox row instead",
            test_server()
        );
        expect_exit_code(replay.wait_exit(REPLAY).await?, 1, &replay)?;
        let stderr = replay.stderr_text();
        ensure!(
            stderr.contains("carries no column names")
                && stderr.contains("binlog_row_metadata=FULL")
                && stderr.contains(&format!("{}.outbox", w.db.name())),
            "the replay's error does not name the table and the fix:\n{stderr}"
        );
        ensure_summary(&stderr, &[("records_produced", "0"), ("complete", "false")])?;
        let topics = list_topics(&bootstrap, &format!("t_{}.replay", w.uid)).await?;
        ensure!(
            topics.is_empty(),
            "the failed replay produced to {topics:?}"
        );
        drop(conn);
        return w.db.drop_database().await;
    }
    expect_exit_code(replay.wait_exit(REPLAY).await?, 0, &replay)?;
    let stderr = replay.stderr_text();
    ensure_summary(
        &stderr,
        &[
            ("files", &files.len().to_string()),
            ("records_produced", &inside.len().to_string()),
            ("dead_lettered", "1"),
            ("complete", "true"),
        ],
    )?;
    // The live connector's checkpoint row (position, lease token, time of the last write) did
    // not change.
    ensure!(
        w.state().await? == state_before,
        "the replay changed the checkpoint row"
    );

    // Nothing outside the range, each row of the range once.
    let replay_topic = spec.topic_for("Order");
    let replay_dlq = format!("t_{}.replay-dlq", w.uid);
    let topics = list_topics(&bootstrap, &format!("t_{}.replay", w.uid)).await?;
    ensure!(
        topics
            == [replay_topic.clone(), replay_dlq.clone()]
                .into_iter()
                .collect(),
        "replay topics: {topics:?}"
    );
    let replayed =
        read_all_records(&bootstrap, std::slice::from_ref(&replay_topic), READ_ALL).await?;
    let inside_keys: HashSet<String> = inside.iter().map(|r| r.event_key.clone()).collect();
    ensure_exactly_once(&replayed, &inside_keys)?;
    // Each record is the row as written, its value the payload as the server stored it
    // (independently of the live run)…
    let rows: HashMap<&str, &OutboxRow> =
        inside.iter().map(|r| (r.event_key.as_str(), r)).collect();
    for r in &replayed {
        let row = rows[r.header("event_key").unwrap_or_default()];
        let payload = stored.get(&row.event_key).cloned().flatten();
        ensure!(
            r.key_str() == Some(row.aggregate_id.as_str())
                && payload.is_some()
                && r.value_str() == payload.as_deref()
                && r.timestamp_ms == Some(row.expected_timestamp_ms())
                && r.header("aggregate_type") == Some("Order")
                && r.header("event_type") == Some(row.event_type.as_str()),
            "record {} does not match its row {row:?}",
            describe_record(r)
        );
    }
    // …and equal to the live record, in the same partition and order.
    let live = read_all_records(&bootstrap, std::slice::from_ref(&live_topic), READ_ALL).await?;
    let live_inside: Vec<Record> = live
        .into_iter()
        .filter(|r| {
            r.header("event_key")
                .is_some_and(|k| inside_keys.contains(k))
        })
        .collect();
    let (live_parts, replay_parts) = (by_partition(&live_inside), by_partition(&replayed));
    ensure!(
        live_parts.keys().eq(replay_parts.keys()),
        "partitions differ: live {:?}, replay {:?}",
        live_parts.keys().collect::<Vec<_>>(),
        replay_parts.keys().collect::<Vec<_>>()
    );
    for (p, live_records) in &live_parts {
        let a: Vec<_> = live_records.iter().map(|r| content(r)).collect();
        let b: Vec<_> = replay_parts[p].iter().map(|r| content(r)).collect();
        ensure!(
            a == b,
            "partition {p} differs:\nlive   {:?}\nreplay {:?}",
            live_records
                .iter()
                .map(|r| describe_record(r))
                .collect::<Vec<_>>(),
            replay_parts[p]
                .iter()
                .map(|r| describe_record(r))
                .collect::<Vec<_>>()
        );
    }
    // The dead letter: the same key, value, row headers and binlog position; the reason names
    // the replay's topic.
    let live_dl = read_all_records(&bootstrap, std::slice::from_ref(&live_dlq), READ_ALL).await?;
    let replay_dl =
        read_all_records(&bootstrap, std::slice::from_ref(&replay_dlq), READ_ALL).await?;
    ensure!(
        live_dl.len() == 1 && replay_dl.len() == 1,
        "dead letters: {live_dl:?} / {replay_dl:?}"
    );
    // MariaDB 11.4+ with binlog_legacy_event_pos=OFF (its default) logs no end for the events
    // inside a transaction, and a live dump leaves out the annotate events: the live relay names
    // the start of the row's transaction (the end of its GTID event), the replay of the file the
    // rows event's exact end. Both are checked against the server's SHOW BINLOG EVENTS below.
    let mut admin = w.db.conn().await?;
    let ends_unlogged = admin
        .query_first::<i64, _>("SELECT @@GLOBAL.binlog_legacy_event_pos")
        .await
        .ok()
        .flatten()
        == Some(0);
    let strip = |r: &Record| {
        (
            r.key.clone(),
            r.value.clone(),
            r.headers
                .iter()
                .filter(|(k, _)| k != "dlq_reason" && !(ends_unlogged && k == "dlq_binlog_pos"))
                .cloned()
                .collect::<Vec<_>>(),
        )
    };
    if ends_unlogged {
        let file = live_dl[0]
            .header("dlq_binlog_file")
            .unwrap_or_default()
            .to_owned();
        let pos = |r: &Record| -> Result<u64> {
            Ok(r.header("dlq_binlog_pos").unwrap_or_default().parse()?)
        };
        let (live_pos, replay_pos) = (pos(&live_dl[0])?, pos(&replay_dl[0])?);
        let gtid = binlog_event_ending_at(&mut admin, &file, live_pos, None).await?;
        ensure!(
            gtid.as_ref().is_some_and(|e| e.event_type == "Gtid"),
            "the live dead letter names {file}:{live_pos}, which is not the end of a GTID event \
             ({gtid:?})"
        );
        let rows = binlog_event_ending_at(&mut admin, &file, replay_pos, None).await?;
        ensure!(
            rows.as_ref()
                .is_some_and(|e| e.event_type.starts_with("Write_rows")),
            "the replayed dead letter names {file}:{replay_pos}, which is not the end of a rows \
             event ({rows:?})"
        );
        ensure!(
            live_pos < replay_pos,
            "the transaction's start {live_pos} is not before its rows event's end {replay_pos}"
        );
    }
    drop(admin);
    ensure!(
        strip(&live_dl[0]) == strip(&replay_dl[0]),
        "dead letters differ:\n{}\n{}",
        describe_record(&live_dl[0]),
        describe_record(&replay_dl[0])
    );
    ensure!(replay_dl[0].header("event_key") == Some(bad.event_key.as_str()));
    ensure!(
        replay_dl[0]
            .header("dlq_reason")
            .is_some_and(|r| r.contains(&format!("t_{}.replay.Bad Type!", w.uid))),
        "{}",
        describe_record(&replay_dl[0])
    );
    ensure!(
        !stderr.contains("127.0.0.1:1"),
        "the replay mentioned the MySQL URL:\n{stderr}"
    );
    drop(conn);
    w.db.drop_database().await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// (2), (3) A MySQL 8 file: binary JSON as MySQL prints it; positions and date-times.
// ---------------------------------------------------------------------------------------------

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/binlogs")
        .join(name)
}

/// The MySQL 8.0.31 file (`binlog_row_metadata=FULL`): `test.t (id, json_col, name AS
/// json_col->>'$.name', age AS json_col->'$.age')`; one transaction per row for rows 1 (events
/// 452-829), 2 (829-1280) and 3 (1280-1753), then rows 4-8 in one (1753-2554) and two UPDATEs
/// (`mysql8-json.000001.events`).
const JSON_FILE: &str = "mysql8-json.000001";

/// Writes `bytes` as each of `names` in a fresh directory.
fn scratch_files(bytes: &[u8], names: &[&str]) -> Result<Vec<PathBuf>> {
    let dir = std::env::temp_dir().join(format!("outbox-relay-replay-{}", unique_suffix()));
    std::fs::create_dir_all(&dir)?;
    names
        .iter()
        .map(|n| {
            let path = dir.join(n);
            std::fs::write(&path, bytes)?;
            Ok(path)
        })
        .collect()
}

/// Creates `topic` with one partition (so the records' order is the replay's order) and no
/// time-based retention (the fixture's records carry 2021 timestamps, older than the test
/// broker's retention).
async fn create_topic(topic: &str) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .create()?;
    let new = NewTopic::new(topic, 1, TopicReplication::Fixed(1)).set("retention.ms", "-1");
    let results = admin
        .create_topics(
            [&new],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await?;
    for r in results {
        r.map_err(|(t, e)| anyhow::anyhow!("creating {t}: {e}"))?;
    }
    Ok(())
}

/// A replay config for the fixture's `mysql.t`: payload = `json_col`, key and id = `id`,
/// aggregate and event type = the generated column `name`, record time = the commit time.
fn fixture_config(topic: &str) -> String {
    let spec = RelayConfigSpec {
        timestamp: None,
        unknown_xa_commit: None,
        http_listen: None,
        ..RelayConfigSpec::for_tables(
            &format!("replay-{}", unique_suffix()),
            NO_MYSQL,
            4242,
            vec!["test.t".into()],
            topic,
        )
    };
    format!(
        "{}\n[outbox.columns]\nid = \"id\"\naggregate_type = \"name\"\naggregate_id = \"id\"\n\
         event_type = \"name\"\nevent_key = \"id\"\npayload = \"json_col\"\ncreated_at = \"\"\n",
        spec.to_toml()
    )
}

/// The record of the fixture's row `id` (1 or 2): `(key, value, headers, timestamp)`.
///
/// Values are MySQL's own text of the stored documents (`mysql8-json.000001.select`);
/// timestamps are the commit times the generator set (`SET TIMESTAMP`, 2021-03-15 08:43:22 and
/// 08:43:39 UTC).
/// The commit times (ms) in the GTID events (type 33) of binlog file `bytes`, in order: the
/// `original_commit_timestamp` (µs) when the event has one, else its
/// `immediate_commit_timestamp` (MySQL's GTID event layout: flags 1, SID 16, GNO 8, logical
/// clock type 1, last_committed 8, sequence_number 8, then 7-byte timestamps whose top bit says
/// the original one follows). The SQL's `SET TIMESTAMP` changes event header times only: these
/// are the real commit times, the record timestamps of the default `outbox.timestamp`.
fn gtid_commit_ms(bytes: &[u8]) -> Vec<i64> {
    let le = |b: &[u8]| {
        b.iter()
            .rev()
            .fold(0u64, |acc, x| (acc << 8) | u64::from(*x))
    };
    let mut out = Vec::new();
    let mut at = 4;
    while at + 19 <= bytes.len() {
        let size = usize::try_from(le(&bytes[at + 9..at + 13])).unwrap_or(usize::MAX);
        if size < 19 || at + size > bytes.len() {
            break;
        }
        if bytes[at + 4] == 33 && size >= 19 + 42 + 7 {
            let ts = at + 19 + 42;
            let immediate = le(&bytes[ts..ts + 7]);
            let micros = if immediate & (1 << 55) != 0 {
                le(&bytes[ts + 7..ts + 14])
            } else {
                immediate
            };
            out.push(i64::try_from(micros / 1000).unwrap_or(0));
        }
        at += size;
    }
    out
}

fn fixture_record(id: u32) -> Content {
    let (name, value) = match id {
        1 => ("Joe", r#"{"age": 24, "data": "xxxxxxxxxx", "name": "Joe"}"#),
        _ => (
            "Sue",
            r#"{"age": 32, "list": ["a", [1, 2, {"deep": {"deeper": [null, {}]}}], [], {}], "name": "Sue"}"#,
        ),
    };
    // GTID event 0 is the CREATE TABLE's; rows 1 and 2 are the next two transactions.
    let commit_ms = std::fs::read(fixture(JSON_FILE))
        .ok()
        .and_then(|bytes| gtid_commit_ms(&bytes).get(id as usize).copied());
    let h = |k: &str, v: &str| (k.to_owned(), Some(v.as_bytes().to_vec()));
    let id = id.to_string();
    (
        Some(id.clone().into_bytes()),
        Some(value.as_bytes().to_vec()),
        vec![
            h("id", &id),
            h("event_key", &id),
            h("event_type", name),
            h("aggregate_type", name),
        ],
        commit_ms,
    )
}

/// Replays `files` with `extra` options to a fresh one-partition topic and returns its records
/// in order, after checking exit code 0 and the summary's `records_produced`.
async fn replay_fixture(files: &[PathBuf], extra: &[&str], expected: usize) -> Result<Vec<Record>> {
    let topic = format!("t_{}.json", unique_suffix());
    create_topic(&topic).await?;
    let replay = spawn_replay(files, extra, &fixture_config(&topic))?;
    expect_exit_code(replay.wait_exit(REPLAY).await?, 0, &replay)?;
    ensure_summary(
        &replay.stderr_text(),
        &[
            ("records_produced", &expected.to_string()),
            ("dead_lettered", "0"),
            ("complete", "true"),
        ],
    )?;
    let mut records = read_all_records(&kafka_bootstrap(), &[topic], READ_ALL).await?;
    records.sort_by_key(|r| r.offset);
    Ok(records)
}

fn ensure_fixture_records(records: &[Record], ids: &[u32]) -> Result<()> {
    let got: Vec<_> = records.iter().map(content).collect();
    let want: Vec<_> = ids.iter().map(|id| fixture_record(*id)).collect();
    ensure!(
        got == want,
        "records differ from the fixture's rows {ids:?}:\n{}",
        records
            .iter()
            .map(describe_record)
            .collect::<Vec<_>>()
            .join("\n")
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql8_json_file_is_replayed_as_mysql_prints_it() -> Result<()> {
    // Rows 1 and 2 (up to the end of row 2's transaction): binary JSON, nested, as MySQL prints it.
    let raw = std::fs::read(fixture(JSON_FILE))?;
    let files = scratch_files(&raw, &["binlog.000001"])?;
    let records = replay_fixture(&files, &["--stop-position", "1280"], 2).await?;
    ensure_fixture_records(&records, &[1, 2])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn positions_and_datetimes_select_exact_transactions() -> Result<()> {
    let files = scratch_files(&std::fs::read(fixture(JSON_FILE))?, &["binlog.000001"])?;
    // Row 2's transaction only.
    let records = replay_fixture(
        &files,
        &["--start-position", "829", "--stop-position", "1280"],
        1,
    )
    .await?;
    ensure_fixture_records(&records, &[2])?;
    // A stop position inside a transaction ends after the one before it.
    let records = replay_fixture(
        &files,
        &["--start-position", "4", "--stop-position", "1279"],
        1,
    )
    .await?;
    ensure_fixture_records(&records, &[1])?;
    // Date-times: commit times 08:43:22 (row 1), 08:43:39 (row 2), 08:43:54 (row 3).
    let records = replay_fixture(
        &files,
        &[
            "--start-datetime",
            "2021-03-15 08:43:00",
            "--stop-datetime",
            "2021-03-15 08:43:30",
        ],
        1,
    )
    .await?;
    ensure_fixture_records(&records, &[1])?;
    let records = replay_fixture(
        &files,
        &[
            "--start-datetime",
            "2021-03-15 08:43:30",
            "--stop-datetime",
            "2021-03-15 08:43:45",
        ],
        1,
    )
    .await?;
    ensure_fixture_records(&records, &[2])
}

/// Without --yes a replay prints its plan (the files, the range, the tables, where the records
/// would go), sends nothing and exits 4; --dry-run prints the same and exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_yes_a_replay_prints_its_plan_and_sends_nothing() -> Result<()> {
    let files = scratch_files(&std::fs::read(fixture(JSON_FILE))?, &["binlog.000001"])?;
    let topic = format!("t_{}.json", unique_suffix());
    create_topic(&topic).await?;
    let file = files[0].display().to_string();
    let size = std::fs::metadata(&files[0])?.len();
    for (flag, code) in [(None, 4), (Some("--dry-run"), 0)] {
        let mut args = vec!["replay", "--binlog", &file, "--stop-position", "1280"];
        args.extend(flag);
        args.push("--config");
        let replay = RelayProcess::spawn_args(bin(), &args, &fixture_config(&topic), &[])?;
        expect_exit_code(replay.wait_exit(REPLAY).await?, code, &replay)?;
        let out = replay.stdout_text();
        for line in [
            format!("file        {file} ({size} bytes)"),
            "range       from the start of the first file to position 1280".to_owned(),
            "tables      test.t".to_owned(),
            format!("records     to {topic} on {}", kafka_bootstrap()),
        ] {
            ensure!(out.contains(&line), "{flag:?}: {line:?} not in\n{out}");
        }
        let last = if code == 4 {
            "not confirmed: nothing changed; run again with --yes to replay them"
        } else {
            "dry run: nothing changed"
        };
        ensure!(out.trim_end().ends_with(last), "{flag:?}:\n{out}");
    }
    let records = read_all_records(&kafka_bootstrap(), &[topic], Duration::from_secs(5)).await?;
    ensure!(
        records.is_empty(),
        "a plan produced {} records",
        records.len()
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// (4) Files that cannot be replayed.
// ---------------------------------------------------------------------------------------------

/// Runs a replay that must fail with `code`; returns its stderr. Nothing may be produced.
async fn failed_replay(files: &[PathBuf], extra: &[&str], code: i32) -> Result<String> {
    let prefix = format!("t_{}", unique_suffix());
    let replay = spawn_replay(files, extra, &fixture_config(&format!("{prefix}.json")))?;
    expect_exit_code(replay.wait_exit(REPLAY).await?, code, &replay)?;
    let topics = list_topics(&kafka_bootstrap(), &prefix).await?;
    ensure!(topics.is_empty(), "a failed replay produced to {topics:?}");
    Ok(replay.stderr_text())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_garbage_and_truncated_files_are_named() -> Result<()> {
    let good = fixture(JSON_FILE);
    let bytes = std::fs::read(&good)?;

    let missing = std::env::temp_dir().join(format!("no-such-binlog-{}.000001", unique_suffix()));
    let stderr = failed_replay(&[good.clone(), missing.clone()], &[], 2).await?;
    ensure!(
        stderr.contains(&format!(
            "invalid argument: --binlog {}: no such file",
            missing.display()
        )),
        "{stderr}"
    );

    let garbage = scratch_files(b"SELECT 1; -- not a binlog", &["garbage.000001"])?;
    let stderr = failed_replay(&garbage, &[], 2).await?;
    ensure!(
        stderr.contains(&format!(
            "invalid argument: --binlog {}: not a binlog file: it does not start with the binlog \
             magic bytes fe 62 69 6e",
            garbage[0].display()
        )),
        "{stderr}"
    );

    // Cut inside the WRITE_ROWS event at 693-798 (105 bytes; mysql8-json.000001.events).
    let cut = scratch_files(&bytes[..730], &["binlog.000001"])?;
    let stderr = failed_replay(&cut, &[], 1).await?;
    ensure!(
        stderr.contains(&format!(
            "binlog: binlog file {} is truncated at position 693: the event there (type 30) is \
             105 bytes long, the file has 37 more",
            cut[0].display()
        )),
        "{stderr}"
    );

    // A start position inside a transaction (BEGIN at 531 of the transaction 452-829).
    let stderr =
        failed_replay(std::slice::from_ref(&good), &["--start-position", "531"], 2).await?;
    ensure!(
        stderr.contains("--start-position 531 is inside the transaction from 452 to 829"),
        "{stderr}"
    );

    // Usage errors are clap's (exit 2); --help says what a replay does not do.
    let stderr = failed_replay(&[good], &["--start-datetime", "2021-03-15T08:43:22"], 2).await?;
    ensure!(stderr.contains("YYYY-MM-DD HH:MM:SS"), "{stderr}");
    let help = std::process::Command::new(bin())
        .args(["replay", "--help"])
        .output()?;
    let help = String::from_utf8_lossy(&help.stdout);
    ensure!(
        help.contains("does NOT connect to MySQL") && help.contains("writes NO checkpoint"),
        "{help}"
    );
    Ok(())
}
