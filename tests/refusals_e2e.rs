//! Records the broker refuses for good, end to end (issue 13, "Nothing wedges the relay"):
//!
//! - the record timestamp: the transaction's commit time by default, so a `created_at` written
//!   in local time (UTC+8, read as UTC: 8 h in the future, which Kafka 4 refuses by default)
//!   does not matter; with `timestamp = "column"` such a value falls back to the commit time
//!   (header `timestamp_fallback`, a counter) or is a row error, per `timestamp_refused`;
//! - a record too large for its topic that only the broker can see (compressed batches) in the
//!   middle of a transaction: dead-lettered with the broker's error, or exit 1 naming the row,
//!   never a restart loop; the other rows of the transaction arrive;
//! - a topic that does not exist on a broker that creates none, and a topic the relay's SASL
//!   user is denied by an ACL (a private broker: `tests/services/kafka.sh` with
//!   `KAFKA_AUTO_CREATE=false`, `KAFKA_SASL_SCRAM=1`, `KAFKA_DENY_TOPIC_PREFIX`);
//! - `dlq replay` (issue 17): the dead letters of the missing topic replayed once, in order,
//!   after the topic was created;
//! - `dead_letter.refused_topic = "hold"` (issue 28): two tenants matched by a pattern, one
//!   whose topic is missing is held (the other flows, the checkpoint stays before the held
//!   rows, a kill -9 loses nothing, all arrive in order once the topic exists), one whose topic
//!   is refused only when written to (an ACL denying WRITE, not DESCRIBE) is held after one
//!   producer restart and retried with trial records that restart nothing, and
//!   `hold_max_records` pauses reading instead of holding more.
//!
//! Every test waits on observable state (records, dead letters, the relay's exit).

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, ensure, Context, Result};
use mysql_async::prelude::*;
use mysql_async::{Conn, TxOpts};
use outbox_relay_testkit::private::repo_root;
use outbox_relay_testkit::{
    collect_until, compare_positions, create_topic, current_binlog_position, describe_exit,
    ensure_at_least_once, free_local_port, high_watermark_total, insert_outbox_rows, list_topics,
    read_all_records, read_committed_records, recent_created_at_base, wait_until, BinlogPosition,
    Checkpoint, InsertStyle, OutboxRow, PrivateService, Record, RelayProcess, ServiceSpec,
};

/// The relay binary under test (built on first use).
fn bin() -> &'static str {
    outbox_relay_testkit::relay_bin()
}
const STARTUP: Duration = Duration::from_secs(60);
const RELAY_WAIT: Duration = Duration::from_secs(120);
const READ_ALL: Duration = Duration::from_secs(60);
const STOP: Duration = Duration::from_secs(30);
/// A relay that must stop on a refused row does so within this (one restart with a new
/// producer to find the row, then the stop): a restart loop would not.
const EXIT_BOUND: Duration = Duration::from_secs(120);
const HOUR_MS: i64 = 3_600_000;

outbox_relay_testkit::world_fixture!(
    /// One test's isolated world ([`World`], its database `e2e_<name>…`).
    Fixture,
    bin(),
    "e2e"
);

impl Fixture {
    /// Three rows: created now, in UTC+8 (see [`utc_plus_8_micros`]), and 1 ms after now.
    fn rows_around_a_utc_plus_8_row(&self) -> Vec<OutboxRow> {
        let now = recent_created_at_base();
        vec![
            self.row(0, now, "{\"n\":0}".into()),
            self.row(1, utc_plus_8_micros(), "{\"n\":1}".into()),
            self.row(2, now + 1000, "{\"n\":2}".into()),
        ]
    }

    /// Reads `topic` until every event key of `wanted` is there ([`until_keys`], up to
    /// [`RELAY_WAIT`]).
    async fn collect(&self, topic: &str, wanted: Vec<String>) -> Result<Vec<Record>> {
        collect_until(
            &self.spec.bootstrap_servers,
            &[topic.to_owned()],
            RELAY_WAIT,
            until_keys(wanted),
        )
        .await
    }

    async fn start_relay(&self) -> Result<RelayProcess> {
        Ok(self.start(STARTUP).await?.0)
    }

    fn row(&self, n: usize, created_at_micros: i64, payload: String) -> OutboxRow {
        OutboxRow {
            aggregate_type: "Ticket".into(),
            // One key: one partition, so the records' order is the rows' order.
            aggregate_id: "ticket-1".into(),
            event_type: "TicketSold".into(),
            event_key: format!("{}-{n}", self.uid),
            payload,
            created_at_micros,
        }
    }

    /// Commits `rows` in one transaction; returns the wall clock (ms) just before and after.
    async fn commit(&self, rows: &[OutboxRow]) -> Result<(i64, i64)> {
        let mut conn = self.db.conn().await?;
        let before = now_ms();
        let mut tx = conn.start_transaction(TxOpts::default()).await?;
        insert_outbox_rows(&mut tx, "outbox", rows, InsertStyle::SingleRow).await?;
        tx.commit().await?;
        Ok((before, now_ms()))
    }
}

/// A graceful stop that must exit 0.
async fn stop_with_exit_0(relay: &RelayProcess) -> Result<()> {
    let status = relay.stop(STOP).await?;
    ensure!(status.code() == Some(0), "{}", describe_exit(&status));
    Ok(())
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Local time of a service in UTC+8 written into a DATETIME read as UTC: 8 h in the future.
fn utc_plus_8_micros() -> i64 {
    (now_ms() + 8 * HOUR_MS) * 1000
}

fn keys(records: &[Record]) -> Vec<Option<&str>> {
    records.iter().map(|r| r.header("event_key")).collect()
}

fn until_keys(wanted: Vec<String>) -> impl FnMut(&[Record]) -> bool + Send + 'static {
    move |records: &[Record]| {
        wanted
            .iter()
            .all(|k| records.iter().any(|r| r.header("event_key") == Some(k)))
    }
}

/// The commit time lies within the commit's wall-clock window (MariaDB: whole seconds, so the
/// second the commit began in).
fn ensure_commit_time(r: &Record, (before, after): (i64, i64)) -> Result<()> {
    let ts = r.timestamp_ms.context("record without timestamp")?;
    ensure!(
        ts >= before - 1000 && ts <= after + 1000,
        "record {:?} stamped {ts}, expected the commit time within [{before}, {after}] ms",
        r.header("event_key")
    );
    Ok(())
}

async fn http_get(port: u16, path: &str) -> Result<String> {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || -> Result<String> {
        let mut conn = std::net::TcpStream::connect(("127.0.0.1", port))?;
        conn.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(conn, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
        let mut response = String::new();
        conn.read_to_string(&mut response)?;
        Ok(response)
    })
    .await?
}

/// (a) Default config: created_at 8 h ahead does not matter; the records carry the commit time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_are_stamped_with_the_commit_time_by_default() -> Result<()> {
    let mut f = Fixture::new("ts_commit").await?;
    f.spec.timestamp = None; // the relay's default
    let relay = f.start_relay().await?;
    let rows: Vec<OutboxRow> = (0..3)
        .map(|n| f.row(n, utc_plus_8_micros(), format!("{{\"n\":{n}}}")))
        .collect();
    let window = f.commit(&rows).await?;
    let topic = f.spec.topic_for("Ticket");
    let wanted: Vec<String> = rows.iter().map(|r| r.event_key.clone()).collect();
    let seen = f.collect(&topic, wanted).await?;
    ensure!(seen.len() == 3, "records: {:?}", keys(&seen));
    for r in &seen {
        ensure_commit_time(r, window)?;
        ensure!(r.header("timestamp_fallback").is_none(), "{r:?}");
    }
    relay.ensure_running()?;
    stop_with_exit_0(&relay).await?;
    f.drop_database().await
}

/// (a) `timestamp = "column"`: the topic (Kafka 4 defaults: at most 1 h ahead) would refuse the
/// UTC+8 row, which falls back to the commit time with header `timestamp_fallback` and the
/// counter; the valid rows of the same transaction keep their created_at.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_created_at_falls_back_to_the_commit_time() -> Result<()> {
    let mut f = Fixture::new("ts_fallback").await?;
    f.spec.timestamp = Some("column".into());
    let port = free_local_port()?;
    f.spec.http_listen = Some(format!("127.0.0.1:{port}"));
    let relay = f.start_relay().await?;
    let rows = f.rows_around_a_utc_plus_8_row();
    let window = f.commit(&rows).await?;
    let topic = f.spec.topic_for("Ticket");
    let wanted: Vec<String> = rows.iter().map(|r| r.event_key.clone()).collect();
    let seen = f.collect(&topic, wanted).await?;
    ensure!(
        keys(&seen)
            == rows
                .iter()
                .map(|r| Some(r.event_key.as_str()))
                .collect::<Vec<_>>(),
        "records: {:?}\n{}",
        keys(&seen),
        relay.stderr_tail()
    );
    ensure!(seen[0].timestamp_ms == Some(rows[0].expected_timestamp_ms()));
    ensure!(seen[2].timestamp_ms == Some(rows[2].expected_timestamp_ms()));
    ensure!(seen[0].header("timestamp_fallback").is_none());
    ensure_commit_time(&seen[1], window)?;
    let refused = rows[1].expected_timestamp_ms().to_string();
    ensure!(
        seen[1].header("timestamp_fallback") == Some(refused.as_str()),
        "headers of the fallen-back record: {:?}",
        seen[1].headers
    );
    let page = http_get(port, "/metrics").await?;
    ensure!(
        outbox_relay_testkit::metric(&page, "outbox_relay_timestamp_fallbacks_total") == Some(1.0),
        "no fallback counted:\n{page}"
    );
    ensure!(
        relay
            .stderr_text()
            .contains("message.timestamp.after.max.ms = 3600000"),
        "no warning naming the topic's limit\n{}",
        relay.stderr_tail()
    );
    stop_with_exit_0(&relay).await?;
    f.drop_database().await
}

/// (a) `timestamp_refused = "row_error"`: the UTC+8 row is dead-lettered, the valid rows of the
/// same transaction arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_created_at_is_a_row_error_when_configured() -> Result<()> {
    let mut f = Fixture::new("ts_rowerr").await?;
    f.spec.timestamp = Some("column".into());
    f.spec.outbox_extra = "timestamp_refused = \"row_error\"\n".into();
    let dlq = format!("t_{}.dlq", f.uid);
    f.spec.dead_letter_topic = Some(dlq.clone());
    let relay = f.start_relay().await?;
    let rows = f.rows_around_a_utc_plus_8_row();
    f.commit(&rows).await?;
    let topic = f.spec.topic_for("Ticket");
    let seen = f
        .collect(
            &topic,
            vec![rows[0].event_key.clone(), rows[2].event_key.clone()],
        )
        .await?;
    ensure!(
        keys(&seen)
            == [
                Some(rows[0].event_key.as_str()),
                Some(rows[2].event_key.as_str())
            ],
        "records: {:?}",
        keys(&seen)
    );
    let dead = f.collect(&dlq, vec![rows[1].event_key.clone()]).await?;
    let reason = dead[0].header("dlq_reason").unwrap_or_default();
    ensure!(
        reason.contains("8 h") && reason.contains("message.timestamp.after.max.ms"),
        "dlq_reason {reason:?}"
    );
    ensure!(dead[0].header("dlq_topic") == Some(topic.as_str()));
    // MySQL's binary JSON comes back as MySQL prints it ({"n": 1}): compare as JSON.
    let value: Option<serde_json::Value> = dead[0]
        .value_str()
        .and_then(|v| serde_json::from_str(v).ok());
    ensure!(
        value == Some(serde_json::json!({"n": 1})),
        "the dead letter's value is not the row's payload: {:?}",
        dead[0].value_str()
    );
    relay.ensure_running()?;
    stop_with_exit_0(&relay).await?;
    f.drop_database().await
}

/// A payload of `bytes` bytes that compresses badly.
fn noise(bytes: usize, seed: u64) -> String {
    let mut x = seed | 1;
    let mut out = String::from("{\"noise\":\"");
    while out.len() < bytes {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.push_str(&format!("{:016x}", x));
    }
    out.push_str("\"}");
    out
}

/// Rows 0..3 in one transaction, row 1 too large for the topic (limit 20000 bytes): with
/// compression the relay cannot know before sending, so the broker refuses the batch.
async fn too_large_in_a_transaction(
    name: &str,
    dead_letters: bool,
    exactly_once: bool,
) -> Result<()> {
    let mut f = Fixture::new(name).await?;
    if exactly_once {
        // The refused batch makes the Kafka transaction abortable: each step of finding the row
        // is an aborted transaction and a run from the last committed point.
        f.spec.kafka_extra = format!(
            "delivery = \"exactly_once\"\nprogress_topic = \"t_{}.progress\"\n",
            f.uid
        );
    }
    let topic = f.spec.topic_for("Ticket");
    create_topic(&f.spec.bootstrap_servers, &topic, 20_000).await?;
    f.spec
        .kafka_properties
        .push(("compression.type".into(), "lz4".into()));
    let dlq = format!("t_{}.dlq", f.uid);
    if dead_letters {
        f.spec.dead_letter_topic = Some(dlq.clone());
    }
    let relay = f.start_relay().await?;
    let now = recent_created_at_base();
    let rows = vec![
        f.row(0, now, "{\"n\":0}".into()),
        f.row(1, now, noise(100_000, 7)),
        f.row(2, now, "{\"n\":2}".into()),
    ];
    f.commit(&rows).await?;
    let table = format!("{}.outbox", f.db.name());
    if dead_letters {
        let seen = f
            .collect(
                &topic,
                vec![rows[0].event_key.clone(), rows[2].event_key.clone()],
            )
            .await?;
        // Exactly-once: as read_committed sees it, each once; at-least-once: first occurrences.
        let first: Vec<Option<&str>> = {
            let mut k = keys(&seen);
            if !exactly_once {
                k.dedup();
            }
            k
        };
        ensure!(
            first
                == [
                    Some(rows[0].event_key.as_str()),
                    Some(rows[2].event_key.as_str())
                ],
            "records: {:?}\n{}",
            keys(&seen),
            relay.stderr_tail()
        );
        let dead = f.collect(&dlq, vec![rows[1].event_key.clone()]).await?;
        let d = &dead[0];
        ensure!(
            d.header("dlq_broker_error")
                .is_some_and(|e| e.contains("MessageSizeTooLarge")),
            "dead letter headers: {:?}",
            d.headers
        );
        ensure!(
            d.header("dlq_table") == Some(table.as_str()),
            "{:?}",
            d.headers
        );
        ensure!(d.value.is_none(), "the too-large value is dropped");
        relay.ensure_running()?;
        stop_with_exit_0(&relay).await?;
    } else {
        let status = relay.wait_exit(EXIT_BOUND).await?;
        let err = relay.stderr_text();
        ensure!(
            status.code() == Some(1),
            "{}\n{}",
            describe_exit(&status),
            relay.stderr_tail()
        );
        for needle in [
            table.as_str(),
            topic.as_str(),
            "Message size too large",
            "Fix:",
        ] {
            ensure!(
                err.contains(needle),
                "stderr does not name {needle:?}:\n{}",
                relay.stderr_tail()
            );
        }
        ensure!(
            err.contains("-bin.") || err.contains("binlog."),
            "stderr names no binlog position:\n{}",
            relay.stderr_tail()
        );
        // Nothing after it arrived; the row before it did (at-least-once: acknowledged and
        // stored before the stop). Exactly-once: the refusal aborted the Kafka transaction that
        // held the row before it, and the stop commits nothing more: it arrives after the fix.
        let seen = if exactly_once {
            read_committed_records(
                &f.spec.bootstrap_servers,
                std::slice::from_ref(&topic),
                READ_ALL,
            )
            .await?
        } else {
            read_all_records(
                &f.spec.bootstrap_servers,
                std::slice::from_ref(&topic),
                READ_ALL,
            )
            .await?
        };
        ensure!(
            (exactly_once
                || seen
                    .iter()
                    .any(|r| r.header("event_key") == Some(rows[0].event_key.as_str())))
                && !seen
                    .iter()
                    .any(|r| r.header("event_key") != Some(rows[0].event_key.as_str())),
            "records: {:?}",
            keys(&seen)
        );
    }
    f.drop_database().await
}

/// (b) dead letters on: the too-large row is dead-lettered with the broker's error, its
/// transaction's other rows arrive, the relay keeps running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_the_broker_refuses_as_too_large_dead_letters_only_its_row() -> Result<()> {
    too_large_in_a_transaction("big_dlq", true, false).await
}

/// (b) in exactly-once mode, dead letters on: the same outcome, each record once for a
/// read_committed reader (the refused batch aborts transactions, never loops).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_a_refused_batch_dead_letters_only_its_row() -> Result<()> {
    too_large_in_a_transaction("big_eos_dlq", true, true).await
}

/// (b) in exactly-once mode, dead letters off: exit 1 naming the row, within the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_a_refused_batch_stops_the_relay_naming_the_row() -> Result<()> {
    too_large_in_a_transaction("big_eos_stop", false, true).await
}

/// (b) dead letters off: exit 1 naming the position, table, topic and the broker's error,
/// within a bound (no restart loop).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_the_broker_refuses_as_too_large_stops_the_relay_naming_the_row() -> Result<()> {
    too_large_in_a_transaction("big_stop", false, false).await
}

const SASL_USER: &str = "relay";
const SASL_PASSWORD: &str = "relay-secret";
/// Topics starting with this are denied to the SASL user on the private broker.
const DENIED_PREFIX: &str = "denied_";

/// A private broker that creates no topics and denies `relay` the `denied_*` topics:
/// (service, SASL bootstrap, PLAINTEXT bootstrap).
fn strict_kafka() -> Result<(Arc<PrivateService>, String, String)> {
    let plain: u16 = std::env::var("STRICT_KAFKA_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(9692);
    let spec = ServiceSpec {
        name: "strict-kafka".into(),
        script: "kafka.sh".into(),
        args: Vec::new(),
        env: vec![
            ("KAFKA_PORT".into(), plain.to_string()),
            ("KAFKA_CONTROLLER_PORT".into(), (plain + 1).to_string()),
            ("KAFKA_SASL_PORT".into(), (plain + 2).to_string()),
            ("KAFKA_SASL_SCRAM".into(), "1".into()),
            ("KAFKA_SASL_USER".into(), SASL_USER.into()),
            ("KAFKA_SASL_PASSWORD".into(), SASL_PASSWORD.into()),
            ("KAFKA_AUTO_CREATE".into(), "false".into()),
            ("KAFKA_DENY_TOPIC_PREFIX".into(), DENIED_PREFIX.into()),
            (
                "KAFKA_LIBS_DIR".into(),
                repo_root()
                    .join(".services")
                    .join("kafka-libs-4.1.1")
                    .display()
                    .to_string(),
            ),
        ],
    };
    let service = PrivateService::acquire(spec, |_| Ok(()))?;
    Ok((
        service,
        format!("127.0.0.1:{}", plain + 2),
        format!("127.0.0.1:{plain}"),
    ))
}

/// (c, d) On a broker that creates no topics, with an ACL denying the relay's user one topic:
/// rows for a missing topic and for the denied topic are dead-lettered (the broker's error in
/// `dlq_broker_error`), the other rows of the same transaction arrive; without dead letters the
/// relay stops with exit 1 naming the topic and the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_and_unauthorized_topics_are_row_errors() -> Result<()> {
    let (_kafka, sasl, plain) = strict_kafka()?;
    let mut f = Fixture::new("strict").await?;
    // Aggregate types pick the topic: t_<uid>.Ticket exists, t_<uid>.Ghost does not,
    // denied_<uid>.Ticket is denied.
    f.spec.topic = "{aggregate_type}".into();
    f.spec.bootstrap_servers = sasl.clone();
    f.spec.kafka_properties.extend([
        ("security.protocol".into(), "SASL_PLAINTEXT".into()),
        ("sasl.mechanisms".into(), "SCRAM-SHA-512".into()),
        ("sasl.username".into(), SASL_USER.into()),
        ("sasl.password".into(), SASL_PASSWORD.into()),
    ]);
    let ok_topic = format!("t_{}.Ticket", f.uid);
    let missing_topic = format!("t_{}.Ghost", f.uid);
    let denied_topic = format!("{DENIED_PREFIX}{}.Ticket", f.uid);
    let dlq = format!("t_{}.dlq", f.uid);
    for t in [&ok_topic, &denied_topic, &dlq] {
        create_topic(&plain, t, 1_048_588).await?;
    }
    f.spec.dead_letter_topic = Some(dlq.clone());
    let relay = f.start_relay().await?;
    let now = recent_created_at_base();
    let uid = f.uid.clone();
    let row = |n: usize, topic: &str| OutboxRow {
        aggregate_type: topic.to_owned(),
        aggregate_id: "ticket-1".into(),
        event_type: "TicketSold".into(),
        event_key: format!("{uid}-{n}"),
        payload: format!("{{\"n\":{n}}}"),
        created_at_micros: now,
    };
    let rows = vec![
        row(0, &ok_topic),
        row(1, &missing_topic),
        row(2, &ok_topic),
        row(3, &denied_topic),
        row(4, &ok_topic),
    ];
    f.commit(&rows).await?;
    let seen = collect_until(
        &plain,
        std::slice::from_ref(&ok_topic),
        RELAY_WAIT,
        until_keys(
            [0, 2, 4]
                .iter()
                .map(|i| rows[*i].event_key.clone())
                .collect(),
        ),
    )
    .await?;
    ensure!(
        seen.len() == 3,
        "records: {:?}\n{}",
        keys(&seen),
        relay.stderr_tail()
    );
    let dead = collect_until(
        &plain,
        std::slice::from_ref(&dlq),
        RELAY_WAIT,
        until_keys(vec![rows[1].event_key.clone(), rows[3].event_key.clone()]),
    )
    .await?;
    let by_key = |k: &str| -> Result<&Record> {
        dead.iter()
            .find(|d| d.header("event_key") == Some(k))
            .ok_or_else(|| anyhow!("no dead letter for {k}"))
    };
    let missing = by_key(&rows[1].event_key)?;
    let reason = missing.header("dlq_reason").unwrap_or_default();
    ensure!(
        reason.contains(&missing_topic) && reason.contains("auto.create.topics.enable=false"),
        "dlq_reason of the missing topic: {reason:?}"
    );
    let denied = by_key(&rows[3].event_key)?;
    let reason = denied.header("dlq_reason").unwrap_or_default();
    ensure!(
        reason.contains(&denied_topic) && reason.contains("TopicAuthorizationFailed"),
        "dlq_reason of the denied topic: {reason:?}"
    );
    relay.ensure_running()?;
    stop_with_exit_0(&relay).await?;

    // Without dead letters: the next denied row stops the relay, naming the topic.
    f.spec.dead_letter_topic = None;
    let relay = f.start_relay().await?;
    let more = vec![row(5, &ok_topic), row(6, &denied_topic)];
    f.commit(&more).await?;
    let status = relay.wait_exit(EXIT_BOUND).await?;
    ensure!(
        status.code() == Some(1),
        "{}\n{}",
        describe_exit(&status),
        relay.stderr_tail()
    );
    let err = relay.stderr_text();
    for needle in [
        denied_topic.as_str(),
        "TopicAuthorizationFailed",
        "grant it WRITE",
    ] {
        ensure!(
            err.contains(needle),
            "stderr does not name {needle:?}:\n{}",
            relay.stderr_tail()
        );
    }
    f.drop_database().await
}

/// Runs `outbox-relay dlq replay --config <spec> args…`: (exit code, stdout, stderr).
async fn dlq_replay(
    spec: &outbox_relay_testkit::RelayConfigSpec,
    args: &[&str],
) -> Result<(Option<i32>, String, String)> {
    let mut all = vec!["dlq", "replay"];
    all.extend_from_slice(args);
    all.push("--config");
    let p = RelayProcess::spawn_args(bin(), &all, &spec.to_toml(), &[])?;
    let status = p.wait_exit(RELAY_WAIT).await?;
    Ok((status.code(), p.stdout_text(), p.stderr_text()))
}

/// `dlq replay` after the fix (issue 17). Rows for a topic that did not exist were
/// dead-lettered; once the topic exists: a dry run lists them and sends nothing; a run stopped
/// by --max-records and a second run replay each once, in the rows' order per key, with the
/// row's key, value and headers (no `dlq_*`) plus `dlq_replayed_from`; a third run finds
/// nothing new. A dead letter whose row had no valid topic is listed as SKIP (exit 3) and not
/// sent. A filter (--event-key) makes its own group: it sees the dead letters again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_replayed_once_in_order_after_the_fix() -> Result<()> {
    let (_kafka, _sasl, plain) = strict_kafka()?;
    let mut f = Fixture::new("dlq_replay").await?;
    f.spec.topic = "{aggregate_type}".into();
    f.spec.bootstrap_servers = plain.clone();
    let ok_topic = format!("t_{}.Ticket", f.uid);
    let ghost = format!("t_{}.Ghost", f.uid);
    let dlq = format!("t_{}.dlq", f.uid);
    for t in [&ok_topic, &dlq] {
        create_topic(&plain, t, 1_048_588).await?;
    }
    f.spec.dead_letter_topic = Some(dlq.clone());
    let relay = f.start_relay().await?;
    let now = recent_created_at_base();
    let uid = f.uid.clone();
    let row = |n: usize, topic: &str, id: &str| OutboxRow {
        aggregate_type: topic.to_owned(),
        aggregate_id: id.to_owned(),
        event_type: "TicketSold".into(),
        event_key: format!("{uid}-{n}"),
        payload: format!("{{\"n\":{n}}}"),
        created_at_micros: now,
    };
    // Rows 1-6 go to the missing topic, over two aggregates; row 8 has no valid topic.
    let mut rows = vec![row(0, &ok_topic, "t-1")];
    for n in 1..=6 {
        rows.push(row(n, &ghost, if n % 2 == 0 { "g-a" } else { "g-b" }));
    }
    rows.push(row(7, &ok_topic, "t-1"));
    rows.push(row(8, "bad topic!", "x-1"));
    f.commit(&rows).await?;
    let ghost_keys: Vec<String> = rows[1..=6].iter().map(|r| r.event_key.clone()).collect();
    let mut dead_keys = ghost_keys.clone();
    dead_keys.push(rows[8].event_key.clone());
    let dead = f.collect(&dlq, dead_keys).await?;
    ensure!(
        dead.len() == 7,
        "dead letters: {:?}\n{}",
        keys(&dead),
        relay.stderr_tail()
    );
    stop_with_exit_0(&relay).await?;

    // The fix: the topic exists now.
    create_topic(&plain, &ghost, 1_048_588).await?;
    let (code, out, err) = dlq_replay(&f.spec, &["--dry-run"]).await?;
    eprintln!("--- dlq replay --dry-run ---\n{out}");
    ensure!(code == Some(3), "dry run: exit {code:?}\n{out}\n{err}");
    for k in &ghost_keys {
        ensure!(
            out.contains(&format!("-> {ghost} event_key={k}")),
            "the dry run does not list {k}:\n{out}"
        );
    }
    ensure!(
        out.contains(&format!("SKIP   {dlq}/0/"))
            && out.contains(&rows[8].event_key)
            && out.contains("would replay 6 of 7 dead letters")
            && out.contains("1 cannot be replayed"),
        "dry run output:\n{out}"
    );
    ensure!(
        high_watermark_total(&plain, std::slice::from_ref(&ghost)).await? == 0,
        "the dry run sent records"
    );

    // Two runs: 2 records, then the rest; a third run: nothing new.
    // Without --yes: the same list, exit 4, nothing sent and no offset committed (the runs
    // below still find all six).
    let (code, out, err) = dlq_replay(&f.spec, &[]).await?;
    ensure!(code == Some(4), "plan: exit {code:?}\n{out}\n{err}");
    ensure!(
        out.contains("would replay 6 of 7 dead letters")
            && out.contains("not confirmed: nothing changed; run again with --yes to replay them"),
        "plan output:\n{out}"
    );
    ensure!(
        high_watermark_total(&plain, std::slice::from_ref(&ghost)).await? == 0,
        "the plan sent records"
    );

    let (code, out, err) =
        dlq_replay(&f.spec, &["--yes", "--max-records", "2", "--batch", "1"]).await?;
    ensure!(code == Some(0), "first run: exit {code:?}\n{out}\n{err}");
    ensure!(
        out.contains("replayed 2 of 2 dead letters") && out.contains("run again"),
        "first run output:\n{out}"
    );
    let (code, out, err) = dlq_replay(&f.spec, &["--yes"]).await?;
    eprintln!("--- dlq replay ---\n{out}");
    ensure!(code == Some(3), "second run: exit {code:?}\n{out}\n{err}");
    ensure!(
        out.contains("replayed 4 of 5 dead letters"),
        "second run output:\n{out}"
    );
    let (code, out, err) = dlq_replay(&f.spec, &["--yes"]).await?;
    ensure!(code == Some(0), "third run: exit {code:?}\n{out}\n{err}");
    ensure!(
        out.contains("replayed 0 of 0 dead letters"),
        "third run output:\n{out}"
    );

    let replayed = read_committed_records(&plain, std::slice::from_ref(&ghost), READ_ALL).await?;
    let expected: std::collections::HashSet<String> = ghost_keys.iter().cloned().collect();
    outbox_relay_testkit::ensure_exactly_once(&replayed, &expected)?;
    let order: std::collections::HashMap<String, usize> = ghost_keys
        .iter()
        .enumerate()
        .map(|(i, k)| (k.clone(), i))
        .collect();
    outbox_relay_testkit::ensure_per_key_order(&replayed, &order)?;
    for r in &replayed {
        let k = r.header("event_key").unwrap_or_default();
        let original = rows
            .iter()
            .find(|row| row.event_key == k)
            .context("a replayed record of no row")?;
        ensure!(
            r.key_str() == Some(original.aggregate_id.as_str())
                && r.header("aggregate_type") == Some(ghost.as_str())
                && r.headers
                    .iter()
                    .all(|(h, _)| !h.starts_with("dlq_") || h == "dlq_replayed_from")
                && r.header("dlq_replayed_from")
                    .is_some_and(|v| v.starts_with(&format!("{dlq}/0/"))),
            "replayed record {k}: key {:?}, headers {:?}",
            r.key_str(),
            r.headers
        );
        let value: serde_json::Value =
            serde_json::from_slice(r.value.as_deref().unwrap_or_default())?;
        let payload: serde_json::Value = serde_json::from_str(&original.payload)?;
        ensure!(
            value == payload,
            "replayed value {value} for payload {payload}"
        );
    }

    // Another selection has its own group: it reads the dead letters again (dry run).
    let (code, out, err) =
        dlq_replay(&f.spec, &["--dry-run", "--event-key", &ghost_keys[2]]).await?;
    ensure!(
        code == Some(0),
        "filtered dry run: exit {code:?}\n{out}\n{err}"
    );
    ensure!(
        out.contains("would replay 1 of 7 dead letters") && out.contains("6 left out"),
        "filtered dry run output:\n{out}"
    );
    Ok(())
}

/// The outbox table's DDL (`migrations/0001_outbox.sql`'s statement) for a table named `name`.
fn outbox_ddl(name: &str) -> Result<String> {
    let path = outbox_relay_testkit::db::migrations_dir().join("0001_outbox.sql");
    let sql = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
    Ok(sql.replace(
        "CREATE TABLE IF NOT EXISTS outbox (",
        &format!("CREATE TABLE IF NOT EXISTS `{name}` ("),
    ))
}

impl Fixture {
    /// A connection to `schema` of the world's server.
    async fn conn_to(&self, schema: &str) -> Result<Conn> {
        let url = self.db.url();
        let (server, _) = url.rsplit_once('/').context("the URL has a database")?;
        Ok(Conn::from_url(format!("{server}/{schema}")).await?)
    }

    /// Creates tenant schema `<db><suffix>` with an `outbox` table; returns its name.
    async fn create_tenant(&self, suffix: &str) -> Result<String> {
        let schema = format!("{}{suffix}", self.db.name());
        let mut conn = self.db.conn().await?;
        conn.query_drop(format!(
            "CREATE DATABASE IF NOT EXISTS `{schema}` DEFAULT CHARACTER SET utf8mb4"
        ))
        .await?;
        drop(conn);
        let mut conn = self.conn_to(&schema).await?;
        conn.query_drop(outbox_ddl("outbox")?).await?;
        conn.disconnect().await?;
        Ok(schema)
    }

    /// Commits `rows` into `schema.outbox`, one transaction.
    async fn commit_into(&self, schema: &str, rows: &[OutboxRow]) -> Result<()> {
        let mut conn = self.conn_to(schema).await?;
        let mut tx = conn.start_transaction(TxOpts::default()).await?;
        insert_outbox_rows(&mut tx, "outbox", rows, InsertStyle::MultiRow).await?;
        tx.commit().await?;
        conn.disconnect().await?;
        Ok(())
    }

    /// The end of the server's binlog now.
    async fn binlog_end(&self) -> Result<BinlogPosition> {
        let mut conn = self.db.conn().await?;
        current_binlog_position(&mut conn).await
    }

    /// Fails unless the stored checkpoint is before `limit` (the binlog's end read right after
    /// the first held transaction's commit: at or past its end, the checkpoint would have passed
    /// the held rows); returns it.
    async fn ensure_checkpoint_before(&self, limit: &BinlogPosition) -> Result<Checkpoint> {
        let cp = self.checkpoint().await?;
        let mut conn = self.db.conn().await?;
        let order = compare_positions(&mut conn, &cp.position(), limit).await?;
        ensure!(
            order.is_lt(),
            "the checkpoint {}:{} (+{} rows) passed the first held transaction, which ends by {limit}",
            cp.binlog_file,
            cp.binlog_pos,
            cp.rows_acked
        );
        Ok(cp)
    }
}

/// Two tenant schemas `<db>_t1`, `<db>_t2` with an outbox each, matched by one pattern, on a
/// world whose topic template is `<prefix>{schema}.{aggregate_type}` and which holds tables
/// whose topic is refused (`dead_letter.refused_topic = "hold"` plus `dead_letter_extra`).
struct Tenants {
    f: Fixture,
    t1: String,
    t2: String,
    /// Tenant 1's topic (`…t1.Order`).
    topic1: String,
    /// Tenant 2's topic (`…t2.Order`).
    topic2: String,
    /// A recent `created_at`.
    now: i64,
}

impl Tenants {
    /// Creates the schemas; the relay of `f` reaches Kafka at `bootstrap`.
    async fn new(name: &str, bootstrap: &str, dead_letter_extra: &str) -> Result<Self> {
        let mut f = Fixture::new(name).await?;
        let t1 = f.create_tenant("_t1").await?;
        let t2 = f.create_tenant("_t2").await?;
        f.spec.tables = vec![format!("{}_t*.outbox", f.db.name())];
        f.spec.topic = format!("{}{{schema}}.{{aggregate_type}}", f.topic_prefix());
        f.spec.bootstrap_servers = bootstrap.to_owned();
        f.spec.dead_letter_extra = format!("refused_topic = \"hold\"\n{dead_letter_extra}");
        let topic1 = format!("{}{t1}.Order", f.topic_prefix());
        let topic2 = format!("{}{t2}.Order", f.topic_prefix());
        Ok(Self {
            f,
            t1,
            t2,
            topic1,
            topic2,
            now: recent_created_at_base(),
        })
    }

    /// Row `n` of `tenant` (`a`: tenant 1, `b`: tenant 2). One key per tenant: one partition,
    /// so the log's order is the rows' order.
    fn row(&self, tenant: &str, n: usize) -> OutboxRow {
        OutboxRow {
            aggregate_type: "Order".into(),
            aggregate_id: format!("order-{tenant}"),
            event_type: "OrderPlaced".into(),
            event_key: format!("{}-{tenant}-{n}", self.f.uid),
            payload: format!("{{\"n\":{n}}}"),
            created_at_micros: self.now + i64::try_from(n).unwrap_or(0),
        }
    }

    /// Rows `range` of `tenant`.
    fn rows(&self, tenant: &str, range: std::ops::Range<usize>) -> Vec<OutboxRow> {
        range.map(|n| self.row(tenant, n)).collect()
    }

    /// Commits tenant 1's `a[0..2]`, tenant 2's `b[0..3]` (the first held transaction), then
    /// `a[2..4]`, `b[3..5]`, `a[4..5]`, each in a transaction of its own; returns the binlog's
    /// end before and after the first held transaction.
    async fn commit_interleaved(
        &self,
        a: &[OutboxRow],
        b: &[OutboxRow],
    ) -> Result<(BinlogPosition, BinlogPosition)> {
        let (t1, t2) = (&self.t1, &self.t2);
        self.f.commit_into(t1, &a[0..2]).await?;
        let hold_start = self.f.binlog_end().await?;
        self.f.commit_into(t2, &b[0..3]).await?;
        let held_end = self.f.binlog_end().await?;
        self.f.commit_into(t1, &a[2..4]).await?;
        self.f.commit_into(t2, &b[3..5]).await?;
        self.f.commit_into(t1, &a[4..5]).await?;
        Ok((hold_start, held_end))
    }

    /// Waits until the stored checkpoint is at or after `start` (everything before the held
    /// transaction is acknowledged) and fails if it is ever at or after `end` (the binlog's end
    /// read right after the held transaction's commit). Other tests write to this server too:
    /// their transactions may come between, so the checkpoint is bounded, not pinned.
    async fn wait_checkpoint_held(
        &self,
        relay: &RelayProcess,
        start: &BinlogPosition,
        end: &BinlogPosition,
    ) -> Result<Checkpoint> {
        let mut conn = self.f.db.conn().await?;
        let cp = wait_until(
            "the checkpoint at the start of the held transaction",
            RELAY_WAIT,
            Duration::from_millis(100),
            async || {
                relay.ensure_running()?;
                let cp = self.f.checkpoint().await?;
                let reached = compare_positions(&mut conn, &cp.position(), start).await?;
                let before = compare_positions(&mut conn, &cp.position(), end).await?;
                ensure!(
                    before.is_lt(),
                    "the checkpoint {} passed the held transaction (ends by {end})",
                    cp.position()
                );
                Ok(reached.is_ge().then_some(cp))
            },
        )
        .await
        .map_err(|e| anyhow!("{e:#}\n{}", relay.stderr_tail()))?;
        // Back to the pool, which the database's drop closes.
        drop(conn);
        ensure!(cp.rows_acked == 0, "checkpoint {cp:?}");
        Ok(cp)
    }

    /// Drops both schemas and the world's database.
    async fn drop_all(self) -> Result<()> {
        let mut conn = self.f.db.conn().await?;
        for s in [&self.t1, &self.t2] {
            conn.query_drop(format!("DROP DATABASE IF EXISTS `{s}`"))
                .await?;
        }
        drop(conn);
        self.f.drop_database().await
    }
}

/// The event keys of `rows`, in order.
fn keys_of(rows: &[OutboxRow]) -> Vec<String> {
    rows.iter().map(|r| r.event_key.clone()).collect()
}

/// The event keys of `records` in their order in the log.
fn key_order(records: &[Record]) -> Vec<String> {
    let mut sorted: Vec<&Record> = records.iter().collect();
    sorted.sort_by_key(|r| (r.partition, r.offset));
    sorted
        .iter()
        .filter_map(|r| r.header("event_key").map(str::to_owned))
        .collect()
}

/// Issue 28, tenant isolation with `dead_letter.refused_topic = "hold"`: two tenants matched by
/// a pattern, on a broker that creates no topics; tenant 2's topic is missing. Tenant 1's rows
/// arrive while tenant 2's are held and the checkpoint stays at the start of tenant 2's first
/// transaction; a kill -9 during the hold loses nothing (tenant 1's records after the hold's
/// start may be sent again: at least once); once the topic is created, every held row arrives,
/// once, in order, and the checkpoint passes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_tenant_topic_holds_only_that_tenants_table() -> Result<()> {
    let (_kafka, _sasl, plain) = strict_kafka()?;
    let w = Tenants::new("hold", &plain, "").await?;
    let (f, t1, t2, topic1, topic2) = (&w.f, &w.t1, &w.t2, &w.topic1, &w.topic2);
    create_topic(&plain, topic1, 1_048_588).await?;
    let relay = f.start_relay().await?;
    let a = w.rows("a", 0..8);
    let b = w.rows("b", 0..6);
    let (hold_start, held_end) = w.commit_interleaved(&a, &b).await?;
    // Tenant 1 flows while tenant 2 is held.
    let seen = f.collect(topic1, keys_of(&a[0..5])).await?;
    ensure!(
        key_order(&seen) == keys_of(&a[0..5]),
        "tenant 1's records: {:?}\n{}",
        key_order(&seen),
        relay.stderr_tail()
    );
    // The checkpoint reaches the start of tenant 2's first transaction and goes no further
    // while it is held.
    w.wait_checkpoint_held(&relay, &hold_start, &held_end)
        .await?;
    // A checkpoint interval or two later, still there.
    tokio::time::sleep(Duration::from_millis(3 * f.spec.checkpoint_interval_ms)).await;
    f.ensure_checkpoint_before(&held_end).await?;
    let err = relay.stderr_text();
    ensure!(
        err.matches("the brokers refuse this table's topic").count() == 1
            && err.contains(topic2.as_str())
            && err.contains("auto.create.topics.enable=false"),
        "one warning naming the held table's topic and the error:\n{}",
        relay.stderr_tail()
    );
    ensure!(
        !list_topics(&plain, topic2).await?.contains(topic2),
        "topic {topic2} appeared"
    );

    // kill -9 during the hold: nothing held is lost.
    relay.kill9()?;
    let relay = f.start_relay().await?;
    f.commit_into(t2, &b[5..6]).await?;
    f.commit_into(t1, &a[5..8]).await?;
    // Read right after the test's last commit: later, the binlog may end with the relay's own
    // checkpoint write, which no checkpoint covers.
    let end = f.binlog_end().await?;
    let seen = f.collect(topic1, keys_of(&a)).await?;
    ensure_at_least_once(&seen, &keys_of(&a).into_iter().collect())?;
    f.ensure_checkpoint_before(&held_end).await?;

    // The topic appears: the held rows arrive in order, once each, and the checkpoint moves on.
    create_topic(&plain, topic2, 1_048_588).await?;
    let held = f.collect(topic2, keys_of(&b)).await?;
    ensure!(
        key_order(&held) == keys_of(&b),
        "tenant 2's records, in order and once each: {:?}\n{}",
        key_order(&held),
        relay.stderr_tail()
    );
    f.wait_checkpoint_covers(&relay, &end, RELAY_WAIT).await?;
    let err = relay.stderr_text();
    ensure!(err.contains("hold ended"), "{}", relay.stderr_tail());
    stop_with_exit_0(&relay).await?;
    w.drop_all().await
}

/// Issue 28, a tenant's topic refused only when written to: the relay's principal may describe
/// topic 2 but not write to it (an ACL added while the broker runs), so the refusal comes in
/// the produce response, which stops the idempotent producer. The relay restarts once with a
/// new producer that holds tenant 2's table from its first record; tenant 1 flows; the held
/// table is retried with a trial record sent by a producer of its own, so the retries restart
/// nothing (the count of interrupted runs stays put while `outbox_relay_hold_retries_total`
/// grows); the checkpoint stays before the held rows. Once the ACL is lifted, every held row
/// arrives once, in order, and the checkpoint passes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_refused_only_when_written_holds_its_table_without_restarts() -> Result<()> {
    let (kafka, sasl, plain) = strict_kafka()?;
    let mut w = Tenants::new("hold_write", &sasl, "").await?;
    w.f.spec.kafka_properties.extend([
        ("security.protocol".into(), "SASL_PLAINTEXT".into()),
        ("sasl.mechanisms".into(), "SCRAM-SHA-512".into()),
        ("sasl.username".into(), SASL_USER.into()),
        ("sasl.password".into(), SASL_PASSWORD.into()),
    ]);
    let port = free_local_port()?;
    w.f.spec.http_listen = Some(format!("127.0.0.1:{port}"));
    let (f, topic1, topic2) = (&w.f, &w.topic1, &w.topic2);
    create_topic(&plain, topic1, 1_048_588).await?;
    create_topic(&plain, topic2, 1_048_588).await?;
    let principal = format!("User:{SASL_USER}");
    let acl = |change: &str, permission: &str, operation: &str| -> Result<()> {
        kafka.run(
            "acl",
            &[
                change,
                "--force",
                permission,
                principal.as_str(),
                "--operation",
                operation,
                "--topic",
                topic2.as_str(),
            ],
        )
    };
    acl("--add", "--allow-principal", "Describe")?;
    acl("--add", "--deny-principal", "Write")?;
    let relay = f.start_relay().await?;
    let a = w.rows("a", 0..5);
    let b = w.rows("b", 0..5);
    let (hold_start, held_end) = w.commit_interleaved(&a, &b).await?;
    // Read right after the test's last commit: later, the binlog may end with the relay's own
    // checkpoint write, which no checkpoint covers.
    let end = f.binlog_end().await?;
    // Tenant 1 flows (sent again after the one restart, maybe: at least once).
    let seen = collect_until(
        &plain,
        std::slice::from_ref(topic1),
        RELAY_WAIT,
        until_keys(keys_of(&a)),
    )
    .await?;
    ensure_at_least_once(&seen, &keys_of(&a).into_iter().collect())?;
    w.wait_checkpoint_held(&relay, &hold_start, &held_end)
        .await?;
    // Held after one restart; three retries later, no other restart.
    let restarts = |text: &str| text.matches("run interrupted").count();
    let err = relay.stderr_text();
    ensure!(
        err.contains("restarting with a new producer, which holds the tables")
            && err.matches("the brokers refuse this table's topic").count() == 1
            && err.contains("TopicAuthorizationFailed"),
        "one restart, then one hold naming the broker's error:\n{}",
        relay.stderr_tail()
    );
    let before = restarts(&err);
    let retries = || async {
        let (_, body) = outbox_relay_testkit::http_get(port, "/metrics").await?;
        let n = body
            .lines()
            .find(|l| l.starts_with("outbox_relay_hold_retries_total"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
        anyhow::Ok(n)
    };
    let first = retries().await?;
    wait_until(
        "three more retries of the held table",
        RELAY_WAIT,
        Duration::from_millis(200),
        async || {
            relay.ensure_running()?;
            Ok((retries().await? >= first + 3.0).then_some(()))
        },
    )
    .await?;
    ensure!(
        restarts(&relay.stderr_text()) == before,
        "a retry restarted the producer:\n{}",
        relay.stderr_tail()
    );
    f.ensure_checkpoint_before(&held_end).await?;
    let early = read_all_records(&plain, std::slice::from_ref(topic2), READ_ALL).await?;
    ensure!(
        early.is_empty(),
        "held records reached the denied topic: {:?}",
        key_order(&early)
    );

    // The fix the error names: the deny is lifted and WRITE granted (with an ACL on the topic,
    // allow.everyone.if.no.acl.found no longer applies to it). The held rows arrive in order,
    // once each; the checkpoint moves on.
    acl("--remove", "--deny-principal", "Write")?;
    acl("--add", "--allow-principal", "Write")?;
    let held = collect_until(
        &plain,
        std::slice::from_ref(topic2),
        RELAY_WAIT,
        until_keys(keys_of(&b)),
    )
    .await?;
    ensure!(
        key_order(&held) == keys_of(&b),
        "tenant 2's records, in order and once each: {:?}\n{}",
        key_order(&held),
        relay.stderr_tail()
    );
    f.wait_checkpoint_covers(&relay, &end, RELAY_WAIT).await?;
    let err = relay.stderr_text();
    ensure!(
        err.contains("hold ended") && restarts(&err) == before,
        "{}",
        relay.stderr_tail()
    );
    stop_with_exit_0(&relay).await?;
    w.drop_all().await
}

/// `dead_letter.hold_max_records`: at the bound the relay stops reading the binlog instead of
/// holding more or dropping anything. Three held rows (one rows event: the bound of 2 is
/// checked before each event) pause reading, so the other tenant's later row is not produced
/// either; `/readyz` says why and `/metrics` counts the held records. Once the topic exists,
/// the held rows arrive in order, then the other tenant's row, and the checkpoint passes both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_records_beyond_the_bound_pause_reading_and_lose_nothing() -> Result<()> {
    let (_kafka, _sasl, plain) = strict_kafka()?;
    let mut w = Tenants::new("hold_bound", &plain, "hold_max_records = 2\n").await?;
    w.f.spec.heartbeat_interval_ms = Some(500);
    let port = free_local_port()?;
    w.f.spec.http_listen = Some(format!("127.0.0.1:{port}"));
    w.f.spec.http_extra = "ready_stall_ms = 1500\n".into();
    let (f, t1, t2, topic1, topic2) = (&w.f, &w.t1, &w.t2, &w.topic1, &w.topic2);
    create_topic(&plain, topic1, 1_048_588).await?;
    let relay = f.start_relay().await?;
    let b = w.rows("b", 0..3);
    let a = w.rows("a", 0..1);
    f.commit_into(t2, &b).await?;
    f.commit_into(t1, &a).await?;
    // Read right after the test's last commit: later, the binlog may end with the relay's own
    // checkpoint write, which no checkpoint covers.
    let end = f.binlog_end().await?;
    // Reading paused at the bound: not ready, saying why (not the 503 of the start-up, which
    // may still answer "connecting" right after the first checkpoint row).
    let mut last = String::new();
    let body = outbox_relay_testkit::wait_until(
        "/readyz to say reading waits for held tables",
        RELAY_WAIT,
        Duration::from_millis(100),
        async || {
            relay.ensure_running()?;
            let (status, body) = outbox_relay_testkit::http_get(port, "/readyz").await?;
            let paused = status == 503 && body.contains("held tables");
            last = format!("{status} {body}");
            Ok(paused.then_some(body))
        },
    )
    .await
    .with_context(|| format!("last /readyz: {last}"))?;
    ensure!(body.contains(topic2.as_str()), "/readyz: {body}");
    let (_, metrics) = outbox_relay_testkit::http_get(port, "/metrics").await?;
    let held_line = metrics
        .lines()
        .find(|l| l.starts_with("outbox_relay_held_records{") && l.contains(t2.as_str()))
        .unwrap_or_default();
    ensure!(held_line.ends_with(" 3"), "held records: {held_line:?}");
    // The other tenant's row after the held ones was not read, so not produced.
    let early = read_all_records(&plain, std::slice::from_ref(topic1), READ_ALL).await?;
    ensure!(
        early.is_empty(),
        "tenant 1 produced while reading was paused: {:?}",
        key_order(&early)
    );
    create_topic(&plain, topic2, 1_048_588).await?;
    let held = f.collect(topic2, keys_of(&b)).await?;
    ensure!(
        key_order(&held) == keys_of(&b),
        "held records: {:?}",
        key_order(&held)
    );
    let seen = f.collect(topic1, keys_of(&a)).await?;
    ensure!(seen.len() == 1, "{:?}", key_order(&seen));
    f.wait_checkpoint_covers(&relay, &end, RELAY_WAIT).await?;
    stop_with_exit_0(&relay).await?;
    w.drop_all().await
}
