//! DDL tracking for servers that log table maps without column names
//! (`binlog_row_metadata=MINIMAL`/`NO_LOG`): [`parse`] reads the statement of a binlog QUERY
//! event and says how it changes table layouts, [`apply`] replays an `ALTER TABLE` on a tracked
//! column list exactly as the server did, [`mentions`] is a cheap pre-filter.
//!
//! Whatever is not understood for sure is a [`DdlError`], never a guess: the relay must stop
//! rather than decode rows with a wrong layout. Sources: the MySQL 8 and MariaDB 10.11 grammars
//! (`sql_yacc.yy`), their lexers (`sql_lex.cc`: comments, executable comments) and
//! `mysql_prepare_alter_table` (`sql_table.cc`: how ALTER orders columns); the tricky cases
//! were checked against MariaDB 10.11.
//!
//! Known limits (all end in an error or must be handled by the caller):
//! - MariaDB system versioning (`WITH SYSTEM VERSIONING`, `ADD SYSTEM VERSIONING`) adds hidden
//!   columns: error. MySQL functional key parts (`INDEX ((expr))`) add hidden columns: error.
//! - MySQL's `sql_generate_invisible_primary_key` adds `my_row_id` first to a `CREATE TABLE`
//!   without primary key; that is not visible in the statement. The caller should compare the
//!   tracked column count with the table map's column count on every table map.
//! - An `ALTER TABLE` on a same-named temporary table looks like one on the real table; only
//!   `binlog_format=ROW` (statements on temporary tables not logged) makes that impossible.
//! - Unqualified table names ([`QualifiedName::database`] `None`) mean the QUERY event's
//!   default database; names of tables are compared by the caller (`lower_case_table_names`).

use std::fmt;

use crate::server::Flavor;

/// A column layout: column names in table order (names compare case-insensitively, as MySQL
/// does).
pub type Columns = Vec<String>;

/// A table name as written in the statement; `database` is `None` when the statement relies on
/// the session's default database (the QUERY event's `schema`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QualifiedName {
    /// The database, if the statement names one.
    pub database: Option<String>,
    /// The table.
    pub table: String,
}

/// Where `ADD`/`CHANGE`/`MODIFY` puts a column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ColumnPosition {
    /// At the end (an `ADD` without `FIRST`/`AFTER`).
    Last,
    /// `FIRST`.
    First,
    /// `AFTER name`: after the column that has this name once earlier clauses are applied.
    After(String),
}

/// One clause of an `ALTER TABLE`, as far as the column layout is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AlterOp {
    /// `ADD [COLUMN] [IF NOT EXISTS] name ... [FIRST | AFTER x]`.
    Add {
        /// The new column.
        name: String,
        /// Where it goes.
        position: ColumnPosition,
        /// MariaDB's `IF NOT EXISTS`: skipped when the column exists.
        if_not_exists: bool,
    },
    /// `DROP [COLUMN] [IF EXISTS] name`.
    Drop {
        /// The dropped column.
        name: String,
        /// MariaDB's `IF EXISTS`: skipped when the column does not exist.
        if_exists: bool,
    },
    /// `CHANGE [COLUMN] [IF EXISTS] old new ... [FIRST | AFTER x]`.
    Change {
        /// The column's name before.
        old: String,
        /// Its name after.
        new: String,
        /// `None`: keeps its place.
        position: Option<ColumnPosition>,
        /// MariaDB's `IF EXISTS`.
        if_exists: bool,
    },
    /// `MODIFY [COLUMN] [IF EXISTS] name ... [FIRST | AFTER x]`.
    Modify {
        /// The column.
        name: String,
        /// `None`: keeps its place.
        position: Option<ColumnPosition>,
        /// MariaDB's `IF EXISTS`.
        if_exists: bool,
    },
    /// `RENAME COLUMN [IF EXISTS] from TO to`.
    RenameColumn {
        /// Old name.
        from: String,
        /// New name.
        to: String,
        /// MariaDB's `IF EXISTS`.
        if_exists: bool,
    },
    /// `RENAME [TO | AS] name`: the table gets a new name (layout unchanged).
    RenameTable {
        /// The new name.
        to: QualifiedName,
    },
    /// Indexes, constraints, table options, `ALTER COLUMN ... SET DEFAULT`, partitioning...
    NoLayoutChange,
}

/// What a statement does to table layouts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ddl {
    /// `CREATE [OR REPLACE] TABLE` with its column list.
    CreateTable {
        /// The table.
        table: QualifiedName,
        /// Its columns in order.
        columns: Columns,
        /// `IF NOT EXISTS`: nothing happened if the table existed (the server logs it anyway).
        if_not_exists: bool,
    },
    /// `CREATE TABLE t LIKE other`: `t` gets `other`'s layout.
    CreateTableLike {
        /// The new table.
        table: QualifiedName,
        /// The model.
        like: QualifiedName,
        /// `IF NOT EXISTS`.
        if_not_exists: bool,
    },
    /// `CREATE TABLE ... SELECT`: the layout depends on the query, unknown here.
    CreateTableSelect {
        /// The table.
        table: QualifiedName,
        /// `IF NOT EXISTS`.
        if_not_exists: bool,
    },
    /// `CREATE`/`DROP TEMPORARY TABLE`: session-only tables, whose rows are not logged in ROW
    /// format; no real table changes.
    Temporary,
    /// `DROP TABLE [IF EXISTS] a, b`.
    DropTable {
        /// The dropped tables.
        tables: Vec<QualifiedName>,
    },
    /// `RENAME TABLE a TO b, c TO d` (applied in order).
    RenameTable {
        /// `(from, to)` pairs.
        pairs: Vec<(QualifiedName, QualifiedName)>,
    },
    /// `ALTER TABLE`.
    AlterTable {
        /// The table.
        table: QualifiedName,
        /// Its clauses in statement order (give them all to [`apply`] at once).
        ops: Vec<AlterOp>,
        /// MariaDB's `ALTER TABLE IF EXISTS`.
        if_exists: bool,
    },
    /// `TRUNCATE [TABLE] t` (layout unchanged).
    Truncate {
        /// The table.
        table: QualifiedName,
    },
    /// Not about table layouts: DML, `CREATE INDEX`, `GRANT`, `CREATE DATABASE`, `BEGIN`...
    Other,
}

/// A statement that [`parse`] cannot understand for sure; says what and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DdlError(pub String);

impl fmt::Display for DdlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot understand the DDL statement: {}", self.0)
    }
}

impl std::error::Error for DdlError {}

/// How the server read the statement: executable comments depend on its flavor and version,
/// quotes on the session's `sql_mode` (the QUERY event's `Q_SQL_MODE_CODE` status variable).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dialect {
    /// MariaDB or MySQL.
    pub flavor: Flavor,
    /// The server version as `major*10000 + minor*100 + patch` (e.g. 101119), see
    /// [`version_id`]; best taken from the binlog's FORMAT_DESCRIPTION event.
    pub version: u32,
    /// `sql_mode` has `ANSI_QUOTES`: `"x"` is an identifier, not a string.
    pub ansi_quotes: bool,
    /// `sql_mode` has `NO_BACKSLASH_ESCAPES`: `\` is an ordinary character in strings.
    pub no_backslash_escapes: bool,
}

impl Dialect {
    /// A server with the default `sql_mode` (no `ANSI_QUOTES`, backslash escapes on).
    pub fn new(flavor: Flavor, version: u32) -> Self {
        Self {
            flavor,
            version,
            ansi_quotes: false,
            no_backslash_escapes: false,
        }
    }

    /// Takes the quoting flags from a binlog `sql_mode` bitmask (`MODE_ANSI_QUOTES` = 0x4,
    /// `MODE_NO_BACKSLASH_ESCAPES` = 0x100000; combination modes like `ANSI` set the bits).
    pub fn with_sql_mode(mut self, sql_mode: u64) -> Self {
        self.ansi_quotes = sql_mode & 0x4 != 0;
        self.no_backslash_escapes = sql_mode & 0x10_0000 != 0;
        self
    }
}

/// `"10.11.19-MariaDB-log"` → `101119`, `"8.0.36"` → `80036`; `None` if not `x.y.z...`.
pub fn version_id(version: &str) -> Option<u32> {
    let mut parts = version.split('.').map(|p| {
        let digits: String = p.chars().take_while(char::is_ascii_digit).collect();
        digits.parse::<u32>().ok()
    });
    let (major, minor, patch) = (parts.next()??, parts.next()??, parts.next()??);
    if minor >= 100 || patch >= 100 {
        return None;
    }
    // The version string of a damaged FORMAT_DESCRIPTION event may hold any number.
    major.checked_mul(10000)?.checked_add(minor * 100 + patch)
}

// ---------------------------------------------------------------------------------------------
// Lexer

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    /// Unquoted keyword, identifier or number.
    Word(String),
    /// Quoted identifier, unescaped.
    Quoted(String),
    /// String literal (its value never matters here).
    Str,
    /// Any other character.
    Punct(char),
}

fn err<T>(msg: impl Into<String>) -> Result<T, DdlError> {
    Err(DdlError(msg.into()))
}

fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '$' || c as u32 >= 0x80
}

/// What the server does with a comment starting at `s` (`/*`): `None` = skip it, `Some(n)` =
/// its content is code starting `n` characters in ([`Flavor::executable_comment`]).
fn executable_comment(s: &[char], d: &Dialect) -> Result<Option<usize>, DdlError> {
    d.flavor.executable_comment(d.version, s).map_err(DdlError)
}

fn lex(sql: &str, d: &Dialect) -> Result<Vec<Tok>, DdlError> {
    let toks = lex_all(sql, d)?;
    if toks.contains(&Tok::Punct(';')) {
        return err("more than one statement");
    }
    Ok(toks)
}

/// The tokens of `sql`, trailing `;` left out; `;` inside (a routine's body) kept as tokens.
fn lex_all(sql: &str, d: &Dialect) -> Result<Vec<Tok>, DdlError> {
    let s: Vec<char> = sql.chars().collect();
    let (mut i, mut toks, mut in_code_comment) = (0, Vec::new(), false);
    while i < s.len() {
        let (c, next) = (s[i], s.get(i + 1).copied());
        let dash_comment = c == '-'
            && next == Some('-')
            && s.get(i + 2)
                .is_none_or(|c| c.is_whitespace() || c.is_control());
        if c.is_whitespace() {
            i += 1;
        } else if c == '#' || dash_comment {
            while i < s.len() && s[i] != '\n' {
                i += 1;
            }
        } else if c == '*' && next == Some('/') && in_code_comment {
            in_code_comment = false;
            i += 2;
        } else if c == '/' && next == Some('*') {
            if in_code_comment {
                return err("a comment inside an executable comment");
            }
            match executable_comment(&s[i..], d)? {
                Some(skip) => {
                    in_code_comment = true;
                    i += skip;
                }
                None => match (i + 2..s.len().saturating_sub(1))
                    .find(|&j| s[j] == '*' && s[j + 1] == '/')
                {
                    Some(end) => i = end + 2,
                    None => return err("unterminated /* comment"),
                },
            }
        } else if c == '`' || c == '\'' || c == '"' {
            let identifier = c == '`' || (c == '"' && d.ansi_quotes);
            let backslash = !identifier && !d.no_backslash_escapes;
            let mut text = String::new();
            i += 1;
            loop {
                match (s.get(i), s.get(i + 1)) {
                    (None, _) => return err(format!("unterminated {c}quoted{c} text")),
                    (Some('\\'), Some(&e)) if backslash => {
                        text.push(e);
                        i += 2;
                    }
                    (Some(&q), Some(&q2)) if q == c && q2 == c => {
                        text.push(c);
                        i += 2;
                    }
                    (Some(&q), _) if q == c => {
                        i += 1;
                        break;
                    }
                    (Some(&o), _) => {
                        text.push(o);
                        i += 1;
                    }
                }
            }
            toks.push(if identifier {
                Tok::Quoted(text)
            } else {
                Tok::Str
            });
        } else if is_word_char(c) {
            let start = i;
            while i < s.len() && is_word_char(s[i]) {
                i += 1;
            }
            toks.push(Tok::Word(s[start..i].iter().collect()));
        } else {
            toks.push(Tok::Punct(c));
            i += 1;
        }
    }
    if in_code_comment {
        return err("unterminated executable comment");
    }
    while toks.last() == Some(&Tok::Punct(';')) {
        toks.pop();
    }
    Ok(toks)
}

// ---------------------------------------------------------------------------------------------
// Parser helpers

fn is_kw(t: Option<&Tok>, kw: &str) -> bool {
    matches!(t, Some(Tok::Word(w)) if w.eq_ignore_ascii_case(kw))
}

/// Is `t` one of the space-separated keywords `kws`?
fn is_any_kw(t: Option<&Tok>, kws: &str) -> bool {
    kws.split(' ').any(|k| is_kw(t, k))
}

/// Renders a few tokens for error messages.
fn show(t: &[Tok]) -> String {
    let words = t.iter().take(8).map(|t| match t {
        Tok::Word(w) => w.clone(),
        Tok::Quoted(q) => format!("`{q}`"),
        Tok::Str => "'…'".into(),
        Tok::Punct(c) => c.to_string(),
    });
    let words: Vec<String> = words.collect();
    format!(
        "`{}{}`",
        words.join(" "),
        if t.len() > 8 { " …" } else { "" }
    )
}

/// Splits at commas outside parentheses.
fn split_commas(t: &[Tok]) -> Result<Vec<&[Tok]>, DdlError> {
    let (mut depth, mut start, mut parts) = (0usize, 0, Vec::new());
    for (i, tok) in t.iter().enumerate() {
        match tok {
            Tok::Punct('(') => depth += 1,
            Tok::Punct(')') if depth == 0 => return err(format!("unbalanced ) in {}", show(t))),
            Tok::Punct(')') => depth -= 1,
            Tok::Punct(',') if depth == 0 => {
                parts.push(&t[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return err(format!("unbalanced ( in {}", show(t)));
    }
    parts.push(&t[start..]);
    Ok(parts)
}

/// Index of the `)` closing the `(` at `open`.
fn closing(t: &[Tok], open: usize) -> Result<usize, DdlError> {
    let mut depth = 0;
    for (i, tok) in t.iter().enumerate().skip(open) {
        match tok {
            Tok::Punct('(') => depth += 1,
            Tok::Punct(')') if depth == 1 => return Ok(i),
            Tok::Punct(')') => depth -= 1,
            _ => {}
        }
    }
    err(format!("unbalanced ( in {}", show(&t[open..])))
}

/// Does the first parenthesized list hold a functional key part `((expr))`? MySQL implements
/// those as hidden columns that are in the row images but not in `information_schema`.
fn has_functional_key_part(t: &[Tok]) -> bool {
    let Some(open) = t.iter().position(|x| *x == Tok::Punct('(')) else {
        return false;
    };
    let mut depth = 0;
    for (i, tok) in t.iter().enumerate().skip(open) {
        let after_sep = i > 0 && matches!(t[i - 1], Tok::Punct('(' | ','));
        match tok {
            Tok::Punct('(') if depth == 1 && after_sep => return true,
            Tok::Punct('(') => depth += 1,
            Tok::Punct(')') if depth == 1 => return false,
            Tok::Punct(')') => depth -= 1,
            _ => {}
        }
    }
    false
}

const FUNCTIONAL: &str = "a functional key part ((expr)) adds a hidden column: not supported";

fn check_versioning(t: &[Tok]) -> Result<(), DdlError> {
    match t
        .windows(2)
        .any(|w| is_kw(w.first(), "SYSTEM") && is_kw(w.get(1), "VERSIONING"))
    {
        true => err("system versioning adds hidden row_start/row_end columns: not supported"),
        false => Ok(()),
    }
}

fn duplicate(names: &[String]) -> Option<&String> {
    let mut dups = names
        .iter()
        .enumerate()
        .filter(|(i, n)| names[..*i].iter().any(|m| eq(m, n)));
    dups.next().map(|(_, n)| n)
}

/// Column names compare case-insensitively.
fn eq(a: &str, b: &str) -> bool {
    a.to_lowercase() == b.to_lowercase()
}

struct Parser<'a> {
    t: &'a [Tok],
    i: usize,
}

impl<'a> Parser<'a> {
    fn new(t: &'a [Tok]) -> Self {
        Self { t, i: 0 }
    }
    fn peek(&self, n: usize) -> Option<&'a Tok> {
        self.t.get(self.i + n)
    }
    fn at(&self, kw: &str) -> bool {
        is_kw(self.peek(0), kw)
    }
    fn eat(&mut self, kw: &str) -> bool {
        self.eat_all(kw)
    }
    /// Eats the space-separated keywords if all of them come next.
    fn eat_all(&mut self, kws: &str) -> bool {
        let hit = kws
            .split(' ')
            .enumerate()
            .all(|(n, k)| is_kw(self.peek(n), k));
        if hit {
            self.i += kws.split(' ').count();
        }
        hit
    }
    fn eat_punct(&mut self, c: char) -> bool {
        let hit = self.peek(0) == Some(&Tok::Punct(c));
        self.i += usize::from(hit);
        hit
    }
    fn rest(&self) -> &'a [Tok] {
        &self.t[self.i.min(self.t.len())..]
    }
    fn expect_end(&self, what: &str) -> Result<(), DdlError> {
        match self.rest() {
            [] => Ok(()),
            rest => err(format!("unexpected {} after {what}", show(rest))),
        }
    }
    fn ident(&mut self, what: &str) -> Result<String, DdlError> {
        match self.peek(0) {
            Some(Tok::Word(w) | Tok::Quoted(w)) => {
                self.i += 1;
                Ok(w.clone())
            }
            _ => err(format!("expected {what}, found {}", show(self.rest()))),
        }
    }
    /// A column name, possibly written `t.col` or `db.t.col`.
    fn column(&mut self) -> Result<String, DdlError> {
        let mut name = self.ident("a column name")?;
        while self.eat_punct('.') {
            name = self.ident("a column name")?;
        }
        Ok(name)
    }
    fn table(&mut self) -> Result<QualifiedName, DdlError> {
        let first = self.ident("a table name")?;
        Ok(match self.eat_punct('.') {
            true => QualifiedName {
                database: Some(first),
                table: self.ident("a table name")?,
            },
            false => QualifiedName {
                database: None,
                table: first,
            },
        })
    }
    /// MariaDB's `WAIT n | NOWAIT`.
    fn skip_wait(&mut self) {
        if self.eat("WAIT") {
            self.i += 1;
        } else {
            self.eat("NOWAIT");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Statements

/// Reads one statement of a binlog QUERY event as the server described by `dialect` did.
///
/// # Errors
/// [`DdlError`] naming the part that is not understood for sure: unknown `ALTER TABLE`
/// clauses, unbalanced parentheses, unterminated quotes or comments, system versioning,
/// functional key parts, `FIRST`/`AFTER` where they cannot be told from a value, several
/// statements. Statements that are not about table layouts are [`Ddl::Other`], not errors.
pub fn parse(statement: &str, dialect: &Dialect) -> Result<Ddl, DdlError> {
    let toks = lex(statement, dialect)?;
    let mut p = Parser::new(&toks);
    if p.eat("CREATE") {
        p.eat_all("OR REPLACE");
        if p.eat("TEMPORARY") {
            return Ok(Ddl::Temporary);
        }
        if p.eat("TABLE") {
            return create_table(p);
        }
        while is_any_kw(p.peek(0), "ONLINE OFFLINE UNIQUE FULLTEXT SPATIAL") {
            p.i += 1;
        }
        let on = p
            .rest()
            .iter()
            .position(|t| is_kw(Some(t), "ON"))
            .unwrap_or(0);
        if p.at("INDEX") && has_functional_key_part(&p.rest()[on..]) {
            return err(FUNCTIONAL);
        }
        return Ok(Ddl::Other);
    }
    if p.eat("ALTER") {
        while p.eat("ONLINE") || p.eat("IGNORE") {}
        return match p.eat("TABLE") {
            true => alter_table(p),
            false => Ok(Ddl::Other),
        };
    }
    if p.eat("DROP") {
        let temporary = p.eat("TEMPORARY");
        if !(p.eat("TABLE") || p.eat("TABLES")) {
            return Ok(Ddl::Other);
        } else if temporary {
            return Ok(Ddl::Temporary);
        }
        p.eat_all("IF EXISTS");
        let mut tables = vec![p.table()?];
        while p.eat_punct(',') {
            tables.push(p.table()?);
        }
        p.skip_wait();
        let _ = p.eat("RESTRICT") || p.eat("CASCADE");
        p.expect_end("DROP TABLE")?;
        return Ok(Ddl::DropTable { tables });
    }
    if p.eat("RENAME") {
        if !(p.eat("TABLE") || p.eat("TABLES")) {
            return Ok(Ddl::Other);
        }
        p.eat_all("IF EXISTS");
        let mut pairs = Vec::new();
        loop {
            let from = p.table()?;
            p.skip_wait();
            if !p.eat("TO") {
                return err(format!(
                    "expected TO in RENAME TABLE, found {}",
                    show(p.rest())
                ));
            }
            pairs.push((from, p.table()?));
            if !p.eat_punct(',') {
                break;
            }
        }
        p.expect_end("RENAME TABLE")?;
        return Ok(Ddl::RenameTable { pairs });
    }
    if p.eat("TRUNCATE") {
        p.eat("TABLE");
        let table = p.table()?;
        p.skip_wait();
        p.expect_end("TRUNCATE")?;
        return Ok(Ddl::Truncate { table });
    }
    Ok(Ddl::Other)
}

/// The tables a statement can change the layout of, read from its head only (so it works for
/// statements [`parse`] refuses): what decides whether a statement it cannot follow concerns an
/// outbox table at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Targets {
    /// No table's layout: a routine, trigger, event, view, user, role, database or server
    /// statement (`CREATE PROCEDURE`, `CREATE DEFINER=… TRIGGER … ON t`, `DROP VIEW`), a grant.
    None,
    /// These tables, as written (unqualified: the statement's default database).
    Tables(Vec<QualifiedName>),
    /// Cannot be told from the head: treat it as possibly about any table it mentions.
    Unknown,
}

/// Objects whose statements never change a table's columns.
const NOT_TABLES: &str = "PROCEDURE FUNCTION TRIGGER EVENT VIEW USER ROLE DATABASE SCHEMA SERVER \
                          PACKAGE LOGFILE TABLESPACE";

/// Which tables `statement` can change the layout of ([`Targets`]), as the server described by
/// `dialect` read it. Lenient: a head it does not recognise is [`Targets::Unknown`].
pub fn targets(statement: &str, dialect: &Dialect) -> Targets {
    let Ok(toks) = lex_all(statement, dialect) else {
        return Targets::Unknown;
    };
    let mut p = Parser::new(&toks);
    if p.eat("GRANT") || p.eat("REVOKE") {
        return Targets::None;
    }
    let verb = ["CREATE", "ALTER", "DROP", "RENAME"]
        .into_iter()
        .find(|v| p.eat(v));
    let Some(verb) = verb else {
        return Targets::Unknown;
    };
    p.eat_all("OR REPLACE");
    // View and routine attributes: ALGORITHM = x, DEFINER = user[@host], SQL SECURITY x.
    loop {
        if p.eat("ALGORITHM") || p.eat("DEFINER") {
            p.eat_punct('=');
            p.i += 1;
            if p.eat_punct('@') {
                p.i += 1;
            }
            // DEFINER = CURRENT_USER()
            if p.eat_punct('(') {
                p.eat_punct(')');
            }
        } else if p.eat_all("SQL SECURITY") {
            p.i += 1;
        } else if !(p.eat("ONLINE") || p.eat("IGNORE") || p.eat("TEMPORARY")) {
            break;
        }
    }
    p.eat("AGGREGATE");
    if is_any_kw(p.peek(0), NOT_TABLES) {
        return Targets::None;
    }
    if !(p.eat("TABLE") || (verb != "CREATE" && verb != "ALTER" && p.eat("TABLES"))) {
        return Targets::Unknown;
    }
    p.eat_all("IF NOT EXISTS");
    p.eat_all("IF EXISTS");
    let mut tables = Vec::new();
    loop {
        let Ok(t) = p.table() else {
            return Targets::Unknown;
        };
        tables.push(t);
        p.skip_wait();
        // DROP TABLE a, b; RENAME TABLE a TO b, c TO d: the other names of the list.
        match verb {
            "DROP" if p.eat_punct(',') => continue,
            "RENAME" if p.eat("TO") || p.eat_punct(',') => continue,
            _ => break,
        }
    }
    Targets::Tables(tables)
}

const QUERY_START: &str = "SELECT WITH VALUES TABLE";

/// `CREATE [OR REPLACE] TABLE` after `TABLE`.
fn create_table(mut p: Parser<'_>) -> Result<Ddl, DdlError> {
    let if_not_exists = p.eat_all("IF NOT EXISTS");
    let table = p.table()?;
    check_versioning(p.rest())?;
    let paren = p.peek(0) == Some(&Tok::Punct('('));
    if p.eat("LIKE") || (paren && is_kw(p.peek(1), "LIKE")) {
        p.i += 2 * usize::from(paren);
        let like = p.table()?;
        if paren && !p.eat_punct(')') {
            return err("expected ) after CREATE TABLE (LIKE ...");
        }
        p.expect_end("CREATE TABLE ... LIKE")?;
        return Ok(Ddl::CreateTableLike {
            table,
            like,
            if_not_exists,
        });
    }
    let select = Ddl::CreateTableSelect {
        table: table.clone(),
        if_not_exists,
    };
    if !paren || is_any_kw(p.peek(1), QUERY_START) || p.peek(1) == Some(&Tok::Punct('(')) {
        return match has_query(p.rest()) {
            true => Ok(select),
            false => err(format!(
                "CREATE TABLE without a column list: {}",
                show(p.rest())
            )),
        };
    }
    let close = closing(p.t, p.i)?;
    let columns = definitions(&p.t[p.i + 1..close])?;
    if let Some(dup) = duplicate(&columns) {
        return err(format!("duplicate column {dup} in CREATE TABLE"));
    }
    match (has_query(&p.t[close + 1..]), columns.is_empty()) {
        (true, _) => Ok(select),
        (false, true) => err("CREATE TABLE without columns"),
        (false, false) => Ok(Ddl::CreateTable {
            table,
            columns,
            if_not_exists,
        }),
    }
}

/// Does the part after a CREATE TABLE's name hold a query (`CREATE TABLE ... [AS] SELECT`)?
fn has_query(t: &[Tok]) -> bool {
    let mut depth = 0;
    for (i, tok) in t.iter().enumerate() {
        match tok {
            Tok::Punct('(') if depth == 0 && is_any_kw(t.get(i + 1), QUERY_START) => return true,
            Tok::Punct('(') => depth += 1,
            Tok::Punct(')') => depth -= 1,
            _ if depth == 0
                && is_any_kw(Some(tok), "SELECT WITH VALUES TABLE AS IGNORE REPLACE") =>
            {
                return true
            }
            _ => {}
        }
    }
    false
}

/// Is this create definition a key, constraint, check or period rather than a column?
fn is_key_or_constraint(def: &[Tok]) -> Result<bool, DdlError> {
    let mut j = usize::from(is_kw(def.first(), "CONSTRAINT"));
    if j == 1 && !is_any_kw(def.get(1), "PRIMARY UNIQUE FOREIGN CHECK") {
        j = 2; // the constraint's name
    }
    let head = def.get(j);
    if is_any_kw(head, "PRIMARY UNIQUE KEY INDEX FULLTEXT SPATIAL FOREIGN") {
        return match has_functional_key_part(def) {
            true => err(FUNCTIONAL),
            false => Ok(true),
        };
    }
    if is_kw(head, "CHECK") || (j == 0 && is_kw(head, "PERIOD") && is_kw(def.get(1), "FOR")) {
        return Ok(true);
    }
    match j {
        0 => Ok(false),
        _ => err(format!("unknown constraint {}", show(def))),
    }
}

/// The column names of a `(create_definition, ...)` list; keys, constraints, periods skipped.
fn definitions(list: &[Tok]) -> Result<Vec<String>, DdlError> {
    let mut columns = Vec::new();
    for def in split_commas(list)? {
        if !is_key_or_constraint(def)? {
            let mut p = Parser::new(def);
            columns.push(p.column()?);
            column_tail(p.rest(), false)?;
        }
    }
    Ok(columns)
}

/// Checks what follows a column's name(s) and finds its trailing `FIRST`/`AFTER x`
/// (`positions`: allowed at all).
fn column_tail(def: &[Tok], positions: bool) -> Result<Option<ColumnPosition>, DdlError> {
    if def.is_empty() {
        return err("a column definition without a type");
    }
    check_versioning(def)?;
    let (mut depth, mut found) = (0, None);
    for (i, tok) in def.iter().enumerate().skip(1) {
        match tok {
            Tok::Punct('(') => depth += 1,
            Tok::Punct(')') => depth -= 1,
            // The name after AFTER may be `first` or `after`.
            _ if depth == 0 && is_any_kw(Some(tok), "FIRST AFTER") && found != Some(i - 1) => {
                // MariaDB accepts `DEFAULT name`: is `DEFAULT first` a value or a position?
                let value = def[i - 1] == Tok::Punct('=') || is_kw(def.get(i - 1), "DEFAULT");
                if found.is_some() || value || !positions {
                    return err(format!(
                        "unexpected {} in a column definition",
                        show(&def[i - 1..])
                    ));
                }
                found = Some(i);
            }
            _ => {}
        }
    }
    let Some(i) = found else { return Ok(None) };
    let mut p = Parser::new(&def[i..]);
    let position = match p.eat("FIRST") {
        true => ColumnPosition::First,
        false => {
            p.eat("AFTER");
            ColumnPosition::After(p.ident("a column name after AFTER")?)
        }
    };
    p.expect_end("FIRST/AFTER")?;
    Ok(Some(position))
}

/// `ALTER [ONLINE] [IGNORE] TABLE` after `TABLE`.
fn alter_table(mut p: Parser<'_>) -> Result<Ddl, DdlError> {
    let if_exists = p.eat_all("IF EXISTS");
    let table = p.table()?;
    p.skip_wait();
    check_versioning(p.rest())?;
    let mut rest = p.rest();
    // A trailing partitioning clause needs no comma: cut it off.
    let (mut depth, mut partitioning) = (0, false);
    for (i, tok) in rest.iter().enumerate() {
        match tok {
            Tok::Punct('(') => depth += 1,
            Tok::Punct(')') => depth -= 1,
            _ if depth == 0
                && ((is_kw(Some(tok), "PARTITION") && is_kw(rest.get(i + 1), "BY"))
                    || (is_kw(Some(tok), "REMOVE") && is_kw(rest.get(i + 1), "PARTITIONING"))) =>
            {
                (rest, partitioning) = (&rest[..i], true);
                break;
            }
            _ => {}
        }
    }
    let mut ops = Vec::new();
    for spec in if rest.is_empty() {
        vec![]
    } else {
        split_commas(rest)?
    } {
        // Partition operations stand alone (commas after them separate partition names), and
        // so does ORDER BY a, b.
        let standalone = is_kw(spec.first(), "ORDER")
            || (is_any_kw(spec.first(), PARTITION_OPS) && is_kw(spec.get(1), "PARTITION"))
            || (is_kw(spec.first(), "CONVERT") && is_kw(spec.get(1), "TABLE"));
        if standalone && is_kw(spec.first(), "CONVERT") {
            return err("CONVERT PARTITION/TABLE moves a table in or out: not supported");
        } else if standalone {
            ops.push(AlterOp::NoLayoutChange);
            break;
        }
        ops.extend(alter_spec(spec)?);
    }
    if partitioning {
        ops.push(AlterOp::NoLayoutChange);
    }
    ops.dedup_by(|a, b| *a == AlterOp::NoLayoutChange && *b == AlterOp::NoLayoutChange);
    Ok(Ddl::AlterTable {
        table,
        ops,
        if_exists,
    })
}

const PARTITION_OPS: &str = "ADD DROP COALESCE REORGANIZE EXCHANGE ANALYZE CHECK OPTIMIZE \
    REBUILD REPAIR TRUNCATE DISCARD IMPORT CONVERT";

/// Table options and clauses that never change the column list.
const NO_LAYOUT: &str = "ALGORITHM LOCK FORCE ENGINE TYPE AUTO_INCREMENT AVG_ROW_LENGTH \
    CHECKSUM TABLE_CHECKSUM COMMENT COMPRESSION CONNECTION DATA INDEX DELAY_KEY_WRITE \
    ENCRYPTION ENCRYPTED ENCRYPTION_KEY_ID ENGINE_ATTRIBUTE SECONDARY_ENGINE \
    SECONDARY_ENGINE_ATTRIBUTE INSERT_METHOD KEY_BLOCK_SIZE MAX_ROWS MIN_ROWS PACK_KEYS \
    PAGE_CHECKSUM PAGE_COMPRESSED PAGE_COMPRESSION_LEVEL PASSWORD ROW_FORMAT \
    STATS_AUTO_RECALC STATS_PERSISTENT STATS_SAMPLE_PAGES TABLESPACE STORAGE TRANSACTIONAL \
    UNION AUTOEXTEND_SIZE DEFAULT CHARACTER CHARSET COLLATE DISABLE ENABLE DISCARD IMPORT \
    SEQUENCE WITH WITHOUT SECONDARY_LOAD SECONDARY_UNLOAD";

/// One comma-separated ALTER TABLE clause.
fn alter_spec(spec: &[Tok]) -> Result<Vec<AlterOp>, DdlError> {
    let mut p = Parser::new(spec);
    let unknown = || err(format!("unknown ALTER TABLE clause {}", show(spec)));
    let unchanged = || Ok(vec![AlterOp::NoLayoutChange]);
    if spec.is_empty() {
        return err("an empty ALTER TABLE clause");
    }
    if p.eat("ADD") {
        let explicit = p.eat("COLUMN");
        let if_not_exists = p.eat_all("IF NOT EXISTS");
        let add = |name, position| AlterOp::Add {
            name,
            position,
            if_not_exists,
        };
        if p.peek(0) == Some(&Tok::Punct('(')) {
            let close = closing(spec, p.i)?;
            if close + 1 != spec.len() {
                return err(format!(
                    "unexpected {} after ADD (...)",
                    show(&spec[close + 1..])
                ));
            }
            let names = definitions(&spec[p.i + 1..close])?;
            return Ok(names
                .into_iter()
                .map(|n| add(n, ColumnPosition::Last))
                .collect());
        } else if !explicit && !if_not_exists && is_key_or_constraint(p.rest())? {
            return unchanged();
        }
        let name = p.column()?;
        return Ok(vec![add(
            name,
            column_tail(p.rest(), true)?.unwrap_or(ColumnPosition::Last),
        )]);
    }
    if p.eat("DROP") {
        let explicit = p.eat("COLUMN");
        let period = p.at("PERIOD") && is_kw(p.peek(1), "FOR");
        if !explicit
            && (period || is_any_kw(p.peek(0), "INDEX KEY PRIMARY FOREIGN CONSTRAINT CHECK"))
        {
            return unchanged();
        }
        let if_exists = p.eat_all("IF EXISTS");
        let name = p.column()?;
        let _ = p.eat("RESTRICT") || p.eat("CASCADE");
        p.expect_end("DROP COLUMN")?;
        return Ok(vec![AlterOp::Drop { name, if_exists }]);
    }
    if p.at("CHANGE") || p.at("MODIFY") {
        let change = p.eat("CHANGE");
        p.eat("MODIFY");
        p.eat("COLUMN");
        let if_exists = p.eat_all("IF EXISTS");
        let old = p.column()?;
        let new = if change { p.column()? } else { old.clone() };
        let position = column_tail(p.rest(), true)?;
        return Ok(vec![match change {
            true => AlterOp::Change {
                old,
                new,
                position,
                if_exists,
            },
            false => AlterOp::Modify {
                name: old,
                position,
                if_exists,
            },
        }]);
    }
    if p.eat("RENAME") {
        if p.at("INDEX") || p.at("KEY") {
            return unchanged();
        } else if p.eat("COLUMN") {
            let if_exists = p.eat_all("IF EXISTS");
            let from = p.column()?;
            if !p.eat("TO") {
                return unknown();
            }
            let to = p.column()?;
            p.expect_end("RENAME COLUMN")?;
            return Ok(vec![AlterOp::RenameColumn {
                from,
                to,
                if_exists,
            }]);
        }
        let _ = p.eat("TO") || p.eat("AS") || p.eat_punct('=');
        let to = p.table()?;
        p.expect_end("RENAME")?;
        return Ok(vec![AlterOp::RenameTable { to }]);
    }
    if p.eat("ALTER") {
        if is_any_kw(p.peek(0), "INDEX KEY CHECK CONSTRAINT") {
            return unchanged();
        }
        p.eat("COLUMN");
        p.eat_all("IF EXISTS");
        p.column()?;
        return if p.at("SET") || p.at("DROP") {
            unchanged()
        } else {
            unknown()
        };
    }
    if p.eat("CONVERT") {
        return if p.at("TO") { unchanged() } else { unknown() };
    }
    // Table options, also engine-defined ones (`name = value`).
    let option = matches!(spec, [Tok::Word(_) | Tok::Quoted(_), Tok::Punct('='), ..]);
    if option || is_any_kw(spec.first(), NO_LAYOUT) {
        return unchanged();
    }
    unknown()
}

// ---------------------------------------------------------------------------------------------
// Applying an ALTER TABLE

/// Applies all clauses of one `ALTER TABLE` to `columns`, as `mysql_prepare_alter_table` does:
/// `DROP`/`CHANGE`/`MODIFY`/`RENAME COLUMN` name columns of the table *before* the statement
/// (so `CHANGE a b, CHANGE b a` swaps); kept and changed columns stay in their order; then,
/// clause by clause, `ADD`s go last and positioned ones move `FIRST` or `AFTER` a column of the
/// list built so far (by its new name). MariaDB's `IF [NOT] EXISTS` clauses are dropped first,
/// judged against the table before the statement and the earlier clauses.
///
/// # Errors
/// What the server would refuse: an unknown column (DROP, CHANGE, MODIFY, AFTER, RENAME
/// COLUMN), a duplicate name, dropping all columns. `columns` is unchanged then.
pub fn apply(columns: &mut Columns, ops: &[AlterOp]) -> Result<(), String> {
    let has = |n: &str| columns.iter().any(|c| eq(c, n));
    // MariaDB's handle_if_exists_options: ADD IF NOT EXISTS is skipped when the table has the
    // column or an earlier ADD (not skipped), CHANGE or MODIFY (even one skipped later) makes
    // it; DROP IF EXISTS when the table lacks it or an earlier kept DROP names it; CHANGE,
    // MODIFY, RENAME COLUMN IF EXISTS when the table lacks the column.
    // The create list: (old name for CHANGE/MODIFY, new name, position).
    let mut defs: Vec<(Option<&str>, &str, Option<&ColumnPosition>)> = Vec::new();
    let (mut drops, mut renames, mut made): (Vec<&str>, Vec<(&str, &str)>, Vec<&str>) =
        Default::default();
    for op in ops {
        match op {
            AlterOp::Add {
                name,
                position,
                if_not_exists,
            } => {
                if !(*if_not_exists && (has(name) || made.iter().any(|m| eq(m, name)))) {
                    made.push(name);
                    defs.push((None, name, Some(position)));
                }
            }
            AlterOp::Drop { name, if_exists } => {
                if !(*if_exists && (!has(name) || drops.iter().any(|d| eq(d, name)))) {
                    drops.push(name);
                }
            }
            AlterOp::Change {
                old,
                new,
                position,
                if_exists,
            }
            | AlterOp::Modify {
                name: old @ new,
                position,
                if_exists,
            } => {
                made.push(new);
                if !*if_exists || has(old) {
                    defs.push((Some(old), new, position.as_ref()));
                }
            }
            AlterOp::RenameColumn {
                from,
                to,
                if_exists,
            } => {
                if !*if_exists || has(from) {
                    renames.push((from, to));
                }
            }
            AlterOp::RenameTable { .. } | AlterOp::NoLayoutChange => {}
        }
    }
    // (name, index of the def that made it); first the table's columns in order.
    let mut list: Vec<(String, Option<usize>)> = Vec::new();
    let mut found = vec![false; defs.len()];
    for column in columns.iter() {
        let changed = defs
            .iter()
            .position(|(old, ..)| old.is_some_and(|o| eq(o, column)));
        if let Some(d) = drops.iter().position(|d| eq(d, column)) {
            drops.remove(d);
        } else if let Some(d) = changed {
            found[d] = true;
            list.push((defs[d].1.to_owned(), Some(d)));
        } else if let Some(r) = renames.iter().position(|(from, _)| eq(from, column)) {
            list.push((renames.remove(r).1.to_owned(), None));
        } else {
            list.push((column.clone(), None));
        }
    }
    if let Some(d) = drops.first() {
        return Err(format!("Can't DROP COLUMN `{d}`; check that it exists"));
    }
    // Then the create list in statement order.
    for (d, (old, new, position)) in defs.iter().enumerate() {
        if let Some(old) = old.filter(|_| !found[d]) {
            return Err(format!("Unknown column '{old}'"));
        }
        let Some(position) = position else { continue };
        list.retain(|(_, id)| *id != Some(d));
        let at = match position {
            ColumnPosition::Last => list.len(),
            ColumnPosition::First => 0,
            ColumnPosition::After(a) => match list.iter().position(|(n, _)| eq(n, a)) {
                Some(i) => i + 1,
                None => return Err(format!("Unknown column '{a}' (in AFTER)")),
            },
        };
        list.insert(at, ((*new).to_owned(), Some(d)));
    }
    if let Some((from, _)) = renames.first() {
        return Err(format!("Unknown column '{from}' (in RENAME COLUMN)"));
    }
    let result: Columns = list.into_iter().map(|(n, _)| n).collect();
    if result.is_empty() {
        return Err("You can't delete all columns with ALTER TABLE; use DROP TABLE".into());
    } else if let Some(dup) = duplicate(&result) {
        return Err(format!("Duplicate column name '{dup}'"));
    }
    *columns = result;
    Ok(())
}

/// Cheap pre-filter: does the statement's text name the identifier `table` (any case, unquoted,
/// in backticks or in double quotes)? Never false when the statement is about that table;
/// may be true when it is not (the name in a comment, a string, a column).
pub fn mentions(statement: &str, table: &str) -> bool {
    let (hay, name) = (statement.to_lowercase(), table.to_lowercase());
    let forms = [
        name.clone(),
        name.replace('`', "``"),
        name.replace('"', "\"\""),
    ];
    !name.is_empty()
        && forms.iter().any(|needle| {
            hay.match_indices(needle.as_str()).any(|(at, m)| {
                let before = hay[..at].chars().next_back();
                let after = hay[at + m.len()..].chars().next();
                !before.is_some_and(is_word_char) && !after.is_some_and(is_word_char)
            })
        })
}

#[cfg(test)]
mod tests {
    //! Expected values are written from MySQL's documented DDL semantics; the layouts were
    //! also checked by hand against MariaDB 10.11 (information_schema.columns afterwards).
    //! Notation: `alter[?] t: ...` with `+x` ADD (`^` FIRST, `>y` AFTER y, `?` IF NOT EXISTS),
    //! `-x` DROP, `~a=b` CHANGE, `~a` MODIFY, `%a=b` RENAME COLUMN, `@u` RENAME TO, `=` no
    //! layout change.
    use super::*;

    fn maria() -> Dialect {
        Dialect::new(Flavor::MariaDb, 101119)
    }
    fn mysql() -> Dialect {
        Dialect::new(Flavor::MySql, 80036)
    }

    fn name(q: &QualifiedName) -> String {
        match &q.database {
            Some(db) => format!("{db}.{}", q.table),
            None => q.table.clone(),
        }
    }
    fn position(p: Option<&ColumnPosition>) -> String {
        match p {
            None | Some(ColumnPosition::Last) => String::new(),
            Some(ColumnPosition::First) => "^".into(),
            Some(ColumnPosition::After(a)) => format!(">{a}"),
        }
    }
    fn op(op: &AlterOp) -> String {
        let q = |b: bool| if b { "?" } else { "" };
        match op {
            AlterOp::Add {
                name,
                position: p,
                if_not_exists: e,
            } => format!("+{name}{}{}", position(Some(p)), q(*e)),
            AlterOp::Drop { name, if_exists: e } => format!("-{name}{}", q(*e)),
            AlterOp::Change {
                old,
                new,
                position: p,
                if_exists: e,
            } => format!("~{old}={new}{}{}", position(p.as_ref()), q(*e)),
            AlterOp::Modify {
                name,
                position: p,
                if_exists: e,
            } => format!("~{name}{}{}", position(p.as_ref()), q(*e)),
            AlterOp::RenameColumn {
                from,
                to,
                if_exists: e,
            } => format!("%{from}={to}{}", q(*e)),
            AlterOp::RenameTable { to } => format!("@{}", name(to)),
            AlterOp::NoLayoutChange => "=".into(),
        }
    }
    /// The statement's meaning in the notation above, or `error: ...`.
    fn render(sql: &str, d: &Dialect) -> String {
        let q = |b: bool| if b { "?" } else { "" };
        match parse(sql, d) {
            Err(e) => format!("error: {}", e.0),
            Ok(Ddl::CreateTable {
                table,
                columns,
                if_not_exists: e,
            }) => format!("create{} {}({})", q(e), name(&table), columns.join(",")),
            Ok(Ddl::CreateTableLike {
                table,
                like,
                if_not_exists: e,
            }) => format!("create{} {} like {}", q(e), name(&table), name(&like)),
            Ok(Ddl::CreateTableSelect {
                table,
                if_not_exists: e,
            }) => format!("create{} {} select", q(e), name(&table)),
            Ok(Ddl::Temporary) => "temporary".into(),
            Ok(Ddl::DropTable { tables }) => format!(
                "drop {}",
                tables.iter().map(name).collect::<Vec<_>>().join(",")
            ),
            Ok(Ddl::RenameTable { pairs }) => format!(
                "rename {}",
                pairs
                    .iter()
                    .map(|(a, b)| format!("{}>{}", name(a), name(b)))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            Ok(Ddl::AlterTable {
                table,
                ops,
                if_exists: e,
            }) => format!(
                "alter{} {}: {}",
                q(e),
                name(&table),
                ops.iter().map(op).collect::<Vec<_>>().join(" ")
            ),
            Ok(Ddl::Truncate { table }) => format!("truncate {}", name(&table)),
            Ok(Ddl::Other) => "other".into(),
        }
    }
    fn check(cases: &[(&str, &str)], d: &Dialect) {
        for (sql, want) in cases {
            let got = render(sql, d);
            let ok = match want.strip_suffix('…') {
                Some(prefix) => got.starts_with(prefix),
                None => got == *want,
            };
            assert!(ok, "{sql}\n  got  {got}\n  want {want}");
        }
    }

    #[test]
    #[rustfmt::skip]
    fn comments() {
        check(&[
            ("/* c, DROP q */ ALTER /* x */ TABLE t -- DROP z\n ADD # , DROP w\n COLUMN x INT", "alter t: +x"),
            // `--` without a space is two minus signs; `#` in a string is not a comment.
            ("ALTER TABLE t ADD x INT DEFAULT (2--1), ADD y CHAR DEFAULT '#', DROP b --", "alter t: +x +y -b"),
            ("ALTER TABLE t /*+ hint */ DROP b /* generated by server */;", "alter t: -b"),
            ("ALTER TABLE t DROP b /* open", "error: unterminated /* comment"),
        ], &maria());
    }

    #[test]
    #[rustfmt::skip]
    fn executable_comments_follow_the_server() {
        let mysql_5_digits = "ALTER TABLE t /*!80013 ADD COLUMN x INT, */ DROP y";
        let mariadb_only = "ALTER TABLE t /*M!100100 ADD COLUMN x INT, */ DROP y";
        let six_digits = "ALTER TABLE t /*!100000 ADD x INT, */ DROP y";
        let both = [
            ("ALTER TABLE t /*!50100 ADD x INT,*/ /*! ADD y INT, */ DROP z", "alter t: +x +y -z"),
            ("CREATE /*!32302 TEMPORARY */ TABLE t (a INT)", "temporary"),
            ("ALTER TABLE t /*!50100 ADD x INT", "error: unterminated executable comment"),
        ];
        check(&both, &maria());
        check(&both, &mysql());
        check(&[(mysql_5_digits, "alter t: +x -y"), (mariadb_only, "alter t: -y")], &mysql());
        check(&[(mysql_5_digits, "alter t: -y")], &Dialect::new(Flavor::MySql, 80012));
        check(&[(six_digits, "error: a 6-digit version…")], &mysql());
        // MariaDB ignores /*!50700 ... /*!99999 (MySQL 5.7+ syntax) but reads 6 digits.
        check(&[(mysql_5_digits, "alter t: -y"), (mariadb_only, "alter t: +x -y"), (six_digits, "alter t: +x -y")], &maria());
        check(&[(mariadb_only, "alter t: -y")], &Dialect::new(Flavor::MariaDb, 100003));
    }

    #[test]
    #[rustfmt::skip]
    fn names() {
        check(&[
            ("CREATE TABLE `my``tab` (`we``ird col` INT, `a,b` INT, `(x)` TEXT, `köln` INT, `select` INT, `--` INT, `#x` INT, `/*` INT)",
             "create my`tab(we`ird col,a,b,(x),köln,select,--,#x,/*)"),
            ("ALTER TABLE t DROP `a", "error: unterminated `quoted` text"),
            ("ALTER TABLE `shop`.`outbox` RENAME TO archive.outbox_old", "alter shop.outbox: @archive.outbox_old"),
            ("ALTER TABLE shop.t ADD t.d INT, DROP shop.t.e", "alter shop.t: +d -e"),
            ("CREATE TABLE s.t (t.a INT, s.t.b INT)", "create s.t(a,b)"),
            ("alter TaBlE t aDd CoLuMn x int AfTeR y", "alter t: +x>y"),
            ("drop table T", "drop T"),
        ], &maria());
    }

    #[test]
    #[rustfmt::skip]
    fn table_statements() {
        check(&[
            ("CREATE TABLE IF NOT EXISTS t (a INT)", "create? t(a)"),
            ("CREATE OR REPLACE TABLE t (a INT)", "create t(a)"),
            ("CREATE TABLE IF NOT EXISTS t (LIKE db.u)", "create? t like db.u"),
            ("CREATE OR REPLACE TABLE t LIKE u", "create t like u"),
            ("CREATE OR REPLACE TEMPORARY TABLE t (a INT)", "temporary"),
            ("create temporary table if not exists t like u", "temporary"),
            ("DROP TEMPORARY TABLE IF EXISTS t", "temporary"),
            ("ALTER TABLE IF EXISTS t NOWAIT ADD x INT", "alter? t: +x"),
            ("DROP TABLE IF EXISTS a, `db`.`b` WAIT 5 /* generated by server */", "drop a,db.b"),
            ("RENAME TABLE IF EXISTS a TO b, db.c TO d", "rename a>b,db.c>d"),
            ("TRUNCATE TABLE t", "truncate t"),
            ("truncate db.t", "truncate db.t"),
            ("RENAME TABLE a b", "error: expected TO in RENAME TABLE, found `b`"),
            ("TRUNCATE TABLE", "error: expected a table name, found ``"),
            ("DROP TABLE t; DROP TABLE u", "error: more than one statement"),
        ], &maria());
    }

    #[test]
    fn column_definitions_with_parentheses_commas_and_strings() {
        let sql = "CREATE TABLE t (
            id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
            price DECIMAL(10,2) NOT NULL DEFAULT '0.00',
            kind ENUM('a,b','c''d', 'e\\',f') NOT NULL DEFAULT 'x,y' COMMENT 'first, after (',
            total INT AS (id + price) VIRTUAL,
            s VARCHAR(10) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin CHECK (s IN ('x', 'y,z')),
            at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
            doc JSON DEFAULT (JSON_OBJECT('a', 1)) INVISIBLE,
            g GEOMETRY NOT NULL /*!80003 SRID 4326 */,
            period INT
        ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COMMENT='select, as'";
        check(
            &[(sql, "create t(id,price,kind,total,s,at,doc,g,period)")],
            &maria(),
        );
    }

    #[test]
    fn keys_and_constraints_are_not_columns() {
        let sql = "CREATE TABLE t (a INT, b INT, d1 DATE, d2 DATE, g POINT NOT NULL, txt TEXT,
            PRIMARY KEY (a), KEY k_b (b, txt(10)), INDEX USING BTREE (b), UNIQUE KEY u (b),
            UNIQUE (a, b), CONSTRAINT fk FOREIGN KEY (b) REFERENCES p (id) ON DELETE CASCADE,
            FOREIGN KEY (a) REFERENCES p (id), CONSTRAINT CHECK (a > 0), CONSTRAINT c2 CHECK (b < 9),
            CHECK (a <> b), FULLTEXT KEY ft (txt), SPATIAL INDEX sp (g), CONSTRAINT u2 UNIQUE (d1),
            PERIOD FOR p (d1, d2)) /*!50100 PARTITION BY KEY (a) PARTITIONS 4 */";
        check(&[(sql, "create t(a,b,d1,d2,g,txt)")], &maria());
    }

    #[test]
    #[rustfmt::skip]
    fn create_table_select() {
        check(&[
            ("CREATE TABLE t AS SELECT * FROM u", "create t select"),
            ("CREATE TABLE IF NOT EXISTS t SELECT 1 AS a", "create? t select"),
            ("CREATE TABLE t (SELECT 1 AS a)", "create t select"),
            ("CREATE TABLE t (a INT) SELECT b FROM u", "create t select"),
            ("CREATE TABLE t (a INT) IGNORE AS SELECT 1 AS a", "create t select"),
            ("CREATE TABLE t (a INT) ENGINE=InnoDB REPLACE SELECT 1 AS a", "create t select"),
            ("CREATE TABLE t AS WITH c AS (SELECT 1) SELECT * FROM c", "create t select"),
            // MySQL 8's atomic CREATE ... SELECT logs the full definition, then the rows.
            ("CREATE TABLE `t` (\n  `a` int DEFAULT NULL\n) START TRANSACTION", "create t(a)"),
            ("CREATE TABLE t ENGINE=InnoDB", "error: CREATE TABLE without a column list…"),
            ("CREATE TABLE t (a INT, A INT)", "error: duplicate column A in CREATE TABLE"),
        ], &maria());
    }

    #[test]
    #[rustfmt::skip]
    fn alter_clauses() {
        check(&[
            ("ALTER TABLE t ADD COLUMN x INT AFTER y, DROP COLUMN z, ADD INDEX (x), ALGORITHM=INPLACE, LOCK=NONE", "alter t: +x>y -z ="),
            ("ALTER TABLE t", "alter t: "),
            ("ALTER ONLINE IGNORE TABLE t ADD x INT", "alter t: +x"),
            ("ALTER IGNORE TABLE t DROP x", "alter t: -x"),
            ("ALTER TABLE t ADD COLUMN (a INT, b DECIMAL(5,2))", "alter t: +a +b"),
            ("ALTER TABLE t ADD (a INT, INDEX (a))", "alter t: +a"),
            ("ALTER TABLE t ADD a INT FIRST, ADD `b` INT AFTER `a`", "alter t: +a^ +b>a"),
            ("ALTER TABLE t ADD COLUMN IF NOT EXISTS x INT FIRST", "alter t: +x^?"),
            ("ALTER TABLE t ADD IF NOT EXISTS (a INT, b INT)", "alter t: +a? +b?"),
            ("ALTER TABLE t ADD first INT DEFAULT (1), ADD after INT AFTER first", "alter t: +first +after>first"),
            ("ALTER TABLE t DROP COLUMN IF EXISTS x, DROP IF EXISTS y, DROP z CASCADE, DROP period", "alter t: -x? -y? -z -period"),
            ("ALTER TABLE t CHANGE COLUMN old new VARCHAR(10) NOT NULL FIRST, CHANGE a b INT AFTER c", "alter t: ~old=new^ ~a=b>c"),
            ("ALTER TABLE t CHANGE c d INT COMMENT 'after x', CHANGE IF EXISTS e f INT", "alter t: ~c=d ~e=f?"),
            ("ALTER TABLE t MODIFY c INT FIRST, MODIFY COLUMN d TEXT AFTER a, MODIFY e ENUM('FIRST')", "alter t: ~c^ ~d>a ~e"),
            ("ALTER TABLE t MODIFY IF EXISTS c INT", "alter t: ~c?"),
            ("ALTER TABLE t RENAME COLUMN a TO b, RENAME INDEX i TO j, RENAME COLUMN IF EXISTS c TO d", "alter t: %a=b = %c=d?"),
            ("ALTER TABLE t RENAME TO db.u", "alter t: @db.u"),
            ("ALTER TABLE t RENAME AS u", "alter t: @u"),
            ("ALTER TABLE t RENAME u", "alter t: @u"),
            ("ALTER TABLE t ADD COLUMN d INT AFTER b PARTITION BY HASH(a) PARTITIONS 2", "alter t: +d>b ="),
        ], &maria());
    }

    #[test]
    #[rustfmt::skip]
    fn alter_clauses_without_layout_change() {
        check(&[
            ("ALTER TABLE t ALTER COLUMN a SET DEFAULT 'x,y', ALTER b DROP DEFAULT", "alter t: ="),
            ("ALTER TABLE t ALTER COLUMN a SET INVISIBLE, ALTER INDEX i INVISIBLE", "alter t: ="),
            ("ALTER TABLE t DROP INDEX i, DROP KEY k, DROP PRIMARY KEY, DROP FOREIGN KEY f, DROP CHECK c", "alter t: ="),
            ("ALTER TABLE t DROP CONSTRAINT IF EXISTS c2, DROP PERIOD FOR p", "alter t: ="),
            ("ALTER TABLE t ENGINE=InnoDB ROW_FORMAT=DYNAMIC, COMMENT 'c', AUTO_INCREMENT = 5", "alter t: ="),
            ("ALTER TABLE t DEFAULT CHARSET utf8mb4, CONVERT TO CHARACTER SET utf8mb4 COLLATE x", "alter t: ="),
            ("ALTER TABLE t page_compressed=1, `engine_option`='x', FORCE, DISABLE KEYS", "alter t: ="),
            ("ALTER TABLE t ADD CONSTRAINT c CHECK (a > 0), ADD PRIMARY KEY (a), ADD FULLTEXT (b)", "alter t: ="),
            ("ALTER TABLE t ADD CONSTRAINT fk FOREIGN KEY (a) REFERENCES p (id), ADD PERIOD FOR p(a, b)", "alter t: ="),
            ("ALTER TABLE t PARTITION BY HASH(id) PARTITIONS 4", "alter t: ="),
            ("ALTER TABLE t REMOVE PARTITIONING", "alter t: ="),
            ("ALTER TABLE t DROP PARTITION p0, p1", "alter t: ="),
            ("ALTER TABLE t ALGORITHM=INPLACE, REORGANIZE PARTITION p0 INTO (PARTITION a VALUES LESS THAN (5), PARTITION b VALUES LESS THAN MAXVALUE)", "alter t: ="),
            ("ALTER TABLE t EXCHANGE PARTITION p WITH TABLE t2 WITHOUT VALIDATION", "alter t: ="),
            ("ALTER TABLE t ORDER BY a, b DESC", "alter t: ="),
        ], &maria());
    }

    #[test]
    #[rustfmt::skip]
    fn not_understood_is_an_error() {
        check(&[
            ("ALTER TABLE t FROBNICATE x", "error: unknown ALTER TABLE clause `FROBNICATE x`"),
            ("ALTER TABLE t ADD x INT,", "error: an empty ALTER TABLE clause"),
            ("ALTER TABLE t ADD x INT DEFAULT 'oops", "error: unterminated 'quoted' text"),
            ("ALTER TABLE t ADD x INT DEFAULT (1", "error: unbalanced (…"),
            ("ALTER TABLE t ADD x INT), DROP y", "error: unbalanced )…"),
            ("ALTER TABLE t ALTER COLUMN a FOO", "error: unknown ALTER TABLE clause…"),
            ("ALTER TABLE t RENAME COLUMN a b", "error: unknown ALTER TABLE clause…"),
            ("ALTER TABLE t DROP COLUMN x y", "error: unexpected `y` after DROP COLUMN"),
            ("ALTER TABLE t ADD COLUMN (a INT) FIRST", "error: unexpected `FIRST` after ADD (...)"),
            ("ALTER TABLE t ADD x INT DEFAULT first", "error: unexpected `DEFAULT first` in a column definition"),
            ("ALTER TABLE t ADD x INT FIRST AFTER y", "error: unexpected `AFTER y` after FIRST/AFTER"),
            ("ALTER TABLE t ADD x INT AFTER", "error: expected a column name after AFTER, found ``"),
            ("ALTER TABLE t ADD x", "error: a column definition without a type"),
            ("ALTER TABLE t CONVERT PARTITION p TO TABLE t2", "error: CONVERT PARTITION/TABLE…"),
            ("CREATE TABLE t (a INT) WITH SYSTEM VERSIONING", "error: system versioning…"),
            ("CREATE TABLE t (a INT WITHOUT SYSTEM VERSIONING)", "error: system versioning…"),
            ("ALTER TABLE t ADD SYSTEM VERSIONING", "error: system versioning…"),
            ("ALTER TABLE t DROP SYSTEM VERSIONING", "error: system versioning…"),
            ("CREATE TABLE t (a INT, CONSTRAINT c BLAH (a))", "error: unknown constraint…"),
        ], &maria());
        check(&[
            ("ALTER TABLE t ADD INDEX i ((a + 1))", "error: a functional key part…"),
            ("CREATE TABLE t (a INT, KEY k (a, (lower(a))))", "error: a functional key part…"),
            ("CREATE INDEX i ON t ((lower(a)))", "error: a functional key part…"),
        ], &mysql());
    }

    #[test]
    #[rustfmt::skip]
    fn other_statements() {
        check(&[
            ("", "other"),
            ("BEGIN", "other"),
            ("INSERT INTO outbox VALUES (1, 'ALTER TABLE outbox DROP a')", "other"),
            ("CREATE DATABASE d", "other"),
            ("DROP DATABASE d", "other"),
            ("GRANT SELECT ON d.* TO u", "other"),
            ("CREATE UNIQUE INDEX i ON t (a(10), b)", "other"),
            ("DROP INDEX i ON t", "other"),
            ("CREATE OR REPLACE VIEW v AS SELECT 1", "other"),
            ("ALTER DATABASE d CHARACTER SET utf8mb4", "other"),
            ("RENAME USER a TO b", "other"),
            ("CREATE DEFINER=`root`@`%` TRIGGER tr BEFORE INSERT ON t FOR EACH ROW SET @x = 1", "other"),
        ], &maria());
    }

    #[test]
    #[rustfmt::skip]
    fn sql_mode_quoting() {
        let ansi_table = "CREATE TABLE \"t\" (\"a\"\"b\" INT, c INT)";
        let backslash = "ALTER TABLE t ADD x CHAR(3) DEFAULT 'a\\', DROP y";
        check(&[(ansi_table, "create t(a\"b,c)")], &maria().with_sql_mode(0x4));
        check(&[(backslash, "alter t: +x -y")], &maria().with_sql_mode(0x10_0000));
        check(&[
            (ansi_table, "error: expected a table name…"),
            (backslash, "error: unterminated 'quoted' text"),
            ("ALTER TABLE t ADD x CHAR(3) DEFAULT \"a,b\", DROP y", "alter t: +x -y"),
            ("ALTER TABLE t ADD x CHAR(3) DEFAULT 'a\\'b', DROP y", "alter t: +x -y"),
        ], &maria());
    }

    #[test]
    fn version_ids() {
        assert_eq!(version_id("10.11.19-MariaDB-0+deb12u1-log"), Some(101119));
        assert_eq!(version_id("8.0.36"), Some(80036));
        assert_eq!(version_id("5.7.44-log"), Some(50744));
        assert_eq!(version_id("8.0"), None);
        // Found by fuzzing (ddl_parse): a major version whose id overflows u32 panicked.
        assert_eq!(version_id("43.48448444.448.44"), None);
        assert_eq!(version_id("429497.0.0"), None);
        assert_eq!(version_id("4294967295.99.99"), None);
        assert_eq!(version_id("1.4294967295.0"), None);
    }

    #[test]
    #[rustfmt::skip]
    fn apply_follows_mysql() {
        // `ALTER TABLE t <clauses>` on a table (a, b, c): the columns after, or the error.
        let cases = [
            ("ADD d INT, ADD e INT FIRST, ADD f INT AFTER a", "e,a,f,b,c,d"),
            ("ADD d INT, ADD e INT AFTER d", "a,b,c,d,e"),
            ("ADD x INT AFTER y, ADD y INT", "Unknown column 'y' (in AFTER)"),
            ("ADD COLUMN (d INT, e INT)", "a,b,c,d,e"),
            ("DROP b", "a,c"),
            ("DROP A", "b,c"),
            ("DROP z", "Can't DROP COLUMN `z`; check that it exists"),
            ("DROP a, DROP b, DROP c", "You can't delete all columns with ALTER TABLE; use DROP TABLE"),
            ("DROP a, ADD a INT", "b,c,a"),
            ("ADD d INT, DROP d", "Can't DROP COLUMN `d`; check that it exists"),
            ("ADD x INT AFTER a, DROP a", "Unknown column 'a' (in AFTER)"),
            ("ADD B INT", "Duplicate column name 'B'"),
            ("CHANGE b bb BIGINT", "a,bb,c"),
            ("CHANGE b bb INT FIRST", "bb,a,c"),
            ("CHANGE a a INT AFTER c", "b,c,a"),
            ("CHANGE a A INT", "A,b,c"),
            ("CHANGE a b INT, CHANGE b a INT", "b,a,c"),
            ("CHANGE a b INT", "Duplicate column name 'b'"),
            ("CHANGE a a2 INT, ADD x INT AFTER a2", "a2,x,b,c"),
            ("CHANGE a a2 INT, ADD x INT AFTER a", "Unknown column 'a' (in AFTER)"),
            ("CHANGE z y INT", "Unknown column 'z'"),
            ("CHANGE a z INT, CHANGE a y INT", "Unknown column 'a'"),
            ("DROP a, CHANGE a z INT", "Unknown column 'a'"),
            ("CHANGE a a INT AFTER c, ADD x INT FIRST, ADD y INT AFTER a", "x,b,c,a,y"),
            ("MODIFY c INT FIRST, MODIFY a INT AFTER c", "c,a,b"),
            ("MODIFY a INT AFTER b, MODIFY b INT FIRST", "b,a,c"),
            ("MODIFY C INT AFTER A", "a,C,b"),
            ("MODIFY a INT AFTER a", "Unknown column 'a' (in AFTER)"),
            ("RENAME COLUMN a TO x, ADD y INT AFTER x", "x,y,b,c"),
            ("RENAME COLUMN a TO b, RENAME COLUMN b TO a", "b,a,c"),
            ("RENAME COLUMN a TO x, RENAME COLUMN x TO y", "Unknown column 'x' (in RENAME COLUMN)"),
            ("RENAME COLUMN a TO x, DROP x", "Can't DROP COLUMN `x`; check that it exists"),
            ("RENAME COLUMN a TO x, CHANGE a z INT", "Unknown column 'a' (in RENAME COLUMN)"),
            ("RENAME COLUMN a TO b", "Duplicate column name 'b'"),
            ("ADD INDEX (a), ALTER COLUMN b SET DEFAULT 1, RENAME TO u, ENGINE=InnoDB", "a,b,c"),
            // MariaDB's IF [NOT] EXISTS.
            ("ADD COLUMN IF NOT EXISTS a INT", "a,b,c"),
            ("ADD COLUMN IF NOT EXISTS A INT FIRST", "a,b,c"),
            ("ADD IF NOT EXISTS d INT, ADD IF NOT EXISTS d INT", "a,b,c,d"),
            ("ADD d INT, ADD IF NOT EXISTS d INT", "a,b,c,d"),
            ("ADD IF NOT EXISTS a INT, ADD a INT", "Duplicate column name 'a'"),
            ("ADD IF NOT EXISTS (a INT, e INT)", "a,b,c,e"),
            ("ADD IF NOT EXISTS (d INT, d INT)", "a,b,c,d"),
            ("CHANGE a d INT, ADD IF NOT EXISTS d INT", "d,b,c"),
            ("ADD IF NOT EXISTS d INT, CHANGE a d INT", "Duplicate column name 'd'"),
            ("MODIFY IF EXISTS z INT, ADD IF NOT EXISTS z INT", "a,b,c"),
            ("RENAME COLUMN a TO d, ADD IF NOT EXISTS d INT", "Duplicate column name 'd'"),
            ("DROP COLUMN IF EXISTS z, DROP b", "a,c"),
            ("DROP IF EXISTS b, DROP IF EXISTS b", "a,c"),
            ("DROP IF EXISTS a, DROP a", "Can't DROP COLUMN `a`; check that it exists"),
            ("DROP IF EXISTS a, ADD IF NOT EXISTS a INT", "b,c"),
            ("ADD IF NOT EXISTS d INT, DROP IF EXISTS d", "a,b,c,d"),
            ("CHANGE IF EXISTS z y INT, MODIFY IF EXISTS z INT FIRST", "a,b,c"),
            ("CHANGE IF EXISTS a b INT", "Duplicate column name 'b'"),
            ("DROP IF EXISTS a, CHANGE IF EXISTS a z INT", "Unknown column 'a'"),
            ("RENAME COLUMN IF EXISTS z TO y", "a,b,c"),
        ];
        for (clauses, want) in cases {
            let Ok(Ddl::AlterTable { ops, .. }) = parse(&format!("ALTER TABLE t {clauses}"), &maria()) else {
                panic!("{clauses}: not parsed");
            };
            let mut columns: Columns = vec!["a".into(), "b".into(), "c".into()];
            let got = match apply(&mut columns, &ops) {
                Ok(()) => columns.join(","),
                Err(e) => {
                    assert_eq!(columns, ["a", "b", "c"], "{clauses}: unchanged on error");
                    e
                }
            };
            assert_eq!(got, want, "{clauses}");
        }
    }

    #[test]
    fn mentions_is_a_safe_prefilter() {
        assert!(mentions("ALTER TABLE `outbox` ADD x INT", "outbox"));
        assert!(mentions("alter table shop.OUTBOX add x int", "outbox"));
        assert!(mentions("RENAME TABLE a TO outbox", "Outbox"));
        assert!(mentions("DROP TABLE `out``box`", "out`box"));
        assert!(mentions("DROP TABLE \"out\"\"box\"", "out\"box"));
        assert!(mentions("DROP TABLE `my outbox`", "my outbox"));
        assert!(mentions("ALTER TABLE t /* outbox */ ADD x INT", "outbox"));
        assert!(!mentions(
            "ALTER TABLE outbox_archive ADD outbox_id INT",
            "outbox"
        ));
        assert!(!mentions("DROP TABLE xoutbox, outbox2, $outbox", "outbox"));
        assert!(!mentions("DROP TABLE t", ""));
    }
}
