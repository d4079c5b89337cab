//! Reading back the first acknowledged record of every partition new to this process, before
//! the checkpoint may pass it.
//!
//! Why: an acknowledgement is the broker's word that the record is in the log, and the relay's
//! checkpoint moves on that word. The one place where that word has been seen wrong is a
//! partition the producer had just learnt about: the first record of a topic the broker
//! auto-created at that moment was acknowledged and then missing (docs/src/limitations.md, "A loss
//! seen once"). The broker names a partition's leader before the leader has created its log,
//! and librdkafka's idempotence state of a fresh partition has had defects of its own
//! (librdkafka #3712). So the first acknowledgement per (topic, partition) in a process is
//! proven by reading the record at its offset with a `read_uncommitted` consumer; one that is
//! not there fails the run, which then resends everything after its checkpoint. Later records
//! of a proven partition are trusted as usual: the idempotent producer keeps them gapless and
//! in order behind it.
//!
//! The reads run on a thread of their own (rdkafka's blocking consumer), one partition at a
//! time; their results wake the acknowledgement queue. A principal without Read on a topic
//! cannot prove anything there: the partition is then trusted with a warning (once per topic),
//! as before this check existed.

use std::collections::HashSet;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::Notify;

use outbox_relay_core::config::KafkaConfig;
use outbox_relay_core::observe::metrics::Metrics;

/// Longest wait for one record to be read back before it counts as not stored.
const READ_TIMEOUT: Duration = Duration::from_secs(15);

/// Longest wait for the metadata of a read-back's topic (see [`read_back`]).
const LEADER_QUERY_TIMEOUT: Duration = Duration::from_secs(5);

/// One read-back: the record acknowledged at (`topic`, `partition`, `offset`), entry `seq` of
/// the acknowledgement queue.
#[derive(Debug, Clone)]
pub struct ReadBackRequest {
    /// Sequence number of the acknowledgement queue's entry.
    pub seq: u64,
    /// Topic.
    pub topic: Arc<str>,
    /// Partition.
    pub partition: i32,
    /// Acknowledged offset.
    pub offset: i64,
}

/// What a read-back found: `Ok` (the record is at its offset, or the partition cannot be read
/// by this principal) or `Err` with why it counts as not stored.
pub type ReadBackResult = (ReadBackRequest, Result<(), String>);

/// The read-back thread and the partitions already proven in this process. Shared by the runs
/// of one process (the proven set outlives a run).
pub struct ReadBack {
    proven: Mutex<HashSet<(Arc<str>, i32)>>,
    requests: Mutex<mpsc::Sender<ReadBackRequest>>,
    results: Arc<Mutex<Vec<ReadBackResult>>>,
    ready: Arc<Notify>,
}

impl std::fmt::Debug for ReadBack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadBack").finish_non_exhaustive()
    }
}

impl ReadBack {
    /// Starts the read-back thread with a consumer on `kafka`'s brokers (the user's client
    /// properties, TLS and SASL included), counting its verdicts in `metrics`.
    pub fn start(kafka: &KafkaConfig, metrics: Arc<Metrics>) -> Self {
        let (tx, rx) = mpsc::channel::<ReadBackRequest>();
        let results = Arc::new(Mutex::new(Vec::new()));
        let ready = Arc::new(Notify::new());
        let mut config = super::transactional::consumer_config(kafka);
        config
            .set("group.id", "outbox-relay-read-back")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("isolation.level", "read_uncommitted")
            .set("allow.auto.create.topics", "false")
            .set("enable.partition.eof", "true")
            // Before the log start: the end, so the watermarks decide (see `read_back`).
            .set("auto.offset.reset", "latest")
            .set("fetch.wait.max.ms", "50");
        let (out, wake) = (Arc::clone(&results), Arc::clone(&ready));
        let context = super::LogContext(crate::kafka_log::KafkaLog::of(&kafka.bootstrap_servers));
        let spawned = std::thread::Builder::new()
            .name("outbox-read-back".into())
            .spawn(move || {
                let consumer: Option<BaseConsumer<super::LogContext>> =
                    match config.create_with_context(context) {
                        Ok(c) => Some(c),
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot create the read-back consumer: \
                            first acknowledgements of new partitions are trusted unread");
                            None
                        }
                    };
                let mut unreadable: HashSet<Arc<str>> = HashSet::new();
                while let Ok(request) = rx.recv() {
                    let verdict = match &consumer {
                        Some(c) if !unreadable.contains(&request.topic) => {
                            let verdict = read_back(c, &request, &mut unreadable);
                            metrics.read_back(verdict.is_ok());
                            verdict
                        }
                        _ => Ok(()),
                    };
                    if let Ok(mut out) = out.lock() {
                        out.push((request, verdict));
                    }
                    wake.notify_one();
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the read-back thread: first \
                acknowledgements of new partitions are trusted unread");
        }
        Self {
            proven: Mutex::new(HashSet::new()),
            requests: Mutex::new(tx),
            results,
            ready,
        }
    }

    /// Whether the first acknowledgement on (`topic`, `partition`) is still to be proven; the
    /// partition then counts as proven from now on (its later records ride behind this one).
    pub fn needs_proof(&self, topic: &Arc<str>, partition: i32) -> bool {
        match self.proven.lock() {
            Ok(mut proven) => proven.insert((Arc::clone(topic), partition)),
            Err(_) => false,
        }
    }

    /// Forgets that (`topic`, `partition`) was proven: its read-back failed, so the next run's
    /// first acknowledgement there is read back again.
    pub fn forget(&self, topic: &Arc<str>, partition: i32) {
        if let Ok(mut proven) = self.proven.lock() {
            proven.remove(&(Arc::clone(topic), partition));
        }
    }

    /// Asks for `request` to be read back; its result comes through [`ReadBack::take`].
    pub fn request(&self, request: ReadBackRequest) {
        let sent = self.requests.lock().map(|tx| tx.send(request.clone()));
        if !matches!(sent, Ok(Ok(()))) {
            // The thread is gone: nothing can be proven, so nothing is held back.
            if let Ok(mut out) = self.results.lock() {
                out.push((request, Ok(())));
            }
            self.ready.notify_one();
        }
    }

    /// The results that arrived, moved into `into`.
    pub fn take(&self, into: &mut Vec<ReadBackResult>) {
        if let Ok(mut out) = self.results.lock() {
            into.append(&mut out);
        }
    }

    /// Resolves when a result may have arrived since the last call.
    pub async fn ready(&self) {
        self.ready.notified().await;
    }
}

/// Reads the record at `request`'s offset. `Ok` when it is there (or the topic cannot be read
/// by this principal: then `unreadable` learns the topic); `Err` naming what was found instead.
fn read_back(
    consumer: &BaseConsumer<super::LogContext>,
    request: &ReadBackRequest,
    unreadable: &mut HashSet<Arc<str>>,
) -> Result<(), String> {
    let started = Instant::now();
    let mut tpl = TopicPartitionList::new();
    let assigned = tpl
        .add_partition_offset(
            &request.topic,
            request.partition,
            Offset::Offset(request.offset),
        )
        .and_then(|()| consumer.assign(&tpl));
    if let Err(e) = assigned {
        return Err(format!("the read-back consumer could not be assigned: {e}"));
    }
    // The partition's leader, asked for now: librdkafka otherwise looks up the leader of a
    // topic new to this consumer at its next periodic scan, up to a second later, and the
    // acknowledgement queue waits behind this record all that time (issue 30: 0.8 s of a
    // 4-5 s drain, the window full and the machine idle). Only a hint: on an error the poll
    // below waits for the scan as before.
    if let Err(e) = consumer.fetch_metadata(Some(&request.topic), LEADER_QUERY_TIMEOUT) {
        tracing::debug!(topic = %request.topic, error = %e, "read-back: no metadata yet");
    }
    let verdict = loop {
        if started.elapsed() > READ_TIMEOUT {
            break Err(format!(
                "no record at that offset within {} s",
                READ_TIMEOUT.as_secs()
            ));
        }
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Ok(m)) if m.partition() != request.partition || *m.topic() != *request.topic => {}
            Some(Ok(m)) if m.offset() == request.offset => break Ok(()),
            Some(Ok(m)) if m.offset() > request.offset => {
                break Err(format!(
                    "the log holds offset {} next, not {}",
                    m.offset(),
                    request.offset
                ))
            }
            Some(Ok(_)) => {}
            Some(Err(KafkaError::PartitionEOF(_))) => {
                break Err("the partition ends before that offset".to_owned())
            }
            Some(Err(e)) if is_not_authorized(&e) => {
                tracing::warn!(topic = %request.topic, error = %e,
                    "the relay may not read this topic, so its first acknowledgement is trusted \
                     without being read back; grant the relay's principal Read on it to have \
                     it proven");
                unreadable.insert(Arc::clone(&request.topic));
                break Ok(());
            }
            Some(Err(e)) => {
                tracing::debug!(error = %e, "read-back consumer error");
            }
        }
    };
    let _ = consumer.unassign();
    // Deleted since (retention, DeleteRecords) is stored all the same.
    let verdict = verdict.or_else(|why| {
        match consumer.fetch_watermarks(&request.topic, request.partition, READ_TIMEOUT) {
            Ok((low, _)) if low > request.offset => Ok(()),
            _ => Err(why),
        }
    });
    tracing::debug!(topic = %request.topic, partition = request.partition,
        offset = request.offset, ms = started.elapsed().as_millis() as u64,
        stored = verdict.is_ok(), "read back");
    verdict
}

fn is_not_authorized(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::GroupAuthorizationFailed
                | RDKafkaErrorCode::ClusterAuthorizationFailed
        )
    )
}
