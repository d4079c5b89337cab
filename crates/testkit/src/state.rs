//! The relay's state row as a whole (lease columns and placeholder rows included), the name of
//! the connector's lease lock, and waiting on what a relay writes to stderr.
//!
//! [`crate::read_checkpoint`] answers "which position is stored"; the helpers here answer "who
//! holds the lease, with which token, and when was the row last written".

use anyhow::{anyhow, ensure, Context, Result};
use mysql_async::prelude::*;
use mysql_async::{Pool, Row};

use outbox_relay_core::state::{checkpoint as core_checkpoint, codec as core_codec};

use outbox_relay_core::position::BinlogPosition;

/// One row of the checkpoint table as the tests compare it, including a lease placeholder
/// (empty `binlog_file`): the relay's [`outbox_relay_core_codec::state::codec::StateRow`] (its
/// statement and decoding) flattened into the table's column names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateRow {
    /// `connector_name`.
    pub connector_name: String,
    /// `binlog_file` (`""` in a lease placeholder).
    pub binlog_file: String,
    /// `binlog_pos` (0 in a lease placeholder).
    pub binlog_pos: u64,
    /// `rows_acked` (0 in a lease placeholder).
    pub rows_acked: u64,
    /// `gtid_set` (`None` also when stored empty, and in a lease placeholder).
    pub gtid_set: Option<String>,
    /// `source_server_id` (0 in a lease placeholder).
    pub source_server_id: u32,
    /// `lease_token`.
    pub lease_token: u64,
    /// `lease_owner` (`host:pid` of the relay that took the lease last).
    pub lease_owner: Option<String>,
    /// `updated_at` as text with microseconds (changes with every write of the row).
    pub updated_at: String,
}

impl StateRow {
    /// The relay's state row of `connector`, flattened.
    pub fn from_relay(connector: &str, row: core_codec::StateRow) -> Self {
        let cp = row.checkpoint.unwrap_or(core_checkpoint::Checkpoint {
            position: BinlogPosition::default(),
            rows_acked: 0,
            gtid_set: None,
            source_server_id: 0,
            source_server_uuid: None,
            table_layouts: None,
        });
        Self {
            connector_name: connector.to_owned(),
            binlog_file: cp.position.file,
            binlog_pos: cp.position.pos,
            rows_acked: cp.rows_acked,
            gtid_set: cp.gtid_set,
            source_server_id: cp.source_server_id,
            lease_token: row.lease_token,
            lease_owner: row.lease_owner,
            updated_at: row.updated_at,
        }
    }

    /// (`binlog_file`, `binlog_pos`).
    pub fn position(&self) -> BinlogPosition {
        BinlogPosition {
            file: self.binlog_file.clone(),
            pos: self.binlog_pos,
        }
    }

    /// `true` for the lease placeholder the relay inserts before it stores a position.
    pub fn is_placeholder(&self) -> bool {
        self.binlog_file.is_empty()
    }

    /// The pid part of `lease_owner` (`host:pid`).
    pub fn lease_owner_pid(&self) -> Option<u32> {
        self.lease_owner
            .as_deref()
            .and_then(|o| o.rsplit_once(':'))
            .and_then(|(_, pid)| pid.parse().ok())
    }
}

fn quote_ident_path(table: &str) -> Result<String> {
    ensure!(
        !table.is_empty()
            && table
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.'),
        "not a plain table name: {table:?}"
    );
    Ok(table
        .split('.')
        .map(|p| format!("`{p}`"))
        .collect::<Vec<_>>()
        .join("."))
}

/// The relay's own state row of `connector` in `table` (`table` or `db.table`, the pool's
/// database for a bare name), read with the relay's statement
/// ([`outbox_relay_core_codec::state::codec::select_state_row`]) and decoding; `updated_at` in the
/// pool's session time zone.
///
/// # Errors
/// The query fails, or the row does not decode (naming the column).
pub async fn read_relay_state_row(
    pool: &Pool,
    table: &str,
    connector: &str,
) -> Result<Option<core_codec::StateRow>> {
    let quoted = quote_ident_path(table)?;
    let mut conn = pool.get_conn().await?;
    let row: Option<Row> = conn
        .exec_first(core_codec::select_state_row(&quoted), (connector,))
        .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let shown = format!("{row:?}");
    core_codec::decode_state_row(row.unwrap())
        .map(Some)
        .map_err(|core_codec::BadColumn(c)| anyhow!("state row {shown}: invalid {c}"))
}

/// The row of `connector` in `table` (`table` or `db.table`, the pool's database for a bare
/// name), placeholder or not.
///
/// # Errors
/// The query fails or the row does not decode.
pub async fn read_state_row(pool: &Pool, table: &str, connector: &str) -> Result<Option<StateRow>> {
    let row = read_relay_state_row(pool, table, connector)
        .await
        .with_context(|| format!("reading the state row of {connector:?} from {table}"))?;
    Ok(row.map(|r| StateRow::from_relay(connector, r)))
}

/// The name of the MySQL user lock that is a connector's lease:
/// `outbox_relay.<db>.<checkpoint table>.<connector>`, or, past MySQL's 64-character limit for
/// lock names, `outbox_relay.<first 40 characters of connector>.<crc32 of the full name, hex>`
/// (the relay's naming, so a test can hold or inspect the lease).
pub fn lease_lock_name(database: &str, checkpoint_table: &str, connector: &str) -> String {
    let full = format!("outbox_relay.{database}.{checkpoint_table}.{connector}");
    if full.len() <= 64 {
        return full;
    }
    let prefix: String = connector.chars().take(40).collect();
    format!("outbox_relay.{prefix}.{:08x}", crc32(full.as_bytes()))
}

/// CRC-32 (IEEE 802.3, as zlib and `crc32fast`).
pub fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0xEDB8_8320 & mask);
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_the_reference_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn lock_names_follow_the_relay() {
        assert_eq!(
            lease_lock_name("shop", "outbox_relay_checkpoint", "orders"),
            "outbox_relay.shop.outbox_relay_checkpoint.orders"
        );
        let long = lease_lock_name("e2e_fence_123456_7_abcdefg", "outbox_relay_checkpoint", "x");
        assert!(long.len() <= 64, "{long}");
        assert!(long.starts_with("outbox_relay.x."), "{long}");
    }
}
