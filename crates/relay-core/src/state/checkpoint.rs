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

impl Checkpoint {
    /// Whether the outbox row numbered `row` (from 1, in binlog order, over every outbox table)
    /// of the transaction that starts at the boundary `base` is covered: relayed by the
    /// relay's contract. It is when the checkpoint lies past that transaction (a checkpoint is
    /// always a boundary, so past `base` means at or after the transaction's end), or when the
    /// checkpoint is `base` itself and the row is among its first `rows_acked`. This is the one
    /// rule `trace`, `status` and `prune` judge "relayed" by; `None` when `base` is in another
    /// binlog sequence than the checkpoint (positions of different file names do not compare).
    pub fn covers_row(&self, base: &BinlogPosition, row: u64) -> Option<bool> {
        Some(match self.position.partial_cmp(base)? {
            std::cmp::Ordering::Greater => true,
            std::cmp::Ordering::Equal => row <= self.rows_acked,
            std::cmp::Ordering::Less => false,
        })
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn at(pos: u64, rows_acked: u64) -> Checkpoint {
        Checkpoint {
            position: BinlogPosition::new("bin.000003", pos),
            rows_acked,
            gtid_set: None,
            source_server_id: 1,
            source_server_uuid: None,
            table_layouts: None,
        }
    }

    #[test]
    fn a_row_is_covered_past_the_checkpoint_or_among_its_acknowledged_rows() {
        let base = BinlogPosition::new("bin.000003", 8069);
        // Past the transaction: every row of it.
        assert_eq!(at(9000, 0).covers_row(&base, 7), Some(true));
        // At its start: only the first rows_acked rows.
        assert_eq!(at(8069, 1).covers_row(&base, 1), Some(true));
        assert_eq!(at(8069, 1).covers_row(&base, 2), Some(false));
        assert_eq!(at(8069, 0).covers_row(&base, 1), Some(false));
        // Before it: none.
        assert_eq!(at(7000, 5).covers_row(&base, 1), Some(false));
        // Another binlog sequence: unknown.
        let other = BinlogPosition::new("mysql-bin.000001", 4);
        assert_eq!(at(8069, 1).covers_row(&other, 1), None);
    }
}
