//! Batch mode (`inbox/CONTRACT.md`, "Batch mode"): [`Inbox::process_batch`] settles the records
//! of a poll batch in one database transaction, each with exactly the writes, hooks, metrics and
//! span the single path ([`Inbox::process`]) gives it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use futures::future::BoxFuture;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Transaction, TxOpts, Value};
use opentelemetry::context::FutureExt;
use opentelemetry::Context;

use super::{Failed, Handler, Hooks, Inbox, ER_DUP_ENTRY};
use crate::config::GapPolicy;
use crate::error::InboxError;
use crate::otel;
use crate::outcome::{Outcome, Settled};
use crate::parked::{self, VersionKey};
use crate::record::InboxRecord;
use crate::retry;

/// The test seam of the MySQL race: called after the duplicate-finding `SELECT … FOR UPDATE`
/// (MariaDB: before the `INSERT IGNORE … RETURNING`) and before the multi-row insert.
pub(crate) type BatchHook = Arc<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>;

/// A parked row's `(aggregate_type, aggregate_id, version)`.
type ParkedSlot = (Vec<u8>, Vec<u8>, i64);

/// The longest event_key the inbox column holds (bytes).
const EVENT_KEY_MAX_BYTES: usize = 1020;

/// 1062 redos of one batch in a row before the next counts as an infrastructure error.
const MAX_RACE_REDOS: u32 = 5;

/// What a record came to in a batch transaction that commits.
#[derive(Debug, Clone)]
enum Fate {
    Processed,
    Duplicate,
    Stale,
    Parked(String),
}

/// Why a batch transaction was rolled back.
enum BatchFailed {
    /// The record at this position of the batch failed (its handler's error, a version gap
    /// under `dead_letter`/`retry`, a statement error that is not the infrastructure's): the
    /// records before it as a batch, it alone through the single path, the rest as a batch.
    /// With the handler's error: the batch run was the record's attempt 1 (a version gap or a
    /// statement error is not: no handler of it ran).
    At(usize, Option<String>),
    /// MySQL: another transaction inserted one of the batch's keys between the `SELECT` and the
    /// `INSERT` (1062): redo the batch at once.
    Race,
    /// An infrastructure error: redo after the backoff, within the outage budget.
    Infra(String),
}

impl BatchFailed {
    /// A failed statement of the batch: the infrastructure's, or else charged to the batch's
    /// first record (which then goes through the single path, its own attempts deciding).
    fn db(what: &str, error: mysql_async::Error) -> Self {
        let f = Failed::db(what, error);
        if f.infrastructure {
            BatchFailed::Infra(f.text)
        } else {
            BatchFailed::At(0, None)
        }
    }
}

/// What to do next with the records of a batch (indices into the caller's slice).
enum Work {
    Batch(Vec<usize>),
    Single(usize, Option<String>),
}

/// A batch record: its index in the caller's slice, event key and version.
struct Item<'a> {
    idx: usize,
    record: &'a InboxRecord,
    key: &'a str,
    version: Option<i64>,
}

/// `(?, ?, …)` groups: `rows` of `(` `row` `)`, comma separated.
fn placeholders(rows: usize, row: &str) -> String {
    let mut s = String::with_capacity(rows * (row.len() + 3));
    for i in 0..rows {
        if i > 0 {
            s.push(',');
        }
        s.push('(');
        s.push_str(row);
        s.push(')');
    }
    s
}

impl<H: Hooks> Inbox<H> {
    /// Settles `records` (in order; the records of one partition in offset order) in one
    /// database transaction (`inbox/CONTRACT.md`, "Batch mode"), each exactly as
    /// [`Inbox::process`] would: the same inbox, version and parked rows, hooks
    /// ([`Hooks::before_commit`] per record before the commit, [`Hooks::after_commit`] per
    /// record after it), metrics, consumer spans and outcomes. Returns one [`Settled`] per
    /// record, in input order.
    ///
    /// - Records without `event_key`, with an invalid version header, or with an event key
    ///   longer than 1,020 bytes go through [`Inbox::process`] first (dead letters).
    /// - A second record with the same event key (bytes) in the batch is a duplicate.
    /// - Inbox rows in one statement: MariaDB `INSERT IGNORE … RETURNING event_key`; MySQL
    ///   `SELECT … FOR UPDATE` of the existing keys, then a multi-row `INSERT` (a 1062 from a
    ///   concurrent insert: the batch is redone, at most 5 times in a row, then it counts as an
    ///   infrastructure error).
    /// - With [`InboxConfig::version_header`](crate::InboxConfig::version_header): one locking
    ///   read of the stored versions, in-order / stale / gap decided in batch order in memory,
    ///   gaps under [`GapPolicy::Park`] parked in the transaction, one multi-row upsert.
    /// - The handler runs per record, in order, with the batch's transaction: a slow handler
    ///   delays the whole batch.
    /// - A handler error (not an infrastructure error) at record `i`: the batch is rolled
    ///   back, records `0..i` are redone as a batch, record `i` goes alone through the single
    ///   path, the records after it as a new batch. The failed batch run is record `i`'s attempt
    ///   1: the single path goes on with attempt 2 after the first backoff (with
    ///   `max_attempts` 1 it settles it at once: next tier or dead letter with the batch run's
    ///   error), so a handler fails at most `max_attempts` times in either mode. A version gap
    ///   under [`GapPolicy::DeadLetter`] or [`GapPolicy::Retry`] also goes through the single
    ///   path, without counting an attempt (no handler ran).
    /// - An infrastructure error ([`crate::is_infrastructure_error`]) anywhere, the commit
    ///   included: the batch is rolled back and redone after the backoff, within
    ///   [`InboxConfig::outage_budget`](crate::InboxConfig::outage_budget) counted from the
    ///   batch's first such error.
    ///
    /// After the commit, the parked successors of the aggregates whose version moved are
    /// applied (outcome [`Outcome::Resumed`], reported to the hooks and metrics as by
    /// [`Inbox::process`]).
    ///
    /// # Errors
    /// As [`Inbox::process`]: [`InboxError::Outage`] (naming the batch's first record) or
    /// [`InboxError::Kafka`]. Then the batch is not settled: commit no offset of it.
    pub async fn process_batch<F: Handler>(
        &self,
        records: &[InboxRecord],
        handler: &F,
    ) -> Result<Vec<Settled>, InboxError> {
        let mut out: Vec<Option<Settled>> = vec![None; records.len()];
        let mut spans: Vec<Option<Context>> = vec![None; records.len()];
        // 1. Records the single path dead-letters at once.
        let mut items: Vec<Option<Item<'_>>> = Vec::with_capacity(records.len());
        let mut batch = Vec::with_capacity(records.len());
        for (idx, record) in records.iter().enumerate() {
            match self.batch_item(idx, record) {
                Some(item) => {
                    batch.push(idx);
                    items.push(Some(item));
                }
                None => {
                    out[idx] = Some(self.process(record, handler).await?);
                    items.push(None);
                }
            }
        }
        let mut work = VecDeque::from([Work::Batch(batch)]);
        while let Some(next) = work.pop_front() {
            match next {
                Work::Single(idx, failed) => {
                    let cx = spans[idx].take();
                    out[idx] = Some(self.process_in(&records[idx], handler, cx, failed).await?);
                }
                Work::Batch(idxs) if idxs.is_empty() => {}
                Work::Batch(idxs) => {
                    let segment: Vec<&Item<'_>> =
                        idxs.iter().filter_map(|&i| items[i].as_ref()).collect();
                    if let Some((pos, failed)) = self
                        .run_batch(&segment, handler, &mut spans, &mut out)
                        .await?
                    {
                        work.push_front(Work::Batch(idxs[pos + 1..].to_vec()));
                        work.push_front(Work::Single(idxs[pos], failed));
                        work.push_front(Work::Batch(idxs[..pos].to_vec()));
                    }
                }
            }
        }
        Ok(out.into_iter().flatten().collect())
    }

    /// Tests only: `hook` runs in every batch transaction after the duplicates were found
    /// (MySQL: after the `SELECT … FOR UPDATE`; MariaDB: before the `INSERT IGNORE`) and before
    /// the multi-row insert.
    #[doc(hidden)]
    pub fn set_batch_hook(
        &mut self,
        hook: impl Fn() -> BoxFuture<'static, ()> + Send + Sync + 'static,
    ) {
        self.batch_hook = Some(Arc::new(hook));
    }

    /// The record's event key and version, or `None` when the single path settles it at once
    /// (missing key, invalid version header, key longer than the column).
    fn batch_item<'a>(&self, idx: usize, record: &'a InboxRecord) -> Option<Item<'a>> {
        let key = record
            .header_str(&self.config.event_key_header)
            .filter(|k| !k.is_empty() && k.len() <= EVENT_KEY_MAX_BYTES)?;
        let version = match self.config.version_header.as_deref() {
            None => None,
            Some(h) => match record.header_str(h) {
                None => None,
                Some(text) => Some(text.trim().parse::<i64>().ok()?),
            },
        };
        Some(Item {
            idx,
            record,
            key,
            version,
        })
    }

    /// One batch until it commits (`Ok(None)`), or fails at a record (`Ok(Some((position,
    /// the handler's error when it was one)))`).
    async fn run_batch<F: Handler>(
        &self,
        segment: &[&Item<'_>],
        handler: &F,
        spans: &mut [Option<Context>],
        out: &mut [Option<Settled>],
    ) -> Result<Option<(usize, Option<String>)>, InboxError> {
        let cfg = &self.config;
        let first = segment[0].record;
        let ts = cfg.for_topic(retry::settings_topic(first));
        for item in segment {
            if spans[item.idx].is_none() {
                spans[item.idx] = Some(self.tracing.start(
                    item.record,
                    &cfg.consumer,
                    &cfg.event_key_header,
                ));
            }
        }
        let cxs: Vec<Context> = segment
            .iter()
            .map(|i| spans[i.idx].clone().unwrap_or_default())
            .collect();
        let mut outage: Option<(Instant, backon::ExponentialBackoff)> = None;
        let mut races = 0u32;
        loop {
            let text = match self.batch_attempt(segment, handler, &cxs).await {
                Ok((fates, moved)) => {
                    for ((item, fate), cx) in segment.iter().zip(fates).zip(&cxs) {
                        let settled = match fate {
                            Fate::Processed => super::settled(Outcome::Processed, 1),
                            Fate::Duplicate => super::settled(Outcome::Duplicate, 1),
                            Fate::Stale => super::settled(Outcome::Stale, 1),
                            Fate::Parked(reason) => Settled {
                                outcome: Outcome::Parked,
                                attempts: 1,
                                reason: Some(reason),
                            },
                        };
                        {
                            let _current = cx.clone().attach();
                            otel::settled(cx, &settled);
                            self.after_settled(item.record, &settled);
                        }
                        opentelemetry::trace::TraceContextExt::span(cx).end();
                        spans[item.idx] = None;
                        out[item.idx] = Some(settled);
                    }
                    self.resume_moved(moved, handler).await?;
                    return Ok(None);
                }
                Err(BatchFailed::At(pos, failed)) => return Ok(Some((pos, failed))),
                Err(BatchFailed::Race) if races < MAX_RACE_REDOS => {
                    races += 1;
                    tracing::debug!(
                        consumer = %cfg.consumer, topic = %first.topic,
                        partition = first.partition, offset = first.offset, redo = races,
                        "inbox: a batch key was inserted concurrently (1062); batch redone"
                    );
                    continue;
                }
                Err(BatchFailed::Race) => {
                    races = 0;
                    format!(
                        "database: inbox insert: duplicate key (1062) in {} batch attempts in a row",
                        MAX_RACE_REDOS + 1
                    )
                }
                Err(BatchFailed::Infra(text)) => text,
            };
            for cx in &cxs {
                let _current = cx.clone().attach();
                otel::outage_failed(&text, 1);
            }
            let (since, waits) =
                outage.get_or_insert_with(|| (Instant::now(), ts.outage_backoff()));
            let down = since.elapsed();
            if down >= cfg.outage_budget {
                tracing::error!(
                    consumer = %cfg.consumer, event_key = segment[0].key, topic = %first.topic,
                    partition = first.partition, offset = first.offset,
                    budget_ms = cfg.outage_budget.as_millis() as u64, error = %text,
                    batch = segment.len(),
                    "inbox: database outage longer than the outage budget; stopping"
                );
                let error = InboxError::Outage {
                    topic: first.topic.clone(),
                    partition: first.partition,
                    offset: first.offset,
                    budget: cfg.outage_budget,
                    error: text,
                };
                for item in segment {
                    if let Some(cx) = spans[item.idx].take() {
                        otel::unsettled(&cx, &error);
                        opentelemetry::trace::TraceContextExt::span(&cx).end();
                    }
                }
                return Err(error);
            }
            let wait = waits
                .next()
                .unwrap_or(ts.backoff_max)
                .min(cfg.outage_budget - down);
            tracing::warn!(
                consumer = %cfg.consumer, event_key = segment[0].key, topic = %first.topic,
                partition = first.partition, offset = first.offset, batch = segment.len(),
                down_ms = down.as_millis() as u64, retry_in_ms = wait.as_millis() as u64,
                error = %text, "inbox: infrastructure error (not an attempt); retrying"
            );
            tokio::time::sleep(wait).await;
        }
    }

    /// Applies the parked successors of the aggregates whose version moved in a batch (in the
    /// batch's order): one read of the parked table for all of them, then
    /// [`Inbox::resume_after`] for those with a successor parked.
    async fn resume_moved<F: Handler>(
        &self,
        moved: Vec<VersionKey>,
        handler: &F,
    ) -> Result<(), InboxError> {
        if moved.is_empty() || !self.config.parks_anywhere() {
            return Ok(());
        }
        let sql = format!(
            "SELECT aggregate_type, aggregate_id, version FROM {} WHERE consumer = ? AND \
             (aggregate_type, aggregate_id, version) IN ({})",
            self.config.parked_table,
            placeholders(moved.len(), "?, ?, ?")
        );
        let mut params: Vec<Value> = vec![self.config.consumer.as_str().into()];
        for k in &moved {
            params.push(k.aggregate_type.as_str().into());
            params.push(k.aggregate_id.as_str().into());
            params.push((k.version + 1).into());
        }
        let found: Result<Vec<ParkedSlot>, mysql_async::Error> = async {
            let mut conn = self.pool.get_conn().await?;
            conn.exec(sql, mysql_async::Params::Positional(params))
                .await
        }
        .await;
        let found: HashSet<(Vec<u8>, Vec<u8>)> = match found {
            Ok(rows) => rows.into_iter().map(|(t, i, _)| (t, i)).collect(),
            Err(e) => {
                tracing::warn!(
                    consumer = %self.config.consumer, error = %e,
                    "inbox: parked successors not read; the sweep will resume them"
                );
                return Ok(());
            }
        };
        for key in moved {
            let k = (
                key.aggregate_type.as_bytes().to_vec(),
                key.aggregate_id.as_bytes().to_vec(),
            );
            if found.contains(&k) {
                self.resume_after(key, handler).await?;
            }
        }
        Ok(())
    }

    /// Whether the server is MariaDB (`SELECT VERSION()`, asked once per inbox).
    async fn is_mariadb(&self, conn: &mut Conn) -> Result<bool, mysql_async::Error> {
        self.mariadb
            .get_or_try_init(|| async {
                let v: Option<String> = conn.query_first("SELECT VERSION()").await?;
                Ok(v.unwrap_or_default().contains("MariaDB"))
            })
            .await
            .copied()
    }

    /// One batch transaction on the inbox's connection (kept unless it saw an infrastructure
    /// error). `Ok`: committed; each record's fate, and the aggregates whose version moved
    /// (their new version).
    async fn batch_attempt<F: Handler>(
        &self,
        segment: &[&Item<'_>],
        handler: &F,
        cxs: &[Context],
    ) -> Result<(Vec<Fate>, Vec<VersionKey>), BatchFailed> {
        let mut slot = self.conn.lock().await;
        let mut conn = match slot.take() {
            Some(c) => c,
            None => self.pool.get_conn().await.map_err(|e| {
                BatchFailed::Infra(format!("database: cannot get a connection: {e}"))
            })?,
        };
        let result = self.batch_on(&mut conn, segment, handler, cxs).await;
        if !matches!(result, Err(BatchFailed::Infra(_))) {
            *slot = Some(conn);
        }
        result
    }

    async fn batch_on<F: Handler>(
        &self,
        conn: &mut Conn,
        segment: &[&Item<'_>],
        handler: &F,
        cxs: &[Context],
    ) -> Result<(Vec<Fate>, Vec<VersionKey>), BatchFailed> {
        let mariadb = self
            .is_mariadb(conn)
            .await
            .map_err(|e| BatchFailed::db("database: server version", e))?;
        let mut tx = conn
            .start_transaction(TxOpts::default())
            .await
            .map_err(|e| BatchFailed::db("database", e))?;
        match self
            .batch_in_transaction(&mut tx, mariadb, segment, handler, cxs)
            .await
        {
            Ok((fates, moved)) => {
                for ((item, fate), cx) in segment.iter().zip(&fates).zip(cxs) {
                    if matches!(fate, Fate::Processed) {
                        let _current = cx.clone().attach();
                        self.hooks.before_commit(item.record);
                    }
                }
                tx.commit().await.map_err(|e| {
                    // Any commit failure redoes the batch: what did commit is found as
                    // duplicates by the redo.
                    BatchFailed::Infra(format!("database commit: {e}"))
                })?;
                Ok((fates, moved))
            }
            Err(e) => {
                let _ = tx.rollback().await;
                Err(e)
            }
        }
    }

    async fn batch_in_transaction<F: Handler>(
        &self,
        tx: &mut Transaction<'_>,
        mariadb: bool,
        segment: &[&Item<'_>],
        handler: &F,
        cxs: &[Context],
    ) -> Result<(Vec<Fate>, Vec<VersionKey>), BatchFailed> {
        let cfg = &self.config;
        let consumer = cfg.consumer.as_str();
        let t = &cfg.inbox_table;
        let mut fates: Vec<Option<Fate>> = vec![None; segment.len()];
        // A second record with the same key (bytes) is a duplicate of the first.
        let mut seen: HashSet<&[u8]> = HashSet::with_capacity(segment.len());
        let mut firsts: Vec<usize> = Vec::with_capacity(segment.len());
        for (pos, item) in segment.iter().enumerate() {
            if seen.insert(item.key.as_bytes()) {
                firsts.push(pos);
            } else {
                fates[pos] = Some(Fate::Duplicate);
            }
        }
        let row_params = |positions: &[usize]| {
            let mut params: Vec<Value> = Vec::with_capacity(positions.len() * 5);
            for &pos in positions {
                // A retry copy's row names the original record ("Retry tiers").
                let origin = retry::origin(segment[pos].record);
                params.push(consumer.into());
                params.push(segment[pos].key.into());
                params.push(origin.topic.into());
                params.push(origin.partition.into());
                params.push(origin.offset.into());
            }
            mysql_async::Params::Positional(params)
        };
        let columns = "consumer, event_key, topic, kafka_partition, kafka_offset";
        // 2. Inbox rows: the keys that are new.
        let new: Vec<usize> = if mariadb {
            if let Some(hook) = &self.batch_hook {
                hook().await;
            }
            let sql = format!(
                "INSERT IGNORE INTO {t} ({columns}) VALUES {} RETURNING event_key",
                placeholders(firsts.len(), "?, ?, ?, ?, ?")
            );
            let returned: Vec<Vec<u8>> = tx
                .exec(sql, row_params(&firsts))
                .await
                .map_err(|e| BatchFailed::db("database: inbox insert", e))?;
            let returned: HashSet<Vec<u8>> = returned.into_iter().collect();
            firsts
                .into_iter()
                .filter(|&pos| {
                    let new = returned.contains(segment[pos].key.as_bytes());
                    if !new {
                        fates[pos] = Some(Fate::Duplicate);
                    }
                    new
                })
                .collect()
        } else {
            let sql = format!(
                "SELECT event_key FROM {t} WHERE consumer = ? AND event_key IN ({}) FOR UPDATE",
                vec!["?"; firsts.len()].join(", ")
            );
            let mut params: Vec<Value> = vec![consumer.into()];
            params.extend(firsts.iter().map(|&pos| Value::from(segment[pos].key)));
            let found: Vec<Vec<u8>> = tx
                .exec(sql, mysql_async::Params::Positional(params))
                .await
                .map_err(|e| BatchFailed::db("database: inbox lookup", e))?;
            let found: HashSet<Vec<u8>> = found.into_iter().collect();
            if let Some(hook) = &self.batch_hook {
                hook().await;
            }
            let new: Vec<usize> = firsts
                .into_iter()
                .filter(|&pos| {
                    let new = !found.contains(segment[pos].key.as_bytes());
                    if !new {
                        fates[pos] = Some(Fate::Duplicate);
                    }
                    new
                })
                .collect();
            if !new.is_empty() {
                let sql = format!(
                    "INSERT INTO {t} ({columns}) VALUES {}",
                    placeholders(new.len(), "?, ?, ?, ?, ?")
                );
                match tx.exec_drop(sql, row_params(&new)).await {
                    Err(mysql_async::Error::Server(e)) if e.code == ER_DUP_ENTRY => {
                        return Err(BatchFailed::Race)
                    }
                    Err(e) => return Err(BatchFailed::db("database: inbox insert", e)),
                    Ok(()) => {}
                }
            }
            new
        };
        // 3. Versions, decided in batch order in memory.
        let mut moved: Vec<VersionKey> = Vec::new();
        let mut parked_rows: Vec<(usize, VersionKey, String)> = Vec::new();
        let versioned: Vec<(usize, (String, String), i64)> = new
            .iter()
            .filter_map(|&pos| {
                let r = segment[pos].record;
                segment[pos].version.map(|v| {
                    let agg = (
                        r.header_str("aggregate_type")
                            .unwrap_or_default()
                            .to_owned(),
                        r.key_str().unwrap_or_default().to_owned(),
                    );
                    (pos, agg, v)
                })
            })
            .collect();
        if !versioned.is_empty() {
            let mut aggregates: Vec<&(String, String)> = Vec::new();
            let mut listed: HashSet<&(String, String)> = HashSet::new();
            for (_, agg, _) in &versioned {
                if listed.insert(agg) {
                    aggregates.push(agg);
                }
            }
            let sql = format!(
                "SELECT aggregate_type, aggregate_id, version FROM {} WHERE consumer = ? AND \
                 (aggregate_type, aggregate_id) IN ({}) FOR UPDATE",
                cfg.version_table,
                placeholders(aggregates.len(), "?, ?")
            );
            let mut params: Vec<Value> = vec![consumer.into()];
            for (ty, id) in &aggregates {
                params.push(ty.as_str().into());
                params.push(id.as_str().into());
            }
            let stored: Vec<(Vec<u8>, Vec<u8>, i64)> = tx
                .exec(sql, mysql_async::Params::Positional(params))
                .await
                .map_err(|e| BatchFailed::db("database: version check", e))?;
            let mut current: HashMap<(Vec<u8>, Vec<u8>), i64> = stored
                .into_iter()
                .map(|(ty, id, v)| ((ty, id), v))
                .collect();
            let mut moved_order: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
            let mut moved_set: HashSet<(Vec<u8>, Vec<u8>)> = HashSet::new();
            for (pos, (ty, id), v) in &versioned {
                let k = (ty.as_bytes().to_vec(), id.as_bytes().to_vec());
                match current.get(&k).copied() {
                    Some(s) if *v <= s => fates[*pos] = Some(Fate::Stale),
                    Some(s) if *v > s + 1 => {
                        let reason = format!("version gap: expected {}, got {v}", s + 1);
                        let record = segment[*pos].record;
                        let policy = cfg.for_topic(retry::settings_topic(record)).gap_policy;
                        match (policy, self.version_key(record)) {
                            (GapPolicy::Park, Some(key)) => {
                                fates[*pos] = Some(Fate::Parked(reason.clone()));
                                parked_rows.push((*pos, key, reason));
                            }
                            // Through the single path, which dead-letters or retries it.
                            _ => return Err(BatchFailed::At(*pos, None)),
                        }
                    }
                    _ => {
                        if moved_set.insert(k.clone()) {
                            moved_order.push(k.clone());
                        }
                        current.insert(k, *v);
                        fates[*pos] = Some(Fate::Processed);
                    }
                }
            }
            if !parked_rows.is_empty() {
                // A parked record leaves no inbox row (the single path rolls its insert back).
                let sql = format!(
                    "DELETE FROM {t} WHERE consumer = ? AND event_key IN ({})",
                    vec!["?"; parked_rows.len()].join(", ")
                );
                let mut params: Vec<Value> = vec![consumer.into()];
                params.extend(
                    parked_rows
                        .iter()
                        .map(|(pos, _, _)| Value::from(segment[*pos].key)),
                );
                tx.exec_drop(sql, mysql_async::Params::Positional(params))
                    .await
                    .map_err(|e| BatchFailed::db("database: parking the record", e))?;
                for (pos, key, reason) in &parked_rows {
                    let record = segment[*pos].record;
                    let gap_deadline = cfg.for_topic(retry::settings_topic(record)).gap_deadline;
                    let deadline_us = u64::try_from(gap_deadline.as_micros()).unwrap_or(u64::MAX);
                    tx.exec_drop(
                        &self.parked_sql.insert,
                        parked::insert_params(
                            consumer,
                            key,
                            segment[*pos].key,
                            record,
                            reason,
                            deadline_us,
                        ),
                    )
                    .await
                    .map_err(|e| BatchFailed::db("database: parking the record", e))?;
                }
            }
            if !moved_order.is_empty() {
                let sql = format!(
                    "INSERT INTO {} (consumer, aggregate_type, aggregate_id, version) VALUES {} \
                     ON DUPLICATE KEY UPDATE version = VALUES(version)",
                    cfg.version_table,
                    placeholders(moved_order.len(), "?, ?, ?, ?")
                );
                let mut params: Vec<Value> = Vec::with_capacity(moved_order.len() * 4);
                for k in &moved_order {
                    let v = current.get(k).copied().unwrap_or_default();
                    params.push(consumer.into());
                    params.push(k.0.clone().into());
                    params.push(k.1.clone().into());
                    params.push(v.into());
                    moved.push(VersionKey {
                        aggregate_type: String::from_utf8_lossy(&k.0).into_owned(),
                        aggregate_id: String::from_utf8_lossy(&k.1).into_owned(),
                        version: v,
                    });
                }
                tx.exec_drop(sql, mysql_async::Params::Positional(params))
                    .await
                    .map_err(|e| BatchFailed::db("database: version update", e))?;
            }
        }
        // Records without a version (or without the check) are in order.
        for pos in new {
            if fates[pos].is_none() {
                fates[pos] = Some(Fate::Processed);
            }
        }
        // 4. The handlers, in batch order, with the batch's transaction.
        for (pos, item) in segment.iter().enumerate() {
            if !matches!(fates[pos], Some(Fate::Processed)) {
                continue;
            }
            let result = handler
                .handle(tx, item.record)
                .with_context(cxs[pos].clone())
                .await;
            if let Err(e) = result {
                if crate::error::is_infrastructure_error(e.as_ref()) {
                    return Err(BatchFailed::Infra(e.to_string()));
                }
                return Err(BatchFailed::At(pos, Some(e.to_string())));
            }
        }
        Ok((
            fates
                .into_iter()
                .map(|f| f.unwrap_or(Fate::Duplicate))
                .collect(),
            moved,
        ))
    }
}
