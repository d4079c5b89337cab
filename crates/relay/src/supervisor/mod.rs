//! The supervisor: runs the pipeline against the server ([`run`]) and over binlog files
//! ([`replay()`]). It starts the HTTP endpoints, waits for the connector's lease, prepares each
//! run (server checks, resume point: `start.rs`), builds the stages and restarts runs after
//! MySQL or Kafka failures with capped exponential backoff, counting consecutive failed
//! attempts (`retry.max_attempts`).

mod replay;
mod retry;
mod sources;
mod start;

pub use replay::replay;
use replay::{new_decoder, new_router, new_sink};
use retry::{wait_or_stop, Retry};
pub use sources::{run_sources, Reload};
use start::{forget_rows_acked_on_another_server, prepare, store_first_start};

use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_relay_mysql::{Opts, Pool};
use tokio::sync::watch;

use crate::pipeline::{PipelineSettings, Refusals, Stages};
use outbox_relay_core::config::{Delivery, RelayConfig};
use outbox_relay_core::error::RelayError;
use outbox_relay_core::observe::audit::AckAudit;
use outbox_relay_core::observe::hub::{Hub, ReadyLimits};
use outbox_relay_core::observe::metrics::{Metrics, State};
use outbox_relay_core::observe::spans::RowSpans;
use outbox_relay_core::sink::RecordSink;
use outbox_relay_core::state::checkpoint::Checkpoint;
use outbox_relay_kafka::route::Router;
use outbox_relay_kafka::sink::{point_label, KafkaProbe, LsoMonitor, ReadBack, TransactionalSink};
use outbox_relay_mysql::binlog::source::{BinlogSource, StartFrom};
use outbox_relay_mysql::cutover::Cutover;
use outbox_relay_mysql::state::lease::Lease;
use outbox_relay_mysql::state::store::MysqlCheckpointStore;

use crate::pipeline;
use outbox_relay_core::config::mysql_tls;
use outbox_relay_core::error::with_timeout;
use outbox_relay_core::observe::http;
use outbox_relay_mysql::binlog::source;
use outbox_relay_mysql::preflight;
use outbox_relay_mysql::state::lease::instance_name;

/// A run that streamed this long counts as a success: the count of consecutive failed
/// attempts (`retry.max_attempts`) and the backoff start over.
const HEALTHY_RUN: Duration = Duration::from_secs(10);

/// Runs ended by an expired transaction of this instance ([`RelayError::TransactionExpired`])
/// or by a commit of unknown outcome ([`RelayError::CommitUnknown`]) that are followed by a
/// new producer at once; more in a row (without a healthy run between)
/// go through the backoff and `retry.max_attempts` like any failure.
const MAX_QUICK_EXPIRIES: usize = 3;

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
    let hub = Hub::new(false);
    let metrics = hub.add(&config.connector_name, ready_limits(&config));
    let spans = RowSpans::start(&config.tracing)?;
    let server = http::start(&config.http, hub).await?;
    let result = supervise(config, shutdown, &spans, Arc::clone(&metrics), None).await;
    metrics.set_state(State::Stopping);
    if let Some(server) = server {
        server.stop().await;
    }
    if let Some(spans) = spans {
        // The spans of the last records (their acknowledgements were awaited by the stop).
        spans.shutdown(SPANS_FLUSH_TIMEOUT).await;
    }
    result
}

/// On a stop, the longest wait for the OTLP receiver to take the spans still queued.
const SPANS_FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// The `/readyz` thresholds of `config`'s source.
pub(crate) fn ready_limits(config: &RelayConfig) -> ReadyLimits {
    ReadyLimits {
        stall: Duration::from_millis(config.http.ready_stall_ms),
        kafka: Duration::from_millis(config.http.ready_kafka_ms),
    }
}

/// [`run`] without the HTTP endpoints and the span exporter: one source, its state and
/// counters in `metrics`. `lease_ttl`: the lease's time to live (a fleet's `lease_ttl_ms`, see
/// relay-mysql's `state::lease`); `None`: the lease lives as long as its session.
pub(crate) async fn supervise(
    config: RelayConfig,
    mut shutdown: watch::Receiver<bool>,
    spans: &Option<RowSpans>,
    metrics: Arc<Metrics>,
    lease_ttl: Option<Duration>,
) -> Result<(), RelayError> {
    let Some(opts) = mysql_opts(&config, &mut shutdown).await? else {
        return Ok(());
    };
    let pool = Pool::new(opts.clone());
    let base_store = MysqlCheckpointStore::new(
        pool.clone(),
        config.checkpoint_table()?,
        config.connector_name.clone(),
    )
    .with_metrics(Arc::clone(&metrics));
    let router = new_router(&config)?;
    let owner = instance_name();
    let address = format!("{}:{}", opts.ip_or_hostname(), opts.tcp_port());
    let mut retry = Retry::new(&config.retry);
    let mut lease: Option<Lease> = None;
    // Consecutive runs ended by an expired transaction (see `MAX_QUICK_EXPIRIES`).
    let mut expiries = 0usize;
    // The resume point of a commit whose outcome was unknown, until a run learns it.
    let mut unknown_commit: Option<String> = None;
    let mut resume: Option<Checkpoint> = None;
    // What runs learnt about records the brokers refuse for good (see pipeline.rs).
    let mut refusals = Refusals::default();
    let mut cutover = new_cutover(&config, &pool)?.map(|c| c.with_metrics(Arc::clone(&metrics)));
    let ack_audit = ack_audit(&config)?;
    let read_back = Some(Arc::new(ReadBack::start(
        &config.kafka,
        Arc::clone(&metrics),
    )));

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
                    lease_ttl,
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
                let parts = Parts {
                    config: &config,
                    opts: &opts,
                    pool: &pool,
                    store: &store,
                    router: &router,
                    spans,
                    ack_audit: &ack_audit,
                    read_back: &read_back,
                    metrics: &metrics,
                };
                let attempt = run_once(
                    &parts,
                    l,
                    resume.clone(),
                    &mut unknown_commit,
                    &mut shutdown,
                    &mut refusals,
                    cutover.as_mut(),
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
        if let RelayError::Fenced(why) = &e {
            let held = match lease.as_mut() {
                Some(l) => l.verify().await.is_ok(),
                None => false,
            };
            if held {
                // Our lease is intact, so the producer that fenced ours is not this connector's
                // next instance: starting a new producer would fence it in turn, forever.
                break Err(RelayError::Fenced(format!(
                    "{why}. This instance still holds connector {:?}'s lease, so the other \
                     producer belongs to another connector or program: this instance stops",
                    config.connector_name
                )));
            }
        }
        if let RelayError::CommitUnknown { point, .. } = &e {
            if streamed.is_some_and(|d| d >= HEALTHY_RUN) {
                expiries = 0;
            }
            expiries += 1;
            unknown_commit = Some(point.clone());
            if expiries <= MAX_QUICK_EXPIRIES {
                // No backoff: the new producer's init_transactions ends the transaction one way
                // or the other, and the progress topic says which (see run_once).
                tracing::warn!(error = %e, "exactly-once: the commit's outcome is unknown; \
                    a new producer fences the old one and the progress topic tells whether \
                    it committed");
                metrics.reconnect(&e);
                continue;
            }
        }
        // Exactly-once: an expired transaction of an instance that still holds its lease.
        let mut expired_with_lease = false;
        if let RelayError::TransactionExpired(why) = &e {
            let held = match lease.as_mut() {
                Some(l) => l.verify().await.is_ok(),
                None => false,
            };
            if streamed.is_some_and(|d| d >= HEALTHY_RUN) {
                expiries = 0;
            }
            expiries += 1;
            expired_with_lease = held;
            if held && expiries <= MAX_QUICK_EXPIRIES {
                // Our own transaction expired while this process was stalled: nobody else
                // produces with our transactional.id, so a new producer (its init_transactions
                // aborts what is left) resumes from the progress topic's committed point at
                // once; not a failure to back off from.
                tracing::warn!(error = %why, "exactly-once: this instance still holds the \
                    connector's lease, so its own transaction expired (no other producer): \
                    continuing with a new producer from the last committed point");
                metrics.reconnect(&e);
                continue;
            }
        }
        // (Expired again and again with the lease held: backed off below, the lease kept.)
        if !expired_with_lease
            && matches!(
                e,
                RelayError::LeaseLost(_)
                    | RelayError::Fenced(_)
                    | RelayError::TransactionExpired(_)
            )
        {
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
            retry.reset();
            metrics.reconnect(&e);
            continue;
        }
        // Only an attempt that streamed for a while resets the count: one that fails before
        // streaming (however long its start-up waits took) is one more consecutive failure.
        if streamed.is_some_and(|d| d >= HEALTHY_RUN) {
            retry.reset();
        }
        let Some(delay) = retry.failed() else {
            tracing::error!(
                attempts = retry.attempts(),
                "giving up after {} consecutive failed attempts (retry.max_attempts = {}; 0 \
                 retries without end)",
                retry.attempts(),
                config.retry.max_attempts
            );
            break Err(e);
        };
        let resume_from = resume.as_ref().map(|c| c.position.to_string());
        // An unreachable Kafka was said once, by its state line; its retries are routine.
        let said = matches!(e, RelayError::Kafka(_))
            && outbox_relay_kafka::kafka_log::KafkaLog::of(&config.kafka.bootstrap_servers)
                .is_unreachable();
        if said {
            tracing::debug!(error = %e, retry_in_ms = delay.as_millis() as u64,
                attempt = retry.attempts(), ?resume_from, "Kafka still unreachable; retrying");
        } else {
            tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64,
                attempt = retry.attempts(), ?resume_from, "relay interrupted; retrying");
        }
        metrics.set_state(State::Retrying {
            error: e.to_string(),
            attempt: retry.attempts(),
            delay_ms: delay.as_millis() as u64,
        });
        if wait_or_stop(delay, &mut shutdown).await {
            break Ok(());
        }
        metrics.reconnect(&e);
    };
    if let Some(lease) = lease {
        lease.release().await;
    }
    if let Some(c) = &cutover {
        let s = c.stats();
        tracing::info!(
            rows_checked = s.checked,
            rows_skipped = s.skipped,
            queries = s.queries,
            "cutover: rows checked and skipped by this process"
        );
    }
    pool.disconnect().await.ok();
    result
}

/// The cutover filter of `[cutover]`, over the outbox tables' id columns.
fn new_cutover(config: &RelayConfig, pool: &Pool) -> Result<Option<Cutover>, RelayError> {
    let Some(c) = &config.cutover else {
        return Ok(None);
    };
    let mut id_columns = std::collections::HashMap::new();
    for m in config.table_mappings()? {
        if m.columns.id.is_empty() {
            return Err(RelayError::Config(format!(
                "[cutover] needs the outbox tables' id column, but {} maps none \
                 (outbox.columns.id = \"\")",
                m.table
            )));
        }
        id_columns.insert((*m.table).clone(), m.columns.id.clone());
    }
    Ok(Some(Cutover::new(
        c,
        pool.clone(),
        id_columns,
        Duration::from_millis(config.mysql.read_timeout_ms),
    )?))
}

/// The options of every MySQL connection ([`mysql_tls::resolve`]). With `tls_mode =
/// "preferred"` that connects once; connection failures are retried with the `[retry]` backoff.
/// `None` when `shutdown` came first.
async fn mysql_opts(
    config: &RelayConfig,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<Option<Opts>, RelayError> {
    let mut retry = Retry::new(&config.retry);
    let timeout = Duration::from_millis(config.mysql.read_timeout_ms);
    let address = mysql_address(&config.mysql.url);
    loop {
        let e = match mysql_tls::resolve(&config.mysql, timeout).await {
            Ok(opts) => return Ok(Some(opts)),
            Err(e) if e.is_retriable() => e.at_mysql_address(&address),
            Err(e) => return Err(e.at_mysql_address(&address)),
        };
        let Some(delay) = retry.failed() else {
            return Err(e);
        };
        tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64,
            attempt = retry.attempts(), "cannot connect to MySQL to negotiate TLS; retrying");
        if wait_or_stop(delay, shutdown).await {
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

/// What every run of one `supervisor::run` shares.
struct Parts<'a> {
    config: &'a RelayConfig,
    opts: &'a Opts,
    pool: &'a Pool,
    store: &'a MysqlCheckpointStore,
    router: &'a Router,
    /// `[tracing]`: the rows' spans, or `None`.
    spans: &'a Option<RowSpans>,
    /// `[audit]`: the acknowledgement audit, or `None`.
    ack_audit: &'a Option<Arc<AckAudit>>,
    /// The read-back of first acknowledgements of new partitions.
    read_back: &'a Option<Arc<ReadBack>>,
    /// The source's metrics.
    metrics: &'a Arc<Metrics>,
}

/// The acknowledgement audit of `config` (`[audit] acks_file`), opened once per process.
///
/// # Errors
/// [`RelayError::Config`] when the file cannot be opened.
pub(crate) fn ack_audit(config: &RelayConfig) -> Result<Option<Arc<AckAudit>>, RelayError> {
    config
        .audit
        .acks_file
        .as_deref()
        .map(|path| {
            AckAudit::open(path, &config.dead_letter.topic, config.audit.timings).map(Arc::new)
        })
        .transpose()
}

/// One connection lifetime: checks, resume point, pipeline.
async fn run_once(
    parts: &Parts<'_>,
    lease: &mut Lease,
    mut resume: Option<Checkpoint>,
    unknown_commit: &mut Option<String>,
    shutdown: &mut watch::Receiver<bool>,
    refusals: &mut Refusals,
    cutover: Option<&mut Cutover>,
) -> Attempt {
    let Parts {
        config,
        pool,
        store,
        metrics,
        ..
    } = *parts;
    metrics.set_state(State::Connecting);
    if let Err(e) = lease.verify().await {
        return Attempt::before_streaming(resume, Err(e));
    }
    // Exactly-once: the producer comes first. Its init_transactions fences an older producer
    // of this connector and ends that one's open transaction, after which the progress topic
    // holds the last committed point: the resume point, whatever an earlier run of this
    // process believed (a commit whose answer was lost may have succeeded).
    let io_timeout = Duration::from_millis(config.mysql.read_timeout_ms);
    let transactional = if config.kafka.delivery == Delivery::ExactlyOnce {
        if resume.is_none() {
            // The first start's position is stored before anything on the Kafka side can fail.
            let stored = unless_stopped(
                shutdown,
                with_timeout(
                    io_timeout * 2,
                    "storing the first start position",
                    store_first_start(config, pool, store),
                ),
            )
            .await;
            match stored.map(|s| s.and_then(|s| s)) {
                None => return Attempt::before_streaming(resume, Ok(())),
                Some(Ok(())) => {}
                Some(Err(e)) => return Attempt::before_streaming(resume, Err(e)),
            }
        }
        let sink = match unless_stopped(
            shutdown,
            TransactionalSink::start(config, Arc::clone(metrics)),
        )
        .await
        {
            None => return Attempt::before_streaming(resume, Ok(())),
            Some(Ok(s)) => s,
            Some(Err(e)) => return Attempt::before_streaming(resume, Err(e)),
        };
        let committed = unless_stopped(shutdown, sink.committed_point(config)).await;
        if let (Some(Ok(found)), Some(point)) = (&committed, unknown_commit.as_deref()) {
            // init_transactions has ended the old transaction: the topic holds the outcome.
            let happened = found.as_ref().map(point_label).as_deref() == Some(point);
            tracing::warn!(point = %point, committed = happened, "exactly-once: the commit whose \
            outcome was unknown {}", if happened {
                "had happened: resuming after it"
            } else {
                "had not happened: its records are sent again from the last committed point"
            });
            *unknown_commit = None;
        }
        match committed {
            None => return Attempt::before_streaming(resume, Ok(())),
            Some(Ok(Some(committed))) => {
                tracing::info!(position = %committed.position, rows_acked = committed.rows_acked,
                    gtid = ?committed.gtid_set, progress_topic = %config.kafka.progress_topic,
                    "exactly-once: resuming from the last committed point in the progress topic");
                resume = Some(committed);
            }
            Some(Ok(None)) => tracing::info!(progress_topic = %config.kafka.progress_topic,
                "exactly-once: the progress topic has no point for this connector yet; \
                 starting from the state table's checkpoint"),
            Some(Err(e)) => return Attempt::before_streaming(resume, Err(e)),
        }
        Some(sink)
    } else {
        None
    };
    let from_memory = resume.is_some();
    // Start-up queries on a half-open connection must not hang the relay either.
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
    let prepared = Prepared {
        server,
        start,
        from,
        from_memory,
    };
    if let Some(sink) = transactional {
        let probe = sink.probe();
        let monitor = sink.lso_monitor(&config.kafka);
        return stream(
            parts,
            lease,
            prepared,
            shutdown,
            (refusals, cutover),
            &sink,
            probe,
            Some(monitor),
        )
        .await;
    }
    let sink = match unless_stopped(shutdown, new_sink(config, Arc::clone(metrics))).await {
        None => return Attempt::before_streaming(Some(prepared.start), Ok(())),
        Some(Ok(s)) => s,
        Some(Err(e)) => return Attempt::before_streaming(Some(prepared.start), Err(e)),
    };
    let probe = sink.probe();
    stream(
        parts,
        lease,
        prepared,
        shutdown,
        (refusals, cutover),
        &sink,
        probe,
        None,
    )
    .await
}

/// The server, resume point and dump start of one run.
struct Prepared {
    server: preflight::ServerInfo,
    start: Checkpoint,
    from: StartFrom,
    /// `start` is an earlier run's acknowledged point, which that run may not have stored.
    from_memory: bool,
}

/// The rest of [`run_once`]: connects the binlog stream and runs the pipeline into `sink`.
#[allow(clippy::too_many_arguments)]
async fn stream<K: RecordSink>(
    parts: &Parts<'_>,
    lease: &mut Lease,
    prepared: Prepared,
    shutdown: &mut watch::Receiver<bool>,
    (refusals, mut cutover): (&mut Refusals, Option<&mut Cutover>),
    sink: &K,
    probe: KafkaProbe,
    monitor: Option<LsoMonitor>,
) -> Attempt {
    let Parts {
        config,
        opts,
        pool,
        store,
        router,
        metrics,
        ..
    } = *parts;
    let Prepared {
        server,
        start,
        from,
        from_memory,
    } = prepared;
    let io_timeout = Duration::from_millis(config.mysql.read_timeout_ms);
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
    let source = match connected {
        None => return Attempt::before_streaming(Some(start), Ok(())),
        Some(Ok(s)) => s.with_metrics(Arc::clone(metrics)),
        Some(Err(e)) => return Attempt::before_streaming(Some(start), Err(e)),
    };
    // By position, the decoder still keeps the checkpoint's GTID state up to date.
    let gtid_state = from.gtid_state().or_else(|| {
        start
            .gtid_set
            .as_deref()
            .and_then(|g| server.flavor.parse_gtid_state(g).ok())
    });
    // The Debezium profile writes Debezium's headers only (its own trace SMT is not part of
    // the event router's output unless configured there).
    let trace_columns = if config.outbox.trace_context
        && config.outbox.compat != outbox_relay_core::config::debezium::Compat::Debezium
    {
        let found = with_timeout(
            io_timeout,
            "reading the outbox tables' trace-context columns",
            async {
                let mut conn = pool.get_conn().await?;
                preflight::trace_context_columns(&mut conn, &config.outbox_tables()).await
            },
        )
        .await;
        match found.and_then(|c| c) {
            Ok(c) => c,
            Err(e) => return Attempt::before_streaming(Some(start), Err(e)),
        }
    } else {
        std::collections::HashMap::new()
    };
    let mut decoder = new_decoder(config, store.table().clone(), gtid_state, &trace_columns);
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
    if let Some(c) = cutover.as_deref_mut() {
        // The condition may have stopped fitting the tables since the last run.
        if let Err(e) = c.validate().await {
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
        spans: parts.spans.clone(),
        ack_audit: parts.ack_audit.clone(),
        read_back: parts.read_back.clone(),
        metrics: Arc::clone(metrics),
        hold: (config.dead_letter.refused_topic == outbox_relay_core::config::RefusedTopic::Hold)
            .then(|| crate::pipeline::HoldSettings {
                max_records: config.dead_letter.hold_max_records,
                initial_backoff: Duration::from_millis(config.retry.initial_backoff_ms),
                max_backoff: Duration::from_millis(config.retry.max_backoff_ms),
            }),
        start_unwritten: from_memory,
    };
    tracing::info!(from = %from, rows_acked = start.rows_acked, server_id = config.mysql.server_id, "streaming binlog");
    let stages = Stages {
        source,
        decoder,
        router,
        sink,
        store: Some(store),
        lease: Some(lease),
        cutover,
    };
    metrics.set_state(State::Streaming);
    let streaming_since = Instant::now();
    // Aborted when the run ends: the probe only speaks for a streaming relay.
    let probe = AbortOnDrop(tokio::spawn(
        probe.run(Duration::from_millis(config.http.ready_kafka_ms / 3)),
    ));
    let monitor = monitor.map(|m| {
        let every = Duration::from_millis(config.kafka.transaction_timeout_ms / 4)
            .min(Duration::from_secs(5));
        AbortOnDrop(tokio::spawn(m.run(every)))
    });
    let outcome = pipeline::run(stages, &settings, start, shutdown, refusals).await;
    drop(probe);
    drop(monitor);
    metrics.set_state(State::Connecting);
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
