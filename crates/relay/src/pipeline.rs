//! One run of the pipeline: source → decode → route → sink → checkpoint, until shutdown or error.
//!
//! # Progress and resumption
//! Records are produced in binlog order. Every produced record and every transaction boundary
//! enter one ordered queue of acknowledgements ([`FuturesOrdered`]); a boundary comes out of it
//! only after every record before it was acknowledged by Kafka. The latest such boundary is the
//! checkpoint candidate, written at most every `checkpoint.interval_ms`, never backwards.
//!
//! # Backpressure
//! At most `kafka.max_in_flight` records are unacknowledged; beyond that the source is not read
//! until Kafka acknowledges the oldest. A full librdkafka queue is handled the same way.
//!
//! # Shutdown
//! On a stop request the pipeline keeps reading until the end of the current transaction (so
//! the final checkpoint is exactly where it stopped producing), waits for every acknowledgement,
//! writes the final checkpoint and returns. Restarting then sends nothing twice.

use std::cmp::Ordering;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::FuturesOrdered;
use futures::{FutureExt, StreamExt};
use tokio::sync::watch;

use crate::checkpoint::{Checkpoint, CheckpointStore};
use crate::decode::{Decoded, Decoder, TxBoundary};
use crate::error::RelayError;
use crate::route::Router;
use crate::sink::{delivery_result, KafkaSink, SendError};
use crate::source::BinlogSource;

/// What leaves the acknowledgement queue, in binlog order.
enum Ack {
    /// A record's delivery report.
    Record(Result<(i32, i64), RelayError>),
    /// All records before this boundary are acknowledged.
    Boundary(TxBoundary),
}

/// Settings of one pipeline run.
#[derive(Debug, Clone)]
pub struct PipelineSettings {
    /// Most unacknowledged records.
    pub max_in_flight: usize,
    /// Least time between checkpoint writes.
    pub checkpoint_interval: Duration,
    /// `@@server_id` of the source, stored with the checkpoint.
    pub source_server_id: u32,
    /// `@@server_uuid` of the source (MySQL), stored with the checkpoint.
    pub source_server_uuid: Option<String>,
}

/// Counters of one run, for logs.
#[derive(Debug, Default, Clone, Copy)]
pub struct RunStats {
    /// Records acknowledged by Kafka.
    pub records_acked: u64,
    /// Transactions whose end was passed.
    pub transactions: u64,
    /// Checkpoint writes.
    pub checkpoints_written: u64,
}

/// Tracks the acknowledged and the stored checkpoint.
struct Progress<'s, S> {
    store: &'s S,
    settings: &'s PipelineSettings,
    /// Latest boundary with everything before it acknowledged.
    acked: Checkpoint,
    /// Last checkpoint written to the store.
    stored: Checkpoint,
    /// `acked` includes a transaction worth storing (not only our own checkpoint writes).
    dirty: bool,
    last_write: Instant,
    stats: RunStats,
}

impl<S: CheckpointStore> Progress<'_, S> {
    fn on_boundary(&mut self, b: TxBoundary) {
        self.stats.transactions += 1;
        self.dirty |= b.advances;
        self.acked = Checkpoint {
            position: b.position,
            gtid_set: b.gtid_pos.map(|g| g.to_string()),
            source_server_id: self.settings.source_server_id,
            source_server_uuid: self.settings.source_server_uuid.clone(),
        };
    }

    /// Writes `acked` if it moved forward (and, unless `force`, if worth a write).
    async fn persist(&mut self, force: bool) -> Result<(), RelayError> {
        if !(self.dirty || force) {
            return Ok(());
        }
        let forward = !matches!(
            self.acked.position.partial_cmp(&self.stored.position),
            Some(Ordering::Less | Ordering::Equal)
        );
        if forward {
            self.store.save(&self.acked).await?;
            tracing::debug!(position = %self.acked.position, gtid = ?self.acked.gtid_set, "checkpoint written");
            self.stored = self.acked.clone();
            self.stats.checkpoints_written += 1;
        }
        self.dirty = false;
        self.last_write = Instant::now();
        Ok(())
    }
}

/// Outcome of a run: the last acknowledged checkpoint (to resume from) and the result.
pub struct RunOutcome {
    /// Latest boundary with all records before it acknowledged (at least the start).
    pub acked: Checkpoint,
    /// `Ok` after a requested stop; the error that ended the run otherwise.
    pub result: Result<(), RelayError>,
    /// Counters.
    pub stats: RunStats,
}

/// Runs the pipeline from `start` (the stored checkpoint) until `shutdown` turns `true` or an
/// error occurs.
#[allow(clippy::too_many_arguments)]
pub async fn run<S: CheckpointStore>(
    source: &mut BinlogSource,
    decoder: &mut Decoder,
    router: &Router,
    sink: &KafkaSink,
    store: &S,
    settings: &PipelineSettings,
    start: Checkpoint,
    shutdown: &mut watch::Receiver<bool>,
) -> RunOutcome {
    let mut progress = Progress {
        store,
        settings,
        acked: start.clone(),
        stored: start,
        dirty: false,
        last_write: Instant::now(),
        stats: RunStats::default(),
    };
    let mut inflight: FuturesOrdered<BoxFuture<'static, Ack>> = FuturesOrdered::new();
    let result = stream(
        source,
        decoder,
        router,
        sink,
        settings,
        shutdown,
        &mut progress,
        &mut inflight,
    )
    .await;
    let result = match result {
        // Kafka failed: what is still in flight will not be acknowledged reliably.
        Err(e @ RelayError::Kafka(_)) => Err(e),
        other => {
            // Stop requested, or the source failed: let Kafka acknowledge what was sent so the
            // checkpoint gets as far as it can, then store it.
            let drained = drain(&mut inflight, &mut progress).await;
            let stored = progress.persist(true).await;
            other.and(drained).and(stored)
        }
    };
    RunOutcome {
        acked: progress.acked,
        result,
        stats: progress.stats,
    }
}

async fn drain<S: CheckpointStore>(
    inflight: &mut FuturesOrdered<BoxFuture<'static, Ack>>,
    progress: &mut Progress<'_, S>,
) -> Result<(), RelayError> {
    while let Some(ack) = inflight.next().await {
        match ack {
            Ack::Record(r) => {
                r?;
                progress.stats.records_acked += 1;
            }
            Ack::Boundary(b) => progress.on_boundary(b),
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn stream<S: CheckpointStore>(
    source: &mut BinlogSource,
    decoder: &mut Decoder,
    router: &Router,
    sink: &KafkaSink,
    settings: &PipelineSettings,
    shutdown: &mut watch::Receiver<bool>,
    progress: &mut Progress<'_, S>,
    inflight: &mut FuturesOrdered<BoxFuture<'static, Ack>>,
) -> Result<(), RelayError> {
    let mut records_in_flight = 0usize;
    let mut stopping = *shutdown.borrow();
    let mut tick = tokio::time::interval(settings.checkpoint_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if stopping && !decoder.in_transaction() {
            return Ok(());
        }
        tokio::select! {
            biased;
            changed = shutdown.changed(), if !stopping => {
                // A dropped sender also means stop.
                stopping = changed.is_err() || *shutdown.borrow();
                if stopping {
                    tracing::info!(in_transaction = decoder.in_transaction(), "stop requested: finishing the current transaction");
                }
            }
            Some(ack) = inflight.next(), if !inflight.is_empty() => {
                match ack {
                    Ack::Record(r) => {
                        r?;
                        records_in_flight -= 1;
                        progress.stats.records_acked += 1;
                    }
                    Ack::Boundary(b) => progress.on_boundary(b),
                }
            }
            _ = tick.tick() => {
                if progress.last_write.elapsed() >= settings.checkpoint_interval {
                    progress.persist(false).await?;
                }
            }
            event = source.next(), if records_in_flight < settings.max_in_flight => {
                let event = event?;
                match decoder.decode(&event, |id| source.table_map(id))? {
                    Decoded::Rows(rows) => {
                        for row in rows {
                            let record = router.route(row)?;
                            let delivery = loop {
                                match sink.send(&record) {
                                    Ok(d) => break d,
                                    Err(SendError::Failed(e)) => return Err(e),
                                    Err(SendError::QueueFull) => {
                                        // Backpressure: wait for the oldest acknowledgement.
                                        match inflight.next().await {
                                            Some(Ack::Record(r)) => {
                                                r?;
                                                records_in_flight -= 1;
                                                progress.stats.records_acked += 1;
                                            }
                                            Some(Ack::Boundary(b)) => progress.on_boundary(b),
                                            None => tokio::time::sleep(Duration::from_millis(20)).await,
                                        }
                                    }
                                }
                            };
                            records_in_flight += 1;
                            inflight.push_back(delivery.map(|r| Ack::Record(delivery_result(r))).boxed());
                        }
                    }
                    Decoded::Boundary(b) => {
                        inflight.push_back(futures::future::ready(Ack::Boundary(b)).boxed());
                    }
                }
            }
        }
    }
}
