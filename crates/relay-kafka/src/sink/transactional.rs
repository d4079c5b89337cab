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

use super::{admin_client_config, record_size, KafkaSink, RelayKafkaContext};
use outbox_relay_core::config::RelayConfig;
use outbox_relay_core::error::RelayError;
use outbox_relay_core::observe::metrics::Metrics;
use outbox_relay_core::sink::{
    expired, fenced, DeadLetter, Deliveries, DeliveryMode, FatalCause, Record, RecordSink,
    SendError,
};
use outbox_relay_core::state::checkpoint::Checkpoint;
use outbox_relay_core::state::codec::{decode_progress, encode_progress};

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
    /// `kafka.transaction_interval_ms`: the longest a transaction stays open while rows flow
    /// ([`DeliveryMode::Committed`]).
    commit_interval: Duration,
    /// Longest wait for `init_transactions`, `commit_transaction`, `abort_transaction`.
    op_timeout: Duration,
    /// `kafka.transaction_timeout_ms`: the coordinator aborts a transaction open this long.
    transaction_timeout: Duration,
    open: Mutex<Open>,
    /// When the last transaction that has not ended well (committed or aborted) began, by the
    /// monotonic and the wall clock (a frozen VM may stop the first), or `None`. Unlike
    /// [`Open`] it outlives the failed commit or abort that reports a fencing, so the error can
    /// tell whether the transaction outlived `transaction.timeout.ms` (see [`Self::expired`]).
    unfinished: Mutex<Option<(Instant, SystemTime)>>,
    /// The point whose progress record [`RecordSink::prepare_commit`] enqueued into the open
    /// transaction (cleared when it ends).
    prepared: Mutex<Option<Checkpoint>>,
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
    ///
    /// `metrics`: the source's metrics (transactions, the last stable offsets).
    pub async fn start(config: &RelayConfig, metrics: Arc<Metrics>) -> Result<Self, RelayError> {
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
            Arc::clone(&metrics),
        )?;
        inner
            .check_reachable(&k.bootstrap_servers, Duration::from_secs(10))
            .await?;
        // A timeout over the brokers' limit: InitProducerId would be refused with
        // INVALID_TRANSACTION_TIMEOUT (a retriable-looking error librdkafka repeats); say which
        // setting and what limit now, when the brokers let the relay read their configuration.
        if let Some(max) = broker_transaction_max_timeout(k).await {
            if k.transaction_timeout_ms > max {
                return Err(transaction_timeout_too_long(
                    k.transaction_timeout_ms,
                    Some(max),
                ));
            }
        }
        ensure_progress_topic(config).await?;
        metrics.set_transaction_stall(Duration::from_millis(k.transaction_timeout_ms / 2));
        let sink = Self {
            inner,
            transactional_id,
            connector: config.connector_name.clone(),
            progress_topic: k.progress_topic.clone(),
            max_records: k.transaction_max_records,
            max_bytes: k.transaction_max_bytes,
            max_open: Duration::from_millis(k.transaction_timeout_ms / 4),
            commit_interval: Duration::from_millis(k.transaction_interval_ms),
            op_timeout: Duration::from_millis(k.transaction_timeout_ms.max(10_000)),
            transaction_timeout: Duration::from_millis(k.transaction_timeout_ms),
            open: Mutex::new(Open::default()),
            unfinished: Mutex::new(None),
            prepared: Mutex::new(None),
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
            .map_err(|e| RelayError::kafka(format!("progress reader task failed: {e}")))?
    }

    /// The readiness probe of this producer (see [`KafkaSink::probe`]).
    pub fn probe(&self) -> super::KafkaProbe {
        self.inner.probe()
    }

    /// The monitor of the last stable offsets of the topics this producer writes (the progress
    /// topic included): run it beside the pipeline.
    pub fn lso_monitor(&self, kafka: &outbox_relay_core::config::KafkaConfig) -> super::LsoMonitor {
        super::LsoMonitor::new(
            Arc::clone(&self.inner.ready_topics),
            self.progress_topic.clone(),
            kafka,
            Arc::clone(&self.inner.metrics),
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
            ) if self.expired() => expired(&format!("{what} (transactional.id {id}): {e}")),
            Some(
                RDKafkaErrorCode::ProducerFenced
                | RDKafkaErrorCode::Fenced
                | RDKafkaErrorCode::InvalidProducerEpoch,
            ) => fenced(Some(id), &e.to_string()),
            Some(RDKafkaErrorCode::InvalidTransactionTimeout) => {
                transaction_timeout_too_long(self.transaction_timeout.as_millis() as u64, None)
            }
            Some(
                RDKafkaErrorCode::TransactionalIdAuthorizationFailed
                | RDKafkaErrorCode::ClusterAuthorizationFailed,
            ) => RelayError::Config(format!(
                "{what}: the brokers refuse transactions for transactional.id {id:?} ({e}). Fix: \
                 grant the relay's principal WRITE and DESCRIBE on TransactionalId {id} (and \
                 IdempotentWrite on the cluster), or set kafka.delivery = \"at_least_once\""
            )),
            _ => RelayError::kafka(format!(
                "{what} (transactional.id {id}): {e}; the records since the last commit are \
                 not visible to read_committed consumers and are sent again from the last \
                 committed resume point"
            )),
        }
    }

    /// Whether the last transaction that did not end well began `transaction.timeout.ms` ago
    /// or more (by either clock): a fencing now is the coordinator's abort of this producer's
    /// own expired transaction (it bumps the epoch), not another producer.
    fn expired(&self) -> bool {
        let unfinished = *self.unfinished.lock().unwrap_or_else(|p| p.into_inner());
        unfinished.is_some_and(|(mono, wall)| {
            let wall = SystemTime::now().duration_since(wall).unwrap_or_default();
            mono.elapsed().max(wall) >= self.transaction_timeout
        })
    }

    /// The transaction ended well (committed or aborted): a later fencing is not its expiry.
    fn finished(&self) {
        *self.unfinished.lock().unwrap_or_else(|p| p.into_inner()) = None;
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
        *self.unfinished.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((Instant::now(), SystemTime::now()));
        self.inner.metrics.transaction_opened();
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
        *self.prepared.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.inner.metrics.transaction_closed();
        (
            closed.since.map_or(Duration::ZERO, |s| s.elapsed()),
            closed.records,
        )
    }

    /// Enqueues the progress record of `point`, waiting for room in librdkafka's queue.
    async fn send_progress(&self, point: &Checkpoint) -> Result<(), RelayError> {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let value = encode_progress(&self.connector, point, now_ms);
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

/// A resume point as [`RelayError::CommitUnknown`] names it: `file:pos (+rows_acked rows)`.
pub fn point_label(point: &Checkpoint) -> String {
    format!("{} (+{} rows)", point.position, point.rows_acked)
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
            | RDKafkaErrorCode::InvalidProducerEpoch
                if self.expired() =>
            {
                FatalCause::Expired
            }
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
    ) -> impl std::future::Future<Output = Result<bool, RelayError>> + Send {
        self.inner.ensure_topic(topic)
    }
    fn ensure_dead_letter_topic(
        &self,
    ) -> impl std::future::Future<Output = Result<(), RelayError>> + Send {
        self.inner.ensure_dead_letter_topic()
    }
    fn recheck_topic_limit(
        &self,
        record: &Record,
    ) -> impl std::future::Future<Output = bool> + Send {
        self.inner.recheck_topic_limit(record)
    }
    fn send(&self, record: &mut Record, seq: u64) -> Result<(), SendError> {
        self.begin()?;
        // Measured first: the producer takes the value.
        let size = record_size(&record.key, record.value.as_deref(), &record.headers);
        self.inner.send(record, seq)?;
        self.count(size);
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
    fn delivery_mode(&self) -> DeliveryMode {
        DeliveryMode::Committed {
            interval: self.commit_interval,
        }
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
    async fn prepare_commit(&self, point: &Checkpoint) -> Result<(), RelayError> {
        if !self.transaction_open() {
            return Ok(());
        }
        if let Err(e) = self.send_progress(point).await {
            self.abort().await;
            return Err(e);
        }
        *self.prepared.lock().unwrap_or_else(|p| p.into_inner()) = Some(point.clone());
        Ok(())
    }
    async fn commit(&self, point: &Checkpoint) -> Result<(), RelayError> {
        self.begin().map_err(|e| match e {
            SendError::Failed(e) => e,
            other => RelayError::kafka(format!("beginning a transaction: {other:?}")),
        })?;
        let prepared = self
            .prepared
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if prepared.as_ref() != Some(point) {
            if prepared.is_some() {
                tracing::debug!(position = %point.position, rows_acked = point.rows_acked,
                    "the commit's point is not the prepared one: sending it too (the later wins)");
            }
            if let Err(e) = self.send_progress(point).await {
                self.abort().await;
                return Err(e);
            }
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
                self.finished();
                let (age, records) = self.close();
                self.inner
                    .metrics
                    .transaction_committed(age, records, started.elapsed());
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
                    // A timed-out commit may still complete on the coordinator (no KIP-890 in
                    // librdkafka: a late EndTxn answer is just lost): the next producer's
                    // InitProducerId bumps the epoch, which fences the old EndTxn if it is still
                    // on its way, and completes or aborts the transaction; the next run reads
                    // the progress topic to learn which.
                    tracing::warn!(error = %e, "the transaction's outcome is unknown (its commit \
                        did not complete); the next producer of this transactional.id completes \
                        or aborts it, and the relay resumes from the progress topic's last \
                        committed point");
                    self.close();
                    self.inner.metrics.transaction_aborted();
                    if let RelayError::Kafka(_) = error {
                        return Err(RelayError::CommitUnknown {
                            detail: format!(
                                "committing the transaction (transactional.id {}): {e}",
                                self.transactional_id
                            ),
                            point: point_label(point),
                        });
                    }
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
        self.inner.metrics.transaction_aborted();
        if result.is_ok() {
            self.finished();
        }
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

/// The brokers' `transaction.max.timeout.ms` in ms, read with DescribeConfigs (Kafka protocol
/// API key 32) from the first broker of the metadata; `None` when the brokers do not answer in
/// 10 s, refuse DescribeConfigs (no `DescribeConfigs` ACL on the cluster) or leave it out.
pub async fn broker_transaction_max_timeout(
    kafka: &outbox_relay_core::config::KafkaConfig,
) -> Option<u64> {
    let client = admin_client_config(kafka);
    let admin: AdminClient<DefaultClientContext> =
        tokio::task::spawn_blocking(move || client.create())
            .await
            .ok()?
            .ok()?;
    let admin = Arc::new(admin);
    let meta = Arc::clone(&admin);
    let broker = tokio::task::spawn_blocking(move || {
        meta.inner()
            .fetch_metadata(None, Duration::from_secs(10))
            .ok()
            .and_then(|m| m.brokers().first().map(|b| b.id()))
    })
    .await
    .ok()??;
    let spec = rdkafka::admin::ResourceSpecifier::Broker(broker);
    let options = AdminOptions::new().request_timeout(Some(Duration::from_secs(10)));
    let results = tokio::time::timeout(
        Duration::from_secs(15),
        admin.describe_configs([&spec], &options),
    )
    .await
    .ok()?
    .ok()?;
    let max = results
        .into_iter()
        .find_map(Result::ok)?
        .get("transaction.max.timeout.ms")?
        .value
        .as_deref()?
        .parse()
        .ok();
    // Dropping an admin client joins its threads (~100 ms): not on the start-up path.
    std::thread::spawn(move || drop(admin));
    max
}

/// The error of a `kafka.transaction_timeout_ms` (`configured`, ms) over the brokers'
/// `transaction.max.timeout.ms` (`max`, ms, when known): a prerequisite (exit code 3), since no
/// retry can make the coordinator accept it (it refuses InitProducerId with
/// `INVALID_TRANSACTION_TIMEOUT`, KIP-98).
pub fn transaction_timeout_too_long(configured: u64, max: Option<u64>) -> RelayError {
    let limit = max.map_or_else(
        || "the brokers' transaction.max.timeout.ms (not readable here: no DescribeConfigs)".into(),
        |m| format!("the brokers' transaction.max.timeout.ms ({m})"),
    );
    RelayError::Prerequisite {
        setting: "kafka.transaction_timeout_ms".into(),
        expected: format!("at most {limit}"),
        found: match max {
            Some(_) => format!("kafka.transaction_timeout_ms = {configured}"),
            None => format!(
                "kafka.transaction_timeout_ms = {configured}, refused by the transaction \
                 coordinator (INVALID_TRANSACTION_TIMEOUT)"
            ),
        },
        fix: format!(
            "set kafka.transaction_timeout_ms to {} or less (default 60000), or raise \
             transaction.max.timeout.ms on every broker to {configured} or more",
            max.map_or_else(|| "the brokers' limit".to_owned(), |m| m.to_string())
        ),
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
            .map_err(|e| RelayError::kafka(format!("admin client task failed: {e}")))?
            .map_err(|e| RelayError::kafka(format!("creating an admin client: {e}")))?;
    // Compaction only reaches rolled segments: 16 MiB segments (or an hour) keep the records
    // a start-up may have to read few, even at one commit every few milliseconds.
    let new = NewTopic::new(&topic, 1, TopicReplication::Fixed(-1))
        .set("cleanup.policy", "compact")
        .set("segment.bytes", "16777216")
        .set("segment.ms", "3600000");
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results = outbox_relay_core::error::with_timeout(
        PROGRESS_READ_TIMEOUT,
        "creating the progress topic",
        admin.create_topics([&new], &options),
    )
    .await?
    .map_err(|e| RelayError::kafka(format!("creating the progress topic {topic}: {e}")))?;
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
                return Err(RelayError::kafka(format!(
                    "creating the progress topic {topic}: {code}"
                )))
            }
        }
    }
    Ok(())
}

/// A consumer configuration on the relay's brokers: the user's properties minus the producer's
/// own (librdkafka warns about each), and `bootstrap.servers`.
pub fn consumer_config(kafka: &outbox_relay_core::config::KafkaConfig) -> ClientConfig {
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
            .map_err(|e| RelayError::kafka(format!("creating the progress reader: {e}")))
    };
    let t0 = Instant::now();
    let reader = consumer("read_committed")?;
    let watermarks = consumer("read_uncommitted")?;
    let metadata = reader
        .fetch_metadata(Some(topic), PROGRESS_READ_TIMEOUT)
        .map_err(|e| RelayError::kafka(format!("reading the progress topic's metadata: {e}")))?;
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
            .map_err(|e| RelayError::kafka(format!("reading the progress topic's offsets: {e}")))?;
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
        .map_err(|e| RelayError::kafka(format!("assigning the progress topic: {e}")))?;
    reader
        .assign(&assignment)
        .map_err(|e| RelayError::kafka(format!("assigning the progress topic: {e}")))?;
    let mut last = None;
    loop {
        let positions = reader
            .position()
            .map_err(|e| RelayError::kafka(format!("reading the progress topic: {e}")))?;
        let done = positions
            .find_partition(topic, p)
            .and_then(|tp| tp.offset().to_raw())
            .is_some_and(|at| at >= end);
        if done {
            return Ok(last);
        }
        if Instant::now() > deadline {
            return Err(RelayError::kafka(format!(
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
                return Err(RelayError::kafka(format!(
                    "reading the progress topic: {e}"
                )));
            }
        }
    }
}
