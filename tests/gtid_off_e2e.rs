//! MySQL 8.0 with GTIDs off (`gtid_mode=OFF`, still common on older fleets): the relay streams,
//! stores a file/position checkpoint without a GTID set, and after kill -9 resumes from that
//! position with nothing lost.
//!
//! The test starts a private MySQL 8.0 with `SERVER_GTID=OFF` (`tests/services/server.sh mysql8`,
//! on 127.0.0.1:3396 or `GTID_OFF_MYSQL_PORT`, data under `.services/private/`), so the shared
//! server keeps its GTIDs. MariaDB has no such mode (every MariaDB transaction has a GTID): on
//! the MariaDB runs the test says so and checks nothing.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{ensure, Result};
use mysql_async::prelude::*;
use outbox_relay_testkit::{
    collect_records, insert_outbox_rows, mysql_async, next_server_id, read_checkpoint,
    recent_created_at_base, test_server, unique_suffix, InsertStyle, OutboxRow, PrivateService,
    RelayConfigSpec, RelayProcess, ServiceSpec, TestDb, DEFAULT_CHECKPOINT_TABLE,
};

/// The relay binary under test (built on first use).
fn bin() -> &'static str {
    outbox_relay_testkit::relay_bin()
}
const STARTUP: Duration = Duration::from_secs(60);
const RELAY_WAIT: Duration = Duration::from_secs(120);
const STOP: Duration = Duration::from_secs(30);

fn rows(uid: &str, from: usize, n: usize) -> Vec<OutboxRow> {
    let base = recent_created_at_base();
    (from..from + n)
        .map(|i| OutboxRow {
            aggregate_type: "Order".into(),
            aggregate_id: format!("o-{}", i % 7),
            event_type: "OrderCreated".into(),
            event_key: format!("{uid}-{i}"),
            payload: format!("{{\"n\": {i}}}"),
            created_at_micros: base + i as i64,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_without_gtids_resumes_by_file_and_position_after_kill_9() -> Result<()> {
    if !test_server().is_mysql() {
        eprintln!(
            "not on {}: MariaDB always logs GTIDs (there is no gtid_mode=OFF to test)",
            test_server()
        );
        return Ok(());
    }
    let port: u16 = std::env::var("GTID_OFF_MYSQL_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3396);
    let _server = PrivateService::acquire(
        ServiceSpec {
            name: "mysql8-gtid-off".into(),
            script: "server.sh".into(),
            args: vec!["mysql8".into()],
            env: vec![
                ("MYSQL8_PORT".into(), port.to_string()),
                ("SERVER_GTID".into(), "OFF".into()),
            ],
        },
        |_| Ok(()),
    )?;
    let db = TestDb::create_on(&format!("mysql://root@127.0.0.1:{port}"), "gtidoff").await?;
    let mut conn = db.conn().await?;
    let mode: Option<String> = conn.query_first("SELECT @@GLOBAL.gtid_mode").await?;
    ensure!(mode.as_deref() == Some("OFF"), "gtid_mode is {mode:?}");

    let uid = unique_suffix();
    let connector = format!("gtidoff-{uid}");
    let spec = RelayConfigSpec::new(&db, &connector, next_server_id(), &format!("g_{uid}"));
    let relay = RelayProcess::spawn(bin(), &spec.to_toml(), &[])?;
    relay
        .wait_for_checkpoint_row(db.pool(), &connector, STARTUP)
        .await?;
    let first = rows(&uid, 0, 20);
    for chunk in first.chunks(5) {
        let mut tx = conn
            .start_transaction(mysql_async::TxOpts::default())
            .await?;
        insert_outbox_rows(&mut tx, "outbox", chunk, InsertStyle::MultiRow).await?;
        tx.commit().await?;
    }
    let topic = spec.topic_for("Order");
    collect_records(
        &spec.bootstrap_servers,
        std::slice::from_ref(&topic),
        first.len(),
        RELAY_WAIT,
    )
    .await?;
    // The checkpoint of a server without GTIDs is a file and position only.
    let cp = outbox_relay_testkit::wait_until(
        "a checkpoint past the first rows",
        RELAY_WAIT,
        Duration::from_millis(100),
        async || {
            let cp = read_checkpoint(db.pool(), DEFAULT_CHECKPOINT_TABLE, &connector).await?;
            Ok(cp.filter(|c| c.binlog_pos > 4))
        },
    )
    .await?;
    ensure!(
        cp.gtid_set.as_deref().unwrap_or("").is_empty(),
        "a checkpoint with GTIDs off holds no GTID set, got {:?}",
        cp.gtid_set
    );
    relay.kill9()?;

    // Rows committed while the relay is down arrive after the restart, from the stored position.
    let second = rows(&uid, 20, 15);
    insert_outbox_rows(&mut conn, "outbox", &second, InsertStyle::SingleRow).await?;
    let relay = RelayProcess::spawn(bin(), &spec.to_toml(), &[])?;
    let want: BTreeSet<String> = first
        .iter()
        .chain(&second)
        .map(|r| r.event_key.clone())
        .collect();
    let goal = want.clone();
    let records = outbox_relay_testkit::collect_until(
        &spec.bootstrap_servers,
        std::slice::from_ref(&topic),
        RELAY_WAIT,
        move |records| {
            let seen: BTreeSet<&str> = records
                .iter()
                .filter_map(|r| r.header("event_key"))
                .collect();
            goal.iter().all(|k| seen.contains(k.as_str()))
        },
    )
    .await?;
    let seen: BTreeSet<String> = records
        .iter()
        .filter_map(|r| r.header("event_key").map(str::to_owned))
        .collect();
    ensure!(
        seen == want,
        "after the restart: {} of {} event keys on Kafka; missing {:?}",
        seen.len(),
        want.len(),
        want.difference(&seen).collect::<Vec<_>>()
    );
    let status = relay.stop(STOP).await?;
    ensure!(status.success(), "relay exit: {status:?}");
    drop(conn);
    db.drop_database().await
}
