//! `outbox-relay status`: the stored checkpoint, the server's current end of binlog, the lag
//! between them, and who holds the connector's lease.
//!
//! Lag in bytes is the binlog between the checkpoint and the server's end (the file sizes of
//! `SHOW BINARY LOGS`), 0 when only checkpoint-table writes lie between (an idle relay's own
//! checkpoint writes; `SHOW BINLOG EVENTS`). Lag in seconds is 0 when the checkpoint is at the end, else the age of
//! the checkpoint row (the server's `NOW()` minus `updated_at`): binlog events carry their times
//! only in the binlog itself (not in `SHOW BINLOG EVENTS`), and reading it would need a dump
//! connection, so the age of the last checkpoint write stands in for the age of the oldest
//! unrelayed event.

use std::fmt;

use serde_json::{json, Value};

use super::{binary_logs, bytes_between, human_duration, lease_holder, read_state_row, StateRow};
use outbox_relay_core::config::RelayConfig;
use outbox_relay_core::error::RelayError;
use outbox_relay_core::position::BinlogPosition;
use outbox_relay_core::state::checkpoint::Checkpoint;
use outbox_relay_mysql::preflight;

/// What `status` found.
#[derive(Debug, Clone)]
pub struct Status {
    /// `connector_name`.
    pub connector: String,
    /// The checkpoint table (`db.table`).
    pub checkpoint_table: String,
    /// The connector's row (a placeholder when no position is stored yet), if any.
    pub row: Option<StateRow>,
    /// `true` when the checkpoint's file is in `SHOW BINARY LOGS` and its position not past the
    /// file's end.
    pub checkpoint_available: bool,
    /// `@@version`.
    pub server_version: String,
    /// `@@server_id`.
    pub server_id: u32,
    /// The server's current end of binlog.
    pub server_position: BinlogPosition,
    /// The server's GTID state there (`@@gtid_binlog_pos` on MariaDB, `Executed_Gtid_Set` on
    /// MySQL).
    pub server_gtid: Option<String>,
    /// Bytes of binlog not yet relayed: from the checkpoint (past the rows of the transaction
    /// after it that `rows_acked` covers) to the end, 0 when only writes to the checkpoint
    /// table lie between (`None` without a checkpoint, or when its file is gone).
    pub lag_bytes: Option<u64>,
    /// 0 when caught up, else the checkpoint's age (see the module docs).
    pub lag_seconds: Option<f64>,
    /// The transaction after the checkpoint is partly acknowledged (`rows_acked` of its rows);
    /// `lag_bytes` then counts from its first unacknowledged row's event.
    pub partly_acked: Option<super::scan::PartlyAcked>,
    /// Why the lag may count acknowledged rows (the transaction after a checkpoint with
    /// `rows_acked` could not be read).
    pub lag_note: Option<String>,
    /// Connection id holding the lease (`IS_USED_LOCK`), if any.
    pub lease_holder: Option<u64>,
}

/// Gathers the status of `config`'s connector.
///
/// # Errors
/// [`RelayError::Mysql`] / [`RelayError::Prerequisite`] when the server cannot be queried or
/// the checkpoint table is missing.
pub async fn status(config: &RelayConfig) -> Result<Status, RelayError> {
    let table = config.checkpoint_table()?;
    let mut conn = super::connect(config).await?;
    let server = preflight::server_identity(&mut conn).await?;
    let (end, executed) = preflight::current_position(&mut conn, server.flavor).await?;
    let server_gtid = server
        .flavor
        .current_gtid(&mut conn, executed)
        .await?
        .filter(|g| !g.is_empty());
    let logs = binary_logs(&mut conn).await?;
    let row = read_state_row(&mut conn, &table, &config.connector_name)
        .await
        .map_err(|e| missing_table(e, &table))?;
    let holder = lease_holder(&mut conn, &table, &config.connector_name).await?;
    let position = row.as_ref().and_then(StateRow::position);
    let checkpoint_available = position.as_ref().is_some_and(|p| {
        logs.iter()
            .any(|(name, size)| *name == p.file && p.pos <= *size)
    });
    // With rows_acked > 0 the transaction after the checkpoint is read: rows of it among the
    // acknowledged ones are not lag (scan::coverage, the rule trace and prune use too).
    let mut partly_acked = None;
    let mut lag_note = None;
    let covered = match row.as_ref().and_then(|r| r.checkpoint.as_ref()) {
        Some(cp) if checkpoint_available => {
            match super::scan::coverage(config, &mut conn, &server, cp, &end).await {
                Ok(c) => {
                    partly_acked = c.partial.clone();
                    Some(c.partial.map_or(c.through, |p| p.unrelayed_from))
                }
                Err(e) => {
                    lag_note = Some(format!(
                        "the transaction after the checkpoint (rows_acked {}) was not read, so \
                         it counts as lag: {e}",
                        cp.rows_acked
                    ));
                    Some(cp.position.clone())
                }
            }
        }
        _ => position.clone(),
    };
    let mut lag_bytes = covered.as_ref().and_then(|p| bytes_between(&logs, p, &end));
    if let (Some(b), Some(p), None) = (lag_bytes, &covered, &partly_acked) {
        // An idle relay's checkpoint stays before its own last checkpoint write (writing a
        // checkpoint past it would make another write, and so on): those writes are not lag.
        if b > 0 && only_checkpoint_writes(&mut conn, &table, p, &end).await? {
            lag_bytes = Some(0);
        }
    }
    let lag_seconds = match (lag_bytes, &row) {
        (Some(0), _) => Some(0.0),
        (Some(_), Some(r)) => Some(r.age_seconds),
        _ => None,
    };
    let _ = conn.disconnect().await;
    Ok(Status {
        connector: config.connector_name.clone(),
        checkpoint_table: table.to_string(),
        row,
        checkpoint_available,
        server_version: server.version,
        server_id: server.server_id,
        server_position: end,
        server_gtid,
        lag_bytes,
        lag_seconds,
        partly_acked,
        lag_note,
        lease_holder: holder,
    })
}

/// Most events `status` inspects behind the checkpoint before it counts them all as lag.
const MAX_EVENTS_INSPECTED: usize = 2_000;

/// Whether every transaction from `from` to `to` only writes the checkpoint `table` (the
/// relays' own checkpoint and lease writes; MariaDB and MySQL `SHOW BINLOG EVENTS` texts).
async fn only_checkpoint_writes(
    conn: &mut mysql_async::Conn,
    table: &outbox_relay_core::config::TableName,
    from: &BinlogPosition,
    to: &BinlogPosition,
) -> Result<bool, RelayError> {
    let own = [
        format!("({}.{})", table.database, table.table).to_ascii_lowercase(),
        format!("(`{}`.`{}`)", table.database, table.table).to_ascii_lowercase(),
    ];
    let other = super::first_event_between(conn, from, to, MAX_EVENTS_INSPECTED, |kind, info| {
        not_a_checkpoint_write(kind, info, &own)
    })
    .await?;
    Ok(other.is_none())
}

/// Why one `SHOW BINLOG EVENTS` row (type `kind`, `info`) is not part of a transaction that
/// only writes the checkpoint table (`own`: its name as table maps show it); `None` when it is.
fn not_a_checkpoint_write(kind: &str, info: &str, own: &[String]) -> Option<String> {
    const FRAMING: [&str; 12] = [
        "Gtid",
        "Anonymous_Gtid",
        "Xid",
        "Annotate_rows",
        "Rows_query",
        "Rotate",
        "Format_desc",
        "Previous_gtids",
        "Gtid_list",
        "Binlog_checkpoint",
        "Stop",
        "Heartbeat",
    ];
    let rows = ["Write_rows", "Update_rows", "Delete_rows"];
    if FRAMING.contains(&kind) || rows.iter().any(|r| kind.starts_with(r)) {
        // Rows events follow their table map, which was checked.
        return None;
    }
    let lower = info.to_ascii_lowercase();
    if kind == "Table_map" {
        return (!own.iter().any(|o| lower.contains(o.as_str())))
            .then(|| format!("a write to another table ({info})"));
    }
    if kind == "Query" && matches!(lower.trim(), "begin" | "commit") {
        return None;
    }
    Some(format!("a {kind} event"))
}

/// A missing checkpoint table as the prerequisite error that names the migration.
pub(crate) fn missing_table(
    e: RelayError,
    table: &outbox_relay_core::config::TableName,
) -> RelayError {
    match &e {
        RelayError::Mysql(m) if m.contains("1146") || m.contains("doesn't exist") => {
            RelayError::Prerequisite {
                setting: format!("checkpoint table {table}"),
                expected: "the outbox-relay state table".into(),
                found: "no such table".into(),
                fix: "create it with `outbox-relay migrate --config …` (or \
                      migrations/0002_checkpoint.sql)"
                    .into(),
            }
        }
        _ => e,
    }
}

impl Status {
    /// The row and its checkpoint, unless there is no row or it is a lease placeholder.
    fn stored(&self) -> Option<(&StateRow, &Checkpoint)> {
        let r = self.row.as_ref()?;
        Some((r, r.checkpoint.as_ref()?))
    }

    /// One JSON object; keys as documented in docs/src/operations/status.md.
    pub fn to_json(&self) -> Value {
        let checkpoint = match self.stored() {
            Some((r, c)) => json!({
                "binlog_file": c.position.file,
                "binlog_pos": c.position.pos,
                "rows_acked": c.rows_acked,
                "gtid_set": c.gtid_set,
                "source_server_id": c.source_server_id,
                "updated_at": r.updated_at,
                "age_seconds": round3(r.age_seconds),
                "available": self.checkpoint_available,
            }),
            _ => Value::Null,
        };
        json!({
            "connector": self.connector,
            "checkpoint_table": self.checkpoint_table,
            "checkpoint": checkpoint,
            "server": {
                "version": self.server_version,
                "server_id": self.server_id,
                "binlog_file": self.server_position.file,
                "binlog_pos": self.server_position.pos,
                "gtid_set": self.server_gtid,
            },
            "lag": {
                "bytes": self.lag_bytes,
                "seconds": self.lag_seconds.map(round3),
                "partly_acknowledged": self.partly_acked.as_ref().map(|p| json!({
                    "rows_acked": p.acked,
                    "rows": p.rows,
                    "unrelayed_from": p.unrelayed_from.to_string(),
                })),
                "note": self.lag_note,
            },
            "lease": {
                "held": self.lease_holder.is_some(),
                "holder_connection_id": self.lease_holder,
                "owner": self.row.as_ref().and_then(|r| r.lease_owner.clone()),
                "token": self.row.as_ref().map(|r| r.lease_token),
            },
        })
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "connector         {}", self.connector)?;
        writeln!(f, "checkpoint table  {}", self.checkpoint_table)?;
        match self.stored() {
            Some((r, c)) => {
                writeln!(
                    f,
                    "checkpoint        {} (rows_acked {})",
                    c.position, c.rows_acked
                )?;
                writeln!(
                    f,
                    "checkpoint gtid   {}",
                    c.gtid_set.as_deref().unwrap_or("(none)")
                )?;
                writeln!(
                    f,
                    "updated_at        {} UTC ({} ago)",
                    r.updated_at,
                    human_duration(r.age_seconds)
                )?;
                if !self.checkpoint_available {
                    writeln!(
                        f,
                        "                  NOT AVAILABLE: the server no longer has this position \
                         (see `outbox-relay reset`)"
                    )?;
                }
            }
            _ => writeln!(
                f,
                "checkpoint        none (the relay starts at the server's current end)"
            )?,
        }
        writeln!(
            f,
            "server position   {} (gtid {}; server_id {}, {})",
            self.server_position,
            self.server_gtid.as_deref().unwrap_or("none"),
            self.server_id,
            self.server_version
        )?;
        match (self.lag_bytes, self.lag_seconds) {
            (Some(b), Some(s)) => writeln!(
                f,
                "lag               {b} bytes, {s:.1} s{}",
                if b == 0 {
                    " (caught up)"
                } else {
                    " (seconds since the checkpoint was written)"
                }
            )?,
            _ => writeln!(f, "lag               unknown")?,
        }
        if let Some(p) = &self.partly_acked {
            writeln!(
                f,
                "                  the transaction after the checkpoint is partly acknowledged: \
                 {} of its {} outbox rows; the lag counts from {}",
                p.acked, p.rows, p.unrelayed_from
            )?;
        }
        if let Some(note) = &self.lag_note {
            writeln!(f, "                  {note}")?;
        }
        let owner = self
            .row
            .as_ref()
            .and_then(|r| r.lease_owner.as_deref())
            .unwrap_or("none");
        let token = self.row.as_ref().map_or(0, |r| r.lease_token);
        match self.lease_holder {
            Some(id) => write!(
                f,
                "lease             held by connection {id} (owner {owner}, token {token})"
            ),
            None => write!(
                f,
                "lease             free (last owner {owner}, token {token})"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_checkpoint_tables_own_transactions_are_not_lag() {
        let own = ["(shop.outbox_relay_checkpoint)".to_owned()];
        let ok = |kind: &str, info: &str| not_a_checkpoint_write(kind, info, &own).is_none();
        // MariaDB 10.11 / MySQL 8.0 SHOW BINLOG EVENTS rows of a checkpoint write.
        assert!(ok("Gtid", "BEGIN GTID 0-1-2869"));
        assert!(ok("Gtid", "SET @@SESSION.GTID_NEXT= 'ab:12'"));
        assert!(ok("Query", "BEGIN"));
        assert!(ok(
            "Annotate_rows",
            "UPDATE outbox_relay_checkpoint SET binlog_pos = 4"
        ));
        assert!(ok(
            "Table_map",
            "table_id: 35 (shop.outbox_relay_checkpoint)"
        ));
        assert!(ok("Update_rows_v1", "table_id: 35 flags: STMT_END_F"));
        assert!(ok("Update_rows", "table_id: 92 flags: STMT_END_F"));
        assert!(ok("Xid", "COMMIT /* xid=77 */"));
        // Anything else is lag.
        assert!(!ok("Table_map", "table_id: 36 (shop.outbox)"));
        assert!(!ok("Query", "CREATE TABLE t (id INT)"));
        assert!(!ok("Transaction_payload", "compression='ZSTD'"));
    }
}
