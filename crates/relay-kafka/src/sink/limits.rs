//! Topic size limits: each topic's `max.message.bytes`, learnt when the relay first sends to
//! it, so a record the broker would refuse as too large is refused before it is sent.
//!
//! Why before: with the idempotent producer and `enable.gapless.guarantee`, a batch the broker
//! refuses (`MSG_SIZE_TOO_LARGE`) is a fatal producer error, not a per-record failure
//! (librdkafka does not split batches), so one too-large record would stop the relay at every
//! restart. Refused here, it becomes a row error like a record over the producer's own
//! `message.max.bytes`: dead-lettered (without its value) or a stop with the reason.
//!
//! The broker compares a whole record batch with `max.message.bytes` (Kafka documentation,
//! topic configuration `max.message.bytes`: "the largest record batch size allowed"), so the
//! check uses the size of a batch holding the record alone ([`batch_size_alone`]). A topic
//! whose limit is below the producer's batch limit (`min(message.max.bytes, batch.size)`) can
//! still see batches of small records refused: that is logged as a warning here and is a
//! failure of `outbox-relay check`.
//!
//! With producer compression the broker sees compressed batches, whose size is not known
//! before sending: no record is refused here then.
//!
//! The same DescribeConfigs answer gives the topic's timestamp rules (`message.timestamp.type`,
//! `message.timestamp.before.max.ms`, `message.timestamp.after.max.ms`; Kafka documentation,
//! topic configurations): a `CreateTime` record outside them is refused by the broker
//! (`INVALID_TIMESTAMP`), which with the idempotent producer is a fatal error as well. Kafka 4
//! refuses, by default, timestamps more than one hour in the future (KIP-1030).
//! [`TopicLimits::timestamp_refusal`] says so before sending.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::ClientConfig;

use crate::sink::{HeaderValue, LogContext};
use outbox_relay_core::config::KafkaConfig;

/// librdkafka's default `message.max.bytes` and `batch.size` (CONFIGURATION.md), bytes.
pub const LIBRDKAFKA_DEFAULT_MAX_BYTES: u64 = 1_000_000;

/// How long the relay waits for a topic's configuration before sending without knowing it.
const DESCRIBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Least time between two reads of one topic's limit before a refusal (see
/// [`TopicLimits::relearn`]): a burst of too-large rows costs one DescribeConfigs, not one each.
const RELEARN_INTERVAL: Duration = Duration::from_secs(10);

/// Bytes of a record batch (message format v2) before its records: base offset, length,
/// partition leader epoch, magic, CRC, attributes, last offset delta, timestamps, producer id
/// and epoch, base sequence, record count (Kafka protocol documentation, "Record Batch").
pub const RECORD_BATCH_OVERHEAD: u64 = 61;

/// Bytes of a Kafka record batch (message format v2) holding only this record: the batch
/// header (61 bytes, from the base offset to the record count) plus the record with its
/// varint-encoded lengths. This is what the broker compares with the topic's
/// `max.message.bytes`. A `None` value is a null value (length -1).
///
/// Source: Kafka protocol documentation, "Record Batch" and "Record" (message format v2,
/// KIP-98); the single record has timestamp delta and offset delta 0.
pub fn batch_size_alone<K: AsRef<str>, V: HeaderValue>(
    key: &[u8],
    value: Option<&[u8]>,
    headers: &[(K, V)],
) -> u64 {
    fn len_field(len: usize) -> u64 {
        varint_size(i64::try_from(len).unwrap_or(i64::MAX)) + len as u64
    }
    let mut body: u64 = 1 // attributes
        + 1 // timestampDelta = 0
        + 1 // offsetDelta = 0
        + len_field(key.len())
        + value.map_or(varint_size(-1), |v| len_field(v.len()))
        + varint_size(i64::try_from(headers.len()).unwrap_or(i64::MAX));
    for (name, value) in headers {
        // A null value is a length of -1 (Kafka protocol, "Record Header").
        body += len_field(name.as_ref().len())
            + value
                .header_bytes()
                .map_or(varint_size(-1), |v| len_field(v.len()));
    }
    RECORD_BATCH_OVERHEAD + varint_size(i64::try_from(body).unwrap_or(i64::MAX)) + body
}

/// Bytes of `n` as a zigzag varint (Kafka's `varint`, protobuf's `sint64`).
fn varint_size(n: i64) -> u64 {
    let mut z = ((n << 1) ^ (n >> 63)) as u64;
    let mut bytes = 1;
    while z >= 0x80 {
        z >>= 7;
        bytes += 1;
    }
    bytes
}

/// The producer's own limits, from `[kafka.properties]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerLimits {
    /// `message.max.bytes`: the largest record (key, value and headers), bytes.
    pub message_max_bytes: u64,
    /// `batch.size`: the largest batch of several records, bytes.
    pub batch_size: u64,
    /// `compression.type` (or `compression.codec`) is set to something else than `none`.
    pub compresses: bool,
}

impl ProducerLimits {
    /// The limits `config` gives the producer (librdkafka's defaults where unset).
    pub fn of(config: &KafkaConfig) -> Self {
        let number = |key: &str| {
            config
                .properties
                .get(key)
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(LIBRDKAFKA_DEFAULT_MAX_BYTES)
        };
        let compresses = ["compression.type", "compression.codec"].iter().any(|k| {
            config
                .properties
                .get(*k)
                .is_some_and(|v| !v.trim().eq_ignore_ascii_case("none"))
        });
        Self {
            message_max_bytes: number("message.max.bytes"),
            batch_size: number("batch.size"),
            compresses,
        }
    }

    /// The largest batch of several records librdkafka builds, bytes: it closes a batch before
    /// a record that would take it over `min(message.max.bytes, batch.size)`
    /// (`rdkafka_msgset_writer.c`).
    pub fn batch_limit(&self) -> u64 {
        self.message_max_bytes.min(self.batch_size)
    }
}

/// When a topic whose `max.message.bytes` is `topic_max` can see a batch of records that are
/// each small enough refused: (what is wrong, how to fix it); `None` when it cannot.
pub fn batch_hazard(
    topic: &str,
    topic_max: u64,
    producer: &ProducerLimits,
) -> Option<(String, String)> {
    (!producer.compresses && topic_max < producer.batch_limit()).then(|| {
        (
            format!(
                "topic {topic} takes record batches of at most {topic_max} bytes \
                 (max.message.bytes) but the producer builds batches of up to {} bytes (min of \
                 message.max.bytes and batch.size): a full batch of small records is refused, \
                 which stops the relay",
                producer.batch_limit()
            ),
            format!(
                "set \"batch.size\" in [kafka.properties] to at most {topic_max}, or raise the \
                 topic's max.message.bytes (kafka-configs.sh --alter --entity-type topics \
                 --entity-name {topic} --add-config max.message.bytes=…)"
            ),
        )
    })
}

/// Which record timestamps a topic takes (Kafka topic configurations `message.timestamp.type`,
/// `message.timestamp.before.max.ms` and `message.timestamp.after.max.ms`; before Kafka 3.6,
/// `message.timestamp.difference.max.ms` for both directions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimestampRules {
    /// `message.timestamp.type = LogAppendTime`: the broker stamps each record with its own
    /// clock and refuses none for its timestamp.
    pub log_append_time: bool,
    /// Most ms a `CreateTime` timestamp may be behind the broker's clock.
    pub before_max_ms: i64,
    /// Most ms a `CreateTime` timestamp may be ahead of the broker's clock.
    pub after_max_ms: i64,
}

/// Slack kept below a topic's timestamp limits, ms: the broker checks with its own clock, and
/// later than the relay (batching, retries). A tenth of the limit, at most a minute.
fn timestamp_slack(limit_ms: i64) -> i64 {
    (limit_ms / 10).clamp(0, 60_000)
}

/// `ms` (since the epoch) as UTC text for messages.
fn utc_text(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).map_or_else(
        || format!("{ms} ms"),
        |t| t.format("%Y-%m-%d %H:%M:%S%.3f UTC").to_string(),
    )
}

/// `ms` as hours and minutes (`8 h 0 min`) for messages.
fn span_text(ms: i64) -> String {
    let minutes = (ms.unsigned_abs() + 30_000) / 60_000;
    format!("{} h {} min", minutes / 60, minutes % 60)
}

/// Why no topic takes `timestamp_ms`, or `None`: a negative timestamp is refused by Kafka's
/// clients and 0 is librdkafka's "now" (`rd_kafka_producev` `RD_KAFKA_VTYPE_TIMESTAMP`).
pub fn invalid_timestamp(timestamp_ms: i64) -> Option<String> {
    (timestamp_ms <= 0).then(|| {
        format!(
            "the record timestamp {} ({timestamp_ms} ms since the epoch) is not after \
             1970-01-01 00:00:00 UTC, which Kafka does not take",
            utc_text(timestamp_ms)
        )
    })
}

impl TimestampRules {
    /// Why this topic's broker would refuse a record stamped `timestamp_ms` when its clock
    /// reads `now_ms` (ms since the epoch), or `None`.
    pub fn refusal(&self, topic: &str, timestamp_ms: i64, now_ms: i64) -> Option<String> {
        if let Some(reason) = invalid_timestamp(timestamp_ms) {
            return Some(reason);
        }
        if self.log_append_time {
            return None;
        }
        let ahead = timestamp_ms.saturating_sub(now_ms);
        if ahead
            > self
                .after_max_ms
                .saturating_sub(timestamp_slack(self.after_max_ms))
        {
            return Some(format!(
                "the record timestamp {} is {} ahead of the relay's clock, and topic {topic} \
                 refuses timestamps more than message.timestamp.after.max.ms = {} ms ahead \
                 (Kafka 4's default is one hour)",
                utc_text(timestamp_ms),
                span_text(ahead),
                self.after_max_ms
            ));
        }
        let behind = now_ms.saturating_sub(timestamp_ms);
        if behind
            > self
                .before_max_ms
                .saturating_sub(timestamp_slack(self.before_max_ms))
        {
            return Some(format!(
                "the record timestamp {} is {} behind the relay's clock, and topic {topic} \
                 refuses timestamps more than message.timestamp.before.max.ms = {} ms old",
                utc_text(timestamp_ms),
                span_text(behind),
                self.before_max_ms
            ));
        }
        None
    }

    /// The rules in a DescribeConfigs answer (`value` looks an entry up); `None` without
    /// `message.timestamp.type`.
    fn from_config(value: impl Fn(&str) -> Option<String>) -> Option<Self> {
        let kind = value("message.timestamp.type")?;
        let ms = |key: &str| value(key).and_then(|v| v.trim().parse::<i64>().ok());
        let both = ms("message.timestamp.difference.max.ms");
        Some(Self {
            log_append_time: kind.eq_ignore_ascii_case("LogAppendTime"),
            before_max_ms: ms("message.timestamp.before.max.ms")
                .or(both)
                .unwrap_or(i64::MAX),
            after_max_ms: ms("message.timestamp.after.max.ms")
                .or(both)
                .unwrap_or(i64::MAX),
        })
    }
}

/// What DescribeConfigs says about one topic.
struct TopicConfig {
    max_message_bytes: Option<u64>,
    timestamps: Option<TimestampRules>,
}

/// The `max.message.bytes` and timestamp rules of the topics the relay sends to: read when it
/// first sends to a topic, and again before a record would be refused ([`TopicLimits::relearn`]).
pub struct TopicLimits {
    admin: ClientConfig,
    /// The cluster's log, for the admin clients' lines.
    log: std::sync::Arc<crate::kafka_log::KafkaLog>,
    producer: ProducerLimits,
    /// Topic → `max.message.bytes`.
    limits: Mutex<HashMap<String, u64>>,
    /// Topic → its timestamp rules.
    timestamps: Mutex<HashMap<String, TimestampRules>>,
    /// The brokers' `auto.create.topics.enable`, once read.
    auto_create: Mutex<Option<bool>>,
    /// Topic → when its limit was last asked for, answered or not (throttles [`Self::relearn`]).
    asked: Mutex<HashMap<String, Instant>>,
    /// The smallest limit learnt so far (`u64::MAX` when none): a record whose batch is not
    /// larger skips the per-topic lookup.
    smallest: AtomicU64,
    /// The tightest timestamp bounds of the topics learnt so far (see [`Bounds`]): a record
    /// within them skips the per-topic lookup, which was a lock, a hash and a clock read per
    /// record on the pipeline's thread.
    bounds: Bounds,
}

/// How far ahead of and behind the relay's clock (ms) every topic learnt so far takes a
/// record's timestamp, slack included; `i64::MAX` for both while no `CreateTime` topic is
/// known. A positive timestamp within both is taken by every topic: the per-topic rules are
/// read only for one outside them.
#[derive(Debug)]
struct Bounds {
    ahead_ms: AtomicI64,
    behind_ms: AtomicI64,
}

impl Bounds {
    fn none() -> Self {
        Self {
            ahead_ms: AtomicI64::new(i64::MAX),
            behind_ms: AtomicI64::new(i64::MAX),
        }
    }

    /// Recomputed from all the rules known (not just narrowed: a topic's rules may be read
    /// again, wider).
    fn set<'a>(&self, rules: impl Iterator<Item = &'a TimestampRules>) {
        let (mut ahead, mut behind) = (i64::MAX, i64::MAX);
        for r in rules.filter(|r| !r.log_append_time) {
            ahead = ahead.min(
                r.after_max_ms
                    .saturating_sub(timestamp_slack(r.after_max_ms)),
            );
            behind = behind.min(
                r.before_max_ms
                    .saturating_sub(timestamp_slack(r.before_max_ms)),
            );
        }
        self.ahead_ms.store(ahead, Ordering::Relaxed);
        self.behind_ms.store(behind, Ordering::Relaxed);
    }

    /// `true` when every topic learnt so far takes `timestamp_ms`.
    fn take(&self, timestamp_ms: i64) -> bool {
        if timestamp_ms <= 0 {
            return false;
        }
        let (ahead, behind) = (
            self.ahead_ms.load(Ordering::Relaxed),
            self.behind_ms.load(Ordering::Relaxed),
        );
        if ahead == i64::MAX && behind == i64::MAX {
            return true;
        }
        let now = now_ms();
        timestamp_ms.saturating_sub(now) <= ahead && now.saturating_sub(timestamp_ms) <= behind
    }
}

impl TopicLimits {
    /// For a producer configured by `config`; asks nothing yet.
    pub fn new(config: &KafkaConfig) -> Self {
        Self {
            admin: super::admin_client_config(config),
            log: crate::kafka_log::KafkaLog::of(&config.bootstrap_servers),
            producer: ProducerLimits::of(config),
            limits: Mutex::new(HashMap::new()),
            timestamps: Mutex::new(HashMap::new()),
            auto_create: Mutex::new(None),
            asked: Mutex::new(HashMap::new()),
            smallest: AtomicU64::new(u64::MAX),
            bounds: Bounds::none(),
        }
    }

    /// The context of an admin client: its lines go to the cluster's log.
    fn context(&self) -> LogContext {
        LogContext(std::sync::Arc::clone(&self.log))
    }

    /// Asks the brokers for `topic`'s `max.message.bytes` and timestamp rules (DescribeConfigs)
    /// and remembers them; warns when batches of small records can exceed the size limit
    /// ([`batch_hazard`]). With compression on, sizes are not checked. When the answer does not
    /// come (no `DescribeConfigs` permission, a timeout), warns and leaves the topic unchecked:
    /// the broker still refuses what it does not take, found and handled as a row error after
    /// the fact (the pipeline resends one record at a time to find it).
    pub async fn learn(&self, topic: &str) {
        if let Ok(mut asked) = self.asked.lock() {
            asked.insert(topic.to_owned(), Instant::now());
        }
        let config = match self.describe(topic).await {
            Ok(config) => config,
            Err(reason) => {
                tracing::warn!(
                    topic,
                    "cannot read the topic's configuration ({reason}); records too large for it \
                     or with timestamps it refuses are found only when the broker refuses them \
                     (grant DescribeConfigs on the topic to have them refused before sending)"
                );
                return;
            }
        };
        if let Some(rules) = config.timestamps {
            self.remember_timestamps(topic, rules);
        }
        if self.producer.compresses {
            return;
        }
        match config
            .max_message_bytes
            .ok_or("the answer has no max.message.bytes")
        {
            Ok(limit) => {
                if let Some((problem, fix)) = batch_hazard(topic, limit, &self.producer) {
                    tracing::warn!(topic, max_message_bytes = limit, "{problem}. Fix: {fix}");
                }
                if let Ok(mut limits) = self.limits.lock() {
                    limits.insert(topic.to_owned(), limit);
                    // Recomputed, not just lowered: a raised limit must count too.
                    let smallest = limits.values().copied().min().unwrap_or(u64::MAX);
                    self.smallest.store(smallest, Ordering::Relaxed);
                }
            }
            Err(reason) => {
                tracing::warn!(topic, "cannot read the topic's max.message.bytes: {reason}")
            }
        }
    }

    /// Keeps `topic`'s timestamp rules (and the bounds every known topic takes).
    fn remember_timestamps(&self, topic: &str, rules: TimestampRules) {
        if let Ok(mut timestamps) = self.timestamps.lock() {
            timestamps.insert(topic.to_owned(), rules);
            self.bounds.set(timestamps.values());
        }
    }

    /// Why `topic` would refuse a record stamped `timestamp_ms`, by its rules as last read and
    /// the relay's clock; `None` when it takes it or its rules are unknown (only a timestamp no
    /// topic takes is refused then, see [`invalid_timestamp`]).
    pub fn timestamp_refusal(&self, topic: &str, timestamp_ms: i64) -> Option<String> {
        if self.bounds.take(timestamp_ms) {
            return None;
        }
        let rules = self.timestamps.lock().ok()?.get(topic).copied();
        match rules {
            Some(rules) => rules.refusal(topic, timestamp_ms, now_ms()),
            None => invalid_timestamp(timestamp_ms),
        }
    }

    /// Why the broker would refuse a record of this key, value and headers for `topic`, or
    /// `None` when it fits, when the topic's limit is unknown, or when the record is over the
    /// producer's own `message.max.bytes` (librdkafka refuses that one when it is sent).
    pub fn refusal<K: AsRef<str>, V: HeaderValue>(
        &self,
        topic: &str,
        key: &[u8],
        value: Option<&[u8]>,
        headers: &[(K, V)],
    ) -> Option<String> {
        let smallest = self.smallest.load(Ordering::Relaxed);
        if smallest == u64::MAX {
            return None;
        }
        let size = batch_size_alone(key, value, headers);
        if size <= smallest {
            return None;
        }
        let raw = super::record_size(key, value, headers);
        if raw as u64 > self.producer.message_max_bytes {
            // librdkafka refuses it itself, with the fix that names both limits.
            return None;
        }
        let limit = *self.limits.lock().ok()?.get(topic)?;
        (size > limit).then(|| {
            format!(
                "the record ({size} bytes as a record batch) is larger than topic {topic}'s \
                 max.message.bytes = {limit}, so the broker would refuse it. Fix: raise the \
                 topic's max.message.bytes (kafka-configs.sh --alter --entity-type topics \
                 --entity-name {topic} --add-config max.message.bytes=…), or keep outbox \
                 payloads smaller"
            )
        })
    }

    /// Reads `topic`'s limit again unless that was done less than 10 s ago: before a record is
    /// refused, so that an operator who raised the topic's `max.message.bytes` (as the refusal's
    /// fix says) does not see more rows refused until the relay restarts.
    pub async fn relearn(&self, topic: &str) {
        let known = self
            .limits
            .lock()
            .is_ok_and(|limits| limits.contains_key(topic));
        let recent = self
            .asked
            .lock()
            .ok()
            .and_then(|asked| asked.get(topic).map(|at| at.elapsed() < RELEARN_INTERVAL))
            .unwrap_or(false);
        // A topic whose limit was never learnt refuses nothing here: nothing to read again.
        if known && !recent {
            self.learn(topic).await;
        }
    }

    /// The broker's `auto.create.topics.enable` (DescribeConfigs of broker `broker_id`), read
    /// once and remembered; `None` when it cannot be read.
    pub async fn auto_create(&self, broker_id: i32) -> Option<bool> {
        if let Some(known) = self.auto_create.lock().ok().and_then(|a| *a) {
            return Some(known);
        }
        let config = self.admin.clone();
        let context = self.context();
        let admin: AdminClient<LogContext> =
            tokio::task::spawn_blocking(move || config.create_with_context(context).ok())
                .await
                .ok()
                .flatten()?;
        let spec = ResourceSpecifier::Broker(broker_id);
        let opts = AdminOptions::new().request_timeout(Some(DESCRIBE_TIMEOUT));
        let answer = admin.describe_configs([&spec], &opts).await;
        tokio::task::spawn_blocking(move || drop(admin));
        let value = answer
            .ok()?
            .into_iter()
            .find_map(Result::ok)?
            .get("auto.create.topics.enable")?
            .value
            .as_deref()
            .map(|v| v.eq_ignore_ascii_case("true"))?;
        if let Ok(mut known) = self.auto_create.lock() {
            *known = Some(value);
        }
        Some(value)
    }

    async fn describe(&self, topic: &str) -> Result<TopicConfig, String> {
        // Creating a librdkafka client starts threads (and may set up TLS): not on the
        // runtime's threads.
        let config = self.admin.clone();
        let context = self.context();
        let admin: AdminClient<LogContext> = tokio::task::spawn_blocking(move || {
            config
                .create_with_context(context)
                .map_err(|e: rdkafka::error::KafkaError| e.to_string())
        })
        .await
        .map_err(|e| e.to_string())??;
        let spec = ResourceSpecifier::Topic(topic);
        let opts = AdminOptions::new().request_timeout(Some(DESCRIBE_TIMEOUT));
        let answer = admin.describe_configs([&spec], &opts).await;
        // Destroying a librdkafka client joins its threads: not on the runtime's threads.
        tokio::task::spawn_blocking(move || drop(admin));
        let resource = answer
            .map_err(|e| e.to_string())?
            .into_iter()
            .next()
            .ok_or("no answer for the topic")?
            .map_err(|code| code.to_string())?;
        let value = |key: &str| resource.get(key).and_then(|entry| entry.value.clone());
        Ok(TopicConfig {
            max_message_bytes: value("max.message.bytes").and_then(|v| v.parse().ok()),
            timestamps: TimestampRules::from_config(value),
        })
    }
}

/// The relay's clock, ms since the epoch.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NO_HEADERS: &[(&str, Vec<u8>)] = &[];

    #[test]
    fn timestamp_rules_follow_the_topic_configuration() {
        let now = 1_767_323_045_000;
        let hour = 3_600_000;
        let kafka4 = TimestampRules::from_config(|k| {
            [
                ("message.timestamp.type", "CreateTime"),
                ("message.timestamp.before.max.ms", "9223372036854775807"),
                ("message.timestamp.after.max.ms", "3600000"),
            ]
            .iter()
            .find(|(key, _)| *key == k)
            .map(|(_, v)| (*v).to_owned())
        })
        .expect("rules");
        assert_eq!(kafka4.after_max_ms, hour);
        // UTC+8 local time read as UTC: 8 h ahead.
        let reason = kafka4.refusal("t", now + 8 * hour, now).expect("refused");
        assert!(reason.contains("is 8 h 0 min ahead"), "{reason}");
        assert!(
            reason.contains("message.timestamp.after.max.ms = 3600000"),
            "{reason}"
        );
        assert_eq!(kafka4.refusal("t", now + 30 * 60_000, now), None);
        // Within a minute of the limit counts as refused (the broker's clock, later sends).
        assert!(kafka4.refusal("t", now + hour - 30_000, now).is_some());
        assert_eq!(kafka4.refusal("t", 1, now), None, "no limit into the past");
        assert!(kafka4.refusal("t", -5, now).is_some(), "negative");
        let zero = kafka4.refusal("t", 0, now).expect("librdkafka's now");
        assert!(
            zero.ends_with(
                "(0 ms since the epoch) is not after 1970-01-01 00:00:00 UTC, which Kafka does not \
                 take"
            ),
            "{zero}"
        );
        let old = TimestampRules {
            log_append_time: false,
            before_max_ms: 24 * hour,
            after_max_ms: i64::MAX,
        };
        let reason = old.refusal("t", now - 48 * hour, now).expect("refused");
        assert!(reason.contains("48 h 0 min behind"), "{reason}");
        assert_eq!(old.refusal("t", now + 1_000 * hour, now), None);
        let append = TimestampRules {
            log_append_time: true,
            ..kafka4
        };
        assert_eq!(append.refusal("t", now + 8 * hour, now), None);
        assert!(append.refusal("t", -1, now).is_some());
        // Before Kafka 3.6: one limit for both directions.
        let legacy = TimestampRules::from_config(|k| match k {
            "message.timestamp.type" => Some("CreateTime".into()),
            "message.timestamp.difference.max.ms" => Some("1000".into()),
            _ => None,
        })
        .expect("rules");
        assert_eq!((legacy.before_max_ms, legacy.after_max_ms), (1000, 1000));
    }

    #[test]
    fn zigzag_varint_sizes() {
        for (n, bytes) in [
            (0, 1),
            (-1, 1),
            (63, 1),
            (64, 2),
            (-65, 2),
            (8191, 2),
            (8192, 3),
            (1 << 19, 3),
            (1 << 20, 4),
            (1 << 27, 5),
            (i64::MAX, 10),
        ] {
            assert_eq!(varint_size(n), bytes, "varint size of {n}");
        }
    }

    #[test]
    fn batch_of_one_record_by_hand() {
        // Header 61; body: attributes 1, timestampDelta 1, offsetDelta 1, key length 1 + "k",
        // value length 1 + "v", header count 1 = 8; body length varint 1.
        assert_eq!(batch_size_alone(b"k", Some(b"v"), NO_HEADERS), 70);
        // A null value is its length (-1, one byte) alone: body 7.
        assert_eq!(batch_size_alone(b"k", None, NO_HEADERS), 69);
        // One header "id" = "42": 1 + 2 + 1 + 2 more, body 14.
        let h = [("id", b"42".to_vec())];
        assert_eq!(batch_size_alone(b"k", Some(b"v"), &h), 76);
        // A 100-byte value: its length takes 2 bytes (zigzag 200), body 3 + 2 + 102 + 1 = 108
        // takes 2 too.
        let v = vec![b'x'; 100];
        assert_eq!(batch_size_alone(b"k", Some(&v), NO_HEADERS), 61 + 2 + 108);
    }

    fn config(props: &[(&str, &str)]) -> KafkaConfig {
        KafkaConfig {
            bootstrap_servers: "127.0.0.1:9092".into(),
            max_in_flight: 1000,
            properties: props
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..KafkaConfig::default()
        }
    }

    fn limits(props: &[(&str, &str)]) -> ProducerLimits {
        ProducerLimits::of(&config(props))
    }

    #[test]
    fn producer_limits_default_to_librdkafkas() {
        let l = limits(&[]);
        assert_eq!(
            (l.message_max_bytes, l.batch_size, l.compresses),
            (1_000_000, 1_000_000, false)
        );
        let l = limits(&[
            ("message.max.bytes", "5000000"),
            ("batch.size", "200000"),
            ("compression.type", "zstd"),
        ]);
        assert_eq!((l.batch_limit(), l.compresses), (200_000, true));
        assert!(!limits(&[("compression.type", "none")]).compresses);
    }

    #[test]
    fn batch_hazard_only_below_the_batch_limit_without_compression() {
        let default = limits(&[]);
        // Kafka's default topic limit (1048588) is above librdkafka's batch limit.
        assert_eq!(batch_hazard("t", 1_048_588, &default), None);
        let (problem, fix) = batch_hazard("t", 500_000, &default).expect("hazard");
        assert!(problem.contains("up to 1000000 bytes"), "{problem}");
        assert!(
            fix.contains("\"batch.size\" in [kafka.properties] to at most 500000"),
            "{fix}"
        );
        assert_eq!(
            batch_hazard("t", 500_000, &limits(&[("batch.size", "400000")])),
            None
        );
        assert_eq!(
            batch_hazard("t", 500_000, &limits(&[("compression.type", "lz4")])),
            None
        );
    }

    #[test]
    fn refusal_uses_the_topic_limit_once_learnt() {
        let l = TopicLimits::new(&config(&[]));
        let big = vec![0u8; 2_000];
        assert_eq!(l.refusal("t", b"k", Some(&big), NO_HEADERS), None);
        l.limits.lock().expect("lock").insert("t".into(), 1_000);
        l.smallest.store(1_000, Ordering::Relaxed);
        let reason = l
            .refusal("t", b"k", Some(&big), NO_HEADERS)
            .expect("refused");
        assert!(reason.contains("max.message.bytes = 1000"), "{reason}");
        assert_eq!(l.refusal("t", b"k", Some(b"small"), NO_HEADERS), None);
        assert_eq!(l.refusal("other", b"k", Some(&big), NO_HEADERS), None);
        // Over message.max.bytes too: left to librdkafka's own refusal.
        let huge = vec![0u8; 1_000_001];
        assert_eq!(l.refusal("t", b"", Some(&huge), NO_HEADERS), None);
    }

    #[test]
    fn timestamp_refusal_by_the_topics_rules_past_the_bounds_of_all() {
        let hour = 3_600_000;
        let now = now_ms();
        let l = TopicLimits::new(&config(&[]));
        // No rules known: only what no topic takes.
        assert_eq!(l.timestamp_refusal("t", now + 8 * hour), None);
        assert!(l.timestamp_refusal("t", 0).is_some());
        assert!(l.timestamp_refusal("t", -1).is_some());
        l.remember_timestamps(
            "t",
            TimestampRules {
                log_append_time: false,
                before_max_ms: i64::MAX,
                after_max_ms: hour,
            },
        );
        l.remember_timestamps(
            "old",
            TimestampRules {
                log_append_time: false,
                before_max_ms: 24 * hour,
                after_max_ms: i64::MAX,
            },
        );
        l.remember_timestamps(
            "append",
            TimestampRules {
                log_append_time: true,
                before_max_ms: 1,
                after_max_ms: 1,
            },
        );
        // Within the bounds of every topic: taken, without the per-topic rules.
        for topic in ["t", "old", "append", "unknown"] {
            assert_eq!(l.timestamp_refusal(topic, now), None, "{topic}");
            assert!(l.timestamp_refusal(topic, 0).is_some(), "{topic}");
        }
        // Past one topic's bound: each topic's own rules decide.
        let ahead = now + 2 * hour;
        let reason = l.timestamp_refusal("t", ahead).expect("refused");
        assert!(
            reason.contains("ahead of the relay's clock, and topic t"),
            "{reason}"
        );
        assert_eq!(l.timestamp_refusal("old", ahead), None);
        assert_eq!(l.timestamp_refusal("append", ahead), None);
        assert_eq!(l.timestamp_refusal("unknown", ahead), None);
        let behind = now - 48 * hour;
        let reason = l.timestamp_refusal("old", behind).expect("refused");
        assert!(reason.contains("48 h 0 min behind"), "{reason}");
        assert_eq!(l.timestamp_refusal("t", behind), None);
        // Read again wider: the bounds widen too.
        l.remember_timestamps(
            "t",
            TimestampRules {
                log_append_time: false,
                before_max_ms: i64::MAX,
                after_max_ms: 10 * hour,
            },
        );
        assert_eq!(l.timestamp_refusal("t", ahead), None);
        assert!(l.bounds.take(ahead), "every topic takes it now");
    }
}
