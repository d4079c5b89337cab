//! Checkpoint: the stored resume position, one row per connector in a MySQL state table.
//!
//! A stored checkpoint is a transaction boundary all of whose records, and all records before
//! it, Kafka has acknowledged, plus how many outbox rows of the next transaction are
//! acknowledged too (see `migrations/0002_checkpoint.sql`). The pipeline only hands such points
//! to the store, moving forward only. Writes are fenced by the lease token (see [`crate::state::lease`]):
//! an instance that lost its lease can no longer write.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

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
    /// Outbox rows of the transaction after `position` that are acknowledged too; a resume
    /// skips them.
    pub rows_acked: u64,
    /// MariaDB GTID position (`0-1-42,…`) or MySQL GTID set including that transaction, when
    /// known.
    pub gtid_set: Option<String>,
    /// `@@server_id` of the source server the position belongs to.
    pub source_server_id: u32,
    /// `@@server_uuid` of the source (MySQL only).
    pub source_server_uuid: Option<String>,
    /// The outbox tables' column layouts at `position` (JSON, see [`crate::decode::schema`]), for table
    /// maps without column names; stored when the table has the `table_layouts` column
    /// (`migrations/0003_checkpoint_layouts.sql`).
    pub table_layouts: Option<Arc<str>>,
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
    /// Fencing token of the lease this instance holds; writes with an older token fail.
    lease_token: Option<u64>,
    /// The table has the `table_layouts` column (found by [`MysqlCheckpointStore::verify`]).
    layouts_column: Arc<AtomicBool>,
}

impl MysqlCheckpointStore {
    /// A store for `connector` in `table`.
    pub fn new(pool: Pool, table: TableName, connector: String) -> Self {
        Self {
            pool,
            table,
            connector,
            lease_token: None,
            layouts_column: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The same store, writing under lease `token` (see [`crate::state::lease::Lease`]).
    pub fn fenced(&self, token: u64) -> Self {
        Self {
            lease_token: Some(token),
            ..self.clone()
        }
    }

    /// The connector name (the row's key).
    pub fn connector(&self) -> &str {
        &self.connector
    }

    /// The pool the store uses.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The checkpoint table this store writes.
    pub fn table(&self) -> &TableName {
        &self.table
    }

    /// `true` when the table can store column layouts (`table_layouts`, migration 0003); known
    /// after [`MysqlCheckpointStore::verify`].
    pub fn stores_layouts(&self) -> bool {
        self.layouts_column.load(Ordering::Relaxed)
    }

    /// Checks that the table exists with the expected columns (and notes whether it has the
    /// optional `table_layouts` column).
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
            "rows_acked",
            "gtid_set",
            "source_server_id",
            "source_server_uuid",
            "lease_token",
            "lease_owner",
            "updated_at",
        ];
        let missing: Vec<&str> = required
            .iter()
            .copied()
            .filter(|c| !columns.iter().any(|have| have.eq_ignore_ascii_case(c)))
            .collect();
        self.layouts_column.store(
            columns
                .iter()
                .any(|c| c.eq_ignore_ascii_case("table_layouts")),
            Ordering::Relaxed,
        );
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
                "create it (or recreate an older layout) with migrations/0002_checkpoint.sql in database `{}` (for example \
                 `mariadb {} < migrations/0002_checkpoint.sql`), or set checkpoint.table",
                self.table.database, self.table.database
            ),
        })
    }
}

impl CheckpointStore for MysqlCheckpointStore {
    async fn load(&self) -> Result<Option<Checkpoint>, RelayError> {
        let mut conn = self.pool.get_conn().await?;
        let layouts = if self.stores_layouts() {
            "table_layouts"
        } else {
            "NULL"
        };
        let row: Option<Row> = conn
            .exec_first(
                format!(
                    "SELECT binlog_file, binlog_pos, rows_acked, gtid_set, source_server_id, \
                     source_server_uuid, {layouts} FROM {} WHERE connector_name = ?",
                    self.table.quoted()
                ),
                (&self.connector,),
            )
            .await?;
        let Some(mut row) = row else { return Ok(None) };
        let table_layouts: Option<String> = row.take_opt(6).and_then(Result::ok).flatten();
        let bad = |what: &str| {
            RelayError::Binlog(format!(
                "the checkpoint row of connector {:?} in {} has an invalid {what}; fix or delete the row",
                self.connector, self.table
            ))
        };
        let fields = (
            row.take_opt::<String, _>(0),
            row.take_opt::<u64, _>(1),
            row.take_opt::<u64, _>(2),
            row.take_opt::<Option<String>, _>(3),
            row.take_opt::<u32, _>(4),
            row.take_opt::<Option<String>, _>(5),
        );
        let (file, pos, rows_acked, gtid_set, server_id, server_uuid) = match fields {
            (Some(Ok(a)), Some(Ok(b)), Some(Ok(c)), Some(Ok(d)), Some(Ok(e)), Some(Ok(f))) => {
                (a, b, c, d, e, f)
            }
            _ => return Err(bad("row")),
        };
        if file.is_empty() {
            return Ok(None); // a lease placeholder: no position stored yet
        }
        if pos < 4 {
            return Err(bad("binlog position"));
        }
        let checkpoint = Checkpoint {
            position: BinlogPosition::new(file, pos),
            rows_acked,
            gtid_set: gtid_set.filter(|g| !g.trim().is_empty()),
            source_server_id: server_id,
            source_server_uuid: server_uuid,
            table_layouts: table_layouts.filter(|l| !l.is_empty()).map(Arc::from),
        };
        crate::observe::metrics::global().checkpoint_stored(&checkpoint.position, false);
        Ok(Some(checkpoint))
    }

    async fn save(&self, checkpoint: &Checkpoint) -> Result<(), RelayError> {
        let mut conn = self.pool.get_conn().await?;
        let Some(token) = self.lease_token else {
            return Err(RelayError::LeaseLost(
                "checkpoint write without a lease (internal error)".into(),
            ));
        };
        // Fenced: matches only while this instance's lease token is the newest. updated_at is
        // set explicitly so the row always changes and affected_rows is 1 on success.
        let layouts = checkpoint.table_layouts.as_deref();
        let set_layouts = if self.stores_layouts() {
            ", table_layouts = ?"
        } else {
            ""
        };
        let mut params: Vec<mysql_async::Value> = vec![
            checkpoint.position.file.as_str().into(),
            checkpoint.position.pos.into(),
            checkpoint.rows_acked.into(),
            checkpoint.gtid_set.as_deref().into(),
            checkpoint.source_server_id.into(),
            checkpoint.source_server_uuid.as_deref().into(),
        ];
        if self.stores_layouts() {
            params.push(layouts.into());
        }
        params.push(self.connector.as_str().into());
        params.push(token.into());
        conn.exec_drop(
            format!(
                "UPDATE {} SET binlog_file = ?, binlog_pos = ?, rows_acked = ?, gtid_set = ?, \
                 source_server_id = ?, source_server_uuid = ?{set_layouts}, \
                 updated_at = CURRENT_TIMESTAMP(6) WHERE connector_name = ? AND lease_token = ?",
                self.table.quoted()
            ),
            params,
        )
        .await?;
        if conn.affected_rows() == 0 {
            return Err(RelayError::LeaseLost(format!(
                "the checkpoint row of connector {:?} carries a newer lease token than {token}: \
                 another instance took over",
                self.connector
            )));
        }
        crate::observe::metrics::global().checkpoint_stored(&checkpoint.position, true);
        Ok(())
    }
}
