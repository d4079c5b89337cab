//! `outbox-relay prune --older-than 7d`: deletes outbox rows that are old AND already relayed.
//!
//! # The rule, and why it never deletes an unrelayed row
//! For each outbox table, in chunks:
//! 1. Select the ids of rows with `created_at` older than the retention (the server's
//!    `UTC_TIMESTAMP()` minus `--older-than`; DATETIME columns compared in the mapping's
//!    `datetime_time_zone`), in id order.
//! 2. Then read the server's binlog end `S` (`SHOW MASTER STATUS`).
//! 3. Wait (up to `--max-wait-ms`) until the stored checkpoint `P` covers `S`: `P >= S`, or
//!    every event between `P` and `S` (`SHOW BINLOG EVENTS`) inserts nothing into an outbox
//!    table (no `Write_rows`/`Update_rows` on an outbox table's table map, no statement naming
//!    one, no `XA COMMIT`, no compressed transaction payload whose content cannot be seen).
//! 4. Delete those ids (`DELETE … WHERE id IN (…) AND created_at < cutoff`) in batches of
//!    `--batch-size`, pausing `--pause-ms` between batches.
//!
//! A row the SELECT saw was committed; a transaction is written to the binlog before InnoDB
//! makes it visible (the binlog is the two-phase-commit coordinator), so the row's INSERT ends
//! before `S`. When the checkpoint covers `S`, that INSERT is before the checkpoint, which by
//! the relay's contract means Kafka acknowledged its record. Rows committed after the SELECT
//! are not in the id list, so they are never deleted in that chunk. A checkpoint with
//! `rows_acked` covers the transaction after it when all of that transaction's outbox rows are
//! among them (`scan::coverage`, read through a binlog dump; when it cannot be read, only the
//! checkpoint's position counts). The relay ignores the DELETEs.

use std::fmt;
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Params, Row, Value};

use super::grants::{with_other_mysql_user, Needed};
use super::read_state_row;
use outbox_relay_core::config::{RelayConfig, TableName};
use outbox_relay_core::error::RelayError;
use outbox_relay_core::outbox::mapping::TableMapping;
use outbox_relay_core::position::BinlogPosition;
use outbox_relay_mysql::preflight;

/// Most events between the checkpoint and the binlog end that are inspected; beyond that the
/// checkpoint counts as behind.
const MAX_EVENTS_INSPECTED: usize = 20_000;

/// `prune`'s options.
#[derive(Debug, Clone)]
pub struct PruneOptions {
    /// Rows with `created_at` older than this are candidates.
    pub older_than: Duration,
    /// Rows per DELETE statement.
    pub batch_size: usize,
    /// Pause between two DELETE statements.
    pub pause: Duration,
    /// Count only; delete nothing.
    pub dry_run: bool,
    /// Longest wait for the checkpoint to cover the rows selected.
    pub max_wait: Duration,
}

/// Parses a retention such as `7d`, `12h`, `30m`, `90s` (one number and one unit: s, m, h, d,
/// w).
///
/// # Errors
/// A message naming the expected form.
pub fn parse_retention(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{text:?} is not a retention like 7d, 12h, 30m or 90s"))?;
    let secs = match unit.trim() {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        _ => {
            return Err(format!(
                "{text:?} is not a retention like 7d, 12h, 30m or 90s"
            ))
        }
    };
    Ok(Duration::from_secs(n.saturating_mul(secs)))
}

/// Parses `TOPIC=AGE` (`prune --inbox --topic-retention orders=30d`): a topic's own inbox
/// retention, the age as [`parse_retention`] takes it. The topic is everything before the last
/// `=` (topic names have no `=`).
///
/// # Errors
/// No `=`, an empty topic, or an age `parse_retention` refuses: the message says which.
pub fn parse_topic_retention(text: &str) -> Result<(String, Duration), String> {
    let Some((topic, age)) = text.rsplit_once('=') else {
        return Err(format!(
            "{text:?} is not TOPIC=AGE (for example orders=30d)"
        ));
    };
    let topic = topic.trim();
    if topic.is_empty() {
        return Err(format!(
            "{text:?} names no topic before '=' (for example orders=30d)"
        ));
    }
    let age = parse_retention(age).map_err(|e| format!("{text:?}: {e}"))?;
    Ok((topic.to_owned(), age))
}

/// What `prune` did per table.
#[derive(Debug, Clone)]
pub struct PruneReport {
    /// (`table`, cutoff as compared, rows deleted — or, in a dry run, that would be).
    pub tables: Vec<(TableName, String, u64)>,
    /// A dry run.
    pub dry_run: bool,
}

/// Prunes every outbox table of `config` (a pattern's: each table that matches it now).
///
/// # Errors
/// [`RelayError::Config`] when a table's mapping has no `created_at`; [`RelayError::Prerequisite`]
/// without a checkpoint of this server; [`RelayError::Mysql`] when the checkpoint does not cover
/// the selected rows within `max_wait`, or on server errors.
pub async fn prune(config: &RelayConfig, opts: &PruneOptions) -> Result<PruneReport, RelayError> {
    let mappings = config.table_mappings()?;
    for m in &mappings {
        if m.columns.created_at.is_empty() {
            return Err(RelayError::Config(format!(
                "outbox table {} has no created_at column mapped (outbox.columns.created_at = \
                 \"\"): prune tells old rows by it. Map the table's creation-time column",
                m.table
            )));
        }
    }
    if opts.batch_size == 0 {
        return Err(RelayError::Argument(
            "--batch-size must be at least 1".into(),
        ));
    }
    let table = config.checkpoint_table()?;
    let mut conn = super::connect(config).await?;
    let server = preflight::server_identity(&mut conn).await?;
    // Patterns (`tenant_*.outbox`) stand for the tables that match them now.
    let mappings = preflight::resolve_mappings(&mut conn, &mappings).await?;
    let mut report = PruneReport {
        tables: Vec::new(),
        dry_run: opts.dry_run,
    };
    let ctx = Ctx {
        config,
        table,
        server_id: server.server_id,
        server: &server,
        flavor: server.flavor,
        mappings: &mappings,
    };
    for m in &mappings {
        let (cutoff, n) = prune_table(&mut conn, &ctx, m, opts).await?;
        report.tables.push(((*m.table).clone(), cutoff, n));
    }
    let _ = conn.disconnect().await;
    Ok(report)
}

struct Ctx<'a> {
    config: &'a RelayConfig,
    table: TableName,
    server_id: u32,
    server: &'a preflight::ServerInfo,
    flavor: outbox_relay_mysql::server::Flavor,
    mappings: &'a [TableMapping],
}

async fn prune_table(
    conn: &mut Conn,
    ctx: &Ctx<'_>,
    m: &TableMapping,
    opts: &PruneOptions,
) -> Result<(String, u64), RelayError> {
    let data_type = super::created_at_type(conn, m).await?;
    let Some(data_type) = data_type else {
        return Err(RelayError::Prerequisite {
            setting: format!("outbox table {}", m.table),
            expected: format!(
                "a column {:?} (outbox.columns.created_at)",
                m.columns.created_at
            ),
            found: "no such table or column".into(),
            fix: "run `outbox-relay check` and fix the table or the mapping".into(),
        });
    };
    let now: Option<String> = conn.query_first("SELECT UTC_TIMESTAMP(6)").await?;
    let now = now
        .and_then(|n| chrono::NaiveDateTime::parse_from_str(&n, "%Y-%m-%d %H:%M:%S%.f").ok())
        .ok_or_else(|| RelayError::mysql("UTC_TIMESTAMP(6) returned no time"))?;
    let older = chrono::Duration::from_std(opts.older_than)
        .map_err(|_| RelayError::Argument("--older-than is too large".into()))?;
    let cutoff_utc = now - older;
    // The connection's zone is UTC (super::connect): TIMESTAMP compares in UTC; DATETIME holds
    // wall-clock time in the mapping's zone.
    let cutoff = if data_type == "timestamp" {
        cutoff_utc
    } else {
        cutoff_utc
            .and_utc()
            .with_timezone(&m.datetime_time_zone)
            .naive_local()
    };
    let cutoff = cutoff.format("%Y-%m-%d %H:%M:%S%.6f").to_string();
    let (t, id, created) = (
        m.table.quoted(),
        super::quote_ident(&m.columns.id),
        super::quote_ident(&m.columns.created_at),
    );
    let chunk = opts.batch_size.saturating_mul(20).clamp(1, 100_000);
    let mut last: Option<Value> = None;
    let mut total = 0u64;
    loop {
        let rows: Vec<Row> = match &last {
            None => {
                conn.exec(
                    format!("SELECT {id} FROM {t} WHERE {created} < ? ORDER BY {id} LIMIT {chunk}"),
                    (&cutoff,),
                )
                .await?
            }
            Some(after) => {
                conn.exec(
                    format!(
                        "SELECT {id} FROM {t} WHERE {created} < ? AND {id} > ? ORDER BY {id} \
                         LIMIT {chunk}"
                    ),
                    (&cutoff, after.clone()),
                )
                .await?
            }
        };
        let ids: Vec<Value> = rows
            .into_iter()
            .filter_map(|mut r| r.take::<Value, _>(0))
            .collect();
        let Some(max) = ids.last().cloned() else {
            break;
        };
        let (end, _) = preflight::current_position(conn, ctx.flavor).await?;
        wait_covered(conn, ctx, &end, opts.max_wait).await?;
        if opts.dry_run {
            total += ids.len() as u64;
        } else {
            for (i, batch) in ids.chunks(opts.batch_size).enumerate() {
                if i > 0 && !opts.pause.is_zero() {
                    tokio::time::sleep(opts.pause).await;
                }
                let marks = vec!["?"; batch.len()].join(", ");
                let mut params = batch.to_vec();
                params.push(Value::from(cutoff.as_str()));
                let delete = format!("DELETE FROM {t} WHERE {id} IN ({marks}) AND {created} < ?");
                if let Err(e) = conn.exec_drop(&delete, Params::Positional(params)).await {
                    let needed = Needed {
                        privileges: "DELETE".into(),
                        on: t.clone(),
                        purpose: format!("to delete relayed rows of {}", m.table),
                        statement: format!("DELETE FROM {t} WHERE {id} IN (…) AND {created} < ?"),
                        instead: with_other_mysql_user(
                            ctx.config,
                            &format!("delete rows of {}", m.table),
                        ),
                    };
                    return Err(needed.explain(conn, e).await);
                }
                total += conn.affected_rows();
            }
            if !opts.pause.is_zero() {
                tokio::time::sleep(opts.pause).await;
            }
        }
        last = Some(max);
    }
    Ok((cutoff, total))
}

/// Waits until the stored checkpoint covers `end` (see the module docs).
async fn wait_covered(
    conn: &mut Conn,
    ctx: &Ctx<'_>,
    end: &BinlogPosition,
    max_wait: Duration,
) -> Result<(), RelayError> {
    let started = Instant::now();
    let mut covered: Option<(
        outbox_relay_core::state::checkpoint::Checkpoint,
        BinlogPosition,
    )> = None;
    loop {
        let row = read_state_row(conn, &ctx.table, &ctx.config.connector_name).await?;
        let Some(stored) = row.and_then(|r| r.checkpoint) else {
            return Err(RelayError::Prerequisite {
                setting: format!("checkpoint of connector {:?}", ctx.config.connector_name),
                expected: "a stored checkpoint (rows are deleted only once relayed)".into(),
                found: "none".into(),
                fix: "start the relay (`outbox-relay run`) and let it store a checkpoint".into(),
            });
        };
        let source = stored.source_server_id;
        if source != ctx.server_id {
            return Err(RelayError::Prerequisite {
                setting: format!("checkpoint of connector {:?}", ctx.config.connector_name),
                expected: format!("a checkpoint of this server (server_id {})", ctx.server_id),
                found: format!("one written for server_id {source}"),
                fix: "let the relay run against this server until it stores a checkpoint here"
                    .into(),
            });
        }
        // Rows of the transaction after the checkpoint that rows_acked covers are relayed
        // (scan::coverage, the rule trace and status use too); read again only when the
        // checkpoint moved.
        if covered.as_ref().is_none_or(|(c, _)| *c != stored) {
            let through = super::scan::coverage(ctx.config, conn, ctx.server, &stored, end)
                .await
                .map_or_else(|_| stored.position.clone(), |c| c.through);
            covered = Some((stored.clone(), through));
        }
        let cp = covered
            .as_ref()
            .map_or_else(|| stored.position.clone(), |(_, t)| t.clone());
        let why = match cp.partial_cmp(end) {
            Some(o) if o.is_ge() => return Ok(()),
            Some(_) => match outbox_insert_between(conn, ctx, &cp, end).await? {
                None => return Ok(()),
                Some(why) => why,
            },
            None => format!("the checkpoint {cp} is in another binlog sequence than {end}"),
        };
        if started.elapsed() >= max_wait {
            return Err(RelayError::mysql(format!(
                "the relay's checkpoint {cp} does not cover the binlog up to {end} after {} ms \
                 ({why}); rows it may not have relayed are kept. Check that the relay runs \
                 (`outbox-relay status`) and run prune again",
                max_wait.as_millis()
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `None` when no event from `from` to `to` may insert an outbox row; else why not.
async fn outbox_insert_between(
    conn: &mut Conn,
    ctx: &Ctx<'_>,
    from: &BinlogPosition,
    to: &BinlogPosition,
) -> Result<Option<String>, RelayError> {
    let names: Vec<String> = ctx
        .mappings
        .iter()
        .map(|m| format!("{}.{}", m.table.database, m.table.table).to_ascii_lowercase())
        .collect();
    let mut outbox_ids: Vec<u64> = Vec::new();
    super::first_event_between(conn, from, to, MAX_EVENTS_INSPECTED, |kind, info| {
        classify(kind, info, &names, &mut outbox_ids)
    })
    .await
}

/// Whether one `SHOW BINLOG EVENTS` row (type `kind`, `info`) may insert an outbox row (the
/// reason), tracking the table ids of outbox table maps in `outbox_ids`.
fn classify(kind: &str, info: &str, names: &[String], outbox_ids: &mut Vec<u64>) -> Option<String> {
    let table_id = |info: &str| -> Option<u64> {
        let rest = info.trim_start().strip_prefix("table_id:")?;
        rest.split_whitespace().next()?.parse().ok()
    };
    let lower = info.to_ascii_lowercase();
    if kind.starts_with("Table_map") {
        let is_outbox = names.iter().any(|n| {
            lower.contains(&format!("({n})"))
                || lower.contains(&format!("(`{}`)", n.replace('.', "`.`")))
        });
        if let (true, Some(id)) = (is_outbox, table_id(info)) {
            outbox_ids.push(id);
        }
        return None;
    }
    if kind.starts_with("Write_rows") || kind.starts_with("Update_rows") {
        return table_id(info)
            .filter(|id| outbox_ids.contains(id))
            .map(|_| format!("a {kind} event on an outbox table"));
    }
    if kind.starts_with("Transaction_payload") {
        return Some("a compressed transaction".into());
    }
    if kind.starts_with("XA_prepare") || lower.trim_start().starts_with("xa commit") {
        return Some("an XA commit".into());
    }
    if kind.starts_with("Query") {
        let table_names = names
            .iter()
            .filter_map(|n| n.rsplit_once('.').map(|(_, t)| t));
        let stmt = lower.trim_start();
        let is_dml = ["insert", "replace", "update", "load"]
            .iter()
            .any(|p| stmt.starts_with(p));
        if is_dml && table_names.into_iter().any(|t| stmt.contains(t)) {
            return Some("a statement on an outbox table".into());
        }
    }
    None
}

impl fmt::Display for PruneReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (table, cutoff, n)) in self.tables.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            if self.dry_run {
                write!(
                    f,
                    "{table}: {n} rows would be deleted (created_at < {cutoff}, already relayed)"
                )?;
            } else {
                write!(
                    f,
                    "{table}: deleted {n} rows (created_at < {cutoff}, already relayed)"
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_retentions_parse() {
        assert_eq!(
            parse_topic_retention("orders=30d"),
            Ok(("orders".to_owned(), Duration::from_secs(30 * 86_400)))
        );
        assert_eq!(
            parse_topic_retention("shop.notifications=1d"),
            Ok(("shop.notifications".to_owned(), Duration::from_secs(86_400)))
        );
        for bad in ["orders", "=7d", "orders=", "orders=7x"] {
            let err = parse_topic_retention(bad).expect_err(bad);
            assert!(err.contains(bad), "{bad}: {err}");
        }
    }

    #[test]
    fn retentions_parse() {
        assert_eq!(parse_retention("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_retention("12h"), Ok(Duration::from_secs(43_200)));
        assert_eq!(parse_retention("30m"), Ok(Duration::from_secs(1_800)));
        assert_eq!(parse_retention("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_retention("2w"), Ok(Duration::from_secs(1_209_600)));
        for bad in ["", "7", "d", "7 days", "-1d", "1.5h"] {
            assert!(parse_retention(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn only_inserts_into_outbox_tables_block_pruning() {
        let names = vec!["shop.outbox".to_owned()];
        let mut ids = Vec::new();
        let mut c = |k: &str, i: &str| classify(k, i, &names, &mut ids);
        // MariaDB 10.11 SHOW BINLOG EVENTS Info texts.
        assert_eq!(
            c("Table_map", "table_id: 41 (shop.outbox_relay_checkpoint)"),
            None
        );
        assert_eq!(c("Update_rows_v1", "table_id: 41 flags: STMT_END_F"), None);
        assert_eq!(c("Table_map", "table_id: 42 (shop.outbox)"), None);
        assert_eq!(c("Delete_rows_v1", "table_id: 42 flags: STMT_END_F"), None);
        assert!(c("Write_rows_v1", "table_id: 42 flags: STMT_END_F").is_some());
        assert_eq!(c("Query", "BEGIN"), None);
        assert_eq!(c("Query", "COMMIT"), None);
        assert_eq!(c("Xid", "COMMIT /* xid=12 */"), None);
        assert!(c("Query", "XA COMMIT X'31',X'',1").is_some());
        assert!(c("Query", "INSERT INTO outbox (a) VALUES (1)").is_some());
        assert_eq!(c("Query", "INSERT INTO other (a) VALUES (1)"), None);
        assert!(c(
            "Transaction_payload",
            "compression='ZSTD', decompressed_size=179 bytes"
        )
        .is_some());
    }
}
