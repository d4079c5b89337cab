//! The exactly-once limit of the latency budget: a bare transactional producer that commits as
//! the relay does (group commit: the records that arrived while a commit was in flight go into
//! the next transaction, committed as soon as they are sent), so that an exactly-once relay's
//! visibility can be split into what one transactional producer costs on this broker and what
//! the relay adds.
//!
//! Why the relay cannot overlap its commits with sends: librdkafka refuses `produce` while a
//! transaction is committing (`rd_kafka_txn_may_enq_msg` is false from `commit_transaction`
//! until it returns; librdkafka `INTRODUCTION.md`, "Transactional Producer"), and a second
//! producer would have a `transactional.id` of its own, which fencing cannot tie to the same
//! checkpoint. This producer has the same constraint, so it is the bound.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Context, Result};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::ClientContext;

use crate::kafka::{producer_config, send_waiting};
use crate::workload::now_micros;

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
    /// Transactions committed.
    pub transactions: u64,
    /// Records not delivered.
    pub failed: u64,
}

/// Delivery reports: the row and its send time travel as the record's opaque.
#[derive(Default)]
struct Timed {
    acked: Mutex<Vec<(u64, i64)>>,
    failed: AtomicU64,
}

impl ClientContext for Timed {}

impl ProducerContext for Timed {
    type DeliveryOpaque = Box<(u64, i64)>;
    fn delivery(&self, r: &DeliveryResult<'_>, sent: Box<(u64, i64)>) {
        let (seq, at) = *sent;
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
    /// `init_transactions` and starts its thread, which sends each row given to
    /// [`TxnBare::send`] to `topic`.
    ///
    /// # Errors
    /// The producer cannot be created or `init_transactions` fails.
    pub async fn start(bootstrap: &str, topic: &str, id: &str) -> Result<Self> {
        let producer: BaseProducer<Timed> = producer_config(bootstrap)
            .set("transactional.id", id)
            .set("message.timeout.ms", "60000")
            .create_with_context(Timed::default())
            .context("creating the bare transactional producer")?;
        let producer = tokio::task::spawn_blocking(move || {
            producer
                .init_transactions(TXN_TIMEOUT)
                .map(|()| producer)
                .context("the bare transactional producer's init_transactions")
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

    /// Commits what is open and returns the measurements.
    ///
    /// # Errors
    /// A send, a commit or the thread failed.
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
/// commits; until the sender is dropped.
fn run(
    producer: &BaseProducer<Timed>,
    topic: &str,
    rx: &mpsc::Receiver<Row>,
) -> Result<TxnBareOut> {
    let mut out = TxnBareOut::default();
    loop {
        let first = match rx.recv_timeout(Duration::from_millis(20)) {
            Ok(row) => row,
            Err(RecvTimeoutError::Timeout) => {
                producer.poll(Duration::ZERO);
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => break,
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
        let flushed_by = std::time::Instant::now() + TXN_TIMEOUT;
        while producer.in_flight_count() > 0 && std::time::Instant::now() < flushed_by {
            producer.poll(Duration::from_millis(5));
        }
        producer
            .commit_transaction(TXN_TIMEOUT)
            .context("the bare transactional producer's commit_transaction")?;
        let committed = now_micros();
        out.transactions += 1;
        out.committed_by_row
            .extend(seqs.into_iter().map(|s| (s, committed)));
    }
    let ctx = producer.context();
    out.failed = ctx.failed.load(Ordering::Relaxed);
    if let Ok(mut acked) = ctx.acked.lock() {
        out.acked_by_row.extend(acked.drain(..));
    }
    Ok(out)
}
