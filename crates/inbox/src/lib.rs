//! The consumer half of the outbox pattern: an **inbox**.
//!
//! The relay delivers every committed outbox row at least once. A consumer built on this crate
//! records "consumer C processed `event_key` K" in the same database transaction as its business
//! change, before the change; a second delivery of K finds the record and is acknowledged
//! without running the handler. The contract (the same in the Rust, Java, Go and Python helpers)
//! is `inbox/CONTRACT.md`; the tables are `migrations/0004_inbox.sql` (keys compared byte for
//! byte; `0005_inbox_keys.sql` upgrades older tables).
//! A missing dead-letter topic is created when [`InboxConsumer::run`] starts, or refused with
//! [`InboxError::DeadLetterTopic`] naming it and the fix ([`ensure_topic`] for your own loop).
//!
//! ```no_run
//! use outbox_inbox::{Handler, HandlerError, Inbox, InboxConfig, InboxConsumer, InboxRecord};
//! use mysql_async::prelude::Queryable;
//!
//! struct GrantCoupon;
//! impl Handler for GrantCoupon {
//!     async fn handle(
//!         &self,
//!         tx: &mut mysql_async::Transaction<'_>,
//!         record: &InboxRecord,
//!     ) -> Result<(), HandlerError> {
//!         let order = record.key_str().unwrap_or_default().to_owned();
//!         tx.exec_drop("INSERT INTO coupons (order_id) VALUES (?)", (order,)).await?;
//!         Ok(())
//!     }
//! }
//!
//! # async fn run() -> Result<(), outbox_inbox::InboxError> {
//! let pool = mysql_async::Pool::new("mysql://app@127.0.0.1:3306/fulfilment");
//! let config = InboxConfig::new("fulfilment", "fulfilment.dead_letter");
//! let inbox = Inbox::new(pool, config, "127.0.0.1:9092")?;
//! let consumer = InboxConsumer::new("127.0.0.1:9092", &["outbox.event.order"], inbox, GrantCoupon)?;
//! consumer.run(async { tokio::signal::ctrl_c().await.ok(); }).await
//! # }
//! ```
//!
//! # Attempts and outages
//!
//! Only the handler's errors and data errors (a version gap under [`GapPolicy::Retry`]) count
//! toward [`InboxConfig::max_attempts`]. An infrastructure error ([`is_infrastructure_error`]:
//! the database unreachable, a lost connection, a read-only server, a lock wait timeout, a
//! deadlock, no connection to be had; also when the handler passes the `mysql_async::Error` on
//! with `?`) rolls the attempt back and redoes it after the backoff without counting, for at most
//! [`InboxConfig::outage_budget`] (5 min). Then [`Inbox::process`] returns
//! [`InboxError::Outage`], the record unsettled, and [`InboxConsumer::run`] returns it after
//! committing only the records settled before: restart the consumer once the database is back and
//! it resumes with that record (`inbox/CONTRACT.md`, "Attempts and outages").
//!
//! # Retry tiers
//!
//! Retries block the partition by default. With [`InboxConfig::retry_tiers`] (delays such as
//! `[1 min, 5 min, 1 h]`) a record whose attempts are used up is instead copied to the next
//! tier's topic ([`InboxConfig::retry_topic_format`], `{topic}.retry.{n}`): key, value and
//! headers plus `retry_count`, `retry_at`, `original_topic`/`_partition`/`_offset`,
//! `retry_error` and `retry_history`; the record is settled ([`Outcome::Retried`]) and the
//! partition moves on. [`InboxConsumer::run`] creates and consumes the tier topics; a copy whose
//! `retry_at` has not come pauses its partition until then. A copy is processed like any record
//! (same `event_key`: a copy of an applied record is a duplicate); after the last tier it goes
//! to the dead-letter topic with its history, `dlq_topic`/`dlq_partition`/`dlq_offset` naming
//! the original record. Per-key order is given up for the records of a topic with tiers
//! (`inbox/CONTRACT.md`, "Retry tiers").
//!
//! # Per-topic settings
//!
//! `max_attempts`, `backoff_initial`, `backoff_max`, `retry_tiers`, `gap_policy`,
//! `gap_deadline` and `inbox_retention` of [`InboxConfig`] are consumer-wide defaults that a
//! topic may override with [`InboxConfig::topic`] and a [`TopicSettings`] (`None` fields
//! inherit; `retry_tiers: Some(vec![])` means no tiers for that topic). The settings of a
//! record are those of its `original_topic` header when present (a retry copy), else of its own
//! topic; every read goes through [`InboxConfig::for_topic`]. [`InboxConsumer::run`] creates and
//! reads each topic's own tier topics, and sweeps the parked table when the default or any
//! topic parks version gaps. [`Inbox::new`] refuses ([`InboxError::Config`], naming the topic
//! and the field) `max_attempts` 0, `backoff_initial` above `backoff_max` and a zero
//! `inbox_retention`. `inbox_retention` is read by `outbox-relay prune --inbox`
//! (`--topic-retention TOPIC=DURATION`); the inbox deletes nothing itself.
//!
//! ```
//! # use std::time::Duration;
//! use outbox_inbox::{InboxConfig, TopicSettings};
//! let config = InboxConfig::new("fulfilment", "fulfilment.dead_letter").topic(
//!     "outbox.event.order",
//!     TopicSettings {
//!         max_attempts: Some(10),
//!         retry_tiers: Some(vec![Duration::from_secs(60), Duration::from_secs(3600)]),
//!         ..TopicSettings::default()
//!     },
//! );
//! assert_eq!(config.for_topic("outbox.event.order").max_attempts, 10);
//! ```
//!
//! # Metrics
//!
//! With [`InboxConfig::metrics_registry`] set (a `prometheus::Registry`; `None`, the default:
//! no metrics, and the default registry is never used implicitly) the inbox keeps
//! (`inbox/CONTRACT.md`, "Metrics"):
//!
//! - `outbox_inbox_records_total{consumer,topic,outcome}`: records settled, `topic` the
//!   original topic, outcomes of the sweep included (`resumed`, `stale`, `dead_lettered`,
//!   `compensated`);
//! - `outbox_inbox_parked_records{consumer}` and `outbox_inbox_parked_oldest_seconds{consumer}`:
//!   set after each parked sweep ([`Inbox::sweep_parked`]);
//! - `outbox_inbox_consumer_lag{consumer,topic,partition}`: set by [`InboxConsumer`] for each
//!   record received: the partition's high watermark minus the position after the record.
//!   The high watermark is the one librdkafka reports in its statistics (the runner sets
//!   `statistics.interval.ms` to 1000 when metrics are on and the client settings have none),
//!   so no broker round trip per record; it may be up to that interval old (a lag under the
//!   truth, never below 0). A revoked partition's series is removed (its next owner reports
//!   it).
//!
//! Inboxes of one process on the same registry share the series (told apart by `consumer`);
//! a series of the same name that is not an inbox's makes [`Inbox::new`] fail.
//!
//! # Batch mode
//!
//! For throughput (thousands of records a second on one partition), set
//! [`InboxConfig::batch_max_records`] above 1 (e.g. 100; at most 10,000; default 1: off) and
//! optionally [`InboxConfig::batch_max_wait`] (20 ms): [`InboxConsumer`] then takes up to
//! `batch_max_records` records per poll, waiting at most `batch_max_wait` for more once one
//! arrived, and settles each run of them in **one database transaction** with
//! [`Inbox::process_batch`] (retry copies of retry tier topics still go one at a time through
//! [`Inbox::process`]); the offsets are committed after each poll batch (`inbox/CONTRACT.md`,
//! "Batch mode").
//!
//! What stays guaranteed: every record gets the outcome, rows (inbox, version, parked), hooks,
//! metrics and span the single path would give it; a key already in the inbox, or a second
//! record with the same key in the batch, is a duplicate; versions are checked in batch order
//! (v5 then v6 of one aggregate in a batch are both in order; a gap is parked, or goes through
//! the single path under `dead_letter`/`retry`). A handler error at record `i` rolls the batch
//! back: records before `i` are redone as a batch, `i` alone through the single path (its own
//! attempts, tiers, dead letter; the failed batch run was its attempt 1, so its handler fails at
//! most `max_attempts` times), the records after it as a new batch. An infrastructure error
//! redoes the whole batch after the backoff, within the outage budget; when that runs out
//! nothing of the batch is settled ([`InboxError::Outage`]).
//!
//! The handler runs **inside the batch's transaction**, record after record: a slow handler
//! delays (and holds the locks of) the whole batch, and a record failing often costs the
//! batch's redo. Keep handlers short; leave batch mode off for slow or failure-prone ones.
//!
//! Statements: on MariaDB (10.5+) one `INSERT IGNORE INTO outbox_inbox (…) VALUES (…), …
//! RETURNING event_key` (the keys returned are new). On MySQL (no `RETURNING`) `SELECT
//! event_key FROM outbox_inbox WHERE consumer = ? AND event_key IN (…) FOR UPDATE`, then one
//! multi-row `INSERT` of the others; should another transaction insert one of them between the
//! two (possible under READ COMMITTED), the `INSERT` fails with 1062 and the batch is redone at
//! once (at most 5 times in a row), finding it a duplicate. The server is asked once
//! (`SELECT VERSION()`). With versions: one `SELECT … FOR UPDATE` of the batch's aggregates and
//! one multi-row upsert.
//!
//! ```
//! # use std::time::Duration;
//! let mut config = outbox_inbox::InboxConfig::new("fulfilment", "fulfilment.dead_letter");
//! config.batch_max_records = 100;
//! config.batch_max_wait = Duration::from_millis(20);
//! ```
//!
//! # Trace context
//!
//! [`Inbox::process`] continues the producer's trace (`inbox/CONTRACT.md`, "Trace context"): it
//! reads the W3C `traceparent`/`tracestate` headers ([`otel::parse_traceparent`]) and runs the
//! record in a CONSUMER span `"<topic> process"` (messaging attributes, `inbox.event_key`,
//! `inbox.outcome`; status error when dead-lettered or parked) whose parent is the producer's
//! span. The handler's future runs with that span's context current, so spans it starts with
//! `opentelemetry::Context::current()` as parent (the default of `Tracer::start`) join the trace.
//!
//! Why the `opentelemetry` API (0.33) and not `tracing` + `tracing-opentelemetry`: the crate
//! uses `tracing` only for log events; the API alone gives the remote parent, span kind and
//! status the contract asks for, works with the application's SDK whatever its `tracing` setup,
//! and costs nothing without one. The SDK is the application's: install a provider globally, or
//! pass it with [`Inbox::with_tracer_provider`]. For example over OTLP (crates
//! `opentelemetry_sdk` and `opentelemetry-otlp`, same 0.33 release; endpoint from
//! `OTEL_EXPORTER_OTLP_ENDPOINT`):
//!
//! ```ignore
//! let exporter = opentelemetry_otlp::SpanExporter::builder().with_tonic().build()?;
//! let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
//!     .with_batch_exporter(exporter)
//!     .build();
//! opentelemetry::global::set_tracer_provider(provider.clone()); // the default
//! let inbox = Inbox::new(pool, config, "127.0.0.1:9092")?.with_tracer_provider(&provider); // or explicitly
//! ```
//!
//! A provider of another `opentelemetry` release is a different type (and a different global):
//! keep the application's OpenTelemetry crates on the release this crate uses.

mod config;
mod consumer;
mod dead_letter;
mod error;
mod metrics;
pub mod otel;
mod outcome;
mod parked;
mod process;
mod record;
mod retry;

pub use config::{GapPolicy, InboxConfig, TopicSettings, TopicView};
pub use consumer::InboxConsumer;
pub use dead_letter::ensure_topic;
pub use error::{is_infrastructure_error, HandlerError, InboxError};
pub use outcome::{Outcome, Settled};
pub use process::{Handler, Hooks, Inbox, NoHooks, ParkedSweep};
pub use record::InboxRecord;
