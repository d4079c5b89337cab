//! Source: the binlog stream of one server, as a replica with its own `server_id`.
//!
//! [`BinlogSource`] registers as a replica (COM_REGISTER_SLAVE), asks for the binlog from a
//! [`BinlogPosition`] (COM_BINLOG_DUMP, MySQL Internals "Replication Protocol"), and yields each
//! event with the position right after it. It keeps the current file name from ROTATE events and
//! the table maps (in mysql_async's stream reader), and treats a silence longer than the read
//! timeout as a dead connection: the server sends heartbeats while idle, so silence means the
//! TCP connection is gone even if no error arrived.

use std::future::Future;
use std::task::Poll;
use std::time::Duration;

use futures::StreamExt;
use mysql_async::binlog::events::{Event, RotateEvent, TableMapEvent, TransactionPayloadEvent};
use mysql_async::binlog::{BinlogVersion, EventType};
use mysql_async::prelude::Queryable;
use mysql_async::{BinlogStream, BinlogStreamRequest, Conn, Opts};

use crate::binlog::compressed::{payload_error, Incomplete, PayloadTracker};
use crate::server::Flavor;
use outbox_relay_core::error::{RelayError, ER_MASTER_FATAL_ERROR_READING_BINLOG};
use outbox_relay_core::position::gtid::MysqlGtidSet;
use outbox_relay_core::position::{BinlogPosition, GtidState, MariadbGtidPos};

/// Where a dump starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartFrom {
    /// A binlog file and position of this server.
    Position(BinlogPosition),
    /// After the given MariaDB GTID position (`@slave_connect_state`), on whichever file of
    /// this server holds it: works on any server of the replication topology.
    MariadbGtid(MariadbGtidPos),
    /// After the given MySQL GTID set (COM_BINLOG_DUMP_GTID): the server sends every
    /// transaction not in it, from any server of the topology.
    MysqlGtid(MysqlGtidSet),
}

/// A dump from a GTID state starts after it (in the state's form).
impl From<GtidState> for StartFrom {
    fn from(state: GtidState) -> Self {
        match state {
            GtidState::MariaDb(pos) => Self::MariadbGtid(pos),
            GtidState::MySql(set) => Self::MysqlGtid(set),
        }
    }
}

impl StartFrom {
    /// The GTID state a dump from here starts after; `None` for a binlog position.
    pub fn gtid_state(&self) -> Option<GtidState> {
        match self {
            Self::Position(_) => None,
            Self::MariadbGtid(pos) => Some(GtidState::MariaDb(pos.clone())),
            Self::MysqlGtid(set) => Some(GtidState::MySql(set.clone())),
        }
    }
}

impl std::fmt::Display for StartFrom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Position(p) => write!(f, "binlog position {p}"),
            Self::MariadbGtid(g) => write!(f, "GTID position {g}"),
            Self::MysqlGtid(g) => write!(f, "GTID set {g}"),
        }
    }
}

/// Where events end when the server leaves `log_pos` at 0.
///
/// MariaDB 11.4+ with `binlog_legacy_event_pos=OFF` (its default) writes `end_log_pos` 0 for
/// the events inside a transaction (annotate, table map, rows events); only the GTID event and
/// the XID/COMMIT event carry their real end (MariaDB KB, system variable
/// `binlog_legacy_event_pos`).
/// - In a binlog FILE every event is there, so such an event ends at the previous event's end
///   plus its own size (`event_size`: header, body and checksum): exact.
/// - In a DUMP the server leaves out events the replica did not ask for (ANNOTATE_ROWS, which
///   mysql_async's dump request cannot ask for), so sizes cannot be added up. Such an event is
///   then placed at the end of the last event with a real position: the start of its
///   transaction (the end of the GTID event). A row error names that boundary, never 0.
#[derive(Debug, Default)]
pub(crate) struct EventEnds {
    /// The end of the last event of the file, when known (unknown right after a dump starts).
    cursor: Option<u64>,
    /// Every event of the file is seen (a file reader), so sizes add up.
    contiguous: bool,
}

impl EventEnds {
    /// For a reader that sees every event of the file (sizes add up to positions).
    pub(crate) fn contiguous() -> Self {
        Self {
            cursor: None,
            contiguous: true,
        }
    }

    /// The end of an event (0 when it cannot be known: artificial events of a dump's start).
    pub(crate) fn end_of(&mut self, log_pos: u32, event_size: u32, event_type: u8) -> u64 {
        if log_pos != 0 {
            self.cursor = Some(u64::from(log_pos));
            return u64::from(log_pos);
        }
        // Events a server sends at a dump's start without a place in the file.
        // MariaDB's BINLOG_CHECKPOINT (161), GTID_LIST (163), START_ENCRYPTION (164).
        const NOT_IN_FILE: [u8; 7] = [
            EventType::ROTATE_EVENT as u8,
            EventType::FORMAT_DESCRIPTION_EVENT as u8,
            EventType::HEARTBEAT_EVENT as u8,
            EventType::PREVIOUS_GTIDS_EVENT as u8,
            161,
            163,
            164,
        ];
        if NOT_IN_FILE.contains(&event_type) {
            return 0;
        }
        match &mut self.cursor {
            Some(c) if self.contiguous => {
                *c += u64::from(event_size);
                *c
            }
            Some(c) => *c,
            None => 0,
        }
    }

    /// A new file or a new dump: the next real position comes from the server.
    pub(crate) fn reset(&mut self) {
        self.cursor = None;
    }
}

/// One binlog event and where it ends.
#[derive(Debug)]
pub struct SourceEvent {
    /// The event (header, body without checksum).
    pub event: Event,
    /// Position right after this event: the dump resumes here.
    pub position: BinlogPosition,
    /// Event timestamp, seconds since the Unix epoch (when the statement began on the primary).
    pub timestamp: u32,
    /// `true` for an event decompressed from a MySQL TRANSACTION_PAYLOAD event (BEGIN, table
    /// map, rows, XID of a compressed transaction). Its `position` is the end of that payload
    /// event: inner events have no position of their own, and a dump can only resume after the
    /// whole payload.
    pub in_payload: bool,
}

impl SourceEvent {
    /// The event's timestamp when it says how current the stream is: not for the format
    /// description a dump starts with (it carries the file's creation time) nor for artificial
    /// events (no position, no time).
    pub fn dated_at(&self) -> Option<u32> {
        let header = self.event.header();
        (self.timestamp != 0
            && header.log_pos() != 0
            && header.event_type_raw()
                != mysql_async::binlog::EventType::FORMAT_DESCRIPTION_EVENT as u8)
            .then_some(self.timestamp)
    }
}

/// The host name the relay registers with (COM_REGISTER_SLAVE `report_host`): names the
/// connector, so a registration left by this connector's previous connection can be told from
/// another replica that uses the same `server_id`.
pub fn report_host(connector: &str) -> String {
    let connector: String = connector.chars().take(40).collect();
    format!("outbox-relay:{connector}")
}

/// A live binlog dump connection.
pub struct BinlogSource {
    stream: BinlogStream,
    file: String,
    read_timeout: Duration,
    /// When the last event or heartbeat arrived: the read deadline counts from here, not from
    /// each call (the pipeline's select loop calls `next` again after every other branch).
    last_event: tokio::time::Instant,
    start: StartFrom,
    payloads: PayloadTracker,
    ends: EventEnds,
    /// To ask the server what it still has when it refuses the start point (error 1236).
    opts: Opts,
    flavor: Flavor,
    /// Whether anything (an event or a heartbeat) arrived on this dump: a MariaDB GTID dump
    /// that closes before its first event may be one whose start the server purged.
    received: bool,
    /// The source's metrics (heartbeats), if any.
    metrics: Option<std::sync::Arc<outbox_relay_core::observe::metrics::Metrics>>,
}

/// `LOG_EVENT_ARTIFICIAL_F`: the event was made up by the dump thread, not read from the file
/// (the first ROTATE of a dump); its `log_pos` is meaningless.
const LOG_EVENT_ARTIFICIAL_F: u16 = 0x20;

impl BinlogSource {
    /// The same dump, counting heartbeats in `metrics`.
    pub fn with_metrics(
        self,
        metrics: std::sync::Arc<outbox_relay_core::observe::metrics::Metrics>,
    ) -> Self {
        Self {
            metrics: Some(metrics),
            ..self
        }
    }

    /// Connects, registers as replica `server_id` (with `report_host`, shown by `SHOW SLAVE
    /// HOSTS`; see [`report_host`]) and starts the dump at `start`.
    ///
    /// `heartbeat` is the period the server is asked to send heartbeats at when idle; after
    /// `read_timeout` without any event the stream is considered dead.
    ///
    /// # Errors
    /// [`RelayError::Mysql`] when the server cannot be reached or refuses the dump.
    pub async fn connect(
        opts: Opts,
        server_id: u32,
        report_host: &str,
        flavor: Flavor,
        start: &StartFrom,
        heartbeat: Duration,
        read_timeout: Duration,
    ) -> Result<Self, RelayError> {
        let mut conn = outbox_relay_core::error::with_timeout(
            read_timeout,
            "connecting for the binlog dump",
            Conn::new(opts.clone()),
        )
        .await??;
        for statement in flavor.dump_session_statements() {
            conn.query_drop(*statement).await?;
        }
        let (file, pos) = match start {
            StartFrom::Position(p) => (p.file.clone(), p.pos),
            StartFrom::MariadbGtid(gtid) => {
                // MariaDB KB "GTID": the dump starts after these GTIDs and ignores file/pos.
                // Strict mode makes a GTID the server does not have an error (1236), never a
                // silent jump.
                conn.exec_drop("SET @slave_connect_state = ?", (gtid.to_string(),))
                    .await?;
                conn.query_drop("SET @slave_gtid_strict_mode = 1").await?;
                conn.query_drop("SET @slave_gtid_ignore_duplicates = 0")
                    .await?;
                (String::new(), 4)
            }
            StartFrom::MysqlGtid(_) => (String::new(), 4),
        };
        // Heartbeat period is in nanoseconds (MySQL Internals, COM_BINLOG_DUMP).
        conn.query_drop(format!(
            "SET @master_heartbeat_period = {}",
            heartbeat.as_nanos()
        ))
        .await?;
        let mut request = BinlogStreamRequest::new(server_id)
            .with_hostname(report_host.as_bytes())
            .with_filename(file.as_bytes())
            .with_pos(pos);
        if let StartFrom::MysqlGtid(set) = start {
            let sids = set
                .to_sids()
                .map_err(|e| RelayError::binlog(format!("checkpoint GTID set: {e}")))?;
            request = request.with_gtid().with_gtid_set(sids);
        }
        let stream = match conn.get_binlog_stream(request).await {
            Ok(stream) => stream,
            Err(e) => {
                let e = unavailable(e, start, &opts, flavor, read_timeout).await;
                return Err(purged_instead(e, start, &opts, read_timeout).await);
            }
        };
        Ok(Self {
            stream,
            file,
            read_timeout,
            last_event: tokio::time::Instant::now(),
            start: start.clone(),
            payloads: PayloadTracker::default(),
            ends: EventEnds::default(),
            opts,
            flavor,
            received: false,
            metrics: None,
        })
    }

    /// `e`, checked by [`purged_instead`] when nothing arrived on this dump yet.
    async fn before_any_event(&self, e: RelayError) -> RelayError {
        if self.received {
            return e;
        }
        purged_instead(e, &self.start, &self.opts, self.read_timeout).await
    }

    /// The table map event for `table_id`, as last seen in this stream.
    pub fn table_map(&self, table_id: u64) -> Option<&TableMapEvent<'static>> {
        self.stream.get_tme(table_id)
    }

    /// The next event; heartbeats are consumed here.
    ///
    /// # Errors
    /// [`RelayError::Mysql`] when the connection fails, the server ends the dump, or nothing
    /// arrives within the read timeout; [`RelayError::Binlog`] for error 1236 (position not
    /// available).
    pub async fn next(&mut self) -> Result<SourceEvent, RelayError> {
        loop {
            let deadline = self.last_event + self.read_timeout;
            let next = self.stream.next();
            tokio::pin!(next);
            // An event already received (a transaction's events arrive together, a backlog
            // always) needs no read deadline: arming a timer for each event was a quarter of
            // the reader thread's CPU at 5,000 one-row transactions/s (clock reads and timer
            // wheel work for every event).
            let ready = std::future::poll_fn(|cx| Poll::Ready(next.as_mut().poll(cx))).await;
            let read = match ready {
                Poll::Ready(event) => Ok(event),
                Poll::Pending => tokio::time::timeout_at(deadline, next).await,
            };
            let event = match read {
                Err(_) => {
                    return Err(RelayError::mysql(format!(
                        "no binlog event or heartbeat for {} s: treating the connection as dead",
                        self.read_timeout.as_secs()
                    )))
                }
                Ok(None) => {
                    let e = RelayError::mysql("the server ended the binlog dump");
                    return Err(self.before_any_event(e).await);
                }
                Ok(Some(Err(e))) => {
                    let (opts, flavor) = (&self.opts, self.flavor);
                    let e = unavailable(e, &self.start, opts, flavor, self.read_timeout).await;
                    return Err(self.before_any_event(e).await);
                }
                Ok(Some(Ok(event))) => event,
            };
            self.received = true;
            self.last_event = tokio::time::Instant::now();
            let header = event.header();
            let raw_type = header.event_type_raw();
            if raw_type == EventType::HEARTBEAT_EVENT as u8 {
                if let Some(m) = &self.metrics {
                    m.heartbeat();
                }
                continue;
            }
            // Before a ROTATE changes the file name: an error names the payload's file.
            let payload_end = self
                .payloads
                .observe(header.log_pos(), header.event_size())
                .map_err(|e| incomplete_payload(&self.file, e))?;
            if raw_type == EventType::ROTATE_EVENT as u8 {
                self.file = rotate_file_name(&event)?;
                let artificial =
                    header.flags_raw() & LOG_EVENT_ARTIFICIAL_F != 0 || header.log_pos() == 0;
                self.ends.reset();
                if artificial {
                    continue; // says where the dump starts; not an event of the file
                }
            }
            let position = BinlogPosition::new(
                self.file.clone(),
                match payload_end {
                    Some(end) => end,
                    // A real ROTATE ends the old file; the next event is the new file's first.
                    None if raw_type == EventType::ROTATE_EVENT as u8 => 4,
                    None => self
                        .ends
                        .end_of(header.log_pos(), header.event_size(), raw_type),
                },
            );
            if raw_type == EventType::TRANSACTION_PAYLOAD_EVENT as u8 {
                // mysql_async yields the inner events right after this one.
                let size = payload_size(&event, &position)?;
                self.payloads
                    .begin(position.pos, size)
                    .map_err(|e| incomplete_payload(&self.file, e))?;
            }
            let event = uncompress(event, &position)?;
            return Ok(SourceEvent {
                timestamp: header.timestamp(),
                position,
                event,
                in_payload: payload_end.is_some(),
            });
        }
    }
}

/// `e`, or the definite "purged" error when `start` is a MariaDB GTID position and the server
/// no longer has the binlog after it; for a dump that failed before its first event.
///
/// Why: MariaDB answers a GTID start it purged with error 1236, but it may close the
/// connection before the client reads that answer; without this check the relay would retry a
/// dump that can never succeed, forever.
async fn purged_instead(
    e: RelayError,
    start: &StartFrom,
    opts: &Opts,
    timeout: Duration,
) -> RelayError {
    let StartFrom::MariadbGtid(pos) = start else {
        return e;
    };
    if !matches!(e, RelayError::Mysql(_)) {
        return e;
    }
    let ask = async {
        let mut conn = Conn::new(opts.clone()).await?;
        let verdict = match mariadb_gtid_purged(&mut conn, pos).await {
            Ok(Some(purged)) => binlog_history(&mut conn, Flavor::MariaDb)
                .await
                .map(|has| Some(mariadb_purged_error(pos, &purged, &has))),
            other => other.map(|_| None),
        };
        conn.disconnect().await.ok();
        verdict
    };
    match outbox_relay_core::error::with_timeout(timeout, "asking the server what it has", ask)
        .await
    {
        Ok(Ok(Some(definite))) => definite,
        // Not purged, or the server cannot be asked: the usual retry decides.
        _ => e,
    }
}

/// The GTIDs after MariaDB GTID position `pos` that the server purged: what the position at
/// the start of its oldest binlog file (`BINLOG_GTID_POS(oldest, 4)`, MariaDB KB
/// "BINLOG_GTID_POS") has beyond `pos` (a higher sequence number in a domain, or a domain `pos`
/// lacks). `None` when the server still has every transaction after `pos`, or has no binlog
/// files or GTIDs to tell.
///
/// # Errors
/// A query fails (`SHOW BINARY LOGS` needs BINLOG MONITOR / REPLICATION CLIENT).
pub async fn mariadb_gtid_purged(
    conn: &mut Conn,
    pos: &MariadbGtidPos,
) -> Result<Option<String>, mysql_async::Error> {
    let logs: Vec<mysql_async::Row> = conn.query("SHOW BINARY LOGS").await?;
    let Some(oldest) = logs.first().and_then(|r| r.get::<String, _>(0)) else {
        return Ok(None);
    };
    let start: Option<Option<String>> = conn
        .exec_first("SELECT BINLOG_GTID_POS(?, 4)", (oldest.as_str(),))
        .await?;
    let Ok(start) = start
        .flatten()
        .unwrap_or_default()
        .parse::<MariadbGtidPos>()
    else {
        return Ok(None);
    };
    let purged: Vec<String> = start
        .beyond(pos)
        .iter()
        .map(|g| format!("up to {g}"))
        .collect();
    Ok((!purged.is_empty()).then(|| purged.join(", ")))
}

/// The definite error for a MariaDB GTID start position `pos` whose following transactions
/// (`purged`, as [`mariadb_gtid_purged`] says) the server no longer has; `has` is
/// [`binlog_history`].
pub fn mariadb_purged_error(pos: &MariadbGtidPos, purged: &str, has: &str) -> RelayError {
    RelayError::binlog(format!(
        "cannot resume from the checkpoint's GTID position {pos}: transactions after it were \
         purged from the server's binlog ({purged}; the dump ends with error 1236 or a closed \
         connection). The server has: {has}. The relay will not skip ahead by itself. To \
         continue, move this connector's checkpoint with `outbox-relay reset --config <file> \
         --to earliest` (from the oldest binlog the server has; events in between are lost \
         unless replayed from elsewhere) or `--to latest` (the gap is not relayed); stop the \
         relay first"
    ))
}

/// The error for a TRANSACTION_PAYLOAD event of `file` whose inner events are incomplete.
fn incomplete_payload(file: &str, e: Incomplete) -> RelayError {
    RelayError::binlog(payload_error(
        &BinlogPosition::new(file, e.end),
        &e.to_string(),
    ))
}

/// A TRANSACTION_PAYLOAD event's header, parsed by mysql_common once its fields are checked
/// ([`crate::binlog::compressed::check_payload_header`]).
fn payload_event(event: &Event) -> Result<TransactionPayloadEvent<'_>, String> {
    crate::binlog::compressed::check_payload_header(event.data())
        .and_then(|()| {
            event
                .read_event::<TransactionPayloadEvent<'_>>()
                .map_err(|e| e.to_string())
        })
        .map_err(|e| format!("its header cannot be parsed: {e}"))
}

/// The `uncompressed_size` of a TRANSACTION_PAYLOAD event.
fn payload_size(event: &Event, position: &BinlogPosition) -> Result<u64, RelayError> {
    payload_event(event)
        .map(|tpe| tpe.uncompressed_size())
        .map_err(|e| RelayError::binlog(payload_error(position, &e)))
}

/// A MariaDB compressed event (`log_bin_compress=ON`) as the ordinary event it stands for; any
/// other event as it is.
fn uncompress(event: Event, position: &BinlogPosition) -> Result<Event, RelayError> {
    let raw_type = event.header().event_type_raw();
    if crate::binlog::compressed::mariadb_uncompressed_type(raw_type).is_none() {
        return Ok(event);
    }
    crate::binlog::compressed::uncompress_mariadb(&event).map_err(|reason| {
        RelayError::binlog(format!(
            "the MariaDB compressed binlog event (type {raw_type}) ending at {position} cannot \
             be decompressed: {reason}. The relay stops instead of skipping its rows. Fix: check \
             the event on the server (mariadb-binlog -vv --stop-position={} {}); if the server's \
             copy reads fine, restart the relay (the copy it received was damaged); if not, SET \
             GLOBAL log_bin_compress=OFF for new events, relay this event's outbox rows by hand \
             and move the connector's checkpoint past {position}",
            position.pos, position.file
        ))
    })
}

/// Maps error 1236 (the server cannot send from there) to a definite error naming the start
/// point, what the server still has (asked on a new connection, see [`binlog_history`]) and the
/// recovery commands; other errors as usual.
async fn unavailable(
    e: mysql_async::Error,
    start: &StartFrom,
    opts: &Opts,
    flavor: Flavor,
    timeout: Duration,
) -> RelayError {
    let mysql_async::Error::Server(s) = &e else {
        return e.into();
    };
    if s.code != ER_MASTER_FATAL_ERROR_READING_BINLOG {
        return e.into();
    }
    let history = async {
        let mut conn = Conn::new(opts.clone()).await?;
        let history = binlog_history(&mut conn, flavor).await;
        conn.disconnect().await.ok();
        history
    };
    let has = match outbox_relay_core::error::with_timeout(
        timeout,
        "asking the server what it has",
        history,
    )
    .await
    {
        Ok(Ok(h)) => h,
        Ok(Err(e)) => format!(
            "(could not ask: {})",
            outbox_relay_core::error::redact_error(&e.to_string())
        ),
        Err(e) => format!("(could not ask: {e})"),
    };
    RelayError::binlog(format!(
        "the server cannot send the binlog from the checkpoint's {start} (error 1236: {}). The \
         binlog holding it was purged, or the server's binlog history was reset (RESET MASTER) \
         or is a different one. The server has: {has}. The relay will not skip ahead by itself. \
         To continue, move this connector's checkpoint with `outbox-relay reset --config <file> \
         --to earliest` (from the oldest binlog the server has; events between the checkpoint \
         and there are lost unless replayed from elsewhere) or `--to latest` (the gap is not \
         relayed); stop the relay first",
        s.message
    ))
}

/// What binlog history the server still has, for error messages: `binlog files
/// mysql-bin.000007:4 to mysql-bin.000009:1234`, then the GTIDs ([`Flavor::binlog_gtids`]:
/// MySQL `gtid_purged` and `gtid_executed`; MariaDB the GTID position at the start of the
/// oldest file and `gtid_binlog_pos`).
///
/// # Errors
/// A query fails (`SHOW BINARY LOGS` needs REPLICATION CLIENT / BINLOG MONITOR).
pub async fn binlog_history(conn: &mut Conn, flavor: Flavor) -> Result<String, mysql_async::Error> {
    let logs: Vec<mysql_async::Row> = conn.query("SHOW BINARY LOGS").await?;
    let logs: Vec<(String, u64)> = logs
        .into_iter()
        .filter_map(|r| Some((r.get::<String, _>(0)?, r.get::<u64, _>(1)?)))
        .collect();
    let (Some((first, _)), Some((last, size))) = (logs.first(), logs.last()) else {
        return Ok("no binlog files".into());
    };
    let files = format!("binlog files {first}:4 to {last}:{size}");
    let gtids = flavor.binlog_gtids(conn, first).await?;
    Ok(format!("{files}; {gtids}"))
}

/// The file name in a ROTATE event.
///
/// The artificial ROTATE that starts a dump is sent before the format description event, so the
/// stream reader does not know yet that events carry a CRC32 checksum and leaves the 4 checksum
/// bytes glued to the name. They are removed when they are the CRC32 of the event, so the name is
/// always exactly one from `SHOW BINARY LOGS`.
fn rotate_file_name(event: &Event) -> Result<String, RelayError> {
    let rotate = event
        .read_event::<RotateEvent<'_>>()
        .map_err(|e| RelayError::binlog(format!("cannot parse ROTATE event: {e}")))?;
    let mut name = rotate.name_raw();
    if name.len() > 4 {
        let (body, tail) = name.split_at(name.len() - 4);
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&header_bytes(event));
        hasher.update(&event.data()[..event.data().len() - 4]);
        if hasher.finalize().to_le_bytes() == tail {
            name = body;
        }
    }
    String::from_utf8(name.to_vec())
        .map_err(|_| RelayError::binlog(format!("binlog file name {name:?} is not UTF-8")))
}

/// The 19-byte v4 event header as it was on the wire (MySQL Internals "Binlog Event Header").
fn header_bytes(event: &Event) -> [u8; 19] {
    let h = event.header();
    let mut out = [0u8; 19];
    out[0..4].copy_from_slice(&h.timestamp().to_le_bytes());
    out[4] = h.event_type_raw();
    out[5..9].copy_from_slice(&h.server_id().to_le_bytes());
    out[9..13].copy_from_slice(&h.event_size().to_le_bytes());
    out[13..17].copy_from_slice(&h.log_pos().to_le_bytes());
    out[17..19].copy_from_slice(&h.flags_raw().to_le_bytes());
    out
}

/// Reads a binlog file from disk through the same decoding path as the network stream (for
/// replaying files and for tests on fixtures written by servers this machine cannot run).
///
/// Unlike the network stream, mysql_common's file reader does not open TRANSACTION_PAYLOAD
/// events: this source decompresses each one whole (its `uncompressed_size` bytes in memory)
/// and yields its inner events after it, as [`BinlogSource`] does.
pub struct BinlogFileSource {
    file: std::io::BufReader<std::io::Take<std::fs::File>>,
    /// Bytes of the file (up to its end for this reader) not read yet.
    left: u64,
    /// mysql_common's event parser; keeps the format description and the table maps.
    reader: mysql_common::binlog::EventStreamReader,
    name: String,
    /// Inner events of the last TRANSACTION_PAYLOAD event, not yet yielded.
    inner: std::collections::VecDeque<Event>,
    payloads: PayloadTracker,
    ends: EventEnds,
}

impl BinlogFileSource {
    /// Opens `path` and checks the binlog magic header.
    ///
    /// # Errors
    /// [`RelayError::Binlog`] when the file cannot be opened or is not a binlog file.
    pub fn open(path: &std::path::Path) -> Result<Self, RelayError> {
        Self::open_until(path, u64::MAX)
    }

    /// Like [`BinlogFileSource::open`], reading only the first `end` bytes of the file: the
    /// file ends there for this reader (an event boundary, so bytes after it, perhaps still
    /// being written, are never looked at).
    ///
    /// # Errors
    /// As [`BinlogFileSource::open`].
    pub fn open_until(path: &std::path::Path, end: u64) -> Result<Self, RelayError> {
        use std::io::Read;
        let bad = |e: std::io::Error| {
            RelayError::binlog(format!("cannot read binlog file {}: {e}", path.display()))
        };
        let file = std::fs::File::open(path).map_err(bad)?;
        let len = file.metadata().map_err(bad)?.len().min(end);
        let mut file = std::io::BufReader::new(file.take(end));
        mysql_common::binlog::BinlogFileHeader::read(&mut file).map_err(bad)?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        Ok(Self {
            file,
            left: len.saturating_sub(4),
            reader: mysql_common::binlog::EventStreamReader::new(BinlogVersion::Version4),
            name,
            inner: std::collections::VecDeque::new(),
            payloads: PayloadTracker::default(),
            ends: EventEnds::contiguous(),
        })
    }

    /// The next event, `None` at the end of the file.
    ///
    /// # Errors
    /// [`RelayError::Binlog`] for a truncated or corrupt event, a TRANSACTION_PAYLOAD event
    /// that cannot be decompressed, or a MariaDB compressed event that cannot be.
    pub fn next_event(&mut self) -> Option<Result<SourceEvent, RelayError>> {
        let event = match self.inner.pop_front() {
            Some(event) => event,
            None if self.left == 0 => {
                return self
                    .payloads
                    .check_complete()
                    .err()
                    .map(|e| Err(incomplete_payload(&self.name, e)))
            }
            None => match self.read_event() {
                Ok(event) => event,
                Err(e) => {
                    self.left = 0; // nothing after a damaged event can be read
                    return Some(Err(RelayError::binlog(format!(
                        "cannot decode an event of {}: {e}",
                        self.name
                    ))));
                }
            },
        };
        Some(self.yield_event(event))
    }

    /// The next event of the file. Its header's size is checked against the bytes the file has
    /// left (and the checksum it must hold) before mysql_common reads it: mysql_common
    /// allocates what the header says and panics on an event cut short.
    fn read_event(&mut self) -> std::io::Result<Event> {
        use std::io::{Error, ErrorKind::InvalidData, Read};
        let mut header = [0u8; 19];
        if self.left < header.len() as u64 {
            return Err(Error::new(
                InvalidData,
                format!(
                    "truncated: an event header takes 19 bytes, the file has {} more",
                    self.left
                ),
            ));
        }
        self.file.read_exact(&mut header)?;
        let event_type = header[4];
        let size = u32::from_le_bytes([header[9], header[10], header[11], header[12]]);
        // Events after a format description event with checksums end with 4 bytes of it.
        let checksum = event_type != EventType::FORMAT_DESCRIPTION_EVENT as u8
            && !matches!(
                self.reader.get_fde().footer().get_checksum_alg(),
                Ok(None | Some(mysql_async::binlog::BinlogChecksumAlg::BINLOG_CHECKSUM_ALG_OFF))
            );
        let min = if checksum { 23 } else { 19 };
        if size < min {
            return Err(Error::new(
                InvalidData,
                format!("the event header (type {event_type}) claims a size of {size} bytes"),
            ));
        }
        if u64::from(size) > self.left {
            return Err(Error::new(
                InvalidData,
                format!(
                    "truncated: the event (type {event_type}) is {size} bytes long, the file has \
                     {} more",
                    self.left
                ),
            ));
        }
        let mut bytes = vec![0u8; size as usize];
        bytes[..19].copy_from_slice(&header);
        self.file.read_exact(&mut bytes[19..])?;
        self.left -= u64::from(size);
        self.reader
            .read(&bytes[..])?
            .ok_or_else(|| Error::new(InvalidData, "an empty event"))
    }

    fn yield_event(&mut self, event: Event) -> Result<SourceEvent, RelayError> {
        let header = event.header();
        let payload_end = self
            .payloads
            .observe(header.log_pos(), header.event_size())
            .map_err(|e| incomplete_payload(&self.name, e))?;
        let position = BinlogPosition::new(
            self.name.clone(),
            payload_end.unwrap_or_else(|| {
                self.ends.end_of(
                    header.log_pos(),
                    header.event_size(),
                    header.event_type_raw(),
                )
            }),
        );
        if header.event_type_raw() == EventType::TRANSACTION_PAYLOAD_EVENT as u8 {
            let size = payload_size(&event, &position)?;
            self.payloads
                .begin(position.pos, size)
                .map_err(|e| incomplete_payload(&self.name, e))?;
            self.inner = self
                .read_payload(&event, size)
                .map_err(|detail| RelayError::binlog(payload_error(&position, &detail)))?;
        }
        let event = uncompress(event, &position)?;
        Ok(SourceEvent {
            timestamp: header.timestamp(),
            position,
            event,
            in_payload: payload_end.is_some(),
        })
    }

    /// Decompresses a TRANSACTION_PAYLOAD event into its inner events (the file reader keeps
    /// their table maps). Every inner event's size is checked against the bytes left before it
    /// is parsed, so damaged data is an error, not a huge allocation.
    fn read_payload(
        &mut self,
        event: &Event,
        size: u64,
    ) -> Result<std::collections::VecDeque<Event>, String> {
        use std::io::Read;
        let tpe = payload_event(event)?;
        let mut bytes = Vec::new();
        tpe.decompressed()
            .and_then(|reader| reader.take(size.saturating_add(1)).read_to_end(&mut bytes))
            .map_err(|e| format!("{e} ({size} bytes expected)"))?;
        if bytes.len() as u64 != size {
            return Err(format!("{size} bytes expected, {} decoded", bytes.len()));
        }
        let mut events = std::collections::VecDeque::new();
        let mut rest = bytes.as_slice();
        while !rest.is_empty() {
            let len = rest
                .get(9..13)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
                .filter(|len| (19..=rest.len()).contains(len))
                .ok_or_else(|| {
                    format!(
                        "the inner event at payload offset {} has a bad size",
                        bytes.len() - rest.len()
                    )
                })?;
            let (one, tail) = rest.split_at(len);
            let inner = self
                .reader
                .read_decompressed(one)
                .map_err(|e| format!("an inner event cannot be parsed: {e}"))?
                .ok_or("an inner event is empty")?;
            events.push_back(inner);
            rest = tail;
        }
        Ok(events)
    }

    /// The table map event for `table_id`, as last seen in the file.
    pub fn table_map(&self, table_id: u64) -> Option<&TableMapEvent<'static>> {
        self.reader.get_tme(table_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mysql_async::binlog::events::FormatDescriptionEvent;

    #[test]
    fn events_without_log_pos_end_after_the_previous_event() {
        // One transaction as MariaDB 11.4.5 logged it (binlog_legacy_event_pos=OFF), from
        // SHOW BINLOG EVENTS: Pos / End_log_pos / event size.
        //   8299 Gtid          end 8341  (42 bytes)
        //   8341 Annotate_rows end 0     (322: next event at 8663)
        //   8663 Table_map     end 0     (265: next at 8928)
        //   8928 Write_rows_v1 end 0     (107: next at 9035)
        //   9035 Xid           end 9066  (31)
        let mut ends = EventEnds::contiguous();
        let t = |e: EventType| e as u8;
        assert_eq!(ends.end_of(8341, 42, 162), 8341); // MariaDB GTID event
        assert_eq!(ends.end_of(0, 322, 160), 8663); // ANNOTATE_ROWS
        assert_eq!(ends.end_of(0, 265, t(EventType::TABLE_MAP_EVENT)), 8928);
        assert_eq!(ends.end_of(0, 107, t(EventType::WRITE_ROWS_EVENT_V1)), 9035);
        assert_eq!(ends.end_of(9066, 31, t(EventType::XID_EVENT)), 9066);
        // A dump's artificial start events have no place in the file and move nothing.
        ends.reset();
        assert_eq!(
            ends.end_of(0, 120, t(EventType::FORMAT_DESCRIPTION_EVENT)),
            0
        );
        assert_eq!(ends.end_of(0, 42, 163), 0); // GTID_LIST
        assert_eq!(ends.end_of(0, 265, t(EventType::TABLE_MAP_EVENT)), 0);
        assert_eq!(ends.end_of(9108, 42, 162), 9108);
        assert_eq!(ends.end_of(0, 480, 160), 9588);

        // A dump leaves out the ANNOTATE_ROWS events: inner events are placed at the end of
        // the transaction's GTID event, the last real position.
        let mut dump = EventEnds::default();
        assert_eq!(dump.end_of(8341, 42, 162), 8341);
        assert_eq!(dump.end_of(0, 265, t(EventType::TABLE_MAP_EVENT)), 8341);
        assert_eq!(dump.end_of(0, 107, t(EventType::WRITE_ROWS_EVENT_V1)), 8341);
        assert_eq!(dump.end_of(9066, 31, t(EventType::XID_EVENT)), 9066);
    }

    /// Bytes of an artificial ROTATE event (header + body), optionally followed by its CRC32.
    fn artificial_rotate(name: &str, with_checksum: bool) -> Vec<u8> {
        let body_len = 8 + name.len() + if with_checksum { 4 } else { 0 };
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&0u32.to_le_bytes()); // timestamp
        bytes.push(EventType::ROTATE_EVENT as u8);
        bytes.extend_from_slice(&1u32.to_le_bytes()); // server_id
        bytes.extend_from_slice(&u32::try_from(19 + body_len).expect("small").to_le_bytes());
        bytes.extend_from_slice(&0u32.to_le_bytes()); // log_pos
        bytes.extend_from_slice(&LOG_EVENT_ARTIFICIAL_F.to_le_bytes());
        bytes.extend_from_slice(&4u64.to_le_bytes()); // position in the new file
        bytes.extend_from_slice(name.as_bytes());
        if with_checksum {
            let crc = crc32fast::hash(&bytes);
            bytes.extend_from_slice(&crc.to_le_bytes());
        }
        bytes
    }

    fn read(bytes: &[u8]) -> Event {
        // Before any format description event the reader assumes no checksum, as at the start
        // of a dump.
        let fde = FormatDescriptionEvent::new(BinlogVersion::Version4);
        Event::read(&fde, bytes).expect("parses")
    }

    #[test]
    fn artificial_rotate_with_crc32_gives_the_exact_file_name() {
        let event = read(&artificial_rotate("mariadb-bin.000001", true));
        assert_eq!(
            rotate_file_name(&event).expect("name"),
            "mariadb-bin.000001"
        );
    }

    #[test]
    fn rotate_without_checksum_keeps_the_name() {
        let event = read(&artificial_rotate("binlog.000042", false));
        assert_eq!(rotate_file_name(&event).expect("name"), "binlog.000042");
    }

    /// A v4 event header of `event_type` claiming `size` bytes (end position 0).
    fn header(event_type: u8, size: u32) -> Vec<u8> {
        let mut h = vec![0u8; 4];
        h.push(event_type);
        h.extend_from_slice(&1u32.to_le_bytes());
        h.extend_from_slice(&size.to_le_bytes());
        h.extend_from_slice(&[0; 6]);
        h
    }

    /// Found by fuzzing (binlog_file): mysql_common's file reader panicked on an event cut
    /// short by the end of the file (`read_exact(..).unwrap()`) and on an event too short for
    /// the checksum its file declares (`len - 4`), and first allocated whatever size the header
    /// claimed. Each is now an error naming the file.
    #[test]
    fn damaged_events_are_errors_not_panics() {
        let fixture = crate::binlog::fixtures::split_events(&crate::binlog::fixtures::read(
            "mysql8-gtid.000001",
        ));
        // The format description event (CRC32 checksums) and the PREVIOUS_GTIDS event.
        let start = crate::binlog::fixtures::write_file(&fixture[..2]);
        let cases: [(&str, Vec<u8>, &str); 4] = [
            // A QUERY event claiming 4 GiB, 6 bytes of it in the file.
            (
                "cut",
                header(2, u32::MAX),
                "the event (type 2) is 4294967295 bytes long",
            ),
            (
                "cut-small",
                header(2, 40),
                "the event (type 2) is 40 bytes long",
            ),
            // A whole header and no room for the checksum.
            ("short", header(2, 19), "claims a size of 19 bytes"),
            // Half a header.
            (
                "half",
                vec![0; 7],
                "an event header takes 19 bytes, the file has 7 more",
            ),
        ];
        let dir = crate::binlog::fixtures::scratch_dir("damaged-events");
        for (name, tail, expected) in cases {
            let path = dir.join(format!("{name}.000001"));
            let mut bytes = start.clone();
            bytes.extend_from_slice(&tail);
            bytes.extend_from_slice(&[0; 6][..if name.starts_with("cut") { 6 } else { 0 }]);
            std::fs::write(&path, &bytes).expect("scratch file");
            let mut source = BinlogFileSource::open(&path).expect("opens");
            for _ in 0..2 {
                assert!(
                    matches!(source.next_event(), Some(Ok(_))),
                    "{name}: good events"
                );
            }
            match source.next_event() {
                Some(Err(RelayError::Binlog(e))) => assert!(
                    e.contains(&format!("{name}.000001")) && e.contains(expected),
                    "{name}: {e}"
                ),
                other => panic!("{name}: {other:?}"),
            }
            assert!(
                source.next_event().is_none(),
                "{name}: nothing after the damage"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Found by fuzzing (binlog_file): mysql_common's TRANSACTION_PAYLOAD parser panics on an
    /// unknown header field longer than the event (`skip`) and on an unknown compression type
    /// (`unwrap`). Each is now the payload error naming the event.
    #[test]
    fn damaged_payload_headers_are_errors_not_panics() {
        let name = "mysql8-compressed.000001";
        let cases: [(&[u8], &str); 3] = [
            (
                &[0xc2, 0x20, 1, 2],
                "its field 194 of 32 bytes is longer than the event",
            ),
            (
                &[2, 1, 7, 1, 1, 1, 0, 0xaa],
                "unknown compression type 7 (0 is zstd, 255 none)",
            ),
            (&[3, 1, 5], "its header has no end mark"),
        ];
        let dir = crate::binlog::fixtures::scratch_dir("damaged-payload");
        for (body, expected) in cases {
            let mut events =
                crate::binlog::fixtures::split_events(&crate::binlog::fixtures::read(name));
            let payload = events
                .iter_mut()
                .find(|e| e.type_code == EventType::TRANSACTION_PAYLOAD_EVENT as u8)
                .expect("payload event");
            payload.body = body.to_vec();
            let path = dir.join(name);
            std::fs::write(&path, crate::binlog::fixtures::write_file(&events))
                .expect("scratch file");
            let mut source = BinlogFileSource::open(&path).expect("opens");
            let error = loop {
                match source.next_event() {
                    Some(Ok(_)) => {}
                    Some(Err(e)) => break e.to_string(),
                    None => panic!("{expected}: no error"),
                }
            };
            assert!(
                error.contains("its header cannot be parsed") && error.contains(expected),
                "{expected}: {error}"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
