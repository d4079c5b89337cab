//! Start-up checks of the source server: binlog settings, outbox tables, current position.
//!
//! Each failed check names the setting, what the relay needs, what the server has, and the fix.

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row};

use crate::server::flavor::{BINLOG_STATUS, ER_PARSE_ERROR};
use crate::server::Flavor;
use outbox_relay_core::config::TableName;
use outbox_relay_core::error::RelayError;
use outbox_relay_core::outbox::mapping::{mapping_of, TableMapping};
use outbox_relay_core::outbox::pattern::{self, TablePattern};
use outbox_relay_core::position::BinlogPosition;

/// What the relay learned about the source server.
#[derive(Debug, Clone)]
pub struct ServerInfo {
    /// MariaDB or MySQL.
    pub flavor: Flavor,
    /// `@@version`.
    pub version: String,
    /// `@@server_id`.
    pub server_id: u32,
    /// `@@server_uuid` (MySQL only).
    pub server_uuid: Option<String>,
    /// Table maps carry column names (`binlog_row_metadata=FULL`); otherwise the relay follows
    /// the outbox tables' layouts itself (see [`crate::decode::schema`]).
    pub row_metadata_full: bool,
}

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Met.
    Ok,
    /// Works, but not as recommended (or could not be verified); the relay still runs.
    Warn,
    /// Not met: the relay refuses to start (or would fail later).
    Fail,
}

impl Level {
    /// `OK`, `WARN` or `FAIL`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "OK",
            Self::Warn => "WARN",
            Self::Fail => "FAIL",
        }
    }
}

/// The outcome of one prerequisite check: the setting or object, what the relay needs, what the
/// server has and, unless it is met, the exact fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// Outcome.
    pub level: Level,
    /// The setting or object (`binlog_format`, `outbox table shop.outbox`).
    pub name: String,
    /// What the relay needs.
    pub expected: String,
    /// What the server has.
    pub found: String,
    /// How to fix it (empty when met).
    pub fix: String,
}

impl Check {
    /// A met check.
    pub fn ok(name: impl Into<String>, found: impl Into<String>) -> Self {
        Self {
            level: Level::Ok,
            name: name.into(),
            expected: String::new(),
            found: found.into(),
            fix: String::new(),
        }
    }

    /// A check that is not met (`level` [`Level::Warn`] or [`Level::Fail`]).
    pub fn not_met(
        level: Level,
        name: impl Into<String>,
        expected: impl Into<String>,
        found: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self {
            level,
            name: name.into(),
            expected: expected.into(),
            found: found.into(),
            fix: fix.into(),
        }
    }

    /// The start-up error for this check ([`RelayError::Prerequisite`]).
    pub fn into_error(self) -> RelayError {
        RelayError::Prerequisite {
            setting: self.name,
            expected: self.expected,
            found: self.found,
            fix: self.fix,
        }
    }
}

/// The first failed check as the start-up error.
fn first_failure(checks: Vec<Check>) -> Result<(), RelayError> {
    match checks.into_iter().find(|c| c.level == Level::Fail) {
        Some(c) => Err(c.into_error()),
        None => Ok(()),
    }
}

/// Whether the relay can read tables whose table map events carry no column names
/// (`binlog_row_metadata=MINIMAL`) by tracking their layout from `information_schema` and the
/// DDL in the binlog ([`crate::decode::schema`]): MINIMAL is then a warning, not a failure. (`NO_LOG`
/// stays a failure: without signedness metadata an UNSIGNED id could not be told apart.)
pub const LAYOUT_TRACKING: bool = true;

/// Reads the server's identity (`@@version`, `@@server_id`, on MySQL `@@server_uuid`).
///
/// # Errors
/// [`RelayError::Mysql`] when the server cannot be queried.
pub async fn server_identity(conn: &mut Conn) -> Result<ServerInfo, RelayError> {
    let version: String = conn
        .query_first("SELECT @@version")
        .await?
        .unwrap_or_default();
    let flavor = Flavor::of_version(&version);
    let server_id: u32 = conn.query_first("SELECT @@server_id").await?.unwrap_or(0);
    let server_uuid: Option<String> = match flavor.server_uuid_variable() {
        Some(variable) => conn.query_first(format!("SELECT {variable}")).await?,
        None => None,
    };
    Ok(ServerInfo {
        flavor,
        version,
        server_id,
        server_uuid,
        row_metadata_full: true,
    })
}

/// The binlog settings [`evaluate_binlog_settings`] looks at, from `SHOW GLOBAL VARIABLES`
/// (names as the server spells them, values as it prints them).
///
/// # Errors
/// [`RelayError::Mysql`] when the server cannot be queried.
pub async fn binlog_variables(conn: &mut Conn) -> Result<Vec<(String, String)>, RelayError> {
    let rows: Vec<Row> = conn
        .query(
            "SHOW GLOBAL VARIABLES WHERE Variable_name IN \
             ('log_bin', 'binlog_format', 'binlog_row_image', 'binlog_row_metadata', \
             'log_slave_updates', 'log_replica_updates')",
        )
        .await?;
    Ok(rows
        .into_iter()
        .filter_map(|r| mysql_async::from_row_opt::<(String, String)>(r).ok())
        .collect())
}

/// Evaluates the binlog settings `vars` (see [`binlog_variables`]) of a `flavor` server:
/// `log_bin=ON`, `binlog_format=ROW`, `binlog_row_image=FULL`, `binlog_row_metadata=FULL`
/// (where the server has it; MINIMAL is a warning when `layout_tracking`, else a failure) and,
/// when the server is itself a `replica`, `log_slave_updates`/`log_replica_updates=ON`. One
/// [`Check`] per setting, in that order, each failure with its fix.
pub fn evaluate_binlog_settings(
    flavor: Flavor,
    vars: &[(String, String)],
    replica: bool,
    layout_tracking: bool,
) -> Vec<Check> {
    let get = |name: &str| {
        vars.iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.to_ascii_uppercase())
    };
    let cnf = flavor.config_section();
    let require = |name: &str, expected: &str, fix: String| -> Check {
        let found = get(name).unwrap_or_else(|| "(not set)".into());
        if found == expected {
            Check::ok(name, found)
        } else {
            Check::not_met(Level::Fail, name, expected, found, fix)
        }
    };
    let mut out = vec![
        require(
            "log_bin",
            "ON",
            format!("enable the binary log: add log_bin (and a server_id) to {cnf} in the server's config and restart it"),
        ),
        require(
            "binlog_format",
            "ROW",
            format!(
                "SET GLOBAL binlog_format=ROW and add binlog_format=ROW to {cnf}; sessions that are \
                 already connected keep their old format until they reconnect"
            ),
        ),
        require(
            "binlog_row_image",
            "FULL",
            format!("SET GLOBAL binlog_row_image=FULL and add binlog_row_image=FULL to {cnf}"),
        ),
    ];
    if get("binlog_row_metadata").is_some() {
        let mut c = require(
            "binlog_row_metadata",
            "FULL",
            format!(
                "SET GLOBAL binlog_row_metadata=FULL and add binlog_row_metadata=FULL to {cnf} \
                 (the relay reads column names from the binlog's table map events; MINIMAL also \
                 works, with the layouts followed from information_schema; NO_LOG cannot: its \
                 table maps carry neither column names nor signedness and character sets)"
            ),
        );
        if layout_tracking && c.level == Level::Fail && c.found == "MINIMAL" {
            c.level = Level::Warn;
            c.expected = "FULL (recommended; MINIMAL works with layout tracking)".into();
        }
        out.push(c);
    }
    // A replica writes what it applies to its own binlog only with log_slave_updates: without
    // it, the primary's outbox rows would never reach the binlog the relay reads.
    if replica {
        let name = if get("log_replica_updates").is_some() {
            "log_replica_updates"
        } else {
            "log_slave_updates"
        };
        out.push(require(
            name,
            "ON",
            format!(
                "this server is a replica: add {name}=ON to {cnf} and restart it (rows it \
                 replicates are not in its binlog otherwise), or point mysql.url at the primary"
            ),
        ));
    }
    out
}

/// Reads the server's identity and checks `log_bin`, `binlog_format`, `binlog_row_image` and
/// (where the server has it) `binlog_row_metadata`.
///
/// # Errors
/// [`RelayError::Prerequisite`] for the first setting that is wrong; [`RelayError::Mysql`] when
/// the server cannot be queried.
pub async fn check_server(conn: &mut Conn) -> Result<ServerInfo, RelayError> {
    let mut info = server_identity(conn).await?;
    let vars = binlog_variables(conn).await?;
    let metadata = vars
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("binlog_row_metadata"))
        .map(|(_, v)| v.to_ascii_uppercase());
    // Servers without the setting (MariaDB before 10.5, MySQL 5.7) log no names either.
    info.row_metadata_full = metadata.as_deref() == Some("FULL");
    // Settings before the replica question, as the first failure is reported (NO_LOG among
    // them: said before any word about following layouts).
    first_failure(evaluate_binlog_settings(
        info.flavor,
        &vars,
        false,
        LAYOUT_TRACKING,
    ))?;
    if !info.row_metadata_full {
        tracing::warn!(binlog_row_metadata = ?metadata,
            "table maps carry no column names: the relay follows the outbox tables' layouts from \
             information_schema and the DDL in the binlog; binlog_row_metadata=FULL is simpler \
             and recommended");
    }
    if is_replica(conn, info.flavor).await {
        first_failure(evaluate_binlog_settings(
            info.flavor,
            &vars,
            true,
            LAYOUT_TRACKING,
        ))?;
    }
    Ok(info)
}

/// `true` when the server replicates from another (it has a replication source configured).
/// Without the privilege to ask, assume not (the check is then skipped, with a log line).
pub async fn is_replica(conn: &mut Conn, flavor: Flavor) -> bool {
    match conn
        .query::<Row, _>(flavor.replica_status_statement())
        .await
    {
        Ok(rows) => !rows.is_empty(),
        Err(e) => {
            tracing::debug!(error = %e, "cannot read replica status; skipping the log_slave_updates check");
            false
        }
    }
}

/// The server's current end of binlog (`SHOW MASTER STATUS`, or `SHOW BINARY LOG STATUS` on
/// MySQL 8.4+, where the old statement was removed: [`BINLOG_STATUS`]), and on MySQL the
/// executed GTID set at that same point (its `Executed_Gtid_Set` column,
/// [`Flavor::executed_gtid_column`]; `None` when empty, e.g. `gtid_mode=OFF`).
///
/// # Errors
/// [`RelayError::Mysql`] when the statement fails or returns nothing (binary log off, or missing
/// REPLICATION CLIENT privilege).
pub async fn current_position(
    conn: &mut Conn,
    flavor: Flavor,
) -> Result<(BinlogPosition, Option<String>), RelayError> {
    let [old, new] = BINLOG_STATUS;
    let row: Option<Row> = match conn.query_first(old).await {
        Ok(row) => row,
        Err(e) if flavor.binlog_status_fallback(&e) => {
            if !matches!(&e, mysql_async::Error::Server(s) if s.code == ER_PARSE_ERROR) {
                tracing::debug!(error = %e, "SHOW MASTER STATUS failed; trying SHOW BINARY LOG STATUS");
            }
            conn.query_first(new).await?
        }
        Err(e) => return Err(e.into()),
    };
    let row = row.ok_or_else(|| RelayError::Prerequisite {
        setting: "SHOW MASTER STATUS".into(),
        expected: "the current binlog file and position".into(),
        found: "no rows".into(),
        fix: "enable log_bin and grant the relay's user REPLICATION CLIENT".into(),
    })?;
    let file: Option<String> = row.get(0);
    let pos: Option<u64> = row.get(1);
    let executed: Option<String> = flavor
        .executed_gtid_column()
        .and_then(|column| row.get::<Option<String>, _>(column).flatten())
        .filter(|g| !g.trim().is_empty());
    match (file, pos) {
        (Some(file), Some(pos)) => Ok((BinlogPosition::new(file, pos), executed)),
        _ => Err(RelayError::mysql(
            "SHOW MASTER STATUS returned an unexpected row",
        )),
    }
}

/// The rows of `information_schema.COLUMNS` for `tables`, in table and column order, each with
/// its table: `SELECT TABLE_SCHEMA, TABLE_NAME, {select} … {and}`. An exact name is one query on
/// its name, as before patterns; a pattern (`tenant_*.outbox`) one query filtered in SQL with
/// `LIKE` on both parts (so the server reads the columns of candidate tables only, never every
/// table's), whose rows are then kept only for tables the pattern matches
/// ([`TablePattern::matches`], which decides case and the literal `_` and `%`).
async fn column_rows(
    conn: &mut Conn,
    tables: &[TableName],
    select: &str,
    and: &str,
) -> Result<Vec<(TableName, Row)>, RelayError> {
    let mut out = Vec::new();
    for table in tables {
        match TablePattern::of(table) {
            None => {
                let rows: Vec<Row> = conn
                    .exec(
                        format!(
                            "SELECT TABLE_SCHEMA, TABLE_NAME, {select} \
                             FROM information_schema.COLUMNS \
                             WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? {and} \
                             ORDER BY ORDINAL_POSITION"
                        ),
                        (&table.database, &table.table),
                    )
                    .await?;
                out.extend(rows.into_iter().map(|r| (table.clone(), r)));
            }
            Some(pattern) => {
                let e = pattern::LIKE_ESCAPE;
                let rows: Vec<Row> = conn
                    .exec(
                        format!(
                            "SELECT TABLE_SCHEMA, TABLE_NAME, {select} \
                             FROM information_schema.COLUMNS \
                             WHERE TABLE_SCHEMA LIKE ? ESCAPE '{e}' \
                             AND TABLE_NAME LIKE ? ESCAPE '{e}' {and} \
                             ORDER BY TABLE_SCHEMA, TABLE_NAME, ORDINAL_POSITION"
                        ),
                        (pattern.like_database(), pattern.like_table()),
                    )
                    .await?;
                for row in rows {
                    let (Some(database), Some(name)) =
                        (row.get::<String, _>(0), row.get::<String, _>(1))
                    else {
                        continue;
                    };
                    let name = TableName {
                        database,
                        table: name,
                    };
                    if pattern.matches(&name) {
                        out.push((name, row));
                    }
                }
            }
        }
    }
    Ok(out)
}

/// The tables `names` stand for on the server now, sorted: each exact name as it is (whether
/// it exists or not), each pattern's matching base tables (`information_schema.TABLES`, one
/// query per pattern filtered with `LIKE`, then [`TablePattern::matches`]). For the commands
/// that need the concrete tables (`cutover`, `prune`, `republish`, `trace`, `check`).
///
/// # Errors
/// The query fails.
pub async fn resolve_tables(
    conn: &mut Conn,
    names: &[TableName],
) -> Result<Vec<TableName>, RelayError> {
    let mut out = std::collections::BTreeSet::new();
    for name in names {
        match TablePattern::of(name) {
            None => {
                out.insert(name.clone());
            }
            Some(pattern) => out.extend(matching_tables(conn, &pattern).await?),
        }
    }
    Ok(out.into_iter().collect())
}

/// The base tables that match `pattern` now, sorted.
///
/// # Errors
/// The query fails.
pub async fn matching_tables(
    conn: &mut Conn,
    pattern: &TablePattern,
) -> Result<Vec<TableName>, RelayError> {
    let e = pattern::LIKE_ESCAPE;
    let rows: Vec<(String, String)> = conn
        .exec(
            format!(
                "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES \
                 WHERE TABLE_SCHEMA LIKE ? ESCAPE '{e}' AND TABLE_NAME LIKE ? ESCAPE '{e}' \
                 AND TABLE_TYPE = 'BASE TABLE' ORDER BY TABLE_SCHEMA, TABLE_NAME"
            ),
            (pattern.like_database(), pattern.like_table()),
        )
        .await?;
    Ok(rows
        .into_iter()
        .map(|(database, table)| TableName { database, table })
        .filter(|t| pattern.matches(t))
        .collect())
}

/// The mappings of the tables `mappings` stand for on the server now: each exact name's
/// mapping, and for each pattern one mapping per matching table ([`mapping_of`]: an exact name
/// wins over a pattern, the first pattern over later ones), each table once.
///
/// # Errors
/// The query fails.
pub async fn resolve_mappings(
    conn: &mut Conn,
    mappings: &[TableMapping],
) -> Result<Vec<TableMapping>, RelayError> {
    let mut out: Vec<TableMapping> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for m in mappings {
        let tables = match &m.pattern {
            None => vec![(*m.table).clone()],
            Some(p) => matching_tables(conn, p).await?,
        };
        for table in tables {
            if seen.insert(table.clone()) {
                out.extend(mapping_of(mappings, &table));
            }
        }
    }
    Ok(out)
}

/// The fractional-second precision of each DATETIME, TIME and TIMESTAMP column of `tables`
/// (lower-case column name → `DATETIME_PRECISION`), for the decoder's pre-5.6 temporal formats
/// ([`crate::decode::Decoder::set_temporal_decimals`]). A pattern among `tables` stands for its
/// matching tables ([`column_rows`]); tables without such columns are left out.
///
/// # Errors
/// The query fails.
pub async fn temporal_decimals(
    conn: &mut Conn,
    tables: &[TableName],
) -> Result<Vec<(TableName, std::collections::HashMap<String, u8>)>, RelayError> {
    let rows = column_rows(
        conn,
        tables,
        "COLUMN_NAME, DATETIME_PRECISION",
        "AND DATA_TYPE IN ('datetime', 'time', 'timestamp')",
    )
    .await?;
    let mut out: std::collections::BTreeMap<TableName, std::collections::HashMap<String, u8>> =
        tables
            .iter()
            .filter(|t| TablePattern::of(t).is_none())
            .map(|t| (t.clone(), std::collections::HashMap::new()))
            .collect();
    for (table, row) in rows {
        let name: String = row.get(2).unwrap_or_default();
        let precision: Option<u64> = row.get::<Option<u64>, _>(3).flatten();
        out.entry(table)
            .or_default()
            .insert(name.to_lowercase(), precision.unwrap_or(0).min(6) as u8);
    }
    Ok(out.into_iter().collect())
}

/// The W3C trace-context columns (`traceparent`, `tracestate`, any case, in table order) of
/// each outbox table that has some, for `outbox.trace_context`. A pattern among `tables` stands
/// for its matching tables ([`column_rows`]).
///
/// # Errors
/// The query fails.
pub async fn trace_context_columns(
    conn: &mut Conn,
    tables: &[TableName],
) -> Result<std::collections::HashMap<TableName, Vec<String>>, RelayError> {
    let mut out: std::collections::HashMap<TableName, Vec<String>> =
        std::collections::HashMap::new();
    let rows = column_rows(
        conn,
        tables,
        "COLUMN_NAME",
        "AND LOWER(COLUMN_NAME) IN ('traceparent', 'tracestate')",
    )
    .await?;
    for (table, row) in rows {
        out.entry(table)
            .or_default()
            .push(row.get(2).unwrap_or_default());
    }
    Ok(out)
}

/// The outbox tables' column layouts as `information_schema.COLUMNS` has them now (names in
/// ordinal order, ENUM/SET labels), in the checkpoint's `table_layouts` form
/// ([`crate::decode::schema::LayoutTracker::snapshot`]); tables that do not exist are left out.
/// A pattern among `tables` stands for its matching tables ([`column_rows`]).
///
/// # Errors
/// The query fails.
pub async fn current_layouts(
    conn: &mut Conn,
    tables: &[TableName],
) -> Result<Option<std::sync::Arc<str>>, RelayError> {
    let mut tracker = crate::decode::schema::LayoutTracker::new(tables.iter().cloned());
    // COLUMN_TYPE holds the labels of ENUM and SET columns, which table maps without optional
    // metadata lack too.
    let rows = column_rows(conn, tables, "COLUMN_NAME, CAST(COLUMN_TYPE AS CHAR)", "").await?;
    let mut by_table: std::collections::BTreeMap<TableName, Vec<(String, String)>> =
        std::collections::BTreeMap::new();
    for (table, row) in rows {
        by_table.entry(table).or_default().push((
            row.get(2).unwrap_or_default(),
            row.get(3).unwrap_or_default(),
        ));
    }
    for (table, rows) in by_table {
        let labels: crate::decode::schema::Labels = rows
            .iter()
            .filter_map(|(name, ty)| {
                Some((name.clone(), crate::decode::schema::enum_set_labels(ty)?))
            })
            .collect();
        tracker.set(&table, rows.into_iter().map(|(name, _)| name).collect());
        tracker.set_labels(&table, labels);
    }
    Ok(tracker.snapshot())
}

/// `binlog_row_metadata=FULL` on the server (table maps name their columns); `false` where the
/// server has no such setting.
///
/// # Errors
/// The query fails.
pub async fn row_metadata_full(conn: &mut Conn) -> Result<bool, RelayError> {
    let vars = binlog_variables(conn).await?;
    Ok(vars.iter().any(|(n, v)| {
        n.eq_ignore_ascii_case("binlog_row_metadata") && v.eq_ignore_ascii_case("FULL")
    }))
}

/// The current binlog position (as [`current_position`]) together with the outbox tables'
/// column layouts (names, and the labels of ENUM and SET columns) from `information_schema`, read so that they belong together: the position is
/// read before and after the layouts, and the read is repeated until nothing was logged in
/// between (a DDL between the two reads would otherwise pair a layout with the wrong position).
///
/// # Errors
/// As [`current_position`]; [`RelayError::Mysql`] when the binlog keeps moving (a very busy
/// server: 20 attempts).
pub async fn position_with_layouts(
    conn: &mut Conn,
    flavor: Flavor,
    tables: &[TableName],
) -> Result<(BinlogPosition, Option<String>, Option<std::sync::Arc<str>>), RelayError> {
    // The layouts of a pattern's tables are only needed when table maps carry no column names:
    // with FULL they are left out, so a checkpoint does not carry one per tenant.
    let tables: Vec<TableName> =
        if tables.iter().any(pattern::is_pattern) && row_metadata_full(conn).await? {
            tables
                .iter()
                .filter(|t| !pattern::is_pattern(t))
                .cloned()
                .collect()
        } else {
            tables.to_vec()
        };
    let tables = &tables[..];
    for _ in 0..20 {
        let (before, executed) = current_position(conn, flavor).await?;
        let layouts = current_layouts(conn, tables).await?;
        let (after, _) = current_position(conn, flavor).await?;
        if after == before {
            return Ok((before, executed, layouts));
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    Err(RelayError::mysql(
        "the binlog kept moving while the outbox tables' layouts were read (20 attempts); \
         retrying",
    ))
}

/// Evaluates one outbox table from the names of its columns (`have`, from
/// `information_schema.COLUMNS`; empty when the table does not exist or cannot be seen): it must
/// exist and have every column the mapping names ([`TableMapping::required_columns`]).
pub fn evaluate_outbox_columns(mapping: &TableMapping, have: &[String]) -> Check {
    let table = &*mapping.table;
    let name = format!("outbox table {table}");
    if have.is_empty() {
        return Check::not_met(
            Level::Fail,
            name,
            "an existing table",
            "no such table (or no SELECT privilege on it)",
            "create it (migrations/0001_outbox.sql has the common shape), fix \
             outbox.tables, or grant SELECT on it",
        );
    }
    // Column names are case-insensitive in MySQL.
    let missing: Vec<String> = mapping
        .required_columns()
        .into_iter()
        .filter(|(_, name)| !have.iter().any(|h| h.eq_ignore_ascii_case(name)))
        .map(|(key, name)| format!("{name:?} ({key})"))
        .collect();
    if missing.is_empty() {
        let cols: Vec<&str> = mapping
            .required_columns()
            .into_iter()
            .map(|(_, n)| n)
            .collect();
        return Check::ok(name, format!("has the mapped columns {}", cols.join(", ")));
    }
    Check::not_met(
        Level::Fail,
        name,
        "the mapped columns",
        format!(
            "no column {}; it has {}",
            missing.join(", "),
            have.join(", ")
        ),
        "map the table's column names in [outbox.columns] (or the table's \
         [[outbox.table]] entry), or add the columns",
    )
}

/// The names of `table`'s columns (`information_schema.COLUMNS`), in table order.
///
/// # Errors
/// [`RelayError::Mysql`] when the query fails.
pub async fn column_names(
    conn: &mut Conn,
    table: &outbox_relay_core::config::TableName,
) -> Result<Vec<String>, RelayError> {
    Ok(conn
        .exec(
            "SELECT COLUMN_NAME FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION",
            (&table.database, &table.table),
        )
        .await?)
}

/// Checks that each outbox table exists and has the mapped columns. A pattern
/// (`tenant_*.outbox`) may match no table yet (a warning: its tables are relayed once created);
/// each table it matches now is checked with its mapping ([`mapping_of`]).
///
/// # Errors
/// [`RelayError::Prerequisite`] naming the table and the missing columns.
pub async fn check_outbox_tables(
    conn: &mut Conn,
    mappings: &[TableMapping],
) -> Result<(), RelayError> {
    for check in outbox_table_checks(conn, mappings).await? {
        if check.level == Level::Warn {
            tracing::warn!(check = %check.name, found = %check.found, fix = %check.fix,
                "start-up check");
        }
        first_failure(vec![check])?;
    }
    Ok(())
}

/// The checks of [`check_outbox_tables`], one per exact name, per table a pattern matches, and
/// a warning per pattern that matches none (or that has capital letters on a server with
/// `lower_case_table_names` 1, whose names are all lower case).
///
/// # Errors
/// [`RelayError::Mysql`] when a query fails.
pub async fn outbox_table_checks(
    conn: &mut Conn,
    mappings: &[TableMapping],
) -> Result<Vec<Check>, RelayError> {
    let mut checks = Vec::new();
    for mapping in mappings {
        let Some(pattern) = &mapping.pattern else {
            let have = column_names(conn, &mapping.table).await?;
            checks.push(evaluate_outbox_columns(mapping, &have));
            continue;
        };
        let rows =
            column_rows(conn, std::slice::from_ref(&pattern.name), "COLUMN_NAME", "").await?;
        let mut by_table: std::collections::BTreeMap<TableName, Vec<String>> =
            std::collections::BTreeMap::new();
        for (table, row) in rows {
            by_table
                .entry(table)
                .or_default()
                .push(row.get(2).unwrap_or_default());
        }
        if by_table.is_empty() {
            let lower: Option<u64> = conn
                .query_first("SELECT @@lower_case_table_names")
                .await
                .ok()
                .flatten();
            let upper = pattern.name.to_string().chars().any(char::is_uppercase);
            checks.push(Check::not_met(
                Level::Warn,
                format!("outbox table pattern {pattern}"),
                "matching tables (or none yet)",
                "no matching table yet",
                if upper && lower == Some(1) {
                    "the server has lower_case_table_names=1 and stores names in lower case: \
                     write the pattern in lower case"
                        .to_owned()
                } else {
                    "none needed if its tables are created later: they are relayed from their \
                     first INSERT; otherwise fix the pattern (case-sensitive; `*` any run of \
                     characters, `?` one, within the database or the table name)"
                        .to_owned()
                },
            ));
            continue;
        }
        for (table, have) in by_table {
            if let Some(m) = mapping_of(mappings, &table) {
                checks.push(evaluate_outbox_columns(&m, &have));
            }
        }
    }
    Ok(checks)
}

/// Checks that `position` is in a binlog file the server still has and not past its end.
///
/// # Errors
/// [`RelayError::Binlog`] naming the missing position, the available range and the recovery
/// steps: the relay never skips ahead by itself.
pub async fn check_position_available(
    conn: &mut Conn,
    flavor: Flavor,
    position: &BinlogPosition,
) -> Result<(), RelayError> {
    let logs: Vec<Row> = conn.query("SHOW BINARY LOGS").await?;
    let logs: Vec<(String, u64)> = logs
        .into_iter()
        .filter_map(|r| Some((r.get::<String, _>(0)?, r.get::<u64, _>(1)?)))
        .collect();
    let problem = match logs.iter().find(|(name, _)| *name == position.file) {
        None => "its binlog file is no longer on the server (purged, or the binlog history was reset)",
        Some((_, size)) if position.pos > *size => {
            "it lies past the end of that file: the server's binlog history was reset (RESET MASTER) \
             or is a different server's"
        }
        Some(_) => return Ok(()),
    };
    let available = crate::binlog::source::binlog_history(conn, flavor).await?;
    Err(RelayError::binlog(format!(
        "cannot resume from the checkpoint's binlog position {position}: {problem}. The server \
         has: {available}. The relay will not skip ahead by itself. To continue, move this \
         connector's checkpoint with `outbox-relay reset --config <file> --to earliest` (from \
         the oldest binlog the server has; events in between are lost unless replayed from \
         elsewhere) or `--to latest` (the gap is not relayed); stop the relay first"
    )))
}

/// Checks, before the dump, that a MySQL server can send the transactions after the GTID set
/// `set`: it executed every one of them (`GTID_SUBSET(set, @@gtid_executed)`) and purged none
/// it would have to send (`GTID_SUBSET(@@gtid_purged, set)`). The dump itself answers error
/// 1236 then, but the server may close the connection before the client reads that answer.
///
/// # Errors
/// [`RelayError::Binlog`] naming the set, what the server has and the recovery commands.
pub async fn check_gtid_set_available(conn: &mut Conn, set: &str) -> Result<(), RelayError> {
    // MySQL refuses a set holding transactions of its own server_uuid that it has not executed,
    // or missing transactions it purged (others' GTIDs it lacks are fine: a failover).
    let row: Option<(Option<String>, Option<String>, Option<i64>)> = conn
        .exec_first(
            "SELECT GTID_SUBTRACT(?, @@GLOBAL.gtid_executed), @@GLOBAL.server_uuid, \
             GTID_SUBSET(@@GLOBAL.gtid_purged, ?)",
            (set, set),
        )
        .await?;
    let (missing, uuid, not_purged) = row.unwrap_or_default();
    let own_missing = match (missing.as_deref(), uuid.as_deref()) {
        (Some(m), Some(u)) if !u.is_empty() => {
            m.to_ascii_lowercase().contains(&u.to_ascii_lowercase())
        }
        _ => false,
    };
    let problem = if own_missing {
        "it holds transactions of this server that the server has not executed (the checkpoint \
         comes from before a RESET MASTER or from another server with this server_uuid)"
    } else if not_purged == Some(0) {
        "transactions after it were purged from the server's binlog"
    } else {
        return Ok(());
    };
    let has = crate::binlog::source::binlog_history(conn, Flavor::MySql).await?;
    Err(RelayError::binlog(format!(
        "cannot resume from the checkpoint's GTID set {set}: {problem} (the dump would end \
         with error 1236). The server has: {has}. The relay will not skip ahead by itself. To \
         continue, move this connector's checkpoint with `outbox-relay reset --config <file> \
         --to earliest` (from the oldest binlog the server has; events in between are lost \
         unless replayed from elsewhere) or `--to latest` (the gap is not relayed); stop the \
         relay first"
    )))
}

/// Checks, before the dump, that a MariaDB server has written the GTID position `pos` it is
/// asked to continue after (every domain's sequence number at most the server's
/// `@@gtid_binlog_pos`) and still has the binlog after it (nothing after `pos` purged:
/// [`crate::binlog::source::mariadb_gtid_purged`]). In strict mode the dump itself answers error 1236 then, but the server
/// may close the connection before the client reads that answer.
///
/// # Errors
/// [`RelayError::Binlog`] naming the GTIDs, what the server has and the recovery commands.
pub async fn check_mariadb_gtid_available(
    conn: &mut Conn,
    pos: &outbox_relay_core::position::MariadbGtidPos,
) -> Result<(), RelayError> {
    let current: Option<String> = conn.query_first("SELECT @@GLOBAL.gtid_binlog_pos").await?;
    let Ok(current) = current
        .unwrap_or_default()
        .parse::<outbox_relay_core::position::MariadbGtidPos>()
    else {
        return Ok(()); // the dump's own answer decides
    };
    // Domains the server has never written are fine (a failover brings other servers'
    // domains along); a domain it has, at a lower sequence number, is not.
    let ahead: Vec<_> = pos
        .beyond(&current)
        .into_iter()
        .filter(|g| {
            current
                .beyond(&outbox_relay_core::position::MariadbGtidPos::default())
                .iter()
                .any(|c| c.domain_id == g.domain_id)
        })
        .collect();
    if ahead.is_empty() {
        if let Some(purged) = crate::binlog::source::mariadb_gtid_purged(conn, pos).await? {
            let has = crate::binlog::source::binlog_history(conn, Flavor::MariaDb).await?;
            return Err(crate::binlog::source::mariadb_purged_error(
                pos, &purged, &has,
            ));
        }
        return Ok(());
    }
    let ahead: Vec<String> = ahead.iter().map(ToString::to_string).collect();
    let has = crate::binlog::source::binlog_history(conn, Flavor::MariaDb).await?;
    Err(RelayError::binlog(format!(
        "cannot resume from the checkpoint's GTID position {pos}: the server has not written \
         {} (the checkpoint comes from another server or from before a RESET MASTER; the dump \
         would end with error 1236). The server has: {has}. The relay will not skip ahead by \
         itself. To continue, move this connector's checkpoint with `outbox-relay reset \
         --config <file> --to earliest` (from the oldest binlog the server has; events in \
         between are lost unless replayed from elsewhere) or `--to latest` (the gap is not \
         relayed); stop the relay first",
        ahead.join(", ")
    )))
}

/// The replicas and dump clients registered with the server, as (`server_id`, host) from
/// `SHOW SLAVE HOSTS` (MariaDB) or `SHOW REPLICAS` (MySQL; `SHOW SLAVE HOSTS` before 8.0.22,
/// chosen by the error code): [`Flavor::replica_list_statements`]. Returns the statement that
/// answered too.
///
/// # Errors
/// The server's error (MariaDB 10.5+ needs REPLICATION MASTER ADMIN, MySQL REPLICATION SLAVE).
pub async fn list_replicas(
    conn: &mut Conn,
    flavor: Flavor,
) -> Result<(Vec<(u32, String)>, &'static str), mysql_async::Error> {
    let [first, second] = flavor.replica_list_statements();
    let (rows, statement): (Vec<Row>, _) = match conn.query(first).await {
        Ok(rows) => (rows, first),
        Err(mysql_async::Error::Server(e)) if e.code == ER_PARSE_ERROR => {
            (conn.query(second).await?, second)
        }
        Err(e) => return Err(e),
    };
    let replicas = rows
        .into_iter()
        .filter_map(|r| {
            let id: Option<u32> = r.get(0);
            let host: Option<String> = r.get::<Option<String>, _>(1).flatten();
            Some((id?, host.unwrap_or_default()))
        })
        .collect();
    Ok((replicas, statement))
}

/// Evaluates `mysql.server_id` = `server_id` against the source's own `@@server_id` and the
/// registered `replicas` (from `statement`, see [`list_replicas`]). A registration with our own
/// `report_host` is this connector's own (previous) connection, not a collision.
pub fn evaluate_server_id(
    server: &ServerInfo,
    server_id: u32,
    replicas: &[(u32, String)],
    report_host: &str,
    statement: &str,
) -> Check {
    let collision = |found: String| {
        Check::not_met(
            Level::Fail,
            "mysql.server_id",
            "a server_id no other server or replica of this topology uses",
            found,
            "choose another mysql.server_id (unique among the server_id of every server, \
             replica and CDC client connected to this topology)",
        )
    };
    if server.server_id == server_id {
        return collision(format!("{server_id}, the source server's own @@server_id"));
    }
    match replicas.iter().find(|(id, _)| *id == server_id) {
        Some((_, host)) if host != report_host => collision(format!(
            "{server_id}, already registered by a replica or CDC client (host {host:?}) \
             in {statement}"
        )),
        Some(_) => Check::ok(
            "mysql.server_id",
            format!("{server_id}, registered by this connector only"),
        ),
        None => Check::ok(
            "mysql.server_id",
            format!(
                "{server_id}, not used by the server or its {} registered replicas",
                replicas.len()
            ),
        ),
    }
}

/// Checks that no other replica or dump client is registered with `server_id` (the server
/// would drop one of the two connections each time the other connects: a reconnect storm).
/// A registration with our own `report_host` is this connector's previous connection (the
/// lease allows one instance per connector), which the server replaces when we register; one
/// that disappears within `grace` is not a collision either.
///
/// # Errors
/// [`RelayError::Prerequisite`] naming the id and who uses it.
pub async fn check_server_id_unique(
    conn: &mut Conn,
    server: &ServerInfo,
    server_id: u32,
    report_host: &str,
    grace: std::time::Duration,
) -> Result<(), RelayError> {
    let deadline = std::time::Instant::now() + grace;
    loop {
        let (replicas, statement) = match list_replicas(conn, server.flavor).await {
            Ok(r) => r,
            Err(e) => {
                // Needs REPLICATION MASTER ADMIN on MariaDB 10.5+; without it, skip the check.
                tracing::warn!(error = %e, "cannot list replicas: the mysql.server_id \
                    collision check is skipped; grant REPLICATION MASTER ADMIN (MariaDB) or \
                    REPLICATION SLAVE (MySQL) to enable it");
                if server.server_id == server_id {
                    return first_failure(vec![evaluate_server_id(
                        server,
                        server_id,
                        &[],
                        report_host,
                        "",
                    )]);
                }
                return Ok(());
            }
        };
        let check = evaluate_server_id(server, server_id, &replicas, report_host, statement);
        // The source's own id never goes away; a registration may (our previous connection).
        if check.level == Level::Ok
            || server.server_id == server_id
            || std::time::Instant::now() >= deadline
        {
            return first_failure(vec![check]);
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}
