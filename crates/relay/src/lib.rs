//! outbox-relay: tails a MySQL/MariaDB binlog as a replica and produces every committed INSERT
//! on the outbox tables to Kafka, checkpointing the binlog position only after Kafka has
//! acknowledged everything before it.
//!
//! One module per pipeline stage:
//! [`source`] (binlog dump) → [`decode`] (rows → [`decode::OutboxEvent`], transaction
//! boundaries) → [`route`] (topic, key, headers) → [`sink`] (idempotent producer) →
//! [`checkpoint`] (state table). [`pipeline`] runs them; [`run`] supervises runs, reconnecting
//! with capped exponential backoff after MySQL or Kafka failures.

pub mod checkpoint;
pub mod config;
pub mod decode;
pub mod error;
pub mod pipeline;
pub mod position;
pub mod preflight;
pub mod route;
pub mod sink;
pub mod source;

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use mysql_async::{Opts, Pool};
use tokio::sync::watch;

use crate::checkpoint::{Checkpoint, CheckpointStore, MysqlCheckpointStore};
use crate::config::RelayConfig;
use crate::decode::Decoder;
use crate::error::RelayError;
use crate::pipeline::PipelineSettings;
use crate::position::MariadbGtidPos;
use crate::preflight::ServerInfo;
use crate::route::{Router, TopicTemplate};
use crate::sink::KafkaSink;
use crate::source::BinlogSource;

pub use crate::config::RelayConfig as Config;

/// How long the server may stay silent before the stream is presumed dead is three of these;
/// the server sends heartbeats at this period when it has nothing else to send.
const HEARTBEAT_PERIOD: Duration = Duration::from_secs(5);

/// A run that streamed this long resets the backoff to its first delay.
const HEALTHY_RUN: Duration = Duration::from_secs(60);

/// Runs the relay until `shutdown` turns `true` (then returns `Ok` after the final checkpoint)
/// or a non-retriable error occurs. MySQL and Kafka failures are retried with capped
/// exponential backoff (`[retry]`), resuming from the last acknowledged transaction boundary.
///
/// # Errors
/// The first error that retrying cannot fix: configuration, server prerequisites, an
/// undecodable outbox row (with its position), an unavailable binlog position, or
/// `retry.max_attempts` consecutive failures.
pub async fn run(
    config: RelayConfig,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), RelayError> {
    let opts = Opts::from_url(&config.mysql.url)
        .map_err(|e| RelayError::Config(format!("mysql.url: {e}")))?;
    let pool = Pool::new(opts.clone());
    let store = MysqlCheckpointStore::new(
        pool.clone(),
        config.checkpoint_table()?,
        config.connector_name.clone(),
    );
    let router = Router::new(TopicTemplate::parse(&config.outbox.topic)?);
    let mut backoff = new_backoff(&config);
    let mut attempts = 0usize;
    let mut resume: Option<Checkpoint> = None;

    let result = loop {
        let started = std::time::Instant::now();
        let attempt = run_once(
            &config,
            &opts,
            &pool,
            &store,
            &router,
            resume.clone(),
            &mut shutdown,
        )
        .await;
        let (acked, result) = attempt;
        if acked.is_some() {
            resume = acked;
        }
        match result {
            Ok(()) => break Ok(()),
            Err(e) if e.is_retriable() && !*shutdown.borrow() => {
                if started.elapsed() >= HEALTHY_RUN {
                    backoff = new_backoff(&config);
                    attempts = 0;
                }
                attempts += 1;
                if config.retry.max_attempts > 0 && attempts >= config.retry.max_attempts {
                    break Err(e);
                }
                let delay = backoff
                    .next()
                    .unwrap_or(Duration::from_millis(config.retry.max_backoff_ms));
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, attempt = attempts,
                    resume_from = ?resume.as_ref().map(|c| c.position.to_string()), "relay interrupted; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = shutdown.changed() => {}
                }
                if *shutdown.borrow() {
                    break Ok(());
                }
            }
            Err(e) => break Err(e),
        }
    };
    pool.disconnect().await.ok();
    result
}

fn new_backoff(config: &RelayConfig) -> impl Iterator<Item = Duration> {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(config.retry.initial_backoff_ms))
        .with_max_delay(Duration::from_millis(config.retry.max_backoff_ms))
        .with_jitter()
        .without_max_times()
        .build()
}

/// One connection lifetime: checks, resume point, pipeline. Returns the latest acknowledged
/// checkpoint known (to resume from without re-reading the store) and the result.
async fn run_once(
    config: &RelayConfig,
    opts: &Opts,
    pool: &Pool,
    store: &MysqlCheckpointStore,
    router: &Router,
    resume: Option<Checkpoint>,
    shutdown: &mut watch::Receiver<bool>,
) -> (Option<Checkpoint>, Result<(), RelayError>) {
    let prepared = prepare(config, pool, store, resume).await;
    let (server, start) = match prepared {
        Ok(p) => p,
        Err(e) => return (None, Err(e)),
    };
    let sink = match KafkaSink::new(&config.kafka) {
        Ok(s) => s,
        Err(e) => return (Some(start), Err(e)),
    };
    if let Err(e) = sink
        .check_reachable(&config.kafka.bootstrap_servers, Duration::from_secs(10))
        .await
    {
        return (Some(start), Err(e));
    }
    let mut source = match BinlogSource::connect(
        opts.clone(),
        config.mysql.server_id,
        server.flavor,
        &start.position,
        HEARTBEAT_PERIOD,
    )
    .await
    {
        Ok(s) => s,
        Err(e) => return (Some(start), Err(e)),
    };
    let gtid_pos = start
        .gtid_set
        .as_deref()
        .and_then(|g| g.parse::<MariadbGtidPos>().ok());
    let mut decoder = Decoder::new(
        config.outbox_tables(),
        store.table().clone(),
        config.outbox.columns.clone(),
        gtid_pos,
    );
    let settings = PipelineSettings {
        max_in_flight: config.kafka.max_in_flight,
        checkpoint_interval: Duration::from_millis(config.checkpoint.interval_ms),
        source_server_id: server.server_id,
        source_server_uuid: server.server_uuid.clone(),
    };
    tracing::info!(from = %start.position, gtid = ?start.gtid_set, server_id = config.mysql.server_id, "streaming binlog");
    let outcome = pipeline::run(
        &mut source,
        &mut decoder,
        router,
        &sink,
        store,
        &settings,
        start,
        shutdown,
    )
    .await;
    tracing::info!(
        records_acked = outcome.stats.records_acked,
        transactions = outcome.stats.transactions,
        checkpoints_written = outcome.stats.checkpoints_written,
        checkpoint = %outcome.acked.position,
        "pipeline run ended"
    );
    (Some(outcome.acked), outcome.result)
}

/// Checks the server and finds where to start: the in-memory resume point, else the stored
/// checkpoint, else the current end of the binlog (stored at once, so rows committed from now on
/// are relayed even if the relay dies before its first record).
async fn prepare(
    config: &RelayConfig,
    pool: &Pool,
    store: &MysqlCheckpointStore,
    resume: Option<Checkpoint>,
) -> Result<(ServerInfo, Checkpoint), RelayError> {
    let mut conn = pool.get_conn().await?;
    let server = preflight::check_server(&mut conn).await?;
    preflight::check_outbox_tables(&mut conn, &config.outbox_tables(), &config.outbox.columns)
        .await?;
    store.verify().await?;
    if let Some(resume) = resume {
        return Ok((server, resume));
    }
    if let Some(stored) = store.load().await? {
        if stored.source_server_id != server.server_id {
            tracing::warn!(
                stored_server_id = stored.source_server_id,
                server_id = server.server_id,
                "the checkpoint was written for another source server; resuming from its position anyway"
            );
        }
        tracing::info!(position = %stored.position, "resuming from stored checkpoint");
        return Ok((server, stored));
    }
    let position = preflight::current_position(&mut conn, server.flavor).await?;
    let start = Checkpoint {
        position,
        gtid_set: None,
        source_server_id: server.server_id,
        source_server_uuid: server.server_uuid.clone(),
    };
    store.save(&start).await?;
    tracing::info!(position = %start.position, "no checkpoint: starting at the current end of the binlog");
    Ok((server, start))
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
}
