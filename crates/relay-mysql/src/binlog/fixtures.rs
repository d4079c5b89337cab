//! Test support: the binlog files of `tests/fixtures/binlogs/` (written by the project's own
//! servers, see `generate.sh` and the README there), and a small binlog writer for events no
//! server here can write (MySQL 8.4 tagged GTIDs), built from MySQL's documented layout.

use std::path::PathBuf;

use crate::binlog::source::BinlogFileSource;

/// `tests/fixtures/binlogs/<name>` in this repository.
pub(crate) fn path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/binlogs")
        .join(name)
}

/// The bytes of fixture `name`; the panic names the file.
pub(crate) fn read(name: &str) -> Vec<u8> {
    let p = path(name);
    std::fs::read(&p).unwrap_or_else(|e| {
        panic!(
            "fixture {}: {e} (tests/fixtures/binlogs/generate.sh writes it)",
            p.display()
        )
    })
}

/// Fixture `name` opened as a [`BinlogFileSource`]; the panic names the file.
pub(crate) fn open(name: &str) -> BinlogFileSource {
    let p = path(name);
    BinlogFileSource::open(&p).unwrap_or_else(|e| panic!("fixture {}: {e}", p.display()))
}

/// A scratch directory of its own for one test (removed by the caller when it wants).
pub(crate) fn scratch_dir(what: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "outbox-relay-{what}-{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    dir
}

// -------------------------------------------------------------------------------------------
// Building binlog files: v4 event headers (timestamp 4, type 1, server id 4, event size 4,
// end position 4, flags 2; little-endian), body, CRC32 of header and body (binlog_checksum=CRC32).
// -------------------------------------------------------------------------------------------

/// One event of a real fixture file: its type, header timestamp and body (between the 19-byte
/// header and the 4-byte CRC32).
#[derive(Debug, Clone)]
pub(crate) struct RawEvent {
    pub(crate) type_code: u8,
    pub(crate) timestamp: u32,
    pub(crate) body: Vec<u8>,
}

/// The events of a binlog file with CRC32 checksums, after the 4-byte magic.
pub(crate) fn split_events(file: &[u8]) -> Vec<RawEvent> {
    assert_eq!(&file[..4], b"\xfebin", "binlog magic");
    let mut events = Vec::new();
    let mut at = 4;
    while at < file.len() {
        let size = u32::from_le_bytes(file[at + 9..at + 13].try_into().expect("4 bytes")) as usize;
        events.push(RawEvent {
            type_code: file[at + 4],
            timestamp: u32::from_le_bytes(file[at..at + 4].try_into().expect("4 bytes")),
            body: file[at + 19..at + size - 4].to_vec(),
        });
        at += size;
    }
    events
}

/// A binlog file of `events` (the first must be the format description event): every header's
/// size and end position and every CRC32 computed here, server id 1, flags 0.
pub(crate) fn write_file(events: &[RawEvent]) -> Vec<u8> {
    let mut out = b"\xfebin".to_vec();
    for ev in events {
        let size = 19 + ev.body.len() + 4;
        let start = out.len();
        let end = u32::try_from(start + size).expect("small file");
        out.extend_from_slice(&ev.timestamp.to_le_bytes());
        out.push(ev.type_code);
        out.extend_from_slice(&1u32.to_le_bytes());
        out.extend_from_slice(&u32::try_from(size).expect("small event").to_le_bytes());
        out.extend_from_slice(&end.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&ev.body);
        let crc = crc32fast::hash(&out[start..]);
        out.extend_from_slice(&crc.to_le_bytes());
    }
    out
}

// -------------------------------------------------------------------------------------------
// MySQL 8.3+ tagged GTIDs, from the documented layout (not from mysql_common's encoder):
// - mysql::serialization (libs/mysql/serialization/readme.md): a varlen unsigned integer takes
//   1-9 bytes, little-endian; the number of trailing one bits of the first byte + 1 is the byte
//   count, followed by a 0 bit, then the value (9 bytes: first byte 0xff, then 8 value bytes).
//   A signed one is encoded as (x << 1) for x >= 0, ((-(x + 1)) << 1) | 1 below. A message is
//   <format version, 1 byte> <size of the whole message, varlen> <last non-ignorable field id,
//   varlen> { <field id, varlen> <field data> }; strings are <length, varlen> <bytes>.
// - Gtid_event::define_fields (libs/mysql/binlog/event/control_events.h): field 0 gtid_flags,
//   1 uuid (16 varlen bytes), 2 gno (signed), 3 tag (string), 4 last_committed (signed),
//   5 sequence_number (signed), 6 immediate_commit_timestamp, 7 original_commit_timestamp (left
//   out when equal to 6), 8 transaction_length, 9 immediate_server_version, 10
//   original_server_version (left out when equal to 9), 11 commit_group_ticket (left out unset).
// - Gtid_set::encode in the tagged format (PREVIOUS_GTIDS, COM_BINLOG_DUMP_GTID): an 8-byte
//   word with the format (1) in its low and its high byte and the number of (uuid, tag) entries
//   in bytes 1..7; per entry the uuid (16 bytes), the tag as a string (length 0: untagged), the
//   number of intervals (8 bytes) and each half-open interval [start, end) (8 + 8 bytes).
// -------------------------------------------------------------------------------------------

/// `value` in mysql::serialization's variable-length unsigned format.
pub(crate) fn varlen_uint(value: u64) -> Vec<u8> {
    let bits = 64 - value.leading_zeros() as usize;
    // n bytes hold 7 * n value bits (n <= 8); more need the 9-byte form.
    let n = bits.div_ceil(7).max(1);
    if n > 8 {
        let mut out = vec![0xff];
        out.extend_from_slice(&value.to_le_bytes());
        return out;
    }
    let marker = (1u64 << (n - 1)) - 1; // n - 1 trailing ones, then a zero bit
    let encoded = (value << n) | marker;
    encoded.to_le_bytes()[..n].to_vec()
}

/// `value` in mysql::serialization's variable-length signed format.
pub(crate) fn varlen_int(value: i64) -> Vec<u8> {
    let unsigned = if value >= 0 {
        (value as u64) << 1
    } else {
        ((-(value + 1)) as u64) << 1 | 1
    };
    varlen_uint(unsigned)
}

/// The fields of a `GTID_TAGGED_LOG_EVENT` (type 42) as MySQL 8.4 writes them.
pub(crate) struct TaggedGtid<'a> {
    pub(crate) uuid: [u8; 16],
    pub(crate) tag: &'a str,
    pub(crate) gno: i64,
    pub(crate) last_committed: i64,
    pub(crate) sequence_number: i64,
    pub(crate) commit_timestamp_us: u64,
    pub(crate) transaction_length: u64,
    pub(crate) server_version: u64,
}

impl TaggedGtid<'_> {
    /// The event body: a mysql::serialization message (format version byte 2, as MySQL 8.4
    /// writes it), all fields ignorable (last non-ignorable field id 0).
    pub(crate) fn body(&self) -> Vec<u8> {
        let mut fields = Vec::new();
        let mut field = |id: u64, data: Vec<u8>| {
            fields.extend(varlen_uint(id));
            fields.extend(data);
        };
        field(0, varlen_uint(0)); // gtid_flags
        field(
            1,
            self.uuid
                .iter()
                .flat_map(|b| varlen_uint(u64::from(*b)))
                .collect(),
        );
        field(2, varlen_int(self.gno));
        let mut tag = varlen_uint(self.tag.len() as u64);
        tag.extend_from_slice(self.tag.as_bytes());
        field(3, tag);
        field(4, varlen_int(self.last_committed));
        field(5, varlen_int(self.sequence_number));
        field(6, varlen_uint(self.commit_timestamp_us));
        field(8, varlen_uint(self.transaction_length));
        field(9, varlen_uint(self.server_version));
        // The message size counts itself: version byte + size + field id 0 + fields.
        let fixed = 1 + 1 + fields.len();
        let mut size = fixed + 1;
        while fixed + varlen_uint(size as u64).len() != size {
            size = fixed + varlen_uint(size as u64).len();
        }
        let mut out = vec![2];
        out.extend(varlen_uint(size as u64));
        out.extend(varlen_uint(0));
        out.extend(fields);
        out
    }
}

/// One entry of a GTID set: uuid, tag ("" for untagged) and half-open intervals.
pub(crate) type SetEntry<'a> = ([u8; 16], &'a str, &'a [(u64, u64)]);

/// A GTID set in `Gtid_set::encode`'s tagged format: `(uuid, tag, [(start, end)])` entries,
/// half-open intervals, in MySQL's order (by uuid, untagged first, tags ascending).
pub(crate) fn tagged_gtid_set(entries: &[SetEntry<'_>]) -> Vec<u8> {
    // Format 1 in the low and the high byte, the entry count in between.
    let word = 1 | (entries.len() as u64) << 8 | 1 << 56;
    let mut out = word.to_le_bytes().to_vec();
    for (uuid, tag, intervals) in entries {
        out.extend_from_slice(uuid);
        out.extend(varlen_uint(tag.len() as u64));
        out.extend_from_slice(tag.as_bytes());
        out.extend_from_slice(&(intervals.len() as u64).to_le_bytes());
        for (start, end) in *intervals {
            out.extend_from_slice(&start.to_le_bytes());
            out.extend_from_slice(&end.to_le_bytes());
        }
    }
    out
}

/// The 16 bytes of a UUID written `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub(crate) fn uuid_bytes(text: &str) -> [u8; 16] {
    let hex: String = text.chars().filter(|c| *c != '-').collect();
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex uuid");
    }
    out
}

/// `mysql8-gtid.000001` (MySQL 8.0.31) turned into what MySQL 8.4 writes for tagged GTIDs: its
/// PREVIOUS_GTIDS event holds `previous` (tagged format) and its three GTID events (type 33,
/// `3e11fa47-71ca-11e1-9e33-c80aa9429562:1..3`) become GTID_TAGGED_LOG_EVENTs (type 42) of
/// `uuid:tag:gno` for each gno of `gnos`; every other event is the server's own.
pub(crate) fn tagged_gtid_file(
    previous: &[SetEntry<'_>],
    uuid: [u8; 16],
    tag: &str,
    gnos: [i64; 3],
) -> Vec<u8> {
    let mut gnos = gnos.into_iter();
    let mut seq = 0;
    let events: Vec<RawEvent> = split_events(&read("mysql8-gtid.000001"))
        .into_iter()
        .map(|ev| match ev.type_code {
            35 => RawEvent {
                body: tagged_gtid_set(previous),
                ..ev
            },
            33 => {
                seq += 1;
                RawEvent {
                    type_code: 42,
                    body: TaggedGtid {
                        uuid,
                        tag,
                        gno: gnos.next().expect("three GTID events"),
                        last_committed: seq - 1,
                        sequence_number: seq,
                        commit_timestamp_us: u64::from(ev.timestamp) * 1_000_000,
                        // Not read by the relay; any plausible value.
                        transaction_length: 279,
                        server_version: 80_400,
                    }
                    .body(),
                    ..ev
                }
            }
            _ => ev,
        })
        .collect();
    write_file(&events)
}

#[test]
fn varlen_examples_of_the_documentation() {
    // libs/mysql/serialization/readme.md: 65535 unsigned is 00000111 11111111 11111011 (BE).
    assert_eq!(varlen_uint(65535), [0xfb, 0xff, 0x07]);
    // Signed 65535: 00001111 11111111 11110011; -65535: ...11101011; -65536: ...11111011.
    assert_eq!(varlen_int(65535), [0xf3, 0xff, 0x0f]);
    assert_eq!(varlen_int(-65535), [0xeb, 0xff, 0x0f]);
    assert_eq!(varlen_int(-65536), [0xfb, 0xff, 0x0f]);
    assert_eq!(varlen_uint(0), [0]);
    assert_eq!(varlen_uint(127), [0xfe]);
    assert_eq!(varlen_uint(128), [0x01, 0x02]);
    let mut max = vec![0xff];
    max.extend_from_slice(&u64::MAX.to_le_bytes());
    assert_eq!(varlen_uint(u64::MAX), max);
    // 56 bits still fit 8 bytes: 7 trailing ones then a zero bit.
    assert_eq!(
        varlen_uint((1 << 56) - 1),
        [0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]
    );
}
