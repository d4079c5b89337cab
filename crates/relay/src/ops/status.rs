//! `outbox-relay status`: the stored checkpoint, the server's current end of binlog, the lag
//! between them, and who holds the connector's lease.
//!
//! Lag in bytes is the binlog between the checkpoint and the server's end (the file sizes of
//! `SHOW BINARY LOGS`). Lag in seconds is 0 when the checkpoint is at the end, else the age of
//! the checkpoint row (the server's `NOW()` minus `updated_at`): binlog events carry their times
//! only in the binlog itself (not in `SHOW BINLOG EVENTS`), and reading it would need a dump
//! connection, so the age of the last checkpoint write stands in for the age of the oldest
//! unrelayed event.

use std::fmt;

use mysql_async::prelude::Queryable;
use serde_json::{json, Value};

use super::{binary_logs, bytes_between, human_duration, lease_holder, read_state_row, StateRow};
use crate::config::RelayConfig;
use crate::error::RelayError;
use crate::position::BinlogPosition;
use crate::preflight;
use crate::source::Flavor;

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
    /// Bytes of binlog from the checkpoint to the end (`None` without a checkpoint, or when its
    /// file is gone).
    pub lag_bytes: Option<u64>,
    /// 0 when caught up, else the checkpoint's age (see the module docs).
    pub lag_seconds: Option<f64>,
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
    let server_gtid = match server.flavor {
        Flavor::MariaDb => conn
            .query_first::<Option<String>, _>("SELECT @@GLOBAL.gtid_binlog_pos")
            .await?
            .flatten()
            .filter(|g| !g.is_empty()),
        Flavor::MySql => executed,
    };
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
    let lag_bytes = position
        .as_ref()
        .and_then(|p| bytes_between(&logs, p, &end));
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
        lease_holder: holder,
    })
}

/// A missing checkpoint table as the prerequisite error that names the migration.
pub(crate) fn missing_table(e: RelayError, table: &crate::config::TableName) -> RelayError {
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
    /// The stored position, if any.
    pub fn checkpoint(&self) -> Option<BinlogPosition> {
        self.row.as_ref().and_then(StateRow::position)
    }

    /// One JSON object; keys as documented in the README ("status").
    pub fn to_json(&self) -> Value {
        let checkpoint = match (&self.row, self.checkpoint()) {
            (Some(r), Some(p)) => json!({
                "binlog_file": p.file,
                "binlog_pos": p.pos,
                "rows_acked": r.rows_acked,
                "gtid_set": r.gtid_set,
                "source_server_id": r.source_server_id,
                "updated_at": r.updated_at_utc,
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
        match (&self.row, self.checkpoint()) {
            (Some(r), Some(p)) => {
                writeln!(f, "checkpoint        {p} (rows_acked {})", r.rows_acked)?;
                writeln!(
                    f,
                    "checkpoint gtid   {}",
                    r.gtid_set.as_deref().unwrap_or("(none)")
                )?;
                writeln!(
                    f,
                    "updated_at        {} UTC ({} ago)",
                    r.updated_at_utc,
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
