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
}

impl AckAudit {
    /// Opens (creates, or appends to) `path`; dead letters are audited under
    /// `dead_letter_topic`.
    ///
    /// # Errors
    /// [`RelayError::Config`] naming `audit.acks_file` when the file cannot be opened.
    pub fn open(path: &Path, dead_letter_topic: &str) -> Result<Self, RelayError> {
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
        })
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
    ) {
        Self::line(out, "record", topic, partition, offset, event_key, position);
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
        let audit = AckAudit::open(&path, "outbox.dlq").expect("open");
        let mut out = String::new();
        AckAudit::record(
            &mut out,
            "t.Order",
            2,
            41,
            Some("evt-\"1\""),
            &"bin.000001:400",
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
    fn an_unwritable_path_is_a_config_error_naming_the_key() {
        let err = AckAudit::open(Path::new("/nonexistent-dir/acks.jsonl"), "dlq")
            .expect_err("no such folder");
        assert!(err.to_string().contains("audit.acks_file"), "{err}");
    }
}
