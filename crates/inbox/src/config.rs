//! Settings of an inbox (`inbox/CONTRACT.md`, "Settings").

use std::collections::BTreeMap;
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

/// The settings a topic may override (`inbox/CONTRACT.md`, "Per-topic settings"): `None`
/// inherits the consumer-wide value of the same name in [`InboxConfig`]. Given with
/// [`InboxConfig::topic`]; read through [`InboxConfig::for_topic`]. The topic whose settings
/// apply to a record is its `original_topic` header when present (a retry copy), else its own
/// topic.
///
/// ```
/// use std::time::Duration;
/// use outbox_inbox::{GapPolicy, InboxConfig, TopicSettings};
///
/// let config = InboxConfig::new("fulfilment", "fulfilment.dead_letter")
///     .topic("orders", TopicSettings {
///         max_attempts: Some(10),
///         retry_tiers: Some(vec![Duration::from_secs(60), Duration::from_secs(3600)]),
///         ..TopicSettings::default()
///     })
///     .topic("notifications", TopicSettings {
///         max_attempts: Some(1),
///         gap_policy: Some(GapPolicy::DeadLetter),
///         inbox_retention: Some(Duration::from_secs(86_400)),
///         ..TopicSettings::default()
///     });
/// assert_eq!(config.for_topic("orders").max_attempts, 10);
/// assert_eq!(config.for_topic("payments").max_attempts, 5); // the default
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicSettings {
    /// Overrides [`InboxConfig::max_attempts`] (at least 1).
    pub max_attempts: Option<u32>,
    /// Overrides [`InboxConfig::backoff_initial`] (at most the topic's `backoff_max`).
    pub backoff_initial: Option<Duration>,
    /// Overrides [`InboxConfig::backoff_max`].
    pub backoff_max: Option<Duration>,
    /// Overrides [`InboxConfig::retry_tiers`]; `Some(vec![])`: no tiers for this topic.
    pub retry_tiers: Option<Vec<Duration>>,
    /// Overrides [`InboxConfig::gap_policy`].
    pub gap_policy: Option<GapPolicy>,
    /// Overrides [`InboxConfig::gap_deadline`].
    pub gap_deadline: Option<Duration>,
    /// Overrides [`InboxConfig::inbox_retention`] (more than zero).
    pub inbox_retention: Option<Duration>,
}

/// The settings in effect for one topic: its [`TopicSettings`] over the consumer-wide values
/// ([`InboxConfig::for_topic`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicView<'a> {
    /// Attempts before the record goes to the next retry tier or the dead-letter topic.
    pub max_attempts: u32,
    /// Wait before the second attempt; doubled each attempt.
    pub backoff_initial: Duration,
    /// Longest wait between attempts.
    pub backoff_max: Duration,
    /// Retry tier delays (empty: none).
    pub retry_tiers: &'a [Duration],
    /// What to do on a version gap.
    pub gap_policy: GapPolicy,
    /// How long a parked record may wait for the version before it.
    pub gap_deadline: Duration,
    /// How long inbox rows of the topic are kept (read by `outbox-relay prune --inbox`).
    pub inbox_retention: Duration,
}

impl TopicView<'_> {
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
    /// [`TopicView::backoff`] without a count (the outage budget bounds them).
    pub fn outage_backoff(&self) -> backon::ExponentialBackoff {
        use backon::BackoffBuilder;
        backon::ExponentialBuilder::default()
            .with_factor(2.0)
            .with_min_delay(self.backoff_initial)
            .with_max_delay(self.backoff_max)
            .without_max_times()
            .build()
    }
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
    /// What to do on a version gap (a topic may override it: [`InboxConfig::topic`]).
    pub gap_policy: GapPolicy,
    /// Attempts before a failing record is dead-lettered (5); at least 1. A topic may override
    /// it ([`InboxConfig::topic`]), like `backoff_initial`, `backoff_max`, `retry_tiers`,
    /// `gap_policy`, `gap_deadline` and `inbox_retention`.
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
    /// dead-lettered by the sweep (a topic may override it).
    pub gap_deadline: Duration,
    /// How often [`crate::InboxConsumer`] sweeps the parked table (10 s): resumes rows whose
    /// predecessor was applied (after a crash between the two), drops stale ones,
    /// dead-letters expired ones. Also once before the first poll.
    pub park_sweep_interval: Duration,
    /// Retry tiers (`inbox/CONTRACT.md`, "Retry tiers"): delays such as `[1 min, 5 min, 1 h]`.
    /// Empty (default): blocking retries only, then the dead-letter topic. Otherwise a record
    /// whose attempts are used up is copied to the next tier's topic (outcome
    /// [`crate::Outcome::Retried`]) and the partition moves on; after the last tier, the
    /// dead-letter topic. A topic may have its own ([`InboxConfig::topic`]).
    pub retry_tiers: Vec<Duration>,
    /// Name of tier `n` (1-based) of a topic: `{topic}` and `{n}` replaced
    /// (`{topic}.retry.{n}`).
    pub retry_topic_format: String,
    /// How long inbox rows are kept (7 days): read by `outbox-relay prune --inbox`
    /// (`--older-than`, `--topic-retention`); the inbox itself deletes nothing. More than zero.
    pub inbox_retention: Duration,
    /// Per-topic overrides of `max_attempts`, `backoff_initial`, `backoff_max`, `retry_tiers`,
    /// `gap_policy`, `gap_deadline` and `inbox_retention` (empty: the values above for every
    /// topic). Set with [`InboxConfig::topic`]; read with [`InboxConfig::for_topic`].
    pub topics: BTreeMap<String, TopicSettings>,
    /// Where the inbox's Prometheus metrics go (`inbox/CONTRACT.md`, "Metrics"):
    /// `outbox_inbox_records_total{consumer,topic,outcome}`,
    /// `outbox_inbox_parked_records{consumer}`, `outbox_inbox_parked_oldest_seconds{consumer}`
    /// and, with [`crate::InboxConsumer`], `outbox_inbox_consumer_lag{consumer,topic,partition}`.
    /// `None` (default): no metrics (the default registry is never used implicitly: pass
    /// `prometheus::default_registry().clone()` for it). Inboxes sharing a registry share
    /// the series (told apart by `consumer`).
    pub metrics_registry: Option<prometheus::Registry>,
    /// Batch mode (`inbox/CONTRACT.md`, "Batch mode"): the most records [`crate::InboxConsumer`]
    /// settles in one database transaction through [`crate::Inbox::process_batch`]. 1 (the
    /// default): batch mode off, every record through [`crate::Inbox::process`]. Consumer-wide;
    /// 1 to 10,000 ([`crate::Inbox::new`] refuses other values).
    pub batch_max_records: usize,
    /// Batch mode: how long the runner waits for more records once a poll returned at least
    /// one (20 ms), at most `batch_max_records` in all. Ignored when `batch_max_records` is 1.
    pub batch_max_wait: Duration,
}

/// The largest [`InboxConfig::batch_max_records`].
pub(crate) const BATCH_MAX_RECORDS_LIMIT: usize = 10_000;

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
            inbox_retention: Duration::from_secs(7 * 24 * 3600),
            topics: BTreeMap::new(),
            metrics_registry: None,
            batch_max_records: 1,
            batch_max_wait: Duration::from_millis(20),
        }
    }

    /// The same settings with `settings` overriding the consumer-wide values for records of
    /// `topic` (and retry copies whose `original_topic` is `topic`); replaces an earlier call
    /// for the same topic.
    #[must_use]
    pub fn topic(mut self, name: impl Into<String>, settings: TopicSettings) -> Self {
        self.topics.insert(name.into(), settings);
        self
    }

    /// The settings in effect for `topic` (an original topic: for a retry copy, its
    /// `original_topic`): its [`TopicSettings`] where set, else the consumer-wide values. The
    /// one lookup every read of these settings goes through.
    pub fn for_topic(&self, topic: &str) -> TopicView<'_> {
        let wide = self.defaults();
        let Some(t) = self.topics.get(topic) else {
            return wide;
        };
        TopicView {
            max_attempts: t.max_attempts.unwrap_or(wide.max_attempts),
            backoff_initial: t.backoff_initial.unwrap_or(wide.backoff_initial),
            backoff_max: t.backoff_max.unwrap_or(wide.backoff_max),
            retry_tiers: t.retry_tiers.as_deref().unwrap_or(wide.retry_tiers),
            gap_policy: t.gap_policy.unwrap_or(wide.gap_policy),
            gap_deadline: t.gap_deadline.unwrap_or(wide.gap_deadline),
            inbox_retention: t.inbox_retention.unwrap_or(wide.inbox_retention),
        }
    }

    /// The consumer-wide values (those of a topic without [`TopicSettings`]).
    pub fn defaults(&self) -> TopicView<'_> {
        TopicView {
            max_attempts: self.max_attempts,
            backoff_initial: self.backoff_initial,
            backoff_max: self.backoff_max,
            retry_tiers: &self.retry_tiers,
            gap_policy: self.gap_policy,
            gap_deadline: self.gap_deadline,
            inbox_retention: self.inbox_retention,
        }
    }

    /// The retry tiers of records first read from `topic` ([`InboxConfig::for_topic`]).
    pub fn retry_tiers_for(&self, topic: &str) -> &[Duration] {
        self.for_topic(topic).retry_tiers
    }

    /// Whether the default or some topic parks version gaps ([`GapPolicy::Park`]): then
    /// [`crate::InboxConsumer`] sweeps the parked table.
    pub fn parks_anywhere(&self) -> bool {
        self.gap_policy == GapPolicy::Park
            || self
                .topics
                .values()
                .any(|t| t.gap_policy == Some(GapPolicy::Park))
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

    /// The consumer-wide waits between attempts ([`TopicView::backoff`] of the defaults; a
    /// record uses its topic's: [`InboxConfig::for_topic`]).
    pub fn backoff(&self) -> backon::ExponentialBackoff {
        self.defaults().backoff()
    }

    /// The consumer-wide waits after infrastructure errors ([`TopicView::outage_backoff`]).
    pub fn outage_backoff(&self) -> backon::ExponentialBackoff {
        self.defaults().outage_backoff()
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
        let any_tiers = !self.retry_tiers.is_empty()
            || self
                .topics
                .values()
                .any(|t| t.retry_tiers.as_ref().is_some_and(|v| !v.is_empty()));
        if any_tiers && !self.retry_topic_format.contains("{n}") {
            return Err(format!(
                "inbox retry_topic_format {:?} has no {{n}}: every tier needs its own topic \
                 (default {{topic}}.retry.{{n}})",
                self.retry_topic_format
            ));
        }
        if !(1..=BATCH_MAX_RECORDS_LIMIT).contains(&self.batch_max_records) {
            return Err(format!(
                "inbox batch_max_records is {}: it must be between 1 and {BATCH_MAX_RECORDS_LIMIT} \
                 (1: batch mode off)",
                self.batch_max_records
            ));
        }
        if self.max_attempts == 0 {
            return Err("inbox max_attempts is 0: it must be at least 1".into());
        }
        if self.backoff_initial > self.backoff_max {
            return Err(format!(
                "inbox backoff_initial ({:?}) is more than backoff_max ({:?})",
                self.backoff_initial, self.backoff_max
            ));
        }
        if self.inbox_retention.is_zero() {
            return Err("inbox inbox_retention is 0: it must be more than zero".into());
        }
        for (name, t) in &self.topics {
            if name.is_empty() {
                return Err("inbox topics: a topic name is empty".into());
            }
            let view = self.for_topic(name);
            if t.max_attempts == Some(0) {
                return Err(format!(
                    "inbox topic {name:?}: max_attempts is 0: it must be at least 1"
                ));
            }
            if view.backoff_initial > view.backoff_max {
                return Err(format!(
                    "inbox topic {name:?}: backoff_initial ({:?}) is more than backoff_max ({:?})",
                    view.backoff_initial, view.backoff_max
                ));
            }
            if t.inbox_retention == Some(Duration::ZERO) {
                return Err(format!(
                    "inbox topic {name:?}: inbox_retention is 0: it must be more than zero"
                ));
            }
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
    fn batch_max_records_outside_1_to_10000_is_refused_with_the_value_and_range() {
        for bad in [0usize, 10_001] {
            let mut c = InboxConfig::new("c", "dlq");
            c.batch_max_records = bad;
            let e = c.validate().unwrap_err();
            assert!(e.contains("batch_max_records"), "{e}");
            assert!(e.contains(&format!("is {bad}")), "{e}");
            assert!(e.contains("between 1 and 10000"), "{e}");
        }
        for good in [1usize, 2, 10_000] {
            let mut c = InboxConfig::new("c", "dlq");
            c.batch_max_records = good;
            c.validate().unwrap();
        }
        assert_eq!(InboxConfig::new("c", "dlq").batch_max_records, 1);
        assert_eq!(
            InboxConfig::new("c", "dlq").batch_max_wait,
            Duration::from_millis(20)
        );
    }

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

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_topic_overrides_only_what_it_sets() {
        let mut c = InboxConfig::new("c", "d").topic(
            "orders",
            TopicSettings {
                max_attempts: Some(1),
                retry_tiers: Some(vec![ms(10), ms(20)]),
                gap_policy: Some(GapPolicy::DeadLetter),
                inbox_retention: Some(Duration::from_secs(86_400)),
                ..TopicSettings::default()
            },
        );
        c.retry_tiers = vec![ms(5)];
        let o = c.for_topic("orders");
        assert_eq!(o.max_attempts, 1);
        assert_eq!(o.retry_tiers, &[ms(10), ms(20)]);
        assert_eq!(o.gap_policy, GapPolicy::DeadLetter);
        assert_eq!(o.inbox_retention, Duration::from_secs(86_400));
        // Inherited.
        assert_eq!(o.backoff_initial, ms(100));
        assert_eq!(o.backoff_max, Duration::from_secs(10));
        assert_eq!(o.gap_deadline, Duration::from_secs(3600));
        // Another topic: the consumer-wide values.
        assert_eq!(c.for_topic("payments"), c.defaults());
        assert_eq!(c.for_topic("payments").max_attempts, 5);
        assert_eq!(
            c.for_topic("payments").inbox_retention,
            Duration::from_secs(7 * 86_400)
        );
        assert_eq!(c.retry_tiers_for("payments"), &[ms(5)]);
        assert_eq!(c.retry_topics("orders").len(), 2);
        assert_eq!(c.retry_topics("payments"), vec!["payments.retry.1"]);
        // Some(vec![]): no tiers for that topic even though the default has some.
        let c = c.topic(
            "notifications",
            TopicSettings {
                retry_tiers: Some(vec![]),
                ..TopicSettings::default()
            },
        );
        assert!(c.retry_topics("notifications").is_empty());
        // The topic's backoff schedule.
        let c = c.topic(
            "fast",
            TopicSettings {
                max_attempts: Some(3),
                backoff_initial: Some(ms(1)),
                backoff_max: Some(ms(2)),
                ..TopicSettings::default()
            },
        );
        let waits: Vec<u128> = c
            .for_topic("fast")
            .backoff()
            .map(|d| d.as_millis())
            .collect();
        assert_eq!(waits, vec![1, 2]);
    }

    #[test]
    fn the_sweep_runs_when_any_topic_parks() {
        let mut c = InboxConfig::new("c", "d");
        assert!(c.parks_anywhere());
        c.gap_policy = GapPolicy::DeadLetter;
        assert!(!c.parks_anywhere());
        let c = c.topic(
            "orders",
            TopicSettings {
                gap_policy: Some(GapPolicy::Park),
                ..TopicSettings::default()
            },
        );
        assert!(c.parks_anywhere());
    }

    #[test]
    fn topic_settings_are_validated_naming_the_topic_and_the_field() {
        let with = |t: TopicSettings| InboxConfig::new("c", "d").topic("orders", t);
        let e = with(TopicSettings {
            max_attempts: Some(0),
            ..TopicSettings::default()
        })
        .validate()
        .unwrap_err();
        assert!(
            e.contains("\"orders\"") && e.contains("max_attempts"),
            "{e}"
        );
        let e = with(TopicSettings {
            backoff_initial: Some(Duration::from_secs(20)),
            ..TopicSettings::default()
        })
        .validate()
        .unwrap_err();
        assert!(
            e.contains("\"orders\"") && e.contains("backoff_initial"),
            "{e}"
        );
        let e = with(TopicSettings {
            backoff_max: Some(ms(50)),
            ..TopicSettings::default()
        })
        .validate()
        .unwrap_err();
        assert!(e.contains("\"orders\"") && e.contains("backoff_max"), "{e}");
        let e = with(TopicSettings {
            inbox_retention: Some(Duration::ZERO),
            ..TopicSettings::default()
        })
        .validate()
        .unwrap_err();
        assert!(
            e.contains("\"orders\"") && e.contains("inbox_retention"),
            "{e}"
        );
        assert!(with(TopicSettings {
            backoff_initial: Some(ms(1)),
            backoff_max: Some(ms(1)),
            retry_tiers: Some(vec![]),
            ..TopicSettings::default()
        })
        .validate()
        .is_ok());
        let mut c = InboxConfig::new("c", "d");
        c.backoff_initial = Duration::from_secs(11);
        assert!(c.validate().unwrap_err().contains("backoff_initial"));
        let mut c = InboxConfig::new("c", "d");
        c.inbox_retention = Duration::ZERO;
        assert!(c.validate().unwrap_err().contains("inbox_retention"));
        // A topic with tiers needs {n} in the format even when the default has none.
        let mut c = with(TopicSettings {
            retry_tiers: Some(vec![ms(10)]),
            ..TopicSettings::default()
        });
        c.retry_topic_format = "{topic}.retry".into();
        assert!(c.validate().unwrap_err().contains("retry_topic_format"));
    }
}
