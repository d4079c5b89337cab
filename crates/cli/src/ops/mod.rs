//! Operator commands of the `outbox-relay` binary besides `run` and `replay`: [`check`] (every
//! prerequisite, one line each), [`status`] (checkpoint, lag, lease), [`reset`] (move the
//! checkpoint), [`migrate`] (create or upgrade the tables), [`prune`] (delete relayed outbox
//! rows), [`inbox`] (the consumers' inbox tables: `migrate --inbox`, `prune --inbox`) and
//! [`fleet`] (`fleet status`: a fleet's sources, owners and leases),
//! [`debezium`] (`migrate-from debezium`: the checkpoint from a stopped Debezium connector's offset). Each returns a report the command line prints; exit codes are in docs/src/operations/commands.md
//! ("Operations").

pub mod check;
pub mod debezium;
pub mod dlq;
pub mod fleet;
pub mod grants;
pub mod inbox;
pub mod java_stream;
pub mod migrate;
pub mod prune;
pub mod republish;
pub mod reset;
pub mod scan;
pub mod status;
pub mod trace;

use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, Row};

use outbox_relay_core::config::{RelayConfig, TableName};
use outbox_relay_core::error::RelayError;
use outbox_relay_core::position::BinlogPosition;

/// Exit code of a command that changes state run without `--yes` (`reset`, `prune`,
/// `republish`, `dlq replay`, …: `commands::Confirm`): the plan was printed, nothing changed.
pub const EXIT_NOT_CONFIRMED: u8 = 4;

/// Opens one connection to `config`'s server (`mysql.url`), within `mysql.read_timeout_ms`.
///
/// # Errors
/// [`RelayError::Config`] for an invalid URL; [`RelayError::Mysql`] (or
/// [`RelayError::Prerequisite`] for access denied) when the server cannot be reached.
pub async fn connect(config: &RelayConfig) -> Result<Conn, RelayError> {
    let opts = opts(config)?;
    let mut conn = outbox_relay_core::error::with_timeout(
        Duration::from_millis(config.mysql.read_timeout_ms),
        "connecting to MySQL",
        Conn::new(opts),
    )
    .await??;
    // TIMESTAMP values (updated_at) and NOW() in UTC, whatever the server's zone.
    conn.query_drop("SET time_zone = '+00:00'").await?;
    Ok(conn)
}

/// The connection options of `[mysql]`, with its TLS settings and password
/// ([`outbox_relay_core::config::mysql_tls::opts`]), as `run` uses them.
///
/// # Errors
/// [`RelayError::Config`] for an invalid URL or TLS setting.
pub fn opts(config: &RelayConfig) -> Result<Opts, RelayError> {
    outbox_relay_core::config::mysql_tls::opts(&config.mysql)
}

/// `SHOW BINARY LOGS`: every binlog file the server has, oldest first, with its size in bytes.
///
/// # Errors
/// [`RelayError::Mysql`] (or [`RelayError::Prerequisite`] without REPLICATION CLIENT / BINLOG
/// MONITOR) when the statement fails.
pub async fn binary_logs(conn: &mut Conn) -> Result<Vec<(String, u64)>, RelayError> {
    let rows: Vec<Row> = conn.query("SHOW BINARY LOGS").await?;
    Ok(rows
        .into_iter()
        .filter_map(|r| Some((r.get::<String, _>(0)?, r.get::<u64, _>(1)?)))
        .collect())
}

/// The table mappings of the outbox tables, or only of `table` (`database.table`, a
/// command's `--table`). A pattern (`tenant_*.outbox`) stands for the tables that match it on
/// the server now (one mapping each); `--table` names one table, an exact outbox table or one a
/// pattern matches.
///
/// # Errors
/// [`RelayError::Argument`] when `table` is a pattern or not an outbox table; mapping errors as
/// [`RelayConfig::table_mappings`]; [`RelayError::Mysql`] when the tables of a pattern cannot be
/// listed.
pub async fn selected_mappings(
    conn: &mut Conn,
    config: &RelayConfig,
    table: Option<&str>,
) -> Result<Vec<outbox_relay_core::outbox::mapping::TableMapping>, RelayError> {
    let mappings = config.table_mappings()?;
    let Some(only) = table else {
        return outbox_relay_mysql::preflight::resolve_mappings(conn, &mappings).await;
    };
    let wanted = TableName::parse(only, None)?;
    if outbox_relay_core::outbox::pattern::is_pattern(&wanted) {
        return Err(RelayError::Argument(format!(
            "--table {only} is a pattern: --table names one table (leave it out for every \
             table the configured patterns match now)"
        )));
    }
    match outbox_relay_core::outbox::mapping::mapping_of(&mappings, &wanted) {
        Some(m) => Ok(vec![m]),
        None => Err(RelayError::Argument(format!(
            "--table {only} is not one of the outbox tables in outbox.tables (nor matches one \
             of its patterns)"
        ))),
    }
}

/// Bytes of binlog from `from` to `to` (`to` at or after `from`), from the file sizes of `logs`
/// ([`binary_logs`]): the rest of `from`'s file, every file in between, and `to.pos` bytes of
/// `to`'s file (counting from the file start, header included). `None` when a file is not in
/// `logs` or `to` is before `from`.
pub fn bytes_between(
    logs: &[(String, u64)],
    from: &BinlogPosition,
    to: &BinlogPosition,
) -> Option<u64> {
    let a = logs.iter().position(|(n, _)| *n == from.file)?;
    let b = logs.iter().position(|(n, _)| *n == to.file)?;
    if a == b {
        return to.pos.checked_sub(from.pos);
    }
    if b < a {
        return None;
    }
    let rest = logs[a].1.checked_sub(from.pos)?;
    let middle: u64 = logs[a + 1..b].iter().map(|(_, size)| size).sum();
    Some(rest + middle + to.pos)
}

/// Walks `SHOW BINLOG EVENTS` from `from` (an event start) up to `to` (exclusive), across
/// files, and returns the first event `visit` objects to (`visit(Event_type, Info)` returns
/// why), as "why at file:pos". `Some` also when `from`'s file is gone or more than `max`
/// events lie between; `None` when every event up to `to` passed.
///
/// # Errors
/// A query fails (`SHOW BINLOG EVENTS` needs REPLICATION SLAVE / BINLOG MONITOR).
pub async fn first_event_between(
    conn: &mut Conn,
    from: &BinlogPosition,
    to: &BinlogPosition,
    max: usize,
    mut visit: impl FnMut(&str, &str) -> Option<String>,
) -> Result<Option<String>, RelayError> {
    let logs = binary_logs(conn).await?;
    let Some(a) = logs.iter().position(|(f, _)| *f == from.file) else {
        return Ok(Some(format!("the checkpoint's file {} is gone", from.file)));
    };
    let mut inspected = 0usize;
    for (file, _) in &logs[a..] {
        let start = if *file == from.file { from.pos } else { 4 };
        // SHOW BINLOG EVENTS takes no placeholders: the name as a quoted literal.
        let literal = file.replace('\\', "\\\\").replace('\'', "''");
        let rows: Vec<Row> = conn
            .query(format!(
                "SHOW BINLOG EVENTS IN '{literal}' FROM {start} LIMIT {}",
                max.saturating_add(1)
            ))
            .await?;
        for r in rows {
            let pos: u64 = r.get(1).unwrap_or(0);
            if *file == to.file && pos >= to.pos {
                return Ok(None);
            }
            inspected += 1;
            if inspected > max {
                return Ok(Some(format!("more than {max} events")));
            }
            let kind: String = r.get(2).unwrap_or_default();
            let info: String = r
                .get::<Option<Vec<u8>>, _>(5)
                .flatten()
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default();
            if let Some(why) = visit(&kind, &info) {
                return Ok(Some(format!("{why} at {file}:{pos}")));
            }
        }
        if *file == to.file {
            return Ok(None);
        }
    }
    Ok(None)
}

pub use outbox_relay_core::state::codec::StateRow;

pub use outbox_relay_mysql::state::store::{lease_holder, read_state_row};

/// Seconds since the epoch as `YYYY-MM-DD HH:MM:SS UTC`.
pub fn format_utc(secs: i64) -> String {
    chrono::DateTime::from_timestamp(secs, 0)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_else(|| format!("{secs} s since the epoch"))
}

/// A human-readable duration: `42 s`, `3 min 5 s`, `2 h 3 min`, `4 d 2 h`.
pub fn human_duration(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    match s {
        0..=59 => format!("{s} s"),
        60..=3599 => format!("{} min {} s", s / 60, s % 60),
        3600..=86_399 => format!("{} h {} min", s / 3600, (s % 3600) / 60),
        _ => format!("{} d {} h", s / 86_400, (s % 86_400) / 3600),
    }
}

/// `ident` quoted as a MySQL identifier: `` `name` `` with backticks doubled.
/// `DATA_TYPE` (lower case) of `m`'s `created_at` column from information_schema; `None` when
/// the table or the column does not exist.
///
/// # Errors
/// [`RelayError::Mysql`] when the query fails.
pub(crate) async fn created_at_type(
    conn: &mut Conn,
    m: &outbox_relay_core::outbox::mapping::TableMapping,
) -> Result<Option<String>, RelayError> {
    Ok(conn
        .exec_first(
            "SELECT LOWER(DATA_TYPE) FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND COLUMN_NAME = ?",
            (&m.table.database, &m.table.table, &m.columns.created_at),
        )
        .await?)
}

pub(crate) fn quote_ident(ident: &str) -> String {
    format!("`{}`", ident.replace('`', "``"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_between_sums_the_files_in_between() {
        let logs = vec![
            ("bin.000001".to_owned(), 1000),
            ("bin.000002".to_owned(), 2000),
            ("bin.000003".to_owned(), 500),
        ];
        let p = |f: &str, pos| BinlogPosition::new(f, pos);
        assert_eq!(
            bytes_between(&logs, &p("bin.000002", 100), &p("bin.000002", 350)),
            Some(250)
        );
        // 900 left in 000001, all 2000 of 000002, 300 of 000003.
        assert_eq!(
            bytes_between(&logs, &p("bin.000001", 100), &p("bin.000003", 300)),
            Some(3200)
        );
        assert_eq!(
            bytes_between(&logs, &p("bin.000000", 4), &p("bin.000003", 300)),
            None
        );
        assert_eq!(
            bytes_between(&logs, &p("bin.000003", 4), &p("bin.000001", 300)),
            None
        );
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(human_duration(0.4), "0 s");
        assert_eq!(human_duration(185.0), "3 min 5 s");
        assert_eq!(human_duration(7380.0), "2 h 3 min");
        assert_eq!(human_duration(360_000.0), "4 d 4 h");
    }
}
