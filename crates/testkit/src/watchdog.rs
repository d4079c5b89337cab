//! A per-test deadline that ends a hung test binary instead of the whole suite.
//!
//! Tests wait on observable state with their own timeouts, but a wait without one (a loop
//! whose exit condition a dead helper task can no longer make true) would otherwise hang
//! `cargo test` until CI's limit kills everything after it. A [`Watchdog`] armed when a test
//! creates its database ends the process with exit code 124 and the test's name once the
//! deadline passes; cargo's `--no-fail-fast` then reports that binary as failed and goes on
//! with the next one.

use std::collections::BTreeSet;
use std::io::Write;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::Mutex;
use std::time::Duration;

/// Default deadline per test: well above the longest test (the fault matrices, ~4 min).
pub const DEFAULT_LIMIT: Duration = Duration::from_secs(15 * 60);

/// Armed until dropped; see the module docs.
#[derive(Debug)]
pub struct Watchdog {
    // Dropping the sender disconnects the watcher thread's channel, which ends it.
    _disarm: Sender<()>,
}

impl Watchdog {
    /// Arms a deadline of `OUTBOX_TEST_WATCHDOG_SECS` seconds (default [`DEFAULT_LIMIT`]) for
    /// the calling test, named after its thread (libtest names test threads after the test).
    pub fn arm() -> Self {
        let limit = std::env::var("OUTBOX_TEST_WATCHDOG_SECS")
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .map_or(DEFAULT_LIMIT, Duration::from_secs);
        Self::arm_for(limit)
    }

    /// Arms a deadline of `limit` for the calling test.
    pub fn arm_for(limit: Duration) -> Self {
        let (tx, rx) = mpsc::channel::<()>();
        let test = std::thread::current()
            .name()
            .unwrap_or("<unnamed test thread>")
            .to_owned();
        let spawned = std::thread::Builder::new()
            .name(format!("watchdog {test}"))
            .spawn(move || {
                if let Err(RecvTimeoutError::Timeout) = rx.recv_timeout(limit) {
                    // Straight to the process's stderr: libtest captures eprintln! of test
                    // threads (and threads they spawn) and would never print it.
                    let _ = writeln!(
                        std::io::stderr(),
                        "test watchdog: {test} is still running after {} s; ending this test \
                         binary (exit 124) so the rest of the suite runs. A wait without a \
                         timeout, or a helper task that died, is the usual cause.",
                        limit.as_secs()
                    );
                    kill_children();
                    std::process::exit(124);
                }
            });
        if let Err(e) = spawned {
            eprintln!("test watchdog: could not start its thread ({e}); running without one");
        }
        Self { _disarm: tx }
    }
}

/// Relay processes the test binary started and has not reaped: `process::exit` runs no
/// destructor, so the watchdog kills these itself rather than leave them running.
static CHILDREN: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

/// Records `pid` as a child to kill if the watchdog fires.
pub fn track_child(pid: u32) {
    CHILDREN
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(pid);
}

/// Forgets `pid` (reaped).
pub fn untrack_child(pid: u32) {
    CHILDREN
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&pid);
}

fn kill_children() {
    let pids = std::mem::take(&mut *CHILDREN.lock().unwrap_or_else(|e| e.into_inner()));
    for pid in pids {
        if let Ok(pid) = i32::try_from(pid) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}
