//! Decode: binlog events → outbox events and transaction boundaries.
//!
//! The [`Decoder`] sees every event of the stream in order. It turns WRITE_ROWS events on the
//! configured outbox tables into [`OutboxEvent`]s and reports the end of each transaction (XID,
//! `COMMIT`, or a statement outside a transaction such as DDL) as a [`TxBoundary`]: the only
//! places where a checkpoint may be stored. UPDATE/DELETE rows events and other tables produce
//! nothing.
//!
//! Only committed transactions reach the binlog (InnoDB writes a transaction at commit), so rows
//! are relayed as they are read, without buffering whole transactions. The exception is XA: an
//! XA transaction's rows are logged at `XA PREPARE` and decided later; they are held until the
//! `XA COMMIT` (relayed there) or `XA ROLLBACK` (dropped), and no boundary is reported while one
//! is undecided (module [`xa`]).

use std::collections::HashMap;
use std::sync::Arc;

use mysql_async::binlog::events::{
    EventData, OptionalMetaExtractor, OptionalMetadataField, RowsEventData, TableMapEvent,
};
use mysql_async::binlog::value::BinlogValue;
use mysql_async::consts::ColumnType;
use mysql_async::Value;
use mysql_common::binlog::consts::OptionalMetadataFieldType;
use mysql_common::io::ParseBuf;

use crate::binlog::source::SourceEvent;
use crate::decode::columns::{string_column_length, ColumnInfo, ColumnValue, UNMAPPED_COLUMN};
use crate::decode::event::{outbox_event, row_values, OutboxColumn, Unbuildable};
use crate::decode::schema::{Labels, LayoutTracker};
use outbox_relay_core::config::{OnUpdate, TableName, TimestampSource, UnknownXaCommit};
use outbox_relay_core::error::RelayError;
use outbox_relay_core::outbox::mapping::TableMapping;
use outbox_relay_core::outbox::OutboxEvent;
use outbox_relay_core::position::gtid::gtid_from_event;
use outbox_relay_core::position::{BinlogPosition, GtidState, MariadbGtid, TransactionGtid};

pub mod columns;
#[cfg(test)]
mod compressed_capture_tests;
pub mod ddl;
pub mod event;
pub mod json;
pub mod schema;
mod temporal;
pub mod xa;

use xa::{Outcome, XaStatement, XaTracker, Xid};

/// The header time of `ev` (whole seconds since the epoch) in ms.
fn header_ms(ev: &SourceEvent) -> i64 {
    i64::from(ev.timestamp) * 1000
}

/// One decoded outbox row: the event, or what could be read of a row that cannot become one.
pub type DecodedRow = Result<OutboxEvent, Box<RowFailure>>;

/// An outbox row that cannot become an [`OutboxEvent`], with what could be read of it (for its
/// dead letter).
#[derive(Debug)]
pub struct RowFailure {
    /// [`RelayError::Row`] naming the position, table and reason.
    pub error: RelayError,
    /// The aggregate id (the would-be key), when readable.
    pub key: Option<Vec<u8>>,
    /// The payload, when readable.
    pub value: Option<Vec<u8>>,
    /// The would-be headers that could be read (`id`, `event_key`, `event_type`,
    /// `aggregate_type`).
    pub headers: Vec<(String, Vec<u8>)>,
}

impl RowFailure {
    fn bare(error: RelayError) -> Box<Self> {
        Box::new(Self {
            error,
            key: None,
            value: None,
            headers: Vec::new(),
        })
    }
}

/// The end of a transaction in the binlog: a position the relay may resume from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxBoundary {
    /// Position right after the transaction's last event (XID or COMMIT).
    pub position: BinlogPosition,
    /// GTID state including this transaction (text form), when tracked.
    pub gtid_set: Option<String>,
    /// `false` when the transaction only wrote the relay's own checkpoint table: storing such a
    /// boundary is not worth a write (and writing it would make an idle relay feed itself).
    pub advances: bool,
    /// The outbox tables' column layouts in force after this transaction (JSON, see
    /// [`crate::decode::schema`]), when known; stored with the checkpoint.
    pub table_layouts: Option<Arc<str>>,
}

/// What one binlog event contributes to the pipeline.
#[derive(Debug)]
pub enum Decoded {
    /// Outbox rows in binlog order (empty for most events). A row that cannot become an
    /// [`OutboxEvent`] (NULL aggregate, missing column) is an [`RelayError::Row`] in its place,
    /// for the pipeline to dead-letter or stop on.
    Rows(Vec<DecodedRow>),
    /// A transaction ended here.
    Boundary(TxBoundary),
    /// Rows, then the end of their transaction: an `XA COMMIT` relays the rows its `XA PREPARE`
    /// logged, as rows of the commit's group.
    RowsThenBoundary(Vec<DecodedRow>, TxBoundary),
}

impl Decoded {
    /// The rows (in order) and the boundary after them, if any.
    pub fn into_parts(self) -> (Vec<DecodedRow>, Option<TxBoundary>) {
        match self {
            Self::Rows(rows) => (rows, None),
            Self::Boundary(b) => (Vec::new(), Some(b)),
            Self::RowsThenBoundary(rows, b) => (rows, Some(b)),
        }
    }
}

// MariaDB event types (MariaDB KB "Replication Protocol" / log_event.h); mysql_common does not
// parse them.
const MARIADB_ANNOTATE_ROWS_EVENT: u8 = 160;
const MARIADB_GTID_EVENT: u8 = 162;
const MARIADB_FIRST_COMPRESSED_EVENT: u8 = 165; // QUERY_COMPRESSED .. DELETE_ROWS_COMPRESSED (v2) = 171
const MARIADB_LAST_COMPRESSED_EVENT: u8 = 171;
const XA_PREPARE_LOG_EVENT: u8 = 38;
const TRANSACTION_PAYLOAD_EVENT: u8 = 40;
const PREVIOUS_GTIDS_EVENT: u8 = 35;
// MariaDB GTID event flags2.
// MariaDB GTID event flags2 (log_event.h). FL_COMPLETED_XA (128) marks the group of an
// XA COMMIT/ROLLBACK query, which is recognised by its text (as on MySQL).
const FL_STANDALONE: u8 = 1;
const FL_PREPARED_XA: u8 = 64;

/// Per-stream decoding state: where in a transaction we are and what it touched.
#[derive(Debug)]
pub struct Decoder {
    /// The mappings of the outbox tables by name: those named exactly, and each table matching a
    /// pattern once its first table map was seen (only matching tables: the map grows with the
    /// outbox tables, never with the other tables of the server).
    outbox_tables: HashMap<TableName, Arc<TableMapping>>,
    /// The mappings of table patterns (`tenant_*.outbox`), in configuration order: a table map
    /// of a table not in `outbox_tables` is matched against them once (its result cached with
    /// the table map, [`TableMapInfo`]).
    patterns: Vec<TableMapping>,
    /// Column layouts known from `information_schema` and DDL tracking, for table maps
    /// without column names.
    layouts: LayoutTracker,
    checkpoint_table: TableName,
    gtid: Option<GtidState>,
    tx: TxState,
    xa: XaTracker,
    unknown_xa_commit: UnknownXaCommit,
    /// What was derived from each table id's table map, reused while the server repeats the
    /// same table map (it sends one before every transaction's rows events).
    table_maps: HashMap<u64, TableMapInfo>,
    /// Fractional-second precision of the outbox tables' DATETIME/TIME/TIMESTAMP columns (by
    /// lower-case name), for the pre-5.6 formats whose table maps do not carry it.
    temporal_decimals: HashMap<TableName, HashMap<String, u8>>,
}

/// Most table ids whose [`TableMapInfo`] is kept; the cache is emptied when it would grow past
/// this (table ids change with DDL and table cache flushes, so old ones go stale).
const TABLE_MAP_CACHE_LIMIT: usize = 1024;

/// What the decoder derived from one table map event.
#[derive(Debug)]
struct TableMapInfo {
    /// The table map it was derived from: reused only while the next one is equal.
    tme: TableMapEvent<'static>,
    /// A state table (ours, or another connector's of the same name in another database).
    is_state_table: bool,
    /// The outbox mapping, `None` for any other table.
    mapping: Option<Arc<TableMapping>>,
    /// The layout resolved for the last rows event of this table, with what it depends on
    /// besides the table map.
    layout: Option<CachedLayout>,
}

#[derive(Debug)]
struct CachedLayout {
    /// The rows event's after-image bitmap (raw bytes; all columns when `None`).
    after_image: Option<Vec<bool>>,
    /// The tracked layout of the table when resolved (names without `binlog_row_metadata=FULL`).
    tracked: Option<Result<Vec<String>, String>>,
    /// The tracked ENUM/SET labels of the table when resolved.
    tracked_labels: Option<Labels>,
    layout: Arc<ColumnLayout>,
}

#[derive(Debug, Default)]
struct TxState {
    /// Inside BEGIN … COMMIT (or a MariaDB GTID group).
    open: bool,
    /// MariaDB standalone group: ends after its single statement.
    standalone: bool,
    /// The transaction's GTID, applied at commit.
    gtid: Option<TransactionGtid>,
    /// Touched something besides the checkpoint table.
    advances: bool,
    /// The transaction's commit time, ms since the epoch, from its first event: MySQL's GTID
    /// event (`original_commit_timestamp`, µs), else that event's header time (s). MariaDB
    /// writes its GTID event at commit, with the committing statement's start time.
    commit_ms: Option<i64>,
}

impl Decoder {
    /// A decoder for the outbox tables of `outbox_tables` (their mappings), ignoring writes to `checkpoint_table` (and to tables of
    /// the same name in other databases: other connectors' state tables).
    /// `gtid` is the GTID state to continue from, if known; without one no GTIDs are tracked
    /// (MySQL) or MariaDB's are tracked from the first one seen.
    pub fn new(
        outbox_tables: impl IntoIterator<Item = TableMapping>,
        checkpoint_table: TableName,
        gtid: Option<GtidState>,
    ) -> Self {
        let (patterns, exact): (Vec<TableMapping>, Vec<TableMapping>) =
            outbox_tables.into_iter().partition(|m| m.pattern.is_some());
        let outbox_tables: HashMap<TableName, Arc<TableMapping>> = exact
            .into_iter()
            .map(|m| ((*m.table).clone(), Arc::new(m)))
            .collect();
        let layouts = LayoutTracker::new(
            outbox_tables
                .keys()
                .chain(patterns.iter().map(|m| &*m.table))
                .cloned(),
        );
        Self {
            outbox_tables,
            patterns,
            layouts,
            checkpoint_table,
            gtid,
            tx: TxState::default(),
            xa: XaTracker::default(),
            unknown_xa_commit: UnknownXaCommit::Stop,
            table_maps: HashMap::new(),
            temporal_decimals: HashMap::new(),
        }
    }

    /// Sets the fractional-second precision of `table`'s DATETIME, TIME and TIMESTAMP columns
    /// (lower-case column name → 0–6, from `information_schema.COLUMNS.DATETIME_PRECISION`):
    /// the pre-5.6 formats (`temporal`) need it and their table maps do not carry it.
    pub fn set_temporal_decimals(&mut self, table: TableName, decimals: HashMap<String, u8>) {
        self.temporal_decimals.insert(table, decimals);
        self.table_maps.clear();
    }

    /// Sets the column layout of `table` (names in table order) for table maps that carry no
    /// column names (`binlog_row_metadata=MINIMAL`): read from `information_schema` at a known
    /// position and kept up to date through the DDL in the binlog.
    pub fn track_layout(&mut self, table: TableName, columns: Vec<String>) {
        self.layouts.set(&table, columns);
    }

    /// Sets the ENUM labels / SET member names of `table`'s columns (by column name) for table
    /// maps that carry none (`binlog_row_metadata=MINIMAL`): read from `information_schema`
    /// with the layout ([`Self::track_layout`]).
    pub fn track_labels(&mut self, table: TableName, labels: Labels) {
        self.layouts.set_labels(&table, labels);
    }

    /// Restores the layouts a checkpoint stored ([`TxBoundary::table_layouts`]).
    ///
    /// # Errors
    /// [`RelayError::Binlog`] when the stored JSON is damaged.
    pub fn restore_layouts(&mut self, json: &str) -> Result<(), RelayError> {
        self.layouts.restore(json).map_err(|e| {
            RelayError::binlog(format!(
                "{e}; fix or clear the checkpoint row's table_layouts column"
            ))
        })
    }

    /// What to do with an `XA COMMIT` whose `XA PREPARE` this decoder has not read (default
    /// [`UnknownXaCommit::Stop`]: a [`RelayError::Binlog`] naming the XID).
    #[must_use]
    pub fn with_unknown_xa_commit(mut self, policy: UnknownXaCommit) -> Self {
        self.unknown_xa_commit = policy;
        self
    }

    /// `true` while inside a transaction, or while an XA transaction is prepared and undecided
    /// (a checkpoint here would be mid-transaction).
    pub fn in_transaction(&self) -> bool {
        self.tx.open || self.xa.undecided() > 0
    }

    /// Prepared XA transactions whose `XA COMMIT`/`XA ROLLBACK` has not been read yet, and the
    /// outbox rows held for them.
    pub fn undecided_xa(&self) -> (usize, usize) {
        (self.xa.undecided(), self.xa.held_rows())
    }

    /// Decodes one event. `table_map` looks up the table map event for a rows event's table id
    /// (kept by the source's stream reader).
    ///
    /// # Errors
    /// [`RelayError::Row`] for a rows event on an outbox table that cannot be decoded (no column
    /// names, partial image); [`RelayError::Binlog`] for an event that cannot be parsed, and for
    /// an `XA COMMIT` whose `XA PREPARE` was before the point this decoder started from.
    pub fn decode<'t>(
        &mut self,
        ev: &SourceEvent,
        table_map: impl Fn(u64) -> Option<&'t TableMapEvent<'static>>,
    ) -> Result<Decoded, RelayError> {
        let raw_type = ev.event.header().event_type_raw();
        match raw_type {
            MARIADB_GTID_EVENT => {
                let (gtid, flags) = MariadbGtid::from_event(&ev.event).ok_or_else(|| {
                    RelayError::binlog(format!(
                        "MariaDB GTID event ending at {} is truncated ({} bytes)",
                        ev.position,
                        ev.event.data().len()
                    ))
                })?;
                if flags & FL_PREPARED_XA != 0 {
                    self.xa.start_group()
                } else {
                    self.xa.end_group_without_prepare()
                }
                .map_err(|e| xa_error(ev, &e))?;
                self.tx = TxState {
                    open: true,
                    standalone: flags & FL_STANDALONE != 0,
                    gtid: Some(TransactionGtid::MariaDb(gtid)),
                    advances: false,
                    commit_ms: Some(header_ms(ev)),
                };
                return Ok(Decoded::Rows(Vec::new()));
            }
            MARIADB_ANNOTATE_ROWS_EVENT => return Ok(Decoded::Rows(Vec::new())),
            XA_PREPARE_LOG_EVENT => {
                let (xid, one_phase) =
                    Xid::from_prepare_event(ev.event.data()).map_err(|e| xa_error(ev, &e))?;
                let rows = self
                    .xa
                    .prepare(xid, one_phase, &ev.position)
                    .map_err(|e| xa_error(ev, &e))?;
                // The prepared group is in the binlog (its GTID counts) but decided later: the
                // XA tracker withholds the boundary until then. A one-phase commit ends here.
                self.tx.advances = true;
                return Ok(self.end_tx(ev, rows));
            }
            PREVIOUS_GTIDS_EVENT => {
                // Not needed here (the GTID state comes from the checkpoint), and not parsed:
                // mysql_common reserves memory for as many sources as a damaged one counts.
                return Ok(Decoded::Rows(Vec::new()));
            }
            TRANSACTION_PAYLOAD_EVENT => {
                // MySQL compressed transaction: the source yields its inner events next, each at
                // this event's end; the inner XID reports the boundary there.
                return Ok(Decoded::Rows(Vec::new()));
            }
            MARIADB_FIRST_COMPRESSED_EVENT..=MARIADB_LAST_COMPRESSED_EVENT => {
                // The source turns these into ordinary events; one arriving here is a bug.
                return Err(RelayError::binlog(format!(
                    "compressed MariaDB binlog event (type {raw_type}) at {} reached the decoder \
                     without being decompressed by the source (a bug: please report it). \
                     Workaround: SET GLOBAL log_bin_compress=OFF on the server",
                    ev.position
                )));
            }
            _ => {}
        }
        let data = ev.event.read_data().map_err(|e| {
            RelayError::binlog(format!(
                "cannot parse binlog event type {raw_type} ending at {}: {e}",
                ev.position
            ))
        })?;
        match data {
            Some(EventData::QueryEvent(q)) => {
                let query = q.query();
                let stmt = query.trim().trim_end_matches(';').trim();
                if let Some(xa) = xa::parse_xa_statement(stmt) {
                    return self.xa_statement(ev, xa.map_err(|e| xa_error(ev, &e))?);
                }
                let is_end =
                    stmt.eq_ignore_ascii_case("COMMIT") || stmt.eq_ignore_ascii_case("ROLLBACK");
                if !is_end && !stmt.eq_ignore_ascii_case("BEGIN") {
                    self.layouts.observe(stmt, &q.schema(), &ev.position);
                    if let Some(failure) = self.statement_on_outbox(stmt, &q.schema(), ev) {
                        self.tx.advances = true;
                        return Ok(Decoded::Rows(vec![Err(failure)]));
                    }
                }
                if stmt.eq_ignore_ascii_case("BEGIN") {
                    // MySQL sends its GTID event just before BEGIN: keep it.
                    self.xa
                        .end_group_without_prepare()
                        .map_err(|e| xa_error(ev, &e))?;
                    self.tx = TxState {
                        open: true,
                        gtid: self.tx.gtid.take(),
                        commit_ms: Some(self.tx.commit_ms.unwrap_or_else(|| header_ms(ev))),
                        ..TxState::default()
                    };
                    Ok(Decoded::Rows(Vec::new()))
                } else if stmt.eq_ignore_ascii_case("COMMIT") || !self.tx.open || self.tx.standalone
                {
                    // COMMIT, or a statement outside a transaction (DDL): both end a group.
                    self.tx.advances = true;
                    Ok(self.end_tx(ev, Vec::new()))
                } else if stmt.eq_ignore_ascii_case("ROLLBACK") {
                    // Logged only when a non-transactional table was changed: those changes
                    // stay, and an outbox row in them was already relayed.
                    self.tx.advances = true;
                    Ok(self.end_tx(ev, Vec::new()))
                } else {
                    self.tx.advances = true;
                    Ok(Decoded::Rows(Vec::new()))
                }
            }
            Some(EventData::GtidEvent(g)) => {
                // MySQL GTID (type 33) or tagged GTID (type 42): the transaction's id, counted
                // at its commit. Anonymous transactions (gno 0) have none.
                self.xa
                    .end_group_without_prepare()
                    .map_err(|e| xa_error(ev, &e))?;
                // MySQL 8.0.1+ stamps the commit time in µs on the source that first committed
                // the transaction (0 when unknown: an older source).
                let original_us = g.original_commit_timestamp();
                self.tx = TxState {
                    gtid: gtid_from_event(&g).ok().map(TransactionGtid::MySql),
                    commit_ms: Some(if original_us > 0 {
                        i64::try_from(original_us / 1000).unwrap_or(i64::MAX)
                    } else {
                        header_ms(ev)
                    }),
                    ..TxState::default()
                };
                Ok(Decoded::Rows(Vec::new()))
            }
            Some(EventData::XidEvent(_)) => Ok(self.end_tx(ev, Vec::new())),
            Some(EventData::FormatDescriptionEvent(fde)) => {
                self.layouts.set_server_version(&fde.server_version());
                Ok(Decoded::Rows(Vec::new()))
            }
            Some(EventData::RowsEvent(rows)) => self.decode_rows(ev, &rows, table_map),
            _ => Ok(Decoded::Rows(Vec::new())),
        }
    }

    /// A row-writing statement on an outbox table logged as SQL text (a session with
    /// `binlog_format=STATEMENT` or `MIXED`): its rows are not in the binlog, so it cannot be
    /// relayed; it becomes a failure carrying the statement (dead letter or stop).
    fn statement_on_outbox(
        &self,
        stmt: &str,
        default_db: &str,
        ev: &SourceEvent,
    ) -> Option<Box<RowFailure>> {
        let table = statement_target(stmt, default_db).filter(|t| {
            self.outbox_tables.contains_key(t) || self.patterns.iter().any(|p| p.covers(t))
        })?;
        let (file, pos) = (&ev.position.file, ev.position.pos);
        Some(Box::new(RowFailure {
            error: RelayError::Row {
                position: ev.position.clone(),
                table: table.to_string(),
                reason: format!(
                    "an INSERT on the outbox was logged as a statement, not as rows (the \
                     writing session used binlog_format=STATEMENT or MIXED), so its rows cannot \
                     be read from the binlog. `SHOW BINLOG EVENTS IN '{file}' FROM {pos} LIMIT \
                     3` shows where it is, up to its transaction's COMMIT (or Xid) event. To get \
                     past it: turn on dead letters ([dead_letter] enabled = true: the statement \
                     becomes the dead letter's value and the stream continues), or write its \
                     rows again with binlog_format=ROW and move the checkpoint past its \
                     transaction with `outbox-relay reset --to {file}:<End_log_pos of that \
                     COMMIT>` (relay stopped). To prevent it: SET GLOBAL binlog_format=ROW and \
                     make sure no writer sets a session binlog_format"
                ),
            },
            key: None,
            value: Some(stmt.as_bytes().to_vec()),
            headers: Vec::new(),
        }))
    }

    /// An `XA …` query: starts an XA group (MySQL), or ends a group with the outcome of a
    /// prepared XA transaction.
    fn xa_statement(&mut self, ev: &SourceEvent, stmt: XaStatement) -> Result<Decoded, RelayError> {
        self.tx.advances = true;
        match stmt {
            XaStatement::Start => {
                self.xa.start_group().map_err(|e| xa_error(ev, &e))?;
                // MySQL: the GTID event just before opens the group.
                self.tx.open = true;
                Ok(Decoded::Rows(Vec::new()))
            }
            XaStatement::InGroup => Ok(Decoded::Rows(Vec::new())),
            XaStatement::Commit {
                one_phase: true, ..
            } => {
                let rows = self.xa.commit_group();
                Ok(self.end_tx(ev, rows))
            }
            XaStatement::Commit { xid, .. } => match self.xa.decide(&xid, true) {
                Outcome::Known(rows) => Ok(self.end_tx(ev, rows)),
                Outcome::Unknown if self.unknown_xa_commit == UnknownXaCommit::Skip => {
                    tracing::warn!(xid = %xid, at = %ev.position,
                        "XA COMMIT of an XA transaction prepared before the relay's start point: \
                         skipped (outbox.unknown_xa_commit = \"skip\"); outbox rows it wrote, if \
                         any, are not relayed");
                    Ok(self.end_tx(ev, Vec::new()))
                }
                Outcome::Unknown => Err(self.unknown_xa_commit(ev, &xid)),
            },
            XaStatement::Rollback(xid) => {
                if let Outcome::Unknown = self.xa.decide(&xid, false) {
                    // Prepared before this decoder's start: a rollback commits nothing.
                    tracing::debug!(xid = %xid, at = %ev.position,
                        "XA ROLLBACK of a transaction prepared before the start point");
                }
                Ok(self.end_tx(ev, Vec::new()))
            }
        }
    }

    /// The error for an `XA COMMIT` whose `XA PREPARE` (and rows) this decoder never read.
    fn unknown_xa_commit(&self, ev: &SourceEvent, xid: &Xid) -> RelayError {
        let mut after = self.gtid.clone();
        if let Some(gtid) = self.tx.gtid.clone() {
            GtidState::count(&mut after, gtid);
        }
        let gtid_set = after.map_or_else(|| "NULL".to_owned(), |g| format!("'{g}'"));
        let skip_it = if self.xa.undecided() == 0 {
            format!(
                " If you know that this XA transaction wrote no outbox rows, you may instead \
                 continue right after its XA COMMIT: binlog_file = '{}', binlog_pos = {}, \
                 rows_acked = 0, gtid_set = {gtid_set}.",
                ev.position.file, ev.position.pos
            )
        } else {
            String::new()
        };
        RelayError::binlog(format!(
            "XA COMMIT {xid} (ending at {}) commits an XA transaction whose XA PREPARE, which \
             carries its rows, was logged before the point this relay started reading from: the \
             relay cannot know which outbox rows it committed and will not guess. Fix: stop the \
             relay and set this connector's checkpoint row to a transaction end before that XA \
             PREPARE (find `XA PREPARE {xid}` with mariadb-binlog/mysqlbinlog or SHOW BINLOG \
             EVENTS; take the End_log_pos of the Xid/COMMIT event before its transaction) with \
             rows_acked = 0 and gtid_set = NULL: its rows are then relayed, and records \
             committed between there and here are sent again (consumers deduplicate by \
             event_key).{skip_it} (If XA transactions on this server never write the outbox, \
             set outbox.unknown_xa_commit = \"skip\".)",
            ev.position
        ))
    }

    /// Ends the current group with `rows` (relayed before the boundary); the boundary is
    /// withheld while an XA transaction is undecided.
    fn end_tx(&mut self, ev: &SourceEvent, mut rows: Vec<DecodedRow>) -> Decoded {
        // Rows released here were held since their XA PREPARE: they commit now, with this
        // group (the XA COMMIT) and its commit time.
        let commit_ms = self.tx.commit_ms.unwrap_or_else(|| header_ms(ev));
        for event in rows.iter_mut().flatten() {
            if !event.column_timestamp {
                event.timestamp_ms = commit_ms;
            }
            event.commit_ms = commit_ms;
        }
        let boundary = self.finish_tx(ev);
        match (self.xa.release(boundary), rows.is_empty()) {
            (None, _) => Decoded::Rows(rows),
            (Some(b), true) => Decoded::Boundary(b),
            (Some(b), false) => Decoded::RowsThenBoundary(rows, b),
        }
    }

    /// Applies the group's GTID and returns the boundary after it.
    fn finish_tx(&mut self, ev: &SourceEvent) -> TxBoundary {
        let tx = std::mem::take(&mut self.tx);
        if let Some(gtid) = tx.gtid {
            GtidState::count(&mut self.gtid, gtid);
        }
        TxBoundary {
            position: ev.position.clone(),
            gtid_set: self.gtid.as_ref().map(ToString::to_string),
            advances: tx.advances,
            table_layouts: self.layouts.snapshot(),
        }
    }

    /// The cached [`TableMapInfo`] of `table_id`, (re)derived when `tme` differs from the
    /// table map it was derived from.
    fn table_map_info(&mut self, table_id: u64, tme: &TableMapEvent<'static>) -> &TableMapInfo {
        let fresh = self
            .table_maps
            .get(&table_id)
            .is_some_and(|info| info.tme == *tme);
        if !fresh {
            if self.table_maps.len() >= TABLE_MAP_CACHE_LIMIT {
                self.table_maps.clear();
            }
            let name = TableName {
                database: tme.database_name().into_owned(),
                table: tme.table_name().into_owned(),
            };
            let is_state_table = name.table == self.checkpoint_table.table;
            let mapping = match self.outbox_tables.get(&name) {
                Some(m) => Some(Arc::clone(m)),
                None if !is_state_table => self.match_pattern(&name, tme),
                None => None,
            };
            if mapping.is_some() && self.layouts.follows(&name) {
                if let Some(names) = table_map_names(tme) {
                    // Column names in the table map are the truth: they repair a tracked layout.
                    self.layouts.set(&name, names);
                }
            }
            self.table_maps.insert(
                table_id,
                TableMapInfo {
                    tme: tme.clone(),
                    is_state_table,
                    mapping,
                    layout: None,
                },
            );
        }
        &self.table_maps[&table_id]
    }

    /// The mapping of `name`, a table not named exactly, from the first pattern it matches
    /// (kept in `outbox_tables` from then on); `None` when it matches none. With
    /// `outbox.trace_context`, the table's `traceparent`/`tracestate` columns (from the table
    /// map's names, else its tracked layout) become header columns, as `run` does at start-up
    /// for the tables named exactly.
    fn match_pattern(
        &mut self,
        name: &TableName,
        tme: &TableMapEvent<'static>,
    ) -> Option<Arc<TableMapping>> {
        let pattern = self.patterns.iter().find(|p| p.covers(name))?;
        let mut mapping = pattern.for_table(name.clone());
        if mapping.trace_context {
            let columns = table_map_names(tme)
                .or_else(|| {
                    self.layouts
                        .get(name)
                        .and_then(|l| l.ok())
                        .map(<[_]>::to_vec)
                })
                .unwrap_or_default();
            for column in columns.iter().filter(|c| {
                c.eq_ignore_ascii_case("traceparent") || c.eq_ignore_ascii_case("tracestate")
            }) {
                if !mapping
                    .additional
                    .iter()
                    .any(|a| a.column.eq_ignore_ascii_case(column))
                {
                    mapping
                        .additional
                        .push(outbox_relay_core::config::AdditionalColumn {
                            column: column.clone(),
                            placement: outbox_relay_core::config::Placement::Header,
                            alias: Some(column.to_ascii_lowercase()),
                        });
                }
            }
        }
        tracing::info!(table = %name, pattern = %pattern.table,
            "outbox table found by pattern: relaying its INSERTs");
        let mapping = Arc::new(mapping);
        self.outbox_tables
            .insert(name.clone(), Arc::clone(&mapping));
        Some(mapping)
    }

    /// The column layout of an outbox rows event: the cached one while the table map, the
    /// after-image bitmap and the tracked layout are those it was resolved with.
    fn layout_for(
        &mut self,
        rows: &RowsEventData<'_>,
        tme: &TableMapEvent<'static>,
        name: &TableName,
        mapping: &TableMapping,
    ) -> Result<Arc<ColumnLayout>, String> {
        // Compared in place: a hit (every rows event after the first) allocates nothing.
        let same_image = |cached: &Option<Vec<bool>>| match (cached, rows.columns_after_image()) {
            (None, None) => true,
            (Some(c), Some(bits)) => {
                c.len() == bits.len() && c.iter().zip(bits.iter()).all(|(a, b)| *a == *b)
            }
            _ => false,
        };
        let tracked = self.layouts.get(name);
        let same_tracked = |cached: &Option<Result<Vec<String>, String>>| match (cached, tracked) {
            (None, None) => true,
            (Some(Ok(a)), Some(Ok(b))) => a.as_slice() == b,
            (Some(Err(a)), Some(Err(b))) => a == b,
            _ => false,
        };
        let tracked_labels = self.layouts.labels(name);
        if let Some(cached) = self
            .table_maps
            .get(&rows.table_id())
            .and_then(|info| info.layout.as_ref())
        {
            if same_image(&cached.after_image)
                && same_tracked(&cached.tracked)
                && cached.tracked_labels.as_ref() == tracked_labels
            {
                return Ok(Arc::clone(&cached.layout));
            }
        }
        let after_image: Option<Vec<bool>> = rows
            .columns_after_image()
            .map(|bits| bits.iter().map(|b| *b).collect());
        // A DDL may have changed the tracked layout since the table map was first seen: names
        // in the table map repair it again.
        if let Some(names) = table_map_names(tme).filter(|_| self.layouts.follows(name)) {
            self.layouts.set(name, names);
        }
        let tracked = self.layouts.get(name);
        let tracked_labels = self.layouts.labels(name);
        let layout = Arc::new(ColumnLayout::resolve(
            tme,
            after_image.as_deref(),
            mapping,
            tracked,
            tracked_labels,
            self.temporal_decimals.get(name),
        )?);
        let tracked = tracked.map(|t| t.map(<[String]>::to_vec).map_err(str::to_owned));
        let tracked_labels = tracked_labels.cloned();
        if let Some(info) = self.table_maps.get_mut(&rows.table_id()) {
            info.layout = Some(CachedLayout {
                after_image,
                tracked,
                tracked_labels,
                layout: Arc::clone(&layout),
            });
        }
        Ok(layout)
    }

    fn decode_rows<'t>(
        &mut self,
        ev: &SourceEvent,
        rows: &RowsEventData<'_>,
        table_map: impl Fn(u64) -> Option<&'t TableMapEvent<'static>>,
    ) -> Result<Decoded, RelayError> {
        let tme = table_map(rows.table_id()).ok_or_else(|| {
            RelayError::binlog(format!(
                "rows event at {} refers to table id {} without a preceding table map event",
                ev.position,
                rows.table_id()
            ))
        })?;
        let info = self.table_map_info(rows.table_id(), tme);
        let (is_state_table, mapping) = (info.is_state_table, info.mapping.clone());
        // Our own checkpoint writes, and those of other connectors keeping a state table of the
        // same name in another database, are not progress: counting them would make idle
        // relays on one server write in answer to each other forever.
        if is_state_table {
            return Ok(Decoded::Rows(Vec::new()));
        }
        self.tx.advances = true;
        let Some(mapping) = mapping else {
            return Ok(Decoded::Rows(Vec::new()));
        };
        let name = Arc::clone(&mapping.table);
        let row_error = |reason: String| RelayError::Row {
            position: ev.position.clone(),
            table: name.to_string(),
            reason,
        };
        match rows {
            RowsEventData::WriteRowsEvent(_) | RowsEventData::WriteRowsEventV1(_) => {}
            RowsEventData::UpdateRowsEvent(_)
            | RowsEventData::UpdateRowsEventV1(_)
            | RowsEventData::PartialUpdateRowsEvent(_) => {
                return Ok(Decoded::Rows(match mapping.on_update {
                    OnUpdate::Ignore => Vec::new(),
                    OnUpdate::Warn => {
                        tracing::warn!(position = %ev.position, table = %name,
                            "UPDATE of outbox rows ignored: outbox rows are insert-only \
                             (outbox.on_update = \"warn\")");
                        Vec::new()
                    }
                    OnUpdate::Fail => vec![Err(RowFailure::bare(row_error(
                        "UPDATE of an outbox row: outbox rows are insert-only \
                         (outbox.on_update = \"fail\"); fix the writer, or set on_update to \
                         \"ignore\" or \"warn\""
                            .into(),
                    )))],
                }))
            }
            // DELETEs (clean-up of relayed rows) are ignored by design.
            RowsEventData::DeleteRowsEvent(_) | RowsEventData::DeleteRowsEventV1(_) => {
                return Ok(Decoded::Rows(Vec::new()))
            }
        }
        let layout = self
            .layout_for(rows, tme, &name, &mapping)
            .map_err(row_error)?;
        let mut out = Vec::new();
        // The row images are parsed in place (values borrow the event's bytes); one values
        // vector serves every row of the event.
        let mut buf = ParseBuf(rows.rows_data());
        let mut values = Vec::with_capacity(layout.image.len());
        while !buf.0.is_empty() {
            let left = buf.0.len();
            layout
                .read_row(&mut buf, &mut values)
                .map_err(|e| row_error(format!("the rows event cannot be decoded: {e}")))?;
            if buf.0.len() == left {
                // An image without columns takes no bytes: the bytes left are not rows.
                return Err(row_error(format!(
                    "the rows event cannot be decoded: its row image holds no columns, yet {left} \
                     bytes of rows follow"
                )));
            }
            let commit_ms = self.tx.commit_ms.unwrap_or_else(|| header_ms(ev));
            match layout.extract(&mut values, &mapping, ev, commit_ms, &row_error) {
                Ok(Some(event)) => out.push(Ok(event)),
                Ok(None) => {} // skipped by configuration (NULL payload)
                Err(failure) => out.push(Err(failure)),
            }
        }
        // Rows of an XA transaction wait for its outcome.
        Ok(Decoded::Rows(self.xa.keep(out).unwrap_or_default()))
    }
}

/// `true` when `stmt` is an INSERT, REPLACE or LOAD DATA whose target is `table` (qualified, or
/// unqualified with `default_db` being the table's database).
#[cfg(test)]
fn statement_writes_table(stmt: &str, default_db: &str, table: &TableName) -> bool {
    statement_target(stmt, default_db).is_some_and(|t| t == *table)
}

/// The target table of `stmt` when it is an INSERT, REPLACE or LOAD DATA (qualified, or in
/// `default_db`).
fn statement_target(stmt: &str, default_db: &str) -> Option<TableName> {
    let tokens = sql_tokens(stmt);
    let first = tokens.first()?;
    if !["insert", "replace", "load"]
        .iter()
        .any(|k| first.eq_ignore_ascii_case(k))
    {
        return None;
    }
    // The target follows INTO (INSERT/REPLACE … INTO t, LOAD DATA … INTO TABLE t) or, for
    // INSERT without INTO, the first identifier after the modifiers.
    let skip = [
        "insert",
        "replace",
        "load",
        "data",
        "xml",
        "low_priority",
        "delayed",
        "high_priority",
        "ignore",
        "into",
        "table",
        "concurrent",
        "local",
        "infile",
    ];
    let mut i = 0;
    while let Some(t) = tokens.get(i) {
        if t.starts_with('\'') || skip.iter().any(|k| t.eq_ignore_ascii_case(k)) {
            i += 1;
        } else {
            break;
        }
    }
    let (db, name) = match (tokens.get(i), tokens.get(i + 1), tokens.get(i + 2)) {
        (Some(db), Some(dot), Some(name)) if dot == "." => (db.as_str(), name.as_str()),
        (Some(name), _, _) => (default_db, name.as_str()),
        _ => return None,
    };
    Some(TableName {
        database: db.to_owned(),
        table: name.to_owned(),
    })
}

/// Identifiers (backticks removed), quoted strings (kept with their quote) and punctuation of a
/// statement, comments dropped. Enough to find a statement's target table.
fn sql_tokens(stmt: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = stmt.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {}
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                let mut prev = ' ';
                for c in chars.by_ref() {
                    if prev == '*' && c == '/' {
                        break;
                    }
                    prev = c;
                }
            }
            '#' => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        break;
                    }
                }
            }
            '-' if chars.peek() == Some(&'-') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        break;
                    }
                }
            }
            '`' => {
                let mut ident = String::new();
                while let Some(c) = chars.next() {
                    if c == '`' {
                        if chars.peek() == Some(&'`') {
                            chars.next();
                            ident.push('`');
                        } else {
                            break;
                        }
                    } else {
                        ident.push(c);
                    }
                }
                out.push(ident);
            }
            '\'' | '"' => {
                let mut s = String::from(c);
                while let Some(d) = chars.next() {
                    if d == '\\' {
                        chars.next();
                    } else if d == c {
                        break;
                    }
                }
                s.push(c);
                out.push(s);
            }
            c if c.is_alphanumeric() || c == '_' || c == '$' => {
                let mut ident = String::from(c);
                while let Some(&d) = chars.peek() {
                    if d.is_alphanumeric() || d == '_' || d == '$' {
                        ident.push(d);
                        chars.next();
                    } else {
                        break;
                    }
                }
                out.push(ident);
            }
            other => out.push(other.to_string()),
        }
        if out.len() > 16 {
            break; // the target is near the start
        }
    }
    out
}

/// An XA event that cannot be followed, at `ev`.
fn xa_error(ev: &SourceEvent, reason: &str) -> RelayError {
    RelayError::binlog(format!("XA transaction at {}: {reason}", ev.position))
}

/// Where the mapped columns are in a table's rows events, what the table map says about them,
/// and how to read a row image.
///
/// Resolved from a table map, an after-image bitmap and the tracked layout; reused (see
/// [`Decoder::layout_for`]) while all three stay the same.
#[derive(Debug)]
struct ColumnLayout {
    /// Per table column: name and type information.
    columns: Vec<ColumnInfo>,
    /// Per table column: its metadata bytes from the table map (how its values are stored).
    meta: Vec<Vec<u8>>,
    /// Per table column: its index in the row image, `None` when the image leaves it out
    /// (`binlog_row_image=MINIMAL`/`NOBLOB`).
    in_image: Vec<Option<usize>>,
    /// The table columns in the row image, in image order.
    image: Vec<usize>,
    id: usize,
    aggregate_type: usize,
    aggregate_id: usize,
    /// `None`: not mapped (the Debezium profile has no event type or event key column).
    event_type: Option<usize>,
    event_key: Option<usize>,
    payload: usize,
    created_at: Option<usize>,
    partition: Option<usize>,
    additional: Vec<usize>,
    /// Table columns read by more than one field: copied, not moved out of the row.
    shared: Vec<usize>,
}

/// Column names of a table map, when it carries them (`binlog_row_metadata=FULL`).
fn table_map_names(tme: &TableMapEvent<'_>) -> Option<Vec<String>> {
    let mut names = Vec::new();
    for field in tme.iter_optional_meta() {
        if let Ok(OptionalMetadataField::ColumnName(n)) = field {
            for name in n.iter_names() {
                names.push(name.ok()?.name().into_owned());
            }
        }
    }
    (!names.is_empty()).then_some(names)
}

/// Whether the ENUM_STR_VALUE and SET_STR_VALUE fields of `tme`'s optional metadata count no
/// more labels than their bytes can hold: mysql_common reserves memory for as many as a list
/// counts before reading them. The optional metadata is the end of the serialized event, after
/// the table id (6), flags (2), database and table names (length, name, NUL), column count,
/// types, metadata block and NULL bitmap.
fn label_counts_fit(tme: &TableMapEvent<'_>) -> bool {
    use mysql_common::proto::MySerialize;
    let mut raw = Vec::new();
    tme.serialize(&mut raw);
    let fits = || -> Option<bool> {
        let size = |n: u64| usize::try_from(n).ok();
        let mut at = 8 + tme.database_name_raw().len() + 2 + tme.table_name_raw().len() + 2;
        let (columns, n) = crate::binlog::compressed::lenenc_int(raw.get(at..)?)?;
        at = at.checked_add(n)?.checked_add(size(columns)?)?;
        let (meta, n) = crate::binlog::compressed::lenenc_int(raw.get(at..)?)?;
        at = at
            .checked_add(n)?
            .checked_add(size(meta)?)?
            .checked_add(size(columns.div_ceil(8))?)?;
        let mut fields = raw.get(at..)?;
        while let Some((&kind, rest)) = fields.split_first() {
            let (len, n) = crate::binlog::compressed::lenenc_int(rest)?;
            let mut value = rest.get(n..n.checked_add(size(len)?)?)?;
            fields = &rest[n + value.len()..];
            if kind != OptionalMetadataFieldType::SET_STR_VALUE as u8
                && kind != OptionalMetadataFieldType::ENUM_STR_VALUE as u8
            {
                continue;
            }
            while !value.is_empty() {
                let (labels, n) = crate::binlog::compressed::lenenc_int(value)?;
                value = &value[n..];
                // Each label takes at least its length byte.
                if labels > value.len() as u64 {
                    return Some(false);
                }
                for _ in 0..labels {
                    let (len, n) = crate::binlog::compressed::lenenc_int(value)?;
                    value = value.get(n.checked_add(size(len)?)?..)?;
                }
            }
        }
        Some(true)
    };
    // A field that does not even parse is left to mysql_common's error.
    fits().unwrap_or(true)
}

/// ENUM labels / SET member names per table column, from the table map's optional metadata.
fn table_map_labels(tme: &TableMapEvent<'_>, count: usize) -> Vec<Option<Vec<Vec<u8>>>> {
    if !label_counts_fit(tme) {
        return vec![None; count];
    }
    let mut enums = Vec::new();
    let mut sets = Vec::new();
    // ENUM and SET label lists have the same shape but different types in mysql_common.
    macro_rules! push_labels {
        ($field:expr, $into:expr) => {
            for values in $field.iter_values() {
                let Ok(values) = values else {
                    return vec![None; count];
                };
                $into.push(
                    values
                        .values()
                        .iter()
                        .map(|v| v.value_raw().to_vec())
                        .collect(),
                );
            }
        };
    }
    for field in tme.iter_optional_meta() {
        match field {
            Ok(OptionalMetadataField::EnumStrValue(e)) => {
                push_labels!(e, enums);
            }
            Ok(OptionalMetadataField::SetStrValue(s)) => {
                push_labels!(s, sets);
            }
            _ => {}
        }
    }
    let (mut enums, mut sets) = (enums.into_iter(), sets.into_iter());
    (0..count)
        .map(|i| match tme.get_column_type(i) {
            Ok(Some(ColumnType::MYSQL_TYPE_ENUM)) => enums.next(),
            Ok(Some(ColumnType::MYSQL_TYPE_SET)) => sets.next(),
            _ => None,
        })
        .collect()
}

/// A TIME(1) or TIME(2) value (`my_time_packed_from_binary`): 3 bytes of integer part, 1 byte
/// of hundredths, negative values borrowing from the integer part. mysql_common computes the
/// borrow on an unsigned byte, which overflows (a panic in debug builds, a wrong value in
/// release builds) for every negative value with a fraction.
fn time2_hundredths(buf: &mut ParseBuf<'_>) -> std::io::Result<Value> {
    use mysql_common::binlog::misc::{my_packed_time_make, time_from_packed};
    let bytes: &[u8] = buf.parse(4)?;
    let mut intpart = i64::from(u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]])) - 0x80_0000;
    let mut frac = i64::from(bytes[3]);
    if intpart < 0 && frac > 0 {
        intpart += 1;
        frac -= 0x100;
    }
    Ok(time_from_packed(my_packed_time_make(
        intpart,
        frac * 10_000,
    )))
}

/// The type mysql_common reads a value of a `ty` column as: a typed array's element type (the
/// first metadata byte; the same metadata bytes are used), else `ty`.
fn read_as(ty: ColumnType, meta: &[u8]) -> ColumnType {
    match (ty, meta.first()) {
        (ColumnType::MYSQL_TYPE_TYPED_ARRAY, Some(&inner)) => {
            ColumnType::try_from(inner).unwrap_or(ty)
        }
        _ => ty,
    }
}

/// Checks the table-map metadata of a column of type `ty` for what mysql_common's value parser
/// takes from it without checking: the bytes it indexes, and a DECIMAL's scale at most its
/// precision (it computes `precision - scale`).
fn check_column_meta(ty: ColumnType, meta: &[u8]) -> Result<(), String> {
    use ColumnType::*;
    let needs = |ty: ColumnType| match ty {
        MYSQL_TYPE_STRING
        | MYSQL_TYPE_BIT
        | MYSQL_TYPE_NEWDECIMAL
        | MYSQL_TYPE_ENUM
        | MYSQL_TYPE_SET
        | MYSQL_TYPE_VARCHAR
        | MYSQL_TYPE_VAR_STRING => 2,
        MYSQL_TYPE_TYPED_ARRAY
        | MYSQL_TYPE_TIMESTAMP2
        | MYSQL_TYPE_DATETIME2
        | MYSQL_TYPE_TIME2
        | MYSQL_TYPE_TINY_BLOB
        | MYSQL_TYPE_MEDIUM_BLOB
        | MYSQL_TYPE_LONG_BLOB
        | MYSQL_TYPE_BLOB
        | MYSQL_TYPE_GEOMETRY
        | MYSQL_TYPE_VECTOR => 1,
        _ => 0,
    };
    let read_as = read_as(ty, meta);
    let needed = needs(ty).max(needs(read_as));
    if meta.len() < needed {
        return Err(format!(
            "the table map gives {} bytes of metadata for its type {ty:?}, which needs {needed}",
            meta.len()
        ));
    }
    if let (MYSQL_TYPE_NEWDECIMAL, [precision, scale, ..]) = (read_as, meta) {
        if scale > precision {
            return Err(format!(
                "the table map gives DECIMAL scale {scale} above its precision {precision}"
            ));
        }
    }
    Ok(())
}

impl ColumnLayout {
    /// Resolves `mapping` against the table map `tme` of a rows event whose after image holds
    /// the columns `after_image` (all when `None`). `tracked` is the column layout known from
    /// `information_schema` and DDL tracking, used when the table map carries no names;
    /// `tracked_labels` the ENUM/SET labels known the same way, used when it carries none.
    fn resolve(
        tme: &TableMapEvent<'_>,
        after_image: Option<&[bool]>,
        mapping: &TableMapping,
        tracked: Option<Result<&[String], &str>>,
        tracked_labels: Option<&Labels>,
        temporal_decimals: Option<&HashMap<String, u8>>,
    ) -> Result<Self, String> {
        let count = usize::try_from(tme.columns_count()).map_err(|e| e.to_string())?;
        let names = match (table_map_names(tme), tracked) {
            (Some(names), _) => names,
            (None, Some(Err(why))) => {
                return Err(format!(
                    "the table map event carries no column names and the table's layout is \
                     unknown: {why}. Fix: SET GLOBAL binlog_row_metadata=FULL on the server \
                     (MySQL 8.0.1+, MariaDB 10.5+), then move the checkpoint past this point \
                     (outbox-relay reset) once the rows from here on were relayed another way"
                ))
            }
            (None, Some(Ok(tracked))) if tracked.len() == count => tracked.to_vec(),
            (None, Some(Ok(tracked))) => {
                return Err(format!(
                    "the table map has {count} columns but the tracked layout of the table has \
                     {} ({}): the layout in force when the row was written is unknown. Fix: SET \
                     GLOBAL binlog_row_metadata=FULL on the server, then restart the relay from a \
                     position after this one",
                    tracked.len(),
                    tracked.join(", ")
                ))
            }
            (None, None) => {
                return Err(
                    "the table map event carries no column names. Fix: SET GLOBAL \
                     binlog_row_metadata=FULL on the server (MySQL 8.0.1+, MariaDB 10.5+)"
                        .into(),
                )
            }
        };
        if names.len() != count {
            return Err(format!(
                "the table map has {count} columns but names {} ({})",
                names.len(),
                names.join(", ")
            ));
        }
        let mut in_image = Vec::with_capacity(count);
        let mut next = 0;
        for i in 0..count {
            if after_image.is_none_or(|bits| bits.get(i).copied().unwrap_or(false)) {
                in_image.push(Some(next));
                next += 1;
            } else {
                in_image.push(None);
            }
        }
        let image: Vec<usize> = (0..count).filter(|&i| in_image[i].is_some()).collect();
        let labels = table_map_labels(tme, count);
        // Signedness and character sets come per numeric / character / ENUM-SET column, in
        // column order (MySQL `Table_map_log_event` optional metadata; read as mysql_common's
        // `BinlogRow` reads them).
        let extractor = OptionalMetaExtractor::new(tme.iter_optional_meta())
            .map_err(|e| format!("the table map's optional metadata cannot be read: {e}"))?;
        let mut signedness = extractor.iter_signedness();
        let mut charsets = extractor.iter_charset();
        let mut enum_set_charsets = extractor.iter_enum_and_set_charset();
        let mut columns = Vec::with_capacity(count);
        let mut meta = Vec::with_capacity(count);
        for (i, (name, labels)) in names.into_iter().zip(labels).enumerate() {
            let column_type = tme.get_column_type(i).ok().flatten();
            let column_meta = tme.get_column_metadata(i).unwrap_or_default();
            let (mut unsigned, mut collation) = (false, 0);
            if let Some(ty) = column_type {
                if ty.is_numeric_type() {
                    unsigned = signedness.next().unwrap_or_default();
                }
                let charset = if ty.is_character_type() {
                    charsets.next()
                } else if ty.is_enum_or_set_type() {
                    enum_set_charsets.next()
                } else {
                    None
                };
                collation = charset
                    .transpose()
                    .map_err(|e| format!("the table map's character sets cannot be read: {e}"))?
                    .unwrap_or_default();
            }
            // Without labels in the table map (`binlog_row_metadata=MINIMAL`): those read from
            // information_schema, if known.
            let labels = match labels {
                None if column_type.is_some_and(|ty| ty.is_enum_or_set_type()) => tracked_labels
                    .and_then(|l| l.get(&name.to_lowercase()))
                    .map(|l| l.iter().map(|v| v.as_bytes().to_vec()).collect()),
                labels => labels,
            };
            columns.push(ColumnInfo {
                name,
                column_type,
                collation,
                unsigned,
                labels,
                fixed_len: (column_type == Some(ColumnType::MYSQL_TYPE_STRING))
                    .then(|| string_column_length(column_meta))
                    .flatten(),
                nullable: tme.null_bitmask().get(i).is_none_or(|b| *b),
            });
            // Pre-5.6 temporal columns carry no metadata: their precision, when known, stands
            // in for it (read_row).
            meta.push(match column_type {
                Some(ty) if temporal::is_old_temporal(ty) => temporal_decimals
                    .and_then(|d| d.get(&columns[i].name.to_lowercase()))
                    .map(|d| vec![*d])
                    .unwrap_or_default(),
                _ => column_meta.to_vec(),
            });
        }
        for &i in &image {
            if let Some(ty) = columns[i].column_type {
                check_column_meta(ty, &meta[i])
                    .map_err(|e| format!("column {:?}: {e}", columns[i].name))?;
            }
        }
        let find = |key: &str, name: &str| {
            columns
                .iter()
                // Column names are case-insensitive in MySQL.
                .position(|c| c.name.eq_ignore_ascii_case(name))
                .ok_or_else(|| {
                    format!(
                        "the outbox has no column {name:?} ({key}); its columns are {}",
                        columns
                            .iter()
                            .map(|c| c.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })
        };
        let optional = |key: &str, name: &str| {
            if name.is_empty() {
                Ok(None)
            } else {
                find(key, name).map(Some)
            }
        };
        let m = &mapping.columns;
        let mut layout = Self {
            id: find("outbox.columns.id", &m.id)?,
            aggregate_type: find("outbox.columns.aggregate_type", &m.aggregate_type)?,
            aggregate_id: find("outbox.columns.aggregate_id", &m.aggregate_id)?,
            event_type: optional("outbox.columns.event_type", &m.event_type)?,
            event_key: optional("outbox.columns.event_key", &m.event_key)?,
            payload: find("outbox.columns.payload", &m.payload)?,
            created_at: optional("outbox.columns.created_at", &m.created_at)?,
            partition: optional("outbox.columns.partition", &m.partition)?,
            additional: mapping
                .additional
                .iter()
                .map(|a| find("outbox.additional", &a.column))
                .collect::<Result<_, _>>()?,
            shared: Vec::new(),
            columns,
            meta,
            in_image,
            image,
        };
        let mut all: Vec<usize> = vec![layout.id, layout.aggregate_type, layout.aggregate_id];
        all.extend(layout.event_type);
        all.extend(layout.event_key);
        all.push(layout.payload);
        all.extend(layout.created_at);
        all.extend(layout.partition);
        all.extend(layout.additional.iter().copied());
        for idx in &all {
            if all.iter().filter(|i| *i == idx).count() > 1 && !layout.shared.contains(idx) {
                layout.shared.push(*idx);
            }
        }
        // A mapped ENUM/SET column must be relayed as its labels, never as the bare index.
        if let Some(c) = all.iter().map(|&i| &layout.columns[i]).find(|c| {
            c.column_type.is_some_and(|ty| ty.is_enum_or_set_type()) && c.labels.is_none()
        }) {
            return Err(format!(
                "the table map carries no ENUM/SET labels and those of column {:?} are not \
                 known (it was added or redefined by a DDL statement the relay read, or the \
                 checkpoint predates stored labels). Fix: SET GLOBAL binlog_row_metadata=FULL \
                 on the server (MySQL 8.0.1+, MariaDB 10.5+), then move the checkpoint past \
                 this point (outbox-relay reset) once the rows from here on were relayed \
                 another way",
                c.name
            ));
        }
        Ok(layout)
    }

    /// Reads one row image from `buf` into `values` (one per image column, in image order):
    /// the NULL bitmap over the image's columns, then each non-NULL value as the table map's
    /// type and metadata say (MySQL `Rows_log_event`, "Row image" in the source's
    /// `log_event.h`). Values borrow `buf`'s bytes where they can.
    ///
    /// # Errors
    /// Data too short, or a value that its column type cannot read.
    fn read_row<'a>(
        &'a self,
        buf: &mut ParseBuf<'a>,
        values: &mut Vec<Option<ColumnValue<'a>>>,
    ) -> std::io::Result<()> {
        values.clear();
        let nulls: &[u8] = buf.parse(self.image.len().div_ceil(8))?;
        for (k, &col) in self.image.iter().enumerate() {
            if nulls.get(k / 8).is_some_and(|b| b & (1 << (k % 8)) != 0) {
                values.push(Some(ColumnValue::Value(Value::NULL)));
                continue;
            }
            let info = &self.columns[col];
            let ty = info.column_type.ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "the table map gives no known type for column {:?}",
                        info.name
                    ),
                )
            })?;
            if temporal::is_old_temporal(ty) {
                let decimals = self.meta[col].first().copied().ok_or_else(|| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!(
                            "column {:?} has a pre-MySQL 5.6 temporal format, whose binlog \
                             values depend on a precision the table map does not carry, and \
                             its precision is not known (the column was added after the relay \
                             started, or this is a replay without a server). Fix: restart the \
                             relay (it reads the precision from information_schema), or convert \
                             the column: ALTER TABLE … FORCE with mysql56_temporal_format=ON",
                            info.name
                        ),
                    )
                })?;
                values.push(Some(ColumnValue::Value(temporal::read(buf, ty, decimals)?)));
                continue;
            }
            let meta = self.meta[col].as_slice();
            let bad = |why: String| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("column {:?}: {why}", info.name),
                )
            };
            match (read_as(ty, meta), meta) {
                (ColumnType::MYSQL_TYPE_DATETIME2, _)
                    if buf.0.first().is_some_and(|b| b & 0x80 == 0) =>
                {
                    // mysql_common negates the packed value, which overflows for the smallest.
                    return Err(bad(format!(
                        "the DATETIME value is below zero (stored as {:02x?}), which MySQL \
                         never writes",
                        &buf.0[..buf.0.len().min(5)]
                    )));
                }
                (ColumnType::MYSQL_TYPE_NEWDECIMAL, &[precision, scale, ..]) => {
                    // mysql_common multiplies the last digit group without checking it.
                    let size =
                        crate::decode::json::decimal_bin_size(precision, scale).map_err(bad)?;
                    if let Some(bin) = buf.0.get(..size) {
                        crate::decode::json::decimal_digits(precision, scale, bin).map_err(bad)?;
                    }
                }
                (ColumnType::MYSQL_TYPE_TIME2, &[1 | 2, ..]) if ty == read_as(ty, meta) => {
                    values.push(Some(ColumnValue::Value(time2_hundredths(buf)?)));
                    continue;
                }
                (ColumnType::MYSQL_TYPE_JSON, _) => {
                    // Kept as the row image's bytes: rendered straight from the binary format
                    // when the event is built, without mysql_common's value per element (which
                    // cost a third of the decoding of a MySQL outbox row with a JSON payload).
                    let doc = buf
                        .checked_eat_u32_str()
                        .ok_or_else(|| bad("the JSON value runs past the end of the row".into()))?;
                    values.push(Some(ColumnValue::Json(doc)));
                    continue;
                }
                _ => {}
            }
            let ctx = (ty, meta, info.unsigned, false);
            match buf.parse::<BinlogValue<'a>>(ctx)? {
                BinlogValue::Value(v) => values.push(Some(ColumnValue::Value(v))),
                // Only a JSON column (read above) or a partial update (not asked for) yields
                // these.
                BinlogValue::Jsonb(_) | BinlogValue::JsonDiff(_) => {
                    return Err(bad("a JSON value in a column of another type".into()))
                }
            }
        }
        Ok(())
    }

    fn extract(
        &self,
        row: &mut [Option<ColumnValue<'_>>],
        mapping: &Arc<TableMapping>,
        ev: &SourceEvent,
        commit_ms: i64,
        row_error: &dyn Fn(String) -> RelayError,
    ) -> Result<Option<OutboxEvent>, Box<RowFailure>> {
        let fail = |reason: String| RowFailure::bare(row_error(reason));
        let mut take = |idx: usize| -> Result<(ColumnValue<'_>, &ColumnInfo), Box<RowFailure>> {
            let info = &self.columns[idx];
            let value = match self.in_image[idx] {
                Some(p) if self.shared.contains(&idx) => {
                    row.get(p).and_then(|v| v.as_ref()).cloned()
                }
                Some(p) => row.get_mut(p).and_then(Option::take),
                None => None,
            };
            value.map(|v| (v, info)).ok_or_else(|| {
                fail(format!(
                    "column {:?} is missing from the row image (the server logs partial rows: \
                     binlog_row_image=MINIMAL or NOBLOB). Fix: SET GLOBAL binlog_row_image=FULL \
                     (and in the writers' sessions)",
                    info.name
                ))
            })
        };
        let column_ms = match self.created_at {
            Some(idx) if mapping.timestamp == TimestampSource::Column => match take(idx)? {
                (ColumnValue::Value(v), info) => {
                    crate::decode::columns::timestamp_ms(&v, mapping.datetime_time_zone)
                        .map_err(|e| fail(format!("column {:?}: {e}", info.name)))?
                }
                (_, info) => {
                    return Err(fail(format!(
                        "column {:?} (outbox.columns.created_at) is not a DATETIME or TIMESTAMP",
                        info.name
                    )))
                }
            },
            _ => None,
        };
        let partition = match self.partition {
            Some(idx) => match take(idx)? {
                (ColumnValue::Value(Value::NULL), _) => None,
                (ColumnValue::Value(Value::Int(p)), _)
                    if (0..=i64::from(i32::MAX)).contains(&p) =>
                {
                    i32::try_from(p).ok()
                }
                (ColumnValue::Value(Value::UInt(p)), _) if p <= i32::MAX as u64 => {
                    i32::try_from(p).ok()
                }
                (v, info) => {
                    return Err(fail(format!(
                        "column {:?} (outbox.columns.partition) holds {v:?}, not a partition \
                         number (an integer from 0)",
                        info.name
                    )))
                }
            },
            None => None,
        };
        let values = row_values(
            mapping,
            |c| {
                let idx = match c {
                    OutboxColumn::Id => Some(self.id),
                    OutboxColumn::AggregateType => Some(self.aggregate_type),
                    OutboxColumn::AggregateId => Some(self.aggregate_id),
                    OutboxColumn::EventType => self.event_type,
                    OutboxColumn::EventKey => self.event_key,
                    OutboxColumn::Payload => Some(self.payload),
                    OutboxColumn::Additional(i) => Some(self.additional[i]),
                };
                match idx {
                    Some(idx) => take(idx),
                    None => Ok((ColumnValue::Value(Value::NULL), &UNMAPPED_COLUMN)),
                }
            },
            fail,
            |v, _| matches!(v, ColumnValue::Json(_)),
        )?;
        match outbox_event(
            mapping,
            values,
            partition,
            column_ms,
            commit_ms,
            ev.position.clone(),
        ) {
            Ok(Some(event)) => Ok(Some(event)),
            Ok(None) => {
                tracing::warn!(position = %ev.position, table = %mapping.table,
                    "outbox row with a NULL payload skipped (outbox.null_payload = \"skip\")");
                Ok(None)
            }
            Err(unbuildable) => {
                let Unbuildable { reason, values } = *unbuildable;
                // Keep what was readable, so the dead letter can still be traced and replayed.
                let h = &mapping.headers;
                let mut headers: Vec<(String, Vec<u8>)> = [
                    (&h.id, values.id),
                    (&h.event_key, values.event_key),
                    (&h.event_type, values.event_type),
                    (&h.aggregate_type, values.aggregate_type),
                ]
                .into_iter()
                .filter(|(name, _)| !name.is_empty())
                .filter_map(|(name, v)| Some((name.to_string(), v?)))
                .collect();
                headers.extend(values.extra_headers);
                Err(Box::new(RowFailure {
                    error: row_error(reason),
                    key: values.aggregate_id,
                    value: values.payload,
                    headers,
                }))
            }
        }
    }
}
#[cfg(test)]
mod statement_tests {
    use super::*;

    fn t(s: &str) -> TableName {
        TableName::parse(s, None).expect("table")
    }

    #[test]
    fn statement_inserts_into_the_outbox_are_recognised() {
        let outbox = t("shop.outbox");
        for stmt in [
            "INSERT INTO outbox (id) VALUES (1)",
            "insert into `shop`.`outbox` values (1)",
            "INSERT /* c */ IGNORE INTO shop.outbox SELECT * FROM x",
            "REPLACE outbox SET id = 1",
            "LOAD DATA LOCAL INFILE '/tmp/x.csv' INTO TABLE outbox",
        ] {
            assert!(statement_writes_table(stmt, "shop", &outbox), "{stmt}");
        }
        for stmt in [
            "INSERT INTO other.outbox (id) VALUES (1)",
            "INSERT INTO outbox_archive SELECT * FROM outbox",
            "UPDATE outbox SET status = 1",
            "INSERT INTO outbox (id) VALUES (1)", // default database is not shop
        ] {
            let db =
                if stmt.contains("other") || stmt.contains("archive") || stmt.starts_with("UPDATE")
                {
                    "shop"
                } else {
                    "billing"
                };
            assert!(!statement_writes_table(stmt, db, &outbox), "{stmt} in {db}");
        }
    }
}

#[cfg(test)]
mod fixture_tests {
    use super::*;
    use crate::binlog::fixtures;
    use crate::binlog::source::BinlogFileSource;
    use outbox_relay_core::position::gtid::MysqlGtidSet;
    use std::path::Path;

    /// The mappings of a config whose `[outbox]` section is `outbox`.
    pub(crate) fn mappings(outbox: &str) -> Vec<TableMapping> {
        let toml = format!(
            "[mysql]\nurl = \"mysql://root@127.0.0.1:3306/shop\"\nserver_id = 9\n\
             [kafka]\nbootstrap_servers = \"127.0.0.1:9092\"\n[outbox]\n{outbox}"
        );
        outbox_relay_core::config::RelayConfig::from_toml_str(&toml)
            .and_then(|c| c.table_mappings())
            .expect("valid mapping")
    }

    /// Decodes a whole fixture file; returns the rows and the boundaries.
    fn decode_file(
        name: &str,
        mappings: Vec<TableMapping>,
        gtid: Option<GtidState>,
    ) -> (Vec<Result<OutboxEvent, Box<RowFailure>>>, Vec<TxBoundary>) {
        decode_path(&fixtures::path(name), mappings, gtid)
    }

    /// Decodes a whole binlog file; returns the rows and the boundaries.
    fn decode_path(
        path: &Path,
        mappings: Vec<TableMapping>,
        gtid: Option<GtidState>,
    ) -> (Vec<Result<OutboxEvent, Box<RowFailure>>>, Vec<TxBoundary>) {
        let name = path.display();
        let mut source =
            BinlogFileSource::open(path).unwrap_or_else(|e| panic!("binlog file {name}: {e}"));
        let mut decoder = Decoder::new(
            mappings,
            TableName::parse("none.none", None).expect("table"),
            gtid,
        );
        let (mut rows, mut boundaries) = (Vec::new(), Vec::new());
        while let Some(ev) = source.next_event() {
            let ev = ev.unwrap_or_else(|e| panic!("{name}: {e}"));
            let (r, b) = decoder
                .decode(&ev, |id| source.table_map(id))
                .unwrap_or_else(|e| panic!("{name}: {e}"))
                .into_parts();
            rows.extend(r);
            boundaries.extend(b);
        }
        (rows, boundaries)
    }

    /// Found by fuzzing (binlog_file): a rows event whose after-image bitmap names no column
    /// has row images of no bytes, and the decoder looped over the bytes after them forever
    /// (collecting failures until memory ran out). Now a row error.
    #[test]
    fn rows_event_without_image_columns_is_an_error() {
        let mut events = fixtures::split_events(&fixtures::read("mysql8-invisible-columns.000001"));
        // The first WRITE_ROWS event of test.t1: table id (6), flags (2), extra data length (2),
        // column count (1: 6), then the after-image bitmap.
        let rows = events
            .iter_mut()
            .find(|e| e.type_code == 30)
            .expect("rows event");
        assert_eq!(rows.body[10..12], [6, 0xff]);
        rows.body[11] = 0;
        let dir = fixtures::scratch_dir("no-image-columns");
        let path = dir.join("mysql8-invisible-columns.000001");
        std::fs::write(&path, fixtures::write_file(&events)).expect("scratch file");
        let m = mappings(
            "tables = [\"test.t1\"]\n[outbox.columns]\nid = \"f1\"\nevent_key = \"f2\"\n\
             event_type = \"f3\"\naggregate_type = \"f4\"\npayload = \"f5\"\naggregate_id = \"f6\"\n\
             created_at = \"\"\n",
        );
        let mut source = BinlogFileSource::open(&path).expect("opens");
        let mut decoder = Decoder::new(m, TableName::parse("none.none", None).expect("t"), None);
        let mut errors = Vec::new();
        while let Some(ev) = source.next_event() {
            let ev = ev.expect("event");
            if let Err(e) = decoder.decode(&ev, |id| source.table_map(id)) {
                errors.push(e.to_string());
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].contains("test.t1")
                && errors[0]
                    .contains("its row image holds no columns, yet 27 bytes of rows follow"),
            "{errors:?}"
        );
    }

    /// Found by fuzzing (gtid_sets): the decoder parsed every PREVIOUS_GTIDS event, and
    /// mysql_common reserves memory for as many sources as one counts (a panic or an abort for
    /// a damaged count). The decoder does not need it and no longer parses it.
    #[test]
    fn damaged_previous_gtids_event_does_not_stop_decoding() {
        let mut events = fixtures::split_events(&fixtures::read("mysql8-gtid.000001"));
        let previous = events
            .iter_mut()
            .find(|e| e.type_code == 35)
            .expect("PREVIOUS_GTIDS");
        previous.body = (1u64 << 55).to_le_bytes().to_vec();
        let dir = fixtures::scratch_dir("damaged-previous-gtids");
        let path = dir.join("mysql8-gtid.000001");
        std::fs::write(&path, fixtures::write_file(&events)).expect("scratch file");
        let (_, boundaries) = decode_path(&path, Vec::new(), None);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(!boundaries.is_empty());
    }

    #[test]
    fn mariadb_fixture_rows_and_boundaries() {
        // mariadb10-outbox.000001 (MariaDB 10.11): toddy_test.outbox (id INT, topic VARCHAR,
        // event_type ENUM('BLOB','JSON','PROTOBUF'), event LONGTEXT, created TIMESTAMP), two
        // INSERTs of ('foo', 'JSON', '{"foo":1}') with ids 62 and 63 under SET TIMESTAMP =
        // 1650493084 and 1650493195 (mariadb10-outbox.000001.sql); Xid events end at 722 and
        // 1114, GTIDs 0-1-1 and 0-1-2 (SHOW BINLOG EVENTS, mariadb10-outbox.000001.events).
        let m = mappings(
            "tables = [\"toddy_test.outbox\"]\n[outbox.columns]\naggregate_type = \"topic\"\n\
             aggregate_id = \"id\"\nevent_key = \"id\"\npayload = \"event\"\ncreated_at = \"created\"\n",
        );
        let (rows, boundaries) = decode_file("mariadb10-outbox.000001", m, None);
        let rows: Vec<OutboxEvent> = rows.into_iter().map(|r| r.expect("row")).collect();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].id.as_deref(), Some(&b"62"[..]));
        assert_eq!(rows[1].id.as_deref(), Some(&b"63"[..]));
        for (row, created) in rows.iter().zip([1_650_493_084_000_i64, 1_650_493_195_000]) {
            assert_eq!(row.aggregate_type, "foo");
            assert_eq!(row.payload.as_deref(), Some(&br#"{"foo":1}"#[..]));
            // ENUM('BLOB','JSON','PROTOBUF'): the binlog holds the index 2.
            assert_eq!(row.event_type.as_deref(), Some(&b"JSON"[..]), "ENUM label");
            assert_eq!(row.timestamp_ms, created, "TIMESTAMP(0) column");
        }
        let ends: Vec<u64> = boundaries.iter().map(|b| b.position.pos).collect();
        assert_eq!(ends, [722, 1114], "ends of the two Xid events");
        let gtids: Vec<_> = boundaries.iter().map(|b| b.gtid_set.clone()).collect();
        assert_eq!(gtids, [Some("0-1-1".to_owned()), Some("0-1-2".to_owned())]);
    }

    #[test]
    fn unsigned_and_signed_integers_keep_their_values() {
        // mysql8-invisible-columns.000001 (MySQL 8.0.31, binlog_row_metadata=FULL): test.t1
        // (f1 INT UNSIGNED INVISIBLE, f2 INT UNSIGNED INVISIBLE, f3 INT, f4 TEXT, f5 BLOB,
        // f6 BIGINT UNSIGNED INVISIBLE); rows (1, 2, -3, '4', x'05', 6000000000),
        // (NULL, NULL, -33, '44', 'U', NULL) and (4294967295, 0, -2147483648, '', x'',
        // 18446744073709551615) (mysql8-invisible-columns.000001.sql).
        let m = mappings(
            "tables = [\"test.t1\"]\n[outbox.columns]\nid = \"f1\"\nevent_key = \"f2\"\n\
             event_type = \"f3\"\naggregate_type = \"f4\"\npayload = \"f5\"\naggregate_id = \"f6\"\n\
             created_at = \"\"\n",
        );
        let (rows, _) = decode_file("mysql8-invisible-columns.000001", m, None);
        assert_eq!(rows.len(), 3);
        let first = rows[0].as_ref().expect("first row");
        assert_eq!(first.id.as_deref(), Some(&b"1"[..]));
        assert_eq!(first.event_key.as_deref(), Some(&b"2"[..]));
        assert_eq!(first.event_type.as_deref(), Some(&b"-3"[..]));
        assert_eq!(first.aggregate_type, "4");
        assert_eq!(first.payload.as_deref(), Some(&b"\x05"[..]));
        assert_eq!(first.aggregate_id, b"6000000000");
        let second = rows[1].as_ref().expect_err("NULL aggregate id");
        assert!(second.error.to_string().contains("aggregate_id is NULL"));
        assert_eq!(second.value.as_deref(), Some(&b"U"[..]));
        let third = rows[2].as_ref().expect("third row");
        assert_eq!(
            third.id.as_deref(),
            Some(&b"4294967295"[..]),
            "INT UNSIGNED max"
        );
        assert_eq!(third.event_key.as_deref(), Some(&b"0"[..]));
        assert_eq!(
            third.event_type.as_deref(),
            Some(&b"-2147483648"[..]),
            "INT min"
        );
        assert_eq!(
            third.aggregate_id, b"18446744073709551615",
            "BIGINT UNSIGNED max"
        );
    }

    #[test]
    fn table_maps_without_names_need_a_tracked_layout() {
        // mysql8-minimal-metadata.000001 (MySQL 8.0.31): noria.t1 (c1 INT NOT NULL PRIMARY KEY,
        // c2 BLOB, c3 CHAR(2) utf8mb4_0900_ai_ci (8 bytes), c4 INT, c5 INT UNSIGNED) logged with
        // binlog_row_metadata=MINIMAL and binlog_row_image=MINIMAL: INSERT (c1, c3, c5) VALUES
        // (1, 'a', 3230202323), so the image has columns 1, 3 and 5 only
        // (mysql8-minimal-metadata.000001.sql).
        let outbox = "tables = [\"noria.t1\"]\n[outbox.columns]\nid = \"c1\"\n\
             aggregate_type = \"c3\"\naggregate_id = \"c5\"\nevent_type = \"c1\"\n\
             event_key = \"c1\"\npayload = \"c3\"\ncreated_at = \"\"\n";
        let run = |tracked: Option<Vec<String>>, outbox: &str| {
            let mut source = fixtures::open("mysql8-minimal-metadata.000001");
            let mut decoder = Decoder::new(
                mappings(outbox),
                TableName::parse("none.none", None).expect("table"),
                None,
            );
            if let Some(t) = tracked {
                decoder.track_layout(TableName::parse("noria.t1", None).expect("t"), t);
            }
            let mut rows = Vec::new();
            while let Some(ev) = source.next_event() {
                let ev = ev.expect("event");
                rows.extend(
                    decoder
                        .decode(&ev, |id| source.table_map(id))?
                        .into_parts()
                        .0,
                );
            }
            Ok::<_, RelayError>(rows)
        };
        let err = run(None, outbox).expect_err("no names").to_string();
        assert!(err.contains("binlog_row_metadata=FULL"), "{err}");
        let names: Vec<String> = (1..=5).map(|i| format!("c{i}")).collect();
        let err = run(Some(names[..4].to_vec()), outbox)
            .expect_err("4 of 5")
            .to_string();
        assert!(err.contains("5 columns") && err.contains("has 4"), "{err}");
        let rows = run(Some(names.clone()), outbox).expect("decodes");
        let row = rows[0].as_ref().expect("row");
        assert_eq!(row.id.as_deref(), Some(&b"1"[..]));
        assert_eq!(row.aggregate_id, b"3230202323", "INT UNSIGNED");
        assert_eq!(row.payload.as_deref(), Some(&b"a"[..]));
        assert_eq!(row.aggregate_type, "a");
        // Column c2 (BLOB) is not in the MINIMAL image.
        let rows = run(
            Some(names),
            &outbox.replace("payload = \"c3\"", "payload = \"c2\""),
        )
        .expect("decodes");
        let err = rows[0]
            .as_ref()
            .expect_err("partial image")
            .error
            .to_string();
        assert!(
            err.contains("missing from the row image") && err.contains("MINIMAL"),
            "{err}"
        );
    }

    #[test]
    fn mysql_gtids_are_counted_at_commit() {
        // mysql8-gtid.000001 (MySQL 8.0.31, gtid_mode=ON): three transactions with gtid_next
        // 3e11fa47-71ca-11e1-9e33-c80aa9429562:1, :2 and :3 (mysql8-gtid.000001.sql).
        let (_, boundaries) = decode_file(
            "mysql8-gtid.000001",
            Vec::new(),
            Some(GtidState::MySql(MysqlGtidSet::new())),
        );
        let sets: Vec<String> = boundaries
            .iter()
            .map(|b| b.gtid_set.clone().unwrap_or_default())
            .collect();
        let uuid = "3e11fa47-71ca-11e1-9e33-c80aa9429562";
        assert_eq!(
            sets,
            [
                format!("{uuid}:1"),
                format!("{uuid}:1-2"),
                format!("{uuid}:1-3")
            ]
        );
    }

    /// MySQL 8.4 tagged GTIDs (GTID_TAGGED_LOG_EVENT, type 42), which no server here writes:
    /// mysql8-gtid.000001 with its GTID events replaced by tagged ones built from MySQL's
    /// documented layout (`fixtures::TaggedGtid`). The assertion on a file MySQL itself wrote is
    /// in the optional conformance target (`make conformance`).
    #[test]
    fn mysql_tagged_gtid_extends_the_set() {
        let uuid = "55778904-0299-11f1-b1b8-4ef0c4956feb";
        let sid = fixtures::uuid_bytes(uuid);
        let dir = fixtures::scratch_dir("tagged-decode");
        let path = dir.join("tagged.000001");
        let bytes = fixtures::tagged_gtid_file(
            &[(sid, "", &[(1, 14)]), (sid, "mytag", &[(1, 3)])],
            sid,
            "mytag",
            [3, 4, 6],
        );
        std::fs::write(&path, bytes).expect("scratch file");
        let start: MysqlGtidSet = format!("{uuid}:1-13:mytag:1-2").parse().expect("set");
        let (_, boundaries) = decode_path(&path, Vec::new(), Some(GtidState::MySql(start)));
        let _ = std::fs::remove_dir_all(&dir);
        let sets: Vec<Option<String>> = boundaries.iter().map(|b| b.gtid_set.clone()).collect();
        assert_eq!(
            sets,
            [
                Some(format!("{uuid}:1-13:mytag:1-3")),
                Some(format!("{uuid}:1-13:mytag:1-4")),
                Some(format!("{uuid}:1-13:mytag:1-4:6")),
            ]
        );
    }
}

#[cfg(test)]
mod payload_fixture_tests {
    use super::*;
    use crate::binlog::fixtures;
    use crate::binlog::source::BinlogFileSource;
    use mysql_async::binlog::events::EventData;
    use std::path::{Path, PathBuf};

    /// MySQL 8.0.31, `SET SESSION binlog_transaction_compression=ON; INSERT INTO test.tb1
    /// VALUES (1)` with `binlog_row_metadata=MINIMAL` (mysql8-compressed.000001.sql).
    const FIXTURE: &str = "mysql8-compressed.000001";

    fn decoder() -> Decoder {
        Decoder::new(
            super::fixture_tests::mappings("tables = [\"test.tb1\"]\n"),
            TableName::parse("none.none", None).expect("table"),
            None,
        )
    }

    /// With the table's layout tracked (one column, here named `id`), the compressed row is
    /// relayed: every field mapped to that column.
    #[test]
    fn compressed_row_is_relayed_with_a_tracked_layout() {
        let mut source = fixtures::open(FIXTURE);
        let mut decoder = Decoder::new(
            super::fixture_tests::mappings(
                "tables = [\"test.tb1\"]\n[outbox.columns]\nid = \"id\"\naggregate_type = \"id\"\n\
                 aggregate_id = \"id\"\nevent_type = \"id\"\nevent_key = \"id\"\npayload = \"id\"\n\
                 created_at = \"\"\n",
            ),
            TableName::parse("none.none", None).expect("table"),
            None,
        );
        decoder.track_layout(
            TableName::parse("test.tb1", None).expect("table"),
            vec!["id".into()],
        );
        let (mut rows, mut ends) = (Vec::new(), Vec::new());
        while let Some(ev) = source.next_event() {
            let (r, b) = decoder
                .decode(&ev.expect("event"), |id| source.table_map(id))
                .expect("decodes")
                .into_parts();
            rows.extend(r.into_iter().map(|r| r.expect("row")));
            ends.extend(b.map(|b| b.position.pos));
        }
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].aggregate_id, b"1");
        assert_eq!(rows[0].payload.as_deref(), Some(&b"1"[..]));
        assert_eq!(rows[0].position.pos, 393, "the payload event's end");
        assert_eq!(ends, [393]);
    }

    // Expected values from SHOW BINLOG EVENTS (mysql8-compressed.000001.events) and an
    // independent look at the file (python + `zstd -d`): FDE, PREVIOUS_GTIDS, GTID (type 33),
    // then the TRANSACTION_PAYLOAD event (234..393) has compression type 0 (zstd),
    // uncompressed_size 175 and a 126-byte payload; `zstd -d` of the payload gives QUERY
    // "BEGIN" (67 bytes), TABLE_MAP test.tb1 (45; one LONG column, no column names:
    // binlog_row_metadata=MINIMAL), WRITE_ROWS v2 (36; the row is 01 00 00 00 = 1) and XID
    // (27), all with log_pos 0; then ROTATE (393..440).
    #[test]
    fn compressed_transaction_yields_inner_events_at_the_payload_end() {
        let mut source = fixtures::open(FIXTURE);
        let mut decoder = decoder();
        let (mut seen, mut rows, mut boundaries, mut values) = (vec![], vec![], vec![], vec![]);
        let mut errors = vec![];
        while let Some(ev) = source.next_event() {
            let ev = ev.expect("event decodes");
            let header = ev.event.header();
            seen.push((
                header.event_type_raw(),
                header.event_size(),
                ev.position.pos,
                ev.in_payload,
            ));
            if let Ok(Some(EventData::RowsEvent(r))) = ev.event.read_data() {
                let tme = source.table_map(r.table_id()).expect("table map kept");
                assert_eq!((&*tme.database_name(), &*tme.table_name()), ("test", "tb1"));
                for row in r.rows(tme) {
                    let (_, after) = row.expect("row decodes");
                    values.push(after.expect("after image").unwrap());
                }
            }
            match decoder.decode(&ev, |id| source.table_map(id)) {
                Ok(d) => {
                    let (r, b) = d.into_parts();
                    rows.extend(r);
                    boundaries.extend(b);
                }
                Err(e) => errors.push(e.to_string()),
            }
        }
        assert_eq!(
            seen,
            [
                (15, 126 - 4, 126, false),
                (35, 157 - 126, 157, false),
                (33, 234 - 157, 234, false), // GTID
                (40, 393 - 234, 393, false),
                (2, 67, 393, true),
                (19, 45, 393, true),
                (30, 36, 393, true),
                (16, 27, 393, true),
                (4, 440 - 393, 440, false),
            ]
        );
        assert_eq!(
            values,
            [vec![BinlogValue::Value(Value::Int(1))]],
            "the one row"
        );
        let ends: Vec<u64> = boundaries.iter().map(|b| b.position.pos).collect();
        assert_eq!(ends, [393], "one boundary, at the end of the payload event");
        // The table has no column names in its map: the outbox row is refused, not dropped.
        assert!(rows.is_empty());
        assert_eq!(
            errors,
            [format!(
                "cannot relay the row at {FIXTURE}:393 in test.tb1: the table map event carries \
                 no column names. Fix: SET GLOBAL binlog_row_metadata=FULL on the server (MySQL \
                 8.0.1+, MariaDB 10.5+)"
            )]
        );
    }

    /// A copy of the fixture whose zstd frame is damaged (payload bytes flipped, the event's
    /// CRC32 recomputed so only decompression fails), in its own temporary directory.
    fn corrupt_copy(dir: &Path) -> PathBuf {
        let mut bytes = fixtures::read(FIXTURE);
        // Payload starts after the 19-byte header and 10 bytes of payload fields (`02 01 00`
        // compression type zstd, `03 01 af` uncompressed size 175, `01 01 7e` payload size 126,
        // `00` end mark); `zstd -d` reports "Data corruption detected" for a flip at payload
        // offset 20.
        let payload = 234 + 19 + 10;
        for b in &mut bytes[payload + 20..payload + 24] {
            *b ^= 0xff;
        }
        let crc = crc32fast::hash(&bytes[234..389]);
        bytes[389..393].copy_from_slice(&crc.to_le_bytes());
        std::fs::create_dir_all(dir).expect("temp dir");
        let path = dir.join(FIXTURE);
        std::fs::write(&path, bytes).expect("temp file");
        path
    }

    #[test]
    fn undecompressable_payload_stops_with_its_position() {
        let dir = std::env::temp_dir().join(format!("outbox-relay-tpe-{}", std::process::id()));
        let path = corrupt_copy(&dir);
        let mut source = BinlogFileSource::open(&path).expect("copy opens");
        let mut decoder = decoder();
        let mut error = None;
        let mut boundaries = 0;
        while let Some(ev) = source.next_event() {
            match ev {
                Ok(ev) => {
                    if let Decoded::Boundary(_) = decoder
                        .decode(&ev, |id| source.table_map(id))
                        .expect("decodes")
                    {
                        boundaries += 1;
                    }
                }
                Err(e) => {
                    error = Some(e.to_string());
                    break;
                }
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        let error = error.expect("a loud error");
        assert_eq!(boundaries, 0);
        let prefix = format!(
            "binlog: the compressed transaction (TRANSACTION_PAYLOAD) ending at {FIXTURE}:393 \
             could not be decompressed: "
        );
        assert!(error.starts_with(&prefix), "{error}");
        assert!(error.contains("(175 bytes expected)"), "{error}");
        assert!(
            error.contains("SET GLOBAL binlog_transaction_compression=OFF"),
            "{error}"
        );
    }
}

#[cfg(test)]
mod minimal_metadata_label_tests {
    //! Table maps logged with `binlog_row_metadata=MINIMAL` (MySQL 8.0's default) carry neither
    //! column names nor ENUM labels: both come from the tracked layout.
    use super::*;
    use crate::decode::columns::text_form;
    use mysql_async::binlog::events::FormatDescriptionEvent;
    use mysql_async::binlog::BinlogVersion;
    use mysql_common::binlog::BinlogCtx;
    use mysql_common::proto::MyDeserialize;

    /// The table map MySQL 8.0 logs with MINIMAL metadata for
    /// `shop.outbox (id BIGINT, kind ENUM('Created','Paid'))`: LONGLONG; STRING whose metadata
    /// is the real type ENUM (247) and pack length 1; no optional metadata.
    fn minimal_table_map() -> TableMapEvent<'static> {
        let mut raw = vec![42, 0, 0, 0, 0, 0, 1, 0];
        raw.extend([4, b's', b'h', b'o', b'p', 0]);
        raw.extend([6, b'o', b'u', b't', b'b', b'o', b'x', 0]);
        raw.extend([2, 8, 254]); // two columns: LONGLONG, STRING
        raw.extend([2, 247, 1]); // metadata: ENUM, 1 byte
        raw.push(0); // null bitmap
        let fde = FormatDescriptionEvent::new(BinlogVersion::Version4);
        let ctx = BinlogCtx::new(raw.len(), &fde, 19);
        TableMapEvent::deserialize(ctx, &mut ParseBuf(&raw))
            .expect("table map")
            .into_owned()
    }

    fn mapping() -> TableMapping {
        super::fixture_tests::mappings(
            "tables = [\"shop.outbox\"]\n[outbox.columns]\nid = \"id\"\naggregate_type = \"id\"\n\
             aggregate_id = \"id\"\nevent_type = \"kind\"\nevent_key = \"id\"\npayload = \"id\"\n\
             created_at = \"\"\n",
        )
        .remove(0)
    }

    #[test]
    fn enum_labels_come_from_the_tracked_labels() {
        let tme = minimal_table_map();
        assert_eq!(
            tme.get_column_type(1).expect("type"),
            Some(ColumnType::MYSQL_TYPE_ENUM)
        );
        let names = ["id".to_owned(), "kind".to_owned()];
        let labels = Labels::from([(
            "kind".to_owned(),
            vec!["Created".to_owned(), "Paid".to_owned()],
        )]);
        let layout = ColumnLayout::resolve(
            &tme,
            None,
            &mapping(),
            Some(Ok(&names[..])),
            Some(&labels),
            None,
        )
        .expect("resolves");
        let kind = &layout.columns[layout.event_type.expect("mapped")];
        let text = text_form(
            ColumnValue::Value(Value::Int(2)),
            kind,
            outbox_relay_core::config::BinaryFormat::Raw,
        )
        .expect("text");
        assert_eq!(text.as_deref(), Some(&b"Paid"[..]), "index 2 is its label");
    }

    #[test]
    fn a_mapped_enum_without_known_labels_stops_rather_than_relay_the_index() {
        let tme = minimal_table_map();
        let names = ["id".to_owned(), "KIND".to_owned()];
        let why = ColumnLayout::resolve(&tme, None, &mapping(), Some(Ok(&names[..])), None, None)
            .expect_err("no labels");
        assert!(
            why.contains("\"KIND\"") && why.contains("binlog_row_metadata=FULL"),
            "{why}"
        );
        // Labels are found whatever the case of the column's name.
        let labels = Labels::from([("kind".to_owned(), vec!["A".to_owned()])]);
        ColumnLayout::resolve(
            &tme,
            None,
            &mapping(),
            Some(Ok(&names[..])),
            Some(&labels),
            None,
        )
        .expect("resolves");
    }
}

#[cfg(test)]
mod damaged_table_map_tests {
    //! Table maps that mysql_common parses but whose columns its value parser (or the layout)
    //! cannot take: found while writing the rows_event fuzz target; each panicked before.
    use super::*;
    use mysql_async::binlog::events::{Event, FormatDescriptionEvent};
    use mysql_async::binlog::BinlogVersion;

    /// A binlog event of `type_code` with `body`, ending at `end` (also `pattern_tests`'s).
    pub(super) fn event(type_code: u8, body: &[u8], end: u64) -> SourceEvent {
        let size = u32::try_from(19 + body.len()).expect("small event");
        let mut bytes = vec![0, 0, 0, 0, type_code, 1, 0, 0, 0];
        bytes.extend_from_slice(&size.to_le_bytes());
        bytes.extend_from_slice(&(end as u32).to_le_bytes());
        bytes.extend_from_slice(&[0, 0]);
        bytes.extend_from_slice(body);
        let fde = FormatDescriptionEvent::new(BinlogVersion::Version4);
        SourceEvent {
            event: Event::read(&fde, &bytes[..]).expect("event"),
            position: BinlogPosition::new("mysql-bin.000001", end),
            timestamp: 0,
            in_payload: false,
        }
    }

    /// Decodes a TABLE_MAP event of shop.outbox (column `types`, metadata block `meta`,
    /// COLUMN_NAME `names`) and a WRITE_ROWS event of all its columns with `rows`; returns the
    /// rows event's result as text.
    fn decode_rows(types: &[u8], meta: &[u8], names: &[&str], rows: &[u8]) -> String {
        decode_rows_with(types, meta, names, &[], rows)
    }

    /// As [`decode_rows`], with `optional` appended to the table map's optional metadata.
    fn decode_rows_with(
        types: &[u8],
        meta: &[u8],
        names: &[&str],
        optional: &[u8],
        rows: &[u8],
    ) -> String {
        let mut tm = vec![1, 0, 0, 0, 0, 0, 1, 0];
        for name in ["shop", "outbox"] {
            tm.push(name.len() as u8);
            tm.extend_from_slice(name.as_bytes());
            tm.push(0);
        }
        tm.push(types.len() as u8);
        tm.extend_from_slice(types);
        tm.push(meta.len() as u8);
        tm.extend_from_slice(meta);
        tm.extend(std::iter::repeat_n(0xff, types.len().div_ceil(8)));
        let column_names: Vec<u8> = names
            .iter()
            .flat_map(|n| [&[n.len() as u8][..], n.as_bytes()].concat())
            .collect();
        tm.extend_from_slice(&[4, column_names.len() as u8]);
        tm.extend_from_slice(&column_names);
        tm.extend_from_slice(optional);
        let mut wr = vec![1, 0, 0, 0, 0, 0, 1, 0, 2, 0, types.len() as u8];
        wr.extend(std::iter::repeat_n(0xff, types.len().div_ceil(8)));
        wr.extend_from_slice(rows);

        let outbox = "tables = [\"shop.outbox\"]\n[outbox.columns]\nid = \"c\"\n\
                      aggregate_type = \"c\"\naggregate_id = \"c\"\nevent_type = \"c\"\n\
                      event_key = \"c\"\npayload = \"c\"\ncreated_at = \"\"\n";
        let mut decoder = Decoder::new(
            super::fixture_tests::mappings(outbox),
            TableName::parse("none.none", None).expect("table"),
            None,
        );
        let tm = event(19, &tm, 100);
        let Ok(Some(EventData::TableMapEvent(tme))) = tm.event.read_data() else {
            panic!("table map");
        };
        let tme = tme.into_owned();
        let table_map = |id: u64| (id == tme.table_id()).then_some(&tme);
        decoder.decode(&tm, table_map).expect("table map decodes");
        match decoder.decode(&event(30, &wr, 200), table_map) {
            Ok(d) => format!("{d:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn column_metadata_mysql_common_cannot_read_is_a_row_error() {
        for (types, meta, names, expected) in [
            // NEWDECIMAL(1,5): mysql_common computes precision - scale.
            (
                &[246][..],
                &[1, 5][..],
                &["c"][..],
                "DECIMAL scale 5 above its precision 1",
            ),
            // VAR_STRING has no metadata in a table map, yet its values are read with two bytes.
            (
                &[253],
                &[],
                &["c"],
                "0 bytes of metadata for its type MYSQL_TYPE_VAR_STRING, which needs 2",
            ),
            // TIMESTAMP2 without its fractional-seconds byte.
            (
                &[17],
                &[],
                &["c"],
                "0 bytes of metadata for its type MYSQL_TYPE_TIMESTAMP2, which needs 1",
            ),
            // Fewer names than columns (an index panic), or more (a misleading error).
            (
                &[3, 3],
                &[],
                &["c"],
                "the table map has 2 columns but names 1 (c)",
            ),
            (
                &[3],
                &[],
                &["x", "c"],
                "the table map has 1 columns but names 2 (x, c)",
            ),
        ] {
            let result = decode_rows(types, meta, names, &[0, 1, 2, 3, 4, 5, 6, 7, 8]);
            assert!(
                result.contains("cannot relay the row at mysql-bin.000001:200 in shop.outbox")
                    && result.contains(expected),
                "{expected}: {result}"
            );
        }
        // Found by fuzzing (rows_event): a DATETIME(0) value stored as 5 zero bytes made
        // mysql_common negate i64::MIN (an overflow panic).
        let result = decode_rows(&[18], &[0], &["c"], &[0, 0, 0, 0, 0, 0]);
        assert!(
            result.contains(
                "column \"c\": the DATETIME value is below zero (stored as [00, 00, 00, 00, 00])"
            ),
            "{result}"
        );
        // An ENUM column whose ENUM_STR_VALUE list counts 2^62 labels in 3 bytes: mysql_common
        // reserved memory for all of them (a capacity overflow panic, or an abort).
        let meta = [0xf7, 1]; // STRING column, real type ENUM, 1-byte values
        let labels = [6, 12, 0xfe, 0, 0, 0, 0, 0, 0, 0, 0x40, 1, b'a', 0];
        let result = decode_rows_with(&[254], &meta, &["c"], &labels, &[0, 1]);
        assert!(
            result.contains("the table map carries no ENUM/SET labels"),
            "{result}"
        );
        // Found by fuzzing (rows_event): a DECIMAL(5,4) whose last digit group (2 bytes, 4
        // digits) holds 32767: mysql_common scales it by 10^5 in an i32 (an overflow panic).
        let result = decode_rows(&[246], &[5, 4], &["c"], &[0, 0x80, 0x7f, 0xff]);
        assert!(
            result.contains("column \"c\": DECIMAL digit group 32767 has more than 4 digits"),
            "{result}"
        );
        // Found by fuzzing (rows_event): a negative TIME(1)/TIME(2) with a fraction made
        // mysql_common borrow from an unsigned byte (an overflow panic; a wrong value in release
        // builds). -00:00:00.50 is stored as ff ff ff ce.
        let result = decode_rows(&[19], &[2], &["c"], &[0, 0x7f, 0xff, 0xff, 0xce]);
        assert!(
            result.contains("aggregate_type: \"-000:00:00.500000\""),
            "{result}"
        );
        // Found by fuzzing (rows_event): a label length of 2^64 - 1 overflowed the label check.
        let labels = [
            6, 11, 1, 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0,
        ];
        let result = decode_rows_with(&[254], &[0xf7, 1], &["c"], &labels, &[0, 1]);
        assert!(
            result.contains("the table map carries no ENUM/SET labels"),
            "{result}"
        );
        // The same layouts with sound metadata decode.
        let ok = decode_rows(&[246], &[5, 1], &["c"], &[0, 0x80, 0x0c, 5]);
        assert!(ok.contains("aggregate_type: \"12.5\""), "{ok}");
    }
}

#[cfg(test)]
mod pattern_tests {
    //! Table patterns (`outbox.tables = ["tenant_*.outbox"]`): a table map of a table not
    //! named exactly is matched once; only matching tables are kept.
    use super::damaged_table_map_tests::event;
    use super::*;

    /// A table map (table id `id`, one BIGINT column `c`, with its name: FULL metadata) of
    /// `db.table`, and a WRITE_ROWS event of one row (`value`) on it.
    fn table_map_and_row(id: u8, db: &str, table: &str, value: u8) -> (SourceEvent, SourceEvent) {
        let mut tm = vec![id, 0, 0, 0, 0, 0, 1, 0];
        for name in [db, table] {
            tm.push(name.len() as u8);
            tm.extend_from_slice(name.as_bytes());
            tm.push(0);
        }
        tm.extend_from_slice(&[1, 8, 0, 0xff]); // one LONGLONG, no metadata, nullable
        tm.extend_from_slice(&[4, 2, 1, b'c']); // COLUMN_NAME: "c"
        let mut wr = vec![id, 0, 0, 0, 0, 0, 1, 0, 2, 0, 1, 0xff, 0];
        wr.extend_from_slice(&[value, 0, 0, 0, 0, 0, 0, 0]);
        (event(19, &tm, 100), event(30, &wr, 200))
    }

    fn decoder() -> Decoder {
        let outbox = "tables = [\"tenant_*.outbox\"]\n[outbox.columns]\nid = \"c\"\n\
                      aggregate_type = \"c\"\naggregate_id = \"c\"\nevent_type = \"c\"\n\
                      event_key = \"c\"\npayload = \"c\"\ncreated_at = \"\"\n";
        Decoder::new(
            super::fixture_tests::mappings(outbox),
            TableName::parse("none.outbox_relay_checkpoint", None).expect("table"),
            None,
        )
    }

    /// The rows `decoder` decodes from one row written to `db.table`: (table, aggregate id).
    fn rows(decoder: &mut Decoder, id: u8, db: &str, table: &str) -> Vec<(String, String)> {
        let (tm, wr) = table_map_and_row(id, db, table, id);
        let Ok(Some(EventData::TableMapEvent(tme))) = tm.event.read_data() else {
            panic!("table map");
        };
        let tme = tme.into_owned();
        let table_map = |i: u64| (i == tme.table_id()).then_some(&tme);
        decoder.decode(&tm, table_map).expect("table map decodes");
        let (rows, _) = decoder
            .decode(&wr, table_map)
            .expect("rows decode")
            .into_parts();
        rows.into_iter()
            .map(|r| {
                let e = r.expect("a row");
                (
                    e.table.to_string(),
                    String::from_utf8(e.aggregate_id).expect("text"),
                )
            })
            .collect()
    }

    #[test]
    fn a_matching_table_is_relayed_from_its_first_table_map_and_others_are_not_kept() {
        let mut d = decoder();
        assert_eq!(
            rows(&mut d, 1, "tenant_1", "outbox"),
            vec![("tenant_1.outbox".to_owned(), "1".to_owned())]
        );
        assert_eq!(rows(&mut d, 2, "tenant_1", "orders"), vec![]);
        assert_eq!(rows(&mut d, 3, "shop", "outbox"), vec![]);
        assert_eq!(
            rows(&mut d, 4, "tenantX1", "outbox"),
            vec![],
            "_ is literal"
        );
        assert_eq!(
            rows(&mut d, 5, "tenant_2", "outbox"),
            vec![("tenant_2.outbox".to_owned(), "5".to_owned())]
        );
        // Thousands of other tables keep nothing but the bounded table-map cache.
        for i in 0..3000u32 {
            let (tm, _) = table_map_and_row(9, &format!("db{i}"), "t", 0);
            let Ok(Some(EventData::TableMapEvent(tme))) = tm.event.read_data() else {
                panic!("table map");
            };
            let tme = tme.into_owned();
            // Each its own table id, as the server gives them.
            let id = 100 + u64::from(i);
            d.table_map_info(id, &tme);
        }
        assert_eq!(d.outbox_tables.len(), 2, "only the matching tables");
        assert_eq!(
            d.layouts.snapshot(),
            None,
            "with names in the table maps, no tenant's layout is kept for the checkpoint"
        );
        assert!(d.table_maps.len() <= TABLE_MAP_CACHE_LIMIT);
        assert_eq!(
            d.layouts.get(&TableName::parse("db7.t", None).expect("t")),
            None
        );
    }

    #[test]
    fn an_insert_logged_as_a_statement_on_a_matching_table_is_a_failure() {
        let d = decoder();
        let ev = table_map_and_row(1, "x", "y", 0).0;
        assert!(d
            .statement_on_outbox("INSERT INTO outbox VALUES (1)", "tenant_9", &ev)
            .is_some());
        assert!(d
            .statement_on_outbox("INSERT INTO tenant_9.outbox VALUES (1)", "x", &ev)
            .is_some());
        assert!(d
            .statement_on_outbox("INSERT INTO outbox VALUES (1)", "shop", &ev)
            .is_none());
    }
}
