//! outbox-relay: tails a MySQL/MariaDB binlog as a replica and produces every committed INSERT
//! on the outbox tables to Kafka, checkpointing the binlog position only after Kafka has
//! acknowledged everything before it. ARCHITECTURE.md (at the repository root) draws the whole.
//!
//! The pipeline's stages, one folder each: [`binlog`] (the dump stream, binlog files) →
//! [`decode`] (rows → [`decode::OutboxEvent`], transaction boundaries, column layouts) →
//! [`kafka`] (route: topic, key, headers; sink: the idempotent producer) → [`state`] (the
//! checkpoint store and the lease). [`pipeline`] runs them once; [`supervisor`] runs the
//! pipeline against the server ([`run`]) or over binlog files ([`replay()`]). Leaves every
//! stage uses: [`config`], [`error`], [`position`], [`observe`] (metrics, HTTP). Operator
//! commands: [`ops`].

pub mod binlog;
pub mod config;
pub mod decode;
pub mod error;
pub mod kafka;
pub mod observe;
pub mod ops;
pub mod pipeline;
pub mod position;
pub mod state;
pub mod supervisor;

pub use crate::config::RelayConfig as Config;
pub use crate::error::{redact_error, redact_url, RelayError};
pub use crate::supervisor::{replay, run};
