//! `process(record, handler)`: one record through the inbox (`inbox/CONTRACT.md`, steps 1-3).

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use opentelemetry::context::FutureExt;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{Tracer, TracerProvider};

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Pool, Transaction, TxOpts};

use crate::config::{GapPolicy, InboxConfig};
use crate::dead_letter::DeadLetters;
use crate::error::{HandlerError, InboxError};
use crate::metrics::Metrics;
use crate::otel::{self, Tracing};
use crate::outcome::{Outcome, Settled};
use crate::parked::{self, ParkedRow, ParkedSql, VersionKey};
use crate::record::InboxRecord;
use crate::retry;

mod batch;

/// MySQL/MariaDB `ER_DUP_ENTRY`: the inbox row exists, the event was processed before.
const ER_DUP_ENTRY: u16 = 1062;

/// The business change for one record, made with the inbox's transaction.
pub trait Handler: Send + Sync {
    /// Applies `record` with `tx` (never commit or roll it back: the inbox does). An error rolls
    /// back everything done in `tx`, the inbox row included, and the record is tried again
    /// after the backoff; its text is the dead letter's reason when the attempts run out.
    /// An error that is, or has in its `source()` chain, an infrastructure error
    /// ([`crate::is_infrastructure_error`]: e.g. a `mysql_async::Error` of a lost connection or
    /// a deadlock passed on with `?`) is not counted as an attempt: the record is redone, up to
    /// the outage budget. Return an error without it as source to make the failure count.
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
    /// The compensation of a parked record whose gap deadline passed (`inbox/CONTRACT.md`,
    /// "Hooks"): called by the sweep outside any inbox transaction, with the record rebuilt
    /// from its parked row and when it was parked (RFC 3339 UTC). `None` (the default): no
    /// compensation, the record goes to the dead-letter topic. `Some(Ok(()))`: compensated, the
    /// parked row is removed (outcome [`Outcome::Compensated`], no dead letter).
    /// `Some(Err(reason))`: the row stays and the next sweep calls it again.
    fn on_gap_expired(
        &self,
        _record: &InboxRecord,
        _parked_at: &str,
    ) -> Option<Result<(), String>> {
        None
    }
}

/// No hooks.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHooks;
impl Hooks for NoHooks {}

/// Why an attempt failed: the error's text, and whether it was the infrastructure's
/// ([`crate::is_infrastructure_error`]: not counted as an attempt).
struct Failed {
    text: String,
    infrastructure: bool,
}

impl Failed {
    /// A failure of the inbox's own database call `what`.
    fn db(what: &str, error: mysql_async::Error) -> Self {
        Failed {
            infrastructure: crate::error::is_infrastructure_error(&error),
            text: format!("{what}: {error}"),
        }
    }
}

/// How one attempt ended.
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
    parked_sql: ParkedSql,
    /// `None`: no [`InboxConfig::metrics_registry`].
    metrics: Option<Metrics>,
    /// Whether the server is MariaDB (batch mode's statements differ), asked once.
    mariadb: tokio::sync::OnceCell<bool>,
    /// Tests only: called in a batch between finding the duplicates and the multi-row insert.
    batch_hook: Option<batch::BatchHook>,
}

/// What one sweep of the parked table did ([`Inbox::sweep_parked`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParkedSweep {
    /// Parked rows applied (their predecessor had been applied), successors included.
    pub resumed: u32,
    /// Parked rows no newer than the applied version (or applied before), removed.
    pub stale: u32,
    /// Parked rows past their deadline (or failing when applied), dead-lettered and removed.
    pub dead_lettered: u32,
    /// Parked rows past their deadline handed to [`Hooks::on_gap_expired`], which compensated
    /// them; removed.
    pub compensated: u32,
    /// Rows still parked after the sweep.
    pub parked: u64,
    /// Age of the oldest of them.
    pub oldest: Option<std::time::Duration>,
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
        let metrics = config
            .metrics_registry
            .as_ref()
            .map(Metrics::register)
            .transpose()
            .map_err(InboxError::Config)?;
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
            parked_sql: ParkedSql::new(&config.parked_table),
            pool,
            conn: tokio::sync::Mutex::new(None),
            config,
            dead_letters,
            hooks: NoHooks,
            tracing: Tracing::default(),
            metrics,
            mariadb: tokio::sync::OnceCell::new(),
            batch_hook: None,
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
            parked_sql: self.parked_sql,
            metrics: self.metrics,
            mariadb: self.mariadb,
            batch_hook: self.batch_hook,
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

    /// Its metrics (`None` without [`InboxConfig::metrics_registry`]).
    pub(crate) fn metrics(&self) -> Option<&Metrics> {
        self.metrics.as_ref()
    }

    /// A record settled: counted (by its original topic) and told to `after_commit`.
    fn after_settled(&self, record: &InboxRecord, settled: &Settled) {
        if let Some(m) = &self.metrics {
            m.settled(
                &self.config.consumer,
                retry::settings_topic(record),
                settled.outcome,
            );
        }
        self.hooks.after_commit(record, settled);
    }

    /// Settles one record (`inbox/CONTRACT.md`): the inbox row and `handler`'s change in one
    /// database transaction; a duplicate, stale or parked record without the handler; failures
    /// retried with the backoff, then copied to the next retry tier
    /// ([`InboxConfig::retry_tiers`]; a copy is processed the same way, its inbox row naming the
    /// original record) or dead-lettered. Call it for the records of a partition one
    /// at a time, in offset order, and commit the record's offset only after it returned `Ok`.
    ///
    /// Handler errors and data errors (a version gap under [`GapPolicy::Retry`]) count toward
    /// `max_attempts`; infrastructure errors ([`crate::is_infrastructure_error`]) are retried
    /// with the same backoff without counting, for at most [`InboxConfig::outage_budget`].
    ///
    /// # Errors
    /// [`InboxError::Kafka`] when a dead letter could not be produced, [`InboxError::Outage`]
    /// when the database stayed unreachable longer than the outage budget. The record is then
    /// not settled: stop without committing its offset, and let it be redelivered.
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
        self.process_in(record, handler, None, None).await
    }

    /// [`Inbox::process`] in the consumer span `cx` when given (a batch record's), else a new
    /// one; `failed`: the error of the batch run that was this record's attempt 1.
    async fn process_in<F: Handler>(
        &self,
        record: &InboxRecord,
        handler: &F,
        cx: Option<opentelemetry::Context>,
        failed: Option<String>,
    ) -> Result<Settled, InboxError> {
        let settled = self
            .process_one_in(record, handler, None, cx, failed)
            .await?;
        if settled.outcome == Outcome::Processed {
            if let Some(key) = self.version_key(record) {
                self.resume_after(key, handler).await?;
            }
        }
        Ok(settled)
    }

    /// The record's aggregate and version, when versions are checked and it has one.
    fn version_key(&self, record: &InboxRecord) -> Option<VersionKey> {
        let header = self.config.version_header.as_deref()?;
        let version = record.header_str(header)?.trim().parse::<i64>().ok()?;
        Some(VersionKey {
            aggregate_type: record
                .header_str("aggregate_type")
                .unwrap_or_default()
                .to_owned(),
            aggregate_id: record.key_str().unwrap_or_default().to_owned(),
            version,
        })
    }

    /// Applies the parked successors of `applied` (the version just committed), one at a
    /// time, in version order, until one is missing (`inbox/CONTRACT.md`, "Parked versions",
    /// resumption). A parked row that cannot be read is left for the sweep.
    async fn resume_after<F: Handler>(
        &self,
        mut applied: VersionKey,
        handler: &F,
    ) -> Result<(), InboxError> {
        loop {
            let next = match self
                .parked_row(
                    &applied.aggregate_type,
                    &applied.aggregate_id,
                    applied.version + 1,
                )
                .await
            {
                Ok(Some(row)) => row,
                Ok(None) => return Ok(()),
                Err(e) => {
                    tracing::warn!(
                        consumer = %self.config.consumer, error = %e,
                        "inbox: parked successors not read; the sweep will resume them"
                    );
                    return Ok(());
                }
            };
            let settled = self
                .process_one(&next.record, handler, Some(&next.key))
                .await?;
            if settled.outcome != Outcome::Resumed {
                return Ok(());
            }
            applied = next.key;
        }
    }

    async fn parked_row(
        &self,
        aggregate_type: &str,
        aggregate_id: &str,
        version: i64,
    ) -> Result<Option<ParkedRow>, String> {
        let mut conn = self.pool.get_conn().await.map_err(|e| e.to_string())?;
        let row: Option<mysql_async::Row> = conn
            .exec_first(
                &self.parked_sql.select_one,
                (
                    self.config.consumer.as_str(),
                    aggregate_type,
                    aggregate_id,
                    version,
                ),
            )
            .await
            .map_err(|e| e.to_string())?;
        row.map(parked::from_row).transpose()
    }

    /// One sweep of the parked table (`inbox/CONTRACT.md`, "Parked versions", the sweep): of
    /// the 100 rows that expire first, a row whose predecessor has been applied is applied
    /// (with its successors), one no newer than the applied version is removed (stale), one
    /// past its deadline is dead-lettered and removed; then the rows left and the oldest age.
    /// [`crate::InboxConsumer`] calls it before the first poll and every
    /// [`InboxConfig::park_sweep_interval`].
    ///
    /// # Errors
    /// As [`Inbox::process`]; [`InboxError::Database`] when the tables cannot be read (nothing
    /// settled by that statement: sweep again later); [`InboxError::Config`] for a parked row
    /// that does not decode (the message names it).
    pub async fn sweep_parked<F: Handler>(&self, handler: &F) -> Result<ParkedSweep, InboxError> {
        let consumer = self.config.consumer.as_str();
        let db = |e: mysql_async::Error| InboxError::Database {
            what: format!("parked sweep of {}", self.config.parked_table),
            source: e,
        };
        let select_stored = format!(
            "SELECT version FROM {} WHERE consumer = ? AND aggregate_type = ? AND aggregate_id = ?",
            self.config.version_table
        );
        let mut sweep = ParkedSweep::default();
        let rows: Vec<mysql_async::Row> = {
            let mut conn = self.pool.get_conn().await.map_err(db)?;
            conn.exec(&self.parked_sql.select_due, (consumer,))
                .await
                .map_err(db)?
        };
        for row in rows {
            let row = parked::from_row(row).map_err(InboxError::Config)?;
            let stored: Option<i64> = {
                let mut conn = self.pool.get_conn().await.map_err(db)?;
                conn.exec_first(
                    &select_stored,
                    (consumer, &row.key.aggregate_type, &row.key.aggregate_id),
                )
                .await
                .map_err(db)?
            };
            if stored.is_none_or(|s| row.key.version <= s + 1) {
                // Its predecessor was applied (a crash came between), or it is stale: the
                // attempt decides under the version row's lock.
                let settled = self
                    .process_one(&row.record, handler, Some(&row.key))
                    .await?;
                match settled.outcome {
                    Outcome::Resumed => {
                        sweep.resumed += 1;
                        self.resume_after(row.key.clone(), handler).await?;
                    }
                    Outcome::Stale | Outcome::Duplicate => sweep.stale += 1,
                    Outcome::DeadLettered => sweep.dead_lettered += 1,
                    _ => {}
                }
            } else if row.expired {
                match self.hooks.on_gap_expired(&row.record, &row.parked_at) {
                    None => {}
                    Some(Ok(())) => {
                        self.delete_parked(&row.key).await.map_err(db)?;
                        let settled = Settled {
                            outcome: Outcome::Compensated,
                            attempts: 0,
                            reason: None,
                        };
                        self.after_settled(&row.record, &settled);
                        sweep.compensated += 1;
                        continue;
                    }
                    Some(Err(reason)) => {
                        tracing::warn!(consumer = %self.config.consumer,
                            aggregate_type = %row.key.aggregate_type,
                            aggregate_id = %row.key.aggregate_id, version = row.key.version,
                            error = %reason,
                            "inbox: the compensation of an expired parked record failed; \
                             the next sweep calls it again");
                        continue;
                    }
                }
                let expected = stored.map_or(1, |s| s + 1);
                let reason = format!(
                    "version gap: expected {expected}, got {}; parked since {}",
                    row.key.version, row.parked_at
                );
                let settled = self
                    .dead_letter(&row.record, reason, 0, Outcome::DeadLettered)
                    .await?;
                self.delete_parked(&row.key).await.map_err(db)?;
                self.after_settled(&row.record, &settled);
                sweep.dead_lettered += 1;
            }
        }
        let mut conn = self.pool.get_conn().await.map_err(db)?;
        let stats: Option<(u64, Option<i64>)> = conn
            .exec_first(&self.parked_sql.stats, (consumer,))
            .await
            .map_err(db)?;
        if let Some((count, oldest_us)) = stats {
            sweep.parked = count;
            sweep.oldest = oldest_us
                .and_then(|us| u64::try_from(us).ok())
                .map(std::time::Duration::from_micros);
        }
        if let Some(m) = &self.metrics {
            m.swept(&self.config.consumer, sweep.parked, sweep.oldest);
        }
        Ok(sweep)
    }

    async fn delete_parked(&self, key: &VersionKey) -> Result<(), mysql_async::Error> {
        let mut conn = self.pool.get_conn().await?;
        conn.exec_drop(
            &self.parked_sql.delete,
            (
                self.config.consumer.as_str(),
                &key.aggregate_type,
                &key.aggregate_id,
                key.version,
            ),
        )
        .await
    }

    /// Parks `record` (`inbox/CONTRACT.md`, "Parked versions", parking): under the version
    /// row's lock, still a gap: stored in the parked table (`Ok(true)`); the gap closed
    /// meanwhile: `Ok(false)`, redo the attempt.
    async fn park(
        &self,
        record: &InboxRecord,
        event_key: &str,
        key: &VersionKey,
        reason: &str,
    ) -> Result<bool, Failed> {
        let consumer = self.config.consumer.as_str();
        let mut conn = self.pool.get_conn().await.map_err(|e| Failed {
            text: format!("database: cannot get a connection: {e}"),
            infrastructure: true,
        })?;
        let mut tx = conn
            .start_transaction(TxOpts::default())
            .await
            .map_err(|e| Failed::db("database", e))?;
        let stored: Option<i64> = tx
            .exec_first(
                &self.select_version_sql,
                (consumer, &key.aggregate_type, &key.aggregate_id),
            )
            .await
            .map_err(|e| Failed::db("database: version check", e))?;
        if stored.is_none_or(|s| key.version <= s + 1) {
            let _ = tx.rollback().await;
            return Ok(false);
        }
        let gap_deadline = self
            .config
            .for_topic(retry::settings_topic(record))
            .gap_deadline;
        let deadline_us = u64::try_from(gap_deadline.as_micros()).unwrap_or(u64::MAX);
        tx.exec_drop(
            &self.parked_sql.insert,
            parked::insert_params(consumer, key, event_key, record, reason, deadline_us),
        )
        .await
        .map_err(|e| Failed::db("database: parking the record", e))?;
        tx.commit()
            .await
            .map_err(|e| Failed::db("database commit", e))?;
        Ok(true)
    }

    /// One record (or, with `parked`, a parked row's record) in its consumer span, with the
    /// `after_commit` hook.
    async fn process_one<F: Handler>(
        &self,
        record: &InboxRecord,
        handler: &F,
        parked: Option<&VersionKey>,
    ) -> Result<Settled, InboxError> {
        self.process_one_in(record, handler, parked, None, None)
            .await
    }

    /// [`Inbox::process_one`] in the consumer span `cx` when given, else a new one.
    async fn process_one_in<F: Handler>(
        &self,
        record: &InboxRecord,
        handler: &F,
        parked: Option<&VersionKey>,
        cx: Option<opentelemetry::Context>,
        failed: Option<String>,
    ) -> Result<Settled, InboxError> {
        let cx = cx.unwrap_or_else(|| {
            self.tracing
                .start(record, &self.config.consumer, &self.config.event_key_header)
        });
        let result = async {
            let settled = self.settle(record, handler, parked, failed).await?;

            otel::settled(&opentelemetry::Context::current(), &settled);
            self.after_settled(record, &settled);
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

    /// `failed`: attempt 1 already failed with this error (a batch run, `inbox/CONTRACT.md`,
    /// "Batch mode" 5): the attempts go on with 2 after the first backoff.
    async fn settle<F: Handler>(
        &self,
        record: &InboxRecord,
        handler: &F,
        parked: Option<&VersionKey>,
        failed: Option<String>,
    ) -> Result<Settled, InboxError> {
        let cfg = &self.config;
        let event_key = match record.header_str(&cfg.event_key_header) {
            Some(k) if !k.is_empty() => k,
            _ => {
                let reason = format!("missing {} header", cfg.event_key_header);
                return self.dead_letter_parked(record, reason, 0, parked).await;
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
                        return self.dead_letter_parked(record, reason, 0, parked).await;
                    }
                },
            },
        };
        // The settings of the record's topic (a retry copy: its original topic's).
        let ts = cfg.for_topic(retry::settings_topic(record));
        let mut delays = ts.backoff();
        // Attempts that count: not those ended by an infrastructure error.
        let mut attempt = 0u32;
        // Since when, and with which waits, the record fails with infrastructure errors only.
        let mut outage: Option<(Instant, backon::ExponentialBackoff)> = None;
        if let Some(error) = failed {
            attempt = 1;
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
                None => return self.attempts_used_up(record, error, attempt, parked).await,
            }
        }
        loop {
            let failed = match self
                .attempt(record, event_key, version, handler, parked)
                .await
            {
                Ok(Attempt::Committed) => {
                    let outcome = if parked.is_some() {
                        Outcome::Resumed
                    } else {
                        Outcome::Processed
                    };
                    return Ok(settled(outcome, attempt + 1));
                }
                Ok(Attempt::Duplicate) => match parked {
                    // Applied before (a redelivery of it was processed): not parked any more.
                    Some(key) => match self.delete_parked(key).await {
                        Ok(()) => return Ok(settled(Outcome::Duplicate, attempt + 1)),
                        Err(e) => Failed::db("database: removing the parked row", e),
                    },
                    None => return Ok(settled(Outcome::Duplicate, attempt + 1)),
                },
                Ok(Attempt::Stale) => return Ok(settled(Outcome::Stale, attempt + 1)),
                // Still ahead (a sweep read an older state): it stays parked.
                Ok(Attempt::Gap { .. }) if parked.is_some() => {
                    return Ok(settled(Outcome::Parked, attempt + 1))
                }
                Ok(Attempt::Gap { expected, got }) => {
                    let reason = format!("version gap: expected {expected}, got {got}");
                    match (ts.gap_policy, self.version_key(record)) {
                        (GapPolicy::Park, Some(key)) => {
                            match self.park(record, event_key, &key, &reason).await {
                                Ok(true) => {
                                    return Ok(Settled {
                                        outcome: Outcome::Parked,
                                        attempts: attempt + 1,
                                        reason: Some(reason),
                                    })
                                }
                                // The gap closed meanwhile: the attempt is redone at once.
                                Ok(false) => continue,
                                Err(f) => f,
                            }
                        }
                        (GapPolicy::Retry, _) => Failed {
                            text: reason,
                            infrastructure: false,
                        },
                        (GapPolicy::DeadLetter | GapPolicy::Park, _) => {
                            return self
                                .dead_letter(record, reason, attempt + 1, Outcome::DeadLettered)
                                .await;
                        }
                    }
                }
                Err(f) => f,
            };
            if failed.infrastructure {
                // Not an attempt: the record is redone once the database answers.
                otel::outage_failed(&failed.text, attempt + 1);
                let (since, waits) =
                    outage.get_or_insert_with(|| (Instant::now(), ts.outage_backoff()));
                let down = since.elapsed();
                if down >= cfg.outage_budget {
                    tracing::error!(
                        consumer = %cfg.consumer, event_key, topic = %record.topic,
                        partition = record.partition, offset = record.offset,
                        budget_ms = cfg.outage_budget.as_millis() as u64, error = %failed.text,
                        "inbox: database outage longer than the outage budget; stopping"
                    );
                    return Err(InboxError::Outage {
                        topic: record.topic.clone(),
                        partition: record.partition,
                        offset: record.offset,
                        budget: cfg.outage_budget,
                        error: failed.text,
                    });
                }
                let wait = waits
                    .next()
                    .unwrap_or(ts.backoff_max)
                    .min(cfg.outage_budget - down);
                tracing::warn!(
                    consumer = %cfg.consumer, event_key, topic = %record.topic,
                    partition = record.partition, offset = record.offset,
                    down_ms = down.as_millis() as u64, retry_in_ms = wait.as_millis() as u64,
                    error = %failed.text, "inbox: infrastructure error (not an attempt); retrying"
                );
                tokio::time::sleep(wait).await;
                continue;
            }
            attempt += 1;
            let error = failed.text;
            outage = None;
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
                None => return self.attempts_used_up(record, error, attempt, parked).await,
            }
        }
    }

    /// A record whose attempts are used up (2.5): a copy to the next retry tier when its
    /// original topic has one left (outcome [`Outcome::Retried`]), else the dead-letter topic.
    /// A parked record's row is removed once the copy or the dead letter is acknowledged.
    async fn attempts_used_up(
        &self,
        record: &InboxRecord,
        error: String,
        attempts: u32,
        parked: Option<&VersionKey>,
    ) -> Result<Settled, InboxError> {
        let origin = retry::origin(record);
        let tiers = self.config.retry_tiers_for(retry::settings_topic(record));
        let n = retry::tier(record).saturating_add(1);
        let Some(delay) = tiers.get(n as usize - 1).copied() else {
            return self
                .dead_letter_parked(record, error, attempts, parked)
                .await;
        };
        let topic = self.config.retry_topic(&origin.topic, n);
        let headers = retry::copy_headers(record, n, delay, &error, attempts, retry::now_ms());
        tracing::warn!(
            consumer = %self.config.consumer, topic = %record.topic, partition = record.partition,
            offset = record.offset, attempts, error = %error, tier = n, retry_topic = %topic,
            delay_ms = delay.as_millis() as u64, "inbox: attempts used up; copied to a retry tier"
        );
        self.dead_letters
            .send_copy(&topic, record, &headers)
            .await?;
        if let Some(key) = parked {
            if let Err(e) = self.delete_parked(key).await {
                tracing::warn!(
                    consumer = %self.config.consumer, error = %e,
                    "inbox: a retried parked row could not be removed"
                );
            }
        }
        Ok(Settled {
            outcome: Outcome::Retried,
            attempts,
            reason: Some(error),
        })
    }

    /// [`Inbox::dead_letter`] of a record, removing its parked row (when it is one) once the
    /// dead letter is acknowledged.
    async fn dead_letter_parked(
        &self,
        record: &InboxRecord,
        reason: String,
        attempts: u32,
        parked: Option<&VersionKey>,
    ) -> Result<Settled, InboxError> {
        let settled = self
            .dead_letter(record, reason, attempts, Outcome::DeadLettered)
            .await?;
        if let Some(key) = parked {
            if let Err(e) = self.delete_parked(key).await {
                // The dead letter is out; the row stays until a sweep finds it applied or
                // expired again (a second dead letter at worst, never a loss).
                tracing::warn!(
                    consumer = %self.config.consumer, error = %e,
                    "inbox: a dead-lettered parked row could not be removed"
                );
            }
        }
        Ok(settled)
    }

    /// One database transaction: inbox row, version check, handler, commit. Rolled back on
    /// every path that does not commit.
    async fn attempt<F: Handler>(
        &self,
        record: &InboxRecord,
        event_key: &str,
        version: Option<i64>,
        handler: &F,
        parked: Option<&VersionKey>,
    ) -> Result<Attempt, Failed> {
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
                // No connection at all: the infrastructure's, whatever the error.
                .map_err(|e| Failed {
                    text: format!("database: cannot get a connection: {e}"),
                    infrastructure: true,
                })?,
        };
        let result = self
            .attempt_on(&mut conn, record, event_key, version, handler, parked)
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
        parked: Option<&VersionKey>,
    ) -> Result<Attempt, Failed> {
        let mut tx = conn
            .start_transaction(TxOpts::default())
            .await
            .map_err(|e| Failed::db("database", e))?;
        let mut result = self
            .in_transaction(&mut tx, record, event_key, version, handler)
            .await;
        if let (Some(key), Ok(Attempt::Committed | Attempt::Stale)) = (parked, &result) {
            // A parked row leaves the table in the transaction that applies (or drops) it.
            if let Err(e) = tx
                .exec_drop(
                    &self.parked_sql.delete,
                    (
                        self.config.consumer.as_str(),
                        &key.aggregate_type,
                        &key.aggregate_id,
                        key.version,
                    ),
                )
                .await
            {
                result = Err(Failed::db("database: removing the parked row", e));
            }
        }
        match result {
            Ok(Attempt::Committed) => {
                self.hooks.before_commit(record);
                tx.commit()
                    .await
                    .map_err(|e| Failed::db("database commit", e))?;
                Ok(Attempt::Committed)
            }
            Ok(Attempt::Stale) => {
                // The inbox row stays: a redelivery of this stale event is a duplicate.
                tx.commit()
                    .await
                    .map_err(|e| Failed::db("database commit", e))?;
                Ok(Attempt::Stale)
            }
            Ok(other) => {
                tx.rollback()
                    .await
                    .map_err(|e| Failed::db("database rollback", e))?;
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
    ) -> Result<Attempt, Failed> {
        let consumer = self.config.consumer.as_str();
        // A retry copy's row names the original record ("Retry tiers").
        let origin = retry::origin(record);
        let inserted = tx
            .exec_drop(
                &self.insert_sql,
                (
                    consumer,
                    event_key,
                    origin.topic.as_str(),
                    origin.partition,
                    origin.offset,
                ),
            )
            .await;
        match inserted {
            Err(mysql_async::Error::Server(e)) if e.code == ER_DUP_ENTRY => {
                return Ok(Attempt::Duplicate)
            }
            Err(e) => return Err(Failed::db("database: inbox insert", e)),
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
                .map_err(|e| Failed::db("database: version check", e))?;
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
            .map_err(|e| Failed::db("database: version update", e))?;
        }
        handler.handle(tx, record).await.map_err(|e| Failed {
            infrastructure: crate::error::is_infrastructure_error(e.as_ref()),
            text: e.to_string(),
        })?;
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
