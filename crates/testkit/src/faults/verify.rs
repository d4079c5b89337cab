//! The end-of-run checks: every committed row on Kafka, nothing else, per-key order, content.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use crate::kafka::Record;

use super::workload::{parse_event_key, payload, EventRef};

/// Outcome of comparing the topics with the outbox table.
#[derive(Debug, Default, Clone)]
pub struct Verification {
    /// Rows in the outbox table at the end (the truth: committed).
    pub committed: usize,
    /// Records read from the topics (duplicates included).
    pub records: usize,
    /// Committed rows that arrived at least once.
    pub distinct_delivered: usize,
    /// Committed rows that never arrived (event keys).
    pub missing: Vec<String>,
    /// Extra copies of committed rows.
    pub duplicates: usize,
    /// Most copies of one row.
    pub max_copies: usize,
    /// Records of rows that are not committed: rolled back on purpose, unknown, or absent from
    /// the outbox table.
    pub phantoms: Vec<String>,
    /// Records whose topic, key, value or headers differ from the row.
    pub content_mismatches: Vec<String>,
    /// Per key: a row first arrived after a later row of the same key, or a key spans
    /// partitions.
    pub order_violations: Vec<String>,
    /// Per key: a re-sent run of records skipped a row (it had arrived before, so nothing is
    /// lost, but a replay must be contiguous).
    pub replay_gaps: Vec<String>,
    /// Distinct keys.
    pub keys: usize,
}

impl Verification {
    /// `true` when nothing is missing, out of order, unexplained or altered.
    pub fn passed(&self) -> bool {
        self.missing.is_empty()
            && self.phantoms.is_empty()
            && self.content_mismatches.is_empty()
            && self.order_violations.is_empty()
            && self.replay_gaps.is_empty()
    }

    /// The first problems of each kind, one per line.
    pub fn problems(&self, limit: usize) -> Vec<String> {
        let mut out = Vec::new();
        for (what, list) in [
            ("missing", &self.missing),
            ("phantom", &self.phantoms),
            ("content", &self.content_mismatches),
            ("order", &self.order_violations),
            ("replay gap", &self.replay_gaps),
        ] {
            for p in list.iter().take(limit) {
                out.push(format!("{what}: {p}"));
            }
            if list.len() > limit {
                out.push(format!("{what}: … {} more", list.len() - limit));
            }
        }
        out
    }
}

/// Where one record of a key was read.
struct Occurrence {
    partition: i32,
    offset: i64,
    seq: u64,
    topic: String,
}

/// Compares `records` (everything in the run's topics) with `committed` (every `event_key` in
/// the outbox table). `topic_for` maps an aggregate type to its topic.
pub fn verify(
    run: &str,
    records: &[Record],
    committed: &HashSet<String>,
    topic_for: impl Fn(&str) -> String,
) -> Verification {
    let mut v = Verification {
        committed: committed.len(),
        records: records.len(),
        ..Verification::default()
    };
    let mut copies: HashMap<&str, usize> = HashMap::new();
    let mut by_key: BTreeMap<String, Vec<Occurrence>> = BTreeMap::new();
    for r in records {
        let at = format!("{}/{}@{}", r.topic, r.partition, r.offset);
        let Some(ek) = r.header("event_key") else {
            v.phantoms
                .push(format!("{at}: record without an event_key header"));
            continue;
        };
        let parsed = parse_event_key(run, ek);
        let (aggregate_id, aggregate_type, seq) = match parsed {
            Some(EventRef::Row {
                aggregate_id,
                aggregate_type,
                seq,
            }) if committed.contains(ek) => (aggregate_id, aggregate_type, seq),
            Some(EventRef::RolledBack) => {
                v.phantoms
                    .push(format!("{at}: {ek} was rolled back but reached Kafka"));
                continue;
            }
            Some(EventRef::Row { .. }) => {
                v.phantoms.push(format!(
                    "{at}: {ek} is not in the outbox table but reached Kafka"
                ));
                continue;
            }
            None => {
                v.phantoms.push(format!(
                    "{at}: event_key {ek:?} was not written by this run"
                ));
                continue;
            }
        };
        *copies.entry(ek).or_default() += 1;
        let want_topic = topic_for(&aggregate_type);
        let want_value = payload(&aggregate_id, seq);
        let mut diffs = Vec::new();
        if r.topic != want_topic {
            diffs.push(format!("topic {} (expected {want_topic})", r.topic));
        }
        if r.key_str() != Some(aggregate_id.as_str()) {
            diffs.push(format!("key {:?} (expected {aggregate_id:?})", r.key_str()));
        }
        if r.value_str() != Some(want_value.as_str()) {
            diffs.push(format!("value {:?}", r.value_str()));
        }
        if r.header("aggregate_type") != Some(aggregate_type.as_str()) {
            diffs.push(format!(
                "header aggregate_type {:?}",
                r.header("aggregate_type")
            ));
        }
        if !diffs.is_empty() {
            v.content_mismatches
                .push(format!("{at} ({ek}): {}", diffs.join(", ")));
        }
        by_key.entry(aggregate_id).or_default().push(Occurrence {
            partition: r.partition,
            offset: r.offset,
            seq,
            topic: r.topic.clone(),
        });
    }

    v.distinct_delivered = copies.len();
    v.duplicates = copies.values().map(|n| n - 1).sum();
    v.max_copies = copies.values().copied().max().unwrap_or(0);
    let mut missing: Vec<String> = committed
        .iter()
        .filter(|ek| !copies.contains_key(ek.as_str()))
        .cloned()
        .collect();
    missing.sort();
    v.missing = missing;
    v.keys = by_key.len();

    for (key, mut occ) in by_key {
        let places: BTreeSet<(String, i32)> =
            occ.iter().map(|o| (o.topic.clone(), o.partition)).collect();
        if places.len() > 1 {
            v.order_violations
                .push(format!("key {key:?} is spread over {places:?}"));
            continue;
        }
        occ.sort_by_key(|o| o.offset);
        let mut seen: HashSet<u64> = HashSet::new();
        let mut max_first = 0u64;
        let mut prev: Option<(u64, i64)> = None;
        for o in &occ {
            if seen.insert(o.seq) {
                if o.seq <= max_first {
                    v.order_violations.push(format!(
                        "key {key:?}: seq {} first arrived at offset {} after seq {max_first}",
                        o.seq, o.offset
                    ));
                }
                max_first = max_first.max(o.seq);
            } else if let Some((p, p_off)) = prev {
                // A re-sent record: the replay must not skip rows since the previous record.
                if o.seq > p + 1 && (p + 1..o.seq).all(|s| seen.contains(&s)) {
                    v.replay_gaps.push(format!(
                        "key {key:?}: re-sent seq {} at offset {} follows seq {p} at offset {p_off}",
                        o.seq, o.offset
                    ));
                }
            }
            prev = Some((o.seq, o.offset));
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::workload::event_key;

    fn rec(topic: &str, partition: i32, offset: i64, key: &str, ek: &str, value: &str) -> Record {
        let agg_type = if topic.ends_with("Order") {
            "Order"
        } else {
            "Payment"
        };
        Record {
            topic: topic.into(),
            partition,
            offset,
            key: Some(key.as_bytes().to_vec()),
            value: Some(value.as_bytes().to_vec()),
            headers: vec![
                ("event_key".into(), Some(ek.as_bytes().to_vec())),
                ("aggregate_type".into(), Some(agg_type.as_bytes().to_vec())),
            ],
            timestamp_ms: None,
        }
    }

    fn row(run: &str, seq: u64, offset: i64) -> Record {
        rec(
            "t.Order",
            0,
            offset,
            "w0-k0",
            &event_key(run, 0, 0, seq),
            &payload("w0-k0", seq),
        )
    }

    fn topic_for(t: &str) -> String {
        format!("t.{t}")
    }

    #[test]
    fn replays_are_fine_gaps_and_inversions_are_not() {
        let run = "r";
        let committed: HashSet<String> = (1..=4).map(|s| event_key(run, 0, 0, s)).collect();
        // 1 2 3 | replay 2 3 4: complete, in order, 2 duplicates.
        let ok: Vec<Record> = [1, 2, 3, 2, 3, 4]
            .iter()
            .enumerate()
            .map(|(i, s)| row(run, *s, i as i64))
            .collect();
        let v = verify(run, &ok, &committed, topic_for);
        assert!(v.passed(), "{:?}", v.problems(10));
        assert_eq!(
            (v.duplicates, v.max_copies, v.distinct_delivered),
            (2, 2, 4)
        );

        // 1 3 2 4: 2 first arrives after 3.
        let inverted: Vec<Record> = [1, 3, 2, 4]
            .iter()
            .enumerate()
            .map(|(i, s)| row(run, *s, i as i64))
            .collect();
        let v = verify(run, &inverted, &committed, topic_for);
        assert_eq!(v.order_violations.len(), 1, "{:?}", v.problems(10));

        // 1 2 3 4 | replay 2 4: the replay skipped 3.
        let gap: Vec<Record> = [1, 2, 3, 4, 2, 4]
            .iter()
            .enumerate()
            .map(|(i, s)| row(run, *s, i as i64))
            .collect();
        let v = verify(run, &gap, &committed, topic_for);
        assert_eq!(v.replay_gaps.len(), 1, "{:?}", v.problems(10));
        assert!(v.order_violations.is_empty());

        // 1 2 4: 3 missing; a rolled-back row and an altered value.
        let mut bad: Vec<Record> = [1, 2, 4]
            .iter()
            .enumerate()
            .map(|(i, s)| row(run, *s, i as i64))
            .collect();
        bad.push(rec("t.Order", 0, 9, "w0-k0", "r.rb.0.1", "{}"));
        bad.push(rec(
            "t.Order",
            0,
            10,
            "w0-k0",
            &event_key(run, 0, 0, 1),
            "{}",
        ));
        let v = verify(run, &bad, &committed, topic_for);
        assert_eq!(v.missing, vec![event_key(run, 0, 0, 3)]);
        assert_eq!(v.phantoms.len(), 1);
        assert_eq!(v.content_mismatches.len(), 1);
        assert!(!v.passed());
    }
}
