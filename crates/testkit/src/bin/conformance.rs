//! Optional conformance checks (`make conformance`, not part of `make test`): the relay's binlog
//! reading against real binlog files written by servers this machine cannot run, MySQL 8.4 /
//! 9.x tagged GTIDs above all. The files are someone else's test data and are not in the
//! repository; `OUTBOX_CONFORMANCE_BINLOGS` names the folder that holds them, in the layout of
//! the `mysql_common` crate's `test-data/binlogs` (file names below).
//!
//! Exits 0 when every check passes, 1 when one fails, 2 when the variable is unset or the
//! folder or a file is missing.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use mysql_common::binlog::consts::BinlogVersion;
use mysql_common::binlog::events::EventData;
use mysql_common::binlog::BinlogFile;
use outbox_relay_core::config::TableName;
use outbox_relay_core::position::gtid::{gtid_from_event, Gtid, MysqlGtidSet};
use outbox_relay_core::position::GtidState;
use outbox_relay_mysql::binlog::source::BinlogFileSource;
use outbox_relay_mysql::decode::json::render_binlog_json;
use outbox_relay_mysql::decode::Decoder;

const VAR: &str = "OUTBOX_CONFORMANCE_BINLOGS";
const TAGGED: &str = "binlog_transaction_with_GTID_TAG.000001";
const UNTAGGED: &str = "binlog_transaction_with_GTID.000001";
const JSON: &str = "json.binlog.000001";
const JSON_OPAQUE: &str = "json-opaque.binlog";
const COMPRESSED: &str = "transaction_compression.000001";
const ALL: [&str; 5] = [TAGGED, UNTAGGED, JSON, JSON_OPAQUE, COMPRESSED];

type Check = Result<(), String>;

/// A named check on the corpus folder.
type NamedCheck = (&'static str, fn(&Path) -> Check);

fn main() -> ExitCode {
    let Some(dir) = std::env::var_os(VAR).filter(|d| !d.is_empty()) else {
        eprintln!(
            "conformance: {VAR} is not set. Set it to a folder of real binlog files (the layout \
             of mysql_common's test-data/binlogs: {}), e.g. \
             {VAR}=<checkout of rust_mysql_common>/test-data/binlogs make conformance",
            ALL.join(", ")
        );
        return ExitCode::from(2);
    };
    let dir = PathBuf::from(dir);
    if !dir.is_dir() {
        eprintln!("conformance: {VAR}={} is not a folder", dir.display());
        return ExitCode::from(2);
    }
    let missing: Vec<&str> = ALL
        .iter()
        .copied()
        .filter(|f| !dir.join(f).is_file())
        .collect();
    if !missing.is_empty() {
        eprintln!(
            "conformance: {VAR}={} lacks {}",
            dir.display(),
            missing.join(", ")
        );
        return ExitCode::from(2);
    }
    let checks: [NamedCheck; 6] = [
        (
            "tagged GTID file: PREVIOUS_GTIDS and GTID_TAGGED_LOG_EVENT",
            tagged_gtids,
        ),
        (
            "tagged GTID set: COM_BINLOG_DUMP_GTID bytes equal MySQL's own encoding",
            tagged_dump_request,
        ),
        (
            "tagged GTID file: the decoder extends the executed set at commit",
            tagged_decode,
        ),
        (
            "untagged GTID file: GTIDs counted at commit",
            untagged_gtids,
        ),
        (
            "JSON files: binary JSON rendered as MySQL prints it",
            json_renders,
        ),
        (
            "compressed transaction: one boundary at the payload event's end",
            compressed,
        ),
    ];
    let mut failed = 0;
    for (name, check) in checks {
        match check(&dir) {
            Ok(()) => println!("ok     {name}"),
            Err(e) => {
                failed += 1;
                println!("FAILED {name}: {e}");
            }
        }
    }
    println!(
        "conformance: {} of {} checks passed ({})",
        checks.len() - failed,
        checks.len(),
        dir.display()
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn ensure_eq<T: PartialEq + std::fmt::Debug>(what: &str, got: T, want: T) -> Check {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}: got {got:?}, expected {want:?}"))
    }
}

fn read(dir: &Path, name: &str) -> Result<Vec<u8>, String> {
    let path = dir.join(name);
    std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))
}

/// The PREVIOUS_GTIDS set and the GTID of every GTID event of a file.
fn gtids_of(dir: &Path, name: &str) -> Result<(MysqlGtidSet, Vec<Gtid>), String> {
    let bytes = read(dir, name)?;
    let binlog =
        BinlogFile::new(BinlogVersion::Version4, &bytes[..]).map_err(|e| format!("{name}: {e}"))?;
    let mut previous = None;
    let mut gtids = Vec::new();
    for event in binlog {
        let event = event.map_err(|e| format!("{name}: {e}"))?;
        match event.read_data().map_err(|e| format!("{name}: {e}"))? {
            Some(EventData::PreviousGtidsEvent(ev)) => {
                previous = Some(
                    MysqlGtidSet::from_previous_gtids(&ev).map_err(|e| format!("{name}: {e}"))?,
                );
            }
            Some(EventData::GtidEvent(ev)) => {
                gtids.push(gtid_from_event(&ev).map_err(|e| format!("{name}: {e}"))?);
            }
            _ => {}
        }
    }
    Ok((
        previous.ok_or(format!("{name}: no PREVIOUS_GTIDS event"))?,
        gtids,
    ))
}

/// MySQL 9.6 file: PREVIOUS_GTIDS `55778904-0299-11f1-b1b8-4ef0c4956feb:1-13:mytag:1-2`, one
/// GTID_TAGGED_LOG_EVENT `...:mytag:3` (read by hand with `xxd`, see the README of the corpus).
fn tagged_gtids(dir: &Path) -> Check {
    let (previous, gtids) = gtids_of(dir, TAGGED)?;
    let uuid = "55778904-0299-11f1-b1b8-4ef0c4956feb";
    ensure_eq(
        "previous set",
        previous.to_string(),
        format!("{uuid}:1-13:mytag:1-2"),
    )?;
    let got: Vec<String> = gtids.iter().map(ToString::to_string).collect();
    ensure_eq("GTIDs", got, vec![format!("{uuid}:mytag:3")])?;
    let g = &gtids[0];
    ensure_eq(
        "tag",
        g.tag().map(|t| t.as_str().to_owned()),
        Some("mytag".into()),
    )?;
    ensure_eq("gno", g.gno(), 3)?;
    ensure_eq(
        "in previous",
        previous.contains(&g.uuid(), g.tag(), g.gno()),
        false,
    )?;
    let mut executed = previous.clone();
    ensure_eq("added", executed.add(g), true)?;
    ensure_eq(
        "executed",
        executed.to_string(),
        format!("{uuid}:1-13:mytag:1-3"),
    )?;
    // The untagged GTID with the same number is a different GTID.
    ensure_eq("untagged 14", executed.contains(&g.uuid(), None, 14), false)?;
    ensure_eq("untagged 3", executed.contains(&g.uuid(), None, 3), true)
}

/// The sid block mysql_common sends in COM_BINLOG_DUMP_GTID equals the PREVIOUS_GTIDS event body
/// MySQL 9.6 encoded (`Gtid_set::encode`) at 127..245 of the tagged file, except the low byte of
/// the count, where MySQL repeats the format (1) and mysql_common writes 0 (MySQL masks it off).
fn tagged_dump_request(dir: &Path) -> Check {
    use mysql_common::packets::ComBinlogDumpGtid;
    use mysql_common::proto::MySerialize;

    let file = read(dir, TAGGED)?;
    let mysql_block = file
        .get(127 + 19..127 + 118 - 4)
        .ok_or(format!("{TAGGED} is shorter than 245 bytes"))?;
    let set: MysqlGtidSet = "55778904-0299-11f1-b1b8-4ef0c4956feb:1-13:mytag:1-2"
        .parse()
        .map_err(|e| format!("{e}"))?;
    let sids = set.to_sids().map_err(|e| format!("{e}"))?;
    let mut bytes = Vec::new();
    ComBinlogDumpGtid::new(1)
        .with_sids(sids)
        .serialize(&mut bytes);
    let len_at = 1 + 2 + 4 + 4 + 8;
    let block = bytes
        .get(len_at + 4..)
        .ok_or("short COM_BINLOG_DUMP_GTID packet")?;
    ensure_eq("block length", block.len(), mysql_block.len())?;
    ensure_eq(
        "MySQL's count",
        &mysql_block[..8],
        &[1, 2, 0, 0, 0, 0, 0, 1][..],
    )?;
    ensure_eq(
        "mysql_common's count",
        &block[..8],
        &[0, 2, 0, 0, 0, 0, 0, 1][..],
    )?;
    ensure_eq("entries", &block[8..], &mysql_block[8..])
}

/// Every boundary's GTID set while decoding `name` from `start`.
fn boundaries(
    dir: &Path,
    name: &str,
    start: Option<GtidState>,
) -> Result<Vec<(u64, Option<String>)>, String> {
    let path = dir.join(name);
    let mut source = BinlogFileSource::open(&path).map_err(|e| e.to_string())?;
    let none = TableName::parse("none.none", None).map_err(|e| e.to_string())?;
    let mut decoder = Decoder::new(Vec::new(), none, start);
    let mut out = Vec::new();
    while let Some(ev) = source.next_event() {
        let ev = ev.map_err(|e| e.to_string())?;
        let (_, b) = decoder
            .decode(&ev, |id| source.table_map(id))
            .map_err(|e| e.to_string())?
            .into_parts();
        out.extend(b.map(|b| (b.position.pos, b.gtid_set)));
    }
    Ok(out)
}

fn tagged_decode(dir: &Path) -> Check {
    let uuid = "55778904-0299-11f1-b1b8-4ef0c4956feb";
    let start: MysqlGtidSet = format!("{uuid}:1-13:mytag:1-2")
        .parse()
        .map_err(|e| format!("{e}"))?;
    let b = boundaries(dir, TAGGED, Some(GtidState::MySql(start)))?;
    ensure_eq(
        "last set",
        b.last().and_then(|b| b.1.clone()),
        Some(format!("{uuid}:1-13:mytag:1-3")),
    )
}

/// MySQL 5.6 file: GTID events `006c2cf2-b1ea-11e4-9057-8c705a3d3e78:1`, `:2`, `:3`.
fn untagged_gtids(dir: &Path) -> Check {
    let (previous, gtids) = gtids_of(dir, UNTAGGED)?;
    ensure_eq("previous empty", previous.is_empty(), true)?;
    let uuid = "006c2cf2-b1ea-11e4-9057-8c705a3d3e78";
    let got: Vec<String> = gtids.iter().map(ToString::to_string).collect();
    let want: Vec<String> = (1..=3).map(|n| format!("{uuid}:{n}")).collect();
    ensure_eq("GTIDs", got, want)?;
    let b = boundaries(dir, UNTAGGED, Some(GtidState::MySql(MysqlGtidSet::new())))?;
    let sets: Vec<Option<String>> = b.into_iter().map(|b| b.1).collect();
    ensure_eq(
        "sets at commit",
        sets,
        vec![
            Some(format!("{uuid}:1")),
            Some(format!("{uuid}:1-2")),
            Some(format!("{uuid}:1-3")),
        ],
    )
}

/// Every JSON value of every rows event, as "<event> <image>: <rendering or error>".
fn json_values(dir: &Path, name: &str) -> Result<Vec<String>, String> {
    use mysql_common::binlog::events::RowsEventData;
    use mysql_common::binlog::value::BinlogValue;
    let mut src = BinlogFileSource::open(&dir.join(name)).map_err(|e| e.to_string())?;
    let mut seen = Vec::new();
    while let Some(ev) = src.next_event() {
        let ev = ev.map_err(|e| e.to_string())?;
        let Ok(Some(EventData::RowsEvent(rows))) = ev.event.read_data() else {
            continue;
        };
        let kind = match &rows {
            RowsEventData::WriteRowsEvent(_) => "write",
            RowsEventData::UpdateRowsEvent(_) => "update",
            RowsEventData::PartialUpdateRowsEvent(_) => "partial-update",
            _ => "other",
        };
        let tme = src
            .table_map(rows.table_id())
            .ok_or(format!("{name}: no table map"))?;
        for row in rows.rows(tme) {
            let (before, after) = row.map_err(|e| format!("{name}: {e}"))?;
            for (image, row) in [("before", before), ("after", after)] {
                let Some(row) = row else { continue };
                for i in 0..row.len() {
                    let Some(v @ (BinlogValue::Jsonb(_) | BinlogValue::JsonDiff(_))) =
                        row.as_ref(i)
                    else {
                        continue;
                    };
                    let text = match render_binlog_json(v) {
                        Ok(t) => String::from_utf8_lossy(&t).into_owned(),
                        Err(e) => format!("error {e:?}"),
                    };
                    seen.push(format!("{kind} {image}: {text}"));
                }
            }
        }
    }
    Ok(seen)
}

/// Expected texts decoded by hand from the files' bytes (the corpus has no Rows_query events).
fn json_renders(dir: &Path) -> Check {
    let joe = |age| format!(r#"{{"age": {age}, "data": "xxxxxxxxxx", "name": "Joe"}}"#);
    let sue = |age| format!(r#"{{"age": {age}, "data": "yyyyyyyyyy", "name": "Sue"}}"#);
    let pete = |age| format!(r#"{{"age": {age}, "data": "zzzzzzzzzz", "name": "Pete"}}"#);
    let mut want = Vec::new();
    for _ in 0..2 {
        want.push(format!("write after: {}", joe(24)));
        want.push(format!("write after: {}", sue(32)));
        want.push(format!("write after: {}", pete(40)));
    }
    for _ in 0..2 {
        for (f, a) in [
            (&joe as &dyn Fn(i32) -> String, 24),
            (&sue, 32),
            (&pete, 40),
        ] {
            want.push(format!("update before: {}", f(a)));
            want.push(format!("update after: {}", f(a + 1)));
        }
    }
    for _ in 0..6 {
        want.push("partial-update after: error PartialUpdate".to_owned());
    }
    ensure_eq(JSON, json_values(dir, JSON)?, want)?;
    let want: Vec<String> = [
        r#"{"a": "base64:type15:VQ=="}"#,
        r#"{"b": "2012-03-18"}"#,
        r#"{"c": "2012-03-18 11:30:45.000000"}"#,
        r#"{"c": "87:31:46.654321"}"#,
        r#"{"d": 123.456}"#,
        r#"{"e": 9.00}"#,
        r#"{"e": [0, 1, true, false]}"#,
        r#"{"e": null}"#,
    ]
    .iter()
    .map(|t| format!("write after: {t}"))
    .collect();
    ensure_eq(JSON_OPAQUE, json_values(dir, JSON_OPAQUE)?, want)
}

/// MySQL 8.0 file: TRANSACTION_PAYLOAD 274..431 holds the one transaction.
fn compressed(dir: &Path) -> Check {
    let b = boundaries(dir, COMPRESSED, None)?;
    let ends: Vec<u64> = b.into_iter().map(|b| b.0).collect();
    ensure_eq("boundaries", ends, vec![431])
}
