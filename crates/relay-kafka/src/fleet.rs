//! A fleet's membership: which sources this process runs, decided by a Kafka consumer group.
//!
//! Every process of a fleet joins consumer group `fleet.group_id` on `fleet.control_topic`
//! with `partition.assignment.strategy=cooperative-sticky`. The topic holds no record; its
//! partitions stand for the sources: source `name` belongs to partition
//! [`source_partition`] (`murmur2(name) & 0x7fffffff % partitions`, Kafka's default
//! partitioner), and a process runs exactly the sources of the partitions it is assigned.
//! Adding or removing a source changes neither the topic nor the assignment; the balance is
//! statistical (many sources over many partitions), which `outbox-relay fleet status` reports.
//!
//! [`Membership::join`] creates the topic when it is missing (`fleet.partitions` partitions,
//! replication factor min(3, brokers)) and polls the group on a thread of its own. Its
//! rebalance callback turns assignments into [`FleetEvent`]s for the engine: `Assigned`
//! partitions (start their sources) and `Revoked` ones, for which the callback WAITS until the
//! engine answers on `done` (its sources stopped: checkpoint written, lease released), so that
//! the partition's next owner finds the lease free. Cooperative rebalancing revokes only the
//! partitions that move: a source whose partition keeps its owner is never touched.
//!
//! Kafka documentation: "Consumer Configs" (`partition.assignment.strategy`,
//! `session.timeout.ms`, `heartbeat.interval.ms`); KIP-429 (incremental cooperative
//! rebalancing); the consumer protocol's `ConsumerProtocolAssignment` for [`group_members`].

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::TopicPartitionList;
use tokio::sync::mpsc;

use outbox_relay_core::config::process::FleetConfig;
use outbox_relay_core::config::KafkaConfig;
use outbox_relay_core::error::RelayError;

/// How long a metadata or admin request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// How long joining waits for a first broker to answer before the attempt fails (and the
/// process's `[retry]` decides what follows); a single source's start waits as long.
const JOIN_TIMEOUT: Duration = Duration::from_secs(10);

/// The control-topic partition of source `name` among `partitions`: Kafka's default
/// partitioner on the name's UTF-8 bytes (the record key a Java producer would hash).
pub fn source_partition(name: &str, partitions: i32) -> i32 {
    crate::route::key_partition(name.as_bytes(), partitions)
}

/// What the group decided for this process.
#[derive(Debug)]
pub enum FleetEvent {
    /// A rebalance completed for this process: `partitions` are added to its share (start
    /// their sources; empty when it gains none, also when it was assigned nothing at all).
    /// After the first one the process is a member of the group.
    Assigned {
        /// The partitions added (an incremental assignment, cooperative rebalancing).
        partitions: Vec<i32>,
        /// The group's generation this assignment belongs to (Kafka's `generationId`, from
        /// the consumer's group metadata; `-1` when the client does not know it).
        generation: i32,
    },
    /// These partitions are taken away (`lost`: the session had expired, another process may
    /// run them already). Stop their sources, then answer on `done`: the revocation completes
    /// only then (or after the wait given to [`Membership::join`]).
    Revoked {
        /// The partitions.
        partitions: Vec<i32>,
        /// The assignment was lost rather than revoked in a rebalance.
        lost: bool,
        /// Answer when their sources have stopped.
        done: std::sync::mpsc::SyncSender<()>,
    },
}

/// The rebalance callbacks.
struct FleetContext {
    events: mpsc::UnboundedSender<FleetEvent>,
    /// Set by [`Membership::leave`]: the sources are stopped already, nothing to wait for.
    leaving: Arc<AtomicBool>,
    revoke_wait: Duration,
}

impl ClientContext for FleetContext {}

fn partitions_of(tpl: &TopicPartitionList) -> Vec<i32> {
    tpl.elements().iter().map(|e| e.partition()).collect()
}

impl ConsumerContext for FleetContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(tpl) = rebalance else {
            return;
        };
        let partitions = partitions_of(tpl);
        if partitions.is_empty() {
            return;
        }
        let lost = consumer.assignment_lost();
        let (done, stopped) = std::sync::mpsc::sync_channel(1);
        tracing::info!(
            ?partitions,
            lost,
            "fleet: partitions revoked; stopping their sources"
        );
        if self
            .events
            .send(FleetEvent::Revoked {
                partitions,
                lost,
                done,
            })
            .is_err()
            || self.leaving.load(Ordering::SeqCst)
        {
            return;
        }
        // The revocation completes when this returns: the sources must have stopped first.
        if stopped.recv_timeout(self.revoke_wait).is_err() {
            tracing::warn!(
                waited_ms = self.revoke_wait.as_millis() as u64,
                "fleet: the revoked sources did not stop in time; the revocation completes anyway \
                 (their leases still fence them)"
            );
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                let partitions = partitions_of(tpl);
                let generation = generation_of(consumer);
                if !partitions.is_empty() {
                    tracing::info!(?partitions, generation, "fleet: partitions assigned");
                }
                // Also when empty: the rebalance completed, this process is a member.
                let _ = self.events.send(FleetEvent::Assigned {
                    partitions,
                    generation,
                });
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(e) => tracing::warn!(error = %e, "fleet: rebalance error"),
        }
    }
}

/// The generation of the group `consumer` is a member of (librdkafka's group metadata;
/// classic protocol: the `generationId` of its last JoinGroup); -1 when it has none.
#[allow(unsafe_code)]
fn generation_of<C: ConsumerContext>(consumer: &BaseConsumer<C>) -> i32 {
    use rdkafka::bindings as rdsys;
    // SAFETY: the client handle is valid while `consumer` lives; the metadata is a copy
    // librdkafka allocates for the caller (null when the consumer has no group), read once and
    // destroyed here.
    unsafe {
        let md = rdsys::rd_kafka_consumer_group_metadata(consumer.client().native_ptr());
        if md.is_null() {
            return -1;
        }
        let generation = rdsys::rd_kafka_consumer_group_metadata_generation_id(md);
        rdsys::rd_kafka_consumer_group_metadata_destroy(md);
        generation
    }
}

/// This process's membership in the fleet's group; [`Membership::leave`] ends it.
pub struct Membership {
    partitions: i32,
    stop: Arc<AtomicBool>,
    leaving: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Membership {
    /// Creates the control topic if it is missing, then joins the group. Returns the
    /// membership and the stream of assignment changes. `revoke_wait`: the longest a
    /// revocation waits for its sources to stop.
    ///
    /// # Errors
    /// [`RelayError::Kafka`] when the brokers cannot be reached or the topic cannot be created
    /// or read; [`RelayError::Config`] when the consumer cannot be made from `kafka`.
    pub async fn join(
        kafka: &KafkaConfig,
        fleet: &FleetConfig,
        revoke_wait: Duration,
    ) -> Result<(Self, mpsc::UnboundedReceiver<FleetEvent>), RelayError> {
        let partitions = ensure_control_topic(kafka, fleet).await?;
        let (tx, rx) = mpsc::unbounded_channel();
        let leaving = Arc::new(AtomicBool::new(false));
        let context = FleetContext {
            events: tx,
            leaving: Arc::clone(&leaving),
            revoke_wait,
        };
        let mut client = crate::sink::consumer_config(kafka);
        client
            .set("group.id", &fleet.group_id)
            .set("client.id", &fleet.instance_id)
            .set("partition.assignment.strategy", "cooperative-sticky")
            .set("session.timeout.ms", fleet.session_timeout_ms.to_string())
            .set(
                "heartbeat.interval.ms",
                fleet.heartbeat_interval_ms.to_string(),
            )
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "latest");
        let consumer: BaseConsumer<FleetContext> = client
            .create_with_context(context)
            .map_err(|e| RelayError::Config(format!("kafka.properties (fleet membership): {e}")))?;
        consumer
            .subscribe(&[&fleet.control_topic])
            .map_err(crate::kafka_error)?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("fleet-membership".into())
            .spawn(move || {
                while !thread_stop.load(Ordering::SeqCst) {
                    // No record is ever written to the control topic: polling serves the
                    // group's callbacks.
                    if let Some(Err(e)) = consumer.poll(Duration::from_millis(100)) {
                        tracing::debug!(error = %e, "fleet: consumer event");
                    }
                }
                // Dropping the consumer leaves the group (its partitions go to the others).
                drop(consumer);
            })
            .map_err(|e| RelayError::kafka(format!("starting the fleet's thread: {e}")))?;
        tracing::info!(
            group = %fleet.group_id,
            topic = %fleet.control_topic,
            partitions,
            instance = %fleet.instance_id,
            "fleet: joined the group"
        );
        Ok((
            Self {
                partitions,
                stop,
                leaving,
                thread: Some(thread),
            },
            rx,
        ))
    }

    /// The control topic's partition count: what [`source_partition`] divides by.
    pub fn partitions(&self) -> i32 {
        self.partitions
    }

    /// Leaves the group (after the sources were stopped): the partitions go to the others.
    pub async fn leave(mut self) {
        self.leaving.store(true, Ordering::SeqCst);
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.leaving.store(true, Ordering::SeqCst);
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn admin(kafka: &KafkaConfig) -> Result<AdminClient<DefaultClientContext>, RelayError> {
    let mut client = crate::sink::admin_client_config(kafka);
    // A metadata request for the missing control topic must not have the broker create it
    // with its default partition count (auto.create.topics.enable).
    client.set("allow.auto.create.topics", "false");
    client
        .create()
        .map_err(|e| RelayError::Config(format!("kafka.properties (fleet admin client): {e}")))
}

/// The partition count of `topic`, `None` when it does not exist.
fn topic_partitions(
    client: &AdminClient<DefaultClientContext>,
    topic: &str,
    timeout: Duration,
) -> Result<(Option<i32>, usize), RelayError> {
    let md = client
        .inner()
        .fetch_metadata(Some(topic), timeout)
        .map_err(crate::kafka_error)?;
    let brokers = md.brokers().len();
    let found = md
        .topics()
        .iter()
        .find(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty())
        .map(|t| t.partitions().len() as i32);
    Ok((found, brokers))
}

/// Creates the control topic when missing; returns its partition count.
async fn ensure_control_topic(kafka: &KafkaConfig, fleet: &FleetConfig) -> Result<i32, RelayError> {
    let topic = fleet.control_topic.clone();
    let (kafka_c, topic_c) = (kafka.clone(), topic.clone());
    let (client, found, brokers) = tokio::task::spawn_blocking(move || {
        let client = admin(&kafka_c)?;
        let (found, brokers) =
            topic_partitions(&client, &topic_c, JOIN_TIMEOUT).map_err(|e| match e {
                RelayError::Kafka(cause) => RelayError::kafka(format!(
                    "no broker of {} answered a metadata request: {}",
                    kafka_c.bootstrap_servers,
                    cause.message()
                ))
                .with_source(cause),
                other => other,
            })?;
        Ok::<_, RelayError>((client, found, brokers))
    })
    .await
    .map_err(|e| RelayError::kafka(format!("fleet admin task failed: {e}")))??;
    if let Some(n) = found {
        if n != fleet.partitions {
            tracing::info!(
                topic,
                partitions = n,
                configured = fleet.partitions,
                "fleet: the control topic exists with its own partition count; the fleet uses it"
            );
        }
        return Ok(n);
    }
    let replication = brokers.clamp(1, 3) as i32;
    let new = NewTopic::new(
        &topic,
        fleet.partitions,
        TopicReplication::Fixed(replication),
    );
    let options = AdminOptions::new().operation_timeout(Some(REQUEST_TIMEOUT));
    let results = client
        .create_topics([&new], &options)
        .await
        .map_err(|e| RelayError::kafka(format!("creating the control topic {topic}: {e}")))?;
    for result in results {
        match result {
            Ok(_) => tracing::info!(
                topic,
                partitions = fleet.partitions,
                replication,
                "fleet: created the control topic"
            ),
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, code)) => {
                return Err(RelayError::kafka(format!(
                    "creating the control topic {topic}: {code}. Fix: create it ({} \
                     partitions) or grant the relay CREATE on it",
                    fleet.partitions
                )))
            }
        }
    }
    // Another process may have created it first, with its own count.
    let kafka_c = kafka.clone();
    let found = tokio::task::spawn_blocking(move || {
        let client = admin(&kafka_c)?;
        for _ in 0..20 {
            if let (Some(n), _) = topic_partitions(&client, &topic, REQUEST_TIMEOUT)? {
                return Ok(Some(n));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        Ok::<_, RelayError>(None)
    })
    .await
    .map_err(|e| RelayError::kafka(format!("fleet admin task failed: {e}")))??;
    Ok(found.unwrap_or(fleet.partitions))
}

/// One member of the fleet's group, as the group coordinator describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMember {
    /// Its `client.id`: the process's `fleet.instance_id`.
    pub instance: String,
    /// Its host as the broker saw it.
    pub host: String,
    /// The partitions of the control topic assigned to it.
    pub partitions: BTreeSet<i32>,
}

/// The control topic's partition count (`None`: no such topic yet) and the members of
/// `fleet`'s group with their assignments (empty when the group has no member), read with a
/// client of its own (no membership needed).
///
/// # Errors
/// [`RelayError::Kafka`] when the brokers cannot be reached.
pub async fn group_members(
    fleet: &FleetConfig,
) -> Result<(Option<i32>, Vec<GroupMember>), RelayError> {
    let fleet = fleet.clone();
    tokio::task::spawn_blocking(move || {
        let client = admin(&fleet.kafka)?;
        let (partitions, _) = topic_partitions(&client, &fleet.control_topic, REQUEST_TIMEOUT)?;
        let list = client
            .inner()
            .fetch_group_list(Some(&fleet.group_id), REQUEST_TIMEOUT)
            .map_err(crate::kafka_error)?;
        let mut members = Vec::new();
        for group in list.groups() {
            if group.name() != fleet.group_id {
                continue;
            }
            for m in group.members() {
                let partitions = m
                    .assignment()
                    .map(|bytes| parse_assignment(bytes, &fleet.control_topic))
                    .unwrap_or_default();
                members.push(GroupMember {
                    instance: m.client_id().to_owned(),
                    host: m.client_host().to_owned(),
                    partitions,
                });
            }
        }
        members.sort_by(|a, b| a.instance.cmp(&b.instance));
        Ok((partitions, members))
    })
    .await
    .map_err(|e| RelayError::kafka(format!("fleet admin task failed: {e}")))?
}

/// The partitions of `topic` in a consumer protocol assignment (`ConsumerProtocolAssignment`:
/// version int16, then an array (int32 count) of (topic string (int16 length), partitions
/// array of int32), then user data); empty when the bytes do not parse.
pub fn parse_assignment(bytes: &[u8], topic: &str) -> BTreeSet<i32> {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        if b.len() < n {
            return None;
        }
        let (head, tail) = b.split_at(n);
        *b = tail;
        Some(head)
    }
    fn i16_of(b: &mut &[u8]) -> Option<i16> {
        take(b, 2).map(|s| i16::from_be_bytes([s[0], s[1]]))
    }
    fn i32_of(b: &mut &[u8]) -> Option<i32> {
        take(b, 4).map(|s| i32::from_be_bytes([s[0], s[1], s[2], s[3]]))
    }
    let parse = || -> Option<BTreeSet<i32>> {
        let mut b = bytes;
        let _version = i16_of(&mut b)?;
        let topics = i32_of(&mut b)?;
        let mut out = BTreeSet::new();
        for _ in 0..topics.max(0) {
            let len = usize::try_from(i16_of(&mut b)?).ok()?;
            let name = take(&mut b, len)?;
            let count = i32_of(&mut b)?;
            for _ in 0..count.max(0) {
                let p = i32_of(&mut b)?;
                if name == topic.as_bytes() {
                    out.insert(p);
                }
            }
        }
        Some(out)
    };
    parse().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_map_to_partitions_as_kafka_keys_do() {
        // Kafka's default partitioner on the name's bytes (route.rs pins it against Java's).
        assert_eq!(
            source_partition("orders", 64),
            crate::route::key_partition(b"orders", 64)
        );
        for name in ["orders", "payments", "a", "shop-eu-1"] {
            let p = source_partition(name, 64);
            assert!((0..64).contains(&p), "{name}: {p}");
            assert_eq!(source_partition(name, 1), 0);
            // Stable: the same name, the same partition, in every process.
            assert_eq!(p, source_partition(name, 64));
        }
        // Statistical balance: 1000 names over 64 partitions, none empty, none far above
        // the mean (~15.6).
        let mut counts = [0u32; 64];
        for i in 0..1000 {
            counts[source_partition(&format!("source-{i}"), 64) as usize] += 1;
        }
        assert!(counts.iter().all(|&c| c > 0 && c < 40), "{counts:?}");
    }

    #[test]
    fn assignments_parse_as_the_consumer_protocol_writes_them() {
        let mut b = Vec::new();
        b.extend_from_slice(&1i16.to_be_bytes());
        b.extend_from_slice(&2i32.to_be_bytes());
        for (topic, parts) in [("other", vec![9i32]), ("ctl", vec![3, 1, 7])] {
            b.extend_from_slice(&(topic.len() as i16).to_be_bytes());
            b.extend_from_slice(topic.as_bytes());
            b.extend_from_slice(&(parts.len() as i32).to_be_bytes());
            for p in parts {
                b.extend_from_slice(&p.to_be_bytes());
            }
        }
        b.extend_from_slice(&(-1i32).to_be_bytes()); // no user data
        assert_eq!(
            parse_assignment(&b, "ctl").into_iter().collect::<Vec<_>>(),
            [1, 3, 7]
        );
        assert!(parse_assignment(&b[..9], "ctl").is_empty());
        assert!(parse_assignment(&[], "ctl").is_empty());
    }
}
