//! outbox-relay's MySQL/MariaDB side: [`binlog`] (the dump stream as a replica, binlog files),
//! [`decode`] (rows events -> [`outbox_relay_core::outbox::OutboxEvent`], transaction
//! boundaries, XA, DDL and column layouts), [`server`] (everything that differs between MariaDB
//! and MySQL, in one flavor module), [`preflight`] (the server's prerequisites, checked before
//! streaming and by `check`) and [`state`] (the checkpoint store and the lease in the state
//! table); [`cutover`] asks the outbox tables which rows a polling relay already sent
//! (`[cutover]`).

pub mod binlog;
pub mod cutover;
pub mod decode;
pub mod preflight;
pub mod server;
pub mod state;

/// The driver's connection handles, for the crates that hold them (the engine's pools, the
/// operator commands' connections) without depending on the driver themselves.
pub use mysql_async::{Conn, Opts, Pool};
