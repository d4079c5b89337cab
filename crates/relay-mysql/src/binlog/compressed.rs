//! Compressed binlog events: MySQL 8 transaction compression and MariaDB `log_bin_compress`.
//!
//! **MySQL** (`binlog_transaction_compression=ON`, 8.0.20+) writes a whole transaction as one
//! TRANSACTION_PAYLOAD event (type 40) whose payload is the zstd-compressed sequence of the
//! transaction's ordinary events (BEGIN, table maps, rows events, XID). The inner events have
//! `log_pos` 0 and no checksum; their `event_size` values add up to the payload event's
//! `uncompressed_size` field (MySQL WL#3549). A resume position can only be the end of the outer
//! event, so the source gives every inner event that position. [`PayloadTracker`] counts the
//! inner events' bytes: mysql_async decompresses the payload itself and yields nothing at all
//! when zstd fails, so a missing inner byte is the only sign of a payload that could not be read.
//!
//! **MariaDB** (`log_bin_compress=ON`, 10.2+) compresses the variable part of QUERY and rows
//! events instead, as new event types 165..171 (MariaDB `sql/log_event.cc`,
//! `query_event_uncompress`, `row_log_event_uncompress`, `binlog_buf_uncompress`):
//!
//! | type | name | uncompressed type | compressed part starts after |
//! | --- | --- | --- | --- |
//! | 165 | QUERY_COMPRESSED | 2 QUERY | post-header, status variables, database name and its NUL |
//! | 166/167/168 | WRITE/UPDATE/DELETE_ROWS_COMPRESSED_V1 | 23/24/25 | table id, flags, column count, column bitmap(s) |
//! | 169/170/171 | WRITE/UPDATE/DELETE_ROWS_COMPRESSED (v2) | 30/31/32 | table id, flags, extra-data block, column count, column bitmap(s) |
//!
//! (Type numbers from MariaDB's `log_event.h` enum `Log_event_type`: the v1 variants come
//! first. MariaDB itself writes v1 rows events, so 166..168 are what a server sends.)
//!
//! UPDATE events carry two column bitmaps, the others one. The compressed part starts with one
//! header byte: bit 7 set, bits 4..6 the algorithm (0 = zlib, the only one defined), bits 0..2
//! the number (1..4) of length bytes that follow; those hold the uncompressed length, most
//! significant byte first; a zlib stream (RFC 1950, `compress2`) follows. [`uncompress_mariadb`]
//! rebuilds the event the server would have written without compression (same header but for
//! the type code and size, the uncompressed body, a fresh CRC32) and parses it again with the
//! event's own format description, so the decoder only ever sees ordinary events.

use std::io::Read;

use mysql_async::binlog::events::Event;
use mysql_async::binlog::EventType;

/// Inner-event bookkeeping for MySQL TRANSACTION_PAYLOAD events on one stream.
///
/// Feed it the header of every event in stream order: [`PayloadTracker::observe`] first, then
/// [`PayloadTracker::begin`] when the event is a TRANSACTION_PAYLOAD.
#[derive(Debug, Default)]
pub(crate) struct PayloadTracker {
    open: Option<OpenPayload>,
}

/// A payload whose inner events have not all been seen yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct OpenPayload {
    /// End of the TRANSACTION_PAYLOAD event (its `log_pos`).
    end: u64,
    /// Its `uncompressed_size`: the sum of the inner events' sizes.
    expected: u64,
    /// Bytes of inner events seen so far.
    decoded: u64,
}

impl PayloadTracker {
    /// A TRANSACTION_PAYLOAD event ending at `end` was read, holding `uncompressed_size` bytes
    /// of inner events.
    ///
    /// # Errors
    /// The previous payload's inner events are incomplete (see [`PayloadTracker::observe`]).
    pub(crate) fn begin(&mut self, end: u64, uncompressed_size: u64) -> Result<(), Incomplete> {
        self.check_complete()?;
        if uncompressed_size > 0 {
            self.open = Some(OpenPayload {
                end,
                expected: uncompressed_size,
                decoded: 0,
            });
        }
        Ok(())
    }

    /// Classifies the next event by its header: `Some(end)` when it is an inner event of the
    /// open payload (`log_pos` 0), `end` being where the payload event ends; `None` for an event
    /// of the binlog itself.
    ///
    /// # Errors
    /// An event of the binlog itself arrives before the inner events added up to the payload's
    /// `uncompressed_size`, or the inner events are larger than that: the payload could not be
    /// decompressed (whole or in part).
    pub(crate) fn observe(
        &mut self,
        log_pos: u32,
        event_size: u32,
    ) -> Result<Option<u64>, Incomplete> {
        let Some(open) = &mut self.open else {
            return Ok(None);
        };
        if log_pos != 0 {
            return Err(Self::incomplete(*open));
        }
        open.decoded += u64::from(event_size);
        let end = open.end;
        if open.decoded > open.expected {
            let err = Self::incomplete(*open);
            self.open = None;
            return Err(err);
        }
        if open.decoded == open.expected {
            self.open = None;
        }
        Ok(Some(end))
    }

    /// Checks that no payload is waiting for inner events (at the end of a file, or before the
    /// next payload).
    ///
    /// # Errors
    /// As [`PayloadTracker::observe`].
    pub(crate) fn check_complete(&self) -> Result<(), Incomplete> {
        match self.open {
            Some(open) => Err(Self::incomplete(open)),
            None => Ok(()),
        }
    }

    fn incomplete(open: OpenPayload) -> Incomplete {
        Incomplete {
            end: open.end,
            expected: open.expected,
            decoded: open.decoded,
        }
    }
}

/// The inner events of the TRANSACTION_PAYLOAD event ending at `end` do not add up to its
/// `uncompressed_size`: it could not be decompressed (whole or in part).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Incomplete {
    /// End of the payload event.
    pub end: u64,
    /// Its `uncompressed_size`.
    pub expected: u64,
    /// Bytes of inner events seen.
    pub decoded: u64,
}

impl std::fmt::Display for Incomplete {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} bytes expected, {} decoded",
            self.expected, self.decoded
        )
    }
}

/// The error text for a TRANSACTION_PAYLOAD event ending at `position` that could not be
/// decompressed, with `detail` (sizes or the zstd error) and the fix.
pub(crate) fn payload_error(
    position: &outbox_relay_core::position::BinlogPosition,
    detail: &str,
) -> String {
    format!(
        "the compressed transaction (TRANSACTION_PAYLOAD) ending at {position} could not be \
         decompressed: {detail}. The relay stops instead of skipping the transaction's rows. \
         Fix: check the event on the server (mysqlbinlog -vv --stop-position={} {}); if the \
         server's copy reads fine, restart the relay (the copy it received was damaged); if not, \
         SET GLOBAL binlog_transaction_compression=OFF for new transactions, relay this \
         transaction's outbox rows by hand and move the connector's checkpoint past {position}",
        position.pos, position.file
    )
}

/// The event type a MariaDB compressed event type (165..171) stands for, `None` for any other.
pub(crate) fn mariadb_uncompressed_type(raw: u8) -> Option<u8> {
    Some(match raw {
        165 => EventType::QUERY_EVENT as u8,
        166 => EventType::WRITE_ROWS_EVENT_V1 as u8,
        167 => EventType::UPDATE_ROWS_EVENT_V1 as u8,
        168 => EventType::DELETE_ROWS_EVENT_V1 as u8,
        169 => EventType::WRITE_ROWS_EVENT as u8,
        170 => EventType::UPDATE_ROWS_EVENT as u8,
        171 => EventType::DELETE_ROWS_EVENT as u8,
        _ => return None,
    })
}

/// Table id (6 bytes) and flags (2 bytes) of a rows event: MariaDB's `ROWS_HEADER_LEN_V1`.
const ROWS_HEADER_LEN_V1: usize = 8;
/// QUERY post-header: offset of the database name length (thread id 4, exec time 4).
const Q_DB_LEN_OFFSET: usize = 8;
/// QUERY post-header: offset of the status variables length (after error code 2).
const Q_STATUS_VARS_LEN_OFFSET: usize = 11;
/// Length of the v4 common event header.
const HEADER_LEN: usize = 19;

/// Rebuilds the MariaDB compressed event `event` (type 165..171, see the module docs) as the
/// uncompressed event it stands for, parsed with the event's own format description.
///
/// # Errors
/// A text naming what is wrong: not a compressed type, a truncated event, an unknown
/// compression algorithm, a zlib error, or an uncompressed length other than announced.
pub(crate) fn uncompress_mariadb(event: &Event) -> Result<Event, String> {
    let header = event.header();
    let raw_type = header.event_type_raw();
    let new_type = mariadb_uncompressed_type(raw_type)
        .ok_or_else(|| format!("event type {raw_type} is not a MariaDB compressed event"))?;
    let data = event.data();
    let start = compressed_part_start(data, raw_type, new_type, event)?;
    let compressed = data.get(start..).unwrap_or_default();
    let body = inflate(compressed)?;
    let mut new_data = Vec::with_capacity(start + body.len());
    new_data.extend_from_slice(data.get(..start).unwrap_or_default());
    new_data.extend_from_slice(&body);

    let checksum = event.checksum().is_some();
    let size = HEADER_LEN + new_data.len() + if checksum { 4 } else { 0 };
    let size = u32::try_from(size)
        .map_err(|_| format!("the uncompressed event would be {size} bytes, over 4 GiB"))?;
    let mut bytes = Vec::with_capacity(size as usize);
    bytes.extend_from_slice(&header.timestamp().to_le_bytes());
    bytes.push(new_type);
    bytes.extend_from_slice(&header.server_id().to_le_bytes());
    bytes.extend_from_slice(&size.to_le_bytes());
    bytes.extend_from_slice(&header.log_pos().to_le_bytes());
    bytes.extend_from_slice(&header.flags_raw().to_le_bytes());
    bytes.extend_from_slice(&new_data);
    if checksum {
        let crc = crc32fast::hash(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
    }
    Event::read(event.fde(), bytes.as_slice())
        .map_err(|e| format!("the uncompressed event cannot be parsed: {e}"))
}

/// Offset in the event body (after the common header) where the compressed part starts.
fn compressed_part_start(
    data: &[u8],
    raw_type: u8,
    new_type: u8,
    event: &Event,
) -> Result<usize, String> {
    let truncated = || format!("the event body is truncated ({} bytes)", data.len());
    if new_type == EventType::QUERY_EVENT as u8 {
        // The post-header length the parser will use for the rebuilt QUERY event; MariaDB
        // writes QUERY_COMPRESSED with the same post-header (QUERY_HEADER_LEN).
        let post = usize::from(
            event
                .fde()
                .get_event_type_header_length(EventType::QUERY_EVENT),
        );
        let db_len = usize::from(*data.get(Q_DB_LEN_OFFSET).ok_or_else(truncated)?);
        let status = data
            .get(Q_STATUS_VARS_LEN_OFFSET..Q_STATUS_VARS_LEN_OFFSET + 2)
            .ok_or_else(truncated)?;
        let status_len = usize::from(u16::from_le_bytes([status[0], status[1]]));
        let start = post + status_len + db_len + 1;
        return if start < data.len() {
            Ok(start)
        } else {
            Err(truncated())
        };
    }
    let mut pos = ROWS_HEADER_LEN_V1;
    if (169..=171).contains(&raw_type) {
        // v2: a variable-length extra-data block whose length includes its own 2 bytes.
        let len = data.get(pos..pos + 2).ok_or_else(truncated)?;
        let len = usize::from(u16::from_le_bytes([len[0], len[1]]));
        if len < 2 {
            return Err(format!("the rows event's extra-data length is {len}"));
        }
        pos += len;
    }
    let (width, used) = packed_int(data.get(pos..).unwrap_or_default()).ok_or_else(truncated)?;
    pos += used;
    let bitmap = usize::try_from(width.div_ceil(8)).map_err(|_| truncated())?;
    let bitmaps = if new_type == EventType::UPDATE_ROWS_EVENT as u8
        || new_type == EventType::UPDATE_ROWS_EVENT_V1 as u8
    {
        2
    } else {
        1
    };
    pos = bitmap
        .checked_mul(bitmaps)
        .and_then(|b| b.checked_add(pos))
        .ok_or_else(truncated)?;
    if pos < data.len() {
        Ok(pos)
    } else {
        Err(truncated())
    }
}

/// A length-encoded integer (MySQL's) at the start of `buf` and its size; `None` when cut short
/// or for the NULL (0xfb) and error (0xff) markers.
pub(crate) fn lenenc_int(buf: &[u8]) -> Option<(u64, usize)> {
    let (&first, rest) = buf.split_first()?;
    let n = match first {
        0..=250 => return Some((u64::from(first), 1)),
        0xfc => 2,
        0xfd => 3,
        0xfe => 8,
        _ => return None,
    };
    let mut le = [0u8; 8];
    le[..n].copy_from_slice(rest.get(..n)?);
    Some((u64::from_le_bytes(le), 1 + n))
}

/// The header fields of a TRANSACTION_PAYLOAD event body, checked as mysql_common reads them
/// (`TransactionPayloadEvent`): it panics on a compression type it does not know and on an
/// unknown field longer than the bytes left, and reads past the end on a cut field.
pub(crate) fn check_payload_header(mut rest: &[u8]) -> Result<(), String> {
    fn next(rest: &mut &[u8], what: &str) -> Result<u64, String> {
        let (value, n) = lenenc_int(rest).ok_or_else(|| format!("its {what} is cut short"))?;
        *rest = &rest[n..];
        Ok(value)
    }
    loop {
        match next(&mut rest, "field type")? {
            0 => return Ok(()), // the end of the header; the payload follows
            field @ 1..=3 => {
                next(&mut rest, "field length")?;
                let value = next(&mut rest, "field value")?;
                if field == 2 && value != 0 && value != 255 {
                    return Err(format!(
                        "unknown compression type {value} (0 is zstd, 255 none)"
                    ));
                }
            }
            field => {
                let len = next(&mut rest, "field length")?;
                let len = usize::try_from(len)
                    .ok()
                    .filter(|&len| len <= rest.len())
                    .ok_or_else(|| {
                        format!("its field {field} of {len} bytes is longer than the event")
                    })?;
                rest = &rest[len..];
            }
        }
        if rest.is_empty() {
            return Err("its header has no end mark".into());
        }
    }
}

/// A length-encoded integer (MariaDB `net_field_length`): the value and the bytes it used.
fn packed_int(buf: &[u8]) -> Option<(u64, usize)> {
    let first = *buf.first()?;
    let n = match first {
        0..=250 => return Some((u64::from(first), 1)),
        251 => return Some((0, 1)), // NULL
        252 => 2,
        253 => 3,
        _ => 8,
    };
    let bytes = buf.get(1..=n)?;
    let mut value = [0u8; 8];
    value[..n].copy_from_slice(bytes);
    Some((u64::from_le_bytes(value), 1 + n))
}

/// Decompresses a MariaDB compressed part: header byte, big-endian length, zlib stream.
fn inflate(compressed: &[u8]) -> Result<Vec<u8>, String> {
    let head = *compressed.first().ok_or("the compressed part is empty")?;
    if head & 0x80 == 0 {
        return Err(format!(
            "the compressed part's header byte {head:#04x} lacks the compression flag (bit 7)"
        ));
    }
    let algorithm = (head & 0x70) >> 4;
    if algorithm != 0 {
        return Err(format!(
            "compression algorithm {algorithm} (only 0, zlib, is defined)"
        ));
    }
    let len_bytes = usize::from(head & 0x07);
    if !(1..=4).contains(&len_bytes) {
        return Err(format!(
            "the compressed part's header byte {head:#04x} announces {len_bytes} length bytes \
             (1 to 4 are valid)"
        ));
    }
    let len = compressed
        .get(1..=len_bytes)
        .ok_or("the compressed part is truncated")?
        .iter()
        .fold(0u64, |acc, b| acc << 8 | u64::from(*b));
    if len == 0 {
        return Err("the announced uncompressed length is 0".into());
    }
    let stream = compressed.get(1 + len_bytes..).unwrap_or_default();
    let mut out = Vec::new();
    flate2::read::ZlibDecoder::new(stream)
        .take(len + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("zlib: {e}"))?;
    if out.len() as u64 != len {
        return Err(format!("{len} bytes announced, {} decompressed", out.len()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const END: u64 = 431;

    fn inc(end: u64, expected: u64, decoded: u64) -> Incomplete {
        Incomplete {
            end,
            expected,
            decoded,
        }
    }

    #[test]
    fn inner_events_take_the_payload_end_until_their_bytes_add_up() {
        let mut t = PayloadTracker::default();
        assert_eq!(t.observe(126, 107), Ok(None), "no payload open");
        assert_eq!(t.observe(274, 77), Ok(None));
        t.begin(431, 179).expect("nothing open");
        for size in [71, 45, 36] {
            assert_eq!(t.observe(0, size), Ok(Some(431)));
        }
        assert_eq!(t.check_complete(), Err(inc(END, 179, 152)));
        assert_eq!(t.observe(0, 27), Ok(Some(431)), "the XID completes it");
        assert_eq!(t.check_complete(), Ok(()));
        // Afterwards log_pos 0 is no inner event any more (e.g. an artificial event).
        assert_eq!(t.observe(0, 44), Ok(None));
        assert_eq!(t.observe(475, 44), Ok(None));
    }

    #[test]
    fn missing_inner_events_are_an_error() {
        // mysql_async yields no inner events when zstd fails: the next binlog event says so.
        let mut t = PayloadTracker::default();
        t.begin(431, 179).expect("nothing open");
        assert_eq!(t.observe(475, 44), Err(inc(END, 179, 0)));

        let mut t = PayloadTracker::default();
        t.begin(431, 179).expect("nothing open");
        assert_eq!(t.observe(0, 71), Ok(Some(431)));
        assert_eq!(t.observe(510, 79), Err(inc(END, 179, 71)));

        let mut t = PayloadTracker::default();
        t.begin(431, 179).expect("nothing open");
        assert_eq!(t.observe(0, 71), Ok(Some(431)));
        assert_eq!(
            t.begin(700, 50),
            Err(inc(END, 179, 71)),
            "a second payload before the first is complete"
        );
    }

    #[test]
    fn more_inner_bytes_than_announced_are_an_error() {
        let mut t = PayloadTracker::default();
        t.begin(431, 100).expect("nothing open");
        assert_eq!(t.observe(0, 71), Ok(Some(431)));
        assert_eq!(t.observe(0, 45), Err(inc(END, 100, 116)));
        assert_eq!(t.check_complete(), Ok(()), "reported once");
    }

    #[test]
    fn empty_payload_opens_nothing() {
        let mut t = PayloadTracker::default();
        t.begin(431, 0).expect("nothing open");
        assert_eq!(t.observe(475, 44), Ok(None));
    }

    #[test]
    fn packed_ints() {
        assert_eq!(packed_int(&[7]), Some((7, 1)));
        assert_eq!(packed_int(&[250]), Some((250, 1)));
        assert_eq!(packed_int(&[252, 0x34, 0x12]), Some((0x1234, 3)));
        assert_eq!(packed_int(&[253, 1, 2, 3]), Some((0x03_0201, 4)));
        assert_eq!(packed_int(&[252, 1]), None);
        assert_eq!(packed_int(&[]), None);
    }
}

/// A compressed event built by hand with flate2, following the layout in the module docs.
#[cfg(test)]
mod built_event_tests {
    use super::*;
    use mysql_async::binlog::events::FormatDescriptionEvent;
    use mysql_async::binlog::BinlogVersion;
    use std::io::Write;

    fn query_compressed(len_bytes: usize, body: &[u8], declared: usize) -> Vec<u8> {
        let mut zlib = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        zlib.write_all(body).expect("compresses");
        let stream = zlib.finish().expect("compresses");
        let mut data = Vec::new();
        data.extend_from_slice(&9u32.to_le_bytes()); // thread id
        data.extend_from_slice(&0u32.to_le_bytes()); // exec time
        data.push(4); // db length
        data.extend_from_slice(&0u16.to_le_bytes()); // error code
        data.extend_from_slice(&0u16.to_le_bytes()); // status vars length
        data.extend_from_slice(b"shop\0");
        data.push(0x80 | len_bytes as u8);
        data.extend_from_slice(&declared.to_be_bytes()[8 - len_bytes..]);
        data.extend_from_slice(&stream);
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&1_700_000_000u32.to_le_bytes());
        bytes.push(165);
        bytes.extend_from_slice(&1u32.to_le_bytes());
        bytes.extend_from_slice(&(19 + data.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&4242u32.to_le_bytes());
        bytes.extend_from_slice(&0u16.to_le_bytes());
        bytes.extend_from_slice(&data);
        bytes
    }

    fn read(bytes: &[u8]) -> Event {
        let fde = FormatDescriptionEvent::new(BinlogVersion::Version4);
        Event::read(&fde, bytes).expect("parses")
    }

    #[test]
    fn query_with_any_length_width_is_rebuilt() {
        let sql = "INSERT INTO shop.outbox VALUES ('ünïcode')".repeat(10);
        for len_bytes in 2..=4 {
            let ev = read(&query_compressed(len_bytes, sql.as_bytes(), sql.len()));
            let out = uncompress_mariadb(&ev).expect("uncompresses");
            assert_eq!(out.header().event_type_raw(), 2);
            assert_eq!(out.header().log_pos(), 4242);
            assert_eq!(out.header().timestamp(), 1_700_000_000);
            let Some(mysql_async::binlog::events::EventData::QueryEvent(q)) =
                out.read_data().expect("parses")
            else {
                panic!("not a query");
            };
            assert_eq!(q.query(), sql);
            assert_eq!(q.schema(), "shop");
            assert_eq!(q.thread_id(), 9);
        }
    }

    #[test]
    fn wrong_announced_length_is_an_error() {
        let ev = read(&query_compressed(1, b"COMMIT", 7));
        assert_eq!(
            uncompress_mariadb(&ev).expect_err("length"),
            "7 bytes announced, 6 decompressed"
        );
        let ev = read(&query_compressed(1, b"COMMIT", 5));
        assert_eq!(
            uncompress_mariadb(&ev).expect_err("length"),
            "5 bytes announced, 6 decompressed"
        );
    }

    #[test]
    fn unknown_algorithm_is_an_error() {
        let mut bytes = query_compressed(1, b"COMMIT", 6);
        let head = 19 + 13 + 5;
        bytes[head] |= 0x10;
        assert_eq!(
            uncompress_mariadb(&read(&bytes)).expect_err("algorithm"),
            "compression algorithm 1 (only 0, zlib, is defined)"
        );
    }
}
