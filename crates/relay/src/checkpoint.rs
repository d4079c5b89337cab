//! Checkpoint: the stored resume position, one row per connector in a MySQL state table.
//!
//! A stored checkpoint is a transaction boundary all of whose records, and all records before
//! it, Kafka has acknowledged (see `migrations/0002_checkpoint.sql`). The pipeline only hands
//! such boundaries to the store, and the store refuses to move a checkpoint backwards.

use mysql_async::prelude::Queryable;
use mysql_async::{Pool, Row};

use crate::config::TableName;
use crate::error::RelayError;
use crate::position::BinlogPosition;

/// A resume point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// End of the last fully acknowledged transaction.
    pub position: BinlogPosition,
    /// MariaDB GTID position (`0-1-42,…`) or MySQL GTID set including that transaction, when
    /// known.
    pub gtid_set: Option<String>,
    /// `@@server_id` of the source server the position belongs to.
    pub source_server_id: u32,
    /// `@@server_uuid` of the source (MySQL only).
    pub source_server_uuid: Option<String>,
}

/// Where checkpoints live. Kept small so an exactly-once mode can store them inside a Kafka
/// transaction later.
pub trait CheckpointStore {
    /// The connector's stored checkpoint, if any.
    fn load(
        &self,
    ) -> impl std::future::Future<Output = Result<Option<Checkpoint>, RelayError>> + Send;
    /// Stores `checkpoint` (forward only).
    fn save(
        &self,
        checkpoint: &Checkpoint,
    ) -> impl std::future::Future<Output = Result<(), RelayError>> + Send;
}

/// The MySQL state table.
#[derive(Clone)]
pub struct MysqlCheckpointStore {
    pool: Pool,
    table: TableName,
    connector: String,
}

impl MysqlCheckpointStore {
    /// A store for `connector` in `table`.
    pub fn new(pool: Pool, table: TableName, connector: String) -> Self {
        Self {
            pool,
            table,
            connector,
        }
    }

    /// The checkpoint table this store writes.
    pub fn table(&self) -> &TableName {
        &self.table
    }

    /// Checks that the table exists with the expected columns.
    ///
    /// # Errors
    /// [`RelayError::Prerequisite`] naming the table and the migration that creates it.
    pub async fn verify(&self) -> Result<(), RelayError> {
        let mut conn = self.pool.get_conn().await?;
        let columns: Vec<String> = conn
            .exec(
                "SELECT COLUMN_NAME FROM information_schema.COLUMNS \
                 WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
                (&self.table.database, &self.table.table),
            )
            .await?;
        let required = [
            "connector_name",
            "binlog_file",
            "binlog_pos",
            "gtid_set",
            "source_server_id",
            "source_server_uuid",
            "updated_at",
        ];
        let missing: Vec<&str> = required
            .iter()
            .copied()
            .filter(|c| !columns.iter().any(|have| have.eq_ignore_ascii_case(c)))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let found = if columns.is_empty() {
            "no such table".to_owned()
        } else {
            format!("a table without the columns {}", missing.join(", "))
        };
        Err(RelayError::Prerequisite {
            setting: format!("checkpoint table {}", self.table),
            expected: "the outbox-relay state table".into(),
            found,
            fix: format!(
                "create it with migrations/0002_checkpoint.sql in database `{}` (for example \
                 `mariadb {} < migrations/0002_checkpoint.sql`), or set checkpoint.table",
                self.table.database, self.table.database
            ),
        })
    }
}

impl CheckpointStore for MysqlCheckpointStore {
    async fn load(&self) -> Result<Option<Checkpoint>, RelayError> {
        let mut conn = self.pool.get_conn().await?;
        let row: Option<Row> = conn
            .exec_first(
                format!(
                    "SELECT binlog_file, binlog_pos, gtid_set, source_server_id, source_server_uuid \
                     FROM {} WHERE connector_name = ?",
                    self.table.quoted()
                ),
                (&self.connector,),
            )
            .await?;
        let Some(row) = row else { return Ok(None) };
        let bad = |what: &str| {
            RelayError::Binlog(format!(
                "the checkpoint row of connector {:?} in {} has an invalid {what}",
                self.connector, self.table
            ))
        };
        let (file, pos, gtid_set, server_id, server_uuid): (
            String,
            u64,
            Option<String>,
            u32,
            Option<String>,
        ) = mysql_async::from_row_opt(row).map_err(|_| bad("row"))?;
        if file.is_empty() || pos < 4 {
            return Err(bad("binlog position"));
        }
        Ok(Some(Checkpoint {
            position: BinlogPosition::new(file, pos),
            gtid_set,
            source_server_id: server_id,
            source_server_uuid: server_uuid,
        }))
    }

    async fn save(&self, checkpoint: &Checkpoint) -> Result<(), RelayError> {
        let mut conn = self.pool.get_conn().await?;
        conn.exec_drop(
            format!(
                "INSERT INTO {} (connector_name, binlog_file, binlog_pos, gtid_set, \
                 source_server_id, source_server_uuid) VALUES (?, ?, ?, ?, ?, ?) \
                 ON DUPLICATE KEY UPDATE binlog_file = VALUES(binlog_file), \
                 binlog_pos = VALUES(binlog_pos), gtid_set = VALUES(gtid_set), \
                 source_server_id = VALUES(source_server_id), \
                 source_server_uuid = VALUES(source_server_uuid)",
                self.table.quoted()
            ),
            (
                &self.connector,
                &checkpoint.position.file,
                checkpoint.position.pos,
                &checkpoint.gtid_set,
                checkpoint.source_server_id,
                &checkpoint.source_server_uuid,
            ),
        )
        .await?;
        Ok(())
    }
}
