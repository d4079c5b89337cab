//! The Kafka side: an [`outbox_relay_core::outbox::OutboxEvent`] becomes a record ([`route`]: topic, key,
//! headers, value, timestamp) and is produced by the idempotent producer ([`sink`]: delivery
//! reports, dead letters, the topics' size and timestamp limits, the readiness probe);
//! [`features`]: the cluster's finalized feature levels (`check`'s `transaction.version`);
//! [`kafka_log`]: librdkafka's lines in the relay's log, and one line per change of the
//! cluster's reachability.
//!
//! The operator commands' clients: [`admin`] (metadata and configurations for `check`),
//! [`reader`] (reading topics, offsets, watermarks and groups' committed offsets for `dlq
//! replay`, `trace` and `prune --inbox`), [`publish`] (the producers of `dlq replay` and
//! `republish`, `check`'s trial of transactions); [`fleet`]: a fleet's membership (which
//! sources this process runs, from a consumer group's assignment) and its description.

pub mod admin;
pub mod features;
pub mod fleet;
pub mod kafka_log;
pub mod publish;
pub mod reader;
pub mod route;
pub mod sink;

use outbox_relay_core::error::RelayError;

/// `e` as a [`RelayError::Kafka`]: the client's text as the message and `e` itself as the
/// source. (A `From` impl cannot live here: both types are foreign to this crate.)
pub fn kafka_error(e: rdkafka::error::KafkaError) -> RelayError {
    RelayError::kafka(e.to_string()).with_source(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_error_is_kept_as_the_source() {
        use std::error::Error as _;
        let kafka = rdkafka::error::KafkaError::MessageProduction(
            rdkafka::types::RDKafkaErrorCode::MessageTimedOut,
        );
        let e = kafka_error(kafka.clone());
        let cause = e.source().expect("the Kafka error has a source");
        let inner = cause.source().expect("the cause keeps the client's error");
        assert_eq!(
            inner.downcast_ref::<rdkafka::error::KafkaError>(),
            Some(&kafka)
        );
    }
}
