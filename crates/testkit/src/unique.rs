//! Names and ids that do not collide between tests, test binaries and repeated runs.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

static NAME_COUNTER: AtomicU32 = AtomicU32::new(0);
static SERVER_ID_COUNTER: AtomicU32 = AtomicU32::new(0);

/// Replica server ids handed out per process before they wrap around.
const SERVER_IDS_PER_PROCESS: u32 = 64;

/// A suffix unique across the tests of this process, concurrent processes and earlier runs:
/// `<pid>_<counter>_<time in base 36>`. Only `[a-z0-9_]`, so it fits database, topic and
/// connector names.
pub fn unique_suffix() -> String {
    let n = NAME_COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    // Microseconds modulo ~2 days keep it short while still differing between runs.
    let t = (nanos / 1_000) % 36u128.pow(7);
    format!("{}_{}_{}", std::process::id(), n, base36(t))
}

fn base36(mut v: u128) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(DIGITS[(v % 36) as usize]);
        v /= 36;
        if v == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8_lossy(&out).into_owned()
}

/// A replica `server_id` for one relay, distinct from the ids of every other relay started by
/// this process (up to 64) and, because it is derived from the pid, by concurrent test
/// processes: `10000 + (pid % 1_000_000) * 64 + counter`. MariaDB disconnects an older replica
/// connection that registers with the same id, so two live relays must never share one.
pub fn next_server_id() -> u32 {
    let n = SERVER_ID_COUNTER.fetch_add(1, Ordering::Relaxed) % SERVER_IDS_PER_PROCESS;
    10_000 + (std::process::id() % 1_000_000) * SERVER_IDS_PER_PROCESS + n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes_differ_and_are_name_safe() {
        let a = unique_suffix();
        let b = unique_suffix();
        assert_ne!(a, b);
        assert!(a
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'));
    }

    #[test]
    fn server_ids_differ_within_a_process() {
        let a = next_server_id();
        let b = next_server_id();
        assert_ne!(a, b);
        assert!(a >= 10_000);
    }
}
