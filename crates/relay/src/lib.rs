//! outbox-relay's engine: [`pipeline`] runs the stages once (binlog source -> decode -> route ->
//! sink -> acknowledgements -> checkpoint), [`supervisor`] runs the pipeline against the server
//! ([`run`]) or over binlog files ([`replay()`]), with the start-up checks, the lease, retries
//! and the HTTP endpoints. The stages themselves are the crates `outbox-relay-mysql` (source,
//! decode, state table) and `outbox-relay-kafka` (route, sinks), on `outbox-relay-core`'s types.
//! ARCHITECTURE.md (at the repository root) draws the whole.

pub mod pipeline;
pub mod supervisor;

pub use crate::supervisor::{replay, run, run_sources, Reload};
