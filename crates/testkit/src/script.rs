//! Running a service script to its end with a deadline.
//!
//! `Command::output` reads the script's output through pipes until every process holding them
//! has closed them, and waits without limit: a client call in the script that never returns, or
//! a grandchild that keeps a pipe open, holds the test (and, before its watchdog is armed, the
//! whole suite) forever. [`run`] gives the script a process group of its own and a file for its
//! output, and kills the group once the limit passes. Servers the scripts start leave the group
//! (`setsid` in `tests/services/server.sh`), so they outlive a killed script.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// Runs `command` (its stdin closed, stdout and stderr into one file) until it exits, for at
/// most `limit`; returns what it printed. `what` names it in errors.
///
/// # Errors
/// The command cannot start, exits unsuccessfully, or is still running after `limit` (then its
/// whole process group is killed); the error carries what it printed.
pub fn run(mut command: Command, what: &str, limit: Duration) -> Result<String> {
    let log_path = std::env::temp_dir().join(format!(
        "outbox-relay-script-{}-{}.log",
        std::process::id(),
        crate::unique_suffix()
    ));
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let spawned = command
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .with_context(|| format!("running {what}"));
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            let _ = std::fs::remove_file(&log_path);
            return Err(e);
        }
    };
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if Instant::now() >= deadline {
            // The whole group: the script and whatever it is waiting on.
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
        Some(status) if status.success() => Ok(output),
        Some(status) => bail!("{what} failed ({status}):\n{output}"),
        None => bail!(
            "{what} was still running after {} s and was killed; it printed:\n{output}",
            limit.as_secs()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_and_exit_status_come_back() {
        let mut ok = Command::new("bash");
        ok.args(["-c", "echo out; echo err >&2"]);
        let out = run(ok, "echo", Duration::from_secs(30)).expect("exits 0");
        assert!(out.contains("out") && out.contains("err"), "{out}");

        let mut failing = Command::new("bash");
        failing.args(["-c", "echo why; exit 3"]);
        let err = run(failing, "exit 3", Duration::from_secs(30)).expect_err("exits 3");
        assert!(format!("{err}").contains("why"), "{err}");
    }

    #[test]
    fn a_stuck_script_is_killed_with_what_it_waits_on() {
        // The script waits on a grandchild that holds its output open: `Command::output` would
        // wait for both forever.
        let mut stuck = Command::new("bash");
        stuck.args(["-c", "echo started; sleep 600 & wait"]);
        let started = Instant::now();
        let err = run(stuck, "stuck", Duration::from_secs(1)).expect_err("killed");
        assert!(started.elapsed() < Duration::from_secs(60));
        let text = format!("{err}");
        assert!(
            text.contains("still running after 1 s") && text.contains("started"),
            "{text}"
        );
    }
}
