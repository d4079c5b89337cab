//! The consumer side's tables (`inbox/CONTRACT.md`): `outbox-relay migrate --inbox` creates them
//! in a consumer's database (and upgrades their keys to byte-exact comparison), `outbox-relay prune --inbox` keeps the inbox small.
//!
//! # The prune rule, and why it never makes a redelivery look new
//! An inbox row (consumer, event_key) is what makes a redelivered record a duplicate. A record
//! can be delivered again while its offset is not committed by the consumer group (a crash
//! before the offset commit), so a row is deleted only when both hold:
//! 1. the group's committed offset of the row's (topic, partition) is past the row's offset
//!    (read once, before deleting, with the Kafka admin protocol's OffsetFetch);
//! 2. the row is older than the retention (`processed_at` before the server's `NOW(6)` minus
//!    `--older-than`), which must be longer than any redelivery the team does on purpose
//!    (dead-letter replay, an offset reset, a republish): docs/src/consumers/inbox.md.
//!
//! Deletes run in batches (`DELETE … LIMIT n`, autocommit: each a short transaction) with a
//! pause between them, so writers of the inbox are never blocked for long.

use std::fmt;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts};

use outbox_relay_core::error::RelayError;

use super::grants::Needed;

/// `migrations/0004_inbox.sql`: the inbox and version tables, idempotent.
pub const INBOX_SQL: &str = include_str!("../../../../migrations/0004_inbox.sql");

/// `migrations/0005_inbox_keys.sql`: key columns compared byte for byte (VARBINARY), for tables
/// an older 0004 created; idempotent.
pub const INBOX_KEYS_SQL: &str = include_str!("../../../../migrations/0005_inbox_keys.sql");

/// `migrations/0006_inbox_parked.sql`: the parked table (records received ahead of their
/// aggregate's next version, `inbox/CONTRACT.md`, "Parked versions"); idempotent.
pub const INBOX_PARKED_SQL: &str = include_str!("../../../../migrations/0006_inbox_parked.sql");

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
    let conn = outbox_relay_core::error::with_timeout(
        Duration::from_secs(30),
        "connecting to the consumer's database",
        Conn::new(opts),
    )
    .await??;
    Ok(conn)
}

/// The inbox tables and their key columns (the primary key's text columns).
pub const INBOX_KEY_COLUMNS: [(&str, &[&str]); 3] = [
    ("outbox_inbox", &["consumer", "event_key"]),
    (
        "outbox_inbox_version",
        &["consumer", "aggregate_type", "aggregate_id"],
    ),
    (
        "outbox_inbox_parked",
        &["consumer", "aggregate_type", "aggregate_id"],
    ),
];

/// The migration that creates inbox table `table`.
pub fn inbox_table_migration(table: &str) -> &'static str {
    if table == "outbox_inbox_parked" {
        "migrations/0006_inbox_parked.sql"
    } else {
        "migrations/0004_inbox.sql"
    }
}

/// One key column as `information_schema.COLUMNS` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyColumn {
    /// `COLUMN_NAME`.
    pub name: String,
    /// `COLUMN_TYPE` (`varchar(255)`, `varbinary(1020)`).
    pub column_type: String,
    /// `COLLATION_NAME` (`None` for binary types).
    pub collation: Option<String>,
}

impl KeyColumn {
    /// Whether values are compared byte for byte: a binary string type (`VARBINARY`, `BLOB`;
    /// not `BINARY(n)`, which pads with zero bytes) or a NO PAD binary collation
    /// (`utf8mb4_nopad_bin`, `utf8mb4_0900_bin`).
    pub fn byte_exact(&self) -> bool {
        let t = self.column_type.to_ascii_lowercase();
        match self.collation.as_deref() {
            None | Some("binary") => t.starts_with("varbinary") || t.ends_with("blob"),
            Some(c) => c.ends_with("_nopad_bin") || c.ends_with("_0900_bin"),
        }
    }

    /// What the column's comparison merges, for messages.
    pub fn describe(&self) -> String {
        match self.collation.as_deref() {
            _ if self.byte_exact() => format!("{} {} (byte for byte)", self.name, self.column_type),
            Some(c) if c.ends_with("_ci") || c.contains("_ai_") => format!(
                "{} {} in collation {c} (case- and accent-insensitive: evt-A = evt-a, café = \
                 cafe; and k = 'k ')",
                self.name, self.column_type
            ),
            Some(c) if c.ends_with("_bin") => format!(
                "{} {} in collation {c} (PAD SPACE: k = 'k ')",
                self.name, self.column_type
            ),
            Some(c) => format!(
                "{} {} in collation {c} (not byte for byte)",
                self.name, self.column_type
            ),
            None => format!("{} {} (pads values)", self.name, self.column_type),
        }
    }
}

/// The key columns of `table` in the current database (empty: no such table).
pub async fn key_columns(
    conn: &mut Conn,
    table: &str,
    names: &[&str],
) -> Result<Vec<KeyColumn>, RelayError> {
    let rows: Vec<(String, String, Option<String>)> = conn
        .exec(
            "SELECT COLUMN_NAME, COLUMN_TYPE, COLLATION_NAME FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION",
            (table,),
        )
        .await?;
    Ok(rows
        .into_iter()
        .filter(|(n, _, _)| names.iter().any(|k| k.eq_ignore_ascii_case(n)))
        .map(|(name, column_type, collation)| KeyColumn {
            name,
            column_type,
            collation,
        })
        .collect())
}

/// A warning for an inbox table (`database.table`) whose key columns are not all compared byte
/// for byte, naming the fix; `None` when they are (or the table is missing).
pub fn evaluate_inbox_keys(
    database: &str,
    table: &str,
    cols: &[KeyColumn],
) -> Option<outbox_relay_mysql::preflight::Check> {
    let loose: Vec<String> = cols
        .iter()
        .filter(|c| !c.byte_exact())
        .map(KeyColumn::describe)
        .collect();
    (!loose.is_empty()).then(|| {
        outbox_relay_mysql::preflight::Check::not_met(
            outbox_relay_mysql::preflight::Level::Warn,
            format!("inbox table {database}.{table} (key comparison)"),
            "keys compared byte for byte (VARBINARY key columns, migrations/0005_inbox_keys.sql)",
            format!(
                "{}: events whose keys differ only in case, accent or trailing spaces count as \
                 one, and the second one's effect never happens",
                loose.join("; ")
            ),
            format!(
                "outbox-relay migrate --inbox --database-url mysql://…/{database} (applies \
                 migrations/0005_inbox_keys.sql; it copies the table: prune first, run it in a \
                 quiet period)"
            ),
        )
    })
}

/// `check --inbox-url URL`: the inbox tables of a consumer's database (the inbox, version and
/// parked tables), one [`Check`] each (OK, a warning when its keys are not compared byte for
/// byte or it is missing, a failure when the database cannot be read).
///
/// [`Check`]: outbox_relay_mysql::preflight::Check
pub async fn inbox_checks(url: &str) -> Vec<outbox_relay_mysql::preflight::Check> {
    use outbox_relay_mysql::preflight::{Check, Level};
    let redacted = outbox_relay_core::error::redact_url(url);
    let mut out = Vec::new();
    let result = async {
        let mut conn = connect(url).await?;
        let database: Option<String> = conn.query_first("SELECT DATABASE()").await?;
        let database = database.unwrap_or_default();
        for (t, keys) in INBOX_KEY_COLUMNS {
            let cols = key_columns(&mut conn, t, keys).await?;
            out.push(if cols.is_empty() {
                Check::not_met(
                    Level::Warn,
                    format!("inbox table {database}.{t}"),
                    format!("the table ({})", inbox_table_migration(t)),
                    if t == "outbox_inbox_parked" {
                        "no such table (a helper with gap policy park cannot park a record \
                         ahead of its version)"
                    } else {
                        "no such table"
                    },
                    format!("outbox-relay migrate --inbox --database-url {redacted}"),
                )
            } else {
                evaluate_inbox_keys(&database, t, &cols).unwrap_or_else(|| {
                    Check::ok(
                        format!("inbox table {database}.{t} (key comparison)"),
                        "byte for byte",
                    )
                })
            });
        }
        conn.disconnect().await.ok();
        Ok::<_, RelayError>(())
    }
    .await;
    if let Err(e) = result {
        out.push(Check::not_met(
            Level::Fail,
            format!("inbox database {redacted}"),
            "a connection and information_schema",
            e.to_string(),
            "check --inbox-url (host, port, user, password, database)",
        ));
    }
    out
}

/// What `migrate --inbox` found and did to one table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InboxTableOutcome {
    /// It did not exist and was created.
    Created,
    /// Its keys were compared loosely (these columns, described) and are now byte for byte.
    Upgraded(Vec<String>),
    /// It was up to date.
    UpToDate,
}

/// Creates `outbox_inbox` and `outbox_inbox_version` in the database of `url` when missing
/// (`migrations/0004_inbox.sql`), makes existing tables compare their keys byte for byte
/// (`migrations/0005_inbox_keys.sql`) and creates `outbox_inbox_parked` when missing
/// (`migrations/0006_inbox_parked.sql`). Reports what it did per table, and warns for a table
/// whose keys are still not byte for byte afterwards.
///
/// # Errors
/// As [`connect`]; server errors (a missing CREATE or ALTER privilege as
/// [`RelayError::Prerequisite`], naming the GRANT).
pub async fn migrate_inbox(url: &str) -> Result<InboxMigrateReport, RelayError> {
    let mut conn = connect(url).await?;
    let database: Option<String> = conn.query_first("SELECT DATABASE()").await?;
    let database = database.unwrap_or_default();
    let mut before = Vec::new();
    for (t, keys) in INBOX_KEY_COLUMNS {
        before.push(key_columns(&mut conn, t, keys).await?);
    }
    let needed = Needed {
        privileges: "CREATE, ALTER".into(),
        on: format!("{}.*", super::quote_ident(&database)),
        purpose: format!("to create and upgrade the inbox tables of {database}"),
        statement: "CREATE TABLE IF NOT EXISTS outbox_inbox (…) (migrations/0004_inbox.sql, \
                    then 0005_inbox_keys.sql and 0006_inbox_parked.sql)"
            .into(),
        instead: "give --database-url the URL of a user that may create and alter tables in \
                  that database (the consumers themselves need no DDL privilege)"
            .into(),
    };
    for sql in [INBOX_SQL, INBOX_KEYS_SQL, INBOX_PARKED_SQL] {
        if let Err(e) = conn.query_drop(sql).await {
            return Err(needed.explain(&mut conn, e).await);
        }
    }
    let mut report = InboxMigrateReport {
        database: database.clone(),
        tables: Vec::new(),
        warnings: Vec::new(),
    };
    for ((t, keys), before) in INBOX_KEY_COLUMNS.into_iter().zip(before) {
        let after = key_columns(&mut conn, t, keys).await?;
        let outcome = if before.is_empty() {
            InboxTableOutcome::Created
        } else {
            let upgraded: Vec<String> = before
                .iter()
                .filter(|b| !b.byte_exact())
                .filter(|b| after.iter().any(|a| a.name == b.name && a.byte_exact()))
                .map(KeyColumn::describe)
                .collect();
            if upgraded.is_empty() {
                InboxTableOutcome::UpToDate
            } else {
                InboxTableOutcome::Upgraded(upgraded)
            }
        };
        report.tables.push((t.to_owned(), outcome));
        report
            .warnings
            .extend(evaluate_inbox_keys(&database, t, &after));
    }
    conn.disconnect().await.ok();
    Ok(report)
}

/// What `migrate --inbox` did.
#[derive(Debug, Clone)]
pub struct InboxMigrateReport {
    /// The consumer's database.
    pub database: String,
    /// (table, what happened).
    pub tables: Vec<(String, InboxTableOutcome)>,
    /// Tables whose keys are still not compared byte for byte.
    pub warnings: Vec<outbox_relay_mysql::preflight::Check>,
}

impl fmt::Display for InboxMigrateReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (t, outcome) in &self.tables {
            match outcome {
                InboxTableOutcome::Created => {
                    writeln!(f, "{}.{t}: created (keys byte for byte)", self.database)?
                }
                InboxTableOutcome::UpToDate => writeln!(f, "{}.{t}: up to date", self.database)?,
                InboxTableOutcome::Upgraded(was) => writeln!(
                    f,
                    "{}.{t}: upgraded: keys now compared byte for byte (VARBINARY, \
                     migrations/0005_inbox_keys.sql); they were {}. Events merged before now \
                     stay merged",
                    self.database,
                    was.join("; ")
                )?,
            }
        }
        for w in &self.warnings {
            writeln!(
                f,
                "WARN  {}: expected {}, found {}",
                w.name, w.expected, w.found
            )?;
            writeln!(f, "      fix: {}", w.fix)?;
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
    /// Retention: rows processed longer ago than this may go (topics without their own).
    pub older_than: Duration,
    /// Topics with their own retention (`--topic-retention TOPIC=AGE`).
    pub topic_retention: std::collections::BTreeMap<String, Duration>,
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
    /// The retention applied to its rows.
    pub retention: Duration,
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
                    "{}[{}]: group {} committed offset {o}: {verb} {} rows processed over {} s ago",
                    p.topic,
                    p.partition,
                    self.group,
                    p.deleted,
                    p.retention.as_secs()
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
        tokio::task::spawn_blocking(move || {
            outbox_relay_kafka::reader::group_committed_offsets(&b, &g, &p, Duration::from_secs(30))
        })
        .await
        .map_err(|e| RelayError::kafka(format!("reading committed offsets: {e}")))??
    };
    let mut report = InboxPruneReport {
        consumer: opts.consumer.clone(),
        group: opts.group.clone(),
        partitions: Vec::new(),
        dry_run: opts.dry_run,
    };
    let filter = "consumer = ? AND topic = ? AND kafka_partition = ? AND kafka_offset < ? AND \
                  processed_at < NOW(6) - INTERVAL ? MICROSECOND";
    for ((topic, partition), committed) in parts.into_iter().zip(committed) {
        let retention = opts
            .topic_retention
            .get(&topic)
            .copied()
            .unwrap_or(opts.older_than);
        let retention_us = i64::try_from(retention.as_micros()).unwrap_or(i64::MAX);
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
                    let delete = format!(
                        "DELETE FROM {INBOX_TABLE} WHERE {filter} LIMIT {}",
                        opts.batch_size
                    );
                    if let Err(e) = conn.exec_drop(&delete, params).await {
                        let database: Option<String> =
                            conn.query_first("SELECT DATABASE()").await.ok().flatten();
                        let database = database.unwrap_or_default();
                        let needed = Needed {
                            privileges: "DELETE".into(),
                            on: format!(
                                "{}.{}",
                                super::quote_ident(&database),
                                super::quote_ident(INBOX_TABLE)
                            ),
                            purpose: format!("to delete old inbox rows of {database}"),
                            statement: format!(
                                "DELETE FROM {INBOX_TABLE} WHERE consumer = ? AND … LIMIT {}",
                                opts.batch_size
                            ),
                            instead: "give --database-url the URL of a user that may delete them"
                                .into(),
                        };
                        return Err(needed.explain(&mut conn, e).await);
                    }
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
            retention,
            deleted,
        });
    }
    conn.disconnect().await.ok();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(name: &str, column_type: &str, collation: Option<&str>) -> KeyColumn {
        KeyColumn {
            name: name.into(),
            column_type: column_type.into(),
            collation: collation.map(Into::into),
        }
    }

    #[test]
    fn only_bytes_or_no_pad_binary_collations_compare_byte_for_byte() {
        assert!(col("event_key", "varbinary(1020)", None).byte_exact());
        assert!(col("event_key", "varchar(255)", Some("utf8mb4_nopad_bin")).byte_exact());
        assert!(col("event_key", "varchar(255)", Some("utf8mb4_0900_bin")).byte_exact());
        // PAD SPACE, case- or accent-insensitive, zero-padded: not byte for byte.
        assert!(!col("event_key", "varchar(255)", Some("utf8mb4_bin")).byte_exact());
        assert!(!col("event_key", "varchar(255)", Some("utf8mb4_general_ci")).byte_exact());
        assert!(!col("event_key", "varchar(255)", Some("utf8mb4_0900_ai_ci")).byte_exact());
        assert!(!col("event_key", "varchar(255)", Some("utf8mb4_uca1400_ai_ci")).byte_exact());
        assert!(!col("event_key", "binary(16)", None).byte_exact());
        assert!(col("event_key", "varchar(255)", Some("utf8mb4_bin"))
            .describe()
            .contains("PAD SPACE"));
    }

    #[test]
    fn a_loose_inbox_table_is_a_warning_naming_the_migration() {
        let cols = [
            col("consumer", "varbinary(764)", None),
            col("event_key", "varchar(255)", Some("utf8mb4_general_ci")),
        ];
        let check = evaluate_inbox_keys("shop", "outbox_inbox", &cols).expect("a warning");
        assert_eq!(check.level, outbox_relay_mysql::preflight::Level::Warn);
        assert!(check
            .found
            .contains("event_key varchar(255) in collation utf8mb4_general_ci"));
        assert!(!check.found.contains("consumer"), "{}", check.found);
        assert!(
            check.fix.contains("outbox-relay migrate --inbox"),
            "{}",
            check.fix
        );
        let exact = [
            col("consumer", "varbinary(764)", None),
            col("event_key", "varbinary(1020)", None),
        ];
        assert!(evaluate_inbox_keys("shop", "outbox_inbox", &exact).is_none());
    }
}
