//! The exactly-once sink (`kafka.delivery = "exactly_once"`): a transactional producer that
//! writes the connector's resume point to the progress topic inside the Kafka transaction of the
//! records it covers (KIP-98, librdkafka "Transactional Producer", `INTRODUCTION.md`).
//!
//! A consumer reading with `isolation.level=read_committed` sees a record only once its
//! transaction committed, and then the progress record saying the relay is past it committed
//! with it. A crash before the commit aborts both (the broker aborts what the next
//! `InitProducerId` of the same `transactional.id` finds open, or what outlives
//! `transaction.timeout.ms`); the next run resumes from the progress topic's last committed
//! point, so nothing is visible twice.
//!
//! The transaction is begun by the first record after a commit and committed by
//! [`RecordSink::commit`], which the pipeline calls with nothing in flight.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use serde_json::{json, Value};

use super::{
    admin_client_config, record_size, DeadLetter, Deliveries, FatalCause, KafkaSink,
    RelayKafkaContext, SendError,
};
use crate::config::RelayConfig;
use crate::error::RelayError;
use crate::kafka::route::KafkaRecord;
use crate::kafka::sink::record_sink::RecordSink;
use crate::observe::metrics;
use crate::position::BinlogPosition;
use crate::state::checkpoint::Checkpoint;

/// Producer properties a consumer ignores with a warning (librdkafka `CONFIGURATION.md`, "P").
const PRODUCER_ONLY: [&str; 16] = [
    "linger.ms",
    "queue.buffering.max.ms",
    "queue.buffering.max.messages",
    "queue.buffering.max.kbytes",
    "batch.num.messages",
    "batch.size",
    "compression.type",
    "compression.codec",
    "compression.level",
    "message.timeout.ms",
    "delivery.timeout.ms",
    "request.timeout.ms",
    "retries",
    "message.send.max.retries",
    "sticky.partitioning.linger.ms",
    "queuing.strategy",
];

/// The delivery-report sequence number of progress records: never one of the pipeline's.
const PROGRESS_SEQ: usize = usize::MAX;

/// Longest wait for the progress topic's metadata, its creation, or reading it to its end.
const PROGRESS_READ_TIMEOUT: Duration = Duration::from_secs(60);

/// The open transaction.
#[derive(Debug, Default)]
struct Open {
    /// When it was begun; `None`: no transaction is open.
    since: Option<Instant>,
    records: u64,
    bytes: u64,
}

/// The transactional producer of one run (see the module documentation).
pub struct TransactionalSink {
    inner: KafkaSink,
    transactional_id: String,
    connector: String,
    progress_topic: String,
    max_records: u64,
    max_bytes: u64,
    /// Longest a transaction stays open before it counts as full: a quarter of
    /// `kafka.transaction_timeout_ms`, so a source transaction that takes longer to relay than
    /// the timeout is committed in parts instead of aborted by the coordinator (and retried,
    /// aborted again, forever).
    max_open: Duration,
    /// Longest wait for `init_transactions`, `commit_transaction`, `abort_transaction`.
    op_timeout: Duration,
    open: Mutex<Open>,
}

impl TransactionalSink {
    /// Creates the transactional producer of `config`, makes sure the progress topic exists
    /// and calls `init_transactions`, which fences any older producer with the same
    /// `transactional.id` and completes or aborts its open transaction.
    ///
    /// # Errors
    /// [`RelayError::Kafka`] when no broker answers or the transaction coordinator cannot be
    /// reached in time; [`RelayError::Config`] when the broker refuses transactions for this
    /// `transactional.id` (no `TransactionalId` ACL) or the producer configuration is invalid.
    pub async fn start(config: &RelayConfig) -> Result<Self, RelayError> {
        let k = &config.kafka;
        let transactional_id = k.transactional_id_for(&config.connector_name);
        let dead_letter = config
            .dead_letter
            .enabled
            .then(|| config.dead_letter.topic.clone());
        // librdkafka requires message.timeout.ms <= transaction.timeout.ms: a record may not
        // outlive the transaction holding it.
        let message_timeout = k
            .properties
            .get("message.timeout.ms")
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(k.transaction_timeout_ms, |t| {
                t.min(k.transaction_timeout_ms)
            });
        let inner = KafkaSink::with_properties(
            k,
            dead_letter,
            &[
                ("transactional.id", transactional_id.clone()),
                (
                    "transaction.timeout.ms",
                    k.transaction_timeout_ms.to_string(),
                ),
                ("message.timeout.ms", message_timeout.to_string()),
                // A transaction's failed batch makes it abortable, never a gap: the gapless
                // guarantee is the idempotent producer's and does not apply here.
                ("enable.gapless.guarantee", "false".into()),
            ],
        )?;
        inner
            .check_reachable(&k.bootstrap_servers, Duration::from_secs(10))
            .await?;
        ensure_progress_topic(config).await?;
        metrics::global()
            .set_transaction_stall(Duration::from_millis(k.transaction_timeout_ms / 2));
        let sink = Self {
            inner,
            transactional_id,
            connector: config.connector_name.clone(),
            progress_topic: k.progress_topic.clone(),
            max_records: k.transaction_max_records,
            max_bytes: k.transaction_max_bytes,
            max_open: Duration::from_millis(k.transaction_timeout_ms / 4),
            op_timeout: Duration::from_millis(k.transaction_timeout_ms.max(10_000)),
            open: Mutex::new(Open::default()),
        };
        let timeout = sink.op_timeout;
        sink.blocking(move |p| p.init_transactions(timeout))
            .await
            .map_err(|e| sink.transaction_error("initializing transactions", &e))?;
        tracing::info!(transactional_id = %sink.transactional_id, progress_topic = %sink.progress_topic,
            "exactly-once: transactional producer ready");
        Ok(sink)
    }

    /// The connector's last committed resume point in the progress topic, read to its end with
    /// `read_committed`; `None` when the topic has none (the first exactly-once start).
    ///
    /// # Errors
    /// [`RelayError::Kafka`] when the topic cannot be read to its end within 60 s;
    /// [`RelayError::Binlog`] when the connector's record cannot be read as a resume point.
    pub async fn committed_point(
        &self,
        config: &RelayConfig,
    ) -> Result<Option<Checkpoint>, RelayError> {
        let config = config.clone();
        let connector = self.connector.clone();
        let topic = self.progress_topic.clone();
        tokio::task::spawn_blocking(move || read_progress(&config, &topic, &connector))
            .await
            .map_err(|e| RelayError::Kafka(format!("progress reader task failed: {e}")))?
    }

    /// The readiness probe of this producer (see [`KafkaSink::probe`]).
    pub fn probe(&self) -> super::KafkaProbe {
        self.inner.probe()
    }

    /// The monitor of the last stable offsets of the topics this producer writes (the progress
    /// topic included): run it beside the pipeline.
    pub fn lso_monitor(&self, kafka: &crate::config::KafkaConfig) -> super::LsoMonitor {
        super::LsoMonitor::new(
            Arc::clone(&self.inner.ready_topics),
            self.progress_topic.clone(),
            kafka,
        )
    }

    /// The `transactional.id` of this producer.
    pub fn transactional_id(&self) -> &str {
        &self.transactional_id
    }

    /// Runs a blocking librdkafka call on a blocking thread while serving the producer's queue
    /// here (delivery reports must be served for `commit_transaction`'s flush to end).
    async fn blocking<T: Send + 'static>(
        &self,
        call: impl FnOnce(&BaseProducer<RelayKafkaContext>) -> Result<T, KafkaError> + Send + 'static,
    ) -> Result<T, KafkaError> {
        let producer = Arc::clone(&self.inner.producer);
        let mut task = tokio::task::spawn_blocking(move || call(&producer.producer));
        loop {
            tokio::select! {
                done = &mut task => {
                    // A panicked or cancelled task: no outcome to report but "not done".
                    return done.unwrap_or(Err(KafkaError::Canceled));
                }
                () = self.inner.events() => self.inner.serve(),
            }
        }
    }

    /// The error for a failed transactional call: fenced (another producer took this
    /// `transactional.id`): not retried; not authorized: a configuration error; anything else:
    /// [`RelayError::Kafka`], retried from the last committed point.
    fn transaction_error(&self, what: &str, e: &KafkaError) -> RelayError {
        let code = e.rdkafka_error_code();
        let id = &self.transactional_id;
        match code {
            Some(
                RDKafkaErrorCode::ProducerFenced
                | RDKafkaErrorCode::Fenced
                | RDKafkaErrorCode::InvalidProducerEpoch,
            ) => fenced(Some(id), &e.to_string()),
            Some(
                RDKafkaErrorCode::TransactionalIdAuthorizationFailed
                | RDKafkaErrorCode::ClusterAuthorizationFailed,
            ) => RelayError::Config(format!(
                "{what}: the brokers refuse transactions for transactional.id {id:?} ({e}). Fix: \
                 grant the relay's principal WRITE and DESCRIBE on TransactionalId {id} (and \
                 IdempotentWrite on the cluster), or set kafka.delivery = \"at_least_once\""
            )),
            _ => RelayError::Kafka(format!(
                "{what} (transactional.id {id}): {e}; the records since the last commit are \
                 not visible to read_committed consumers and are sent again from the last \
                 committed resume point"
            )),
        }
    }

    /// Begins a transaction unless one is open.
    fn begin(&self) -> Result<(), SendError> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.since.is_some() {
            return Ok(());
        }
        self.inner
            .producer
            .producer
            .begin_transaction()
            .map_err(|e| {
                SendError::Failed(self.transaction_error("beginning a transaction", &e))
            })?;
        *open = Open {
            since: Some(Instant::now()),
            records: 0,
            bytes: 0,
        };
        metrics::global().transaction_opened();
        Ok(())
    }

    fn count(&self, bytes: usize) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.records += 1;
        open.bytes += bytes as u64;
    }

    /// Ends the open transaction's bookkeeping; returns its age and record count.
    fn close(&self) -> (Duration, u64) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let closed = std::mem::take(&mut *open);
        metrics::global().transaction_closed();
        (
            closed.since.map_or(Duration::ZERO, |s| s.elapsed()),
            closed.records,
        )
    }

    /// Enqueues the progress record of `point`, waiting for room in librdkafka's queue.
    async fn send_progress(&self, point: &Checkpoint) -> Result<(), RelayError> {
        let value = encode_progress(&self.connector, point);
        let deadline = Instant::now() + self.op_timeout;
        loop {
            let record = BaseRecord::<'_, [u8], [u8], usize>::with_opaque_to(
                &self.progress_topic,
                PROGRESS_SEQ,
            )
            .key(self.connector.as_bytes())
            .payload(value.as_slice());
            match self.inner.producer.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _))
                    if Instant::now() < deadline =>
                {
                    self.inner.serve();
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err((e, _)) => {
                    return Err(self.transaction_error("sending the resume point", &e));
                }
            }
        }
    }
}

/// The error of a producer fenced by a newer one with the same `transactional.id`.
pub fn fenced(id: Option<&str>, detail: &str) -> RelayError {
    let id = id.map_or_else(
        || "this connector's transactional.id".to_owned(),
        |id| format!("transactional.id {id:?}"),
    );
    RelayError::Fenced(format!(
        "the transactional producer was fenced ({detail}): another producer started with \
         {id}. If another instance of this connector took over, this one waits for the \
         connector's lease; if another connector uses the same kafka.transactional_id, this \
         one stops: give each connector its own"
    ))
}

impl RecordSink for TransactionalSink {
    fn deliveries(&self) -> &Arc<Deliveries> {
        self.inner.deliveries()
    }
    fn serve(&self) {
        self.inner.serve();
    }
    fn events(&self) -> impl std::future::Future<Output = ()> + Send {
        self.inner.events()
    }
    fn fatal(&self) -> Option<(FatalCause, String)> {
        let (code, reason) = self.inner.producer.producer.client().fatal_error()?;
        let cause = match code {
            RDKafkaErrorCode::ProducerFenced
            | RDKafkaErrorCode::Fenced
            | RDKafkaErrorCode::InvalidProducerEpoch => FatalCause::Fenced,
            _ => FatalCause::Transient,
        };
        Some((cause, format!("{code}: {reason}")))
    }
    fn has_dead_letter(&self) -> bool {
        self.inner.has_dead_letter()
    }
    fn ensure_topic(
        &self,
        topic: &str,
    ) -> impl std::future::Future<Output = Result<(), RelayError>> + Send {
        self.inner.ensure_topic(topic)
    }
    fn ensure_dead_letter_topic(
        &self,
    ) -> impl std::future::Future<Output = Result<(), RelayError>> + Send {
        self.inner.ensure_dead_letter_topic()
    }
    fn recheck_topic_limit(
        &self,
        record: &KafkaRecord,
    ) -> impl std::future::Future<Output = bool> + Send {
        self.inner.recheck_topic_limit(record)
    }
    fn send(&self, record: &KafkaRecord, seq: u64) -> Result<(), SendError> {
        self.begin()?;
        self.inner.send(record, seq)?;
        self.count(record_size(
            &record.key,
            record.value.as_deref(),
            &record.headers,
        ));
        Ok(())
    }
    fn send_dead_letter(&self, dl: &DeadLetter, seq: u64) -> Result<(), SendError> {
        self.begin()?;
        self.inner.send_dead_letter(dl, seq)?;
        self.count(record_size(
            dl.key.as_deref().unwrap_or_default(),
            dl.value.as_deref(),
            &dl.headers,
        ));
        Ok(())
    }
    fn transactional(&self) -> bool {
        true
    }
    fn transaction_full(&self) -> bool {
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.records >= self.max_records
            || open.bytes >= self.max_bytes
            || open.since.is_some_and(|t| t.elapsed() >= self.max_open)
    }
    fn transaction_open(&self) -> bool {
        self.open.lock().map(|o| o.since.is_some()).unwrap_or(true)
    }
    async fn commit(&self, point: &Checkpoint) -> Result<(), RelayError> {
        self.begin().map_err(|e| match e {
            SendError::Failed(e) => e,
            other => RelayError::Kafka(format!("beginning a transaction: {other:?}")),
        })?;
        if let Err(e) = self.send_progress(point).await {
            self.abort().await;
            return Err(e);
        }
        // Wait for the progress record's acknowledgement here, serving the queue: rdkafka's
        // commit_transaction flushes first, and its flush polls the queue in steps of 100 ms,
        // which this task's serving empties under it, so every commit waited 100 ms for nothing.
        let started = Instant::now();
        let flushed_by = started + self.op_timeout;
        while self.inner.producer.producer.in_flight_count() > 0 && Instant::now() < flushed_by {
            tokio::select! {
                () = self.inner.events() => {}
                () = tokio::time::sleep(Duration::from_millis(5)) => {}
            }
            self.inner.serve();
        }
        let flushed = started.elapsed();
        let timeout = self.op_timeout;
        match self.blocking(move |p| p.commit_transaction(timeout)).await {
            Ok(()) => {
                let (age, records) = self.close();
                metrics::global().transaction_committed(age, records, started.elapsed());
                tracing::debug!(records, age_ms = age.as_millis() as u64,
                    flush_ms = flushed.as_millis() as u64,
                    end_ms = (started.elapsed() - flushed).as_millis() as u64, position = %point.position,
                    rows_acked = point.rows_acked, "transaction committed");
                Ok(())
            }
            Err(e) => {
                let error = self.transaction_error("committing the transaction", &e);
                let abortable = matches!(&e, KafkaError::Transaction(t) if t.txn_requires_abort());
                if abortable {
                    self.abort().await;
                } else {
                    // A timed-out commit may still complete on the coordinator: the next
                    // producer's InitProducerId finishes or aborts it, and the next run reads
                    // the progress topic to learn which.
                    tracing::warn!(error = %e, "the transaction's outcome is unknown (its commit \
                        did not complete); the next producer of this transactional.id completes \
                        or aborts it, and the relay resumes from the progress topic's last \
                        committed point");
                    self.close();
                    metrics::global().transaction_aborted();
                }
                Err(error)
            }
        }
    }
    async fn abort(&self) {
        if !self.transaction_open() {
            return;
        }
        let timeout = self.op_timeout;
        let result = self.blocking(move |p| p.abort_transaction(timeout)).await;
        self.close();
        metrics::global().transaction_aborted();
        match result {
            Ok(()) => tracing::info!(
                "transaction aborted: its records are not visible to \
                read_committed consumers and are sent again from the last committed point"
            ),
            // The next producer's init_transactions aborts it (or the broker, after
            // transaction.timeout.ms).
            Err(e) => tracing::warn!(error = %e, "aborting the transaction failed; the next \
                producer of this transactional.id aborts it"),
        }
    }
}

/// Creates the progress topic when it is missing: one partition (one record per connector,
/// read whole at start-up), `cleanup.policy=compact`, the brokers' default replication.
async fn ensure_progress_topic(config: &RelayConfig) -> Result<(), RelayError> {
    let topic = config.kafka.progress_topic.clone();
    let client = admin_client_config(&config.kafka);
    let admin: AdminClient<DefaultClientContext> =
        tokio::task::spawn_blocking(move || client.create())
            .await
            .map_err(|e| RelayError::Kafka(format!("admin client task failed: {e}")))?
            .map_err(|e| RelayError::Kafka(format!("creating an admin client: {e}")))?;
    // Compaction only reaches rolled segments: 16 MiB segments (or an hour) keep the records
    // a start-up may have to read few, even at one commit every few milliseconds.
    let new = NewTopic::new(&topic, 1, TopicReplication::Fixed(-1))
        .set("cleanup.policy", "compact")
        .set("segment.bytes", "16777216")
        .set("segment.ms", "3600000");
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results = crate::error::with_timeout(
        PROGRESS_READ_TIMEOUT,
        "creating the progress topic",
        admin.create_topics([&new], &options),
    )
    .await?
    .map_err(|e| RelayError::Kafka(format!("creating the progress topic {topic}: {e}")))?;
    for result in results {
        match result {
            Ok(_) => tracing::info!(
                topic,
                "created the progress topic (compacted, 1 partition, 16 MiB segments)"
            ),
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((
                _,
                RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::ClusterAuthorizationFailed,
            )) => {
                return Err(RelayError::Config(format!(
                    "the progress topic {topic} does not exist and the relay may not create it. \
                     Fix: create it (cleanup.policy=compact, 1 partition, replication factor 3) \
                     and grant the relay READ, WRITE and DESCRIBE on it"
                )));
            }
            Err((_, code)) => {
                return Err(RelayError::Kafka(format!(
                    "creating the progress topic {topic}: {code}"
                )))
            }
        }
    }
    Ok(())
}

/// The progress record of `point` for `connector`: JSON with the binlog position, the rows of
/// the next transaction already committed, the GTID set, the server identity, the layouts and
/// the commit time (ms since the epoch).
pub fn encode_progress(connector: &str, point: &Checkpoint) -> Vec<u8> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    json!({
        "connector": connector,
        "binlog_file": point.position.file,
        "binlog_pos": point.position.pos,
        "rows_acked": point.rows_acked,
        "gtid_set": point.gtid_set,
        "source_server_id": point.source_server_id,
        "source_server_uuid": point.source_server_uuid,
        "table_layouts": point.table_layouts.as_deref(),
        "committed_at_ms": now,
    })
    .to_string()
    .into_bytes()
}

/// The resume point of a progress record (see [`encode_progress`]).
///
/// # Errors
/// [`RelayError::Binlog`] naming the field that is missing or of the wrong type.
pub fn decode_progress(value: &[u8]) -> Result<Checkpoint, RelayError> {
    let bad = |what: &str| {
        RelayError::Binlog(format!(
            "the progress record is not a resume point ({what}); fix or delete the record \
             (a tombstone for the connector's key) and reset the connector"
        ))
    };
    let v: Value = serde_json::from_slice(value).map_err(|e| bad(&format!("not JSON: {e}")))?;
    let text = |key: &str| v.get(key).and_then(Value::as_str).map(str::to_owned);
    let file = text("binlog_file").ok_or_else(|| bad("binlog_file"))?;
    let pos = v
        .get("binlog_pos")
        .and_then(Value::as_u64)
        .ok_or_else(|| bad("binlog_pos"))?;
    let rows_acked = v
        .get("rows_acked")
        .and_then(Value::as_u64)
        .ok_or_else(|| bad("rows_acked"))?;
    let source_server_id = v
        .get("source_server_id")
        .and_then(Value::as_u64)
        .and_then(|id| u32::try_from(id).ok())
        .ok_or_else(|| bad("source_server_id"))?;
    Ok(Checkpoint {
        position: BinlogPosition::new(file, pos),
        rows_acked,
        gtid_set: text("gtid_set"),
        source_server_id,
        source_server_uuid: text("source_server_uuid"),
        table_layouts: text("table_layouts").map(Arc::from),
    })
}

/// A consumer configuration on the relay's brokers: the user's properties minus the producer's
/// own (librdkafka warns about each), and `bootstrap.servers`.
pub(crate) fn consumer_config(kafka: &crate::config::KafkaConfig) -> ClientConfig {
    let mut client = ClientConfig::new();
    for (key, value) in &kafka.properties {
        if !PRODUCER_ONLY.contains(&key.as_str()) {
            client.set(key, value);
        }
    }
    client.set("bootstrap.servers", &kafka.bootstrap_servers);
    client
}

/// Reads `topic` to its end with `read_committed` and returns `connector`'s last resume point.
/// "Its end" is the high watermark when reading starts: the read waits for transactions still
/// open below it (another connector's) to end, so a committed point after them is not missed.
///
/// The last [`PROGRESS_TAIL`] offsets of each partition are read first: the connector's last
/// point is almost always there (one per commit), and the compacted topic's active segment is
/// only compacted once it rolls, so reading from the beginning could read every commit of the
/// last segment. Only when the tail has no record of the connector is the partition read from
/// its beginning.
fn read_progress(
    config: &RelayConfig,
    topic: &str,
    connector: &str,
) -> Result<Option<Checkpoint>, RelayError> {
    let consumer = |isolation: &str| -> Result<BaseConsumer, RelayError> {
        let mut client = consumer_config(&config.kafka);
        client
            .set(
                "group.id",
                format!("outbox-relay.progress-reader.{connector}"),
            )
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "false")
            // The broker answers a fetch at the end at once instead of after 500 ms.
            .set("fetch.wait.max.ms", "10")
            .set("isolation.level", isolation);
        client
            .create()
            .map_err(|e| RelayError::Kafka(format!("creating the progress reader: {e}")))
    };
    let t0 = Instant::now();
    let reader = consumer("read_committed")?;
    let watermarks = consumer("read_uncommitted")?;
    let metadata = reader
        .fetch_metadata(Some(topic), PROGRESS_READ_TIMEOUT)
        .map_err(|e| RelayError::Kafka(format!("reading the progress topic's metadata: {e}")))?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    // (partition, low, high) of each partition that holds records.
    let mut ranges = Vec::new();
    for p in partitions {
        let (low, high) = watermarks
            .fetch_watermarks(topic, p, PROGRESS_READ_TIMEOUT)
            .map_err(|e| RelayError::Kafka(format!("reading the progress topic's offsets: {e}")))?;
        if high > low {
            ranges.push((p, low, high));
        }
    }
    let deadline = Instant::now() + PROGRESS_READ_TIMEOUT;
    let mut last = None;
    for (p, low, high) in ranges {
        let tail = (high - PROGRESS_TAIL).max(low);
        let mut found = read_partition(&reader, topic, p, tail, high, connector, deadline)?;
        if found.is_none() && tail > low {
            found = read_partition(&reader, topic, p, low, tail, connector, deadline)?;
        }
        last = found.or(last);
    }
    tracing::debug!(ms = t0.elapsed().as_millis() as u64, "progress topic read");
    // Closing consumers takes librdkafka ~100 ms: not on the start-up path.
    std::thread::spawn(move || drop((reader, watermarks)));
    last.map(|v| decode_progress(&v)).transpose()
}

/// How many offsets at the end of a progress partition are read first (see [`read_progress`]).
const PROGRESS_TAIL: i64 = 1000;

/// Reads partition `p` of `topic` from offset `from` until the reader's position reaches `end`
/// and returns the value of `connector`'s last record in that range.
fn read_partition(
    reader: &BaseConsumer,
    topic: &str,
    p: i32,
    from: i64,
    end: i64,
    connector: &str,
    deadline: Instant,
) -> Result<Option<Vec<u8>>, RelayError> {
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic, p, Offset::Offset(from))
        .map_err(|e| RelayError::Kafka(format!("assigning the progress topic: {e}")))?;
    reader
        .assign(&assignment)
        .map_err(|e| RelayError::Kafka(format!("assigning the progress topic: {e}")))?;
    let mut last = None;
    loop {
        let positions = reader
            .position()
            .map_err(|e| RelayError::Kafka(format!("reading the progress topic: {e}")))?;
        let done = positions
            .find_partition(topic, p)
            .and_then(|tp| tp.offset().to_raw())
            .is_some_and(|at| at >= end);
        if done {
            return Ok(last);
        }
        if Instant::now() > deadline {
            return Err(RelayError::Kafka(format!(
                "the progress topic {topic} could not be read to its end within {} s (a \
                 transaction holding back its last stable offset?)",
                PROGRESS_READ_TIMEOUT.as_secs()
            )));
        }
        // Short polls: the position passes a transaction marker (never delivered) only on a
        // fetch, and a long poll would wait for a record that is not coming.
        match reader.poll(Duration::from_millis(10)) {
            // Past `end` (a later commit of another connector): not part of this range.
            Some(Ok(m)) if m.offset() >= end => {}
            Some(Ok(m)) if m.key() == Some(connector.as_bytes()) => {
                last = m.payload().map(<[u8]>::to_vec);
            }
            Some(Ok(_)) | None => {}
            Some(Err(e)) => {
                return Err(RelayError::Kafka(format!(
                    "reading the progress topic: {e}"
                )));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_progress_record_gives_back_its_resume_point() {
        let point = Checkpoint {
            position: BinlogPosition::new("binlog.000007", 1234),
            rows_acked: 17,
            gtid_set: Some("3E11FA47-71CA-11E1-9E33-C80AA9429562:1-77".into()),
            source_server_id: 8,
            source_server_uuid: Some("3e11fa47-71ca-11e1-9e33-c80aa9429562".into()),
            table_layouts: Some(Arc::from("{\"shop.outbox\":[]}")),
        };
        let value = encode_progress("orders", &point);
        assert_eq!(decode_progress(&value).ok(), Some(point));
        let none = Checkpoint {
            gtid_set: None,
            source_server_uuid: None,
            table_layouts: None,
            ..decode_progress(&value).expect("decodes")
        };
        assert_eq!(
            decode_progress(&encode_progress("orders", &none)).ok(),
            Some(none)
        );
    }

    #[test]
    fn a_record_that_is_not_a_resume_point_is_named() {
        let Err(e) = decode_progress(br#"{"binlog_file":"b.1"}"#) else {
            panic!("decoded");
        };
        assert!(e.to_string().contains("binlog_pos"), "{e}");
        assert!(decode_progress(b"not json").is_err());
    }
}
