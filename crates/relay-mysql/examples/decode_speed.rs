//! How fast the decoder turns a binlog file's outbox rows into events, on one thread, with
//! nothing else running: the relay's reader thread without the network and the pipeline.
//!
//! ```text
//! cargo run --release -p outbox-relay-mysql --example decode_speed -- <binlog file> [repeat]
//! ```
//!
//! The file is one a `make bench` drain wrote (MySQL 8.0: `.services/mysql8/binlog/`; MariaDB:
//! `.services/mariadb/…`): its tables named `outbox` are decoded with the bench's column layout
//! (the migrations' outbox plus the polling relay's `status`), as the relay would with
//! `binlog_row_metadata=MINIMAL`. Prints rows, seconds and nanoseconds per row for each pass
//! and the best; the file is read into memory before the first pass.

use std::path::PathBuf;
use std::time::Instant;

use outbox_relay_core::config::{RelayConfig, TableName};
use outbox_relay_mysql::binlog::source::BinlogFileSource;
use outbox_relay_mysql::decode::Decoder;

const COLUMNS: [&str; 8] = [
    "id",
    "aggregate_type",
    "aggregate_id",
    "event_type",
    "event_key",
    "payload",
    "created_at",
    "status",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = PathBuf::from(
        args.next()
            .ok_or("usage: decode_speed <binlog file> [repeat]")?,
    );
    let repeat: usize = args.next().map_or(Ok(3), |r| r.parse())?;
    // The outbox tables the file writes to (the bench names its databases per run).
    let mut tables = Vec::new();
    {
        let mut source = BinlogFileSource::open(&path)?;
        while let Some(ev) = source.next_event() {
            let ev = ev?;
            if ev.event.header().event_type_raw()
                != mysql_async::binlog::EventType::TABLE_MAP_EVENT as u8
            {
                continue;
            }
            if let Ok(tm) = ev
                .event
                .read_event::<outbox_relay_mysql::binlog::TableMapEvent<'_>>()
            {
                let name = format!("{}.{}", tm.database_name(), tm.table_name());
                if tm.table_name() == "outbox" && !tables.contains(&name) {
                    tables.push(name);
                }
            }
        }
    }
    if tables.is_empty() {
        return Err("the file writes to no table named outbox".into());
    }
    let list: Vec<String> = tables.iter().map(|t| format!("{t:?}")).collect();
    let toml = format!(
        "[mysql]\nurl = \"mysql://root@127.0.0.1:3306/x\"\nserver_id = 9\n\
         [kafka]\nbootstrap_servers = \"127.0.0.1:9092\"\n[outbox]\ntables = [{}]\n",
        list.join(", ")
    );
    let mappings = RelayConfig::from_toml_str(&toml)?.table_mappings()?;
    // A file that holds the table's CREATE TABLE (and the bench's ALTER) gives the decoder the
    // layout itself; one that starts later needs it given.
    let mut track = false;
    let mut best = f64::MAX;
    let mut pass = 1;
    while pass <= repeat {
        match decode_pass(&path, &mappings, &tables, track) {
            Ok((rows, failed, secs)) => {
                let ns = secs * 1e9 / rows.max(1) as f64;
                best = best.min(ns);
                println!(
                    "pass {pass}: {rows} rows ({failed} failed) in {secs:.3} s: {ns:.0} ns per row"
                );
                pass += 1;
            }
            Err(e)
                if !track
                    && (e.to_string().contains("layout is unknown")
                        || e.to_string().contains("carries no column names")) =>
            {
                track = true
            }
            Err(e) => return Err(e),
        }
    }
    println!("best: {best:.0} ns per row");
    Ok(())
}

/// Decodes the whole file once: (rows, rows that failed, seconds).
fn decode_pass(
    path: &std::path::Path,
    mappings: &[outbox_relay_core::outbox::mapping::TableMapping],
    tables: &[String],
    track: bool,
) -> Result<(u64, u64, f64), Box<dyn std::error::Error>> {
    let mut source = BinlogFileSource::open(path)?;
    let mut decoder = Decoder::new(
        mappings.to_vec(),
        TableName::parse("none.none", None)?,
        None,
    );
    if track {
        for t in tables {
            decoder.track_layout(
                TableName::parse(t, None)?,
                COLUMNS.iter().map(|c| (*c).to_owned()).collect(),
            );
        }
    }
    let (mut rows, mut failed) = (0u64, 0u64);
    let started = Instant::now();
    while let Some(ev) = source.next_event() {
        let ev = ev?;
        let (decoded, _) = decoder.decode(&ev, |id| source.table_map(id))?.into_parts();
        for row in decoded {
            match row {
                Ok(event) => {
                    rows += 1;
                    std::hint::black_box(event);
                }
                Err(_) => failed += 1,
            }
        }
    }
    Ok((rows, failed, started.elapsed().as_secs_f64()))
}
