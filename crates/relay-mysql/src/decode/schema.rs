//! Column layouts of the outbox tables, for table maps that carry no column names.
//!
//! With `binlog_row_metadata=FULL` every table map names its columns and nothing here is
//! needed. Without it (MINIMAL, or servers without the setting) a rows event only says "column
//! 3"; the names come from the layout in force when the row was written. That layout is read
//! from `information_schema` once, at a binlog position known to match it (a fresh start), stored
//! with every checkpoint, and followed through the DDL in the binlog (`ALTER TABLE`, `CREATE`,
//! `RENAME`, `DROP`; parsed by [`crate::decode::ddl`]). So a relay far behind an ALTER that the server
//! has long applied still decodes older rows with the older layout.
//!
//! A DDL statement on an outbox table that cannot be followed for sure marks the table's layout
//! unknown: its next rows event without column names stops the relay with the position and the
//! reason; it never guesses. A table map that does carry names always wins and repairs the
//! layout.
//!
//! Such table maps carry no ENUM labels or SET member names either: a row holds only the
//! value's index (bit set). The labels of the outbox tables' ENUM and SET columns are read from
//! `information_schema` together with the names and stored with them ([`Labels`]). A DDL
//! statement that (re)defines a column (`ADD`, `CHANGE`, `MODIFY`, `CREATE TABLE`) forgets that
//! column's labels (their new values are not parsed): a mapped ENUM/SET column without labels
//! stops the relay rather than relaying an index as if it were the label.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::decode::ddl::{self, Ddl, Dialect, QualifiedName};
use crate::server::Flavor;
use outbox_relay_core::config::TableName;
use outbox_relay_core::outbox::pattern::{self, TablePattern};
use outbox_relay_core::position::BinlogPosition;

/// A table's layout: its column names in order, or why it is not known.
pub type Layout = Result<Vec<String>, String>;

/// The labels of a table's ENUM columns (in declaration order) and the member names of its SET
/// columns, by lower-case column name (column names are case-insensitive).
pub type Labels = BTreeMap<String, Vec<String>>;

/// One table's entry in the stored JSON: its column names alone (no known ENUM/SET labels; the
/// only form before labels were stored), or names and labels.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
enum StoredLayout<'a> {
    Names(Vec<String>),
    WithLabels {
        columns: Vec<String>,
        #[serde(borrow)]
        labels: BTreeMap<std::borrow::Cow<'a, str>, Vec<String>>,
    },
}

/// The tracked layouts of the outbox tables.
#[derive(Debug, Clone)]
pub struct LayoutTracker {
    /// Outbox tables named exactly.
    outbox: Vec<TableName>,
    /// Outbox table patterns (`tenant_*.outbox`): every matching table is followed too.
    patterns: Vec<TablePattern>,
    /// Layout per outbox table; absent: never learned.
    layouts: BTreeMap<TableName, Layout>,
    /// ENUM/SET labels per outbox table (absent or missing a column: not known).
    labels: BTreeMap<TableName, Labels>,
    dialect: Dialect,
    /// JSON of the known layouts (what a checkpoint stores), rebuilt on change.
    snapshot: Option<Arc<str>>,
}

impl LayoutTracker {
    /// A tracker for `outbox` tables (exact names, and patterns such as `tenant_*.outbox`,
    /// [`outbox_relay_core::outbox::pattern`]), knowing nothing yet.
    pub fn new(outbox: impl IntoIterator<Item = TableName>) -> Self {
        let (patterns, outbox): (Vec<TableName>, Vec<TableName>) =
            outbox.into_iter().partition(pattern::is_pattern);
        Self {
            outbox,
            patterns: patterns.iter().filter_map(TablePattern::of).collect(),
            layouts: BTreeMap::new(),
            labels: BTreeMap::new(),
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

    /// Sets the labels of `table`'s ENUM and SET columns (from `information_schema`, at the same
    /// point as its layout); column names are lower-cased here.
    pub fn set_labels(&mut self, table: &TableName, labels: Labels) {
        let labels: Labels = labels
            .into_iter()
            .map(|(c, l)| (c.to_lowercase(), l))
            .collect();
        if self.labels.get(table).unwrap_or(&Labels::new()) != &labels {
            if labels.is_empty() {
                self.labels.remove(table);
            } else {
                self.labels.insert(table.clone(), labels);
            }
            self.refresh();
        }
    }

    /// The known ENUM/SET labels of `table`'s columns (`None`: none known).
    pub fn labels(&self, table: &TableName) -> Option<&Labels> {
        self.labels.get(table)
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
        self.dialect = Dialect::new(
            Flavor::of_version(version),
            ddl::version_id(version).unwrap_or(0),
        );
    }

    /// `true` when table maps with column names should set `table`'s layout: a table named
    /// exactly, or a table of a pattern whose layout is already tracked (learned from
    /// `information_schema` or its `CREATE TABLE`, which only happens without FULL metadata).
    /// With names in every table map, nothing is kept per tenant, and a checkpoint's
    /// `table_layouts` does not grow with the number of tenants.
    pub fn follows(&self, table: &TableName) -> bool {
        self.outbox.contains(table) || self.layouts.contains_key(table)
    }

    /// `true` when `table` is an outbox table: named exactly, or matching a pattern.
    fn is_outbox(&self, table: &TableName) -> bool {
        self.outbox.contains(table) || self.patterns.iter().any(|p| p.matches(table))
    }

    /// Follows a statement from a QUERY event whose default database is `default_db`.
    ///
    /// With patterns, every table DDL statement is parsed (a new table's name is only known
    /// from it); one that cannot be parsed marks only the already tracked tables it mentions
    /// unknown: a new matching table it created stays unknown (never learned), so its first
    /// rows event without column names stops the relay rather than guess.
    pub fn observe(&mut self, statement: &str, default_db: &str, position: &BinlogPosition) {
        let touched: Vec<TableName> = self
            .outbox
            .iter()
            .chain(self.layouts.keys().filter(|t| !self.outbox.contains(t)))
            .filter(|t| ddl::mentions(statement, &t.table))
            .cloned()
            .collect();
        if touched.is_empty() && (self.patterns.is_empty() || !may_be_table_ddl(statement)) {
            return;
        }
        // A routine, view, trigger, user or grant that mentions an outbox table changes no
        // layout (a procedure's body that inserts into `outbox` in another database is the
        // common case).
        let targets = ddl::targets(statement, &self.dialect);
        if targets == ddl::Targets::None {
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
        // New labels per table (`None`: forgotten), applied to outbox tables with `changes`.
        let mut label_changes: Vec<(TableName, Option<Labels>)> = Vec::new();
        match ddl::parse(statement, &self.dialect) {
            Err(e) => {
                // Only the tables the statement's head names, when it can be read: an ALTER
                // of `other.outbox` leaves `shop.outbox` known.
                let named: Option<Vec<TableName>> = match &targets {
                    ddl::Targets::Tables(names) => Some(names.iter().map(resolve).collect()),
                    _ => None,
                };
                let is_named = |t: &TableName| {
                    named.as_ref().is_none_or(|names| {
                        names.iter().any(|n| {
                            n.database.eq_ignore_ascii_case(&t.database)
                                && n.table.eq_ignore_ascii_case(&t.table)
                        })
                    })
                };
                for t in touched.into_iter().filter(is_named) {
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
                    label_changes.push((t.clone(), None));
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
                    label_changes.push((t.clone(), self.labels.get(&resolve(&like)).cloned()));
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
                    label_changes.push((t.clone(), None));
                    changes.push((t, Some(unknown("CREATE TABLE … SELECT".into()))));
                }
            }
            Ok(Ddl::DropTable { tables }) => {
                for t in tables {
                    label_changes.push((resolve(&t), None));
                    changes.push((resolve(&t), None));
                }
            }
            Ok(Ddl::RenameTable { pairs }) => {
                for (from, to) in pairs {
                    let (from, to) = (resolve(&from), resolve(&to));
                    let layout = self.layouts.get(&from).cloned().unwrap_or_else(|| {
                        unknown(format!("renamed from {from}, whose layout is not tracked"))
                    });
                    label_changes.push((to.clone(), self.labels.get(&from).cloned()));
                    label_changes.push((from.clone(), None));
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
                let labels = self
                    .labels
                    .get(&t)
                    .map(|labels| altered_labels(labels.clone(), &ops));
                let renamed = ops.iter().rev().find_map(|op| match op {
                    ddl::AlterOp::RenameTable { to } => Some(resolve(to)),
                    _ => None,
                });
                match renamed {
                    Some(to) => {
                        label_changes.push((t.clone(), None));
                        label_changes.push((to.clone(), labels));
                        changes.push((t, None));
                        changes.push((to, Some(layout)));
                    }
                    None => {
                        label_changes.push((t.clone(), labels));
                        changes.push((t, Some(layout)));
                    }
                }
            }
            Ok(Ddl::Truncate { .. } | Ddl::Temporary | Ddl::Other) => {}
        }
        let mut changed = false;
        for (table, labels) in label_changes {
            if !self.is_outbox(&table) {
                continue;
            }
            changed = true;
            match labels {
                Some(labels) if !labels.is_empty() => {
                    self.labels.insert(table, labels);
                }
                _ => {
                    self.labels.remove(&table);
                }
            }
        }
        for (table, layout) in changes {
            if !self.is_outbox(&table) {
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

    /// The known layouts as JSON, for the checkpoint: `{"db.table": ["col", …]}`, or
    /// `{"db.table": {"columns": ["col", …], "labels": {"col": ["label", …]}}}` for a table with
    /// known ENUM/SET labels; `None` when nothing is known.
    pub fn snapshot(&self) -> Option<Arc<str>> {
        self.snapshot.clone()
    }

    /// Restores layouts from a checkpoint's JSON.
    ///
    /// # Errors
    /// A message when the JSON is not an object of string arrays.
    pub fn restore(&mut self, json: &str) -> Result<(), String> {
        let stored: BTreeMap<String, StoredLayout<'_>> = serde_json::from_str(json)
            .map_err(|e| format!("the stored table layouts are not valid JSON: {e}"))?;
        for (name, layout) in stored {
            let table = TableName::parse(&name, None).map_err(|e| e.to_string())?;
            let (columns, labels) = match layout {
                StoredLayout::Names(columns) => (columns, Labels::new()),
                StoredLayout::WithLabels { columns, labels } => (
                    columns,
                    labels
                        .into_iter()
                        .map(|(c, l)| (c.to_lowercase(), l))
                        .collect(),
                ),
            };
            self.layouts.insert(table.clone(), Ok(columns));
            if labels.is_empty() {
                self.labels.remove(&table);
            } else {
                self.labels.insert(table, labels);
            }
        }
        self.refresh();
        Ok(())
    }

    fn refresh(&mut self) {
        let known: BTreeMap<String, StoredLayout<'_>> = self
            .layouts
            .iter()
            .filter_map(|(t, l)| {
                let columns = l.as_ref().ok()?.clone();
                let stored = match self.labels.get(t) {
                    Some(labels) => StoredLayout::WithLabels {
                        columns,
                        labels: labels
                            .iter()
                            .map(|(c, l)| (std::borrow::Cow::Borrowed(c.as_str()), l.clone()))
                            .collect(),
                    },
                    None => StoredLayout::Names(columns),
                };
                Some((t.to_string(), stored))
            })
            .collect();
        self.snapshot = (!known.is_empty())
            .then(|| serde_json::to_string(&known).ok().map(Arc::from))
            .flatten();
    }
}

/// `labels` after an `ALTER TABLE`: columns that `ADD`, `CHANGE` or `MODIFY` (re)define lose
/// their labels (the new definition is not parsed), `RENAME COLUMN` moves them. Clauses name
/// the columns as before the statement, except `ADD`, which needs no existing column.
fn altered_labels(mut labels: Labels, ops: &[ddl::AlterOp]) -> Labels {
    let mut moved = Vec::new();
    for op in ops {
        match op {
            ddl::AlterOp::Add { name, .. } | ddl::AlterOp::Modify { name, .. } => {
                labels.remove(&name.to_lowercase());
            }
            ddl::AlterOp::Change { old, new, .. } => {
                labels.remove(&old.to_lowercase());
                labels.remove(&new.to_lowercase());
            }
            ddl::AlterOp::RenameColumn { from, to, .. } => {
                if let Some(l) = labels.remove(&from.to_lowercase()) {
                    moved.push((to.to_lowercase(), l));
                }
            }
            ddl::AlterOp::Drop { name, .. } => {
                labels.remove(&name.to_lowercase());
            }
            ddl::AlterOp::RenameTable { .. } | ddl::AlterOp::NoLayoutChange => {}
        }
    }
    labels.extend(moved);
    labels
}

/// The labels of an ENUM or SET column from its `information_schema.COLUMNS.COLUMN_TYPE`
/// (`enum('a','b''c')`, `set('x','y')`; quotes doubled or backslash-escaped); `None` for any
/// other type or text that does not read as such a list.
pub fn enum_set_labels(column_type: &str) -> Option<Vec<String>> {
    let lower = column_type.to_ascii_lowercase();
    let rest = if lower.starts_with("enum(") {
        &column_type[5..]
    } else if lower.starts_with("set(") {
        &column_type[4..]
    } else {
        return None;
    };
    let mut labels = Vec::new();
    let mut chars = rest.chars().peekable();
    loop {
        if chars.next()? != '\'' {
            return None;
        }
        let mut label = String::new();
        loop {
            match chars.next()? {
                '\'' if chars.peek() == Some(&'\'') => {
                    chars.next();
                    label.push('\'');
                }
                '\'' => break,
                '\\' => label.push(match chars.next()? {
                    'n' => '\n',
                    'r' => '\r',
                    't' => '\t',
                    '0' => '\0',
                    'Z' => '\x1a',
                    c => c,
                }),
                c => label.push(c),
            }
        }
        labels.push(label);
        match chars.next()? {
            ',' => {}
            ')' if chars.next().is_none() => return Some(labels),
            _ => return None,
        }
    }
}

/// `true` when `statement` may be a DDL statement on a table: its first word after comments
/// (`-- …`, `# …`, `/* … */`, which servers keep in the binlog) is `CREATE`, `ALTER`, `RENAME`
/// or `DROP`, or it starts with an executable comment (`/*! … */`, which may hide one). A cheap
/// test before parsing every such statement for table patterns.
fn may_be_table_ddl(statement: &str) -> bool {
    let mut s = statement.trim_start();
    loop {
        if s.starts_with("/*!") || s.starts_with("/*M!") {
            return true;
        }
        if s.starts_with("--") || s.starts_with('#') {
            s = s.split_once('\n').map_or("", |(_, rest)| rest).trim_start();
        } else if let Some(rest) = s.strip_prefix("/*") {
            s = rest
                .split_once("*/")
                .map_or("", |(_, rest)| rest)
                .trim_start();
        } else {
            break;
        }
    }
    ["create", "alter", "rename", "drop"].iter().any(|k| {
        s.get(..k.len()).is_some_and(|w| w.eq_ignore_ascii_case(k))
            && !s[k.len()..].starts_with(|c: char| c.is_alphanumeric() || c == '_')
    })
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

    /// Statements that cannot touch `shop.outbox` (other databases, routines, views,
    /// triggers, users and grants, other tables) leave its layout known, also when the relay
    /// cannot parse them (a routine's body of several statements); statements that can (ALTER,
    /// RENAME, DROP, CREATE of it, unqualified in `shop` or qualified) still count.
    #[test]
    fn only_statements_that_can_touch_an_outbox_table_count() {
        let pos = BinlogPosition::new("bin.000003", 223_847);
        let layout = cols(&["id", "payload"]);
        let ignored = [
            // (statement, default database)
            (
                "CREATE DEFINER=`root`@`localhost` PROCEDURE `archive_outbox`() BEGIN INSERT \
                 INTO outbox (id) VALUES (1); DELETE FROM outbox WHERE id < 0; END",
                "otherops",
            ),
            (
                "CREATE DEFINER=`root`@`localhost` PROCEDURE shop.p() BEGIN SELECT * FROM \
                 outbox; SELECT 1; END",
                "shop",
            ),
            (
                "CREATE OR REPLACE DEFINER=CURRENT_USER() FUNCTION f() RETURNS INT BEGIN \
                 DECLARE n INT; SELECT COUNT(*) INTO n FROM outbox; RETURN n; END",
                "shop",
            ),
            (
                "CREATE DEFINER=`app`@`%` TRIGGER trg AFTER INSERT ON outbox FOR EACH ROW \
                 BEGIN SET @n = 1; SET @m = 2; END",
                "shop",
            ),
            (
                "CREATE ALGORITHM=UNDEFINED DEFINER=`root`@`localhost` SQL SECURITY DEFINER \
                 VIEW `v` AS select `outbox`.`id` AS `id` from `outbox`",
                "shop",
            ),
            ("DROP VIEW IF EXISTS outbox_view, outbox", "shop"),
            ("DROP PROCEDURE IF EXISTS outbox", "shop"),
            (
                "CREATE EVENT e ON SCHEDULE EVERY 1 DAY DO BEGIN DELETE FROM outbox; END",
                "shop",
            ),
            ("GRANT SELECT ON shop.outbox TO 'relay'@'%'", "shop"),
            ("REVOKE DELETE ON shop.outbox FROM 'relay'@'%'", "shop"),
            ("CREATE USER 'outbox'@'%' IDENTIFIED BY 'x'", "shop"),
            ("DROP DATABASE outbox", "shop"),
            // Another database's table of the same name, unparseable or not.
            ("ALTER TABLE outbox FROBNICATE COLUMN id", "other"),
            ("ALTER TABLE other.outbox FROBNICATE COLUMN id", "shop"),
            ("ALTER TABLE outbox DROP COLUMN id", "other"),
            ("DROP TABLE other.outbox", "shop"),
            ("RENAME TABLE other.outbox TO other.outbox_old", "shop"),
            // Another table that mentions the name.
            (
                "ALTER TABLE outbox_archive FROBNICATE COLUMN outbox",
                "shop",
            ),
        ];
        let after = |statement: &str, db: &str| {
            let mut tracker = LayoutTracker::new([t("shop.outbox")]);
            tracker.set_server_version("10.11.19-MariaDB-log");
            tracker.set(&t("shop.outbox"), layout.clone());
            tracker.observe(statement, db, &pos);
            tracker
                .get(&t("shop.outbox"))
                .map(|l| l.map(<[String]>::to_vec).map_err(str::to_owned))
        };
        for (statement, db) in ignored {
            assert_eq!(
                after(statement, db),
                Some(Ok(layout.clone())),
                "{statement} (in {db})"
            );
        }
        let counted = [
            ("ALTER TABLE outbox FROBNICATE COLUMN id", "shop"),
            ("ALTER TABLE shop.outbox FROBNICATE COLUMN id", "other"),
            (
                "ALTER TABLE `shop`.`outbox` ADD COLUMN x INT, FROBNICATE",
                "other",
            ),
            ("DROP TABLE outbox, nope FROBNICATE", "shop"),
            ("RENAME TABLE outbox_new TO outbox FROBNICATE", "shop"),
            ("CREATE TABLE outbox (id INT, FROBNICATE", "shop"),
            ("/*!40000 ALTER TABLE outbox FROBNICATE */", "shop"),
        ];
        for (statement, db) in counted {
            let got = after(statement, db);
            assert!(
                got.as_ref().is_some_and(Result::is_err),
                "{statement} (in {db}) must make the layout unknown: {got:?}"
            );
        }
        // Followed, not unknown: a parsed ALTER of the outbox in its own database.
        let mut tracker = LayoutTracker::new([t("shop.outbox")]);
        tracker.set(&t("shop.outbox"), layout.clone());
        tracker.observe("ALTER TABLE outbox ADD COLUMN tenant INT", "shop", &pos);
        assert_eq!(
            tracker.get(&t("shop.outbox")),
            Some(Ok(&cols(&["id", "payload", "tenant"])[..]))
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

    #[test]
    fn enum_and_set_labels_from_column_types() {
        assert_eq!(
            enum_set_labels("enum('Created','Paid')"),
            Some(cols(&["Created", "Paid"]))
        );
        assert_eq!(
            enum_set_labels("SET('a''b','c\\\\d','e,f')"),
            Some(cols(&["a'b", "c\\d", "e,f"]))
        );
        assert_eq!(enum_set_labels("enum('')"), Some(cols(&[""])));
        assert_eq!(enum_set_labels("varchar(10)"), None);
        assert_eq!(enum_set_labels("enum('a'"), None);
        assert_eq!(enum_set_labels("enum('a') x"), None);
    }

    #[test]
    fn labels_are_stored_and_forgotten_by_ddl_that_redefines_their_column() {
        let pos = BinlogPosition::new("bin.000001", 4);
        let outbox = t("shop.outbox");
        let mut tracker = LayoutTracker::new([outbox.clone()]);
        tracker.set(&outbox, cols(&["id", "Kind", "state"]));
        tracker.set_labels(
            &outbox,
            Labels::from([
                ("Kind".to_owned(), cols(&["Created", "Paid"])),
                ("state".to_owned(), cols(&["new", "old"])),
            ]),
        );
        let json = tracker.snapshot().expect("snapshot");
        assert_eq!(
            &*json,
            r#"{"shop.outbox":{"columns":["id","Kind","state"],"labels":{"kind":["Created","Paid"],"state":["new","old"]}}}"#
        );
        let mut restored = LayoutTracker::new([outbox.clone()]);
        restored.restore(&json).expect("restores");
        assert_eq!(restored.labels(&outbox), tracker.labels(&outbox));
        // The older form (names only) still restores, without labels.
        let mut old = LayoutTracker::new([outbox.clone()]);
        old.restore(r#"{"shop.outbox":["id","kind"]}"#)
            .expect("restores");
        assert_eq!(old.labels(&outbox), None);
        // ADD of an unrelated column keeps the labels; MODIFY forgets its column's; RENAME
        // COLUMN moves them.
        tracker.observe("ALTER TABLE outbox ADD COLUMN note TEXT", "shop", &pos);
        assert_eq!(tracker.labels(&outbox).map(|l| l.len()), Some(2));
        tracker.observe(
            "ALTER TABLE outbox MODIFY kind ENUM('Created','Paid','Shipped'), \
             RENAME COLUMN state TO phase",
            "shop",
            &pos,
        );
        assert_eq!(
            tracker.labels(&outbox),
            Some(&Labels::from([("phase".to_owned(), cols(&["new", "old"]))]))
        );
        // A RENAME TABLE moves them with the layout; CREATE TABLE starts without.
        tracker.observe("RENAME TABLE outbox TO outbox_old", "shop", &pos);
        assert_eq!(tracker.labels(&outbox), None);
        tracker.observe("CREATE TABLE outbox (id INT, kind ENUM('x'))", "shop", &pos);
        assert_eq!(tracker.labels(&outbox), None);
        assert_eq!(
            tracker.snapshot().as_deref(),
            Some(r#"{"shop.outbox":["id","kind"]}"#)
        );
    }

    #[test]
    fn patterns_follow_tables_created_later_and_nothing_else() {
        let pos = BinlogPosition::new("bin.000001", 4);
        let mut tracker = LayoutTracker::new([t("tenant_*.outbox")]);
        tracker.observe("CREATE DATABASE tenant_9", "", &pos);
        tracker.observe(
            "CREATE TABLE outbox (id BIGINT, payload JSON)",
            "tenant_9",
            &pos,
        );
        tracker.observe("CREATE TABLE tenant_9.orders (id BIGINT)", "", &pos);
        tracker.observe("CREATE TABLE shop.outbox (id BIGINT)", "", &pos);
        assert_eq!(
            tracker.get(&t("tenant_9.outbox")),
            Some(Ok(&cols(&["id", "payload"])[..]))
        );
        assert_eq!(tracker.get(&t("tenant_9.orders")), None);
        assert_eq!(tracker.get(&t("shop.outbox")), None);
        tracker.observe("ALTER TABLE tenant_9.outbox ADD COLUMN x INT", "", &pos);
        assert_eq!(
            tracker.get(&t("tenant_9.outbox")),
            Some(Ok(&cols(&["id", "payload", "x"])[..]))
        );
        // A statement the parser does not follow marks the tracked table it mentions unknown.
        tracker.observe("ALTER TABLE tenant_9.outbox FROBNICATE x", "", &pos);
        assert!(tracker
            .get(&t("tenant_9.outbox"))
            .is_some_and(|l| l.is_err()));
        tracker.observe("DROP TABLE tenant_9.outbox", "", &pos);
        assert_eq!(tracker.get(&t("tenant_9.outbox")), None);
        assert!(!may_be_table_ddl("INSERT INTO outbox VALUES (1)"));
        assert!(!may_be_table_ddl("created_at"));
        assert!(may_be_table_ddl("  create table x (a int)"));
        assert!(may_be_table_ddl("/*!40000 ALTER TABLE x */"));
        // MySQL 8.0 keeps a statement's leading comments in the binlog.
        assert!(may_be_table_ddl(
            "-- the outbox\n# shape\n/* c */ CREATE TABLE x (a int)"
        ));
        assert!(!may_be_table_ddl(
            "-- CREATE TABLE x\nINSERT INTO x VALUES (1)"
        ));
    }
}
