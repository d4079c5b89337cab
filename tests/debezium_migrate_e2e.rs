//! `outbox-relay migrate-from debezium` against the test server and Kafka: Debezium offsets in
//! Kafka Connect's form (an offsets topic of this test) for a stop in the middle of a
//! multi-row transaction, as `BinlogOffsetContext` writes them (file/pos = the transaction's
//! first event: MySQL's BEGIN query, MariaDB's GTID event; `event` = the events handled since
//! it, that one included; `row` = rows of the next event emitted), then the relay started from
//! the checkpoint the command writes must produce exactly the rows after the stop.
//!
//! The event counts are computed here from `SHOW BINLOG EVENTS` (less the Annotate_rows events
//! a dump does not send to a replica that did not ask for them, as Debezium does not by
//! default), independently of the command's own binlog reading.

use std::process::ExitStatus;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use mysql_async::prelude::*;
use mysql_async::Conn;
use outbox_relay_testkit::rdkafka::config::ClientConfig;
use outbox_relay_testkit::rdkafka::producer::{FutureProducer, FutureRecord};
use outbox_relay_testkit::{
    create_topic, current_binlog_position, describe_exit, insert_outbox_rows, test_server,
    BinlogPosition, InsertStyle, RelayConfigSpec, RelayProcess, RowGen, World,
};

fn bin() -> &'static str {
    outbox_relay_testkit::relay_bin()
}
const EXIT: Duration = Duration::from_secs(90);

/// Runs `outbox-relay <args> --config <spec>` to its end.
async fn run(spec: &RelayConfigSpec, args: &[&str]) -> Result<(ExitStatus, String, String)> {
    let mut all: Vec<&str> = args.to_vec();
    all.push("--config");
    let p = RelayProcess::spawn_args(bin(), &all, &spec.to_toml(), &[])?;
    let status = p.wait_exit(EXIT).await?;
    Ok((status, p.stdout_text(), p.stderr_text()))
}

/// `migrate-from debezium --offsets-topic TOPIC --connector CONNECTOR FLAG`.
async fn from_offsets_topic(
    spec: &RelayConfigSpec,
    topic: &str,
    connector: &str,
    flag: &str,
) -> Result<(ExitStatus, String, String)> {
    let args = [
        "migrate-from",
        "debezium",
        "--offsets-topic",
        topic,
        "--connector",
        connector,
        flag,
    ];
    run(spec, &args).await
}

fn refs(a: &[String]) -> Vec<&str> {
    a.iter().map(String::as_str).collect()
}

fn expect(status: &ExitStatus, code: i32, out: &str, err: &str) -> Result<()> {
    ensure!(
        status.code() == Some(code),
        "expected exit code {code}, got {}\n--- stdout ---\n{out}\n--- stderr ---\n{err}",
        describe_exit(status)
    );
    Ok(())
}

/// One event of `SHOW BINLOG EVENTS`: (file, start, type, end, info).
type Shown = (String, u64, String, u64, String);

async fn events_from(conn: &mut Conn, from: &BinlogPosition) -> Result<Vec<Shown>> {
    let rows: Vec<mysql_async::Row> = conn
        .query(format!(
            "SHOW BINLOG EVENTS IN '{}' FROM {}",
            from.file, from.pos
        ))
        .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let info = r
                .get::<Option<Vec<u8>>, _>(5)
                .flatten()
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default();
            (
                r.get::<String, _>(0).unwrap_or_default(),
                r.get::<u64, _>(1).unwrap_or(0),
                r.get::<String, _>(2).unwrap_or_default(),
                r.get::<u64, _>(4).unwrap_or(0),
                info,
            )
        })
        .collect())
}

/// Produces Connect offset records (key, value or tombstone) to `topic`.
async fn produce_offsets(
    bootstrap: &str,
    topic: &str,
    records: &[(String, Option<String>)],
) -> Result<()> {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .create()
        .context("creating the offsets producer")?;
    for (key, value) in records {
        let mut r = FutureRecord::<String, String>::to(topic).key(key);
        if let Some(v) = value {
            r = r.payload(v);
        }
        producer
            .send(r, Duration::from_secs(30))
            .await
            .map_err(|(e, _)| anyhow::anyhow!("producing an offset record: {e}"))?;
    }
    Ok(())
}

/// The Debezium offset for a stop in the middle of the test's transaction (the one that writes
/// `marker_table`, a table only it writes: other tests write to the server at the same time):
/// the transaction's start (its first event as Debezium's `handleTransactionBegin` sees it),
/// and the index (from that event, 0-based, Annotate_rows left out) of its `nth` Write_rows
/// event.
fn debezium_stop(
    events: &[Shown],
    mariadb: bool,
    marker_table: &str,
    nth_write: usize,
) -> Result<(u64, u64)> {
    let marker = events
        .iter()
        .position(|(_, _, kind, _, info)| kind == "Table_map" && info.contains(marker_table))
        .with_context(|| format!("no table map of {marker_table} among the events"))?;
    let start = events[..marker]
        .iter()
        .rposition(|(_, _, kind, _, info)| {
            if mariadb {
                kind == "Gtid" && info.starts_with("BEGIN")
            } else {
                kind == "Query" && info.trim() == "BEGIN"
            }
        })
        .context("no transaction start before the table map")?;
    let tx: Vec<&Shown> = events[start..]
        .iter()
        .filter(|(_, _, kind, _, _)| kind != "Annotate_rows")
        .collect();
    let index = tx
        .iter()
        .enumerate()
        .filter(|(_, (_, _, kind, _, _))| kind.starts_with("Write_rows"))
        .nth(nth_write)
        .map(|(i, _)| i)
        .context("too few Write_rows events")?;
    Ok((events[start].1, u64::try_from(index)?))
}

/// Debezium's `gtids` at the transaction starting at `start`: the GTIDs completed before it,
/// from its own GTID (MariaDB `BEGIN GTID 0-1-N` → `0-1-(N-1)`; MySQL `GTID_NEXT=
/// 'uuid:N'` → `uuid:1-(N-1)`: the test servers have one source and no purged GTIDs).
fn gtids_before(events: &[Shown], start: u64, mariadb: bool) -> Result<String> {
    let i = events
        .iter()
        .position(|e| e.1 == start)
        .context("the transaction's start")?;
    let (gtid_event, prefix) = if mariadb {
        (&events[i], "BEGIN GTID ")
    } else {
        (
            events[..i]
                .last()
                .context("no event before the transaction's BEGIN")?,
            "SET @@SESSION.GTID_NEXT= '",
        )
    };
    let text = gtid_event
        .4
        .strip_prefix(prefix)
        .with_context(|| format!("no GTID in {gtid_event:?}"))?;
    let gtid: String = text
        .chars()
        .take_while(|c| c.is_ascii_hexdigit() || *c == '-' || *c == ':')
        .collect();
    let (head, n) = gtid
        .rsplit_once(if mariadb { '-' } else { ':' })
        .context("GTID form")?;
    let n: u64 = n.parse()?;
    Ok(if mariadb {
        format!("{head}-{}", n - 1)
    } else {
        format!("{head}:1-{}", n - 1)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_resumes_where_debezium_stopped_inside_a_transaction() -> Result<()> {
    // Stopped after emitting c: row 0 of the three-row event (the 4th rows event), row = 1.
    resume_inside_a_transaction(false, 3, 1).await
}

/// The same in exactly-once mode: the command also commits the point to the progress topic
/// (reset's writer), where such runs resume from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_resumes_where_debezium_stopped_inside_a_transaction() -> Result<()> {
    // Stopped after emitting f, the last row of the transaction: the three-row event was
    // handled whole (its rows are skipped with it), then f's event with row = 1 (its count).
    resume_inside_a_transaction(true, 4, 1).await
}

/// Debezium stopped after emitting `row` rows of the transaction's `nth_write` (0-based) rows
/// event: a, b, other_table, c-d-e, f.
async fn resume_inside_a_transaction(exactly_once: bool, nth_write: usize, row: u64) -> Result<()> {
    let mariadb = test_server().is_mariadb();
    let mut w = World::new(bin(), if exactly_once { "dbzeos" } else { "dbzmig" }).await?;
    if exactly_once {
        w.spec.kafka_extra = format!(
            "delivery = \"exactly_once\"\nprogress_topic = \"t_{}.progress\"\n\
             transaction_interval_ms = 50\n",
            w.uid
        );
    }
    let mut conn = w.db.conn().await?;
    conn.query_drop("CREATE TABLE other_table (id INT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(20))")
        .await?;
    let mut gen = RowGen::new(&w.uid, "dbz", 3);
    // Delivered by Debezium before: a whole transaction.
    let earlier = gen.rows(2);
    outbox_relay_testkit::commit_rows(&mut conn, &earlier).await?;
    let before_tx = current_binlog_position(&mut conn).await?;
    let server_id: u32 = conn.query_first("SELECT @@server_id").await?.unwrap_or(0);
    // The transaction: a, b (one INSERT each), a row of another table, c d e (one INSERT, one
    // rows event of three rows), f.
    let rows = gen.rows(6);
    conn.query_drop("BEGIN").await?;
    insert_outbox_rows(&mut conn, "outbox", &rows[0..1], InsertStyle::SingleRow).await?;
    insert_outbox_rows(&mut conn, "outbox", &rows[1..2], InsertStyle::SingleRow).await?;
    conn.query_drop("INSERT INTO other_table (v) VALUES ('between')")
        .await?;
    insert_outbox_rows(&mut conn, "outbox", &rows[2..5], InsertStyle::MultiRow).await?;
    insert_outbox_rows(&mut conn, "outbox", &rows[5..6], InsertStyle::SingleRow).await?;
    conn.query_drop("COMMIT").await?;
    // After Debezium stopped: another transaction.
    let later = gen.rows(2);
    outbox_relay_testkit::commit_rows(&mut conn, &later).await?;
    let end = current_binlog_position(&mut conn).await?;

    let events = events_from(&mut conn, &before_tx).await?;
    // Debezium stopped after emitting c (row 0 of the multi-row event, the 4th Write_rows:
    // a, b, other_table, c-d-e): offset row = 1.
    let marker = format!("({}.other_table)", w.db.name());
    let (pos, event) = debezium_stop(&events, mariadb, &marker, nth_write)?;
    let gtids = gtids_before(&events, pos, mariadb)?;
    // BEGIN (MySQL) or the GTID event (MariaDB), then a table map and a rows event per INSERT.
    let expected_event = 2 + 2 * u64::try_from(nth_write)?;
    ensure!(
        event == expected_event,
        "the stop is event {event}, expected {expected_event}"
    );
    // Outbox rows Debezium delivered: those of the rows events before (other_table's is the
    // 3rd), then `row` of the stop's.
    let delivered: usize = match nth_write {
        3 => 2 + usize::try_from(row)?,
        4 => 5 + usize::try_from(row)?,
        _ => anyhow::bail!("no stop planned at rows event {nth_write}"),
    };
    let connector = format!("dbz-{}", w.uid);
    let key = format!(r#"["{connector}",{{"server":"shop"}}]"#);
    let boundary_offset = format!(
        r#"{{"ts_sec":1767323045,"file":"{}","pos":{},"gtids":"{gtids}","server_id":{server_id}}}"#,
        before_tx.file, before_tx.pos
    );
    let stop_offset = format!(
        r#"{{"transaction_id":null,"ts_sec":1767323046,"file":"{}","pos":{pos},"gtids":"{gtids}","row":{row},"server_id":{server_id},"event":{event}}}"#,
        before_tx.file
    );
    let offsets_topic = format!("connect-offsets-{}", w.uid);
    create_topic(&w.spec.bootstrap_servers, &offsets_topic, 1_000_000).await?;
    produce_offsets(
        &w.spec.bootstrap_servers,
        &offsets_topic,
        &[
            (key.clone(), Some(boundary_offset)),
            (
                r#"["someone-else",{"server":"shop"}]"#.into(),
                Some(r#"{"file":"x.000001","pos":4}"#.into()),
            ),
            (key.clone(), Some(stop_offset)),
        ],
    )
    .await?;

    let args = |extra: &[&'static str]| -> Vec<String> {
        let mut a: Vec<String> = [
            "migrate-from",
            "debezium",
            "--offsets-topic",
            &offsets_topic,
            "--connector",
            &connector,
            "--topic-prefix",
            "shop",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        a.extend(extra.iter().map(|s| (*s).to_owned()));
        a
    };

    // --dry-run: prints, writes nothing.
    let a = args(&["--dry-run"]);
    let (status, out, err) = run(&w.spec, &refs(&a)).await?;
    expect(&status, 0, &out, &err)?;
    ensure!(
        out.contains(&format!("rows_acked {delivered}")) && out.contains("dry run"),
        "{out}"
    );
    ensure!(
        outbox_relay_testkit::read_checkpoint(
            w.db.pool(),
            outbox_relay_testkit::DEFAULT_CHECKPOINT_TABLE,
            &w.spec.connector_name
        )
        .await?
        .is_none(),
        "a dry run wrote a checkpoint:\n{out}"
    );
    // Without --yes: the plan, exit code 4.
    let a = args(&[]);
    let (status, out, err) = run(&w.spec, &refs(&a)).await?;
    expect(&status, 4, &out, &err)?;
    // With --yes: written.
    let a = args(&["--yes"]);
    let (status, out, err) = run(&w.spec, &refs(&a)).await?;
    expect(&status, 0, &out, &err)?;
    println!("--- migrate-from debezium --yes ---\n{out}");
    // Its gtids are the server's GTID state there: no warning.
    ensure!(!out.contains("warning"), "{out}");
    ensure!(out.contains("next        start the relay"), "{out}");
    let cp = w.checkpoint().await?;
    ensure!(
        cp.rows_acked == u64::try_from(delivered)?,
        "rows_acked {}, expected {delivered}:\n{out}",
        cp.rows_acked
    );
    ensure!(
        cp.position() <= BinlogPosition::new(before_tx.file.clone(), pos)
            && cp.position() >= before_tx,
        "checkpoint {} is not the boundary before the transaction at {pos}:\n{out}",
        cp.position()
    );

    // The relay sends exactly d, e, f and the later rows.
    let relay = w.spawn()?;
    w.wait_checkpoint_covers(&relay, &end, EXIT).await?;
    // While the relay runs, the command is refused (its lease).
    let a = args(&["--yes"]);
    let (status, out, err) = run(&w.spec, &refs(&a)).await?;
    expect(&status, 3, &out, &err)?;
    ensure!(err.contains("lease of connector"), "{err}");
    let topic = w.topic(&rows[0].aggregate_type);
    let records = if exactly_once {
        outbox_relay_testkit::read_committed_records(
            &w.spec.bootstrap_servers,
            std::slice::from_ref(&topic),
            EXIT,
        )
        .await
    } else {
        outbox_relay_testkit::read_all_records(
            &w.spec.bootstrap_servers,
            std::slice::from_ref(&topic),
            EXIT,
        )
        .await
    }
    .with_context(|| relay.stderr_tail())?;
    outbox_relay_testkit::expect_exit_code(relay.stop(EXIT).await?, 0, &relay)?;
    // Sorted: the aggregates spread over partitions (order within one is the relay's own
    // guarantee, tested elsewhere); a duplicate would show twice, a gap as a missing key.
    let mut keys: Vec<&str> = records
        .iter()
        .filter_map(|r| r.header("event_key"))
        .collect();
    keys.sort_unstable();
    let mut expected: Vec<&str> = rows[delivered..]
        .iter()
        .chain(later.iter())
        .map(|r| r.event_key.as_str())
        .collect();
    expected.sort_unstable();
    ensure!(
        keys == expected,
        "records after the migration: {keys:?}, expected {expected:?} (no gap, no duplicate)"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_offsets_are_refused_with_the_reason() -> Result<()> {
    let w = World::new(bin(), "dbzbad").await?;
    let mut conn = w.db.conn().await?;
    let now = current_binlog_position(&mut conn).await?;
    let offsets_topic = format!("connect-offsets-{}", w.uid);
    create_topic(&w.spec.bootstrap_servers, &offsets_topic, 1_000_000).await?;
    let (stem, _) = now.file.rsplit_once('.').context("binlog file name")?;
    let gone = format!("{stem}.000000");
    produce_offsets(
        &w.spec.bootstrap_servers,
        &offsets_topic,
        &[
            (
                r#"["snap",{"server":"p"}]"#.into(),
                Some(format!(
                    r#"{{"file":"{}","pos":{},"snapshot":"INITIAL","snapshot_completed":false}}"#,
                    now.file, now.pos
                )),
            ),
            (
                r#"["purged",{"server":"p"}]"#.into(),
                Some(format!(
                    r#"{{"file":"{gone}","pos":1234,"event":2,"row":1}}"#
                )),
            ),
            (
                r#"["deleted",{"server":"p"}]"#.into(),
                Some(format!(r#"{{"file":"{}","pos":4}}"#, now.file)),
            ),
            (r#"["deleted",{"server":"p"}]"#.into(), None),
            (
                r#"["elsewhere",{"server":"p"}]"#.into(),
                Some(format!(
                    r#"{{"file":"{}","pos":{},"gtids":"00000000-0000-0000-0000-00000000abcd:1-5"}}"#,
                    now.file, now.pos
                )),
            ),
            (
                r#"["other-id",{"server":"p"}]"#.into(),
                Some(format!(
                    r#"{{"file":"{}","pos":{},"server_id":4242424}}"#,
                    now.file, now.pos
                )),
            ),
        ],
    )
    .await?;
    // Another server id: a warning only (a replica's events carry their origin's).
    let (status, out, err) =
        from_offsets_topic(&w.spec, &offsets_topic, "other-id", "--dry-run").await?;
    expect(&status, 0, &out, &err)?;
    ensure!(
        out.contains("warning     Debezium's offset has server_id 4242424"),
        "{out}"
    );
    if !test_server().is_mariadb() {
        // GTIDs this MySQL server never executed: another server.
        let (status, out, err) =
            from_offsets_topic(&w.spec, &offsets_topic, "elsewhere", "--yes").await?;
        expect(&status, 2, &out, &err)?;
        ensure!(
            err.contains("which this server has not all executed"),
            "{err}"
        );
    }
    for (connector, says) in [
        ("snap", "during its INITIAL snapshot"),
        ("purged", "no longer has (or never had) binlog file"),
        ("deleted", "was deleted"),
        ("nobody", "holds no offset of connector"),
    ] {
        let (status, out, err) =
            from_offsets_topic(&w.spec, &offsets_topic, connector, "--yes").await?;
        expect(&status, 2, &out, &err)?;
        ensure!(err.contains(says), "{connector}: {says:?} not in:\n{err}");
    }
    Ok(())
}

/// A `FileOffsetBackingStore` file as `ObjectOutputStream.writeObject(HashMap<byte[],byte[]>)`
/// writes it (the layout of `crates/cli/testdata/debezium-offsets.dat`, which Kafka Connect
/// itself wrote): one entry.
fn offset_file(key: &str, value: &str) -> Vec<u8> {
    let mut b = vec![0xAC, 0xED, 0x00, 0x05, 0x73, 0x72, 0x00, 0x11];
    b.extend_from_slice(b"java.util.HashMap");
    b.extend_from_slice(&[
        0x05, 0x07, 0xDA, 0xC1, 0xC3, 0x16, 0x60, 0xD1, 0x03, 0x00, 0x02,
    ]);
    b.extend_from_slice(b"F\x00\x0aloadFactorI\x00\x09threshold\x78\x70");
    b.extend_from_slice(&[
        0x3F, 0x40, 0, 0, 0, 0, 0, 0x0C, 0x77, 0x08, 0, 0, 0, 0x10, 0, 0, 0, 1,
    ]);
    b.extend_from_slice(&[0x75, 0x72, 0x00, 0x02, b'[', b'B']);
    b.extend_from_slice(&[
        0xAC, 0xF3, 0x17, 0xF8, 0x06, 0x08, 0x54, 0xE0, 0x02, 0x00, 0x00, 0x78, 0x70,
    ]);
    for (i, part) in [key, value].into_iter().enumerate() {
        if i == 1 {
            b.extend_from_slice(&[0x75, 0x71, 0x00, 0x7E, 0x00, 0x02]);
        }
        b.extend_from_slice(&u32::try_from(part.len()).unwrap_or(0).to_be_bytes());
        b.extend_from_slice(part.as_bytes());
    }
    b.push(0x78);
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offset_file_at_a_transaction_boundary_resumes_at_the_next_transaction() -> Result<()> {
    let w = World::new(bin(), "dbzfile").await?;
    let mut conn = w.db.conn().await?;
    let mut gen = RowGen::new(&w.uid, "dbzf", 2);
    let earlier = gen.rows(2);
    outbox_relay_testkit::commit_rows(&mut conn, &earlier).await?;
    // Debezium committed the offset after the earlier transaction's commit: no event/row.
    let stop = current_binlog_position(&mut conn).await?;
    let later = gen.rows(3);
    outbox_relay_testkit::commit_rows(&mut conn, &later).await?;
    let end = current_binlog_position(&mut conn).await?;
    let path = std::env::temp_dir().join(format!("dbz-offsets-{}.dat", w.uid));
    std::fs::write(
        &path,
        offset_file(
            r#"["engine",{"server":"shop"}]"#,
            &format!(
                r#"{{"ts_sec":1767323046,"file":"{}","pos":{}}}"#,
                stop.file, stop.pos
            ),
        ),
    )?;
    let file = path.to_string_lossy().into_owned();
    let (status, out, err) = run(
        &w.spec,
        &["migrate-from", "debezium", "--offset-file", &file, "--yes"],
    )
    .await?;
    let _ = std::fs::remove_file(&path);
    expect(&status, 0, &out, &err)?;
    let cp = w.checkpoint().await?;
    ensure!(
        cp.position() == stop && cp.rows_acked == 0,
        "checkpoint {} rows_acked {}, expected {stop} and 0:\n{out}",
        cp.position(),
        cp.rows_acked
    );
    let relay = w.spawn()?;
    w.wait_checkpoint_covers(&relay, &end, EXIT).await?;
    let records = outbox_relay_testkit::read_all_records(
        &w.spec.bootstrap_servers,
        &[w.topic(&later[0].aggregate_type)],
        EXIT,
    )
    .await
    .with_context(|| relay.stderr_tail())?;
    outbox_relay_testkit::expect_exit_code(relay.stop(EXIT).await?, 0, &relay)?;
    let mut keys: Vec<&str> = records
        .iter()
        .filter_map(|r| r.header("event_key"))
        .collect();
    keys.sort_unstable();
    let mut expected: Vec<&str> = later.iter().map(|r| r.event_key.as_str()).collect();
    expected.sort_unstable();
    ensure!(keys == expected, "records {keys:?}, expected {expected:?}");
    Ok(())
}
