//! outbox-relay's core: what every other crate speaks in, with no broker client and no binlog
//! reader. [`config`] (the configuration, validated), [`error`] (one error type, one
//! classifier: retriable or not, exit code), [`observe`] (metrics named in `observe::names`, the
//! HTTP endpoints, spans, the acknowledgement audit), [`position`] (binlog positions, GTID sets
//! and their flavors' forms), [`outbox`] (the outbox event and the table mappings), [`sink`] (the
//! broker-neutral sink interface: records, dead letters, send errors, fatal causes) and [`state`]
//! (the checkpoint and its one codec: the state table's row, the progress record's JSON);
//! [`debezium`] is the Debezium profile (`[outbox] compat = "debezium"`): Debezium's bytes for
//! the same rows.
//!
//! ARCHITECTURE.md (at the repository root) draws the crates and what each may depend on.

pub mod config;
pub mod debezium;
pub mod error;
pub mod observe;
pub mod outbox;
pub mod position;
pub mod sink;
pub mod state;

pub use crate::config::RelayConfig as Config;
pub use crate::error::{redact_error, redact_url, RelayError};
