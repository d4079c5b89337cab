//! What the inbox crate's integration tests share: a database with the inbox tables and an
//! `effects` table, and a handler that writes one effect per record.

use anyhow::Result;
use mysql_async::prelude::Queryable;
use mysql_async::Transaction;
use outbox_inbox::{Handler, HandlerError, InboxRecord};
use outbox_relay_testkit::db::migrations_dir;
use outbox_relay_testkit::TestDb;

/// Inserts one `effects` row with the record's event key, then fails when the value is
/// `poison` (the row is rolled back with the attempt).
pub struct Effects;

impl Handler for Effects {
    async fn handle(
        &self,
        tx: &mut Transaction<'_>,
        record: &InboxRecord,
    ) -> Result<(), HandlerError> {
        tx.exec_drop(
            "INSERT INTO effects (event_key) VALUES (?)",
            (record.header_str("event_key").unwrap_or_default(),),
        )
        .await?;
        if record.value.as_deref() == Some(b"poison") {
            return Err("poison record".into());
        }
        Ok(())
    }
}

/// A database of its own named after `name`, with the inbox tables (0004, 0006) and `effects`.
pub async fn database(name: &str) -> Result<TestDb> {
    let db = TestDb::create(name).await?;
    let mut conn = db.conn().await?;
    for m in ["0004_inbox.sql", "0006_inbox_parked.sql"] {
        conn.query_drop(std::fs::read_to_string(migrations_dir().join(m))?)
            .await?;
    }
    conn.query_drop(
        "CREATE TABLE effects (id BIGINT AUTO_INCREMENT PRIMARY KEY, event_key TEXT) \
         DEFAULT CHARSET = utf8mb4",
    )
    .await?;
    Ok(db)
}
