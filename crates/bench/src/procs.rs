//! CPU time and memory of a process, from /proc (Linux).

use anyhow::{Context, Result};

/// Kernel clock ticks per second in /proc/<pid>/stat (USER_HZ, 100 on Linux).
const TICKS: f64 = 100.0;

/// A process's resource use so far.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    /// User + system CPU seconds.
    pub cpu_s: f64,
    /// Peak resident set size (VmHWM), MiB.
    pub peak_rss_mb: f64,
}

/// Reads `/proc/<pid>/stat` (utime + stime) and `/proc/<pid>/status` (VmHWM).
///
/// # Errors
/// The process does not exist (any more) or the files are not as expected.
pub fn usage(pid: u32) -> Result<Usage> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    let after = stat
        .rsplit_once(')')
        .map(|(_, a)| a)
        .context("malformed /proc/<pid>/stat")?;
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields after "(comm)": state(3) … utime(14) stime(15), so indexes 11 and 12 here.
    let tick = |i: usize| -> Result<f64> {
        Ok(f.get(i).context("short /proc/<pid>/stat")?.parse::<f64>()? / TICKS)
    };
    let cpu_s = tick(11)? + tick(12)?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let hwm_kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN);
    Ok(Usage {
        cpu_s,
        peak_rss_mb: hwm_kb / 1024.0,
    })
}

/// CPU seconds of a process's threads so far, summed by the part of the relay they belong to:
/// `binlog_reader` (the thread that reads and decodes the binlog), `pipeline` (the main thread
/// and Tokio's workers: routing, producing, acknowledgements, checkpoints, HTTP),
/// `librdkafka` (its `rdk:*` threads: the producer's I/O, batching and delivery reports) and
/// `other`. Threads that ended are not counted (`/proc/<pid>/task` lists live ones).
///
/// # Errors
/// The process does not exist (any more).
pub fn thread_cpu(pid: u32) -> Result<std::collections::BTreeMap<&'static str, f64>> {
    by_thread_class(pid, |task| {
        stat_cpu_s(&std::fs::read_to_string(task.join("stat")).ok()?)
    })
}

/// Seconds a process's threads have spent runnable but waiting for a core so far (the
/// scheduler's run-queue wait, `/proc/<pid>/task/<tid>/schedstat`'s second field, ns; see the
/// kernel's Documentation/scheduler/sched-stats.rst), summed as [`thread_cpu`] sums CPU. A
/// thread that waits about as long as it runs is on a machine with no core to spare.
///
/// # Errors
/// The process does not exist (any more).
pub fn thread_runq_wait(pid: u32) -> Result<std::collections::BTreeMap<&'static str, f64>> {
    by_thread_class(pid, |task| {
        schedstat_wait_s(&std::fs::read_to_string(task.join("schedstat")).ok()?)
    })
}

/// `figure` of each live thread of `pid`, summed by [`thread_class`].
fn by_thread_class(
    pid: u32,
    figure: impl Fn(&std::path::Path) -> Option<f64>,
) -> Result<std::collections::BTreeMap<&'static str, f64>> {
    let mut by = std::collections::BTreeMap::new();
    let dir = format!("/proc/{pid}/task");
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {dir}"))? {
        let path = entry?.path();
        let (Ok(comm), Some(value)) = (std::fs::read_to_string(path.join("comm")), figure(&path))
        else {
            continue; // ended meanwhile
        };
        let tid = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        *by.entry(thread_class(comm.trim(), tid == pid.to_string()))
            .or_insert(0.0) += value;
    }
    Ok(by)
}

/// The run-queue wait of a `schedstat` line (`<run ns> <wait ns> <timeslices>`), seconds.
pub fn schedstat_wait_s(schedstat: &str) -> Option<f64> {
    let ns: f64 = schedstat.split_whitespace().nth(1)?.parse().ok()?;
    Some(ns / 1e9)
}

/// The part of the relay a thread named `comm` belongs to (see [`thread_cpu`]).
pub fn thread_class(comm: &str, main: bool) -> &'static str {
    if comm == "binlog-reader" {
        "binlog_reader"
    } else if comm.starts_with("rdk:") {
        "librdkafka"
    } else if main || comm.starts_with("tokio-runtime") || comm.starts_with("tokio-rt") {
        "pipeline"
    } else {
        "other"
    }
}

/// utime + stime of a `/proc/<pid>/stat` or `/proc/<pid>/task/<tid>/stat` line, in seconds.
pub fn stat_cpu_s(stat: &str) -> Option<f64> {
    let (_, after) = stat.rsplit_once(')')?;
    let f: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| Some(f.get(i)?.parse::<f64>().ok()? / TICKS);
    Some(tick(11)? + tick(12)?)
}

/// The pid in the server's `@@pid_file`, when readable (the database's CPU is only shown
/// then).
pub fn pid_from_file(path: &str) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// CPU seconds the whole machine has been busy so far (all cores: `/proc/stat` first line,
/// every field but idle and iowait), to tell whether a phase was bound by the machine's CPUs.
///
/// # Errors
/// `/proc/stat` cannot be read or is not as expected.
pub fn machine_busy_s() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    let line = stat.lines().next().context("empty /proc/stat")?;
    let fields: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse::<f64>())
        .collect::<Result<_, _>>()
        .context("malformed /proc/stat")?;
    // user nice system idle iowait irq softirq steal (guest time is inside user already).
    let busy: f64 = fields
        .iter()
        .take(8)
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4)
        .map(|(_, v)| v)
        .sum();
    Ok(busy / TICKS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_are_classed_by_their_names() {
        assert_eq!(thread_class("binlog-reader", false), "binlog_reader");
        assert_eq!(thread_class("rdk:broker1", false), "librdkafka");
        assert_eq!(thread_class("rdk:main", false), "librdkafka");
        assert_eq!(thread_class("outbox-relay", true), "pipeline");
        assert_eq!(thread_class("tokio-runtime-w", false), "pipeline");
        assert_eq!(thread_class("readback", false), "other");
    }

    #[test]
    fn a_stat_line_gives_user_plus_system_time() {
        // pid (comm with ) and spaces) state ppid … utime=150 stime=50 (fields 14 and 15).
        let line = "42 (a) b c) S 1 2 3 4 5 6 7 8 9 10 150 50 0 0";
        assert_eq!(stat_cpu_s(line), Some(2.0));
        assert_eq!(stat_cpu_s("42 (short) S 1"), None);
    }

    #[test]
    fn this_process_has_a_pipeline_thread() {
        let by = thread_cpu(std::process::id()).expect("own /proc");
        assert!(by.contains_key("pipeline"), "{by:?}");
        let waits = thread_runq_wait(std::process::id()).expect("own /proc");
        assert!(waits.contains_key("pipeline"), "{waits:?}");
        // This thread's own line parses (the kernel has schedstats on).
        let own = std::fs::read_to_string("/proc/thread-self/schedstat").expect("schedstat");
        assert!(schedstat_wait_s(&own).is_some(), "{own}");
    }

    #[test]
    fn a_schedstat_line_gives_the_run_queue_wait() {
        assert_eq!(schedstat_wait_s("1500000000 250000000 42\n"), Some(0.25));
        assert_eq!(schedstat_wait_s("1500000000"), None);
        assert_eq!(schedstat_wait_s("1 x 2"), None);
    }
}
