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

/// The check of a login the server refused (error 1045): the user and server by name, where
/// the password comes from, and no privilege list (the user may hold every privilege).
fn login_denied(config: &RelayConfig, e: &RelayError) -> Check {
    let (user, server) = match super::opts(config) {
        Ok(o) => (
            o.user().unwrap_or("(none)").to_owned(),
            format!("{}:{}", o.ip_or_hostname(), o.tcp_port()),
        ),
        Err(_) => ("(unknown)".to_owned(), "(unknown)".to_owned()),
    };
    let password = if std::env::var_os("OUTBOX_RELAY__MYSQL__PASSWORD").is_some() {
        "the environment variable OUTBOX_RELAY__MYSQL__PASSWORD (it overrides mysql.password)"
    } else if config.mysql.password.is_some() {
        "mysql.password"
    } else if mysql_async::Opts::from_url(&config.mysql.url).is_ok_and(|o| o.pass().is_some()) {
        "the password in mysql.url"
    } else {
        "none is set (mysql.url has no password and mysql.password is not set)"
    };
    let detail = match e {
        RelayError::Prerequisite { found, .. } => found
            .strip_prefix("access denied ")
            .unwrap_or(found)
            .to_owned(),
        other => other.to_string(),
    };
    Check::not_met(
        Level::Fail,
        "MySQL login",
        format!("the server at {server} to accept user {user:?}"),
        format!("access denied for user {user:?} at {server} {detail}"),
        format!(
            "check the user and password: the user is mysql.url's, the password comes from \
             {password}; a user created REQUIRE SSL also needs mysql.tls_mode. The MySQL checks \
             were skipped"
        ),
    )
}

/// Runs every check against `config`'s server and brokers.
pub async fn check(config: &RelayConfig) -> CheckReport {
    let mut report = CheckReport::default();
    // Whether an instance of the connector runs (holds the lease); unknown without MySQL.
    let mut running = None;
    let mut payloads = Vec::new();
    match super::connect(config).await {
        Ok(mut conn) => {
            if let Err(e) = mysql_checks(config, &mut conn, &mut report.checks, &mut payloads).await
            {
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
        Err(e) if e.is_login_denied() => report.checks.push(login_denied(config, &e)),
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
    let limits = kafka_checks(config, running, &mut report.checks).await;
    // After Kafka: a table's largest record is set by the producer and by its topic.
    let producer = ProducerLimits::of(&config.kafka);
    for (m, facts) in &payloads {
        let limit = limits.record_limit(m, &producer);
        report
            .checks
            .push(evaluate_message_size(m, facts, &limit, &config.dead_letter));
    }
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
    payloads: &mut Vec<(TableMapping, PayloadFacts)>,
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
    // The largest payload the table can hold and the largest it holds now, judged against
    // the record limits once Kafka has been asked (`check`).
    let packet: Option<u64> = conn
        .query_first::<Option<u64>, _>("SELECT @@GLOBAL.max_allowed_packet")
        .await?
        .flatten();
    for m in &mappings {
        let column: Option<(String, Option<u64>)> = conn
            .exec_first(
                "SELECT LOWER(COLUMN_TYPE), CHARACTER_OCTET_LENGTH FROM information_schema.COLUMNS \
                 WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND COLUMN_NAME = ?",
                (&m.table.database, &m.table.table, &m.columns.payload),
            )
            .await?;
        let Some((column_type, octets)) = column else {
            continue;
        };
        // The newest rows by id (an index walk, not a scan of a large outbox).
        let (payload, id, table) = (
            super::quote_ident(&m.columns.payload),
            super::quote_ident(&m.columns.id),
            m.table.quoted(),
        );
        let now: Option<(Option<u64>, u64)> = conn
            .query_first(format!(
                "SELECT MAX(LENGTH(p)), COUNT(*) FROM (SELECT {payload} AS p FROM {table} \
                 ORDER BY {id} DESC LIMIT {NEWEST_ROWS}) AS newest"
            ))
            .await?;
        let (largest_now, rows_seen) = now.unwrap_or((None, 0));
        payloads.push((
            m.clone(),
            PayloadFacts {
                column_type,
                octets,
                max_allowed_packet: packet,
                largest_now,
                rows_seen,
            },
        ));
    }
    Ok(())
}

/// ` (4 GiB)` for a size of a MiB or more, else nothing: the exact bytes stay beside it.
fn human_bytes(bytes: u64) -> String {
    const MIB: u64 = 1 << 20;
    match bytes {
        b if b >= 1 << 30 => format!(" ({:.0} GiB)", b as f64 / (1u64 << 30) as f64),
        b if b >= MIB => format!(" ({:.0} MiB)", b as f64 / MIB as f64),
        _ => String::new(),
    }
}

/// How many of the newest rows `check` reads the payload sizes of.
const NEWEST_ROWS: u64 = 10_000;

/// Room for a record's key, headers and length fields beside its payload, in bytes: the
/// common shape's key and headers (`aggregate_id`, `id`, `event_key`, `event_type`,
/// `aggregate_type`: VARCHAR(255) each, at most 1020 bytes in utf8mb4) stay well within it.
const RECORD_ALLOWANCE: u64 = 4096;

/// What `check` learned of one outbox table's payload column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayloadFacts {
    /// The column's type as the server shows it: `longtext`, `json`, `varchar(2000)`.
    pub column_type: String,
    /// `CHARACTER_OCTET_LENGTH`, bytes (`None` for MySQL's JSON).
    pub octets: Option<u64>,
    /// `@@GLOBAL.max_allowed_packet`, bytes: no row can be larger.
    pub max_allowed_packet: Option<u64>,
    /// The largest payload among the newest rows, bytes (`None`: no row, or all NULL).
    pub largest_now: Option<u64>,
    /// How many rows that looked at (at most [`NEWEST_ROWS`]).
    pub rows_seen: u64,
}

/// The largest record a table's rows may become, and the limit that sets it ("the producer's
/// message.max.bytes = 1000000").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordLimit {
    /// Bytes of key, headers and value.
    pub bytes: u64,
    /// Which limit, with its value.
    pub by: String,
}

/// The topics' limits `check` read from the brokers: each existing topic's
/// `max.message.bytes`, and the broker's `message.max.bytes` for the topics it creates.
#[derive(Debug, Clone, Default)]
pub struct TopicLimits {
    /// `max.message.bytes` of the existing topics the configuration names.
    pub topics: std::collections::BTreeMap<String, u64>,
    /// The brokers' `message.max.bytes` when they create topics (`auto.create.topics.enable`).
    pub created: Option<u64>,
}

impl TopicLimits {
    /// The limit of `m`'s records: the producer's `message.max.bytes`, or its topic's
    /// `max.message.bytes` less a batch's framing when that is smaller (a templated topic, or
    /// one that does not exist yet: the brokers' default for the topics they create).
    pub fn record_limit(&self, m: &TableMapping, producer: &ProducerLimits) -> RecordLimit {
        let mut limit = RecordLimit {
            bytes: producer.message_max_bytes,
            by: format!(
                "the producer's message.max.bytes = {}",
                producer.message_max_bytes
            ),
        };
        let topic = match m.topic.fixed() {
            Some(t) => match self.topics.get(&t) {
                Some(max) => Some((*max, format!("max.message.bytes = {max} of topic {t}"))),
                None => self
                    .created
                    .map(|max| (max, format!("message.max.bytes = {max} of the brokers, for the topic {t} they create"))),
            },
            None => self.created.map(|max| {
                (
                    max,
                    format!("message.max.bytes = {max} of the brokers, for the topics they create"),
                )
            }),
        };
        if let Some((max, by)) = topic {
            let bytes = max.saturating_sub(RECORD_BATCH_OVERHEAD);
            if bytes < limit.bytes {
                limit = RecordLimit {
                    bytes,
                    by: format!("{by} (less {RECORD_BATCH_OVERHEAD} bytes of batch framing)"),
                };
            }
        }
        limit
    }
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
/// the application's table, so `run` never changes it: the fix names the ALTER
/// (`nopad_collation`: a NO PAD binary collation the server has, else VARBINARY) and, for a
/// NO PAD collation, `migrate --outbox`, which applies it (migrations/0007_outbox_event_key.sql).
/// `None` when the column is in no unique key.
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
    let (target, migrate) = match nopad_collation {
        Some(c) => (
            format!("VARCHAR(255) CHARACTER SET utf8mb4 COLLATE {c} NOT NULL"),
            ", or `outbox-relay migrate --outbox` (migrations/0007_outbox_event_key.sql) for a \
             table of the common shape; it copies the table",
        ),
        None => ("VARBINARY(1020) NOT NULL".to_owned(), ""),
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
             ALTER TABLE {} MODIFY {} {target}{migrate} (the outbox is the application's table: \
             `run` never changes it; docs/src/consumers/inbox.md, \"The outbox's own unique event \
             key\")",
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
    let fine = Check::ok(
        name.clone(),
        format!(
            "the newest row's value is {} UTC_TIMESTAMP() ({} UTC)",
            skew_text(skew),
            now.format("%Y-%m-%d %H:%M:%S")
        ),
    );
    if skew.abs() <= SKEW_TOLERANCE_MS || !whole_zone || steps.abs() > 14 * 4 {
        return Some(fine);
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
    let etc = (writers % 3600 == 0 && writers != 0 && writers.abs() <= 14 * 3600).then(|| {
        format!(
            "Etc/GMT{}{}",
            if writers > 0 { '-' } else { '+' },
            writers.abs() / 3600
        )
    });
    if etc.is_none() && zones.is_empty() {
        // No zone is at that offset now (UTC-00:15): an outbox row that is simply that old.
        return Some(fine);
    }
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
             the writers seem to store local time of a zone at {offset}{}",
            skew_text(steps * ZONE_STEP_MS),
            now.format("%Y-%m-%d %H:%M:%S"),
            if skew < 0 {
                " (unless that row is simply that old: nothing written since)"
            } else {
                ""
            }
        ),
        format!(
            "set datetime_time_zone = \"{suggestion}\" ({offset}{}) in [outbox] or the table's \
             [[outbox.table]], or have the writers store UTC. Until then, with outbox.timestamp \
             = \"column\" record timestamps are off by that much (Kafka 4 refuses those more \
             than an hour ahead), and prune misjudges the rows' age",
            if zones.is_empty() {
                String::new()
            } else {
                format!(
                    "; or the writers' own IANA zone, which follows their daylight saving, e.g. {}",
                    zones.join(", ")
                )
            }
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

/// The payloads of `m` against the largest record its rows may become (`limit`): the largest
/// payload the column can hold (`facts.octets`, bounded by `max_allowed_packet`) and the largest
/// among its newest rows. OK when the column cannot hold a payload over the limit (less
/// [`RECORD_ALLOWANCE`] for the key and headers); also OK, saying why, when it can (LONGTEXT,
/// JSON: gigabytes) but no newest row comes within 10 % of the limit, since such a row is a row
/// error the relay handles by `dead_letter`; a warning when rows do, naming the limit, the
/// numbers, what becomes of such a row and the fix.
pub fn evaluate_message_size(
    m: &TableMapping,
    facts: &PayloadFacts,
    limit: &RecordLimit,
    dead_letter: &outbox_relay_core::config::DeadLetterConfig,
) -> Check {
    let name = format!("message size of {}", m.table);
    let room = limit.bytes.saturating_sub(RECORD_ALLOWANCE);
    let column_max = match (facts.octets, facts.max_allowed_packet) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let column = match (facts.octets, facts.max_allowed_packet) {
        (Some(o), Some(p)) if p < o => format!(
            "column {:?} {} holds up to {o} bytes{}, a row at most max_allowed_packet = {p}{}",
            m.columns.payload,
            facts.column_type,
            human_bytes(o),
            human_bytes(p)
        ),
        (Some(o), _) => format!(
            "column {:?} {} holds up to {o} bytes{}",
            m.columns.payload,
            facts.column_type,
            human_bytes(o)
        ),
        (None, Some(p)) => format!(
            "column {:?} {} holds up to max_allowed_packet = {p} bytes{}",
            m.columns.payload,
            facts.column_type,
            human_bytes(p)
        ),
        (None, None) => format!(
            "column {:?} {} has no known bound",
            m.columns.payload, facts.column_type
        ),
    };
    if column_max.is_some_and(|c| c <= room) {
        return Check::ok(
            name,
            format!(
                "{column}, within the largest record, {} bytes ({})",
                limit.bytes, limit.by
            ),
        );
    }
    let now = match facts.largest_now {
        Some(n) => format!(
            "the largest payload of the newest {} rows is {n} bytes",
            facts.rows_seen
        ),
        None => "the table has no payload yet".to_owned(),
    };
    let fate = if dead_letter.enabled {
        format!(
            "goes to the dead-letter topic {} without its value (the row stays in the outbox: \
             republish it once the limits are raised)",
            dead_letter.topic
        )
    } else {
        "stops the relay with the row's position (dead_letter.enabled = false; it resumes with \
         that row once the limits are raised)"
            .to_owned()
    };
    let near = facts.largest_now.is_some_and(|n| n > room / 10 * 9);
    if !near {
        return Check::ok(
            name,
            format!(
                "{column}: more than the largest record, {} bytes ({}), but {now}; a row over \
                 it would be a row error that {fate}",
                limit.bytes, limit.by
            ),
        );
    }
    let largest = facts.largest_now.unwrap_or(0);
    Check::not_met(
        Level::Warn,
        name,
        format!(
            "payloads well within the largest record, {} bytes ({}), less {RECORD_ALLOWANCE} for \
             the key and headers",
            limit.bytes, limit.by
        ),
        format!(
            "{now}{} ({column})",
            if largest > room {
                ": over it"
            } else {
                ": within 10 % of it"
            }
        ),
        format!(
            "a row over the limit is a row error that {fate}. Raise \"message.max.bytes\" in [kafka.properties] and \
             the topics' max.message.bytes (at least message.max.bytes + {RECORD_BATCH_OVERHEAD}) \
             above the largest payload you expect plus {RECORD_ALLOWANCE} bytes, or keep payloads \
             smaller (README, \"Record size limits\")"
        ),
    )
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

async fn kafka_checks(
    config: &RelayConfig,
    running: Option<bool>,
    out: &mut Vec<Check>,
) -> TopicLimits {
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
            return TopicLimits::default();
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
            return TopicLimits::default();
        }
        Err(MetadataError::Task(e)) => {
            out.push(Check::not_met(
                Level::Fail,
                "Kafka",
                "a metadata answer",
                e,
                "retry",
            ));
            return TopicLimits::default();
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
    let creation = TopicCreation {
        auto_create,
        partitions: value("num.partitions"),
        replication: value("default.replication.factor"),
        bootstrap: config.kafka.bootstrap_servers.clone(),
        own: [
            config
                .dead_letter
                .enabled
                .then(|| config.dead_letter.topic.clone()),
            (config.kafka.delivery == Delivery::ExactlyOnce)
                .then(|| config.kafka.progress_topic.clone()),
        ]
        .into_iter()
        .flatten()
        .collect(),
    };
    out.push(creation.check());
    let mut wanted: Vec<(String, String)> = Vec::new();
    for m in &mappings {
        if let Some(t) = m.topic.fixed() {
            wanted.push((t, format!("topic of {}", m.table)));
        } else {
            out.push(creation.templated(m, &topics));
        }
    }
    if config.dead_letter.enabled {
        wanted.push((
            config.dead_letter.topic.clone(),
            "dead-letter topic".to_owned(),
        ));
    }
    let mut limits = topic_limit_checks(
        config,
        &admin,
        &wanted,
        &topics,
        auto_create,
        new_topic_max,
        out,
    )
    .await;
    if auto_create == Some(true) {
        limits.created = new_topic_max;
    }
    for (topic, what) in wanted {
        out.push(creation.fixed(&format!("{what} {topic}"), &topic, &topics));
    }
    limits
}

/// What the brokers do with a topic the relay routes to that does not exist: create it
/// (`auto.create.topics.enable`) with their default partitions and replication, which are
/// rarely what the relay's topics need, or refuse its records. The README's quick start and
/// the compose file create their topics; `check` says which of the configuration's topics
/// exist.
#[derive(Debug, Clone)]
pub struct TopicCreation {
    /// The brokers' `auto.create.topics.enable` (`None`: not readable).
    pub auto_create: Option<bool>,
    /// Their `num.partitions`.
    pub partitions: Option<String>,
    /// Their `default.replication.factor`.
    pub replication: Option<String>,
    /// `kafka.bootstrap_servers`, for the `kafka-topics.sh` line.
    pub bootstrap: String,
    /// The relay's own topics (dead letters, exactly-once progress), never a row's topic even
    /// when a template's shape takes their names.
    pub own: Vec<String>,
}

impl TopicCreation {
    /// `num.partitions = 1, default.replication.factor = 1` (or the brokers' defaults).
    fn defaults(&self) -> String {
        match (&self.partitions, &self.replication) {
            (Some(p), Some(r)) => {
                format!("num.partitions = {p} and default.replication.factor = {r}")
            }
            _ => "the brokers' default partitions and replication".into(),
        }
    }

    /// `kafka-topics.sh --bootstrap-server … --create --topic T --partitions N
    /// --replication-factor R`.
    fn create_line(&self, topic: &str) -> String {
        format!(
            "kafka-topics.sh --bootstrap-server {} --create --topic {topic} --partitions N \
             --replication-factor R",
            self.bootstrap
        )
    }

    /// The line on the brokers' auto-creation: what they do with a missing topic, and the
    /// advice. Never a failure nor a warning by itself: relying on it is (see [`Self::fixed`],
    /// [`Self::templated`]).
    pub fn check(&self) -> Check {
        let name = "topic auto-creation";
        match self.auto_create {
            Some(true) => Check::ok(
                name,
                format!(
                    "the brokers create a missing topic on its first record \
                     (auto.create.topics.enable=true), with {}: create the relay's topics \
                     yourself with the partitions and replication you want, then set \
                     auto.create.topics.enable=false on the brokers",
                    self.defaults()
                ),
            ),
            Some(false) => Check::ok(
                name,
                "the brokers create no topics (auto.create.topics.enable=false): each topic \
                 must exist before its first record",
            ),
            None => Check::not_met(
                Level::Warn,
                name,
                "the brokers' auto.create.topics.enable (DescribeConfigs of a broker)",
                "no answer (no permission, or none in time)",
                "grant the relay's user DescribeConfigs on the cluster, or make sure every \
                 topic exists before its first record",
            ),
        }
    }

    /// A topic the configuration names (`name`: "topic of shop.outbox orders"): OK when it
    /// exists; a warning when the brokers would create it with their defaults; a failure when
    /// they would refuse its records.
    pub fn fixed(&self, name: &str, topic: &str, existing: &[String]) -> Check {
        if existing.iter().any(|t| t == topic) {
            return Check::ok(name, "exists");
        }
        let create = self.create_line(topic);
        if self.auto_create == Some(true) {
            return Check::not_met(
                Level::Warn,
                name,
                "a topic created with the partitions and replication it needs",
                format!(
                    "no such topic yet: the brokers create it on its first record with {}",
                    self.defaults()
                ),
                format!("create it: {create}"),
            );
        }
        Check::not_met(
            Level::Fail,
            name,
            "an existing topic",
            format!(
                "no such topic; auto.create.topics.enable={}",
                self.auto_create
                    .map_or("unknown", |a| if a { "true" } else { "false" })
            ),
            format!("create it: {create}"),
        )
    }

    /// The topics of a templated mapping: the existing ones it can name (OK, listed), or none
    /// (a warning: each topic is created by the brokers with their defaults, or its records
    /// are refused).
    pub fn templated(&self, m: &TableMapping, existing: &[String]) -> Check {
        let name = format!("topics of {}", m.table);
        let Some(shape) = TopicShape::of(m) else {
            return Check::ok(name, "templated (per row)");
        };
        let named: Vec<&String> = existing
            .iter()
            .filter(|t| shape.names(t) && !self.own.contains(t))
            .collect();
        let then = match self.auto_create {
            Some(true) => format!(
                "a topic it names that does not exist is created by the brokers on its first \
                 record with {}",
                self.defaults()
            ),
            _ => "the records of a topic it names that does not exist are refused (dead-lettered, \
                  held or stopping the relay by [dead_letter])"
                .to_owned(),
        };
        if named.is_empty() {
            return Check::not_met(
                Level::Warn,
                name,
                format!("the topics {} names, created beforehand", shape.text),
                format!("none exists yet; {then}"),
                format!(
                    "create one per value before its first row: {}",
                    self.create_line(&shape.text.replace('{', "<").replace('}', ">"))
                ),
            );
        }
        let mut list: Vec<&str> = named.iter().take(5).map(|t| t.as_str()).collect();
        let more = named.len().saturating_sub(list.len());
        let more = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        list.sort_unstable();
        Check::ok(
            name,
            format!(
                "{} names {} existing topic(s): {}{more}; {then}",
                shape.text,
                named.len(),
                list.join(", ")
            ),
        )
    }
}

/// The topics a mapping's template can name: its text with the placeholders of row values
/// (`{aggregate_type}`, `{event_type}`) kept and the table's database and name filled in.
#[derive(Debug, Clone)]
struct TopicShape {
    /// The literal pieces between the row values.
    pieces: Vec<String>,
    /// `outbox.event.{aggregate_type}`.
    text: String,
}

impl TopicShape {
    /// Row values stand in as markers of topic characters no real value uses.
    const AGGREGATE: &'static str = "AGGREGATETYPE0x7f3a";
    const EVENT: &'static str = "EVENTTYPE0x7f3a";

    /// `None` for a template without row values (a fixed topic) or whose table is a pattern.
    fn of(m: &TableMapping) -> Option<Self> {
        let fields = outbox_relay_core::config::topic::TopicFields {
            aggregate_type: Self::AGGREGATE,
            event_type: Some(Self::EVENT.as_bytes()),
            database: &m.table.database,
            table: &m.table.table,
        };
        let rendered = m.topic.render(&fields).ok()?;
        let text = rendered
            .replace(Self::AGGREGATE, "{aggregate_type}")
            .replace(Self::EVENT, "{event_type}");
        let pieces: Vec<String> = rendered
            .replace(Self::EVENT, Self::AGGREGATE)
            .split(Self::AGGREGATE)
            .map(str::to_owned)
            .collect();
        (pieces.len() > 1).then_some(Self { pieces, text })
    }

    /// Whether `topic` is one the template names: its pieces in order, each row value at
    /// least one character.
    fn names(&self, topic: &str) -> bool {
        let (first, last) = (&self.pieces[0], &self.pieces[self.pieces.len() - 1]);
        let Some(rest) = topic.strip_prefix(first.as_str()) else {
            return false;
        };
        let Some(mut rest) = rest.strip_suffix(last.as_str()) else {
            return false;
        };
        for piece in &self.pieces[1..self.pieces.len() - 1] {
            // The earliest match after a non-empty value leaves the most room for the rest.
            match rest.get(1..).and_then(|r| r.find(piece.as_str())) {
                Some(at) => rest = &rest[1 + at + piece.len()..],
                None => return false,
            }
        }
        !rest.is_empty()
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
/// Returns the existing topics' limits ([`TopicLimits::topics`]).
async fn topic_limit_checks(
    config: &RelayConfig,
    admin: &Admin,
    wanted: &[(String, String)],
    existing: &[String],
    auto_create: Option<bool>,
    new_topic_max: Option<u64>,
    out: &mut Vec<Check>,
) -> TopicLimits {
    let mut limits = TopicLimits::default();
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
                        Some(limit) => {
                            limits.topics.insert(topic.clone(), limit);
                            out.extend(evaluate_topic_limit(
                                &format!("{what} {topic}"),
                                topic,
                                limit,
                                &producer,
                            ));
                        }
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
    limits
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
        // A row a quarter of an hour old: no zone is at UTC-00:15.
        let quarter = evaluate_created_at_skew(&m, "2026-11-30 02:58:26", "2026-11-30 03:13:26")
            .expect("parses");
        assert_eq!(quarter.level, Level::Ok, "{quarter:?}");
        // An old row (not a whole offset): no guess.
        let old = evaluate_created_at_skew(&m, "2026-11-28 17:41:00", "2026-11-30 03:13:26")
            .expect("check");
        assert_eq!(old.level, Level::Ok, "{old:?}");
        // UTC-05:00 (New York in winter) read as UTC.
        let west = evaluate_created_at_skew(&m, "2026-11-29 22:13:00", "2026-11-30 03:13:26")
            .expect("check");
        assert!(west.found.contains("UTC-05:00"), "{west:?}");
        assert!(
            west.found.contains("unless that row is simply that old"),
            "{west:?}"
        );
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

    fn facts(column_type: &str, octets: Option<u64>, largest_now: Option<u64>) -> PayloadFacts {
        PayloadFacts {
            column_type: column_type.into(),
            octets,
            max_allowed_packet: Some(64 << 20),
            largest_now,
            rows_seen: largest_now.map_or(0, |_| 3),
        }
    }

    #[test]
    fn message_size_judges_the_column_and_the_rows_against_the_record_limit() {
        use outbox_relay_core::config::DeadLetterConfig;
        let m = mapping("");
        let producer = ProducerLimits {
            message_max_bytes: 1_000_000,
            batch_size: 1_000_000,
            compresses: false,
        };
        let limit = TopicLimits::default().record_limit(&m, &producer);
        assert_eq!(limit.bytes, 1_000_000);
        let stop = DeadLetterConfig::default();
        let dlq = DeadLetterConfig {
            enabled: true,
            topic: "outbox.dlq".into(),
            ..DeadLetterConfig::default()
        };
        let judge =
            |f: PayloadFacts, dl: &DeadLetterConfig| evaluate_message_size(&m, &f, &limit, dl);
        // A column that cannot hold more than the limit: OK, whatever the rows.
        let c = judge(facts("varchar(2000)", Some(8000), None), &stop);
        assert_eq!(c.level, Level::Ok);
        assert_eq!(
            c.found,
            "column \"payload\" varchar(2000) holds up to 8000 bytes, within the largest record, \
             1000000 bytes (the producer's message.max.bytes = 1000000)"
        );
        // The README's setup: JSON (LONGTEXT on MariaDB, unbounded JSON on MySQL) with small
        // rows, or none yet: OK, saying why and what a larger row would do.
        for f in [
            facts("longtext", Some(4_294_967_295), Some(2)),
            facts("json", None, Some(2)),
            facts("json", None, None),
        ] {
            let c = judge(f, &stop);
            assert_eq!(c.level, Level::Ok, "{c:?}");
            assert!(
                c.found
                    .contains("more than the largest record, 1000000 bytes")
                    && c.found.contains("stops the relay with the row's position"),
                "{c:?}"
            );
        }
        let c = judge(facts("longtext", Some(4_294_967_295), Some(2)), &stop);
        assert!(
            c.found.starts_with(
                "column \"payload\" longtext holds up to 4294967295 bytes (4 GiB), a row at most \
                 max_allowed_packet = 67108864 (64 MiB): more than the largest record"
            ) && c
                .found
                .contains("the largest payload of the newest 3 rows is 2 bytes"),
            "{c:?}"
        );
        // Rows within 10 % of the limit, or over it: a warning with the numbers, the fate of
        // such a row by dead_letter, and the fix.
        let near = judge(facts("longtext", Some(4_294_967_295), Some(920_000)), &dlq);
        assert_eq!(near.level, Level::Warn);
        assert!(
            near.found.starts_with(
                "the largest payload of the newest 3 rows is 920000 bytes: within 10 %"
            ),
            "{near:?}"
        );
        assert!(
            near.fix
                .contains("goes to the dead-letter topic outbox.dlq without its value")
                && near.fix.contains("Raise \"message.max.bytes\""),
            "{near:?}"
        );
        let over = judge(
            facts("mediumblob", Some(16_777_215), Some(2_000_000)),
            &stop,
        );
        assert_eq!(over.level, Level::Warn);
        assert!(over.found.contains("2000000 bytes: over it"), "{over:?}");
        assert!(over.fix.contains("stops the relay"), "{over:?}");
    }

    #[test]
    fn templates_name_the_topics_they_can_render() {
        let shape = |extra: &str| TopicShape::of(&mapping(extra));
        assert!(shape("topic = \"orders\"\n").is_none(), "a fixed topic");
        let default = shape("").expect("templated");
        assert_eq!(default.text, "outbox.event.{aggregate_type}");
        assert!(default.names("outbox.event.Order"));
        assert!(default.names("outbox.event.a.b"));
        assert!(!default.names("outbox.event."));
        assert!(!default.names("other.event.Order"));
        let two = shape("topic = \"{database}.{aggregate_type}.v1.{event_type}\"\n").expect("t");
        assert_eq!(two.text, "shop.{aggregate_type}.v1.{event_type}");
        assert!(two.names("shop.Order.v1.Created"));
        assert!(two.names("shop.Order.v1.v1.Created"));
        assert!(!two.names("shop.Order.v1."));
        assert!(!two.names("shop..v1.Created"));
        assert!(!two.names("billing.Order.v1.Created"));
    }

    #[test]
    fn auto_creation_is_said_and_relied_on_topics_warn() {
        let creation = |auto_create| TopicCreation {
            auto_create,
            partitions: Some("1".into()),
            replication: Some("1".into()),
            bootstrap: "kafka:9092".into(),
            own: vec!["outbox.event.dead_letter".into()],
        };
        let on = creation(Some(true));
        let line = on.check();
        assert_eq!(line.level, Level::Ok);
        assert!(
            line.found.contains("auto.create.topics.enable=true")
                && line
                    .found
                    .contains("num.partitions = 1 and default.replication.factor = 1")
                && line
                    .found
                    .contains("with the partitions and replication you want"),
            "{line:?}"
        );
        let existing = vec![
            "orders".to_owned(),
            "outbox.event.Order".to_owned(),
            "outbox.event.dead_letter".to_owned(),
        ];
        assert_eq!(
            on.fixed("topic of shop.outbox orders", "orders", &existing)
                .level,
            Level::Ok
        );
        let missing = on.fixed("topic of shop.outbox payments", "payments", &existing);
        assert_eq!(missing.level, Level::Warn);
        assert_eq!(
            missing.fix,
            "create it: kafka-topics.sh --bootstrap-server kafka:9092 --create --topic payments \
             --partitions N --replication-factor R"
        );
        let off = creation(Some(false));
        assert_eq!(off.fixed("t", "payments", &existing).level, Level::Fail);
        // A template: the existing topics it names (OK), or none (a warning either way).
        let m = mapping("");
        let named = on.templated(&m, &existing);
        assert_eq!(named.level, Level::Ok);
        assert!(
            named.found.starts_with(
                "outbox.event.{aggregate_type} names 1 existing topic(s): outbox.event.Order; \
                 a topic it names that does not exist is created by the brokers"
            ),
            "{named:?}"
        );
        for c in [on.templated(&m, &[]), off.templated(&m, &[])] {
            assert_eq!(c.level, Level::Warn, "{c:?}");
            assert!(
                c.fix.contains("--topic outbox.event.<aggregate_type>"),
                "{c:?}"
            );
        }
        assert!(off.templated(&m, &existing).found.contains("are refused"));
    }

    #[test]
    fn the_record_limit_is_the_smaller_of_producer_and_topic() {
        let producer = ProducerLimits {
            message_max_bytes: 1_000_000,
            batch_size: 1_000_000,
            compresses: false,
        };
        let fixed = mapping("topic = \"orders\"\n");
        let mut limits = TopicLimits::default();
        limits.topics.insert("orders".into(), 500_000);
        let l = limits.record_limit(&fixed, &producer);
        assert_eq!(l.bytes, 500_000 - RECORD_BATCH_OVERHEAD);
        assert!(
            l.by.starts_with("max.message.bytes = 500000 of topic orders"),
            "{l:?}"
        );
        // Templated topics the brokers create: their default; a larger one leaves the producer's.
        let templated = mapping("");
        limits.created = Some(2_000_000);
        assert_eq!(limits.record_limit(&templated, &producer).bytes, 1_000_000);
        limits.created = Some(300_000);
        let l = limits.record_limit(&templated, &producer);
        assert_eq!(l.bytes, 300_000 - RECORD_BATCH_OVERHEAD);
        assert!(
            l.by.contains("of the brokers, for the topics they create"),
            "{l:?}"
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
