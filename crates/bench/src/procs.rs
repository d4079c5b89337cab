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
