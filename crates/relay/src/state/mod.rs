//! The relay's state in the database: the checkpoint store ([`checkpoint`]: the resume point,
//! written only at acknowledged transaction boundaries) and the connector's lease ([`lease`]:
//! one active instance, fenced writes).

pub mod checkpoint;
pub mod lease;
