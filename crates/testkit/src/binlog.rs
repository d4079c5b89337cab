//! Reading the server's binary log listing, to check that a stored checkpoint is a transaction
//! boundary.

use std::cmp::Ordering;

use anyhow::{bail, Context, Result};
use mysql_async::prelude::*;
use mysql_async::{Conn, Row};

/// A position in the binary log: the relay's own type (`file:pos` when shown).
pub use outbox_relay_core::position::BinlogPosition;

/// One row of `SHOW BINLOG EVENTS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BinlogEvent {
    /// File the event is in.
    pub log_name: String,
    /// Where the event starts.
    pub pos: u64,
    /// `Xid`, `Query`, `Gtid`, `Table_map`, `Write_rows_v1`, …
    pub event_type: String,
    /// Server id of the server that wrote the event.
    pub server_id: u32,
    /// Where the event ends (the next event starts). MariaDB 11.4+ (`binlog_legacy_event_pos=OFF`,
    /// its default) lists `End_log_pos` 0 for the events inside an event group; the helpers of
    /// this crate fill in the next event's `Pos` instead ([`fill_in_ends`]).
    pub end_log_pos: u64,
    /// `false` when the server showed `End_log_pos` 0 (MariaDB 11.4+ inside a transaction) and
    /// `end_log_pos` was taken from the next event's `Pos`.
    pub end_logged: bool,
    /// The `Info` column (lossily decoded).
    pub info: String,
}

impl BinlogEvent {
    /// The end of an event group: an `Xid` event, or a `Query` event that is not the start of
    /// a transaction (`COMMIT`, or a statement logged on its own such as DDL, which with
    /// `binlog_format=ROW` only appears outside transactions).
    pub fn ends_group(&self) -> bool {
        if self.event_type == "Xid" {
            return true;
        }
        let info = self.info.trim_start().to_ascii_uppercase();
        self.event_type == "Query"
            && !["BEGIN", "XA START", "XA BEGIN", "SAVEPOINT", "ROLLBACK TO"]
                .iter()
                .any(|p| info.starts_with(p))
    }

    /// An `Xid` event, or a `Query` event whose text is `COMMIT`: the end of a transaction.
    pub fn is_commit(&self) -> bool {
        self.event_type == "Xid"
            || (self.event_type == "Query" && self.info.trim().eq_ignore_ascii_case("COMMIT"))
    }
}

/// `SHOW BINARY LOGS`: every binlog file and its size, oldest first.
///
/// # Errors
/// The query fails (binary logging off, no privilege).
pub async fn binary_logs(conn: &mut Conn) -> Result<Vec<(String, u64)>> {
    let rows: Vec<Row> = conn.query("SHOW BINARY LOGS").await?;
    rows.into_iter()
        .map(|row| {
            let name: Option<String> = row.get(0);
            let size: Option<u64> = row.get(1);
            match (name, size) {
                (Some(n), Some(s)) => Ok((n, s)),
                _ => bail!("unexpected SHOW BINARY LOGS row {row:?}"),
            }
        })
        .collect()
}

/// `SHOW MASTER STATUS`: the end of the server's binlog (where the next event will start).
///
/// # Errors
/// The query fails or binary logging is off.
pub async fn current_binlog_position(conn: &mut Conn) -> Result<BinlogPosition> {
    let row: Option<Row> = conn.query_first("SHOW MASTER STATUS").await?;
    let row = row.context("SHOW MASTER STATUS returned nothing: is log_bin on?")?;
    let file: Option<String> = row.get(0);
    let pos: Option<u64> = row.get(1);
    match (file, pos) {
        (Some(file), Some(pos)) => Ok(BinlogPosition { file, pos }),
        _ => bail!("unexpected SHOW MASTER STATUS row {row:?}"),
    }
}

/// Orders two positions by (file's place in `SHOW BINARY LOGS`, offset).
///
/// # Errors
/// Either file is not (or no longer) listed by `SHOW BINARY LOGS`.
pub async fn compare_positions(
    conn: &mut Conn,
    a: &BinlogPosition,
    b: &BinlogPosition,
) -> Result<Ordering> {
    let logs = binary_logs(conn).await?;
    let index = |p: &BinlogPosition| {
        logs.iter()
            .position(|(name, _)| *name == p.file)
            .with_context(|| format!("{} is not in SHOW BINARY LOGS ({logs:?})", p.file))
    };
    Ok((index(a)?, a.pos).cmp(&(index(b)?, b.pos)))
}

const PAGE: u64 = 5_000;

/// Replaces `End_log_pos` 0 (MariaDB 11.4+ inside event groups, see
/// [`BinlogEvent::end_log_pos`]) by the start of the next event of the same file in `events`
/// (consecutive rows of `SHOW BINLOG EVENTS`). The last event keeps what the server said.
pub fn fill_in_ends(events: &mut [BinlogEvent]) {
    for i in 1..events.len() {
        let (before, after) = events.split_at_mut(i);
        let (ev, next) = (&mut before[i - 1], &after[0]);
        if ev.end_log_pos == 0 && next.log_name == ev.log_name && ev.event_type != "Format_desc" {
            ev.end_log_pos = next.pos;
            ev.end_logged = false;
        }
    }
}

/// `SHOW BINLOG EVENTS IN 'file' [FROM from] LIMIT limit`, with [`fill_in_ends`] applied: one
/// more row is read, so the last event returned has its end too.
async fn show_binlog_events(
    conn: &mut Conn,
    file: &str,
    from: Option<u64>,
    limit: u64,
) -> Result<Vec<BinlogEvent>> {
    let quoted = file.replace('\\', "\\\\").replace('\'', "\\'");
    let sql = match from {
        Some(f) => format!(
            "SHOW BINLOG EVENTS IN '{quoted}' FROM {f} LIMIT {}",
            limit + 1
        ),
        None => format!("SHOW BINLOG EVENTS IN '{quoted}' LIMIT {}", limit + 1),
    };
    let rows: Vec<Row> = conn.query(&sql).await.with_context(|| sql.clone())?;
    let mut events = rows
        .into_iter()
        .map(event_from_row)
        .collect::<Result<Vec<_>>>()?;
    fill_in_ends(&mut events);
    events.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    Ok(events)
}

fn event_from_row(row: Row) -> Result<BinlogEvent> {
    let text = |i: usize| -> String {
        row.get::<Option<Vec<u8>>, _>(i)
            .flatten()
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    };
    let num = |i: usize| -> Result<u64> {
        row.get::<Option<u64>, _>(i)
            .flatten()
            .with_context(|| format!("column {i} of SHOW BINLOG EVENTS row {row:?}"))
    };
    Ok(BinlogEvent {
        log_name: text(0),
        pos: num(1)?,
        event_type: text(2),
        server_id: u32::try_from(num(3)?)?,
        end_log_pos: num(4)?,
        end_logged: true,
        info: text(5),
    })
}

/// The event of `file` whose `End_log_pos` is `pos`, if any.
///
/// Scans `SHOW BINLOG EVENTS IN 'file' FROM … LIMIT …` page by page, from `scan_from` when it is
/// given, lies in the same file and not after `pos` (it must be an event start, e.g.
/// [`current_binlog_position`] taken earlier or [`crate::TestDb::created_at_binlog`]), else from
/// the file's start.
///
/// # Errors
/// `file` is not in `SHOW BINARY LOGS`, or a query fails.
pub async fn binlog_event_ending_at(
    conn: &mut Conn,
    file: &str,
    pos: u64,
    scan_from: Option<&BinlogPosition>,
) -> Result<Option<BinlogEvent>> {
    let logs = binary_logs(conn).await?;
    if !logs.iter().any(|(name, _)| name == file) {
        bail!("binlog file {file:?} is not in SHOW BINARY LOGS ({logs:?})");
    }
    let mut from = scan_from
        .filter(|s| s.file == file && s.pos <= pos)
        .map(|s| s.pos);
    loop {
        let events = show_binlog_events(conn, file, from, PAGE).await?;
        let n = events.len() as u64;
        let mut last_end = None;
        for ev in events {
            if ev.end_log_pos == pos {
                return Ok(Some(ev));
            }
            if ev.end_log_pos > pos {
                return Ok(None);
            }
            last_end = Some(ev.end_log_pos);
        }
        match last_end {
            Some(end) if n == PAGE => from = Some(end),
            _ => return Ok(None),
        }
    }
}

/// Whether (`file`, `pos`) is a transaction boundary: `file` is listed by `SHOW BINARY LOGS` and
/// `pos` is the start of the file (4, where a rotation leaves the relay) or the `End_log_pos` of
/// an event that ends a group ([`BinlogEvent::ends_group`]: `Xid`, `COMMIT`, a DDL statement).
/// `scan_from` as for [`binlog_event_ending_at`].
///
/// # Errors
/// A query fails. A file that is not listed gives `Ok(false)`.
pub async fn is_transaction_boundary(
    conn: &mut Conn,
    file: &str,
    pos: u64,
    scan_from: Option<&BinlogPosition>,
) -> Result<bool> {
    let logs = binary_logs(conn).await?;
    if !logs.iter().any(|(name, _)| name == file) {
        return Ok(false);
    }
    if pos == 4 {
        return Ok(true);
    }
    Ok(binlog_event_ending_at(conn, file, pos, scan_from)
        .await?
        .is_some_and(|ev| ev.ends_group()))
}

/// Up to `limit` events of `from.file` starting at `from.pos` (which must be an event start),
/// every `End_log_pos` filled in ([`fill_in_ends`]).
///
/// # Errors
/// The query fails (e.g. `from.pos` is not an event start).
pub async fn binlog_events_from(
    conn: &mut Conn,
    from: &BinlogPosition,
    limit: u64,
) -> Result<Vec<BinlogEvent>> {
    show_binlog_events(conn, &from.file, Some(from.pos), limit).await
}
