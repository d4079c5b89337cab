//! The consumer side's tables (`inbox/CONTRACT.md`): `outbox-relay migrate --inbox` creates them
//! in a consumer's database, `outbox-relay prune --inbox` keeps the inbox small.
//!
//! # The prune rule, and why it never makes a redelivery look new
//! An inbox row (consumer, event_key) is what makes a redelivered record a duplicate. A record
//! can be delivered again while its offset is not committed by the consumer group (a crash
//! before the offset commit), so a row is deleted only when both hold:
//! 1. the group's committed offset of the row's (topic, partition) is past the row's offset
//!    (read once, before deleting, with the Kafka admin protocol's OffsetFetch);
//! 2. the row is older than the retention (`processed_at` before the server's `NOW(6)` minus
//!    `--older-than`), which must be longer than any redelivery the team does on purpose
//!    (dead-letter replay, an offset reset, a republish): README, "Consumers: the inbox".
//!
//! Deletes run in batches (`DELETE … LIMIT n`, autocommit: each a short transaction) with a
//! pause between them, so writers of the inbox are never blocked for long.

use std::fmt;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use crate::error::RelayError;

/// `migrations/0004_inbox.sql`: the inbox and version tables, idempotent.
pub const INBOX_SQL: &str = include_str!("../../../../migrations/0004_inbox.sql");

/// The inbox table `prune --inbox` works on.
pub const INBOX_TABLE: &str = "outbox_inbox";

/// Connects to the consumer's database at `url` (`mysql://user:pass@host:port/db`).
///
/// # Errors
/// [`RelayError::Argument`] for a URL without a database or that does not parse;
/// [`RelayError::Mysql`] when the server cannot be reached.
pub(crate) async fn connect(url: &str) -> Result<Conn, RelayError> {
    let opts = Opts::from_url(url)
        .map_err(|e| RelayError::Argument(format!("--database-url {url:?}: {e}")))?;
    if opts.db_name().is_none() {
        return Err(RelayError::Argument(format!(
            "--database-url {url:?} names no database: add it as the path, \
             mysql://user:pass@host:3306/DATABASE (the consumer's own database)"
        )));
    }
    let conn = crate::error::with_timeout(
        Duration::from_secs(30),
        "connecting to the consumer's database",
        Conn::new(opts),
    )
    .await??;
    Ok(conn)
}

/// Creates `outbox_inbox` and `outbox_inbox_version` in the database of `url` when missing.
/// Returns which tables existed before.
///
/// # Errors
/// As [`connect`]; server errors (a missing CREATE privilege as [`RelayError::Mysql`]).
pub async fn migrate_inbox(url: &str) -> Result<InboxMigrateReport, RelayError> {
    let mut conn = connect(url).await?;
    let mut existed = Vec::new();
    for t in ["outbox_inbox", "outbox_inbox_version"] {
        let n: Option<u64> = conn
            .exec_first(
                "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() \
                 AND TABLE_NAME = ?",
                (t,),
            )
            .await?;
        existed.push((t.to_owned(), n.unwrap_or(0) > 0));
    }
    conn.query_drop(INBOX_SQL).await?;
    let database: Option<String> = conn.query_first("SELECT DATABASE()").await?;
    conn.disconnect().await.ok();
    Ok(InboxMigrateReport {
        database: database.unwrap_or_default(),
        tables: existed,
    })
}

/// What `migrate --inbox` did.
#[derive(Debug, Clone)]
pub struct InboxMigrateReport {
    /// The consumer's database.
    pub database: String,
    /// (table, existed before).
    pub tables: Vec<(String, bool)>,
}

impl fmt::Display for InboxMigrateReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (t, existed) in &self.tables {
            let what = if *existed { "up to date" } else { "created" };
            writeln!(f, "{}.{t}: {what}", self.database)?;
        }
        Ok(())
    }
}

/// `prune --inbox`'s options.
#[derive(Debug, Clone)]
pub struct InboxPruneOptions {
    /// The consumer's database (`mysql://…/db`).
    pub database_url: String,
    /// Kafka bootstrap servers of the consumer group.
    pub bootstrap_servers: String,
    /// The consumer name (inbox key).
    pub consumer: String,
    /// The consumer group whose committed offsets bound the delete (default: the consumer
    /// name, as the helpers use it).
    pub group: String,
    /// Retention: rows processed longer ago than this may go.
    pub older_than: Duration,
    /// Rows per DELETE statement.
    pub batch_size: usize,
    /// Pause between two DELETE statements.
    pub pause: Duration,
    /// Count only; delete nothing.
    pub dry_run: bool,
}

/// One (topic, partition) of the inbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionPrune {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// The group's committed offset (`None`: none, so nothing of it is deleted).
    pub committed: Option<i64>,
    /// Rows deleted (or, with `dry_run`, that would be).
    pub deleted: u64,
}

/// What `prune --inbox` did.
#[derive(Debug, Clone)]
pub struct InboxPruneReport {
    /// The consumer.
    pub consumer: String,
    /// The group.
    pub group: String,
    /// Per partition found in the inbox.
    pub partitions: Vec<PartitionPrune>,
    /// Nothing was deleted.
    pub dry_run: bool,
}

impl InboxPruneReport {
    /// Rows deleted (or that would be) in all.
    pub fn deleted(&self) -> u64 {
        self.partitions.iter().map(|p| p.deleted).sum()
    }
}

impl fmt::Display for InboxPruneReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verb = if self.dry_run {
            "would delete"
        } else {
            "deleted"
        };
        for p in &self.partitions {
            match p.committed {
                Some(o) => writeln!(
                    f,
                    "{}[{}]: group {} committed offset {o}: {verb} {} rows",
                    p.topic, p.partition, self.group, p.deleted
                )?,
                None => writeln!(
                    f,
                    "{}[{}]: group {} has no committed offset: kept every row",
                    p.topic, p.partition, self.group
                )?,
            }
        }
        write!(
            f,
            "consumer {}: {verb} {} inbox rows",
            self.consumer,
            self.deleted()
        )
    }
}

/// The group's committed offsets of `parts`, from the group coordinator.
fn committed_offsets(
    bootstrap: &str,
    group: &str,
    parts: &[(String, i32)],
) -> Result<Vec<Option<i64>>, RelayError> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .map_err(|e| RelayError::Kafka(format!("creating a consumer for group {group}: {e}")))?;
    let mut tpl = TopicPartitionList::new();
    for (t, p) in parts {
        tpl.add_partition(t, *p);
    }
    let got = consumer
        .committed_offsets(tpl, Duration::from_secs(30))
        .map_err(|e| {
            RelayError::Kafka(format!("reading group {group}'s committed offsets: {e}"))
        })?;
    Ok(parts
        .iter()
        .map(|(t, p)| {
            got.find_partition(t, *p).and_then(|e| match e.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            })
        })
        .collect())
}

/// Deletes the consumer's inbox rows that are older than the retention and whose records the
/// group has committed past (see the module documentation).
///
/// # Errors
/// [`RelayError::Argument`] for a bad URL or a zero batch size; [`RelayError::Mysql`] and
/// [`RelayError::Kafka`] when a server fails (rows deleted until then stay deleted: each batch
/// is safe on its own).
pub async fn prune_inbox(opts: &InboxPruneOptions) -> Result<InboxPruneReport, RelayError> {
    if opts.batch_size == 0 {
        return Err(RelayError::Argument(
            "--batch-size must be at least 1".into(),
        ));
    }
    let mut conn = connect(&opts.database_url).await?;
    let parts: Vec<(String, i32)> = conn
        .exec(
            format!(
                "SELECT DISTINCT topic, kafka_partition FROM {INBOX_TABLE} WHERE consumer = ? \
                 ORDER BY topic, kafka_partition"
            ),
            (&opts.consumer,),
        )
        .await?;
    let committed = {
        let (b, g, p) = (
            opts.bootstrap_servers.clone(),
            opts.group.clone(),
            parts.clone(),
        );
        tokio::task::spawn_blocking(move || committed_offsets(&b, &g, &p))
            .await
            .map_err(|e| RelayError::Kafka(format!("reading committed offsets: {e}")))??
    };
    let retention_s = opts.older_than.as_secs_f64();
    let mut report = InboxPruneReport {
        consumer: opts.consumer.clone(),
        group: opts.group.clone(),
        partitions: Vec::new(),
        dry_run: opts.dry_run,
    };
    let filter = "consumer = ? AND topic = ? AND kafka_partition = ? AND kafka_offset < ? AND \
                  processed_at < NOW(6) - INTERVAL ? MICROSECOND";
    let retention_us = (retention_s * 1e6) as i64;
    for ((topic, partition), committed) in parts.into_iter().zip(committed) {
        let mut deleted = 0u64;
        if let Some(offset) = committed {
            let params = (&opts.consumer, &topic, partition, offset, retention_us);
            if opts.dry_run {
                let n: Option<u64> = conn
                    .exec_first(
                        format!("SELECT COUNT(*) FROM {INBOX_TABLE} WHERE {filter}"),
                        params,
                    )
                    .await?;
                deleted = n.unwrap_or(0);
            } else {
                loop {
                    conn.exec_drop(
                        format!(
                            "DELETE FROM {INBOX_TABLE} WHERE {filter} LIMIT {}",
                            opts.batch_size
                        ),
                        params,
                    )
                    .await?;
                    let n = conn.affected_rows();
                    deleted += n;
                    if n < opts.batch_size as u64 {
                        break;
                    }
                    tokio::time::sleep(opts.pause).await;
                }
            }
        }
        report.partitions.push(PartitionPrune {
            topic,
            partition,
            committed,
            deleted,
        });
    }
    conn.disconnect().await.ok();
    Ok(report)
}
