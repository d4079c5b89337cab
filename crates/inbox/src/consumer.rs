//! The runner: a Kafka consumer loop around [`Inbox::process`]. Records are settled one at a
//! time in the order received (so in offset order per partition, retries blocking the
//! partition); the offsets of settled records are committed synchronously when the fetched batch
//! is used up and when partitions are revoked. With retry tiers
//! ([`crate::InboxConfig::retry_tiers`]) it also consumes the tier topics; a copy whose
//! `retry_at` has not come pauses its partition (position back on the copy, offset not
//! committed) until then, and the other partitions go on.
//!
//! Batch mode ([`crate::InboxConfig::batch_max_records`] above 1): each poll batch (up to that
//! many records, waiting up to [`crate::InboxConfig::batch_max_wait`] for more once one arrived)
//! is settled in order, runs of ordinary records through [`Inbox::process_batch`], each retry
//! copy alone through [`Inbox::process`]; the batch's offsets are committed synchronously after
//! it.

use std::future::Future;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use futures::FutureExt;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use crate::error::InboxError;
use crate::metrics::Metrics;
use crate::outcome::Settled;
use crate::process::{Handler, Hooks, Inbox};
use crate::record::InboxRecord;

/// Commits the settled records' offsets before partitions are taken away; counts the
/// rebalances (a retry copy's paused partition may have moved); keeps the partitions' high
/// watermarks from librdkafka's statistics (`outbox_inbox_consumer_lag`).
#[derive(Default)]
pub struct CommitOnRevoke {
    rebalances: AtomicU64,
    /// topic → partition → high watermark, as of the last statistics
    /// (`statistics.interval.ms`, set when the inbox has metrics).
    high_watermarks: Mutex<HashMap<String, HashMap<i32, i64>>>,
    /// The lag gauge and the consumer name (with metrics): a revoked partition's series is
    /// removed (its next owner reports it).
    lag: Option<(Metrics, String)>,
}

impl CommitOnRevoke {
    /// The partition's high watermark as of the last statistics (no broker request).
    fn high_watermark(&self, topic: &str, partition: i32) -> Option<i64> {
        let map = self.high_watermarks.lock().ok()?;
        map.get(topic)?.get(&partition).copied()
    }
}

impl ClientContext for CommitOnRevoke {
    fn stats(&self, statistics: rdkafka::Statistics) {
        let Ok(mut map) = self.high_watermarks.lock() else {
            return;
        };
        for (name, topic) in statistics.topics {
            let partitions = map.entry(name).or_default();
            for (partition, p) in topic.partitions {
                // -1: the internal "unassigned" partition, or not known yet.
                if partition >= 0 && p.hi_offset >= 0 {
                    partitions.insert(partition, p.hi_offset);
                }
            }
        }
    }
}

impl ConsumerContext for CommitOnRevoke {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(revoked) = rebalance {
            if let Err(e) = commit_stored(consumer) {
                // The next owner gets those records again: duplicates, which the inbox absorbs.
                tracing::warn!(error = %e, "inbox: offset commit before revocation failed");
            }
            if let Some((metrics, name)) = &self.lag {
                for tp in revoked.elements() {
                    metrics.forget_lag(name, tp.topic(), tp.partition());
                }
            }
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, _rebalance: &Rebalance<'_>) {
        self.rebalances.fetch_add(1, Ordering::SeqCst);
    }
}

/// Commits the offsets stored for settled records; "nothing stored" is not an error.
fn commit_stored<C: Consumer<CommitOnRevoke>>(consumer: &C) -> Result<(), KafkaError> {
    match consumer.commit_consumer_state(CommitMode::Sync) {
        Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => Ok(()),
        other => other,
    }
}

/// A paused partition's retry copy: due at `at` (ms since the epoch), paused after
/// `rebalances` rebalances.
struct Waiting {
    at: i64,
    rebalances: u64,
}

/// A consumer group member that settles every record through an [`Inbox`].
pub struct InboxConsumer<F: Handler, H: Hooks> {
    consumer: StreamConsumer<CommitOnRevoke>,
    inbox: Inbox<H>,
    handler: F,
    /// The client settings, for the dead-letter topic's check at the start of `run`.
    config: ClientConfig,
    /// The topics subscribed to (without their retry tier topics, added by `run`).
    topics: Vec<String>,
}

impl<F: Handler, H: Hooks> InboxConsumer<F, H> {
    /// Subscribes to `topics` on `bootstrap_servers` with group id = the inbox's consumer name
    /// and `auto.offset.reset = earliest`.
    ///
    /// # Errors
    /// [`InboxError::Kafka`] when the consumer cannot be created or subscribe.
    pub fn new(
        bootstrap_servers: &str,
        topics: &[&str],
        inbox: Inbox<H>,
        handler: F,
    ) -> Result<Self, InboxError> {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", bootstrap_servers)
            .set("group.id", &inbox.config().consumer)
            .set("auto.offset.reset", "earliest");
        Self::with_config(config, topics, inbox, handler)
    }

    /// Like [`InboxConsumer::new`] with the client settings of `config` (security, group id,
    /// timeouts…). `enable.auto.commit` and `enable.auto.offset.store` are set to `false`: the
    /// runner commits only settled records.
    ///
    /// # Errors
    /// As [`InboxConsumer::new`].
    pub fn with_config(
        mut config: ClientConfig,
        topics: &[&str],
        mut inbox: Inbox<H>,
        handler: F,
    ) -> Result<Self, InboxError> {
        if config.get("group.id").is_none() {
            config.set("group.id", &inbox.config().consumer);
        }
        if let Some(group) = config.get("group.id") {
            inbox.set_span_group(group);
        }
        config
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false");
        // The lag gauge reads the high watermarks librdkafka reports in its statistics (no
        // broker round trip per record).
        if inbox.metrics().is_some() && config.get("statistics.interval.ms").is_none() {
            config.set("statistics.interval.ms", "1000");
        }
        let consumer: StreamConsumer<CommitOnRevoke> = config
            .create_with_context(CommitOnRevoke {
                lag: inbox
                    .metrics()
                    .map(|m| (m.clone(), inbox.config().consumer.clone())),
                ..CommitOnRevoke::default()
            })
            .map_err(|e| InboxError::kafka("creating the consumer", e))?;
        consumer
            .subscribe(topics)
            .map_err(|e| InboxError::kafka(format!("subscribing to {topics:?}"), e))?;
        Ok(InboxConsumer {
            consumer,
            inbox,
            handler,
            config,
            topics: topics.iter().map(|t| (*t).to_owned()).collect(),
        })
    }

    /// The Kafka consumer (assignment, positions, lag).
    pub fn consumer(&self) -> &StreamConsumer<CommitOnRevoke> {
        &self.consumer
    }

    /// Runs until `shutdown` completes, then commits the settled offsets and leaves the group.
    /// Before the first poll it makes sure the dead-letter topic exists
    /// ([`crate::ensure_topic`]: created with the broker's defaults when missing), and so the
    /// retry tier topics of its topics ([`crate::InboxConfig::retry_topics`]), which it then
    /// consumes too.
    ///
    /// # Errors
    /// [`InboxError::DeadLetterTopic`] when the dead-letter topic is missing and the broker
    /// refuses to create it (before anything is consumed), [`InboxError::RetryTopic`] the same
    /// for a retry tier topic; [`InboxError::Kafka`] for a dead
    /// letter that could not be produced or an offset commit that failed,
    /// [`InboxError::Outage`] for a database outage longer than
    /// [`crate::InboxConfig::outage_budget`]: the offsets of the records settled before are
    /// committed, the unsettled record's and later ones are not (it is redelivered to the next
    /// owner or a restarted consumer).
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), InboxError> {
        self.run_with(shutdown, |_, _, _| ControlFlow::Continue(()))
            .await
    }

    /// [`InboxConsumer::run`], calling `on_settled(record, settled, time since it was
    /// received)` after each record; `ControlFlow::Break` stops like `shutdown`.
    ///
    /// # Errors
    /// As [`InboxConsumer::run`].
    pub async fn run_with(
        self,
        shutdown: impl Future<Output = ()>,
        mut on_settled: impl FnMut(&InboxRecord, &Settled, Duration) -> ControlFlow<()>,
    ) -> Result<(), InboxError> {
        // The dead-letter topic exists, is created now, or the consumer refuses to start.
        crate::dead_letter::ensure_topic(
            &self.config,
            &self.inbox.config().dead_letter_topic,
            Duration::from_secs(30),
        )
        .await?;
        // Retry tiers: their topics exist (or are created now), and are consumed too.
        let mut all_topics = self.topics.clone();
        for topic in &self.topics {
            for tier in self.inbox.config().retry_topics(topic) {
                crate::dead_letter::ensure_topic(&self.config, &tier, Duration::from_secs(30))
                    .await
                    .map_err(|e| match e {
                        InboxError::DeadLetterTopic { topic, why } => {
                            InboxError::RetryTopic { topic, why }
                        }
                        other => other,
                    })?;
                if !all_topics.contains(&tier) {
                    all_topics.push(tier);
                }
            }
        }
        if all_topics.len() > self.topics.len() {
            let names: Vec<&str> = all_topics.iter().map(String::as_str).collect();
            self.consumer
                .subscribe(&names)
                .map_err(|e| InboxError::kafka(format!("subscribing to {names:?}"), e))?;
        }
        // Retry copies waiting for their retry_at: their partitions are paused, the position
        // back on the copy, until then (ms since the epoch).
        let mut waiting: HashMap<(String, i32), Waiting> = HashMap::new();
        tokio::pin!(shutdown);
        let mut uncommitted = false;
        // Parked versions: swept before the first poll and every park_sweep_interval (checked
        // between records, so a busy partition does not starve the sweep).
        let parks = {
            let c = self.inbox.config();
            c.version_header.is_some() && c.parks_anywhere()
        };
        let mut last_sweep: Option<Instant> = None;
        let batch_max = self.inbox.config().batch_max_records;
        loop {
            self.resume_due(&mut waiting);
            if parks
                && last_sweep.is_none_or(|t| t.elapsed() >= self.inbox.config().park_sweep_interval)
            {
                last_sweep = Some(Instant::now());
                match self.inbox.sweep_parked(&self.handler).await {
                    Ok(sweep) => tracing::debug!(?sweep, "inbox: parked table swept"),
                    Err(InboxError::Database { what, source }) => {
                        tracing::warn!(%what, error = %source, "inbox: parked sweep failed; next one later");
                    }
                    Err(e) => {
                        if uncommitted {
                            if let Err(c) = commit_stored(&self.consumer) {
                                tracing::warn!(error = %c, "inbox: offset commit on failure failed");
                            }
                        }
                        return Err(e);
                    }
                }
            }
            // Take what is already fetched without waiting; when nothing is, the batch is
            // used up: commit before waiting for more.
            let next = match self.consumer.recv().now_or_never() {
                Some(m) => m,
                None => {
                    if uncommitted {
                        commit_stored(&self.consumer)
                            .map_err(|e| InboxError::kafka("committing offsets", e))?;
                        uncommitted = false;
                    }
                    let mut sweep_in = if parks {
                        self.inbox.config().park_sweep_interval
                    } else {
                        Duration::from_secs(3600)
                    };
                    // Idle: also wake up when the first waiting copy is due.
                    if let Some(due) = waiting.values().map(|w| w.at).min() {
                        let ms = u64::try_from(due - crate::retry::now_ms()).unwrap_or(0);
                        sweep_in = sweep_in.min(Duration::from_millis(ms));
                    }
                    tokio::select! {
                        _ = &mut shutdown => break,
                        m = self.consumer.recv() => m,
                        // Idle: wake up for the next sweep.
                        () = tokio::time::sleep(sweep_in) => continue,
                    }
                }
            };
            let message = match next {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(error = %e, "inbox: consumer error");
                    continue;
                }
            };
            let received = Instant::now();
            let record = InboxRecord::from_message(&message);
            drop(message);
            if batch_max > 1 {
                let polled = self
                    .poll_batch(record, received, batch_max, &mut waiting)
                    .await?;
                let stop = self.settle_polled(polled, &mut on_settled).await;
                // The poll batch's settled records, committed synchronously.
                commit_stored(&self.consumer)
                    .map_err(|e| InboxError::kafka("committing offsets", e))?;
                uncommitted = false;
                if stop? {
                    break;
                }
                continue;
            }
            self.record_lag(&record);
            if !self.admit(&record, &mut waiting)? {
                continue;
            }
            let settled = match self.inbox.process(&record, &self.handler).await {
                Ok(settled) => settled,
                Err(e) => {
                    // The records settled before this one are committed; this one and the
                    // ones after it are not: the next member of the group resumes with it.
                    if uncommitted {
                        if let Err(c) = commit_stored(&self.consumer) {
                            tracing::warn!(error = %c, "inbox: offset commit on failure failed");
                        }
                    }
                    return Err(e);
                }
            };
            self.consumer
                .store_offset(&record.topic, record.partition, record.offset)
                .map_err(|e| InboxError::kafka("storing the offset", e))?;
            uncommitted = true;
            if on_settled(&record, &settled, received.elapsed()).is_break() {
                break;
            }
        }
        if uncommitted {
            commit_stored(&self.consumer)
                .map_err(|e| InboxError::kafka("committing offsets", e))?;
        }
        self.consumer.unsubscribe();
        Ok(())
    }

    /// Whether `record` is to be settled now: not when its partition is paused for a retry
    /// copy (fetched before the pause: delivered again after the resume), nor when it is a
    /// retry copy whose `retry_at` has not come (its partition is paused now).
    fn admit(
        &self,
        record: &InboxRecord,
        waiting: &mut HashMap<(String, i32), Waiting>,
    ) -> Result<bool, InboxError> {
        let tp = (record.topic.clone(), record.partition);
        let rebalances = self.rebalances();
        if let Some(w) = waiting.get(&tp) {
            if w.rebalances == rebalances {
                // Fetched before the pause: delivered again after the resume (the position
                // is the copy's).
                return Ok(false);
            }
            // The partition was assigned again meanwhile (not paused any more, position
            // from the committed offset): this record is the next one.
            waiting.remove(&tp);
        }
        if let Some(at) = crate::retry::retry_at(record) {
            if at > crate::retry::now_ms() && crate::retry::tier(record) > 0 {
                self.wait_for(record, at)?;
                waiting.insert(tp, Waiting { at, rebalances });
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Batch mode: `first` and the records that follow it within
    /// [`crate::InboxConfig::batch_max_wait`], at most `batch_max` received, those to be
    /// settled now ([`InboxConsumer::admit`]) with when each was received.
    async fn poll_batch(
        &self,
        first: InboxRecord,
        received: Instant,
        batch_max: usize,
        waiting: &mut HashMap<(String, i32), Waiting>,
    ) -> Result<Vec<(InboxRecord, Instant)>, InboxError> {
        let deadline = received + self.inbox.config().batch_max_wait;
        let mut polled = Vec::with_capacity(batch_max.min(1024));
        let mut next = Some((first, received));
        let mut count = 0usize;
        loop {
            let (record, at) = match next.take() {
                Some(r) => r,
                None => {
                    if count >= batch_max {
                        break;
                    }
                    let m = match self.consumer.recv().now_or_never() {
                        Some(m) => m,
                        None => {
                            let left = deadline.saturating_duration_since(Instant::now());
                            if left.is_zero() {
                                break;
                            }
                            match tokio::time::timeout(left, self.consumer.recv()).await {
                                Ok(m) => m,
                                Err(_) => break,
                            }
                        }
                    };
                    match m {
                        Ok(m) => {
                            let r = InboxRecord::from_message(&m);
                            (r, Instant::now())
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "inbox: consumer error");
                            continue;
                        }
                    }
                }
            };
            count += 1;
            self.record_lag(&record);
            if self.admit(&record, waiting)? {
                polled.push((record, at));
            }
        }
        Ok(polled)
    }

    /// Batch mode: settles a poll batch in order, runs of ordinary records through
    /// [`Inbox::process_batch`], each retry copy alone through [`Inbox::process`]; stores the
    /// offsets of the settled records. `Ok(true)`: `on_settled` asked to stop.
    async fn settle_polled(
        &self,
        polled: Vec<(InboxRecord, Instant)>,
        on_settled: &mut impl FnMut(&InboxRecord, &Settled, Duration) -> ControlFlow<()>,
    ) -> Result<bool, InboxError> {
        let is_copy =
            |r: &InboxRecord| crate::retry::tier(r) > 0 || !self.topics.contains(&r.topic);
        let mut stop = false;
        let mut i = 0;
        while i < polled.len() {
            let j = if is_copy(&polled[i].0) {
                i + 1
            } else {
                i + polled[i..].iter().take_while(|(r, _)| !is_copy(r)).count()
            };
            let run = &polled[i..j];
            let settled = if j == i + 1 && is_copy(&run[0].0) {
                vec![self.inbox.process(&run[0].0, &self.handler).await?]
            } else {
                let records: Vec<InboxRecord> = run.iter().map(|(r, _)| r.clone()).collect();
                self.inbox.process_batch(&records, &self.handler).await?
            };
            for ((record, received), settled) in run.iter().zip(&settled) {
                self.consumer
                    .store_offset(&record.topic, record.partition, record.offset)
                    .map_err(|e| InboxError::kafka("storing the offset", e))?;
                if !stop && on_settled(record, settled, received.elapsed()).is_break() {
                    stop = true;
                }
            }
            if stop {
                break;
            }
            i = j;
        }
        Ok(stop)
    }

    /// Sets `outbox_inbox_consumer_lag` of the record's partition (with metrics): the high
    /// watermark of librdkafka's last statistics (at most `statistics.interval.ms` old; at
    /// least the position) minus the position after this record (its offset + 1).
    fn record_lag(&self, record: &InboxRecord) {
        let Some(metrics) = self.inbox.metrics() else {
            return;
        };
        let Some(high) = self
            .consumer
            .context()
            .high_watermark(&record.topic, record.partition)
        else {
            return;
        };
        let position = record.offset + 1;
        metrics.lag(
            &self.inbox.config().consumer,
            &record.topic,
            record.partition,
            high.max(position) - position,
        );
    }

    fn rebalances(&self) -> u64 {
        self.consumer.context().rebalances.load(Ordering::SeqCst)
    }

    /// A retry copy whose `retry_at` has not come: its partition is paused and its position set
    /// back to the copy (its offset is not stored), until [`InboxConsumer::resume_due`].
    fn wait_for(&self, record: &InboxRecord, retry_at: i64) -> Result<(), InboxError> {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&record.topic, record.partition);
        self.consumer
            .pause(&tpl)
            .map_err(|e| InboxError::kafka(format!("pausing {}", record.topic), e))?;
        self.consumer
            .seek(
                &record.topic,
                record.partition,
                Offset::Offset(record.offset),
                Duration::from_secs(10),
            )
            .map_err(|e| InboxError::kafka(format!("seeking back in {}", record.topic), e))?;
        tracing::debug!(
            topic = %record.topic, partition = record.partition, offset = record.offset,
            wait_ms = retry_at - crate::retry::now_ms(),
            "inbox: retry copy not due; partition paused"
        );
        Ok(())
    }

    /// Resumes the paused partitions whose copy is due.
    fn resume_due(&self, waiting: &mut HashMap<(String, i32), Waiting>) {
        if waiting.is_empty() {
            return;
        }
        let now = crate::retry::now_ms();
        let due: Vec<(String, i32)> = waiting
            .iter()
            .filter(|(_, w)| w.at <= now)
            .map(|(tp, _)| tp.clone())
            .collect();
        for tp in due {
            waiting.remove(&tp);
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&tp.0, tp.1);
            // A partition revoked meanwhile is not paused any more: nothing to resume.
            if let Err(e) = self.consumer.resume(&tpl) {
                tracing::debug!(topic = %tp.0, partition = tp.1, error = %e, "inbox: resume");
            }
        }
    }
}
