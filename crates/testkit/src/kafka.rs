//! Reading what the relay produced: every record of a set of topics, from the beginning.
//!
//! The readers assign all partitions of the topics by hand (no consumer group, no committed
//! offsets) from the beginning, so every call sees the complete topic contents. They never
//! create topics (`allow.auto.create.topics=false`). Blocking librdkafka calls run on tokio's
//! blocking pool.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use crate::unique::unique_suffix;

/// One consumed Kafka record, detached from the consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset in the partition.
    pub offset: i64,
    /// Key bytes, if any.
    pub key: Option<Vec<u8>>,
    /// Value bytes, if any (`None` is a null value).
    pub value: Option<Vec<u8>>,
    /// Headers in order: name and value (`None` for a null header value).
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// Record timestamp in ms since the epoch, if it has one.
    pub timestamp_ms: Option<i64>,
}

impl Record {
    /// The first header called `name`, if its value is UTF-8.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.as_deref())
            .and_then(|v| std::str::from_utf8(v).ok())
    }

    /// How many headers are called `name`.
    pub fn header_count(&self, name: &str) -> usize {
        self.headers.iter().filter(|(n, _)| n == name).count()
    }

    /// The key as UTF-8, if it is.
    pub fn key_str(&self) -> Option<&str> {
        self.key
            .as_deref()
            .and_then(|k| std::str::from_utf8(k).ok())
    }

    /// The value as UTF-8, if it is.
    pub fn value_str(&self) -> Option<&str> {
        self.value
            .as_deref()
            .and_then(|v| std::str::from_utf8(v).ok())
    }
}

/// A predicate over the records read so far.
type RecordsPredicate = Box<dyn FnMut(&[Record]) -> bool + Send>;

/// When a read is complete.
enum Goal {
    /// At least this many records.
    Count(usize),
    /// The predicate holds for the records read so far.
    Predicate(RecordsPredicate),
}

const METADATA_TIMEOUT: Duration = Duration::from_secs(5);

fn new_consumer(bootstrap: &str) -> Result<BaseConsumer> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set(
            "group.id",
            format!("outbox-relay-tests-{}", unique_suffix()),
        )
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        // librdkafka's default, said here because exactly-once tests depend on it.
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "earliest")
        .set("allow.auto.create.topics", "false")
        .set("enable.partition.eof", "false")
        .set("topic.metadata.refresh.interval.ms", "1000")
        .create()
        .context("creating a Kafka consumer")
}

/// What the broker's metadata says about one topic.
enum TopicState {
    /// It exists, with these partitions.
    Exists(Vec<i32>),
    /// The broker answered that it does not know the topic.
    Unknown,
    /// No definite answer (request timed out, leader not available yet, no partitions listed):
    /// asked again, never taken for "does not exist".
    Unsettled(String),
}

/// The partitions of `topic` as the broker's metadata gives them.
fn topic_state(consumer: &BaseConsumer, topic: &str) -> TopicState {
    let md = match consumer.fetch_metadata(Some(topic), METADATA_TIMEOUT) {
        Ok(md) => md,
        Err(e) => return TopicState::Unsettled(format!("metadata request: {e}")),
    };
    let Some(t) = md.topics().iter().find(|t| t.name() == topic) else {
        return TopicState::Unsettled("topic not in the metadata answer".into());
    };
    match t.error() {
        Some(e) if RDKafkaErrorCode::from(e) == RDKafkaErrorCode::UnknownTopicOrPartition => {
            TopicState::Unknown
        }
        Some(e) => TopicState::Unsettled(format!("topic error {:?}", RDKafkaErrorCode::from(e))),
        None if t.partitions().is_empty() => TopicState::Unsettled("no partitions listed".into()),
        None => TopicState::Exists(t.partitions().iter().map(|p| p.id()).collect()),
    }
}

/// How long a topic whose metadata gives no definite answer is asked about again when the
/// caller does not wait for missing topics: a metadata timeout on a loaded machine must not make
/// a topic that holds records look absent (its records would then look lost).
const UNSETTLED_RETRY: Duration = Duration::from_secs(60);

/// Waits until every topic exists (or `deadline`), and returns the partitions of those that do.
/// With `wait` false, a topic the broker definitely does not know is skipped at once, while one
/// without a definite answer is asked about again for up to [`UNSETTLED_RETRY`].
///
/// # Errors
/// `wait` is false and a topic's metadata stayed unsettled for [`UNSETTLED_RETRY`].
fn await_topics(
    consumer: &BaseConsumer,
    topics: &[String],
    wait: bool,
    deadline: Instant,
) -> Result<BTreeMap<String, Vec<i32>>> {
    let mut found = BTreeMap::new();
    let mut unknown = BTreeSet::new();
    let unsettled_deadline = Instant::now() + UNSETTLED_RETRY;
    loop {
        let mut unsettled = Vec::new();
        for t in topics {
            if found.contains_key(t) || (!wait && unknown.contains(t)) {
                continue;
            }
            match topic_state(consumer, t) {
                TopicState::Exists(parts) => {
                    found.insert(t.clone(), parts);
                }
                TopicState::Unknown => {
                    unknown.insert(t.clone());
                }
                TopicState::Unsettled(why) => unsettled.push(format!("{t}: {why}")),
            }
        }
        if wait {
            if found.len() == topics.len() || Instant::now() >= deadline {
                return Ok(found);
            }
        } else if unsettled.is_empty() {
            return Ok(found);
        } else if Instant::now() >= unsettled_deadline {
            bail!(
                "no definite metadata for {} topic(s) within {UNSETTLED_RETRY:?}: {}",
                unsettled.len(),
                unsettled.join("; ")
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// (low, high) watermarks of a partition. Right after a topic is created the broker may not
/// serve them yet (no leader), so errors are retried until `deadline`.
fn watermarks(
    consumer: &BaseConsumer,
    topic: &str,
    partition: i32,
    deadline: Instant,
) -> Result<(i64, i64)> {
    loop {
        match consumer.fetch_watermarks(topic, partition, METADATA_TIMEOUT) {
            Ok(w) => return Ok(w),
            Err(e) if Instant::now() >= deadline => {
                return Err(e)
                    .with_context(|| format!("fetching watermarks of {topic}/{partition}"))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// How long watermark queries of a topic that exists are retried.
const WATERMARK_RETRY: Duration = Duration::from_secs(30);

fn detach(m: &rdkafka::message::BorrowedMessage<'_>) -> Record {
    let r = outbox_relay_kafka::reader::ReadRecord::from_message(m);
    Record {
        topic: r.topic,
        partition: r.partition,
        offset: r.offset,
        key: r.key,
        value: r.value,
        headers: r.headers,
        timestamp_ms: r.timestamp_ms,
    }
}

/// The blocking read behind the public functions.
fn read_blocking(
    bootstrap: &str,
    topics: &[String],
    wait_for_topics: bool,
    mut goal: Option<Goal>,
    timeout: Duration,
) -> Result<Vec<Record>> {
    let deadline = Instant::now() + timeout;
    let consumer = new_consumer(bootstrap)?;
    // Watermarks are asked through a client of their own: on the reading consumer each
    // ListOffsets request waits behind its outstanding fetch (up to fetch.wait.max.ms, 500 ms),
    // which made the targets of 45 partitions take ~18 s.
    let meta = new_consumer(bootstrap)?;
    let parts = await_topics(&consumer, topics, wait_for_topics, deadline)?;
    let mut records = Vec::new();
    if parts.is_empty() {
        return Ok(records);
    }
    let mut tpl = TopicPartitionList::new();
    for (topic, ps) in &parts {
        for p in ps {
            tpl.add_partition_offset(topic, *p, Offset::Beginning)?;
        }
    }
    consumer.assign(&tpl).context("assigning partitions")?;

    // Next offset to read, per partition (starts at the low watermark once known).
    let mut next: BTreeMap<(String, i32), i64> = BTreeMap::new();
    // High watermarks to read up to, fixed once the goal is met.
    let mut targets: Option<BTreeMap<(String, i32), i64>> = None;
    let mut last_error = None;
    loop {
        if targets.is_none() {
            let met = match goal.as_mut() {
                None => true,
                Some(Goal::Count(n)) => records.len() >= *n,
                Some(Goal::Predicate(p)) => p(&records),
            };
            if met {
                let mut t = BTreeMap::new();
                for (topic, ps) in &parts {
                    for p in ps {
                        let (low, high) = watermarks(
                            &meta,
                            topic,
                            *p,
                            deadline.max(Instant::now() + WATERMARK_RETRY),
                        )?;
                        let n = next.entry((topic.clone(), *p)).or_insert(low);
                        *n = (*n).max(low);
                        t.insert((topic.clone(), *p), high);
                    }
                }
                targets = Some(t);
            }
        }
        if let Some(t) = &targets {
            let done = t
                .iter()
                .all(|(tp, high)| next.get(tp).is_some_and(|n| n >= high));
            if done {
                return Ok(records);
            }
        }
        if Instant::now() >= deadline {
            if let Some(e) = last_error {
                eprintln!("kafka read ended by timeout; last consumer error: {e}");
            }
            return Ok(records);
        }
        let mut idle = false;
        match consumer.poll(Duration::from_millis(200)) {
            None => idle = true,
            Some(Ok(m)) => {
                let r = detach(&m);
                let n = next.entry((r.topic.clone(), r.partition)).or_insert(0);
                *n = (*n).max(r.offset + 1);
                records.push(r);
            }
            Some(Err(e)) => last_error = Some(e),
        }
        // Control records (transactional producers) take offsets but are never delivered:
        // the consumer's position accounts for them. Asked only when a poll found nothing
        // (the records before them are all delivered by then): asking after every record
        // costs more than the read itself in a debug build.
        if targets.is_some() && idle {
            if let Ok(pos) = consumer.position() {
                for el in pos.elements() {
                    if let Offset::Offset(o) = el.offset() {
                        let n = next
                            .entry((el.topic().to_owned(), el.partition()))
                            .or_insert(0);
                        *n = (*n).max(o);
                    }
                }
            }
        }
    }
}

async fn run_blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .context("Kafka reader task panicked")?
}

/// Reads `topics` from the beginning until at least `expected` records have arrived, then on
/// up to each partition's high watermark at that moment, so extra or duplicate records already
/// in the topics are returned as well. Topics that do not exist yet are waited for (the relay
/// creates them by producing).
///
/// Returns what was read when `timeout` passes, even if fewer than `expected`: the caller
/// asserts on the contents (and can say which records are missing).
///
/// # Errors
/// The consumer cannot be created or a partition cannot be assigned.
pub async fn collect_records(
    bootstrap: &str,
    topics: &[String],
    expected: usize,
    timeout: Duration,
) -> Result<Vec<Record>> {
    let (bootstrap, topics) = (bootstrap.to_owned(), topics.to_vec());
    run_blocking(move || {
        read_blocking(
            &bootstrap,
            &topics,
            true,
            Some(Goal::Count(expected)),
            timeout,
        )
    })
    .await
}

/// Like [`collect_records`], with a predicate over the records read so far (from the
/// beginning) as the goal, e.g. "every committed event key has been seen". Topics that do not
/// exist are waited for until `timeout`.
///
/// # Errors
/// As [`collect_records`].
pub async fn collect_until(
    bootstrap: &str,
    topics: &[String],
    timeout: Duration,
    done: impl FnMut(&[Record]) -> bool + Send + 'static,
) -> Result<Vec<Record>> {
    let (bootstrap, topics) = (bootstrap.to_owned(), topics.to_vec());
    run_blocking(move || {
        read_blocking(
            &bootstrap,
            &topics,
            true,
            Some(Goal::Predicate(Box::new(done))),
            timeout,
        )
    })
    .await
}

/// Everything currently in `topics`: each partition from the beginning up to its current high
/// watermark. Topics that do not exist are skipped, not waited for. Use it once the producer
/// has stopped, to count every record (duplicates included).
///
/// # Errors
/// As [`collect_records`], or the partitions could not be read to their end within
/// `timeout`.
pub async fn read_all_records(
    bootstrap: &str,
    topics: &[String],
    timeout: Duration,
) -> Result<Vec<Record>> {
    let (bootstrap, topics) = (bootstrap.to_owned(), topics.to_vec());
    let (records, total) = run_blocking(move || {
        let consumer = new_consumer(&bootstrap)?;
        let parts = await_topics(&consumer, &topics, false, Instant::now())?;
        let total = sum_watermarks(&consumer, &parts, |low, high| high - low)?;
        drop(consumer);
        let existing: Vec<String> = parts.into_keys().collect();
        let records = read_blocking(&bootstrap, &existing, false, None, timeout)?;
        Ok((records, total))
    })
    .await?;
    if (records.len() as u64) < total {
        bail!(
            "read only {} of the {total} records in the topics within {timeout:?}",
            records.len()
        );
    }
    Ok(records)
}

/// Everything in `topics` a `read_committed` consumer sees: each partition from the beginning
/// to its end (the consumer's position past the last stable offset: transaction markers and
/// aborted records take offsets but are never delivered, so unlike [`read_all_records`] the
/// count is not checked against the watermarks). Topics that do not exist are skipped.
///
/// # Errors
/// As [`collect_records`].
pub async fn read_committed_records(
    bootstrap: &str,
    topics: &[String],
    timeout: Duration,
) -> Result<Vec<Record>> {
    let (bootstrap, topics) = (bootstrap.to_owned(), topics.to_vec());
    run_blocking(move || read_blocking(&bootstrap, &topics, false, None, timeout)).await
}

/// Sum over the partitions of `topics` of (high − low watermark): how many records they hold.
/// Missing topics count 0. Cheap enough to poll.
///
/// # Errors
/// The consumer cannot be created or a watermark query fails.
pub async fn high_watermark_total(bootstrap: &str, topics: &[String]) -> Result<u64> {
    sum_over_partitions(bootstrap, topics, |low, high| high - low).await
}

/// Sum over the partitions of `topics` of the low watermark: how many records the broker has
/// already deleted (retention) from their start. Non-zero means a read from the beginning
/// cannot see everything that was produced. Missing topics count 0.
///
/// # Errors
/// The consumer cannot be created or a watermark query fails.
pub async fn deleted_record_count(bootstrap: &str, topics: &[String]) -> Result<u64> {
    sum_over_partitions(bootstrap, topics, |low, _| low).await
}

/// [`sum_watermarks`] over the partitions of `topics` (missing topics have none).
async fn sum_over_partitions(
    bootstrap: &str,
    topics: &[String],
    per_partition: fn(i64, i64) -> i64,
) -> Result<u64> {
    let (bootstrap, topics) = (bootstrap.to_owned(), topics.to_vec());
    run_blocking(move || {
        let consumer = new_consumer(&bootstrap)?;
        let parts = await_topics(&consumer, &topics, false, Instant::now())?;
        sum_watermarks(&consumer, &parts, per_partition)
    })
    .await
}

/// Sum over `parts` (topic → partitions) of `per_partition(low, high)` of their watermarks,
/// negative terms counting 0.
fn sum_watermarks(
    consumer: &BaseConsumer,
    parts: &BTreeMap<String, Vec<i32>>,
    per_partition: fn(i64, i64) -> i64,
) -> Result<u64> {
    let mut total = 0u64;
    for (t, ps) in parts {
        for p in ps {
            let (low, high) = watermarks(consumer, t, *p, Instant::now() + WATERMARK_RETRY)?;
            total += u64::try_from(per_partition(low, high)).unwrap_or(0);
        }
    }
    Ok(total)
}

/// Names of all topics on the broker that start with `prefix`, sorted.
///
/// # Errors
/// The metadata request fails.
pub async fn list_topics(bootstrap: &str, prefix: &str) -> Result<BTreeSet<String>> {
    let (bootstrap, prefix) = (bootstrap.to_owned(), prefix.to_owned());
    run_blocking(move || {
        let consumer = new_consumer(&bootstrap)?;
        let md = consumer
            .fetch_metadata(None, METADATA_TIMEOUT)
            .context("fetching cluster metadata")?;
        Ok(md
            .topics()
            .iter()
            .map(|t| t.name().to_owned())
            .filter(|n| n.starts_with(&prefix))
            .collect())
    })
    .await
}

/// Creates `topic` (1 partition, replication 1) with `max.message.bytes` set (bytes: the
/// largest record batch the broker takes for it).
///
/// # Errors
/// The admin client cannot be created or the broker refuses the topic (e.g. it exists).
pub async fn create_topic(bootstrap: &str, topic: &str, max_message_bytes: usize) -> Result<()> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .context("creating a Kafka admin client")?;
    let bytes = max_message_bytes.to_string();
    let new = NewTopic::new(topic, 1, TopicReplication::Fixed(1)).set("max.message.bytes", &bytes);
    let results = admin
        .create_topics(&[new], &AdminOptions::new())
        .await
        .with_context(|| format!("creating topic {topic}"))?;
    for r in results {
        r.map_err(|(t, e)| anyhow::anyhow!("creating topic {t}: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::kafka_bootstrap;
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{FutureProducer, FutureRecord};

    /// Needs the test broker (`tests/services/kafka.sh up`).
    #[tokio::test]
    async fn reads_back_what_was_produced_from_all_partitions() -> Result<()> {
        let bootstrap = kafka_bootstrap();
        let prefix = format!("tk_{}", unique_suffix());
        let topics = vec![format!("{prefix}.a"), format!("{prefix}.b")];
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("enable.idempotence", "true")
            .create()?;
        let mut sent = Vec::new();
        // Recent timestamps: older ones fall to the broker's time-based retention.
        let ts0 = chrono::Utc::now().timestamp_millis() - 60_000;
        for i in 0..30i64 {
            let topic = &topics[(i % 2) as usize];
            let key = format!("k{}", i % 7);
            let value = format!("{{\"i\":{i},\"note\":\"crème ✓\"}}");
            let headers = OwnedHeaders::new()
                .insert(Header {
                    key: "event_key",
                    value: Some(&format!("ek-{i}")),
                })
                .insert(Header {
                    key: "id",
                    value: Some(&i.to_string()),
                });
            producer
                .send(
                    FutureRecord::to(topic)
                        .key(&key)
                        .payload(&value)
                        .headers(headers)
                        .timestamp(ts0 + i),
                    Duration::from_secs(30),
                )
                .await
                .map_err(|(e, _)| e)?;
            sent.push((topic.clone(), key, value, i));
        }

        let records =
            collect_records(&bootstrap, &topics, sent.len(), Duration::from_secs(60)).await?;
        assert_eq!(records.len(), sent.len());
        for (topic, key, value, i) in &sent {
            let ek = format!("ek-{i}");
            let r = records
                .iter()
                .find(|r| r.header("event_key") == Some(ek.as_str()))
                .with_context(|| format!("{ek} not read"))?;
            assert_eq!(&r.topic, topic);
            assert_eq!(r.key_str(), Some(key.as_str()));
            assert_eq!(r.value_str(), Some(value.as_str()));
            assert_eq!(r.header("id"), Some(i.to_string().as_str()));
            assert_eq!(r.timestamp_ms, Some(ts0 + i));
        }

        let all = read_all_records(&bootstrap, &topics, Duration::from_secs(60)).await?;
        assert_eq!(all.len(), sent.len());
        assert_eq!(
            high_watermark_total(&bootstrap, &topics).await?,
            sent.len() as u64
        );
        assert_eq!(deleted_record_count(&bootstrap, &topics).await?, 0);
        let listed = list_topics(&bootstrap, &prefix).await?;
        assert_eq!(listed, topics.iter().cloned().collect::<BTreeSet<_>>());

        // A topic that does not exist is not created by reading it.
        let missing = vec![format!("{prefix}.missing")];
        assert!(
            read_all_records(&bootstrap, &missing, Duration::from_secs(10))
                .await?
                .is_empty()
        );
        assert_eq!(high_watermark_total(&bootstrap, &missing).await?, 0);
        assert!(!list_topics(&bootstrap, &prefix)
            .await?
            .contains(&missing[0]));
        Ok(())
    }

    /// A count goal that is never met ends at the timeout with what was read.
    #[tokio::test]
    async fn returns_partial_results_at_the_timeout() -> Result<()> {
        let topics = vec![format!("tk_{}.none", unique_suffix())];
        let start = Instant::now();
        let records =
            collect_records(&kafka_bootstrap(), &topics, 1, Duration::from_secs(2)).await?;
        assert!(records.is_empty());
        assert!(start.elapsed() < Duration::from_secs(20));
        Ok(())
    }
}
