//! The configuration reference, generated from the configuration types so that it cannot drift.
//!
//! Every section and key comes from the JSON Schema that `schemars` derives from the types
//! `RelayConfig` is deserialized into (plus the many-source keys, `[[source]]` and `[fleet]`
//! of [`super::process`]): its name, its type, its serde default, its allowed values (enum
//! variants, with their doc comments) and ranges (`#[schemars(range(..))]`, which a test holds
//! to the validation), and its description (the field's doc comment). [`markdown`] renders it
//! as `docs/src/reference/configuration.md` (`outbox-relay config-reference`,
//! `make config-reference`); the configuration errors take each key's type and valid siblings
//! from the same tree ([`lookup`]).

use std::collections::BTreeMap;
use std::sync::OnceLock;

use schemars::JsonSchema;
use serde_json::{Map, Value};

use super::process::{FleetWritten, ManySourcesWritten, SourceWritten};
use super::RelayConfig;

/// The path of the generated reference in the repository.
pub const REFERENCE_PATH: &str = "docs/src/reference/configuration.md";

/// The command that writes [`REFERENCE_PATH`].
pub const REGENERATE: &str = "make config-reference";

/// The order of the top-level sections in the reference (sections not listed follow in
/// alphabetical order, so a new one still appears).
const SECTION_ORDER: [&str; 13] = [
    "mysql",
    "outbox",
    "kafka",
    "checkpoint",
    "retry",
    "dead_letter",
    "http",
    "tracing",
    "audit",
    "cutover",
    "debezium",
    "source",
    "fleet",
];

/// One node of the configuration: a section (a TOML table, or a list of tables) or a key.
#[derive(Debug, Clone)]
pub struct Node {
    /// Dotted path without list positions (`outbox.table.columns.id`).
    pub path: String,
    /// How it is written: `[mysql]`, `[[outbox.table]]`, or for a key its last name.
    pub heading: String,
    /// What the value is, in a user's terms (`string`, `milliseconds (integer)`, `list of
    /// strings`, `table`, ...).
    pub kind: String,
    /// `required`, or the default as TOML (`"outbox-relay"`, `5000`, `[]`), or `none`.
    pub default: String,
    /// The doc comment, reflowed: paragraphs separated by a blank line.
    pub description: String,
    /// Allowed values (enum variants) with their descriptions.
    pub values: Vec<(String, String)>,
    /// A validated range, in words (`1 to 10000`, `at least 3000`).
    pub range: Option<String>,
    /// For a section: its keys, as written, in the reference's order.
    pub keys: Vec<String>,
    /// A section (table or list of tables) rather than a key.
    pub section: bool,
    /// Inside a list of tables (no environment variable reaches it).
    pub in_list: bool,
}

/// Every node by path; the root is `""`.
fn tree() -> &'static BTreeMap<String, Node> {
    static TREE: OnceLock<BTreeMap<String, Node>> = OnceLock::new();
    TREE.get_or_init(|| build(&root_schema()))
}

/// The node at `path` (keys as written; list positions, all-digit segments, are skipped).
pub fn lookup<S: AsRef<str>>(path: &[S]) -> Option<&'static Node> {
    let key = normalize(path);
    tree().get(&key)
}

/// `path` as a tree key: digits (list positions) dropped, joined by dots.
pub(crate) fn normalize<S: AsRef<str>>(path: &[S]) -> String {
    path.iter()
        .map(AsRef::as_ref)
        .filter(|s| s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()))
        .collect::<Vec<_>>()
        .join(".")
}

fn schema_of<T: JsonSchema>() -> Value {
    schemars::generate::SchemaSettings::draft2020_12()
        .with(|s| s.inline_subschemas = true)
        .into_generator()
        .into_root_schema_for::<T>()
        .to_value()
}

/// The schema of a configuration file: a single-source file's keys and sections, and a
/// many-source file's own (`sources_dir`, `sources_poll_ms`, `[[source]]`, `[fleet]`).
pub fn root_schema() -> Value {
    let mut root = schema_of::<RelayConfig>();
    let many = schema_of::<ManySourcesWritten>();
    let mut source = schema_of::<SourceWritten>();
    let mut fleet = schema_of::<FleetWritten>();
    for s in [&mut source, &mut fleet] {
        if let Some(o) = s.as_object_mut() {
            o.remove("$schema");
            o.remove("title");
        }
    }
    let source_doc = source.get("description").cloned().unwrap_or(Value::Null);
    let fleet_doc = fleet.get("description").cloned().unwrap_or(Value::Null);
    if let Some(props) = root.get_mut("properties").and_then(Value::as_object_mut) {
        if let Some(many) = many.get("properties").and_then(Value::as_object) {
            for (k, v) in many {
                props.insert(k.clone(), v.clone());
            }
        }
        props.insert(
            "source".into(),
            serde_json::json!({"type": "array", "items": source, "description": source_doc}),
        );
        if let Some(o) = fleet.as_object_mut() {
            o.insert("description".into(), fleet_doc);
        }
        props.insert("fleet".into(), fleet);
    }
    root
}

/// The schema's `type` names, `null` left out.
fn types(s: &Value) -> Vec<&str> {
    match s.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
    .into_iter()
    .filter(|t| *t != "null")
    .collect()
}

/// `s` without an `Option`'s `anyOf: [T, null]` wrapper, with the outer description kept.
fn unwrap_optional(s: &Value) -> Value {
    if let Some(any) = s.get("anyOf").and_then(Value::as_array) {
        let inner: Vec<&Value> = any
            .iter()
            .filter(|v| v.get("type").and_then(Value::as_str) != Some("null"))
            .collect();
        if let [one] = inner.as_slice() {
            let mut merged = (*one).clone();
            if let (Some(m), Some(outer)) = (merged.as_object_mut(), s.as_object()) {
                for (k, v) in outer {
                    if k != "anyOf" {
                        m.insert(k.clone(), v.clone());
                    }
                }
            }
            return merged;
        }
    }
    s.clone()
}

fn is_table(s: &Value) -> bool {
    s.get("properties").is_some()
}

fn enum_values(s: &Value) -> Vec<(String, String)> {
    s.get("oneOf")
        .or_else(|| s.get("anyOf"))
        .and_then(Value::as_array)
        .map(|variants| {
            variants
                .iter()
                .filter_map(|v| {
                    let name = v.get("const").and_then(Value::as_str)?;
                    let doc = v.get("description").and_then(Value::as_str).unwrap_or("");
                    Some((name.to_owned(), reflow(doc)))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The value's kind in a user's terms.
fn kind_of(name: &str, s: &Value) -> String {
    if !enum_values(s).is_empty() {
        return "string, one of the values below".into();
    }
    let t = types(s);
    match t.first().copied() {
        Some("string") => "string".into(),
        Some("boolean") => "boolean (`true` or `false`)".into(),
        Some("number") => "number".into(),
        Some("integer") if name.ends_with("_ms") => "milliseconds (integer)".into(),
        Some("integer") if name.ends_with("_bytes") => "bytes (integer)".into(),
        Some("integer") => "integer".into(),
        Some("array") => {
            let items = s.get("items").map(unwrap_optional).unwrap_or(Value::Null);
            if is_table(&items) {
                "list of tables".into()
            } else {
                format!("list of {}s", kind_of("", &items))
            }
        }
        Some("object") if is_table(s) => "table".into(),
        Some("object") => {
            let values = s
                .get("additionalProperties")
                .map(|v| kind_of("", v))
                .unwrap_or_else(|| "value".into());
            format!("table of {values}s (any key; quote keys with dots: `\"linger.ms\" = \"5\"`)")
        }
        _ => "value".into(),
    }
}

/// A default as TOML.
fn toml_value(v: &Value) -> String {
    match v {
        Value::Null => "none".into(),
        Value::String(s) => format!("{s:?}"),
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(toml_value).collect::<Vec<_>>().join(", ")
        ),
        Value::Object(o) => format!(
            "{{{}}}",
            o.iter()
                .map(|(k, v)| format!("{k:?} = {}", toml_value(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Value::Number(n) if n.is_f64() => {
            let f = n.as_f64().unwrap_or_default();
            if f.fract() == 0.0 {
                format!("{f:.1}")
            } else {
                f.to_string()
            }
        }
        other => other.to_string(),
    }
}

fn range_of(s: &Value, name: &str) -> Option<String> {
    let num = |k: &str| s.get(k).and_then(Value::as_f64);
    let int = |v: f64| {
        if v.fract() == 0.0 {
            format!("{v:.0}")
        } else {
            v.to_string()
        }
    };
    let unit = if name.ends_with("_ms") { " ms" } else { "" };
    // An unsigned integer's minimum 0 says nothing a user needs.
    let min = num("minimum").filter(|m| *m != 0.0 || types(s) == ["number"]);
    let min_len = s.get("minLength").and_then(Value::as_u64);
    let max_len = s.get("maxLength").and_then(Value::as_u64);
    match (min, num("maximum"), min_len, max_len) {
        (Some(a), Some(b), _, _) => Some(format!("{} to {}{unit}", int(a), int(b))),
        (Some(a), None, _, _) => Some(format!("at least {}{unit}", int(a))),
        (None, Some(b), _, _) => Some(format!("at most {}{unit}", int(b))),
        (None, None, Some(a), Some(b)) => Some(format!("{a} to {b} characters")),
        _ => None,
    }
}

/// A doc comment's text: lines joined into paragraphs, intra-doc link brackets removed.
pub(crate) fn reflow(doc: &str) -> String {
    doc.split("\n\n")
        .map(|p| {
            p.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join("\n\n")
}

fn ordered_keys(props: &Map<String, Value>, required: &[String], top: bool) -> Vec<String> {
    let mut keys: Vec<String> = props.keys().cloned().collect();
    // Required keys first, then the others alphabetically, then sections (at the top level in
    // the reference's order).
    let rank = |k: &String| {
        let s = unwrap_optional(&props[k]);
        let section = is_table(&s)
            || (types(&s) == ["array"]
                && s.get("items")
                    .map(unwrap_optional)
                    .is_some_and(|i| is_table(&i)));
        let order = if top {
            SECTION_ORDER
                .iter()
                .position(|o| o == k)
                .unwrap_or(SECTION_ORDER.len())
        } else {
            0
        };
        (section, order, !required.contains(k), k.clone())
    };
    keys.sort_by_key(rank);
    keys
}

fn build(root: &Value) -> BTreeMap<String, Node> {
    let mut out = BTreeMap::new();
    walk(root, "", "", false, &[], &mut out);
    out
}

/// Adds the section `s` at `path` and everything under it.
fn walk(
    s: &Value,
    path: &str,
    heading: &str,
    in_list: bool,
    required: &[String],
    out: &mut BTreeMap<String, Node>,
) {
    let Some(props) = s.get("properties").and_then(Value::as_object) else {
        return;
    };
    let required_here: Vec<String> = s
        .get("required")
        .and_then(Value::as_array)
        .map(|r| {
            r.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let keys = ordered_keys(props, &required_here, path.is_empty());
    let name = path.rsplit('.').next().unwrap_or_default();
    out.insert(
        path.to_owned(),
        Node {
            path: path.to_owned(),
            heading: heading.to_owned(),
            kind: if in_list && !path.is_empty() {
                "list of tables".into()
            } else {
                "table".into()
            },
            default: default_text(s, name, required),
            description: reflow(s.get("description").and_then(Value::as_str).unwrap_or("")),
            values: Vec::new(),
            range: None,
            keys: keys.clone(),
            section: true,
            in_list,
        },
    );
    for key in keys {
        let child = unwrap_optional(&props[&key]);
        let child_path = if path.is_empty() {
            key.clone()
        } else {
            format!("{path}.{key}")
        };
        let items = child.get("items").map(unwrap_optional);
        if is_table(&child) {
            let mut section = child.clone();
            copy_outer(&props[&key], &mut section);
            let heading = if in_list {
                format!("{key} = {{ … }}")
            } else {
                format!("[{child_path}]")
            };
            walk(
                &section,
                &child_path,
                &heading,
                in_list,
                &required_here,
                out,
            );
        } else if let Some(items) = items.filter(is_table) {
            let mut section = items.clone();
            if let Some(m) = section.as_object_mut() {
                for k in ["description", "default"] {
                    match child.get(k) {
                        Some(v) => m.insert(k.into(), v.clone()),
                        None => m.remove(k),
                    };
                }
            }
            // Lists of tables in a section of a list are written inline.
            let heading = if in_list || key == "additional" {
                format!("{child_path} = [{{ … }}, …]")
            } else {
                format!("[[{child_path}]]")
            };
            walk(&section, &child_path, &heading, true, &required_here, out);
        } else {
            out.insert(
                child_path.clone(),
                Node {
                    path: child_path.clone(),
                    heading: key.clone(),
                    kind: kind_of(&key, &child),
                    default: default_text(&child, &key, &required_here),
                    description: reflow(
                        child
                            .get("description")
                            .and_then(Value::as_str)
                            .unwrap_or(""),
                    ),
                    values: enum_values(&child),
                    range: range_of(&child, &key),
                    keys: Vec::new(),
                    section: false,
                    in_list,
                },
            );
        }
    }
}

/// The description and default of an `Option<section>` live on the wrapper.
fn copy_outer(outer: &Value, section: &mut Value) {
    if let (Some(o), Some(m)) = (outer.as_object(), section.as_object_mut()) {
        for k in ["description", "default"] {
            if let Some(v) = o.get(k) {
                m.insert(k.into(), v.clone());
            }
        }
    }
}

fn default_text(s: &Value, name: &str, required: &[String]) -> String {
    if required.iter().any(|r| r == name) {
        return "required".into();
    }
    match s.get("default") {
        None | Some(Value::Null) => "none".into(),
        Some(Value::Object(o)) if !o.is_empty() && is_table(s) => "see its keys".into(),
        Some(v) => toml_value(v),
    }
}

/// Keys (not sections) without a description, by path: the reference would not explain them.
pub fn undocumented(nodes: &BTreeMap<String, Node>) -> Vec<String> {
    nodes
        .values()
        .filter(|n| !n.path.is_empty() && n.description.trim().is_empty())
        .map(|n| n.path.clone())
        .collect()
}

/// Every node of `T`'s schema (for tests of types other than the configuration's).
pub fn nodes_of<T: JsonSchema>() -> BTreeMap<String, Node> {
    build(&schema_of::<T>())
}

/// A plain string key (for the values of a table of strings, which have no node of their own).
pub(crate) fn string_node() -> Option<&'static Node> {
    static NODE: OnceLock<Node> = OnceLock::new();
    Some(NODE.get_or_init(|| Node {
        path: String::new(),
        heading: String::new(),
        kind: "string".into(),
        default: "none".into(),
        description: String::new(),
        values: Vec::new(),
        range: None,
        keys: Vec::new(),
        section: false,
        in_list: false,
    }))
}

/// Every node of the configuration, by path.
pub fn nodes() -> &'static BTreeMap<String, Node> {
    tree()
}

/// The environment variable that overrides a key, for keys outside lists of tables.
fn env_var(n: &Node) -> Option<String> {
    if n.in_list || n.path.starts_with("source.") {
        return None;
    }
    Some(format!(
        "{}{}",
        super::ENV_PREFIX,
        n.path.replace('.', "__").to_uppercase()
    ))
}

const INTRO: &str = "\
<!-- Generated from the configuration types (crates/relay-core/src/config/) by `outbox-relay \
config-reference`. Do not edit: change the doc comments and run `make config-reference`. -->

# Configuration reference

The relay reads one TOML file: `outbox-relay run --config relay.toml` (or
`OUTBOX_RELAY_CONFIG=relay.toml`). Every key below can be overridden by an environment variable
`OUTBOX_RELAY__SECTION__KEY` (named under each key); lists and tables are written inline there:
`OUTBOX_RELAY__OUTBOX__TABLES='[\"shop.outbox\"]'`,
`OUTBOX_RELAY__KAFKA__PROPERTIES='{\"linger.ms\"=\"20\"}'`. Unknown keys are errors, with the
closest valid key suggested: a typo is never silently ignored. Values may hold `${env:NAME}` and
`${file:PATH}` references where a key says so.

A file configures one source (the sections below at its top level), or many: `[[source]]`
tables and/or `sources_dir` files, each holding a source's own sections, merged key by key over
the file's top-level sections, which are then shared settings.

```toml
connector_name = \"orders-relay\"

[mysql]
url = \"mysql://relay:secret@127.0.0.1:3306/shop\"

[outbox]
tables = [\"shop.outbox\"]

[kafka]
bootstrap_servers = \"127.0.0.1:9092\"

[kafka.properties]        # librdkafka properties: quote names with dots
\"compression.type\" = \"zstd\"
```
";

/// The reference as Markdown (what `docs/src/reference/configuration.md` holds).
pub fn markdown() -> String {
    let tree = tree();
    let mut out = String::from(INTRO);
    let Some(root) = tree.get("") else {
        return out;
    };
    let top_keys: Vec<&String> = root
        .keys
        .iter()
        .filter(|k| tree.get(k.as_str()).is_some_and(|n| !n.section))
        .collect();
    out.push_str("\n## Top-level keys\n");
    for k in top_keys {
        if let Some(n) = tree.get(k.as_str()) {
            render_key(n, &mut out);
        }
    }
    for k in &root.keys {
        if let Some(n) = tree.get(k.as_str()).filter(|n| n.section) {
            render_section(tree, n, 2, &mut out);
        }
    }
    out
}

fn render_section(tree: &BTreeMap<String, Node>, n: &Node, level: usize, out: &mut String) {
    let hashes = "#".repeat(level.min(4));
    out.push_str(&format!("\n{hashes} `{}`\n\n", n.heading));
    if !n.description.is_empty() {
        out.push_str(&n.description);
        out.push('\n');
    }
    if n.default == "required" {
        out.push_str("\nRequired.\n");
    }
    for k in &n.keys {
        let path = format!("{}.{k}", n.path);
        if let Some(child) = tree.get(&path) {
            if child.section {
                render_section(tree, child, level + 1, out);
            } else {
                render_key(child, out);
            }
        }
    }
}

fn render_key(n: &Node, out: &mut String) {
    out.push_str(&format!("\n#### `{}`\n\n", n.path));
    out.push_str(&format!("- type: {}\n", n.kind));
    out.push_str(&format!(
        "- default: {}\n",
        match n.default.as_str() {
            "required" | "none" => n.default.clone(),
            d => format!("`{d}`"),
        }
    ));
    if let Some(r) = &n.range {
        out.push_str(&format!("- range: {r}\n"));
    }
    if let Some(env) = env_var(n) {
        out.push_str(&format!("- environment: `{env}`\n"));
    }
    if !n.description.is_empty() {
        out.push('\n');
        out.push_str(&n.description);
        out.push('\n');
    }
    if !n.values.is_empty() {
        out.push('\n');
        for (value, doc) in &n.values {
            out.push_str(&format!("- `{value:?}`: {doc}\n"));
        }
    }
}
