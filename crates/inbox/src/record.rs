//! An owned copy of a Kafka record, as the inbox and handlers see it.

use rdkafka::message::{Headers, Message};

/// One record: where it was read, its key, value and headers (bytes as received).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxRecord {
    /// Topic it was read from.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset in the partition.
    pub offset: i64,
    /// Key (the aggregate id for records of the relay), if any.
    pub key: Option<Vec<u8>>,
    /// Value (the payload), if any.
    pub value: Option<Vec<u8>>,
    /// Headers in order; a header may have no value.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

impl InboxRecord {
    /// Copies a record received by an rdkafka consumer.
    pub fn from_message<M: Message>(m: &M) -> Self {
        let headers = m
            .headers()
            .map(|h| {
                h.iter()
                    .map(|x| (x.key.to_owned(), x.value.map(<[u8]>::to_vec)))
                    .collect()
            })
            .unwrap_or_default();
        InboxRecord {
            topic: m.topic().to_owned(),
            partition: m.partition(),
            offset: m.offset(),
            key: m.key().map(<[u8]>::to_vec),
            value: m.payload().map(<[u8]>::to_vec),
            headers,
        }
    }

    /// The value of the first header named `name`, if present and valid UTF-8.
    pub fn header_str(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.as_deref())
            .and_then(|v| std::str::from_utf8(v).ok())
    }

    /// The key as UTF-8 text, if present and valid.
    pub fn key_str(&self) -> Option<&str> {
        self.key
            .as_deref()
            .and_then(|k| std::str::from_utf8(k).ok())
    }
}
