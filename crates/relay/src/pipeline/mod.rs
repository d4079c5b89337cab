//! One run of the pipeline: source → decode (on the reader thread) → route → sink → checkpoint, until
//! shutdown or error.
//!
//! # Progress and resumption
//! Records are produced in binlog order. Every produced record and every transaction boundary
//! enter one ordered queue of acknowledgements (module `acks`); an entry comes out only
//! after everything before it did. A record's entry carries the checkpoint it completes: the
//! boundary before its transaction plus its index in the transaction (`rows_acked`), so even
//! inside a 100,000-row transaction the checkpoint follows Kafka's acknowledgements. The latest
//! point is written at most every `checkpoint.interval_ms`, never backwards. On resume the first
//! `rows_acked` outbox rows of the transaction after the stored boundary are skipped.
//!
//! # Backpressure
//! At most `kafka.max_in_flight` records are unacknowledged; beyond that no event is taken
//! from the reader thread (module `read_ahead`, which reads and decodes the binlog at most
//! 4,096 events, about 2 MiB, ahead) and that thread stops reading, until Kafka acknowledges
//! the oldest. A full librdkafka queue is handled the same way.
//!
//! # Rows that cannot be relayed
//! A row that cannot become a record, or that Kafka refuses for good (too large, topic missing
//! or forbidden), goes to the dead-letter topic when one is configured; otherwise the run stops
//! with an error naming the row's binlog position, and the checkpoint stays before it.
//!
//! # Records a broker refuses for good
//! With the idempotent producer and `enable.gapless.guarantee`, a batch the broker refuses for
//! good (too large, an invalid timestamp, a policy) stops the producer (librdkafka's fatal
//! error) and the run ends. Which row was at fault is not always known (a batch holds several
//! records; a compressed batch can be too large as a whole), so the next run sends the records
//! from the checkpoint up to the last row the failed run had sent one at a time, each
//! acknowledged before the next ([`Refusals`]). A record refused alone is its row's fault:
//! that row is dead-lettered by the run after (a stopped producer sends nothing more), or
//! stops the relay naming it when there is no dead-letter topic. The other records of its
//! batch and transaction are delivered. Each refusal costs one restart, never a loop.
//!
//! # Tables held while their topic is refused
//! With `dead_letter.refused_topic = "hold"`, a record whose topic the brokers refuse (known
//! before sending: missing while they create no topics, or not authorized) is not a row error:
//! it and every later record of its outbox table are held (module `hold`) while the other
//! tables go on, the stored checkpoint stays at or before the first held row
//! ([`Progress::acked`] is capped there), and the table is retried on the `[retry]` backoff
//! until the topic accepts; its records then go out in order and the checkpoint moves on. At
//! most `dead_letter.hold_max_records` records are held: beyond, reading the binlog pauses.
//! A topic refused only in a produce response (write denied, describe allowed) stops the
//! idempotent producer: the run ends, [`Refusals`] keeps the topic, and the next run holds its
//! tables from their first record; their retries send the first held record alone with the
//! sink's trial producer ([`RecordSink::send_trial`]), which a refusal does not stop, so a
//! retry never restarts the run.
//!
//! # Shutdown
//! On a stop request the pipeline stops reading, waits for every acknowledgement, writes the
//! final checkpoint (mid-transaction if need be) and returns: a restart sends nothing twice.
//!
//! # Sources
//! The events come from an [`EventSource`]: the live binlog dump ([`outbox_relay_mysql::binlog::source::BinlogSource`], never ends)
//! or binlog files ([`outbox_relay_mysql::binlog::replay::ReplaySource`]). When a source ends (the end of the last
//! file), the run waits for every acknowledgement as on a stop request and returns `Ok`. A run
//! without a checkpoint store (replay) writes no checkpoint and needs no lease.

use std::cmp::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

mod acks;
mod hold;
mod read_ahead;
use acks::{AckQueue, Done, RecordInfo};
pub use hold::HoldSettings;
use hold::{Held, Holds};
use outbox_relay_mysql::cutover::{self, Cutover};
use read_ahead::{ReadAhead, Spent};

use outbox_relay_core::config::TableName;
use outbox_relay_core::error::RelayError;
use outbox_relay_core::observe::audit::{self, AckAudit};
use outbox_relay_core::observe::metrics::{self, DeadLetterKind, Metrics, ProgressLog};
use outbox_relay_core::observe::spans::{RowSpan, RowSpans, RowStart};
use outbox_relay_core::outbox::OutboxEvent;
use outbox_relay_core::sink::{DeadLetter, Delivered, DeliveryMode, Record, RecordSink, SendError};
use outbox_relay_core::state::checkpoint::{Checkpoint, CheckpointStore};
use outbox_relay_kafka::route::Router;
use outbox_relay_kafka::sink::ReadBack;
pub use outbox_relay_mysql::binlog::EventSource;
use outbox_relay_mysql::decode::{DecodedRow, Decoder, RowFailure};
use outbox_relay_mysql::state::lease::{Lease, LeaseClock};

/// What leaves the acknowledgement queue, in binlog order.
enum Ack {
    /// A record was acknowledged (or dead-lettered): `base` + `rows_acked` is now safe.
    Record(Result<(Arc<Checkpoint>, u64), RelayError>),
    /// A transaction ended and all its records are acknowledged. `advances` is false for a
    /// transaction that only wrote the relay's own checkpoint table.
    Boundary(Arc<Checkpoint>, bool),
    /// A record of a held table, released (sent) after later records: it does not move the
    /// acknowledged point (the hold's floor kept the checkpoint before it), it counts towards
    /// the end of hold `.0`.
    Released(u64, Result<(), RelayError>),
}

/// One outbox row as the pipeline counts them: the transaction boundary before it and its
/// number in that transaction (from 1). Every run that reads the row gives it the same
/// reference (the checkpoint's `rows_acked` counts the same way).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RowRef {
    /// The boundary before the row's transaction.
    pub base: outbox_relay_core::position::BinlogPosition,
    /// The row's number in the transaction, from 1.
    pub row: u64,
}

impl RowRef {
    fn of(done: &Done) -> Self {
        Self {
            base: done.0.position.clone(),
            row: done.1,
        }
    }

    /// `true` when `self` is `other` or comes before it in the binlog.
    fn not_after(&self, other: &RowRef) -> bool {
        match self.base.partial_cmp(&other.base) {
            Some(Ordering::Less) => true,
            Some(Ordering::Equal) => self.row <= other.row,
            _ => false,
        }
    }
}

/// A row the broker refused when it was sent alone.
#[derive(Debug, Clone)]
pub struct BrokerRefusal {
    /// Why, with the fix (`dlq_reason`).
    pub reason: String,
    /// The broker's error (`dlq_broker_error`).
    pub broker_error: String,
    /// The value may go into the dead letter (its size was not the problem).
    pub keep_value: bool,
}

/// What runs learnt about records the brokers refuse for good, kept by the supervisor from one
/// run to the next (see "Records a broker refuses for good" above).
#[derive(Debug, Default)]
pub struct Refusals {
    /// Rows up to and including this one are sent one at a time: a batch before it was
    /// refused and the row at fault is not known yet.
    isolate_through: Option<RowRef>,
    /// Rows a broker refused alone: dead-lettered without being sent again.
    refused: std::collections::HashMap<RowRef, BrokerRefusal>,
    /// With `dead_letter.refused_topic = "hold"`: topics a produce response refused (not
    /// authorized, missing) although their metadata did not, and why. Their tables are held
    /// from their first record on, and retried with a trial record ([`RecordSink::send_trial`])
    /// instead of the sink's producer, which such a refusal stops.
    refused_topics: std::collections::HashMap<Arc<str>, String>,
    /// Counts what was learnt (a row found, the isolated range extended).
    learnt: u64,
}

impl Refusals {
    /// Forgets everything (another server's binlog, or another instance moved the checkpoint).
    pub fn clear(&mut self) {
        *self = Self::default();
    }

    /// Changes whenever a run learns something new: a run that did is progress, not a
    /// failure to back off from.
    pub fn learnt(&self) -> u64 {
        self.learnt
    }

    /// The row `done` is sent alone (it is in the isolated range).
    ///
    /// Its [`RowRef`] (a copy of its binlog file name) is built only when there is a range: for
    /// every row it cost an allocation and a cross-thread free.
    fn isolates(&self, done: &Done) -> bool {
        self.isolate_through
            .as_ref()
            .is_some_and(|last| RowRef::of(done).not_after(last))
    }

    /// How a broker refused the row `done` alone in an earlier run, if it did (its
    /// [`RowRef`] built only when some row was refused, as in [`Refusals::isolates`]).
    fn refusal_of(&self, done: &Done) -> Option<BrokerRefusal> {
        if self.refused.is_empty() {
            return None;
        }
        self.refused.get(&RowRef::of(done)).cloned()
    }
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
    /// Longest wait for a checkpoint write or lease check before the connection counts as dead.
    pub io_timeout: Duration,
    /// After a stop was requested, longest wait for Kafka to acknowledge what is in flight
    /// (`retry.stop_timeout_ms`); what is not acknowledged by then is sent again next start.
    pub stop_timeout: Duration,
    /// OpenTelemetry spans of the rows (`[tracing]`); `None`: no span, no cost.
    pub spans: Option<RowSpans>,
    /// The acknowledgement audit (`[audit] acks_file`); `None`: no audit, no cost.
    pub ack_audit: Option<Arc<AckAudit>>,
    /// Reads back the first acknowledgement of each partition new to the process before the
    /// checkpoint may pass it (`kafka/sink/readback.rs`); `None`: acknowledgements trusted.
    pub read_back: Option<Arc<ReadBack>>,
    /// The source's metrics.
    pub metrics: Arc<Metrics>,
    /// `dead_letter.refused_topic = "hold"`: records whose topic is refused are held with their
    /// table's later records (see "Tables held while their topic is refused" above); `None`:
    /// they are row errors (dead letter or stop).
    pub hold: Option<HoldSettings>,
    /// `true` when the run's start point comes from an earlier run's acknowledgements, not
    /// from the checkpoint store, so it may not be stored yet: the run's first checkpoint
    /// write stores it even if nothing moved since (at-least-once; see `Progress`).
    pub start_unwritten: bool,
}

/// Counters of one run, for logs.
#[derive(Debug, Default, Clone, Copy)]
pub struct RunStats {
    /// Records acknowledged by Kafka (dead-lettered ones included).
    pub records_acked: u64,
    /// Records sent to the dead-letter topic.
    pub dead_lettered: u64,
    /// Transactions whose end was passed.
    pub transactions: u64,
    /// Checkpoint writes.
    pub checkpoints_written: u64,
}

/// Tracks the acknowledged and the stored checkpoint.
struct Progress<'s, S> {
    /// `None`: no checkpoint is ever written (replay).
    store: Option<&'s S>,
    io_timeout: Duration,
    /// Latest boundary with everything before it acknowledged…
    acked_base: Arc<Checkpoint>,
    /// …plus this many outbox rows of the next transaction.
    acked_rows: u64,
    /// Last checkpoint written to the store.
    stored: Checkpoint,
    /// Something worth storing was acknowledged since the last write (not only our own
    /// checkpoint transactions, which would otherwise make an idle relay feed itself).
    dirty: bool,
    last_write: Instant,
    /// Least time between two writes to the store (`checkpoint.interval_ms`).
    write_interval: Duration,
    /// When the sink's records are delivered, which decides where the resume point is kept
    /// (the four methods that ask are [`Progress::persist`], [`Progress::on_tick`],
    /// [`Progress::finish`] and [`Progress::resume_point`]).
    mode: DeliveryMode,
    /// [`DeliveryMode::Committed`]: the last committed point written to the store.
    mirrored: Option<Checkpoint>,
    stats: RunStats,
    /// `@@server_id` and `@@server_uuid` of the server this run reads.
    server: (u32, Option<String>),
    /// The source's metrics.
    metrics: Arc<Metrics>,
    /// While a table is held: the point just before its first held row, which the stored
    /// checkpoint may not pass ([`Progress::acked`]).
    floor: Option<Checkpoint>,
    /// [`DeliveryMode::Acknowledged`]: the run's start point may not be in the store yet (a
    /// run after a failed one starts where that one's acknowledgements got, which it may not
    /// have written): the first write stores it even if nothing moved since. Without it, a
    /// hold's floor at the start point would keep the store behind it for the whole hold.
    start_unwritten: bool,
    /// `[audit] timings`: the audit that gets a line per committed Kafka transaction.
    commit_audit: Option<Arc<AckAudit>>,
}

impl<S: CheckpointStore> Progress<'_, S> {
    fn on_ack(&mut self, ack: Ack) -> Result<(), RelayError> {
        match ack {
            Ack::Record(r) => {
                let (base, rows) = r?;
                self.acked_base = base;
                self.acked_rows = rows;
                self.dirty = true;
                self.stats.records_acked += 1;
            }
            Ack::Boundary(base, advances) => {
                self.acked_base = base;
                self.acked_rows = 0;
                self.dirty |= advances;
                self.stats.transactions += 1;
            }
            // Handled by the reader (`Reader::on_ack`): it never moves the acknowledged point.
            Ack::Released(..) => {}
        }
        Ok(())
    }

    /// Sets the point the stored checkpoint may not pass while tables are held (`None`: no
    /// hold). A floor lifted lets the next write catch up with the acknowledged point.
    fn set_floor(&mut self, floor: Option<&Checkpoint>) {
        if self.floor.as_ref() != floor {
            self.floor = floor.cloned();
            self.dirty = true;
        }
    }

    /// `true` when the acknowledged point is ahead of the stored one.
    fn moved(&self, acked: &Checkpoint) -> bool {
        if self.start_unwritten {
            return true;
        }
        // Positions of different servers (after a move by GTID) are unordered, even when their
        // files share a name: the newer is the one this run produced.
        let order = (acked.source_server_id == self.stored.source_server_id)
            .then(|| acked.position.partial_cmp(&self.stored.position))
            .flatten()
            .map(|o| o.then(acked.rows_acked.cmp(&self.stored.rows_acked)));
        !matches!(order, Some(Ordering::Less | Ordering::Equal))
    }

    /// [`Progress::persist`] of a sink whose records are delivered at commit: `stored` is the
    /// last committed point.
    async fn commit<K: RecordSink>(&mut self, force: bool, sink: &K) -> Result<(), RelayError> {
        let acked = self.acked();
        let moved = self.moved(&acked);
        if moved || sink.transaction_open() {
            sink.commit(&acked).await?;
            if let Some(audit) = &self.commit_audit {
                let mut line = String::new();
                audit.commit(&mut line, audit::unix_micros());
                audit.write(&mut line);
            }
            self.stored = acked;
            self.stats.checkpoints_written += 1;
        }
        self.dirty = false;
        self.mirror(force).await
    }

    /// [`DeliveryMode::Committed`]: writes the last committed point to the state table when it
    /// is not there yet and `write_interval` passed since the last write (or `force`). Called
    /// at each commit and at each checkpoint tick: a commit within the interval of the previous
    /// write is mirrored by a later tick, so an idle relay's state table does not stay behind
    /// its last commit.
    async fn mirror(&mut self, force: bool) -> Result<(), RelayError> {
        let Some(store) = self.store else {
            return Ok(());
        };
        if (force || self.last_write.elapsed() >= self.write_interval)
            && self.mirrored.as_ref() != Some(&self.stored)
        {
            // The progress topic is the resume point; the state table follows it for `status`,
            // `prune` and operators (never ahead of it: written after the commit).
            outbox_relay_core::error::with_timeout(
                self.io_timeout,
                "mirroring the committed resume point to the state table",
                store.save(&self.stored),
            )
            .await??;
            self.mirrored = Some(self.stored.clone());
            self.last_write = Instant::now();
        }
        self.metrics.checkpoint_current();
        Ok(())
    }

    /// [`DeliveryMode::Committed`]: the point [`Progress::commit`] will write once everything
    /// queued before the transaction boundary `boundary` (the last one read, nothing after it
    /// queued) is acknowledged: that boundary itself, unless a hold's floor or a base of another
    /// server would make it another (`None`: not known ahead).
    fn point_at(&self, boundary: &Checkpoint) -> Option<Checkpoint> {
        let own = boundary.source_server_id == self.server.0
            && !matches!((&boundary.source_server_uuid, &self.server.1), (Some(a), Some(b)) if a != b);
        (matches!(self.mode, DeliveryMode::Committed { .. }) && self.floor.is_none() && own).then(
            || Checkpoint {
                rows_acked: 0,
                ..boundary.clone()
            },
        )
    }

    /// `true` while the acknowledged base was written on another server (a run moved there by
    /// GTID, until its first boundary).
    fn foreign_base(&self) -> bool {
        let base = &self.acked_base;
        base.source_server_id != self.server.0
            || matches!((&base.source_server_uuid, &self.server.1), (Some(a), Some(b)) if a != b)
    }

    fn acked(&self) -> Checkpoint {
        // Rows counted against a base written on another server are rows of this server's
        // transaction: stored under the other server's name, a return to that server would
        // skip rows of its own, maybe different, transaction. Counted as 0 they are only sent
        // again.
        let acked = Checkpoint {
            rows_acked: if self.foreign_base() {
                0
            } else {
                self.acked_rows
            },
            ..(*self.acked_base).clone()
        };
        match &self.floor {
            // A table is held: never past its first held row (a position not comparable with
            // the floor's counts as past it).
            Some(floor) if !not_after(&acked, floor) => Checkpoint {
                rows_acked: if floor.source_server_id == self.server.0 {
                    floor.rows_acked
                } else {
                    0
                },
                ..floor.clone()
            },
            _ => acked,
        }
    }

    /// Writes the acknowledged checkpoint if it moved forward (and, unless `force`, if it is
    /// worth a write). [`DeliveryMode::Committed`]: commits the sink's transaction with that
    /// point instead (the caller made sure nothing is in flight) and mirrors it to the store at
    /// most every `write_interval` (always when `force`).
    async fn persist<K: RecordSink>(&mut self, force: bool, sink: &K) -> Result<(), RelayError> {
        // Records delivered only at commit: the point is made durable with them, by the sink.
        // Written to the store alone it would pass records that may still be aborted.
        if let DeliveryMode::Committed { .. } = self.mode {
            return self.commit(force, sink).await;
        }
        if !(self.dirty || force) {
            if self.store.is_some() {
                self.metrics.checkpoint_current();
            }
            return Ok(());
        }
        let Some(store) = self.store else {
            self.dirty = false;
            return Ok(());
        };
        let acked = self.acked();
        if self.moved(&acked) {
            let t = Instant::now();
            outbox_relay_core::error::with_timeout(
                self.io_timeout,
                "writing the checkpoint",
                store.save(&acked),
            )
            .await??;
            tracing::debug!(position = %acked.position, rows_acked = acked.rows_acked,
                gtid = ?acked.gtid_set, save_ms = t.elapsed().as_millis() as u64, "checkpoint written");
            self.start_unwritten = false;
            self.stored = acked;
            self.stats.checkpoints_written += 1;
        }
        self.dirty = false;
        self.last_write = Instant::now();
        self.metrics.checkpoint_current();
        Ok(())
    }

    /// At each checkpoint tick: [`DeliveryMode::Acknowledged`] writes the acknowledged point
    /// once `write_interval` passed since the last write; [`DeliveryMode::Committed`] only
    /// mirrors the last committed point (commits wait for a transaction boundary with nothing
    /// in flight, which a tick is not).
    async fn on_tick<K: RecordSink>(&mut self, sink: &K) -> Result<(), RelayError> {
        match self.mode {
            DeliveryMode::Acknowledged if self.last_write.elapsed() >= self.write_interval => {
                self.persist(false, sink).await
            }
            DeliveryMode::Acknowledged => Ok(()),
            DeliveryMode::Committed { .. } => self.mirror(false).await,
        }
    }

    /// Stores the final point of a run once its acknowledgements were drained (`all_acked`:
    /// every report came). [`DeliveryMode::Committed`] with reports missing aborts instead: a
    /// commit now would deliver records after the point it stores; they are sent again.
    async fn finish<K: RecordSink>(&mut self, all_acked: bool, sink: &K) -> Result<(), RelayError> {
        if !all_acked && matches!(self.mode, DeliveryMode::Committed { .. }) {
            sink.abort().await;
            return Ok(());
        }
        let stored = self.persist(true, sink).await;
        if stored.is_err() {
            sink.abort().await;
        }
        stored
    }

    /// Where the next run resumes: [`DeliveryMode::Committed`], the last committed point
    /// (acknowledged records of an aborted transaction are not past); otherwise the last
    /// acknowledged one.
    fn resume_point(&self) -> Checkpoint {
        match self.mode {
            DeliveryMode::Acknowledged => self.acked(),
            DeliveryMode::Committed { .. } => self.stored.clone(),
        }
    }
}

/// `true` when checkpoint `a` is `b` or before it: the same server and an earlier position, or
/// the same position with no more rows acknowledged.
fn not_after(a: &Checkpoint, b: &Checkpoint) -> bool {
    if a.source_server_id != b.source_server_id {
        return false;
    }
    match a.position.partial_cmp(&b.position) {
        Some(Ordering::Less) => true,
        Some(Ordering::Equal) => a.rows_acked <= b.rows_acked,
        _ => false,
    }
}

/// Outcome of a run: the last acknowledged checkpoint (to resume from) and the result.
pub struct RunOutcome<E> {
    /// Latest point with all records before it acknowledged (at least the start).
    pub acked: Checkpoint,
    /// `Ok` after a requested stop; the error that ended the run otherwise.
    pub result: Result<(), RelayError>,
    /// Counters.
    pub stats: RunStats,
    /// The source, back from the reader thread (`None` when that thread did not end in
    /// time, or panicked): the replay reads its counters.
    pub source: Option<E>,
}

/// The stages of one run. The source and the decoder move to the run's reader thread
/// (module `read_ahead`); the rest is borrowed from the supervisor.
pub struct Stages<'a, S, E, K> {
    /// Binlog events: the live dump or binlog files.
    pub source: E,
    /// Decoder for the outbox tables.
    pub decoder: Decoder,
    /// Topic/key/header mapping.
    pub router: &'a Router,
    /// Kafka producer: [`outbox_relay_kafka::sink::KafkaSink`] (at-least-once) or
    /// [`outbox_relay_kafka::sink::TransactionalSink`] (exactly-once).
    pub sink: &'a K,
    /// Fenced checkpoint store; `None` writes no checkpoint at all (replay).
    pub store: Option<&'a S>,
    /// The connector's lease, verified at every checkpoint tick; `None` when the run writes no
    /// checkpoint.
    pub lease: Option<&'a mut Lease>,
    /// The cutover filter (`[cutover]`, see [`cutover`]): rows a previous relay sent are not
    /// produced. `None`: every row is.
    pub cutover: Option<&'a mut Cutover>,
}

/// Runs the pipeline from `start` (the stored checkpoint) until `shutdown` turns `true`, the
/// source ends, or an error occurs.
///
/// `refusals` carries what earlier runs learnt about records the brokers refuse for good (keep
/// one per connector and pass it to every run; see "Records a broker refuses for good").
pub async fn run<S: CheckpointStore, E: EventSource + Send + 'static, K: RecordSink>(
    stages: Stages<'_, S, E, K>,
    settings: &PipelineSettings,
    start: Checkpoint,
    shutdown: &mut watch::Receiver<bool>,
    refusals: &mut Refusals,
) -> RunOutcome<E> {
    let Stages {
        source,
        decoder,
        router,
        sink,
        store,
        lease,
        cutover,
    } = stages;
    let start_unwritten = settings.start_unwritten
        && matches!(sink.delivery_mode(), DeliveryMode::Acknowledged)
        && store.is_some();
    let mut progress = Progress {
        store,
        io_timeout: settings.io_timeout,
        acked_base: Arc::new(Checkpoint {
            rows_acked: 0,
            ..start.clone()
        }),
        acked_rows: start.rows_acked,
        stored: start.clone(),
        dirty: start_unwritten,
        last_write: Instant::now(),
        write_interval: settings.checkpoint_interval,
        mode: sink.delivery_mode(),
        mirrored: Some(start.clone()),
        stats: RunStats::default(),
        server: (
            settings.source_server_id,
            settings.source_server_uuid.clone(),
        ),
        metrics: Arc::clone(&settings.metrics),
        floor: None,
        start_unwritten,
        commit_audit: settings.ack_audit.clone().filter(|a| a.timings()),
    };
    let mut inflight = AckQueue::new(
        sink,
        settings.ack_audit.clone(),
        settings.read_back.clone(),
        Arc::clone(&settings.metrics),
    );
    let mut reader = Reader {
        tx_base: Arc::clone(&progress.acked_base),
        rows_in_tx: 0,
        skip: start.rows_acked,
        records_in_flight: 0,
        pending: None,
        settings,
        event_time: 0,
        read_at: Instant::now(),
        decoder_state: (false, 0),
        table: None,
        ready_topic: None,
        spent: Spent::default(),
        refusals,
        last_sent: None,
        drain_after: false,
        cutover,
        held: Vec::new(),
        cutover_over: false,
        lease_clock: lease.as_ref().and_then(|l| l.clock()),
        holds: settings
            .hold
            .map(|h| Holds::new(h, Arc::clone(&settings.metrics))),
    };
    let (result, source) = match ReadAhead::start(source, decoder, Arc::clone(&settings.metrics)) {
        Ok(mut ahead) => {
            let result = reader
                .stream(
                    &mut ahead,
                    router,
                    sink,
                    lease,
                    shutdown,
                    &mut progress,
                    &mut inflight,
                )
                .await;
            // Nothing more is read while the run drains its acknowledgements.
            let back = ahead.close(settings.io_timeout).await;
            (result, back.map(|(source, _)| source))
        }
        Err(e) => (Err(e), None),
    };
    if let Err(e) = &result {
        // Say so at once: draining and the final checkpoint write may take a while more.
        tracing::warn!(error = %e, "run interrupted");
    }
    let result = match result {
        // Kafka or the lease failed: what is in flight cannot be trusted to move the
        // checkpoint (and without the lease it may not be written). Exactly-once: the open
        // transaction is aborted, so none of it becomes visible.
        Err(
            e @ (RelayError::Kafka(_)
            | RelayError::LeaseLost(_)
            | RelayError::Fenced(_)
            | RelayError::TransactionExpired(_)
            | RelayError::CommitUnknown { .. }),
        ) => {
            sink.abort().await;
            Err(e)
        }
        other => {
            // Stop requested, the source failed, or a row stopped the relay: let Kafka
            // acknowledge what was sent so the checkpoint gets as far as it can, then store it.
            let mut drained = Ok(());
            let mut all_acked = true;
            let deadline = tokio::time::Instant::now() + settings.stop_timeout;
            loop {
                let ack = match tokio::time::timeout_at(deadline, inflight.next(sink)).await {
                    Ok(Some(ack)) => ack,
                    Ok(None) => break,
                    Err(_) => {
                        all_acked = false;
                        tracing::warn!(
                            in_flight = reader.records_in_flight,
                            waited_ms = settings.stop_timeout.as_millis() as u64,
                            "Kafka did not acknowledge the records in flight within \
                             retry.stop_timeout_ms: stopping at the last checkpoint whose \
                             records were all acknowledged (the rest are sent again next start)"
                        );
                        break;
                    }
                };
                if let Err(e) = reader.on_ack(ack, inflight.is_empty(), &mut progress) {
                    drained = Err(e);
                    all_acked = false;
                    break;
                }
            }
            let stored = progress.finish(all_acked, sink).await;
            other.and(drained).and(stored)
        }
    };
    let result = match result {
        Err(e @ RelayError::Kafka(_)) => {
            let culprit = inflight.fatal_refusal.take();
            reader.settle_refusal(e, culprit, sink, &mut progress).await
        }
        other => other,
    };
    // What was not drained is no longer waited for.
    settings.metrics.set_in_flight(0);
    RunOutcome {
        acked: progress.resume_point(),
        result,
        stats: progress.stats,
        source,
    }
}

/// The reading side: where the current transaction started and how many of its outbox rows
/// were seen.
struct Reader<'a> {
    /// Checkpoint at the start of the current transaction.
    tx_base: Arc<Checkpoint>,
    /// Outbox rows seen in the current transaction (skipped ones included).
    rows_in_tx: u64,
    /// Rows of the first transaction that were acknowledged before this run.
    skip: u64,
    records_in_flight: usize,
    /// Newest boundary read after the last queued record, not queued yet (see `stream`).
    pending: Option<(Arc<Checkpoint>, bool)>,
    settings: &'a PipelineSettings,
    /// Binlog timestamp of the event being relayed (s since the epoch), for the latency metric.
    event_time: u32,
    /// When the event being relayed was read (the read → ack latency metric of its rows).
    read_at: Instant,
    /// The decoder's state after the event last taken: inside a transaction, and how many
    /// prepared XA transactions are undecided (logged at a stop request).
    decoder_state: (bool, usize),
    /// The last outbox table a row came from: its `database.table` label and row counter,
    /// looked up once per table rather than per row.
    table: Option<(Arc<TableName>, Arc<str>, metrics::TableRows)>,
    /// The last topic the sink said was ready (`RecordSink::ensure_topic`): the router hands
    /// consecutive records of one topic the same `Arc`, so one pointer comparison per record
    /// replaces the sink's locked lookup by name (4 % of the pipeline thread draining a
    /// backlog).
    ready_topic: Option<Arc<str>>,
    /// Sent records' buffers, freed on the reader thread that allocated them.
    spent: Spent,
    /// Kept by the supervisor across runs.
    refusals: &'a mut Refusals,
    /// The last row whose record this run sent.
    last_sent: Option<Done>,
    /// The record just sent was sent alone: wait for its report before reading on.
    drain_after: bool,
    /// The cutover filter, while `[cutover]` is configured.
    cutover: Option<&'a mut Cutover>,
    /// With the cutover filter: rows of the current transaction (with their index in it) not
    /// checked yet; checked and produced at its boundary or at [`cutover::MAX_HELD_ROWS`].
    held: Vec<(u64, DecodedRow)>,
    /// This run read a transaction committed after `cutover.until`: the binlog is in commit
    /// order, so no later one is checked (nor held).
    cutover_over: bool,
    /// A lease with a time to live (fleets): no record is handed to the producer unless the
    /// lease was confirmed recently enough (relay-mysql's `state::lease`).
    lease_clock: Option<LeaseClock>,
    /// `dead_letter.refused_topic = "hold"`: the tables held in this run.
    holds: Option<Holds>,
}

impl Reader<'_> {
    /// After a run ended with a Kafka error: when the producer stopped because a broker refused
    /// a batch for good, finds out what to do next (see "Records a broker refuses for good").
    /// `culprit`: the first refused record reported in this run.
    async fn settle_refusal<S: CheckpointStore, K: RecordSink>(
        &mut self,
        error: RelayError,
        culprit: Option<acks::FatalRefusal>,
        sink: &K,
        progress: &mut Progress<'_, S>,
    ) -> Result<(), RelayError> {
        use outbox_relay_core::sink::FatalCause;
        let fatal = match sink.fatal() {
            Some((FatalCause::Fenced, fatal)) => {
                return Err(outbox_relay_core::sink::fenced(None, &fatal))
            }
            Some((FatalCause::Expired, fatal)) => {
                return Err(outbox_relay_core::sink::expired(&fatal))
            }
            Some((FatalCause::Transient, _)) if culprit.is_none() => return Err(error),
            Some((_, fatal)) => fatal,
            // A refusal that failed the sink's open commit (see `AckQueue::new`) ends the run
            // without a fatal error.
            None if culprit.as_ref().is_some_and(|c| c.failed_commit) => {
                "a record was refused inside the Kafka transaction, which was aborted".to_owned()
            }
            None => return Err(error),
        };
        if let Some(c) = culprit
            .as_ref()
            .filter(|c| c.topic_refused && self.holds.is_some())
        {
            // The topic, not the row, is at fault: no row to find. The next run holds the
            // topic's tables from their first record (`dead_letter.refused_topic = "hold"`).
            self.refusals.learnt += 1;
            self.refusals
                .refused_topics
                .insert(Arc::clone(&c.topic), c.reason.clone());
            return Err(RelayError::kafka(format!(
                "Kafka refused the records of topic {} when they were written ({fatal}); \
                 restarting with a new producer, which holds the tables writing to it \
                 (dead_letter.refused_topic = \"hold\")",
                c.topic
            )));
        }
        match culprit.filter(|c| c.alone) {
            Some(c) if !sink.has_dead_letter() => {
                // Everything before the row is acknowledged: store that, then stop.
                if let Err(e) = progress.persist(true, sink).await {
                    tracing::warn!(error = %e, "cannot store the checkpoint before the refused row");
                }
                Err(RelayError::Row {
                    position: c.position,
                    table: c.table.to_string(),
                    reason: format!(
                        "{} (broker error {}; dead_letter.enabled = false, so the relay stops \
                         with its checkpoint before the row; or enable dead letters to pass it)",
                        c.reason, c.broker_error
                    ),
                })
            }
            Some(c) => {
                tracing::warn!(reason = %c.reason, position = %c.position, table = %c.table,
                    "record refused by Kafka; the producer stopped, so it goes to the \
                     dead-letter topic after a restart");
                self.refusals.learnt += 1;
                self.refusals.refused.insert(
                    c.row,
                    BrokerRefusal {
                        reason: c.reason,
                        broker_error: c.broker_error,
                        keep_value: c.keep_value,
                    },
                );
                Err(RelayError::kafka(format!(
                    "Kafka refused a record for good ({fatal}); restarting with a new producer \
                     to dead-letter its row"
                )))
            }
            None => {
                let through = self.last_sent.as_ref().map(RowRef::of);
                if let Some(last) = &through {
                    self.refusals.learnt += 1;
                    let known = self.refusals.isolate_through.take();
                    self.refusals.isolate_through = Some(match known {
                        Some(k) if last.not_after(&k) => k,
                        _ => last.clone(),
                    });
                }
                Err(RelayError::kafka(format!(
                    "Kafka refused a batch for good ({fatal}); the records from the checkpoint \
                     through the last one sent ({}) are sent again one at a time to find the \
                     row at fault",
                    through.map_or_else(
                        || "none".to_owned(),
                        |r| format!("row {} after {}", r.row, r.base)
                    )
                )))
            }
        }
    }

    /// Takes one acknowledgement; once the queue is empty, the pending boundary is safe too.
    fn on_ack<S: CheckpointStore>(
        &mut self,
        ack: Ack,
        queue_empty: bool,
        progress: &mut Progress<'_, S>,
    ) -> Result<(), RelayError> {
        if matches!(ack, Ack::Record(_) | Ack::Released(..)) {
            self.records_in_flight -= 1;
            self.settings.metrics.set_in_flight(self.records_in_flight);
        }
        if let Ack::Released(id, result) = ack {
            result?;
            progress.stats.records_acked += 1;
            let ended = self
                .holds
                .as_mut()
                .and_then(|h| h.released_acked(id, Instant::now()));
            if let Some(ended) = ended {
                self.hold_ended(ended, progress);
            }
        } else {
            progress.on_ack(ack)?;
        }
        if queue_empty {
            if let Some((base, advances)) = self.pending.take() {
                progress.on_ack(Ack::Boundary(base, advances))?;
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    async fn stream<S: CheckpointStore, E: EventSource + Send + 'static, K: RecordSink>(
        &mut self,
        source: &mut ReadAhead<E>,
        router: &Router,
        sink: &K,
        mut lease: Option<&mut Lease>,
        shutdown: &mut watch::Receiver<bool>,
        progress: &mut Progress<'_, S>,
        inflight: &mut AckQueue,
    ) -> Result<(), RelayError> {
        self.spent = source.spent();
        let mut tick = tokio::time::interval(self.settings.checkpoint_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Commits by time, only for a sink whose records are delivered at commit.
        let mut commit_tick = sink.delivery_mode().commit_interval().map(|every| {
            let mut t = tokio::time::interval(every);
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            t
        });
        let mut last_commit = Instant::now();
        // The commit interval passed inside a source transaction; commit at its end.
        let mut commit_due = false;
        let mut progress_tick = tokio::time::interval_at(
            tokio::time::Instant::now() + metrics::PROGRESS_LOG_INTERVAL,
            metrics::PROGRESS_LOG_INTERVAL,
        );
        progress_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut progress_log = ProgressLog::new(
            Arc::clone(&self.settings.metrics),
            progress.stats.records_acked,
        );
        loop {
            if *shutdown.borrow() {
                return Ok(());
            }
            let held_full = self.holds.as_ref().is_some_and(Holds::full);
            let takes = self.records_in_flight < self.settings.max_in_flight && !held_full;
            // The reader thread stops reading while no event is taken (see `read_ahead`), and
            // reads on once a quarter of max_in_flight was acknowledged: a relay at its bound
            // would otherwise wake that thread at every acknowledgement.
            let max = self.settings.max_in_flight;
            if !takes {
                source.pause(true);
            } else if self.records_in_flight <= max - max / 4 {
                source.pause(false);
            }
            tokio::select! {
                biased;
                // A dropped sender also means stop: the loop re-checks the flag.
                _ = shutdown.changed() => {
                    tracing::info!(in_transaction = self.decoder_state.0, undecided_xa = self.decoder_state.1, "stop requested");
                    if shutdown.has_changed().is_err() { return Ok(()); }
                }
                () = hold_retry(self.holds.as_ref().and_then(Holds::next_try)),
                    if self.holds.as_ref().is_some_and(Holds::any) =>
                {
                    self.retry_holds(sink, progress, inflight).await?;
                }
                Some(ack) = inflight.next(sink), if !inflight.is_empty() => {
                    self.on_ack(ack, inflight.is_empty(), progress)?;
                    // Those already filed with it, in one go: a turn of this loop per
                    // acknowledgement re-armed every branch above and below each time.
                    for _ in 1..ACK_BATCH {
                        let Some(ack) = inflight.next_ready() else { break };
                        self.on_ack(ack, inflight.is_empty(), progress)?;
                    }
                }
                _ = tick.tick() => {
                    if let Some(lease) = lease.as_deref_mut() {
                        lease.verify().await?;
                    }
                    progress.on_tick(sink).await?;
                }
                every = next_tick(&mut commit_tick), if commit_tick.is_some() => {
                    // Catching up on a backlog, a commit every transaction_interval would spend
                    // more time committing than producing (each commit waits for the
                    // coordinator, nothing is sent meanwhile) for records that are late anyway:
                    // transactions then grow to their size bounds, or CATCH_UP_TRANSACTION.
                    let interval = if catching_up(self.event_time) {
                        CATCH_UP_TRANSACTION.max(every)
                    } else {
                        every
                    };
                    if last_commit.elapsed() >= interval
                        && (progress.dirty || sink.transaction_open())
                    {
                        if self.rows_in_tx == 0 {
                            self.commit_at_boundary(sink, progress, inflight).await?;
                            last_commit = Instant::now();
                        } else {
                            // Inside a source transaction: commit at its end, so that the
                            // point is a transaction boundary, which a GTID names on any
                            // server (a point inside one is only exact on its own server).
                            commit_due = true;
                        }
                    }
                }
                _ = progress_tick.tick() => {
                    progress_log.log(progress.stats.records_acked, &progress.acked_base.position);
                }
                // Not while hold_max_records records are held (backpressure of held tables).
                event = source.next(), if takes =>
                {
                    let Some(event) = event? else {
                        tracing::debug!("the source has no more events");
                        return Ok(());
                    };
                    self.event_time = event.timestamp;
                    self.read_at = event.read_at;
                    self.decoder_state = (event.in_transaction, event.undecided_xa);
                    let (rows, boundary) = (event.rows, event.boundary);
                    for row in rows {
                        let index = self.rows_in_tx;
                        self.rows_in_tx += 1;
                        if index < self.skip {
                            continue; // acknowledged before the restart
                        }
                        if self.cutover.is_some() && !self.cutover_over {
                            self.held.push((index, row));
                        } else {
                            self.relay_row(index, row, router, sink, progress, inflight, &mut last_commit).await?;
                        }
                    }
                    if !self.held.is_empty()
                        && (boundary.is_some() || self.held.len() >= cutover::MAX_HELD_ROWS)
                    {
                        self.relay_held(router, sink, progress, inflight, &mut last_commit).await?;
                    }
                    if let Some(b) = boundary {
                        if self.skip > self.rows_in_tx {
                            return Err(RelayError::binlog(format!(
                                "the checkpoint says {} outbox rows of the transaction after {} \
                                 were acknowledged, but it has only {}: the binlog differs from \
                                 the one the checkpoint was written for",
                                self.skip, self.tx_base.position, self.rows_in_tx
                            )));
                        }
                        self.skip = 0;
                        self.rows_in_tx = 0;
                        self.tx_base = Arc::new(Checkpoint {
                            position: b.position,
                            rows_acked: 0,
                            gtid_set: b.gtid_set,
                            source_server_id: self.settings.source_server_id,
                            source_server_uuid: self.settings.source_server_uuid.clone(),
                            table_layouts: b.table_layouts,
                        });
                        let boundary = (Arc::clone(&self.tx_base), b.advances);
                        if inflight.is_empty() {
                            // Nothing unacknowledged before it: it is safe right away.
                            progress.on_ack(Ack::Boundary(boundary.0, boundary.1))?;
                        } else {
                            // Keep only the newest boundary until the next record is queued,
                            // so a busy server with an idle outbox cannot fill the queue
                            // while Kafka is slow.
                            let advances = boundary.1 || self.pending.as_ref().is_some_and(|p| p.1);
                            self.pending = Some((boundary.0, advances));
                        }
                        if std::mem::take(&mut commit_due) {
                            self.commit_at_boundary(sink, progress, inflight).await?;
                            last_commit = Instant::now();
                        }
                    }
                }
                // Last in the biased order: reached only when no acknowledgement and no binlog
                // event is ready now. A transaction open and current: commit it at this source
                // transaction boundary instead of waiting for the interval (group
                // commit: what arrives during a commit goes into the next transaction, so
                // transactions grow with the load and a read_committed consumer sees a record
                // about two commit round trips after the relay read it). Progress-only commits
                // (no record sent) still wait for the interval.
                () = std::future::ready(()), if self.rows_in_tx == 0
                    && sink.transaction_open()
                    && !catching_up(self.event_time) =>
                {
                    self.commit_at_boundary(sink, progress, inflight).await?;
                    last_commit = Instant::now();
                    commit_due = false;
                }
            }
        }
    }

    /// Checks the held rows of the current transaction with the cutover filter and relays
    /// those the previous relay did not send, in order. Skipped rows keep their numbers in the
    /// transaction: the checkpoint passes them with the next record or the boundary.
    async fn relay_held<S: CheckpointStore, K: RecordSink>(
        &mut self,
        router: &Router,
        sink: &K,
        progress: &mut Progress<'_, S>,
        inflight: &mut AckQueue,
        last_commit: &mut Instant,
    ) -> Result<(), RelayError> {
        let held = std::mem::take(&mut self.held);
        let skip = match (self.cutover.as_deref_mut(), cutover::commit_ms(&held)) {
            (Some(c), Some(ms)) => {
                if c.covers(ms) {
                    c.skips(&held).await?
                } else {
                    self.cutover_over = true;
                    vec![false; held.len()]
                }
            }
            _ => vec![false; held.len()],
        };
        for ((index, row), skip) in held.into_iter().zip(skip) {
            if skip {
                if let Ok(e) = &row {
                    // Counted as read, as every row of an outbox table.
                    self.table_label(&e.table);
                }
                continue;
            }
            self.relay_row(index, row, router, sink, progress, inflight, last_commit)
                .await?;
        }
        Ok(())
    }

    /// Relays row `index` (from 0) of the current transaction: waits for room in flight, then
    /// produces it (see [`Reader::produce`]); exactly-once, commits when the Kafka transaction
    /// is full.
    #[allow(clippy::too_many_arguments)]
    async fn relay_row<S: CheckpointStore, K: RecordSink>(
        &mut self,
        index: u64,
        row: DecodedRow,
        router: &Router,
        sink: &K,
        progress: &mut Progress<'_, S>,
        inflight: &mut AckQueue,
        last_commit: &mut Instant,
    ) -> Result<(), RelayError> {
        // One event can carry many rows (an XA COMMIT relays all of its transaction's): keep
        // to max_in_flight within it too.
        while self.records_in_flight >= self.settings.max_in_flight {
            match inflight.next(sink).await {
                Some(ack) => self.on_ack(ack, inflight.is_empty(), progress)?,
                None => break,
            }
        }
        // Before the record's entry (whose sequence number is taken at send).
        if let Some((base, advances)) = self.pending.take() {
            inflight.push_boundary(base, advances);
        }
        let done = (Arc::clone(&self.tx_base), index + 1);
        if !self
            .produce(row, router, sink, done, progress, inflight)
            .await?
        {
            // Held: nothing was sent.
            return Ok(());
        }
        self.records_in_flight += 1;
        self.settings.metrics.set_in_flight(self.records_in_flight);
        if std::mem::take(&mut self.drain_after) {
            // Sent alone: nothing more is sent before its report.
            Box::pin(self.drain(sink, progress, inflight)).await?;
        }
        if sink.transaction_full() && !progress.foreign_base() {
            // A Kafka transaction holds at most so many records or bytes: a larger source
            // transaction spans several, the point saying how many of its rows are committed.
            // (Not while the base is another server's: such a point cannot count this server's
            // rows, see `Progress::acked`; the transaction then ends at the boundary.)
            Box::pin(self.drain(sink, progress, inflight)).await?;
            Box::pin(progress.persist(true, sink)).await?;
            *last_commit = Instant::now();
        }
        Ok(())
    }

    /// Routes and sends one row (or its dead letter) and queues its acknowledgement entry;
    /// `false` when the row's record was held instead (its table is held, or its topic was
    /// just refused with `dead_letter.refused_topic = "hold"`): nothing was queued.
    async fn produce<S: CheckpointStore, K: RecordSink>(
        &mut self,
        mut row: Result<OutboxEvent, Box<RowFailure>>,
        router: &Router,
        sink: &K,
        done: Done,
        progress: &mut Progress<'_, S>,
        inflight: &mut AckQueue,
    ) -> Result<bool, RelayError> {
        let (position, table) = match &mut row {
            // Moved out: the record does not need it, the acknowledgement entry does.
            Ok(e) => (std::mem::take(&mut e.position), self.table_label(&e.table)),
            Err(f) => {
                let (position, table) = match &f.error {
                    RelayError::Row {
                        position, table, ..
                    } => (position.clone(), table.as_str()),
                    _ => (self.tx_base.position.clone(), ""),
                };
                self.settings.metrics.row_read(table);
                (position, Arc::from(table))
            }
        };
        let read_at = self.read_at;
        // Only with spans or the audit on: the header that carried it is gone once the record
        // is routed.
        let wanted = self.settings.spans.is_some() || self.settings.ack_audit.is_some();
        let event_key = match &row {
            Ok(e) if wanted => e.event_key.clone(),
            _ => None,
        };
        let routed = match row {
            Ok(event) => router.try_route(event).map_err(|(reason, event)| {
                // Unroutable (e.g. a topic name Kafka forbids): keep what the row had.
                let record = Router::record_without_topic(*event);
                let err = RelayError::Row {
                    position: position.clone(),
                    table: table.to_string(),
                    reason: reason.clone(),
                };
                (
                    err,
                    dead_letter_of(record, reason, position.clone(), table.to_string(), true),
                    DeadLetterKind::Route,
                )
            }),
            Err(f) => {
                let f = *f;
                let dl = DeadLetter {
                    reason: f.error.to_string(),
                    position: position.clone(),
                    table: table.to_string(),
                    topic: None,
                    key: f.key,
                    value: f.value,
                    headers: f.headers,
                    broker_error: None,
                    value_dropped: false,
                };
                Err((f.error, dl, DeadLetterKind::Decode))
            }
        };
        let mut record = match routed {
            Ok(record) => record,
            Err((err, dl, kind)) => {
                let span = self.settings.spans.as_ref().map(|spans| {
                    Box::new(spans.start_row(
                        &RowStart {
                            topic: dl.topic.as_deref().unwrap_or(""),
                            key: dl.key.as_deref().unwrap_or_default(),
                            tombstone: dl.value.is_none(),
                            table: &dl.table,
                            source: self.settings.metrics.source(),
                            event_key: event_key.as_deref(),
                            position: dl.position.to_string(),
                            read_at,
                        },
                        dl.headers.iter().map(|(n, v)| (n.as_str(), v.as_slice())),
                    ))
                });
                return Box::pin(self.dead_letter(
                    (dl, kind),
                    err,
                    span,
                    sink,
                    done,
                    progress,
                    inflight,
                ))
                .await
                .map(|()| true);
            }
        };
        let span = self.settings.spans.as_ref().map(|spans| {
            let span = spans.start_row(
                &RowStart {
                    topic: &record.topic,
                    key: &record.key,
                    tombstone: record.value.is_none(),
                    table: &table,
                    source: self.settings.metrics.source(),
                    event_key: event_key.as_deref(),
                    position: position.to_string(),
                    read_at,
                },
                record
                    .headers
                    .iter()
                    .filter_map(|(n, v)| Some((&**n, v.as_deref()?))),
            );
            span.inject(&mut record.headers);
            Box::new(span)
        });
        let bytes = record_bytes(&record);
        if let Some(refusal) = self.refusals.refusal_of(&done) {
            // Refused alone by a broker in an earlier run: not sent again.
            let err = RelayError::Row {
                position: position.clone(),
                table: table.to_string(),
                reason: refusal.reason.clone(),
            };
            let mut dl = dead_letter_of(
                record,
                refusal.reason,
                position,
                table.to_string(),
                refusal.keep_value,
            );
            dl.broker_error = Some(refusal.broker_error);
            return Box::pin(self.dead_letter(
                (dl, DeadLetterKind::Broker),
                err,
                span,
                sink,
                done,
                progress,
                inflight,
            ))
            .await
            .map(|()| true);
        }
        let mut held = Held {
            record,
            done,
            table,
            position,
            event_time: self.event_time,
            read_at,
            bytes,
            span,
            event_key: self.settings.ack_audit.as_ref().and(event_key),
        };
        if let Some(holds) = self.holds.as_mut().filter(|h| h.holding(&held.table)) {
            // Behind the held records of its table, in order.
            holds.push(held);
            return Ok(false);
        }
        if let Some(reason) = self
            .refusals
            .refused_topics
            .get(&held.record.topic)
            .filter(|_| self.holds.is_some())
        {
            // A produce response refused its topic in an earlier run: sending would stop the
            // producer again.
            let (topic, reason) = (Arc::clone(&held.record.topic), reason.clone());
            self.start_hold(topic, reason, held, progress);
            return Ok(false);
        }
        let alone = self.refusals.isolates(&held.done);
        let topic = &held.record.topic;
        if !self
            .ready_topic
            .as_ref()
            .is_some_and(|ready| Arc::ptr_eq(ready, topic))
            && sink.ensure_topic(topic).await?
        {
            self.ready_topic = Some(Arc::clone(topic));
        }
        if alone {
            Box::pin(self.drain(sink, progress, inflight)).await?;
        }
        // The rare paths' futures are boxed (here and below): this future is built and moved
        // for every row, and with them inline it was 3.4 KB, whose copies were about a third
        // of the pipeline thread's CPU draining a backlog.
        let mut sent = match self.send_once(sink, inflight, |s, seq| s.send(&mut held.record, seq))
        {
            Err(SendError::QueueFull) => {
                Box::pin(
                    self.send_with_backpressure(sink, progress, inflight, |s, seq| {
                        s.send(&mut held.record, seq)
                    }),
                )
                .await
            }
            sent => sent.map_err(Refusal::of),
        };
        if matches!(
            sent,
            Err(Refusal::Permanent(_, DeadLetterKind::Producer, false))
        ) && Box::pin(sink.recheck_topic_limit(&held.record)).await
        {
            // The topic's max.message.bytes was raised since it was read.
            sent = Box::pin(
                self.send_with_backpressure(sink, progress, inflight, |s, seq| {
                    s.send(&mut held.record, seq)
                }),
            )
            .await;
        }
        if self.holds.is_none() {
            // Without holds a refused topic is a row error like any other.
            if let Err(Refusal::Topic(reason)) = sent {
                sent = Err(Refusal::Permanent(reason, DeadLetterKind::Broker, true));
            }
        }
        match sent {
            Ok(()) => {
                if let Some(span) = held.span.as_deref_mut() {
                    span.produced();
                }
                let (done, mut info, record) = record_info(held, alone, None);
                self.spent.put(record);
                self.last_sent = Some(done.clone());
                if self
                    .settings
                    .ack_audit
                    .as_ref()
                    .is_some_and(|a| a.timings())
                {
                    info.sent_at = Some(Instant::now());
                }
                inflight.push_record(done, info);
                // Its acknowledgement is awaited once it counts as in flight (see `stream`).
                self.drain_after = alone;
                Ok(true)
            }
            Err(Refusal::Topic(reason)) => {
                let topic = Arc::clone(&held.record.topic);
                self.start_hold(topic, reason, held, progress);
                Ok(false)
            }
            Err(Refusal::Permanent(reason, kind, keep_value)) => {
                let Held {
                    record,
                    done,
                    table,
                    position,
                    span,
                    ..
                } = held;
                let err = RelayError::Row {
                    position: position.clone(),
                    table: table.to_string(),
                    reason: reason.clone(),
                };
                let dl = dead_letter_of(record, reason, position, table.to_string(), keep_value);
                Box::pin(self.dead_letter((dl, kind), err, span, sink, done, progress, inflight))
                    .await
                    .map(|()| true)
            }
            Err(Refusal::Failed(e)) => {
                if let Some(span) = held.span {
                    span.failed(&e.to_string());
                }
                Err(e)
            }
        }
    }

    /// Starts holding the table of `held`, whose `topic` the brokers refuse for `reason`: logs
    /// it once (warn) and keeps the checkpoint before the row.
    fn start_hold<S: CheckpointStore>(
        &mut self,
        topic: Arc<str>,
        reason: String,
        held: Held,
        progress: &mut Progress<'_, S>,
    ) {
        let Some(holds) = self.holds.as_mut() else {
            return;
        };
        let position = held.position.clone();
        let started = holds.start(topic, reason, held, Instant::now());
        tracing::warn!(table = %started.table, topic = %started.topic, position = %position,
            checkpoint_floor = %started.floor.position,
            rows_acked = started.floor.rows_acked,
            error = %started.reason,
            "the brokers refuse this table's topic: its records are held in order \
             (dead_letter.refused_topic = \"hold\") while the other tables go on, and the \
             checkpoint stays before its first held row. Fix the topic as the error says (create \
             it, or grant the relay's principal WRITE and DESCRIBE on it); the table is retried \
             with the [retry] backoff and its records are sent as soon as the topic accepts them");
        progress.set_floor(holds.floor());
    }

    /// Logs the end of a hold and lets the checkpoint move past its rows.
    fn hold_ended<S: CheckpointStore>(&self, ended: hold::Ended, progress: &mut Progress<'_, S>) {
        tracing::info!(table = %ended.table, topic = %ended.topic,
            held_ms = ended.held_for.as_millis() as u64,
            "hold ended: every held record of the table is acknowledged; the checkpoint moves \
             past them");
        progress.set_floor(self.holds.as_ref().and_then(Holds::floor));
    }

    /// Retries every held table whose retry is due: asks the brokers about its topic again and
    /// releases its records in order while they are accepted (see [`Reader::release`]).
    async fn retry_holds<S: CheckpointStore, K: RecordSink>(
        &mut self,
        sink: &K,
        progress: &mut Progress<'_, S>,
        inflight: &mut AckQueue,
    ) -> Result<(), RelayError> {
        let now = Instant::now();
        while let Some((id, topic)) = self.holds.as_ref().and_then(|h| h.due(now)) {
            self.settings.metrics.hold_retried();
            if self.refusals.refused_topics.contains_key(&topic) {
                if !self.trial(id, topic, sink, progress, inflight).await? {
                    continue;
                }
            } else {
                sink.recheck_topic(&topic).await?;
            }
            self.release(id, sink, progress, inflight).await?;
        }
        Ok(())
    }

    /// Retries hold `id`, whose `topic` a produce response refused (see
    /// [`Refusals::refused_topics`]): sends its first held record alone with the sink's trial
    /// producer ([`RecordSink::send_trial`]), so that a topic still refused does not stop the
    /// sink's producer. `true` when the record was written: its acknowledgement is queued as
    /// the sink's own reports are, the topic is no longer known as refused, and the caller
    /// releases the rest with the sink's producer. `false` when the topic still refuses it or
    /// the trial failed: the record goes back first in line until the next backoff delay.
    ///
    /// # Errors
    /// The record was refused for another reason (too large, say): as in [`Reader::release`],
    /// the run ends and the next one, which sends it with the sink's producer, finds a row
    /// error as usual.
    async fn trial<S: CheckpointStore, K: RecordSink>(
        &mut self,
        id: u64,
        topic: Arc<str>,
        sink: &K,
        progress: &mut Progress<'_, S>,
        inflight: &mut AckQueue,
    ) -> Result<bool, RelayError> {
        while self.records_in_flight >= self.settings.max_in_flight {
            match inflight.next(sink).await {
                Some(ack) => self.on_ack(ack, inflight.is_empty(), progress)?,
                None => break,
            }
        }
        let Some(mut held) = self.holds.as_mut().and_then(|h| h.pop(id)) else {
            return Ok(true);
        };
        if let Some(clock) = &self.lease_clock {
            // As before every hand-over (`send_with_backpressure`).
            if let Err(e) = clock.check() {
                if let Some(h) = self.holds.as_mut() {
                    h.refused_again(id, held, topic, e.to_string(), Instant::now());
                }
                return Err(e);
            }
        }
        match sink.send_trial(&held.record).await {
            Ok(delivered @ Delivered::Acked(..)) => {
                self.refusals.refused_topics.remove(&topic);
                tracing::info!(%topic, table = %held.table,
                    "a held table's topic accepts records again (its first held record was \
                     written alone): the rest are sent in order");
                if let Some(span) = held.span.as_deref_mut() {
                    span.produced();
                }
                if let Some((base, advances)) = self.pending.take() {
                    inflight.push_boundary(base, advances);
                }
                let seq = inflight.next_seq();
                let (done, info, record) = record_info(held, false, Some(id));
                self.spent.put(record);
                inflight.push_record(done, info);
                // Filed where the sink files its own reports: audit, spans, read-back and the
                // hold's count see it as any released record.
                sink.deliveries().file((seq, Ok(delivered)));
                self.records_in_flight += 1;
                self.settings.metrics.set_in_flight(self.records_in_flight);
                if let Some(h) = self.holds.as_mut() {
                    h.sent(id);
                }
                Ok(true)
            }
            Ok(Delivered::Refused {
                reason,
                topic_refused: true,
                ..
            }) => {
                tracing::debug!(%topic, table = %held.table, %reason,
                    "a held table's topic still refuses its records");
                if let Some(h) = self.holds.as_mut() {
                    h.refused_again(id, held, topic, reason, Instant::now());
                }
                Ok(false)
            }
            Ok(Delivered::Refused { reason, .. }) => {
                self.refusals.refused_topics.remove(&topic);
                if let Some(span) = held.span {
                    span.failed(&reason);
                }
                Err(RelayError::kafka(format!(
                    "a held record of table {} (at {}) was refused when its topic accepted \
                     again: {reason}; the relay resumes from its checkpoint, before the held \
                     rows, where this row is a row error as usual",
                    held.table, held.position
                )))
            }
            Err(e) => {
                tracing::warn!(%topic, table = %held.table, error = %e,
                    "a held table's trial record failed; retried after the next backoff delay");
                if let Some(h) = self.holds.as_mut() {
                    h.refused_again(id, held, topic, e.to_string(), Instant::now());
                }
                Ok(false)
            }
        }
    }

    /// Sends the held records of hold `id` in order until its queue is empty (its table is
    /// then no longer held; the hold ends once they are all acknowledged) or one is refused by
    /// its topic again (it goes back first in line, and the table waits for its next retry).
    ///
    /// # Errors
    /// A held record refused for another reason (too large, say) ends the run with a Kafka
    /// error: the next run starts at or before the held rows, where its topic accepts, so the
    /// row is then a row error as usual (dead letter or stop), never a loop.
    async fn release<S: CheckpointStore, K: RecordSink>(
        &mut self,
        id: u64,
        sink: &K,
        progress: &mut Progress<'_, S>,
        inflight: &mut AckQueue,
    ) -> Result<(), RelayError> {
        let mut released = 0u64;
        let mut ready: Option<Arc<str>> = None;
        loop {
            while self.records_in_flight >= self.settings.max_in_flight {
                match inflight.next(sink).await {
                    Some(ack) => self.on_ack(ack, inflight.is_empty(), progress)?,
                    None => break,
                }
            }
            let Some(mut held) = self.holds.as_mut().and_then(|h| h.pop(id)) else {
                break;
            };
            if ready.as_deref() != Some(&*held.record.topic) {
                sink.ensure_topic(&held.record.topic).await?;
                ready = Some(Arc::clone(&held.record.topic));
            }
            if let Some((base, advances)) = self.pending.take() {
                inflight.push_boundary(base, advances);
            }
            let sent = self
                .send_with_backpressure(sink, progress, inflight, |s, seq| {
                    s.send(&mut held.record, seq)
                })
                .await;
            match sent {
                Ok(()) => {
                    if let Some(span) = held.span.as_deref_mut() {
                        span.produced();
                    }
                    let (done, info, record) = record_info(held, false, Some(id));
                    self.spent.put(record);
                    inflight.push_record(done, info);
                    self.records_in_flight += 1;
                    self.settings.metrics.set_in_flight(self.records_in_flight);
                    if let Some(h) = self.holds.as_mut() {
                        h.sent(id);
                    }
                    released += 1;
                }
                Err(Refusal::Topic(reason)) => {
                    tracing::debug!(topic = %held.record.topic, table = %held.table, %reason,
                        released, "a held table's topic is still refused");
                    let topic = Arc::clone(&held.record.topic);
                    if let Some(h) = self.holds.as_mut() {
                        h.refused_again(id, held, topic, reason, Instant::now());
                    }
                    return Ok(());
                }
                Err(Refusal::Permanent(reason, ..)) => {
                    if let Some(span) = held.span {
                        span.failed(&reason);
                    }
                    return Err(RelayError::kafka(format!(
                        "a held record of table {} (at {}) was refused when its topic accepted \
                         again: {reason}; the relay resumes from its checkpoint, before the held \
                         rows, where this row is a row error as usual",
                        held.table, held.position
                    )));
                }
                Err(Refusal::Failed(e)) => {
                    if let Some(span) = held.span {
                        span.failed(&e.to_string());
                    }
                    return Err(e);
                }
            }
        }
        if released > 0 {
            tracing::info!(
                released,
                "a held table's topic accepts its records again: sent in order"
            );
        }
        let ended = self
            .holds
            .as_mut()
            .and_then(|h| h.end_if_acked(id, Instant::now()));
        if let Some(ended) = ended {
            self.hold_ended(ended, progress);
        }
        Ok(())
    }

    /// The `database.table` label of `table` (counting one row read in it).
    fn table_label(&mut self, table: &Arc<TableName>) -> Arc<str> {
        let (_, label, rows) = match &self.table {
            Some(t) if Arc::ptr_eq(&t.0, table) => t,
            _ => {
                let label: Arc<str> = table.to_string().into();
                let rows = self.settings.metrics.table_rows(&label);
                self.table.insert((Arc::clone(table), label, rows))
            }
        };
        self.settings.metrics.row_read_in(rows);
        Arc::clone(label)
    }

    /// Sends `dl` (a dead letter of `kind`) to the dead-letter topic when one is configured
    /// and queues its acknowledgement entry (with the row's `span`); otherwise returns `err`.
    #[allow(clippy::too_many_arguments)]
    async fn dead_letter<S: CheckpointStore, K: RecordSink>(
        &mut self,
        (dl, kind): (DeadLetter, DeadLetterKind),
        err: RelayError,
        span: Option<Box<RowSpan>>,
        sink: &K,
        done: Done,
        progress: &mut Progress<'_, S>,
        inflight: &mut AckQueue,
    ) -> Result<(), RelayError> {
        if !sink.has_dead_letter() {
            if let Some(span) = span {
                span.failed(&err.to_string());
            }
            return Err(err);
        }
        tracing::warn!(reason = %dl.reason, position = %dl.position, table = %dl.table, "row sent to the dead-letter topic");
        progress.stats.dead_lettered += 1;
        self.settings.metrics.dead_lettered(kind);
        sink.ensure_dead_letter_topic().await?;
        match self
            .send_with_backpressure(sink, progress, inflight, |s, seq| {
                s.send_dead_letter(&dl, seq)
            })
            .await
        {
            Ok(()) => {
                inflight.push_dead_letter(done, dl, span);
                Ok(())
            }
            Err(refusal) => {
                let err = match refusal {
                    Refusal::Permanent(reason, ..) | Refusal::Topic(reason) => {
                        refused_too(&dl, &reason)
                    }
                    Refusal::Failed(e) => e,
                };
                if let Some(span) = span {
                    span.failed(&err.to_string());
                }
                Err(err)
            }
        }
    }

    /// Takes acknowledgements until nothing is in flight.
    async fn drain<S: CheckpointStore, K: RecordSink>(
        &mut self,
        sink: &K,
        progress: &mut Progress<'_, S>,
        inflight: &mut AckQueue,
    ) -> Result<(), RelayError> {
        while let Some(ack) = inflight.next(sink).await {
            self.on_ack(ack, inflight.is_empty(), progress)?;
        }
        Ok(())
    }

    /// Drains and persists (exactly-once: commits) at a source transaction boundary
    /// (`rows_in_tx` 0). Exactly-once, the progress record of the point the commit will write
    /// is enqueued first ([`RecordSink::prepare_commit`]): its round trip overlaps the records'
    /// acknowledgements, and reading resumes one round trip sooner.
    async fn commit_at_boundary<S: CheckpointStore, K: RecordSink>(
        &mut self,
        sink: &K,
        progress: &mut Progress<'_, S>,
        inflight: &mut AckQueue,
    ) -> Result<(), RelayError> {
        if self.rows_in_tx == 0 && sink.transaction_open() {
            if let Some(point) = progress.point_at(&self.tx_base) {
                sink.prepare_commit(&point).await?;
            }
        }
        self.drain(sink, progress, inflight).await?;
        progress.persist(false, sink).await
    }

    /// Calls `send` with the queue's next sequence number until librdkafka's queue has room,
    /// taking acknowledgements meanwhile (backpressure).
    async fn send_with_backpressure<S: CheckpointStore, K: RecordSink>(
        &mut self,
        sink: &K,
        progress: &mut Progress<'_, S>,
        inflight: &mut AckQueue,
        mut send: impl FnMut(&K, u64) -> Result<(), SendError>,
    ) -> Result<(), Refusal> {
        loop {
            match self.send_once(sink, inflight, &mut send) {
                Ok(()) => return Ok(()),
                Err(SendError::QueueFull) => match inflight.next(sink).await {
                    Some(ack) => {
                        self.on_ack(ack, inflight.is_empty(), progress)
                            .map_err(Refusal::Failed)?;
                    }
                    None => tokio::time::sleep(Duration::from_millis(10)).await,
                },
                Err(refused) => return Err(Refusal::of(refused)),
            }
        }
    }

    /// One hand-over of a record to the producer (`send` with the next sequence number), after
    /// the lease check: a process resumed after a freeze stops here. A full queue is
    /// [`SendError::QueueFull`], for the caller to wait on acknowledgements.
    fn send_once<K: RecordSink>(
        &self,
        sink: &K,
        inflight: &AckQueue,
        mut send: impl FnMut(&K, u64) -> Result<(), SendError>,
    ) -> Result<(), SendError> {
        if let Some(clock) = &self.lease_clock {
            clock.check().map_err(SendError::Failed)?;
        }
        send(sink, inflight.next_seq())
    }
}

/// The acknowledgement entry of `held`, sent (alone: see [`RecordInfo::alone`]; `released`:
/// the hold that released it), and its record, for [`Spent`].
fn record_info(held: Held, alone: bool, released: Option<u64>) -> (Done, RecordInfo, Record) {
    (
        held.done,
        RecordInfo {
            topic: Arc::clone(&held.record.topic),
            bytes: held.bytes,
            event_time: held.event_time,
            read_at: held.read_at,
            position: held.position,
            table: held.table,
            alone,
            span: held.span,
            event_key: held.event_key,
            released,
            sent_at: None,
        },
        held.record,
    )
}

/// Resolves with the period of `timer` at its next tick; never without a timer.
async fn next_tick(timer: &mut Option<tokio::time::Interval>) -> Duration {
    match timer {
        Some(t) => {
            t.tick().await;
            t.period()
        }
        None => std::future::pending().await,
    }
}

/// Resolves at `at` (a held table's next retry); never without one.
async fn hold_retry(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// Exactly-once: events at least this old (binlog timestamp, s) mean the relay is catching up.
const CATCH_UP_LAG_S: u64 = 2;

/// At most this many acknowledgements handled per turn of the streaming loop, so that a stop
/// request or a due hold retry waits for no more than that.
const ACK_BATCH: usize = 1024;

/// Exactly-once: the longest a Kafka transaction stays open while the relay catches up.
/// Each commit stops producing until the coordinator answers (tens of ms); a drain of 150k
/// rows/s with 1 s transactions spent ~10% of its time committing.
const CATCH_UP_TRANSACTION: Duration = Duration::from_secs(2);

/// `true` when the event last read (binlog timestamp `event_time`, s since the epoch; 0:
/// none) is [`CATCH_UP_LAG_S`] or more behind the clock.
fn catching_up(event_time: u32) -> bool {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    event_time != 0 && now.saturating_sub(u64::from(event_time)) >= CATCH_UP_LAG_S
}

/// Why a record could not be enqueued, once the queue had room.
enum Refusal {
    /// Refused for good: dead-letter (counted as this kind; with the value when `true`, i.e.
    /// its size was not the problem) or stop.
    Permanent(String, DeadLetterKind, bool),
    /// The brokers refuse the record's topic (missing while they create none, not authorized),
    /// known from their metadata: held with `dead_letter.refused_topic = "hold"`, otherwise as
    /// `Permanent` of kind `broker`, with the value.
    Topic(String),
    /// Anything else: the run ends and resumes from its checkpoint.
    Failed(RelayError),
}

impl Refusal {
    /// The refusal of a send that failed for a reason other than a full queue: the value is
    /// left out of the dead letter only when its size was the problem.
    fn of(e: SendError) -> Self {
        match e {
            SendError::TooLarge(reason) => Self::Permanent(reason, DeadLetterKind::Producer, false),
            SendError::Permanent(reason) | SendError::Timestamp(reason) => {
                Self::Permanent(reason, DeadLetterKind::Producer, true)
            }
            SendError::BrokerRefused(reason) => Self::Topic(reason),
            SendError::Failed(e) => Self::Failed(e),
            SendError::QueueFull => {
                Self::Failed(RelayError::kafka("the producer's queue stayed full"))
            }
        }
    }
}

/// The dead letter of `record`; its value is kept unless `keep_value` is false (the refusal is
/// about the record's size).
fn dead_letter_of(
    record: Record,
    reason: String,
    position: outbox_relay_core::position::BinlogPosition,
    table: String,
    keep_value: bool,
) -> DeadLetter {
    DeadLetter {
        reason,
        position,
        table,
        topic: (!record.topic.is_empty()).then(|| record.topic.to_string()),
        key: Some(record.key),
        value_dropped: !keep_value && record.value.is_some(),
        value: if keep_value { record.value } else { None },
        // A null-valued header (Debezium profile) has no bytes to keep.
        headers: record
            .headers
            .into_iter()
            .filter_map(|(k, v)| Some((k.to_string(), v?)))
            .collect(),
        broker_error: None,
    }
}

/// Bytes of `record` as counted by `outbox_relay_bytes_produced_total`: key, value, header
/// names and values.
fn record_bytes(record: &Record) -> u64 {
    let headers: usize = record
        .headers
        .iter()
        .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len))
        .sum();
    (record.key.len() + record.value.as_ref().map_or(0, Vec::len) + headers) as u64
}

/// The error for a row whose dead letter was refused as well: the relay must stop.
fn refused_too(dl: &DeadLetter, reason: &str) -> RelayError {
    RelayError::Row {
        position: dl.position.clone(),
        table: dl.table.clone(),
        reason: format!(
            "{}; the dead-letter topic refused it too: {reason}",
            dl.reason
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_relay_core::position::BinlogPosition;
    use outbox_relay_mysql::state::store::MysqlCheckpointStore;

    /// The dead letter of a record refused by `e`, with its value `{"n":1}`.
    fn refused_as(e: SendError) -> DeadLetter {
        let record = Record {
            topic: Arc::from("t.Order"),
            key: b"o-1".to_vec(),
            value: Some(br#"{"n":1}"#.to_vec()),
            headers: Vec::new(),
            partition: Some(7),
            timestamp_ms: 0,
            column_timestamp: false,
            fallback_ms: None,
        };
        let Refusal::Permanent(reason, _, keep_value) = Refusal::of(e) else {
            panic!("not a permanent refusal");
        };
        dead_letter_of(
            record,
            reason,
            BinlogPosition::new("bin.000001", 400),
            "shop.outbox".into(),
            keep_value,
        )
    }

    #[test]
    fn a_dead_letter_drops_the_value_only_when_its_size_was_refused() {
        // A partition the topic does not have: the record was fine, `dlq replay` needs it.
        let dl = refused_as(SendError::Permanent(
            "the partition column names a partition topic t.Order does not have".into(),
        ));
        assert_eq!(dl.value.as_deref(), Some(&br#"{"n":1}"#[..]));
        assert!(!dl.value_dropped);
        let dl = refused_as(SendError::Timestamp("timestamp out of range".into()));
        assert!(dl.value.is_some() && !dl.value_dropped);
        let dl = refused_as(SendError::TooLarge("larger than max.message.bytes".into()));
        assert_eq!(dl.value, None);
        assert!(dl.value_dropped);
    }

    fn base(server_id: u32, uuid: Option<&str>) -> Arc<Checkpoint> {
        Arc::new(Checkpoint {
            position: BinlogPosition::new("mariadb-bin.000067", 27064),
            rows_acked: 0,
            gtid_set: Some("0-1-89,2-2-10".into()),
            source_server_id: server_id,
            source_server_uuid: uuid.map(str::to_owned),
            table_layouts: None,
        })
    }

    fn progress(
        acked_base: Arc<Checkpoint>,
        server: (u32, Option<&str>),
    ) -> Progress<'static, MysqlCheckpointStore> {
        Progress {
            store: None,
            io_timeout: Duration::from_secs(1),
            stored: (*acked_base).clone(),
            acked_base,
            acked_rows: 3,
            dirty: true,
            last_write: Instant::now(),
            write_interval: Duration::from_secs(1),
            mode: DeliveryMode::Acknowledged,
            mirrored: None,
            stats: RunStats::default(),
            server: (server.0, server.1.map(str::to_owned)),
            metrics: Arc::new(Metrics::new()),
            floor: None,
            start_unwritten: false,
            commit_audit: None,
        }
    }

    #[test]
    fn the_prepared_point_is_the_one_the_commit_writes_after_the_boundary_is_acknowledged() {
        let committed = DeliveryMode::Committed {
            interval: Duration::from_millis(20),
        };
        let boundary = Arc::new(Checkpoint {
            position: BinlogPosition::new("mariadb-bin.000067", 40_000),
            ..(*base(1, None)).clone()
        });
        let mut p = progress(base(1, None), (1, None));
        p.mode = committed;
        let prepared = p.point_at(&boundary).expect("known ahead");
        p.on_ack(Ack::Boundary(Arc::clone(&boundary), true))
            .expect("ack");
        assert_eq!(p.acked(), prepared);
        // Not known ahead: at-least-once, a hold's floor, another server's boundary.
        p.mode = DeliveryMode::Acknowledged;
        assert_eq!(p.point_at(&boundary), None);
        p.mode = committed;
        p.set_floor(Some(&base(1, None)));
        assert_eq!(p.point_at(&boundary), None);
        p.set_floor(None);
        assert_eq!(p.point_at(&base(2, None)), None);
        let mut mysql = progress(base(2, Some("a")), (2, Some("a")));
        mysql.mode = committed;
        assert!(mysql.point_at(&base(2, Some("a"))).is_some());
        assert_eq!(mysql.point_at(&base(2, Some("b"))), None);
    }

    #[test]
    fn the_checkpoint_never_passes_a_held_tables_first_row() {
        let mut p = progress(base(1, None), (1, None));
        // The first held row is row 2 (0-based) of the transaction after 27064.
        let floor = Checkpoint {
            rows_acked: 2,
            ..(*base(1, None)).clone()
        };
        p.set_floor(Some(&floor));
        assert_eq!(p.acked().rows_acked, 2, "3 rows acknowledged, capped at 2");
        // Later transactions of other tables acknowledged: still the floor.
        p.acked_base = Arc::new(Checkpoint {
            position: BinlogPosition::new("mariadb-bin.000067", 40_000),
            ..(*base(1, None)).clone()
        });
        p.acked_rows = 0;
        assert_eq!(p.acked(), floor);
        assert_eq!(p.resume_point(), floor);
        // Before the floor: the acknowledged point itself.
        p.acked_base = Arc::new(Checkpoint {
            position: BinlogPosition::new("mariadb-bin.000066", 4),
            ..(*base(1, None)).clone()
        });
        assert_eq!(p.acked().position.file, "mariadb-bin.000066");
        // The hold ended: the point moves on.
        p.acked_base = Arc::new(Checkpoint {
            position: BinlogPosition::new("mariadb-bin.000067", 40_000),
            ..(*base(1, None)).clone()
        });
        p.set_floor(None);
        assert!(p.dirty);
        assert_eq!(p.acked().position.pos, 40_000);
    }

    #[test]
    fn rows_counted_against_another_servers_base_are_not_stored_under_its_name() {
        // A run moved by GTID from server 2 to server 1: until its first boundary, the rows it
        // acknowledged are server 1's; stored as "server 2, 3 rows acked" a return to server 2
        // would skip 3 rows of server 2's own transaction after that GTID set.
        let moved = progress(base(2, None), (1, None)).acked();
        assert_eq!((moved.source_server_id, moved.rows_acked), (2, 0));
        // MySQL: same server_id, another server_uuid.
        let uuid = progress(base(2, Some("a")), (2, Some("b"))).acked();
        assert_eq!(uuid.rows_acked, 0);
        // The checkpoint's own server: the count is kept.
        let same = progress(base(1, None), (1, None)).acked();
        assert_eq!((same.source_server_id, same.rows_acked), (1, 3));
    }
}
