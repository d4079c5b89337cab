//! Start-up checks of `outbox-relay` that change GLOBAL server variables of the shared test
//! MariaDB. They live in their own test binary: `cargo test` runs test binaries one after
//! another, so no other relay test sees the changed setting. (A runner that runs binaries in
//! parallel, such as nextest, must keep this binary apart from `relay_e2e`.)
//!
//! Tests in this file run one at a time (see [`SERIAL`]), since they share the server's state.

use std::time::Duration;

use anyhow::{ensure, Result};
use outbox_relay_testkit::{
    describe_exit, next_server_id, unique_suffix, GlobalVariableGuard, RelayConfigSpec,
    RelayProcess, TestDb,
};
use tokio::sync::Mutex;

/// The relay binary under test (built on first use).
fn bin() -> &'static str {
    outbox_relay_testkit::relay_bin()
}

/// Start-up until the relay has given up.
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);

/// Serialises the tests of this binary: each changes global server state.
static SERIAL: Mutex<()> = Mutex::const_new(());

/// With `binlog_format` other than ROW the relay cannot see row images: it refuses to start
/// with exit code 3 and says what it found and how to fix it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_to_start_when_binlog_format_is_not_row() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let db = TestDb::create("startup_binlog_format").await?;
    let uid = unique_suffix();
    let spec = RelayConfigSpec::new(
        &db,
        &format!("startup-{uid}"),
        next_server_id(),
        &format!("t_{uid}"),
    );

    let guard = GlobalVariableGuard::set("binlog_format", "MIXED").await?;
    ensure!(
        guard.original() == Some("ROW"),
        "the test server should run with binlog_format=ROW, has {:?}",
        guard.original()
    );
    // Restore before asserting anything; the guard's Drop restores on every other path.
    let outcome = async {
        let relay = RelayProcess::spawn(bin(), &spec.to_toml(), &[])?;
        let status = relay.wait_exit(EXIT_TIMEOUT).await;
        anyhow::Ok((status, relay))
    }
    .await;
    guard.restore().await?;
    let (status, relay) = outcome?;
    let status = status?;
    let stderr = relay.stderr_text();

    ensure!(
        status.code() == Some(3),
        "expected exit code 3 (server prerequisite failed), got {}\n--- stderr ---\n{stderr}",
        describe_exit(&status)
    );
    for needle in ["binlog_format", "MIXED", "binlog_format=ROW"] {
        ensure!(
            stderr.contains(needle),
            "stderr does not contain {needle:?}:\n{stderr}"
        );
    }
    db.drop_database().await
}
