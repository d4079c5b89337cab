//! The state table against the test server of `OUTBOX_TEST_SERVER` (as the testkit names them): layouts larger than
//! an old `TEXT` `table_layouts` column stop the checkpoint write with the fix (instead of a
//! write that fails or is cut short at every retry), and `migrations/0002_checkpoint.sql` turns
//! the column into `MEDIUMTEXT`, after which the same checkpoint is stored and read back whole.

use mysql_async::prelude::Queryable;
use outbox_relay_core::config::TableName;
use outbox_relay_core::error::RelayError;
use outbox_relay_core::position::BinlogPosition;
use outbox_relay_core::state::checkpoint::{Checkpoint, CheckpointStore};
use outbox_relay_mysql::state::store::MysqlCheckpointStore;

/// The port of `OUTBOX_TEST_SERVER`'s server (`mariadb10`: `MARIADB_PORT` or 3306, `mariadb11`:
/// `MARIADB11_PORT` or 3316, `mysql8`: `MYSQL8_PORT` or 3326), as `crates/testkit`'s env.rs.
fn test_server_port() -> u16 {
    let (var, default) = match std::env::var("OUTBOX_TEST_SERVER").as_deref() {
        Ok("mariadb11") => ("MARIADB11_PORT", 3316),
        Ok("mysql8") => ("MYSQL8_PORT", 3326),
        _ => ("MARIADB_PORT", 3306),
    };
    std::env::var(var)
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(default)
}

const MIGRATION: &str = include_str!("../../../migrations/0002_checkpoint.sql");

#[tokio::test]
async fn layouts_beyond_the_column_stop_with_the_fix_and_fit_after_the_migration() {
    let port = test_server_port();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let db = format!("state_check_{}_{nanos}", std::process::id());
    let server = mysql_async::Pool::new(format!("mysql://root@127.0.0.1:{port}").as_str());
    let mut conn = server.get_conn().await.expect("test server reachable");
    conn.query_drop(format!("CREATE DATABASE {db}"))
        .await
        .expect("create database");
    let pool = mysql_async::Pool::new(format!("mysql://root@127.0.0.1:{port}/{db}").as_str());
    let mut c = pool.get_conn().await.expect("connect to the database");
    c.query_drop(MIGRATION).await.expect("0002 applies");
    // A state table of an older release: table_layouts as TEXT (64 KB).
    c.query_drop("ALTER TABLE outbox_relay_checkpoint MODIFY table_layouts TEXT NULL")
        .await
        .expect("alter to TEXT");
    c.query_drop(
        "INSERT INTO outbox_relay_checkpoint (connector_name, binlog_file, binlog_pos, \
         source_server_id, lease_token) VALUES ('big', 'bin.000001', 4, 1, 1)",
    )
    .await
    .expect("a row under lease token 1");

    let table = TableName::parse("outbox_relay_checkpoint", Some(&db)).expect("table name");
    let store = MysqlCheckpointStore::new(pool.clone(), table, "big".into()).fenced(1);
    store.verify().await.expect("the table is a state table");
    assert!(store.stores_layouts());
    // 1,000 tenants' layouts: about 90 KB of JSON.
    let layouts = format!(
        "{{{}}}",
        (0..1000)
            .map(|i| format!("\"tenant_{i:04}.outbox\":[\"id\",\"aggregate_type\",\"aggregate_id\",\"event_type\",\"payload\"]"))
            .collect::<Vec<_>>()
            .join(",")
    );
    assert!(layouts.len() > 65_535, "{} bytes", layouts.len());
    let checkpoint = Checkpoint {
        position: BinlogPosition::new("bin.000001", 1234),
        rows_acked: 0,
        gtid_set: None,
        source_server_id: 1,
        source_server_uuid: None,
        table_layouts: Some(layouts.as_str().into()),
    };
    match store.save(&checkpoint).await {
        Err(e @ RelayError::Prerequisite { .. }) => {
            let text = e.to_string();
            assert!(!e.is_retriable(), "{text}");
            assert!(
                text.contains("table_layouts")
                    && text.contains("MEDIUMTEXT")
                    && text.contains("65535"),
                "{text}"
            );
        }
        other => panic!("expected the prerequisite error, got {other:?}"),
    }

    // The migration upgrades the column; the same checkpoint then fits, whole.
    c.query_drop(MIGRATION).await.expect("0002 upgrades");
    let data_type: Option<String> = c
        .exec_first(
            "SELECT DATA_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND \
             TABLE_NAME = 'outbox_relay_checkpoint' AND COLUMN_NAME = 'table_layouts'",
            (&db,),
        )
        .await
        .expect("column type");
    assert_eq!(data_type.as_deref(), Some("mediumtext"));
    store.verify().await.expect("verify again");
    store
        .save(&checkpoint)
        .await
        .expect("stored after the migration");
    let loaded = store.load().await.expect("load").expect("a checkpoint");
    assert_eq!(loaded.table_layouts.as_deref(), Some(layouts.as_str()));
    assert_eq!(loaded.position.pos, 1234);

    drop(c);
    conn.query_drop(format!("DROP DATABASE {db}"))
        .await
        .expect("drop database");
    pool.disconnect().await.ok();
}
