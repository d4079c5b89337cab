//! The fault matrix (`outbox_relay_testkit::faults`, profile `short`) as a test: kill -9 of the
//! relay, broker restarts, MariaDB restarts and connection cuts under a concurrent workload;
//! nothing committed may be missing, per-key order must hold.
//!
//! It restarts the server under test (`tests/services/server.sh`) and a private Kafka broker
//! of its own (port 9992, `FAULTS_KAFKA_PORT`; see `short_matrix_test`), and takes a few
//! minutes. It is the only test of its binary, and cargo runs test binaries one after another,
//! so `make test` runs it with nothing else using the server; it is up again when it ends. `make faults` runs the same harness alone (`--profile short`, or
//! `make faults-full`).

use anyhow::Result;
use outbox_relay_testkit::faults::short_matrix_test;

#[test]
fn fault_matrix_short_loses_nothing() -> Result<()> {
    short_matrix_test(outbox_relay_testkit::relay_bin(), false)
}
