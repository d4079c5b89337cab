//! Reading the relay's checkpoint (state) table.

use std::time::Duration;

use anyhow::{Context, Result};
use mysql_async::Pool;
use outbox_relay_core::state::codec as core;

use crate::wait::wait_until;
use outbox_relay_core::position::BinlogPosition;

/// The checkpoint table's default name (in the database of `mysql.url`).
pub const DEFAULT_CHECKPOINT_TABLE: &str = "outbox_relay_checkpoint";

/// A stored checkpoint as the tests compare it: the relay's
/// [`outbox_relay_core::state::checkpoint::Checkpoint`] (read with the relay's own statement and
/// decoding, [`crate::state::read_state_row`]) flattened into the state table's column names,
/// plus the row's key and lease token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// The connector the row belongs to.
    pub connector_name: String,
    /// Binlog file of the stored position.
    pub binlog_file: String,
    /// Offset in `binlog_file`: the end of a transaction's XID/COMMIT event, or where the relay
    /// started.
    pub binlog_pos: u64,
    /// GTID set, when the relay records one (`None` also when stored empty).
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
    /// The relay's checkpoint of `connector`'s state row; `None` for a lease placeholder.
    pub fn from_state_row(connector: &str, row: &core::StateRow) -> Option<Self> {
        let c = row.checkpoint.as_ref()?;
        Some(Self {
            connector_name: connector.to_owned(),
            binlog_file: c.position.file.clone(),
            binlog_pos: c.position.pos,
            gtid_set: c.gtid_set.clone(),
            source_server_id: c.source_server_id,
            source_server_uuid: c.source_server_uuid.clone(),
            rows_acked: c.rows_acked,
            lease_token: row.lease_token,
        })
    }

    /// (`binlog_file`, `binlog_pos`) as a position.
    pub fn position(&self) -> BinlogPosition {
        BinlogPosition {
            file: self.binlog_file.clone(),
            pos: self.binlog_pos,
        }
    }
}

/// The checkpoint row of `connector` in `table` (`table` or `db.table`; the pool's database is
/// used for a bare name), if there is one with a position (the relay first inserts a lease
/// placeholder with an empty `binlog_file`, then stores its start position).
///
/// # Errors
/// The query fails (e.g. the table does not exist) or the row does not decode.
pub async fn read_checkpoint(
    pool: &Pool,
    table: &str,
    connector: &str,
) -> Result<Option<Checkpoint>> {
    let row = crate::state::read_relay_state_row(pool, table, connector)
        .await
        .with_context(|| format!("reading checkpoint of {connector:?} from {table}"))?;
    Ok(row.and_then(|r| Checkpoint::from_state_row(connector, &r)))
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
