//! The stages both [`super::run`] and [`replay()`] build from the configuration, and the
//! replay of binlog files through them.

use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::watch;

use crate::pipeline::{PipelineSettings, Refusals, Stages};
use outbox_relay_core::config::{RelayConfig, TableName};
use outbox_relay_core::error::RelayError;
use outbox_relay_core::observe::metrics::Metrics;
use outbox_relay_core::position::GtidState;
use outbox_relay_core::state::checkpoint::Checkpoint;
use outbox_relay_kafka::route::Router;
use outbox_relay_kafka::sink::KafkaSink;
use outbox_relay_mysql::binlog::replay::{ReplayRange, ReplaySource, ReplaySummary};
use outbox_relay_mysql::decode::Decoder;
use outbox_relay_mysql::state::store::MysqlCheckpointStore;

use crate::pipeline;

/// The router of `config`'s outbox tables (shared by [`run`] and [`replay()`]).
pub(super) fn new_router(config: &RelayConfig) -> Result<Router, RelayError> {
    config.table_mappings()?; // validated at load; a router follows each row's mapping
    Ok(Router::new())
}

/// The decoder of `config`'s outbox tables, ignoring writes to `checkpoint_table` (shared by
/// [`run`] and [`replay()`]). `trace_columns`: per table, its trace-context columns
/// (`outbox.trace_context`) that become header columns unless `additional` maps them already.
pub(super) fn new_decoder(
    config: &RelayConfig,
    checkpoint_table: TableName,
    gtid: Option<GtidState>,
    trace_columns: &std::collections::HashMap<TableName, Vec<String>>,
) -> Decoder {
    let mut mappings = config.table_mappings().unwrap_or_default();
    for m in &mut mappings {
        for column in trace_columns.get(&*m.table).into_iter().flatten() {
            if !m
                .additional
                .iter()
                .any(|a| a.column.eq_ignore_ascii_case(column))
            {
                m.additional
                    .push(outbox_relay_core::config::AdditionalColumn {
                        column: column.clone(),
                        placement: outbox_relay_core::config::Placement::Header,
                        alias: Some(column.to_ascii_lowercase()),
                    });
            }
        }
    }
    Decoder::new(mappings, checkpoint_table, gtid)
        .with_unknown_xa_commit(config.outbox.unknown_xa_commit)
}

/// The Kafka producer of `config` (with its dead-letter topic when enabled), once a broker
/// answers (shared by [`run`] and [`replay()`]).
pub(super) async fn new_sink(
    config: &RelayConfig,
    metrics: std::sync::Arc<Metrics>,
) -> Result<KafkaSink, RelayError> {
    let dead_letter = config
        .dead_letter
        .enabled
        .then(|| config.dead_letter.topic.clone());
    let sink = KafkaSink::new(&config.kafka, dead_letter, metrics)?;
    sink.check_reachable(&config.kafka.bootstrap_servers, Duration::from_secs(10))
        .await?;
    Ok(sink)
}

/// Replays binlog `files` (read in the order given) to Kafka: the transactions `range` selects
/// go through the same decoder, router and producer as [`super::run`], with the same dead-letter
/// handling, until the end of the selection (or `shutdown`), then every record is acknowledged
/// before it returns.
///
/// A replay does not connect to MySQL (`mysql.url` is only parsed: it names the checkpoint
/// table, whose writes the decoder ignores as in [`super::run`]), takes no lease and writes no
/// checkpoint: the live connector's position does not move.
///
/// # Errors
/// [`RelayError::Argument`] for unusable files or bounds, [`RelayError::Binlog`] for damaged
/// files (both before anything is produced; see [`outbox_relay_mysql::binlog::replay::plan`]); then as a pipeline run: an
/// undecodable or refused row without a dead-letter topic, Kafka failures (not retried: run the
/// replay again, records are at least once).
pub async fn replay(
    config: RelayConfig,
    files: Vec<PathBuf>,
    range: ReplayRange,
    mut shutdown: watch::Receiver<bool>,
) -> Result<ReplaySummary, RelayError> {
    let router = new_router(&config)?;
    // Binlog files come without a server to ask for the trace-context columns: only mapped
    // ones (outbox.additional) are sent.
    let decoder = new_decoder(
        &config,
        config.checkpoint_table()?,
        None,
        &std::collections::HashMap::new(),
    );
    let file_count = files.len();
    let plan = tokio::task::spawn_blocking(move || {
        outbox_relay_mysql::binlog::replay::plan(&files, &range)
    })
    .await
    .map_err(|e| RelayError::binlog(format!("reading the binlog files failed: {e}")))??;
    match (&plan.first, &plan.last) {
        (Some(first), Some(last)) => tracing::info!(
            transactions = plan.transactions, from = %first, to = %last,
            "replaying whole transactions"
        ),
        _ => tracing::warn!("no whole transaction of the files is in the selected range"),
    }
    // Not served anywhere (a replay has no HTTP endpoints); its summary is logged.
    let metrics = std::sync::Arc::new(Metrics::new());
    let sink = new_sink(&config, std::sync::Arc::clone(&metrics)).await?;
    let source = ReplaySource::new(&plan);
    let settings = PipelineSettings {
        max_in_flight: config.kafka.max_in_flight,
        checkpoint_interval: Duration::from_millis(config.checkpoint.interval_ms),
        source_server_id: 0,
        source_server_uuid: None,
        io_timeout: Duration::from_millis(config.mysql.read_timeout_ms),
        stop_timeout: Duration::from_millis(config.retry.stop_timeout_ms),
        // Re-publishing files makes no spans (`[tracing]` is for the live relay).
        spans: None,
        ack_audit: super::ack_audit(&config)?,
        read_back: Some(std::sync::Arc::new(
            outbox_relay_kafka::sink::ReadBack::start(
                &config.kafka,
                std::sync::Arc::clone(&metrics),
            ),
        )),
        metrics,
        // A replay ends with its files: nothing would release a held table. A refused topic
        // is a row error there (dead letter or stop).
        hold: None,
        // A replay stores no checkpoint.
        start_unwritten: false,
    };
    let start = Checkpoint {
        position: plan
            .first
            .clone()
            .unwrap_or_else(|| outbox_relay_core::position::BinlogPosition::new(String::new(), 4)),
        rows_acked: 0,
        gtid_set: None,
        source_server_id: 0,
        source_server_uuid: None,
        table_layouts: None,
    };
    let stages = Stages {
        source,
        decoder,
        router: &router,
        sink: &sink,
        store: None::<&MysqlCheckpointStore>,
        lease: None,
        // Replay sends what the operator selected: no cutover filter.
        cutover: None,
    };
    // A replay is not retried: a refusal that stops the producer ends it (exit 1).
    let mut refusals = Refusals::default();
    let outcome = pipeline::run(stages, &settings, start, &mut shutdown, &mut refusals).await;
    // The source comes back from the reader thread unless that thread panicked or hung; its
    // counters are then unknown (and the replay incomplete).
    let (events, finished) = outcome
        .source
        .as_ref()
        .map_or((0, false), |s| (s.events(), s.finished()));
    let summary = ReplaySummary {
        files: file_count,
        events,
        transactions: plan.transactions,
        records: outcome
            .stats
            .records_acked
            .saturating_sub(outcome.stats.dead_lettered),
        dead_lettered: outcome.stats.dead_lettered,
        last_position: (outcome.stats.transactions > 0).then(|| outcome.acked.position.clone()),
        rows_after_last_position: outcome.acked.rows_acked,
        complete: finished,
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
