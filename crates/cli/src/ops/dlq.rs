//! `outbox-relay dlq replay`: dead letters back to the topics they were meant for, after the
//! fix.
//!
//! Reads the dead-letter topic (`dead_letter.topic`, `read_committed`) from its own consumer
//! group's committed offsets to the end the topic had when the run started, and re-produces
//! each selected dead letter to its `dlq_topic` with its key, value and headers (the `dlq_*`
//! headers removed) plus `dlq_replayed_from` = `<dead-letter topic>/<partition>/<offset>`.
//!
//! Records go out in Kafka transactions of a transactional producer that also commit the
//! group's offsets (`send_offsets_to_transaction`: KIP-98's consume-transform-produce loop), so
//! a run stopped anywhere resumes after the last committed batch, and a `read_committed`
//! consumer sees each replayed dead letter once. Keys keep their partition (the relay's
//! partitioner, `murmur2_random`) and their order (one producer, in dead-letter order, which
//! is the rows' order per key). Records dead-lettered with a value too large for their topic
//! (`dlq_value_dropped`) or without a topic (the row could not be routed) cannot be replayed:
//! they are listed, and `republish` sends their rows again from the outbox.

use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, Instant};

use outbox_relay_core::config::{KafkaConfig, RelayConfig};
use outbox_relay_core::error::RelayError;
use outbox_relay_kafka::publish::{transaction_error as txn_error, TxnProducer};
use outbox_relay_kafka::reader::{Offsets, ReadRecord, Reader};

/// Header a replayed record carries: where its dead letter was, `<topic>/<partition>/<offset>`.
pub const REPLAYED_FROM_HEADER: &str = "dlq_replayed_from";

/// Longest wait for metadata, offsets and each transactional call.
const TIMEOUT: Duration = Duration::from_secs(30);
/// Longest time without a record while the topic is not read to its end.
const IDLE: Duration = Duration::from_secs(30);

/// What `dlq replay` selects and how it runs. Filters combine with AND; none: every dead letter.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    /// Only dead letters written at or after this time (the dead letter's timestamp, ms since
    /// the epoch).
    pub since_ms: Option<i64>,
    /// Only dead letters written before this time (ms since the epoch).
    pub until_ms: Option<i64>,
    /// Only dead letters of this outbox table (`dlq_table`, `database.table`).
    pub table: Option<String>,
    /// Only dead letters whose `dlq_reason` contains this text.
    pub reason: Option<String>,
    /// Only dead letters meant for this topic (`dlq_topic`).
    pub topic: Option<String>,
    /// Only dead letters with one of these `event_key` headers (empty: any).
    pub event_keys: Vec<String>,
    /// The replay's consumer group and `transactional.id`; `None`: derived from the connector
    /// name and the filters ([`default_group`]), so the same selection resumes and another
    /// selection starts from the beginning.
    pub group: Option<String>,
    /// List what would be replayed; produce and commit nothing.
    pub dry_run: bool,
    /// Stop after this many replayed records; the next run goes on from there.
    pub max_records: Option<u64>,
    /// Records per Kafka transaction (at least 1).
    pub batch: usize,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        Self {
            since_ms: None,
            until_ms: None,
            table: None,
            reason: None,
            topic: None,
            event_keys: Vec::new(),
            group: None,
            dry_run: false,
            max_records: None,
            batch: 500,
        }
    }
}

/// The consumer group of a replay of `connector`'s dead letters with `opts`' filters:
/// `outbox-relay.dlq-replay.<connector>.<crc32 of the filters, 8 hex digits>`.
pub fn default_group(connector: &str, opts: &ReplayOptions) -> String {
    let mut keys = opts.event_keys.clone();
    keys.sort();
    let filters = format!(
        "{:?}|{:?}|{:?}|{:?}|{:?}|{:?}",
        opts.since_ms, opts.until_ms, opts.table, opts.reason, opts.topic, keys
    );
    format!(
        "outbox-relay.dlq-replay.{connector}.{:08x}",
        crc32fast::hash(filters.as_bytes())
    )
}

/// What a replay did (or, with `dry_run`, would do).
#[derive(Debug, Default)]
pub struct ReplayReport {
    /// The dead-letter topic read.
    pub dead_letter_topic: String,
    /// The replay's consumer group.
    pub group: String,
    /// Nothing was produced or committed.
    pub dry_run: bool,
    /// Dead letters read.
    pub read: u64,
    /// Dead letters replayed (dry run: that would be).
    pub replayed: u64,
    /// Dead letters the filters left out.
    pub filtered: u64,
    /// Selected dead letters that cannot be replayed (each has a `SKIP` line).
    pub not_replayable: u64,
    /// Stopped at `max_records` before the end: a next run goes on.
    pub more: bool,
    /// One line per replayed (`REPLAY`, dry run `WOULD`) or unreplayable (`SKIP`) dead letter.
    pub lines: Vec<String>,
}

impl fmt::Display for ReplayReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for line in &self.lines {
            writeln!(f, "{line}")?;
        }
        let verb = if self.dry_run {
            "would replay"
        } else {
            "replayed"
        };
        write!(
            f,
            "{verb} {} of {} dead letters read from {} (group {}); {} left out by the filters, \
             {} cannot be replayed",
            self.replayed,
            self.read,
            self.dead_letter_topic,
            self.group,
            self.filtered,
            self.not_replayable
        )?;
        if self.more {
            write!(f, "; stopped at --max-records: run again to go on")?;
        }
        // A plan's last line (nothing sent, no offset committed) is the command's.
        Ok(())
    }
}

/// What to do with one dead letter.
enum Verdict {
    Filtered,
    Skip(&'static str),
    Replay(String),
}

fn verdict(m: &ReadRecord, opts: &ReplayOptions) -> Verdict {
    let ts = m.timestamp_ms;
    let selected = opts.since_ms.is_none_or(|s| ts.is_some_and(|t| t >= s))
        && opts.until_ms.is_none_or(|u| ts.is_some_and(|t| t < u))
        && opts
            .table
            .as_deref()
            .is_none_or(|t| m.header_str("dlq_table") == Some(t))
        && opts
            .reason
            .as_deref()
            .is_none_or(|r| m.header_str("dlq_reason").is_some_and(|h| h.contains(r)))
        && opts
            .topic
            .as_deref()
            .is_none_or(|t| m.header_str("dlq_topic") == Some(t))
        && (opts.event_keys.is_empty()
            || m.header_str("event_key")
                .is_some_and(|k| opts.event_keys.iter().any(|e| e == k)));
    if !selected {
        return Verdict::Filtered;
    }
    match m.header_str("dlq_topic") {
        None | Some("") => Verdict::Skip(
            "its row was never routed to a topic (see dlq_reason): fix the row, then republish \
             it from the outbox",
        ),
        Some(_) if m.header_str("dlq_value_dropped") == Some("true") => Verdict::Skip(
            "its value was dropped (too large for its topic): raise the size limits, then \
             republish it from the outbox",
        ),
        Some(topic)
            if !topic
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')) =>
        {
            Verdict::Skip("its topic is not a valid Kafka topic name: republish it from the outbox")
        }
        Some(topic) => Verdict::Replay(topic.to_owned()),
    }
}

/// The consumer of `group` (`read_committed`, manual offsets) with the connection properties
/// of `kafka.properties` (producer-only ones left out).
fn consumer(kafka: &KafkaConfig, group: &str) -> Result<Reader, RelayError> {
    Reader::read_committed(kafka, group, false, "dead-letter reader")
}

/// The transactional producer of the replay: the relay's producer settings (idempotent,
/// `acks=all`, `murmur2_random`) with `transactional.id` = `group`.
fn producer(kafka: &KafkaConfig, group: &str) -> Result<TxnProducer, RelayError> {
    TxnProducer::new(kafka, group, "replay", TIMEOUT)
}

/// Replays `config`'s dead letters per `opts` (see the module documentation). Blocking: call
/// it from a blocking thread.
///
/// # Errors
/// [`RelayError::Config`] when the dead-letter topic does not exist or a property is invalid;
/// [`RelayError::Kafka`] when Kafka cannot be read or written, or a transaction fails (what was
/// committed before stays; a next run goes on from there).
pub fn replay(config: &RelayConfig, opts: &ReplayOptions) -> Result<ReplayReport, RelayError> {
    let dlq = config.dead_letter.topic.clone();
    let group = opts
        .group
        .clone()
        .unwrap_or_else(|| default_group(&config.connector_name, opts));
    let mut report = ReplayReport {
        dead_letter_topic: dlq.clone(),
        group: group.clone(),
        dry_run: opts.dry_run,
        ..ReplayReport::default()
    };
    let reader = consumer(&config.kafka, &group)?;
    let metadata = reader
        .topics(Some(dlq.as_str()), TIMEOUT)
        .map_err(|e| RelayError::kafka(format!("reading the metadata of {dlq}: {e}")))?;
    let partitions: Vec<i32> = metadata
        .iter()
        .filter(|t| t.error.is_none())
        .flat_map(|t| t.partitions.iter().copied())
        .collect();
    if partitions.is_empty() {
        return Err(RelayError::Config(format!(
            "the dead-letter topic {dlq} does not exist (dead_letter.topic): nothing to replay, \
             or the config names another topic than the relay's"
        )));
    }
    let mut wanted = Offsets::new();
    for p in &partitions {
        wanted.add_partition(&dlq, *p);
    }
    let committed = reader
        .committed(wanted, TIMEOUT)
        .map_err(|e| RelayError::kafka(format!("reading the offsets of group {group}: {e}")))?;
    // Per partition: where the run starts and the end it stops at.
    let mut ends: HashMap<i32, i64> = HashMap::new();
    let mut assignment = Offsets::new();
    for p in partitions {
        let (low, high) = reader
            .watermarks(&dlq, p, TIMEOUT)
            .map_err(|e| RelayError::kafka(format!("reading the offsets of {dlq}: {e}")))?;
        let start = committed
            .raw(&dlq, p)
            .filter(|o| *o >= 0)
            .map_or(low, |o| o.max(low));
        if start < high {
            ends.insert(p, high);
            assignment
                .add(&dlq, p, start)
                .map_err(|e| RelayError::kafka(format!("assigning {dlq}: {e}")))?;
        }
    }
    if ends.is_empty() {
        return Ok(report);
    }
    reader
        .assign(&assignment)
        .map_err(|e| RelayError::kafka(format!("assigning {dlq}: {e}")))?;
    let producer = if opts.dry_run {
        None
    } else {
        Some(producer(&config.kafka, &group)?)
    };
    let mut run = Batch {
        producer: producer.as_ref(),
        reader: &reader,
        dlq: &dlq,
        ends: &ends,
        open: false,
        records: 0,
    };
    let mut last_record = Instant::now();
    loop {
        if run.read_to_end()? {
            break;
        }
        if opts.max_records.is_some_and(|m| report.replayed >= m) {
            report.more = true;
            break;
        }
        let Some(message) = reader.poll(Duration::from_millis(200)) else {
            if last_record.elapsed() > IDLE {
                run.abort();
                return Err(RelayError::kafka(format!(
                    "{dlq} could not be read to its end within {} s (an open transaction \
                     holding back its last stable offset?); what was committed stays, run \
                     again",
                    IDLE.as_secs()
                )));
            }
            continue;
        };
        let m = message.map_err(|e| RelayError::kafka(format!("reading {dlq}: {e}")))?;
        last_record = Instant::now();
        if ends.get(&m.partition).is_none_or(|end| m.offset >= *end) {
            continue; // written after the run started
        }
        report.read += 1;
        let from = format!("{dlq}/{}/{}", m.partition, m.offset);
        let event_key = m.header_str("event_key").unwrap_or("-").to_owned();
        match verdict(&m, opts) {
            Verdict::Filtered => report.filtered += 1,
            Verdict::Skip(why) => {
                report.not_replayable += 1;
                report
                    .lines
                    .push(format!("SKIP   {from} event_key={event_key}: {why}"));
            }
            Verdict::Replay(topic) => {
                let verb = if opts.dry_run { "WOULD " } else { "REPLAY" };
                report
                    .lines
                    .push(format!("{verb} {from} -> {topic} event_key={event_key}"));
                run.send(&m, &topic, &from)?;
                report.replayed += 1;
            }
        }
        if run.records >= opts.batch.max(1) {
            run.commit()?;
        }
    }
    run.commit()?;
    Ok(report)
}

/// The open Kafka transaction of a replay.
struct Batch<'a> {
    /// `None`: dry run.
    producer: Option<&'a TxnProducer>,
    reader: &'a Reader,
    dlq: &'a str,
    ends: &'a HashMap<i32, i64>,
    open: bool,
    records: usize,
}

impl Batch<'_> {
    /// `true` when every assigned partition is read up to its end.
    fn read_to_end(&self) -> Result<bool, RelayError> {
        let positions = self
            .reader
            .position()
            .map_err(|e| RelayError::kafka(format!("reading {}: {e}", self.dlq)))?;
        Ok(self
            .ends
            .iter()
            .all(|(p, end)| positions.raw(self.dlq, *p).is_some_and(|at| at >= *end)))
    }

    fn begin(&mut self) -> Result<(), RelayError> {
        if let (Some(p), false) = (self.producer, self.open) {
            p.begin()
                .map_err(|e| txn_error("beginning a replay transaction", &e))?;
            self.open = true;
        }
        Ok(())
    }

    /// Sends `m`'s key, value and headers (without `dlq_*`, with [`REPLAYED_FROM_HEADER`]) to
    /// `topic`.
    fn send(&mut self, m: &ReadRecord, topic: &str, from: &str) -> Result<(), RelayError> {
        let Some(producer) = self.producer else {
            return Ok(());
        };
        self.begin()?;
        let mut headers: Vec<(&str, Option<&[u8]>)> = m
            .headers
            .iter()
            .filter(|(k, _)| !k.starts_with("dlq_"))
            .map(|(k, v)| (k.as_str(), v.as_deref()))
            .collect();
        headers.push((REPLAYED_FROM_HEADER, Some(from.as_bytes())));
        if let Err(e) = producer.send(
            topic,
            m.key.as_deref(),
            m.value.as_deref(),
            &headers,
            TIMEOUT,
        ) {
            self.abort();
            return Err(RelayError::kafka(format!("sending {from} to {topic}: {e}")));
        }
        self.records += 1;
        Ok(())
    }

    /// Commits the sent records with the group's offsets up to what was read (also when only
    /// filtered or unreplayable dead letters were read). Nothing in a dry run.
    fn commit(&mut self) -> Result<(), RelayError> {
        let Some(producer) = self.producer else {
            return Ok(());
        };
        let positions = self
            .reader
            .position()
            .map_err(|e| RelayError::kafka(format!("reading {}: {e}", self.dlq)))?;
        let mut offsets = Offsets::new();
        for (p, end) in self.ends {
            if let Some(at) = positions.raw(self.dlq, *p) {
                // Records polled past the end are not replayed: never commit past it.
                offsets
                    .add(self.dlq, *p, at.min(*end))
                    .map_err(|e| RelayError::kafka(format!("offsets of {}: {e}", self.dlq)))?;
            }
        }
        if offsets.count() == 0 && !self.open {
            return Ok(());
        }
        self.begin()?;
        let group = self
            .reader
            .group_metadata()
            .ok_or_else(|| RelayError::kafka("the dead-letter reader has no group metadata"))?;
        let result = producer.commit_with_offsets(&offsets, &group, TIMEOUT);
        match result {
            Ok(()) => {
                self.open = false;
                self.records = 0;
                Ok(())
            }
            Err(e) => {
                self.abort();
                Err(txn_error(
                    "committing a replay transaction (its records are not visible to \
                     read_committed consumers; run again)",
                    &e,
                ))
            }
        }
    }

    fn abort(&mut self) {
        if let (Some(p), true) = (self.producer, self.open) {
            if let Err(e) = p.abort(TIMEOUT) {
                tracing::warn!(error = %e, "aborting the replay transaction failed; the next \
                    replay with this group aborts it");
            }
            self.open = false;
            self.records = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_group_follows_the_filters() {
        let all = ReplayOptions::default();
        let one = ReplayOptions {
            event_keys: vec!["b".into(), "a".into()],
            ..ReplayOptions::default()
        };
        let same = ReplayOptions {
            event_keys: vec!["a".into(), "b".into()],
            dry_run: true,
            ..ReplayOptions::default()
        };
        assert!(default_group("c", &all).starts_with("outbox-relay.dlq-replay.c."));
        assert_ne!(default_group("c", &all), default_group("c", &one));
        // Order of keys and the dry-run flag do not make another selection.
        assert_eq!(default_group("c", &one), default_group("c", &same));
        assert_ne!(default_group("c", &all), default_group("d", &all));
    }

    #[test]
    fn the_summary_says_what_happened() {
        let report = ReplayReport {
            dead_letter_topic: "dlq".into(),
            group: "g".into(),
            dry_run: true,
            read: 3,
            replayed: 1,
            filtered: 1,
            not_replayable: 1,
            more: false,
            lines: vec!["WOULD  dlq/0/0 -> t event_key=k".into()],
        };
        let text = report.to_string();
        assert!(
            text.starts_with("WOULD  dlq/0/0 -> t event_key=k\n"),
            "{text}"
        );
        assert!(
            text.ends_with(
                "would replay 1 of 3 dead letters read from dlq (group g); 1 left out by the \
                 filters, 1 cannot be replayed"
            ),
            "{text}"
        );
    }
}
