//! What a draining relay waits on, sampled: every [`EVERY`] its records in flight (the
//! `outbox_relay_records_in_flight` gauge of its `/metrics`) and whether its pipeline's thread
//! (the process's main thread: routing, producing, acknowledgements) is runnable, i.e. running
//! or waiting for a core (state `R` in `/proc/<pid>/stat`, proc(5)), and so is its
//! `binlog-reader` thread. A window that stays full says Kafka's acknowledgements bound the
//! drain; a window far from full with the pipeline's thread nearly always runnable says that
//! thread's CPU does. A pipeline thread asleep is told apart by the window at that sample: at
//! three quarters of `max_in_flight` or more the reader is paused and the pipeline waits for
//! acknowledgements; below, it takes events and waits for the reader to decode one.

use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How often the relay is sampled.
pub const EVERY: Duration = Duration::from_millis(50);

/// What the samples found.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Samples {
    /// The records in flight at each sample that read the gauge.
    pub in_flight: Vec<f64>,
    /// Samples that read the pipeline thread's state.
    pub pipeline_samples: u32,
    /// Of those, the samples that found it runnable.
    pub pipeline_runnable: u32,
    /// Samples that read the `binlog-reader` thread's state.
    pub reader_samples: u32,
    /// Of those, the samples that found it runnable.
    pub reader_runnable: u32,
    /// Samples with the pipeline's thread asleep and the window at three quarters of
    /// `max_in_flight` or more (waiting for acknowledgements).
    pub asleep_window_full: u32,
    /// Samples with the pipeline's thread asleep and the window below that (waiting for the
    /// reader).
    pub asleep_window_open: u32,
}

impl Samples {
    /// The figures for the report: sample count, the in-flight median and 90th percentile and
    /// the share of samples below a quarter of `max_in_flight`, the pipeline and reader
    /// threads' runnable shares, and the shares of the pipeline's samples asleep with the
    /// window full or open; `Null` without samples.
    pub fn summary(&self, max_in_flight: f64) -> Value {
        if self.in_flight.is_empty() && self.pipeline_samples == 0 {
            return Value::Null;
        }
        let mut v = self.in_flight.clone();
        v.sort_by(f64::total_cmp);
        let at = |q: f64| {
            v.get(((v.len() as f64 - 1.0) * q).round() as usize)
                .copied()
        };
        let below = v.iter().filter(|x| **x < max_in_flight / 4.0).count();
        json!({
            "samples": v.len(),
            "max_in_flight": max_in_flight,
            "in_flight_p50": at(0.5),
            "in_flight_p90": at(0.9),
            "share_below_quarter": (!v.is_empty()).then(|| below as f64 / v.len() as f64),
            "pipeline_runnable_share": (self.pipeline_samples > 0)
                .then(|| f64::from(self.pipeline_runnable) / f64::from(self.pipeline_samples)),
            "reader_runnable_share": (self.reader_samples > 0)
                .then(|| f64::from(self.reader_runnable) / f64::from(self.reader_samples)),
            "pipeline_asleep_window_full_share": (self.pipeline_samples > 0)
                .then(|| f64::from(self.asleep_window_full) / f64::from(self.pipeline_samples)),
            "pipeline_asleep_window_open_share": (self.pipeline_samples > 0)
                .then(|| f64::from(self.asleep_window_open) / f64::from(self.pipeline_samples)),
        })
    }
}

/// A running sampler; [`Sampler::finish`] stops it.
pub struct Sampler {
    stop: watch::Sender<bool>,
    task: JoinHandle<Samples>,
}

impl Sampler {
    /// Samples process `pid`, whose metrics are at `http://127.0.0.1:<port>/metrics` and
    /// whose window is `max_in_flight` records, until [`Sampler::finish`].
    pub fn start(pid: u32, port: u16, max_in_flight: f64) -> Self {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let client = reqwest::Client::builder()
                .timeout(Duration::from_millis(500))
                .build()
                .ok();
            let url = format!("http://127.0.0.1:{port}/metrics");
            let mut out = Samples::default();
            // The reader thread of the run sampled (a restart starts another).
            let mut reader: Option<String> = None;
            let mut tick = tokio::time::interval(EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tokio::select! {
                    _ = stopped.changed() => return out,
                    _ = tick.tick() => {}
                }
                let pipeline = state_of(&format!("/proc/{pid}/stat"));
                if let Some(state) = pipeline {
                    out.pipeline_samples += 1;
                    out.pipeline_runnable += u32::from(state == 'R');
                }
                let mut reader_state = reader.as_deref().and_then(state_of);
                if reader_state.is_none() {
                    reader = reader_stat(pid);
                    reader_state = reader.as_deref().and_then(state_of);
                }
                if let Some(state) = reader_state {
                    out.reader_samples += 1;
                    out.reader_runnable += u32::from(state == 'R');
                }
                let Some(client) = &client else { continue };
                if let Ok(resp) = client.get(&url).send().await {
                    if let Some(n) = resp.text().await.ok().as_deref().and_then(in_flight_of) {
                        out.in_flight.push(n);
                        if pipeline.is_some_and(|s| s != 'R') {
                            if n >= max_in_flight * 0.75 {
                                out.asleep_window_full += 1;
                            } else {
                                out.asleep_window_open += 1;
                            }
                        }
                    }
                }
            }
        });
        Self { stop, task }
    }

    /// Stops sampling; what was sampled (nothing when the task failed).
    pub async fn finish(self) -> Samples {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_default()
    }
}

/// The records in flight in a Prometheus text exposition: the sum of the
/// `outbox_relay_records_in_flight` samples (one per source); `None` without one.
pub fn in_flight_of(text: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("outbox_relay_records_in_flight") else {
            continue;
        };
        // The name alone, or followed by its labels: not a longer name sharing the prefix.
        if !(rest.starts_with(' ') || rest.starts_with('{')) {
            continue;
        }
        if let Some(v) = rest
            .rsplit(' ')
            .next()
            .and_then(|v| v.trim().parse::<f64>().ok())
        {
            *found.get_or_insert(0.0) += v;
        }
    }
    found
}

/// The state letter of the thread or process whose `stat` file is at `path`.
fn state_of(path: &str) -> Option<char> {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| thread_state(&s))
}

/// The `stat` file of process `pid`'s `binlog-reader` thread, when it has one.
fn reader_stat(pid: u32) -> Option<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
        .map(|task| task.path())
        .find(|task| {
            std::fs::read_to_string(task.join("comm"))
                .is_ok_and(|c| crate::procs::thread_class(c.trim(), false) == "binlog_reader")
        })
        .map(|task| task.join("stat").to_string_lossy().into_owned())
}

/// The state letter of a `/proc/<pid>/stat` line (the field after the parenthesised command
/// name, which may itself hold spaces and parentheses).
pub fn thread_state(stat: &str) -> Option<char> {
    let (_, after) = stat.rsplit_once(')')?;
    after.trim_start().chars().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_flight_sums_the_sources_and_ignores_other_metrics() {
        let text =
            "# HELP outbox_relay_records_in_flight Records produced and not yet acknowledged.\n\
                    # TYPE outbox_relay_records_in_flight gauge\n\
                    outbox_relay_records_in_flight{source=\"a\"} 120\n\
                    outbox_relay_records_in_flight{source=\"b\"} 5\n\
                    outbox_relay_records_in_flight_total 9\n\
                    outbox_relay_records_produced_total{topic=\"t\"} 7\n";
        assert_eq!(in_flight_of(text), Some(125.0));
        assert_eq!(
            in_flight_of("outbox_relay_records_in_flight 3\n"),
            Some(3.0)
        );
        assert_eq!(in_flight_of("outbox_relay_lag_seconds 1\n"), None);
    }

    #[test]
    fn thread_state_reads_past_a_command_with_parentheses() {
        assert_eq!(thread_state("42 (outbox-relay) R 1 42 42 0"), Some('R'));
        assert_eq!(thread_state("42 (a) b (c)) S 1 42"), Some('S'));
        assert_eq!(thread_state("garbage"), None);
    }

    #[test]
    fn summary_gives_percentiles_and_shares() {
        let s = Samples {
            in_flight: vec![100.0, 4000.0, 300.0, 200.0, 10000.0],
            pipeline_samples: 4,
            pipeline_runnable: 3,
            reader_samples: 5,
            reader_runnable: 1,
            asleep_window_full: 1,
            asleep_window_open: 0,
        };
        let v = s.summary(10000.0);
        assert_eq!(v["samples"], 5);
        assert_eq!(v["in_flight_p50"], 300.0);
        assert_eq!(v["in_flight_p90"], 10000.0);
        assert_eq!(v["share_below_quarter"], 0.6);
        assert_eq!(v["pipeline_runnable_share"], 0.75);
        assert_eq!(v["reader_runnable_share"], 0.2);
        assert_eq!(v["pipeline_asleep_window_full_share"], 0.25);
        assert_eq!(v["pipeline_asleep_window_open_share"], 0.0);
        assert_eq!(Samples::default().summary(10.0), Value::Null);
    }
}
