//! The test server's GTID replica (`tests/services/replica.sh`, same server type on the next
//! port), for the failover suite.

use std::time::Duration;

use anyhow::Result;

use crate::env::test_server;

/// The port of the test server's GTID replica (`tests/services/replica.sh`, same flavor):
/// `REPLICA_PORT` as the script reads it, else the primary's port + 1 (3307, 3317, 3327).
pub fn replica_port() -> u16 {
    std::env::var("REPLICA_PORT")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| crate::env::mysql_port() + 1)
}

/// How long `replica.sh up` or `down` may take: starting a replica (initialising its data folder
/// the first time) takes 5–30 s here; a script still running after this is stuck.
const SCRIPT_LIMIT: Duration = Duration::from_secs(300);

/// Runs `tests/services/replica.sh <test server> <action>` (`up`, `down`, `status`) to its end,
/// blocking, for at most 300 s; the replica replicates only the `failover_%` databases of the
/// primary.
///
/// Run by [`crate::script::run`]: a stuck script (a client call that never returns) is killed
/// with everything it started, and the error carries what it printed.
///
/// # Errors
/// The script cannot run, fails, or is still running after 300 s; the error carries its output.
pub fn replica_script(action: &str) -> Result<()> {
    let script = crate::faults::services::default_repo_root()
        .join("tests")
        .join("services")
        .join("replica.sh");
    let server = test_server().name();
    let mut command = std::process::Command::new(&script);
    command
        .args([server, action])
        .env("REPLICA_PORT", replica_port().to_string());
    let what = format!("{} {server} {action}", script.display());
    crate::script::run(command, &what, SCRIPT_LIMIT).map(drop)
}
