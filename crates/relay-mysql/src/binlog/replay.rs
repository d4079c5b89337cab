//! Replay: binlog files read from disk (a backup, an archive, a server's binlog directory) go
//! through the same decode → route → sink path as the live relay, for a range of whole
//! transactions. A replay connects to no MySQL server, takes no lease and writes no checkpoint,
//! so it never moves the live connector's position.
//!
//! # Two passes
//! 1. [`plan`] reads the files in the order given, frame by frame, before anything is produced:
//!    each event's header must fit the file (a truncated file is an error naming the file and
//!    the position), its `log_pos` must be its end (or 0 inside an event group of a MariaDB
//!    11.4+ file: `binlog_legacy_event_pos=OFF`), and its CRC32 must match when the format
//!    description event says the file carries checksums (MySQL Internals "Binlog Event Header",
//!    "Binlog Checksums"). It finds the transactions and selects the range.
//! 2. [`ReplaySource`] reads the selected byte range of each file through
//!    [`BinlogFileSource`] (the relay's reader for binlog files) and yields its events to the
//!    pipeline; each file is read only up to the end of the range, so bytes after it (the end of
//!    a file still being written) are never looked at.
//!
//! # Transactions and the range
//! A transaction starts at its GTID event (MySQL GTID, anonymous GTID or tagged GTID; MariaDB
//! GTID), or at `BEGIN` or a statement outside one, and ends after its XID event, `COMMIT`
//! (`ROLLBACK`, `XA COMMIT`, `XA ROLLBACK`), XA PREPARE event, TRANSACTION_PAYLOAD event (MySQL
//! compressed transaction) or, for a statement outside a transaction (DDL), after that
//! statement. Its time is the timestamp of its last event (when it committed), in seconds, UTC.
//!
//! The selection is the run of consecutive transactions that
//! - start at or after `--start-position` in the first file (which must be the start of an
//!   event outside any transaction, such as a position `SHOW MASTER STATUS` printed, an
//!   `End_log_pos` of an XID event, or 4; anything else is refused),
//! - begins with the first transaction that committed at or after `--start-datetime`,
//! - ends with the last transaction that ends at or before `--stop-position` in the last file,
//!   and before the first transaction that committed after `--stop-datetime`.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use mysql_async::binlog::events::TableMapEvent;
use mysql_async::binlog::events::{Event, EventData, FormatDescriptionEvent};
use mysql_async::binlog::{BinlogChecksumAlg, BinlogVersion};

use crate::binlog::source::{BinlogFileSource, SourceEvent};
use outbox_relay_core::error::RelayError;
use outbox_relay_core::position::BinlogPosition;

/// The format `--start-datetime` and `--stop-datetime` take (UTC).
pub const DATETIME_FORMAT: &str = "%Y-%m-%d %H:%M:%S";

/// Which transactions of the files to replay. Every bound is optional; none selects every
/// whole transaction of the files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayRange {
    /// Byte position in the first file where the replay starts: the start of an event outside
    /// any transaction (4 is the first event of a file).
    pub start_position: Option<u64>,
    /// Byte position in the last file: the replay ends with the last transaction that ends at
    /// or before it.
    pub stop_position: Option<u64>,
    /// Seconds since the Unix epoch: the replay begins with the first transaction that
    /// committed at or after it.
    pub start_datetime: Option<i64>,
    /// Seconds since the Unix epoch: the replay ends before the first transaction that
    /// committed after it.
    pub stop_datetime: Option<i64>,
}

/// Parses `YYYY-MM-DD HH:MM:SS` (UTC) into seconds since the Unix epoch.
///
/// # Errors
/// A message naming the expected format.
pub fn parse_datetime(text: &str) -> Result<i64, String> {
    chrono::NaiveDateTime::parse_from_str(text.trim(), DATETIME_FORMAT)
        .map(|t| t.and_utc().timestamp())
        .map_err(|e| {
            format!("{text:?} is not a date-time of the form \"YYYY-MM-DD HH:MM:SS\" (UTC): {e}")
        })
}

fn format_datetime(secs: i64) -> String {
    chrono::DateTime::from_timestamp(secs, 0)
        .map(|t| t.format(DATETIME_FORMAT).to_string())
        .unwrap_or_else(|| secs.to_string())
}

/// The bytes of one file to read: events that start at or after `from` and end at or before
/// `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSlice {
    /// The file.
    pub path: PathBuf,
    /// Its name (the binlog file name in positions, dead letters and logs).
    pub name: String,
    /// First byte: the start of the first event to yield.
    pub from: u64,
    /// End of the last event to read.
    pub to: u64,
}

/// What a replay reads: the selected transactions, as byte ranges of the files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayPlan {
    /// Byte ranges to read, in order (empty when no whole transaction is selected).
    pub slices: Vec<FileSlice>,
    /// Whole transactions selected.
    pub transactions: u64,
    /// Start of the first selected transaction.
    pub first: Option<BinlogPosition>,
    /// End of the last selected transaction.
    pub last: Option<BinlogPosition>,
}

/// What a replay did, for its summary line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplaySummary {
    /// Files given.
    pub files: usize,
    /// Binlog events passed to the decoder.
    pub events: u64,
    /// Whole transactions selected by the range.
    pub transactions: u64,
    /// Records produced and acknowledged by Kafka (dead letters not counted).
    pub records: u64,
    /// Rows sent to the dead-letter topic.
    pub dead_lettered: u64,
    /// End of the last transaction whose records (and all before) Kafka acknowledged; `None`
    /// when no transaction was passed.
    pub last_position: Option<BinlogPosition>,
    /// Outbox rows after `last_position` that were acknowledged too (a replay stopped by a
    /// signal inside a transaction).
    pub rows_after_last_position: u64,
    /// `false` when a stop request ended the replay before the end of the range.
    pub complete: bool,
}

// Event type codes (MySQL Internals "Binlog Event Type"; MariaDB KB "Replication Protocol").
const STOP_EVENT: u8 = 3;
const ROTATE_EVENT: u8 = 4;
const QUERY_EVENT: u8 = 2;
const FORMAT_DESCRIPTION_EVENT: u8 = 15;
const XID_EVENT: u8 = 16;
const INCIDENT_EVENT: u8 = 26;
const HEARTBEAT_EVENT: u8 = 27;
const GTID_EVENT: u8 = 33;
const ANONYMOUS_GTID_EVENT: u8 = 34;
const PREVIOUS_GTIDS_EVENT: u8 = 35;
const XA_PREPARE_EVENT: u8 = 38;
const TRANSACTION_PAYLOAD_EVENT: u8 = 40;
const HEARTBEAT_EVENT_V2: u8 = 41;
const GTID_TAGGED_EVENT: u8 = 42;
const MARIADB_BINLOG_CHECKPOINT_EVENT: u8 = 161;
const MARIADB_GTID_EVENT: u8 = 162;
const MARIADB_GTID_LIST_EVENT: u8 = 163;
const MARIADB_START_ENCRYPTION_EVENT: u8 = 164;
/// Format description event flag (low byte of the header's flags): the file is open.
const LOG_EVENT_BINLOG_IN_USE_F: u8 = 0x1;
/// MariaDB GTID event flags2: the group is a single statement without BEGIN/COMMIT.
const FL_STANDALONE: u8 = 1;

/// Length of an event header (binlog v4).
const HEADER_LEN: u64 = 19;
/// Smallest format description event body: binlog version (2), server version (50), create
/// time (4), header length (1).
const MIN_FDE_BODY: u64 = 57;
const MAGIC: [u8; 4] = [0xfe, b'b', b'i', b'n'];

/// One event's frame as read from the file.
#[derive(Debug)]
struct Frame {
    start: u64,
    end: u64,
    event_type: u8,
    timestamp: u32,
    /// The statement of a QUERY event.
    query: Option<String>,
    /// flags2 of a MariaDB GTID event.
    gtid_flags: u8,
}

/// Reads a binlog file event by event, checking each frame.
struct FrameReader {
    path: PathBuf,
    reader: BufReader<File>,
    offset: u64,
    len: u64,
    fde: FormatDescriptionEvent<'static>,
    crc32: bool,
}

impl FrameReader {
    /// Opens `path` and checks that it is a binlog file.
    ///
    /// # Errors
    /// [`RelayError::Argument`] naming the file when it does not exist, cannot be read or does
    /// not start with the binlog magic bytes.
    fn open(path: &Path) -> Result<Self, RelayError> {
        let arg = |why: String| RelayError::Argument(format!("--binlog {}: {why}", path.display()));
        let file = File::open(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => arg("no such file".into()),
            _ => arg(format!("cannot open the file: {e}")),
        })?;
        let meta = file
            .metadata()
            .map_err(|e| arg(format!("cannot read the file: {e}")))?;
        if meta.is_dir() {
            return Err(arg("is a directory, not a binlog file".into()));
        }
        let len = meta.len();
        let mut reader = BufReader::new(file);
        let mut magic = [0u8; 4];
        let not_binlog = || {
            arg(format!(
                "not a binlog file: it does not start with the binlog magic bytes fe 62 69 6e \
                 ({len} bytes long). Give files of the server's binlog directory (@@log_bin_basename), \
                 such as mysql-bin.000042"
            ))
        };
        if len < 4 {
            return Err(not_binlog());
        }
        reader
            .read_exact(&mut magic)
            .map_err(|e| arg(format!("cannot read the file: {e}")))?;
        if magic != MAGIC {
            return Err(not_binlog());
        }
        Ok(Self {
            path: path.to_owned(),
            reader,
            offset: 4,
            len,
            fde: FormatDescriptionEvent::new(BinlogVersion::Version4),
            crc32: false,
        })
    }

    fn corrupt(&self, at: u64, why: impl std::fmt::Display) -> RelayError {
        RelayError::binlog(format!(
            "binlog file {} is damaged at position {at}: {why}",
            self.path.display()
        ))
    }

    fn truncated(&self, at: u64, why: impl std::fmt::Display) -> RelayError {
        RelayError::binlog(format!(
            "binlog file {} is truncated at position {at}: {why}. Use a complete copy of the file \
             (or --stop-position at or before {at})",
            self.path.display()
        ))
    }

    /// Start of the next event (the end of the file after the last one).
    fn offset(&self) -> u64 {
        self.offset
    }

    /// The next event's frame, `None` at the end of the file.
    fn next(&mut self) -> Result<Option<Frame>, RelayError> {
        let start = self.offset;
        if start == self.len {
            return Ok(None);
        }
        let io = |e: std::io::Error| {
            RelayError::binlog(format!(
                "cannot read binlog file {} at position {start}: {e}",
                self.path.display()
            ))
        };
        let left = self.len - start;
        if left < HEADER_LEN {
            return Err(self.truncated(
                start,
                format!("an event header takes {HEADER_LEN} bytes, the file has {left} more"),
            ));
        }
        let mut header = [0u8; HEADER_LEN as usize];
        self.reader.read_exact(&mut header).map_err(io)?;
        let u32_at =
            |i: usize| u32::from_le_bytes([header[i], header[i + 1], header[i + 2], header[i + 3]]);
        let timestamp = u32_at(0);
        let event_type = header[4];
        let size = u64::from(u32_at(9));
        let log_pos = u64::from(u32_at(13));
        if start == 4 && event_type != FORMAT_DESCRIPTION_EVENT {
            return Err(self.corrupt(
                start,
                format!(
                    "the first event is of type {event_type}, not a format description event \
                     (binlog files of MySQL 5.0+ and MariaDB start with one)"
                ),
            ));
        }
        let min = HEADER_LEN
            + if event_type == FORMAT_DESCRIPTION_EVENT {
                MIN_FDE_BODY
            } else if self.crc32 {
                4
            } else {
                0
            };
        if size < min {
            return Err(self.corrupt(
                start,
                format!("the event there (type {event_type}) claims a size of {size} bytes"),
            ));
        }
        let end = start + size;
        // Positions are 32-bit in the header. MariaDB 11.4+ (`binlog_legacy_event_pos=OFF`, its
        // default) writes 0 for the events inside an event group; the frame's end is known
        // anyway (events are contiguous).
        let unpositioned = log_pos == 0
            && event_type != FORMAT_DESCRIPTION_EVENT
            && self.fde.server_version().contains("MariaDB");
        if log_pos != end & u64::from(u32::MAX) && !unpositioned {
            return Err(self.corrupt(
                start,
                format!(
                    "the event there (type {event_type}, {size} bytes) says it ends at {log_pos}, \
                     not {end} (not a binlog file of this format, or a relay log)"
                ),
            ));
        }
        if size > left {
            return Err(self.truncated(
                start,
                format!(
                    "the event there (type {event_type}) is {size} bytes long, the file has {left} \
                     more"
                ),
            ));
        }
        let mut bytes =
            vec![0u8; usize::try_from(size).map_err(|_| self.corrupt(start, "event too large"))?];
        bytes[..header.len()].copy_from_slice(&header);
        self.reader
            .read_exact(&mut bytes[header.len()..])
            .map_err(io)?;
        let mut frame = Frame {
            start,
            end,
            event_type,
            timestamp,
            query: None,
            gtid_flags: 0,
        };
        if event_type == FORMAT_DESCRIPTION_EVENT {
            let default = FormatDescriptionEvent::new(BinlogVersion::Version4);
            let fde = Event::read(&default, &bytes[..])
                .and_then(|e| {
                    let fde = e.read_event::<FormatDescriptionEvent<'_>>()?;
                    Ok(fde.into_owned().with_footer(e.footer()))
                })
                .map_err(|e| {
                    self.corrupt(start, format!("unreadable format description event: {e}"))
                })?;
            self.crc32 = matches!(
                fde.footer().get_checksum_alg(),
                Ok(Some(BinlogChecksumAlg::BINLOG_CHECKSUM_ALG_CRC32))
            );
            self.fde = fde;
        }
        if self.crc32 {
            let (body, sum) = bytes.split_at(bytes.len() - 4);
            let mut hasher = crc32fast::Hasher::new();
            if event_type == FORMAT_DESCRIPTION_EVENT {
                // The server sets LOG_EVENT_BINLOG_IN_USE_F in the file's format description
                // event while the file is open and clears it at close without updating the
                // checksum, which is computed with the flag clear.
                let mut head = header;
                head[17] &= !LOG_EVENT_BINLOG_IN_USE_F;
                hasher.update(&head);
                hasher.update(&body[header.len()..]);
            } else {
                hasher.update(body);
            }
            if hasher.finalize().to_le_bytes() != sum {
                return Err(self.corrupt(
                    start,
                    format!(
                        "the CRC32 checksum of the event there (type {event_type}) does not match"
                    ),
                ));
            }
        }
        match event_type {
            QUERY_EVENT => {
                let event = Event::read(&self.fde, &bytes[..])
                    .map_err(|e| self.corrupt(start, format!("unreadable QUERY event: {e}")))?;
                match event.read_data() {
                    Ok(Some(EventData::QueryEvent(q))) => {
                        frame.query = Some(q.query().into_owned());
                    }
                    Ok(_) => {}
                    Err(e) => {
                        return Err(self.corrupt(start, format!("unreadable QUERY event: {e}")))
                    }
                }
            }
            MARIADB_GTID_EVENT => {
                // seq_no u64, domain_id u32, flags2 u8.
                frame.gtid_flags =
                    bytes
                        .get(HEADER_LEN as usize + 12)
                        .copied()
                        .ok_or_else(|| {
                            self.corrupt(start, "the MariaDB GTID event there is too short")
                        })?;
            }
            _ => {}
        }
        self.offset = end;
        Ok(Some(frame))
    }
}

/// A whole transaction: from the start of its first event to the end of its last, and when it
/// committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tx {
    start: u64,
    end: u64,
    timestamp: u32,
}

/// Finds transactions in a sequence of event frames.
#[derive(Debug, Default)]
struct TxTracker {
    /// Start of the open transaction.
    start: Option<u64>,
    /// Inside BEGIN … COMMIT (or a MariaDB non-standalone GTID group).
    in_block: bool,
    /// MariaDB standalone group: ends after its statement.
    standalone: bool,
}

impl TxTracker {
    /// Start of the transaction the next event would be part of, if one is open.
    fn open_since(&self) -> Option<u64> {
        self.start
    }

    /// Takes the next event; returns the transaction it ends.
    fn feed(&mut self, f: &Frame) -> Option<Tx> {
        match f.event_type {
            MARIADB_GTID_EVENT => {
                let standalone = f.gtid_flags & FL_STANDALONE != 0;
                *self = Self {
                    start: Some(f.start),
                    in_block: !standalone,
                    standalone,
                };
                None
            }
            GTID_EVENT | ANONYMOUS_GTID_EVENT | GTID_TAGGED_EVENT => {
                *self = Self {
                    start: Some(f.start),
                    ..Self::default()
                };
                None
            }
            QUERY_EVENT => {
                self.start.get_or_insert(f.start);
                let stmt = f.query.as_deref().unwrap_or_default();
                let stmt = stmt
                    .trim()
                    .trim_end_matches(';')
                    .trim()
                    .to_ascii_uppercase();
                let words: Vec<&str> = stmt.split_whitespace().take(2).collect();
                match words.as_slice() {
                    ["BEGIN"] | ["START", "TRANSACTION"] | ["XA", "START" | "BEGIN"] => {
                        self.in_block = true;
                        None
                    }
                    ["COMMIT" | "ROLLBACK", ..] | ["XA", "COMMIT" | "ROLLBACK"] => self.end(f),
                    _ if !self.in_block || self.standalone => self.end(f),
                    _ => None,
                }
            }
            XID_EVENT | XA_PREPARE_EVENT => {
                self.start.get_or_insert(f.start);
                self.end(f)
            }
            TRANSACTION_PAYLOAD_EVENT if !self.in_block => {
                // The whole transaction (BEGIN … XID) is inside the payload.
                self.start.get_or_insert(f.start);
                self.end(f)
            }
            0
            | STOP_EVENT
            | ROTATE_EVENT
            | FORMAT_DESCRIPTION_EVENT
            | INCIDENT_EVENT
            | HEARTBEAT_EVENT
            | PREVIOUS_GTIDS_EVENT
            | HEARTBEAT_EVENT_V2
            | MARIADB_BINLOG_CHECKPOINT_EVENT
            | MARIADB_GTID_LIST_EVENT
            | MARIADB_START_ENCRYPTION_EVENT => None,
            _ => {
                // Table maps, rows events, annotations…: part of a transaction.
                self.start.get_or_insert(f.start);
                None
            }
        }
    }

    fn end(&mut self, f: &Frame) -> Option<Tx> {
        let start = self.start.take().unwrap_or(f.start);
        *self = Self::default();
        Some(Tx {
            start,
            end: f.end,
            timestamp: f.timestamp,
        })
    }
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Checks the range's bounds against each other.
fn check_range(files: &[PathBuf], range: &ReplayRange) -> Result<(), RelayError> {
    let arg = |s: String| Err(RelayError::Argument(s));
    if files.is_empty() {
        return arg("give at least one binlog file with --binlog FILE".into());
    }
    for (name, pos) in [
        ("--start-position", range.start_position),
        ("--stop-position", range.stop_position),
    ] {
        if pos.is_some_and(|p| p < 4) {
            return arg(format!(
                "{name} must be at least 4 (the first event of a binlog file starts there)"
            ));
        }
    }
    if let (Some(start), Some(stop), 1) = (range.start_position, range.stop_position, files.len()) {
        if start > stop {
            return arg(format!(
                "--start-position {start} is after --stop-position {stop} in the same file"
            ));
        }
    }
    if let (Some(start), Some(stop)) = (range.start_datetime, range.stop_datetime) {
        if start > stop {
            return arg(format!(
                "--start-datetime {} is after --stop-datetime {}",
                format_datetime(start),
                format_datetime(stop)
            ));
        }
    }
    Ok(())
}

/// Reads `files` (in this order) and selects the transactions of `range`: the first pass of a
/// replay. Blocking file I/O.
///
/// Every file is opened and checked (exists, binlog magic) before any is read. Files are then
/// read from their start up to where the selection ends.
///
/// # Errors
/// [`RelayError::Argument`] (exit code 2) for a file that does not exist, cannot be read or is
/// not a binlog file, bounds that contradict each other, or a start position that is not the
/// start of an event outside a transaction (or lies beyond the first file's end);
/// [`RelayError::Binlog`] (exit code 1) for a truncated or damaged file (naming the file and
/// position), or a file that ends inside a transaction before the end of the selection.
pub fn plan(files: &[PathBuf], range: &ReplayRange) -> Result<ReplayPlan, RelayError> {
    check_range(files, range)?;
    let mut readers = Vec::with_capacity(files.len());
    for path in files {
        readers.push(FrameReader::open(path)?);
    }
    let last_index = files.len() - 1;
    // (file index, transaction) of the first and last selected transactions.
    let mut first: Option<(usize, Tx)> = None;
    let mut last: Option<(usize, Tx)> = None;
    let mut transactions = 0u64;
    // End of the last event read in each file.
    let mut scanned = vec![4u64; files.len()];
    let mut done = false;
    for (index, reader) in readers.iter_mut().enumerate() {
        let start_position = if index == 0 {
            range.start_position
        } else {
            None
        };
        let stop_position = if index == last_index {
            range.stop_position
        } else {
            None
        };
        let mut tracker = TxTracker::default();
        let mut start_checked = start_position.is_none();
        // A start position inside a transaction: refused once the transaction's end is known.
        let mut refused: Option<(u64, u64)> = None;
        let mut previous_start = 4u64;
        loop {
            if stop_position.is_some_and(|stop| reader.offset() >= stop) && refused.is_none() {
                done = true;
                break;
            }
            let Some(frame) = reader.next()? else {
                break;
            };
            scanned[index] = frame.end;
            if let (false, Some(start)) = (start_checked, start_position) {
                if frame.start == start {
                    start_checked = true;
                    if let Some(since) = tracker.open_since() {
                        refused = Some((start, since));
                    }
                } else if frame.start > start {
                    return Err(RelayError::Argument(format!(
                        "--start-position {start} is not the start of an event in {}: the events \
                         around it start at {previous_start} and {}. Use a position from SHOW \
                         MASTER STATUS, an End_log_pos of an Xid event, or 4",
                        reader.path.display(),
                        frame.start
                    )));
                }
            }
            previous_start = frame.start;
            let Some(tx) = tracker.feed(&frame) else {
                continue;
            };
            if let Some((start, since)) = refused {
                return Err(RelayError::Argument(format!(
                    "--start-position {start} is inside the transaction from {since} to {} of {}: \
                     a replay starts at whole transactions. Use {since} to include that \
                     transaction or {} to start after it",
                    tx.end,
                    reader.path.display(),
                    tx.end
                )));
            }
            if start_position.is_some_and(|start| tx.start < start) {
                continue;
            }
            if stop_position.is_some_and(|stop| tx.end > stop)
                || range
                    .stop_datetime
                    .is_some_and(|t| i64::from(tx.timestamp) > t)
            {
                done = true;
                break;
            }
            if first.is_none()
                && range
                    .start_datetime
                    .is_some_and(|t| i64::from(tx.timestamp) < t)
            {
                continue;
            }
            if first.is_none() {
                first = Some((index, tx));
            }
            last = Some((index, tx));
            transactions += 1;
        }
        if let Some((start, since)) = refused {
            return Err(reader.truncated(
                reader.offset(),
                format!(
                    "the transaction that starts at {since} (around --start-position {start}) has \
                     no end"
                ),
            ));
        }
        if let (false, Some(start)) = (start_checked, start_position) {
            if start != reader.offset() {
                return Err(RelayError::Argument(format!(
                    "--start-position {start} is beyond the end of {} ({} bytes)",
                    reader.path.display(),
                    reader.offset()
                )));
            }
        }
        if done {
            break;
        }
        if let Some(since) = tracker.open_since() {
            // Binlog files hold whole transactions: an open one at the end means a cut file.
            return Err(reader.truncated(
                reader.offset(),
                format!("the transaction that starts at {since} has no end in the file"),
            ));
        }
    }
    let (Some((first_index, first_tx)), Some((last_index, last_tx))) = (first, last) else {
        return Ok(ReplayPlan::default());
    };
    let slices = (first_index..=last_index)
        .map(|i| FileSlice {
            path: files[i].clone(),
            name: file_name(&files[i]),
            from: if i == first_index { first_tx.start } else { 4 },
            to: if i == last_index {
                last_tx.end
            } else {
                scanned[i]
            },
        })
        .collect();
    Ok(ReplayPlan {
        slices,
        transactions,
        first: Some(BinlogPosition::new(
            file_name(&files[first_index]),
            first_tx.start,
        )),
        last: Some(BinlogPosition::new(
            file_name(&files[last_index]),
            last_tx.end,
        )),
    })
}

/// One slice being read.
struct SliceReader {
    file: BinlogFileSource,
    slice: FileSlice,
    /// End of the last event of the file read so far.
    read_to: u64,
    /// Whether the current event is yielded (it starts at or after `slice.from`).
    yielding: bool,
}

/// The events of a [`ReplayPlan`], for the pipeline ([`crate::binlog::EventSource`]); ends
/// after the last selected transaction.
pub struct ReplaySource {
    slices: VecDeque<FileSlice>,
    current: Option<SliceReader>,
    events: u64,
    finished: bool,
}

impl ReplaySource {
    /// A source reading `plan`'s slices in order.
    pub fn new(plan: &ReplayPlan) -> Self {
        Self {
            slices: plan.slices.iter().cloned().collect(),
            current: None,
            events: 0,
            finished: false,
        }
    }

    /// Events yielded so far.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// `true` once the last event of the plan was yielded and the source said so.
    pub fn finished(&self) -> bool {
        self.finished
    }

    /// The next event of the selection, `None` after the last. Blocking file I/O (one event).
    ///
    /// # Errors
    /// [`RelayError::Binlog`] when a file cannot be read again or changed since [`plan`] read
    /// it.
    pub fn read_next(&mut self) -> Result<Option<SourceEvent>, RelayError> {
        loop {
            let reader = match &mut self.current {
                Some(r) => r,
                None => {
                    let Some(slice) = self.slices.pop_front() else {
                        self.finished = true;
                        return Ok(None);
                    };
                    let file = BinlogFileSource::open_until(&slice.path, slice.to)?;
                    tracing::info!(file = %slice.path.display(), from = slice.from, to = slice.to, "replaying binlog file");
                    self.current.insert(SliceReader {
                        file,
                        slice,
                        read_to: 4,
                        yielding: false,
                    })
                }
            };
            match reader.file.next_event() {
                None => {
                    if reader.read_to != reader.slice.to {
                        return Err(RelayError::binlog(format!(
                            "binlog file {} changed while it was replayed: it ends at {}, it \
                             was read up to {} before",
                            reader.slice.path.display(),
                            reader.read_to,
                            reader.slice.to
                        )));
                    }
                    self.current = None;
                }
                Some(Err(e)) => return Err(e),
                Some(Ok(event)) => {
                    // Events carried inside another (a compressed transaction's) do not move
                    // the file position: they share their carrier's fate.
                    let end = event.position.pos;
                    if end > reader.read_to {
                        reader.yielding = reader.read_to >= reader.slice.from;
                        reader.read_to = end;
                    }
                    if reader.yielding {
                        self.events += 1;
                        return Ok(Some(event));
                    }
                }
            }
        }
    }
}

impl crate::binlog::EventSource for ReplaySource {
    // An `async fn`, so the file is read only when the future is polled: the pipeline's select
    // loop creates this future on every turn and drops it unpolled when another branch is
    // ready, and an event read eagerly would be lost.
    async fn next_event(&mut self) -> Result<Option<SourceEvent>, RelayError> {
        self.read_next()
    }

    fn table_map(&self, table_id: u64) -> Option<&TableMapEvent<'static>> {
        self.current
            .as_ref()
            .and_then(|r| r.file.table_map(table_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::binlog::fixtures;

    fn fixture(name: &str) -> PathBuf {
        fixtures::path(name)
    }

    /// A scratch copy of `bytes` named `name` in a directory of its own.
    fn scratch(name: &str, bytes: &[u8]) -> PathBuf {
        let path = fixtures::scratch_dir("replay").join(name);
        std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        path
    }

    fn json_fixture() -> Vec<u8> {
        fixtures::read(JSON)
    }

    const JSON: &str = "mysql8-json.000001";

    fn range(start: Option<u64>, stop: Option<u64>) -> ReplayRange {
        ReplayRange {
            start_position: start,
            stop_position: stop,
            ..ReplayRange::default()
        }
    }

    fn bounds(plan: &ReplayPlan) -> (u64, Option<String>, Option<String>) {
        (
            plan.transactions,
            plan.first.as_ref().map(ToString::to_string),
            plan.last.as_ref().map(ToString::to_string),
        )
    }

    fn err(files: &[PathBuf], range: &ReplayRange) -> String {
        plan(files, range).expect_err("refused").to_string()
    }

    // Event layout of mysql8-json.000001 (MySQL 8.0.31; Pos and End_log_pos of SHOW BINLOG
    // EVENTS in mysql8-json.000001.events; the times are the SET TIMESTAMPs of
    // mysql8-json.000001.sql, all on 2021-03-15 UTC):
    //   4-126 FDE, 126-157 PREVIOUS_GTIDS,
    //   157-236 GTID + 236-452 QUERY "CREATE TABLE t …"                   08:42:38
    //   452-531 GTID, 531-606 BEGIN, 606-693 TABLE_MAP, 693-798 WRITE_ROWS, 798-829 XID
    //                                                                       08:43:22
    //   829-1280 (BEGIN 908, TABLE_MAP 983, WRITE_ROWS 1070, XID 1249)     08:43:39
    //   1280-1753 (WRITE_ROWS)                                             08:43:54
    //   1753-2554 (WRITE_ROWS of 5 rows)                                   08:44:04
    //   2554-4451 (UPDATE_ROWS)                                            08:44:12
    //   4451-4865 (GTID to 4530, BEGIN 4614, TABLE_MAP 4701, PARTIAL_UPDATE_ROWS 4834, XID
    //              4865)                                                   08:44:29
    //   4865-4912 ROTATE (FLUSH BINARY LOGS); the file has 4912 bytes.

    #[test]
    fn datetimes_are_utc() {
        assert_eq!(parse_datetime("2021-03-15 08:43:22"), Ok(1_615_797_802));
        assert!(parse_datetime("2021-03-15T08:43:22").is_err());
        assert!(parse_datetime("2021-03-15").is_err());
    }

    #[test]
    fn whole_file_selects_every_transaction() {
        let p = plan(&[fixture(JSON)], &ReplayRange::default()).expect("plan");
        assert_eq!(
            bounds(&p),
            (7, Some(format!("{JSON}:157")), Some(format!("{JSON}:4865")))
        );
        assert_eq!(p.slices.len(), 1);
        assert_eq!((p.slices[0].from, p.slices[0].to), (157, 4865));
    }

    #[test]
    fn positions_select_whole_transactions() {
        let f = [fixture(JSON)];
        let p = plan(&f, &range(Some(829), Some(1753))).expect("plan");
        assert_eq!(
            bounds(&p),
            (2, Some(format!("{JSON}:829")), Some(format!("{JSON}:1753")))
        );
        // A stop position inside a transaction ends after the one before it.
        let p = plan(&f, &range(Some(452), Some(1000))).expect("plan");
        assert_eq!(bounds(&p).0, 1);
        assert_eq!(p.last.map(|l| l.pos), Some(829));
        // Positions before the first transaction are fine (file start, after the FDE).
        for start in [4, 126, 157] {
            let p = plan(&f, &range(Some(start), Some(829))).expect("plan");
            assert_eq!(bounds(&p).0, 2, "from {start}");
        }
        // Start at the end of the file, or after the last transaction: nothing, and no error.
        for start in [4912, 4865] {
            let p = plan(&f, &range(Some(start), None)).expect("plan");
            assert_eq!(p, ReplayPlan::default(), "from {start}");
        }
        // Stop before the first transaction ends: nothing.
        let p = plan(&f, &range(None, Some(451))).expect("plan");
        assert_eq!(p, ReplayPlan::default());
    }

    #[test]
    fn a_start_inside_a_transaction_or_an_event_is_refused() {
        let f = [fixture(JSON)];
        let e = err(&f, &range(Some(983), None));
        assert!(
            e.contains("--start-position 983 is inside the transaction from 829 to 1280"),
            "{e}"
        );
        assert!(
            e.contains("Use 829 to include that transaction or 1280"),
            "{e}"
        );
        // BEGIN after MySQL's GTID event: the GTID event starts the transaction.
        let e = err(&f, &range(Some(908), None));
        assert!(e.contains("inside the transaction from 829 to 1280"), "{e}");
        let e = err(&f, &range(Some(984), None));
        assert!(
            e.contains("--start-position 984 is not the start of an event")
                && e.contains("start at 983 and 1070"),
            "{e}"
        );
        let e = err(&f, &range(Some(5000), None));
        assert!(
            e.contains("--start-position 5000 is beyond the end of") && e.contains("(4912 bytes)"),
            "{e}"
        );
        let e = err(&f, &range(Some(1280), Some(829)));
        assert!(e.contains("is after --stop-position"), "{e}");
        let e = err(&f, &range(Some(3), None));
        assert!(e.contains("must be at least 4"), "{e}");
    }

    #[test]
    fn datetimes_select_by_commit_time() {
        let f = [fixture(JSON)];
        let at = |s: &str| Some(parse_datetime(s).expect("datetime"));
        let r = ReplayRange {
            start_datetime: at("2021-03-15 08:43:39"),
            stop_datetime: at("2021-03-15 08:43:54"),
            ..ReplayRange::default()
        };
        let p = plan(&f, &r).expect("plan");
        assert_eq!(
            bounds(&p),
            (2, Some(format!("{JSON}:829")), Some(format!("{JSON}:1753"))),
            "both bounds inclusive"
        );
        let r = ReplayRange {
            start_datetime: at("2021-03-15 08:43:23"),
            stop_datetime: at("2021-03-15 08:43:53"),
            ..ReplayRange::default()
        };
        assert_eq!(
            bounds(&plan(&f, &r).expect("plan")),
            (1, Some(format!("{JSON}:829")), Some(format!("{JSON}:1280")))
        );
        // With a position too: both apply.
        let r = ReplayRange {
            start_position: Some(1280),
            start_datetime: at("2021-03-15 08:43:00"),
            stop_datetime: at("2021-03-15 08:44:05"),
            ..ReplayRange::default()
        };
        assert_eq!(
            bounds(&plan(&f, &r).expect("plan")),
            (
                2,
                Some(format!("{JSON}:1280")),
                Some(format!("{JSON}:2554"))
            )
        );
        let r = ReplayRange {
            start_datetime: at("2021-03-15 09:00:00"),
            stop_datetime: at("2021-03-15 08:00:00"),
            ..ReplayRange::default()
        };
        assert!(err(&f, &r).contains("is after --stop-datetime"));
    }

    #[test]
    fn several_files_in_the_order_given() {
        let bytes = json_fixture();
        let one = scratch("binlog.000001", &bytes);
        let two = one.with_file_name("binlog.000002");
        std::fs::write(&two, &bytes).expect("copy");
        let p = plan(&[one.clone(), two.clone()], &range(Some(4451), Some(829))).expect("plan");
        assert_eq!(
            bounds(&p),
            (
                3,
                Some("binlog.000001:4451".to_owned()),
                Some("binlog.000002:829".to_owned())
            )
        );
        let slices: Vec<(String, u64, u64)> = p
            .slices
            .iter()
            .map(|s| (s.name.clone(), s.from, s.to))
            .collect();
        assert_eq!(
            slices,
            [
                // A file followed by another is read to its end: its ROTATE event too.
                ("binlog.000001".to_owned(), 4451, 4912),
                ("binlog.000002".to_owned(), 4, 829)
            ]
        );
        // The events yielded: from the first selected event to the last, the second file's
        // format description and PREVIOUS_GTIDS events included.
        let mut source = ReplaySource::new(&p);
        let mut ends = Vec::new();
        while let Some(ev) = source.read_next().expect("reads") {
            ends.push(ev.position.to_string());
        }
        assert_eq!(source.events(), 15);
        assert!(source.finished());
        let expected: Vec<String> = [4530, 4614, 4701, 4834, 4865, 4912]
            .iter()
            .map(|p| format!("binlog.000001:{p}"))
            .chain(
                [126, 157, 236, 452, 531, 606, 693, 798, 829]
                    .iter()
                    .map(|p| format!("binlog.000002:{p}")),
            )
            .collect();
        assert_eq!(ends.len(), 15);
        assert_eq!(ends, expected);
    }

    #[test]
    fn a_dropped_next_event_future_consumes_nothing() {
        use crate::binlog::EventSource;
        let p = plan(&[fixture(JSON)], &range(Some(452), Some(829))).expect("plan");
        let mut source = ReplaySource::new(&p);
        // The pipeline's select loop drops the future unpolled when another branch wins.
        drop(source.next_event());
        let first = futures::executor::block_on(source.next_event())
            .expect("reads")
            .expect("an event");
        assert_eq!(
            first.position.to_string(),
            format!("{JSON}:531"),
            "the GTID event 452-531"
        );
        assert_eq!(source.events(), 1);
    }

    #[test]
    fn damaged_and_missing_files_are_named() {
        let bytes = json_fixture();
        let missing = std::env::temp_dir().join("outbox-relay-no-such-binlog.000001");
        let e = plan(std::slice::from_ref(&missing), &ReplayRange::default()).expect_err("missing");
        assert!(matches!(e, RelayError::Argument(_)));
        assert_eq!(
            e.to_string(),
            format!(
                "invalid argument: --binlog {}: no such file",
                missing.display()
            )
        );
        // A missing later file is found before anything is read.
        let e = err(&[fixture(JSON), missing.clone()], &ReplayRange::default());
        assert!(e.contains("no such file"), "{e}");

        let garbage = scratch("garbage.000001", b"this is not a binlog file at all");
        let e = plan(std::slice::from_ref(&garbage), &ReplayRange::default()).expect_err("garbage");
        assert!(matches!(e, RelayError::Argument(_)));
        assert!(
            e.to_string().contains(&format!(
                "--binlog {}: not a binlog file",
                garbage.display()
            )),
            "{e}"
        );
        let empty = scratch("empty.000001", b"");
        assert!(err(&[empty], &ReplayRange::default()).contains("not a binlog file"));

        // Magic bytes, then garbage: the first event's header does not describe the file.
        let mut fake = MAGIC.to_vec();
        fake.extend_from_slice(&[0x5a; 200]);
        let fake = scratch("fake.000001", &fake);
        let e = plan(std::slice::from_ref(&fake), &ReplayRange::default()).expect_err("fake");
        assert!(matches!(e, RelayError::Binlog(_)));
        assert!(
            e.to_string().contains(&format!(
                "binlog file {} is damaged at position 4",
                fake.display()
            )),
            "{e}"
        );

        // Cut inside the WRITE_ROWS event 693-798.
        let cut = scratch("cut.000001", &bytes[..734]);
        let e = plan(std::slice::from_ref(&cut), &ReplayRange::default()).expect_err("cut");
        assert!(matches!(e, RelayError::Binlog(_)));
        assert_eq!(
            e.to_string(),
            format!(
                "binlog: binlog file {} is truncated at position 693: the event there (type 30) \
                 is 105 bytes long, the file has 41 more. Use a complete copy of the file (or \
                 --stop-position at or before 693)",
                cut.display()
            )
        );
        // Cut inside a header.
        let e = err(
            &[scratch("cut.000001", &bytes[..804])],
            &ReplayRange::default(),
        );
        assert!(
            e.contains(
                "truncated at position 798: an event header takes 19 bytes, the file has 6 more"
            ),
            "{e}"
        );
        // Cut between events, inside a transaction.
        let e = err(
            &[scratch("cut.000001", &bytes[..798])],
            &ReplayRange::default(),
        );
        assert!(
            e.contains("truncated at position 798: the transaction that starts at 452 has no end"),
            "{e}"
        );
        // What lies before the damage can still be replayed.
        let p = plan(&[cut], &range(None, Some(452))).expect("plan");
        assert_eq!(bounds(&p).0, 1);

        // A flipped byte inside the CREATE TABLE statement (236-452).
        let mut flipped = bytes.clone();
        flipped[300] ^= 0x01;
        let e = err(
            &[scratch("flipped.000001", &flipped)],
            &ReplayRange::default(),
        );
        assert!(
            e.contains("is damaged at position 236: the CRC32 checksum of the event there (type 2) does not match"),
            "{e}"
        );
    }

    #[test]
    fn mariadb_transactions_start_at_their_gtid_event() {
        // mariadb10-outbox.000001: GTID events at 330 and 722, Xid events ending at 722 and
        // 1114 (Pos / End_log_pos in mariadb10-outbox.000001.events).
        let f = [fixture("mariadb10-outbox.000001")];
        let p = plan(&f, &ReplayRange::default()).expect("plan");
        assert_eq!(
            bounds(&p),
            (
                2,
                Some("mariadb10-outbox.000001:330".to_owned()),
                Some("mariadb10-outbox.000001:1114".to_owned())
            )
        );
        let p = plan(&f, &range(Some(722), None)).expect("plan");
        assert_eq!(bounds(&p).0, 1);
        let e = err(&f, &range(Some(372), None));
        assert!(e.contains("inside the transaction from 330 to 722"), "{e}");
    }

    /// `bytes` (a MariaDB binlog file with CRC32 checksums) as MariaDB 11.4+ writes it by
    /// default (`binlog_legacy_event_pos=OFF`): `log_pos` 0 for every event between a GTID event
    /// and the XID that ends its group, checksums recomputed.
    fn without_inner_positions(bytes: &[u8]) -> Vec<u8> {
        let mut out = bytes.to_vec();
        let mut at = 4usize;
        let mut in_group = false;
        let mut zeroed = 0;
        while at + 19 <= out.len() {
            let event_type = out[at + 4];
            let size = u32::from_le_bytes(out[at + 9..at + 13].try_into().expect("4 bytes"));
            let size = usize::try_from(size).expect("size");
            if in_group && event_type != XID_EVENT {
                out[at + 13..at + 17].copy_from_slice(&0u32.to_le_bytes());
                let sum = crc32fast::hash(&out[at..at + size - 4]);
                out[at + size - 4..at + size].copy_from_slice(&sum.to_le_bytes());
                zeroed += 1;
            }
            in_group = match event_type {
                MARIADB_GTID_EVENT => true,
                XID_EVENT => false,
                _ => in_group,
            };
            at += size;
        }
        assert!(zeroed > 0, "no event inside a group");
        out
    }

    /// Every event's position as a [`ReplaySource`] of the whole file yields it.
    fn replayed_positions(file: &Path) -> Vec<(u8, String)> {
        let p = plan(&[file.to_owned()], &ReplayRange::default()).expect("plan");
        let mut source = ReplaySource::new(&p);
        let mut out = Vec::new();
        while let Some(ev) = source.read_next().expect("event") {
            out.push((ev.event.header().event_type_raw(), ev.position.to_string()));
        }
        out
    }

    #[test]
    fn mariadb_events_without_log_pos_get_their_real_ends() {
        // MariaDB 11.4's default: log_pos 0 inside event groups. Such a file is not damaged, its
        // transactions are the same, and every event gets the position it really ends at (a
        // row's dead letter names it).
        let original = std::fs::read(fixture("mariadb10-outbox.000001")).expect("fixture");
        let file = scratch(
            "mariadb10-outbox.000001",
            &without_inner_positions(&original),
        );
        let p = plan(std::slice::from_ref(&file), &ReplayRange::default()).expect("plan");
        assert_eq!(
            bounds(&p),
            (
                2,
                Some("mariadb10-outbox.000001:330".to_owned()),
                Some("mariadb10-outbox.000001:1114".to_owned())
            )
        );
        let want = replayed_positions(&fixture("mariadb10-outbox.000001"));
        assert!(want.len() > 4, "{want:?}");
        assert_eq!(replayed_positions(&file), want);
    }

    #[test]
    fn a_compressed_transaction_ends_with_its_payload_event() {
        // mysql8-compressed.000001: GTID 157-234, TRANSACTION_PAYLOAD 234-393, ROTATE 393-440
        // (mysql8-compressed.000001.events).
        let p = plan(
            &[fixture("mysql8-compressed.000001")],
            &ReplayRange::default(),
        )
        .expect("plan");
        assert_eq!(
            bounds(&p),
            (
                1,
                Some("mysql8-compressed.000001:157".to_owned()),
                Some("mysql8-compressed.000001:393".to_owned())
            )
        );
    }
}
