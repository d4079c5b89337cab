//! The relay's state: the checkpoint ([`checkpoint`]: the resume point, written only at
//! acknowledged transaction boundaries, and the store interface) and its one codec ([`codec`]:
//! the state table's columns and SQL, the progress record's JSON). The MySQL store and the lease
//! are `outbox_relay_mysql::state`'s.

pub mod checkpoint;
pub mod codec;
