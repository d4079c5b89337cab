//! Recovery probes: after a fault ends, one outbox row is committed on its own key (`probe`, its
//! own topic); the time until it is read back from Kafka is the relay's recovery time.
//!
//! [`ProbeWatcher`] is a long-lived consumer on its own thread that notes when each probe
//! record arrives, so the measurement does not include starting a consumer.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use crate::unique::unique_suffix;

type Seen = Arc<Mutex<HashMap<String, Instant>>>;

/// Watches the probe topic and records when each `event_key` first arrived.
pub struct ProbeWatcher {
    seen: Seen,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ProbeWatcher {
    /// Starts consuming every partition of `topic` (which must exist) from the beginning.
    ///
    /// # Errors
    /// The consumer cannot be created or the topic's partitions cannot be found.
    pub fn start(bootstrap: &str, topic: &str) -> Result<Self> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set(
                "group.id",
                format!("outbox-relay-probe-{}", unique_suffix()),
            )
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("allow.auto.create.topics", "false")
            .set("fetch.wait.max.ms", "50")
            .set("reconnect.backoff.max.ms", "500")
            .create()
            .context("creating the probe consumer")?;
        let md = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .with_context(|| format!("metadata of {topic}"))?;
        let partitions: Vec<i32> = md
            .topics()
            .iter()
            .find(|t| t.name() == topic)
            .map(|t| t.partitions().iter().map(|p| p.id()).collect())
            .unwrap_or_default();
        if partitions.is_empty() {
            return Err(anyhow!("topic {topic} has no partitions (does it exist?)"));
        }
        let mut tpl = TopicPartitionList::new();
        for p in partitions {
            tpl.add_partition_offset(topic, p, Offset::Beginning)?;
        }
        consumer.assign(&tpl).context("assigning the probe topic")?;
        let seen: Seen = Arc::new(Mutex::new(HashMap::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (seen, stop) = (Arc::clone(&seen), Arc::clone(&stop));
            std::thread::Builder::new()
                .name("probe-watcher".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
                            let ek = m.headers().and_then(|h| {
                                h.iter()
                                    .find(|h| h.key == "event_key")
                                    .and_then(|h| h.value)
                                    .and_then(|v| std::str::from_utf8(v).ok())
                                    .map(str::to_owned)
                            });
                            if let Some(ek) = ek {
                                seen.lock()
                                    .unwrap_or_else(|e| e.into_inner())
                                    .entry(ek)
                                    .or_insert_with(Instant::now);
                            }
                        }
                    }
                })
                .context("starting the probe thread")?
        };
        Ok(Self {
            seen,
            stop,
            thread: Some(thread),
        })
    }

    /// When `event_key` arrived, if it has.
    pub fn arrived(&self, event_key: &str) -> Option<Instant> {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(event_key)
            .copied()
    }

    /// Waits until `event_key` has arrived (polling every 20 ms) and returns when it did.
    ///
    /// # Errors
    /// It did not arrive within `timeout`.
    pub async fn wait_for(&self, event_key: &str, timeout: Duration) -> Result<Instant> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(t) = self.arrived(event_key) {
                return Ok(t);
            }
            if Instant::now() >= deadline {
                return Err(anyhow!(
                    "probe {event_key} did not arrive on Kafka within {timeout:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for ProbeWatcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
