//! Bounded retries and clean stops against the real servers: with Kafka unreachable every
//! failed attempt counts (`retry.max_attempts`), the backoff grows, and the relay gives up
//! after the last attempt; a stop (SIGTERM) while Kafka is unreachable, at start-up or with
//! records in flight, exits 0 within a bounded time and leaves the last checkpoint whose
//! records Kafka acknowledged; the next start sends what was not acknowledged.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use outbox_relay_testkit::{
    collect_records, commit_rows, compare_positions, current_binlog_position, ensure_at_least_once,
    expect_exit_code, free_local_port, http_get, metric, read_all_records, wait_for_status,
    wait_for_stderr, wait_until, PrivateService, RelayProcess, RowGen, ServiceSpec, TcpProxy,
    World,
};

/// The relay binary under test (built on first use).
fn bin() -> &'static str {
    outbox_relay_testkit::relay_bin()
}
const WAIT: Duration = Duration::from_secs(90);

/// The log filter that shows the supervisor's retries of an unreachable Kafka (DEBUG lines:
/// its state line is the WARN one).
const RETRIES_SHOWN: (&str, &str) = ("RUST_LOG", "info,outbox_relay_engine::supervisor=debug");

/// `retry_in_ms` of every "retrying" line of `stderr`, in order.
fn retry_delays(stderr: &str) -> Vec<u64> {
    stderr
        .lines()
        .filter(|l| l.contains("; retrying"))
        .filter_map(|l| {
            let v = l.split("retry_in_ms=").nth(1)?;
            v.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
        })
        .collect()
}

/// With Kafka unreachable at start-up, each failed attempt counts (an attempt that never
/// streams is a failure however long its wait for a broker took), the delay grows, and with
/// `max_attempts = 3` the relay exits 1 after the third failure, naming Kafka.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_kafka_attempts_are_counted_and_bounded() -> Result<()> {
    let mut w = World::new(bin(), "retry_bound").await?;
    w.spec.bootstrap_servers = format!("127.0.0.1:{}", free_local_port()?); // nothing listens
    w.spec.initial_backoff_ms = 100;
    w.spec.max_backoff_ms = 10_000;
    w.spec.retry_extra = "max_attempts = 3\n".into();
    let relay = RelayProcess::spawn(&w.binary, &w.spec.to_toml(), &[RETRIES_SHOWN])?;
    let status = relay.wait_exit(WAIT).await?;
    expect_exit_code(status, 1, &relay)?;
    let stderr = relay.stderr_text();
    for n in 1..=2 {
        ensure!(
            stderr.contains(&format!("attempt={n}")),
            "no retry logged as attempt {n}:\n{stderr}"
        );
    }
    ensure!(
        !stderr.contains("attempt=3"),
        "the third failure must end the relay, not schedule a fourth attempt:\n{stderr}"
    );
    let delays = retry_delays(&stderr);
    ensure!(
        delays.len() == 2 && delays[1] > delays[0],
        "the backoff must grow between consecutive failures: {delays:?}\n{stderr}"
    );
    let last = stderr
        .lines()
        .rev()
        .find(|l| l.contains("ERROR"))
        .unwrap_or("");
    ensure!(
        last.contains("Kafka") && last.contains("advertised.listeners"),
        "the final error names Kafka and what to check: {last}"
    );
    ensure!(
        stderr.contains(
            "giving up after 3 consecutive failed attempts (retry.max_attempts = 3; 0 retries \
             without end)"
        ),
        "no line says why the relay gives up:\n{stderr}"
    );
    w.db.drop_database().await?;
    Ok(())
}

/// Kafka unreachable (issue 31): one WARN line when no broker answers (the brokers tried, the
/// class of error, what to check), none more while the attempts go on failing, one INFO line
/// when Kafka answers again (a proxy to the test broker starts listening at that address;
/// the shared broker is never stopped), and the relay streams. librdkafka's own lines stay at
/// DEBUG: none at WARN or above, and none of rdkafka's default context.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_unreachable_is_said_once_per_change_of_state() -> Result<()> {
    let mut w = World::new(bin(), "retry_state").await?;
    let port = free_local_port()?; // nothing listens, until the proxy does
    let http = free_local_port()?;
    w.spec.bootstrap_servers = format!("127.0.0.1:{port}");
    w.spec.http_listen = Some(format!("127.0.0.1:{http}"));
    w.spec.initial_backoff_ms = 100;
    w.spec.max_backoff_ms = 500;
    let relay = w.spawn()?;
    wait_for_stderr(&relay, "Kafka unreachable: no broker of", WAIT).await?;
    // At least one more attempt fails while Kafka stays unreachable.
    wait_until(
        "a failed attempt",
        WAIT,
        Duration::from_millis(200),
        async || {
            let (_, page) = http_get(http, "/metrics").await?;
            Ok(
                metric(&page, "outbox_relay_reconnects_total{cause=\"kafka\"}")
                    .is_some_and(|n| n >= 1.0)
                    .then_some(()),
            )
        },
    )
    .await?;
    let _proxy = TcpProxy::start_kafka(
        &format!("127.0.0.1:{port}"),
        outbox_relay_testkit::kafka_bootstrap(),
    )
    .await?;
    wait_for_stderr(&relay, "Kafka reachable again", WAIT).await?;
    let mut conn = w.db.conn().await?;
    let rows = RowGen::new(&w.uid, "back", 1).rows(1);
    commit_rows(&mut conn, &rows).await?;
    let keys: HashSet<String> = rows.iter().map(|r| r.event_key.clone()).collect();
    w.wait_for_keys(
        &[w.topic(&rows[0].aggregate_type)],
        &keys,
        Some(&relay),
        WAIT,
    )
    .await?;
    expect_exit_code(relay.stop(WAIT).await?, 0, &relay)?;

    let stderr = relay.stderr_text();
    let lines = |needle: &str| stderr.lines().filter(|l| l.contains(needle)).count();
    ensure!(
        lines("Kafka unreachable:") == 1 && lines("Kafka reachable again") == 1,
        "one line per change of state:\n{stderr}"
    );
    let down = stderr
        .lines()
        .find(|l| l.contains("Kafka unreachable:"))
        .unwrap_or_default();
    for needle in [
        " WARN ",
        &format!("no broker of 127.0.0.1:{port} answers (connection refused: nothing listens"),
        "advertised.listeners",
        "security.protocol",
        "error_class=\"connection_refused\"",
        &format!("brokers=127.0.0.1:{port}"),
    ] {
        ensure!(down.contains(needle), "{needle:?} not in: {down}");
    }
    let up = stderr
        .lines()
        .find(|l| l.contains("Kafka reachable again"))
        .unwrap_or_default();
    ensure!(
        up.contains(" INFO ") && up.contains(&format!("127.0.0.1:{port} answered after")),
        "{up}"
    );
    for quiet in [
        " WARN librdkafka",
        " ERROR librdkafka",
        "rdkafka::client",
        "relay interrupted; retrying",
    ] {
        ensure!(lines(quiet) == 0, "{quiet:?} logged:\n{stderr}");
    }
    drop(conn);
    w.db.drop_database().await
}

/// A stop while Kafka is unreachable (the relay waiting for a broker before it streams) exits
/// 0 at once; the stored checkpoint is the one the previous run left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_while_kafka_is_unreachable_exits_0_at_once() -> Result<()> {
    let mut w = World::new(bin(), "retry_stop").await?;
    let (relay, _) = w.start(WAIT).await?;
    let mut conn = w.db.conn().await?;
    let mut gen = RowGen::new(&w.uid, "stop", 2);
    commit_rows(&mut conn, &gen.rows(3)).await?;
    let end = current_binlog_position(&mut conn).await?;
    w.wait_checkpoint_covers(&relay, &end, WAIT).await?;
    expect_exit_code(relay.stop(WAIT).await?, 0, &relay)?;
    let before = w.checkpoint().await?;

    w.spec.bootstrap_servers = format!("127.0.0.1:{}", free_local_port()?);
    // Retry at once, so the stop lands while the next attempt waits for a broker.
    w.spec.initial_backoff_ms = 1;
    // The retries of an unreachable Kafka are DEBUG lines (its state line is the WARN one).
    let relay = RelayProcess::spawn(
        &w.binary,
        &w.spec.to_toml(),
        &[("RUST_LOG", "info,outbox_relay_engine::supervisor=debug")],
    )?;
    wait_for_stderr(&relay, "Kafka still unreachable; retrying", WAIT).await?;
    let asked = Instant::now();
    let status = relay.stop(WAIT).await?;
    let took = asked.elapsed();
    expect_exit_code(status, 0, &relay)?;
    ensure!(
        took < Duration::from_secs(5),
        "the stop took {took:?}\n{}",
        relay.stderr_tail()
    );
    let after = w.checkpoint().await?;
    ensure!(
        after.position() == before.position() && after.rows_acked == before.rows_acked,
        "the checkpoint moved: {before:?} -> {after:?}"
    );
    drop(conn);
    w.db.drop_database().await?;
    Ok(())
}

/// A Kafka broker of this test binary alone, which a test stops under a running relay
/// (`RETRY_KAFKA_PORT`, default 9792, and the next port for its controller).
fn private_kafka() -> Result<(Arc<PrivateService>, String)> {
    let port: u16 = std::env::var("RETRY_KAFKA_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(9792);
    let spec = ServiceSpec::kafka("retry-kafka", port, Vec::new());
    Ok((
        PrivateService::acquire(spec, |_| Ok(()))?,
        format!("127.0.0.1:{port}"),
    ))
}

/// Kafka goes away while no rows flow: `/readyz` turns not ready within `http.ready_kafka_ms`
/// and ready again when Kafka is back. Then Kafka goes away while records are in flight; a stop
/// waits `retry.stop_timeout_ms` for acknowledgements, exits 0 and leaves the checkpoint at the
/// last acknowledged transaction. With Kafka back, the next start delivers every row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_down_is_seen_by_readyz_and_bounds_a_stop_that_loses_nothing() -> Result<()> {
    let (kafka, bootstrap) = private_kafka()?;
    let mut w = World::new(bin(), "retry_inflight").await?;
    let port = free_local_port()?;
    w.spec.bootstrap_servers = bootstrap.clone();
    w.spec.http_listen = Some(format!("127.0.0.1:{port}"));
    w.spec.retry_extra = "stop_timeout_ms = 3000\n".into();
    w.spec.http_extra = "ready_kafka_ms = 3000\n".into();
    let topic = w.topic("Order");
    let (relay, _) = w.start(WAIT).await?;
    let mut conn = w.db.conn().await?;
    let mut gen = RowGen::new(&w.uid, "inflight", 3);
    let first = gen.rows(5);
    commit_rows(&mut conn, &first).await?;
    let acked_end = current_binlog_position(&mut conn).await?;
    collect_records(&bootstrap, std::slice::from_ref(&topic), first.len(), WAIT).await?;
    w.wait_checkpoint_covers(&relay, &acked_end, WAIT).await?;

    // Idle: no records are sent, yet readiness follows Kafka.
    wait_for_status(&relay, port, "/readyz", 200, WAIT).await?;
    kafka.stop()?;
    let down = Instant::now();
    let reason = wait_for_status(&relay, port, "/readyz", 503, WAIT).await?;
    ensure!(
        reason.contains("Kafka unreachable for ") && reason.contains("http.ready_kafka_ms = 3000"),
        "{reason}"
    );
    // The bound (3 s), plus at most one probe interval (1 s) and the script's stop.
    ensure!(
        down.elapsed() < Duration::from_secs(20),
        "{:?}",
        down.elapsed()
    );
    kafka.start()?;
    wait_for_status(&relay, port, "/readyz", 200, WAIT).await?;

    kafka.stop()?;
    let before_second = current_binlog_position(&mut conn).await?;
    let second = gen.rows(5);
    commit_rows(&mut conn, &second).await?;
    wait_until(
        "the second transaction's records to be in flight",
        WAIT,
        Duration::from_millis(100),
        async || {
            relay.ensure_running()?;
            let (_, page) = http_get(port, "/metrics").await?;
            Ok(metric(&page, "outbox_relay_records_in_flight")
                .is_some_and(|n| n >= 5.0)
                .then_some(()))
        },
    )
    .await?;
    let asked = Instant::now();
    let status = relay.stop(WAIT).await?;
    let took = asked.elapsed();
    expect_exit_code(status, 0, &relay)?;
    ensure!(
        took >= Duration::from_secs(3) && took < Duration::from_secs(20),
        "the stop took {took:?}: it waits stop_timeout_ms (3 s) for Kafka, then exits\n{}",
        relay.stderr_tail()
    );
    ensure!(
        relay
            .stderr_text()
            .contains("did not acknowledge the records in flight within retry.stop_timeout_ms"),
        "{}",
        relay.stderr_tail()
    );
    // Other tests' transactions may follow the first one: the checkpoint may pass them, never
    // the second transaction, whose records Kafka did not acknowledge.
    let cp = w.checkpoint().await?.position();
    ensure!(
        compare_positions(&mut conn, &cp, &acked_end).await?.is_ge()
            && compare_positions(&mut conn, &cp, &before_second)
                .await?
                .is_le(),
        "the checkpoint {cp} must lie between {acked_end} and {before_second}"
    );

    kafka.start()?;
    let relay = w.spawn()?;
    let all: HashSet<String> = first
        .iter()
        .chain(&second)
        .map(|r| r.event_key.clone())
        .collect();
    collect_records(&bootstrap, std::slice::from_ref(&topic), all.len(), WAIT)
        .await
        .with_context(|| relay.stderr_tail())?;
    expect_exit_code(relay.stop(WAIT).await?, 0, &relay)?;
    let records = read_all_records(&bootstrap, &[topic], WAIT).await?;
    ensure_at_least_once(&records, &all)?;
    drop(conn);
    w.db.drop_database().await?;
    Ok(())
}

/// The server ends the relay's binlog dump (its thread killed, as an operator or a failover
/// tool does): the relay says that the server closed or killed the connection, retries, and
/// the rows committed meanwhile arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dump_connection_the_server_closes_is_named_and_resumed() -> Result<()> {
    use mysql_async::prelude::*;

    let w = World::new(bin(), "retry_kill").await?;
    let (relay, _) = w.start(WAIT).await?;
    let mut conn = w.db.conn().await?;
    let mut gen = RowGen::new(&w.uid, "kill", 2);
    let topic = w.topic("Order");
    let before = gen.rows(2);
    commit_rows(&mut conn, &before).await?;
    collect_records(
        &w.spec.bootstrap_servers,
        std::slice::from_ref(&topic),
        2,
        WAIT,
    )
    .await?;
    // The relay's dump connection: the one binlog dump of this test's database.
    let dump: u64 = wait_until(
        "the relay's binlog dump thread",
        WAIT,
        Duration::from_millis(100),
        async || {
            Ok(conn
                .exec_first::<u64, _, _>(
                    "SELECT ID FROM information_schema.PROCESSLIST \
                 WHERE COMMAND LIKE 'Binlog Dump%' AND DB = ?",
                    (w.db.name(),),
                )
                .await?)
        },
    )
    .await?;
    conn.query_drop(format!("KILL {dump}")).await?;
    let stderr = wait_for_stderr(&relay, "relay interrupted; retrying", WAIT).await?;
    let line = stderr
        .lines()
        .find(|l| l.contains("relay interrupted; retrying"))
        .unwrap_or_default();
    ensure!(
        ["killed", "closed the connection", "ended the binlog dump"]
            .iter()
            .any(|s| line.contains(s)),
        "the retry does not say that the server ended the dump: {line}"
    );
    let after = gen.rows(2);
    commit_rows(&mut conn, &after).await?;
    let all: HashSet<String> = before
        .iter()
        .chain(&after)
        .map(|r| r.event_key.clone())
        .collect();
    w.wait_for_keys(std::slice::from_ref(&topic), &all, Some(&relay), WAIT)
        .await?;
    expect_exit_code(relay.stop(WAIT).await?, 0, &relay)?;
    drop(conn);
    w.db.drop_database().await?;
    Ok(())
}
