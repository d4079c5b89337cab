//! The relay binary the end-to-end suites run: built once per test process with the `cargo`
//! that runs the tests (`cargo build -p outbox-relay --bin outbox-relay`, a no-op when it is up
//! to date), so a suite never runs a stale binary. The suites are a package of their own
//! (`tests/Cargo.toml`), and cargo's `CARGO_BIN_EXE_<name>` exists only for the tests of the
//! binary's own package.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// Path of the `outbox-relay` binary of this build profile, built on first use.
///
/// # Panics
/// When cargo cannot build it (the build's output is shown above the panic): no test can run
/// without the binary. `OUTBOX_RELAY_BIN` names a binary to use instead, without building.
pub fn relay_bin() -> &'static str {
    static BIN: OnceLock<String> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Ok(bin) = std::env::var("OUTBOX_RELAY_BIN") {
            return bin;
        }
        // The test executable is target/<profile>/deps/<name>-<hash>.
        let exe = std::env::current_exe().expect("the test executable's path");
        let profile_dir: PathBuf = exe
            .parent()
            .and_then(|deps| deps.parent())
            .expect("the test executable lies in target/<profile>/deps")
            .to_path_buf();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let mut build = Command::new(cargo);
        build.args(["build", "-p", "outbox-relay", "--bin", "outbox-relay"]);
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            build.arg("--release");
        }
        let status = build
            .status()
            .expect("running cargo to build the outbox-relay binary");
        assert!(
            status.success(),
            "cargo build -p outbox-relay failed ({status}); see its output above"
        );
        profile_dir.join("outbox-relay").display().to_string()
    })
}
