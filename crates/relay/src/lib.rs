//! outbox-relay: tails a MySQL/MariaDB binlog as a replica and produces every committed INSERT
//! on the outbox tables to Kafka, checkpointing the binlog position only after Kafka has
//! acknowledged everything before it.
//!
//! One module per pipeline stage:
//! [`source`] (binlog dump) → [`decode`] (rows → [`decode::OutboxEvent`], transaction
//! boundaries) → [`route`] (topic, key, headers) → [`sink`] (idempotent producer) →
//! [`checkpoint`] (state table). [`pipeline`] runs them; [`run`] supervises runs, reconnecting
//! with capped exponential backoff after MySQL or Kafka failures. [`replay()`] runs the same
//! stages over binlog files ([`replay`] module) instead of a server.

pub mod checkpoint;
pub mod columns;
mod compressed;
pub mod config;
pub mod ddl;
pub mod decode;
pub mod error;
pub mod gtid;
pub mod http;
pub mod json;
pub mod lease;
pub mod mapping;
pub mod metrics;
pub mod mysql_tls;
pub mod ops;
pub mod pipeline;
pub mod position;
pub mod preflight;
pub mod replay;
pub mod route;
pub mod schema;
pub mod secrets;
pub mod sink;
pub mod source;

#[cfg(test)]
mod fixtures;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBuilder};
use mysql_async::{Opts, Pool};
use tokio::sync::watch;

use crate::checkpoint::{Checkpoint, CheckpointStore, MysqlCheckpointStore};
use crate::config::{RelayConfig, ResumeMode, TableName};
use crate::decode::Decoder;
use crate::decode::GtidState;
use crate::error::RelayError;
use crate::gtid::MysqlGtidSet;
use crate::lease::Lease;
use crate::metrics::State;
use crate::pipeline::{PipelineSettings, Refusals, Stages};
use crate::position::MariadbGtidPos;
use crate::preflight::ServerInfo;
use crate::replay::{ReplayRange, ReplaySource, ReplaySummary};
use crate::route::Router;
use crate::sink::KafkaSink;
use crate::source::{BinlogSource, Flavor, StartFrom};

pub use crate::config::RelayConfig as Config;

/// A run that streamed this long counts as a success: the count of consecutive failed
/// attempts (`retry.max_attempts`) and the backoff start over.
const HEALTHY_RUN: Duration = Duration::from_secs(10);

/// Runs the relay until `shutdown` turns `true` (then returns `Ok` after the final checkpoint)
/// or a non-retriable error occurs.
///
/// Before anything else it starts the HTTP endpoints of `[http]` ([`http`]: `/metrics`,
/// `/healthz`, `/readyz`), which stop when it returns. Then it waits for the connector's lease (one active instance per connector name). MySQL and
/// Kafka failures are retried with capped exponential backoff (`[retry]`), resuming from the
/// last acknowledged point; a lost lease sends the instance back to waiting for it.
///
/// # Errors
/// The first error that retrying cannot fix: configuration, server prerequisites, an
/// undecodable outbox row (with its position), an unavailable binlog position, or
/// `retry.max_attempts` consecutive failures. [`RelayError::Config`] when `http.listen` cannot
/// be bound.
pub async fn run(config: RelayConfig, shutdown: watch::Receiver<bool>) -> Result<(), RelayError> {
    let metrics = metrics::global();
    let server = http::start(&config.http, metrics).await?;
    let result = supervise(config, shutdown).await;
    metrics.set_state(State::Stopping);
    if let Some(server) = server {
        server.stop().await;
    }
    result
}

/// [`run`] without the HTTP endpoints.
async fn supervise(
    config: RelayConfig,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), RelayError> {
    let metrics = metrics::global();
    let Some(opts) = mysql_opts(&config, &mut shutdown).await? else {
        return Ok(());
    };
    let pool = Pool::new(opts.clone());
    let base_store = MysqlCheckpointStore::new(
        pool.clone(),
        config.checkpoint_table()?,
        config.connector_name.clone(),
    );
    let router = new_router(&config)?;
    let owner = instance_name();
    let address = format!("{}:{}", opts.ip_or_hostname(), opts.tcp_port());
    let mut backoff = new_backoff(&config);
    let mut attempts = 0usize;
    let mut lease: Option<Lease> = None;
    let mut resume: Option<Checkpoint> = None;
    // What runs learnt about records the brokers refuse for good (see pipeline.rs).
    let mut refusals = Refusals::default();

    let result = loop {
        let mut streamed = None;
        let learnt = refusals.learnt();
        let result = match lease.as_mut() {
            None => {
                // A missing or outdated state table is an operator's fix, not a retry.
                if let Err(e) = base_store.verify().await {
                    if !e.is_retriable() {
                        break Err(e);
                    }
                }
                metrics.set_state(State::WaitingForLease);
                match Lease::acquire(
                    opts.clone(),
                    base_store.table(),
                    &config.connector_name,
                    &owner,
                    Duration::from_millis(config.mysql.read_timeout_ms),
                    &mut shutdown,
                )
                .await
                {
                    Ok(Some(l)) => {
                        lease = Some(l);
                        resume = None; // another instance may have moved the checkpoint
                        refusals.clear();
                        continue;
                    }
                    Ok(None) => break Ok(()),
                    Err(e) => Err(e),
                }
            }
            Some(l) => {
                let store = base_store.fenced(l.token());
                let attempt = run_once(
                    &config,
                    &opts,
                    &pool,
                    &store,
                    &router,
                    l,
                    resume.clone(),
                    &mut shutdown,
                    &mut refusals,
                )
                .await;
                if attempt.acked.is_some() {
                    resume = attempt.acked;
                }
                streamed = attempt.streamed;
                attempt.result
            }
        };
        let result = result.map_err(|e| e.at_mysql_address(&address));
        if let Err(e) = &result {
            metrics.error(e);
        }
        let e = match result {
            Ok(()) => break Ok(()),
            Err(e) if e.is_retriable() && *shutdown.borrow() => {
                // A stop while MySQL or Kafka is unreachable is still a clean stop: the stored
                // checkpoint is the last one whose records Kafka acknowledged.
                tracing::info!(error = %e, checkpoint = ?resume.as_ref().map(|c| c.position.to_string()),
                    "stopped while the connection was failing; resuming from the stored checkpoint next start");
                break Ok(());
            }
            Err(e) if e.is_retriable() => e,
            Err(e) => break Err(e),
        };
        if matches!(e, RelayError::LeaseLost(_)) {
            // Give the lock back (if the connection still works) so the instance that took over
            // is not kept waiting by ours.
            if let Some(old) = lease.take() {
                let limit = Duration::from_millis(config.mysql.read_timeout_ms);
                let _ = with_timeout(limit, "releasing the lease", old.release()).await;
            }
        }
        if refusals.learnt() != learnt {
            // A refused record was found or narrowed down: progress, not a failure. Go on at
            // once with a new producer (see pipeline.rs, "Records a broker refuses for good").
            tracing::warn!(error = %e, "restarting with a new producer");
            backoff = new_backoff(&config);
            attempts = 0;
            metrics.reconnect(&e);
            continue;
        }
        // Only an attempt that streamed for a while resets the count: one that fails before
        // streaming (however long its start-up waits took) is one more consecutive failure.
        if streamed.is_some_and(|d| d >= HEALTHY_RUN) {
            backoff = new_backoff(&config);
            attempts = 0;
        }
        attempts += 1;
        if config.retry.max_attempts > 0 && attempts >= config.retry.max_attempts {
            break Err(e);
        }
        // Jitter may add to the exponential delay: the cap holds after it.
        let max_delay = Duration::from_millis(config.retry.max_backoff_ms);
        let delay = backoff.next().unwrap_or(max_delay).min(max_delay);
        tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, attempt = attempts,
            resume_from = ?resume.as_ref().map(|c| c.position.to_string()), "relay interrupted; retrying");
        metrics.set_state(State::Retrying {
            error: e.to_string(),
            attempt: attempts,
            delay_ms: delay.as_millis() as u64,
        });
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = shutdown.changed() => {}
        }
        if *shutdown.borrow() {
            break Ok(());
        }
        metrics.reconnect(&e);
    };
    if let Some(lease) = lease {
        lease.release().await;
    }
    pool.disconnect().await.ok();
    result
}

/// The options of every MySQL connection ([`mysql_tls::resolve`]). With `tls_mode =
/// "preferred"` that connects once; connection failures are retried with the `[retry]` backoff.
/// `None` when `shutdown` came first.
async fn mysql_opts(
    config: &RelayConfig,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<Option<Opts>, RelayError> {
    let mut backoff = new_backoff(config);
    let mut attempts = 0usize;
    let timeout = Duration::from_millis(config.mysql.read_timeout_ms);
    let address = mysql_address(&config.mysql.url);
    loop {
        let e = match mysql_tls::resolve(&config.mysql, timeout).await {
            Ok(opts) => return Ok(Some(opts)),
            Err(e) if e.is_retriable() => e.at_mysql_address(&address),
            Err(e) => return Err(e.at_mysql_address(&address)),
        };
        attempts += 1;
        if config.retry.max_attempts > 0 && attempts >= config.retry.max_attempts {
            return Err(e);
        }
        let max_delay = Duration::from_millis(config.retry.max_backoff_ms);
        let delay = backoff.next().unwrap_or(max_delay).min(max_delay);
        tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, attempt = attempts,
            "cannot connect to MySQL to negotiate TLS; retrying");
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = shutdown.changed() => {}
        }
        if *shutdown.borrow() {
            return Ok(None);
        }
    }
}

/// `host:port` of `mysql.url`, for error messages (the URL itself may hold a password).
fn mysql_address(url: &str) -> String {
    match Opts::from_url(url) {
        Ok(o) => format!("{}:{}", o.ip_or_hostname(), o.tcp_port()),
        Err(_) => "the server of mysql.url".into(),
    }
}

/// `host:pid`, stored as the lease owner for operators.
fn instance_name() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown-host".into());
    format!("{host}:{}", std::process::id())
}

fn new_backoff(config: &RelayConfig) -> impl Iterator<Item = Duration> {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(config.retry.initial_backoff_ms))
        .with_max_delay(Duration::from_millis(config.retry.max_backoff_ms))
        .with_jitter()
        .without_max_times()
        .build()
}

/// Aborts its task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What one connection lifetime ([`run_once`]) ended with.
struct Attempt {
    /// The latest acknowledged checkpoint known, to resume from without re-reading the store.
    acked: Option<Checkpoint>,
    /// `Ok` after a requested stop.
    result: Result<(), RelayError>,
    /// How long the binlog stream ran; `None` when the attempt ended before streaming.
    streamed: Option<Duration>,
}

impl Attempt {
    /// An attempt that ended before streaming.
    fn before_streaming(acked: Option<Checkpoint>, result: Result<(), RelayError>) -> Self {
        Self {
            acked,
            result,
            streamed: None,
        }
    }
}

/// `step`, or `None` as soon as `shutdown` turns `true` (start-up steps such as reaching an
/// unreachable Kafka must not hold up a stop).
async fn unless_stopped<T>(
    shutdown: &mut watch::Receiver<bool>,
    step: impl std::future::Future<Output = T>,
) -> Option<T> {
    if *shutdown.borrow() {
        return None;
    }
    tokio::select! {
        out = step => Some(out),
        _ = shutdown.wait_for(|stop| *stop) => None,
    }
}

/// One connection lifetime: checks, resume point, pipeline.
#[allow(clippy::too_many_arguments)]
async fn run_once(
    config: &RelayConfig,
    opts: &Opts,
    pool: &Pool,
    store: &MysqlCheckpointStore,
    router: &Router,
    lease: &mut Lease,
    resume: Option<Checkpoint>,
    shutdown: &mut watch::Receiver<bool>,
    refusals: &mut Refusals,
) -> Attempt {
    metrics::global().set_state(State::Connecting);
    if let Err(e) = lease.verify().await {
        return Attempt::before_streaming(resume, Err(e));
    }
    // Start-up queries on a half-open connection must not hang the relay either.
    let io_timeout = Duration::from_millis(config.mysql.read_timeout_ms);
    let prepared = unless_stopped(
        shutdown,
        with_timeout(
            io_timeout * 2,
            "start-up checks",
            prepare(config, pool, store, resume.clone()),
        ),
    )
    .await;
    let (server, mut start, from) = match prepared.map(|p| p.and_then(|p| p)) {
        None => return Attempt::before_streaming(resume, Ok(())),
        Some(Ok(p)) => p,
        Some(Err(e)) => return Attempt::before_streaming(resume, Err(e)),
    };
    forget_rows_acked_on_another_server(&mut start, &server, &from);
    let sink = match unless_stopped(shutdown, new_sink(config)).await {
        None => return Attempt::before_streaming(Some(start), Ok(())),
        Some(Ok(s)) => s,
        Some(Err(e)) => return Attempt::before_streaming(Some(start), Err(e)),
    };
    let connected = unless_stopped(
        shutdown,
        BinlogSource::connect(
            opts.clone(),
            config.mysql.server_id,
            &source::report_host(&config.connector_name),
            server.flavor,
            &from,
            Duration::from_millis(config.mysql.heartbeat_interval_ms),
            Duration::from_millis(config.mysql.read_timeout_ms),
        ),
    )
    .await;
    let mut source = match connected {
        None => return Attempt::before_streaming(Some(start), Ok(())),
        Some(Ok(s)) => s,
        Some(Err(e)) => return Attempt::before_streaming(Some(start), Err(e)),
    };
    let gtid_state = match &from {
        StartFrom::MariadbGtid(g) => Some(GtidState::MariaDb(g.clone())),
        StartFrom::MysqlGtid(g) => Some(GtidState::MySql(g.clone())),
        StartFrom::Position(_) => start.gtid_set.as_deref().and_then(|g| match server.flavor {
            Flavor::MariaDb => g.parse::<MariadbGtidPos>().ok().map(GtidState::MariaDb),
            Flavor::MySql => g.parse::<MysqlGtidSet>().ok().map(GtidState::MySql),
        }),
    };
    let mut decoder = new_decoder(config, store.table().clone(), gtid_state);
    let decimals = with_timeout(io_timeout, "reading temporal column precisions", async {
        let mut conn = pool.get_conn().await?;
        preflight::temporal_decimals(&mut conn, &config.outbox_tables()).await
    })
    .await;
    match decimals.and_then(|d| d) {
        Ok(all) => {
            for (table, decimals) in all {
                decoder.set_temporal_decimals(table, decimals);
            }
        }
        Err(e) => return Attempt::before_streaming(Some(start), Err(e)),
    }
    if let Some(layouts) = start.table_layouts.as_deref() {
        if let Err(e) = decoder.restore_layouts(layouts) {
            return Attempt::before_streaming(Some(start), Err(e));
        }
    }
    let settings = PipelineSettings {
        max_in_flight: config.kafka.max_in_flight,
        checkpoint_interval: Duration::from_millis(config.checkpoint.interval_ms),
        source_server_id: server.server_id,
        source_server_uuid: server.server_uuid.clone(),
        io_timeout,
        stop_timeout: Duration::from_millis(config.retry.stop_timeout_ms),
    };
    tracing::info!(from = %from, rows_acked = start.rows_acked, server_id = config.mysql.server_id, "streaming binlog");
    let stages = Stages {
        source: &mut source,
        decoder: &mut decoder,
        router,
        sink: &sink,
        store: Some(store),
        lease: Some(lease),
    };
    metrics::global().set_state(State::Streaming);
    let streaming_since = Instant::now();
    // Aborted when the run ends: the probe only speaks for a streaming relay.
    let probe = AbortOnDrop(tokio::spawn(
        sink.probe()
            .run(Duration::from_millis(config.http.ready_kafka_ms / 3)),
    ));
    let outcome = pipeline::run(stages, &settings, start, shutdown, refusals).await;
    drop(probe);
    metrics::global().set_state(State::Connecting);
    tracing::info!(
        records_acked = outcome.stats.records_acked,
        dead_lettered = outcome.stats.dead_lettered,
        transactions = outcome.stats.transactions,
        checkpoints_written = outcome.stats.checkpoints_written,
        checkpoint = %outcome.acked.position,
        rows_acked = outcome.acked.rows_acked,
        "pipeline run ended"
    );
    Attempt {
        acked: Some(outcome.acked),
        result: outcome.result,
        streamed: Some(streaming_since.elapsed()),
    }
}

/// The router of `config`'s outbox tables (shared by [`run`] and [`replay()`]).
fn new_router(config: &RelayConfig) -> Result<Router, RelayError> {
    config.table_mappings()?; // validated at load; a router follows each row's mapping
    Ok(Router::new())
}

/// The decoder of `config`'s outbox tables, ignoring writes to `checkpoint_table` (shared by
/// [`run`] and [`replay()`]).
fn new_decoder(
    config: &RelayConfig,
    checkpoint_table: TableName,
    gtid: Option<GtidState>,
) -> Decoder {
    Decoder::new(
        config.table_mappings().unwrap_or_default(),
        checkpoint_table,
        gtid,
    )
    .with_unknown_xa_commit(config.outbox.unknown_xa_commit)
}

/// The Kafka producer of `config` (with its dead-letter topic when enabled), once a broker
/// answers (shared by [`run`] and [`replay()`]).
async fn new_sink(config: &RelayConfig) -> Result<KafkaSink, RelayError> {
    let dead_letter = config
        .dead_letter
        .enabled
        .then(|| config.dead_letter.topic.clone());
    let sink = KafkaSink::new(&config.kafka, dead_letter)?;
    sink.check_reachable(&config.kafka.bootstrap_servers, Duration::from_secs(10))
        .await?;
    Ok(sink)
}

/// Replays binlog `files` (read in the order given) to Kafka: the transactions `range` selects
/// go through the same decoder, router and producer as [`run`], with the same dead-letter
/// handling, until the end of the selection (or `shutdown`), then every record is acknowledged
/// before it returns.
///
/// A replay does not connect to MySQL (`mysql.url` is only parsed: it names the checkpoint
/// table, whose writes the decoder ignores as in [`run`]), takes no lease and writes no
/// checkpoint: the live connector's position does not move.
///
/// # Errors
/// [`RelayError::Argument`] for unusable files or bounds, [`RelayError::Binlog`] for damaged
/// files (both before anything is produced; see [`replay::plan`]); then as a pipeline run: an
/// undecodable or refused row without a dead-letter topic, Kafka failures (not retried: run the
/// replay again, records are at least once).
pub async fn replay(
    config: RelayConfig,
    files: Vec<PathBuf>,
    range: ReplayRange,
    mut shutdown: watch::Receiver<bool>,
) -> Result<ReplaySummary, RelayError> {
    let router = new_router(&config)?;
    let mut decoder = new_decoder(&config, config.checkpoint_table()?, None);
    let file_count = files.len();
    let plan = tokio::task::spawn_blocking(move || replay::plan(&files, &range))
        .await
        .map_err(|e| RelayError::Binlog(format!("reading the binlog files failed: {e}")))??;
    match (&plan.first, &plan.last) {
        (Some(first), Some(last)) => tracing::info!(
            transactions = plan.transactions, from = %first, to = %last,
            "replaying whole transactions"
        ),
        _ => tracing::warn!("no whole transaction of the files is in the selected range"),
    }
    let sink = new_sink(&config).await?;
    let mut source = ReplaySource::new(&plan);
    let settings = PipelineSettings {
        max_in_flight: config.kafka.max_in_flight,
        checkpoint_interval: Duration::from_millis(config.checkpoint.interval_ms),
        source_server_id: 0,
        source_server_uuid: None,
        io_timeout: Duration::from_millis(config.mysql.read_timeout_ms),
        stop_timeout: Duration::from_millis(config.retry.stop_timeout_ms),
    };
    let start = Checkpoint {
        position: plan
            .first
            .clone()
            .unwrap_or_else(|| position::BinlogPosition::new(String::new(), 4)),
        rows_acked: 0,
        gtid_set: None,
        source_server_id: 0,
        source_server_uuid: None,
        table_layouts: None,
    };
    let stages = Stages {
        source: &mut source,
        decoder: &mut decoder,
        router: &router,
        sink: &sink,
        store: None::<&MysqlCheckpointStore>,
        lease: None,
    };
    // A replay is not retried: a refusal that stops the producer ends it (exit 1).
    let mut refusals = Refusals::default();
    let outcome = pipeline::run(stages, &settings, start, &mut shutdown, &mut refusals).await;
    let summary = ReplaySummary {
        files: file_count,
        events: source.events(),
        transactions: plan.transactions,
        records: outcome
            .stats
            .records_acked
            .saturating_sub(outcome.stats.dead_lettered),
        dead_lettered: outcome.stats.dead_lettered,
        last_position: (outcome.stats.transactions > 0).then(|| outcome.acked.position.clone()),
        rows_after_last_position: outcome.acked.rows_acked,
        complete: source.finished(),
    };
    let last = summary
        .last_position
        .as_ref()
        .map_or_else(|| "none".to_owned(), ToString::to_string);
    tracing::info!(
        files = summary.files,
        events = summary.events,
        transactions = summary.transactions,
        records_produced = summary.records,
        dead_lettered = summary.dead_lettered,
        last_position = %last,
        rows_after_last_position = summary.rows_after_last_position,
        complete = summary.complete && outcome.result.is_ok(),
        "replay summary"
    );
    outcome.result?;
    Ok(summary)
}

/// Checks the server and finds where to start: the in-memory resume point, else the stored
/// checkpoint, else the current end of the binlog (stored at once, so rows committed from now on
/// are relayed even if the relay dies before its first record).
async fn prepare(
    config: &RelayConfig,
    pool: &Pool,
    store: &MysqlCheckpointStore,
    resume: Option<Checkpoint>,
) -> Result<(ServerInfo, Checkpoint, StartFrom), RelayError> {
    let mut conn = pool.get_conn().await?;
    let server = preflight::check_server(&mut conn).await?;
    preflight::check_outbox_tables(&mut conn, &config.table_mappings()?).await?;
    store.verify().await?;
    if !server.row_metadata_full && !store.stores_layouts() {
        return Err(RelayError::Prerequisite {
            setting: "binlog_row_metadata".into(),
            expected: "FULL (column names in the binlog), or a checkpoint table that can store \
                       the outbox tables' column layouts"
                .into(),
            found: format!(
                "no column names in table maps, and {} has no table_layouts column",
                store.table()
            ),
            fix: format!(
                "SET GLOBAL binlog_row_metadata=FULL (MySQL 8.0.1+, MariaDB 10.5+), or apply \
                 migrations/0003_checkpoint_layouts.sql to {} so the relay can follow the \
                 layouts itself",
                store.table()
            ),
        });
    }
    // Our own previous dump connection may still be registered until the server notices it is
    // gone (at its next heartbeat).
    let grace = Duration::from_millis(config.mysql.heartbeat_interval_ms * 2 + 1000);
    preflight::check_server_id_unique(
        &mut conn,
        &server,
        config.mysql.server_id,
        &source::report_host(&config.connector_name),
        grace,
    )
    .await?;
    let start = match resume {
        Some(resume) => resume,
        None => match store.load().await? {
            Some(stored) => {
                tracing::info!(position = %stored.position, rows_acked = stored.rows_acked,
                    gtid = ?stored.gtid_set, "resuming from stored checkpoint");
                stored
            }
            None => {
                let (position, executed, table_layouts) = preflight::position_with_layouts(
                    &mut conn,
                    server.flavor,
                    &config.outbox_tables(),
                )
                .await?;
                let gtid_set = match server.flavor {
                    Flavor::MariaDb => preflight::mariadb_gtid_at(&mut conn, &position).await?,
                    Flavor::MySql => executed,
                };
                let start = Checkpoint {
                    position,
                    rows_acked: 0,
                    gtid_set,
                    source_server_id: server.server_id,
                    source_server_uuid: server.server_uuid.clone(),
                    table_layouts,
                };
                store.save(&start).await?;
                tracing::info!(position = %start.position, gtid = ?start.gtid_set,
                    "no checkpoint: starting at the current end of the binlog");
                start
            }
        },
    };
    let mut start = start;
    if !server.row_metadata_full && start.table_layouts.is_none() {
        // A checkpoint moved by `reset` or by hand carries no layouts: today's are the best
        // known, right unless an outbox table's columns changed after the checkpoint.
        start.table_layouts =
            preflight::current_layouts(&mut conn, &config.outbox_tables()).await?;
        tracing::warn!(position = %start.position,
            "the checkpoint carries no outbox table layouts (moved by reset or by hand) and table \
             maps carry no column names: using the tables' current columns from \
             information_schema. If an outbox table's columns changed after this position, move \
             the checkpoint past that change (or SET GLOBAL binlog_row_metadata=FULL)");
    }
    let from = start_from(config.mysql.resume, &server, &start)?;
    if let StartFrom::Position(p) = &from {
        preflight::check_position_available(&mut conn, server.flavor, p).await?;
    }
    Ok((server, start, from))
}

/// Chooses how to resume from `start` under `mode`.
/// A checkpoint inside a transaction (`rows_acked` > 0) resumed by GTID on another server than
/// the one it was written on (a failover): its `rows_acked` becomes 0, so that transaction's
/// first rows are sent again rather than trusted.
///
/// Why: `rows_acked` counts rows of "the transaction after the GTID set", which is a fact of the
/// server the checkpoint was written on. Another server may log other transactions first (ones
/// the old replica's replication filters left out, other GTID domains) or may not have that
/// transaction at all (an asynchronous failover that lost it); skipping rows there could skip
/// rows that were never sent. Sending them twice is within at-least-once.
fn forget_rows_acked_on_another_server(
    start: &mut Checkpoint,
    server: &ServerInfo,
    from: &StartFrom,
) {
    let by_gtid = matches!(from, StartFrom::MariadbGtid(_) | StartFrom::MysqlGtid(_));
    let other_server = start.source_server_id != server.server_id
        || matches!((&start.source_server_uuid, &server.server_uuid), (Some(a), Some(b)) if a != b);
    if by_gtid && other_server && start.rows_acked > 0 {
        tracing::warn!(
            rows_acked = start.rows_acked,
            checkpoint_server_id = start.source_server_id,
            server_id = server.server_id,
            "the checkpoint was written inside a transaction on another server: that \
             transaction cannot be matched here, so its first rows_acked rows are not skipped \
             and may be sent again (at-least-once; consumers deduplicate by event_key)"
        );
        start.rows_acked = 0;
    }
}

fn start_from(
    mode: ResumeMode,
    server: &ServerInfo,
    start: &Checkpoint,
) -> Result<StartFrom, RelayError> {
    let bad = |e: String| RelayError::Binlog(format!("the checkpoint's gtid_set: {e}"));
    let gtid = match (server.flavor, start.gtid_set.as_deref()) {
        (Flavor::MariaDb, Some(g)) => Some(StartFrom::MariadbGtid(
            g.parse::<MariadbGtidPos>()
                .map_err(|e| bad(e.to_string()))?,
        )),
        (Flavor::MySql, Some(g)) => Some(StartFrom::MysqlGtid(
            g.parse::<MysqlGtidSet>().map_err(|e| bad(e.to_string()))?,
        )),
        (_, None) => None,
    };
    match (mode, gtid) {
        (ResumeMode::Position, _) | (ResumeMode::Auto, None) => {
            if start.source_server_id != server.server_id {
                tracing::warn!(
                    stored_server_id = start.source_server_id,
                    server_id = server.server_id,
                    "the checkpoint was written for another server; resuming from its file and \
                     position, which only makes sense on the same server (use GTIDs to move \
                     between servers)"
                );
            }
            Ok(StartFrom::Position(start.position.clone()))
        }
        (ResumeMode::Gtid | ResumeMode::Auto, Some(from)) => Ok(from),
        (ResumeMode::Gtid, None) => Err(RelayError::Config(
            "mysql.resume = \"gtid\" but the checkpoint has no gtid_set (MySQL needs \
             gtid_mode=ON)"
                .into(),
        )),
    }
}

/// Awaits `fut` for at most `limit`; a half-open connection must not hang the relay.
///
/// # Errors
/// [`RelayError::Mysql`] naming `what` when the time is up.
pub async fn with_timeout<T>(
    limit: Duration,
    what: &str,
    fut: impl std::future::Future<Output = T>,
) -> Result<T, RelayError> {
    tokio::time::timeout(limit, fut).await.map_err(|_| {
        RelayError::Mysql(format!("{what}: no answer within {} ms", limit.as_millis()))
    })
}

/// `url` with any password replaced by `***`, for logs and errors.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let Some((userinfo, host)) = rest.rsplit_once('@') else {
        return url.to_owned();
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_owned(),
    }
}

/// Removes anything that looks like a connection URL's password from an error message.
pub fn redact_error(message: &str) -> String {
    message
        .split(' ')
        .map(|w| {
            if w.contains("://") {
                redact_url(w)
            } else {
                w.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact_url("mysql://relay:s3cr@t@db:3306/shop"),
            "mysql://relay:***@db:3306/shop"
        );
        assert_eq!(redact_url("mysql://root@db/shop"), "mysql://root@db/shop");
        assert_eq!(
            redact_error("cannot connect to mysql://u:pw@h/db now"),
            "cannot connect to mysql://u:***@h/db now"
        );
    }

    #[test]
    fn rows_acked_is_kept_only_on_the_checkpoints_own_server_or_by_position() {
        let server = |id: u32, uuid: Option<&str>| ServerInfo {
            flavor: Flavor::MariaDb,
            version: "10.11".into(),
            server_id: id,
            server_uuid: uuid.map(str::to_owned),
            row_metadata_full: true,
        };
        let checkpoint = |id: u32, uuid: Option<&str>| Checkpoint {
            position: position::BinlogPosition::new("mariadb-bin.000007", 1234),
            rows_acked: 3,
            gtid_set: Some("0-1-50".into()),
            source_server_id: id,
            source_server_uuid: uuid.map(str::to_owned),
            table_layouts: None,
        };
        let by_gtid = StartFrom::MariadbGtid("0-1-50".parse().expect("gtid"));
        let by_position =
            StartFrom::Position(position::BinlogPosition::new("mariadb-bin.000007", 1234));
        let after = |cp: Checkpoint, s: &ServerInfo, from: &StartFrom| {
            let mut cp = cp;
            forget_rows_acked_on_another_server(&mut cp, s, from);
            cp.rows_acked
        };
        // The same server: the transaction after the GTID set is the one counted.
        assert_eq!(after(checkpoint(2, None), &server(2, None), &by_gtid), 3);
        // Another server (a failover): not trusted.
        assert_eq!(after(checkpoint(2, None), &server(1, None), &by_gtid), 0);
        // Same server_id but another server_uuid (MySQL): not trusted either.
        assert_eq!(
            after(checkpoint(2, Some("a")), &server(2, Some("b")), &by_gtid),
            0
        );
        // By position the file and offset name the transaction: kept (and checked by the run).
        assert_eq!(
            after(checkpoint(2, None), &server(1, None), &by_position),
            3
        );
    }
}
