//! Errors of the inbox.

/// What a [`crate::Handler`] returns on failure: any error; its text becomes the dead letter's
/// `dlq_reason` when the attempts run out.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Errors that stop an inbox consumer (a record's own failures are retried and dead-lettered,
/// never returned; infrastructure errors are retried up to the outage budget).
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
    /// The record in hand failed only with infrastructure errors
    /// ([`is_infrastructure_error`]) for longer than [`crate::InboxConfig::outage_budget`]. It
    /// is not settled: its offset, and those after it, must not be committed; a restarted
    /// consumer resumes with it.
    #[error(
        "database outage longer than the outage budget ({budget:?}) at record \
         {topic}/{partition}@{offset}, not settled: {error}"
    )]
    Outage {
        /// The record's topic.
        topic: String,
        /// Its partition.
        partition: i32,
        /// Its offset.
        offset: i64,
        /// The outage budget that ran out.
        budget: std::time::Duration,
        /// The last infrastructure error.
        error: String,
    },
    /// The inbox's own read of its parked table failed (a sweep: [`crate::Inbox::sweep_parked`]);
    /// nothing was settled by the failing statement, the next sweep tries again.
    #[error("database: {what}: {source}")]
    Database {
        /// The operation.
        what: String,
        /// The driver's error.
        source: mysql_async::Error,
    },
    /// The dead-letter topic is missing and the broker refused to create it (or could not be
    /// asked); the text names the topic and the fix.
    #[error(
        "dead-letter topic {topic:?} does not exist and the broker refused to create it: {why}; \
         create it (kafka-topics.sh --create --topic {topic}), grant this client CREATE on it, \
         or set dead_letter_topic to an existing topic (a valid name: at most 249 of \
         [a-zA-Z0-9._-])"
    )]
    DeadLetterTopic {
        /// The topic.
        topic: String,
        /// What the broker said.
        why: String,
    },
    /// A retry tier's topic is missing and the broker refused to create it (or could not be
    /// asked); the text names the topic and the fix.
    #[error(
        "retry tier topic {topic:?} does not exist and the broker refused to create it: {why}; \
         create it (kafka-topics.sh --create --topic {topic}), grant this client CREATE on it, \
         or set retry_topic_format to name existing topics (a valid name: at most 249 of \
         [a-zA-Z0-9._-])"
    )]
    RetryTopic {
        /// The topic.
        topic: String,
        /// What the broker said.
        why: String,
    },
}

/// MySQL/MariaDB server errors that are the infrastructure's, not the record's
/// (`inbox/CONTRACT.md`, "Attempts and outages"): lock wait timeout, deadlock (both roll the
/// transaction back), read-only server (failover), shutdown, connection killed, client
/// disconnected, and the client codes of a lost or refused connection.
const INFRASTRUCTURE_CODES: [u16; 13] = [
    1205, 1213, 1290, 1836, 1053, 1077, 1927, 4031, 2002, 2003, 2006, 2013, 2055,
];

/// Whether `error`, or an error in its `source()` chain (a [`HandlerError`] included), means the
/// database could not do the work rather than that the record is wrong: a `mysql_async` I/O error
/// (refused, reset, lost connection, TLS), a closed connection, a server error 1205, 1213, 1290,
/// 1836, 1053, 1077, 1927, 4031 (or a client code 2002, 2003, 2006, 2013, 2055), or a connection
/// `std::io::Error`. The inbox retries those without counting them as attempts. The first
/// `mysql_async::Error` of the chain decides.
pub fn is_infrastructure_error(error: &(dyn std::error::Error + 'static)) -> bool {
    use std::io::ErrorKind;
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(m) = e.downcast_ref::<mysql_async::Error>() {
            return match m {
                mysql_async::Error::Io(_) => true,
                mysql_async::Error::Driver(mysql_async::DriverError::ConnectionClosed) => true,
                mysql_async::Error::Server(s) => INFRASTRUCTURE_CODES.contains(&s.code),
                _ => false,
            };
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                ErrorKind::ConnectionRefused
                    | ErrorKind::ConnectionReset
                    | ErrorKind::ConnectionAborted
                    | ErrorKind::NotConnected
                    | ErrorKind::BrokenPipe
                    | ErrorKind::UnexpectedEof
                    | ErrorKind::TimedOut
            );
        }
        next = e.source();
    }
    false
}

impl InboxError {
    pub(crate) fn kafka(what: impl Into<String>, source: rdkafka::error::KafkaError) -> Self {
        InboxError::Kafka {
            what: what.into(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(code: u16) -> mysql_async::Error {
        mysql_async::Error::Server(mysql_async::ServerError {
            code,
            message: "m".into(),
            state: "HY000".into(),
        })
    }

    #[derive(Debug, thiserror::Error)]
    #[error("handler: {0}")]
    struct Wrapped(#[source] mysql_async::Error);

    #[test]
    fn infrastructure_errors_are_classified_by_code_and_kind() {
        for code in INFRASTRUCTURE_CODES {
            assert!(is_infrastructure_error(&server(code)), "{code}");
        }
        for code in [1062, 1146, 1064, 1406] {
            assert!(!is_infrastructure_error(&server(code)), "{code}");
        }
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let io = mysql_async::Error::Io(mysql_async::IoError::Io(refused));
        assert!(is_infrastructure_error(&io));
        let closed = mysql_async::Error::Driver(mysql_async::DriverError::ConnectionClosed);
        assert!(is_infrastructure_error(&closed));
        // A handler's error wrapping a deadlock is one; its own error is not.
        assert!(is_infrastructure_error(&Wrapped(server(1213))));
        let own: HandlerError = "poison record".into();
        assert!(!is_infrastructure_error(own.as_ref()));
        let boxed: HandlerError = Box::new(server(1205));
        assert!(is_infrastructure_error(boxed.as_ref()));
    }
}
