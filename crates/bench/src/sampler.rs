//! What a draining relay waits on, sampled from its first record in flight on (its startup's
//! ticks are counted apart): every [`EVERY`] its records in flight (the
//! `outbox_relay_records_in_flight` gauge of its `/metrics`) and whether its pipeline's thread
//! (the process's main thread: routing, producing, acknowledgements) is runnable, i.e. running
//! or waiting for a core (state `R` in `/proc/<pid>/stat`, proc(5)), and so is its
//! `binlog-reader` thread. A window that stays full says Kafka's acknowledgements bound the
//! drain; a window far from full with the pipeline's thread nearly always runnable says that
//! thread's CPU does. A pipeline thread asleep is told apart by the window at that sample: at
//! three quarters of `max_in_flight` or more the reader is paused and the pipeline waits for
//! acknowledgements; below, it takes events and waits for the reader to decode one.
//!
//! With the database server's pid, every thread of the server is sampled too, and the one that
//! used the most CPU over the drain (the binlog dump thread serving the relay) is reported: how
//! often it was runnable, and where the kernel had it asleep (`/proc/<pid>/task/<tid>/wchan`,
//! proc(5)). A dump thread asleep waiting to send (`poll_schedule_timeout` on MySQL, with a full
//! socket) while the reader thread runs says the relay's reading and decoding bound the drain,
//! not the server.

use std::collections::BTreeMap;
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
    /// The database server's threads, by thread id.
    pub server_threads: BTreeMap<u32, ServerThread>,
    /// Ticks before the first sample that found a record in flight (the relay starting),
    /// not counted in any figure above.
    pub before_first_record: u32,
}

/// What the samples found of one thread of the database server.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ServerThread {
    /// Its CPU time (seconds, user + system) at its first and last sample.
    pub first_cpu_s: f64,
    /// See `first_cpu_s`.
    pub last_cpu_s: f64,
    /// Samples that read its state.
    pub samples: u32,
    /// Of those, the samples that found it runnable.
    pub runnable: u32,
    /// The samples that found it asleep, by the kernel function it waited in (its `wchan`).
    pub asleep_in: BTreeMap<String, u32>,
}

impl Samples {
    /// The figures for the report: sample count, the in-flight median and 90th percentile and
    /// the share of samples below a quarter of `max_in_flight`, the pipeline and reader
    /// threads' runnable shares, and the shares of the pipeline's samples asleep with the
    /// window full or open; of the database server's busiest thread, its runnable share and
    /// the kernel function it was most often asleep in with that share; `Null` without
    /// samples.
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
        let dump = self
            .server_threads
            .values()
            .filter(|t| t.samples > 0)
            .max_by(|a, b| {
                (a.last_cpu_s - a.first_cpu_s).total_cmp(&(b.last_cpu_s - b.first_cpu_s))
            });
        let share = |n: u32, of: u32| f64::from(n) / f64::from(of.max(1));
        let dump_wait = dump.and_then(|t| {
            let (wchan, n) = t.asleep_in.iter().max_by_key(|(_, n)| **n)?;
            Some((wchan.clone(), share(*n, t.samples)))
        });
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
            "server_dump_runnable_share": dump.map(|t| share(t.runnable, t.samples)),
            "server_dump_asleep_in": dump_wait.as_ref().map(|(w, _)| w.clone()),
            "server_dump_asleep_in_share": dump_wait.map(|(_, s)| s),
            "skipped_before_first_record": self.before_first_record,
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
    /// whose window is `max_in_flight` records, and the threads of the database server `server`
    /// when known, until [`Sampler::finish`].
    pub fn start(pid: u32, port: u16, max_in_flight: f64, server: Option<u32>) -> Self {
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
            // Samples count from the first one that finds a record in flight: before it the
            // relay is starting (its checks, the lease, and on MySQL the server reading the
            // binlog file up to a GTID start, 1.0–1.3 s of a 5 s drain in a full bench), and
            // its threads' states say nothing about what bounds the streaming rate, which is
            // what `× limit` compares. Without a metrics client nothing gates the samples.
            let mut streaming = client.is_none();
            loop {
                tokio::select! {
                    _ = stopped.changed() => return out,
                    _ = tick.tick() => {}
                }
                // The relay's thread states before its metrics are fetched: serving the
                // request wakes the relay, which would make its threads look runnable.
                let pipeline = state_of(&format!("/proc/{pid}/stat"));
                let mut reader_state = reader.as_deref().and_then(state_of);
                if reader_state.is_none() {
                    reader = reader_stat(pid);
                    reader_state = reader.as_deref().and_then(state_of);
                }
                let metrics = match &client {
                    Some(client) => match client.get(&url).send().await {
                        Ok(resp) => resp.text().await.ok().as_deref().and_then(in_flight_of),
                        Err(_) => None,
                    },
                    None => None,
                };
                if !streaming {
                    if metrics.is_some_and(|n| n > 0.0) {
                        streaming = true;
                    } else {
                        out.before_first_record += 1;
                        continue;
                    }
                }
                if let Some(state) = pipeline {
                    out.pipeline_samples += 1;
                    out.pipeline_runnable += u32::from(state == 'R');
                }
                if let Some(state) = reader_state {
                    out.reader_samples += 1;
                    out.reader_runnable += u32::from(state == 'R');
                }
                if let Some(server) = server {
                    sample_server(server, &mut out.server_threads);
                }
                if let Some(n) = metrics {
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

/// Adds one sample of every thread of process `server` to `threads`.
fn sample_server(server: u32, threads: &mut BTreeMap<u32, ServerThread>) {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{server}/task")) else {
        return;
    };
    for task in tasks.flatten() {
        let Some(tid) = task
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        let (Some(state), Some(cpu_s)) = (thread_state(&stat), crate::procs::stat_cpu_s(&stat))
        else {
            continue;
        };
        let t = threads.entry(tid).or_insert_with(|| ServerThread {
            first_cpu_s: cpu_s,
            ..ServerThread::default()
        });
        t.last_cpu_s = cpu_s;
        t.samples += 1;
        if state == 'R' {
            t.runnable += 1;
        } else if let Ok(wchan) = std::fs::read_to_string(task.path().join("wchan")) {
            let wchan = match wchan.trim() {
                "" | "0" => "-",
                w => w,
            };
            *t.asleep_in.entry(wchan.to_owned()).or_default() += 1;
        }
    }
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
            before_first_record: 3,
            server_threads: BTreeMap::from([
                // An idle thread, always asleep in one place.
                (
                    7,
                    ServerThread {
                        first_cpu_s: 0.10,
                        last_cpu_s: 0.11,
                        samples: 4,
                        runnable: 0,
                        asleep_in: BTreeMap::from([("do_epoll_wait".to_owned(), 4)]),
                    },
                ),
                // The dump thread: the most CPU between its first and last sample.
                (
                    9,
                    ServerThread {
                        first_cpu_s: 1.0,
                        last_cpu_s: 4.0,
                        samples: 5,
                        runnable: 1,
                        asleep_in: BTreeMap::from([
                            ("poll_schedule_timeout".to_owned(), 3),
                            ("-".to_owned(), 1),
                        ]),
                    },
                ),
            ]),
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
        assert_eq!(v["server_dump_runnable_share"], 0.2);
        assert_eq!(v["server_dump_asleep_in"], "poll_schedule_timeout");
        assert_eq!(v["server_dump_asleep_in_share"], 0.6);
        assert_eq!(v["skipped_before_first_record"], 3);
        assert_eq!(Samples::default().summary(10.0), Value::Null);
        let no_server = Samples {
            pipeline_samples: 1,
            ..Samples::default()
        };
        assert_eq!(
            no_server.summary(10.0)["server_dump_asleep_in"],
            Value::Null
        );
    }
}
