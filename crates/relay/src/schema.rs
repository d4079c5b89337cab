//! Column layouts of the outbox tables, for table maps that carry no column names.
//!
//! With `binlog_row_metadata=FULL` every table map names its columns and nothing here is
//! needed. Without it (MINIMAL, or servers without the setting) a rows event only says "column
//! 3"; the names come from the layout in force when the row was written. That layout is read
//! from `information_schema` once, at a binlog position known to match it (a fresh start), stored
//! with every checkpoint, and followed through the DDL in the binlog (`ALTER TABLE`, `CREATE`,
//! `RENAME`, `DROP`; parsed by [`crate::ddl`]). So a relay far behind an ALTER that the server
//! has long applied still decodes older rows with the older layout.
//!
//! A DDL statement on an outbox table that cannot be followed for sure marks the table's layout
//! unknown: its next rows event without column names stops the relay with the position and the
//! reason; it never guesses. A table map that does carry names always wins and repairs the
//! layout.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::config::TableName;
use crate::ddl::{self, Ddl, Dialect, QualifiedName};
use crate::position::BinlogPosition;
use crate::source::Flavor;

/// A table's layout: its column names in order, or why it is not known.
pub type Layout = Result<Vec<String>, String>;

/// The tracked layouts of the outbox tables.
#[derive(Debug, Clone)]
pub struct LayoutTracker {
    /// Outbox tables.
    outbox: Vec<TableName>,
    /// Layout per outbox table; absent: never learned.
    layouts: BTreeMap<TableName, Layout>,
    dialect: Dialect,
    /// JSON of the known layouts (what a checkpoint stores), rebuilt on change.
    snapshot: Option<Arc<str>>,
}

impl LayoutTracker {
    /// A tracker for `outbox` tables, knowing nothing yet.
    pub fn new(outbox: impl IntoIterator<Item = TableName>) -> Self {
        Self {
            outbox: outbox.into_iter().collect(),
            layouts: BTreeMap::new(),
            dialect: Dialect::new(Flavor::MariaDb, 0),
            snapshot: None,
        }
    }

    /// Sets `table`'s layout (from `information_schema`, a stored checkpoint or a table map with
    /// names).
    pub fn set(&mut self, table: &TableName, columns: Vec<String>) {
        if self.layouts.get(table).and_then(|l| l.as_ref().ok()) != Some(&columns) {
            self.layouts.insert(table.clone(), Ok(columns));
            self.refresh();
        }
    }

    /// `table`'s layout: `None` when never learned.
    pub fn get(&self, table: &TableName) -> Option<Result<&[String], &str>> {
        self.layouts
            .get(table)
            .map(|l| l.as_ref().map(Vec::as_slice).map_err(String::as_str))
    }

    /// The server version from the binlog's FORMAT_DESCRIPTION event (how executable comments
    /// in DDL read).
    pub fn set_server_version(&mut self, version: &str) {
        let flavor = if version.to_ascii_lowercase().contains("mariadb") {
            Flavor::MariaDb
        } else {
            Flavor::MySql
        };
        self.dialect = Dialect::new(flavor, ddl::version_id(version).unwrap_or(0));
    }

    /// Follows a statement from a QUERY event whose default database is `default_db`.
    pub fn observe(&mut self, statement: &str, default_db: &str, position: &BinlogPosition) {
        let touched: Vec<TableName> = self
            .outbox
            .iter()
            .filter(|t| ddl::mentions(statement, &t.table))
            .cloned()
            .collect();
        if touched.is_empty() {
            return;
        }
        let resolve = |q: &QualifiedName| TableName {
            database: q.database.clone().unwrap_or_else(|| default_db.to_owned()),
            table: q.table.clone(),
        };
        let unknown = |why: String| -> Layout {
            Err(format!(
                "the DDL statement at {position} changed the table in a way the relay cannot \
                 follow ({why})"
            ))
        };
        let mut changes: Vec<(TableName, Option<Layout>)> = Vec::new();
        match ddl::parse(statement, &self.dialect) {
            Err(e) => {
                for t in touched {
                    changes.push((t, Some(unknown(e.to_string()))));
                }
            }
            Ok(Ddl::CreateTable {
                table,
                columns,
                if_not_exists,
            }) => {
                let t = resolve(&table);
                if !(if_not_exists && self.layouts.contains_key(&t)) {
                    changes.push((t, Some(Ok(columns))));
                }
            }
            Ok(Ddl::CreateTableLike {
                table,
                like,
                if_not_exists,
            }) => {
                let t = resolve(&table);
                if !(if_not_exists && self.layouts.contains_key(&t)) {
                    let layout = match self.layouts.get(&resolve(&like)) {
                        Some(Ok(columns)) => Ok(columns.clone()),
                        _ => unknown(format!(
                            "CREATE TABLE … LIKE {}, whose layout is not tracked",
                            like.table
                        )),
                    };
                    changes.push((t, Some(layout)));
                }
            }
            Ok(Ddl::CreateTableSelect {
                table,
                if_not_exists,
            }) => {
                let t = resolve(&table);
                if !(if_not_exists && self.layouts.contains_key(&t)) {
                    changes.push((t, Some(unknown("CREATE TABLE … SELECT".into()))));
                }
            }
            Ok(Ddl::DropTable { tables }) => {
                for t in tables {
                    changes.push((resolve(&t), None));
                }
            }
            Ok(Ddl::RenameTable { pairs }) => {
                for (from, to) in pairs {
                    let (from, to) = (resolve(&from), resolve(&to));
                    let layout = self.layouts.get(&from).cloned().unwrap_or_else(|| {
                        unknown(format!("renamed from {from}, whose layout is not tracked"))
                    });
                    changes.push((from, None));
                    changes.push((to, Some(layout)));
                }
            }
            Ok(Ddl::AlterTable { table, ops, .. }) => {
                let t = resolve(&table);
                let layout = match self.layouts.get(&t) {
                    Some(Ok(columns)) => {
                        let mut columns = columns.clone();
                        match ddl::apply(&mut columns, &ops) {
                            Ok(()) => Ok(columns),
                            Err(e) => unknown(e),
                        }
                    }
                    Some(Err(e)) => Err(e.clone()),
                    None => unknown("ALTER TABLE of a table whose layout is not tracked".into()),
                };
                let renamed = ops.iter().rev().find_map(|op| match op {
                    ddl::AlterOp::RenameTable { to } => Some(resolve(to)),
                    _ => None,
                });
                match renamed {
                    Some(to) => {
                        changes.push((t, None));
                        changes.push((to, Some(layout)));
                    }
                    None => changes.push((t, Some(layout))),
                }
            }
            Ok(Ddl::Truncate { .. } | Ddl::Temporary | Ddl::Other) => {}
        }
        let mut changed = false;
        for (table, layout) in changes {
            if !self.outbox.contains(&table) {
                continue;
            }
            changed = true;
            match layout {
                Some(layout) => {
                    if let Err(why) = &layout {
                        tracing::warn!(table = %table, %position, reason = %why,
                            "outbox table layout unknown after DDL; rows logged without column \
                             names will stop the relay");
                    }
                    self.layouts.insert(table, layout);
                }
                None => {
                    self.layouts.remove(&table);
                }
            }
        }
        if changed {
            self.refresh();
        }
    }

    /// The known layouts as JSON (`{"db.table": ["col", …]}`), for the checkpoint; `None` when
    /// nothing is known.
    pub fn snapshot(&self) -> Option<Arc<str>> {
        self.snapshot.clone()
    }

    /// Restores layouts from a checkpoint's JSON.
    ///
    /// # Errors
    /// A message when the JSON is not an object of string arrays.
    pub fn restore(&mut self, json: &str) -> Result<(), String> {
        let stored: BTreeMap<String, Vec<String>> = serde_json::from_str(json)
            .map_err(|e| format!("the stored table layouts are not valid JSON: {e}"))?;
        for (name, columns) in stored {
            let table = TableName::parse(&name, None).map_err(|e| e.to_string())?;
            self.layouts.insert(table, Ok(columns));
        }
        self.refresh();
        Ok(())
    }

    fn refresh(&mut self) {
        let known: BTreeMap<String, &Vec<String>> = self
            .layouts
            .iter()
            .filter_map(|(t, l)| Some((t.to_string(), l.as_ref().ok()?)))
            .collect();
        self.snapshot = (!known.is_empty())
            .then(|| serde_json::to_string(&known).ok().map(Arc::from))
            .flatten();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> TableName {
        TableName::parse(s, None).expect("table")
    }

    fn cols(c: &[&str]) -> Vec<String> {
        c.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn alters_are_followed_and_stored() {
        let pos = BinlogPosition::new("bin.000001", 100);
        let mut tracker = LayoutTracker::new([t("shop.outbox")]);
        tracker.set(&t("shop.outbox"), cols(&["id", "payload"]));
        tracker.observe(
            "ALTER TABLE outbox ADD COLUMN tenant INT FIRST, DROP COLUMN payload",
            "shop",
            &pos,
        );
        assert_eq!(
            tracker.get(&t("shop.outbox")),
            Some(Ok(&cols(&["tenant", "id"])[..]))
        );
        // Another database's table of the same name is not the outbox.
        tracker.observe("ALTER TABLE outbox DROP COLUMN id", "other", &pos);
        assert_eq!(
            tracker.get(&t("shop.outbox")),
            Some(Ok(&cols(&["tenant", "id"])[..]))
        );
        let json = tracker.snapshot().expect("snapshot");
        assert_eq!(&*json, r#"{"shop.outbox":["tenant","id"]}"#);
        let mut restored = LayoutTracker::new([t("shop.outbox")]);
        restored.restore(&json).expect("restores");
        assert_eq!(
            restored.get(&t("shop.outbox")),
            Some(Ok(&cols(&["tenant", "id"])[..]))
        );
    }

    #[test]
    fn unparseable_ddl_makes_the_layout_unknown_until_a_named_table_map() {
        let pos = BinlogPosition::new("bin.000007", 4242);
        let mut tracker = LayoutTracker::new([t("shop.outbox")]);
        tracker.set(&t("shop.outbox"), cols(&["id"]));
        tracker.observe("ALTER TABLE outbox FROBNICATE COLUMN id", "shop", &pos);
        let why = tracker
            .get(&t("shop.outbox"))
            .expect("tracked")
            .expect_err("unknown");
        assert!(why.contains("bin.000007:4242"), "{why}");
        assert_eq!(tracker.snapshot(), None, "unknown layouts are not stored");
        tracker.set(&t("shop.outbox"), cols(&["id", "x"]));
        assert_eq!(
            tracker.get(&t("shop.outbox")),
            Some(Ok(&cols(&["id", "x"])[..]))
        );
    }

    #[test]
    fn create_rename_and_drop() {
        let pos = BinlogPosition::new("bin.000001", 4);
        let mut tracker = LayoutTracker::new([t("shop.outbox")]);
        tracker.observe(
            "CREATE TABLE shop.outbox_new (id BIGINT, body JSON, KEY (id))",
            "x",
            &pos,
        );
        assert_eq!(tracker.get(&t("shop.outbox")), None, "not an outbox name");
        tracker.observe(
            "CREATE TABLE `outbox` (id BIGINT, body JSON, created DATETIME(6))",
            "shop",
            &pos,
        );
        assert_eq!(
            tracker.get(&t("shop.outbox")),
            Some(Ok(&cols(&["id", "body", "created"])[..]))
        );
        tracker.observe("RENAME TABLE outbox TO outbox_old", "shop", &pos);
        assert_eq!(tracker.get(&t("shop.outbox")), None);
        tracker.observe("CREATE TABLE outbox LIKE outbox_old", "shop", &pos);
        assert!(tracker.get(&t("shop.outbox")).expect("known").is_err());
        tracker.observe("DROP TABLE IF EXISTS shop.outbox", "", &pos);
        assert_eq!(tracker.get(&t("shop.outbox")), None);
    }
}
