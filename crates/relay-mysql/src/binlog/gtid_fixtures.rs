//! GTIDs read from binlog files and the COM_BINLOG_DUMP_GTID encoding, checked against the
//! fixtures of `tests/fixtures/binlogs/` and MySQL's documented layout (`fixtures.rs`). They sit
//! here, beside the fixtures, because the GTID types they check are `outbox_relay_core`'s.

use outbox_relay_core::position::gtid::{gtid_from_event, Gtid, GtidTag, MysqlGtidSet};

use crate::binlog::fixtures;

fn set(s: &str) -> MysqlGtidSet {
    s.parse()
        .unwrap_or_else(|e| panic!("{s:?} should parse: {e}"))
}

fn uuid(s: &str) -> outbox_relay_core::position::gtid::ServerUuid {
    s.parse().expect("valid uuid")
}

/// The bytes mysql_common sends in COM_BINLOG_DUMP_GTID for a set, compared with the set
/// encoded as MySQL documents `Gtid_set::encode` in the tagged format (built in
/// `fixtures::tagged_gtid_set`): `01 02 00 00 00 00 00 01` (format 1, 2 entries, format
/// repeated in the low byte), then uuid `55778904-0299-11f1-b1b8-4ef0c4956feb`, tag length
/// 0, 1 interval [1, 14), then the same uuid, tag length `0a` (5 << 1) `mytag`, 1 interval
/// [1, 3). The comparison with the PREVIOUS_GTIDS event a MySQL 9.6 server wrote is in the
/// optional conformance target (`make conformance`).
#[test]
fn tagged_dump_request_encoding_matches_mysql() {
    use mysql_common::packets::ComBinlogDumpGtid;
    use mysql_common::proto::MySerialize;

    let sid = fixtures::uuid_bytes("55778904-0299-11f1-b1b8-4ef0c4956feb");
    let mysql_block =
        &fixtures::tagged_gtid_set(&[(sid, "", &[(1, 14)]), (sid, "mytag", &[(1, 3)])])[..];
    assert_eq!(
        mysql_block.len(),
        8 + (16 + 1 + 8 + 16) + (16 + 1 + 5 + 8 + 16)
    );

    let s = set("55778904-0299-11f1-b1b8-4ef0c4956feb:1-13:mytag:1-2");
    let packet = ComBinlogDumpGtid::new(1).with_sids(s.to_sids().expect("sids"));
    let mut bytes = Vec::new();
    packet.serialize(&mut bytes);
    // command (1), flags (2), server id (4), filename length (4) + "" , position (8),
    // sid block length (4), sid block.
    let len_at = 1 + 2 + 4 + 4 + 8;
    let block_len =
        u32::from_le_bytes(bytes[len_at..len_at + 4].try_into().expect("4 bytes")) as usize;
    let block = &bytes[len_at + 4..];
    assert_eq!(block_len, block.len());
    assert_eq!(block.len(), mysql_block.len());
    // The count: MySQL repeats the format (1) in the low byte; mysql_common writes 0 there,
    // which MySQL's decoder masks off.
    assert_eq!(mysql_block[..8], [1, 2, 0, 0, 0, 0, 0, 1]);
    assert_eq!(block[..8], [0, 2, 0, 0, 0, 0, 0, 1]);
    assert_eq!(block[8..], mysql_block[8..]);

    // An untagged set uses the classic format: a plain count, no tag fields.
    let s = set("55778904-0299-11f1-b1b8-4ef0c4956feb:1-13");
    let packet = ComBinlogDumpGtid::new(1).with_sids(s.to_sids().expect("sids"));
    let mut bytes = Vec::new();
    packet.serialize(&mut bytes);
    let block = &bytes[len_at + 4..];
    let mut expected = vec![1, 0, 0, 0, 0, 0, 0, 0];
    expected.extend_from_slice(uuid("55778904-0299-11f1-b1b8-4ef0c4956feb").as_bytes());
    expected.extend_from_slice(&1u64.to_le_bytes());
    expected.extend_from_slice(&1u64.to_le_bytes());
    expected.extend_from_slice(&14u64.to_le_bytes());
    assert_eq!(block, expected.as_slice());
}

/// Reads a binlog file: the PREVIOUS_GTIDS set and the GTID of every GTID event.
fn read_binlog(name: &str, bytes: &[u8]) -> (MysqlGtidSet, Vec<Gtid>) {
    use mysql_common::binlog::consts::BinlogVersion;
    use mysql_common::binlog::events::EventData;
    use mysql_common::binlog::BinlogFile;

    let binlog = BinlogFile::new(BinlogVersion::Version4, bytes)
        .unwrap_or_else(|e| panic!("{name}: binlog header: {e}"));
    let mut previous = None;
    let mut gtids = Vec::new();
    for event in binlog {
        let event = event.unwrap_or_else(|e| panic!("{name}: {e}"));
        match event.read_data().unwrap_or_else(|e| panic!("{name}: {e}")) {
            Some(EventData::PreviousGtidsEvent(ev)) => {
                assert!(previous.is_none(), "one PREVIOUS_GTIDS event");
                previous = Some(MysqlGtidSet::from_previous_gtids(&ev).expect("previous"));
            }
            Some(EventData::GtidEvent(ev)) => {
                gtids.push(gtid_from_event(&ev).expect("gtid"));
            }
            _ => {}
        }
    }
    (previous.expect("a PREVIOUS_GTIDS event"), gtids)
}

/// mysql8-gtid.000001 (MySQL 8.0.31, gtid_mode=ON), written after RESET MASTER: an empty
/// Previous_gtids at 126, then three transactions whose GTIDs were set with gtid_next
/// `3e11fa47-71ca-11e1-9e33-c80aa9429562:1`, `:2` and `:3` (mysql8-gtid.000001.sql; GTID
/// events at 157, 436 and 715 in mysql8-gtid.000001.events).
#[test]
fn fixture_untagged_gtids() {
    let name = "mysql8-gtid.000001";
    let (previous, gtids) = read_binlog(name, &fixtures::read(name));
    assert!(previous.is_empty());
    let expected: Vec<String> = (1..=3)
        .map(|n| format!("3e11fa47-71ca-11e1-9e33-c80aa9429562:{n}"))
        .collect();
    let got: Vec<String> = gtids.iter().map(ToString::to_string).collect();
    assert_eq!(got, expected);
    let mut executed = previous.clone();
    for g in &gtids {
        assert!(executed.add(g));
    }
    assert_eq!(
        executed.to_string(),
        "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-3"
    );
}

/// A tagged GTID as MySQL 8.4 writes it, which no server here can: mysql8-gtid.000001 with
/// its PREVIOUS_GTIDS event replaced by `55778904-0299-11f1-b1b8-4ef0c4956feb:1-13:mytag:1-2`
/// in the tagged format and its GTID events by GTID_TAGGED_LOG_EVENTs (type 42) of
/// `...:mytag:3`, `:4` and `:6`, built from MySQL's documented layout (`fixtures.rs`). In
/// MySQL's serialization format the sid (field 1) is 16 varlen bytes
/// `aa ee 25 02 08 04 65 02 22 c5 03 c5 02 e1 02 9c c1 03 11 03 55 02 de ad 03` = 55 77 89
/// 04 02 99 11 f1 b1 b8 4e f0 c4 95 6f eb, the gno (field 2, signed varlen) `0c` = 3, the
/// tag (field 3) `0a` (length 5) `mytag`. The same assertions on a file MySQL 9.6 wrote
/// are in the optional conformance target (`make conformance`).
#[test]
fn fixture_tagged_gtid() {
    let sid = fixtures::uuid_bytes("55778904-0299-11f1-b1b8-4ef0c4956feb");
    let file = fixtures::tagged_gtid_file(
        &[(sid, "", &[(1, 14)]), (sid, "mytag", &[(1, 3)])],
        sid,
        "mytag",
        [3, 4, 6],
    );
    let at = file
        .windows(2)
        .position(|w| w == [0xaa, 0xee])
        .expect("the sid of the first tagged event");
    assert_eq!(
        file[at..at + 25],
        [
            0xaa, 0xee, 0x25, 0x02, 0x08, 0x04, 0x65, 0x02, 0x22, 0xc5, 0x03, 0xc5, 0x02, 0xe1,
            0x02, 0x9c, 0xc1, 0x03, 0x11, 0x03, 0x55, 0x02, 0xde, 0xad, 0x03
        ]
    );
    assert_eq!(
        file[at + 25..at + 34],
        *b"\x04\x0c\x06\x0amytag",
        "gno 3, tag"
    );
    let (previous, gtids) = read_binlog("tagged GTID file", &file);
    assert_eq!(
        previous.to_string(),
        "55778904-0299-11f1-b1b8-4ef0c4956feb:1-13:mytag:1-2"
    );
    let got: Vec<String> = gtids.iter().map(ToString::to_string).collect();
    assert_eq!(
        got,
        vec![
            "55778904-0299-11f1-b1b8-4ef0c4956feb:mytag:3",
            "55778904-0299-11f1-b1b8-4ef0c4956feb:mytag:4",
            "55778904-0299-11f1-b1b8-4ef0c4956feb:mytag:6"
        ]
    );
    let g = &gtids[0];
    assert_eq!(g.tag().map(GtidTag::as_str), Some("mytag"));
    assert_eq!(g.gno(), 3);
    assert!(!previous.contains(&g.uuid(), g.tag(), g.gno()));
    let mut executed = previous.clone();
    assert!(executed.add(g));
    assert_eq!(
        executed.to_string(),
        "55778904-0299-11f1-b1b8-4ef0c4956feb:1-13:mytag:1-3"
    );
    // The untagged GTID with the same number is a different GTID.
    assert!(!executed.contains(&g.uuid(), None, 14));
    assert!(executed.contains(&g.uuid(), None, 3));
}
