//! Scanning the server's binlog across files (`SHOW BINLOG EVENTS`), to find a test's own
//! transaction by its GTID and to count what was written to a table (e.g. the relay's
//! checkpoint writes) since a position.

use std::ops::ControlFlow;

use anyhow::{Context, Result};
use mysql_async::prelude::*;
use mysql_async::{Conn, Row};

use crate::binlog::{binary_logs, binlog_events_from, BinlogEvent, BinlogPosition};

/// Events read per `SHOW BINLOG EVENTS` page.
const SCAN_PAGE: u64 = 5_000;

/// Calls `visit` with every event from `from` (an event start, e.g. a position from
/// [`crate::current_binlog_position`]) to the current end of the binlog, following the files of
/// `SHOW BINARY LOGS` in order, until `visit` breaks. Returns the break value, if any.
///
/// # Errors
/// `from.file` is not listed by `SHOW BINARY LOGS`, or a query fails.
pub async fn scan_binlog<B>(
    conn: &mut Conn,
    from: &BinlogPosition,
    mut visit: impl FnMut(&BinlogEvent) -> ControlFlow<B>,
) -> Result<Option<B>> {
    let logs = binary_logs(conn).await?;
    let first = logs
        .iter()
        .position(|(name, _)| *name == from.file)
        .with_context(|| format!("{} is not in SHOW BINARY LOGS ({logs:?})", from.file))?;
    for (i, (file, _)) in logs.iter().enumerate().skip(first) {
        let mut at = BinlogPosition {
            file: file.clone(),
            pos: if i == first { from.pos } else { 4 },
        };
        loop {
            let events = binlog_events_from(conn, &at, SCAN_PAGE).await?;
            let n = events.len() as u64;
            for ev in &events {
                if let ControlFlow::Break(b) = visit(ev) {
                    return Ok(Some(b));
                }
            }
            match events.last() {
                Some(last) if n == SCAN_PAGE && last.end_log_pos > at.pos => {
                    at.pos = last.end_log_pos;
                }
                _ => break,
            }
        }
    }
    Ok(None)
}

/// One transaction found in the binlog.
#[derive(Debug, Clone)]
pub struct BinlogTransaction {
    /// Where its GTID event starts: the boundary before it.
    pub start: BinlogPosition,
    /// Where its Xid/COMMIT event ends: the boundary after it.
    pub end: BinlogPosition,
    /// Its events, from the GTID event to the Xid/COMMIT event.
    pub events: Vec<BinlogEvent>,
}

impl BinlogTransaction {
    /// The position the relay names for a row of `rows_event` (one of this transaction's
    /// events) in a row error or a dead letter's `dlq_binlog_pos`: the event's end, or, when the
    /// server did not log it (MariaDB 11.4+, `binlog_legacy_event_pos=OFF`), the end of the
    /// transaction's GTID event: a dump leaves out events, so the relay cannot add up sizes.
    pub fn relay_row_position(&self, rows_event: &BinlogEvent) -> BinlogPosition {
        let pos = if rows_event.end_logged {
            rows_event.end_log_pos
        } else {
            self.events
                .iter()
                .find(|e| e.event_type == "Gtid")
                .map_or(rows_event.end_log_pos, |g| g.end_log_pos)
        };
        BinlogPosition {
            file: rows_event.log_name.clone(),
            pos,
        }
    }

    /// Its `Write_rows` events on `database.table`, in order (each preceded by a `Table_map`
    /// event naming the table).
    pub fn write_rows_events(&self, database: &str, table: &str) -> Vec<&BinlogEvent> {
        let mut out = Vec::new();
        let mut on_table = false;
        for ev in &self.events {
            if ev.event_type == "Table_map" {
                on_table = names_table(ev, database, table);
            } else if ev.event_type.starts_with("Write_rows") && on_table {
                out.push(ev);
            }
        }
        out
    }
}

/// The GTID of the last transaction the session committed: MariaDB's `@@last_gtid`
/// (`0-1-42`); on MySQL, the session's newest transaction with a GTID in
/// `performance_schema.events_transactions_history` (`uuid:42`; the consumer is on by default
/// in 8.0 and keeps each thread's last 10 transactions).
///
/// # Errors
/// The query fails or the session has committed nothing yet (on MySQL also: GTIDs are off).
pub async fn last_gtid(conn: &mut Conn) -> Result<String> {
    let gtid: Option<String> = if crate::env::test_server().is_mysql() {
        conn.query_first(
            "SELECT GTID FROM performance_schema.events_transactions_history \
             WHERE THREAD_ID = PS_CURRENT_THREAD_ID() AND GTID LIKE '%:%' \
             ORDER BY EVENT_ID DESC LIMIT 1",
        )
        .await?
    } else {
        conn.query_first("SELECT @@last_gtid").await?
    };
    gtid.filter(|g| !g.is_empty()).context(
        "no GTID for the session's last transaction: it has committed none (or GTIDs are off)",
    )
}

/// Whether a `Gtid` event's `Info` is `gtid`: MariaDB `BEGIN GTID 0-1-42`, `GTID 0-1-42`,
/// `… cid=7`; MySQL `SET @@SESSION.GTID_NEXT= 'uuid:42'`.
fn is_gtid_event_of(ev: &BinlogEvent, gtid: &str) -> bool {
    ev.event_type == "Gtid"
        && ev
            .info
            .split_whitespace()
            .any(|t| t.trim_matches(|c| c == '\'' || c == ';') == gtid)
}

/// Whether a `Table_map` event's `Info` (`table_id: 33 (db.table)`) names `database.table`.
pub fn names_table(ev: &BinlogEvent, database: &str, table: &str) -> bool {
    ev.event_type == "Table_map"
        && ev
            .info
            .trim_end()
            .ends_with(&format!("({database}.{table})"))
}

/// The transaction with MariaDB GTID `gtid` (`0-1-42`), searched from `from` on.
///
/// # Errors
/// A query fails.
pub async fn find_transaction(
    conn: &mut Conn,
    from: &BinlogPosition,
    gtid: &str,
) -> Result<Option<BinlogTransaction>> {
    let mut current: Option<Vec<BinlogEvent>> = None;
    scan_binlog(conn, from, |ev| {
        match current.as_mut() {
            None => {
                if is_gtid_event_of(ev, gtid) {
                    current = Some(vec![ev.clone()]);
                }
            }
            Some(events) => {
                events.push(ev.clone());
                if ev.is_commit() {
                    let first = &events[0];
                    return ControlFlow::Break(BinlogTransaction {
                        start: BinlogPosition {
                            file: first.log_name.clone(),
                            pos: first.pos,
                        },
                        end: BinlogPosition {
                            file: ev.log_name.clone(),
                            pos: ev.end_log_pos,
                        },
                        events: std::mem::take(events),
                    });
                }
            }
        }
        ControlFlow::Continue(())
    })
    .await
}

/// How many statements wrote `database.table` (its `Table_map` events) from `from` to the
/// current end of the binlog. For the relay's checkpoint table this is the number of checkpoint
/// writes (one UPDATE per write).
///
/// # Errors
/// A query fails.
pub async fn count_table_writes(
    conn: &mut Conn,
    from: &BinlogPosition,
    database: &str,
    table: &str,
) -> Result<usize> {
    let mut n = 0usize;
    scan_binlog::<()>(conn, from, |ev| {
        if names_table(ev, database, table) {
            n += 1;
        }
        ControlFlow::Continue(())
    })
    .await?;
    Ok(n)
}

/// How many transactions (GTID event groups) from `from` on did not write `database.table`:
/// the server's other traffic (DDL included).
///
/// # Errors
/// A query fails.
pub async fn count_other_transactions(
    conn: &mut Conn,
    from: &BinlogPosition,
    database: &str,
    table: &str,
) -> Result<usize> {
    let mut others = 0usize;
    let mut in_tx: Option<bool> = None; // Some(touched the table)
    scan_binlog::<()>(conn, from, |ev| {
        if ev.event_type == "Gtid" {
            if in_tx == Some(false) {
                others += 1;
            }
            in_tx = Some(false);
        } else if names_table(ev, database, table) {
            in_tx = Some(true);
        }
        ControlFlow::Continue(())
    })
    .await?;
    if in_tx == Some(false) {
        others += 1;
    }
    Ok(others)
}

/// `SHOW BINARY LOGS`' newest file.
///
/// # Errors
/// The query fails or lists nothing.
pub async fn newest_binlog_file(conn: &mut Conn) -> Result<String> {
    binary_logs(conn)
        .await?
        .pop()
        .map(|(name, _)| name)
        .context("SHOW BINARY LOGS is empty")
}

/// The `Write_rows` event of `file` that ends at `end_log_pos`, if there is one.
///
/// # Errors
/// A query fails.
pub async fn write_rows_event_ending_at(
    conn: &mut Conn,
    file: &str,
    end_log_pos: u64,
    scan_from: Option<&BinlogPosition>,
) -> Result<Option<BinlogEvent>> {
    let ev = crate::binlog::binlog_event_ending_at(conn, file, end_log_pos, scan_from).await?;
    Ok(ev.filter(|e| e.event_type.starts_with("Write_rows")))
}

/// `SELECT @@GLOBAL.<name>` as text.
///
/// # Errors
/// The variable does not exist or the query fails.
pub async fn global_variable(conn: &mut Conn, name: &str) -> Result<String> {
    anyhow::ensure!(
        name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
        "not a variable name: {name:?}"
    );
    let row: Option<Row> = conn
        .query_first(format!("SELECT CAST(@@GLOBAL.{name} AS CHAR)"))
        .await?;
    row.and_then(|r| r.get::<Option<String>, _>(0).flatten())
        .with_context(|| format!("@@GLOBAL.{name} has no value"))
}

/// One transaction (GTID event group) and the tables its rows events wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransactionTables {
    /// Where its GTID event starts.
    pub start: BinlogPosition,
    /// `database.table` of each `Table_map` event in it (one per written table and statement).
    pub tables: Vec<String>,
}

impl TransactionTables {
    /// Whether it wrote `database.table`.
    pub fn writes(&self, database: &str, table: &str) -> bool {
        let name = format!("{database}.{table}");
        self.tables.contains(&name)
    }
}

/// The transactions that start in [`from`, `to`) (both event starts, e.g. positions from
/// [`crate::current_binlog_position`]), with the tables each wrote.
///
/// # Errors
/// A position's file is not listed by `SHOW BINARY LOGS`, or a query fails.
pub async fn binlog_transactions(
    conn: &mut Conn,
    from: &BinlogPosition,
    to: &BinlogPosition,
) -> Result<Vec<TransactionTables>> {
    let logs = binary_logs(conn).await?;
    let index = |p: &BinlogPosition| {
        logs.iter()
            .position(|(name, _)| *name == p.file)
            .with_context(|| format!("{} is not in SHOW BINARY LOGS ({logs:?})", p.file))
    };
    let to_key = (index(to)?, to.pos);
    let file_index: std::collections::HashMap<String, usize> = logs
        .iter()
        .enumerate()
        .map(|(i, (name, _))| (name.clone(), i))
        .collect();
    let mut out: Vec<TransactionTables> = Vec::new();
    scan_binlog::<()>(conn, from, |ev| {
        let key = (
            file_index.get(&ev.log_name).copied().unwrap_or(usize::MAX),
            ev.pos,
        );
        if key >= to_key {
            return ControlFlow::Break(());
        }
        if ev.event_type == "Gtid" {
            out.push(TransactionTables {
                start: BinlogPosition {
                    file: ev.log_name.clone(),
                    pos: ev.pos,
                },
                tables: Vec::new(),
            });
        } else if ev.event_type == "Table_map" {
            if let (Some(tx), Some(name)) = (out.last_mut(), table_map_name(ev)) {
                tx.tables.push(name);
            }
        }
        ControlFlow::Continue(())
    })
    .await?;
    Ok(out)
}

/// `database.table` from a `Table_map` event's `Info` (`table_id: 33 (db.table)`).
fn table_map_name(ev: &BinlogEvent) -> Option<String> {
    let info = ev.info.trim_end();
    let open = info.rfind('(')?;
    info.strip_suffix(')').map(|s| s[open + 1..].to_owned())
}
