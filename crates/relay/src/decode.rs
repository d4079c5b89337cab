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

use std::collections::HashSet;
use std::sync::Arc;

use mysql_async::binlog::events::{EventData, RowsEventData, TableMapEvent};
use mysql_async::binlog::row::BinlogRow;
use mysql_async::binlog::value::BinlogValue;
use mysql_async::Value;

use crate::config::{ColumnMapping, TableName, UnknownXaCommit};
use crate::error::RelayError;
use crate::gtid::{gtid_from_event, Gtid, MysqlGtidSet};
use crate::position::{BinlogPosition, MariadbGtid, MariadbGtidPos};

/// The GTID state the decoder keeps up to date: MariaDB's position per domain, or MySQL's
/// executed GTID set. Its text form is what the checkpoint stores as `gtid_set`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GtidState {
    /// MariaDB `domain-server-seq` per domain.
    MariaDb(MariadbGtidPos),
    /// MySQL `uuid[:tag]:intervals`.
    MySql(MysqlGtidSet),
}

impl std::fmt::Display for GtidState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::MariaDb(p) => p.fmt(f),
            Self::MySql(s) => s.fmt(f),
        }
    }
}

/// A transaction's GTID, applied to the [`GtidState`] at its commit (never before: a GTID
/// counted before its commit would let a resume skip the transaction).
#[derive(Debug, Clone)]
enum PendingGtid {
    MariaDb(MariadbGtid),
    MySql(Gtid),
}
use crate::source::SourceEvent;

pub mod xa;

use xa::{Outcome, XaStatement, XaTracker, Xid};

/// One decoded outbox row: the event, or what could be read of a row that cannot become one.
pub type DecodedRow = Result<OutboxEvent, Box<RowFailure>>;

/// One committed INSERT on an outbox table, owned and typed.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxEvent {
    /// The outbox table the row was written to.
    pub table: Arc<TableName>,
    /// Text form of the `id` column (header `id`).
    pub id: Option<Vec<u8>>,
    /// Text form of the aggregate type (topic template, header `aggregate_type`).
    pub aggregate_type: String,
    /// Text form of the aggregate id (the Kafka key).
    pub aggregate_id: Vec<u8>,
    /// Header `event_type`.
    pub event_type: Option<Vec<u8>>,
    /// Header `event_key` (consumers' idempotency key).
    pub event_key: Option<Vec<u8>>,
    /// The payload bytes as stored; `None` for SQL NULL.
    pub payload: Option<Vec<u8>>,
    /// Record timestamp in ms since the Unix epoch: `created_at` read as UTC, else the binlog
    /// event time.
    pub timestamp_ms: i64,
    /// End of the rows event that carried the row (for error messages and tracing).
    pub position: BinlogPosition,
}

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
const MARIADB_FIRST_COMPRESSED_EVENT: u8 = 165; // QUERY_COMPRESSED .. DELETE_ROWS_COMPRESSED_V1 = 171
const MARIADB_LAST_COMPRESSED_EVENT: u8 = 171;
const XA_PREPARE_LOG_EVENT: u8 = 38;
// MariaDB GTID event flags2 (log_event.h). FL_COMPLETED_XA (128) marks the group of an
// XA COMMIT/ROLLBACK query, which is recognised by its text (as on MySQL).
const FL_STANDALONE: u8 = 1;
const FL_PREPARED_XA: u8 = 64;

/// Per-stream decoding state: where in a transaction we are and what it touched.
#[derive(Debug)]
pub struct Decoder {
    outbox_tables: HashSet<Arc<TableName>>,
    checkpoint_table: TableName,
    columns: ColumnMapping,
    gtid: Option<GtidState>,
    tx: TxState,
    xa: XaTracker,
    unknown_xa_commit: UnknownXaCommit,
}

#[derive(Debug, Default)]
struct TxState {
    /// Inside BEGIN … COMMIT (or a MariaDB GTID group).
    open: bool,
    /// MariaDB standalone group: ends after its single statement.
    standalone: bool,
    /// The transaction's GTID, applied at commit.
    gtid: Option<PendingGtid>,
    /// Touched something besides the checkpoint table.
    advances: bool,
}

impl Decoder {
    /// A decoder for `outbox_tables`, ignoring writes to `checkpoint_table` (and to tables of
    /// the same name in other databases: other connectors' state tables).
    /// `gtid` is the GTID state to continue from, if known; without one no GTIDs are tracked
    /// (MySQL) or MariaDB's are tracked from the first one seen.
    pub fn new(
        outbox_tables: impl IntoIterator<Item = TableName>,
        checkpoint_table: TableName,
        columns: ColumnMapping,
        gtid: Option<GtidState>,
    ) -> Self {
        Self {
            outbox_tables: outbox_tables.into_iter().map(Arc::new).collect(),
            checkpoint_table,
            columns,
            gtid,
            tx: TxState::default(),
            xa: XaTracker::default(),
            unknown_xa_commit: UnknownXaCommit::Stop,
        }
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
                let (gtid, flags) = parse_mariadb_gtid(ev)?;
                if flags & FL_PREPARED_XA != 0 {
                    self.xa.start_group()
                } else {
                    self.xa.end_group_without_prepare()
                }
                .map_err(|e| xa_error(ev, &e))?;
                self.tx = TxState {
                    open: true,
                    standalone: flags & FL_STANDALONE != 0,
                    gtid: Some(PendingGtid::MariaDb(gtid)),
                    advances: false,
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
            MARIADB_FIRST_COMPRESSED_EVENT..=MARIADB_LAST_COMPRESSED_EVENT => {
                return Err(RelayError::Binlog(format!(
                    "compressed MariaDB binlog event (type {raw_type}) at {}: binlog compression is \
                     not supported yet. Fix: SET GLOBAL log_bin_compress=OFF on the server",
                    ev.position
                )));
            }
            _ => {}
        }
        let data = ev.event.read_data().map_err(|e| {
            RelayError::Binlog(format!(
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
                if stmt.eq_ignore_ascii_case("BEGIN") {
                    // MySQL sends its GTID event just before BEGIN: keep it.
                    self.xa
                        .end_group_without_prepare()
                        .map_err(|e| xa_error(ev, &e))?;
                    self.tx = TxState {
                        open: true,
                        gtid: self.tx.gtid.take(),
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
                self.tx = TxState {
                    gtid: gtid_from_event(&g).ok().map(PendingGtid::MySql),
                    ..TxState::default()
                };
                Ok(Decoded::Rows(Vec::new()))
            }
            Some(EventData::XidEvent(_)) => Ok(self.end_tx(ev, Vec::new())),
            Some(EventData::RowsEvent(rows)) => self.decode_rows(ev, &rows, table_map),
            _ => Ok(Decoded::Rows(Vec::new())),
        }
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
            apply_gtid(&mut after, gtid);
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
        RelayError::Binlog(format!(
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
    fn end_tx(&mut self, ev: &SourceEvent, rows: Vec<DecodedRow>) -> Decoded {
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
            apply_gtid(&mut self.gtid, gtid);
        }
        TxBoundary {
            position: ev.position.clone(),
            gtid_set: self.gtid.as_ref().map(ToString::to_string),
            advances: tx.advances,
        }
    }

    fn decode_rows<'t>(
        &mut self,
        ev: &SourceEvent,
        rows: &RowsEventData<'_>,
        table_map: impl Fn(u64) -> Option<&'t TableMapEvent<'static>>,
    ) -> Result<Decoded, RelayError> {
        let tme = table_map(rows.table_id()).ok_or_else(|| {
            RelayError::Binlog(format!(
                "rows event at {} refers to table id {} without a preceding table map event",
                ev.position,
                rows.table_id()
            ))
        })?;
        let name = TableName {
            database: tme.database_name().into_owned(),
            table: tme.table_name().into_owned(),
        };
        // Our own checkpoint writes, and those of other connectors keeping a state table of the
        // same name in another database, are not progress: counting them would make idle
        // relays on one server write in answer to each other forever.
        if name.table == self.checkpoint_table.table {
            return Ok(Decoded::Rows(Vec::new()));
        }
        self.tx.advances = true;
        let Some(table) = self.outbox_tables.get(&name).cloned() else {
            return Ok(Decoded::Rows(Vec::new()));
        };
        if !matches!(
            rows,
            RowsEventData::WriteRowsEvent(_) | RowsEventData::WriteRowsEventV1(_)
        ) {
            return Ok(Decoded::Rows(Vec::new())); // UPDATE/DELETE on the outbox: ignored by design
        }
        let row_error = |reason: String| RelayError::Row {
            position: ev.position.clone(),
            table: name.to_string(),
            reason,
        };
        let mut out = Vec::new();
        let mut layout: Option<ColumnLayout> = None;
        for row in rows.rows(tme) {
            let (_, after) =
                row.map_err(|e| row_error(format!("the rows event cannot be decoded: {e}")))?;
            let mut row =
                after.ok_or_else(|| row_error("WRITE_ROWS without an after image".into()))?;
            let layout = match &layout {
                Some(l) => l,
                None => {
                    layout.insert(ColumnLayout::resolve(&row, &self.columns).map_err(row_error)?)
                }
            };
            out.push(layout.extract(&mut row, &table, ev, &row_error));
        }
        // Rows of an XA transaction wait for its outcome.
        Ok(Decoded::Rows(self.xa.keep(out).unwrap_or_default()))
    }
}

/// Counts a committed group's GTID in `state` (MariaDB's position starts with the first GTID
/// seen when none was known; MySQL's set is tracked only from a known set).
fn apply_gtid(state: &mut Option<GtidState>, gtid: PendingGtid) {
    match (gtid, state) {
        (PendingGtid::MySql(gtid), Some(GtidState::MySql(set))) => {
            set.add(&gtid);
        }
        (PendingGtid::MariaDb(gtid), Some(GtidState::MariaDb(pos))) => pos.apply(gtid),
        (PendingGtid::MariaDb(gtid), state @ None) => {
            let mut pos = MariadbGtidPos::default();
            pos.apply(gtid);
            *state = Some(GtidState::MariaDb(pos));
        }
        _ => {}
    }
}

/// An XA event that cannot be followed, at `ev`.
fn xa_error(ev: &SourceEvent, reason: &str) -> RelayError {
    RelayError::Binlog(format!("XA transaction at {}: {reason}", ev.position))
}

/// Parses a MariaDB GTID event body: seq_no u64, domain_id u32, flags2 u8 (all little-endian).
fn parse_mariadb_gtid(ev: &SourceEvent) -> Result<(MariadbGtid, u8), RelayError> {
    let data = ev.event.data();
    let bad = || {
        RelayError::Binlog(format!(
            "MariaDB GTID event ending at {} is truncated ({} bytes)",
            ev.position,
            data.len()
        ))
    };
    let seq = data.get(0..8).ok_or_else(bad)?;
    let domain = data.get(8..12).ok_or_else(bad)?;
    let flags = *data.get(12).ok_or_else(bad)?;
    let mut seq_bytes = [0u8; 8];
    seq_bytes.copy_from_slice(seq);
    let mut domain_bytes = [0u8; 4];
    domain_bytes.copy_from_slice(domain);
    Ok((
        MariadbGtid {
            domain_id: u32::from_le_bytes(domain_bytes),
            server_id: ev.event.header().server_id(),
            sequence: u64::from_le_bytes(seq_bytes),
        },
        flags,
    ))
}

/// Indices of the mapped columns in a table's rows.
#[derive(Debug)]
struct ColumnLayout {
    id: usize,
    aggregate_type: usize,
    aggregate_id: usize,
    event_type: usize,
    event_key: usize,
    payload: usize,
    created_at: Option<usize>,
    /// Columns mapped to more than one field (e.g. `event_key = "id"`): read by copy, not moved.
    shared: Vec<usize>,
}

impl ColumnLayout {
    fn resolve(row: &BinlogRow, m: &ColumnMapping) -> Result<Self, String> {
        let columns = row.columns_ref();
        if columns.iter().all(|c| c.name_ref().is_empty()) {
            return Err(
                "the table map event carries no column names. Fix: SET GLOBAL \
                 binlog_row_metadata=FULL on the server (MySQL 8.0.1+, MariaDB 10.5+)"
                    .into(),
            );
        }
        let find = |key: &str, name: &str| {
            columns
                .iter()
                .position(|c| c.name_ref() == name.as_bytes())
                .ok_or_else(|| {
                    format!(
                        "the outbox has no column {name:?} (outbox.columns.{key}); its columns are {}",
                        columns
                            .iter()
                            .map(|c| c.name_str().into_owned())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })
        };
        let mut layout = Self {
            id: find("id", &m.id)?,
            aggregate_type: find("aggregate_type", &m.aggregate_type)?,
            aggregate_id: find("aggregate_id", &m.aggregate_id)?,
            event_type: find("event_type", &m.event_type)?,
            event_key: find("event_key", &m.event_key)?,
            payload: find("payload", &m.payload)?,
            created_at: if m.created_at.is_empty() {
                None
            } else {
                Some(find("created_at", &m.created_at)?)
            },
            shared: Vec::new(),
        };
        let all = [
            Some(layout.id),
            Some(layout.aggregate_type),
            Some(layout.aggregate_id),
            Some(layout.event_type),
            Some(layout.event_key),
            Some(layout.payload),
            layout.created_at,
        ];
        for idx in all.iter().flatten() {
            if all.iter().flatten().filter(|i| *i == idx).count() > 1
                && !layout.shared.contains(idx)
            {
                layout.shared.push(*idx);
            }
        }
        Ok(layout)
    }

    fn extract(
        &self,
        row: &mut BinlogRow,
        table: &Arc<TableName>,
        ev: &SourceEvent,
        row_error: &dyn Fn(String) -> RelayError,
    ) -> Result<OutboxEvent, Box<RowFailure>> {
        let fail = |reason: String| RowFailure::bare(row_error(reason));
        let timestamp_ms = match self.created_at {
            Some(idx) => match row.as_ref(idx) {
                Some(BinlogValue::Value(v)) => timestamp_ms(v).map_err(fail)?,
                _ => None,
            },
            None => None,
        }
        .unwrap_or(i64::from(ev.timestamp) * 1000);
        let mut take = |idx: usize| -> Result<Option<Vec<u8>>, Box<RowFailure>> {
            let name = row
                .columns_ref()
                .get(idx)
                .map(|c| c.name_str().into_owned())
                .unwrap_or_default();
            let value = if self.shared.contains(&idx) {
                row.as_ref(idx).map(|v| v.clone().into_owned())
            } else {
                row.take(idx)
            };
            match value {
                None => Err(fail(format!(
                    "column {name:?} is missing from the row image. Fix: SET GLOBAL \
                     binlog_row_image=FULL and make sure writers use binlog_format=ROW"
                ))),
                Some(v) => value_bytes(v).map_err(|e| fail(format!("column {name:?}: {e}"))),
            }
        };
        let id = take(self.id)?;
        let aggregate_type = take(self.aggregate_type)?;
        let aggregate_id = take(self.aggregate_id)?;
        let event_type = take(self.event_type)?;
        let event_key = take(self.event_key)?;
        let payload = take(self.payload)?;
        let problem = match (&aggregate_type, &aggregate_id) {
            (None, _) => Some("aggregate_type is NULL: cannot route the row to a topic"),
            (Some(t), _) if std::str::from_utf8(t).is_err() => {
                Some("aggregate_type is not valid UTF-8 text")
            }
            (_, None) => Some("aggregate_id is NULL: the row has no partition key"),
            _ => None,
        };
        match (problem, aggregate_type, aggregate_id) {
            (None, Some(aggregate_type), Some(aggregate_id)) => Ok(OutboxEvent {
                table: Arc::clone(table),
                id,
                aggregate_type: String::from_utf8(aggregate_type).unwrap_or_default(),
                aggregate_id,
                event_type,
                event_key,
                payload,
                timestamp_ms,
                position: ev.position.clone(),
            }),
            (problem, aggregate_type, aggregate_id) => {
                // Keep what was readable, so the dead letter can still be traced and replayed.
                let headers = [
                    ("id", id),
                    ("event_key", event_key),
                    ("event_type", event_type),
                    ("aggregate_type", aggregate_type),
                ]
                .into_iter()
                .filter_map(|(name, v)| Some((name.to_owned(), v?)))
                .collect();
                Err(Box::new(RowFailure {
                    error: row_error(problem.unwrap_or("incomplete row").to_owned()),
                    key: aggregate_id,
                    value: payload,
                    headers,
                }))
            }
        }
    }
}

/// The text form (or raw bytes) of a column value; `None` for NULL.
fn value_bytes(v: BinlogValue<'_>) -> Result<Option<Vec<u8>>, String> {
    Ok(match v {
        BinlogValue::Value(Value::NULL) => None,
        BinlogValue::Value(Value::Bytes(b)) => Some(b),
        BinlogValue::Value(Value::Int(i)) => Some(i.to_string().into_bytes()),
        BinlogValue::Value(Value::UInt(u)) => Some(u.to_string().into_bytes()),
        BinlogValue::Value(Value::Float(f)) => Some(f.to_string().into_bytes()),
        BinlogValue::Value(Value::Double(f)) => Some(f.to_string().into_bytes()),
        BinlogValue::Value(v @ (Value::Date(..) | Value::Time(..))) => {
            Some(v.as_sql(true).trim_matches('\'').as_bytes().to_vec())
        }
        // MySQL's binary JSON, rendered exactly as MySQL prints it (MariaDB stores JSON as
        // LONGTEXT and arrives as bytes above).
        BinlogValue::Jsonb(j) => {
            Some(crate::json::render_mysql_json_to_vec(&j).map_err(|e| e.to_string())?)
        }
        BinlogValue::JsonDiff(_) => {
            return Err(
                "partial JSON update (binlog_row_value_options=PARTIAL_JSON) in an INSERT".into(),
            )
        }
    })
}

/// Epoch ms of a DATETIME (read as UTC) or TIMESTAMP value; `None` for NULL or a zero date.
fn timestamp_ms(v: &Value) -> Result<Option<i64>, String> {
    match v {
        Value::NULL => Ok(None),
        Value::Date(0, 0, 0, ..) => Ok(None),
        Value::Date(y, mo, d, h, mi, s, us) => {
            let date =
                chrono::NaiveDate::from_ymd_opt(i32::from(*y), u32::from(*mo), u32::from(*d))
                    .and_then(|date| {
                        date.and_hms_micro_opt(u32::from(*h), u32::from(*mi), u32::from(*s), *us)
                    })
                    .ok_or_else(|| format!("created_at {v:?} is not a valid date-time"))?;
            Ok(Some(date.and_utc().timestamp_millis()))
        }
        // TIMESTAMP(0): seconds since the epoch.
        Value::Int(secs) => Ok(Some(secs.saturating_mul(1000))),
        // TIMESTAMP(n), n > 0: "seconds.micros" text, as mysql_common decodes TIMESTAMP2.
        Value::Bytes(b) => {
            let text = std::str::from_utf8(b).map_err(|_| "created_at is not a timestamp")?;
            let (secs, frac) = text.split_once('.').unwrap_or((text, "0"));
            let secs: i64 = secs
                .parse()
                .map_err(|_| format!("created_at {text:?} is not a timestamp"))?;
            let micros: i64 = format!("{frac:0<6}")
                .get(..6)
                .and_then(|f| f.parse().ok())
                .ok_or_else(|| format!("created_at {text:?} is not a timestamp"))?;
            Ok(Some(secs * 1000 + micros / 1000))
        }
        other => Err(format!(
            "created_at has an unsupported type ({other:?}); map a DATETIME or TIMESTAMP column, \
             or set outbox.columns.created_at = \"\" to use the binlog event time"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datetime_is_read_as_utc_epoch_ms() {
        let v = Value::Date(2026, 1, 2, 3, 4, 5, 678_901);
        assert_eq!(timestamp_ms(&v), Ok(Some(1_767_323_045_678)));
        assert_eq!(timestamp_ms(&Value::Date(0, 0, 0, 0, 0, 0, 0)), Ok(None));
        assert!(timestamp_ms(&Value::Date(2026, 2, 30, 0, 0, 0, 0)).is_err());
    }

    #[test]
    fn timestamp_columns_become_epoch_ms() {
        assert_eq!(
            timestamp_ms(&Value::Int(1_767_323_045)),
            Ok(Some(1_767_323_045_000))
        );
        assert_eq!(
            timestamp_ms(&Value::Bytes(b"1767323045.678901".to_vec())),
            Ok(Some(1_767_323_045_678))
        );
        assert_eq!(
            timestamp_ms(&Value::Bytes(b"1767323045.5".to_vec())),
            Ok(Some(1_767_323_045_500))
        );
    }

    #[test]
    fn values_have_their_text_form() {
        let t = |v| value_bytes(BinlogValue::Value(v)).expect("converts");
        assert_eq!(t(Value::Int(-42)), Some(b"-42".to_vec()));
        assert_eq!(
            t(Value::UInt(u64::MAX)),
            Some(b"18446744073709551615".to_vec())
        );
        assert_eq!(t(Value::Bytes(b"ord-1".to_vec())), Some(b"ord-1".to_vec()));
        assert_eq!(t(Value::NULL), None);
    }
}

#[cfg(test)]
mod fixture_tests {
    use super::*;
    use crate::source::BinlogFileSource;
    use std::path::PathBuf;

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../../shared/fixtures/binlogs")
            .join(name)
    }

    /// Decodes a whole fixture file; returns the rows and the boundaries.
    fn decode_file(
        name: &str,
        tables: &[&str],
        columns: ColumnMapping,
        gtid: Option<GtidState>,
    ) -> (Vec<Result<OutboxEvent, Box<RowFailure>>>, Vec<TxBoundary>) {
        let mut source = BinlogFileSource::open(&fixture(name)).expect("fixture opens");
        let mut decoder = Decoder::new(
            tables
                .iter()
                .map(|t| TableName::parse(t, None).expect("table")),
            TableName::parse("none.none", None).expect("table"),
            columns,
            gtid,
        );
        let (mut rows, mut boundaries) = (Vec::new(), Vec::new());
        while let Some(ev) = source.next_event() {
            let ev = ev.expect("event decodes");
            let (r, b) = decoder
                .decode(&ev, |id| source.table_map(id))
                .expect("decodes")
                .into_parts();
            rows.extend(r);
            boundaries.extend(b);
        }
        (rows, boundaries)
    }

    #[test]
    fn mariadb_fixture_rows_and_boundaries() {
        // Expected values from `mariadb-binlog -vv` of the file, not from this decoder.
        let columns = ColumnMapping {
            id: "id".into(),
            aggregate_type: "topic".into(),
            aggregate_id: "id".into(),
            event_type: "event_type".into(),
            event_key: "id".into(),
            payload: "event".into(),
            created_at: "created".into(),
        };
        let (rows, boundaries) =
            decode_file("mariadb-bin.000001", &["toddy_test.outbox"], columns, None);
        let rows: Vec<OutboxEvent> = rows.into_iter().map(|r| r.expect("row")).collect();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].id.as_deref(), Some(&b"62"[..]));
        assert_eq!(rows[1].id.as_deref(), Some(&b"63"[..]));
        for (row, created) in rows.iter().zip([1_650_493_084_000_i64, 1_650_493_195_000]) {
            assert_eq!(row.aggregate_type, "foo");
            assert_eq!(row.payload.as_deref(), Some(&br#"{"foo":1}"#[..]));
            assert_eq!(row.event_type.as_deref(), Some(&b"2"[..]), "ENUM index");
            assert_eq!(row.timestamp_ms, created, "TIMESTAMP(0) column");
        }
        let ends: Vec<u64> = boundaries.iter().map(|b| b.position.pos).collect();
        assert_eq!(ends, [702, 1074], "ends of the two Xid events");
        let gtids: Vec<_> = boundaries.iter().map(|b| b.gtid_set.clone()).collect();
        assert_eq!(gtids, [Some("0-1-1".to_owned()), Some("0-1-2".to_owned())]);
    }

    #[test]
    fn mysql_gtids_are_counted_at_commit() {
        let (_, boundaries) = decode_file(
            "binlog_transaction_with_GTID.000001",
            &[],
            ColumnMapping::default(),
            Some(GtidState::MySql(MysqlGtidSet::new())),
        );
        let sets: Vec<String> = boundaries
            .iter()
            .map(|b| b.gtid_set.clone().unwrap_or_default())
            .collect();
        let uuid = "006c2cf2-b1ea-11e4-9057-8c705a3d3e78";
        assert_eq!(
            sets,
            [
                format!("{uuid}:1"),
                format!("{uuid}:1-2"),
                format!("{uuid}:1-3")
            ]
        );
    }

    #[test]
    fn mysql_tagged_gtid_extends_the_set() {
        let uuid = "55778904-0299-11f1-b1b8-4ef0c4956feb";
        let start: MysqlGtidSet = format!("{uuid}:1-13:mytag:1-2").parse().expect("set");
        let (_, boundaries) = decode_file(
            "binlog_transaction_with_GTID_TAG.000001",
            &[],
            ColumnMapping::default(),
            Some(GtidState::MySql(start)),
        );
        let last = boundaries.last().and_then(|b| b.gtid_set.clone());
        assert_eq!(last, Some(format!("{uuid}:1-13:mytag:1-3")));
    }
}
