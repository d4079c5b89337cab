//! The decoder on MariaDB compressed events (`binlog/compressed.rs`), end to end on a capture.
//! Here rather than beside `compressed.rs` so that `binlog/` does not import `decode/`.
//!
//! MariaDB compressed events captured from a MariaDB 10.11 server with
//! `log_bin_compress=ON`, `log_bin_compress_min_len=10` (`testdata/mariadb-compressed-bin.000002`):
//!
//! ```sql
//! CREATE DATABASE cap;
//! CREATE TABLE cap.t (id BIGINT PRIMARY KEY, txt VARCHAR(100), payload LONGTEXT)
//!   DEFAULT CHARSET utf8mb4;                                  -- Query_compressed, ends at 726
//! INSERT INTO cap.t VALUES (7, 'grüße', REPEAT('abc', 20));   -- Write_rows_compressed_v1, 987
//! UPDATE cap.t SET txt='x' WHERE id=7;                        -- Update_rows_compressed_v1, 1266
//! DELETE FROM cap.t WHERE id=7;                               -- Delete_rows_compressed_v1, 1522
//! ```
//!
//! Expected values are those statements and `mariadb-binlog -vv` of the file.

use crate::binlog::source::BinlogFileSource;
use crate::decode::Decoder;
use mysql_async::binlog::events::{EventData, RowsEventData};
use mysql_async::binlog::row::BinlogRow;
use mysql_async::binlog::value::BinlogValue;
use mysql_async::Value;
use outbox_relay_core::config::TableName;
use outbox_relay_core::outbox::OutboxEvent;
use std::path::{Path, PathBuf};

const NAME: &str = "mariadb-compressed-bin.000002";

fn capture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(NAME)
}

fn values(row: Option<BinlogRow>) -> Vec<BinlogValue<'static>> {
    row.expect("image").unwrap()
}

fn text(s: &str) -> BinlogValue<'static> {
    BinlogValue::Value(Value::Bytes(s.as_bytes().to_vec()))
}

#[test]
fn compressed_events_become_the_uncompressed_events() {
    let mut source = BinlogFileSource::open(&capture()).expect("capture opens");
    let (mut queries, mut rows) = (Vec::new(), Vec::new());
    while let Some(ev) = source.next_event() {
        let ev = ev.expect("event decodes");
        let raw = ev.event.header().event_type_raw();
        assert!(!(165..=171).contains(&raw), "type {raw} left compressed");
        match ev.event.read_data().expect("parses") {
            Some(EventData::QueryEvent(q)) => {
                queries.push((ev.position.pos, q.query().into_owned()));
            }
            Some(EventData::RowsEvent(r)) => {
                let tme = source.table_map(r.table_id()).expect("table map");
                let kind = match &r {
                    RowsEventData::WriteRowsEventV1(_) => "write",
                    RowsEventData::UpdateRowsEventV1(_) => "update",
                    RowsEventData::DeleteRowsEventV1(_) => "delete",
                    _ => "other",
                };
                for row in r.rows(tme) {
                    let (before, after) = row.expect("row decodes");
                    rows.push((
                        ev.position.pos,
                        kind,
                        before.map(|b| values(Some(b))),
                        after.map(|a| values(Some(a))),
                    ));
                }
            }
            _ => {}
        }
    }
    assert_eq!(
        queries,
        [
            (502, "CREATE DATABASE cap".to_owned()),
            (
                726,
                "CREATE TABLE cap.t (id BIGINT PRIMARY KEY, txt VARCHAR(100), payload \
                 LONGTEXT) DEFAULT CHARSET utf8mb4"
                    .to_owned()
            ),
        ]
    );
    let abc = "abc".repeat(20);
    let row = |txt: &str| vec![BinlogValue::Value(Value::Int(7)), text(txt), text(&abc)];
    assert_eq!(
        rows,
        [
            (987, "write", None, Some(row("grüße"))),
            (1266, "update", Some(row("grüße")), Some(row("x"))),
            (1522, "delete", Some(row("x")), None),
        ]
    );
}

#[test]
fn decoder_relays_the_compressed_insert() {
    let mut source = BinlogFileSource::open(&capture()).expect("capture opens");
    let toml = "[mysql]\nurl = \"mysql://root@127.0.0.1:3306/shop\"\nserver_id = 9\n\
                [kafka]\nbootstrap_servers = \"127.0.0.1:9092\"\n[outbox]\n\
                tables = [\"cap.t\"]\n[outbox.columns]\naggregate_type = \"txt\"\n\
                aggregate_id = \"id\"\nevent_type = \"txt\"\nevent_key = \"id\"\n\
                created_at = \"\"\n";
    let mappings = outbox_relay_core::config::RelayConfig::from_toml_str(toml)
        .and_then(|c| c.table_mappings())
        .expect("mapping");
    let mut decoder = Decoder::new(
        mappings,
        TableName::parse("none.none", None).expect("table"),
        None,
    );
    let (mut rows, mut ends) = (Vec::<OutboxEvent>::new(), Vec::new());
    while let Some(ev) = source.next_event() {
        let ev = ev.expect("event decodes");
        let (r, b) = decoder
            .decode(&ev, |id| source.table_map(id))
            .expect("decodes")
            .into_parts();
        rows.extend(r.into_iter().map(|r| r.expect("row")));
        ends.extend(b.map(|b| (b.position.pos, b.gtid_set)));
    }
    assert_eq!(rows.len(), 1, "only the INSERT");
    assert_eq!(rows[0].id.as_deref(), Some(&b"7"[..]));
    assert_eq!(rows[0].aggregate_type, "grüße");
    assert_eq!(rows[0].payload, Some("abc".repeat(20).into_bytes()));
    assert_eq!(rows[0].position.to_string(), format!("{NAME}:987"));
    let gtid = |n: u32| Some(format!("0-1-{n}"));
    assert_eq!(
        ends,
        [
            (502, gtid(1)),
            (726, gtid(2)), // the compressed CREATE TABLE ends its group
            (1018, gtid(3)),
            (1297, gtid(4)),
            (1553, gtid(5)),
        ]
    );
}

#[test]
fn v2_layout_with_extra_data_is_rebuilt() {
    // MariaDB writes v1 rows events; build the v2 form (type 169, an empty extra-data
    // block `02 00` after the flags) of the captured compressed INSERT (923..987).
    let file = std::fs::read(capture()).expect("capture reads");
    let v1 = &file[923..987];
    let body = &v1[19..v1.len() - 4];
    let mut v2 = v1[..19].to_vec();
    v2[4] = 169;
    v2[9..13].copy_from_slice(&(v1.len() as u32 + 2).to_le_bytes());
    v2.extend_from_slice(&body[..8]);
    v2.extend_from_slice(&[2, 0]);
    v2.extend_from_slice(&body[8..]);
    let crc = crc32fast::hash(&v2);
    v2.extend_from_slice(&crc.to_le_bytes());

    let mut source = BinlogFileSource::open(&capture()).expect("capture opens");
    let mut fde = None;
    while let Some(ev) = source.next_event() {
        let ev = ev.expect("event decodes");
        if ev.position.pos == 923 {
            fde = Some(ev.event.fde().clone());
            break; // the table map of the INSERT was just read
        }
    }
    let fde = fde.expect("table map at 923");
    let event = mysql_async::binlog::events::Event::read(&fde, v2.as_slice()).expect("reads");
    let out = crate::binlog::compressed::uncompress_mariadb(&event).expect("uncompresses");
    assert_eq!(out.header().event_type_raw(), 30, "WRITE_ROWS v2");
    let Some(EventData::RowsEvent(r)) = out.read_data().expect("parses") else {
        panic!("not a rows event");
    };
    let tme = source.table_map(r.table_id()).expect("table map");
    let rows: Vec<_> = r.rows(tme).map(|row| values(row.expect("row").1)).collect();
    let abc = "abc".repeat(20);
    assert_eq!(
        rows,
        [vec![
            BinlogValue::Value(Value::Int(7)),
            text("grüße"),
            text(&abc)
        ]]
    );
}

/// The capture with bytes of one event's zlib stream flipped and its CRC32 recomputed.
fn damaged_copy(dir: &Path, start: usize, end: usize, flip: usize) -> PathBuf {
    let mut bytes = std::fs::read(capture()).expect("capture reads");
    bytes[flip] ^= 0xff;
    bytes[flip + 1] ^= 0xff;
    let crc = crc32fast::hash(&bytes[start..end - 4]);
    bytes[end - 4..end].copy_from_slice(&crc.to_le_bytes());
    std::fs::create_dir_all(dir).expect("temp dir");
    let path = dir.join(NAME);
    std::fs::write(&path, bytes).expect("temp file");
    path
}

fn first_error(path: &Path) -> String {
    let mut source = BinlogFileSource::open(path).expect("opens");
    while let Some(ev) = source.next_event() {
        if let Err(e) = ev {
            return e.to_string();
        }
    }
    panic!("no error");
}

#[test]
fn damaged_compressed_events_stop_with_their_position() {
    let dir = std::env::temp_dir().join(format!("outbox-relay-mdbz-{}", std::process::id()));
    // Write_rows_compressed_v1 (type 166) 923..987: header 19, table id 6, flags 2, width 1,
    // bitmap 1, then 0x81 0x52 (1 length byte: 82) and the zlib stream from 954.
    let rows = first_error(&damaged_copy(&dir, 923, 987, 960));
    // Query_compressed 544..726: the zlib stream starts at 544 + 19 + 13 + 35 + 1 + 2.
    let query = first_error(&damaged_copy(&dir, 544, 726, 620));
    let _ = std::fs::remove_dir_all(&dir);
    for (error, ty, end) in [(rows, 166, 987), (query, 165, 726)] {
        let prefix = format!(
            "binlog: the MariaDB compressed binlog event (type {ty}) ending at {NAME}:{end} \
             cannot be decompressed: zlib: "
        );
        assert!(error.starts_with(&prefix), "{error}");
        assert!(error.contains("SET GLOBAL log_bin_compress=OFF"), "{error}");
    }
}
