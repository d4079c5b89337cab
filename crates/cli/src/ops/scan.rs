//! Reading the server's binlog for `reset`: whether a position is a transaction boundary, the
//! first boundary at or after a time, where a GTID position starts. Through the same binlog dump
//! ([`BinlogSource`], registering as replica `mysql.server_id`) and the same transaction
//! tracking ([`Decoder`], with no outbox table) as `run`, so "a boundary" means exactly what the
//! relay stores as a checkpoint.
//!
//! Only call these while holding the connector's lease or after checking that no instance holds
//! it: the dump uses the connector's `server_id`.

use std::time::Duration;

use mysql_async::binlog::EventType;

use outbox_relay_core::config::RelayConfig;
use outbox_relay_core::error::RelayError;
use outbox_relay_core::outbox::mapping::TableMapping;
use outbox_relay_core::position::gtid::MysqlGtidSet;
use outbox_relay_core::position::{BinlogPosition, GtidState};
use outbox_relay_mysql::binlog::source::{report_host, BinlogSource, SourceEvent, StartFrom};
use outbox_relay_mysql::decode::{DecodedRow, Decoder, TxBoundary};
use outbox_relay_mysql::server::Flavor;

/// The dump server_id of an operator command that reads the binlog while the relay may run
/// (`trace`, `status`, `prune`): 4000000000 + a hash of the connector name and the process id,
/// so it is neither the connector's own `mysql.server_id` (a second dump with it would make the
/// server drop the running relay's connection) nor (very likely) another command's.
pub fn private_server_id(config: &RelayConfig) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(config.connector_name.as_bytes());
    h.update(&std::process::id().to_le_bytes());
    4_000_000_000 + h.finalize() % 294_967_295
}

/// A [`Scanner`] from `from` that decodes the rows of every outbox table of `config` (patterns
/// resolved on the server, layouts from `information_schema` when table maps carry no column
/// names), numbering them as `run` does, as replica [`private_server_id`].
///
/// # Errors
/// As [`Scanner::open`]; [`RelayError::Mysql`] when the tables of a pattern cannot be listed.
pub async fn outbox_scanner(
    config: &RelayConfig,
    conn: &mut mysql_async::Conn,
    server: &outbox_relay_mysql::preflight::ServerInfo,
    from: &BinlogPosition,
) -> Result<Scanner, RelayError> {
    let mappings =
        outbox_relay_mysql::preflight::resolve_mappings(conn, &config.table_mappings()?).await?;
    // ServerInfo::row_metadata_full is only known after the prerequisite checks: asked here.
    let layouts = if outbox_relay_mysql::preflight::row_metadata_full(conn).await? {
        None
    } else {
        let tables: Vec<_> = mappings.iter().map(|m| (*m.table).clone()).collect();
        outbox_relay_mysql::preflight::current_layouts(conn, &tables)
            .await
            .ok()
            .flatten()
    };
    let mut dump = config.clone();
    dump.mysql.server_id = private_server_id(config);
    Ok(
        Scanner::open(&dump, server.flavor, &StartFrom::Position(from.clone()))
            .await?
            .with_outbox_tables(mappings, layouts),
    )
}

/// Outbox rows a forward move of the checkpoint skips (`reset`'s plan).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Skipped {
    /// Rows counted.
    pub rows: u64,
    /// The event keys of the first rows (at most [`SKIPPED_KEYS_SHOWN`]; a row without one
    /// shows its position).
    pub first: Vec<String>,
    /// Counting stopped early (after [`SKIPPED_DEADLINE`]): `rows` is a lower bound.
    pub partial: bool,
}

/// Most event keys [`skipped_rows`] lists.
pub const SKIPPED_KEYS_SHOWN: usize = 5;
/// Longest count of [`skipped_rows`].
const SKIPPED_DEADLINE: Duration = Duration::from_secs(60);

/// The outbox rows from `checkpoint` to the boundary `to` that a relay resuming at `to` does
/// not relay: every outbox row of the transactions in between, except those the checkpoint
/// covers already ([`Checkpoint::covers_row`]: its `rows_acked`).
///
/// # Errors
/// As [`outbox_scanner`] and [`Scanner::next`].
pub async fn skipped_rows(
    config: &RelayConfig,
    conn: &mut mysql_async::Conn,
    server: &outbox_relay_mysql::preflight::ServerInfo,
    checkpoint: &outbox_relay_core::state::checkpoint::Checkpoint,
    to: &BinlogPosition,
) -> Result<Skipped, RelayError> {
    let mut skipped = Skipped::default();
    if checkpoint
        .position
        .partial_cmp(to)
        .is_none_or(|o| o.is_ge())
    {
        return Ok(skipped);
    }
    let mut scanner = outbox_scanner(config, conn, server, &checkpoint.position).await?;
    let deadline = tokio::time::Instant::now() + SKIPPED_DEADLINE;
    let mut base = checkpoint.position.clone();
    let mut n = 0u64;
    loop {
        let Ok(next) = tokio::time::timeout_at(deadline, scanner.next()).await else {
            skipped.partial = true;
            return Ok(skipped);
        };
        let s = next?;
        if s.event.position > *to {
            return Ok(skipped);
        }
        for row in &s.rows {
            n += 1;
            if checkpoint.covers_row(&base, n) == Some(true) {
                continue;
            }
            skipped.rows += 1;
            if skipped.first.len() < SKIPPED_KEYS_SHOWN {
                let key = match row {
                    Ok(ev) => ev.event_key.as_deref(),
                    Err(f) => f
                        .headers
                        .iter()
                        .find(|(name, _)| name == "event_key")
                        .map(|(_, v)| v.as_slice()),
                };
                skipped.first.push(key.map_or_else(
                    || format!("(no event_key, at {})", s.event.position),
                    |k| String::from_utf8_lossy(k).into_owned(),
                ));
            }
        }
        if s.event.position >= *to {
            // `to` may follow events that end no transaction (a new file's first events).
            return Ok(skipped);
        }
        if let Some(b) = s.boundary {
            base = b.position;
            n = 0;
        }
    }
}

/// How far a stored checkpoint covers the binlog, its `rows_acked` taken into account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Coverage {
    /// Every outbox row before this position is relayed: the checkpoint's position, or the end
    /// of the transaction after it when all of that transaction's outbox rows are among the
    /// checkpoint's `rows_acked`.
    pub through: BinlogPosition,
    /// The transaction after the checkpoint is partly acknowledged.
    pub partial: Option<PartlyAcked>,
}

/// A transaction whose first outbox rows are acknowledged (the checkpoint's `rows_acked`) and
/// the rest not yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartlyAcked {
    /// Its outbox rows acknowledged (`rows_acked`).
    pub acked: u64,
    /// Its outbox rows (those read up to the server's end, when it has not ended there).
    pub rows: u64,
    /// Where the event holding its first unacknowledged row starts: binlog before it is
    /// relayed.
    pub unrelayed_from: BinlogPosition,
}

/// Longest read of the transaction after a checkpoint.
const COVERAGE_DEADLINE: Duration = Duration::from_secs(20);

/// How far `checkpoint` covers the binlog, up to the server's end `end`: with `rows_acked` = 0
/// its position; else the transaction after it is read (a binlog dump as replica
/// [`private_server_id`], its outbox rows decoded with every outbox table of `config` as `run`
/// numbers them) and judged by [`Checkpoint::covers_row`]: all its rows acknowledged moves
/// `through` to its end, otherwise it is [`PartlyAcked`].
///
/// # Errors
/// As [`Scanner::open`] and [`Scanner::next`]; [`RelayError::Binlog`] after
/// [`COVERAGE_DEADLINE`].
pub async fn coverage(
    config: &RelayConfig,
    conn: &mut mysql_async::Conn,
    server: &outbox_relay_mysql::preflight::ServerInfo,
    checkpoint: &outbox_relay_core::state::checkpoint::Checkpoint,
    end: &BinlogPosition,
) -> Result<Coverage, RelayError> {
    let at = Coverage {
        through: checkpoint.position.clone(),
        partial: None,
    };
    if checkpoint.rows_acked == 0
        || checkpoint
            .position
            .partial_cmp(end)
            .is_none_or(|o| o.is_ge())
    {
        return Ok(at);
    }
    let read = async {
        let mut scanner = outbox_scanner(config, conn, server, &checkpoint.position).await?;
        let mut rows = 0u64;
        let mut event_start = checkpoint.position.clone();
        let mut unrelayed_from: Option<BinlogPosition> = None;
        loop {
            let s = scanner.next().await?;
            for _ in &s.rows {
                rows += 1;
                if checkpoint.covers_row(&checkpoint.position, rows) == Some(false)
                    && unrelayed_from.is_none()
                {
                    unrelayed_from = Some(event_start.clone());
                }
            }
            let ended = s.boundary.is_some() || s.event.position >= *end;
            if let Some(b) = &s.boundary {
                if unrelayed_from.is_none() {
                    return Ok(Coverage {
                        through: b.position.clone(),
                        partial: None,
                    });
                }
            }
            if ended {
                return Ok(Coverage {
                    through: checkpoint.position.clone(),
                    partial: Some(PartlyAcked {
                        acked: checkpoint.rows_acked,
                        rows,
                        unrelayed_from: unrelayed_from.unwrap_or(event_start),
                    }),
                });
            }
            // Events of a compressed payload share its end: the next starts where it ends only
            // once the payload is over.
            if !s.event.in_payload && s.event.position > event_start {
                event_start = s.event.position.clone();
            }
        }
    };
    match tokio::time::timeout(COVERAGE_DEADLINE, read).await {
        Ok(r) => r,
        Err(_) => Err(RelayError::binlog(format!(
            "reading the transaction after the checkpoint {} took over {} s",
            checkpoint.position,
            COVERAGE_DEADLINE.as_secs()
        ))),
    }
}

/// MariaDB GTID event (type 162).
const MARIADB_GTID_EVENT: u8 = 162;
/// MySQL tagged GTID event (type 42).
const GTID_TAGGED_LOG_EVENT: u8 = 42;

/// A binlog dump with transaction tracking.
pub struct Scanner {
    source: BinlogSource,
    decoder: Option<Decoder>,
    checkpoint_table: outbox_relay_core::config::TableName,
    /// Outbox tables whose rows are decoded (none for `reset`; `trace` reads them).
    outbox_tables: Vec<TableMapping>,
    /// Column layouts to start from when table maps carry no column names (JSON of
    /// [`outbox_relay_mysql::decode::schema`]).
    layouts: Option<std::sync::Arc<str>>,
}

/// One event of a [`Scanner`].
pub struct Scanned {
    /// The event and where it ends.
    pub event: SourceEvent,
    /// The transaction boundary this event ends, if any.
    pub boundary: Option<TxBoundary>,
    /// Outbox rows of this event (only with [`Scanner::with_outbox_tables`]).
    pub rows: Vec<DecodedRow>,
    /// `true` after this event while a transaction is open (or a GTID event was just read).
    pub inside: bool,
}

impl Scanner {
    /// Starts a dump at `from` as replica `mysql.server_id` (report host of the connector).
    ///
    /// # Errors
    /// [`RelayError::Binlog`] when the server cannot send from there (error 1236);
    /// [`RelayError::Mysql`] for connection failures.
    pub async fn open(
        config: &RelayConfig,
        flavor: Flavor,
        from: &StartFrom,
    ) -> Result<Self, RelayError> {
        let source = BinlogSource::connect(
            super::opts(config)?,
            config.mysql.server_id,
            &report_host(&config.connector_name),
            flavor,
            from,
            Duration::from_millis(config.mysql.heartbeat_interval_ms),
            Duration::from_millis(config.mysql.read_timeout_ms),
        )
        .await?;
        Ok(Self {
            source,
            decoder: None,
            checkpoint_table: config.checkpoint_table()?,
            outbox_tables: Vec::new(),
            layouts: None,
        })
    }

    /// Decodes the rows of these outbox tables too ([`Scanned::rows`]), starting from
    /// `layouts` (JSON of [`outbox_relay_mysql::decode::schema`]) when the server's table maps carry no
    /// column names. Call before the first [`Scanner::next`].
    #[must_use]
    pub fn with_outbox_tables(
        mut self,
        tables: Vec<TableMapping>,
        layouts: Option<std::sync::Arc<str>>,
    ) -> Self {
        self.outbox_tables = tables;
        self.layouts = layouts;
        self
    }

    fn decoder(&mut self, gtid: Option<GtidState>) -> &mut Decoder {
        let table = self.checkpoint_table.clone();
        let tables = &self.outbox_tables;
        let layouts = self.layouts.as_deref();
        self.decoder.get_or_insert_with(|| {
            let mut d = Decoder::new(tables.iter().cloned(), table, gtid)
                .with_unknown_xa_commit(outbox_relay_core::config::UnknownXaCommit::Skip);
            if let Some(json) = layouts {
                // Layouts that do not parse only cost column names: rows then fail to decode
                // and the caller reports them as not found.
                let _ = d.restore_layouts(json);
            }
            d
        })
    }

    /// The next event, decoded for transaction boundaries.
    ///
    /// # Errors
    /// As [`BinlogSource::next`] and [`Decoder::decode`].
    pub async fn next(&mut self) -> Result<Scanned, RelayError> {
        let event = self.source.next().await?;
        let raw = event.event.header().event_type_raw();
        if raw == EventType::FORMAT_DESCRIPTION_EVENT as u8 || raw == EventType::ROTATE_EVENT as u8
        {
            return Ok(Scanned {
                event,
                boundary: None,
                rows: Vec::new(),
                inside: self.decoder.as_ref().is_some_and(Decoder::in_transaction),
            });
        }
        // MySQL: the GTID set of the file's start, so boundaries carry GTID sets.
        let start_set = (raw == EventType::PREVIOUS_GTIDS_EVENT as u8)
            .then(|| MysqlGtidSet::from_previous_gtids_event(&event.event).ok())
            .flatten();
        self.decoder(start_set.map(GtidState::MySql));
        let is_gtid = is_gtid_event(raw);
        let Self {
            source, decoder, ..
        } = self;
        let decoder = decoder
            .as_mut()
            .ok_or_else(|| RelayError::binlog("scanner without a decoder"))?;
        let decoded = decoder.decode(&event, |id| source.table_map(id))?;
        let (rows, boundary) = decoded.into_parts();
        let inside = decoder.in_transaction() || is_gtid;
        Ok(Scanned {
            event,
            boundary,
            rows,
            inside,
        })
    }
}

/// `true` for a MySQL or MariaDB GTID event type (a transaction's first event).
pub(crate) fn is_gtid_event(raw: u8) -> bool {
    raw == MARIADB_GTID_EVENT
        || raw == EventType::GTID_EVENT as u8
        || raw == EventType::ANONYMOUS_GTID_EVENT as u8
        || raw == GTID_TAGGED_LOG_EVENT
}

/// Checks that `pos` is a place the relay may resume from: the start of a file (4) or the end of
/// an event after which no transaction is open. Returns the GTID set there when the scan knows
/// it (MySQL; MariaDB's comes from `BINLOG_GTID_POS`).
///
/// # Errors
/// [`RelayError::Argument`] saying why it is not; dump errors as [`Scanner::open`].
pub async fn check_boundary(
    config: &RelayConfig,
    flavor: Flavor,
    pos: &BinlogPosition,
) -> Result<Option<String>, RelayError> {
    let mut scanner = Scanner::open(
        config,
        flavor,
        &StartFrom::Position(BinlogPosition::new(pos.file.clone(), 4)),
    )
    .await?;
    let mut gtid: Option<String> = None;
    if pos.pos == 4 {
        // Read the file's header events for the GTID set at its start (MySQL).
        loop {
            let s = scanner.next().await?;
            let raw = s.event.event.header().event_type_raw();
            if raw == EventType::PREVIOUS_GTIDS_EVENT as u8 {
                gtid = MysqlGtidSet::from_previous_gtids_event(&s.event.event)
                    .ok()
                    .map(|g| g.to_string());
            }
            if raw != EventType::FORMAT_DESCRIPTION_EVENT as u8 || s.event.position.file != pos.file
            {
                return Ok(gtid.filter(|g| !g.is_empty()));
            }
        }
    }
    // Whether a transaction was open after the previous event: a position before the next
    // event's end is then inside that transaction. (MariaDB 11.4+ logs no end for the events
    // inside a transaction, so the dump cannot place `pos` between them.)
    let mut open_before = false;
    loop {
        let s = scanner.next().await?;
        if let Some(b) = &s.boundary {
            gtid = b.gtid_set.clone();
        }
        let at = &s.event.position;
        if at.file != pos.file {
            return Err(not_boundary(pos, "no event of that file ends there"));
        }
        if at.pos == pos.pos {
            if s.inside {
                return Err(not_boundary(
                    pos,
                    "it is inside a transaction (or right after its GTID event, or while an XA \
                     transaction prepared earlier in the file is undecided)",
                ));
            }
            return Ok(gtid.filter(|g| !g.is_empty()));
        }
        if at.pos > pos.pos {
            if open_before {
                return Err(not_boundary(
                    pos,
                    &format!("it is inside a transaction (its next event ends at {at})"),
                ));
            }
            return Err(not_boundary(
                pos,
                &format!("it is inside the event that ends at {at}"),
            ));
        }
        open_before = s.inside;
    }
}

fn not_boundary(pos: &BinlogPosition, why: &str) -> RelayError {
    RelayError::Argument(format!(
        "{pos} is not a transaction boundary: {why}. Use 4 (a file's start), the End_log_pos of \
         an Xid event or of a COMMIT query in SHOW BINLOG EVENTS IN '{}', or --to TIMESTAMP",
        pos.file
    ))
}

/// The time (seconds since the epoch) the binlog file `file` was created: the timestamp of its
/// format description event.
///
/// # Errors
/// As [`Scanner::open`].
pub async fn file_created(
    config: &RelayConfig,
    flavor: Flavor,
    file: &str,
) -> Result<u32, RelayError> {
    let mut scanner = Scanner::open(
        config,
        flavor,
        &StartFrom::Position(BinlogPosition::new(file, 4)),
    )
    .await?;
    let s = scanner.next().await?;
    Ok(s.event.timestamp)
}

/// The boundary before the first transaction whose commit event (Xid or COMMIT) has a
/// timestamp at or after `at` (seconds since the epoch, UTC), scanning from `from` (a file
/// start, itself a boundary) to `end` (the server's current end, a boundary). `end` when no
/// transaction committed at or after `at` by then. Returns the position, its GTID set when the
/// scan knows it (MySQL), and the commit time of the transaction that follows (if any).
///
/// # Errors
/// As [`Scanner::next`].
pub async fn first_boundary_at(
    config: &RelayConfig,
    flavor: Flavor,
    from: &BinlogPosition,
    end: &BinlogPosition,
    at: i64,
) -> Result<(BinlogPosition, Option<String>, Option<u32>), RelayError> {
    let mut last = (from.clone(), None::<String>);
    if from >= end {
        return Ok((last.0, last.1, None));
    }
    let mut scanner = Scanner::open(config, flavor, &StartFrom::Position(from.clone())).await?;
    loop {
        let s = scanner.next().await?;
        if let Some(b) = s.boundary {
            if i64::from(s.event.timestamp) >= at {
                return Ok((last.0, last.1, Some(s.event.timestamp)));
            }
            last = (b.position, b.gtid_set);
        }
        if s.event.position >= *end {
            return Ok((last.0, last.1, None));
        }
    }
}

/// Where a dump from the GTID position `gtid` starts: the start of the first transaction not in
/// it. The caller handles a `gtid` equal to the server's current GTID state (nothing to send).
///
/// # Errors
/// [`RelayError::Argument`] when the server does not have those GTIDs (error 1236: purged,
/// or not of this topology) or sends no transaction within the read timeout; parse errors of
/// `gtid` as [`RelayError::Argument`].
pub async fn gtid_start(
    config: &RelayConfig,
    flavor: Flavor,
    gtid: &str,
) -> Result<BinlogPosition, RelayError> {
    let start = StartFrom::from(
        flavor
            .parse_gtid_state(gtid)
            .map_err(|e| RelayError::Argument(format!("--to {gtid:?}: {e}")))?,
    );
    let refuse = |e: RelayError| {
        RelayError::Argument(format!(
            "the server cannot send the binlog from GTID position {gtid}: {e}"
        ))
    };
    let mut scanner = Scanner::open(config, flavor, &start)
        .await
        .map_err(refuse)?;
    loop {
        let s = scanner.next().await.map_err(refuse)?;
        let h = s.event.event.header();
        let raw = h.event_type_raw();
        if is_gtid_event(raw) && h.log_pos() > 0 {
            let start = u64::from(h.log_pos()).saturating_sub(u64::from(h.event_size()));
            return Ok(BinlogPosition::new(s.event.position.file, start));
        }
    }
}
