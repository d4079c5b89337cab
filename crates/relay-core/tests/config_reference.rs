//! The generated configuration reference (`docs/src/reference/configuration.md`): up to date,
//! every key documented, every key the documentation's examples use in it, and every range it
//! states enforced.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use outbox_relay_core::config::process::ProcessConfig;
use outbox_relay_core::config::reference::{self, Node};
use outbox_relay_core::config::RelayConfig;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn the_committed_reference_is_the_generated_one() {
    let path = repo().join(reference::REFERENCE_PATH);
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    let generated = reference::markdown();
    if committed != generated {
        let line = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .map_or_else(
                || committed.lines().count().min(generated.lines().count()) + 1,
                |i| i + 1,
            );
        panic!(
            "{} is not what the configuration types generate (first difference at line {line}): \
             run `{}` and commit the file",
            reference::REFERENCE_PATH,
            reference::REGENERATE
        );
    }
}

#[test]
fn every_key_has_a_description() {
    let missing = reference::undocumented(reference::nodes());
    assert!(
        missing.is_empty(),
        "keys without a doc comment (the configuration reference would not explain them): {}",
        missing.join(", ")
    );
}

/// A type with one key left undocumented, to show that the check finds it.
#[derive(serde::Deserialize, schemars::JsonSchema)]
#[allow(dead_code, missing_docs)]
struct Sample {
    /// Documented.
    documented: String,
    nested: SampleSection,
}

/// A section.
#[derive(serde::Deserialize, schemars::JsonSchema)]
#[allow(dead_code, missing_docs)]
struct SampleSection {
    /// Documented.
    fine: u64,
    forgotten_ms: u64,
}

#[test]
fn an_undocumented_key_is_named_by_its_path() {
    let nodes = reference::nodes_of::<Sample>();
    assert_eq!(reference::undocumented(&nodes), ["nested.forgotten_ms"]);
    assert_eq!(nodes["nested.forgotten_ms"].kind, "milliseconds (integer)");
}

/// The key paths of a TOML example (list positions left out; `[[source]]` sections as the
/// top-level ones they override).
fn key_paths(table: &toml_edit::Table, prefix: &str, out: &mut Vec<String>) {
    for (key, item) in table.iter() {
        let path = if prefix.is_empty() {
            key.to_owned()
        } else {
            format!("{prefix}.{key}")
        };
        out.push(path.clone());
        if reference::lookup(&path.split('.').collect::<Vec<_>>())
            .is_some_and(|n| n.kind.starts_with("table of"))
        {
            continue;
        }
        match item {
            toml_edit::Item::Table(t) => key_paths(t, &path, out),
            toml_edit::Item::ArrayOfTables(a) => {
                for t in a.iter() {
                    if path == "source" {
                        let mut inner = Vec::new();
                        key_paths(t, "", &mut inner);
                        out.extend(inner.into_iter().map(|k| {
                            if k == "name" {
                                "source.name".to_owned()
                            } else {
                                k
                            }
                        }));
                    } else {
                        key_paths(t, &path, out);
                    }
                }
            }
            toml_edit::Item::Value(v) => value_paths(v, &path, out),
            toml_edit::Item::None => {}
        }
    }
}

fn value_paths(v: &toml_edit::Value, path: &str, out: &mut Vec<String>) {
    match v {
        toml_edit::Value::InlineTable(t) => {
            for (k, v) in t.iter() {
                let p = format!("{path}.{k}");
                out.push(p.clone());
                value_paths(v, &p, out);
            }
        }
        toml_edit::Value::Array(a) => {
            for v in a.iter() {
                value_paths(v, path, out);
            }
        }
        _ => {}
    }
}

/// Markdown files whose examples must use documented keys: the README and the book.
fn documents() -> Vec<PathBuf> {
    let mut files = vec![repo().join("README.md")];
    let mut dirs = vec![repo().join("docs/src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let p = entry.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|e| e == "md")
                && !p.ends_with(reference::REFERENCE_PATH)
            {
                files.push(p);
            }
        }
    }
    files
}

/// Whether the reference documents `path`: a key of its tree, a name inside a table of strings
/// (`kafka.properties."linger.ms"`), or another name of a key that its section's keys name in
/// their descriptions (Debezium's `"topic.prefix"` for `debezium.topic_prefix`).
fn documented(path: &str, nodes: &BTreeMap<String, Node>) -> bool {
    if nodes.contains_key(path) {
        return true;
    }
    let (section, name) = path.rsplit_once('.').unwrap_or(("", path));
    if nodes
        .get(section)
        .is_some_and(|n| n.kind.starts_with("table of"))
    {
        return true;
    }
    // A dotted name that is a key of a section: `"table.expand.json.payload"` in [debezium].
    let mut parts = path.split('.');
    let first = parts.next().unwrap_or_default();
    let rest: Vec<&str> = parts.collect();
    (1..=rest.len()).any(|n| {
        let section = [first]
            .iter()
            .chain(&rest[..rest.len() - n])
            .copied()
            .collect::<Vec<_>>()
            .join(".");
        let alias = rest[rest.len() - n..].join(".");
        nodes.get(&section).is_some_and(|s| {
            s.keys.iter().any(|k| {
                nodes
                    .get(&format!("{section}.{k}"))
                    .is_some_and(|n| n.description.contains(&format!("`{alias}`")))
            })
        })
    }) || name.is_empty()
}

#[test]
fn every_key_the_documentation_uses_is_in_the_reference() {
    let nodes = reference::nodes();
    let mut parsed = 0;
    let mut undocumented = Vec::new();
    for file in documents() {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let mut in_block = false;
        let mut block = String::new();
        let mut start = 0;
        for (i, line) in text.lines().enumerate() {
            if !in_block && line.trim_start().starts_with("```toml") {
                in_block = true;
                block.clear();
                start = i + 1;
            } else if in_block && line.trim_start().starts_with("```") {
                in_block = false;
                // Fragments with placeholders (`…`) are not configurations.
                let Ok(doc) = block.parse::<toml_edit::DocumentMut>() else {
                    continue;
                };
                parsed += 1;
                let mut paths = Vec::new();
                key_paths(doc.as_table(), "", &mut paths);
                for p in paths {
                    if !documented(&p, nodes) {
                        undocumented.push(format!("{} line {start}: {p}", file.display()));
                    }
                }
            } else if in_block {
                block.push_str(line);
                block.push('\n');
            }
        }
    }
    assert!(
        parsed >= 5,
        "only {parsed} TOML examples found in the README and docs/src"
    );
    assert!(
        undocumented.is_empty(),
        "keys the documentation's examples use but {} does not list:\n{}",
        reference::REFERENCE_PATH,
        undocumented.join("\n")
    );
}

const MINIMAL: &str = "[mysql]\nurl = \"mysql://root@127.0.0.1:3306/shop\"\n\
    [outbox]\ntables = [\"shop.outbox\"]\n[kafka]\nbootstrap_servers = \"127.0.0.1:9092\"\n";

/// A configuration of `sections` (name, lines), top-level keys first.
fn render(sections: &[(String, Vec<String>)]) -> String {
    let mut text = String::new();
    for (name, lines) in sections.iter().filter(|(n, _)| n.is_empty()) {
        let _ = name;
        for l in lines {
            text.push_str(&format!("{l}\n"));
        }
    }
    for (name, lines) in sections.iter().filter(|(n, _)| !n.is_empty()) {
        text.push_str(&format!("[{name}]\n"));
        for l in lines {
            text.push_str(&format!("{l}\n"));
        }
    }
    text
}

/// `path = value` in a minimal configuration, in each setting it may need (exactly-once keys
/// under exactly-once, `hold_max_records` with `hold`).
fn with(path: &str, value: &str) -> Vec<String> {
    let (section, key) = path.rsplit_once('.').unwrap_or(("", path));
    let contexts: [&[(&str, &str)]; 3] = [
        &[],
        &[("kafka", "delivery = \"exactly_once\"")],
        &[("dead_letter", "refused_topic = \"hold\"")],
    ];
    contexts
        .iter()
        .map(|extra| {
            let mut sections: Vec<(String, Vec<String>)> = vec![
                (
                    "mysql".into(),
                    vec!["url = \"mysql://root@127.0.0.1:3306/shop\"".into()],
                ),
                ("outbox".into(), vec!["tables = [\"shop.outbox\"]".into()]),
                (
                    "kafka".into(),
                    vec!["bootstrap_servers = \"127.0.0.1:9092\"".into()],
                ),
            ];
            let mut add =
                |section: &str, line: String| match sections.iter_mut().find(|(n, _)| n == section)
                {
                    Some((_, lines)) => lines.push(line),
                    None => sections.push((section.to_owned(), vec![line])),
                };
            for (s, l) in extra.iter() {
                add(s, (*l).to_owned());
            }
            add(section, format!("{key} = {value}"));
            render(&sections)
        })
        .collect()
}

#[test]
fn every_stated_range_is_enforced() {
    let mut checked = 0;
    for (path, node) in reference::nodes() {
        let Some(range) = &node.range else { continue };
        if path.starts_with("fleet.") {
            continue;
        }
        let numbers: Vec<f64> = range
            .split(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter_map(|w| w.parse().ok())
            .collect();
        let outside: Vec<String> = if range.contains("characters") {
            vec![
                "\"\"".into(),
                format!("\"{}\"", "x".repeat(numbers[1] as usize + 1)),
            ]
        } else if node.kind == "number" {
            vec![
                format!("{:.1}", numbers[0] - 0.5),
                format!("{:.1}", numbers[1] + 0.5),
            ]
        } else if range.starts_with("at least") {
            vec![format!("{}", numbers[0] as i64 - 1)]
        } else {
            vec![
                format!("{}", numbers[0] as i64 - 1),
                format!("{}", numbers[1] as i64 + 1),
            ]
        };
        for value in outside {
            let refused = with(path, &value).iter().any(|text| {
                RelayConfig::from_toml_str(text)
                    .err()
                    .is_some_and(|e| e.to_string().contains(path.as_str()))
            });
            assert!(
                refused,
                "{path} = {value} (outside \"{range}\") is not refused naming {path}"
            );
            checked += 1;
        }
    }
    assert!(checked >= 12, "only {checked} ranges checked");
    // [fleet]'s, in a many-source file.
    let dir = std::env::temp_dir().join(format!("outbox-relay-ranges-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let file = dir.join("relay.toml");
    let mut fleet = 0;
    for (path, node) in reference::nodes()
        .iter()
        .filter(|(p, _)| p.starts_with("fleet."))
    {
        let Some(range) = &node.range else { continue };
        let numbers: Vec<i64> = range
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|w| w.parse().ok())
            .collect();
        let key = path.trim_start_matches("fleet.");
        let mut values = vec![numbers[0] - 1];
        if let Some(max) = numbers.get(1) {
            values.push(max + 1);
        }
        for value in values {
            std::fs::write(
                &file,
                format!("{MINIMAL}[fleet]\n{key} = {value}\n[[source]]\nname = \"a\"\n"),
            )
            .expect("write");
            let err = ProcessConfig::load(&file)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains(path.as_str()), "{path} = {value}: {err}");
            fleet += 1;
        }
    }
    assert!(fleet >= 6, "only {fleet} fleet ranges checked");
}
