//! Event keys are compared byte for byte (`inbox/CONTRACT.md`, "Tables"): keys and aggregate
//! ids that differ only in case, accent or trailing spaces are distinct events, against the real
//! database (`OUTBOX_TEST_SERVER`, a database of its own) with the tables of
//! `migrations/0004_inbox.sql`.

use std::time::Duration;

use anyhow::Result;
use mysql_async::prelude::Queryable;
use mysql_async::Transaction;
use outbox_inbox::{Handler, HandlerError, Inbox, InboxConfig, InboxRecord, Outcome};
use outbox_relay_testkit::db::migrations_dir;
use outbox_relay_testkit::unique::unique_suffix;
use outbox_relay_testkit::{kafka_bootstrap, TestDb};

/// Keys that differ only in case, accent or trailing spaces.
const KEY_TWINS: [&str; 6] = ["evt-a1B", "evt-A1b", "café", "cafe", "k", "k "];

/// Inserts one `effects` row with the record's event key in the inbox's transaction.
struct Effects;

impl Handler for Effects {
    async fn handle(
        &self,
        tx: &mut Transaction<'_>,
        record: &InboxRecord,
    ) -> Result<(), HandlerError> {
        let key = record
            .header_str("event_key")
            .unwrap_or_default()
            .to_owned();
        tx.exec_drop("INSERT INTO effects (event_key) VALUES (?)", (key,))
            .await?;
        Ok(())
    }
}

fn record(topic: &str, offset: i64, key: &str, version: &str) -> InboxRecord {
    InboxRecord {
        topic: topic.to_owned(),
        partition: 0,
        offset,
        key: Some(key.as_bytes().to_vec()),
        value: Some(b"{}".to_vec()),
        headers: [
            ("event_key", key),
            ("aggregate_type", "order"),
            ("version", version),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Some(v.as_bytes().to_vec())))
        .collect(),
    }
}

#[tokio::test]
async fn keys_differing_in_case_accent_or_trailing_spaces_are_distinct() -> Result<()> {
    let db = TestDb::create("inbox_keys").await?;
    let mut conn = db.conn().await?;
    conn.query_drop(std::fs::read_to_string(
        migrations_dir().join("0004_inbox.sql"),
    )?)
    .await?;
    conn.query_drop(
        "CREATE TABLE effects (id BIGINT AUTO_INCREMENT PRIMARY KEY, event_key VARCHAR(255)) \
         DEFAULT CHARSET = utf8mb4",
    )
    .await?;
    // The pool may be small: the inbox takes its connections from it.
    drop(conn);
    let suffix = unique_suffix();
    let topic = format!("inbox-rust-keys-{suffix}");
    let mut config = InboxConfig::new("keys", format!("{topic}.dlq"));
    config.version_header = Some("version".into());
    config.backoff_initial = Duration::from_millis(5);
    config.backoff_max = Duration::from_millis(20);
    let inbox = Inbox::new(db.pool().clone(), config, &kafka_bootstrap())?;

    // Each key once: a new event each (the aggregate ids are the same strings, version 1 each:
    // a shared version row would make the twin stale).
    for (i, k) in KEY_TWINS.iter().enumerate() {
        let settled = inbox
            .process(&record(&topic, i as i64, k, "1"), &Effects)
            .await?;
        assert_eq!(settled.outcome, Outcome::Processed, "event_key {k:?}");
    }
    // Each key again: a duplicate, no second effect.
    for (i, k) in KEY_TWINS.iter().enumerate() {
        let settled = inbox
            .process(&record(&topic, 10 + i as i64, k, "2"), &Effects)
            .await?;
        assert_eq!(settled.outcome, Outcome::Duplicate, "event_key {k:?} again");
    }
    let mut conn = db.conn().await?;
    let effects: Vec<String> = conn
        .query("SELECT event_key FROM effects ORDER BY id")
        .await?;
    assert_eq!(effects, KEY_TWINS);
    let inbox_rows: Vec<Vec<u8>> = conn
        .query("SELECT event_key FROM outbox_inbox WHERE consumer = 'keys' ORDER BY kafka_offset")
        .await?;
    let want: Vec<Vec<u8>> = KEY_TWINS.iter().map(|k| k.as_bytes().to_vec()).collect();
    assert_eq!(inbox_rows, want);
    let versions: Vec<(Vec<u8>, i64)> = conn
        .query(
            "SELECT aggregate_id, version FROM outbox_inbox_version WHERE consumer = 'keys' \
             ORDER BY aggregate_id",
        )
        .await?;
    let mut want: Vec<(Vec<u8>, i64)> = KEY_TWINS
        .iter()
        .map(|k| (k.as_bytes().to_vec(), 1))
        .collect();
    want.sort();
    let mut got = versions;
    got.sort();
    assert_eq!(got, want);
    drop(conn);
    drop(inbox); // returns its connection: the pool's disconnect waits for it
    db.drop_database().await?;
    Ok(())
}
