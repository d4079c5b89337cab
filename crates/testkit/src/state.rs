//! The relay's state row as a whole (lease columns and placeholder rows included), the name of
//! the connector's lease lock, and waiting on what a relay writes to stderr.
//!
//! [`crate::read_checkpoint`] answers "which position is stored"; the helpers here answer "who
//! holds the lease, with which token, and when was the row last written".

use std::time::Duration;

use anyhow::{anyhow, ensure, Context, Result};
use mysql_async::prelude::*;
use mysql_async::{Pool, Row};

use crate::binlog::BinlogPosition;
use crate::relay::RelayProcess;
use crate::wait::wait_until;

/// Every column of one row of the checkpoint table, including a lease placeholder (empty
/// `binlog_file`), as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateRow {
    /// `connector_name`.
    pub connector_name: String,
    /// `binlog_file` (`""` in a lease placeholder).
    pub binlog_file: String,
    /// `binlog_pos`.
    pub binlog_pos: u64,
    /// `rows_acked`.
    pub rows_acked: u64,
    /// `gtid_set`.
    pub gtid_set: Option<String>,
    /// `source_server_id`.
    pub source_server_id: u32,
    /// `lease_token`.
    pub lease_token: u64,
    /// `lease_owner` (`host:pid` of the relay that took the lease last).
    pub lease_owner: Option<String>,
    /// `updated_at` as text with microseconds (changes with every write of the row).
    pub updated_at: String,
}

impl StateRow {
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

/// The row of `connector` in `table` (`table` or `db.table`, the pool's database for a bare
/// name), placeholder or not.
///
/// # Errors
/// The query fails.
pub async fn read_state_row(pool: &Pool, table: &str, connector: &str) -> Result<Option<StateRow>> {
    let quoted = quote_ident_path(table)?;
    let mut conn = pool.get_conn().await?;
    let row: Option<Row> = conn
        .exec_first(
            format!(
                "SELECT connector_name, binlog_file, binlog_pos, rows_acked, gtid_set, \
                 source_server_id, lease_token, lease_owner, \
                 DATE_FORMAT(updated_at, '%Y-%m-%d %H:%i:%s.%f') FROM {quoted} \
                 WHERE connector_name = ?"
            ),
            (connector,),
        )
        .await
        .with_context(|| format!("reading the state row of {connector:?} from {table}"))?;
    let Some(row) = row else {
        return Ok(None);
    };
    let ctx = || format!("state row {row:?}");
    Ok(Some(StateRow {
        connector_name: row.get::<String, _>(0).with_context(ctx)?,
        binlog_file: row.get::<String, _>(1).with_context(ctx)?,
        binlog_pos: row.get::<u64, _>(2).with_context(ctx)?,
        rows_acked: row.get::<u64, _>(3).with_context(ctx)?,
        gtid_set: row.get::<Option<String>, _>(4).flatten(),
        source_server_id: row.get::<u32, _>(5).with_context(ctx)?,
        lease_token: row.get::<u64, _>(6).with_context(ctx)?,
        lease_owner: row.get::<Option<String>, _>(7).flatten(),
        updated_at: row.get::<String, _>(8).with_context(ctx)?,
    }))
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

/// Waits until the relay's stderr contains `needle`, failing at once if the relay exits first
/// (unless the text is there by then). Returns the stderr text.
///
/// # Errors
/// Timeout (the error shows the stderr tail) or the relay exited without writing `needle`.
pub async fn wait_for_stderr(
    relay: &RelayProcess,
    needle: &str,
    timeout: Duration,
) -> Result<String> {
    wait_until(
        &format!("the relay to log {needle:?}"),
        timeout,
        Duration::from_millis(100),
        async || {
            let text = relay.stderr_text();
            if text.contains(needle) {
                return Ok(Some(text));
            }
            relay.ensure_running()?;
            Ok(None)
        },
    )
    .await
    .map_err(|e| anyhow!("{e:#}\n--- relay stderr ---\n{}", relay.stderr_tail()))
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
