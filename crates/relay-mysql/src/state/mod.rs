//! The relay's state in the MySQL state table: the checkpoint store ([`store`], statements and
//! values from [`outbox_relay_core::state::codec`]) and the connector's lease ([`lease`]: one
//! active instance, fenced writes).

pub mod lease;
pub mod store;
