//! The binlog read limit: the backlog's binlog range streamed over a bare replication
//! connection (mysql_async, as the relay connects) that decodes nothing but event headers.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use mysql_async::binlog::events::RotateEvent;
use mysql_async::binlog::EventType;
use mysql_async::prelude::*;
use mysql_async::{BinlogStreamRequest, Conn, Opts};
use outbox_relay_testkit::binlog::BinlogPosition;

/// What the bare binlog stream read.
#[derive(Debug, Clone, Default)]
pub struct RawRead {
    /// Events read.
    pub events: u64,
    /// Event bytes read.
    pub bytes: u64,
    /// Seconds from the dump request to the last event of the range.
    pub secs: f64,
}

/// Streams the binlog from `from` up to `to` (an event end) with replica id `server_id`;
/// `mariadb`: the server is MariaDB (any version string it reports).
///
/// # Errors
/// The connection or the dump fails, or the stream ends before `to`.
pub async fn raw_read(
    url: &str,
    server_id: u32,
    mariadb: bool,
    from: &BinlogPosition,
    to: &BinlogPosition,
) -> Result<RawRead> {
    let mut conn = Conn::new(Opts::from_url(url)?)
        .await
        .context("binlog read connection")?;
    if mariadb {
        // As the relay does on MariaDB: GTID-aware dump (MARIA_SLAVE_CAPABILITY_GTID = 4).
        conn.query_drop("SET @mariadb_slave_capability = 4").await?;
    }
    let started = Instant::now();
    let request = BinlogStreamRequest::new(server_id)
        .with_filename(from.file.as_bytes())
        .with_pos(from.pos);
    let debug = std::env::var_os("BENCH_DEBUG").is_some();
    if debug {
        eprintln!("[bench] binlog read: requesting {}:{}", from.file, from.pos);
    }
    let mut stream = conn.get_binlog_stream(request).await?;
    if debug {
        eprintln!("[bench] binlog read: stream open");
    }
    let mut file = from.file.clone();
    let mut out = RawRead::default();
    let mut seen_fde = false;
    while let Some(ev) = stream.next().await {
        let ev = ev.context("reading the binlog stream")?;
        let h = ev.header();
        out.events += 1;
        out.bytes += u64::from(h.event_size());
        if h.event_type() == Ok(EventType::FORMAT_DESCRIPTION_EVENT) {
            seen_fde = true;
        }
        if debug && (out.events < 6 || out.events % 10_000 == 0) {
            eprintln!(
                "[bench] binlog read: {file}:{} {:?} size {}",
                h.log_pos(),
                h.event_type(),
                h.event_size()
            );
        }
        if h.event_type() == Ok(EventType::ROTATE_EVENT) {
            if let Ok(r) = ev.read_event::<RotateEvent<'_>>() {
                file = r.name().into_owned();
                // The fake rotate before the first format description names the file the dump
                // starts in; from MariaDB it still carries its CRC32 (the reader only knows the
                // checksum algorithm after that event), from MySQL it does not.
                if !seen_fde {
                    let raw = r.name_raw();
                    file = if raw.starts_with(from.file.as_bytes()) {
                        from.file.clone()
                    } else {
                        String::from_utf8_lossy(&raw[..raw.len().saturating_sub(4)]).into_owned()
                    };
                }
            }
            continue;
        }
        if file == to.file && u64::from(h.log_pos()) >= to.pos {
            out.secs = started.elapsed().as_secs_f64();
            // Dropping the stream closes its connection.
            return Ok(out);
        }
    }
    bail!("the binlog stream ended before {}:{}", to.file, to.pos)
}
