//! The fault matrix (`outbox_relay_testkit::faults`, profile `short`) with the relay in
//! exactly-once mode (`kafka.delivery = "exactly_once"`): kill -9 of the relay, broker
//! restarts, server restarts and connection cuts under a concurrent workload; a
//! `read_committed` reader must find every committed row exactly once (no duplicates at all),
//! per-key order intact.
//!
//! Like `tests/faults.rs` it restarts the servers, so it is the only test of its binary (cargo
//! runs test binaries one after another). `make faults FAULTS_ARGS=--exactly-once` runs the
//! same harness alone.

use anyhow::Result;
use outbox_relay_testkit::faults::short_matrix_test;

#[test]
fn fault_matrix_short_exactly_once_has_no_duplicates() -> Result<()> {
    short_matrix_test(env!("CARGO_BIN_EXE_outbox-relay"), true)
}
