//! Configuration errors as a person needs them: which key, where (file and line), what is
//! wrong and how to fix it, in the words of the configuration reference, never in Rust's.
//!
//! Figment and serde report a key path and a structured error kind; the values figment read
//! carry no lines. [`Places`] reads the files again with `toml_edit`, which keeps spans, to find
//! each key's line, and [`super::reference`] (the tree the reference is generated from) gives
//! each key's type, values and siblings. Unknown keys get the closest valid key (`strsim`), a
//! dotted property name left unquoted (`linger.ms = "5"`) gets its quoted form, and a key whose
//! value has the type a near-miss sibling takes (`table = ["db.outbox"]`) gets that sibling.

use std::path::Path;

use figment::error::{Actual, Kind};

use super::reference::{self, Node};
use crate::error::RelayError;

/// A value read from a file, with the line it starts on.
#[derive(Debug, Clone)]
struct Located {
    line: usize,
    value: Shape,
}

#[derive(Debug, Clone)]
enum Shape {
    Table(Vec<(String, Located)>),
    Array(Vec<Located>),
    /// A scalar's text as written (`"5"`, `5000`, `true`).
    Scalar(String),
}

impl Located {
    fn get(&self, seg: &str) -> Option<&Located> {
        match &self.value {
            Shape::Table(entries) => entries.iter().find(|(k, _)| k == seg).map(|(_, v)| v),
            Shape::Array(items) => seg.parse::<usize>().ok().and_then(|i| items.get(i)),
            Shape::Scalar(_) => None,
        }
    }

    /// `name = value` lines for every scalar under this value, names dotted from `name`.
    fn flatten(&self, name: &str, out: &mut Vec<(String, String, usize)>) {
        match &self.value {
            Shape::Table(entries) => {
                for (k, v) in entries {
                    v.flatten(&format!("{name}.{k}"), out);
                }
            }
            Shape::Array(_) => out.push((name.to_owned(), "[…]".into(), self.line)),
            Shape::Scalar(s) => out.push((name.to_owned(), s.clone(), self.line)),
        }
    }
}

fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset).map_or(0, |t| t.matches('\n').count()) + 1
}

fn from_value(text: &str, v: &toml_edit::Value, line: usize) -> Located {
    let line = v.span().map_or(line, |s| line_of(text, s.start));
    let value = match v {
        toml_edit::Value::Array(a) => {
            Shape::Array(a.iter().map(|v| from_value(text, v, line)).collect())
        }
        toml_edit::Value::InlineTable(t) => {
            Shape::Table(entries(text, line, t.iter().map(|(k, _)| k), |k| {
                t.get_key_value(k)
            }))
        }
        other => Shape::Scalar(
            other
                .span()
                .and_then(|s| text.get(s))
                .map(str::trim)
                .unwrap_or_default()
                .to_owned(),
        ),
    };
    Located { line, value }
}

fn from_table(text: &str, t: &toml_edit::Table, line: usize) -> Located {
    let line = t.span().map_or(line, |s| line_of(text, s.start));
    Located {
        line,
        value: Shape::Table(entries(text, line, t.iter().map(|(k, _)| k), |k| {
            t.get_key_value(k)
        })),
    }
}

/// A table's entries, each with the line of its key.
fn entries<'t>(
    text: &str,
    line: usize,
    keys: impl Iterator<Item = &'t str>,
    get: impl Fn(&str) -> Option<(&'t toml_edit::Key, &'t toml_edit::Item)>,
) -> Vec<(String, Located)> {
    keys.filter_map(|k| {
        let (key, item) = get(k)?;
        let line = key.span().map_or(line, |s| line_of(text, s.start));
        Some((k.to_owned(), from_item(text, item, line)))
    })
    .collect()
}

fn from_item(text: &str, item: &toml_edit::Item, line: usize) -> Located {
    match item {
        toml_edit::Item::Table(t) => from_table(text, t, line),
        toml_edit::Item::ArrayOfTables(a) => Located {
            line,
            value: Shape::Array(a.iter().map(|t| from_table(text, t, line)).collect()),
        },
        toml_edit::Item::Value(v) => from_value(text, v, line),
        toml_edit::Item::None => Located {
            line,
            value: Shape::Scalar(String::new()),
        },
    }
}

/// One place a source's keys are written: a file, and where in it (`source.1` for the second
/// `[[source]]` table; nothing for a single-source file or a `sources_dir` file).
#[derive(Debug, Clone)]
pub(crate) struct Place {
    /// The file's name as the user gave it (`relay.toml`), or `the configuration` for text.
    file: String,
    root: Option<Located>,
    prefix: Vec<String>,
}

impl Place {
    /// `path`, read and parsed again for lines (none when it cannot be).
    pub(crate) fn file(path: &Path, prefix: &[&str]) -> Self {
        let text = std::fs::read_to_string(path).ok();
        Self::text(&path.display().to_string(), text.as_deref(), prefix)
    }

    /// Configuration text under a file name (`""`: text without a file).
    pub(crate) fn text(name: &str, text: Option<&str>, prefix: &[&str]) -> Self {
        let root = text.and_then(|t| {
            let doc = toml_edit::ImDocument::parse(t).ok()?;
            Some(from_table(t, doc.as_table(), 1))
        });
        Self {
            file: name.to_owned(),
            root,
            prefix: prefix.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    /// ` (relay.toml line 6)`, or ` (line 6)` for text without a file.
    fn line(&self, line: usize) -> String {
        if self.file.is_empty() {
            format!(" (line {line})")
        } else {
            format!(" ({} line {line})", self.file)
        }
    }

    fn find(&self, path: &[String]) -> Option<&Located> {
        let mut at = self.root.as_ref()?;
        for seg in self.prefix.iter().chain(path) {
            at = at.get(seg)?;
        }
        Some(at)
    }
}

/// Where a source's keys may be written, most specific first (a `[[source]]` table, then the
/// file's shared sections).
#[derive(Debug, Clone, Default)]
pub(crate) struct Places(pub(crate) Vec<Place>);

/// Where a key was found.
#[derive(Clone, Copy)]
struct Found<'a> {
    place: &'a Place,
    at: &'a Located,
}

impl Places {
    /// The places of one file.
    pub(crate) fn file(path: &Path) -> Self {
        Self(vec![Place::file(path, &[])])
    }

    fn find(&self, path: &[String]) -> Option<Found<'_>> {
        self.0.iter().find_map(|place| {
            Some(Found {
                place,
                at: place.find(path)?,
            })
        })
    }

    /// ` (relay.toml line 6)`, ` (environment variable OUTBOX_RELAY__X__Y)`, or nothing.
    fn at(&self, path: &[String]) -> String {
        self.at_with(path, |var| std::env::var(var).ok())
    }

    /// [`Places::at`] with the environment read through `env`. The environment is merged
    /// after the files, so a variable that sets the key, or a section above it with the key
    /// in its value (`OUTBOX_RELAY__KAFKA__PROPERTIES='{"linger.ms"=20}'`), is where the value
    /// came from, even when a file writes that section too.
    fn at_with(&self, path: &[String], env: impl Fn(&str) -> Option<String>) -> String {
        if path.is_empty() {
            return String::new();
        }
        if let Some(var) = env_source(path, env) {
            return format!(" (environment variable {var})");
        }
        if let Some(f) = self.find(path) {
            return f.place.line(f.at.line);
        }
        // A missing key: the line of the closest section written.
        (1..path.len())
            .rev()
            .find_map(|n| self.find(&path[..n]))
            .map(|f| f.place.line(f.at.line))
            .unwrap_or_default()
    }

    /// Whether the key was found under a `[[source]]` table (its section is then written
    /// `[source.outbox]`).
    fn in_source_table(&self, path: &[String]) -> bool {
        self.find(path)
            .is_some_and(|f| f.place.prefix.first().is_some_and(|p| p == "source"))
    }

    /// A figment error as one configuration error; `base` is the path of the value that was
    /// deserialized (`["fleet"]` for `[fleet]`), empty for a whole source.
    pub(crate) fn error(&self, e: figment::Error, base: &[&str]) -> RelayError {
        let messages: Vec<String> = e
            .into_iter()
            .map(|e| {
                let mut path: Vec<String> = base.iter().map(|s| (*s).to_owned()).collect();
                path.extend(e.path.iter().cloned());
                self.message(&e.kind, &path)
            })
            .collect();
        RelayError::Config(messages.join("; "))
    }

    fn message(&self, kind: &Kind, path: &[String]) -> String {
        match kind {
            Kind::UnknownField(field, expected) => self.unknown_key(field, expected, path),
            Kind::InvalidType(actual, expected) => self.invalid_type(actual, expected, path),
            Kind::InvalidValue(actual, expected) => {
                let node = reference::lookup(path);
                format!(
                    "{}{}: {} is out of range: {}{}",
                    key_label(path),
                    self.at(path),
                    actual_text(actual),
                    integer_range(expected)
                        .unwrap_or_else(|| format!("expected {}", expectation(node, expected))),
                    "",
                )
            }
            Kind::UnknownVariant(value, expected) => {
                let suggestion = closest(value, expected.iter().copied())
                    .map(|s| format!("did you mean {s:?}? "))
                    .unwrap_or_default();
                format!(
                    "{}{}: unknown value {value:?}: {suggestion}the values are {}",
                    key_label(path),
                    self.at(path),
                    expected
                        .iter()
                        .map(|v| format!("{v:?}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
            Kind::MissingField(name) => self.missing(name, path),
            Kind::Message(m) if m.starts_with("TOML parse error") => {
                let file = self
                    .0
                    .first()
                    .map(|p| p.file.as_str())
                    .filter(|f| !f.is_empty())
                    .unwrap_or("the configuration");
                format!(
                    "{file}: {}",
                    m.trim_end()
                        .replace("TOML parse error", "TOML syntax error")
                )
            }
            Kind::Message(m) => format!("{}{}: {m}", key_label(path), self.at(path)),
            Kind::InvalidLength(n, _) => format!(
                "{}{}: {n} entries is not a valid number of entries",
                key_label(path),
                self.at(path)
            ),
            Kind::DuplicateField(f) => format!(
                "{}{}: the key {f:?} is written twice: keep one",
                key_label(path),
                self.at(path)
            ),
            Kind::ISizeOutOfRange(_)
            | Kind::USizeOutOfRange(_)
            | Kind::Unsupported(_)
            | Kind::UnsupportedKey(..) => {
                let node = reference::lookup(path);
                format!(
                    "{}{}: not {}{}",
                    key_label(path),
                    self.at(path),
                    expectation(node, ""),
                    fix(node, path, None)
                )
            }
        }
    }

    /// `[outbox]`, `[source.outbox]`, `[[outbox.table]] number 2`, or `the top level`.
    fn section_label(&self, parent: &[String]) -> String {
        if parent.is_empty() {
            return "at the top level".into();
        }
        let source = if self.in_source_table(parent) {
            "source."
        } else {
            ""
        };
        match parent.last() {
            Some(last) if last.bytes().all(|b| b.is_ascii_digit()) => {
                let n = last.parse::<usize>().map_or(1, |n| n + 1);
                let list = reference::normalize(parent);
                if reference::lookup(parent).is_some_and(|n| n.heading.starts_with("[[")) {
                    format!("in [[{source}{list}]] number {n}")
                } else {
                    format!("in {list} entry {n}")
                }
            }
            _ => format!("in [{source}{}]", reference::normalize(parent)),
        }
    }

    fn unknown_key(&self, field: &str, expected: &[&str], path: &[String]) -> String {
        let parent = &path[..path.len().saturating_sub(1)];
        let section = reference::lookup(parent);
        let written = self.find(path);
        let is_table = written.is_some_and(|f| matches!(f.at.value, Shape::Table(_)));
        let what = if is_table && parent.is_empty() {
            format!("unknown section [{field}]")
        } else {
            format!("unknown key {field:?}")
        };
        let head = format!("{what} {}{}", self.section_label(parent), self.at(path));
        // The keys a user may write here: the reference's (one name per key); serde's list
        // (with Debezium's dotted aliases) when the reference has no such section.
        let keys: Vec<String> = match section {
            Some(s) if !s.keys.is_empty() => s.keys.clone(),
            _ => expected.iter().map(|s| (*s).to_owned()).collect(),
        };
        // `table.expand.json.payload = true`: TOML read a dotted name as nested tables.
        if let Some(f) = written.filter(|_| is_table) {
            let mut lines = Vec::new();
            f.at.flatten(field, &mut lines);
            let accepted: Vec<&(String, String, usize)> = lines
                .iter()
                .filter(|(name, _, _)| expected.contains(&name.as_str()))
                .collect();
            if !accepted.is_empty() {
                return format!(
                    "{head}: {} read as nested tables because the name has dots: quote it: {}",
                    accepted
                        .iter()
                        .map(|(n, _, _)| n.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                    accepted
                        .iter()
                        .map(|(n, v, _)| format!("\"{n}\" = {v}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
        }
        let candidates = keys
            .iter()
            .map(String::as_str)
            .chain(expected.iter().copied());
        let listed = keys.join(", ");
        // A key written above its section's header (`tables` before `[outbox]`).
        let elsewhere: Vec<&Node> = reference::nodes()
            .values()
            .filter(|n| !n.section && !n.in_list && n.heading == field && n.path != field)
            .collect();
        if let ([other], None) = (
            elsewhere.as_slice(),
            closest(field, keys.iter().map(String::as_str)),
        ) {
            let section = other.path.rsplit_once('.').map_or("", |(s, _)| s);
            return format!(
                "{head}: {field} is a key of [{section}]: write it below the [{section}] line \
                 (a key belongs to the last [section] line above it)"
            );
        }
        match closest(field, candidates) {
            Some(s) if parent.is_empty() && is_table => {
                format!("{head}: did you mean [{s}]? The top-level keys and sections are: {listed}")
            }
            Some(s) => format!("{head}: did you mean {s:?}? The valid keys are: {listed}"),
            None => format!("{head}: remove it or correct its name; the valid keys are: {listed}"),
        }
    }

    fn invalid_type(&self, actual: &Actual, expected: &str, path: &[String]) -> String {
        // A list of tables given something else: the error names the entry
        // (`outbox.table.0`); the user wrote the key.
        let (key_path, element) = match path.split_last() {
            Some((last, rest)) if last.bytes().all(|b| b.is_ascii_digit()) => (rest.to_vec(), true),
            _ => (path.to_vec(), false),
        };
        let node = reference::lookup(&key_path).or_else(|| reference::lookup(path));
        let node = node.or_else(|| {
            // A value of a table of strings takes a string.
            let parent = &key_path[..key_path.len().saturating_sub(1)];
            reference::lookup(parent)
                .filter(|n| n.kind.starts_with("table of"))
                .and(reference::string_node())
        });
        let parent = &key_path[..key_path.len().saturating_sub(1)];
        let name = key_path.last().cloned().unwrap_or_default();
        // What the user wrote, as a whole.
        let written = self.find(&key_path);
        let found = match (element, written.map(|f| &f.at.value)) {
            (true, Some(Shape::Array(items))) => {
                let scalars = items.iter().all(|i| matches!(i.value, Shape::Scalar(_)));
                if scalars && matches!(actual, Actual::Str(_)) {
                    "a list of strings".to_owned()
                } else {
                    format!("a list holding {}", actual_text(actual))
                }
            }
            _ => actual_text(actual),
        };
        // `linger.ms = "5"` in a table of strings: TOML made it the table `linger`.
        if matches!(actual, Actual::Map) {
            if let Some(map) = reference::lookup(parent).filter(|n| n.kind.starts_with("table of"))
            {
                let mut lines = Vec::new();
                if let Some(f) = written {
                    f.at.flatten(&name, &mut lines);
                }
                let shown = if lines.is_empty() {
                    format!("{name}.…")
                } else {
                    lines
                        .iter()
                        .map(|(n, _, _)| n.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                let quoted = if lines.is_empty() {
                    format!("\"{name}.…\" = \"…\"")
                } else {
                    lines
                        .iter()
                        .map(|(n, v, _)| format!("\"{n}\" = {v}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                return format!(
                    "{}: {shown}{} was read as the table {name:?} because the name has dots and no \
                     quotes, but {} keys are names with string values: quote the name: {quoted}",
                    map.path,
                    self.at(&key_path),
                    map.path
                );
            }
        }
        // A near-miss sibling that takes what was written (`table` for `tables`).
        let sibling = reference::lookup(parent)
            .map(|s| {
                s.keys
                    .iter()
                    .filter(|k| **k != name)
                    .filter(|k| {
                        let mut p = parent.to_vec();
                        p.push((*k).clone());
                        reference::lookup(&p).is_some_and(|n| accepts(n, &found, actual))
                    })
                    .cloned()
                    .collect::<Vec<_>>()
            })
            .and_then(|siblings| {
                closest(&name, siblings.iter().map(String::as_str)).map(str::to_owned)
            });
        let hint = match sibling {
            Some(s) => {
                let value = written
                    .and_then(|f| self.source_text(f.at))
                    .unwrap_or_else(|| "…".into());
                format!(": did you mean {s} = {value}?")
            }
            // A value of a table of strings (`"linger.ms" = 5`).
            None if node.is_none()
                && reference::lookup(parent).is_some_and(|n| n.kind.starts_with("table of")) =>
            {
                let value = match actual {
                    Actual::Str(s) => s.clone(),
                    Actual::Signed(v) => v.to_string(),
                    Actual::Unsigned(v) => v.to_string(),
                    Actual::Float(v) => v.to_string(),
                    Actual::Bool(v) => v.to_string(),
                    _ => "…".into(),
                };
                format!(
                    ": write it in double quotes: {} = {value:?}",
                    toml_key(&name)
                )
            }
            None => fix(node, &key_path, Some(actual)),
        };
        format!(
            "{}{}: expected {}, found {found}{hint}",
            key_label(&key_path),
            self.at(&key_path),
            expectation(node, expected),
        )
    }

    /// A value's text as written, for lists of scalars and scalars.
    fn source_text(&self, at: &Located) -> Option<String> {
        match &at.value {
            Shape::Scalar(s) => Some(s.clone()),
            Shape::Array(items) => Some(format!(
                "[{}]",
                items
                    .iter()
                    .map(|i| match &i.value {
                        Shape::Scalar(s) => s.clone(),
                        _ => "…".into(),
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            Shape::Table(_) => None,
        }
    }

    fn missing(&self, name: &str, parent: &[String]) -> String {
        let mut path = parent.to_vec();
        path.push(name.to_owned());
        let node = reference::lookup(&path);
        let doc = node
            .map(|n| first_sentence(&n.description))
            .filter(|d| !d.is_empty())
            .map(|d| format!(": {d}"))
            .unwrap_or_default();
        match node {
            Some(n) if n.section => {
                let keys: Vec<String> = n
                    .keys
                    .iter()
                    .filter(|k| {
                        reference::lookup(&[n.path.as_str(), k.as_str()])
                            .is_some_and(|c| c.default == "required")
                    })
                    .map(|k| format!("{k} = …"))
                    .collect();
                let with = if keys.is_empty() {
                    String::new()
                } else {
                    format!(" with {}", keys.join(", "))
                };
                // The section's description, as an aside: "(the Kafka producer: …)".
                let about = doc
                    .trim_start_matches(": ")
                    .trim_end_matches('.')
                    .to_owned();
                let about = match about.chars().next() {
                    Some(c) => format!(" ({}{})", c.to_lowercase(), &about[c.len_utf8()..]),
                    None => String::new(),
                };
                format!(
                    "the section [{}] is missing{}: add [{}]{with}{about}",
                    n.path,
                    self.at(parent),
                    n.path
                )
            }
            _ => format!(
                "{}{} needs the key {name}, which has no default: add {name} = … below that \
                 line{}",
                self.section_label(parent)
                    .trim_start_matches("in ")
                    .trim_start_matches("at "),
                self.at(parent),
                doc.replacen(": ", &format!(". {name}: "), 1)
            ),
        }
    }
}

/// `kafka.properties."linger.ms"`, `outbox.additional[1].placement` (1 = the first entry).
/// The environment variable (`OUTBOX_RELAY__A__B`) whose value holds the key at `path`: the
/// one of the key itself, else the nearest one of a section above it whose value (parsed as
/// the configuration loader parses it: `{"linger.ms"=20}` is a table) has the key.
fn env_source(path: &[String], env: impl Fn(&str) -> Option<String>) -> Option<String> {
    (1..=path.len()).rev().find_map(|n| {
        let var = format!(
            "{}{}",
            super::ENV_PREFIX,
            path[..n]
                .iter()
                .map(|s| s.to_uppercase())
                .collect::<Vec<_>>()
                .join("__")
        );
        let text = env(&var)?;
        let mut value: figment::value::Value = text.parse().ok()?;
        for seg in &path[n..] {
            value = match value {
                figment::value::Value::Dict(_, mut dict) => dict.remove(seg)?,
                _ => return None,
            };
        }
        Some(var)
    })
}

fn key_label(path: &[String]) -> String {
    let mut out = String::new();
    for seg in path {
        if seg.bytes().all(|b| b.is_ascii_digit()) && !seg.is_empty() {
            let n = seg.parse::<usize>().map_or(1, |n| n + 1);
            out.push_str(&format!("[{n}]"));
            continue;
        }
        if !out.is_empty() {
            out.push('.');
        }
        if seg.contains('.') || seg.is_empty() {
            out.push_str(&format!("{seg:?}"));
        } else {
            out.push_str(seg);
        }
    }
    if out.is_empty() {
        "the configuration".into()
    } else {
        out
    }
}

/// The range of serde's integer types, in words (`u32`: `0 to 4294967295`).
fn integer_range(serde_expected: &str) -> Option<String> {
    let range = match serde_expected {
        "u8" => "0 to 255",
        "u16" => "0 to 65535",
        "u32" => "0 to 4294967295",
        "u64" | "usize" => "0 or more",
        "i32" => "-2147483648 to 2147483647",
        "i64" => "a whole number",
        _ => return None,
    };
    Some(format!("the value must be {range}"))
}

/// A key as TOML writes it: bare, or quoted when it has other characters (`"linger.ms"`).
fn toml_key(key: &str) -> String {
    if !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        key.to_owned()
    } else {
        format!("{key:?}")
    }
}

fn first_sentence(doc: &str) -> String {
    let para = doc.split("\n\n").next().unwrap_or_default();
    match para.find(". ") {
        Some(i) => para[..=i].to_owned(),
        None => para.to_owned(),
    }
}

/// What a value is, in a user's words.
fn actual_text(actual: &Actual) -> String {
    match actual {
        Actual::Bool(b) => format!("the boolean {b}"),
        Actual::Unsigned(n) => format!("the integer {n}"),
        Actual::Signed(n) => format!("the integer {n}"),
        Actual::Float(f) => format!("the number {f}"),
        Actual::Char(c) => format!("the string {:?}", c.to_string()),
        Actual::Str(s) => format!("the string {s:?}"),
        Actual::Seq => "a list".into(),
        Actual::Map => "a table".into(),
        Actual::Unit | Actual::Option => "nothing".into(),
        _ => "a value of another type".into(),
    }
}

fn article(kind: &str) -> &'static str {
    if kind.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    }
}

/// What the key takes: from the reference when it knows the key, else serde's expectation in
/// a user's words (serde names Rust types: `u32`, `struct OutboxTableConfig`, `a sequence`).
fn expectation(node: Option<&Node>, serde_expected: &str) -> String {
    if let Some(n) = node {
        if !n.values.is_empty() {
            return format!(
                "one of {}",
                n.values
                    .iter()
                    .map(|(v, _)| format!("{v:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        let kind = n.kind.split(" (any key").next().unwrap_or(&n.kind);
        let range = n
            .range
            .as_deref()
            .map(|r| format!(", {r}"))
            .unwrap_or_default();
        let section = if n.section && n.heading.starts_with('[') {
            format!(" ({})", n.heading)
        } else {
            String::new()
        };
        return format!("{} {kind}{section}{range}", article(kind));
    }
    let e = serde_expected;
    if e.contains("string") || e == "a borrowed path" || e == "path string" {
        "a string".into()
    } else if e.starts_with('u') && e[1..].bytes().all(|b| b.is_ascii_digit()) || e == "usize" {
        "a whole number, 0 or more".into()
    } else if e.starts_with('i') && e[1..].bytes().all(|b| b.is_ascii_digit()) {
        "a whole number".into()
    } else if e.starts_with('f') && e[1..].bytes().all(|b| b.is_ascii_digit()) {
        "a number".into()
    } else if e.contains("bool") {
        "a boolean (true or false)".into()
    } else if e.contains("sequence") {
        "a list".into()
    } else {
        "a table".into()
    }
}

/// Whether `n` takes what was written.
fn accepts(n: &Node, found: &str, actual: &Actual) -> bool {
    if found == "a list of strings" {
        return n.kind == "list of strings";
    }
    match actual {
        Actual::Str(_) => n.kind == "string" || !n.values.is_empty(),
        Actual::Bool(_) => n.kind.starts_with("boolean"),
        Actual::Signed(_) | Actual::Unsigned(_) => {
            n.kind.starts_with("integer") || n.kind.contains("(integer)")
        }
        Actual::Float(_) => n.kind == "number",
        Actual::Seq => n.kind.starts_with("list"),
        Actual::Map => n.section || n.kind.starts_with("table"),
        _ => false,
    }
}

/// How to write the value right, as a sentence starting with `: `.
fn fix(node: Option<&Node>, path: &[String], actual: Option<&Actual>) -> String {
    let Some(n) = node else {
        return String::new();
    };
    let key = toml_key(path.last().map_or("key", String::as_str));
    let written = match actual {
        Some(Actual::Str(s)) => Some(s.clone()),
        Some(Actual::Signed(v)) => Some(v.to_string()),
        Some(Actual::Unsigned(v)) => Some(v.to_string()),
        Some(Actual::Float(v)) => Some(v.to_string()),
        Some(Actual::Bool(v)) => Some(v.to_string()),
        _ => None,
    };
    if n.section {
        return if n.heading.starts_with("[[") {
            format!(": write each entry as a {} table", n.heading)
        } else if n.heading.starts_with('[') {
            format!(
                ": write it as the section {} with key = value lines",
                n.heading
            )
        } else {
            format!(": write it as an inline table, {}", n.heading)
        };
    }
    if !n.values.is_empty() {
        return format!(
            ": write it in double quotes, e.g. {key} = {:?}",
            n.values
                .first()
                .map(|(v, _)| v.as_str())
                .unwrap_or_default()
        );
    }
    match n.kind.as_str() {
        "string" => format!(
            ": write it in double quotes: {key} = {:?}",
            written.unwrap_or_default()
        ),
        k if k.starts_with("boolean") => {
            format!(": write {key} = true or {key} = false, without quotes")
        }
        k if k.starts_with("integer") || k.contains("(integer)") => {
            let example = written
                .filter(|w| w.parse::<u64>().is_ok())
                .unwrap_or_else(|| n.default.trim_matches('"').to_owned());
            let example = if example.parse::<u64>().is_ok() {
                example
            } else {
                "1000".into()
            };
            format!(": write a whole number without quotes, e.g. {key} = {example}")
        }
        "number" => format!(": write a number without quotes, e.g. {key} = 0.5"),
        "list of strings" => format!(
            ": write a list in brackets: {key} = [{:?}]",
            written.unwrap_or_else(|| "…".into())
        ),
        k if k.starts_with("table of") => format!(
            ": write it as the section [{}] with \"name\" = \"value\" lines",
            n.path
        ),
        _ => String::new(),
    }
}

/// The candidate closest to `word`, when it is close enough to be what was meant: the same
/// once case and `-`/`_` are ignored, or a Damerau-Levenshtein distance of at most 2 (1 for
/// words of 3 to 5 letters), or a Jaro-Winkler similarity of at least 0.9.
pub(crate) fn closest<'a>(
    word: &str,
    candidates: impl Iterator<Item = &'a str>,
) -> Option<&'a str> {
    let norm = |s: &str| s.to_lowercase().replace('-', "_");
    let w = norm(word);
    candidates
        .filter(|c| *c != word)
        .map(|c| {
            let n = norm(c);
            let distance = strsim::damerau_levenshtein(&w, &n);
            let similarity = strsim::jaro_winkler(&w, &n);
            (c, distance, similarity)
        })
        .filter(|(c, distance, similarity)| {
            let len = w.len().max(c.len());
            *distance == 0
                || (*distance <= 2 && len >= 6)
                || (*distance == 1 && len >= 3)
                || *similarity >= 0.9
        })
        .min_by(|a, b| a.1.cmp(&b.1).then(b.2.total_cmp(&a.2)))
        .map(|(c, _, _)| c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::process::ProcessConfig;
    use crate::config::RelayConfig;

    const BASE: &str = "[mysql]\nurl = \"mysql://root@127.0.0.1:3306/shop\"\n\
                        [kafka]\nbootstrap_servers = \"127.0.0.1:9092\"\n";

    /// The error of `BASE` followed by `rest`, without the `configuration error: ` prefix.
    fn error(rest: &str) -> String {
        let text = format!("{BASE}{rest}");
        match RelayConfig::from_toml_str(&text) {
            Ok(_) => panic!("accepted:\n{text}"),
            Err(e) => e
                .to_string()
                .trim_start_matches("configuration error: ")
                .to_owned(),
        }
    }

    const OUTBOX_KEYS: &str = "binary_format, compat, datetime_time_zone, key_format, \
        null_payload, on_update, tables, timestamp, timestamp_refused, topic, trace_context, \
        unknown_xa_commit, additional, cloudevents, columns, headers, table";

    #[test]
    fn an_unknown_key_gets_the_closest_one_its_section_line_and_the_valid_keys() {
        assert_eq!(
            error("[outbox]\ntabels = [\"shop.outbox\"]\n"),
            format!(
                "unknown key \"tabels\" in [outbox] (line 6): did you mean \"tables\"? The valid \
                 keys are: {OUTBOX_KEYS}"
            )
        );
        // Nothing close: no suggestion, the list and the fix.
        assert_eq!(
            error("[outbox]\ntables = [\"shop.outbox\"]\nzzz = 1\n"),
            format!(
                "unknown key \"zzz\" in [outbox] (line 7): remove it or correct its name; the \
                 valid keys are: {OUTBOX_KEYS}"
            )
        );
        assert_eq!(
            error("[outbox]\ntables = [\"shop.outbox\"]\n[checkpoints]\ntable = \"x\"\n"),
            "unknown section [checkpoints] at the top level (line 7): did you mean \
             [checkpoint]? The top-level keys and sections are: connector_name, sources_dir, \
             sources_poll_ms, mysql, outbox, kafka, checkpoint, retry, dead_letter, http, \
             tracing, audit, cutover, debezium, source, fleet"
        );
        // A hyphen for an underscore, inside a list of tables.
        assert_eq!(
            error("[outbox]\n[[outbox.table]]\nname = \"shop.outbox\"\nkey-format = \"raw\"\n"),
            "unknown key \"key-format\" in [[outbox.table]] number 1 (line 8): did you mean \
             \"key_format\"? The valid keys are: name, binary_format, datetime_time_zone, \
             key_format, null_payload, on_update, timestamp, timestamp_refused, topic, \
             additional, columns, headers"
        );
        // A key above its section's line.
        assert_eq!(
            error("tables = [\"shop.outbox\"]\n[outbox]\n"),
            "unknown key \"tables\" in [kafka] (line 5): tables is a key of [outbox]: write it \
             below the [outbox] line (a key belongs to the last [section] line above it)"
        );
    }

    #[test]
    fn closest_keys_are_suggested_only_when_close() {
        let keys = [
            "tables",
            "table",
            "topic",
            "url",
            "bootstrap_servers",
            "group_id",
        ];
        let best = |w: &str| closest(w, keys.iter().copied());
        assert_eq!(best("tabels"), Some("tables"));
        assert_eq!(best("Tables"), Some("tables"));
        assert_eq!(best("bootstrap-servers"), Some("bootstrap_servers"));
        assert_eq!(best("bootstrap_server"), Some("bootstrap_servers"));
        assert_eq!(best("groupid"), Some("group_id"));
        assert_eq!(best("uri"), Some("url"));
        assert_eq!(best("topics"), Some("topic"));
        assert_eq!(best("zzz"), None);
        assert_eq!(best("id"), None);
        assert_eq!(best("partition"), None);
    }

    #[test]
    fn an_unquoted_dotted_property_is_named_as_written_with_its_quoted_form() {
        assert_eq!(
            error("[outbox]\ntables = [\"shop.outbox\"]\n[kafka.properties]\nlinger.ms = \"5\"\n"),
            "kafka.properties: linger.ms (line 8) was read as the table \"linger\" because the \
             name has dots and no quotes, but kafka.properties keys are names with string \
             values: quote the name: \"linger.ms\" = \"5\""
        );
        // Deeper names, inline.
        assert_eq!(
            error(
                "properties = { ssl.key.password = \"x\" }\n[outbox]\ntables = [\"shop.outbox\"]\n"
            ),
            "kafka.properties: ssl.key.password (line 5) was read as the table \"ssl\" because \
             the name has dots and no quotes, but kafka.properties keys are names with string \
             values: quote the name: \"ssl.key.password\" = \"x\""
        );
        // A property's value must be a string.
        assert_eq!(
            error("[outbox]\ntables = [\"shop.outbox\"]\n[kafka.properties]\n\"linger.ms\" = 5\n"),
            "kafka.properties.\"linger.ms\" (line 8): expected a string, found the integer 5: \
             write it in double quotes: \"linger.ms\" = \"5\""
        );
        // Debezium's dotted names are keys of [debezium] when quoted.
        assert_eq!(
            error(
                "[outbox]\ntables = [\"shop.outbox\"]\n[debezium]\ntable.expand.json.payload = true\n"
            ),
            "unknown key \"table\" in [debezium] (line 8): table.expand.json.payload read as \
             nested tables because the name has dots: quote it: \"table.expand.json.payload\" = \
             true"
        );
    }

    #[test]
    fn a_key_set_by_the_environment_is_attributed_to_its_variable_not_to_the_file() {
        let file = format!(
            "{BASE}[outbox]\ntables = [\"shop.outbox\"]\n[kafka.properties]\nacks = \"all\"\n"
        );
        let places = Places(vec![Place::text("relay.toml", Some(&file), &[])]);
        let path = |p: &[&str]| p.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let env = |var: &str| {
            (var == "OUTBOX_RELAY__KAFKA__PROPERTIES").then(|| r#"{"linger.ms"=20}"#.to_owned())
        };
        // The key is in the variable's table: the variable, not the file's [kafka.properties].
        assert_eq!(
            places.at_with(&path(&["kafka", "properties", "linger.ms"]), env),
            " (environment variable OUTBOX_RELAY__KAFKA__PROPERTIES)"
        );
        // A key of the same section written only in the file: the file's line.
        assert_eq!(
            places.at_with(&path(&["kafka", "properties", "acks"]), env),
            " (relay.toml line 8)"
        );
        // Without the variable: the section's line, as before.
        assert_eq!(
            places.at_with(&path(&["kafka", "properties", "linger.ms"]), |_| None),
            " (relay.toml line 7)"
        );
        // A scalar override of a key the file writes too: the variable.
        let env = |var: &str| (var == "OUTBOX_RELAY__KAFKA__PROPERTIES__ACKS").then(|| "1".into());
        assert_eq!(
            places.at_with(&path(&["kafka", "properties", "acks"]), env),
            " (environment variable OUTBOX_RELAY__KAFKA__PROPERTIES__ACKS)"
        );
    }

    #[test]
    fn a_near_miss_key_of_the_wrong_type_names_the_key_that_takes_it() {
        assert_eq!(
            error("[outbox]\ntable = [\"shop.outbox\", \"shop.outbox2\"]\n"),
            "outbox.table (line 6): expected a list of tables ([[outbox.table]]), found a list \
             of strings: did you mean tables = [\"shop.outbox\", \"shop.outbox2\"]?"
        );
        assert_eq!(
            error("[outbox]\ntables = \"shop.outbox\"\n"),
            "outbox.tables (line 6): expected a list of strings, found the string \
             \"shop.outbox\": write a list in brackets: tables = [\"shop.outbox\"]"
        );
    }

    #[test]
    fn wrong_types_and_values_say_what_the_key_takes() {
        let tables = "[outbox]\ntables = [\"shop.outbox\"]\n";
        assert_eq!(
            error(&format!("{tables}[retry]\nmax_attempts = \"3\"\n")),
            "retry.max_attempts (line 8): expected an integer, found the string \"3\": write a \
             whole number without quotes, e.g. max_attempts = 3"
        );
        assert_eq!(
            error(&format!("{tables}[retry]\nmax_attempts = -3\n")),
            "retry.max_attempts (line 8): the integer -3 is out of range: the value must be 0 or \
             more"
        );
        assert_eq!(
            error(&format!("{tables}null_payload = \"dead-letter\"\n")),
            "outbox.null_payload (line 7): unknown value \"dead-letter\": did you mean \
             \"dead_letter\"? the values are \"tombstone\", \"skip\", \"dead_letter\""
        );
        assert_eq!(
            error(&format!(
                "{tables}additional = [{{ column = \"x\", placement = \"body\" }}]\n"
            )),
            "outbox.additional[1].placement (line 7): unknown value \"body\": the values are \
             \"header\", \"envelope\""
        );
        assert_eq!(
            error(&format!("{tables}[http]\nenabled = \"yes\"\n")),
            "http.enabled (line 8): expected a boolean (`true` or `false`), found the string \
             \"yes\": write enabled = true or enabled = false, without quotes"
        );
        assert_eq!(
            error(&format!("{tables}columns = \"id\"\n")),
            "outbox.columns (line 7): expected a table ([outbox.columns]), found the string \
             \"id\": write it as the section [outbox.columns] with key = value lines"
        );
    }

    #[test]
    fn missing_keys_and_sections_say_what_to_add() {
        assert_eq!(
            error("[outbox]\ntables = [\"shop.outbox\"]\n[cutover]\nskip_if = \"x\"\n"),
            "[cutover] (line 7) needs the key until, which has no default: add until = … below \
             that line. until: `YYYY-MM-DD HH:MM:SS` (UTC, that second included): transactions \
             whose commit time in the binlog is after it are relayed without checks."
        );
        let err =
            RelayConfig::from_toml_str("[outbox]\ntables = [\"a.b\"]\n[mysql]\nurl = \"x\"\n")
                .expect_err("no [kafka]")
                .to_string();
        assert!(
            err.starts_with(
                "configuration error: the section [kafka] is missing: add [kafka] with \
                 bootstrap_servers = … (the Kafka producer: brokers,"
            ),
            "{err}"
        );
    }

    fn temp_dir(tag: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("outbox-relay-explain-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sources.d")).expect("mkdir");
        dir
    }

    #[test]
    fn many_source_files_name_the_source_the_file_and_the_line() {
        let dir = temp_dir("many");
        let main = dir.join("relay.toml");
        std::fs::write(
            &main,
            format!("{BASE}[outbox]\ntables = [\"shop.outbox\"]\n\n[[source]]\nname = \"a\"\n[source.outbox]\ntabels = [\"x.y\"]\n"),
        )
        .expect("write");
        let err = ProcessConfig::load(&main).expect_err("typo").to_string();
        assert_eq!(
            err,
            format!(
                "configuration error: source \"a\": unknown key \"tabels\" in [source.outbox] \
                 ({} line 11): did you mean \"tables\"? The valid keys are: {OUTBOX_KEYS}",
                main.display()
            )
        );

        std::fs::write(&main, format!("sources_dir = \"sources.d\"\n{BASE}")).expect("write");
        let file = dir.join("sources.d").join("orders.toml");
        std::fs::write(
            &file,
            "[outbox]\ntables = [\"shop.outbox\"]\n[mysql]\nserver_idd = 5\n",
        )
        .expect("write");
        let err = ProcessConfig::load(&main).expect_err("typo").to_string();
        assert_eq!(
            err,
            format!(
                "configuration error: source \"orders\": unknown key \"server_idd\" in [mysql] \
                 ({} line 4): did you mean \"server_id\"? The valid keys are: url, \
                 heartbeat_interval_ms, password, read_timeout_ms, resume, server_id, tls_ca, \
                 tls_cert, tls_key, tls_mode",
                file.display()
            )
        );
        std::fs::write(&file, "[outbox\n").expect("write");
        let err = ProcessConfig::load(&main).expect_err("syntax").to_string();
        assert!(
            err.starts_with(&format!(
                "configuration error: {}: TOML syntax error at line 1, column 8",
                file.display()
            )),
            "{err}"
        );
        std::fs::write(&main, format!("sources_dir = 5\n{BASE}")).expect("write");
        let err = ProcessConfig::load(&main).expect_err("type").to_string();
        assert_eq!(
            err,
            format!(
                "configuration error: sources_dir ({} line 1): expected a string, found the \
                 integer 5: write it in double quotes: sources_dir = \"5\"",
                main.display()
            )
        );
    }

    /// Words of Rust or of serde's internals that a configuration error must never show.
    const RUST_WORDS: [&str; 16] = [
        "Vec<", "Option<", "BTreeMap", "alloc::", "struct ", "enum ", "variant", "newtype",
        "sequence", "usize", "u32", "u64", "i64", "f64", "Config", ".rs:",
    ];

    #[test]
    fn no_message_shows_rust_type_names_or_serde_wording() {
        // Wrong types for each section's keys, a string for a table, a number for a string,
        // unknown enum values, missing keys, unknown keys: every section and list of tables.
        let tables = "[outbox]\ntables = [\"shop.outbox\"]\n";
        let mut cases: Vec<String> = Vec::new();
        for (path, node) in reference::nodes() {
            if path.is_empty() || path.starts_with("source") || path.starts_with("fleet") {
                continue;
            }
            let (section, key) = path.rsplit_once('.').unwrap_or(("", path));
            let head = if section.is_empty() {
                String::new()
            } else if section == "outbox.table" {
                "[[outbox.table]]\nname = \"shop.outbox\"\n".into()
            } else if section.contains("table.") || section.contains("additional") {
                continue;
            } else {
                format!("[{section}]\n")
            };
            let wrong = if node.section {
                vec!["5", "\"x\""]
            } else if !node.values.is_empty() {
                vec!["\"no-such-value\"", "5", "[\"x\"]"]
            } else if node.kind == "string" {
                vec!["5", "true", "{ a = 1 }"]
            } else if node.kind.starts_with("list") {
                vec!["\"x\"", "5", "[5]"]
            } else if node.kind.starts_with("table of") {
                vec!["\"x\"", "{ a = 5 }", "{ a.b = \"x\" }"]
            } else {
                vec!["\"x\"", "-1", "1.5", "[1]", "99999999999999999999"]
            };
            for w in wrong {
                cases.push(format!("{tables}{head}{key} = {w}\n"));
            }
        }
        // Unknown keys, missing required keys and sections.
        cases.push(format!("{tables}[mysql]\nurl2 = \"x\"\n"));
        cases.push(format!("{tables}[cutover]\nskip_if = \"x\"\n"));
        cases.push(format!("{tables}[[outbox.table]]\ntopic = \"x\"\n"));
        cases.push(format!("{tables}additional = [{{ column = \"x\" }}]\n"));
        cases.push(format!("{tables}additional = [\"x\"]\n"));
        let mut checked = 0;
        for case in &cases {
            let text = format!("{BASE}{case}");
            // A duplicate key (the case repeats a key of BASE or `tables`) is a syntax error.
            let Err(e) = RelayConfig::from_toml_str(&text) else {
                continue;
            };
            let msg = e.to_string();
            for word in RUST_WORDS {
                assert!(!msg.contains(word), "{word:?} in {msg:?} for\n{text}");
            }
            checked += 1;
        }
        assert!(checked > 200, "only {checked} wrong configurations refused");
        // Many-source files and [fleet].
        let dir = temp_dir("words");
        let main = dir.join("relay.toml");
        for fleet in [
            "partitions = \"x\"",
            "enabled = 1",
            "session_timeout_ms = -1",
            "instance_id = 5",
            "groupid = 1",
            "lease_ttl_ms = [1]",
        ] {
            std::fs::write(
                &main,
                format!("{BASE}{tables}[fleet]\n{fleet}\n[[source]]\nname = \"a\"\n"),
            )
            .expect("write");
            let msg = ProcessConfig::load(&main).expect_err(fleet).to_string();
            for word in RUST_WORDS {
                assert!(!msg.contains(word), "{word:?} in {msg:?} for {fleet}");
            }
        }
        for source in [
            "name = 5",
            "[source.mysql]\nserver_id = \"x\"",
            "sources_poll_ms = \"x\"",
        ] {
            std::fs::write(
                &main,
                format!("{BASE}{tables}[[source]]\nname = \"a\"\n{source}\n"),
            )
            .expect("write");
            if let Err(e) = ProcessConfig::load(&main) {
                let msg = e.to_string();
                for word in RUST_WORDS {
                    assert!(!msg.contains(word), "{word:?} in {msg:?} for {source}");
                }
            }
        }
    }
}
