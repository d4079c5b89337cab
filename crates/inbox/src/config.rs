//! Settings of an inbox (`inbox/CONTRACT.md`, "Settings").

use std::time::Duration;

/// What to do with an event whose version is ahead of the next expected one (an earlier version
/// has not been applied yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GapPolicy {
    /// Store it in the parked table (outcome [`crate::Outcome::Parked`]) and apply it by itself
    /// once the version before it has been applied (outcome [`crate::Outcome::Resumed`]); past
    /// [`InboxConfig::gap_deadline`] it is dead-lettered with reason `version gap: expected N,
    /// got M; parked since T`. The partition moves on.
    #[default]
    Park,
    /// Dead-letter it at once with reason `version gap: expected N, got M` (outcome
    /// [`crate::Outcome::DeadLettered`]); the partition moves on.
    DeadLetter,
    /// Count it as a failed attempt and retry with backoff (the missing version may be on its
    /// way through another path); dead-letter after `max_attempts`.
    Retry,
}

/// Settings of one inbox. Build with [`InboxConfig::new`] and change fields as needed.
#[derive(Debug, Clone)]
pub struct InboxConfig {
    /// The consumer's name: part of the inbox key (two services sharing a database never
    /// suppress each other's events) and the default Kafka group id.
    pub consumer: String,
    /// Inbox table (`outbox_inbox`); `db.table` or `table`.
    pub inbox_table: String,
    /// Version table (`outbox_inbox_version`).
    pub version_table: String,
    /// Parked table (`outbox_inbox_parked`, `migrations/0006_inbox_parked.sql`).
    pub parked_table: String,
    /// Header carrying the idempotency key (`event_key`).
    pub event_key_header: String,
    /// Header carrying the event's version (decimal integer); `None` (default): no version check.
    pub version_header: Option<String>,
    /// What to do on a version gap.
    pub gap_policy: GapPolicy,
    /// Attempts before a failing record is dead-lettered (5); at least 1.
    pub max_attempts: u32,
    /// Wait before the second attempt (100 ms); doubled each attempt.
    pub backoff_initial: Duration,
    /// Longest wait between attempts (10 s).
    pub backoff_max: Duration,
    /// How long one record may keep failing with infrastructure errors only (the database
    /// unreachable, a lost connection, a read-only server, a deadlock…: see
    /// [`crate::is_infrastructure_error`]) before the consumer stops with
    /// [`crate::InboxError::Outage`], the record unsettled (5 min). Those errors are retried with
    /// the backoff above and do not count toward `max_attempts`.
    pub outage_budget: Duration,
    /// Dead-letter topic (required).
    pub dead_letter_topic: String,
    /// How long a parked record may wait for the version before it (1 h); then it is
    /// dead-lettered by the sweep.
    pub gap_deadline: Duration,
    /// How often [`crate::InboxConsumer`] sweeps the parked table (10 s): resumes rows whose
    /// predecessor was applied (after a crash between the two), drops stale ones,
    /// dead-letters expired ones. Also once before the first poll.
    pub park_sweep_interval: Duration,
    /// Retry tiers (`inbox/CONTRACT.md`, "Retry tiers"): delays such as `[1 min, 5 min, 1 h]`.
    /// Empty (default): blocking retries only, then the dead-letter topic. Otherwise a record
    /// whose attempts are used up is copied to the next tier's topic (outcome
    /// [`crate::Outcome::Retried`]) and the partition moves on; after the last tier, the
    /// dead-letter topic. Consumer-wide for now: [`InboxConfig::retry_tiers_for`] is where a
    /// per-topic value will take its place.
    pub retry_tiers: Vec<Duration>,
    /// Name of tier `n` (1-based) of a topic: `{topic}` and `{n}` replaced
    /// (`{topic}.retry.{n}`).
    pub retry_topic_format: String,
}

impl InboxConfig {
    /// The defaults of `inbox/CONTRACT.md` for `consumer`, dead-lettering to `dead_letter_topic`.
    pub fn new(consumer: impl Into<String>, dead_letter_topic: impl Into<String>) -> Self {
        InboxConfig {
            consumer: consumer.into(),
            inbox_table: "outbox_inbox".into(),
            version_table: "outbox_inbox_version".into(),
            parked_table: "outbox_inbox_parked".into(),
            event_key_header: "event_key".into(),
            version_header: None,
            gap_policy: GapPolicy::Park,
            max_attempts: 5,
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
            outage_budget: Duration::from_secs(300),
            dead_letter_topic: dead_letter_topic.into(),
            gap_deadline: Duration::from_secs(3600),
            park_sweep_interval: Duration::from_secs(10),
            retry_tiers: Vec::new(),
            retry_topic_format: "{topic}.retry.{n}".into(),
        }
    }

    /// The retry tiers of records first read from `topic` (consumer-wide for now: per-topic
    /// settings will replace the value here).
    pub fn retry_tiers_for(&self, _topic: &str) -> &[Duration] {
        &self.retry_tiers
    }

    /// The topic of tier `n` (1-based) of `topic`: [`InboxConfig::retry_topic_format`] with
    /// `{topic}` and `{n}` replaced.
    pub fn retry_topic(&self, topic: &str, n: u32) -> String {
        self.retry_topic_format
            .replace("{topic}", topic)
            .replace("{n}", &n.to_string())
    }

    /// The tier topics of `topic` (none without tiers).
    pub fn retry_topics(&self, topic: &str) -> Vec<String> {
        (1..=self.retry_tiers_for(topic).len() as u32)
            .map(|n| self.retry_topic(topic, n))
            .collect()
    }

    /// The waits between attempts: `backoff_initial`, doubled after each failed attempt, at
    /// most `backoff_max`, one per retry (`max_attempts - 1` of them); backon's exponential
    /// backoff without jitter, so the contract's schedule holds in every language.
    pub fn backoff(&self) -> backon::ExponentialBackoff {
        use backon::BackoffBuilder;
        backon::ExponentialBuilder::default()
            .with_factor(2.0)
            .with_min_delay(self.backoff_initial)
            .with_max_delay(self.backoff_max)
            .with_max_times(self.max_attempts.saturating_sub(1) as usize)
            .build()
    }

    /// The waits between retries after infrastructure errors: the same schedule as
    /// [`InboxConfig::backoff`] without a count (the outage budget bounds them).
    pub fn outage_backoff(&self) -> backon::ExponentialBackoff {
        use backon::BackoffBuilder;
        backon::ExponentialBuilder::default()
            .with_factor(2.0)
            .with_min_delay(self.backoff_initial)
            .with_max_delay(self.backoff_max)
            .without_max_times()
            .build()
    }

    /// Checks the names the SQL is built from (letters, digits, `_`, `$`, one optional `.`).
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.consumer.is_empty() {
            return Err("inbox consumer name is empty: set InboxConfig::consumer".into());
        }
        if self.dead_letter_topic.is_empty() {
            return Err(
                "inbox dead_letter_topic is empty: name the topic failed records go to".into(),
            );
        }
        if !self.retry_tiers.is_empty() && !self.retry_topic_format.contains("{n}") {
            return Err(format!(
                "inbox retry_topic_format {:?} has no {{n}}: every tier needs its own topic \
                 (default {{topic}}.retry.{{n}})",
                self.retry_topic_format
            ));
        }
        if self.max_attempts == 0 {
            return Err("inbox max_attempts is 0: it must be at least 1".into());
        }
        for (what, name) in [
            ("inbox_table", &self.inbox_table),
            ("version_table", &self.version_table),
            ("parked_table", &self.parked_table),
        ] {
            let plain = |s: &str| {
                !s.is_empty()
                    && s.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
            };
            let ok = match name.split_once('.') {
                Some((db, t)) => plain(db) && plain(t),
                None => plain(name),
            };
            if !ok {
                return Err(format!(
                    "inbox {what} {name:?} is not a plain table name (letters, digits, _, $, \
                     optionally db.table)"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let mut c = InboxConfig::new("c", "dlq");
        c.backoff_initial = Duration::from_millis(100);
        c.backoff_max = Duration::from_millis(750);
        c.max_attempts = 7;
        let waits: Vec<u128> = c.backoff().map(|d| d.as_millis()).collect();
        assert_eq!(waits, vec![100, 200, 400, 750, 750, 750]);
        c.max_attempts = 1;
        assert_eq!(c.backoff().count(), 0);
    }

    #[test]
    fn names_are_checked() {
        let mut c = InboxConfig::new("c", "dlq");
        assert!(c.validate().is_ok());
        c.inbox_table = "shop.inbox".into();
        assert!(c.validate().is_ok());
        c.inbox_table = "inbox; DROP TABLE x".into();
        assert!(c.validate().unwrap_err().contains("inbox_table"));
        let mut c = InboxConfig::new("c", "");
        assert!(c.validate().unwrap_err().contains("dead_letter_topic"));
        c = InboxConfig::new("c", "d");
        c.max_attempts = 0;
        assert!(c.validate().unwrap_err().contains("max_attempts"));
        c = InboxConfig::new("c", "d");
        c.retry_tiers = vec![Duration::from_secs(60)];
        assert!(c.validate().is_ok());
        c.retry_topic_format = "{topic}.retry".into();
        assert!(c.validate().unwrap_err().contains("retry_topic_format"));
    }

    #[test]
    fn tier_topics_follow_the_format() {
        let mut c = InboxConfig::new("c", "d");
        assert!(c.retry_topics("orders").is_empty());
        c.retry_tiers = vec![Duration::from_secs(60), Duration::from_secs(300)];
        assert_eq!(
            c.retry_topics("orders"),
            vec!["orders.retry.1", "orders.retry.2"]
        );
        c.retry_topic_format = "retry-{n}-{topic}".into();
        assert_eq!(c.retry_topic("orders", 2), "retry-2-orders");
    }
}
