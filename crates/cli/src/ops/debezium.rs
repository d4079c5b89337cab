//! `outbox-relay migrate-from debezium`: starts the relay exactly where Debezium's MySQL or
//! MariaDB connector (with the outbox EventRouter) stopped, from its committed source offset.
//!
//! # The offset
//!
//! Kafka Connect stores a source offset under the key `["<connector name>",{"server":"<topic
//! prefix>"}]` (the connector's name and its source partition, `BinlogPartition`'s
//! `{"server": topic.prefix}`, both connectors alike), as JSON, in the worker's compacted
//! offsets topic (`offset.storage.topic`, e.g. `connect-offsets`: the last record of a key wins,
//! a null value deletes it) or, for Debezium Server and the embedded engine, in a
//! `FileOffsetBackingStore` file ([`super::java_stream`]). The value is `BinlogOffsetContext`'s
//! (debezium-connector-binlog 3.6.1, `offsetUsingPosition` and `getOffset`):
//!
//! ```json
//! {"ts_sec":1767323045,"file":"binlog.000003","pos":1234,"gtids":"…","event":2,"row":1,
//!  "server_id":1,"transaction_id":null}
//! ```
//!
//! `file`/`pos` is where a restart begins: the start of the transaction being streamed (the
//! position of its first event, recorded by `startNextTransaction`), or after a commit the end
//! of its commit event (`commitTransaction`), with `event` and `row` absent (0). `event` counts
//! the events Debezium completed since that start, each event it handled, of any type
//! (`BinlogStreamingChangeEventSource.handleEvent` calls `completeEvent` after every event's
//! handler; `handleTransactionBegin` resets it, so the transaction's first event counts as the
//! first): MySQL's `BEGIN` query event (its GTID event comes before the start), MariaDB's GTID
//! event (`MariaDbStreamingChangeEventSource.handleGtidEvent` begins the transaction), then every
//! table map, rows event, rows-query/annotate event of the transaction. `row` is how many rows
//! of the next event Debezium already emitted (`setRowNumber`: the row's index + 1, or the
//! event's row count at its last row). A restart skips `event` events and then `row` rows of the
//! next rows event (`handleChange` starts at `startingRowNumber`). `gtids` is the GTID set of the
//! transactions completed before `file`/`pos`. Offsets written during the initial snapshot carry
//! `"snapshot"` and no `"snapshot_completed": true`: those cannot be resumed from the binlog.
//!
//! # The checkpoint
//!
//! The relay's checkpoint is the boundary before that transaction (MariaDB: `pos` itself;
//! MySQL: the start of its GTID event, the end of the previous transaction) with `rows_acked`
//! the outbox rows (of the config's outbox tables) Debezium already delivered: those in the
//! first `event` events read from `pos`, plus `row` rows of the next event. It is found by
//! reading the binlog from the start of `file` through a dump as replica `mysql.server_id` with
//! the relay's own decoder ([`super::scan::Scanner`]). `event` = `row` = 0 is a boundary and
//! `rows_acked` = 0. It is written as `reset` writes (lease, fenced row, exactly-once progress
//! topic: [`super::reset::write_point`]).

use std::fmt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use mysql_async::binlog::EventType;
use mysql_async::Pool;
use serde_json::Value;

use super::java_stream;
use super::scan::Scanner;
use super::{binary_logs, lease_holder, read_state_row, StateRow};
use outbox_relay_core::config::{KafkaConfig, RelayConfig, TableName};
use outbox_relay_core::error::RelayError;
use outbox_relay_core::position::gtid::MysqlGtidSet;
use outbox_relay_core::position::BinlogPosition;
use outbox_relay_core::state::checkpoint::Checkpoint;
use outbox_relay_kafka::reader::{Offsets, Reader};
use outbox_relay_mysql::binlog::source::StartFrom;
use outbox_relay_mysql::preflight;
use outbox_relay_mysql::server::Flavor;
use outbox_relay_mysql::state::store::MysqlCheckpointStore;

/// How long reading one partition of the offsets topic may take.
const PARTITION_DEADLINE: Duration = Duration::from_secs(60);
/// Kafka metadata and watermark requests.
const KAFKA_TIMEOUT: Duration = Duration::from_secs(15);
/// The heartbeat event type (27): not a binlog event, never counted.
const HEARTBEAT_EVENT: u8 = 27;

/// One stored offset record: key bytes, value bytes (`None`: deleted), where it was read.
pub type OffsetEntry = (Vec<u8>, Option<Vec<u8>>, String);

/// Where Debezium's offset is read from.
#[derive(Debug, Clone)]
pub enum OffsetSource {
    /// Kafka Connect's offsets topic, bootstrapped from `kafka.bootstrap_servers`.
    Topic {
        /// The topic (`offset.storage.topic`).
        topic: String,
        /// The connector's name (`name` of its configuration).
        connector: String,
        /// The connector's `topic.prefix` (its source partition `{"server": …}`); needed only
        /// when the connector has offsets of several.
        topic_prefix: Option<String>,
    },
    /// A `FileOffsetBackingStore` file (`offset.storage.file.filename`).
    File {
        /// The file.
        path: PathBuf,
        /// Only entries of this connector name (needed when the file holds several).
        connector: Option<String>,
        /// Only entries of this `topic.prefix`.
        topic_prefix: Option<String>,
    },
}

/// Debezium's committed source offset (the fields the relay uses; `raw` has all of them).
#[derive(Debug, Clone, PartialEq)]
pub struct DebeziumOffset {
    /// `file`: the binlog file of the restart position.
    pub file: String,
    /// `pos`: the restart position in it (bytes; a transaction's first event or a commit's end).
    pub pos: u64,
    /// `event`: events of the transaction at `pos` already handled (0 when absent).
    pub event: u64,
    /// `row`: rows of the next event already emitted (0 when absent).
    pub row: u64,
    /// `gtids`: the GTID set (MySQL) or GTID position (MariaDB) completed before `pos`.
    pub gtids: Option<String>,
    /// `server_id`: the originating server id of the last event Debezium read.
    pub server_id: Option<u64>,
    /// `ts_sec`: the source time of that event (seconds since the epoch).
    pub ts_sec: Option<i64>,
    /// `snapshot`: present while the offset belongs to a snapshot (`INITIAL`, `true`, …).
    pub snapshot: Option<String>,
    /// `snapshot_completed`.
    pub snapshot_completed: bool,
    /// The value as stored.
    pub raw: Value,
}

/// A number of an offset field: Connect stores longs, older offsets strings.
fn number(v: &Value, key: &str) -> Result<Option<u64>, String> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("\"{key}\" is {n}, expected a non-negative integer")),
        Some(Value::String(s)) => s
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| format!("\"{key}\" is {s:?}, expected a non-negative integer")),
        Some(other) => Err(format!("\"{key}\" is {other}, expected an integer")),
    }
}

impl DebeziumOffset {
    /// Parses an offset value (JSON bytes as Connect's `JsonConverter` with
    /// `schemas.enable=false` writes them).
    ///
    /// # Errors
    /// [`RelayError::Argument`] naming the field that is missing or malformed.
    pub fn parse(value: &[u8]) -> Result<Self, RelayError> {
        let bad = |why: String| {
            RelayError::Argument(format!(
                "Debezium's offset {} is not a MySQL/MariaDB connector offset: {why}",
                String::from_utf8_lossy(value)
            ))
        };
        let raw: Value =
            serde_json::from_slice(value).map_err(|e| bad(format!("not JSON ({e})")))?;
        if !raw.is_object() {
            return Err(bad("not a JSON object".into()));
        }
        let file = match raw.get("file") {
            Some(Value::String(f)) if !f.is_empty() => f.clone(),
            _ => return Err(bad("no \"file\"".into())),
        };
        let pos = number(&raw, "pos")
            .map_err(bad)?
            .ok_or_else(|| bad("no \"pos\"".into()))?;
        let event = number(&raw, "event").map_err(bad)?.unwrap_or(0);
        let row = number(&raw, "row").map_err(bad)?.unwrap_or(0);
        let server_id = number(&raw, "server_id").map_err(bad)?;
        let ts_sec = number(&raw, "ts_sec")
            .map_err(bad)?
            .and_then(|t| i64::try_from(t).ok());
        let gtids = raw
            .get("gtids")
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|g| !g.is_empty())
            .map(str::to_owned);
        let snapshot = match raw.get("snapshot") {
            None | Some(Value::Null) | Some(Value::Bool(false)) => None,
            Some(Value::String(s)) if s.eq_ignore_ascii_case("false") => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(other) => Some(other.to_string()),
        };
        let snapshot_completed = matches!(raw.get("snapshot_completed"), Some(Value::Bool(true)))
            || matches!(raw.get("snapshot_completed"), Some(Value::String(s)) if s == "true");
        Ok(Self {
            file,
            pos,
            event,
            row,
            gtids,
            server_id,
            ts_sec,
            snapshot,
            snapshot_completed,
            raw,
        })
    }

    /// Refuses an offset taken during a snapshot, which has no binlog position to resume from.
    ///
    /// # Errors
    /// [`RelayError::Argument`] saying so and what to do.
    pub fn check_not_in_snapshot(&self) -> Result<(), RelayError> {
        match &self.snapshot {
            Some(kind) if !self.snapshot_completed => Err(RelayError::Argument(format!(
                "Debezium's offset was written during its {kind} snapshot (\"snapshot\": \
                 {kind:?}, no \"snapshot_completed\": true): the snapshot's rows were read \
                 with SELECT, not from the binlog, and the relay cannot continue a snapshot. \
                 Let the connector finish its snapshot and stream at least one change (its \
                 offset then has no \"snapshot\"), stop it, and run migrate-from again"
            ))),
            _ => Ok(()),
        }
    }

    /// The restart position.
    pub fn position(&self) -> BinlogPosition {
        BinlogPosition::new(self.file.clone(), self.pos)
    }
}

/// A connector's offset key `["<name>",{"server":"<prefix>"}]`: (name, prefix).
///
/// # Errors
/// A description when the key has another shape.
pub fn parse_key(key: &[u8]) -> Result<(String, String), String> {
    let v: Value = serde_json::from_slice(key).map_err(|e| format!("not JSON: {e}"))?;
    let shape = || {
        format!(
            "{} is not [\"<connector>\",{{\"server\":\"<topic.prefix>\"}}]",
            String::from_utf8_lossy(key)
        )
    };
    let Value::Array(a) = v else {
        return Err(shape());
    };
    match a.as_slice() {
        [Value::String(name), Value::Object(partition)] => match partition.get("server") {
            Some(Value::String(server)) if partition.len() == 1 => {
                Ok((name.clone(), server.clone()))
            }
            _ => Err(shape()),
        },
        _ => Err(shape()),
    }
}

/// The offset found, and where.
#[derive(Debug, Clone)]
pub struct FoundOffset {
    /// The connector name of its key.
    pub connector: String,
    /// The `topic.prefix` of its key.
    pub topic_prefix: String,
    /// Where it was read: `topic connect-offsets partition 3 offset 17` or the file.
    pub location: String,
    /// The offset.
    pub offset: DebeziumOffset,
}

/// A value (`None`: deleted) and where it was read.
type OffsetValue = (Option<Vec<u8>>, String);

/// Chooses the last offset of the selected connector among `entries` ((key, value, location)
/// in the order written; the last of a key wins, a `None` value deletes it).
///
/// # Errors
/// [`RelayError::Argument`] when none or several source partitions match, or the last value of
/// the key is a deletion.
pub fn choose(
    entries: impl IntoIterator<Item = OffsetEntry>,
    connector: Option<&str>,
    topic_prefix: Option<&str>,
    described: &str,
) -> Result<FoundOffset, RelayError> {
    // (name, prefix) -> (value, location), in first-seen order.
    let mut last: Vec<((String, String), OffsetValue)> = Vec::new();
    let mut other_names: Vec<String> = Vec::new();
    for (key, value, location) in entries {
        let Ok((name, prefix)) = parse_key(&key) else {
            continue;
        };
        if connector.is_some_and(|c| c != name) || topic_prefix.is_some_and(|p| p != prefix) {
            if !other_names.contains(&name) {
                other_names.push(name);
            }
            continue;
        }
        match last.iter_mut().find(|(k, _)| k.0 == name && k.1 == prefix) {
            Some(slot) => slot.1 = (value, location),
            None => last.push(((name, prefix), (value, location))),
        }
    }
    let wanted = match (connector, topic_prefix) {
        (Some(c), Some(p)) => format!("connector {c:?} with topic.prefix {p:?}"),
        (Some(c), None) => format!("connector {c:?}"),
        (None, Some(p)) => format!("topic.prefix {p:?}"),
        (None, None) => "any connector".into(),
    };
    match last.len() {
        0 => Err(RelayError::Argument(format!(
            "{described} holds no offset of {wanted}{}: check the connector's name (its \
             \"name\") and topic.prefix, and the offsets' location",
            if other_names.is_empty() {
                String::new()
            } else {
                format!(" (it has offsets of {})", other_names.join(", "))
            }
        ))),
        1 => {
            let Some(((name, prefix), (value, location))) = last.pop() else {
                return Err(RelayError::Argument(format!("{described}: no offset")));
            };
            let Some(value) = value else {
                return Err(RelayError::Argument(format!(
                    "the offset of connector {name:?} (topic.prefix {prefix:?}) in \
                     {described} was deleted (its last record, {location}, has a null value): \
                     Debezium would start over with a snapshot, and there is no position to \
                     resume from. Use outbox-relay reset --to … to choose one"
                )));
            };
            Ok(FoundOffset {
                connector: name,
                topic_prefix: prefix,
                location,
                offset: DebeziumOffset::parse(&value)?,
            })
        }
        _ => Err(RelayError::Argument(format!(
            "{described} holds offsets of several source partitions of {wanted}: {}; choose one \
             with --connector and --topic-prefix",
            last.iter()
                .map(|((n, p), _)| format!("{n:?} with topic.prefix {p:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// Reads the offset from `source`.
///
/// # Errors
/// [`RelayError::Argument`] for a file or topic that does not hold a usable offset;
/// [`RelayError::Kafka`] when the topic cannot be read.
pub async fn read_offset(
    config: &RelayConfig,
    source: &OffsetSource,
) -> Result<FoundOffset, RelayError> {
    match source {
        OffsetSource::File {
            path,
            connector,
            topic_prefix,
        } => read_offset_file(path, connector.as_deref(), topic_prefix.as_deref()),
        OffsetSource::Topic {
            topic,
            connector,
            topic_prefix,
        } => {
            let kafka = config.kafka.clone();
            let topic_owned = topic.clone();
            let entries = tokio::task::spawn_blocking(move || read_topic(&kafka, &topic_owned))
                .await
                .map_err(|e| RelayError::Argument(format!("reading {topic}: {e}")))??;
            choose(
                entries,
                Some(connector),
                topic_prefix.as_deref(),
                &format!("offsets topic {topic}"),
            )
        }
    }
}

/// The offset of a `FileOffsetBackingStore` file.
///
/// # Errors
/// [`RelayError::Argument`] when the file cannot be read, is not such a file or holds no
/// usable offset of the selected connector.
pub fn read_offset_file(
    path: &std::path::Path,
    connector: Option<&str>,
    topic_prefix: Option<&str>,
) -> Result<FoundOffset, RelayError> {
    let bytes = std::fs::read(path).map_err(|e| {
        RelayError::Argument(format!(
            "--offset-file {}: {e}: give the offset.storage.file.filename of the stopped \
             Debezium Server or engine",
            path.display()
        ))
    })?;
    let entries = java_stream::read_offset_file(&bytes).map_err(|e| {
        RelayError::Argument(format!(
            "--offset-file {} is not a Kafka Connect FileOffsetBackingStore file: {e}",
            path.display()
        ))
    })?;
    let described = format!("offset file {}", path.display());
    let entries = entries
        .into_iter()
        .enumerate()
        .filter_map(|(i, (k, v))| Some((k?, v, format!("{described}, entry {i}"))));
    choose(entries, connector, topic_prefix, &described)
}

/// Every record of `topic` (key, value, location), partition by partition, in offset order.
fn read_topic(kafka: &KafkaConfig, topic: &str) -> Result<Vec<OffsetEntry>, RelayError> {
    let fail = |what: String| {
        RelayError::Argument(format!(
            "{what} (kafka.bootstrap_servers {}): give the Connect worker's \
             offset.storage.topic as --offsets-topic",
            kafka.bootstrap_servers
        ))
    };
    let reader = Reader::read_committed(
        kafka,
        "outbox-relay.migrate-from",
        true,
        "offsets topic reader",
    )?;
    let md = reader
        .topics(Some(topic), KAFKA_TIMEOUT)
        .map_err(|e| fail(format!("metadata of offsets topic {topic}: {e}")))?;
    let info = md
        .iter()
        .find(|t| t.name == topic)
        .ok_or_else(|| fail(format!("offsets topic {topic} does not exist")))?;
    if let Some(e) = &info.error {
        return Err(fail(format!("offsets topic {topic}: {e}")));
    }
    if info.partitions.is_empty() {
        return Err(fail(format!("offsets topic {topic} has no partitions")));
    }
    let mut out = Vec::new();
    for &p in &info.partitions {
        let (low, high) = reader
            .watermarks(topic, p, KAFKA_TIMEOUT)
            .map_err(|e| fail(format!("offsets of {topic}/{p}: {e}")))?;
        if high <= low {
            continue;
        }
        let mut assignment = Offsets::new();
        assignment
            .add(topic, p, low)
            .map_err(|e| fail(format!("{topic}/{p}: {e}")))?;
        reader
            .assign(&assignment)
            .map_err(|e| fail(format!("reading {topic}/{p}: {e}")))?;
        let deadline = Instant::now() + PARTITION_DEADLINE;
        loop {
            if Instant::now() >= deadline {
                return Err(RelayError::kafka(format!(
                    "reading offsets topic {topic}/{p} ({low}..{high}) took more than {} s",
                    PARTITION_DEADLINE.as_secs()
                )));
            }
            let Some(polled) = reader.poll(Duration::from_millis(200)) else {
                continue;
            };
            let r = match polled {
                Ok(r) => r,
                Err(e) if e.is_partition_eof() => break,
                Err(e) => {
                    return Err(RelayError::kafka(format!(
                        "reading offsets topic {topic}/{p}: {e}"
                    )))
                }
            };
            let done = r.offset >= high - 1;
            if let Some(key) = r.key {
                out.push((
                    key,
                    r.value,
                    format!("topic {topic} partition {p} offset {}", r.offset),
                ));
            }
            if done {
                break;
            }
        }
        let _ = reader.unassign();
    }
    Ok(out)
}

/// Where Debezium's offset puts the relay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    /// The boundary before the transaction at the offset (the checkpoint's position).
    pub position: BinlogPosition,
    /// The GTID state there as the scan found it (MySQL; MariaDB's comes from the server).
    pub scanned_gtid: Option<String>,
    /// Outbox rows of the next transaction Debezium delivered.
    pub rows_acked: u64,
    /// How they were counted.
    pub how: String,
}

/// Finds the checkpoint of `offset` in the server's binlog: the boundary before its
/// transaction and the outbox rows Debezium delivered of it.
///
/// # Errors
/// [`RelayError::Argument`] when no event starts at the offset's position, the transaction has
/// fewer events than `event`, or the offset's shape is not one Debezium writes; dump errors
/// as [`Scanner::open`].
///
/// `layouts` (JSON of `outbox_relay_mysql::decode::schema`) are the outbox tables' column
/// layouts when the server's table maps carry no column names, as the relay takes them at a
/// start from a checkpoint without layouts.
/// MySQL's TRANSACTION_PAYLOAD event (`binlog_transaction_compression=ON`).
const TRANSACTION_PAYLOAD_EVENT: u8 = 40;

/// The refusal of an offset at or inside a compressed transaction.
fn compressed(at: &BinlogPosition, boundary: &BinlogPosition) -> RelayError {
    RelayError::Argument(format!(
        "Debezium's offset {at} is at or inside a compressed transaction \
         (binlog_transaction_compression=ON): Debezium counts the events inside the compressed \
         payload, which this command does not resolve yet. Move the checkpoint to the \
         boundary before it with `outbox-relay reset --config <file> --to {boundary} --yes` \
         instead: rows of that transaction Debezium already sent are then sent again \
         (duplicates, which the inbox drops by event id)"
    ))
}

pub async fn locate(
    config: &RelayConfig,
    flavor: Flavor,
    offset: &DebeziumOffset,
    layouts: Option<std::sync::Arc<str>>,
) -> Result<Located, RelayError> {
    let at = offset.position();
    if offset.event == 0 && offset.row > 0 {
        return Err(RelayError::Argument(format!(
            "Debezium's offset has \"row\": {} without \"event\": Debezium writes rows to skip \
             only inside a transaction, after its first event; not an offset of the MySQL or \
             MariaDB connector",
            offset.row
        )));
    }
    let mut scanner = Scanner::open(
        config,
        flavor,
        &StartFrom::Position(BinlogPosition::new(at.file.clone(), 4)),
    )
    .await?
    .with_outbox_tables(config.table_mappings()?, layouts);
    let mut boundary = (BinlogPosition::new(at.file.clone(), 4), None::<String>);
    let mut gtid: Option<String> = None;
    // Outbox rows between the last boundary and the offset's position: delivered, when the
    // position lies inside a transaction (the connector resumes there, after them).
    let mut rows_before = 0u64;
    let inconsistent = |why: String| {
        RelayError::Argument(format!(
            "Debezium's offset {at} (event {}, row {}) does not fit this server's binlog: {why}. \
             Is mysql.url the server (or a copy of its binlog) the connector read?",
            offset.event, offset.row
        ))
    };
    // Up to the offset's position: the last boundary before it.
    if at.pos > 4 {
        loop {
            let s = scanner.next().await?;
            let h = s.event.event.header();
            let raw = h.event_type_raw();
            if raw == HEARTBEAT_EVENT || h.log_pos() == 0 {
                continue;
            }
            if raw == EventType::PREVIOUS_GTIDS_EVENT as u8 {
                gtid = MysqlGtidSet::from_previous_gtids_event(&s.event.event)
                    .ok()
                    .map(|g| g.to_string());
            }
            if let Some(b) = &s.boundary {
                gtid.clone_from(&b.gtid_set);
            }
            let end = &s.event.position;
            if raw == TRANSACTION_PAYLOAD_EVENT && end.pos >= at.pos {
                return Err(compressed(&at, &boundary.0));
            }
            if end.file != at.file {
                return Err(inconsistent(format!(
                    "the file {} ends before position {}",
                    at.file, at.pos
                )));
            }
            if s.inside {
                rows_before += u64::try_from(s.rows.len()).unwrap_or(u64::MAX);
            } else {
                boundary = (end.clone(), gtid.clone());
                rows_before = 0;
            }
            if end.pos == at.pos {
                break;
            }
            if end.pos > at.pos {
                return Err(inconsistent(format!(
                    "no event starts there (an event ends at {end})"
                )));
            }
        }
    }
    let (position, scanned_gtid) = boundary;
    let scanned_gtid = scanned_gtid.filter(|g| !g.is_empty());
    if offset.event == 0 {
        let at_boundary = at.pos == 4 || position == at;
        return Ok(Located {
            position,
            scanned_gtid,
            rows_acked: rows_before,
            how: if at_boundary {
                "a transaction boundary (no \"event\"/\"row\"): nothing of the next transaction \
                 was delivered"
                    .into()
            } else if rows_before > 0 {
                format!(
                    "inside a transaction (no \"event\"/\"row\"): the connector resumes there, \
                     so its {rows_before} outbox row(s) before that point were delivered"
                )
            } else {
                "before a transaction's first event (no \"event\"/\"row\"): nothing of it was \
                 delivered"
                    .into()
            },
        });
    }
    // From the offset's position: the transaction's events, the first one counted as event 0
    // (outbox rows of the same transaction before the position were delivered too).
    let mut rows = rows_before;
    let mut index = 0u64;
    loop {
        let s = scanner.next().await?;
        let h = s.event.event.header();
        let raw = h.event_type_raw();
        if raw == HEARTBEAT_EVENT
            || (h.log_pos() == 0
                && (raw == EventType::ROTATE_EVENT as u8
                    || raw == EventType::FORMAT_DESCRIPTION_EVENT as u8))
        {
            continue;
        }
        if index == 0 && raw == TRANSACTION_PAYLOAD_EVENT {
            return Err(compressed(&at, &position));
        }
        if index == 0 && !s.inside {
            return Err(inconsistent(format!(
                "the event there (type {raw}) does not begin a transaction"
            )));
        }
        let n = u64::try_from(s.rows.len()).unwrap_or(u64::MAX);
        if index < offset.event {
            if s.boundary.is_some() {
                return Err(inconsistent(format!(
                    "its transaction ends after {} events, Debezium's offset says {} were \
                     handled before the point where it stopped",
                    index + 1,
                    offset.event
                )));
            }
            rows += n;
            index += 1;
            continue;
        }
        let in_next = n.min(offset.row);
        let in_events = rows;
        rows += in_next;
        return Ok(Located {
            position,
            scanned_gtid,
            rows_acked: rows,
            how: format!(
                "inside the transaction starting at {at}: Debezium delivered {rows} of its \
                 outbox row(s): {in_events} in its first {} event(s) and {in_next} of the \
                 next event's rows",
                offset.event
            ),
        });
    }
}

/// What `migrate-from debezium` does (or would do).
#[derive(Debug, Clone)]
pub struct MigrateReport {
    /// The offset read.
    pub found: FoundOffset,
    /// `connector_name` of the relay.
    pub connector: String,
    /// The checkpoint table.
    pub table: TableName,
    /// The relay's row before, if any.
    pub before: Option<StateRow>,
    /// The checkpoint written (or to write).
    pub checkpoint: Checkpoint,
    /// How it was found.
    pub how: String,
    /// Warnings (server id differs, …).
    pub warnings: Vec<String>,
    /// `true` when written.
    pub applied: bool,
    /// `true` for `--dry-run`.
    pub dry_run: bool,
    /// The lease token of the write.
    pub lease_token: Option<u64>,
}

/// Reads Debezium's offset from `source`, converts it to the relay's checkpoint and, with
/// `yes` (and not `dry_run`), writes it as `reset` does.
///
/// # Errors
/// [`RelayError::Argument`] for an unusable offset (snapshot, purged or unknown binlog file,
/// not fitting the binlog, GTIDs the server does not have); [`RelayError::Prerequisite`] while a
/// relay holds the lease or without the checkpoint table; [`RelayError::Mysql`] /
/// [`RelayError::Kafka`] otherwise.
pub async fn migrate_from(
    config: &RelayConfig,
    source: &OffsetSource,
    dry_run: bool,
    yes: bool,
) -> Result<MigrateReport, RelayError> {
    let found = read_offset(config, source).await?;
    let offset = &found.offset;
    offset.check_not_in_snapshot()?;
    let table = config.checkpoint_table()?;
    let connector = config.connector_name.clone();
    let pool = Pool::new(super::opts(config)?);
    let store = MysqlCheckpointStore::new(pool.clone(), table.clone(), connector.clone());
    store.verify().await?;
    let mut conn = super::connect(config).await?;
    let server = preflight::server_identity(&mut conn).await?;
    if let Some(holder) = lease_holder(&mut conn, &table, &connector).await? {
        return Err(super::reset::lease_held(config, &mut conn, &table, Some(holder)).await);
    }
    let mut warnings = Vec::new();
    // The binlog file must still be there.
    let logs = binary_logs(&mut conn).await?;
    let available = match (logs.first(), logs.last()) {
        (Some((f, _)), Some((l, s))) => format!("{f}:4 to {l}:{s}"),
        _ => "no binlog files".into(),
    };
    match logs.iter().find(|(f, _)| *f == offset.file) {
        None => {
            let older = logs.first().is_some_and(|(f, _)| offset.file < *f);
            return Err(RelayError::Argument(format!(
                "Debezium's offset is at {}:{}, but the server no longer has (or never had) \
                 binlog file {:?} (it has {available}){}. The relay cannot start where Debezium \
                 stopped without a gap: either point mysql.url at the server Debezium read, or \
                 accept the gap with outbox-relay reset --to earliest and re-send what is \
                 missing with outbox-relay republish",
                offset.file,
                offset.pos,
                offset.file,
                if older {
                    ": purged (Debezium was stopped longer than the binlog retention, \
                     binlog_expire_logs_seconds / expire_logs_days)"
                } else {
                    ""
                }
            )));
        }
        Some((_, size)) if offset.pos > *size || offset.pos < 4 => {
            return Err(RelayError::Argument(format!(
                "Debezium's offset {}:{} is outside that file (its size is {size} bytes): not \
                 this server's binlog, or the binlog history was reset (RESET MASTER)",
                offset.file, offset.pos
            )));
        }
        Some(_) => {}
    }
    if let Some(id) = offset.server_id {
        if id != u64::from(server.server_id) {
            warnings.push(format!(
                "Debezium's offset has server_id {id} (the originating server of the last event \
                 it read), this server's @@server_id is {}: expected on a replica or after a \
                 failover, otherwise check that mysql.url is the server Debezium read",
                server.server_id
            ));
        }
    }
    if let (Some(g), Flavor::MySql) = (&offset.gtids, server.flavor) {
        check_mysql_gtids(&mut conn, g).await?;
    }
    // Without column names in the table maps, rows decode with the tables' current layouts
    // (as the relay's start from this checkpoint does); a row that fails to decode still
    // counts as one row.
    let layouts = if server.row_metadata_full {
        None
    } else {
        let tables: Vec<TableName> = config
            .table_mappings()?
            .iter()
            .map(|m| (*m.table).clone())
            .collect();
        preflight::current_layouts(&mut conn, &tables)
            .await
            .ok()
            .flatten()
    };
    let lease = if yes && !dry_run {
        Some(super::reset::take_lease(config, &mut conn, &table, "migrate-from").await?)
    } else {
        None
    };
    let before = match read_state_row(&mut conn, &table, &connector).await {
        Ok(b) => b,
        Err(e) => {
            if let Some(l) = lease {
                l.release().await;
            }
            return Err(e);
        }
    };
    let located = match locate(config, server.flavor, offset, layouts).await {
        Ok(l) => l,
        Err(e) => {
            if let Some(l) = lease {
                l.release().await;
            }
            return Err(e);
        }
    };
    let gtid_set = match server
        .flavor
        .gtid_at(&mut conn, &located.position, located.scanned_gtid.clone())
        .await
    {
        Ok(g) => g,
        Err(e) => {
            if let Some(l) = lease {
                l.release().await;
            }
            return Err(e.into());
        }
    };
    if let (Some(theirs), Some(ours)) = (&offset.gtids, &gtid_set) {
        let same = match (
            server.flavor.parse_gtid_state(theirs),
            server.flavor.parse_gtid_state(ours),
        ) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        };
        if !same {
            warnings.push(format!(
                "Debezium's \"gtids\" {theirs} differ from the server's GTID state at the \
                 checkpoint ({ours}): expected when Debezium filtered GTID sources \
                 (gtid.source.includes/excludes); otherwise check that mysql.url is the server \
                 Debezium read"
            ));
        }
    }
    let checkpoint = Checkpoint {
        position: located.position.clone(),
        rows_acked: located.rows_acked,
        gtid_set,
        source_server_id: server.server_id,
        source_server_uuid: server.server_uuid.clone(),
        // As reset: the relay takes the layouts from information_schema at its next start
        // when the table maps carry no column names.
        table_layouts: None,
    };
    let mut report = MigrateReport {
        found: found.clone(),
        connector,
        table,
        before,
        checkpoint,
        how: located.how,
        warnings,
        applied: false,
        dry_run,
        lease_token: None,
    };
    if let Some(lease) = lease {
        let token = super::reset::write_point(config, &store, lease, &report.checkpoint).await?;
        report.applied = true;
        report.lease_token = Some(token);
    }
    let _ = conn.disconnect().await;
    let _ = pool.disconnect().await;
    Ok(report)
}

/// MySQL: Debezium's `gtids` must be transactions this server executed, else it read another
/// server (or another history).
async fn check_mysql_gtids(conn: &mut mysql_async::Conn, gtids: &str) -> Result<(), RelayError> {
    let Ok(theirs) = gtids.parse::<MysqlGtidSet>() else {
        return Err(RelayError::Argument(format!(
            "Debezium's offset has \"gtids\": {gtids:?}, not a MySQL GTID set: an offset of \
             the MariaDB connector? mysql.url is a MySQL server"
        )));
    };
    let executed: Option<String> =
        mysql_async::prelude::Queryable::query_first(conn, "SELECT @@GLOBAL.gtid_executed").await?;
    let Some(ours) = executed.and_then(|e| e.replace('\n', "").parse::<MysqlGtidSet>().ok()) else {
        return Ok(());
    };
    if ours.union(&theirs) != ours {
        return Err(RelayError::Argument(format!(
            "Debezium's offset has \"gtids\": {theirs}, which this server has not all executed \
             (gtid_executed {ours}): the connector read another server or history. Point \
             mysql.url at the server Debezium read"
        )));
    }
    Ok(())
}

impl fmt::Display for MigrateReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.found.offset;
        writeln!(
            f,
            "debezium    connector {:?}, topic.prefix {:?} ({})",
            self.found.connector, self.found.topic_prefix, self.found.location
        )?;
        writeln!(f, "offset      {}", o.raw)?;
        writeln!(
            f,
            "            file {} pos {} event {} row {} gtids {} server_id {}{}",
            o.file,
            o.pos,
            o.event,
            o.row,
            o.gtids.as_deref().unwrap_or("none"),
            o.server_id.map_or_else(|| "none".into(), |s| s.to_string()),
            o.ts_sec
                .map(|t| format!(" (last event at {})", super::format_utc(t)))
                .unwrap_or_default()
        )?;
        writeln!(f, "resolves    {}", self.how)?;
        writeln!(
            f,
            "connector   {} (checkpoint table {})",
            self.connector, self.table
        )?;
        match self.before.as_ref().and_then(|r| r.checkpoint.as_ref()) {
            Some(c) => writeln!(
                f,
                "current     {} (rows_acked {}, gtid {})",
                c.position,
                c.rows_acked,
                c.gtid_set.as_deref().unwrap_or("none")
            )?,
            None => writeln!(f, "current     none")?,
        }
        let c = &self.checkpoint;
        writeln!(
            f,
            "checkpoint  {} (rows_acked {}, gtid {}, source_server_id {})",
            c.position,
            c.rows_acked,
            c.gtid_set.as_deref().unwrap_or("none"),
            c.source_server_id
        )?;
        for w in &self.warnings {
            writeln!(f, "warning     {w}")?;
        }
        if self.applied {
            writeln!(
                f,
                "done        checkpoint written under lease token {}",
                self.lease_token.unwrap_or(0)
            )?;
            write!(
                f,
                "next        start the relay (outbox-relay run --config …); keep the Debezium \
                 connector stopped"
            )
        } else if self.dry_run {
            write!(
                f,
                "dry run     nothing written: run again with --yes (without --dry-run) to write it"
            )
        } else {
            write!(
                f,
                "not applied nothing written: run again with --yes to write it"
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: &str, value: Option<&str>, at: &str) -> (Vec<u8>, Option<Vec<u8>>, String) {
        (
            key.as_bytes().to_vec(),
            value.map(|v| v.as_bytes().to_vec()),
            at.into(),
        )
    }

    #[test]
    fn offsets_parse_with_defaults_and_string_numbers() {
        let o = DebeziumOffset::parse(
            br#"{"ts_sec":1767323045,"file":"binlog.000003","pos":1234,"gtids":"3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5","row":1,"event":2,"server_id":1,"transaction_id":null}"#,
        )
        .expect("offset");
        assert_eq!(o.position(), BinlogPosition::new("binlog.000003", 1234));
        assert_eq!((o.event, o.row, o.server_id), (2, 1, Some(1)));
        assert_eq!(o.ts_sec, Some(1_767_323_045));
        assert!(o.check_not_in_snapshot().is_ok());
        let o =
            DebeziumOffset::parse(br#"{"file":"mariadb-bin.000001","pos":"4"}"#).expect("offset");
        assert_eq!((o.pos, o.event, o.row, o.gtids), (4, 0, 0, None));
        for bad in [
            &br#"{"pos":4}"#[..],
            br#"{"file":"x","pos":-1}"#,
            br#"[1]"#,
            b"nope",
        ] {
            let e = DebeziumOffset::parse(bad).expect_err("bad").to_string();
            assert!(e.contains("not a MySQL/MariaDB connector offset"), "{e}");
        }
    }

    #[test]
    fn snapshot_offsets_are_refused_until_completed() {
        let during = DebeziumOffset::parse(
            br#"{"file":"binlog.000002","pos":157,"snapshot":"INITIAL","snapshot_completed":false}"#,
        )
        .expect("offset");
        let e = during.check_not_in_snapshot().expect_err("snapshot");
        assert!(e.to_string().contains("during its INITIAL snapshot"), "{e}");
        let old = DebeziumOffset::parse(br#"{"file":"binlog.000002","pos":157,"snapshot":true}"#)
            .expect("offset");
        assert!(old.check_not_in_snapshot().is_err());
        let done = DebeziumOffset::parse(
            br#"{"file":"binlog.000002","pos":157,"snapshot":"INITIAL","snapshot_completed":true}"#,
        )
        .expect("offset");
        assert!(done.check_not_in_snapshot().is_ok());
    }

    #[test]
    fn the_last_record_of_the_key_wins_and_null_deletes() {
        let k = r#"["orders",{"server":"shop"}]"#;
        let chosen = choose(
            vec![
                entry(k, Some(r#"{"file":"b.000001","pos":100}"#), "p0 o1"),
                entry(r#"["other",{"server":"x"}]"#, Some("{}"), "p0 o2"),
                entry(
                    k,
                    Some(r#"{"file":"b.000001","pos":200,"event":3}"#),
                    "p0 o3",
                ),
                entry("not json", Some("{}"), "p0 o4"),
            ],
            Some("orders"),
            None,
            "t",
        )
        .expect("found");
        assert_eq!((chosen.offset.pos, chosen.offset.event), (200, 3));
        assert_eq!(chosen.location, "p0 o3");
        assert_eq!(chosen.topic_prefix, "shop");
        let e = choose(
            vec![
                entry(k, Some(r#"{"file":"b.000001","pos":100}"#), "p0 o1"),
                entry(k, None, "p0 o2"),
            ],
            Some("orders"),
            None,
            "t",
        )
        .expect_err("deleted");
        assert!(e.to_string().contains("was deleted"), "{e}");
        let e =
            choose(vec![entry(k, Some("{}"), "a")], Some("payments"), None, "t").expect_err("none");
        assert!(e.to_string().contains("it has offsets of orders"), "{e}");
        let two = vec![
            entry(k, Some(r#"{"file":"b.000001","pos":1}"#), "a"),
            entry(
                r#"["orders",{"server":"shop2"}]"#,
                Some(r#"{"file":"b.000001","pos":2}"#),
                "b",
            ),
        ];
        let e = choose(two.clone(), Some("orders"), None, "t").expect_err("several");
        assert!(e.to_string().contains("--topic-prefix"), "{e}");
        let one = choose(two, Some("orders"), Some("shop2"), "t").expect("one");
        assert_eq!(one.offset.pos, 2);
    }

    /// `testdata/debezium-offsets.dat`: written by Kafka Connect's FileOffsetBackingStore
    /// (testdata/README.md).
    #[test]
    fn reads_an_offset_file_written_by_kafka_connect() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata")
            .join("debezium-offsets.dat");
        let found = read_offset_file(&path, Some("inventory-engine"), None).expect("found");
        assert_eq!(found.topic_prefix, "shop");
        let o = &found.offset;
        assert_eq!(
            (o.file.as_str(), o.pos, o.event, o.row, o.server_id),
            ("binlog.000003", 1234, 2, 1, Some(1))
        );
        assert_eq!(
            o.gtids.as_deref(),
            Some("3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5")
        );
        let e = read_offset_file(&path, Some("old-engine"), None).expect_err("deleted");
        assert!(e.to_string().contains("was deleted"), "{e}");
        let e = read_offset_file(&path, None, None).expect_err("two engines");
        assert!(e.to_string().contains("several source partitions"), "{e}");
    }

    #[test]
    fn keys_parse_in_connects_form() {
        assert_eq!(
            parse_key(br#"["inventory-connector",{"server":"dbserver1"}]"#),
            Ok(("inventory-connector".into(), "dbserver1".into()))
        );
        assert_eq!(
            parse_key(br#"[ "a" , { "server" : "b" } ]"#),
            Ok(("a".into(), "b".into()))
        );
        for bad in [&br#"["a"]"#[..], br#"["a",{"server":1}]"#, br#"{"a":1}"#] {
            assert!(parse_key(bad).is_err());
        }
    }

    #[test]
    fn an_offset_file_is_read_through_the_java_stream_reader() {
        let file = java_stream::tests::write_offset_file(&[
            (
                Some(br#"["engine",{"server":"shop"}]"#.to_vec()),
                Some(br#"{"file":"binlog.000002","pos":900,"event":4,"row":2}"#.to_vec()),
            ),
            (Some(b"[\"other\",{\"server\":\"x\"}]".to_vec()), None),
        ]);
        let dir = std::env::temp_dir().join(format!("dbz-offsets-{}", std::process::id()));
        std::fs::write(&dir, &file).expect("write");
        let found = read_offset_file(&dir, Some("engine"), None).expect("found");
        let _ = std::fs::remove_file(&dir);
        assert_eq!(
            (found.offset.pos, found.offset.event, found.offset.row),
            (900, 4, 2)
        );
    }
}
