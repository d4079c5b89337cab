//! `outbox-relay trace <event_key>`: one event from its outbox row to its consumers, in one
//! answer (the on-call question "order 1001 was paid, why didn't fulfilment run?").
//!
//! 1. **The outbox row**: each outbox table (or `--table`) is queried by its event_key column;
//!    the row becomes the record `run` would send (the same mapping and router as `republish`),
//!    which gives its topic, key and (explicit) partition. No row: it was pruned or never
//!    written.
//! 2. **The binlog transaction** that inserted it: whole binlog files are skipped by their
//!    creation time (as `reset --to TIME` does), then a binlog dump from the last file created
//!    before `created_at` (minus [`LOOK_BACK_SECS`]) decodes the outbox rows with the relay's
//!    decoder until the row's transaction ends (its start and end position, GTID, commit time),
//!    until commits are `--window` past `created_at`, or until the server's end of binlog at
//!    the start of the trace. The dump registers as replica `--server-id` (default: one derived
//!    from the connector name and the process id, in 4000000000..4294967295), never the
//!    connector's own `mysql.server_id`: a second dump with that id would make the server
//!    drop the running relay's connection.
//! 3. **The checkpoint**: the connector's checkpoint row says whether the relay is past that
//!    transaction; if not, how many binlog bytes behind it is (not yet relayed).
//! 4. **Kafka**: the record's partition is the explicit one or Kafka's default partitioner's
//!    (murmur2 of the key, seed `0x9747b28c`, `& 0x7fffffff`, modulo the partition count: what
//!    librdkafka's `murmur2_random` and the Java client compute; Apache Kafka,
//!    `Utils.murmur2` / `BuiltInPartitioner.partitionForKey`). The read starts at the offset of
//!    the expected record timestamp minus [`LOOK_BACK_SECS`] (ListOffsets by timestamp, KIP-79)
//!    and stops at the end, at `--window` past it, or after `--max-scan` records: never a full
//!    topic scan. A record matches by key and its event_key header (or id header, or value when
//!    those headers are dropped). With a dead-letter topic, its partitions are read the same
//!    way for dead letters of the row (`dlq_table` and the event_key header).
//! 5. **Consumers**: every consumer group (ListGroups) with a committed offset on that
//!    partition (OffsetFetch), and whether it is past the record; the inbox rows
//!    (`outbox_inbox`, `inbox/CONTRACT.md`) with that event_key in each `--inbox-url` database,
//!    and its parked rows (`outbox_inbox_parked`, "Parked versions": received ahead of its
//!    aggregate's next version), with the version each waits for (the stored one + 1).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use mysql_async::{Row, Value};
use serde::Serialize;

use super::republish::{event_of, row_label, select_list};
use super::scan::{self, Scanner};
use super::{binary_logs, bytes_between, read_state_row, StateRow};
use outbox_relay_core::config::{KafkaConfig, RelayConfig, TableName, TimestampSource};
use outbox_relay_core::error::RelayError;
use outbox_relay_core::outbox::mapping::TableMapping;
use outbox_relay_core::position::BinlogPosition;
use outbox_relay_core::sink::Record;
use outbox_relay_kafka::reader::{group_committed, Offsets, Reader};
use outbox_relay_kafka::route::{key_partition, Router};
use outbox_relay_mysql::binlog::source::StartFrom;
use outbox_relay_mysql::decode::columns::timestamp_ms;
use outbox_relay_mysql::preflight;
use outbox_relay_mysql::server::Flavor;

/// How far before `created_at` (or the expected record timestamp) the binlog and Kafka
/// searches start, in seconds: clocks of the application, the database and Kafka differ, and
/// a transaction commits after its rows were written.
pub const LOOK_BACK_SECS: i64 = 60;
/// Most rows shown per outbox table (an event_key should be unique).
const MAX_ROWS: usize = 10;
/// Most consumer groups checked.
const MAX_GROUPS: usize = 200;
/// Timeout of each Kafka request.
const KAFKA_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest binlog search per row.
const BINLOG_DEADLINE: Duration = Duration::from_secs(120);
/// Longest read of one partition.
const PARTITION_DEADLINE: Duration = Duration::from_secs(60);

/// `trace` arguments.
#[derive(Debug, Clone)]
pub struct TraceOptions {
    /// The event_key to follow.
    pub event_key: String,
    /// Only this outbox table (`database.table`); `None`: every configured one.
    pub table: Option<String>,
    /// Consumers' databases (`mysql://user:pass@host:port/db`) whose `outbox_inbox` is read.
    pub inbox_urls: Vec<String>,
    /// How far after `created_at` a commit (and a record timestamp) may be, in seconds.
    pub window_secs: u64,
    /// Most records read per partition.
    pub max_scan: u64,
    /// The binlog dump's replica server_id; `None`: derived (see the module docs).
    pub server_id: Option<u32>,
}

/// What `trace` found. `--json` prints it as JSON (field names as here).
#[derive(Debug, Serialize)]
pub struct TraceReport {
    /// The event_key traced.
    pub event_key: String,
    /// The outbox tables searched (`database.table`).
    pub tables: Vec<String>,
    /// The rows with that event_key (normally one).
    pub rows: Vec<RowTrace>,
}

/// One outbox row of a [`TraceReport`].
#[derive(Debug, Default, Serialize)]
pub struct RowTrace {
    /// `database.table`.
    pub table: String,
    /// The id column's value.
    pub id: Option<String>,
    /// `created_at` as stored (the server's text), if mapped.
    pub created_at: Option<String>,
    /// The aggregate type, aggregate id and event type columns' values.
    pub aggregate_type: Option<String>,
    /// See `aggregate_type`.
    pub aggregate_id: Option<String>,
    /// See `aggregate_type`.
    pub event_type: Option<String>,
    /// The topic `run` sends the row to; `None` with `route_error`.
    pub topic: Option<String>,
    /// The record key (text, lossy UTF-8).
    pub key: Option<String>,
    /// The partition the record goes to (explicit, or from the key and the partition count).
    pub partition: Option<i32>,
    /// Why the row cannot become a record (the relay dead-letters it).
    pub route_error: Option<String>,
    /// The binlog transaction that inserted the row.
    pub binlog: Option<BinlogTransaction>,
    /// The connector's checkpoint, relative to that transaction.
    pub checkpoint: Option<CheckpointView>,
    /// Records of the row on its topic (the relay's, and copies from `republish` or
    /// `dlq replay` within the window).
    pub records: Vec<RecordAt>,
    /// Dead letters of the row.
    pub dead_letters: Vec<DeadLetterAt>,
    /// Consumer groups with a committed offset on the first record's partition.
    pub groups: Vec<GroupOffset>,
    /// Inbox rows with the row's event_key.
    pub inbox: Vec<InboxRow>,
    /// Parked rows with the row's event_key (received ahead of the aggregate's next version).
    pub parked: Vec<ParkedRow>,
    /// What could not be looked up, and why.
    pub notes: Vec<String>,
}

/// The binlog transaction of a row.
#[derive(Debug, Serialize)]
pub struct BinlogTransaction {
    /// The transaction boundary before it (`FILE:POS`; where `reset --to` would resume to
    /// relay it again).
    pub after: String,
    /// The end of its commit event (`FILE:POS`).
    pub end: String,
    /// The row's number among the transaction's outbox rows (from 1, over every outbox
    /// table, as `run` numbers them for the checkpoint's `rows_acked`).
    pub row_in_transaction: u64,
    /// Its GTID (MariaDB `domain-server-seq`, MySQL `uuid:n`), when it has one.
    pub gtid: Option<String>,
    /// Commit time, ms since the epoch (MySQL 8: the GTID event's µs commit timestamp;
    /// otherwise the transaction's header time, whole seconds).
    pub commit_ms: i64,
    /// `commit_ms` as RFC 3339, UTC.
    pub committed_at: String,
}

/// The checkpoint relative to a row's transaction: a view of the state row
/// ([`outbox_relay_core::state::codec::StateRow`]), see [`CheckpointView::new`].
#[derive(Debug, Serialize)]
pub struct CheckpointView {
    /// The checkpoint's position (`FILE:POS`).
    pub position: String,
    /// Outbox rows of the transaction after `position` acknowledged too.
    pub rows_acked: u64,
    /// The checkpoint covers the row: past its transaction's end, or at its start with the
    /// row among the `rows_acked` acknowledged ones. The relay has relayed it.
    pub relayed: bool,
    /// When not relayed: binlog bytes from the checkpoint to the transaction's end.
    pub behind_bytes: Option<u64>,
    /// The checkpoint row's age, seconds.
    pub age_seconds: f64,
}

impl CheckpointView {
    /// `state`'s checkpoint against the row's transaction `tx` (when found), judged by
    /// [`outbox_relay_core::state::checkpoint::Checkpoint::covers_row`] (so a checkpoint inside
    /// that transaction covers the row when it is among its `rows_acked`), with the bytes
    /// behind from the file sizes of `logs`; `None` for a lease placeholder.
    pub fn new(
        state: &StateRow,
        tx: Option<&BinlogTransaction>,
        logs: &[(String, u64)],
    ) -> Option<Self> {
        let checkpoint = state.checkpoint.as_ref()?;
        let cp = &checkpoint.position;
        let bounds = tx.and_then(|t| {
            Some((
                t.after.parse::<BinlogPosition>().ok()?,
                t.end.parse::<BinlogPosition>().ok()?,
                t.row_in_transaction,
            ))
        });
        let relayed = bounds.as_ref().is_some_and(|(after, end, row)| {
            checkpoint.covers_row(after, *row).unwrap_or(false) || cp >= end
        });
        Some(Self {
            position: cp.to_string(),
            rows_acked: checkpoint.rows_acked,
            relayed,
            behind_bytes: bounds
                .filter(|_| !relayed)
                .and_then(|(_, end, _)| bytes_between(logs, cp, &end)),
            age_seconds: state.age_seconds,
        })
    }
}

/// A record on Kafka.
#[derive(Debug, Serialize)]
pub struct RecordAt {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Record timestamp, ms since the epoch.
    pub timestamp_ms: Option<i64>,
    /// A `republish` copy (its `republished_at` header).
    pub republished_at: Option<String>,
    /// A `dlq replay` copy (its `dlq_replayed_from` header).
    pub replayed_from: Option<String>,
}

/// A dead letter on the dead-letter topic.
#[derive(Debug, Serialize)]
pub struct DeadLetterAt {
    /// Where it is.
    pub record: RecordAt,
    /// `dlq_reason`.
    pub reason: String,
    /// `dlq_topic`: the topic it was meant for.
    pub meant_for: Option<String>,
}

/// A consumer group's committed offset on a record's partition.
#[derive(Debug, Serialize)]
pub struct GroupOffset {
    /// Group id.
    pub group: String,
    /// Committed offset (the next one the group reads).
    pub committed: i64,
    /// `committed > offset`: the group has consumed the record.
    pub past: bool,
}

/// An inbox row of the event.
#[derive(Debug, Serialize)]
pub struct InboxRow {
    /// The consumer database's URL, password redacted.
    pub database: String,
    /// `consumer`.
    pub consumer: String,
    /// `topic`, `kafka_partition`, `kafka_offset` of the record processed.
    pub topic: String,
    /// See `topic`.
    pub partition: i32,
    /// See `topic`.
    pub offset: i64,
    /// `processed_at` (the server's text).
    pub processed_at: String,
}

/// A parked row of the event (`outbox_inbox_parked`, `inbox/CONTRACT.md`, "Parked versions").
#[derive(Debug, Clone, Serialize)]
pub struct ParkedRow {
    /// The consumer database's URL, password redacted.
    pub database: String,
    /// `consumer`.
    pub consumer: String,
    /// `aggregate_type`.
    pub aggregate_type: String,
    /// `aggregate_id`.
    pub aggregate_id: String,
    /// The record's version.
    pub version: i64,
    /// The version it waits for: the stored version (`outbox_inbox_version`) + 1; `None` when
    /// the aggregate has no version row.
    pub waits_for: Option<i64>,
    /// `topic`, `kafka_partition`, `kafka_offset` of the record received.
    pub topic: String,
    /// See `topic`.
    pub partition: i32,
    /// See `topic`.
    pub offset: i64,
    /// `parked_at` (the server's text).
    pub parked_at: String,
    /// `expires_at` (the server's text): past it, the helpers' sweep dead-letters the record
    /// (or calls `on_gap_expired`).
    pub expires_at: String,
    /// `expires_at` has passed (by the server's clock).
    pub expired: bool,
    /// `reason` (`version gap: expected X, got Y`).
    pub reason: String,
}

/// The answer in one word, and the command's exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A row's record is on its topic (exit 0).
    Delivered,
    /// Not on its topic, but dead-lettered (exit 3).
    DeadLettered,
    /// A row exists but no record or dead letter was found: not yet relayed, or outside the
    /// searched window (exit 5).
    NotOnKafka,
    /// No outbox row has that event_key (exit 6).
    NoRow,
}

impl Verdict {
    /// The exit code of `trace`.
    pub fn exit_code(self) -> u8 {
        match self {
            Self::Delivered => 0,
            Self::DeadLettered => 3,
            Self::NotOnKafka => 5,
            Self::NoRow => 6,
        }
    }
}

impl TraceReport {
    /// What the trace found, over all rows.
    pub fn verdict(&self) -> Verdict {
        if self.rows.is_empty() {
            Verdict::NoRow
        } else if self.rows.iter().any(|r| !r.records.is_empty()) {
            Verdict::Delivered
        } else if self.rows.iter().any(|r| !r.dead_letters.is_empty()) {
            Verdict::DeadLettered
        } else {
            Verdict::NotOnKafka
        }
    }
}

/// Follows `opts.event_key` (see the module docs).
///
/// # Errors
/// [`RelayError::Argument`] for a `--table` that is not an outbox table or an unusable
/// `--inbox-url`; [`RelayError::Config`] when no searched table maps an event_key column;
/// [`RelayError::Mysql`] when the outbox rows cannot be read. What cannot be looked up after
/// the row was found (binlog purged, Kafka unreachable, a topic missing) is a note of the row,
/// not an error.
pub async fn trace(config: &RelayConfig, opts: &TraceOptions) -> Result<TraceReport, RelayError> {
    if config
        .table_mappings()?
        .iter()
        .all(|m| m.columns.event_key.is_empty())
    {
        return Err(RelayError::Config(
            "no outbox table maps an event_key column (outbox.columns.event_key): trace finds \
             rows by it"
                .into(),
        ));
    }
    let mut conn = super::connect(config).await?;
    let mut mappings = super::selected_mappings(&mut conn, config, opts.table.as_deref()).await?;
    mappings.retain(|m| !m.columns.event_key.is_empty());
    let mut report = TraceReport {
        event_key: opts.event_key.clone(),
        tables: mappings.iter().map(|m| m.table.to_string()).collect(),
        rows: Vec::new(),
    };
    let mut found: Vec<(Arc<TableMapping>, Option<Record>, Option<i64>)> = Vec::new();
    for m in mappings {
        let m = Arc::new(m);
        let t = m.table.quoted();
        let sql = format!(
            "SELECT {} FROM {t} WHERE {} = ? ORDER BY {} LIMIT {MAX_ROWS}",
            select_list(&m),
            super::quote_ident(&m.columns.event_key),
            super::quote_ident(&m.columns.id),
        );
        let rows: Vec<Row> = conn.exec(sql, (opts.event_key.as_str(),)).await?;
        for row in rows {
            let (trace, record, created_ms) = row_trace(&m, row);
            report.rows.push(trace);
            found.push((Arc::clone(&m), record, created_ms));
        }
    }
    if report.rows.is_empty() {
        return Ok(report);
    }

    // The binlog and the checkpoint.
    let server = preflight::server_identity(&mut conn).await?;
    let logs = binary_logs(&mut conn).await?;
    let (end, _) = preflight::current_position(&mut conn, server.flavor).await?;
    let state = read_state_row(
        &mut conn,
        &config.checkpoint_table()?,
        &config.connector_name,
    )
    .await
    .ok()
    .flatten();
    // Every outbox table, for the row's number in its transaction.
    let outbox = preflight::resolve_mappings(&mut conn, &config.table_mappings()?).await?;
    // ServerInfo::row_metadata_full is only known after the prerequisite checks: asked here.
    let layouts = if preflight::row_metadata_full(&mut conn).await? {
        None
    } else {
        let tables: Vec<TableName> = outbox.iter().map(|m| (*m.table).clone()).collect();
        preflight::current_layouts(&mut conn, &tables)
            .await
            .ok()
            .flatten()
    };
    let mut dump_config = config.clone();
    dump_config.mysql.server_id = opts
        .server_id
        .unwrap_or_else(|| scan::private_server_id(config));
    for (row, (m, _, created_ms)) in report.rows.iter_mut().zip(&found) {
        let Some(created_ms) = created_ms else {
            row.notes.push(
                "outbox.columns.created_at is not mapped (or NULL): the binlog transaction was \
                 not searched"
                    .into(),
            );
            continue;
        };
        let search = Search {
            config: &dump_config,
            flavor: server.flavor,
            logs: &logs,
            end: &end,
            mapping: m,
            outbox: &outbox,
            layouts: layouts.clone(),
            event_key: opts.event_key.as_bytes(),
            around_ms: *created_ms,
            window_ms: i64::try_from(opts.window_secs.saturating_mul(1000)).unwrap_or(i64::MAX),
        };
        match tokio::time::timeout(BINLOG_DEADLINE, search.run()).await {
            Ok(Ok(Some(tx))) => row.binlog = Some(tx),
            Ok(Ok(None)) => row.notes.push(format!(
                "no transaction inserting it in the binlog from {} s before created_at to \
                 {} s after it (or to the end of binlog, {end}): committed later than \
                 --window, or written before the binlog's oldest file",
                LOOK_BACK_SECS, opts.window_secs
            )),
            Ok(Err(e)) => row.notes.push(format!("binlog search failed: {e}")),
            Err(_) => row.notes.push(format!(
                "binlog search stopped after {} s",
                BINLOG_DEADLINE.as_secs()
            )),
        }
        match (&state, &row.binlog) {
            (None, _) => row.notes.push(format!(
                "connector {:?} has no checkpoint row: it never ran (or was reset)",
                config.connector_name
            )),
            (Some(s), tx) => row.checkpoint = CheckpointView::new(s, tx.as_ref(), &logs),
        }
    }
    drop(conn);

    // Kafka, on a blocking thread (the Kafka reader blocks).
    let kafka = config.kafka.clone();
    let dlq = config
        .dead_letter
        .enabled
        .then(|| config.dead_letter.topic.clone());
    let window_ms = i64::try_from(opts.window_secs.saturating_mul(1000)).unwrap_or(i64::MAX);
    let max_scan = opts.max_scan.max(1);
    let jobs: Vec<KafkaJob> = report
        .rows
        .iter()
        .zip(&found)
        .map(|(row, (m, record, created_ms))| KafkaJob {
            table: row.table.clone(),
            event_key: opts.event_key.clone(),
            event_key_header: m.headers.event_key.to_string(),
            id_header: m.headers.id.to_string(),
            id: row.id.clone(),
            record: record.clone(),
            // The record's timestamp: created_at with `timestamp = "column"`, else the commit
            // time (created_at when the transaction was not found).
            expected_ms: match m.timestamp {
                TimestampSource::Column => *created_ms,
                TimestampSource::Commit => row.binlog.as_ref().map(|b| b.commit_ms).or(*created_ms),
            },
        })
        .collect();
    let results = tokio::task::spawn_blocking(move || {
        jobs.iter()
            .map(|j| kafka_lookup(&kafka, dlq.as_deref(), j, window_ms, max_scan))
            .collect::<Vec<_>>()
    })
    .await
    .map_err(|e| RelayError::kafka(format!("the Kafka lookup failed: {e}")))?;
    for (row, found) in report.rows.iter_mut().zip(results) {
        if row.partition.is_none() {
            row.partition = found.partition;
        }
        row.records = found.records;
        row.dead_letters = found.dead_letters;
        row.groups = found.groups;
        row.notes.extend(found.notes);
    }

    // Inbox rows, and parked rows.
    for url in &opts.inbox_urls {
        let rows = inbox_rows(url, &opts.event_key).await;
        let parked = parked_rows(url, &opts.event_key).await;
        for row in &mut report.rows {
            match &rows {
                Ok(found) => row.inbox.extend(found.iter().map(|r| InboxRow {
                    database: r.database.clone(),
                    consumer: r.consumer.clone(),
                    topic: r.topic.clone(),
                    partition: r.partition,
                    offset: r.offset,
                    processed_at: r.processed_at.clone(),
                })),
                Err(e) => row.notes.push(format!(
                    "inbox {}: {e}",
                    outbox_relay_core::error::redact_url(url)
                )),
            }
            match &parked {
                Ok(found) => row.parked.extend(found.iter().cloned()),
                Err(e) => row.notes.push(format!(
                    "inbox {} (parked rows): {e}",
                    outbox_relay_core::error::redact_url(url)
                )),
            }
        }
    }
    Ok(report)
}

/// A row read with [`select_list`] as a [`RowTrace`] (lookups still empty), the record `run`
/// would send for it, and its `created_at` in ms since the epoch.
fn row_trace(m: &Arc<TableMapping>, row: Row) -> (RowTrace, Option<Record>, Option<i64>) {
    let text = |i: usize| -> Option<String> {
        match row.as_ref(i) {
            Some(Value::NULL) | None => None,
            Some(Value::Bytes(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            Some(v) => Some(v.as_sql(true).trim_matches('\'').to_owned()),
        }
    };
    let created_value = row.as_ref(6).cloned();
    let created_is_timestamp = row
        .columns_ref()
        .get(6)
        .is_some_and(|c| c.column_type() == mysql_async::consts::ColumnType::MYSQL_TYPE_TIMESTAMP);
    let created_ms = match created_value {
        Some(Value::NULL) | None => None,
        Some(v) => {
            // TIMESTAMP values arrive in the connection's zone (UTC); DATETIME holds wall-clock
            // time in the mapping's zone.
            let zone = if created_is_timestamp {
                chrono_tz::UTC
            } else {
                m.datetime_time_zone
            };
            timestamp_ms(&v, zone).ok().flatten()
        }
    };
    let mut trace = RowTrace {
        table: m.table.to_string(),
        id: text(0),
        created_at: text(6),
        aggregate_type: text(1),
        aggregate_id: text(2),
        event_type: text(3),
        topic: None,
        key: None,
        partition: None,
        route_error: None,
        binlog: None,
        checkpoint: None,
        records: Vec::new(),
        dead_letters: Vec::new(),
        groups: Vec::new(),
        inbox: Vec::new(),
        parked: Vec::new(),
        notes: Vec::new(),
    };
    let label = row_label(&row);
    let record = match event_of(m, row) {
        Ok(Some(event)) => match Router::new().try_route(event) {
            Ok(record) => Some(record),
            Err((reason, _)) => {
                trace.route_error = Some(reason.to_string());
                None
            }
        },
        Ok(None) => {
            trace.route_error =
                Some("NULL payload with outbox.null_payload = \"skip\": never sent".into());
            None
        }
        Err(reason) => {
            trace.route_error = Some(format!("{label}: {reason}"));
            None
        }
    };
    if let Some(r) = &record {
        trace.topic = Some(r.topic.to_string());
        trace.key = Some(String::from_utf8_lossy(&r.key).into_owned());
        trace.partition = r.partition;
    }
    (trace, record, created_ms)
}

/// The binlog search of one row.
struct Search<'a> {
    config: &'a RelayConfig,
    flavor: Flavor,
    logs: &'a [(String, u64)],
    end: &'a BinlogPosition,
    mapping: &'a TableMapping,
    /// Every outbox table (patterns resolved): the row's number in its transaction counts
    /// their rows, as `run` does.
    outbox: &'a [TableMapping],
    layouts: Option<Arc<str>>,
    event_key: &'a [u8],
    around_ms: i64,
    window_ms: i64,
}

impl Search<'_> {
    async fn run(&self) -> Result<Option<BinlogTransaction>, RelayError> {
        let Some((first, _)) = self.logs.first() else {
            return Ok(None);
        };
        let from_secs = self.around_ms.div_euclid(1000) - LOOK_BACK_SECS;
        // The last file created before the search's start: earlier files ended before it.
        let mut start = first.clone();
        for (file, _) in self.logs.iter().rev() {
            let created = scan::file_created(self.config, self.flavor, file).await?;
            if i64::from(created) < from_secs {
                start = file.clone();
                break;
            }
        }
        let from = BinlogPosition::new(start, 4);
        if from >= *self.end {
            return Ok(None);
        }
        let mut scanner =
            Scanner::open(self.config, self.flavor, &StartFrom::Position(from.clone()))
                .await?
                .with_outbox_tables(self.outbox.to_vec(), self.layouts.clone());
        let until_ms = self.around_ms.saturating_add(self.window_ms);
        let mut after = from;
        let mut gtid: Option<String> = None;
        let mut hit: Option<(i64, u64)> = None;
        let mut rows = 0u64;
        loop {
            let s = scanner.next().await?;
            let header = s.event.event.header();
            let raw = header.event_type_raw();
            if scan::is_gtid_event(raw) {
                gtid = self.gtid_of(&s.event);
            }
            for row in &s.rows {
                rows += 1;
                let commit_ms = match row {
                    Ok(ev)
                        if *ev.table == *self.mapping.table
                            && ev.event_key.as_deref() == Some(self.event_key) =>
                    {
                        Some(ev.commit_ms)
                    }
                    // Every outbox table is decoded (for the row's number): a failed row of
                    // another table with the same event_key is not this one.
                    Err(f)
                        if !matches!(&f.error, RelayError::Row { table, .. }
                            if *table != self.mapping.table.to_string())
                            && f.headers.iter().any(|(n, v)| {
                                n == "event_key" && v.as_slice() == self.event_key
                            }) =>
                    {
                        Some(i64::from(s.event.timestamp) * 1000)
                    }
                    _ => None,
                };
                if hit.is_none() {
                    hit = commit_ms.map(|ms| (ms, rows));
                }
            }
            if let Some(b) = s.boundary {
                if let Some((commit_ms, row_in_transaction)) = hit {
                    return Ok(Some(BinlogTransaction {
                        after: after.to_string(),
                        end: b.position.to_string(),
                        row_in_transaction,
                        gtid,
                        commit_ms,
                        committed_at: rfc3339(commit_ms),
                    }));
                }
                if i64::from(s.event.timestamp) * 1000 > until_ms {
                    return Ok(None);
                }
                after = b.position;
                gtid = None;
                rows = 0;
            }
            if s.event.position >= *self.end && hit.is_none() {
                return Ok(None);
            }
        }
    }

    /// The GTID a GTID event starts, as text.
    fn gtid_of(&self, ev: &outbox_relay_mysql::binlog::source::SourceEvent) -> Option<String> {
        self.flavor.gtid_of_event(&ev.event)
    }
}

/// ms since the epoch as RFC 3339 (UTC, ms).
fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).map_or_else(
        || ms.to_string(),
        |t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
    )
}

/// What the Kafka lookup of one row needs.
struct KafkaJob {
    table: String,
    event_key: String,
    event_key_header: String,
    id_header: String,
    id: Option<String>,
    record: Option<Record>,
    expected_ms: Option<i64>,
}

/// What the Kafka lookup of one row found.
#[derive(Default)]
struct KafkaFound {
    partition: Option<i32>,
    records: Vec<RecordAt>,
    dead_letters: Vec<DeadLetterAt>,
    groups: Vec<GroupOffset>,
    notes: Vec<String>,
}

/// A record read by [`read_partition`].
struct Read {
    at: RecordAt,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(String, Vec<u8>)>,
}

impl Read {
    fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }

    fn header_text(&self, name: &str) -> Option<String> {
        self.header(name)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }
}

fn kafka_lookup(
    kafka: &KafkaConfig,
    dlq: Option<&str>,
    job: &KafkaJob,
    window_ms: i64,
    max_scan: u64,
) -> KafkaFound {
    let mut found = KafkaFound::default();
    let consumer = match reader(kafka) {
        Ok(c) => c,
        Err(e) => {
            found.notes.push(e.to_string());
            return found;
        }
    };
    let from_ms = job.expected_ms.map(|t| t - LOOK_BACK_SECS * 1000);
    let until_ms = job.expected_ms.map(|t| t.saturating_add(window_ms));
    if let Some(record) = &job.record {
        match partition_of(&consumer, record) {
            Err(note) => found.notes.push(note),
            Ok(p) => {
                found.partition = Some(p);
                let wanted = |r: &Read| -> bool {
                    if r.key.as_deref() != Some(record.key.as_slice()) {
                        return false;
                    }
                    if !job.event_key_header.is_empty() {
                        return r.header(&job.event_key_header) == Some(job.event_key.as_bytes());
                    }
                    if let (false, Some(id)) = (job.id_header.is_empty(), &job.id) {
                        return r.header(&job.id_header) == Some(id.as_bytes());
                    }
                    r.value == record.value
                };
                match read_partition(
                    &consumer,
                    &record.topic,
                    p,
                    from_ms,
                    until_ms,
                    max_scan,
                    wanted,
                ) {
                    Ok((reads, note)) => {
                        found.notes.extend(note);
                        found.records = reads
                            .into_iter()
                            .map(|r| RecordAt {
                                republished_at: r.header_text(super::republish::REPUBLISHED_HEADER),
                                replayed_from: r.header_text(super::dlq::REPLAYED_FROM_HEADER),
                                ..r.at
                            })
                            .collect();
                    }
                    Err(e) => found.notes.push(e),
                }
            }
        }
    }
    if let Some(dlq_topic) = dlq {
        match partitions(&consumer, dlq_topic) {
            Ok(n) => {
                for p in 0..n {
                    let wanted = |r: &Read| {
                        r.header("dlq_table") == Some(job.table.as_bytes())
                            && (r.header(&job.event_key_header) == Some(job.event_key.as_bytes())
                                || r.header("event_key") == Some(job.event_key.as_bytes()))
                    };
                    match read_partition(&consumer, dlq_topic, p, from_ms, None, max_scan, wanted) {
                        Ok((reads, note)) => {
                            found.notes.extend(note);
                            found
                                .dead_letters
                                .extend(reads.into_iter().map(|r| DeadLetterAt {
                                    reason: r.header_text("dlq_reason").unwrap_or_default(),
                                    meant_for: r.header_text("dlq_topic").filter(|t| !t.is_empty()),
                                    record: r.at,
                                }));
                        }
                        Err(e) => found.notes.push(e),
                    }
                }
            }
            Err(note) if job.record.is_none() => found.notes.push(note),
            Err(_) => {}
        }
    }
    if let Some(first) = found.records.first() {
        match groups_past(
            kafka,
            &consumer,
            &first.topic,
            first.partition,
            first.offset,
        ) {
            Ok((groups, note)) => {
                found.groups = groups;
                found.notes.extend(note);
            }
            Err(e) => found.notes.push(e),
        }
    }
    found
}

/// The trace's reader: read_committed (what consumers see), no group commits.
fn reader(kafka: &KafkaConfig) -> Result<Reader, RelayError> {
    Reader::read_committed(kafka, "outbox-relay.trace", true, "trace reader")
}

/// The partition count of `topic`.
fn partitions(consumer: &Reader, topic: &str) -> Result<i32, String> {
    let md = consumer
        .topics(Some(topic), KAFKA_TIMEOUT)
        .map_err(|e| format!("metadata of topic {topic}: {e}"))?;
    let t = md
        .iter()
        .find(|t| t.name == topic)
        .ok_or_else(|| format!("topic {topic} is not in the metadata"))?;
    if let Some(e) = &t.error {
        return Err(format!("topic {topic}: {e}"));
    }
    i32::try_from(t.partitions.len())
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("topic {topic} has no partitions"))
}

/// The partition `record` goes to: explicit, or Kafka's default partitioner of its key.
fn partition_of(consumer: &Reader, record: &Record) -> Result<i32, String> {
    if let Some(p) = record.partition {
        return Ok(p);
    }
    let n = partitions(consumer, &record.topic)?;
    Ok(key_partition(&record.key, n))
}

/// Reads `topic`/`p` from the offset of `from_ms` (or the last `max_scan` records) to its end,
/// to a record timestamp past `until_ms`, or for `max_scan` records; returns the records
/// `wanted` accepts and a note when the read stopped early.
fn read_partition(
    consumer: &Reader,
    topic: &str,
    p: i32,
    from_ms: Option<i64>,
    until_ms: Option<i64>,
    max_scan: u64,
    wanted: impl Fn(&Read) -> bool,
) -> Result<(Vec<Read>, Option<String>), String> {
    let (low, high) = consumer
        .watermarks(topic, p, KAFKA_TIMEOUT)
        .map_err(|e| format!("offsets of {topic}/{p}: {e}"))?;
    let start = match from_ms {
        Some(ms) => {
            let mut times = Offsets::new();
            times
                .add(topic, p, ms)
                .map_err(|e| format!("{topic}/{p}: {e}"))?;
            let got = consumer
                .offsets_for_times(times, KAFKA_TIMEOUT)
                .map_err(|e| format!("offsets for times of {topic}/{p}: {e}"))?;
            got.offset(topic, p).unwrap_or(high)
        }
        None => low.max(high - i64::try_from(max_scan).unwrap_or(i64::MAX)),
    };
    if start >= high {
        return Ok((Vec::new(), None));
    }
    let mut assignment = Offsets::new();
    assignment
        .add(topic, p, start)
        .map_err(|e| format!("{topic}/{p}: {e}"))?;
    consumer
        .assign(&assignment)
        .map_err(|e| format!("reading {topic}/{p}: {e}"))?;
    let deadline = Instant::now() + PARTITION_DEADLINE;
    let mut out = Vec::new();
    let mut read = 0u64;
    let note = loop {
        if Instant::now() >= deadline {
            break Some(format!(
                "{topic}/{p}: read stopped after {} s at {read} records",
                PARTITION_DEADLINE.as_secs()
            ));
        }
        let Some(polled) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let m = match polled {
            Ok(m) => m,
            Err(e) if e.is_partition_eof() => break None,
            Err(e) => break Some(format!("reading {topic}/{p}: {e}")),
        };
        read += 1;
        let ts = m.timestamp_ms;
        let offset = m.offset;
        let r = Read {
            at: RecordAt {
                topic: topic.to_owned(),
                partition: p,
                offset,
                timestamp_ms: ts,
                republished_at: None,
                replayed_from: None,
            },
            key: m.key,
            value: m.value,
            headers: m
                .headers
                .into_iter()
                .map(|(k, v)| (k, v.unwrap_or_default()))
                .collect(),
        };
        if wanted(&r) {
            out.push(r);
        }
        if offset >= high - 1 {
            break None;
        }
        if until_ms.zip(ts).is_some_and(|(u, t)| t > u) {
            break None;
        }
        if read >= max_scan {
            break Some(format!(
                "{topic}/{p}: read stopped at --max-scan {max_scan} records (offset {offset})"
            ));
        }
    };
    let _ = consumer.unassign();
    Ok((out, note))
}

/// Consumer groups with a committed offset on `topic`/`p`, and whether each is past `offset`.
fn groups_past(
    kafka: &KafkaConfig,
    consumer: &Reader,
    topic: &str,
    p: i32,
    offset: i64,
) -> Result<(Vec<GroupOffset>, Option<String>), String> {
    let list = consumer
        .group_names(KAFKA_TIMEOUT)
        .map_err(|e| format!("listing consumer groups: {e}"))?;
    let mut names: Vec<String> = list
        .into_iter()
        .filter(|n| !n.starts_with("outbox-relay.trace"))
        .collect();
    names.sort();
    let note = (names.len() > MAX_GROUPS).then(|| {
        format!(
            "{} consumer groups; only the first {MAX_GROUPS} (by name) were checked",
            names.len()
        )
    });
    let mut out = Vec::new();
    for name in names.into_iter().take(MAX_GROUPS) {
        if let Some(o) = group_committed(kafka, &name, topic, p, KAFKA_TIMEOUT) {
            out.push(GroupOffset {
                group: name,
                committed: o,
                past: o > offset,
            });
        }
    }
    Ok((out, note))
}

/// An inbox row read from a consumer database.
struct FoundInbox {
    database: String,
    consumer: String,
    topic: String,
    partition: i32,
    offset: i64,
    processed_at: String,
}

async fn inbox_rows(url: &str, event_key: &str) -> Result<Vec<FoundInbox>, RelayError> {
    let mut conn = super::inbox::connect(url).await?;
    let rows: Vec<(String, String, i32, i64, String)> = conn
        .exec(
            format!(
                "SELECT consumer, topic, kafka_partition, kafka_offset, \
                 CAST(processed_at AS CHAR) FROM {} WHERE event_key = ? ORDER BY consumer",
                super::inbox::INBOX_TABLE
            ),
            (event_key,),
        )
        .await?;
    let database = outbox_relay_core::error::redact_url(url);
    Ok(rows
        .into_iter()
        .map(
            |(consumer, topic, partition, offset, processed_at)| FoundInbox {
                database: database.clone(),
                consumer,
                topic,
                partition,
                offset,
                processed_at,
            },
        )
        .collect())
}

/// The parked rows with `event_key` in the database of `url` (none when it has no parked table:
/// `check --inbox-url` warns about that), each with the version it waits for.
async fn parked_rows(url: &str, event_key: &str) -> Result<Vec<ParkedRow>, RelayError> {
    let mut conn = super::inbox::connect(url).await?;
    let rows: Vec<Row> = match conn
        .exec(
            "SELECT CONVERT(p.consumer USING utf8mb4), CONVERT(p.aggregate_type USING utf8mb4), \
             CONVERT(p.aggregate_id USING utf8mb4), p.version, v.version + 1, p.topic, \
             p.kafka_partition, p.kafka_offset, CAST(p.parked_at AS CHAR), \
             CAST(p.expires_at AS CHAR), p.expires_at < NOW(6), p.reason \
             FROM outbox_inbox_parked p LEFT JOIN outbox_inbox_version v \
             ON v.consumer = p.consumer AND v.aggregate_type = p.aggregate_type \
             AND v.aggregate_id = p.aggregate_id \
             WHERE p.event_key = ? ORDER BY p.consumer, p.aggregate_type, p.aggregate_id, \
             p.version",
            (event_key,),
        )
        .await
    {
        Ok(rows) => rows,
        // ER_NO_SUCH_TABLE: no parked table (migrations/0006_inbox_parked.sql), so none parked.
        Err(mysql_async::Error::Server(e)) if e.code == 1146 => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    conn.disconnect().await.ok();
    let database = outbox_relay_core::error::redact_url(url);
    rows.into_iter()
        .map(|mut r| {
            let mut col = |i: usize| r.take::<Value, usize>(i).unwrap_or(Value::NULL);
            let text = |v: Value| match v {
                Value::Bytes(b) => String::from_utf8_lossy(&b).into_owned(),
                Value::NULL => String::new(),
                other => other.as_sql(true),
            };
            let int = |v: Value| -> Option<i64> { mysql_async::from_value_opt(v).ok() };
            Ok(ParkedRow {
                database: database.clone(),
                consumer: text(col(0)),
                aggregate_type: text(col(1)),
                aggregate_id: text(col(2)),
                version: int(col(3)).unwrap_or_default(),
                waits_for: int(col(4)),
                topic: text(col(5)),
                partition: int(col(6)).unwrap_or_default() as i32,
                offset: int(col(7)).unwrap_or_default(),
                parked_at: text(col(8)),
                expires_at: text(col(9)),
                expired: int(col(10)).unwrap_or_default() != 0,
                reason: text(col(11)),
            })
        })
        .collect()
}

impl fmt::Display for TraceReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "event_key   {}", self.event_key)?;
        if self.rows.is_empty() {
            return writeln!(
                f,
                "outbox row  none in {}: pruned, or never written (check the writer's \
                 transaction committed)",
                self.tables.join(", ")
            );
        }
        for r in &self.rows {
            let or_null = |v: &Option<String>| v.clone().unwrap_or_else(|| "NULL".into());
            writeln!(
                f,
                "outbox row  {} id={} created_at={} aggregate={}/{} event_type={}",
                r.table,
                or_null(&r.id),
                or_null(&r.created_at),
                or_null(&r.aggregate_type),
                or_null(&r.aggregate_id),
                or_null(&r.event_type)
            )?;
            match (&r.topic, &r.route_error) {
                (Some(topic), _) => writeln!(
                    f,
                    "route       topic {topic}, key {:?}, partition {}",
                    r.key.as_deref().unwrap_or_default(),
                    r.partition.map_or_else(|| "?".into(), |p| p.to_string())
                )?,
                (None, Some(e)) => writeln!(f, "route       none: {e}")?,
                (None, None) => {}
            }
            if let Some(b) = &r.binlog {
                writeln!(
                    f,
                    "binlog      transaction {} .. {}{}, committed {}",
                    b.after,
                    b.end,
                    b.gtid
                        .as_ref()
                        .map_or_else(String::new, |g| format!(", GTID {g}")),
                    b.committed_at
                )?;
            }
            if let Some(c) = &r.checkpoint {
                let inside = r.binlog.as_ref().filter(|b| b.after == c.position);
                if let (true, Some(b)) = (c.relayed, inside) {
                    // A checkpoint inside the row's transaction (a stop between two of its rows'
                    // acknowledgements and its end).
                    writeln!(
                        f,
                        "checkpoint  {} rows_acked {} (age {}): inside the transaction, its row {} \
                         acknowledged, relayed",
                        c.position,
                        c.rows_acked,
                        super::human_duration(c.age_seconds),
                        b.row_in_transaction
                    )?;
                } else if c.relayed {
                    writeln!(
                        f,
                        "checkpoint  {} (age {}): past the transaction, relayed",
                        c.position,
                        super::human_duration(c.age_seconds)
                    )?;
                } else if r.binlog.is_some() {
                    writeln!(
                        f,
                        "checkpoint  {} (age {}): NOT YET RELAYED, {} behind the transaction's end",
                        c.position,
                        super::human_duration(c.age_seconds),
                        c.behind_bytes
                            .map_or_else(|| "? bytes".into(), |b| format!("{b} bytes"))
                    )?;
                } else {
                    writeln!(f, "checkpoint  {}", c.position)?;
                }
            }
            for k in &r.records {
                writeln!(
                    f,
                    "kafka       {}/{}@{} timestamp {}{}{}",
                    k.topic,
                    k.partition,
                    k.offset,
                    k.timestamp_ms.map_or_else(|| "none".into(), rfc3339),
                    k.republished_at
                        .as_ref()
                        .map_or_else(String::new, |t| format!(" (republished at {t})")),
                    k.replayed_from
                        .as_ref()
                        .map_or_else(String::new, |t| format!(" (replayed from {t})"))
                )?;
            }
            if r.records.is_empty() && r.route_error.is_none() {
                writeln!(f, "kafka       no record found on its topic")?;
            }
            for d in &r.dead_letters {
                writeln!(
                    f,
                    "dead letter {}/{}@{} timestamp {}: {}{}",
                    d.record.topic,
                    d.record.partition,
                    d.record.offset,
                    d.record.timestamp_ms.map_or_else(|| "none".into(), rfc3339),
                    d.reason,
                    d.meant_for
                        .as_ref()
                        .map_or_else(String::new, |t| format!(" (meant for {t})"))
                )?;
            }
            for g in &r.groups {
                writeln!(
                    f,
                    "group       {}: committed {} ({})",
                    g.group,
                    g.committed,
                    if g.past {
                        "past it: consumed"
                    } else {
                        "not yet consumed"
                    }
                )?;
            }
            for i in &r.inbox {
                writeln!(
                    f,
                    "inbox       {} consumer {} processed {}/{}@{} at {}",
                    i.database, i.consumer, i.topic, i.partition, i.offset, i.processed_at
                )?;
            }
            for p in &r.parked {
                writeln!(
                    f,
                    "parked      {} consumer {}: {} {} version {}, waits for version {}; \
                     received {}/{}@{}, parked at {}, expires at {}{}: {}",
                    p.database,
                    p.consumer,
                    p.aggregate_type,
                    p.aggregate_id,
                    p.version,
                    p.waits_for
                        .map_or_else(|| "? (no version row)".to_owned(), |v| v.to_string()),
                    p.topic,
                    p.partition,
                    p.offset,
                    p.parked_at,
                    p.expires_at,
                    if p.expired {
                        " (passed: the next sweep dead-letters it)"
                    } else {
                        ""
                    },
                    p.reason
                )?;
            }
            for n in &r.notes {
                writeln!(f, "note        {n}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdict_prefers_the_topic_then_the_dead_letter() {
        let mut r = TraceReport {
            event_key: "k".into(),
            tables: vec!["s.outbox".into()],
            rows: Vec::new(),
        };
        assert_eq!(r.verdict(), Verdict::NoRow);
        assert_eq!(r.verdict().exit_code(), 6);
        r.rows.push(RowTrace::default());
        assert_eq!(r.verdict(), Verdict::NotOnKafka);
        let at = || RecordAt {
            topic: "t".into(),
            partition: 0,
            offset: 1,
            timestamp_ms: None,
            republished_at: None,
            replayed_from: None,
        };
        r.rows[0].dead_letters.push(DeadLetterAt {
            record: at(),
            reason: "r".into(),
            meant_for: None,
        });
        assert_eq!(r.verdict(), Verdict::DeadLettered);
        // Replayed after the fix: on its topic now.
        r.rows[0].records.push(at());
        assert_eq!(r.verdict(), Verdict::Delivered);
        assert_eq!(r.verdict().exit_code(), 0);
    }
}
