//! Kafka side of the benchmark: topics with broker append times, counting and timing what
//! arrived, per-record latencies, and the bare producer that gives the produce limit.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Message, OwnedHeaders, Timestamp};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use crate::workload::{event_key, key_of, now_micros, payload, payload_seq, payload_ts};

/// Partitions of every benchmark topic (the broker's `num.partitions` in tests/services).
pub const PARTITIONS: i32 = 3;

/// The relay's producer settings (crates/relay-kafka/src/sink/mod.rs): idempotent, `acks=all`, Java
/// partitioner, `linger.ms=1`. The polling relay, the raw-produce limit and the Debezium runner
/// use the same.
pub fn producer_config(bootstrap: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("linger.ms", "1")
        .set("message.timeout.ms", "120000")
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("partitioner", "murmur2_random");
    c
}

fn consumer(bootstrap: &str) -> Result<BaseConsumer> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "outbox-relay-bench")
        .set("enable.auto.commit", "false")
        .set("allow.auto.create.topics", "false")
        .set("fetch.max.bytes", "52428800")
        .set("max.partition.fetch.bytes", "10485760")
        .create()
        .context("creating a Kafka consumer")
}

/// Creates `topics` ([`PARTITIONS`] partitions, replication 1,
/// `message.timestamp.type=LogAppendTime`).
///
/// # Errors
/// The broker refuses a topic (other than "already exists").
pub async fn create_topics(bootstrap: &str, topics: &[String]) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .context("creating a Kafka admin client")?;
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|t| {
            NewTopic::new(t, PARTITIONS, TopicReplication::Fixed(1))
                .set("message.timestamp.type", "LogAppendTime")
        })
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for r in admin.create_topics(&new, &opts).await? {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, e)) => bail!("creating topic {t}: {e}"),
        }
    }
    // Let the partitions' leaders settle before anyone produces.
    tokio::time::sleep(Duration::from_millis(500)).await;
    Ok(())
}

/// Deletes `topics` (best effort: errors are printed, not returned). Names are deduplicated
/// first: librdkafka answers a DeleteTopics request with a repeated name with fewer results than
/// names, and rdkafka 0.x then reads a NULL result (a segfault seen at the end of `make bench`).
pub async fn delete_topics(bootstrap: &str, topics: &[String]) {
    if topics.is_empty() {
        // A request without names is refused (InvalidArgument): a run of the tenants phase
        // alone made none here.
        return;
    }
    let admin: Result<AdminClient<DefaultClientContext>, _> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create();
    let Ok(admin) = admin else { return };
    let mut names: Vec<&str> = topics.iter().map(String::as_str).collect();
    names.sort_unstable();
    names.dedup();
    if let Err(e) = admin.delete_topics(&names, &AdminOptions::new()).await {
        eprintln!("[bench] deleting topics: {e}");
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .context("blocking Kafka task")?
}

fn count_of(c: &BaseConsumer, topic: &str) -> Result<u64> {
    let mut total = 0;
    for p in 0..PARTITIONS {
        let (lo, hi) = c
            .fetch_watermarks(topic, p, Duration::from_secs(10))
            .with_context(|| format!("watermarks of {topic}/{p}"))?;
        total += u64::try_from(hi - lo).unwrap_or(0);
    }
    Ok(total)
}

/// Polls the record count of `topic` every 50 ms until it reaches `want` or `timeout` passes,
/// or `give_up` says so; returns the count last seen.
///
/// # Errors
/// A watermark query fails.
pub async fn wait_for_count(
    bootstrap: &str,
    topic: &str,
    want: u64,
    timeout: Duration,
    mut give_up: impl FnMut() -> Result<()>,
) -> Result<u64> {
    let c = consumer(bootstrap)?;
    let deadline = Instant::now() + timeout;
    loop {
        let n = count_of(&c, topic)?;
        if n >= want || Instant::now() >= deadline {
            return Ok(n);
        }
        give_up()?;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Which end of a topic [`append_ms`] looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edge {
    /// The partitions' first records: the earliest append time among them, when the first
    /// record was acknowledged.
    First,
    /// The partitions' last records: the latest append time among them, when the last record
    /// was acknowledged.
    Last,
}

/// The broker append time (ms since the epoch) of `topic`'s first or last record, as `edge`
/// says (the topics are created with `LogAppendTime`).
///
/// # Errors
/// The topic is empty or cannot be read.
pub async fn append_ms(bootstrap: &str, topic: &str, edge: Edge) -> Result<i64> {
    let (bootstrap, topic) = (bootstrap.to_owned(), topic.to_owned());
    blocking(move || {
        let c = consumer(&bootstrap)?;
        let mut best = None;
        for p in 0..PARTITIONS {
            let (lo, hi) = c.fetch_watermarks(&topic, p, Duration::from_secs(10))?;
            if hi <= lo {
                continue;
            }
            let at = match edge {
                Edge::First => lo,
                Edge::Last => hi - 1,
            };
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(&topic, p, Offset::Offset(at))?;
            c.assign(&tpl)?;
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                match c.poll(Duration::from_millis(200)) {
                    Some(Ok(m)) if m.partition() == p => {
                        if let Some(ms) = m.timestamp().to_millis() {
                            best = Some(best.map_or(ms, |b: i64| match edge {
                                Edge::First => b.min(ms),
                                Edge::Last => b.max(ms),
                            }));
                        }
                        break;
                    }
                    Some(Err(e)) => bail!("reading {topic}/{p}: {e}"),
                    _ if Instant::now() > deadline => {
                        bail!("no record at offset {at} of {topic}/{p}")
                    }
                    _ => {}
                }
            }
        }
        best.with_context(|| format!("{topic} is empty"))
    })
    .await
}

/// What was read back from one steady-state topic.
#[derive(Debug, Clone, Default)]
pub struct Latencies {
    /// Commit → broker append latency of every record, µs, sorted.
    pub micros: Vec<i64>,
    /// Records whose append time was not `LogAppendTime` or whose payload had no `ts`.
    pub unusable: u64,
    /// Records read.
    pub records: u64,
    /// Each record's row sequence number (its payload's `seq`) and the time measured (broker
    /// append, or arrival at the live reader), µs since the epoch: the stage budget's points.
    pub by_seq: Vec<(u64, i64)>,
}

/// Reads every record of `topic` and computes append time − payload `ts` for each. `expected`:
/// how many records a `read_committed` reader gets (a transactional producer's topic, whose
/// commit markers take offsets); `None`: the partitions' record counts.
///
/// # Errors
/// The topic cannot be read.
pub async fn latencies(bootstrap: &str, topic: &str, expected: Option<u64>) -> Result<Latencies> {
    let (bootstrap, topic) = (bootstrap.to_owned(), topic.to_owned());
    blocking(move || {
        let c = consumer(&bootstrap)?;
        let want = match expected {
            Some(n) => n,
            None => count_of(&c, &topic)?,
        };
        let mut tpl = TopicPartitionList::new();
        for p in 0..PARTITIONS {
            tpl.add_partition_offset(&topic, p, Offset::Beginning)?;
        }
        c.assign(&tpl)?;
        let mut out = Latencies::default();
        let mut last_progress = Instant::now();
        while out.records < want {
            match c.poll(Duration::from_millis(200)) {
                Some(Ok(m)) => {
                    out.records += 1;
                    last_progress = Instant::now();
                    let ts = m.payload().and_then(payload_ts);
                    match (m.timestamp(), ts) {
                        (Timestamp::LogAppendTime(ms), Some(ts)) => {
                            out.micros.push((ms * 1000 - ts).max(0));
                            if let Some(seq) = m.payload().and_then(payload_seq) {
                                out.by_seq.push((seq, ms * 1000));
                            }
                        }
                        _ => out.unusable += 1,
                    }
                }
                Some(Err(e)) => bail!("reading {topic}: {e}"),
                None if last_progress.elapsed() > Duration::from_secs(30) => {
                    bail!(
                        "{topic}: read {} of {want} records, then nothing for 30 s",
                        out.records
                    )
                }
                None => {}
            }
        }
        out.micros.sort_unstable();
        Ok(out)
    })
    .await
}

struct Counting {
    acked: AtomicU64,
    failed: AtomicU64,
}

impl ClientContext for Counting {}

impl ProducerContext for Counting {
    type DeliveryOpaque = ();
    fn delivery(&self, r: &DeliveryResult<'_>, _: ()) {
        match r {
            Ok(_) => self.acked.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.failed.fetch_add(1, Ordering::Relaxed),
        };
    }
}

/// The bare producer's run.
#[derive(Debug, Clone, Default)]
pub struct Produced {
    /// Records acknowledged.
    pub records: u64,
    /// Value bytes acknowledged.
    pub payload_bytes: u64,
    /// First send → last acknowledgement, seconds.
    pub secs: f64,
}

/// One backlog record, built before the bare producer runs (so its CPU time and rate are the
/// producer's alone, not the JSON formatting's).
pub struct Prepared {
    key: String,
    value: String,
    event_key: String,
    id: String,
}

/// Rows `0..rows` of workload `agg` as records: the backlog's keys, payload sizes and headers.
pub fn prepare(agg: &str, rows: u64) -> Vec<Prepared> {
    (0..rows)
        .map(|seq| {
            let key = key_of(seq);
            Prepared {
                value: payload(now_micros(), seq, &key),
                key,
                event_key: event_key(agg, seq),
                id: (seq + 1).to_string(),
            }
        })
        .collect()
}

/// Holds a bare producer behind a bare binlog read of the same rows: record `i` of `n` is sent
/// only once `i / n` of the range's bytes were read, as a relay can produce a row only after
/// reading it.
#[derive(Debug, Clone)]
pub struct ReadGate {
    /// Bytes read so far ([`crate::binlog::raw_read`] stores them); `u64::MAX` opens the gate.
    pub read_bytes: Arc<AtomicU64>,
    /// The range's size in bytes (as a bare read of it counted).
    pub total_bytes: u64,
}

impl ReadGate {
    /// How many of `n` records the bytes read so far let through.
    fn allowed(&self, n: u64) -> u64 {
        let read = u128::from(self.read_bytes.load(Ordering::Relaxed));
        let allowed = read * u128::from(n) / u128::from(self.total_bytes.max(1));
        u64::try_from(allowed).unwrap_or(u64::MAX)
    }
}

/// Produces `records` (from [`prepare`] for workload `agg`) to `topic` with
/// [`producer_config`], at most `max_in_flight` unacknowledged (the relay's
/// `kafka.max_in_flight` default), and times it; with `gate`, no faster than a binlog read
/// reaches each record's share of the range.
///
/// # Errors
/// The producer cannot be created, or a record fails.
pub async fn raw_produce(
    bootstrap: &str,
    topic: &str,
    agg: &str,
    records: Arc<Vec<Prepared>>,
    max_in_flight: u64,
    gate: Option<ReadGate>,
) -> Result<Produced> {
    let (bootstrap, topic, agg) = (bootstrap.to_owned(), topic.to_owned(), agg.to_owned());
    blocking(move || {
        let producer: BaseProducer<Counting> = producer_config(&bootstrap)
            .create_with_context(Counting {
                acked: AtomicU64::new(0),
                failed: AtomicU64::new(0),
            })
            .context("creating the bare producer")?;
        let started = Instant::now();
        let mut bytes = 0u64;
        let n = records.len() as u64;
        let mut allowed = 0u64;
        for (seq, r) in (0u64..).zip(records.iter()) {
            if let Some(gate) = &gate {
                while seq >= allowed {
                    allowed = gate.allowed(n);
                    if seq >= allowed {
                        producer.poll(Duration::from_millis(1));
                    }
                }
            }
            bytes += r.value.len() as u64;
            let headers = OwnedHeaders::new_with_capacity(4)
                .insert(Header {
                    key: "id",
                    value: Some(r.id.as_bytes()),
                })
                .insert(Header {
                    key: "event_key",
                    value: Some(r.event_key.as_bytes()),
                })
                .insert(Header {
                    key: "event_type",
                    value: Some("OrderCreated"),
                })
                .insert(Header {
                    key: "aggregate_type",
                    value: Some(agg.as_bytes()),
                });
            let record = BaseRecord::to(&topic)
                .key(r.key.as_bytes())
                .payload(r.value.as_bytes())
                .headers(headers);
            while seq - producer.context().acked.load(Ordering::Relaxed) >= max_in_flight {
                producer.poll(Duration::from_millis(1));
            }
            send_waiting(&producer, record).context("bare producer")?;
            if seq % 256 == 0 {
                producer.poll(Duration::ZERO);
            }
        }
        producer
            .flush(Duration::from_secs(300))
            .context("flushing the bare producer")?;
        let secs = started.elapsed().as_secs_f64();
        let failed = producer.context().failed.load(Ordering::Relaxed);
        if failed > 0 {
            bail!("bare producer: {failed} records failed");
        }
        Ok(Produced {
            records: producer.context().acked.load(Ordering::Relaxed),
            payload_bytes: bytes,
            secs,
        })
    })
    .await
}

/// Sends `record`, serving the producer's queue while it is full (librdkafka's
/// `queue.buffering.max.messages`) instead of failing.
///
/// # Errors
/// The producer refuses the record for any other reason.
pub fn send_waiting<C: ProducerContext>(
    producer: &BaseProducer<C>,
    mut record: BaseRecord<'_, [u8], [u8], C::DeliveryOpaque>,
) -> Result<()> {
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                record = r;
                producer.poll(Duration::from_millis(1));
            }
            Err((e, _)) => bail!("{e}"),
        }
    }
}

/// Percentile `q` (0–1) of sorted `v`, in ms.
pub fn pct_ms(v: &[i64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
    v[i] as f64 / 1000.0
}

/// Summary of a latency distribution, ms.
pub fn summary(v: &[i64]) -> BTreeMap<&'static str, f64> {
    BTreeMap::from([
        ("p50_ms", pct_ms(v, 0.5)),
        ("p99_ms", pct_ms(v, 0.99)),
        ("p999_ms", pct_ms(v, 0.999)),
        ("max_ms", v.last().map_or(f64::NAN, |m| *m as f64 / 1000.0)),
    ])
}

/// A `read_committed` reader of one topic running while a system produces to it: each record's
/// latency is the time it was received here minus its payload `ts` (the source commit), i.e.
/// commit → visible to a consumer, what a transactional producer's consumers see. Used for the
/// relay in both delivery modes, so their figures compare.
pub struct LiveReader {
    stop: Arc<std::sync::atomic::AtomicBool>,
    count: Arc<AtomicU64>,
    /// `None` once [`LiveReader::finish`] took it.
    handle: Option<std::thread::JoinHandle<Result<(Latencies, i64)>>>,
}

/// A reader dropped unfinished (an error on the way) stops too: its thread would fetch every
/// few ms for the rest of the bench, a load on the runs after it.
impl Drop for LiveReader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl LiveReader {
    /// Starts reading `topic` (which exists) from its beginning.
    ///
    /// # Errors
    /// The consumer cannot be created or assigned.
    pub fn start(bootstrap: &str, topic: &str) -> Result<Self> {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", "outbox-relay-bench-live")
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .set("fetch.wait.max.ms", "5")
            .set("fetch.max.bytes", "52428800")
            .create()
            .context("creating the live reader")?;
        let mut tpl = TopicPartitionList::new();
        for p in 0..PARTITIONS {
            tpl.add_partition_offset(topic, p, Offset::Beginning)?;
        }
        c.assign(&tpl)?;
        // Warm up before the writer starts: the first fetches (metadata, connection, offsets)
        // took ~0.5 s, which the first records would count as latency. (An empty partition
        // has no position to wait for, so the warm-up is a fixed second of polling.)
        let warm = Instant::now() + Duration::from_secs(1);
        while Instant::now() < warm {
            if let Some(Err(e)) = c.poll(Duration::from_millis(100)) {
                bail!("live reader: {e}");
            }
        }
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let count = Arc::new(AtomicU64::new(0));
        let (s, n) = (Arc::clone(&stop), Arc::clone(&count));
        let handle = std::thread::spawn(move || {
            let mut out = Latencies::default();
            let mut last = 0;
            while !s.load(Ordering::Relaxed) {
                match c.poll(Duration::from_millis(50)) {
                    Some(Ok(m)) => {
                        let now = now_micros();
                        last = now;
                        out.records += 1;
                        n.fetch_add(1, Ordering::Relaxed);
                        match m.payload().and_then(payload_ts) {
                            Some(ts) => out.micros.push((now - ts).max(0)),
                            None => out.unusable += 1,
                        }
                        if let Some(seq) = m.payload().and_then(payload_seq) {
                            out.by_seq.push((seq, now));
                        }
                    }
                    Some(Err(e)) => bail!("live reader: {e}"),
                    None => {}
                }
            }
            out.micros.sort_unstable();
            Ok((out, last))
        });
        Ok(Self {
            stop,
            count,
            handle: Some(handle),
        })
    }

    /// Records received so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Waits until `want` records arrived (or `timeout`, or `give_up` says so); returns the count.
    ///
    /// # Errors
    /// `give_up` fails.
    pub async fn wait_for(
        &self,
        want: u64,
        timeout: Duration,
        mut give_up: impl FnMut() -> Result<()>,
    ) -> Result<u64> {
        let deadline = Instant::now() + timeout;
        loop {
            let n = self.count();
            if n >= want || Instant::now() >= deadline {
                return Ok(n);
            }
            give_up()?;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops reading; the latencies and when the last record arrived (µs since the epoch).
    ///
    /// # Errors
    /// The reader failed.
    pub fn finish(mut self) -> Result<(Latencies, i64)> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle
            .take()
            .context("live reader already finished")?
            .join()
            .map_err(|_| anyhow::anyhow!("live reader panicked"))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_read_gate_lets_through_the_share_of_records_read() {
        let gate = ReadGate {
            read_bytes: Arc::new(AtomicU64::new(0)),
            total_bytes: 1_000,
        };
        assert_eq!(gate.allowed(400), 0);
        gate.read_bytes.store(250, Ordering::Relaxed);
        assert_eq!(gate.allowed(400), 100);
        gate.read_bytes.store(1_000, Ordering::Relaxed);
        assert_eq!(gate.allowed(400), 400);
        // Opened whatever the read did: no record waits for it any more.
        gate.read_bytes.store(u64::MAX, Ordering::Relaxed);
        assert!(gate.allowed(400) >= 400);
        let empty = ReadGate {
            read_bytes: Arc::new(AtomicU64::new(0)),
            total_bytes: 0,
        };
        assert_eq!(empty.allowed(10), 0);
    }
}
