//! The binlog read limit: the backlog's binlog range streamed over a bare replication
//! connection (mysql_async, as the relay connects) that decodes nothing but event headers; and
//! the steady workloads' bare tail ([`Tail`]): rows' arrival over such a connection and a bare
//! producer's send → acknowledgement, the latency budget's limits.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use mysql_async::binlog::events::{EventData, RotateEvent, RowsEventData, TableMapEvent};
use mysql_async::binlog::value::BinlogValue;
use mysql_async::binlog::EventType;
use mysql_async::prelude::*;
use mysql_async::{BinlogStreamRequest, Conn, Opts};
use outbox_relay_testkit::binlog::BinlogPosition;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};

use crate::txn_bare::{TxnBare, PRIME};
use crate::workload::{key_of, now_micros, payload};

/// A connection ready to ask for a binlog dump, as the relay's: on MariaDB GTID-aware
/// (MARIA_SLAVE_CAPABILITY_GTID = 4).
async fn replica_conn(url: &str, mariadb: bool) -> Result<Conn> {
    let mut conn = Conn::new(Opts::from_url(url)?)
        .await
        .context("binlog replica connection")?;
    if mariadb {
        conn.query_drop("SET @mariadb_slave_capability = 4").await?;
    }
    Ok(conn)
}

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
/// `mariadb`: the server is MariaDB (any version string it reports). With `read_bytes`, stores
/// the event bytes read so far there after each event (for a producer gated on the read, see
/// [`crate::kafka::ReadGate`]).
///
/// # Errors
/// The connection or the dump fails, or the stream ends before `to`.
pub async fn raw_read(
    url: &str,
    server_id: u32,
    mariadb: bool,
    from: &BinlogPosition,
    to: &BinlogPosition,
    read_bytes: Option<&AtomicU64>,
) -> Result<RawRead> {
    let conn = replica_conn(url, mariadb).await?;
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
        if let Some(read) = read_bytes {
            read.store(out.bytes, Ordering::Relaxed);
        }
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

/// What the bare tail saw while a steady workload ran: per outbox row (by its sequence number),
/// when its rows event arrived, and the bare producer's send → acknowledgement of a record of
/// the same size and key sent at that moment (exactly-once runs: sent in the transactional
/// producer's next transaction, and when that transaction committed).
#[derive(Debug, Default)]
pub struct TailOut {
    /// Row sequence number → arrival of its rows event, µs since the epoch.
    pub arrivals: HashMap<u64, i64>,
    /// Row sequence number → the bare producer's send → acknowledgement of its record, µs
    /// (exactly-once runs: the transactional producer's, inside its transaction).
    pub produce_by_row: HashMap<u64, i64>,
    /// The same for the control producer (`BENCH_PAIR_CONTROL`), empty without it.
    pub control_by_row: HashMap<u64, i64>,
    /// Records the bare producer could not deliver.
    pub produce_failed: u64,
    /// Exactly-once runs ([`BareProducers::transactional`]): row → when the bare transactional
    /// producer's transaction holding its record committed, µs since the epoch.
    pub committed_by_row: HashMap<u64, i64>,
    /// Exactly-once runs: why the bare transactional producer stopped early, if it did (the
    /// rows it committed before are measured; the relay's run is not failed for it).
    pub bare_error: Option<String>,
}

impl TailOut {
    /// One bare record's delivery report: its row and send → acknowledgement (µs), `None` when
    /// it was not delivered.
    fn delivered(&mut self, (seq, us, control): Delivered) {
        let by_row = if control {
            &mut self.control_by_row
        } else {
            &mut self.produce_by_row
        };
        match us {
            Some(us) => _ = by_row.insert(seq, us),
            None => self.produce_failed += 1,
        }
    }
}

/// A bare record's delivery report: its row, send → acknowledgement (µs, `None`: not
/// delivered), and whether the control producer sent it.
type Delivered = (u64, Option<i64>, bool);

/// The physical limits of the stages a relay adds nothing to, measured on the same rows while
/// the relay runs: a second replica connection (as the relay connects: mysql_async, GTID-aware
/// on MariaDB) that decodes only the outbox table's rows, and a bare producer (the relay's
/// producer settings: idempotent, `acks=all`, `linger.ms=1`) that sends a record of each row
/// as soon as it arrives; in exactly-once runs a transactional one ([`crate::txn_bare`]),
/// which sends it at once or, while a commit is in flight, in the next transaction.
pub struct Tail {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<TailOut>>,
}

/// The tail's bare producers: where they send, and whether a second one runs.
pub struct BareProducers<'a> {
    /// Kafka's bootstrap servers.
    pub bootstrap: &'a str,
    /// The topic the bare producers send to.
    pub topic: &'a str,
    /// A second bare producer (its own connection, the same settings) sends each row's record
    /// right after the first: the per-row difference of two producers that add nothing is the
    /// noise floor of the relay's paired figure (`pair_floor`). At-least-once runs only: not
    /// with `transactional`.
    pub control: bool,
    /// The bare producer is transactional and commits as an exactly-once relay does
    /// ([`crate::txn_bare`]): the limit of an exactly-once relay's visibility.
    pub transactional: bool,
}

/// Where the tail finds a row's sequence number: the outbox table and its `event_key` column
/// (`<workload>-<seq>`).
pub struct TailTarget {
    /// Database of the outbox table.
    pub database: String,
    /// Its name.
    pub table: String,
    /// 0-based position of `event_key` among its columns.
    pub event_key_column: usize,
}

impl Tail {
    /// Starts streaming from `from` (the binlog's current end) with replica id `server_id`,
    /// producing as `bare` says.
    ///
    /// # Errors
    /// The connection, the dump request or the producer fails.
    pub async fn start(
        url: &str,
        server_id: u32,
        mariadb: bool,
        from: &BinlogPosition,
        target: TailTarget,
        bare: BareProducers<'_>,
    ) -> Result<Self> {
        let BareProducers {
            bootstrap,
            topic,
            control,
            transactional,
        } = bare;
        let conn = replica_conn(url, mariadb).await?;
        let request = BinlogStreamRequest::new(server_id)
            .with_filename(from.file.as_bytes())
            .with_pos(from.pos);
        let mut stream = conn.get_binlog_stream(request).await?;
        let bare_producer = || -> Result<FutureProducer> {
            ClientConfig::new()
                .set("bootstrap.servers", bootstrap)
                .set("linger.ms", "1")
                .set("enable.idempotence", "true")
                .set("acks", "all")
                .set("partitioner", "murmur2_random")
                .create()
                .context("creating the bare producer")
        };
        // One bare producer: at-least-once (a future per record), or transactional.
        let (producer, txn) = if transactional {
            let id = format!("outbox-relay-bench-{topic}");
            (None, Some(TxnBare::start(bootstrap, topic, &id).await?))
        } else {
            (Some(bare_producer()?), None)
        };
        let control = if control && !transactional {
            Some(bare_producer()?)
        } else {
            None
        };
        // Primed as the relay's topic is: a new topic's first record waits for its metadata
        // (up to a second), and every record sent meanwhile with it. (The duration is the wait
        // for room in the queue; the delivery is bounded by `message.timeout.ms`.)
        for p in producer.iter().chain(&control) {
            p.send(
                FutureRecord::<[u8], [u8]>::to(topic).payload(PRIME),
                Duration::from_secs(60),
            )
            .await
            .map_err(|(e, _)| anyhow::anyhow!("priming the bare producer: {e}"))?;
        }
        let topic = topic.to_owned();
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let mut out = TailOut::default();
            let mut maps: HashMap<u64, TableMapEvent<'static>> = HashMap::new();
            let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel::<Delivered>();
            loop {
                let ev = tokio::select! {
                    ev = stream.next() => ev,
                    _ = stopped.changed() => break,
                };
                let Some(ev) = ev else { break };
                let ev = ev.context("reading the binlog tail")?;
                let arrived = now_micros();
                match ev.read_data() {
                    Ok(Some(EventData::TableMapEvent(tme)))
                        if tme.database_name() == target.database
                            && tme.table_name() == target.table =>
                    {
                        maps.insert(tme.table_id(), tme.into_owned());
                    }
                    Ok(Some(EventData::RowsEvent(rows @ RowsEventData::WriteRowsEvent(_))))
                    | Ok(Some(EventData::RowsEvent(rows @ RowsEventData::WriteRowsEventV1(_)))) => {
                        let Some(tme) = maps.get(&rows.table_id()) else {
                            continue;
                        };
                        for row in rows.rows(tme) {
                            let Ok((_, Some(after))) = row else { continue };
                            let Some(BinlogValue::Value(mysql_async::Value::Bytes(key))) =
                                after.as_ref(target.event_key_column)
                            else {
                                continue;
                            };
                            let Some(seq) = std::str::from_utf8(key)
                                .ok()
                                .and_then(|k| k.rsplit('-').next())
                                .and_then(|s| s.parse::<u64>().ok())
                            else {
                                continue;
                            };
                            out.arrivals.insert(seq, arrived);
                            let (k, value) = (key_of(seq), payload(arrived, seq, &key_of(seq)));
                            if let Some(txn) = &txn {
                                txn.send(seq, k, value);
                                continue;
                            }
                            let producers = producer
                                .iter()
                                .map(|p| (p, false))
                                .chain(control.iter().map(|c| (c, true)));
                            for (producer, is_control) in producers {
                                let sent = now_micros();
                                match producer
                                    .send_result(FutureRecord::to(&topic).key(&k).payload(&value))
                                {
                                    Ok(delivery) => {
                                        let tx = done_tx.clone();
                                        tokio::spawn(async move {
                                            let ok = matches!(delivery.await, Ok(Ok(_)));
                                            let us = ok.then(|| now_micros() - sent);
                                            let _ = tx.send((seq, us, is_control));
                                        });
                                    }
                                    Err(_) => out.produce_failed += 1,
                                }
                            }
                        }
                    }
                    _ => {}
                }
                while let Ok(d) = done_rx.try_recv() {
                    out.delivered(d);
                }
            }
            drop(done_tx);
            // The last records' acknowledgements.
            let wait = tokio::time::sleep(Duration::from_secs(30));
            tokio::pin!(wait);
            loop {
                tokio::select! {
                    d = done_rx.recv() => match d {
                        Some(d) => out.delivered(d),
                        None => break,
                    },
                    () = &mut wait => break,
                }
            }
            if let Some(txn) = txn {
                let t = txn.finish().await?;
                out.produce_by_row = t.acked_by_row;
                out.committed_by_row = t.committed_by_row;
                out.bare_error = t.error;
            }
            Ok(out)
        });
        Ok(Self { stop, task })
    }

    /// Rows seen so far is not tracked live: the caller stops the tail once the system under
    /// test has delivered everything (its rows events arrived long before).
    ///
    /// # Errors
    /// The tail failed.
    pub async fn finish(self) -> Result<TailOut> {
        let _ = self.stop.send(true);
        self.task.await.context("binlog tail task")?
    }
}
