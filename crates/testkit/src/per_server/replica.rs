//! The test server's GTID replica (`tests/services/replica.sh`, same server type on the next
//! port), for the failover suite.

use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

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
/// The script runs in a process group of its own with its output in a file, so a stuck script
/// (a client call that never returns) is killed with everything it started, and the error carries
/// what it printed: a pipe would keep the caller waiting for as long as any grandchild held it.
/// The replica server itself runs in a session of its own (`setsid` in `server.sh`) and survives.
///
/// # Errors
/// The script cannot run, fails, or is still running after 300 s; the error carries its output.
pub fn replica_script(action: &str) -> Result<()> {
    let script = crate::faults::services::default_repo_root()
        .join("tests")
        .join("services")
        .join("replica.sh");
    let server = test_server().name();
    let what = format!("{} {server} {action}", script.display());
    let log_path = std::env::temp_dir().join(format!(
        "outbox-relay-replica-{}-{}.log",
        std::process::id(),
        crate::unique_suffix()
    ));
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let mut child = std::process::Command::new(&script)
        .args([server, action])
        .env("REPLICA_PORT", replica_port().to_string())
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .with_context(|| format!("running {what}"))?;
    let deadline = Instant::now() + SCRIPT_LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if Instant::now() >= deadline {
            // The whole group: the script and any client call it is waiting on.
            let pgid = i32::try_from(child.id()).unwrap_or(i32::MAX);
            let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let output = std::fs::read_to_string(&log_path).unwrap_or_default();
    let _ = std::fs::remove_file(&log_path);
    match status {
        Some(status) if status.success() => Ok(()),
        Some(status) => bail!("{what} failed ({status}):\n{output}"),
        None => bail!(
            "{what} was still running after {} s and was killed; it printed:\n{output}",
            SCRIPT_LIMIT.as_secs()
        ),
    }
}
