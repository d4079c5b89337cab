//! The test server's GTID replica (`tests/services/replica.sh`, same server type on the next
//! port), for the failover suite.

use anyhow::{Context, Result};

use crate::env::test_server;

/// The port of the test server's GTID replica (`tests/services/replica.sh`, same flavor):
/// `REPLICA_PORT` as the script reads it, else the primary's port + 1 (3307, 3317, 3327).
pub fn replica_port() -> u16 {
    std::env::var("REPLICA_PORT")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| crate::env::mysql_port() + 1)
}

/// Runs `tests/services/replica.sh <test server> <action>` (`up`, `down`, `status`) to its end,
/// blocking; the replica replicates only the `failover_%` databases of the primary.
///
/// # Errors
/// The script cannot run or fails; the error carries its output.
pub fn replica_script(action: &str) -> Result<()> {
    let script = crate::faults::services::default_repo_root()
        .join("tests")
        .join("services")
        .join("replica.sh");
    let server = test_server().name();
    let out = std::process::Command::new(&script)
        .args([server, action])
        .env("REPLICA_PORT", replica_port().to_string())
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("running {} {server} {action}", script.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "{} {server} {action} failed ({}):\n{}{}",
        script.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}
