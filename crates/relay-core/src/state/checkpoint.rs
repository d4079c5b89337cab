//! Checkpoint: the stored resume position, one row per connector in a MySQL state table.
//!
//! A stored checkpoint is a transaction boundary all of whose records, and all records before
//! it, Kafka has acknowledged, plus how many outbox rows of the next transaction are
//! acknowledged too (see `migrations/0002_checkpoint.sql`). The pipeline only hands such points
//! to the store, moving forward only. The MySQL store (`outbox_relay_mysql::state::store`) fences
//! its writes by the lease token: an instance that lost its lease can no longer write.
//!
//! The row's columns, the statements and the value decoding are [`crate::state::codec`]'s, as
//! is the exactly-once progress record's form of a [`Checkpoint`].

use std::sync::Arc;

use crate::error::RelayError;
use crate::position::BinlogPosition;

/// A resume point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// End of the last fully acknowledged transaction.
    pub position: BinlogPosition,
    /// Outbox rows of the transaction after `position` that are acknowledged too; a resume
    /// skips them.
    pub rows_acked: u64,
    /// MariaDB GTID position (`0-1-42,…`) or MySQL GTID set including that transaction, when
    /// known.
    pub gtid_set: Option<String>,
    /// `@@server_id` of the source server the position belongs to.
    pub source_server_id: u32,
    /// `@@server_uuid` of the source (MySQL only).
    pub source_server_uuid: Option<String>,
    /// The outbox tables' column layouts at `position` (JSON, see `outbox_relay_mysql::decode::schema`), for table
    /// maps without column names; stored when the table has the `table_layouts` column
    /// (`migrations/0003_checkpoint_layouts.sql`).
    pub table_layouts: Option<Arc<str>>,
}

/// Where checkpoints live. Kept small so an exactly-once mode can store them inside a Kafka
/// transaction later.
pub trait CheckpointStore {
    /// The connector's stored checkpoint, if any.
    fn load(
        &self,
    ) -> impl std::future::Future<Output = Result<Option<Checkpoint>, RelayError>> + Send;
    /// Stores `checkpoint` (forward only).
    fn save(
        &self,
        checkpoint: &Checkpoint,
    ) -> impl std::future::Future<Output = Result<(), RelayError>> + Send;
}
