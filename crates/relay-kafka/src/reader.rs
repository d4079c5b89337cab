//! Reading topics for the operator commands (`dlq replay`, `trace`, `prune --inbox`): a
//! consumer with manual offsets ([`Reader`]), the records it polls as plain values
//! ([`ReadRecord`]), partition offsets ([`Offsets`]), watermarks, offsets by timestamp, and
//! consumer groups' committed offsets. Nothing here names a librdkafka type in its interface.

use std::fmt;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerGroupMetadata};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use outbox_relay_core::config::KafkaConfig;
use outbox_relay_core::error::RelayError;

/// A failed call of the Kafka client; its text is the client's.
#[derive(Debug)]
pub struct ClientError(pub(crate) KafkaError);

impl ClientError {
    /// The end of a partition was reached (a reader made with `partition_eof`).
    pub fn is_partition_eof(&self) -> bool {
        matches!(self.0, KafkaError::PartitionEOF(_))
    }

    /// The broker refused the `transactional.id` (TRANSACTIONAL_ID_AUTHORIZATION_FAILED).
    pub fn is_transactional_id_authorization_failed(&self) -> bool {
        self.0.rdkafka_error_code() == Some(RDKafkaErrorCode::TransactionalIdAuthorizationFailed)
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for ClientError {}

impl From<KafkaError> for ClientError {
    fn from(e: KafkaError) -> Self {
        Self(e)
    }
}

/// A record read from a topic.
#[derive(Debug, Clone)]
pub struct ReadRecord {
    /// Its topic.
    pub topic: String,
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// Its timestamp (ms since the epoch), when it has one.
    pub timestamp_ms: Option<i64>,
    /// Its key (`None`: a NULL key).
    pub key: Option<Vec<u8>>,
    /// Its value (`None`: a tombstone).
    pub value: Option<Vec<u8>>,
    /// Its headers in order (`None`: a NULL header value).
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

impl ReadRecord {
    /// The first header `name`: `Some(None)` when its value is NULL.
    fn first_header(&self, name: &str) -> Option<Option<&[u8]>> {
        let (_, value) = self.headers.iter().find(|(n, _)| n == name)?;
        Some(value.as_deref())
    }

    /// The value of the first header `name` (a NULL value as empty bytes).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.first_header(name).map(Option::unwrap_or_default)
    }

    /// The value of the first header `name` as UTF-8 text (`None`: no such header, a NULL
    /// value or not UTF-8).
    pub fn header_str(&self, name: &str) -> Option<&str> {
        std::str::from_utf8(self.first_header(name)??).ok()
    }

    /// A consumed message, copied out of the client's buffers.
    pub fn from_message<M: Message>(m: &M) -> Self {
        Self {
            topic: m.topic().to_owned(),
            partition: m.partition(),
            offset: m.offset(),
            timestamp_ms: m.timestamp().to_millis(),
            key: m.key().map(<[u8]>::to_vec),
            value: m.payload().map(<[u8]>::to_vec),
            headers: m
                .headers()
                .map(|h| {
                    h.iter()
                        .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec)))
                        .collect()
                })
                .unwrap_or_default(),
        }
    }
}

/// A topic as the cluster's metadata describes it.
#[derive(Debug, Clone)]
pub struct TopicInfo {
    /// Its name.
    pub name: String,
    /// The error the metadata carries for it (an unknown topic), as text.
    pub error: Option<String>,
    /// Its partitions' ids.
    pub partitions: Vec<i32>,
}

/// Offsets of topic partitions (what is assigned, committed or looked up).
#[derive(Debug, Default)]
pub struct Offsets(pub(crate) TopicPartitionList);

impl Offsets {
    /// No partition.
    pub fn new() -> Self {
        Self(TopicPartitionList::new())
    }

    /// Adds `topic`/`partition` at `offset`.
    ///
    /// # Errors
    /// The client's, when the offset cannot be set.
    pub fn add(&mut self, topic: &str, partition: i32, offset: i64) -> Result<(), ClientError> {
        self.0
            .add_partition_offset(topic, partition, Offset::Offset(offset))?;
        Ok(())
    }

    /// Adds `topic`/`partition` without an offset (to look one up).
    pub fn add_partition(&mut self, topic: &str, partition: i32) {
        self.0.add_partition(topic, partition);
    }

    /// How many partitions it holds.
    pub fn count(&self) -> usize {
        self.0.count()
    }

    /// The offset of `topic`/`partition` when it is an offset (not a logical one: none, end,
    /// beginning).
    pub fn offset(&self, topic: &str, partition: i32) -> Option<i64> {
        self.0
            .find_partition(topic, partition)
            .and_then(|e| match e.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            })
    }

    /// The raw offset of `topic`/`partition` (logical offsets as librdkafka's negative
    /// numbers).
    pub fn raw(&self, topic: &str, partition: i32) -> Option<i64> {
        self.0
            .find_partition(topic, partition)
            .and_then(|e| e.offset().to_raw())
    }
}

/// A consumer's group membership, for committing its offsets in a producer's transaction.
pub struct GroupMetadata(pub(crate) ConsumerGroupMetadata);

/// A consumer with manual offsets (assigned partitions, no automatic commits).
pub struct Reader(BaseConsumer);

impl Reader {
    /// A `read_committed` reader in `group` with the connection properties of
    /// `kafka.properties` (producer-only ones left out): no automatic commits or offset
    /// stores, `fetch.wait.max.ms` = 100, and an end-of-partition event when `partition_eof`.
    ///
    /// # Errors
    /// [`RelayError::Config`] `kafka.properties ({what}): …` when the client cannot be made.
    pub fn read_committed(
        kafka: &KafkaConfig,
        group: &str,
        partition_eof: bool,
        what: &str,
    ) -> Result<Self, RelayError> {
        let mut client = crate::sink::consumer_config(kafka);
        client
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set(
                "enable.partition.eof",
                if partition_eof { "true" } else { "false" },
            )
            .set("isolation.level", "read_committed")
            .set("fetch.wait.max.ms", "100");
        client
            .create()
            .map(Self)
            .map_err(|e| RelayError::Config(format!("kafka.properties ({what}): {e}")))
    }

    /// The metadata of `topic` (`None`: every topic).
    ///
    /// # Errors
    /// The client's.
    pub fn topics(
        &self,
        topic: Option<&str>,
        timeout: Duration,
    ) -> Result<Vec<TopicInfo>, ClientError> {
        let md = self.0.fetch_metadata(topic, timeout)?;
        Ok(md
            .topics()
            .iter()
            .map(|t| TopicInfo {
                name: t.name().to_owned(),
                error: t.error().map(|e| RDKafkaErrorCode::from(e).to_string()),
                partitions: t.partitions().iter().map(|p| p.id()).collect(),
            })
            .collect())
    }

    /// The group's committed offsets of `wanted`'s partitions.
    ///
    /// # Errors
    /// The client's.
    pub fn committed(&self, wanted: Offsets, timeout: Duration) -> Result<Offsets, ClientError> {
        Ok(Offsets(self.0.committed_offsets(wanted.0, timeout)?))
    }

    /// The low and high watermarks of `topic`/`partition`.
    ///
    /// # Errors
    /// The client's.
    pub fn watermarks(
        &self,
        topic: &str,
        partition: i32,
        timeout: Duration,
    ) -> Result<(i64, i64), ClientError> {
        Ok(self.0.fetch_watermarks(topic, partition, timeout)?)
    }

    /// The first offsets whose timestamps are at or after `times`' offsets (ms; ListOffsets by
    /// timestamp).
    ///
    /// # Errors
    /// The client's.
    pub fn offsets_for_times(
        &self,
        times: Offsets,
        timeout: Duration,
    ) -> Result<Offsets, ClientError> {
        Ok(Offsets(self.0.offsets_for_times(times.0, timeout)?))
    }

    /// Reads `assignment`'s partitions from its offsets.
    ///
    /// # Errors
    /// The client's.
    pub fn assign(&self, assignment: &Offsets) -> Result<(), ClientError> {
        Ok(self.0.assign(&assignment.0)?)
    }

    /// Stops reading every partition.
    ///
    /// # Errors
    /// The client's.
    pub fn unassign(&self) -> Result<(), ClientError> {
        Ok(self.0.unassign()?)
    }

    /// The next record or error, waiting at most `timeout` (`None`: nothing came).
    pub fn poll(&self, timeout: Duration) -> Option<Result<ReadRecord, ClientError>> {
        self.0
            .poll(timeout)
            .map(|m| m.map(|m| ReadRecord::from_message(&m)).map_err(ClientError))
    }

    /// The next offsets to read of the assigned partitions.
    ///
    /// # Errors
    /// The client's.
    pub fn position(&self) -> Result<Offsets, ClientError> {
        Ok(Offsets(self.0.position()?))
    }

    /// The group membership, for [`crate::publish::TxnProducer::commit_offsets`].
    pub fn group_metadata(&self) -> Option<GroupMetadata> {
        self.0.group_metadata().map(GroupMetadata)
    }

    /// The names of the cluster's consumer groups (ListGroups).
    ///
    /// # Errors
    /// The client's.
    pub fn group_names(&self, timeout: Duration) -> Result<Vec<String>, ClientError> {
        let list = self.0.fetch_group_list(None, timeout)?;
        Ok(list.groups().iter().map(|g| g.name().to_owned()).collect())
    }
}

/// The committed offset of `group` on `topic`/`partition`, read with the connection properties
/// of `kafka.properties`; `None` when it has none or it cannot be read.
pub fn group_committed(
    kafka: &KafkaConfig,
    group: &str,
    topic: &str,
    partition: i32,
    timeout: Duration,
) -> Option<i64> {
    let mut client = crate::sink::consumer_config(kafka);
    client
        .set("group.id", group)
        .set("enable.auto.commit", "false");
    let c = client.create::<BaseConsumer>().ok()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, partition)
        .set_offset(Offset::Invalid)
        .ok()?;
    let committed = c.committed_offsets(tpl, timeout).ok()?;
    match committed
        .find_partition(topic, partition)
        .map(|e| e.offset())
    {
        Some(Offset::Offset(o)) => Some(o),
        _ => None,
    }
}

/// The committed offsets of `group` on `parts` (topic, partition), from the group coordinator
/// of `bootstrap` (no other client property); `None` where it has none.
///
/// # Errors
/// [`RelayError::Kafka`] when the client cannot be made or the offsets cannot be read.
pub fn group_committed_offsets(
    bootstrap: &str,
    group: &str,
    parts: &[(String, i32)],
    timeout: Duration,
) -> Result<Vec<Option<i64>>, RelayError> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .map_err(|e| RelayError::kafka(format!("creating a consumer for group {group}: {e}")))?;
    let mut tpl = TopicPartitionList::new();
    for (t, p) in parts {
        tpl.add_partition(t, *p);
    }
    let got = consumer.committed_offsets(tpl, timeout).map_err(|e| {
        RelayError::kafka(format!("reading group {group}'s committed offsets: {e}"))
    })?;
    let got = Offsets(got);
    Ok(parts.iter().map(|(t, p)| got.offset(t, *p)).collect())
}
