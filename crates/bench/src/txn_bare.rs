//! The exactly-once limit of the latency budget: a bare transactional producer that commits as
//! the relay does (group commit: the records that arrived while a commit was in flight go into
//! the next transaction, committed as soon as they are sent), so that an exactly-once relay's
//! visibility can be split into what one transactional producer costs on this broker and what
//! the relay adds.
//!
//! Why the relay cannot overlap its commits with sends: librdkafka enqueues a transactional
//! producer's records only in a transaction that is open, not while one commits (its source,
//! `rdkafka_txnmgr.c`: `rd_kafka_txn_may_enq_msg`), and a second producer would have a
//! `transactional.id` of its own, which fencing cannot tie to the same checkpoint. This
//! producer has the same constraint, so it is the bound. It commits no progress record, which
//! the relay's transactions also carry: that append counts as the relay's.
//!
//! A failure of this producer once started does not fail the relay's run: its transaction is
//! aborted, the rows it committed before are measured, and the error goes into the run's
//! budget (`bare_error`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rdkafka::producer::{
    BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext, PurgeConfig,
};
use rdkafka::ClientContext;

use crate::kafka::{producer_config, send_waiting};
use crate::workload::now_micros;

/// The priming record's value: no `ts` or `seq`, so readers count it as unusable, not as a row.
pub const PRIME: &[u8] = b"{}";

/// The priming record's sequence number in its delivery report: no row's.
const PRIME_SEQ: u64 = u64::MAX;

/// Longest wait for `init_transactions` and each `commit_transaction`.
const TXN_TIMEOUT: Duration = Duration::from_secs(60);

/// What the bare transactional producer measured, per row (by its sequence number).
#[derive(Debug, Default)]
pub struct TxnBareOut {
    /// Send → acknowledgement of the row's record inside its transaction, µs.
    pub acked_by_row: HashMap<u64, i64>,
    /// When the transaction holding the row's record committed (`commit_transaction`
    /// returned), µs since the epoch.
    pub committed_by_row: HashMap<u64, i64>,
    /// Why the producer stopped before the run's end (begin, send or commit failed; its
    /// transaction was aborted, its rows are not in `committed_by_row`); `None`: it did not.
    pub error: Option<String>,
}

/// Delivery reports: the row and its send time travel as the record's opaque.
#[derive(Default)]
struct Timed {
    acked: Mutex<Vec<(u64, i64)>>,
    /// Records whose delivery failed (their transaction cannot commit).
    failed: AtomicU64,
}

impl ClientContext for Timed {}

impl ProducerContext for Timed {
    type DeliveryOpaque = Box<(u64, i64)>;
    fn delivery(&self, r: &DeliveryResult<'_>, sent: Box<(u64, i64)>) {
        let (seq, at) = *sent;
        if seq == PRIME_SEQ {
            return; // not a row's
        }
        match r {
            Ok(_) => {
                if let Ok(mut acked) = self.acked.lock() {
                    acked.push((seq, now_micros() - at));
                }
            }
            Err(_) => _ = self.failed.fetch_add(1, Ordering::Relaxed),
        }
    }
}

/// One row's record: its sequence number, key and value.
type Row = (u64, String, String);

/// A bare transactional producer running on a thread of its own (its commits block).
pub struct TxnBare {
    rows: mpsc::Sender<Row>,
    handle: std::thread::JoinHandle<Result<TxnBareOut>>,
}

impl TxnBare {
    /// Creates the producer (the relay's producer settings, `transactional.id` `id`), calls
    /// `init_transactions`, commits one priming record ([`PRIME`]) to `topic` and starts its
    /// thread, which sends each row given to [`TxnBare::send`] to `topic`.
    ///
    /// Why the priming record: a topic's first record waits for its metadata (up to a second
    /// for a topic just created), and with group commit every row arriving meanwhile would
    /// wait behind it; the relay's topic is primed the same way before a run.
    ///
    /// # Errors
    /// The producer cannot be created, or `init_transactions` or the priming transaction fails.
    pub async fn start(bootstrap: &str, topic: &str, id: &str) -> Result<Self> {
        let producer: BaseProducer<Timed> = producer_config(bootstrap)
            .set("transactional.id", id)
            .set("message.timeout.ms", "60000")
            .create_with_context(Timed::default())
            .context("creating the bare transactional producer")?;
        let primed_topic = topic.to_owned();
        let producer = tokio::task::spawn_blocking(move || -> Result<BaseProducer<Timed>> {
            producer
                .init_transactions(TXN_TIMEOUT)
                .context("the bare transactional producer's init_transactions")?;
            producer.begin_transaction()?;
            let record =
                BaseRecord::with_opaque_to(&primed_topic, Box::new((PRIME_SEQ, 0))).payload(PRIME);
            send_waiting(&producer, record).context("priming the bare transactional producer")?;
            producer
                .commit_transaction(TXN_TIMEOUT)
                .context("priming the bare transactional producer")?;
            Ok(producer)
        })
        .await
        .context("init_transactions task")??;
        let (rows, rx) = mpsc::channel::<Row>();
        let topic = topic.to_owned();
        let handle = std::thread::Builder::new()
            .name("bench-txn-bare".into())
            .spawn(move || run(&producer, &topic, &rx))
            .context("starting the bare transactional producer's thread")?;
        Ok(Self { rows, handle })
    }

    /// Hands row `seq`'s record to the producer's thread (sent at once, or after the commit in
    /// flight).
    pub fn send(&self, seq: u64, key: String, value: String) {
        // The thread ended early only on an error, which `finish` returns.
        let _ = self.rows.send((seq, key, value));
    }

    /// Commits what is open and returns the measurements (a failure of the producer is in
    /// [`TxnBareOut::error`]).
    ///
    /// # Errors
    /// The thread panicked.
    pub async fn finish(self) -> Result<TxnBareOut> {
        drop(self.rows);
        tokio::task::spawn_blocking(move || {
            self.handle
                .join()
                .map_err(|_| anyhow::anyhow!("the bare transactional producer panicked"))?
        })
        .await
        .context("joining the bare transactional producer")?
    }
}

/// The thread: waits for a row, begins a transaction, sends it and every row already waiting,
/// commits; until the sender is dropped or the producer fails (then it aborts what is open and
/// says why in the result).
fn run(
    producer: &BaseProducer<Timed>,
    topic: &str,
    rx: &mpsc::Receiver<Row>,
) -> Result<TxnBareOut> {
    let mut out = TxnBareOut::default();
    if let Err(e) = transactions(producer, topic, rx, &mut out) {
        // An open transaction would hold back its partitions' last stable offset until
        // transaction.timeout.ms. The abort flushes and only this thread serves the queue
        // (rdkafka's abort_transaction does not), so: purge what is queued, serve the reports
        // of what is in flight, then abort.
        producer.purge(PurgeConfig::default().queue());
        serve_until_acknowledged(producer);
        let _ = producer.abort_transaction(TXN_TIMEOUT);
        out.error = Some(format!("{e:#}"));
    }
    if let Ok(mut acked) = producer.context().acked.lock() {
        // Only rows whose transaction committed: an aborted one's records were acknowledged
        // but never visible.
        let committed = &out.committed_by_row;
        out.acked_by_row
            .extend(acked.drain(..).filter(|(s, _)| committed.contains_key(s)));
    }
    Ok(out)
}

/// [`run`]'s loop.
fn transactions(
    producer: &BaseProducer<Timed>,
    topic: &str,
    rx: &mpsc::Receiver<Row>,
    out: &mut TxnBareOut,
) -> Result<()> {
    loop {
        let first = match rx.recv_timeout(Duration::from_millis(20)) {
            Ok(row) => row,
            Err(RecvTimeoutError::Timeout) => {
                producer.poll(Duration::ZERO);
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => return Ok(()),
        };
        producer
            .begin_transaction()
            .context("the bare transactional producer's begin_transaction")?;
        let mut seqs = Vec::new();
        for (seq, key, value) in std::iter::once(first).chain(rx.try_iter()) {
            let record = BaseRecord::with_opaque_to(topic, Box::new((seq, now_micros())))
                .key(key.as_bytes())
                .payload(value.as_bytes());
            send_waiting(producer, record).context("bare transactional producer")?;
            seqs.push(seq);
        }
        // Served here until every record is acknowledged, as the relay does: rdkafka's
        // commit_transaction flushes first, polling in steps of 100 ms, which would add up to
        // 100 ms to every commit for no reason of the broker's.
        serve_until_acknowledged(producer);
        let failed = producer.context().failed.swap(0, Ordering::Relaxed);
        if failed > 0 {
            bail!("{failed} records of the bare transactional producer were not delivered");
        }
        producer
            .commit_transaction(TXN_TIMEOUT)
            .context("the bare transactional producer's commit_transaction")?;
        let committed = now_micros();
        out.committed_by_row
            .extend(seqs.into_iter().map(|s| (s, committed)));
    }
}

/// Serves the producer's queue until nothing is in flight (or [`TXN_TIMEOUT`]). `poll` with a
/// timeout serves until the timeout passes, so: no timeout, and a short sleep between.
fn serve_until_acknowledged(producer: &BaseProducer<Timed>) {
    let until = Instant::now() + TXN_TIMEOUT;
    while producer.in_flight_count() > 0 && Instant::now() < until {
        producer.poll(Duration::ZERO);
        std::thread::sleep(Duration::from_micros(100));
    }
}
