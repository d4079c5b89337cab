//! Reading the relay's checkpoint (state) table.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use mysql_async::prelude::*;
use mysql_async::{Pool, Row};

use crate::binlog::BinlogPosition;
use crate::wait::wait_until;

/// The checkpoint table's default name (in the database of `mysql.url`).
pub const DEFAULT_CHECKPOINT_TABLE: &str = "outbox_relay_checkpoint";

/// One row of the checkpoint table (`migrations/0002_checkpoint.sql`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// The connector the row belongs to.
    pub connector_name: String,
    /// Binlog file of the stored position.
    pub binlog_file: String,
    /// Offset in `binlog_file`: the end of a transaction's XID/COMMIT event, or where the relay
    /// started.
    pub binlog_pos: u64,
    /// GTID set, when the relay records one.
    pub gtid_set: Option<String>,
    /// `server_id` of the source server.
    pub source_server_id: u32,
    /// `server_uuid` of the source server, when known.
    pub source_server_uuid: Option<String>,
    /// Outbox rows of the transaction after the position that were acknowledged too.
    pub rows_acked: u64,
    /// Fencing token of the instance that holds (or last held) the lease.
    pub lease_token: u64,
}

impl Checkpoint {
    /// (`binlog_file`, `binlog_pos`) as a position.
    pub fn position(&self) -> BinlogPosition {
        BinlogPosition {
            file: self.binlog_file.clone(),
            pos: self.binlog_pos,
        }
    }
}

fn check_table_name(table: &str) -> Result<()> {
    ensure!(
        !table.is_empty()
            && table
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.'),
        "not a plain table name: {table:?}"
    );
    Ok(())
}

fn quote_table(table: &str) -> String {
    table
        .split('.')
        .map(|p| format!("`{p}`"))
        .collect::<Vec<_>>()
        .join(".")
}

/// The checkpoint row of `connector` in `table` (`table` or `db.table`; the pool's database is
/// used for a bare name), if there is one with a position (the relay first inserts a lease
/// placeholder with an empty `binlog_file`, then stores its start position).
///
/// # Errors
/// The query fails (e.g. the table does not exist).
pub async fn read_checkpoint(
    pool: &Pool,
    table: &str,
    connector: &str,
) -> Result<Option<Checkpoint>> {
    check_table_name(table)?;
    let mut conn = pool.get_conn().await?;
    let row: Option<Row> = conn
        .exec_first(
            format!(
                "SELECT connector_name, binlog_file, binlog_pos, gtid_set, source_server_id, \
                 source_server_uuid, rows_acked, lease_token FROM {} \
                 WHERE connector_name = ? AND binlog_file <> ''",
                quote_table(table)
            ),
            (connector,),
        )
        .await
        .with_context(|| format!("reading checkpoint of {connector:?} from {table}"))?;
    let Some(row) = row else {
        return Ok(None);
    };
    let ctx = || format!("checkpoint row {row:?}");
    Ok(Some(Checkpoint {
        connector_name: row.get::<String, _>(0).with_context(ctx)?,
        binlog_file: row.get::<String, _>(1).with_context(ctx)?,
        binlog_pos: row.get::<u64, _>(2).with_context(ctx)?,
        gtid_set: row.get::<Option<String>, _>(3).flatten(),
        source_server_id: row.get::<u32, _>(4).with_context(ctx)?,
        source_server_uuid: row.get::<Option<String>, _>(5).flatten(),
        rows_acked: row.get::<u64, _>(6).with_context(ctx)?,
        lease_token: row.get::<u64, _>(7).with_context(ctx)?,
    }))
}

/// Waits until the default checkpoint table (in the pool's database) has the row of
/// `connector`, and returns it. The relay writes that row as soon as it has started, so this is
/// the signal that it is tailing the binlog and that rows inserted from now on will be relayed.
///
/// See [`crate::RelayProcess::wait_for_checkpoint_row`] for the variant that also gives up as
/// soon as the relay process exits.
///
/// # Errors
/// The row did not appear within `timeout`, or a query failed.
pub async fn wait_for_checkpoint_row(
    pool: &Pool,
    connector: &str,
    timeout: Duration,
) -> Result<Checkpoint> {
    wait_until(
        &format!("the checkpoint row of {connector:?}"),
        timeout,
        Duration::from_millis(100),
        async || read_checkpoint(pool, DEFAULT_CHECKPOINT_TABLE, connector).await,
    )
    .await
}
