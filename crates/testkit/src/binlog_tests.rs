//! `binlog.rs` against the live server: positions, events and checkpoints. Apart from
//! `binlog.rs` because they need `db` and `checkpoint`, which build on it.

use std::cmp::Ordering;

use anyhow::{Context, Result};
use mysql_async::prelude::*;

use crate::binlog::*;
use crate::checkpoint::{read_checkpoint, DEFAULT_CHECKPOINT_TABLE};
use crate::db::TestDb;
use crate::outbox::{insert_outbox_rows, InsertStyle, OutboxRow};

fn row(i: i64) -> OutboxRow {
    OutboxRow {
        aggregate_type: "Order".into(),
        aggregate_id: format!("o-{i}"),
        event_type: "OrderCreated".into(),
        event_key: format!("ek-{i}"),
        payload: format!("{{\"i\": {i}, \"note\":\"crème brûlée ✓ 🚀\"}}"),
        created_at_micros: 1_767_323_045_678_901 + i,
    }
}

/// Needs the test MariaDB (`tests/services/mariadb.sh up`).
#[tokio::test]
async fn test_db_migrations_binlog_boundaries_and_checkpoint_rows() -> Result<()> {
    let db = TestDb::create("tk_binlog").await?;
    let mut conn = db.conn().await?;

    // Both migrations are applied.
    let tables: Vec<String> = conn.query("SHOW TABLES").await?;
    assert!(tables.contains(&"outbox".to_owned()), "{tables:?}");
    assert!(
        tables.contains(&DEFAULT_CHECKPOINT_TABLE.to_owned()),
        "{tables:?}"
    );

    let before = current_binlog_position(&mut conn).await?;
    let rows: Vec<OutboxRow> = (0..3).map(row).collect();
    let mut tx = conn.start_transaction(Default::default()).await?;
    insert_outbox_rows(&mut tx, "outbox", &rows[..1], InsertStyle::SingleRow).await?;
    insert_outbox_rows(&mut tx, "outbox", &rows[1..], InsertStyle::MultiRow).await?;
    tx.commit().await?;
    let after = current_binlog_position(&mut conn).await?;

    // Payload text and created_at arrive unchanged.
    let stored: Vec<(String, String, String)> = conn
        .query("SELECT event_key, payload, CAST(created_at AS CHAR) FROM outbox ORDER BY id")
        .await?;
    for (r, (ek, payload, created)) in rows.iter().zip(&stored) {
        assert_eq!(&r.event_key, ek);
        assert_eq!(&r.payload, payload);
        assert_eq!(&r.created_at_text()?, created);
    }

    // The end of our transaction is a boundary (with and without a scan hint); the end of
    // its first event (GTID/BEGIN) is not; neither is a file that does not exist.
    assert_eq!(before.file, after.file, "binlog rotated during the test");
    assert!(is_transaction_boundary(&mut conn, &after.file, after.pos, Some(&before)).await?);
    assert!(is_transaction_boundary(&mut conn, &after.file, after.pos, None).await?);
    let events = binlog_events_from(&mut conn, &before, 100).await?;
    let first = events.first().context("no events after our position")?;
    assert!(!first.is_commit(), "{first:?}");
    assert!(
        !is_transaction_boundary(&mut conn, &after.file, first.end_log_pos, Some(&before)).await?
    );
    assert!(!is_transaction_boundary(&mut conn, "no-such-file.000001", 4, None).await?);
    assert_eq!(
        compare_positions(&mut conn, &before, &after).await?,
        Ordering::Less
    );

    // Checkpoint rows are read back.
    conn.exec_drop(
        "INSERT INTO outbox_relay_checkpoint (connector_name, binlog_file, binlog_pos, \
         source_server_id) VALUES (?, ?, ?, 1)",
        ("tk", &after.file, after.pos),
    )
    .await?;
    let cp = read_checkpoint(db.pool(), DEFAULT_CHECKPOINT_TABLE, "tk")
        .await?
        .context("checkpoint row missing")?;
    assert_eq!(cp.position(), after);
    assert_eq!(cp.gtid_set, None);
    assert!(
        read_checkpoint(db.pool(), DEFAULT_CHECKPOINT_TABLE, "other")
            .await?
            .is_none()
    );

    drop(conn);
    db.drop_database().await
}
