//! `process(record, handler)`: one record through the inbox (`inbox/CONTRACT.md`, steps 1-3).

use std::future::Future;
use std::sync::Arc;

use opentelemetry::context::FutureExt;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{Tracer, TracerProvider};

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Pool, Transaction, TxOpts};

use crate::config::{GapPolicy, InboxConfig};
use crate::dead_letter::DeadLetters;
use crate::error::{HandlerError, InboxError};
use crate::otel::{self, Tracing};
use crate::record::InboxRecord;

/// MySQL/MariaDB `ER_DUP_ENTRY`: the inbox row exists, the event was processed before.
const ER_DUP_ENTRY: u16 = 1062;

/// The business change for one record, made with the inbox's transaction.
pub trait Handler: Send + Sync {
    /// Applies `record` with `tx` (never commit or roll it back: the inbox does). An error rolls
    /// back everything done in `tx`, the inbox row included, and the record is tried again
    /// after the backoff; its text is the dead letter's reason when the attempts run out.
    fn handle(
        &self,
        tx: &mut Transaction<'_>,
        record: &InboxRecord,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send;
}

/// Observation points around the database commit (metrics, tracing, fault injection).
pub trait Hooks: Send + Sync {
    /// After the handler succeeded, before the database commit.
    fn before_commit(&self, _record: &InboxRecord) {}
    /// After the record was settled (its database transaction ended, or it was dead-lettered),
    /// before its offset can be committed to Kafka.
    fn after_commit(&self, _record: &InboxRecord, _settled: &Settled) {}
}

/// No hooks.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHooks;
impl Hooks for NoHooks {}

/// How a record was settled. Every outcome lets its offset be committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The handler ran and its transaction (with the inbox row) committed.
    Processed,
    /// The inbox row existed: processed before; the handler did not run.
    Duplicate,
    /// Its version was not newer than the stored one; recorded, the handler did not run.
    Stale,
    /// A version gap with [`GapPolicy::Park`]: dead-lettered at once with the reason.
    Parked,
    /// Failed `max_attempts` times (or could never be processed): dead-lettered.
    DeadLettered,
}

impl Outcome {
    /// The contract's name: `processed`, `duplicate`, `stale`, `parked`, `dead_lettered`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Processed => "processed",
            Outcome::Duplicate => "duplicate",
            Outcome::Stale => "stale",
            Outcome::Parked => "parked",
            Outcome::DeadLettered => "dead_lettered",
        }
    }
}

/// The result of [`Inbox::process`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    /// What happened.
    pub outcome: Outcome,
    /// Database transactions attempted (0 when the record was dead-lettered before any).
    pub attempts: u32,
    /// Why it was dead-lettered or parked (the dead letter's `dlq_reason`).
    pub reason: Option<String>,
}

/// How one attempt ended (errors are `Err(text)`).
enum Attempt {
    Committed,
    Duplicate,
    Stale,
    Gap { expected: i64, got: i64 },
}

/// An inbox: the consumer's database, its settings, the dead-letter producer and hooks.
pub struct Inbox<H: Hooks = NoHooks> {
    pool: Pool,
    /// The connection records are settled on, between records.
    conn: tokio::sync::Mutex<Option<Conn>>,
    config: InboxConfig,
    dead_letters: DeadLetters,
    hooks: H,
    tracing: Tracing,
    insert_sql: String,
    select_version_sql: String,
    upsert_version_sql: String,
}

impl Inbox<NoHooks> {
    /// An inbox on `pool` (the consumer's own database, where its business tables are),
    /// dead-lettering through a producer to `bootstrap_servers` (`host:port,…`).
    ///
    /// # Errors
    /// [`InboxError::Config`] for a setting [`InboxConfig`] refuses; [`InboxError::Kafka`]
    /// when the producer cannot be created.
    pub fn new(
        pool: Pool,
        config: InboxConfig,
        bootstrap_servers: &str,
    ) -> Result<Self, InboxError> {
        config.validate().map_err(InboxError::Config)?;
        let dead_letters = DeadLetters::new(bootstrap_servers, &config.dead_letter_topic)?;
        let t = &config.inbox_table;
        let v = &config.version_table;
        Ok(Inbox {
            insert_sql: format!(
                "INSERT INTO {t} (consumer, event_key, topic, kafka_partition, kafka_offset) \
                 VALUES (?, ?, ?, ?, ?)"
            ),
            select_version_sql: format!(
                "SELECT version FROM {v} WHERE consumer = ? AND aggregate_type = ? AND \
                 aggregate_id = ? FOR UPDATE"
            ),
            upsert_version_sql: format!(
                "INSERT INTO {v} (consumer, aggregate_type, aggregate_id, version) VALUES \
                 (?, ?, ?, ?) ON DUPLICATE KEY UPDATE version = VALUES(version)"
            ),
            pool,
            conn: tokio::sync::Mutex::new(None),
            config,
            dead_letters,
            hooks: NoHooks,
            tracing: Tracing::default(),
        })
    }
}

impl<H: Hooks> Inbox<H> {
    /// The same inbox with `hooks`.
    pub fn with_hooks<H2: Hooks>(self, hooks: H2) -> Inbox<H2> {
        Inbox {
            pool: self.pool,
            conn: self.conn,
            config: self.config,
            dead_letters: self.dead_letters,
            hooks,
            tracing: self.tracing,
            insert_sql: self.insert_sql,
            select_version_sql: self.select_version_sql,
            upsert_version_sql: self.upsert_version_sql,
        }
    }

    /// The same inbox making its consumer spans (`inbox/CONTRACT.md`, "Trace context") with a
    /// tracer of `provider` (e.g. the application's `opentelemetry_sdk::trace::SdkTracerProvider`)
    /// instead of the global provider (`opentelemetry::global::set_tracer_provider`; without one
    /// the spans are no-ops). The provider must be of the same `opentelemetry` version (0.33).
    #[must_use]
    pub fn with_tracer_provider<P>(mut self, provider: &P) -> Self
    where
        P: TracerProvider,
        P::Tracer: Send + Sync + 'static,
        <P::Tracer as Tracer>::Span: Send + Sync + 'static,
    {
        self.tracing.set_tracer_provider(provider);
        self
    }

    /// The same inbox reading the producer's trace context from the record's headers with
    /// `propagator` instead of the W3C `traceparent`/`tracestate` headers (the default, what the
    /// relay writes; see [`otel::parse_traceparent`]).
    #[must_use]
    pub fn with_propagator(
        mut self,
        propagator: impl TextMapPropagator + Send + Sync + 'static,
    ) -> Self {
        self.tracing.set_propagator(Arc::new(propagator));
        self
    }

    /// Sets the consumer group named by the spans' `messaging.consumer.group.name` (default: the
    /// consumer name; [`crate::InboxConsumer`] sets its `group.id`).
    pub(crate) fn set_span_group(&mut self, group: &str) {
        self.tracing.group = Some(group.to_owned());
    }

    /// Its settings.
    pub fn config(&self) -> &InboxConfig {
        &self.config
    }

    /// Settles one record (`inbox/CONTRACT.md`): the inbox row and `handler`'s change in one
    /// database transaction; a duplicate, stale or parked record without the handler; failures
    /// retried with the backoff, then dead-lettered. Call it for the records of a partition one
    /// at a time, in offset order, and commit the record's offset only after it returned `Ok`.
    ///
    /// # Errors
    /// Only [`InboxError::Kafka`], when a dead letter could not be produced (the record is then
    /// not settled: stop and let it be redelivered).
    ///
    /// The record is processed inside its consumer span `"<topic> process"`, a child of the
    /// trace context in its `traceparent`/`tracestate` headers (a new trace without them); the
    /// handler and the hooks run with that span's context current
    /// (`opentelemetry::Context::current()`), so their spans join the producer's trace. Its
    /// status is an error for a parked or dead-lettered record and when this returns `Err`.
    pub async fn process<F: Handler>(
        &self,
        record: &InboxRecord,
        handler: &F,
    ) -> Result<Settled, InboxError> {
        let cx = self
            .tracing
            .start(record, &self.config.consumer, &self.config.event_key_header);
        let result = async {
            let settled = self.settle(record, handler).await?;
            otel::settled(&opentelemetry::Context::current(), &settled);
            self.hooks.after_commit(record, &settled);
            Ok(settled)
        }
        .with_context(cx.clone())
        .await;
        if let Err(e) = &result {
            otel::unsettled(&cx, e);
        }
        opentelemetry::trace::TraceContextExt::span(&cx).end();
        result
    }

    async fn settle<F: Handler>(
        &self,
        record: &InboxRecord,
        handler: &F,
    ) -> Result<Settled, InboxError> {
        let cfg = &self.config;
        let event_key = match record.header_str(&cfg.event_key_header) {
            Some(k) if !k.is_empty() => k,
            _ => {
                let reason = format!("missing {} header", cfg.event_key_header);
                return self
                    .dead_letter(record, reason, 0, Outcome::DeadLettered)
                    .await;
            }
        };
        let version = match cfg.version_header.as_deref() {
            None => None,
            Some(h) => match record.header_str(h) {
                None => None,
                Some(text) => match text.trim().parse::<i64>() {
                    Ok(v) => Some(v),
                    Err(_) => {
                        let reason = format!("invalid version header: {text}");
                        return self
                            .dead_letter(record, reason, 0, Outcome::DeadLettered)
                            .await;
                    }
                },
            },
        };
        let mut delays = cfg.backoff();
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let error = match self.attempt(record, event_key, version, handler).await {
                Ok(Attempt::Committed) => return Ok(settled(Outcome::Processed, attempt)),
                Ok(Attempt::Duplicate) => return Ok(settled(Outcome::Duplicate, attempt)),
                Ok(Attempt::Stale) => return Ok(settled(Outcome::Stale, attempt)),
                Ok(Attempt::Gap { expected, got }) => {
                    let reason = format!("version gap: expected {expected}, got {got}");
                    if cfg.gap_policy == GapPolicy::Park {
                        return self
                            .dead_letter(record, reason, attempt, Outcome::Parked)
                            .await;
                    }
                    reason
                }
                Err(e) => e,
            };
            otel::attempt_failed(&error, attempt);
            match delays.next() {
                Some(wait) => {
                    tracing::warn!(
                        consumer = %cfg.consumer, event_key, topic = %record.topic,
                        partition = record.partition, offset = record.offset, attempt,
                        retry_in_ms = wait.as_millis() as u64, error = %error,
                        "inbox: attempt failed; retrying"
                    );
                    tokio::time::sleep(wait).await;
                }
                None => {
                    return self
                        .dead_letter(record, error, attempt, Outcome::DeadLettered)
                        .await
                }
            }
        }
    }

    /// One database transaction: inbox row, version check, handler, commit. Rolled back on
    /// every path that does not commit.
    async fn attempt<F: Handler>(
        &self,
        record: &InboxRecord,
        event_key: &str,
        version: Option<i64>,
        handler: &F,
    ) -> Result<Attempt, String> {
        // One connection kept across records: the pool's reset on return (COM_RESET_CONNECTION)
        // would drop the prepared statements every time (measured: a third of the rate).
        // A connection that saw an error is not kept.
        let mut slot = self.conn.lock().await;
        let mut conn = match slot.take() {
            Some(c) => c,
            None => self
                .pool
                .get_conn()
                .await
                .map_err(|e| format!("database: {e}"))?,
        };
        let result = self
            .attempt_on(&mut conn, record, event_key, version, handler)
            .await;
        if result.is_ok() {
            *slot = Some(conn);
        }
        result
    }

    async fn attempt_on<F: Handler>(
        &self,
        conn: &mut Conn,
        record: &InboxRecord,
        event_key: &str,
        version: Option<i64>,
        handler: &F,
    ) -> Result<Attempt, String> {
        let mut tx = conn
            .start_transaction(TxOpts::default())
            .await
            .map_err(|e| format!("database: {e}"))?;
        let result = self
            .in_transaction(&mut tx, record, event_key, version, handler)
            .await;
        match result {
            Ok(Attempt::Committed) => {
                self.hooks.before_commit(record);
                tx.commit()
                    .await
                    .map_err(|e| format!("database commit: {e}"))?;
                Ok(Attempt::Committed)
            }
            Ok(Attempt::Stale) => {
                // The inbox row stays: a redelivery of this stale event is a duplicate.
                tx.commit()
                    .await
                    .map_err(|e| format!("database commit: {e}"))?;
                Ok(Attempt::Stale)
            }
            Ok(other) => {
                tx.rollback()
                    .await
                    .map_err(|e| format!("database rollback: {e}"))?;
                Ok(other)
            }
            Err(e) => {
                // Rolled back here, or by the server when the connection is dropped (the
                // caller does not keep a connection that saw an error).
                let _ = tx.rollback().await;
                Err(e)
            }
        }
    }

    async fn in_transaction<F: Handler>(
        &self,
        tx: &mut Transaction<'_>,
        record: &InboxRecord,
        event_key: &str,
        version: Option<i64>,
        handler: &F,
    ) -> Result<Attempt, String> {
        let consumer = self.config.consumer.as_str();
        let inserted = tx
            .exec_drop(
                &self.insert_sql,
                (
                    consumer,
                    event_key,
                    record.topic.as_str(),
                    record.partition,
                    record.offset,
                ),
            )
            .await;
        match inserted {
            Err(mysql_async::Error::Server(e)) if e.code == ER_DUP_ENTRY => {
                return Ok(Attempt::Duplicate)
            }
            Err(e) => return Err(format!("database: inbox insert: {e}")),
            Ok(()) => {}
        }
        if let Some(v) = version {
            let aggregate_type = record.header_str("aggregate_type").unwrap_or_default();
            let aggregate_id = record.key_str().unwrap_or_default();
            let stored: Option<i64> = tx
                .exec_first(
                    &self.select_version_sql,
                    (consumer, aggregate_type, aggregate_id),
                )
                .await
                .map_err(|e| format!("database: version check: {e}"))?;
            match stored {
                Some(s) if v <= s => return Ok(Attempt::Stale),
                Some(s) if v > s + 1 => {
                    return Ok(Attempt::Gap {
                        expected: s + 1,
                        got: v,
                    })
                }
                _ => {}
            }
            tx.exec_drop(
                &self.upsert_version_sql,
                (consumer, aggregate_type, aggregate_id, v),
            )
            .await
            .map_err(|e| format!("database: version update: {e}"))?;
        }
        handler
            .handle(tx, record)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Attempt::Committed)
    }

    async fn dead_letter(
        &self,
        record: &InboxRecord,
        reason: String,
        attempts: u32,
        outcome: Outcome,
    ) -> Result<Settled, InboxError> {
        tracing::warn!(
            consumer = %self.config.consumer, topic = %record.topic, partition = record.partition,
            offset = record.offset, attempts, reason = %reason, outcome = outcome.as_str(),
            "inbox: record dead-lettered"
        );
        self.dead_letters
            .send(record, &self.config.consumer, &reason, attempts)
            .await?;
        Ok(Settled {
            outcome,
            attempts,
            reason: Some(reason),
        })
    }
}

fn settled(outcome: Outcome, attempts: u32) -> Settled {
    Settled {
        outcome,
        attempts,
        reason: None,
    }
}
