//! The checkpoint's stored forms, defined once: the state table's columns and SQL
//! (`migrations/0002_checkpoint.sql`, `0003_checkpoint_layouts.sql`), a row's values ↔
//! [`Checkpoint`], and the exactly-once progress record (JSON) ↔ [`Checkpoint`].
//!
//! Deployments have rows and progress records in these formats: a change here is a change of
//! the stored format, which the pinned-format tests below make a deliberate edit.

use std::sync::Arc;

use mysql_async::{from_value_opt, FromValueError, Value};
use serde::{Deserialize, Serialize};

use crate::error::RelayError;
use crate::position::BinlogPosition;
use crate::state::checkpoint::Checkpoint;

/// Column names of the state table.
pub mod columns {
    /// The key: the connector's name (`VARCHAR(191)`).
    pub const CONNECTOR_NAME: &str = "connector_name";
    /// Binlog file of the position; `''` in a lease placeholder (no position yet).
    pub const BINLOG_FILE: &str = "binlog_file";
    /// Byte offset in `binlog_file` (an event's end).
    pub const BINLOG_POS: &str = "binlog_pos";
    /// Outbox rows of the transaction after the position that are acknowledged too.
    pub const ROWS_ACKED: &str = "rows_acked";
    /// GTID position (MariaDB) or set (MySQL) including the position's transaction; nullable.
    pub const GTID_SET: &str = "gtid_set";
    /// `@@server_id` of the source.
    pub const SOURCE_SERVER_ID: &str = "source_server_id";
    /// `@@server_uuid` of the source (MySQL); nullable.
    pub const SOURCE_SERVER_UUID: &str = "source_server_uuid";
    /// Outbox tables' column layouts (JSON); optional column (migration 0003), nullable.
    pub const TABLE_LAYOUTS: &str = "table_layouts";
    /// Fencing token of the last lease taken.
    pub const LEASE_TOKEN: &str = "lease_token";
    /// `host:pid` of the instance that took the lease last; nullable.
    pub const LEASE_OWNER: &str = "lease_owner";
    /// Time of the last write (`TIMESTAMP(6)`).
    pub const UPDATED_AT: &str = "updated_at";
}

use columns::*;

/// The columns of a [`Checkpoint`], in the order of [`select_checkpoint`]'s values and
/// [`update_checkpoint`]'s parameters (`table_layouts` follows them).
pub const CHECKPOINT_COLUMNS: [&str; 6] = [
    BINLOG_FILE,
    BINLOG_POS,
    ROWS_ACKED,
    GTID_SET,
    SOURCE_SERVER_ID,
    SOURCE_SERVER_UUID,
];

/// The columns every state table has (`migrations/0002_checkpoint.sql`): the key, the
/// [`CHECKPOINT_COLUMNS`], the lease's and `updated_at`; `table_layouts` (0003) is optional.
pub const REQUIRED_COLUMNS: [&str; 10] = {
    let mut all = [CONNECTOR_NAME; 10];
    let mut i = 0;
    while i < CHECKPOINT_COLUMNS.len() {
        all[1 + i] = CHECKPOINT_COLUMNS[i];
        i += 1;
    }
    all[7] = LEASE_TOKEN;
    all[8] = LEASE_OWNER;
    all[9] = UPDATED_AT;
    all
};

/// `SELECT` of `connector`'s checkpoint (one `?`: the connector) from `table` (quoted, see
/// [`crate::config::TableName::quoted`]): the [`CHECKPOINT_COLUMNS`] and `table_layouts`, or
/// `NULL` in its place when the table has no such column. Decode with [`decode_checkpoint`].
pub fn select_checkpoint(table: &str, with_layouts: bool) -> String {
    let layouts = if with_layouts { TABLE_LAYOUTS } else { "NULL" };
    format!(
        "SELECT {}, {layouts} FROM {table} WHERE {CONNECTOR_NAME} = ?",
        CHECKPOINT_COLUMNS.join(", ")
    )
}

/// The fenced write of a checkpoint to `table` (quoted): parameters [`checkpoint_params`],
/// then the connector and the lease token. It matches only while the token is the newest, and
/// sets `updated_at` so the row always changes (one affected row on success).
pub fn update_checkpoint(table: &str, with_layouts: bool) -> String {
    let mut set: Vec<String> = CHECKPOINT_COLUMNS
        .iter()
        .map(|c| format!("{c} = ?"))
        .collect();
    if with_layouts {
        set.push(format!("{TABLE_LAYOUTS} = ?"));
    }
    format!(
        "UPDATE {table} SET {}, {UPDATED_AT} = CURRENT_TIMESTAMP(6) \
         WHERE {CONNECTOR_NAME} = ? AND {LEASE_TOKEN} = ?",
        set.join(", ")
    )
}

/// The values of `checkpoint` for [`update_checkpoint`], in [`CHECKPOINT_COLUMNS`] order, then
/// `table_layouts` when `with_layouts`.
pub fn checkpoint_params(checkpoint: &Checkpoint, with_layouts: bool) -> Vec<Value> {
    let mut params: Vec<Value> = vec![
        checkpoint.position.file.as_str().into(),
        checkpoint.position.pos.into(),
        checkpoint.rows_acked.into(),
        checkpoint.gtid_set.as_deref().into(),
        checkpoint.source_server_id.into(),
        checkpoint.source_server_uuid.as_deref().into(),
    ];
    if with_layouts {
        params.push(checkpoint.table_layouts.as_deref().into());
    }
    params
}

/// Takes the next fencing token (two `?`: connector, owner): inserts a lease placeholder (empty
/// `binlog_file`: no position stored) when the connector has no row, else increments
/// `lease_token`; either way records the owner.
pub fn take_lease(table: &str) -> String {
    format!(
        "INSERT INTO {table} ({CONNECTOR_NAME}, {BINLOG_FILE}, {BINLOG_POS}, {SOURCE_SERVER_ID}, \
         {LEASE_TOKEN}, {LEASE_OWNER}) VALUES (?, '', 0, 0, 1, ?) \
         ON DUPLICATE KEY UPDATE {LEASE_TOKEN} = {LEASE_TOKEN} + 1, \
         {LEASE_OWNER} = VALUES({LEASE_OWNER})"
    )
}

/// `SELECT lease_token` of a connector (one `?`).
pub fn select_lease_token(table: &str) -> String {
    format!("SELECT {LEASE_TOKEN} FROM {table} WHERE {CONNECTOR_NAME} = ?")
}

/// Statements that change no row but need SELECT, INSERT and UPDATE on `table` (`check` runs
/// them in a rolled-back transaction).
pub fn privilege_probes(table: &str) -> [String; 2] {
    let copied = [CONNECTOR_NAME, BINLOG_FILE, BINLOG_POS, SOURCE_SERVER_ID].join(", ");
    [
        format!("INSERT INTO {table} ({copied}) SELECT {copied} FROM {table} WHERE 1 = 0"),
        format!("UPDATE {table} SET {LEASE_OWNER} = {LEASE_OWNER} WHERE 1 = 0"),
    ]
}

/// A stored value that does not fit its column's meaning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadColumn(pub &'static str);

fn take<T: mysql_async::prelude::FromValue>(
    values: &mut [Value],
    i: usize,
    column: &'static str,
) -> Result<T, BadColumn> {
    let v = values
        .get_mut(i)
        .map(|v| std::mem::replace(v, Value::NULL))
        .ok_or(BadColumn(column))?;
    from_value_opt(v).map_err(|_: FromValueError| BadColumn(column))
}

/// The checkpoint in the first seven values of a row of [`select_checkpoint`] (or
/// [`select_state_row`]); `Ok(None)` for a lease placeholder (empty `binlog_file`). An empty
/// `gtid_set` or `table_layouts` is `None`. The position is not validated here (see
/// [`outbox_relay_mysql::state::store::MysqlCheckpointStore`]'s load).
///
/// # Errors
/// [`BadColumn`] naming the first value that is missing, `NULL` where not allowed, or of
/// the wrong type.
pub fn decode_checkpoint(values: &mut [Value]) -> Result<Option<Checkpoint>, BadColumn> {
    let file: String = take(values, 0, BINLOG_FILE)?;
    let pos: u64 = take(values, 1, BINLOG_POS)?;
    let rows_acked: u64 = take(values, 2, ROWS_ACKED)?;
    let gtid_set: Option<String> = take(values, 3, GTID_SET)?;
    let source_server_id: u32 = take(values, 4, SOURCE_SERVER_ID)?;
    let source_server_uuid: Option<String> = take(values, 5, SOURCE_SERVER_UUID)?;
    // Unreadable layouts only cost the layouts (the pipeline reads them from the server then).
    let table_layouts: Option<String> = take(values, 6, TABLE_LAYOUTS).unwrap_or(None);
    if file.is_empty() {
        return Ok(None);
    }
    Ok(Some(Checkpoint {
        position: BinlogPosition::new(file, pos),
        rows_acked,
        gtid_set: gtid_set.filter(|g| !g.trim().is_empty()),
        source_server_id,
        source_server_uuid,
        table_layouts: table_layouts.filter(|l| !l.is_empty()).map(Arc::from),
    }))
}

/// The whole state row of one connector, as stored (lease columns included), with the row's
/// age by the server's clock: what the operator commands (`status`, `check`, `reset`,
/// `prune`, `trace`) and the tests read.
#[derive(Debug, Clone, PartialEq)]
pub struct StateRow {
    /// The stored checkpoint; `None` in a lease placeholder (no position stored yet).
    /// `table_layouts` is never read here (`None`).
    pub checkpoint: Option<Checkpoint>,
    /// `lease_token`.
    pub lease_token: u64,
    /// `lease_owner` (`host:pid` of the instance that took the lease last).
    pub lease_owner: Option<String>,
    /// `updated_at` in the session's time zone, `YYYY-MM-DD HH:MM:SS.ffffff`.
    pub updated_at: String,
    /// Seconds from `updated_at` to the server's `NOW()`.
    pub age_seconds: f64,
}

impl StateRow {
    /// The stored position, unless the row is a lease placeholder.
    pub fn position(&self) -> Option<BinlogPosition> {
        self.checkpoint.as_ref().map(|c| c.position.clone())
    }
}

/// `SELECT` of `connector`'s whole row (one `?`) for [`decode_state_row`]: the checkpoint's
/// values as [`select_checkpoint`] without layouts, then the lease columns, `updated_at` as
/// text and its age in µs.
pub fn select_state_row(table: &str) -> String {
    format!(
        "SELECT {}, NULL, {LEASE_TOKEN}, {LEASE_OWNER}, \
         DATE_FORMAT({UPDATED_AT}, '%Y-%m-%d %H:%i:%s.%f'), \
         TIMESTAMPDIFF(MICROSECOND, {UPDATED_AT}, NOW(6)) FROM {table} \
         WHERE {CONNECTOR_NAME} = ?",
        CHECKPOINT_COLUMNS.join(", ")
    )
}

/// A row of [`select_state_row`].
///
/// # Errors
/// [`BadColumn`] as [`decode_checkpoint`], or for a missing or mistyped lease column.
pub fn decode_state_row(mut values: Vec<Value>) -> Result<StateRow, BadColumn> {
    let checkpoint = decode_checkpoint(&mut values)?;
    Ok(StateRow {
        checkpoint,
        lease_token: take(&mut values, 7, LEASE_TOKEN)?,
        lease_owner: take(&mut values, 8, LEASE_OWNER)?,
        updated_at: take::<Option<String>>(&mut values, 9, UPDATED_AT)?.unwrap_or_default(),
        age_seconds: take::<Option<i64>>(&mut values, 10, UPDATED_AT)
            .ok()
            .flatten()
            .map_or(0.0, |us| us as f64 / 1e6),
    })
}

/// The progress record (exactly-once): the value of the connector-keyed record in the progress
/// topic. Fields serialize in this order, which is the format stored since the first release
/// (keys in alphabetical order).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct ProgressRecord {
    binlog_file: String,
    binlog_pos: u64,
    /// Commit time, ms since the epoch: for operators, not read back.
    #[serde(default)]
    committed_at_ms: u64,
    /// The record's key again: for operators, not read back.
    #[serde(default)]
    connector: String,
    gtid_set: Option<String>,
    rows_acked: u64,
    source_server_id: u32,
    source_server_uuid: Option<String>,
    table_layouts: Option<String>,
}

/// The progress record of `point` for `connector`, committed at `committed_at_ms` (ms since
/// the epoch): one JSON object with the [`CHECKPOINT_COLUMNS`], `table_layouts`, `connector`
/// and `committed_at_ms`, `null` for an absent value.
pub fn encode_progress(connector: &str, point: &Checkpoint, committed_at_ms: u64) -> Vec<u8> {
    let record = ProgressRecord {
        binlog_file: point.position.file.clone(),
        binlog_pos: point.position.pos,
        committed_at_ms,
        connector: connector.to_owned(),
        gtid_set: point.gtid_set.clone(),
        rows_acked: point.rows_acked,
        source_server_id: point.source_server_id,
        source_server_uuid: point.source_server_uuid.clone(),
        table_layouts: point.table_layouts.as_deref().map(str::to_owned),
    };
    // A struct of strings and integers: serializing cannot fail.
    serde_json::to_vec(&record).unwrap_or_default()
}

/// The resume point of a progress record (see [`encode_progress`]); unknown keys are ignored,
/// `connector` and `committed_at_ms` are not needed.
///
/// # Errors
/// [`RelayError::Binlog`] naming what is missing or of the wrong type.
pub fn decode_progress(value: &[u8]) -> Result<Checkpoint, RelayError> {
    let r: ProgressRecord = serde_json::from_slice(value).map_err(|e| {
        RelayError::binlog(format!(
            "the progress record is not a resume point ({e}); fix or delete the record \
             (a tombstone for the connector's key) and reset the connector"
        ))
    })?;
    Ok(Checkpoint {
        position: BinlogPosition::new(r.binlog_file, r.binlog_pos),
        rows_acked: r.rows_acked,
        gtid_set: r.gtid_set,
        source_server_id: r.source_server_id,
        source_server_uuid: r.source_server_uuid,
        table_layouts: r.table_layouts.map(Arc::from),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point() -> Checkpoint {
        Checkpoint {
            position: BinlogPosition::new("binlog.000007", 1234),
            rows_acked: 17,
            gtid_set: Some("3E11FA47-71CA-11E1-9E33-C80AA9429562:1-77".into()),
            source_server_id: 8,
            source_server_uuid: Some("3e11fa47-71ca-11e1-9e33-c80aa9429562".into()),
            table_layouts: Some(Arc::from("{\"shop.outbox\":[]}")),
        }
    }

    fn bare() -> Checkpoint {
        Checkpoint {
            gtid_set: None,
            source_server_uuid: None,
            table_layouts: None,
            ..point()
        }
    }

    /// The stored progress format, byte for byte (what releases before this module wrote, with
    /// serde_json's sorted keys): change it only together with a migration of existing records.
    #[test]
    fn progress_format_is_pinned() {
        let full = r#"{"binlog_file":"binlog.000007","binlog_pos":1234,"committed_at_ms":1796327151832,"connector":"orders","gtid_set":"3E11FA47-71CA-11E1-9E33-C80AA9429562:1-77","rows_acked":17,"source_server_id":8,"source_server_uuid":"3e11fa47-71ca-11e1-9e33-c80aa9429562","table_layouts":"{\"shop.outbox\":[]}"}"#;
        let nulls = r#"{"binlog_file":"binlog.000007","binlog_pos":1234,"committed_at_ms":0,"connector":"ordérs","gtid_set":null,"rows_acked":17,"source_server_id":8,"source_server_uuid":null,"table_layouts":null}"#;
        assert_eq!(
            String::from_utf8(encode_progress("orders", &point(), 1_796_327_151_832)).ok(),
            Some(full.to_owned())
        );
        assert_eq!(
            String::from_utf8(encode_progress("ordérs", &bare(), 0)).ok(),
            Some(nulls.to_owned())
        );
        assert_eq!(decode_progress(full.as_bytes()).ok(), Some(point()));
        assert_eq!(decode_progress(nulls.as_bytes()).ok(), Some(bare()));
    }

    #[test]
    fn a_progress_record_gives_back_its_resume_point() {
        for p in [point(), bare()] {
            let value = encode_progress("orders", &p, 42);
            assert_eq!(decode_progress(&value).ok(), Some(p));
        }
        // Only the resume point's keys are needed; unknown keys are ignored.
        let minimal =
            br#"{"binlog_file":"b.1","binlog_pos":4,"rows_acked":0,"source_server_id":1,"x":[]}"#;
        assert_eq!(
            decode_progress(minimal).ok().map(|c| c.position),
            Some(BinlogPosition::new("b.1", 4))
        );
    }

    #[test]
    fn a_record_that_is_not_a_resume_point_is_named() {
        let Err(e) = decode_progress(br#"{"binlog_file":"b.1"}"#) else {
            panic!("decoded");
        };
        assert!(e.to_string().contains("binlog_pos"), "{e}");
        assert!(decode_progress(b"not json").is_err());
        let too_big =
            br#"{"binlog_file":"b.1","binlog_pos":4,"rows_acked":0,"source_server_id":4294967296}"#;
        assert!(decode_progress(too_big).is_err());
    }

    /// The state table's columns and statements, as deployed tables have them.
    #[test]
    fn column_list_and_statements_are_pinned() {
        assert_eq!(
            CHECKPOINT_COLUMNS.join(", "),
            "binlog_file, binlog_pos, rows_acked, gtid_set, source_server_id, source_server_uuid"
        );
        assert_eq!(
            REQUIRED_COLUMNS.join(", "),
            "connector_name, binlog_file, binlog_pos, rows_acked, gtid_set, source_server_id, \
             source_server_uuid, lease_token, lease_owner, updated_at"
        );
        let t = "`shop`.`outbox_relay_checkpoint`";
        assert_eq!(
            select_checkpoint(t, true),
            "SELECT binlog_file, binlog_pos, rows_acked, gtid_set, source_server_id, \
             source_server_uuid, table_layouts FROM `shop`.`outbox_relay_checkpoint` \
             WHERE connector_name = ?"
        );
        assert!(select_checkpoint(t, false).contains("source_server_uuid, NULL FROM"));
        assert_eq!(
            update_checkpoint(t, true),
            "UPDATE `shop`.`outbox_relay_checkpoint` SET binlog_file = ?, binlog_pos = ?, \
             rows_acked = ?, gtid_set = ?, source_server_id = ?, source_server_uuid = ?, \
             table_layouts = ?, updated_at = CURRENT_TIMESTAMP(6) \
             WHERE connector_name = ? AND lease_token = ?"
        );
        assert_eq!(
            take_lease(t),
            "INSERT INTO `shop`.`outbox_relay_checkpoint` (connector_name, binlog_file, \
             binlog_pos, source_server_id, lease_token, lease_owner) VALUES (?, '', 0, 0, 1, ?) \
             ON DUPLICATE KEY UPDATE lease_token = lease_token + 1, \
             lease_owner = VALUES(lease_owner)"
        );
        assert_eq!(
            privilege_probes(t),
            [
                "INSERT INTO `shop`.`outbox_relay_checkpoint` (connector_name, binlog_file, \
                 binlog_pos, source_server_id) SELECT connector_name, binlog_file, binlog_pos, \
                 source_server_id FROM `shop`.`outbox_relay_checkpoint` WHERE 1 = 0",
                "UPDATE `shop`.`outbox_relay_checkpoint` SET lease_owner = lease_owner WHERE 1 = 0"
            ]
        );
        assert_eq!(
            select_state_row(t),
            "SELECT binlog_file, binlog_pos, rows_acked, gtid_set, source_server_id, \
             source_server_uuid, NULL, lease_token, lease_owner, \
             DATE_FORMAT(updated_at, '%Y-%m-%d %H:%i:%s.%f'), \
             TIMESTAMPDIFF(MICROSECOND, updated_at, NOW(6)) FROM \
             `shop`.`outbox_relay_checkpoint` WHERE connector_name = ?"
        );
    }

    /// What [`update_checkpoint`] writes (text as bytes, integers as integers, as the server
    /// returns them) decodes to the checkpoint again.
    #[test]
    fn row_values_give_back_the_checkpoint() {
        for p in [point(), bare()] {
            let mut values = checkpoint_params(&p, true);
            assert_eq!(values.len(), CHECKPOINT_COLUMNS.len() + 1);
            assert_eq!(decode_checkpoint(&mut values), Ok(Some(p.clone())));
            // Without the layouts column: NULL in its place.
            let mut values = checkpoint_params(&p, false);
            values.push(Value::NULL);
            let without = Checkpoint {
                table_layouts: None,
                ..p
            };
            assert_eq!(decode_checkpoint(&mut values), Ok(Some(without)));
        }
    }

    #[test]
    fn placeholders_empty_values_and_bad_values() {
        let row = |file: &str, gtid: Value, id: Value| {
            vec![
                Value::from(file),
                Value::UInt(4),
                Value::UInt(0),
                gtid,
                id,
                Value::NULL,
                Value::from(""),
            ]
        };
        assert_eq!(
            decode_checkpoint(&mut row("", Value::NULL, Value::UInt(0))),
            Ok(None)
        );
        let cp = decode_checkpoint(&mut row("b.1", Value::from(" "), Value::UInt(1)))
            .expect("decodes")
            .expect("a checkpoint");
        assert_eq!((cp.gtid_set, cp.table_layouts), (None, None));
        assert_eq!(
            decode_checkpoint(&mut row("b.1", Value::NULL, Value::NULL)),
            Err(BadColumn(SOURCE_SERVER_ID))
        );
        let mut short = vec![Value::from("b.1")];
        assert_eq!(decode_checkpoint(&mut short), Err(BadColumn(BINLOG_POS)));
    }

    #[test]
    fn a_state_row_decodes_with_its_lease_columns() {
        let mut values = checkpoint_params(&bare(), false);
        values.extend([
            Value::NULL,
            Value::UInt(3),
            Value::from("host:42"),
            Value::from("2026-01-02 03:04:05.000006"),
            Value::Int(1_500_000),
        ]);
        let row = decode_state_row(values).expect("decodes");
        assert_eq!(row.checkpoint, Some(bare()));
        assert_eq!(row.position(), Some(bare().position));
        assert_eq!(row.lease_token, 3);
        assert_eq!(row.lease_owner.as_deref(), Some("host:42"));
        assert_eq!(row.updated_at, "2026-01-02 03:04:05.000006");
        assert!((row.age_seconds - 1.5).abs() < 1e-9);
        let placeholder = vec![
            Value::from(""),
            Value::UInt(0),
            Value::UInt(0),
            Value::NULL,
            Value::UInt(0),
            Value::NULL,
            Value::NULL,
            Value::UInt(1),
            Value::NULL,
            Value::NULL,
            Value::NULL,
        ];
        let row = decode_state_row(placeholder).expect("decodes");
        assert_eq!((row.checkpoint, row.lease_token), (None, 1));
    }
}
