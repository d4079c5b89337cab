//! `outbox-relay migrate [--outbox]`: creates or upgrades the checkpoint table (and, with
//! `--outbox`, creates missing outbox tables in the common shape and makes an existing one's
//! unique `event_key` compare byte for byte) from the SQL in `migrations/`, embedded in the
//! binary. Idempotent: the SQL is `CREATE TABLE IF NOT EXISTS` plus `ALTER TABLE` statements
//! that run only when their column is missing or still of the old type. Records nothing else
//! (no migration history table).

use std::fmt;

use mysql_async::prelude::Queryable;
use mysql_async::Conn;

use outbox_relay_core::config::{ColumnMapping, RelayConfig, TableName};
use outbox_relay_core::error::RelayError;
use outbox_relay_core::outbox::mapping::TableMapping;
use outbox_relay_mysql::preflight::column_names;

use super::grants::{with_other_mysql_user, Needed};

/// `migrations/0001_outbox.sql`: the common outbox shape.
pub const OUTBOX_SQL: &str = include_str!("../../../../migrations/0001_outbox.sql");
/// `migrations/0002_checkpoint.sql`: the checkpoint table, idempotent, with upgrades.
pub const CHECKPOINT_SQL: &str = include_str!("../../../../migrations/0002_checkpoint.sql");
/// `migrations/0007_outbox_event_key.sql`: an older outbox table's unique `event_key` in a NO
/// PAD binary collation, idempotent.
pub const OUTBOX_KEY_SQL: &str = include_str!("../../../../migrations/0007_outbox_event_key.sql");

/// What happened to one table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It did not exist and was created.
    Created,
    /// It existed; these columns were added (`added`), given a larger type (`widened`, as
    /// `column type`: the state table's `table_layouts` from `TEXT` to `MEDIUMTEXT`) or a
    /// byte-exact collation (`collated`, as `column collation`: an outbox's `event_key`).
    Upgraded {
        /// Columns added.
        added: Vec<String>,
        /// Columns whose type was widened, with the new type.
        widened: Vec<String>,
        /// Columns now compared byte for byte, with their new collation.
        collated: Vec<String>,
    },
    /// It existed with everything; nothing changed.
    UpToDate,
}

/// The tables `migrate` looked at.
#[derive(Debug, Clone)]
pub struct MigrateReport {
    /// (`table`, what happened), checkpoint table first.
    pub tables: Vec<(TableName, Outcome)>,
}

/// Runs the migrations for `config` (the outbox tables too with `outbox`).
///
/// # Errors
/// [`RelayError::Config`] for a table name the SQL cannot take (only `[A-Za-z0-9_$]`), a table
/// pattern with `outbox` (it names no table to create), or an
/// outbox mapping whose column names differ from the common shape (create such a table
/// yourself); server errors otherwise (an access error as [`RelayError::Prerequisite`]).
pub async fn migrate(config: &RelayConfig, outbox: bool) -> Result<MigrateReport, RelayError> {
    let table = config.checkpoint_table()?;
    let mappings = if outbox {
        config.table_mappings()?
    } else {
        Vec::new()
    };
    plain_name(&table)?;
    if let Some(p) = mappings.iter().find_map(|m| m.pattern.as_ref()) {
        return Err(RelayError::Config(format!(
            "migrate --outbox cannot create the outbox tables of the pattern {p}: a pattern names \
             no table to create. Create each matching table yourself (migrations/0001_outbox.sql \
             has the common shape; the relay picks it up while running), or run `migrate` \
             without --outbox for the checkpoint table only"
        )));
    }
    for m in &mappings {
        plain_name(&m.table)?;
    }
    let mut conn = super::connect(config).await?;
    let mut report = MigrateReport { tables: Vec::new() };
    let before = column_names(&mut conn, &table).await?;
    let layouts_before = layouts_type(&mut conn, &table).await?;
    if checkpoint_up_to_date(&before, layouts_before.as_deref()) {
        // Nothing to run: no DDL privilege needed, so the relay's own user may run it.
        report.tables.push((table.clone(), Outcome::UpToDate));
    } else {
        let (purpose, statement) = if before.is_empty() {
            (
                format!("to create the checkpoint table {table}"),
                format!("CREATE TABLE IF NOT EXISTS {} (…)", table.quoted()),
            )
        } else {
            (
                format!("to upgrade the checkpoint table {table}"),
                format!(
                    "CREATE TABLE IF NOT EXISTS {0} (…), then ALTER TABLE {0} … \
                     (migrations/0002_checkpoint.sql)",
                    table.quoted()
                ),
            )
        };
        let needed = Needed {
            privileges: "CREATE, ALTER".into(),
            on: table.quoted(),
            purpose,
            statement,
            instead: with_other_mysql_user(config, DDL_USER),
        };
        if let Err(e) = run_in(&mut conn, &table.database, &checkpoint_sql(&table.table)).await {
            return Err(needed.explain(&mut conn, e).await);
        }
        let after = column_names(&mut conn, &table).await?;
        let layouts_after = layouts_type(&mut conn, &table).await?;
        let mut done = outcome(&before, &after);
        if let (Some(was), Some(now)) = (&layouts_before, &layouts_after) {
            if was != now {
                let widened = vec![format!("table_layouts {now}")];
                done = match done {
                    Outcome::Upgraded { added, .. } => Outcome::Upgraded {
                        added,
                        widened,
                        collated: Vec::new(),
                    },
                    _ => Outcome::Upgraded {
                        added: Vec::new(),
                        widened,
                        collated: Vec::new(),
                    },
                };
            }
        }
        report.tables.push((table, done));
    }
    for m in &mappings {
        let before = column_names(&mut conn, &m.table).await?;
        if !before.is_empty() {
            let done = upgrade_event_key(&mut conn, config, m).await?;
            report.tables.push(((*m.table).clone(), done));
            continue;
        }
        common_shape(m)?;
        let needed = Needed {
            privileges: "CREATE".into(),
            on: m.table.quoted(),
            purpose: format!("to create the outbox table {} (--outbox)", m.table),
            statement: format!("CREATE TABLE IF NOT EXISTS {} (…)", m.table.quoted()),
            instead: with_other_mysql_user(config, DDL_USER),
        };
        if let Err(e) = run_in(&mut conn, &m.table.database, &outbox_sql(&m.table.table)).await {
            return Err(needed.explain(&mut conn, e).await);
        }
        report.tables.push(((*m.table).clone(), Outcome::Created));
    }
    let _ = conn.disconnect().await;
    Ok(report)
}

fn outcome(before: &[String], after: &[String]) -> Outcome {
    if before.is_empty() {
        return Outcome::Created;
    }
    let added: Vec<String> = after
        .iter()
        .filter(|c| !before.iter().any(|b| b.eq_ignore_ascii_case(c)))
        .cloned()
        .collect();
    if added.is_empty() {
        Outcome::UpToDate
    } else {
        Outcome::Upgraded {
            added,
            widened: Vec::new(),
            collated: Vec::new(),
        }
    }
}

/// An existing outbox table of the common shape whose unique `event_key` is a `VARCHAR` not yet
/// compared byte for byte gets `migrations/0007_outbox_event_key.sql`. Other tables are left as
/// they are (`check` warns about a loose key and names the ALTER).
async fn upgrade_event_key(
    conn: &mut Conn,
    config: &RelayConfig,
    m: &TableMapping,
) -> Result<Outcome, RelayError> {
    if common_shape(m).is_err() {
        return Ok(Outcome::UpToDate);
    }
    let before = event_key_collation(conn, &m.table).await?;
    if before.as_deref().is_none_or(nopad_binary) {
        // Nothing to run: no ALTER privilege needed.
        return Ok(Outcome::UpToDate);
    }
    let needed = Needed {
        privileges: "ALTER".into(),
        on: m.table.quoted(),
        purpose: format!(
            "to make the unique event_key of the outbox table {} compare byte for byte",
            m.table
        ),
        statement: format!(
            "ALTER TABLE {} MODIFY `event_key` … COLLATE … (migrations/0007_outbox_event_key.sql)",
            m.table.quoted()
        ),
        instead: with_other_mysql_user(config, DDL_USER),
    };
    if let Err(e) = run_in(conn, &m.table.database, &outbox_key_sql(&m.table.table)).await {
        return Err(needed.explain(conn, e).await);
    }
    Ok(match event_key_collation(conn, &m.table).await? {
        Some(now) if before.as_deref() != Some(now.as_str()) => Outcome::Upgraded {
            added: Vec::new(),
            widened: Vec::new(),
            collated: vec![format!("event_key {now}")],
        },
        // A server without a NO PAD binary collation (MySQL before 8.0.17).
        _ => Outcome::UpToDate,
    })
}

/// Whether `collation` compares byte for byte without padding.
fn nopad_binary(collation: &str) -> bool {
    matches!(collation, "utf8mb4_nopad_bin" | "utf8mb4_0900_bin")
}

/// The collation of `table`'s `event_key` when it is a `VARCHAR` in a unique key.
async fn event_key_collation(
    conn: &mut Conn,
    table: &TableName,
) -> Result<Option<String>, RelayError> {
    Ok(conn
        .exec_first(
            "SELECT c.COLLATION_NAME FROM information_schema.COLUMNS c WHERE c.TABLE_SCHEMA = ? \
             AND c.TABLE_NAME = ? AND c.COLUMN_NAME = 'event_key' AND c.DATA_TYPE = 'varchar' \
             AND EXISTS (SELECT 1 FROM information_schema.STATISTICS s WHERE s.TABLE_SCHEMA = \
             c.TABLE_SCHEMA AND s.TABLE_NAME = c.TABLE_NAME AND s.COLUMN_NAME = c.COLUMN_NAME \
             AND s.NON_UNIQUE = 0)",
            (&table.database, &table.table),
        )
        .await?)
}

/// The data type of `table`'s `table_layouts` column (`text`, `mediumtext`), if it has one.
async fn layouts_type(conn: &mut Conn, table: &TableName) -> Result<Option<String>, RelayError> {
    use mysql_async::prelude::Queryable;
    Ok(conn
        .exec_first(
            "SELECT LOWER(DATA_TYPE) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? \
             AND TABLE_NAME = ? AND COLUMN_NAME = 'table_layouts'",
            (&table.database, &table.table),
        )
        .await?)
}

/// Runs `sql` (several statements) with `database` as the default database.
async fn run_in(conn: &mut Conn, database: &str, sql: &str) -> Result<(), mysql_async::Error> {
    conn.query_drop(format!("USE `{}`", database.replace('`', "``")))
        .await?;
    conn.query_drop(sql).await
}

/// What [`with_other_mysql_user`] says the other user may do.
const DDL_USER: &str = "create and alter tables (the relay itself needs no DDL privilege)";

/// The columns `migrations/0002_checkpoint.sql` creates, in its order: the first word of each
/// line of its `CREATE TABLE` up to the key.
fn checkpoint_columns() -> Vec<&'static str> {
    CHECKPOINT_SQL
        .lines()
        .skip_while(|l| !l.starts_with("CREATE TABLE"))
        .skip(1)
        .take_while(|l| !l.trim_start().starts_with("PRIMARY KEY"))
        .filter_map(|l| l.split_whitespace().next())
        .collect()
}

/// Whether a checkpoint table with these columns (`before`, empty when it does not exist) and
/// this `table_layouts` type has everything `migrations/0002_checkpoint.sql` would add or widen.
fn checkpoint_up_to_date(before: &[String], layouts: Option<&str>) -> bool {
    !before.is_empty()
        && checkpoint_columns()
            .iter()
            .all(|c| before.iter().any(|b| b.eq_ignore_ascii_case(c)))
        && !matches!(layouts, Some("text" | "tinytext"))
}

/// Table names the SQL files can take by substitution.
fn plain_name(table: &TableName) -> Result<(), RelayError> {
    let ok = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
    };
    if ok(&table.database) && ok(&table.table) {
        Ok(())
    } else {
        Err(RelayError::Config(format!(
            "migrate handles table names of A-Z a-z 0-9 _ $ only; create {table} yourself from \
             the SQL in migrations/"
        )))
    }
}

/// The checkpoint SQL for a table named `name` (in the default database).
pub fn checkpoint_sql(name: &str) -> String {
    CHECKPOINT_SQL
        .replace("`outbox_relay_checkpoint`", &format!("`{name}`"))
        .replace("'outbox_relay_checkpoint'", &format!("'{name}'"))
}

/// The outbox SQL for a table named `name` (in the default database).
pub fn outbox_sql(name: &str) -> String {
    OUTBOX_SQL.replace(
        "CREATE TABLE IF NOT EXISTS outbox (",
        &format!("CREATE TABLE IF NOT EXISTS `{name}` ("),
    )
}

/// The event_key upgrade for an outbox table named `name` (in the default database).
pub fn outbox_key_sql(name: &str) -> String {
    OUTBOX_KEY_SQL
        .replace("`outbox`", &format!("`{name}`"))
        .replace("'outbox'", &format!("'{name}'"))
}

/// `--outbox` creates only tables whose mapping uses the common column names.
fn common_shape(m: &TableMapping) -> Result<(), RelayError> {
    let d = ColumnMapping::default();
    let c = &m.columns;
    let same = c.id == d.id
        && c.aggregate_type == d.aggregate_type
        && c.aggregate_id == d.aggregate_id
        && c.event_type == d.event_type
        && c.event_key == d.event_key
        && c.payload == d.payload
        && (c.created_at == d.created_at || c.created_at.is_empty())
        && c.partition.is_empty()
        && m.additional.is_empty();
    if same {
        Ok(())
    } else {
        Err(RelayError::Config(format!(
            "outbox table {} does not exist and its mapping names other columns than the common \
             shape of migrations/0001_outbox.sql (or extra ones): create it yourself, then run \
             migrate without --outbox",
            m.table
        )))
    }
}

impl fmt::Display for MigrateReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (table, outcome)) in self.tables.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            match outcome {
                Outcome::Created => write!(f, "{table}: created")?,
                Outcome::Upgraded {
                    added,
                    widened,
                    collated,
                } => {
                    let mut parts = Vec::new();
                    if !added.is_empty() {
                        parts.push(format!("added {}", added.join(", ")));
                    }
                    if !widened.is_empty() {
                        parts.push(format!("widened {}", widened.join(", ")));
                    }
                    if !collated.is_empty() {
                        parts.push(format!("compares {} byte for byte", collated.join(", ")));
                    }
                    write!(f, "{table}: upgraded ({})", parts.join("; "))?
                }
                Outcome::UpToDate => write!(f, "{table}: up to date (unchanged)")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_up_to_date_checkpoint_table_needs_no_statement() {
        let columns = checkpoint_columns();
        assert_eq!(
            columns,
            [
                "connector_name",
                "binlog_file",
                "binlog_pos",
                "rows_acked",
                "gtid_set",
                "source_server_id",
                "source_server_uuid",
                "lease_token",
                "lease_owner",
                "table_layouts",
                "updated_at"
            ]
        );
        let all: Vec<String> = columns.iter().map(|c| c.to_ascii_uppercase()).collect();
        assert!(checkpoint_up_to_date(&all, Some("mediumtext")));
        assert!(!checkpoint_up_to_date(&all, Some("text")));
        assert!(!checkpoint_up_to_date(&[], None));
        let without_owner: Vec<String> = all
            .iter()
            .filter(|c| *c != "LEASE_OWNER")
            .cloned()
            .collect();
        assert!(!checkpoint_up_to_date(&without_owner, Some("mediumtext")));
    }

    #[test]
    fn the_embedded_sql_is_renamed_everywhere() {
        let sql = checkpoint_sql("relay_state");
        assert!(!sql.contains("`outbox_relay_checkpoint`"), "{sql}");
        assert!(!sql.contains("'outbox_relay_checkpoint'"), "{sql}");
        assert!(sql.contains("CREATE TABLE IF NOT EXISTS `relay_state` ("));
        assert_eq!(
            sql.matches("ALTER TABLE `relay_state` ADD COLUMN").count(),
            4
        );
        assert_eq!(
            sql.matches("ALTER TABLE `relay_state` MODIFY COLUMN table_layouts MEDIUMTEXT")
                .count(),
            1
        );
        assert_eq!(sql.matches("TABLE_NAME = 'relay_state'").count(), 5);
        let sql = outbox_sql("events");
        assert!(
            sql.contains("CREATE TABLE IF NOT EXISTS `events` ("),
            "{sql}"
        );
        let sql = outbox_key_sql("events");
        assert!(!sql.contains("`outbox`"), "{sql}");
        assert!(!sql.contains("'outbox'"), "{sql}");
        assert_eq!(sql.matches("ALTER TABLE `events` MODIFY").count(), 1);
        assert_eq!(sql.matches("TABLE_NAME = 'events'").count(), 1);
    }
}
