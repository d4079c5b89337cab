//! Outbox table patterns: `outbox.tables` and `[[outbox.table]] name` entries such as
//! `tenant_*.outbox`, `*.outbox` or `shop.outbox_*`.
//!
//! Syntax: `*` matches any run of characters (also none) and `?` exactly one character, each
//! within one identifier part (the database or the table name; the `.` between them is never
//! matched). No other character is special: `_`, `%`, `\`, `[` are literal, as in MySQL
//! identifiers. A name without `*` or `?` is an exact name and is matched as before.
//!
//! Case: names are compared byte for byte, case-sensitively, against the names as the server
//! stores them, which are the names its binlog table maps and `information_schema` carry. With
//! `lower_case_table_names=0` (Linux's default) that is the case written in `CREATE TABLE`;
//! with `1` the server stores names in lower case, so patterns must be written in lower case.
//! Exact names have always been compared the same way.
//!
//! The SQL side ([`TablePattern::like_database`], [`TablePattern::like_table`]) turns a pattern
//! into `LIKE … ESCAPE '!'` patterns that select a superset of the matching tables on the
//! server (`information_schema` compares case-insensitively on some servers); the rows are then
//! filtered with [`TablePattern::matches`], which decides.

use crate::config::TableName;

/// The escape character of the `LIKE` patterns of [`TablePattern::like_database`] and
/// [`TablePattern::like_table`] (`… LIKE ? ESCAPE '!'`): not the backslash, whose meaning in a
/// string literal depends on `NO_BACKSLASH_ESCAPES`.
pub const LIKE_ESCAPE: char = '!';

/// `true` when `part` (a database or table name) holds a wildcard (`*` or `?`).
pub fn has_wildcard(part: &str) -> bool {
    part.contains(['*', '?'])
}

/// `true` when `name` is a pattern (either part holds a wildcard), not an exact table name.
pub fn is_pattern(name: &TableName) -> bool {
    has_wildcard(&name.database) || has_wildcard(&name.table)
}

/// A `database.table` pattern.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TablePattern {
    /// The pattern as configured (`tenant_*.outbox`).
    pub name: TableName,
}

impl TablePattern {
    /// The pattern of `name`, `None` when `name` has no wildcard (an exact name).
    pub fn of(name: &TableName) -> Option<Self> {
        is_pattern(name).then(|| Self { name: name.clone() })
    }

    /// `true` when `table` matches: each part against its pattern, case-sensitively.
    pub fn matches(&self, table: &TableName) -> bool {
        part_matches(&self.name.database, &table.database)
            && part_matches(&self.name.table, &table.table)
    }

    /// `true` when the table-name part matches `table` (any database).
    pub fn matches_table_part(&self, table: &str) -> bool {
        part_matches(&self.name.table, table)
    }

    /// The database part as a `LIKE` pattern (escape [`LIKE_ESCAPE`]).
    pub fn like_database(&self) -> String {
        to_like(&self.name.database)
    }

    /// The table part as a `LIKE` pattern (escape [`LIKE_ESCAPE`]).
    pub fn like_table(&self) -> String {
        to_like(&self.name.table)
    }
}

impl std::fmt::Display for TablePattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.name.fmt(f)
    }
}

/// `*` → `%`, `?` → `_`; the LIKE metacharacters `%`, `_` and the escape itself are escaped.
fn to_like(part: &str) -> String {
    let mut out = String::with_capacity(part.len() + 4);
    for c in part.chars() {
        match c {
            '*' => out.push('%'),
            '?' => out.push('_'),
            '%' | '_' | LIKE_ESCAPE => {
                out.push(LIKE_ESCAPE);
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out
}

/// Glob match of one identifier part: `*` any run of characters, `?` one character
/// (characters, not bytes). Iterative with one backtrack point: linear in practice, never
/// exponential.
fn part_matches(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, ni));
                pi += 1;
            }
            Some(&c) if c == '?' || c == n[ni] => {
                pi += 1;
                ni += 1;
            }
            _ => match star {
                Some((sp, sn)) => {
                    pi = sp + 1;
                    ni = sn + 1;
                    star = Some((sp, sn + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> TableName {
        TableName::parse(s, None).expect("a name")
    }

    fn pattern(s: &str) -> TablePattern {
        TablePattern::of(&t(s)).expect("a pattern")
    }

    #[test]
    fn exact_names_are_not_patterns() {
        assert!(TablePattern::of(&t("shop.outbox")).is_none());
        assert!(TablePattern::of(&t("shop_1.out_box%")).is_none());
        assert!(TablePattern::of(&t("tenant_*.outbox")).is_some());
        assert!(TablePattern::of(&t("shop.outbox_?")).is_some());
    }

    #[test]
    fn star_and_question_mark_stay_within_one_part() {
        let p = pattern("tenant_*.outbox");
        assert!(p.matches(&t("tenant_1.outbox")));
        assert!(p.matches(&t("tenant_.outbox")), "* matches nothing too");
        assert!(!p.matches(&t("tenant_1.outbox2")));
        assert!(!p.matches(&t("tenant_1.outbox_old")));
        assert!(!p.matches(&t("tenantx1.outbox")), "_ is literal");
        assert!(!p.matches(&t("other.outbox")));
        let any = pattern("*.outbox");
        assert!(any.matches(&t("a.outbox")));
        assert!(!any.matches(&t("a.outbox_relay_checkpoint")));
        let tables = pattern("shop.outbox_*");
        assert!(tables.matches(&t("shop.outbox_orders")));
        assert!(tables.matches(&t("shop.outbox_")));
        assert!(!tables.matches(&t("shop.outbox")));
        assert!(!tables.matches(&t("shop2.outbox_orders")));
        let one = pattern("t?.o*x*");
        assert!(one.matches(&t("t1.ox")));
        assert!(
            one.matches(&t("tä.obbxyyxz")),
            "? is one character, not one byte"
        );
        assert!(!one.matches(&t("t.ox")));
        assert!(!one.matches(&t("t12.ox")));
        assert!(pattern("a*b*c.t").matches(&t("aXbYbZc.t")), "backtracks");
        assert!(!pattern("a*b*c.t").matches(&t("aXbYbZ.t")));
    }

    #[test]
    fn percent_underscore_and_backslash_are_literal() {
        let p = pattern("t%_\\*.o");
        assert!(p.matches(&t("t%_\\x.o")));
        assert!(!p.matches(&t("tx_\\x.o")), "% is not a wildcard");
        assert!(!p.matches(&t("t%x\\x.o")), "_ is not a wildcard");
    }

    #[test]
    fn matching_is_case_sensitive_as_the_server_stores_names() {
        let p = pattern("tenant_*.outbox");
        assert!(!p.matches(&t("Tenant_1.outbox")));
        assert!(!p.matches(&t("tenant_1.OUTBOX")));
        assert!(p.matches(&t("tenant_A.outbox")));
    }

    #[test]
    fn like_patterns_escape_the_like_metacharacters() {
        let p = pattern("tenant_*.out%box!?");
        assert_eq!(p.like_database(), "tenant!_%");
        assert_eq!(p.like_table(), "out!%box!!_");
        assert_eq!(pattern("*.outbox").like_table(), "outbox");
        assert_eq!(pattern("*.outbox").like_database(), "%");
    }
}
