//! End-to-end tests of exactly-once delivery (`kafka.delivery = "exactly_once"`) against the
//! real servers of the test machine: a `read_committed` consumer sees every committed outbox row
//! once, across `kill -9` of the relay, source transactions larger than one Kafka transaction,
//! and a producer that takes the relay's `transactional.id`.
//!
//! Each test has its own database, topics, progress topic, connector name and server id
//! ([`World`]), so the tests run in parallel. They wait only on observable state (records
//! visible to `read_committed` readers, the process's exit) and check what reached Kafka.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use outbox_relay_testkit::mysql_async::Conn;
use outbox_relay_testkit::rdkafka::config::ClientConfig;
use outbox_relay_testkit::rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use outbox_relay_testkit::{
    commit_rows, describe_exit, ensure_exactly_once, ensure_per_key_order, free_local_port,
    high_watermark_total, http_get, metric, read_committed_records, wait_for_status,
    wait_for_stderr, wait_until, PrivateService, Record, RelayProcess, RowGen, ServiceSpec, World,
};

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
/// Reading topics that are no longer written.
const READ_ALL: Duration = Duration::from_secs(120);

/// A world whose relay runs exactly-once with its own progress topic and at most
/// `max_records` records per Kafka transaction. A first relay has streamed and stopped, so its
/// checkpoint (the end of the binlog then) is where the next one starts: rows committed from
/// here on are a backlog.
async fn eos_world(name: &str, max_records: u64) -> Result<World> {
    eos_world_with(name, max_records, |_| {}).await
}

/// [`eos_world`] with the spec changed by `tune` first.
async fn eos_world_with(
    name: &str,
    max_records: u64,
    tune: impl FnOnce(&mut World),
) -> Result<World> {
    let mut world = World::new(bin(), name).await?;
    world.spec.kafka_extra = format!(
        "delivery = \"exactly_once\"\nprogress_topic = \"t_{}.progress\"\n\
         transaction_max_records = {max_records}\ntransaction_interval_ms = 50\n",
        world.uid
    );
    tune(&mut world);
    let (relay, _) = world.start(STARTUP).await?;
    // The start position is stored before the producer starts: wait for the stream, so the
    // progress topic exists too.
    wait_for_stderr(&relay, "streaming binlog", STARTUP).await?;
    stop_cleanly(&relay).await?;
    Ok(world)
}

/// SIGTERM, then checks the relay exited 0.
async fn stop_cleanly(relay: &RelayProcess) -> Result<()> {
    let status = relay.stop(STOP).await?;
    ensure!(
        status.success(),
        "the relay stopped with {}\n{}",
        describe_exit(&status),
        relay.stderr_tail()
    );
    Ok(())
}

/// Waits until every key in `keys` is visible to read_committed readers.
async fn finish_keys(
    world: &World,
    topics: &[String],
    keys: &[String],
    relay: &RelayProcess,
) -> Result<()> {
    let wanted: HashSet<String> = keys.iter().cloned().collect();
    world
        .wait_for_keys(topics, &wanted, Some(relay), RELAY_WAIT)
        .await?;
    Ok(())
}

/// [`finish_keys`], then stops `relay` cleanly and checks that each key is there exactly once,
/// in commit order per aggregate; returns the records.
async fn finish(
    world: &World,
    topics: &[String],
    keys: &[String],
    relay: &RelayProcess,
) -> Result<Vec<Record>> {
    finish_keys(world, topics, keys, relay).await?;
    stop_cleanly(relay).await?;
    ensure_each_once(world, topics, keys).await
}

fn progress_topic(world: &World) -> String {
    format!("t_{}.progress", world.uid)
}

/// Offsets of `topics` below their last stable offsets: the records a `read_committed` reader
/// can see, plus transaction markers and aborted records (a lower bound of progress, cheap
/// to poll).
async fn visible(world: &World, topics: &[String]) -> Result<u64> {
    high_watermark_total(&world.spec.bootstrap_servers, topics).await
}

/// Waits until at least `n` records of `topics` are visible, failing if `relay` exits.
async fn wait_visible(
    world: &World,
    topics: &[String],
    n: u64,
    relay: &RelayProcess,
) -> Result<u64> {
    wait_until(
        &format!("{n} records visible to read_committed readers"),
        RELAY_WAIT,
        Duration::from_millis(20),
        async || {
            relay.ensure_running()?;
            let seen = visible(world, topics).await?;
            Ok((seen >= n).then_some(seen))
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e:#}\n--- relay stderr ---\n{}", relay.stderr_tail()))
}

/// [`eos_world`], its `Order` topic, rows labelled `label` over `keys` aggregates, and a
/// connection.
async fn eos_start(
    name: &str,
    max_records: u64,
    label: &str,
    keys: usize,
) -> Result<(World, Vec<String>, RowGen, Conn)> {
    let world = eos_world(name, max_records).await?;
    let topics = vec![world.topic("Order")];
    let gen = RowGen::new(&world.uid, label, keys);
    let conn = world.db.conn().await?;
    Ok((world, topics, gen, conn))
}

/// Commits `n` more rows of `gen` in one transaction and adds their event keys to `keys`.
async fn commit_more(
    conn: &mut Conn,
    gen: &mut RowGen,
    n: usize,
    keys: &mut Vec<String>,
) -> Result<()> {
    let rows = gen.rows(n);
    keys.extend(rows.iter().map(|r| r.event_key.clone()));
    commit_rows(conn, &rows).await?;
    Ok(())
}

/// Commits `rows` in one source transaction, in statements of at most 5,000 rows (a
/// statement's placeholder limit).
async fn commit_in_one_transaction(
    conn: &mut Conn,
    rows: &[outbox_relay_testkit::OutboxRow],
) -> Result<()> {
    let mut tx = conn
        .start_transaction(outbox_relay_testkit::mysql_async::TxOpts::default())
        .await?;
    for chunk in rows.chunks(5_000) {
        outbox_relay_testkit::insert_outbox_rows(
            &mut tx,
            "outbox",
            chunk,
            outbox_relay_testkit::InsertStyle::MultiRow,
        )
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// At most `in_flight` records unacknowledged, each batch held `linger_ms`: a large source
/// transaction then takes seconds to relay.
fn slow_batches(w: &mut World, in_flight: usize, linger_ms: u32) {
    w.spec.max_in_flight = in_flight;
    w.spec
        .kafka_properties
        .retain(|(k, _)| k.as_str() != "linger.ms");
    w.spec
        .kafka_properties
        .push(("linger.ms".into(), linger_ms.to_string()));
}

/// Commit order of each event key, for [`ensure_per_key_order`].
fn commit_order(keys: &[String]) -> HashMap<String, usize> {
    keys.iter()
        .enumerate()
        .map(|(i, k)| (k.clone(), i))
        .collect()
}

/// The connector's progress records (JSON values), oldest first.
async fn progress_records(world: &World) -> Result<Vec<serde_json::Value>> {
    let records = read_committed_records(
        &world.spec.bootstrap_servers,
        &[progress_topic(world)],
        READ_ALL,
    )
    .await?;
    records
        .iter()
        .filter(|r| r.key_str() == Some(world.connector()))
        .map(|r| {
            serde_json::from_slice(r.value.as_deref().unwrap_or_default())
                .context("a progress record is not JSON")
        })
        .collect()
}

/// Checks the final outcome: every key in `keys` exactly once for a read_committed reader, in
/// commit order per aggregate; returns the records.
async fn ensure_each_once(
    world: &World,
    topics: &[String],
    keys: &[String],
) -> Result<Vec<Record>> {
    let records = read_committed_records(&world.spec.bootstrap_servers, topics, READ_ALL).await?;
    let expected: HashSet<String> = keys.iter().cloned().collect();
    ensure_exactly_once(&records, &expected)?;
    ensure_per_key_order(&records, &commit_order(keys))?;
    Ok(records)
}

/// kill -9 while transactions of a backlog are open, twice, with rows committed meanwhile: the
/// aborted transactions never become visible, and the last committed point in the progress
/// topic is where each new instance resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_is_visible_once_across_kill_9() -> Result<()> {
    let (world, topics, mut gen, mut conn) = eos_start("eos_kill", 300, "k", 40).await?;
    let mut keys = Vec::new();
    // A backlog of 30,000 rows in transactions of 100.
    for _ in 0..300 {
        commit_more(&mut conn, &mut gen, 100, &mut keys).await?;
    }
    for (round, at) in [3_000u64, 12_000].into_iter().enumerate() {
        let relay = world.spawn()?;
        wait_visible(&world, &topics, at, &relay).await?;
        relay.kill9()?;
        // More rows while no relay runs.
        commit_more(&mut conn, &mut gen, 50, &mut keys).await?;
        eprintln!("round {round}: killed after {at} visible records");
    }
    let relay = world.spawn()?;
    // Rows committed while the last instance streams.
    for _ in 0..20 {
        commit_more(&mut conn, &mut gen, 25, &mut keys).await?;
    }
    let records = finish(&world, &topics, &keys, &relay).await?;
    ensure!(
        records.len() == keys.len(),
        "{} records for {} rows",
        records.len(),
        keys.len()
    );
    // The progress topic holds the end, and the state table mirrors it after the stop.
    let progress = progress_records(&world).await?;
    let last = progress
        .last()
        .context("no progress record for the connector")?;
    ensure!(
        last["rows_acked"] == 0,
        "the final resume point is inside a transaction: {last}"
    );
    let mirrored = world.checkpoint().await?;
    ensure!(
        last["binlog_file"] == mirrored.binlog_file.as_str()
            && last["binlog_pos"] == mirrored.binlog_pos,
        "the state table mirrors {}:{} but the last committed point is {last}",
        mirrored.binlog_file,
        mirrored.binlog_pos
    );
    ensure!(
        relay
            .stderr_text()
            .contains("exactly-once: resuming from the last committed point"),
        "the last instance did not resume from the progress topic:\n{}",
        relay.stderr_tail()
    );
    Ok(())
}

/// A current relay commits as soon as it has read everything the server sent (group commit),
/// not only after `transaction_interval_ms`: with the interval at 5 minutes, rows committed
/// one by one are visible to a read_committed reader long before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_current_relay_commits_without_waiting_for_the_interval() -> Result<()> {
    let world = eos_world_with("eos_group_commit", 1000, |w| {
        w.spec.kafka_extra = w.spec.kafka_extra.replace(
            "transaction_interval_ms = 50\n",
            "transaction_interval_ms = 300000\ntransaction_timeout_ms = 900000\n",
        );
    })
    .await?;
    let topics = vec![world.topic("Order")];
    let mut gen = RowGen::new(&world.uid, "g", 3);
    let mut conn = world.db.conn().await?;
    let relay = world.spawn()?;
    let mut keys = Vec::new();
    for _ in 0..5 {
        commit_more(&mut conn, &mut gen, 2, &mut keys).await?;
        // Each pair becomes visible on its own (RELAY_WAIT is shorter than the interval).
        finish_keys(&world, &topics, &keys, &relay).await?;
    }
    stop_cleanly(&relay).await?;
    ensure_each_once(&world, &topics, &keys).await?;
    Ok(())
}

/// A start reads the progress topic's last offsets first; when more than that many records of
/// other connectors follow the connector's last point, it reads the topic from the beginning
/// and still resumes from that point (not from the state table, not from the binlog's end).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_point_behind_other_connectors_records_is_found() -> Result<()> {
    let (world, topics, mut gen, mut conn) = eos_start("eos_progress_tail", 1000, "p", 5).await?;
    let mut keys = Vec::new();
    commit_more(&mut conn, &mut gen, 10, &mut keys).await?;
    let relay = world.spawn()?;
    finish_keys(&world, &topics, &keys, &relay).await?;
    stop_cleanly(&relay).await?;
    // 1,500 resume points of another connector after this one's (more than the 1,000 offsets
    // a start reads first).
    let topic = progress_topic(&world);
    let bootstrap = world.spec.bootstrap_servers.clone();
    tokio::task::spawn_blocking(move || -> Result<()> {
        let p: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .create()?;
        for i in 0..1500 {
            let value = format!("{{\"other\": {i}}}");
            loop {
                match p.send(
                    BaseRecord::<str, str>::to(&topic)
                        .key("another-connector")
                        .payload(&value),
                ) {
                    Ok(()) => break,
                    Err((_, _)) => {
                        p.poll(Duration::from_millis(10));
                    }
                }
            }
        }
        p.flush(Duration::from_secs(30))?;
        Ok(())
    })
    .await??;
    // (A relay that missed the progress topic's point would resume from the state table's
    // mirror and say so: the log line below tells them apart.)
    commit_more(&mut conn, &mut gen, 10, &mut keys).await?;
    let relay = world.spawn()?;
    finish_keys(&world, &topics, &keys, &relay).await?;
    stop_cleanly(&relay).await?;
    ensure!(
        relay
            .stderr_text()
            .contains("exactly-once: resuming from the last committed point"),
        "the relay did not resume from the progress topic:\n{}",
        relay.stderr_tail()
    );
    let records = ensure_each_once(&world, &topics, &keys).await?;
    ensure!(records.len() == 20, "{} records for 20 rows", records.len());
    Ok(())
}

/// A source transaction of 5,000 rows with at most 500 records per Kafka transaction: it is
/// committed in parts, each resume point inside it saying how many of its rows are committed;
/// a kill -9 in the middle of the second such transaction resumes inside it without a
/// duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_source_transaction_spans_several_kafka_transactions() -> Result<()> {
    let (world, topics, mut gen, mut conn) = eos_start("eos_large", 500, "l", 20).await?;
    let mut keys = Vec::new();
    commit_more(&mut conn, &mut gen, 5_000, &mut keys).await?;
    let relay = world.spawn()?;
    let wanted: HashSet<String> = keys.iter().cloned().collect();
    world
        .wait_for_keys(&topics, &wanted, Some(&relay), RELAY_WAIT)
        .await?;
    let inside: Vec<u64> = progress_records(&world)
        .await?
        .iter()
        .filter_map(|p| p["rows_acked"].as_u64())
        .filter(|n| *n > 0)
        .collect();
    // Commits come every 500 records at most (sooner when transaction_interval_ms passes).
    let steps_ok = inside.windows(2).all(|w| w[0] < w[1] && w[1] - w[0] <= 500);
    ensure!(
        inside.len() >= 9 && steps_ok && inside[0] <= 500 && inside[inside.len() - 1] >= 4_500,
        "expected resume points at most 500 rows apart inside the source transaction, got \
         {inside:?}"
    );
    commit_more(&mut conn, &mut gen, 5_000, &mut keys).await?;
    // Inside the second source transaction: committed parts visible, the rest not yet.
    let seen = wait_visible(&world, &topics, 6_000, &relay).await?;
    relay.kill9()?;
    eprintln!("killed with {seen} records visible");
    let relay = world.spawn()?;
    finish(&world, &topics, &keys, &relay).await?;
    Ok(())
}

/// The transaction timeout against a large source transaction: with
/// `transaction_timeout_ms = 6000` and the record and byte bounds out of reach, a source
/// transaction of 2,500 rows relayed with at most 50 records in flight and `linger.ms = 200`
/// (at most ~250 rows/s on any machine, so at least ~10 s) takes longer than the timeout; the
/// Kafka transaction is committed in parts once open for a quarter of it (resume points inside
/// the source transaction, ~1.5 s apart), never aborted by the broker (which would repeat the
/// same abort on every retry), and every row is visible once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_transaction_longer_than_the_transaction_timeout_is_committed_in_parts(
) -> Result<()> {
    let port = free_local_port()?;
    let world = eos_world_with("eos_timeout", 10_000_000, |w| {
        w.spec
            .kafka_extra
            .push_str("transaction_timeout_ms = 6000\n");
        slow_batches(w, 50, 200);
        w.spec.http_listen = Some(format!("127.0.0.1:{port}"));
    })
    .await?;
    let topics = vec![world.topic("Order")];
    let mut gen = RowGen::new(&world.uid, "t", 20);
    let mut conn = world.db.conn().await?;
    let rows = gen.rows(2_500);
    let keys: Vec<String> = rows.iter().map(|r| r.event_key.clone()).collect();
    commit_in_one_transaction(&mut conn, &rows).await?;
    let relay = world.spawn()?;
    let wanted: HashSet<String> = keys.iter().cloned().collect();
    world
        .wait_for_keys(&topics, &wanted, Some(&relay), RELAY_WAIT)
        .await?;
    let (_, page) = http_get(port, "/metrics").await?;
    let aborted = metric(&page, "outbox_relay_transactions_aborted_total").unwrap_or(-1.0);
    let committed = metric(&page, "outbox_relay_transactions_committed_total").unwrap_or(0.0);
    let inside: Vec<(u64, i64)> = progress_records(&world)
        .await?
        .iter()
        .filter_map(|p| Some((p["rows_acked"].as_u64()?, p["committed_at_ms"].as_i64()?)))
        .filter(|(n, _)| *n > 0)
        .collect();
    let span_ms = match (inside.first(), inside.last()) {
        (Some(a), Some(b)) => b.1 - a.1,
        _ => 0,
    };
    eprintln!(
        "{} commits inside the source transaction over {span_ms} ms; {committed} committed, \
         {aborted} aborted",
        inside.len()
    );
    ensure!(
        aborted == 0.0,
        "{aborted} transactions aborted\n{}",
        relay.stderr_tail()
    );
    // Split by time alone: 2,500 records are far from the record and byte bounds.
    ensure!(
        inside.len() >= 2 && inside.windows(2).all(|w| w[0].0 < w[1].0),
        "expected resume points inside the source transaction, got {inside:?}"
    );
    finish(&world, &topics, &keys, &relay).await?;
    Ok(())
}

/// Another producer takes the relay's `transactional.id` while the relay holds its lease (two
/// connectors configured with one id): the relay is fenced and stops with an error naming the
/// id, and does not fence the other producer back (it commits after the relay's exit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_relay_stops_and_does_not_fence_back() -> Result<()> {
    let (world, topics, mut gen, mut conn) = eos_start("eos_fenced", 1000, "f", 5).await?;
    commit_rows(&mut conn, &gen.rows(10)).await?;
    let relay = world.spawn()?;
    wait_visible(&world, &topics, 10, &relay).await?;
    let id = format!("outbox-relay.{}", world.connector());
    let other: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &world.spec.bootstrap_servers)
        .set("transactional.id", &id)
        .create()?;
    let other = tokio::task::spawn_blocking(move || -> Result<BaseProducer> {
        other.init_transactions(Duration::from_secs(30))?;
        Ok(other)
    })
    .await??;
    // The relay finds out at its next transaction.
    commit_rows(&mut conn, &gen.rows(10)).await?;
    let status = relay.wait_exit(RELAY_WAIT).await?;
    ensure!(
        status.code() == Some(1),
        "expected exit code 1, got {}\n{}",
        describe_exit(&status),
        relay.stderr_tail()
    );
    wait_for_stderr(&relay, "fenced", Duration::from_secs(5)).await?;
    let stderr = relay.stderr_text();
    ensure!(
        stderr.contains(&id) && stderr.contains("this instance stops"),
        "the error does not name the transactional.id and the stop:\n{}",
        relay.stderr_tail()
    );
    let scratch = format!("t_{}.scratch", world.uid);
    tokio::task::spawn_blocking(move || -> Result<()> {
        other.begin_transaction()?;
        other
            .send(BaseRecord::<str, str>::to(&scratch).key("k").payload("v"))
            .map_err(|(e, _)| e)?;
        other.commit_transaction(Duration::from_secs(30))?;
        Ok(())
    })
    .await?
    .context("the other producer was fenced back")?;
    Ok(())
}

/// `reset` in exactly-once mode moves the point runs resume from (the progress topic), not
/// only the state table: after a reset to where the relay started, its rows are sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_moves_the_progress_topics_point() -> Result<()> {
    let (world, topics, mut gen, mut conn) = eos_start("eos_reset", 1000, "r", 5).await?;
    let start = world.checkpoint().await?;
    let mut keys = Vec::new();
    commit_more(&mut conn, &mut gen, 30, &mut keys).await?;
    let relay = world.spawn()?;
    finish(&world, &topics, &keys, &relay).await?;
    let to = format!("{}:{}", start.binlog_file, start.binlog_pos);
    let reset = RelayProcess::spawn_args(
        bin(),
        &["reset", "--to", &to, "--yes", "--config"],
        &world.spec.to_toml(),
        &[],
    )?;
    let status = reset.wait_exit(STOP).await?;
    ensure!(
        status.success(),
        "reset ended with {}\n{}\n{}",
        describe_exit(&status),
        reset.stdout_text(),
        reset.stderr_tail()
    );
    let last = progress_records(&world).await?;
    let last = last.last().context("no progress record")?;
    ensure!(
        last["binlog_file"] == start.binlog_file.as_str() && last["binlog_pos"] == start.binlog_pos,
        "the progress topic's last point is {last}, not the reset's {to}"
    );
    let relay = world.spawn()?;
    let wanted = keys.clone();
    let again = move |records: &[Record]| {
        let counts = outbox_relay_testkit::event_key_counts(records);
        wanted.iter().all(|k| counts.get(k) == Some(&2))
    };
    let records = outbox_relay_testkit::collect_until(
        &world.spec.bootstrap_servers,
        &topics,
        RELAY_WAIT,
        again,
    )
    .await?;
    stop_cleanly(&relay).await?;
    let counts = outbox_relay_testkit::event_key_counts(&records);
    ensure!(
        keys.iter().all(|k| counts.get(k) == Some(&2)),
        "after the reset every row must be sent once more: {counts:?}"
    );
    Ok(())
}

/// `check` in exactly-once mode: it initializes transactions with the connector's id when no
/// instance runs (and says it did not while one runs), reads the progress topic's cleanup
/// policy, and warns about the test broker's unreplicated transaction state log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_verifies_transactions_and_the_progress_topic() -> Result<()> {
    let world = eos_world("eos_check", 1000).await?;
    let id = format!("outbox-relay.{}", world.connector());
    let check = |spec: &outbox_relay_testkit::RelayConfigSpec| {
        RelayProcess::spawn_args(bin(), &["check", "--config"], &spec.to_toml(), &[])
    };
    let stopped = check(&world.spec)?;
    stopped.wait_exit(STOP).await?;
    let out = stopped.stdout_text();
    for line in [
        format!(
            "OK    transactions (transactional.id {id}): the transaction coordinator initialized \
             the producer"
        ),
        format!(
            "OK    progress topic {}: exists, cleanup.policy=compact",
            progress_topic(&world)
        ),
        "WARN  transaction state log: expected transaction.state.log.replication.factor >= 3 \
         and transaction.state.log.min.isr >= 2, found replication factor 1, min.isr 1"
            .to_owned(),
    ] {
        ensure!(out.contains(&line), "{line:?} not in:\n{out}");
    }
    let relay = world.spawn()?;
    wait_for_stderr(&relay, "streaming binlog", RELAY_WAIT).await?;
    let running = check(&world.spec)?;
    running.wait_exit(STOP).await?;
    let out = running.stdout_text();
    let line = format!(
        "OK    transactions (transactional.id {id}): not tried: an instance of this connector \
         is running"
    );
    ensure!(out.contains(&line), "{line:?} not in:\n{out}");
    // The check did not fence the running relay: it still relays.
    let mut gen = RowGen::new(&world.uid, "c", 3);
    let rows = gen.rows(5);
    let keys: Vec<String> = rows.iter().map(|r| r.event_key.clone()).collect();
    commit_rows(&mut world.db.conn().await?, &rows).await?;
    finish(&world, &[world.topic("Order")], &keys, &relay).await?;
    Ok(())
}

/// An exactly-once relay (`transaction_timeout_ms = 8000`, HTTP on `port`) that relayed a first
/// batch of 5 rows over `aggregates` aggregates.
struct Watched {
    world: World,
    topics: Vec<String>,
    gen: RowGen,
    conn: Conn,
    keys: Vec<String>,
    first: Vec<outbox_relay_testkit::OutboxRow>,
    relay: RelayProcess,
}

async fn watched(
    name: &str,
    port: u16,
    aggregates: usize,
    tune: impl FnOnce(&mut World),
) -> Result<Watched> {
    let world = eos_world_with(name, 1000, |w| {
        w.spec
            .kafka_extra
            .push_str("transaction_timeout_ms = 8000\n");
        w.spec.http_listen = Some(format!("127.0.0.1:{port}"));
        tune(w);
    })
    .await?;
    let topics = vec![world.topic("Order")];
    let mut gen = RowGen::new(&world.uid, "w", aggregates);
    let mut conn = world.db.conn().await?;
    let first = gen.rows(5);
    let keys: Vec<String> = first.iter().map(|r| r.event_key.clone()).collect();
    commit_rows(&mut conn, &first).await?;
    let relay = world.spawn()?;
    finish_keys(&world, &topics, &keys, &relay).await?;
    Ok(Watched {
        world,
        topics,
        gen,
        conn,
        keys,
        first,
        relay,
    })
}

/// Another producer leaves a transaction open on the relay's topic (a hanging transaction):
/// read_committed consumers see none of the relay's later records, the relay's metrics show
/// the last stable offset lag and how long it has been stuck, and `/readyz` says so once that
/// passes half of `kafka.transaction_timeout_ms`. When the other transaction ends, everything is
/// visible once and the relay is ready again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_transaction_on_the_relays_topic_is_seen() -> Result<()> {
    let port = free_local_port()?;
    // One aggregate: every record goes to the partition of the hanging transaction.
    let Watched {
        world,
        topics,
        mut gen,
        mut conn,
        mut keys,
        first,
        relay,
    } = watched("eos_hang", port, 1, |_| {}).await?;
    wait_for_status(&relay, port, "/readyz", 200, RELAY_WAIT).await?;
    // The other producer's transaction: one record, never committed.
    let (bootstrap, topic) = (world.spec.bootstrap_servers.clone(), topics[0].clone());
    let hanging = format!("hanging-{}", world.uid);
    let other = tokio::task::spawn_blocking(move || -> Result<BaseProducer> {
        let p: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("transactional.id", &hanging)
            // The relay's partitioner: key o-00 lands on the relay's partition for it.
            .set("partitioner", "murmur2_random")
            .create()?;
        p.init_transactions(Duration::from_secs(30))?;
        p.begin_transaction()?;
        p.send(
            BaseRecord::<str, str>::to(&topic)
                .key("o-00")
                .payload("hanging"),
        )
        .map_err(|(e, _)| e)?;
        p.flush(Duration::from_secs(30))?;
        Ok(p)
    })
    .await??;
    commit_more(&mut conn, &mut gen, 5, &mut keys).await?;
    let reason = wait_for_status(&relay, port, "/readyz", 503, RELAY_WAIT).await?;
    ensure!(
        reason.contains(&format!("the last stable offset of {}", topics[0]))
            && reason.contains("a transaction is hanging"),
        "{reason}"
    );
    let (_, page) = http_get(port, "/metrics").await?;
    let lag = metric(&page, "outbox_relay_last_stable_offset_lag_records").unwrap_or(0.0);
    let stuck = metric(&page, "outbox_relay_last_stable_offset_stuck_seconds").unwrap_or(0.0);
    ensure!(lag >= 6.0 && stuck >= 4.0, "lag {lag}, stuck {stuck} s");
    // Behind the hanging transaction, read_committed readers see only the first rows.
    let seen = read_committed_records(&world.spec.bootstrap_servers, &topics, READ_ALL).await?;
    ensure!(
        seen.len() == first.len(),
        "{} records visible behind the open transaction",
        seen.len()
    );
    tokio::task::spawn_blocking(move || other.abort_transaction(Duration::from_secs(30))).await??;
    wait_for_status(&relay, port, "/readyz", 200, RELAY_WAIT).await?;
    finish(&world, &topics, &keys, &relay).await?;
    Ok(())
}

/// Kafka goes away while the relay's transaction holds records: the open transaction shows in
/// `outbox_relay_transaction_open_seconds` and in `/readyz` once it passes half of
/// `kafka.transaction_timeout_ms`; the transaction is aborted, and with Kafka back every row is
/// visible once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_transaction_kafka_cannot_take_is_seen_and_aborted() -> Result<()> {
    let kafka_port: u16 = std::env::var("EOS_KAFKA_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(9892);
    let kafka = PrivateService::acquire(
        ServiceSpec::kafka("eos-kafka", kafka_port, Vec::new()),
        |_| Ok(()),
    )?;
    let port = free_local_port()?;
    let Watched {
        world,
        topics,
        mut gen,
        mut conn,
        mut keys,
        relay,
        ..
    } = watched("eos_open", port, 5, |w| {
        w.spec.bootstrap_servers = format!("127.0.0.1:{kafka_port}");
        w.spec.http_extra = "ready_kafka_ms = 120000\n".into();
    })
    .await?;
    kafka.stop()?;
    commit_more(&mut conn, &mut gen, 5, &mut keys).await?;
    let reason = wait_for_status(&relay, port, "/readyz", 503, RELAY_WAIT).await?;
    ensure!(
        reason.contains("a Kafka transaction has been open for"),
        "{reason}"
    );
    let (_, page) = http_get(port, "/metrics").await?;
    let open = metric(&page, "outbox_relay_transaction_open_seconds").unwrap_or(0.0);
    ensure!(
        open >= 4.0,
        "outbox_relay_transaction_open_seconds = {open}"
    );
    // The abort itself fails while no broker answers, or the commit times out with its outcome
    // unknown; the next producer's InitProducerId (or the coordinator's timeout) then ends it.
    wait_until(
        "the relay to abort its transaction",
        RELAY_WAIT,
        Duration::from_millis(200),
        async || {
            let text = relay.stderr_text();
            let ended = text.contains("transaction aborted")
                || text.contains("aborting the transaction")
                || text.contains("the transaction's outcome is unknown");
            Ok(ended.then_some(()))
        },
    )
    .await?;
    kafka.start()?;
    finish(&world, &topics, &keys, &relay).await?;
    Ok(())
}

/// `prune` never passes the committed point: killed (-9) while a Kafka transaction holds
/// acknowledged but uncommitted records of a large source transaction, the relay has mirrored
/// only the last committed point to the state table, and `prune` deletes nothing (the rows
/// after that point are not visible to read_committed consumers). After a restart that commits
/// everything and a graceful stop, `prune` deletes every old row, each of them visible.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_never_deletes_past_the_committed_point() -> Result<()> {
    // Small batches, so the 30,000-row transaction below takes seconds to relay and the kill
    // lands while its Kafka transaction is open.
    let port = free_local_port()?;
    let world = eos_world_with("eos_prune", 100_000, |w| {
        w.spec.http_listen = Some(format!("127.0.0.1:{port}"));
        // Records stamped with the commit time: with `timestamp = "column"` the rows backdated
        // 10 days below would be past the broker's 7-day retention, and a segment roll would
        // let Kafka delete them before the test reads them.
        w.spec.timestamp = Some("commit".into());
        slow_batches(w, 200, 20);
    })
    .await?;
    let topics = vec![world.topic("Order")];
    let mut gen = RowGen::new(&world.uid, "q", 20);
    let mut conn = world.db.conn().await?;
    let old = |rows: &mut Vec<outbox_relay_testkit::OutboxRow>| {
        for r in rows.iter_mut() {
            r.created_at_micros -= 10 * 86_400_000_000;
        }
    };
    let mut first = gen.rows(200);
    old(&mut first);
    commit_rows(&mut conn, &first).await?;
    let relay = world.spawn()?;
    let first_keys: Vec<String> = first.iter().map(|r| r.event_key.clone()).collect();
    finish_keys(&world, &topics, &first_keys, &relay).await?;
    // One source transaction of 30,000 rows: one Kafka transaction, committed at its end.
    let mut big = gen.rows(30_000);
    old(&mut big);
    commit_in_one_transaction(&mut conn, &big).await?;
    // Kafka has acknowledged 3,000 of its records (inside the open Kafka transaction).
    let series = format!(
        "outbox_relay_records_produced_total{{topic=\"{}\"}}",
        topics[0]
    );
    wait_until(
        "3,200 records acknowledged",
        RELAY_WAIT,
        Duration::from_millis(20),
        async || {
            relay.ensure_running()?;
            let (_, page) = http_get(port, "/metrics").await?;
            Ok(metric(&page, &series).filter(|n| *n >= 3_200.0))
        },
    )
    .await?;
    relay.kill9()?;
    let committed = read_committed_records(&world.spec.bootstrap_servers, &topics, READ_ALL)
        .await?
        .len();
    ensure!(
        committed == 200,
        "{committed} records committed at the kill: expected only the first 200 (the large \
         transaction's Kafka transaction open)"
    );
    // The state table mirrors a committed point only: at or before the last one.
    let progress = progress_records(&world).await?;
    let last = progress.last().context("no progress record")?;
    let mirrored = world.checkpoint().await?;
    let committed_point = (
        last["binlog_file"].as_str().unwrap_or_default().to_owned(),
        last["binlog_pos"].as_u64().unwrap_or_default(),
        last["rows_acked"].as_u64().unwrap_or_default(),
    );
    ensure!(
        (
            mirrored.binlog_file.clone(),
            mirrored.binlog_pos,
            mirrored.rows_acked
        ) <= committed_point,
        "the state table holds {}:{} (+{}), ahead of the last committed point {last}",
        mirrored.binlog_file,
        mirrored.binlog_pos,
        mirrored.rows_acked
    );
    let count = async |conn: &mut Conn| -> Result<u64> {
        use outbox_relay_testkit::mysql_async::prelude::Queryable;
        Ok(conn
            .query_first("SELECT COUNT(*) FROM outbox")
            .await?
            .unwrap_or(0))
    };
    let prune = async || -> Result<(Option<i32>, String)> {
        let p = RelayProcess::spawn_args(
            bin(),
            &[
                "prune",
                "--yes",
                "--older-than",
                "7d",
                "--max-wait-ms",
                "1500",
                "--config",
            ],
            &world.spec.to_toml(),
            &[],
        )?;
        let status = p.wait_exit(STOP).await?;
        Ok((
            status.code(),
            format!("{}{}", p.stdout_text(), p.stderr_text()),
        ))
    };
    let (code, out) = prune().await?;
    ensure!(
        code == Some(1) && count(&mut conn).await? == 30_200,
        "prune with uncommitted rows: exit {code:?}, {} rows left\n{out}",
        count(&mut conn).await?
    );
    let relay = world.spawn()?;
    let keys: Vec<String> = first_keys
        .into_iter()
        .chain(big.iter().map(|r| r.event_key.clone()))
        .collect();
    finish(&world, &topics, &keys, &relay).await?;
    let (code, out) = prune().await?;
    ensure!(
        code == Some(0) && count(&mut conn).await? == 0,
        "prune after the commit: exit {code:?}, {} rows left\n{out}",
        count(&mut conn).await?
    );
    Ok(())
}

/// The state table follows the progress topic while the relay runs, also when it goes idle
/// right after a commit: a commit within `checkpoint_interval_ms` of the previous state-table
/// write is mirrored by a later checkpoint tick, not left behind until the next commit (which
/// an idle relay never makes; `status` and `prune` read the table).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_relay_mirrors_its_last_commit_to_the_state_table() -> Result<()> {
    let world = eos_world_with("eos_idle_mirror", 1000, |w| {
        w.spec.checkpoint_interval_ms = 3000;
    })
    .await?;
    let topics = vec![world.topic("Order")];
    let mut gen = RowGen::new(&world.uid, "m", 3);
    let mut conn = world.db.conn().await?;
    let relay = world.spawn()?;
    let from = outbox_relay_testkit::current_binlog_position(&mut conn).await?;
    let mut keys = Vec::new();
    // Two commits well within one checkpoint interval: the second is not mirrored at once.
    commit_more(&mut conn, &mut gen, 2, &mut keys).await?;
    finish_keys(&world, &topics, &keys, &relay).await?;
    let rows = gen.rows(2);
    keys.extend(rows.iter().map(|r| r.event_key.clone()));
    let gtid = commit_rows(&mut conn, &rows).await?;
    finish_keys(&world, &topics, &keys, &relay).await?;
    let tx = outbox_relay_testkit::find_transaction(&mut conn, &from, &gtid)
        .await?
        .context("the second transaction is not in the binlog")?;
    // Nothing more is written to the outbox: the relay is idle from here on.
    world
        .wait_checkpoint_covers(&relay, &tx.end, Duration::from_secs(60))
        .await?;
    stop_cleanly(&relay).await?;
    ensure_each_once(&world, &topics, &keys).await?;
    Ok(())
}

/// The private broker of the transaction-timeout tests (`EOS_TXN_KAFKA_PORT`, default 9572, its
/// controller on the next port): the coordinator looks for expired transactions every 500 ms
/// (`transaction.abort.timed.out.transaction.cleanup.interval.ms`, 10 s by default) and accepts
/// transaction timeouts up to 90 s (`transaction.max.timeout.ms`; the default 60 s fits). Returns it and its address.
fn txn_broker() -> Result<(std::sync::Arc<PrivateService>, String)> {
    let port: u16 = std::env::var("EOS_TXN_KAFKA_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(9572);
    let props = "transaction.abort.timed.out.transaction.cleanup.interval.ms=500\n\
                 transaction.max.timeout.ms=90000";
    let kafka = PrivateService::acquire(
        ServiceSpec::kafka(
            "eos-txn-kafka",
            port,
            vec![("KAFKA_EXTRA_PROPS".into(), props.into())],
        ),
        |_| Ok(()),
    )?;
    Ok((kafka, format!("127.0.0.1:{port}")))
}

/// The relay is stopped (SIGSTOP) with a Kafka transaction open for longer than its
/// `transaction_timeout_ms`: the coordinator aborts that transaction and bumps the epoch, and
/// after SIGCONT the relay, still holding its lease, sees the fencing as its own expired
/// transaction: a new producer resumes from the last committed point, the process never
/// exits, and every row written before, during and after the stall is visible once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_past_the_transaction_timeout_does_not_stop_the_relay() -> Result<()> {
    let (_kafka, bootstrap) = txn_broker()?;
    let world = eos_world_with("eos_stall", 10_000_000, |w| {
        w.spec.bootstrap_servers = bootstrap.clone();
        w.spec
            .kafka_extra
            .push_str("transaction_timeout_ms = 3000\n");
        // ~200 records/s: the backlog below keeps a transaction open for seconds.
        slow_batches(w, 20, 100);
    })
    .await?;
    let topics = vec![world.topic("Order")];
    let mut gen = RowGen::new(&world.uid, "s", 10);
    let mut conn = world.db.conn().await?;
    let mut keys = Vec::new();
    // Before: a backlog of small source transactions.
    for _ in 0..60 {
        commit_more(&mut conn, &mut gen, 50, &mut keys).await?;
    }
    let relay = world.spawn()?;
    wait_visible(&world, &topics, 200, &relay).await?;
    let marker = "its own transaction expired";
    let mut stalls = 0;
    while !relay.stderr_text().contains(marker) {
        stalls += 1;
        ensure!(
            stalls <= 3,
            "three stalls did not catch an open transaction\n{}",
            relay.stderr_tail()
        );
        let before = visible(&world, &topics).await?;
        relay.pause()?;
        // During: rows committed while the relay is stopped.
        commit_more(&mut conn, &mut gen, 20, &mut keys).await?;
        // The coordinator aborts the open transaction (its marker moves the last stable
        // offset), or a commit that was on its way completes.
        let moved = wait_until(
            "the stalled relay's open transaction to end",
            Duration::from_secs(20),
            Duration::from_millis(100),
            async || Ok((visible(&world, &topics).await? > before).then_some(())),
        )
        .await;
        relay.resume()?;
        if moved.is_err() {
            continue; // no transaction was open on the coordinator: stall again
        }
        // The relay notices at its next request of the old epoch.
        let _ = wait_for_stderr(&relay, marker, Duration::from_secs(15)).await;
        relay.ensure_running()?;
    }
    // After: rows committed once the relay goes on.
    for _ in 0..5 {
        commit_more(&mut conn, &mut gen, 10, &mut keys).await?;
    }
    finish(&world, &topics, &keys, &relay).await?;
    let stderr = relay.stderr_text();
    ensure!(
        !stderr.contains("this instance stops"),
        "the relay meant to stop:\n{}",
        relay.stderr_tail()
    );
    Ok(())
}

/// An exactly-once relay whose first start cannot reach Kafka (nothing listens on its
/// bootstrap port) stores its start position at once, as at-least-once does: rows committed
/// while Kafka is unreachable are relayed, each exactly once, when the relay runs with a
/// reachable broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_start_without_kafka_keeps_its_start_position() -> Result<()> {
    let mut world = World::new(bin(), "eos_first").await?;
    world.spec.kafka_extra = format!(
        "delivery = \"exactly_once\"\nprogress_topic = \"t_{}.progress\"\n\
         transaction_interval_ms = 50\n",
        world.uid
    );
    let reachable = world.spec.bootstrap_servers.clone();
    let mut unreachable = world.spec.clone();
    unreachable.bootstrap_servers = format!("127.0.0.1:{}", free_local_port()?);
    // The retries of an unreachable Kafka are DEBUG lines (its state line is the WARN one).
    let relay = RelayProcess::spawn(
        &world.binary,
        &unreachable.to_toml(),
        &[("RUST_LOG", "info,outbox_relay_engine::supervisor=debug")],
    )?;
    wait_for_stderr(&relay, "Kafka still unreachable; retrying", RELAY_WAIT).await?;
    let stored = world
        .checkpoint()
        .await
        .context("no position stored by the first start (rows committed now would be skipped)")?;
    eprintln!(
        "first start stored {}:{}",
        stored.binlog_file, stored.binlog_pos
    );
    let topics = vec![world.topic("Order")];
    let mut gen = RowGen::new(&world.uid, "u", 4);
    let mut conn = world.db.conn().await?;
    let mut keys = Vec::new();
    for _ in 0..4 {
        commit_more(&mut conn, &mut gen, 5, &mut keys).await?;
    }
    stop_cleanly(&relay).await?;
    world.spec.bootstrap_servers = reachable;
    let relay = world.spawn()?;
    commit_more(&mut conn, &mut gen, 5, &mut keys).await?;
    let records = finish(&world, &topics, &keys, &relay).await?;
    ensure!(
        records.len() == keys.len(),
        "{} records for {} rows",
        records.len(),
        keys.len()
    );
    Ok(())
}

/// `kafka.transaction_timeout_ms` over the brokers' `transaction.max.timeout.ms`: `check`
/// fails naming both values (and reports the cluster's `transaction.version` and what it means
/// for the relay), and `run` stops with exit code 3 naming the setting, the limit and the fix
/// instead of retrying forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_timeout_over_the_brokers_limit_is_named() -> Result<()> {
    let (_kafka, bootstrap) = txn_broker()?;
    let mut world = World::new(bin(), "eos_txn_max").await?;
    world.spec.bootstrap_servers = bootstrap;
    world.spec.kafka_extra = format!(
        "delivery = \"exactly_once\"\nprogress_topic = \"t_{}.progress\"\n\
         transaction_timeout_ms = 120000\n",
        world.uid
    );
    let check =
        RelayProcess::spawn_args(bin(), &["check", "--config"], &world.spec.to_toml(), &[])?;
    let status = check.wait_exit(STOP).await?;
    let out = check.stdout_text();
    ensure!(
        !status.success(),
        "check passed with a timeout over the limit:\n{out}"
    );
    for line in [
        "FAIL  kafka.transaction_timeout_ms: expected at most the brokers' \
         transaction.max.timeout.ms (90000), found kafka.transaction_timeout_ms = 120000",
        "OK    transaction.version: ",
    ] {
        ensure!(out.contains(line), "{line:?} not in:\n{out}");
    }
    ensure!(
        out.lines()
            .any(|l| l.starts_with("OK    transaction.version: ") && l.contains("KIP-890")),
        "transaction.version is not explained:\n{out}"
    );
    let relay = world.spawn()?;
    let status = relay.wait_exit(Duration::from_secs(60)).await?;
    let stderr = relay.stderr_text();
    ensure!(
        status.code() == Some(3),
        "expected exit code 3, got {}\n{}",
        describe_exit(&status),
        relay.stderr_tail()
    );
    for needle in [
        "kafka.transaction_timeout_ms",
        "transaction.max.timeout.ms (90000)",
        "120000",
        "Fix: set kafka.transaction_timeout_ms to 90000 or less",
    ] {
        ensure!(
            stderr.contains(needle),
            "{needle:?} not in the error:\n{}",
            relay.stderr_tail()
        );
    }
    Ok(())
}

/// A commit whose EndTxn answer is lost (librdkafka has no KIP-890, so its outcome is unknown):
/// the relay and the test's readers reach a private broker (`EOS_ENDTXN_KAFKA_PORT`, default
/// 9582, its controller on the next port) only through a Kafka-aware proxy on the port after
/// that, which the broker advertises; the proxy drops the answer to one EndTxn request (API key
/// 26). The relay builds a new producer at once, learns from the progress topic that the commit
/// happened, goes on after it without exiting, and every row is visible once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_answer_is_lost_is_resolved_from_the_progress_topic() -> Result<()> {
    use outbox_relay_testkit::{KafkaFault, TcpProxy, END_TXN};
    let port: u16 = std::env::var("EOS_ENDTXN_KAFKA_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(9582);
    let listen = format!("127.0.0.1:{}", port + 2);
    let proxy = TcpProxy::start_kafka(&listen, format!("127.0.0.1:{port}")).await?;
    let _kafka = tokio::task::spawn_blocking(move || {
        PrivateService::acquire(
            ServiceSpec::kafka(
                "eos-endtxn-kafka",
                port,
                vec![("KAFKA_ADVERTISED_PORT".into(), (port + 2).to_string())],
            ),
            |_| Ok(()),
        )
    })
    .await??;
    let world = eos_world_with("eos_endtxn", 1000, |w| {
        w.spec.bootstrap_servers = listen.clone();
        // commit_transaction gives up after max(this, 10 s): the lost answer's wait.
        w.spec.kafka_extra.push_str(
            "transaction_timeout_ms = 10000
",
        );
    })
    .await?;
    let topics = vec![world.topic("Order")];
    let mut gen = RowGen::new(&world.uid, "e", 5);
    let mut conn = world.db.conn().await?;
    let mut keys = Vec::new();
    commit_more(&mut conn, &mut gen, 10, &mut keys).await?;
    let relay = world.spawn()?;
    finish_keys(&world, &topics, &keys, &relay).await?;
    proxy.arm_kafka_fault(END_TXN, KafkaFault::Drop);
    commit_more(&mut conn, &mut gen, 10, &mut keys).await?;
    wait_until(
        "the answer to an EndTxn request to be dropped",
        RELAY_WAIT,
        Duration::from_millis(50),
        async || {
            relay.ensure_running()?;
            Ok((proxy.kafka_faults_fired() > 0).then_some(()))
        },
    )
    .await?;
    wait_for_stderr(&relay, "the commit whose outcome was unknown", RELAY_WAIT).await?;
    for _ in 0..3 {
        commit_more(&mut conn, &mut gen, 5, &mut keys).await?;
    }
    finish(&world, &topics, &keys, &relay).await?;
    ensure!(
        relay
            .stderr_text()
            .contains("the commit whose outcome was unknown had happened"),
        "the relay did not learn that the commit happened:\n{}",
        relay.stderr_tail()
    );
    Ok(())
}
