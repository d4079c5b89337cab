//! Cutover from a polling relay (docs/src/migrate/polling.md), end to end: a real
//! polling relay (in this test: `SELECT … FOR UPDATE SKIP LOCKED`, mark `SENDING`, produce, wait
//! for the ack, mark `SENT`) relays an outbox table with a `status` column while a writer keeps
//! inserting; it stops with rows `SENT`, rows `SENDING` it had produced (the "still sending"
//! case), rows `SENDING` it had not produced, and `NEW` rows. Then the documented procedure:
//! `reset --to` a time before the oldest row not `SENT`, `run` with `[cutover]`, the writer still
//! inserting across the switch. Checked: every row reaches Kafka, the only rows on Kafka twice
//! are the `SENDING` rows the polling relay had produced, and outbox-relay re-sent no `SENT` row.
//! Once per delivery mode.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use outbox_relay_testkit::mysql_async::prelude::*;
use outbox_relay_testkit::mysql_async::{self, Conn};
use outbox_relay_testkit::rdkafka::config::ClientConfig;
use outbox_relay_testkit::rdkafka::message::{Header, OwnedHeaders};
use outbox_relay_testkit::rdkafka::producer::{FutureProducer, FutureRecord};
use outbox_relay_testkit::{
    create_topic, current_binlog_position, describe_exit, read_all_records, read_committed_records,
    wait_for_stderr, wait_until, Record, RelayProcess, World,
};
use tokio::task::JoinHandle;

/// The relay binary under test (built on first use).
fn bin() -> &'static str {
    outbox_relay_testkit::relay_bin()
}

/// Longest wait for the relay to catch up, and for Kafka reads.
const RELAY_WAIT: Duration = Duration::from_secs(180);

/// Aggregate types the writer uses (one topic each).
const TYPES: [&str; 2] = ["Order", "Payment"];

/// The header the polling relay adds to its records, so the test can tell who sent what.
const POLLER_HEADER: &str = "relayed_by";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cutover_from_a_polling_relay_at_least_once() -> Result<()> {
    cutover("cutal", false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cutover_from_a_polling_relay_exactly_once() -> Result<()> {
    cutover("cuteo", true).await
}

/// A `skip_if` that does not fit the table stops the relay at start-up with a configuration
/// error naming the key (exit 2), before anything is sent; `skip_ids_through` alone skips the
/// rows up to the watermark without any query.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cutover_condition_is_checked_and_id_watermark_skips() -> Result<()> {
    let w = World::with_db_prefix(bin(), "e2e", "cutids").await?;
    let topic = w.topic("Order");
    create_topic(&w.spec.bootstrap_servers, &topic, 1_048_576).await?;
    let mut conn = w.db.conn().await?;
    let start = current_binlog_position(&mut conn).await?;
    let mut ids = Vec::new();
    for n in 0..10 {
        conn.exec_drop(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, event_key, payload) \
             VALUES ('Order', 'o1', 'Created', ?, '{}')",
            (format!("{}-{n}", w.uid),),
        )
        .await?;
        ids.push(conn.last_insert_id().context("insert id")?);
    }
    let until: String = conn
        .query_first("SELECT DATE_FORMAT(UTC_TIMESTAMP(), '%Y-%m-%d %H:%i:%s')")
        .await?
        .context("UTC_TIMESTAMP")?;
    let with = |section: &str| {
        format!(
            "{}\n[cutover]\n{section}until = \"{until}\"\n",
            w.spec.to_toml()
        )
    };

    let bad = RelayProcess::spawn(bin(), &with("skip_if = \"no_such_column = 'SENT'\"\n"), &[])?;
    let status = bad.wait_exit(Duration::from_secs(60)).await?;
    let err = bad.stderr_text();
    ensure!(
        status.code() == Some(2) && err.contains("cutover.skip_if") && err.contains("no_such_column"),
        "a skip_if naming a missing column must stop the relay with exit 2 naming the key: {}\n{err}",
        describe_exit(&status)
    );

    let toml = with(&format!("skip_ids_through = {}\n", ids[4]));
    let pos = format!("{}:{}", start.file, start.pos);
    let reset = RelayProcess::spawn_args(
        bin(),
        &["reset", "--to", &pos, "--yes", "--config"],
        &toml,
        &[],
    )?;
    let status = reset.wait_exit(Duration::from_secs(60)).await?;
    ensure!(
        status.success(),
        "reset: {}\n{}",
        describe_exit(&status),
        reset.stderr_text()
    );
    let relay = RelayProcess::spawn(bin(), &toml, &[])?;
    let end = current_binlog_position(&mut conn).await?;
    w.wait_checkpoint_covers(&relay, &end, RELAY_WAIT).await?;
    let status = relay.stop(Duration::from_secs(60)).await?;
    ensure!(status.success(), "relay stop: {}", describe_exit(&status));
    let records = read_all_records(&w.spec.bootstrap_servers, &[topic], RELAY_WAIT).await?;
    let mut keys: Vec<String> = records.iter().map(event_key).collect::<Result<_>>()?;
    keys.sort_by_key(|k| k.rsplit('-').next().and_then(|n| n.parse::<u32>().ok()));
    let expected: Vec<String> = (5..10).map(|n| format!("{}-{n}", w.uid)).collect();
    ensure!(
        keys == expected,
        "skip_ids_through = id of row 4: got {keys:?}, expected {expected:?}"
    );
    ensure!(
        logged_count(&relay.stderr_text(), "rows_skipped=") == Some(5)
            && logged_count(&relay.stderr_text(), "queries=") == Some(0),
        "the watermark alone skips 5 rows with no query:\n{}",
        relay.stderr_tail()
    );
    drop(conn);
    w.db.drop_database().await?;
    Ok(())
}

async fn cutover(name: &str, exactly_once: bool) -> Result<()> {
    let mut w = World::with_db_prefix(bin(), "e2e", name).await?;
    if exactly_once {
        w.spec.kafka_extra = format!(
            "delivery = \"exactly_once\"\nprogress_topic = \"t_{}.progress\"\n",
            w.uid
        );
    }
    let topics: Vec<String> = TYPES.iter().map(|t| w.topic(t)).collect();
    for t in &topics {
        create_topic(&w.spec.bootstrap_servers, t, 1_048_576).await?;
    }
    let mut conn = w.db.conn().await?;
    conn.query_drop(
        "ALTER TABLE outbox ADD COLUMN status VARCHAR(16) NOT NULL DEFAULT 'NEW', \
         ADD KEY ix_outbox_status (status, id)",
    )
    .await?;

    // The application keeps writing throughout.
    let stop_writing = Arc::new(AtomicBool::new(false));
    let writer = spawn_writer(w.db.conn().await?, w.uid.clone(), Arc::clone(&stop_writing));

    // The polling relay runs for a while, then stops mid-flight.
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &w.spec.bootstrap_servers)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()
        .context("creating the polling relay's producer")?;
    let mut poller = Poller {
        conn: w.db.conn().await?,
        producer,
        topic_of: |t: &str| w.topic(t),
    };
    let polling_since = std::time::Instant::now();
    let mut sent_by_poller = 0usize;
    // At least 4 s of polling, so the rows before the cutover point span several seconds of
    // commits (some are SENT rows the new relay reads and must skip).
    while polling_since.elapsed() < Duration::from_secs(4) || sent_by_poller < 100 {
        // The writer feeds the loop: if it ended, no row will come; say why instead of
        // polling an idle table forever.
        if writer.is_finished() {
            let ended = writer.await.context("writer task")?;
            anyhow::bail!("the writer ended while the polling relay ran: {ended:?}");
        }
        ensure!(
            polling_since.elapsed() < RELAY_WAIT,
            "the polling relay sent only {sent_by_poller} rows in {} s",
            RELAY_WAIT.as_secs()
        );
        let batch = poller.claim(8).await?;
        poller.produce(&batch).await?;
        poller.mark_sent(&batch).await?;
        sent_by_poller += batch.len();
    }
    // Enough NEW rows for the last two batches.
    wait_until(
        "12 NEW rows",
        Duration::from_secs(30),
        Duration::from_millis(20),
        async || {
            let n: Option<u64> = conn
                .query_first("SELECT COUNT(*) FROM outbox WHERE status = 'NEW'")
                .await?;
            Ok(n.filter(|n| *n >= 12))
        },
    )
    .await?;
    // Produced and acknowledged, then the polling relay stops before marking them SENT.
    let still_sending = poller.claim(5).await?;
    poller.produce(&still_sending).await?;
    // Claimed (SENDING), never produced.
    let never_produced = poller.claim(5).await?;
    ensure!(
        still_sending.len() == 5 && never_produced.len() == 5,
        "claimed {} and {} rows",
        still_sending.len(),
        never_produced.len()
    );
    drop(poller);
    let still_sending: HashSet<String> = still_sending.into_iter().map(|r| r.event_key).collect();
    let never_produced: HashSet<String> = never_produced.into_iter().map(|r| r.event_key).collect();

    // The procedure. 1: the polling relay is stopped; `until` is the server's UTC time now.
    let until: String = conn
        .query_first("SELECT DATE_FORMAT(UTC_TIMESTAMP(), '%Y-%m-%d %H:%i:%s')")
        .await?
        .context("UTC_TIMESTAMP")?;
    // 2: the checkpoint goes to a time before the oldest row not SENT (created_at is in the
    // session's time zone, as the application wrote it; a margin of 2 s).
    let oldest: Option<i64> = conn
        .query_first(
            "SELECT CAST(FLOOR(UNIX_TIMESTAMP(MIN(created_at))) AS SIGNED) - 2 FROM outbox \
             WHERE status <> 'SENT'",
        )
        .await?
        .flatten();
    let oldest = oldest.context("no row is unsent")?;
    let to = chrono::DateTime::from_timestamp(oldest, 0)
        .context("timestamp")?
        .format("%Y-%m-%d %H:%M:%S")
        .to_string();
    let toml = format!(
        "{}\n[cutover]\nskip_if = \"status = 'SENT'\"\nuntil = \"{until}\"\n",
        w.spec.to_toml()
    );
    let reset = RelayProcess::spawn_args(
        bin(),
        &["reset", "--to", &to, "--yes", "--config"],
        &toml,
        &[],
    )?;
    let status = reset.wait_exit(Duration::from_secs(60)).await?;
    ensure!(
        status.success(),
        "reset --to {to:?}: {}\n{}\n{}",
        describe_exit(&status),
        reset.stdout_text(),
        reset.stderr_text()
    );
    // 3: run with [cutover], the writer still writing.
    let relay = RelayProcess::spawn(bin(), &toml, &[])?;
    // Rows committed after `until` end the window: the writer goes on for 2 s past it.
    wait_until(
        "the server clock 2 s past cutover.until",
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || {
            relay.ensure_running()?;
            let past: Option<i64> = conn
                .exec_first(
                    "SELECT TIMESTAMPDIFF(SECOND, ?, UTC_TIMESTAMP())",
                    (until.as_str(),),
                )
                .await?;
            Ok(past.filter(|s| *s >= 2))
        },
    )
    .await?;
    wait_for_stderr(&relay, "cutover window ended", RELAY_WAIT).await?;
    stop_writing.store(true, Ordering::SeqCst);
    let written = writer.await.context("writer task")??;
    // Every row on Kafka (read_committed), then a graceful stop: everything the relay sent is
    // acknowledged (exactly-once: committed) before the topics are read in full.
    let all: HashSet<String> = conn
        .query("SELECT event_key FROM outbox")
        .await?
        .into_iter()
        .collect();
    w.wait_for_keys(&topics, &all, Some(&relay), RELAY_WAIT)
        .await?;
    let status = relay.stop(Duration::from_secs(60)).await?;
    ensure!(status.success(), "relay stop: {}", describe_exit(&status));

    // What the table says about each row.
    let rows: Vec<(String, String)> = conn
        .query("SELECT event_key, status FROM outbox ORDER BY id")
        .await?;
    ensure!(
        rows.len() == written,
        "{} rows in the table, {written} written",
        rows.len()
    );
    let sent: HashSet<String> = rows
        .iter()
        .filter(|(_, s)| s == "SENT")
        .map(|(k, _)| k.clone())
        .collect();
    ensure!(sent.len() >= 100, "only {} rows SENT", sent.len());

    let records = if exactly_once {
        read_committed_records(&w.spec.bootstrap_servers, &topics, RELAY_WAIT).await?
    } else {
        read_all_records(&w.spec.bootstrap_servers, &topics, RELAY_WAIT).await?
    };
    let mut by_poller: HashMap<String, usize> = HashMap::new();
    let mut by_relay: HashMap<String, usize> = HashMap::new();
    for r in &records {
        let key = event_key(r)?;
        let counts = if r.header(POLLER_HEADER).is_some() {
            &mut by_poller
        } else {
            &mut by_relay
        };
        *counts.entry(key).or_default() += 1;
    }
    let missing: Vec<&String> = rows
        .iter()
        .map(|(k, _)| k)
        .filter(|k| !by_poller.contains_key(*k) && !by_relay.contains_key(*k))
        .collect();
    ensure!(
        missing.is_empty(),
        "{} rows never reached Kafka, e.g. {:?}\n--- relay stderr ---\n{}",
        missing.len(),
        &missing[..missing.len().min(10)],
        relay.stderr_tail()
    );
    // Each relay sent a row at most once.
    for (who, counts) in [("poller", &by_poller), ("outbox-relay", &by_relay)] {
        let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
        ensure!(
            twice.is_empty(),
            "{who} sent rows more than once: {twice:?}"
        );
    }
    let resent_sent: Vec<&String> = sent.iter().filter(|k| by_relay.contains_key(*k)).collect();
    ensure!(
        resent_sent.is_empty(),
        "outbox-relay re-sent {} SENT rows, e.g. {:?}",
        resent_sent.len(),
        &resent_sent[..resent_sent.len().min(10)]
    );
    let duplicated: HashSet<String> = by_poller
        .keys()
        .filter(|k| by_relay.contains_key(*k))
        .cloned()
        .collect();
    ensure!(
        duplicated == still_sending,
        "rows on Kafka twice: {duplicated:?}; expected exactly the SENDING rows the polling \
         relay had produced: {still_sending:?}"
    );
    for k in &never_produced {
        ensure!(
            by_relay.contains_key(k) && !by_poller.contains_key(k),
            "the SENDING row {k} the polling relay never produced must come from outbox-relay"
        );
    }
    let text = relay.stderr_text();
    ensure!(
        text.contains("cutover: rows the previous relay sent are skipped"),
        "no start-up line about the cutover:\n{}",
        relay.stderr_tail()
    );

    // The filter did skip rows: the checkpoint was put before SENT rows.
    let skipped = logged_count(&relay.stderr_text(), "rows_skipped=")
        .context("no rows_skipped in the relay's summary line")?;
    ensure!(
        skipped > 0 && skipped as usize <= sent.len(),
        "rows_skipped={skipped} with {} rows SENT",
        sent.len()
    );
    eprintln!(
        "{name}: {written} rows, {} SENT by the poller ({skipped} of them read and skipped by \
         outbox-relay), {} duplicates (SENDING, produced), {} sent by outbox-relay",
        sent.len(),
        duplicated.len(),
        by_relay.len()
    );
    drop(conn); // the pool waits for its connections
    w.db.drop_database().await?;
    Ok(())
}

/// The number after the last `field` (`rows_skipped=`) in the relay's log `text`.
fn logged_count(text: &str, field: &str) -> Option<u64> {
    let at = text.rfind(field)? + field.len();
    let digits: String = text[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// The `event_key` header of `r`.
fn event_key(r: &Record) -> Result<String> {
    r.header("event_key")
        .map(str::to_owned)
        .with_context(|| format!("record without event_key: {r:?}"))
}

/// Inserts rows (1–3 per transaction) until `stop`; returns how many. A transaction the
/// server rolls back as a deadlock victim or after a lock wait timeout (the polling relay's
/// `FOR UPDATE` locks index gaps on MariaDB) is retried, as an application would.
fn spawn_writer(mut conn: Conn, uid: String, stop: Arc<AtomicBool>) -> JoinHandle<Result<usize>> {
    tokio::spawn(async move {
        let mut n = 0usize;
        let mut retries = 0u32;
        while !stop.load(Ordering::SeqCst) {
            match insert_batch(&mut conn, &uid, n).await {
                Ok(next) => n = next,
                Err(e) if is_retryable(&e) && retries < 1_000 => retries += 1,
                Err(e) => return Err(e).context(format!("writer, after {n} rows")),
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(n)
    })
}

/// One writer transaction of 1–3 rows, the first numbered `n`; returns the next number.
async fn insert_batch(
    conn: &mut Conn,
    uid: &str,
    mut n: usize,
) -> Result<usize, mysql_async::Error> {
    let rows = 1 + n % 3;
    let mut tx = conn.start_transaction(Default::default()).await?;
    for _ in 0..rows {
        let t = TYPES[n % TYPES.len()];
        tx.exec_drop(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, event_key, \
             payload) VALUES (?, ?, 'Created', ?, ?)",
            (
                t,
                format!("agg-{}", n % 7),
                format!("{uid}-{n}"),
                format!("{{\"n\":{n}}}"),
            ),
        )
        .await?;
        n += 1;
    }
    tx.commit().await?;
    Ok(n)
}

/// A deadlock (1213) or lock wait timeout (1205): the server rolled the transaction back.
fn is_retryable(e: &mysql_async::Error) -> bool {
    matches!(e, mysql_async::Error::Server(s) if s.code == 1213 || s.code == 1205)
}

/// One row the polling relay claimed.
struct Claimed {
    id: u64,
    aggregate_type: String,
    aggregate_id: String,
    event_type: String,
    event_key: String,
    payload: Option<String>,
}

/// A polling relay as teams write them: claim NEW rows (`FOR UPDATE SKIP LOCKED`, mark
/// `SENDING`), produce them with the relay's topic, key and headers, mark them `SENT` once
/// Kafka acknowledged.
struct Poller<F> {
    conn: Conn,
    producer: FutureProducer,
    topic_of: F,
}

impl<F: Fn(&str) -> String> Poller<F> {
    /// Claims up to `n` NEW rows; a claim the server rolled back (deadlock, lock wait
    /// timeout) is retried, as a polling relay would.
    async fn claim(&mut self, n: usize) -> Result<Vec<Claimed>> {
        let mut attempts = 0u32;
        loop {
            match self.claim_once(n).await {
                Err(e) if is_retryable(&e) && attempts < 100 => attempts += 1,
                done => return Ok(done?),
            }
        }
    }

    async fn claim_once(&mut self, n: usize) -> Result<Vec<Claimed>, mysql_async::Error> {
        let mut tx = self.conn.start_transaction(Default::default()).await?;
        let rows: Vec<(u64, String, String, String, String, Option<String>)> = tx
            .exec(
                "SELECT id, aggregate_type, aggregate_id, event_type, event_key, \
                 CAST(payload AS CHAR) FROM outbox WHERE status = 'NEW' ORDER BY id LIMIT ? \
                 FOR UPDATE SKIP LOCKED",
                (n as u64,),
            )
            .await?;
        let claimed: Vec<Claimed> = rows
            .into_iter()
            .map(
                |(id, aggregate_type, aggregate_id, event_type, event_key, payload)| Claimed {
                    id,
                    aggregate_type,
                    aggregate_id,
                    event_type,
                    event_key,
                    payload,
                },
            )
            .collect();
        if !claimed.is_empty() {
            tx.query_drop(format!(
                "UPDATE outbox SET status = 'SENDING' WHERE id IN ({})",
                ids(&claimed)
            ))
            .await?;
        }
        tx.commit().await?;
        Ok(claimed)
    }

    async fn produce(&self, rows: &[Claimed]) -> Result<()> {
        for r in rows {
            let topic = (self.topic_of)(&r.aggregate_type);
            let id = r.id.to_string();
            let headers = OwnedHeaders::new()
                .insert(Header {
                    key: "id",
                    value: Some(&id),
                })
                .insert(Header {
                    key: "event_key",
                    value: Some(&r.event_key),
                })
                .insert(Header {
                    key: "event_type",
                    value: Some(&r.event_type),
                })
                .insert(Header {
                    key: "aggregate_type",
                    value: Some(&r.aggregate_type),
                })
                .insert(Header {
                    key: POLLER_HEADER,
                    value: Some("poller"),
                });
            let mut record = FutureRecord::to(&topic)
                .key(r.aggregate_id.as_bytes())
                .headers(headers);
            if let Some(p) = &r.payload {
                record = record.payload(p.as_bytes());
            }
            // Waits for Kafka's acknowledgement.
            self.producer
                .send(record, Duration::from_secs(30))
                .await
                .map_err(|(e, _)| anyhow::anyhow!("polling relay: produce failed: {e}"))?;
        }
        Ok(())
    }

    async fn mark_sent(&mut self, rows: &[Claimed]) -> Result<()> {
        if !rows.is_empty() {
            self.conn
                .query_drop(format!(
                    "UPDATE outbox SET status = 'SENT' WHERE id IN ({})",
                    ids(rows)
                ))
                .await?;
        }
        Ok(())
    }
}

fn ids(rows: &[Claimed]) -> String {
    rows.iter()
        .map(|r| r.id.to_string())
        .collect::<Vec<_>>()
        .join(",")
}
