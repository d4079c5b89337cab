//! The checkpoint store in the MySQL state table: one row per connector, written with the
//! statements and values of [`outbox_relay_core::state::codec`], fenced by the lease token
//! ([`crate::state::lease`]); and the operator commands' reads of a connector's whole row
//! ([`read_state_row`]) and of who holds its lease ([`lease_holder`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Pool, Row};

use outbox_relay_core::config::TableName;
use outbox_relay_core::error::RelayError;
use outbox_relay_core::observe::metrics::Metrics;
use outbox_relay_core::state::checkpoint::{Checkpoint, CheckpointStore};
use outbox_relay_core::state::codec::{self, StateRow};

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
    /// The most bytes `table_layouts` holds (its `CHARACTER_OCTET_LENGTH`, found by
    /// [`MysqlCheckpointStore::verify`]; 0: unknown).
    layouts_capacity: Arc<AtomicU64>,
    /// The source's metrics (checkpoint gauges), if any.
    metrics: Option<Arc<Metrics>>,
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
            layouts_capacity: Arc::new(AtomicU64::new(0)),
            metrics: None,
        }
    }

    /// The same store, reporting what it loads and stores to `metrics` (the checkpoint gauges).
    pub fn with_metrics(self, metrics: Arc<Metrics>) -> Self {
        Self {
            metrics: Some(metrics),
            ..self
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
        let described: Vec<(String, Option<u64>)> = conn
            .exec(
                "SELECT COLUMN_NAME, CHARACTER_OCTET_LENGTH FROM information_schema.COLUMNS \
                 WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
                (&self.table.database, &self.table.table),
            )
            .await?;
        let capacity = described
            .iter()
            .find(|(c, _)| c.eq_ignore_ascii_case(codec::columns::TABLE_LAYOUTS))
            .and_then(|(_, bytes)| *bytes)
            .unwrap_or(0);
        self.layouts_capacity.store(capacity, Ordering::Relaxed);
        let columns: Vec<String> = described.into_iter().map(|(c, _)| c).collect();
        let missing: Vec<&str> = codec::REQUIRED_COLUMNS
            .iter()
            .copied()
            .filter(|c| !columns.iter().any(|have| have.eq_ignore_ascii_case(c)))
            .collect();
        self.layouts_column.store(
            columns
                .iter()
                .any(|c| c.eq_ignore_ascii_case(codec::columns::TABLE_LAYOUTS)),
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
        let row: Option<Row> = conn
            .exec_first(
                codec::select_checkpoint(&self.table.quoted(), self.stores_layouts()),
                (&self.connector,),
            )
            .await?;
        let Some(row) = row else { return Ok(None) };
        let bad = |what: &str| {
            RelayError::binlog(format!(
                "the checkpoint row of connector {:?} in {} has an invalid {what}; fix or delete the row",
                self.connector, self.table
            ))
        };
        let mut values = row.unwrap();
        // None: a lease placeholder, no position stored yet.
        let Some(checkpoint) = codec::decode_checkpoint(&mut values).map_err(|_| bad("row"))?
        else {
            return Ok(None);
        };
        if checkpoint.position.pos < 4 {
            return Err(bad("binlog position"));
        }
        if let Some(m) = &self.metrics {
            m.checkpoint_stored(&checkpoint.position, false);
        }
        Ok(Some(checkpoint))
    }

    async fn save(&self, checkpoint: &Checkpoint) -> Result<(), RelayError> {
        // A value the column cannot hold would fail (strict SQL mode) or be cut short (not
        // strict) at every write: stop with the fix instead of retrying forever.
        let capacity = self.layouts_capacity.load(Ordering::Relaxed);
        if let Some(layouts) = checkpoint.table_layouts.as_deref() {
            if self.stores_layouts() && capacity > 0 && layouts.len() as u64 > capacity {
                return Err(RelayError::Prerequisite {
                    setting: format!("checkpoint table {} column table_layouts", self.table),
                    expected: format!(
                        "room for the outbox tables' column layouts ({} bytes)",
                        layouts.len()
                    ),
                    found: format!("a column of at most {capacity} bytes"),
                    fix: format!(
                        "run `outbox-relay migrate` (migrations/0002_checkpoint.sql makes it \
                         MEDIUMTEXT), or ALTER TABLE {} MODIFY table_layouts MEDIUMTEXT NULL; \
                         with binlog_row_metadata=FULL no layouts are stored",
                        self.table.quoted()
                    ),
                });
            }
        }
        let mut conn = self.pool.get_conn().await?;
        let Some(token) = self.lease_token else {
            return Err(RelayError::LeaseLost(
                "checkpoint write without a lease (internal error)".into(),
            ));
        };
        // Fenced: matches only while this instance's lease token is the newest. updated_at is
        // set explicitly so the row always changes and affected_rows is 1 on success.
        let mut params = codec::checkpoint_params(checkpoint, self.stores_layouts());
        params.push(self.connector.as_str().into());
        params.push(token.into());
        conn.exec_drop(
            codec::update_checkpoint(&self.table.quoted(), self.stores_layouts()),
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
        if let Some(m) = &self.metrics {
            m.checkpoint_stored(&checkpoint.position, true);
        }
        Ok(())
    }
}

/// Reads `connector`'s row of `table` (on a connection whose session zone is UTC, as the operator
/// commands' are, so `updated_at` is UTC) with [`codec::select_state_row`].
///
/// # Errors
/// [`RelayError::Mysql`] when the query fails (for example the table does not exist) or the
/// row has values of the wrong type.
pub async fn read_state_row(
    conn: &mut Conn,
    table: &TableName,
    connector: &str,
) -> Result<Option<StateRow>, RelayError> {
    let row: Option<Row> = conn
        .exec_first(codec::select_state_row(&table.quoted()), (connector,))
        .await?;
    let Some(row) = row else { return Ok(None) };
    codec::decode_state_row(row.unwrap())
        .map(Some)
        .map_err(|_| {
            RelayError::mysql(format!(
                "the checkpoint row of connector {connector:?} in {table} has unexpected values"
            ))
        })
}

/// The connection id holding `connector`'s lease (`IS_USED_LOCK` on
/// [`crate::state::lease::lock_name`]), if any.
///
/// # Errors
/// [`RelayError::Mysql`] when the query fails.
pub async fn lease_holder(
    conn: &mut Conn,
    table: &TableName,
    connector: &str,
) -> Result<Option<u64>, RelayError> {
    let holder: Option<Option<u64>> = conn
        .exec_first(
            "SELECT IS_USED_LOCK(?)",
            (crate::state::lease::lock_name(table, connector),),
        )
        .await?;
    Ok(holder.flatten())
}
