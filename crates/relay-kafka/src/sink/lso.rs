//! Exactly-once: watches the last stable offset (LSO) of the topics the relay writes. A
//! `read_committed` consumer reads a partition only up to its LSO, the first offset of the
//! oldest transaction still open there. An LSO that stays put while records follow it means a
//! transaction is hanging (a producer that died without its transaction being aborted, or the
//! relay's own commit stuck), and every `read_committed` consumer of that partition waits.
//!
//! The lag is high watermark minus LSO, read with `ListOffsets` at both isolation levels
//! (KIP-98); the relay's own transactions make it briefly non-zero, a hanging one keeps the LSO
//! fixed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};

use super::LogContext;
use crate::kafka_log::KafkaLog;
use rdkafka::ClientConfig;

use outbox_relay_core::config::KafkaConfig;

/// Longest wait for one watermark or metadata answer.
const QUERY_TIMEOUT: Duration = Duration::from_secs(5);

/// Samples the LSO lag of a set of topics (see the module documentation).
pub struct LsoMonitor {
    topics: Arc<Mutex<std::collections::HashSet<String>>>,
    progress_topic: String,
    config: ClientConfig,
    metrics: Arc<outbox_relay_core::observe::metrics::Metrics>,
}

impl LsoMonitor {
    pub(super) fn new(
        topics: Arc<Mutex<std::collections::HashSet<String>>>,
        progress_topic: String,
        kafka: &KafkaConfig,
        metrics: Arc<outbox_relay_core::observe::metrics::Metrics>,
    ) -> Self {
        Self {
            topics,
            progress_topic,
            config: super::transactional::consumer_config(kafka),
            metrics,
        }
    }

    /// Samples every `interval` until dropped (spawn it; abort the task to stop), feeding
    /// `outbox_relay_last_stable_offset_lag_records` and `…_stuck_seconds`.
    pub async fn run(self, interval: Duration) {
        let consumers = tokio::task::spawn_blocking({
            let config = self.config.clone();
            move || -> Option<(BaseConsumer<LogContext>, BaseConsumer<LogContext>)> {
                let log = KafkaLog::of(config.get("bootstrap.servers").unwrap_or_default());
                let make = |isolation: &str| {
                    let mut c = config.clone();
                    c.set("isolation.level", isolation)
                        .set("group.id", "outbox-relay.lso-monitor")
                        .set("enable.auto.commit", "false");
                    c.create_with_context(LogContext(Arc::clone(&log))).ok()
                };
                Some((make("read_committed")?, make("read_uncommitted")?))
            }
        })
        .await
        .ok()
        .flatten();
        let Some(consumers) = consumers else {
            tracing::warn!("cannot create the last-stable-offset monitor's consumers");
            return;
        };
        let consumers = Arc::new(consumers);
        // (topic, partition) → (LSO, since when it has not moved while records follow it).
        let mut stuck: HashMap<(String, i32), (i64, Instant)> = HashMap::new();
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let mut topics: Vec<String> = self
                .topics
                .lock()
                .map(|t| t.iter().cloned().collect())
                .unwrap_or_default();
            topics.push(self.progress_topic.clone());
            let c = Arc::clone(&consumers);
            let sample = tokio::task::spawn_blocking(move || sample(&c.0, &c.1, &topics)).await;
            let Ok(sample) = sample else { continue };
            let now = Instant::now();
            let mut total = 0;
            let mut oldest: Option<(String, i32, Duration)> = None;
            stuck.retain(|k, _| sample.iter().any(|(t, p, _, _)| (t, p) == (&k.0, &k.1)));
            for (topic, partition, lso, lag) in sample {
                total += lag;
                let key = (topic, partition);
                if lag <= 0 {
                    stuck.remove(&key);
                    continue;
                }
                let entry = stuck.entry(key.clone()).or_insert((lso, now));
                if entry.0 != lso {
                    *entry = (lso, now);
                }
                let age = now.duration_since(entry.1);
                if oldest.as_ref().is_none_or(|o| age > o.2) {
                    oldest = Some((key.0, key.1, age));
                }
            }
            self.metrics.last_stable_offset(total, oldest);
        }
    }
}

/// `(topic, partition, LSO, high watermark − LSO)` of every partition of `topics` that
/// answered.
fn sample(
    committed: &BaseConsumer<LogContext>,
    uncommitted: &BaseConsumer<LogContext>,
    topics: &[String],
) -> Vec<(String, i32, i64, i64)> {
    let mut out = Vec::new();
    for topic in topics {
        let Ok(metadata) = committed.fetch_metadata(Some(topic), QUERY_TIMEOUT) else {
            continue;
        };
        let partitions: Vec<i32> = metadata
            .topics()
            .iter()
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect();
        for p in partitions {
            let (Ok((_, lso)), Ok((_, high))) = (
                committed.fetch_watermarks(topic, p, QUERY_TIMEOUT),
                uncommitted.fetch_watermarks(topic, p, QUERY_TIMEOUT),
            ) else {
                continue;
            };
            out.push((topic.clone(), p, lso, (high - lso).max(0)));
        }
    }
    out
}
