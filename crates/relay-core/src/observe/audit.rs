//! The acknowledgement audit (`[audit] acks_file`): one JSON line per record Kafka
//! acknowledged, so that a test, a soak or an operator can read every acknowledged offset back
//! and prove it was stored.
//!
//! A line is
//! `{"topic":"outbox.event.Order","partition":3,"offset":1234,"event_key":"evt-1","position":"binlog.000002:5678","kind":"record"}`
//! (`kind` `dead_letter` for a dead letter, its topic the dead-letter topic; `event_key` null
//! when the row had none). Lines are appended with one `write` per batch of delivery reports,
//! straight to the file (no buffer in the process), so a relay killed with -9 leaves every line
//! of the acknowledgements it had applied. Off by default: no per-record work then.
//!
//! With `[audit] timings = true` a record's line also has `read_us`, `sent_us` and `acked_us`
//! (wall-clock microseconds since the Unix epoch: its binlog event read, its record handed to
//! the producer, its acknowledgement applied), and each committed Kafka transaction of the
//! exactly-once relay a line `{"kind":"commit","committed_us":...}`: the relay's stages of a
//! latency budget (`make bench`), taken where the pipeline already is, so that timing costs
//! nothing while it is off.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

use crate::error::RelayError;

/// The open audit file, shared by the runs of one process.
#[derive(Debug)]
pub struct AckAudit {
    file: Mutex<File>,
    dead_letter_topic: String,
    timings: bool,
}

/// When the relay handled one record (wall clock, microseconds since the Unix epoch), for a
/// line of an audit with timings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordTimes {
    /// Its binlog event was read (returned by the binlog source).
    pub read_us: i64,
    /// Its record was handed to the producer.
    pub sent_us: i64,
    /// Its acknowledgement was applied.
    pub acked_us: i64,
}

/// Now, in microseconds since the Unix epoch (0 if the clock is before it).
pub fn unix_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// `at` on the wall clock, in microseconds since the Unix epoch, given that `now` is
/// `now_us` there.
pub fn wall_micros(at: std::time::Instant, now: std::time::Instant, now_us: i64) -> i64 {
    let back = now.saturating_duration_since(at).as_micros();
    now_us.saturating_sub(i64::try_from(back).unwrap_or(i64::MAX))
}

impl AckAudit {
    /// Opens (creates, or appends to) `path`; dead letters are audited under
    /// `dead_letter_topic`.
    ///
    /// # Errors
    /// [`RelayError::Config`] naming `audit.acks_file` when the file cannot be opened.
    pub fn open(path: &Path, dead_letter_topic: &str, timings: bool) -> Result<Self, RelayError> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| {
                RelayError::Config(format!(
                    "audit.acks_file {}: cannot open it for appending: {e}. Fix: name a file in \
                     a writable folder, or remove audit.acks_file",
                    path.display()
                ))
            })?;
        Ok(Self {
            file: Mutex::new(file),
            dead_letter_topic: dead_letter_topic.to_owned(),
            timings,
        })
    }

    /// `[audit] timings`: records' lines carry [`RecordTimes`], commits get lines.
    pub fn timings(&self) -> bool {
        self.timings
    }

    /// Appends the line of a committed Kafka transaction (audit with timings only) to `out`.
    pub fn commit(&self, out: &mut String, committed_us: i64) {
        if self.timings {
            let line = serde_json::json!({"kind": "commit", "committed_us": committed_us});
            out.push_str(&line.to_string());
            out.push('\n');
        }
    }

    /// Appends one line for an acknowledged outbox record to `out` (a batch, written later by
    /// [`AckAudit::write`]).
    pub fn record(
        out: &mut String,
        topic: &str,
        partition: i32,
        offset: i64,
        event_key: Option<&str>,
        position: &dyn std::fmt::Display,
        times: Option<RecordTimes>,
    ) {
        Self::line(out, "record", topic, partition, offset, event_key, position);
        if let Some(t) = times {
            // The line's closing brace and newline, replaced by the times.
            out.truncate(out.len() - 2);
            out.push_str(&format!(
                ",\"read_us\":{},\"sent_us\":{},\"acked_us\":{}}}\n",
                t.read_us, t.sent_us, t.acked_us
            ));
        }
    }

    /// Appends one line for an acknowledged dead letter to `out`.
    pub fn dead_letter(
        &self,
        out: &mut String,
        partition: i32,
        offset: i64,
        event_key: Option<&str>,
        position: &dyn std::fmt::Display,
    ) {
        Self::line(
            out,
            "dead_letter",
            &self.dead_letter_topic,
            partition,
            offset,
            event_key,
            position,
        );
    }

    fn line(
        out: &mut String,
        kind: &str,
        topic: &str,
        partition: i32,
        offset: i64,
        event_key: Option<&str>,
        position: &dyn std::fmt::Display,
    ) {
        let line = serde_json::json!({
            "topic": topic,
            "partition": partition,
            "offset": offset,
            "event_key": event_key,
            "position": position.to_string(),
            "kind": kind,
        });
        out.push_str(&line.to_string());
        out.push('\n');
    }

    /// Writes the batch `lines` (whole lines) with one `write_all`, and clears it. A failure is
    /// logged, never fatal: the audit observes the relay, it does not steer it.
    pub fn write(&self, lines: &mut String) {
        if lines.is_empty() {
            return;
        }
        let result = match self.file.lock() {
            Ok(mut file) => file.write_all(lines.as_bytes()),
            Err(_) => Ok(()), // a writer panicked: nothing sane to add to
        };
        if let Err(e) = result {
            tracing::warn!(error = %e, "cannot append to audit.acks_file");
        }
        lines.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_json_with_every_field() {
        let dir = std::env::temp_dir().join(format!("ack-audit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("acks.jsonl");
        let audit = AckAudit::open(&path, "outbox.dlq", false).expect("open");
        let mut out = String::new();
        AckAudit::record(
            &mut out,
            "t.Order",
            2,
            41,
            Some("evt-\"1\""),
            &"bin.000001:400",
            None,
        );
        audit.dead_letter(&mut out, 0, 7, None, &"bin.000001:500");
        audit.write(&mut out);
        assert!(out.is_empty());
        let text = std::fs::read_to_string(&path).expect("read");
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("json line"))
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["topic"], "t.Order");
        assert_eq!(lines[0]["partition"], 2);
        assert_eq!(lines[0]["offset"], 41);
        assert_eq!(lines[0]["event_key"], "evt-\"1\"");
        assert_eq!(lines[0]["position"], "bin.000001:400");
        assert_eq!(lines[0]["kind"], "record");
        assert_eq!(lines[1]["topic"], "outbox.dlq");
        assert_eq!(lines[1]["kind"], "dead_letter");
        assert!(lines[1]["event_key"].is_null());
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn timings_add_the_record_times_and_commit_lines() {
        let dir = std::env::temp_dir().join(format!("ack-audit-t-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("acks.jsonl");
        let audit = AckAudit::open(&path, "outbox.dlq", true).expect("open");
        assert!(audit.timings());
        let mut out = String::new();
        let times = RecordTimes {
            read_us: 1_700_000_000_000_001,
            sent_us: 1_700_000_000_000_020,
            acked_us: 1_700_000_000_003_000,
        };
        AckAudit::record(&mut out, "t.Order", 0, 5, Some("k"), &"b.1:4", Some(times));
        audit.commit(&mut out, 1_700_000_000_004_000);
        audit.write(&mut out);
        let text = std::fs::read_to_string(&path).expect("read");
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("json line"))
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(lines[0]["event_key"], "k");
        assert_eq!(lines[0]["offset"], 5);
        assert_eq!(lines[0]["read_us"], 1_700_000_000_000_001_i64);
        assert_eq!(lines[0]["sent_us"], 1_700_000_000_000_020_i64);
        assert_eq!(lines[0]["acked_us"], 1_700_000_000_003_000_i64);
        assert_eq!(lines[1]["kind"], "commit");
        assert_eq!(lines[1]["committed_us"], 1_700_000_000_004_000_i64);
        // Without timings: no commit lines.
        let quiet = AckAudit::open(&dir.join("b.jsonl"), "outbox.dlq", false).expect("open");
        let mut out = String::new();
        quiet.commit(&mut out, 1);
        assert!(out.is_empty());
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn wall_micros_goes_back_from_now() {
        let now = std::time::Instant::now();
        let earlier = now
            .checked_sub(std::time::Duration::from_micros(1_500))
            .expect("past");
        assert_eq!(wall_micros(earlier, now, 10_000), 8_500);
        // A later instant than `now` counts as now.
        assert_eq!(
            wall_micros(now + std::time::Duration::from_secs(1), now, 10_000),
            10_000
        );
    }

    #[test]
    fn an_unwritable_path_is_a_config_error_naming_the_key() {
        let err = AckAudit::open(Path::new("/nonexistent-dir/acks.jsonl"), "dlq", false)
            .expect_err("no such folder");
        assert!(err.to_string().contains("audit.acks_file"), "{err}");
    }
}
