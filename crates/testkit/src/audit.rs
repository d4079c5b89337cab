//! The relay's acknowledgement audit (`[audit] acks_file`, `OUTBOX_RELAY__AUDIT__ACKS_FILE`)
//! read back against the log: every (topic, partition, offset) the relay was told was stored
//! is read with a fresh consumer, and must hold a record with the acknowledged `event_key`.
//!
//! The read is `read_uncommitted`: an exactly-once relay's records of an aborted transaction
//! were acknowledged too and are in the log (marked aborted), so this checks what an
//! acknowledgement claims (storage), in both delivery modes. What a `read_committed` consumer
//! sees is the fault matrix's other check.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::Value;

use crate::unique::unique_suffix;

/// One line of the audit file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckLine {
    /// Topic acknowledged.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// The row's event_key (`None`: the row had none).
    pub event_key: Option<String>,
    /// `record` or `dead_letter`.
    pub kind: String,
}

/// The lines of the audit file at `path`, and how many lines could not be parsed (a relay
/// killed in the middle of a write leaves at most one, its last).
///
/// # Errors
/// The file cannot be read.
pub fn read_ack_audit(path: &Path) -> Result<(Vec<AckLine>, usize)> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the acknowledgement audit {}", path.display()))?;
    let mut lines = Vec::new();
    let mut unparsed = 0;
    // `[audit] timings` adds a line per committed Kafka transaction: not an acknowledgement.
    for line in text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with(r#"{"kind":"commit""#))
    {
        match parse_line(line) {
            Some(l) => lines.push(l),
            None => unparsed += 1,
        }
    }
    Ok((lines, unparsed))
}

fn parse_line(line: &str) -> Option<AckLine> {
    let v: Value = serde_json::from_str(line).ok()?;
    Some(AckLine {
        topic: v.get("topic")?.as_str()?.to_owned(),
        partition: i32::try_from(v.get("partition")?.as_i64()?).ok()?,
        offset: v.get("offset")?.as_i64()?,
        event_key: v.get("event_key")?.as_str().map(str::to_owned),
        kind: v.get("kind")?.as_str()?.to_owned(),
    })
}

/// What reading every acknowledged offset back found.
#[derive(Debug, Clone, Default)]
pub struct AuditCheck {
    /// Acknowledgements audited (lines).
    pub acknowledged: usize,
    /// Distinct (topic, partition, offset) read back.
    pub offsets: usize,
    /// Acknowledged offsets with no record in the log: `topic/partition@offset event_key`.
    pub missing: Vec<String>,
    /// Offsets whose record has another event_key than the acknowledged one.
    pub mismatched: Vec<String>,
    /// Audit lines that could not be parsed.
    pub unparsed: usize,
}

impl AuditCheck {
    /// Every acknowledged offset holds its record.
    pub fn passed(&self) -> bool {
        self.missing.is_empty() && self.mismatched.is_empty()
    }
}

/// Reads every offset of `lines` back (a fresh `read_uncommitted` consumer per call, each
/// partition from its lowest acknowledged offset to its highest) and compares the record's
/// `event_key` header with the acknowledged one.
///
/// # Errors
/// The consumer cannot be created or assigned. Offsets not read within `timeout` count as
/// missing.
pub async fn check_ack_audit(
    bootstrap: &str,
    lines: Vec<AckLine>,
    timeout: Duration,
) -> Result<AuditCheck> {
    let bootstrap = bootstrap.to_owned();
    tokio::task::spawn_blocking(move || check_blocking(&bootstrap, &lines, timeout))
        .await
        .context("the audit reader panicked")?
}

fn check_blocking(bootstrap: &str, lines: &[AckLine], timeout: Duration) -> Result<AuditCheck> {
    let mut wanted: BTreeMap<(String, i32), BTreeSet<i64>> = BTreeMap::new();
    for l in lines {
        wanted
            .entry((l.topic.clone(), l.partition))
            .or_default()
            .insert(l.offset);
    }
    let mut found: HashMap<(String, i32, i64), Option<String>> = HashMap::new();
    if !wanted.is_empty() {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set(
                "group.id",
                format!("outbox-relay-audit-{}", unique_suffix()),
            )
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_uncommitted")
            .set("allow.auto.create.topics", "false")
            .set("enable.partition.eof", "false")
            .create()
            .context("creating the audit reader")?;
        let mut tpl = TopicPartitionList::new();
        for ((topic, partition), offsets) in &wanted {
            let first = offsets.first().copied().unwrap_or(0);
            tpl.add_partition_offset(topic, *partition, Offset::Offset(first))?;
        }
        consumer
            .assign(&tpl)
            .context("assigning the audited partitions")?;
        // Highest offset still to reach, per partition.
        let mut left: BTreeMap<(String, i32), i64> = wanted
            .iter()
            .filter_map(|(tp, offsets)| offsets.last().map(|o| (tp.clone(), *o)))
            .collect();
        let deadline = Instant::now() + timeout;
        while !left.is_empty() && Instant::now() < deadline {
            let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) else {
                continue;
            };
            let tp = (m.topic().to_owned(), m.partition());
            let key = m.headers().and_then(|h| {
                h.iter()
                    .find(|h| h.key == "event_key")
                    .and_then(|h| h.value)
                    .map(|v| String::from_utf8_lossy(v).into_owned())
            });
            found.insert((tp.0.clone(), tp.1, m.offset()), key);
            if left.get(&tp).is_some_and(|last| m.offset() >= *last) {
                left.remove(&tp);
            }
        }
    }
    let mut check = AuditCheck {
        acknowledged: lines.len(),
        offsets: wanted.values().map(BTreeSet::len).sum(),
        ..AuditCheck::default()
    };
    for l in lines {
        let at = format!(
            "{}/{}@{} event_key {}",
            l.topic,
            l.partition,
            l.offset,
            l.event_key.as_deref().unwrap_or("(none)")
        );
        match found.get(&(l.topic.clone(), l.partition, l.offset)) {
            None => check.missing.push(at),
            Some(key) if l.event_key.is_some() && *key != l.event_key => {
                check
                    .mismatched
                    .push(format!("{at}: the log holds event_key {key:?}"));
            }
            Some(_) => {}
        }
    }
    Ok(check)
}
