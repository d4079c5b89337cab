//! `outbox-relay check`: every prerequisite of `run`, one [`Check`] each, with the exact fix for
//! each failure. The evaluation of server values is in pure functions (unit-tested on values);
//! [`check`] gathers the values.

use std::fmt;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Pool, Row};

use super::{binary_logs, read_state_row, StateRow};
use outbox_relay_core::config::{Delivery, RelayConfig, ResumeMode};
use outbox_relay_core::error::RelayError;
use outbox_relay_core::outbox::mapping::TableMapping;
use outbox_relay_kafka::admin::{Admin, MetadataError};
use outbox_relay_kafka::sink::{batch_hazard, ProducerLimits, RECORD_BATCH_OVERHEAD};
use outbox_relay_mysql::binlog::source::report_host;
use outbox_relay_mysql::preflight::{self, Check, Level};
use outbox_relay_mysql::server::Flavor;
use outbox_relay_mysql::state::store::MysqlCheckpointStore;

/// How long the Kafka checks wait for the brokers.
const KAFKA_TIMEOUT: Duration = Duration::from_secs(10);

/// Every check, in order.
#[derive(Debug, Clone, Default)]
pub struct CheckReport {
    /// The checks.
    pub checks: Vec<Check>,
}

impl CheckReport {
    /// `true` when no check failed.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.level != Level::Fail)
    }
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in &self.checks {
            match c.level {
                Level::Ok => writeln!(f, "OK    {}: {}", c.name, c.found)?,
                _ => {
                    writeln!(
                        f,
                        "{:<5} {}: expected {}, found {}",
                        c.level.as_str(),
                        c.name,
                        c.expected,
                        c.found
                    )?;
                    writeln!(f, "      fix: {}", c.fix)?;
                }
            }
        }
        let count = |l: Level| self.checks.iter().filter(|c| c.level == l).count();
        write!(
            f,
            "{} OK, {} WARN, {} FAIL",
            count(Level::Ok),
            count(Level::Warn),
            count(Level::Fail)
        )
    }
}

/// Runs every check against `config`'s server and brokers.
pub async fn check(config: &RelayConfig) -> CheckReport {
    let mut report = CheckReport::default();
    // Whether an instance of the connector runs (holds the lease); unknown without MySQL.
    let mut running = None;
    match super::connect(config).await {
        Ok(mut conn) => {
            if let Err(e) = mysql_checks(config, &mut conn, &mut report.checks).await {
                report.checks.push(error_check("MySQL checks", &e));
            }
            if let Ok(table) = config.checkpoint_table() {
                running = super::lease_holder(&mut conn, &table, &config.connector_name)
                    .await
                    .ok()
                    .map(|h| h.is_some());
            }
            let _ = conn.disconnect().await;
        }
        Err(e) => report.checks.push(Check::not_met(
            Level::Fail,
            "MySQL connection",
            format!(
                "a connection to {}",
                outbox_relay_core::error::redact_url(&config.mysql.url)
            ),
            e.to_string(),
            "check mysql.url (host, port, user, password) and that the server runs; the MySQL \
             checks were skipped",
        )),
    }
    kafka_checks(config, running, &mut report.checks).await;
    report
}

fn error_check(name: &str, e: &RelayError) -> Check {
    match e {
        RelayError::Prerequisite {
            setting,
            expected,
            found,
            fix,
        } => Check::not_met(
            Level::Fail,
            setting.clone(),
            expected.clone(),
            found.clone(),
            fix.clone(),
        ),
        _ => Check::not_met(
            Level::Fail,
            name,
            "an answer",
            e.to_string(),
            "see the error; the remaining checks of this group were skipped",
        ),
    }
}

async fn global_vars(conn: &mut Conn, names: &[&str]) -> Result<Vec<(String, String)>, RelayError> {
    let list = names
        .iter()
        .map(|n| format!("'{n}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let rows: Vec<Row> = conn
        .query(format!(
            "SHOW GLOBAL VARIABLES WHERE Variable_name IN ({list})"
        ))
        .await?;
    Ok(rows
        .into_iter()
        .filter_map(|r| mysql_async::from_row_opt::<(String, String)>(r).ok())
        .collect())
}

fn var<'a>(vars: &'a [(String, String)], name: &str) -> Option<&'a str> {
    vars.iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

async fn mysql_checks(
    config: &RelayConfig,
    conn: &mut Conn,
    out: &mut Vec<Check>,
) -> Result<(), RelayError> {
    let server = preflight::server_identity(conn).await?;
    out.push(Check::ok(
        "MySQL connection",
        format!("{} (server_id {})", server.version, server.server_id),
    ));
    let vars = preflight::binlog_variables(conn).await?;
    let replica = preflight::is_replica(conn, server.flavor).await;
    out.extend(preflight::evaluate_binlog_settings(
        server.flavor,
        &vars,
        replica,
        preflight::LAYOUT_TRACKING,
    ));
    if !replica {
        out.push(Check::ok(
            "log_slave_updates",
            "not needed: the server is not a replica",
        ));
    }
    out.push(match preflight::list_replicas(conn, server.flavor).await {
        Ok((replicas, statement)) => preflight::evaluate_server_id(
            &server,
            config.mysql.server_id,
            &replicas,
            &report_host(&config.connector_name),
            statement,
        ),
        Err(e) => Check::not_met(
            Level::Warn,
            "mysql.server_id",
            "a server_id no other replica uses (checked with SHOW SLAVE HOSTS / SHOW REPLICAS)",
            format!(
                "cannot list the replicas: {}",
                outbox_relay_core::error::redact_error(&e.to_string())
            ),
            "grant REPLICATION MASTER ADMIN (MariaDB 10.5+) or REPLICATION SLAVE (MySQL) so the \
             collision check can run",
        ),
    });
    if config.mysql.resume == ResumeMode::Gtid {
        let gv = global_vars(conn, &["gtid_mode", "enforce_gtid_consistency"]).await?;
        out.push(evaluate_gtid_mode(
            server.flavor,
            var(&gv, "gtid_mode"),
            var(&gv, "enforce_gtid_consistency"),
        ));
    }
    // Privileges.
    match conn.query::<String, _>("SHOW GRANTS").await {
        Ok(grants) => out.extend(evaluate_grants(&grants)),
        Err(e) => out.push(grants_refused(&e)),
    }
    let logs = match binary_logs(conn).await {
        Ok(logs) => {
            out.push(Check::ok(
                "REPLICATION CLIENT / BINLOG MONITOR",
                format!("SHOW BINARY LOGS works ({} files)", logs.len()),
            ));
            Some(logs)
        }
        Err(e) => {
            out.push(Check::not_met(
                Level::Fail,
                "REPLICATION CLIENT / BINLOG MONITOR",
                "SHOW BINARY LOGS allowed",
                e.to_string(),
                server.flavor.binlog_monitor_grant(),
            ));
            None
        }
    };
    // Tables.
    let mappings = config.table_mappings()?;
    for p in mappings.iter().filter_map(|m| m.pattern.as_ref()) {
        if preflight::matching_tables(conn, p).await?.is_empty() {
            out.push(Check::not_met(
                Level::Warn,
                format!("outbox table pattern {p}"),
                "matching tables (or none yet)",
                "no matching table yet",
                "none needed if its tables are created later (run relays them from their first \
                 INSERT); else fix the pattern (case-sensitive, `*` and `?` within one name)",
            ));
        }
    }
    // Patterns stand for the tables that match them now.
    let mappings = preflight::resolve_mappings(conn, &mappings).await?;
    for m in &mappings {
        out.extend(outbox_table_checks(conn, m).await?);
    }
    let table = config.checkpoint_table()?;
    let pool = Pool::new(super::opts(config)?);
    let store =
        MysqlCheckpointStore::new(pool.clone(), table.clone(), config.connector_name.clone());
    match store.verify().await {
        Ok(()) => {
            out.push(Check::ok(
                format!("checkpoint table {table}"),
                "exists with the expected columns",
            ));
            out.push(checkpoint_privileges(conn, &table).await);
            let row = read_state_row(conn, &table, &config.connector_name).await?;
            let rv = global_vars(conn, &["binlog_expire_logs_seconds", "expire_logs_days"]).await?;
            if let Some(logs) = &logs {
                out.extend(evaluate_retention(
                    row.as_ref(),
                    logs,
                    var(&rv, "binlog_expire_logs_seconds").and_then(|v| v.parse().ok()),
                    var(&rv, "expire_logs_days").and_then(|v| v.parse().ok()),
                ));
            }
            if config.mysql.resume == ResumeMode::Gtid {
                out.push(evaluate_checkpoint_gtid(row.as_ref()));
            }
        }
        Err(e) => out.push(error_check("checkpoint table", &e)),
    }
    let _ = pool.disconnect().await;
    // Producer limit vs the largest row the server accepts.
    let packet: Option<u64> = conn
        .query_first::<Option<u64>, _>("SELECT @@GLOBAL.max_allowed_packet")
        .await?
        .flatten();
    let producer_max = ProducerLimits::of(&config.kafka).message_max_bytes;
    for m in &mappings {
        let len: Option<Option<u64>> = conn
            .exec_first(
                "SELECT CHARACTER_OCTET_LENGTH FROM information_schema.COLUMNS \
                 WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND COLUMN_NAME = ?",
                (&m.table.database, &m.table.table, &m.columns.payload),
            )
            .await?;
        if let Some(len) = len {
            out.push(evaluate_message_size(
                m,
                len,
                packet,
                producer_max,
                config.dead_letter.enabled,
            ));
        }
    }
    Ok(())
}

/// `gtid_mode`/`enforce_gtid_consistency` for `mysql.resume = "gtid"`: MariaDB always logs
/// GTIDs; MySQL needs `gtid_mode=ON` (and `enforce_gtid_consistency=ON`, which it requires).
pub fn evaluate_gtid_mode(flavor: Flavor, gtid_mode: Option<&str>, enforce: Option<&str>) -> Check {
    if flavor.always_logs_gtids() {
        return Check::ok(
            "GTIDs (mysql.resume = \"gtid\")",
            "MariaDB always logs GTIDs",
        );
    }
    let mode = gtid_mode.unwrap_or("(not set)").to_ascii_uppercase();
    let enforce = enforce.unwrap_or("(not set)").to_ascii_uppercase();
    if mode == "ON" && enforce == "ON" {
        return Check::ok(
            "gtid_mode (mysql.resume = \"gtid\")",
            "gtid_mode=ON, enforce_gtid_consistency=ON",
        );
    }
    Check::not_met(
        Level::Fail,
        "gtid_mode (mysql.resume = \"gtid\")",
        "gtid_mode=ON and enforce_gtid_consistency=ON",
        format!("gtid_mode={mode}, enforce_gtid_consistency={enforce}"),
        "set enforce_gtid_consistency=ON, then step gtid_mode OFF -> OFF_PERMISSIVE -> \
         ON_PERMISSIVE -> ON (SET GLOBAL, one step at a time, and in [mysqld]); or set \
         mysql.resume = \"auto\" or \"position\"",
    )
}

/// With `mysql.resume = "gtid"` the stored checkpoint must carry a GTID set.
pub fn evaluate_checkpoint_gtid(row: Option<&StateRow>) -> Check {
    match row.and_then(|r| r.checkpoint.as_ref().map(|c| c.gtid_set.clone())) {
        Some(Some(g)) => Check::ok("checkpoint gtid_set", g),
        Some(None) => Check::not_met(
            Level::Fail,
            "checkpoint gtid_set",
            "a GTID set (mysql.resume = \"gtid\")",
            "none",
            "move the checkpoint with `outbox-relay reset --to …` (it stores the GTID state \
             there), or set mysql.resume = \"auto\"",
        ),
        None => Check::ok("checkpoint gtid_set", "no checkpoint yet"),
    }
}

/// The REPLICATION SLAVE line when the server refused `SHOW GRANTS`: what the server said,
/// instead of judging an empty list of grants.
pub fn grants_refused(e: &mysql_async::Error) -> Check {
    Check::not_met(
        Level::Warn,
        "REPLICATION SLAVE",
        "REPLICATION SLAVE on *.* (the binlog dump needs it)",
        format!(
            "not checked: the server refused SHOW GRANTS ({})",
            outbox_relay_core::error::redact_error(&e.to_string())
        ),
        "let the user read its own grants (SHOW GRANTS needs no privilege for the current user \
         on MySQL and MariaDB; a proxy or a restricted account may refuse it), or check by hand \
         that REPLICATION SLAVE is granted ON *.*",
    )
}

/// REPLICATION SLAVE (needed for the binlog dump) and, from `SHOW GRANTS`, whether it is
/// granted on `*.*` (directly or as ALL PRIVILEGES). Grants through roles are not expanded: a
/// user with roles gets a warning instead of a failure.
pub fn evaluate_grants(grants: &[String]) -> Vec<Check> {
    let global: Vec<String> = grants
        .iter()
        .map(|g| g.to_ascii_uppercase())
        .filter(|g| g.starts_with("GRANT ") && g.contains(" ON *.* TO "))
        .collect();
    let has = |p: &str| {
        global
            .iter()
            .any(|g| g.contains("ALL PRIVILEGES") || g.contains(p))
    };
    let roles = grants.iter().any(|g| {
        let u = g.to_ascii_uppercase();
        u.starts_with("GRANT ") && !u.contains(" ON ")
    });
    let name = "REPLICATION SLAVE";
    if has("REPLICATION SLAVE") || has("REPLICATION REPLICA") {
        return vec![Check::ok(name, "granted on *.*")];
    }
    let level = if roles || grants.is_empty() {
        Level::Warn
    } else {
        Level::Fail
    };
    let found = if grants.is_empty() {
        "SHOW GRANTS returned nothing".to_owned()
    } else if roles {
        "not granted directly (the user has roles, which were not expanded)".to_owned()
    } else {
        "not granted".to_owned()
    };
    vec![Check::not_met(
        level,
        name,
        "REPLICATION SLAVE on *.* (the binlog dump needs it)",
        found,
        "GRANT REPLICATION SLAVE ON *.* TO the relay's user",
    )]
}

/// SELECT, INSERT and UPDATE on the checkpoint table, tested with statements that change no
/// row (inside a transaction that is rolled back).
async fn checkpoint_privileges(
    conn: &mut Conn,
    table: &outbox_relay_core::config::TableName,
) -> Check {
    let t = table.quoted();
    let result = async {
        conn.query_drop("START TRANSACTION").await?;
        for probe in outbox_relay_core::state::codec::privilege_probes(&t) {
            conn.query_drop(probe).await?;
        }
        Ok::<_, mysql_async::Error>(())
    }
    .await;
    let _ = conn.query_drop("ROLLBACK").await;
    match result {
        Ok(()) => Check::ok(format!("privileges on {table}"), "SELECT, INSERT, UPDATE"),
        Err(e) => Check::not_met(
            Level::Fail,
            format!("privileges on {table}"),
            "SELECT, INSERT, UPDATE",
            outbox_relay_core::error::redact_error(&e.to_string()),
            format!("GRANT SELECT, INSERT, UPDATE ON {t} TO the relay's user"),
        ),
    }
}

/// One column of an outbox table as `information_schema.COLUMNS` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnInfo {
    /// `COLUMN_NAME`.
    pub name: String,
    /// `DATA_TYPE`, lowercase (`json`, `longtext`, `datetime`, …).
    pub data_type: String,
    /// `COLUMN_TYPE` (`datetime(6)`, `varchar(255)`, …).
    pub column_type: String,
}

async fn outbox_table_checks(conn: &mut Conn, m: &TableMapping) -> Result<Vec<Check>, RelayError> {
    let rows: Vec<(String, String, String)> = conn
        .exec(
            "SELECT COLUMN_NAME, LOWER(DATA_TYPE), COLUMN_TYPE FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION",
            (&m.table.database, &m.table.table),
        )
        .await?;
    let cols: Vec<ColumnInfo> = rows
        .into_iter()
        .map(|(name, data_type, column_type)| ColumnInfo {
            name,
            data_type,
            column_type,
        })
        .collect();
    let names: Vec<String> = cols.iter().map(|c| c.name.clone()).collect();
    let mut out = vec![preflight::evaluate_outbox_columns(m, &names)];
    if cols.is_empty() {
        return Ok(out);
    }
    out.extend(evaluate_column_types(m, &cols));
    if let Some(check) = outbox_event_key_check(conn, m).await? {
        out.push(check);
    }
    let created_at_is_datetime = !m.columns.created_at.is_empty()
        && cols.iter().any(|c| {
            c.name.eq_ignore_ascii_case(&m.columns.created_at) && c.data_type == "datetime"
        });
    if created_at_is_datetime {
        // The newest row by id, and the server's UTC time, as text (no session time zone).
        let newest: Result<Option<(Option<String>, String)>, _> = conn
            .query_first(format!(
                "SELECT CAST({} AS CHAR), CAST(UTC_TIMESTAMP(6) AS CHAR) FROM {} ORDER BY {} \
                 DESC LIMIT 1",
                super::quote_ident(&m.columns.created_at),
                m.table.quoted(),
                super::quote_ident(&m.columns.id),
            ))
            .await;
        if let Ok(Some((Some(created), now))) = newest {
            if let Some(check) = evaluate_created_at_skew(m, &created, &now) {
                out.push(check);
            }
        }
    }
    let select = conn
        .query_drop(format!("SELECT 1 FROM {} LIMIT 0", m.table.quoted()))
        .await;
    out.push(match select {
        Ok(()) => Check::ok(format!("SELECT on {}", m.table), "granted"),
        Err(e) => Check::not_met(
            Level::Fail,
            format!("SELECT on {}", m.table),
            "SELECT",
            outbox_relay_core::error::redact_error(&e.to_string()),
            format!("GRANT SELECT ON {} TO the relay's user", m.table.quoted()),
        ),
    });
    Ok(out)
}

/// The outbox's unique key on the event_key column, when it has one (see
/// [`evaluate_outbox_event_key`]).
async fn outbox_event_key_check(
    conn: &mut Conn,
    m: &TableMapping,
) -> Result<Option<Check>, RelayError> {
    if m.columns.event_key.is_empty() {
        return Ok(None);
    }
    let col: Option<(String, String, Option<String>)> = conn
        .exec_first(
            "SELECT COLUMN_NAME, COLUMN_TYPE, COLLATION_NAME FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND COLUMN_NAME = ?",
            (&m.table.database, &m.table.table, &m.columns.event_key),
        )
        .await?;
    let Some((name, column_type, collation)) = col else {
        return Ok(None);
    };
    let unique: Option<u64> = conn
        .exec_first(
            "SELECT COUNT(*) FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = ? \
             AND TABLE_NAME = ? AND COLUMN_NAME = ? AND NON_UNIQUE = 0",
            (&m.table.database, &m.table.table, &m.columns.event_key),
        )
        .await?;
    let nopad: Option<String> = conn
        .query_first(
            "SELECT COLLATION_NAME FROM information_schema.COLLATIONS WHERE COLLATION_NAME IN \
             ('utf8mb4_nopad_bin', 'utf8mb4_0900_bin') ORDER BY COLLATION_NAME DESC LIMIT 1",
        )
        .await?;
    let col = crate::ops::inbox::KeyColumn {
        name,
        column_type,
        collation,
    };
    Ok(evaluate_outbox_event_key(
        m,
        &col,
        unique.unwrap_or(0) > 0,
        nopad.as_deref(),
    ))
}

/// The outbox's UNIQUE key on `event_key` (migrations/0001_outbox.sql has one): a warning when
/// it compares loosely (case- and accent-insensitive or PAD SPACE), so the application cannot
/// write two events whose keys differ only that way (its INSERT fails with a duplicate-key
/// error: loud, never a silent merge; consumers' inboxes compare byte for byte). The outbox is
/// the application's table, so the relay never changes it: the fix names the ALTER
/// (`nopad_collation`: a NO PAD binary collation the server has, else VARBINARY). `None` when
/// the column is in no unique key.
pub fn evaluate_outbox_event_key(
    m: &TableMapping,
    col: &crate::ops::inbox::KeyColumn,
    unique: bool,
    nopad_collation: Option<&str>,
) -> Option<Check> {
    if !unique {
        return None;
    }
    let name = format!("{}.{} (unique event key)", m.table, col.name);
    if col.byte_exact() {
        return Some(Check::ok(name, col.describe()));
    }
    let target = match nopad_collation {
        Some(c) => format!("VARCHAR(255) CHARACTER SET utf8mb4 COLLATE {c} NOT NULL"),
        None => "VARBINARY(1020) NOT NULL".to_owned(),
    };
    Some(Check::not_met(
        Level::Warn,
        name,
        "a unique key compared byte for byte (as consumers' inboxes compare event keys)",
        format!(
            "{}: an INSERT of an event whose key differs from an existing one only that way fails \
             with a duplicate-key error (the application's transaction rolls back; nothing is \
             merged silently)",
            col.describe()
        ),
        format!(
            "if the application's event keys may differ only in case, accent or trailing spaces: \
             ALTER TABLE {} MODIFY {} {target} (the outbox is the application's table: the relay \
             never changes it; docs/src/consumers/inbox.md, \"Event keys are compared byte for byte\")",
            m.table.quoted(),
            super::quote_ident(&col.name)
        ),
    ))
}

/// Most skew between a recent row's `created_at` and the server's UTC time that is not worth
/// a word, ms.
const SKEW_TOLERANCE_MS: i64 = 10 * 60_000;

/// A whole time-zone offset is a multiple of this (UTC+05:45 exists), ms.
const ZONE_STEP_MS: i64 = 15 * 60_000;

/// How far from a whole zone offset a skew still counts as one (the row was written a little
/// before the check), ms.
const ZONE_SLACK_MS: i64 = 5 * 60_000;

/// Compares `created` (a DATETIME value of the newest outbox row, as MySQL prints it) read in
/// the table's `datetime_time_zone` with `server_utc` (`UTC_TIMESTAMP()`): when they differ by
/// a whole time-zone offset (± 5 min), the writers store local time in another zone, and the
/// check names the `datetime_time_zone` that reads it right. `None` when a value does not
/// parse.
pub fn evaluate_created_at_skew(
    m: &TableMapping,
    created: &str,
    server_utc: &str,
) -> Option<Check> {
    use chrono::{NaiveDateTime, Offset, TimeZone};
    let parse = |v: &str| NaiveDateTime::parse_from_str(v.trim(), "%Y-%m-%d %H:%M:%S%.f").ok();
    let (created, now) = (parse(created)?, parse(server_utc)?);
    let zone = m.datetime_time_zone;
    let instant = zone.from_local_datetime(&created).earliest()?;
    let now_utc = now.and_utc();
    let skew = (instant.timestamp_millis()) - now_utc.timestamp_millis();
    let name = format!(
        "created_at of {} ({} read in datetime_time_zone {})",
        m.table,
        m.columns.created_at,
        zone.name()
    );
    let steps = (skew as f64 / ZONE_STEP_MS as f64).round() as i64;
    let whole_zone = steps != 0 && (skew - steps * ZONE_STEP_MS).abs() <= ZONE_SLACK_MS;
    if skew.abs() <= SKEW_TOLERANCE_MS || !whole_zone || steps.abs() > 14 * 4 {
        return Some(Check::ok(
            name,
            format!(
                "the newest row's value is {} UTC_TIMESTAMP() ({} UTC)",
                skew_text(skew),
                now.format("%Y-%m-%d %H:%M:%S")
            ),
        ));
    }
    // The writers' zone is `steps` quarter hours ahead of the configured one (at that instant).
    let configured = zone.offset_from_utc_datetime(&now).fix().local_minus_utc();
    let writers = configured + i32::try_from(steps * ZONE_STEP_MS / 1000).ok()?;
    let sign = if writers < 0 { '-' } else { '+' };
    let offset = format!(
        "UTC{sign}{:02}:{:02}",
        writers.unsigned_abs() / 3600,
        writers.unsigned_abs() % 3600 / 60
    );
    let mut zones: Vec<&str> = chrono_tz::TZ_VARIANTS
        .iter()
        .filter(|z| z.offset_from_utc_datetime(&now).fix().local_minus_utc() == writers)
        .map(|z| z.name())
        .filter(|n| {
            [
                "Europe/",
                "Asia/",
                "America/",
                "Africa/",
                "Australia/",
                "Pacific/",
            ]
            .iter()
            .any(|p| n.starts_with(p))
        })
        .take(3)
        .collect();
    // POSIX sign: Etc/GMT-8 is UTC+8. Exact, without daylight saving; else the first example.
    let etc = (writers % 3600 == 0 && writers != 0).then(|| {
        format!(
            "Etc/GMT{}{}",
            if writers > 0 { '-' } else { '+' },
            writers.abs() / 3600
        )
    });
    let suggestion = etc
        .clone()
        .or_else(|| zones.first().map(|z| (*z).to_owned()))
        .unwrap_or_else(|| offset.clone());
    zones.retain(|z| Some(*z) != etc.as_deref());
    Some(Check::not_met(
        Level::Warn,
        name,
        "created_at in datetime_time_zone (close to the server's UTC time for a new row)",
        format!(
            "the newest row's value is {} UTC_TIMESTAMP() ({} UTC): a whole time-zone offset, so \
             the writers seem to store local time of a zone at {offset}",
            skew_text(steps * ZONE_STEP_MS),
            now.format("%Y-%m-%d %H:%M:%S")
        ),
        format!(
            "set datetime_time_zone = \"{suggestion}\" ({offset}; or the writers' own IANA \
             zone, which follows their daylight saving, e.g. {}) in [outbox] or the table's [[outbox.table]], or have the \
             writers store UTC. Until then, with outbox.timestamp = \"column\" record \
             timestamps are off by that much (Kafka 4 refuses those more than an hour ahead), \
             and prune misjudges the rows' age",
            zones.join(", ")
        ),
    ))
}

/// `ms` as "8 h 0 min after" / "3 min before" for messages.
fn skew_text(ms: i64) -> String {
    let minutes = ms.unsigned_abs() / 60_000;
    let dir = if ms >= 0 { "after" } else { "before" };
    if minutes >= 60 {
        format!("{} h {} min {dir}", minutes / 60, minutes % 60)
    } else {
        format!("{minutes} min {} s {dir}", ms.unsigned_abs() / 1000 % 60)
    }
}

/// Types of the mapped columns: the payload a JSON, text or binary string type, `created_at` a
/// DATETIME or TIMESTAMP, the partition column an integer. Columns that do not exist are left
/// to [`preflight::evaluate_outbox_columns`].
pub fn evaluate_column_types(m: &TableMapping, cols: &[ColumnInfo]) -> Vec<Check> {
    let find = |name: &str| cols.iter().find(|c| c.name.eq_ignore_ascii_case(name));
    let t = m.table.quoted();
    let mut out = Vec::new();
    let mut one = |key: &str,
                   name: &str,
                   allowed: &[&str],
                   expected: &str,
                   fix_type: &str,
                   alt: &str| {
        if name.is_empty() {
            return;
        }
        let Some(c) = find(name) else { return };
        let check_name = format!("{}.{} ({key})", m.table, c.name);
        if allowed.contains(&c.data_type.as_str()) {
            out.push(Check::ok(check_name, c.column_type.clone()));
        } else {
            out.push(Check::not_met(
                Level::Fail,
                check_name,
                expected,
                c.column_type.clone(),
                format!(
                    "ALTER TABLE {t} MODIFY `{}` {fix_type} (converting the existing values), {alt}",
                    c.name
                ),
            ));
        }
    };
    one(
        "outbox.columns.payload",
        &m.columns.payload,
        &[
            "json",
            "text",
            "tinytext",
            "mediumtext",
            "longtext",
            "blob",
            "tinyblob",
            "mediumblob",
            "longblob",
            "varbinary",
            "binary",
            "varchar",
            "char",
        ],
        "JSON, TEXT, BLOB or VARBINARY",
        "JSON",
        "or map another column as outbox.columns.payload",
    );
    one(
        "outbox.columns.created_at",
        &m.columns.created_at,
        &["datetime", "timestamp"],
        "DATETIME or TIMESTAMP",
        "DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)",
        "or set outbox.columns.created_at = \"\" (records carry the commit time)",
    );
    one(
        "outbox.columns.partition",
        &m.columns.partition,
        &["tinyint", "smallint", "mediumint", "int", "bigint"],
        "an integer type",
        "INT NULL",
        "or map another column as outbox.columns.partition",
    );
    out
}

/// Binlog retention against the checkpoint: its file must still be on the server (and the
/// position not past its end); a checkpoint older than half the retention is a warning (its
/// file will be purged soon if the relay does not move on). `expire_seconds`
/// (`binlog_expire_logs_seconds`, 0 = unset) wins over `expire_days` (`expire_logs_days`).
pub fn evaluate_retention(
    row: Option<&StateRow>,
    logs: &[(String, u64)],
    expire_seconds: Option<u64>,
    expire_days: Option<f64>,
) -> Vec<Check> {
    let retention = match (expire_seconds, expire_days) {
        (Some(s), _) if s > 0 => Some(s as f64),
        (_, Some(d)) if d > 0.0 => Some(d * 86_400.0),
        _ => None,
    };
    let retention_text = retention.map_or_else(
        || "never (binlog_expire_logs_seconds and expire_logs_days are 0)".to_owned(),
        super::human_duration,
    );
    let Some((row, pos)) = row.and_then(|r| r.position().map(|p| (r, p))) else {
        return vec![Check::ok(
            "checkpoint position",
            format!(
                "no checkpoint yet: the relay starts at the server's current end (binlogs expire \
                 after {retention_text})"
            ),
        )];
    };
    let available = match (logs.first(), logs.last()) {
        (Some((a, _)), Some((b, size))) => format!("{a}:4 to {b}:{size}"),
        _ => "none".to_owned(),
    };
    let mut out = Vec::new();
    match logs.iter().find(|(f, _)| *f == pos.file) {
        Some((_, size)) if pos.pos <= *size => out.push(Check::ok(
            "checkpoint position",
            format!("{pos} is on the server (available {available})"),
        )),
        found => {
            out.push(Check::not_met(
                Level::Fail,
                "checkpoint position",
                "a position the server still has",
                format!(
                    "{pos}, {} (available {available})",
                    if found.is_some() {
                        "past the end of its file (the binlog history was reset)"
                    } else {
                        "whose file was purged"
                    }
                ),
                "move the checkpoint: `outbox-relay reset --to earliest --yes` (rows between the \
                 checkpoint and there are not relayed) or `--to latest`; replay the gap from a \
                 binlog backup with `outbox-relay replay` if you have one",
            ));
            return out;
        }
    }
    let age = row.age_seconds;
    out.push(match retention {
        Some(r) if age > r / 2.0 => Check::not_met(
            Level::Warn,
            "binlog retention",
            format!("a checkpoint younger than half the retention ({retention_text})"),
            format!("a checkpoint written {} ago", super::human_duration(age)),
            "make sure the relay runs (`outbox-relay status`); raise binlog_expire_logs_seconds \
             so its file is not purged before it moves on",
        ),
        _ => Check::ok(
            "binlog retention",
            format!(
                "binlogs expire after {retention_text}; the checkpoint was written {} ago",
                super::human_duration(age)
            ),
        ),
    });
    out
}

/// The largest payload a row can carry (`payload_octets`: the column's
/// `CHARACTER_OCTET_LENGTH`, `None` for JSON on MySQL; bounded by `max_allowed_packet`) against
/// the producer's `message.max.bytes`. A warning, not a failure: such a row is dead-lettered
/// (or stops the relay when dead letters are off) rather than lost.
pub fn evaluate_message_size(
    m: &TableMapping,
    payload_octets: Option<u64>,
    max_allowed_packet: Option<u64>,
    producer_max: u64,
    dead_letter: bool,
) -> Check {
    let largest = match (payload_octets, max_allowed_packet) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let name = format!("message size of {}", m.table);
    match largest {
        Some(l) if l <= producer_max => Check::ok(
            name,
            format!("the largest payload ({l} bytes) fits message.max.bytes = {producer_max}"),
        ),
        _ => Check::not_met(
            Level::Warn,
            name,
            format!("every possible row within message.max.bytes = {producer_max}"),
            format!(
                "payloads up to {} bytes (column {:?}{})",
                largest.map_or_else(|| "unknown".to_owned(), |l| l.to_string()),
                m.columns.payload,
                if max_allowed_packet.is_some() {
                    ", bounded by max_allowed_packet"
                } else {
                    ""
                }
            ),
            format!(
                "a larger row is {}; raise \"message.max.bytes\" in [kafka.properties] and the \
                 topics' max.message.bytes (broker message.max.bytes), or keep payloads smaller",
                if dead_letter {
                    "sent to the dead-letter topic without its value"
                } else {
                    "refused and stops the relay (dead_letter.enabled = false)"
                }
            ),
        ),
    }
}

/// A topic's `max.message.bytes` (`topic_max`; for `what` = "topics the broker creates", the
/// broker's `message.max.bytes`) against the producer's limits. Fails when a batch of small
/// records can be refused ([`batch_hazard`]: that stops the relay); warns when single records
/// under the producer's `message.max.bytes` can be over it (those are dead-lettered or stop the
/// relay). `None` when the producer compresses (batch sizes are known only when sent).
pub fn evaluate_topic_limit(
    what: &str,
    topic: &str,
    topic_max: u64,
    producer: &ProducerLimits,
) -> Option<Check> {
    if producer.compresses {
        return None;
    }
    let name = format!("max.message.bytes of {what}");
    let found = format!("max.message.bytes = {topic_max}");
    Some(
        if let Some((problem, fix)) = batch_hazard(topic, topic_max, producer) {
            Check::not_met(
                Level::Fail,
                name,
                format!(
                    "at least the producer's batch limit, {} bytes",
                    producer.batch_limit()
                ),
                found,
                format!("{fix}; otherwise {problem}"),
            )
        } else if topic_max < producer.message_max_bytes + RECORD_BATCH_OVERHEAD {
            // A record librdkafka takes (message.max.bytes counts it with its framing) is one
            // batch of up to message.max.bytes + 61 bytes.
            Check::not_met(
                Level::Warn,
                name,
                format!(
                    "at least the producer's message.max.bytes + {RECORD_BATCH_OVERHEAD} (a \
                     record batch's header) = {}",
                    producer.message_max_bytes + RECORD_BATCH_OVERHEAD
                ),
                found,
                format!(
                    "a row whose record batch is over {topic_max} bytes is dead-lettered (or \
                     stops the relay when dead letters are off); raise the topic's \
                     max.message.bytes, or set \"message.max.bytes\" in [kafka.properties] to \
                     at most {}",
                    topic_max.saturating_sub(RECORD_BATCH_OVERHEAD)
                ),
            )
        } else {
            Check::ok(
                name,
                format!(
                    "{found} takes the producer's batches and records (message.max.bytes = {}, \
                 batch.size = {})",
                    producer.message_max_bytes, producer.batch_size
                ),
            )
        },
    )
}

async fn kafka_checks(config: &RelayConfig, running: Option<bool>, out: &mut Vec<Check>) {
    let admin = match Admin::new(&config.kafka) {
        Ok(a) => a,
        Err(e) => {
            out.push(Check::not_met(
                Level::Fail,
                "Kafka client",
                "valid kafka.properties",
                e,
                "fix kafka.properties",
            ));
            return;
        }
    };
    let metadata = admin.cluster(KAFKA_TIMEOUT).await;
    let (brokers, topics) = match metadata {
        Ok(m) => (m.brokers, m.topics),
        Err(MetadataError::Kafka(e)) => {
            out.push(Check::not_met(
                Level::Fail,
                "Kafka",
                format!(
                    "a broker of {} answering a metadata request",
                    config.kafka.bootstrap_servers
                ),
                e,
                "check kafka.bootstrap_servers, the network and the security settings in \
                 [kafka.properties]; the topic checks were skipped",
            ));
            return;
        }
        Err(MetadataError::Task(e)) => {
            out.push(Check::not_met(
                Level::Fail,
                "Kafka",
                "a metadata answer",
                e,
                "retry",
            ));
            return;
        }
    };
    out.push(Check::ok(
        "Kafka",
        format!(
            "{} answered ({} brokers, {} topics)",
            config.kafka.bootstrap_servers,
            brokers.len(),
            topics.len()
        ),
    ));
    // The broker's defaults: whether it creates topics, and their max.message.bytes.
    let broker = match brokers.first() {
        Some(id) => admin.broker_configs(*id, KAFKA_TIMEOUT).await,
        None => None,
    };
    let value = |key: &str| broker.as_ref().and_then(|b| Some(b.get(key)?.to_owned()));
    let auto_create = value("auto.create.topics.enable").map(|v| v.eq_ignore_ascii_case("true"));
    let new_topic_max = value("message.max.bytes").and_then(|v| v.parse::<u64>().ok());
    if config.kafka.delivery == Delivery::ExactlyOnce {
        let log = |key: &str| value(key).and_then(|v| v.parse::<i64>().ok());
        out.extend(transaction_log_checks(
            log("transaction.state.log.replication.factor"),
            log("transaction.state.log.min.isr"),
        ));
        out.push(evaluate_transaction_timeout(
            config.kafka.transaction_timeout_ms,
            value("transaction.max.timeout.ms").and_then(|v| v.parse::<u64>().ok()),
        ));
        out.push(transactions_check(config, running).await);
        out.push(transaction_version_check(config).await);
        out.push(progress_topic_check(config, &admin, &topics).await);
    }
    let mappings = config.table_mappings().unwrap_or_default();
    let mut wanted: Vec<(String, String)> = Vec::new();
    for m in &mappings {
        if let Some(t) = m.topic.fixed() {
            wanted.push((t, format!("topic of {}", m.table)));
        } else {
            out.push(match auto_create {
                Some(false) => Check::not_met(
                    Level::Warn,
                    format!("topics of {}", m.table),
                    "existing topics for every value of the template",
                    "a templated topic and auto.create.topics.enable=false",
                    "create each topic the template can produce before rows arrive (a missing \
                     topic is dead-lettered or stops the relay)",
                ),
                _ => Check::ok(
                    format!("topics of {}", m.table),
                    "templated (per row); the broker creates missing topics \
                     (auto.create.topics.enable=true)",
                ),
            });
        }
    }
    if config.dead_letter.enabled {
        wanted.push((
            config.dead_letter.topic.clone(),
            "dead-letter topic".to_owned(),
        ));
    }
    topic_limit_checks(
        config,
        &admin,
        &wanted,
        &topics,
        auto_create,
        new_topic_max,
        out,
    )
    .await;
    for (topic, what) in wanted {
        let name = format!("{what} {topic}");
        out.push(if topics.contains(&topic) {
            Check::ok(name, "exists")
        } else if auto_create == Some(true) {
            Check::ok(
                name,
                "does not exist yet; auto.create.topics.enable=true creates it",
            )
        } else {
            Check::not_met(
                Level::Fail,
                name,
                "an existing topic (or auto.create.topics.enable=true)",
                format!(
                    "no such topic; auto.create.topics.enable={}",
                    auto_create.map_or("unknown", |a| if a { "true" } else { "false" })
                ),
                format!("create it: kafka-topics.sh --create --topic {topic} --bootstrap-server …"),
            )
        });
    }
}

/// Exactly-once: the transaction state log's replication. A transaction's commit needs its
/// coordinator's `__transaction_state` partition in sync: with one replica a single broker
/// failure blocks every transaction (the relay stops producing) or, on an unclean election,
/// loses commit decisions.
fn transaction_log_checks(replication: Option<i64>, min_isr: Option<i64>) -> Vec<Check> {
    let name = "transaction state log";
    match (replication, min_isr) {
        (Some(rf), Some(isr)) if rf >= 3 && isr >= 2 => vec![Check::ok(
            name,
            format!(
                "transaction.state.log.replication.factor = {rf}, transaction.state.log.min.isr \
                 = {isr}"
            ),
        )],
        (Some(rf), Some(isr)) => vec![Check::not_met(
            Level::Warn,
            name,
            "transaction.state.log.replication.factor >= 3 and transaction.state.log.min.isr >= 2",
            format!("replication factor {rf}, min.isr {isr}"),
            "fine for a test cluster; in production set both on the brokers before the log is \
             created (a broker failure otherwise blocks or loses transaction commits)",
        )],
        _ => vec![Check::not_met(
            Level::Warn,
            name,
            "transaction.state.log.replication.factor and min.isr readable",
            "not in the broker's configuration answer",
            "check them on the brokers (3 and 2 in production)",
        )],
    }
}

/// Exactly-once: `kafka.transaction_timeout_ms` (`configured`, ms) against the brokers'
/// `transaction.max.timeout.ms` (`max`, ms; `None`: not in the DescribeConfigs answer). Over
/// it, the transaction coordinator refuses every InitProducerId (`INVALID_TRANSACTION_TIMEOUT`)
/// and `run` stops with exit code 3.
pub fn evaluate_transaction_timeout(configured: u64, max: Option<u64>) -> Check {
    let name = "kafka.transaction_timeout_ms";
    match max {
        Some(max) if configured <= max => Check::ok(
            name,
            format!("{configured}, within the brokers' transaction.max.timeout.ms ({max})"),
        ),
        Some(max) => Check::not_met(
            Level::Fail,
            name,
            format!("at most the brokers' transaction.max.timeout.ms ({max})"),
            format!("kafka.transaction_timeout_ms = {configured}"),
            format!(
                "set kafka.transaction_timeout_ms to {max} or less (default 60000), or raise \
                 transaction.max.timeout.ms on every broker to {configured} or more (the \
                 coordinator refuses the relay's transactions otherwise)"
            ),
        ),
        None => Check::not_met(
            Level::Warn,
            name,
            "the brokers' transaction.max.timeout.ms readable (DescribeConfigs)",
            format!("kafka.transaction_timeout_ms = {configured}, the brokers' limit unknown"),
            "grant the relay DescribeConfigs on the cluster; the transactions check below \
             still tries the configured timeout",
        ),
    }
}

/// Exactly-once: the cluster's finalized `transaction.version` (KIP-890), read with a raw
/// ApiVersions request ([`outbox_relay_kafka::features`]).
async fn transaction_version_check(config: &RelayConfig) -> Check {
    let tls = config
        .kafka
        .properties
        .get("security.protocol")
        .is_some_and(|p| p.eq_ignore_ascii_case("ssl") || p.eq_ignore_ascii_case("sasl_ssl"));
    let features = if tls {
        Err("a TLS listener (security.protocol), which this check does not read".to_owned())
    } else {
        let servers = config.kafka.bootstrap_servers.clone();
        tokio::task::spawn_blocking(move || {
            outbox_relay_kafka::features::finalized_features(&servers, KAFKA_TIMEOUT)
        })
        .await
        .unwrap_or_else(|e| Err(e.to_string()))
    };
    evaluate_transaction_version(features.map(|f| {
        f.iter()
            .find(|f| f.name == "transaction.version")
            .map_or(0, |f| f.max_level)
    }))
}

/// What the cluster's finalized `transaction.version` (`Ok(level)`; a cluster without the
/// feature is level 0) or the failure to read it means for the relay: librdkafka does not
/// implement KIP-890 (transaction protocol version 2), so its transactions use version 1 at
/// any level, where a commit whose EndTxn answer is lost has an unknown outcome; the relay
/// handles that by a new producer (whose epoch fences the old requests) and the progress
/// topic's committed point. Never a failure.
pub fn evaluate_transaction_version(level: Result<i16, String>) -> Check {
    let name = "transaction.version";
    let relay = "librdkafka does not implement KIP-890, so the relay's transactions use \
                 transaction protocol version 1; after a commit whose outcome is unknown (a lost \
                 or late EndTxn answer) the relay builds a new producer, whose epoch fences the \
                 old requests, and resumes from the progress topic's committed point";
    match level {
        Ok(level) if level >= 2 => Check::ok(
            name,
            format!(
                "{level} finalized (KIP-890 server-side defense for clients that use it); {relay}"
            ),
        ),
        Ok(level) => Check::ok(
            name,
            format!("{level} finalized (below 2: no KIP-890 on the brokers); {relay}"),
        ),
        Err(e) => Check::not_met(
            Level::Warn,
            name,
            "the cluster's finalized features (ApiVersions v3)",
            format!("not readable: {e}"),
            format!("nothing to fix for the relay: {relay}"),
        ),
    }
}

/// Exactly-once: initializes transactions with the connector's `transactional.id` (which only
/// fences and aborts what a stopped instance left) unless an instance runs.
async fn transactions_check(config: &RelayConfig, running: Option<bool>) -> Check {
    let id = config.kafka.transactional_id_for(&config.connector_name);
    let name = format!("transactions (transactional.id {id})");
    match running {
        Some(true) => {
            return Check::ok(
                name,
                "not tried: an instance of this connector is running (initializing would fence \
                 it); it uses them",
            )
        }
        None => {
            return Check::not_met(
                Level::Warn,
                name,
                "a check whether an instance runs",
                "MySQL unreachable",
                "run check again once MySQL answers",
            )
        }
        Some(false) => {}
    }
    // The producer the relay builds: with the configured timeout, which the coordinator
    // refuses (INVALID_TRANSACTION_TIMEOUT) when it is over transaction.max.timeout.ms.
    let timeout = config.kafka.transaction_timeout_ms;
    let tried = outbox_relay_kafka::publish::try_init_transactions(
        &config.kafka,
        &id,
        timeout,
        KAFKA_TIMEOUT,
    )
    .await;
    match tried {
        Ok(()) => Check::ok(name, "the transaction coordinator initialized the producer"),
        Err(e) => Check::not_met(
            Level::Fail,
            name,
            "a broker with transactions that authorizes this transactional.id",
            e,
            format!(
                "grant the relay's principal WRITE and DESCRIBE on TransactionalId {id} and \
                 IdempotentWrite on the cluster, check that the brokers' transaction state log \
                 can be created (transaction.state.log.replication.factor <= brokers), or set \
                 kafka.delivery = \"at_least_once\""
            ),
        ),
    }
}

/// Exactly-once: the progress topic exists and is compacted, or the broker lets the relay
/// create it.
async fn progress_topic_check(config: &RelayConfig, admin: &Admin, topics: &[String]) -> Check {
    let topic = &config.kafka.progress_topic;
    let name = format!("progress topic {topic}");
    if !topics.contains(topic) {
        return Check::ok(
            name,
            "does not exist yet; the relay creates it (compacted, 1 partition) at its first \
             exactly-once start",
        );
    }
    let policy = match admin.topic_configs(&[topic.as_str()], KAFKA_TIMEOUT).await {
        Some(results) => results
            .into_iter()
            .find_map(|r| r)
            .and_then(|r| Some(r.get("cleanup.policy")?.to_owned())),
        None => None,
    };
    match policy {
        Some(p) if p.contains("compact") => Check::ok(name, format!("exists, cleanup.policy={p}")),
        Some(p) => Check::not_met(
            Level::Warn,
            name,
            "cleanup.policy=compact",
            format!("cleanup.policy={p}"),
            format!(
                "kafka-configs.sh --alter --entity-type topics --entity-name {topic} \
                 --add-config cleanup.policy=compact (with delete, the connector's last point \
                 could expire and the relay would fall back to the state table's mirror)"
            ),
        ),
        None => Check::not_met(
            Level::Warn,
            name,
            "its configuration",
            "not readable",
            "check that it is compacted (cleanup.policy=compact)",
        ),
    }
}

/// [`evaluate_topic_limit`] for each existing topic in `wanted` and, when the broker creates
/// topics (a templated topic, or one that does not exist yet), for the broker's default.
async fn topic_limit_checks(
    config: &RelayConfig,
    admin: &Admin,
    wanted: &[(String, String)],
    existing: &[String],
    auto_create: Option<bool>,
    new_topic_max: Option<u64>,
    out: &mut Vec<Check>,
) {
    let producer = ProducerLimits::of(&config.kafka);
    let present: Vec<&(String, String)> = wanted
        .iter()
        .filter(|(t, _)| existing.contains(t))
        .collect();
    if !present.is_empty() {
        let names: Vec<&str> = present.iter().map(|(t, _)| t.as_str()).collect();
        match admin.topic_configs(&names, KAFKA_TIMEOUT).await {
            Some(results) => {
                for ((topic, what), result) in present.iter().zip(results) {
                    let limit = result.and_then(|r| r.get("max.message.bytes")?.parse().ok());
                    match limit {
                        Some(limit) => out.extend(evaluate_topic_limit(
                            &format!("{what} {topic}"),
                            topic,
                            limit,
                            &producer,
                        )),
                        None => out.push(unknown_topic_limit(&format!("{what} {topic}"))),
                    }
                }
            }
            None => out.push(unknown_topic_limit("the relay's topics")),
        }
    }
    let creates = wanted.iter().any(|(t, _)| !existing.contains(t))
        || config
            .table_mappings()
            .unwrap_or_default()
            .iter()
            .any(|m| m.topic.fixed().is_none());
    if creates && auto_create == Some(true) {
        if let Some(limit) = new_topic_max {
            out.extend(evaluate_topic_limit(
                "topics the broker creates",
                "<new topic>",
                limit,
                &producer,
            ));
        }
    }
}

fn unknown_topic_limit(what: &str) -> Check {
    Check::not_met(
        Level::Warn,
        format!("max.message.bytes of {what}"),
        "a DescribeConfigs answer",
        "none (no permission, or no answer in time)",
        "grant the relay's user DescribeConfigs on its topics: without the topic's limit, a \
         record over it is refused by the broker, which stops the relay instead of being \
         dead-lettered",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_relay_mysql::preflight::ServerInfo;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect()
    }

    fn mapping(extra: &str) -> TableMapping {
        let toml = format!(
            "[mysql]\nurl = \"mysql://root@127.0.0.1:3306/shop\"\nserver_id = 4242\n\
             [kafka]\nbootstrap_servers = \"127.0.0.1:9092\"\n[outbox]\ntables = [\"shop.outbox\"]\n{extra}"
        );
        RelayConfig::from_toml_str(&toml)
            .and_then(|c| c.table_mappings())
            .expect("valid")
            .remove(0)
    }

    #[test]
    fn created_at_skew_of_a_whole_zone_names_the_zone_that_fixes_it() {
        let m = mapping("");
        // Local time in UTC+8 read as UTC: 8 h ahead (give or take the seconds since).
        let check =
            evaluate_created_at_skew(&m, "2026-11-30 11:13:20.123456", "2026-11-30 03:13:26.000")
                .expect("check");
        assert_eq!(check.level, Level::Warn, "{check:?}");
        assert!(check.found.contains("8 h 0 min after"), "{check:?}");
        assert!(check.found.contains("UTC+08:00"), "{check:?}");
        assert!(check.fix.contains("Etc/GMT-8"), "{check:?}");
        assert!(
            check.fix.starts_with("set datetime_time_zone = \""),
            "{check:?}"
        );
        // Within minutes: fine.
        let ok = evaluate_created_at_skew(&m, "2026-11-30 03:12:00", "2026-11-30 03:13:26")
            .expect("check");
        assert_eq!(ok.level, Level::Ok, "{ok:?}");
        // An old row (not a whole offset): no guess.
        let old = evaluate_created_at_skew(&m, "2026-11-28 17:41:00", "2026-11-30 03:13:26")
            .expect("check");
        assert_eq!(old.level, Level::Ok, "{old:?}");
        // UTC-05:00 (New York in winter) read as UTC.
        let west = evaluate_created_at_skew(&m, "2026-11-29 22:13:00", "2026-11-30 03:13:26")
            .expect("check");
        assert!(west.found.contains("UTC-05:00"), "{west:?}");
        assert!(west.fix.contains("Etc/GMT+5"), "{west:?}");
    }

    #[test]
    fn binlog_settings_each_get_a_line_and_a_fix() {
        let good = vars(&[
            ("log_bin", "ON"),
            ("binlog_format", "ROW"),
            ("binlog_row_image", "FULL"),
            ("binlog_row_metadata", "FULL"),
        ]);
        let checks = preflight::evaluate_binlog_settings(Flavor::MariaDb, &good, false, false);
        assert_eq!(checks.len(), 4);
        assert!(checks.iter().all(|c| c.level == Level::Ok), "{checks:?}");

        let bad = vars(&[
            ("log_bin", "OFF"),
            ("binlog_format", "MIXED"),
            ("binlog_row_image", "MINIMAL"),
            ("binlog_row_metadata", "MINIMAL"),
            ("log_slave_updates", "OFF"),
        ]);
        let checks = preflight::evaluate_binlog_settings(Flavor::MariaDb, &bad, true, false);
        let fails: Vec<(&str, &str, &str)> = checks
            .iter()
            .map(|c| (c.name.as_str(), c.level.as_str(), c.found.as_str()))
            .collect();
        assert_eq!(
            fails,
            vec![
                ("log_bin", "FAIL", "OFF"),
                ("binlog_format", "FAIL", "MIXED"),
                ("binlog_row_image", "FAIL", "MINIMAL"),
                ("binlog_row_metadata", "FAIL", "MINIMAL"),
                ("log_slave_updates", "FAIL", "OFF"),
            ]
        );
        assert!(checks[1].fix.contains("SET GLOBAL binlog_format=ROW"));
        assert!(checks[1].fix.contains("[mariadbd]"));
        assert!(checks[4].fix.contains("log_slave_updates=ON"));
        // With layout tracking MINIMAL metadata only warns.
        let checks = preflight::evaluate_binlog_settings(Flavor::MySql, &bad, false, true);
        assert_eq!(checks[3].level, Level::Warn);
        assert!(checks[3].fix.contains("[mysqld]"));
        // MySQL 8 names it log_replica_updates.
        let v = vars(&[("log_replica_updates", "OFF"), ("log_slave_updates", "OFF")]);
        let checks = preflight::evaluate_binlog_settings(Flavor::MySql, &v, true, false);
        assert_eq!(
            checks.last().map(|c| c.name.as_str()),
            Some("log_replica_updates")
        );
        // A server without binlog_row_metadata (MariaDB < 10.5) gets no line for it.
        let old = vars(&[
            ("log_bin", "ON"),
            ("binlog_format", "ROW"),
            ("binlog_row_image", "FULL"),
        ]);
        assert_eq!(
            preflight::evaluate_binlog_settings(Flavor::MariaDb, &old, false, false).len(),
            3
        );
    }

    #[test]
    fn server_id_collisions_name_the_holder() {
        let server = ServerInfo {
            flavor: Flavor::MariaDb,
            version: "10.11".into(),
            server_id: 1,
            server_uuid: None,
            row_metadata_full: true,
        };
        let me = report_host("orders");
        let replicas = vec![(7, "replica-7".to_owned()), (9, me.clone())];
        let c = preflight::evaluate_server_id(&server, 7, &replicas, &me, "SHOW SLAVE HOSTS");
        assert_eq!(c.level, Level::Fail);
        assert!(
            c.found.contains("\"replica-7\"") && c.found.contains("SHOW SLAVE HOSTS"),
            "{c:?}"
        );
        assert_eq!(
            preflight::evaluate_server_id(&server, 9, &replicas, &me, "").level,
            Level::Ok
        );
        assert_eq!(
            preflight::evaluate_server_id(&server, 8, &replicas, &me, "").level,
            Level::Ok
        );
        let own = preflight::evaluate_server_id(&server, 1, &[], &me, "");
        assert!(own.found.contains("own @@server_id"), "{own:?}");
    }

    #[test]
    fn gtid_mode_matters_only_on_mysql() {
        assert_eq!(
            evaluate_gtid_mode(Flavor::MariaDb, None, None).level,
            Level::Ok
        );
        assert_eq!(
            evaluate_gtid_mode(Flavor::MySql, Some("ON"), Some("ON")).level,
            Level::Ok
        );
        let c = evaluate_gtid_mode(Flavor::MySql, Some("OFF_PERMISSIVE"), Some("OFF"));
        assert_eq!(c.level, Level::Fail);
        assert_eq!(
            c.found,
            "gtid_mode=OFF_PERMISSIVE, enforce_gtid_consistency=OFF"
        );
    }

    #[test]
    fn grants_are_read_from_show_grants() {
        let g = |v: &[&str]| {
            evaluate_grants(&v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>()).remove(0)
        };
        assert_eq!(
            g(&["GRANT ALL PRIVILEGES ON *.* TO `root`@`localhost` WITH GRANT OPTION"]).level,
            Level::Ok
        );
        assert_eq!(
            g(&["GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO `relay`@`%`"]).level,
            Level::Ok
        );
        let c = g(&[
            "GRANT USAGE ON *.* TO `relay`@`%`",
            "GRANT SELECT ON `shop`.* TO `relay`@`%`",
        ]);
        assert_eq!(c.level, Level::Fail);
        assert_eq!(c.fix, "GRANT REPLICATION SLAVE ON *.* TO the relay's user");
        // Only database-level: not enough.
        assert_eq!(
            g(&["GRANT ALL PRIVILEGES ON `shop`.* TO `relay`@`%`"]).level,
            Level::Fail
        );
        // Roles are not expanded: a warning.
        assert_eq!(
            g(&[
                "GRANT USAGE ON *.* TO `relay`@`%`",
                "GRANT `cdc` TO `relay`@`%`"
            ])
            .level,
            Level::Warn
        );
    }

    #[test]
    fn a_refused_show_grants_reports_what_the_server_said() {
        let e = mysql_async::Error::Server(mysql_async::ServerError {
            code: 1142,
            message: "SHOW GRANTS command denied to user 'relay'@'10.0.0.7'".into(),
            state: "42000".into(),
        });
        let c = grants_refused(&e);
        assert_eq!(c.level, Level::Warn);
        assert!(
            c.found.contains("refused SHOW GRANTS")
                && c.found.contains("SHOW GRANTS command denied to user"),
            "{}",
            c.found
        );
        assert!(!c.found.contains("returned nothing"), "{}", c.found);
    }

    #[test]
    fn column_types_are_checked_per_mapped_column() {
        let m = mapping("[outbox.columns]\npartition = \"part\"\n");
        let col = |n: &str, t: &str, ct: &str| ColumnInfo {
            name: n.into(),
            data_type: t.into(),
            column_type: ct.into(),
        };
        let good = [
            col("payload", "longtext", "longtext"),
            col("created_at", "datetime", "datetime(6)"),
            col("part", "int", "int(11)"),
        ];
        assert!(evaluate_column_types(&m, &good)
            .iter()
            .all(|c| c.level == Level::Ok));
        let bad = [
            col("payload", "int", "int(11)"),
            col("created_at", "varchar", "varchar(32)"),
            col("part", "varchar", "varchar(8)"),
        ];
        let checks = evaluate_column_types(&m, &bad);
        assert_eq!(checks.len(), 3);
        assert!(checks.iter().all(|c| c.level == Level::Fail));
        assert_eq!(
            checks[1].name,
            "shop.outbox.created_at (outbox.columns.created_at)"
        );
        assert_eq!(checks[1].expected, "DATETIME or TIMESTAMP");
        assert_eq!(checks[1].found, "varchar(32)");
        assert!(checks[1]
            .fix
            .starts_with("ALTER TABLE `shop`.`outbox` MODIFY `created_at` DATETIME(6)"));
    }

    fn row(file: &str, pos: u64, age: f64) -> StateRow {
        StateRow {
            checkpoint: Some(outbox_relay_core::state::checkpoint::Checkpoint {
                position: outbox_relay_core::position::BinlogPosition::new(file, pos),
                rows_acked: 0,
                gtid_set: None,
                source_server_id: 1,
                source_server_uuid: None,
                table_layouts: None,
            }),
            lease_token: 1,
            lease_owner: None,
            updated_at: String::new(),
            age_seconds: age,
        }
    }

    #[test]
    fn retention_against_the_checkpoint() {
        let logs = vec![
            ("bin.000002".to_owned(), 5000),
            ("bin.000003".to_owned(), 700),
        ];
        let r = |row: &StateRow, s: Option<u64>, d: Option<f64>| {
            evaluate_retention(Some(row), &logs, s, d)
        };
        let ok = r(&row("bin.000003", 400, 60.0), Some(86_400), None);
        assert!(ok.iter().all(|c| c.level == Level::Ok), "{ok:?}");
        let purged = r(&row("bin.000001", 400, 60.0), Some(86_400), None);
        assert_eq!(purged.len(), 1);
        assert_eq!(purged[0].level, Level::Fail);
        assert!(
            purged[0].found.contains("purged")
                && purged[0].found.contains("bin.000002:4 to bin.000003:700")
        );
        assert!(purged[0].fix.contains("reset --to earliest"));
        let past_end = r(&row("bin.000003", 900, 60.0), None, None);
        assert!(past_end[0].found.contains("past the end"));
        // 13 h old with 1 day retention (expire_logs_days, MariaDB prints a decimal).
        let old = r(&row("bin.000003", 400, 13.0 * 3600.0), Some(0), Some(1.0));
        assert_eq!(old[1].level, Level::Warn, "{old:?}");
        // binlog_expire_logs_seconds wins over expire_logs_days; 0 and 0 never expire.
        assert_eq!(
            r(
                &row("bin.000003", 400, 13.0 * 3600.0),
                Some(30 * 86_400),
                Some(1.0)
            )[1]
            .level,
            Level::Ok
        );
        assert_eq!(
            r(&row("bin.000003", 400, 1e9), Some(0), Some(0.0))[1].level,
            Level::Ok
        );
        assert_eq!(
            evaluate_retention(None, &logs, None, None)[0].level,
            Level::Ok
        );
    }

    #[test]
    fn message_size_against_the_largest_payload() {
        let m = mapping("");
        assert_eq!(
            evaluate_message_size(&m, Some(65_535), Some(16 << 20), 1_000_000, false).level,
            Level::Ok
        );
        let c = evaluate_message_size(&m, Some(4_294_967_295), Some(16 << 20), 1_000_000, false);
        assert_eq!(c.level, Level::Warn);
        assert!(
            c.found.starts_with("payloads up to 16777216 bytes"),
            "{c:?}"
        );
        assert!(c.fix.contains("stops the relay"));
        assert!(
            evaluate_message_size(&m, None, Some(64 << 20), 1_000_000, true)
                .fix
                .contains("dead-letter")
        );
    }

    #[test]
    fn checkpoint_gtid_needed_for_gtid_resume() {
        assert_eq!(evaluate_checkpoint_gtid(None).level, Level::Ok);
        assert_eq!(
            evaluate_checkpoint_gtid(Some(&row("bin.000001", 4, 0.0))).level,
            Level::Fail
        );
        let mut r = row("bin.000001", 4, 0.0);
        if let Some(c) = r.checkpoint.as_mut() {
            c.gtid_set = Some("0-1-5".into());
        }
        assert_eq!(evaluate_checkpoint_gtid(Some(&r)).found, "0-1-5");
    }

    #[test]
    fn transaction_version_is_explained() {
        let two = evaluate_transaction_version(Ok(2));
        assert_eq!(two.level, Level::Ok);
        assert!(two.found.starts_with("2 finalized") && two.found.contains("KIP-890"));
        assert!(evaluate_transaction_version(Ok(0))
            .found
            .starts_with("0 finalized"));
        assert_eq!(
            evaluate_transaction_version(Err("refused".into())).level,
            Level::Warn
        );
    }

    #[test]
    fn transaction_timeout_against_the_brokers_limit() {
        let ok = evaluate_transaction_timeout(60_000, Some(900_000));
        assert_eq!(ok.level, Level::Ok);
        let over = evaluate_transaction_timeout(120_000, Some(60_000));
        assert_eq!(over.level, Level::Fail);
        assert!(over.expected.contains("60000") && over.found.contains("120000"));
        assert!(over.fix.contains("kafka.transaction_timeout_ms"));
        assert_eq!(evaluate_transaction_timeout(1, None).level, Level::Warn);
    }

    #[test]
    fn topic_limit_against_the_producers_limits() {
        let producer = |mmb: u64, batch: u64, compresses| ProducerLimits {
            message_max_bytes: mmb,
            batch_size: batch,
            compresses,
        };
        let default = producer(1_000_000, 1_000_000, false);
        let level = |limit, p: &ProducerLimits| {
            evaluate_topic_limit("topic of shop.outbox t", "t", limit, p).map(|c| c.level)
        };
        // Kafka's default topic limit takes librdkafka's default batches and records.
        assert_eq!(level(1_048_588, &default), Some(Level::Ok));
        // Below the batch limit: full batches of small records are refused (a stop).
        let c = evaluate_topic_limit("topic t", "t", 100_000, &default).expect("a check");
        assert_eq!(c.level, Level::Fail);
        assert!(c.fix.contains("\"batch.size\""), "{}", c.fix);
        // Batches fit, single large records do not: those are dead-lettered.
        let big_records = producer(10_000_000, 500_000, false);
        assert_eq!(level(1_048_588, &big_records), Some(Level::Warn));
        assert_eq!(level(10_000_000, &big_records), Some(Level::Warn));
        assert_eq!(level(10_000_061, &big_records), Some(Level::Ok));
        // Compressed batches are not judged.
        assert_eq!(level(100_000, &producer(1_000_000, 1_000_000, true)), None);
    }
}
