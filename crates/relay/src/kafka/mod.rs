//! The Kafka side: an [`crate::decode::OutboxEvent`] becomes a record ([`route`]: topic, key,
//! headers, value, timestamp) and is produced by the idempotent producer ([`sink`]: delivery
//! reports, dead letters, the topics' size and timestamp limits, the readiness probe).

pub mod route;
pub mod sink;
