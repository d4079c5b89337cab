//! The rows-event decoder: a TABLE_MAP event built from the input (column types, their
//! metadata, optional metadata: names, signedness, character sets, ENUM/SET labels), then a
//! rows event of that table (WRITE/UPDATE/DELETE, v1 or v2, an after-image bitmap, rows whose
//! values are encoded mostly as their column type and metadata say), both as raw binlog events
//! parsed by mysql_common as the relay's source does, then `Decoder::decode` with one of a few
//! outbox mappings. The structure only makes the fuzzer get deep: every length, metadata byte
//! and value can still be anything. Errors are fine; panics are not.
//!
//! `ROWS_EVENT_DEBUG=1` prints each rows event's result, to see how deep a corpus gets:
//! `ROWS_EVENT_DEBUG=1 target/x86_64-unknown-linux-gnu/release/rows_event -runs=0 corpus/rows_event`.
#![no_main]

use std::sync::OnceLock;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use mysql_common::binlog::events::{Event, TableMapEvent};
use mysql_common::constants::ColumnType;
use outbox_relay_mysql::binlog::source::SourceEvent;
use outbox_relay_core::config::TableName;
use outbox_relay_core::outbox::mapping::TableMapping;
use outbox_relay_mysql::decode::Decoder;
use outbox_relay_core::position::BinlogPosition;
use outbox_relay_fuzz::{binlog_event, config};

/// Column type codes (`enum_field_types`) of table maps MySQL and MariaDB write, picked by
/// index so most columns have a real type.
const TYPES: [u8; 29] = [
    1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 242, 245, 246, 247, 248, 249,
    250, 251, 252, 254, 255,
];
/// Types no server writes in a table map (or only for functional indexes): seldom picked.
const RARE_TYPES: [u8; 4] = [0, 6, 20, 253];

/// The mapped column names of the default mapping, given to the first columns.
const REQUIRED: [&str; 7] = [
    "id",
    "aggregate_type",
    "aggregate_id",
    "event_type",
    "event_key",
    "payload",
    "created_at",
];
/// Other names a column may take (the extra mappings use `part`, `extra`, `other`).
const NAMES: [&str; 8] = ["part", "extra", "other", "ID", "Payload", "", "note", "é"];

/// Mappings: the defaults; raw keys, hex binaries, partition and additional columns; raw
/// binaries, a time zone and columns read by several fields.
const MAPPINGS: [&str; 3] = [
    "tables = [\"shop.outbox\"]\n",
    "tables = [\"shop.outbox\"]\nkey_format = \"raw\"\nbinary_format = \"hex\"\n\
     null_payload = \"dead_letter\"\non_update = \"fail\"\n\
     additional = [{ column = \"extra\", placement = \"header\" }, \
     { column = \"other\", placement = \"envelope\", alias = \"o\" }]\n\
     [outbox.columns]\ncreated_at = \"\"\npartition = \"part\"\n",
    "tables = [\"shop.outbox\"]\nbinary_format = \"raw\"\nnull_payload = \"skip\"\n\
     on_update = \"warn\"\ndatetime_time_zone = \"Europe/Berlin\"\n\
     additional = [{ column = \"payload\", placement = \"envelope\", alias = \"raw\" }, \
     { column = \"id\", placement = \"header\", alias = \"row_id\" }, { column = \"note\", placement = \"envelope\" }]\n\
     [outbox.columns]\npartition = \"aggregate_id\"\n",
];

struct Setup {
    mappings: Vec<Vec<TableMapping>>,
    checkpoint: TableName,
}

fn setup() -> &'static Setup {
    static SETUP: OnceLock<Setup> = OnceLock::new();
    SETUP.get_or_init(|| Setup {
        mappings: MAPPINGS
            .iter()
            .map(|m| config(m).table_mappings().expect("valid mapping"))
            .collect(),
        checkpoint: config(MAPPINGS[0])
            .checkpoint_table()
            .expect("checkpoint table"),
    })
}

#[derive(Debug, Arbitrary)]
struct Input {
    mapping: u8,
    table: TableChoice,
    table_id: u8,
    columns: Vec<Column>,
    /// 0..=239: the names in the table map; else `names_other`.
    names: u8,
    names_other: NameSource,
    signedness: Option<Vec<u8>>,
    charset: Option<Charset>,
    enum_set_charset: Option<Charset>,
    /// ENUM labels / SET members per ENUM or SET column.
    labels: Option<Vec<Vec<Vec<u8>>>>,
    /// Appended to the optional metadata as they are (when `extra` is 0xff).
    extra_optional: Vec<u8>,
    extra: u8,
    kind: RowsKind,
    /// The rows event's column count, when not the table map's.
    width: Option<u8>,
    /// The after-image bitmap, when not all columns.
    image: Option<Vec<u8>>,
    rows: Vec<Row>,
    /// Appended to the rows data as they are.
    trailing: Vec<u8>,
    /// Decode the rows event twice (the second time with the cached layout).
    repeat: bool,
}

#[derive(Debug, Arbitrary)]
enum TableChoice {
    Outbox,
    Checkpoint,
    Other,
}

#[derive(Debug, Arbitrary, Clone, Copy)]
enum NameSource {
    /// `binlog_row_metadata=FULL`: COLUMN_NAME in the table map.
    TableMap,
    /// `MINIMAL`: names known from the tracked layout.
    Tracked,
    /// `MINIMAL` with a tracked layout of another column count.
    TrackedOther(u8),
    /// `MINIMAL` without a tracked layout.
    Unknown,
}

/// Deviations from a well-formed event are rare (a flag of one value in 16 or 256): with 50%
/// each (`Option`, `bool`), a table of seven mapped columns would almost never be whole.
#[derive(Debug, Arbitrary)]
struct Column {
    ty: u8,
    meta: [u8; 4],
    /// High nibble 0xf: `raw_meta` instead of the type's length of `meta`; low nibble 0xf:
    /// the name `name` instead of the mapped name of its position.
    flags: u8,
    raw_meta: Vec<u8>,
    name: u8,
}

#[derive(Debug, Arbitrary)]
enum Charset {
    /// DEFAULT_CHARSET: the default collation and (column index, collation) exceptions.
    Default(u16, Vec<(u8, u16)>),
    /// COLUMN_CHARSET: one collation per character column.
    PerColumn(Vec<u16>),
}

impl Charset {
    /// One collation per column for `n` columns (COLUMN_CHARSET); DEFAULT_CHARSET as it is.
    fn sized(&self, n: usize) -> Charset {
        match self {
            Charset::Default(d, rest) => Charset::Default(*d, rest.clone()),
            Charset::PerColumn(c) => {
                Charset::PerColumn((0..n).map(|i| c.get(i).copied().unwrap_or(45)).collect())
            }
        }
    }
}

#[derive(Debug, Arbitrary)]
enum RowsKind {
    Write,
    WriteV1,
    Update,
    Delete,
}

#[derive(Debug, Arbitrary)]
struct Row {
    nulls: Vec<u8>,
    values: Vec<Value>,
    /// The whole row image as it is instead (when `use_raw` is 0xff).
    raw: Vec<u8>,
    use_raw: u8,
}

#[derive(Debug, Arbitrary)]
struct Value {
    bytes: Vec<u8>,
    /// 0xff: the bytes as they are, without the length prefix or size of the column's type.
    raw: u8,
}

fn column_type(c: &Column) -> u8 {
    match c.ty {
        0..=231 => TYPES[usize::from(c.ty) % TYPES.len()],
        232..=247 => RARE_TYPES[usize::from(c.ty) % RARE_TYPES.len()],
        _ => c.meta[3],
    }
}

/// The column's type as mysql_common resolves it (a STRING column's metadata may say ENUM or
/// SET).
fn real_type(ty: u8, meta: &[u8; 4]) -> u8 {
    match (ty, meta[0]) {
        (254, 0xf7) => 247,
        (254, 0xf8) => 248,
        _ => ty,
    }
}

/// Bytes of column metadata a type has in the table map (mysql_common `get_metadata`).
fn meta_len(ty: u8, meta: &[u8; 4]) -> usize {
    match ty {
        4 | 5 | 17 | 18 | 19 | 242 | 245 | 249..=252 | 255 => 1,
        15 | 16 | 246..=248 | 254 => 2,
        20 if meta[0] == 15 => 4,
        20 => 1 + meta_len(meta[0], &[meta[1], meta[2], meta[3], 0]).min(3),
        _ => 0,
    }
}

fn lenenc(out: &mut Vec<u8>, n: u64) {
    match n {
        0..=250 => out.push(n as u8),
        251..=0xffff => {
            out.push(0xfc);
            out.extend_from_slice(&(n as u16).to_le_bytes());
        }
        0x1_0000..=0xff_ffff => {
            out.push(0xfd);
            out.extend_from_slice(&(n as u32).to_le_bytes()[..3]);
        }
        _ => {
            out.push(0xfe);
            out.extend_from_slice(&n.to_le_bytes());
        }
    }
}

fn lenenc_bytes(out: &mut Vec<u8>, b: &[u8]) {
    lenenc(out, b.len() as u64);
    out.extend_from_slice(b);
}

fn optional_field(out: &mut Vec<u8>, kind: u8, value: &[u8]) {
    out.push(kind);
    lenenc_bytes(out, value);
}

fn charset_field(out: &mut Vec<u8>, default_kind: u8, c: &Charset) {
    let mut v = Vec::new();
    match c {
        Charset::Default(default, rest) => {
            lenenc(&mut v, u64::from(*default));
            for (col, coll) in rest {
                lenenc(&mut v, u64::from(*col));
                lenenc(&mut v, u64::from(*coll));
            }
            optional_field(out, default_kind, &v);
        }
        Charset::PerColumn(colls) => {
            for coll in colls {
                lenenc(&mut v, u64::from(*coll));
            }
            optional_field(out, default_kind + 1, &v);
        }
    }
}

fn column_name(i: usize, c: &Column) -> &'static str {
    if c.flags & 0x0f == 0x0f {
        NAMES[usize::from(c.name) % NAMES.len()]
    } else {
        REQUIRED.get(i).copied().unwrap_or(NAMES[i % 3])
    }
}

fn name_source(input: &Input) -> NameSource {
    if input.names < 240 {
        NameSource::TableMap
    } else {
        input.names_other
    }
}

/// `bytes` resized to `n` (zeros added).
fn sized(bytes: &[u8], n: usize) -> Vec<u8> {
    (0..n).map(|i| bytes.get(i).copied().unwrap_or(0)).collect()
}

fn table_map_body(input: &Input, columns: &[Column], types: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&u64::from(input.table_id).to_le_bytes()[..6]);
    b.extend_from_slice(&1u16.to_le_bytes()); // flags
    let (db, table) = match input.table {
        TableChoice::Outbox => ("shop", "outbox"),
        TableChoice::Checkpoint => ("shop", setup().checkpoint.table.as_str()),
        TableChoice::Other => ("shop", "orders"),
    };
    for name in [db, table] {
        b.push(name.len() as u8);
        b.extend_from_slice(name.as_bytes());
        b.push(0);
    }
    lenenc(&mut b, columns.len() as u64);
    b.extend_from_slice(types);
    let mut meta = Vec::new();
    for (c, &ty) in columns.iter().zip(types) {
        if c.flags & 0xf0 == 0xf0 {
            meta.extend_from_slice(&c.raw_meta);
        } else {
            meta.extend_from_slice(&c.meta[..meta_len(ty, &c.meta)]);
        }
    }
    lenenc_bytes(&mut b, &meta);
    b.extend(std::iter::repeat_n(0xff, columns.len().div_ceil(8))); // all nullable
                                                                    // Optional metadata, in the order MySQL writes it.
                                                                    // Counts of the columns each field describes, as the relay reads them.
    let real: Vec<u8> = columns
        .iter()
        .zip(types)
        .map(|(c, &ty)| real_type(ty, &c.meta))
        .collect();
    let count = |f: fn(ColumnType) -> bool| {
        real.iter()
            .filter(|&&t| ColumnType::try_from(t).is_ok_and(f))
            .count()
    };
    let numeric = count(|t| t.is_numeric_type());
    let character = count(|t| t.is_character_type());
    let enums_sets = count(|t| t.is_enum_or_set_type());
    if let Some(bits) = &input.signedness {
        optional_field(&mut b, 1, &sized(bits, numeric.div_ceil(8)));
    }
    if let Some(c) = &input.charset {
        charset_field(&mut b, 2, &c.sized(character));
    }
    if let NameSource::TableMap = name_source(input) {
        let mut v = Vec::new();
        for (i, c) in columns.iter().enumerate() {
            lenenc_bytes(&mut v, column_name(i, c).as_bytes());
        }
        optional_field(&mut b, 4, &v);
    }
    if let Some(labels) = &input.labels {
        // The same label lists as SET_STR_VALUE and ENUM_STR_VALUE: each is read for the
        // columns of its type.
        let mut v = Vec::new();
        let empty = Vec::new();
        for list in (0..enums_sets).map(|i| labels.get(i).unwrap_or(&empty)) {
            lenenc(&mut v, list.len() as u64);
            for label in list {
                lenenc_bytes(&mut v, label);
            }
        }
        optional_field(&mut b, 5, &v);
        optional_field(&mut b, 6, &v);
    }
    if let Some(c) = &input.enum_set_charset {
        charset_field(&mut b, 10, &c.sized(enums_sets));
    }
    if input.extra == 0xff {
        b.extend_from_slice(&input.extra_optional);
    }
    b
}

/// Size of a fixed-size value of type `ty` with metadata `m` (after mysql_common's real-type
/// resolution of STRING), `None` for length-prefixed and unknown types.
fn fixed_size(ty: u8, m: &[u8]) -> Option<usize> {
    let m0 = usize::from(m.first().copied().unwrap_or(0));
    let m1 = usize::from(m.get(1).copied().unwrap_or(0));
    let frac = |fsp: usize| fsp.min(6).div_ceil(2);
    Some(match ty {
        1 | 13 => 1,
        2 => 2,
        9 | 10 | 11 | 14 => 3,
        3 | 4 | 7 => 4,
        5 | 8 | 12 => 8,
        16 => (m1 * 8 + m0).div_ceil(8),
        17 => 4 + frac(m0),
        18 => 5 + frac(m0),
        19 => 3 + frac(m0),
        246 => {
            const DIG2BYTES: [usize; 10] = [0, 1, 1, 2, 2, 3, 3, 4, 4, 4];
            let (p, s) = (m0, m1);
            let intg = p.saturating_sub(s);
            intg / 9 * 4 + DIG2BYTES[intg % 9] + s / 9 * 4 + DIG2BYTES[s % 9]
        }
        254 if m0 == 0xf7 => m1.clamp(1, 2),
        254 if m0 == 0xf8 => m1,
        247 => m1.clamp(1, 2),
        248 => m1,
        _ => return None,
    })
}

/// Bytes of the length prefix of a length-prefixed value of type `ty` with metadata `m`.
fn prefix_len(ty: u8, m: &[u8]) -> Option<usize> {
    let m0 = usize::from(m.first().copied().unwrap_or(0));
    let m1 = usize::from(m.get(1).copied().unwrap_or(0));
    Some(match ty {
        15 | 253 => {
            if m0 | m1 << 8 < 256 {
                1
            } else {
                2
            }
        }
        254 => {
            let len = if m0 & 0x30 != 0x30 {
                m1 | ((m0 & 0x30) ^ 0x30) << 4
            } else {
                m1
            };
            if len < 256 {
                1
            } else {
                2
            }
        }
        249..=252 | 255 | 242 => m0.clamp(1, 4),
        245 => 4,
        _ => return None,
    })
}

fn encode_value(out: &mut Vec<u8>, ty: u8, meta: &[u8], v: &Value) {
    if v.raw == 0xff {
        out.extend_from_slice(&v.bytes);
    } else if let Some(n) = fixed_size(ty, meta) {
        let n = n.min(64);
        let take = v.bytes.len().min(n);
        out.extend_from_slice(&v.bytes[..take]);
        out.extend(std::iter::repeat_n(0, n - take));
    } else if let Some(p) = prefix_len(ty, meta) {
        let max = if p >= 4 {
            u32::MAX as usize
        } else {
            (1 << (8 * p)) - 1
        };
        let b = &v.bytes[..v.bytes.len().min(max)];
        out.extend_from_slice(&(b.len() as u32).to_le_bytes()[..p]);
        out.extend_from_slice(b);
    } else {
        out.extend_from_slice(&v.bytes);
    }
}

fn rows_body(input: &Input, columns: &[Column], tme: &TableMapEvent<'_>) -> (u8, Vec<u8>) {
    let (type_code, v2) = match input.kind {
        RowsKind::Write => (30, true),
        RowsKind::WriteV1 => (23, false),
        RowsKind::Update => (31, true),
        RowsKind::Delete => (32, true),
    };
    let mut b = Vec::new();
    b.extend_from_slice(&u64::from(input.table_id).to_le_bytes()[..6]);
    b.extend_from_slice(&1u16.to_le_bytes()); // STMT_END_F
    if v2 {
        b.extend_from_slice(&2u16.to_le_bytes()); // no extra data
    }
    let width = input.width.map_or(columns.len(), usize::from);
    lenenc(&mut b, width as u64);
    let bitmap_len = width.div_ceil(8);
    let image: Vec<u8> = match &input.image {
        Some(bits) => (0..bitmap_len)
            .map(|i| bits.get(i).copied().unwrap_or(0))
            .collect(),
        None => vec![0xff; bitmap_len],
    };
    let images = if type_code == 31 { 2 } else { 1 };
    for _ in 0..images {
        b.extend_from_slice(&image);
    }
    let in_image: Vec<usize> = (0..width)
        .filter(|&i| image[i / 8] & (1 << (i % 8)) != 0)
        .collect();
    for row in &input.rows {
        for _ in 0..images {
            if row.use_raw == 0xff {
                b.extend_from_slice(&row.raw);
                continue;
            }
            let nulls: Vec<u8> = (0..in_image.len().div_ceil(8))
                .map(|i| row.nulls.get(i).copied().unwrap_or(0))
                .collect();
            b.extend_from_slice(&nulls);
            for (k, &col) in in_image.iter().enumerate() {
                if nulls[k / 8] & (1 << (k % 8)) != 0 {
                    continue;
                }
                let ty = tme
                    .get_column_type(col)
                    .ok()
                    .flatten()
                    .map_or(0, |t| t as u8);
                let meta = tme.get_column_metadata(col).unwrap_or_default();
                let empty = Value {
                    bytes: Vec::new(),
                    raw: 0,
                };
                encode_value(&mut b, ty, meta, row.values.get(k).unwrap_or(&empty));
            }
        }
    }
    b.extend_from_slice(&input.trailing);
    (type_code, b)
}

fn source_event(event: Event, pos: u64) -> SourceEvent {
    SourceEvent {
        timestamp: event.header().timestamp(),
        event,
        position: BinlogPosition::new("mysql-bin.000001", pos),
        in_payload: false,
    }
}

fuzz_target!(|input: Input| {
    let mut input = input;
    if input.columns.len() > 64 || input.rows.len() > 16 {
        return;
    }
    let setup = setup();
    // At least the seven mapped columns (as INTs when the input has fewer).
    let mut columns: Vec<Column> = std::mem::take(&mut input.columns);
    while columns.len() < REQUIRED.len() {
        columns.push(Column {
            ty: 2,
            meta: [0; 4],
            flags: 0,
            raw_meta: Vec::new(),
            name: 0,
        });
    }
    let columns = &columns;
    let types: Vec<u8> = columns.iter().map(column_type).collect();
    let Some(tm_event) = binlog_event(19, &table_map_body(&input, columns, &types), 1000) else {
        return;
    };
    let Ok(tme) = tm_event.read_event::<TableMapEvent<'_>>() else {
        return;
    };
    let tme = tme.into_owned();
    let (type_code, body) = rows_body(&input, columns, &tme);
    let Some(rows_event) = binlog_event(type_code, &body, 2000) else {
        return;
    };
    let mappings = &setup.mappings[usize::from(input.mapping) % setup.mappings.len()];
    let mut decoder = Decoder::new(mappings.clone(), setup.checkpoint.clone(), None);
    let outbox = TableName::parse("shop.outbox", None).expect("table name");
    let names: Vec<String> = (0..columns.len())
        .map(|i| column_name(i, &columns[i]).to_owned())
        .collect();
    match name_source(&input) {
        NameSource::Tracked => decoder.track_layout(outbox, names),
        NameSource::TrackedOther(n) => {
            decoder.track_layout(outbox, names.into_iter().take(usize::from(n)).collect())
        }
        NameSource::TableMap | NameSource::Unknown => {}
    }
    let table_map = |id: u64| (id == tme.table_id()).then_some(&tme);
    let _ = decoder.decode(&source_event(tm_event, 1000), table_map);
    let rows_event = source_event(rows_event, 2000);
    let result = decoder.decode(&rows_event, table_map);
    if std::env::var_os("ROWS_EVENT_DEBUG").is_some() {
        eprintln!("{result:?}");
    }
    if input.repeat {
        let _ = decoder.decode(&rows_event, table_map);
    }
});
