//! The fault matrix (`outbox_relay_testkit::faults`, profile `short`) with the relay in
//! exactly-once mode (`kafka.delivery = "exactly_once"`): kill -9 of the relay, broker
//! restarts, server restarts, connection cuts and lost EndTxn answers (a Kafka-aware proxy the
//! private broker advertises) under a concurrent workload; a
//! `read_committed` reader must find every committed row exactly once (no duplicates at all),
//! per-key order intact.
//!
//! Like `tests/faults.rs` it restarts the servers, so it is the only test of its binary (cargo
//! runs test binaries one after another). `make test` (tests/run.sh) runs it against the first
//! server of `OUTBOX_TEST_SERVERS` only, to keep CI within its budget;
//! `make faults FAULTS_ARGS=--exactly-once` runs the same harness alone against any server.

use anyhow::Result;
use outbox_relay_testkit::faults::short_matrix_test;

#[test]
fn fault_matrix_short_exactly_once_has_no_duplicates() -> Result<()> {
    short_matrix_test(outbox_relay_testkit::relay_bin(), true)
}
