//! End-to-end tests of the relay's HTTP endpoints (`/metrics`, `/healthz`, `/readyz`), its
//! progress log and its logging settings, against the real MariaDB and Kafka of the test
//! machine.
//!
//! Each relay listens on its own free port ([`free_local_port`]). The expected values come from
//! what the test wrote (row counts), what Kafka holds (record sizes) and the checkpoint row in
//! the state table, never from the relay's own output.

use std::time::Duration;

use anyhow::{anyhow, ensure, Context, Result};
use mysql_async::prelude::*;
use outbox_relay_testkit::{
    collect_records, commit_rows, current_binlog_position, expect_exit_code, free_local_port,
    http_get, metric, wait_for_status, wait_until, Record, RelayProcess, RowGen, World,
};

/// The relay binary under test (built on first use).
fn bin() -> &'static str {
    outbox_relay_testkit::relay_bin()
}

/// Relay start-up until `/readyz` says it streams.
const STARTUP: Duration = Duration::from_secs(60);
/// Records reaching Kafka and the metrics following them.
const RELAY_WAIT: Duration = Duration::from_secs(120);
/// A graceful stop until the process has exited.
const STOP: Duration = Duration::from_secs(30);
/// Poll interval of HTTP checks.
const POLL: Duration = Duration::from_millis(100);

/// Bytes of `r` as the relay counts them: key, value, header names and values.
fn record_bytes(r: &Record) -> u64 {
    let headers: usize = r
        .headers
        .iter()
        .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len))
        .sum();
    (r.key.as_ref().map_or(0, Vec::len) + r.value.as_ref().map_or(0, Vec::len) + headers) as u64
}

/// `rows_read=<n>` summed over the relay's `progress` log lines (text format).
fn progress_rows_read(stderr: &str) -> u64 {
    stderr
        .lines()
        .filter(|l| l.contains(" progress "))
        .filter_map(|l| {
            let rest = &l[l.find(" rows_read=")? + " rows_read=".len()..];
            rest.split(' ').next()?.parse::<u64>().ok()
        })
        .sum()
}

/// Rows written while the relay streams: `/metrics` counts them as produced, read and
/// acknowledged exactly once each, with the byte count of the records on Kafka, and the
/// checkpoint gauges equal the checkpoint row; a `progress` line reports them; the endpoints
/// go away with the relay.
#[tokio::test(flavor = "multi_thread")]
async fn metrics_follow_the_relayed_rows() -> Result<()> {
    const TRANSACTIONS: usize = 3;
    const ROWS_PER_TX: usize = 10;
    const N: usize = TRANSACTIONS * ROWS_PER_TX;
    let mut w = World::new(bin(), "obs_metrics").await?;
    let port = free_local_port()?;
    w.spec.http_listen = Some(format!("127.0.0.1:{port}"));
    let relay = w.spawn()?;

    let health = wait_for_status(&relay, port, "/healthz", 200, STARTUP).await?;
    ensure!(health == "ok\n", "{health:?}");
    let ready = wait_for_status(&relay, port, "/readyz", 200, STARTUP).await?;
    ensure!(ready == "ready: streaming\n", "{ready:?}");

    let mut conn = w.db.conn().await?;
    let mut gen = RowGen::new(&w.uid, "obs", 4);
    for _ in 0..TRANSACTIONS {
        commit_rows(&mut conn, &gen.rows(ROWS_PER_TX)).await?;
    }
    let end = current_binlog_position(&mut conn).await?;
    let topic = w.topic("Order");
    let records = collect_records(
        &w.spec.bootstrap_servers,
        std::slice::from_ref(&topic),
        N,
        RELAY_WAIT,
    )
    .await?;
    ensure!(records.len() == N, "{} records on {topic}", records.len());
    let bytes: u64 = records.iter().map(record_bytes).sum();
    // The first acknowledgement of each partition is read back before the checkpoint passes it.
    let partitions = records
        .iter()
        .map(|r| r.partition)
        .collect::<std::collections::HashSet<_>>()
        .len();

    let produced = format!("outbox_relay_records_produced_total{{topic=\"{topic}\"}}");
    let page = wait_until(
        "the metrics to count every record",
        RELAY_WAIT,
        POLL,
        async || {
            let (status, page) = http_get(port, "/metrics").await?;
            ensure!(status == 200, "/metrics answered {status}");
            let proven = metric(&page, "outbox_relay_read_backs_total{result=\"stored\"}");
            Ok(
                (metric(&page, &produced) == Some(N as f64) && proven == Some(partitions as f64))
                    .then_some(page),
            )
        },
    )
    .await?;
    let table = format!(
        "outbox_relay_outbox_rows_read_total{{table=\"{}\"}}",
        w.db.outbox_table()
    );
    for (series, want) in [
        (table.as_str(), N as f64),
        (
            &format!("outbox_relay_bytes_produced_total{{topic=\"{topic}\"}}"),
            bytes as f64,
        ),
        ("outbox_relay_binlog_to_ack_seconds_count", N as f64),
        ("outbox_relay_read_to_ack_seconds_count", N as f64),
        ("outbox_relay_records_in_flight", 0.0),
        ("outbox_relay_source_connected", 1.0),
        (
            "outbox_relay_read_backs_total{result=\"stored\"}",
            partitions as f64,
        ),
    ] {
        ensure!(
            metric(&page, series) == Some(want),
            "{series}: expected {want}, got {:?}\n{page}",
            metric(&page, series)
        );
    }
    ensure!(
        metric(&page, "outbox_relay_read_backs_total{result=\"missing\"}").is_none(),
        "a read-back found an acknowledged record missing:\n{page}"
    );
    ensure!(
        page.contains("# TYPE outbox_relay_binlog_to_ack_seconds histogram"),
        "{page}"
    );
    let events = metric(&page, "outbox_relay_binlog_events_read_total").unwrap_or(0.0);
    // Each transaction is at least GTID, annotate/table map, rows and XID events.
    ensure!(events >= (TRANSACTIONS * 3) as f64, "{events} events read");
    let lag = metric(&page, "outbox_relay_lag_seconds").context("lag")?;
    ensure!((0.0..60.0).contains(&lag), "lag {lag}");

    // The checkpoint gauges show the stored row. Other tests' transactions on the shared server
    // move the checkpoint too, so compare a scrape taken while the row did not change.
    w.wait_checkpoint_covers(&relay, &end, RELAY_WAIT).await?;
    wait_until(
        "the checkpoint gauges to equal the checkpoint row",
        RELAY_WAIT,
        POLL,
        async || {
            let before = w.checkpoint().await?;
            let (_, page) = http_get(port, "/metrics").await?;
            let after = w.checkpoint().await?;
            if before != after {
                return Ok(None);
            }
            let seq: f64 = before
                .binlog_file
                .rsplit_once('.')
                .and_then(|(_, s)| s.parse().ok())
                .context("a numbered binlog file")?;
            let gauges = (
                metric(&page, "outbox_relay_checkpoint_binlog_file_sequence"),
                metric(&page, "outbox_relay_checkpoint_binlog_position_bytes"),
            );
            Ok((gauges == (Some(seq), Some(before.binlog_pos as f64))).then_some(()))
        },
    )
    .await?;
    let (_, page) = http_get(port, "/metrics").await?;
    ensure!(
        metric(&page, "outbox_relay_checkpoint_writes_total").is_some_and(|n| n >= 1.0),
        "{page}"
    );
    let age = metric(&page, "outbox_relay_checkpoint_age_seconds").context("age")?;
    ensure!((0.0..30.0).contains(&age), "checkpoint age {age}");

    // The progress line of the interval in which the rows were read (every 10 s).
    wait_until(
        "progress log lines reporting every row read",
        Duration::from_secs(30),
        POLL,
        async || Ok((progress_rows_read(&relay.stderr_text()) == N as u64).then_some(())),
    )
    .await
    .map_err(|e| anyhow!("{e:#}\n--- relay stderr ---\n{}", relay.stderr_tail()))?;

    let status = relay.stop(STOP).await?;
    expect_exit_code(status, 0, &relay)?;
    ensure!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "port {port} still answers after the relay stopped"
    );
    Ok(())
}

/// With MySQL unreachable the process is live but not ready, and says why; JSON logs at
/// `RUST_LOG=warn` carry no info lines and never the password of `mysql.url`.
#[tokio::test(flavor = "multi_thread")]
async fn unreachable_mysql_is_live_but_not_ready() -> Result<()> {
    const PASSWORD: &str = "Obs3rvSecretPw";
    let mut w = World::new(bin(), "obs_down").await?;
    let port = free_local_port()?;
    let closed = free_local_port()?; // nothing listens there
    w.spec.http_listen = Some(format!("127.0.0.1:{port}"));
    w.spec.mysql_url = format!("mysql://root:{PASSWORD}@127.0.0.1:{closed}/{}", w.db.name());
    let relay = RelayProcess::spawn_args(
        bin(),
        &["--log-format", "json", "run", "--config"],
        &w.spec.to_toml(),
        &[("RUST_LOG", "warn")],
    )?;

    let health = wait_for_status(&relay, port, "/healthz", 200, STARTUP).await?;
    ensure!(health == "ok\n", "{health:?}");
    let reason = wait_for_status(&relay, port, "/readyz", 503, STARTUP).await?;
    let reason = if reason.contains("retrying") {
        reason
    } else {
        // Before the first attempt failed it may still be "starting"/"waiting…".
        wait_until("a retrying reason", STARTUP, POLL, async || {
            let (status, body) = http_get(port, "/readyz").await?;
            ensure!(status == 503, "/readyz answered {status}: {body}");
            Ok(body.contains("retrying").then_some(body))
        })
        .await?
    };
    ensure!(
        reason.starts_with("not ready: not streaming: attempt ")
            && reason.contains("failed, retrying in ")
            && reason.contains("MySQL: "),
        "{reason:?}"
    );
    // The address and the fix, said once.
    ensure!(
        reason.contains(&format!("MySQL: 127.0.0.1:{closed}: connection refused"))
            && reason.contains("Fix: start the server")
            && !reason.contains("Input/output error"),
        "{reason:?}"
    );
    ensure!(!reason.contains(PASSWORD), "{reason:?}");
    // Still live, and the metrics count the failures.
    ensure!(http_get(port, "/healthz").await?.0 == 200);
    let page = wait_until(
        "a MySQL reconnect to be counted",
        STARTUP,
        POLL,
        async || {
            let (_, page) = http_get(port, "/metrics").await?;
            Ok(
                (metric(&page, "outbox_relay_reconnects_total{cause=\"mysql\"}")
                    .is_some_and(|n| n >= 1.0))
                .then_some(page),
            )
        },
    )
    .await?;
    ensure!(
        metric(&page, "outbox_relay_errors_total{kind=\"mysql\"}").is_some_and(|n| n >= 1.0),
        "{page}"
    );
    ensure!(
        metric(&page, "outbox_relay_source_connected") == Some(0.0),
        "{page}"
    );
    ensure!(!page.contains(PASSWORD), "{page}");

    let status = relay.stop(STOP).await?;
    expect_exit_code(status, 0, &relay)?;
    let stderr = relay.stderr_text();
    ensure!(
        !stderr.contains(PASSWORD),
        "the password is in the log:\n{stderr}"
    );
    let mut retries = 0;
    for line in stderr.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("not a JSON log line: {line:?}"))?;
        let level = v["level"].as_str().unwrap_or_default();
        ensure!(
            level == "WARN" || level == "ERROR",
            "RUST_LOG=warn let a {level} line through: {line}"
        );
        if v["fields"]["message"] == "relay interrupted; retrying" {
            retries += 1;
        }
    }
    ensure!(retries >= 1, "no retry warning in\n{stderr}");
    Ok(())
}

/// An `http.listen` port that is already in use stops the relay at start-up with a
/// configuration error (exit code 2) naming the key and the fix.
#[tokio::test(flavor = "multi_thread")]
async fn http_port_in_use_is_a_configuration_error() -> Result<()> {
    let mut w = World::new(bin(), "obs_port").await?;
    let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
    let listen = taken.local_addr()?.to_string();
    w.spec.http_listen = Some(listen.clone());
    let relay = w.spawn()?;
    let status = relay.wait_exit(STARTUP).await?;
    expect_exit_code(status, 2, &relay)?;
    let stderr = relay.stderr_text();
    let want =
        format!("configuration error: http.listen \"{listen}\": the address is already in use");
    ensure!(stderr.contains(&want), "{want:?} not in\n{stderr}");
    ensure!(stderr.contains("http.enabled = false"), "{stderr}");
    drop(taken);
    Ok(())
}

/// Rows that go to the dead-letter topic are counted by why, and not as produced records.
#[tokio::test(flavor = "multi_thread")]
async fn dead_letters_are_counted_by_kind() -> Result<()> {
    let mut w = World::new(bin(), "obs_dlq").await?;
    let port = free_local_port()?;
    let dlq = format!("t_{}.dead_letter", w.uid);
    w.spec.http_listen = Some(format!("127.0.0.1:{port}"));
    w.spec.dead_letter_topic = Some(dlq.clone());
    w.spec
        .kafka_properties
        .push(("message.max.bytes".into(), "2000".into()));
    let relay = w.spawn()?;
    wait_for_status(&relay, port, "/readyz", 200, STARTUP).await?;

    let mut conn = w.db.conn().await?;
    let big = format!(r#"{{"blob":"{}"}}"#, "x".repeat(5_000));
    // (aggregate type, payload): good, no valid topic (a space), too large, good.
    let rows = [
        ("Order", r#"{"n":1}"#.to_owned()),
        ("Bad Type", r#"{"n":2}"#.to_owned()),
        ("Order", big),
        ("Order", r#"{"n":4}"#.to_owned()),
    ];
    for (i, (agg_type, payload)) in rows.iter().enumerate() {
        conn.exec_drop(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, event_key, payload) \
             VALUES (?, 'o-1', 'Created', ?, ?)",
            (agg_type, format!("{}-obs-dl-{i}", w.uid), payload),
        )
        .await?;
    }
    let topic = w.topic("Order");
    collect_records(
        &w.spec.bootstrap_servers,
        std::slice::from_ref(&dlq),
        2,
        RELAY_WAIT,
    )
    .await?;
    collect_records(
        &w.spec.bootstrap_servers,
        std::slice::from_ref(&topic),
        2,
        RELAY_WAIT,
    )
    .await?;

    let produced = format!("outbox_relay_records_produced_total{{topic=\"{topic}\"}}");
    let page = wait_until(
        "the metrics to count every row",
        RELAY_WAIT,
        POLL,
        async || {
            let (_, page) = http_get(port, "/metrics").await?;
            Ok((metric(&page, &produced) == Some(2.0)).then_some(page))
        },
    )
    .await?;
    let table = format!(
        "outbox_relay_outbox_rows_read_total{{table=\"{}\"}}",
        w.db.outbox_table()
    );
    for (series, want) in [
        (table.as_str(), Some(4.0)),
        (
            "outbox_relay_records_dead_lettered_total{kind=\"route\"}",
            Some(1.0),
        ),
        (
            "outbox_relay_records_dead_lettered_total{kind=\"producer\"}",
            Some(1.0),
        ),
        (
            "outbox_relay_records_dead_lettered_total{kind=\"decode\"}",
            None,
        ),
        ("outbox_relay_read_to_ack_seconds_count", Some(2.0)),
    ] {
        ensure!(
            metric(&page, series) == want,
            "{series}: expected {want:?}, got {:?}\n{page}",
            metric(&page, series)
        );
    }
    ensure!(
        !page.contains(&format!("topic=\"{dlq}\"")),
        "dead letters counted as produced records:\n{page}"
    );
    let status = relay.stop(STOP).await?;
    expect_exit_code(status, 0, &relay)?;
    Ok(())
}

/// Microseconds since the Unix epoch, now.
fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// `[audit] timings = true` (the latency budget's hook): each record's audit line says when the
/// relay read its row, handed it to the producer and got its acknowledgement, in that order and
/// between the test's commit and the test seeing the record on Kafka; the exactly-once relay
/// adds a line per committed Kafka transaction, after the acknowledgements it commits and
/// before a read_committed reader saw them.
#[tokio::test(flavor = "multi_thread")]
async fn audit_timings_give_each_record_its_stages() -> Result<()> {
    for exactly_once in [false, true] {
        let mut w = World::new(bin(), "obs_timings").await?;
        if exactly_once {
            w.spec.kafka_extra = format!(
                "delivery = \"exactly_once\"\nprogress_topic = \"t_{}.progress\"\n",
                w.uid
            );
        }
        let port = free_local_port()?;
        w.spec.http_listen = Some(format!("127.0.0.1:{port}"));
        let audit = std::env::temp_dir().join(format!("obs-timings-{}.jsonl", w.uid));
        let audit_path = audit.display().to_string();
        let relay = RelayProcess::spawn(
            std::path::Path::new(bin()),
            &w.spec.to_toml(),
            &[
                ("OUTBOX_RELAY__AUDIT__ACKS_FILE", &audit_path),
                ("OUTBOX_RELAY__AUDIT__TIMINGS", "true"),
            ],
        )?;
        wait_for_status(&relay, port, "/readyz", 200, STARTUP).await?;
        let mut conn = w.db.conn().await?;
        let mut gen = RowGen::new(&w.uid, "timings", 2);
        let rows = gen.rows(5);
        let before_commit = now_us();
        commit_rows(&mut conn, &rows).await?;
        let topic = w.topic("Order");
        let records = collect_records(
            &w.spec.bootstrap_servers,
            std::slice::from_ref(&topic),
            rows.len(),
            RELAY_WAIT,
        )
        .await?;
        let seen = now_us();
        ensure!(records.len() == rows.len(), "{} records", records.len());
        let lines = wait_until("the audit's lines", RELAY_WAIT, POLL, async || {
            let text = std::fs::read_to_string(&audit).unwrap_or_default();
            let lines: Vec<serde_json::Value> = text
                .lines()
                .map(serde_json::from_str)
                .collect::<Result<_, _>>()
                .context("an audit line is not JSON")?;
            let records = lines.iter().filter(|l| l["kind"] == "record").count();
            let commits = lines.iter().filter(|l| l["kind"] == "commit").count();
            Ok((records >= rows.len() && (!exactly_once || commits > 0)).then_some(lines))
        })
        .await?;
        let mut last_ack = 0;
        for row in &rows {
            let line = lines
                .iter()
                .find(|l| l["kind"] == "record" && l["event_key"] == row.event_key.as_str())
                .with_context(|| format!("no audit line for {}", row.event_key))?;
            let record = records
                .iter()
                .find(|r| r.header("event_key") == Some(row.event_key.as_str()))
                .with_context(|| format!("no record for {}", row.event_key))?;
            ensure!(
                line["offset"] == record.offset && line["partition"] == record.partition,
                "audit line {line} vs record at {}/{}",
                record.partition,
                record.offset
            );
            let t = |k: &str| {
                line[k]
                    .as_i64()
                    .with_context(|| format!("{k} missing: {line}"))
            };
            let (read, sent, acked) = (t("read_us")?, t("sent_us")?, t("acked_us")?);
            ensure!(
                before_commit <= read && read <= sent && sent <= acked && acked <= seen,
                "times out of order (commit from {before_commit}, seen by {seen}): {line}"
            );
            last_ack = last_ack.max(acked);
        }
        let commits: Vec<i64> = lines
            .iter()
            .filter(|l| l["kind"] == "commit")
            .filter_map(|l| l["committed_us"].as_i64())
            .collect();
        if exactly_once {
            ensure!(
                commits.iter().any(|&c| c >= last_ack && c <= seen),
                "no commit line between the last acknowledgement ({last_ack}) and the read \
                 ({seen}): {commits:?}"
            );
        } else {
            ensure!(
                commits.is_empty(),
                "commit lines without exactly-once: {commits:?}"
            );
        }
        let status = relay.stop(STOP).await?;
        ensure!(status.success(), "relay exited with {status}");
        std::fs::remove_file(&audit).ok();
    }
    Ok(())
}
