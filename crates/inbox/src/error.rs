//! Errors of the inbox.

/// What a [`crate::Handler`] returns on failure: any error; its text becomes the dead letter's
/// `dlq_reason` when the attempts run out.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Errors that stop an inbox consumer (a record's own failures are retried and dead-lettered,
/// never returned).
#[derive(Debug, thiserror::Error)]
pub enum InboxError {
    /// A setting is wrong; the text says which and how to fix it.
    #[error("inbox configuration: {0}")]
    Config(String),
    /// Kafka refused or failed an operation the inbox cannot go on without (subscribe, commit,
    /// a dead letter that could not be produced: never dropped, so the consumer stops).
    #[error("kafka: {what}: {source}")]
    Kafka {
        /// The operation.
        what: String,
        /// librdkafka's error.
        source: rdkafka::error::KafkaError,
    },
}

impl InboxError {
    pub(crate) fn kafka(what: impl Into<String>, source: rdkafka::error::KafkaError) -> Self {
        InboxError::Kafka {
            what: what.into(),
            source,
        }
    }
}
