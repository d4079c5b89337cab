//! The latency budget of one steady run: each relayed row's latency split into stages, from
//! points measured outside the relay's hot path:
//!
//! | point | measured by |
//! | --- | --- |
//! | statement sent, commit returned | the writer ([`crate::workload::write_steady`]) |
//! | rows event arrived at a bare replica | [`crate::binlog::Tail`] |
//! | read, handed to the producer, acknowledged | the relay's `[audit] timings` lines |
//! | appended by the broker | the record's `LogAppendTime` (ms) |
//! | Kafka transaction committed (exactly-once) | the audit's `commit` lines |
//! | visible to a `read_committed` reader | [`crate::kafka::LiveReader`] |
//!
//! and the relay's own share of the p99: its commit → acknowledgement p99 minus the p99 of the
//! bare arrival and of the bare producer's send → acknowledgement on the same rows.

use std::collections::HashMap;
use std::path::Path;

use serde_json::{json, Map, Value};

use crate::kafka::summary;

/// The relay's times of one row, from its audit line.
#[derive(Debug, Clone, Copy)]
pub struct RelayTimes {
    /// Its binlog event read, µs since the epoch.
    pub read_us: i64,
    /// Handed to the producer.
    pub sent_us: i64,
    /// Acknowledged.
    pub acked_us: i64,
}

/// The audit of a relay run with `[audit] timings`: rows of workload `agg` (event keys
/// `<agg>-<seq>`) by sequence number, and the commit times (sorted).
#[derive(Debug, Default)]
pub struct Audit {
    /// Row sequence number → its times.
    pub rows: HashMap<u64, RelayTimes>,
    /// Committed Kafka transactions, µs since the epoch, sorted.
    pub commits: Vec<i64>,
}

/// Reads `path` (missing: empty), keeping the rows of workload `agg` and every commit line.
pub fn read_audit(path: &Path, agg: &str) -> Audit {
    let mut out = Audit::default();
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let prefix = format!("{agg}-");
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if v["kind"] == "commit" {
            if let Some(c) = v["committed_us"].as_i64() {
                out.commits.push(c);
            }
            continue;
        }
        let Some(seq) = v["event_key"]
            .as_str()
            .and_then(|k| k.strip_prefix(&prefix))
            .and_then(|s| s.parse::<u64>().ok())
        else {
            continue;
        };
        let t = |k: &str| v[k].as_i64();
        if let (Some(read_us), Some(sent_us), Some(acked_us)) =
            (t("read_us"), t("sent_us"), t("acked_us"))
        {
            out.rows.insert(
                seq,
                RelayTimes {
                    read_us,
                    sent_us,
                    acked_us,
                },
            );
        }
    }
    out.commits.sort_unstable();
    out
}

/// Everything measured about the rows of one steady run.
#[derive(Debug, Default)]
pub struct Points {
    /// Rows per source transaction.
    pub txn: u64,
    /// Per transaction: its first row, statement sent, commit returned (µs since the epoch).
    pub commits: Vec<(u64, i64, i64)>,
    /// Row → arrival at the bare replica.
    pub arrivals: HashMap<u64, i64>,
    /// Row → the bare producer's send → acknowledgement of its record, µs.
    pub bare_by_row: HashMap<u64, i64>,
    /// Row → the control producer's send → acknowledgement of its record, µs
    /// (`BENCH_PAIR_CONTROL`; empty without it).
    pub control_by_row: HashMap<u64, i64>,
    /// The relay's audit.
    pub audit: Audit,
    /// Row → broker append time (µs, from ms).
    pub appended: HashMap<u64, i64>,
    /// Row → arrival at the read_committed live reader.
    pub visible: HashMap<u64, i64>,
    /// Exactly-once runs: row → when the bare transactional producer's transaction holding its
    /// record committed (µs since the epoch).
    pub bare_committed: HashMap<u64, i64>,
    /// Exactly-once runs: row → the bare transactional producer's record of it reached a
    /// read_committed reader (µs since the epoch).
    pub bare_visible: HashMap<u64, i64>,
}

/// The stage names in timeline order, each with what it spans.
pub const STAGES: &[(&str, &str)] = &[
    ("db_commit", "statement sent → commit returned"),
    (
        "binlog_arrival",
        "commit returned → rows event at a bare replica",
    ),
    ("relay_read", "bare arrival → relay read the event"),
    ("relay_handoff", "relay read → handed to the producer"),
    (
        "broker_append",
        "handed to the producer → broker append (LogAppendTime, ms)",
    ),
    ("ack", "broker append → relay got the acknowledgement"),
    (
        "commit_to_ack",
        "commit returned → acknowledged (the relay's figure)",
    ),
    (
        "txn_commit",
        "acknowledged → its Kafka transaction committed (exactly-once)",
    ),
    (
        "visible",
        "transaction committed → read_committed reader got it (exactly-once)",
    ),
    (
        "commit_to_visible",
        "commit returned → visible to a read_committed reader",
    ),
    (
        "bare_produce",
        "a bare producer's send → acknowledgement, same rows (exactly-once runs: the bare \
         transactional producer's, inside its transactions, as the relay's acknowledgements are)",
    ),
    (
        "relay_excess",
        "per row: bare arrival → the relay's acknowledgement, less the bare producer's send → \
         acknowledgement of the same row (the relay's own time, paired row by row)",
    ),
    (
        "bare_txn_commit",
        "exactly-once runs: bare arrival → a bare transactional producer (the relay's group \
         commit) committed the transaction holding the row's record",
    ),
    (
        "bare_visible",
        "exactly-once runs: bare arrival → that record reached a read_committed reader",
    ),
    (
        "relay_eos_excess",
        "per row: bare arrival → visible for the relay's record, less bare arrival → visible \
         for the bare transactional producer's (the exactly-once relay's own time, paired)",
    ),
    (
        "pair_floor",
        "per row: a second bare producer's send → acknowledgement, less the first's \
         (`BENCH_PAIR_CONTROL=1`): what `relay_excess` reads for a relay that adds no time",
    ),
];

/// Per stage: p50/p99/p999/max (ms) and the number of rows measured; and the relay's share of
/// the p99 (`relay_share_p99_ms`) when the arrival, the bare producer and the relay's
/// acknowledgements were all measured.
pub fn budget(p: &Points) -> Value {
    let mut stages: HashMap<&str, Vec<i64>> = HashMap::new();
    let mut push = |name: &'static str, v: i64| stages.entry(name).or_default().push(v);
    for &(first, sent, commit) in &p.commits {
        push("db_commit", commit - sent);
        for seq in first..first + p.txn.max(1) {
            let arrival = p.arrivals.get(&seq).copied();
            let relay = p.audit.rows.get(&seq).copied();
            let appended = p.appended.get(&seq).copied();
            if let Some(a) = arrival {
                push("binlog_arrival", a - commit);
            }
            if let (Some(a), Some(r)) = (arrival, relay) {
                push("relay_read", r.read_us - a);
                // Paired on the row: a broker stall both records meet cancels out, where the
                // difference of two p99s keeps each run's luck.
                if let Some(&bare) = p.bare_by_row.get(&seq) {
                    push("relay_excess", r.acked_us - a - bare);
                }
            }
            if let Some(r) = relay {
                push("relay_handoff", r.sent_us - r.read_us);
                push("commit_to_ack", r.acked_us - commit);
                if let Some(ap) = appended {
                    push("broker_append", ap - r.sent_us);
                    push("ack", r.acked_us - ap);
                }
                // The first commit at or after the acknowledgement.
                let i = p.audit.commits.partition_point(|&c| c < r.acked_us);
                if let Some(&c) = p.audit.commits.get(i) {
                    push("txn_commit", c - r.acked_us);
                    if let Some(&v) = p.visible.get(&seq) {
                        push("visible", v - c);
                    }
                }
            }
            if let Some(&v) = p.visible.get(&seq) {
                push("commit_to_visible", v - commit);
            }
            if let Some(a) = arrival {
                if let Some(&c) = p.bare_committed.get(&seq) {
                    push("bare_txn_commit", c - a);
                }
                if let Some(&bv) = p.bare_visible.get(&seq) {
                    push("bare_visible", bv - a);
                    if let Some(&v) = p.visible.get(&seq) {
                        push("relay_eos_excess", v - bv);
                    }
                }
            }
        }
    }
    if !p.bare_by_row.is_empty() {
        stages.insert("bare_produce", p.bare_by_row.values().copied().collect());
    }
    // Two producers that add nothing, paired on the row as `relay_excess` pairs the relay with
    // the first: whatever this reads is the broker's and the machine's, not a relay's.
    let floor: Vec<i64> = p
        .control_by_row
        .iter()
        .filter_map(|(seq, c)| Some(c - p.bare_by_row.get(seq)?))
        .collect();
    if !floor.is_empty() {
        stages.insert("pair_floor", floor);
    }
    let mut out = Map::new();
    let mut p99 = HashMap::new();
    for (name, _) in STAGES {
        let Some(v) = stages.get_mut(name) else {
            continue;
        };
        v.sort_unstable();
        let mut s = Map::new();
        for (k, x) in summary(v) {
            s.insert(k.to_owned(), json!(x));
        }
        s.insert("rows".into(), json!(v.len()));
        p99.insert(*name, summary(v)["p99_ms"]);
        out.insert((*name).to_owned(), Value::Object(s));
    }
    // A relay's p99 less the bare arrival's and its bare limit's, when all three were measured.
    let share_of = |total: &str, bare: &str| match (
        p99.get(total),
        p99.get("binlog_arrival"),
        p99.get(bare),
    ) {
        (Some(total), Some(arrival), Some(bare)) => json!(total - (arrival + bare)),
        _ => Value::Null,
    };
    let share = share_of("commit_to_ack", "bare_produce");
    let excess = p99.get("relay_excess").map_or(Value::Null, |v| json!(v));
    let floor = p99.get("pair_floor").map_or(Value::Null, |v| json!(v));
    // Exactly-once: the same split, with the transactional bare producer's arrival → visible
    // as the limit (what one transactional producer's commits cost on this broker).
    let eos_share = share_of("commit_to_visible", "bare_visible");
    let eos_excess = p99
        .get("relay_eos_excess")
        .map_or(Value::Null, |v| json!(v));
    json!({"stages": out, "relay_share_p99_ms": share, "relay_excess_p99_ms": excess,
        "pair_floor_p99_ms": floor, "relay_eos_share_p99_ms": eos_share,
        "relay_eos_excess_p99_ms": eos_excess})
}

/// Now, in ms since the epoch.
pub fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The broker's stop-the-world garbage collection pauses logged between `from_ms` and `to_ms`
/// (ms since the epoch) in `path`, a JVM unified log with the `timemillis` decorator
/// (`-Xlog:gc:file=…:timemillis`, tests/services/kafka.sh with `KAFKA_GC_LOG=1`), lines such as
/// `[1764921021123ms] GC(5) Pause Young (Normal) (G1 Evacuation Pause) 51M->12M(256M) 3.456ms`:
/// `{"pauses": n, "total_ms": …, "max_ms": …}`; `null` when the file cannot be read.
pub fn gc_pauses(path: &Path, from_ms: i64, to_ms: i64) -> Value {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Value::Null;
    };
    let (mut n, mut total, mut max) = (0u64, 0f64, 0f64);
    for line in text.lines() {
        let Some(at) = line
            .strip_prefix('[')
            .and_then(|l| l.split_once("ms]"))
            .and_then(|(t, _)| t.parse::<i64>().ok())
        else {
            continue;
        };
        if !(from_ms..=to_ms).contains(&at) || !line.contains(" Pause ") {
            continue;
        }
        let Some(ms) = line
            .rsplit(' ')
            .next()
            .and_then(|x| x.strip_suffix("ms"))
            .and_then(|x| x.parse::<f64>().ok())
        else {
            continue;
        };
        n += 1;
        total += ms;
        max = max.max(ms);
    }
    json!({"pauses": n, "total_ms": total, "max_ms": max})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gc_pauses_counts_the_pauses_within_the_window() {
        let dir = std::env::temp_dir().join(format!("bench-gc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("gc.log");
        std::fs::write(
            &path,
            "[1000ms] Using G1\n\
             [1500ms] GC(0) Pause Young (Normal) (G1 Evacuation Pause) 51M->12M(256M) 3.5ms\n\
             [2500ms] GC(1) Pause Young (Normal) (G1 Evacuation Pause) 60M->13M(256M) 20.25ms\n\
             [2600ms] GC(2) Concurrent Mark Cycle 40.0ms\n\
             [2700ms] GC(2) Pause Remark 70M->70M(256M) 1.25ms\n\
             [9000ms] GC(3) Pause Young (Normal) (G1 Evacuation Pause) 51M->12M(256M) 99.0ms\n",
        )
        .expect("write");
        let g = gc_pauses(&path, 2000, 3000);
        assert_eq!(g["pauses"], 2);
        assert_eq!(g["total_ms"], 21.5);
        assert_eq!(g["max_ms"], 20.25);
        assert!(gc_pauses(&dir.join("none.log"), 0, 1).is_null());
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn stages_are_the_differences_between_the_points_of_each_row() {
        let mut p = Points {
            txn: 2,
            commits: vec![(10, 1_000, 3_000)],
            ..Points::default()
        };
        for (seq, base) in [(10u64, 0i64), (11, 100)] {
            p.arrivals.insert(seq, 3_500 + base);
            p.audit.rows.insert(
                seq,
                RelayTimes {
                    read_us: 4_000 + base,
                    sent_us: 4_200 + base,
                    acked_us: 9_000 + base,
                },
            );
            p.appended.insert(seq, 7_000 + base);
            p.visible.insert(seq, 12_000 + base);
        }
        p.audit.commits = vec![5_000, 10_000];
        p.bare_by_row = HashMap::from([(10, 2_000), (11, 2_000)]);
        let b = budget(&p);
        let s = &b["stages"];
        assert_eq!(s["db_commit"]["p50_ms"], 2.0);
        assert_eq!(s["binlog_arrival"]["rows"], 2);
        assert_eq!(s["relay_read"]["p50_ms"], 0.5);
        assert_eq!(s["relay_handoff"]["p99_ms"], 0.2);
        assert_eq!(s["broker_append"]["p50_ms"], 2.8);
        assert_eq!(s["ack"]["p50_ms"], 2.0);
        // 10,000 is the first commit at or after both acknowledgements (9,000 and 9,100).
        assert_eq!(s["txn_commit"]["p99_ms"], 1.0);
        assert_eq!(s["visible"]["p99_ms"], 2.1);
        assert_eq!(s["commit_to_ack"]["p99_ms"], 6.1);
        assert_eq!(s["commit_to_visible"]["p50_ms"], 9.0);
        // 6.1 - (0.6 + 2.0)
        let share = b["relay_share_p99_ms"].as_f64().expect("share");
        assert!((share - 3.5).abs() < 1e-9, "{share}");
        // Per row, arrival → ack less the bare record's send → ack: (9,000 - 3,500) - 2,000
        // and (9,100 - 3,600) - 2,000.
        assert_eq!(s["relay_excess"]["rows"], 2);
        assert_eq!(s["relay_excess"]["max_ms"], 3.5);
        assert_eq!(b["relay_excess_p99_ms"], s["relay_excess"]["p99_ms"]);
        assert!(s["relay_excess"]["p50_ms"]
            .as_f64()
            .is_some_and(|x| x == 1.5 || x == 3.5));
        // No control producer: no floor.
        assert!(s["pair_floor"].is_null());
        assert!(b["pair_floor_p99_ms"].is_null());
    }

    #[test]
    fn the_exactly_once_share_is_taken_against_the_bare_transactional_producer() {
        let mut p = Points {
            txn: 1,
            commits: vec![(1, 0, 1_000), (2, 0, 2_000)],
            ..Points::default()
        };
        // Arrival 500 µs after each commit; the relay's record visible 40/50 ms after the
        // commit, the bare transactional producer's 30/45 ms after the arrival, its commit
        // 25/40 ms after it.
        for (seq, commit, relay, bare, bare_commit) in [
            (1u64, 1_000i64, 40_000i64, 30_000i64, 25_000i64),
            (2, 2_000, 50_000, 45_000, 40_000),
        ] {
            let arrival = commit + 500;
            p.arrivals.insert(seq, arrival);
            p.visible.insert(seq, commit + relay);
            p.bare_visible.insert(seq, arrival + bare);
            p.bare_committed.insert(seq, arrival + bare_commit);
        }
        let b = budget(&p);
        let s = &b["stages"];
        assert_eq!(s["bare_txn_commit"]["p99_ms"], 40.0);
        assert_eq!(s["bare_visible"]["p99_ms"], 45.0);
        assert_eq!(s["commit_to_visible"]["p99_ms"], 50.0);
        // 50 - (0.5 + 45)
        let share = b["relay_eos_share_p99_ms"].as_f64().expect("share");
        assert!((share - 4.5).abs() < 1e-9, "{share}");
        // Per row, the relay's visible time less the bare one's: 41,000 - 31,500 = 9.5 ms and
        // 52,000 - 47,500 = 4.5 ms.
        assert_eq!(s["relay_eos_excess"]["rows"], 2);
        assert_eq!(b["relay_eos_excess_p99_ms"], 9.5);
        // No relay acknowledgements among these points: no acknowledgement share.
        assert!(b["relay_share_p99_ms"].is_null());
    }

    #[test]
    fn the_pairing_floor_is_the_control_producer_less_the_first_per_row() {
        let mut p = Points {
            txn: 1,
            ..Points::default()
        };
        p.bare_by_row = HashMap::from([(1, 2_000), (2, 3_000), (3, 1_000)]);
        // Row 3's control record was not delivered: no pair.
        p.control_by_row = HashMap::from([(1, 2_500), (2, 1_000)]);
        let b = budget(&p);
        let floor = &b["stages"]["pair_floor"];
        assert_eq!(floor["rows"], 2);
        assert_eq!(floor["max_ms"], 0.5);
        assert_eq!(b["pair_floor_p99_ms"], floor["p99_ms"]);
        // 1,000 - 3,000: the control was the faster one for row 2.
        assert!(floor["p50_ms"]
            .as_f64()
            .is_some_and(|x| x == -2.0 || x == 0.5));
    }

    #[test]
    fn the_audit_keeps_its_workload_rows_and_every_commit() {
        let dir = std::env::temp_dir().join(format!("bench-audit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("a.jsonl");
        std::fs::write(
            &path,
            concat!(
                r#"{"kind":"record","event_key":"s5000x1-7","read_us":1,"sent_us":2,"acked_us":3}"#,
                "\n",
                r#"{"kind":"record","event_key":"s1000x1-7","read_us":4,"sent_us":5,"acked_us":6}"#,
                "\n",
                r#"{"kind":"commit","committed_us":9}"#,
                "\n",
                r#"{"kind":"commit","committed_us":8}"#,
                "\nnot json\n",
            ),
        )
        .expect("write");
        let a = read_audit(&path, "s5000x1");
        assert_eq!(a.rows.len(), 1);
        assert_eq!(a.rows[&7].acked_us, 3);
        assert_eq!(a.commits, vec![8, 9]);
        std::fs::remove_dir_all(&dir).ok();
    }
}
