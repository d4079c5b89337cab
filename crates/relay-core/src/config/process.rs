//! A process's configuration: one source (today's single-source file, unchanged) or many.
//!
//! A file with `[[source]]` tables, or a top-level `sources_dir` (a folder with one TOML file
//! per source), configures many sources in one process. Its top-level sections are the shared
//! settings, written once; each source is what one relay is on its own (server, `server_id`,
//! outbox tables, routing, delivery mode, state table, lease, checkpoint, dead letters) and may
//! override any shared section, merged key by key (a source's `[source.kafka]` sets only the
//! keys it names; a list such as `outbox.tables` replaces the shared one). `[http]` and
//! `[tracing]` are the process's own (one listener, one exporter) and may not appear in a
//! source.
//!
//! ```toml
//! sources_dir = "sources.d"        # optional: sources.d/<name>.toml, one source each
//!
//! [kafka]
//! bootstrap_servers = "kafka:9092"
//!
//! [[source]]
//! name = "orders"                  # its connector name: the state-table row and the lease
//! [source.mysql]
//! url = "mysql://relay:${env:ORDERS_PASSWORD}@orders-db:3306/shop"
//! [source.outbox]
//! tables = ["shop.outbox"]
//! ```
//!
//! A file in `sources_dir` holds one source's sections at its top level (`[mysql]`,
//! `[outbox]`, …); its `name` defaults to the file name without `.toml`. Files whose name starts
//! with `.` are skipped (Kubernetes mounts a ConfigMap through `..data` links). The
//! `OUTBOX_RELAY__SECTION__KEY` environment overrides apply to the shared settings.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use figment::providers::{Env, Format, Serialized, Toml};
use figment::value::{Dict, Value};
use figment::Figment;

use super::{HttpConfig, RelayConfig, TracingConfig, ENV_PREFIX};
use crate::error::RelayError;

/// Top-level keys of a many-source file that are not shared settings of its sources.
const PROCESS_KEYS: [&str; 3] = ["source", "sources_dir", "sources_poll_ms"];

/// Sections that belong to the process, not to a source.
const PROCESS_SECTIONS: [&str; 2] = ["http", "tracing"];

/// Default `sources_poll_ms`.
pub const DEFAULT_SOURCES_POLL_MS: u64 = 2_000;

/// One source of a process.
#[derive(Debug, Clone)]
pub struct SourceConfig {
    /// Its name: the connector name (`connector_name` of a single-source file).
    pub name: String,
    /// Its whole configuration, shared settings merged in, validated.
    pub config: RelayConfig,
    /// What the source's settings were built from (the merged settings as written, plus a
    /// digest of the secrets they resolved to): equal fingerprints mean nothing changed, so a
    /// reload leaves the source running.
    pub fingerprint: String,
}

/// A process's configuration (see the module documentation).
#[derive(Debug, Clone)]
pub struct ProcessConfig {
    /// The file has `[[source]]` tables or `sources_dir`: the process runs each source on its
    /// own and stays up when one fails. `false`: today's single-source file, whose failure ends
    /// the process with its exit code.
    pub multi: bool,
    /// `[http]` of the process.
    pub http: HttpConfig,
    /// `[tracing]` of the process.
    pub tracing: TracingConfig,
    /// The sources, in the order written (`[[source]]` tables first, then the folder's files
    /// by name).
    pub sources: Vec<SourceConfig>,
    /// The sources folder, resolved against the file's directory.
    pub sources_dir: Option<PathBuf>,
    /// How often the process reads its configuration again to pick up changes without a
    /// SIGHUP, in ms (`sources_poll_ms`, many-source files only; default 2000; 0: only on
    /// SIGHUP).
    pub poll_ms: u64,
}

fn config_error(msg: String) -> RelayError {
    RelayError::Config(msg)
}

/// Figment's message, with keys as the user wrote them.
fn figment_error(e: figment::Error) -> RelayError {
    RelayError::Config(
        e.into_iter()
            .map(|e| e.to_string().replace("\"default.", "\""))
            .collect::<Vec<_>>()
            .join("; "),
    )
}

impl ProcessConfig {
    /// Loads `path` (TOML) and, for a many-source file, its sources folder; applies the
    /// environment overrides; validates every source.
    ///
    /// # Errors
    /// [`RelayError::Config`] naming the file, the source and the key: a missing file, a
    /// syntax error, an unknown or invalid key in any source, a source without a name, two
    /// sources of one name, `[http]`/`[tracing]` inside a source, two sources registering with
    /// the same `server_id` on the same server.
    pub fn load(path: &Path) -> Result<Self, RelayError> {
        if !path.exists() {
            return Err(config_error(format!(
                "config file {} does not exist",
                path.display()
            )));
        }
        let base =
            || Figment::from(Toml::file_exact(path)).merge(Env::prefixed(ENV_PREFIX).split("__"));
        let root: Dict = base().extract().map_err(figment_error)?;
        if !PROCESS_KEYS.iter().any(|k| root.contains_key(*k)) {
            let config = RelayConfig::from_figment(base())?;
            let fingerprint = fingerprint(&root, &config);
            return Ok(Self {
                multi: false,
                http: config.http.clone(),
                tracing: config.tracing.clone(),
                sources: vec![SourceConfig {
                    name: config.connector_name.clone(),
                    config,
                    fingerprint,
                }],
                sources_dir: None,
                poll_ms: 0,
            });
        }
        let dir = path.parent().unwrap_or(Path::new("."));
        Self::from_root(root, dir)
    }

    /// A many-source configuration from the file's top-level `root`; `dir` resolves a
    /// relative `sources_dir`.
    fn from_root(mut root: Dict, dir: &Path) -> Result<Self, RelayError> {
        let tables = match root.remove("source") {
            None => Vec::new(),
            Some(Value::Array(_, items)) => items,
            Some(_) => {
                return Err(config_error(
                    "source must be written as [[source]] tables (an array of tables)".into(),
                ))
            }
        };
        let sources_dir = match root.remove("sources_dir") {
            None => None,
            Some(Value::String(_, s)) => Some(dir.join(s)),
            Some(_) => {
                return Err(config_error(
                    "sources_dir must be a string: the folder of the source files".into(),
                ))
            }
        };
        let poll_ms = match root.remove("sources_poll_ms") {
            None => DEFAULT_SOURCES_POLL_MS,
            Some(v) => v.deserialize::<u64>().map_err(|_| {
                config_error("sources_poll_ms must be a whole number of ms (0: SIGHUP only)".into())
            })?,
        };
        if root.contains_key("connector_name") {
            return Err(config_error(
                "connector_name is per source in a file with [[source]] tables or sources_dir: \
                 give each source its name (name = \"orders\") and remove the top-level \
                 connector_name"
                    .into(),
            ));
        }
        let process: Figment = Figment::from(Serialized::defaults(Dict::from_iter(
            PROCESS_SECTIONS
                .iter()
                .filter_map(|k| Some(((*k).to_owned(), root.get(*k)?.clone()))),
        )));
        let http: HttpConfig = if root.contains_key("http") {
            process.extract_inner("http").map_err(figment_error)?
        } else {
            HttpConfig::default()
        };
        let tracing: TracingConfig = if root.contains_key("tracing") {
            process.extract_inner("tracing").map_err(figment_error)?
        } else {
            TracingConfig::default()
        };

        let mut written: Vec<(String, Dict)> = Vec::new();
        for (i, table) in tables.into_iter().enumerate() {
            let Value::Dict(_, mut dict) = table else {
                return Err(config_error(format!(
                    "[[source]] number {} is not a table",
                    i + 1
                )));
            };
            let name = take_name(&mut dict, None)
                .map_err(|why| config_error(format!("[[source]] number {}: {why}", i + 1)))?;
            written.push((name, dict));
        }
        if let Some(folder) = &sources_dir {
            for (file, mut dict) in read_folder(folder)? {
                let stem = file
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let name = take_name(&mut dict, Some(&stem))
                    .map_err(|why| config_error(format!("{}: {why}", file.display())))?;
                written.push((name, dict));
            }
        }

        let mut sources = Vec::with_capacity(written.len());
        let mut names: HashMap<String, ()> = HashMap::new();
        for (name, mut dict) in written {
            if names.insert(name.clone(), ()).is_some() {
                return Err(config_error(format!(
                    "two sources are named {name:?}: names key the state-table row and the \
                     lease, so each must be unique"
                )));
            }
            let in_source = |msg: String| config_error(format!("source {name:?}: {msg}"));
            for section in PROCESS_SECTIONS {
                if dict.contains_key(section) {
                    return Err(in_source(format!(
                        "[{section}] is the process's own (one per process): set it at the top \
                         level of the main file, not in a source"
                    )));
                }
            }
            if dict.contains_key("connector_name") {
                return Err(in_source(
                    "write the source's connector name as name = \"…\", not connector_name".into(),
                ));
            }
            dict.insert("connector_name".into(), Value::from(name.clone()));
            let merged =
                Figment::from(Serialized::defaults(root.clone())).merge(Serialized::defaults(dict));
            let settings: Dict = merged.extract().map_err(figment_error)?;
            let config = RelayConfig::from_figment(merged).map_err(|e| match e {
                RelayError::Config(msg) => in_source(msg),
                other => other,
            })?;
            let fingerprint = fingerprint(&settings, &config);
            sources.push(SourceConfig {
                name,
                config,
                fingerprint,
            });
        }
        check_server_ids(&sources)?;
        Ok(Self {
            multi: true,
            http,
            tracing,
            sources,
            sources_dir,
            poll_ms,
        })
    }
}

/// The source's name: its `name` key (removed from `dict`), else `default` (a file's stem).
fn take_name(dict: &mut Dict, default: Option<&str>) -> Result<String, String> {
    let name =
        match dict.remove("name") {
            Some(Value::String(_, s)) => s,
            Some(_) => return Err("name must be a string".into()),
            None => match default {
                Some(d) => d.to_owned(),
                None => return Err(
                    "a source needs a name (name = \"orders\"): its connector name, which keys \
                     its state-table row and its lease"
                        .into(),
                ),
            },
        };
    if name.trim().is_empty() || name.len() > 191 {
        return Err(format!("name {name:?} must be 1 to 191 characters"));
    }
    Ok(name)
}

/// The `*.toml` files of `folder` (not those whose name starts with `.`), sorted by name,
/// each parsed.
fn read_folder(folder: &Path) -> Result<Vec<(PathBuf, Dict)>, RelayError> {
    let entries = std::fs::read_dir(folder).map_err(|e| {
        config_error(format!(
            "sources_dir {}: cannot read the folder: {e}",
            folder.display()
        ))
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
            name.is_some_and(|n| !n.starts_with('.') && n.ends_with(".toml")) && p.is_file()
        })
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|file| {
            let dict: Dict = Figment::from(Toml::file_exact(&file))
                .extract()
                .map_err(|e| config_error(format!("{}: {}", file.display(), figment_error(e))))?;
            Ok((file, dict))
        })
        .collect()
}

/// The settings as written plus a digest of the secrets they resolved to (a rotated
/// `${file:…}` secret changes it; the values themselves are not kept).
fn fingerprint(settings: &Dict, config: &RelayConfig) -> String {
    let written = serde_json::to_string(settings).unwrap_or_default();
    let mut secrets = crc32fast::Hasher::new();
    secrets.update(config.mysql.url.as_bytes());
    secrets.update(
        config
            .mysql
            .password
            .as_deref()
            .unwrap_or_default()
            .as_bytes(),
    );
    let properties: BTreeMap<_, _> = config.kafka.properties.iter().collect();
    for (k, v) in properties {
        secrets.update(k.as_bytes());
        secrets.update(v.as_bytes());
    }
    format!("{written}#{:08x}", secrets.finalize())
}

/// Two sources of one process registering with the same `server_id` on the same server
/// would drop each other's binlog connection.
fn check_server_ids(sources: &[SourceConfig]) -> Result<(), RelayError> {
    let mut seen: HashMap<(String, u32), &str> = HashMap::new();
    for s in sources {
        let server = mysql_async::Opts::from_url(&s.config.mysql.url)
            .map(|o| format!("{}:{}", o.ip_or_hostname(), o.tcp_port()))
            .unwrap_or_default();
        if let Some(other) = seen.insert((server.clone(), s.config.mysql.server_id), &s.name) {
            return Err(config_error(format!(
                "sources {other:?} and {:?} both register with server_id {} on {server}: the \
                 server would drop one's binlog connection for the other's. Set a distinct \
                 mysql.server_id in one of them",
                s.name, s.config.mysql.server_id
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write");
        path
    }

    fn temp_dir(tag: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("outbox-relay-process-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mkdir");
        dir
    }

    const SHARED: &str = r#"
[kafka]
bootstrap_servers = "127.0.0.1:9092"
max_in_flight = 500
[mysql]
url = "mysql://root@127.0.0.1:3306/shop"
heartbeat_interval_ms = 2000
[outbox]
tables = ["shop.outbox"]
[http]
listen = "127.0.0.1:0"
"#;

    #[test]
    fn a_single_source_file_loads_as_today() {
        let dir = temp_dir("single");
        let path = write(
            &dir,
            "relay.toml",
            &format!("connector_name = \"one\"\n{SHARED}"),
        );
        let p = ProcessConfig::load(&path).expect("valid");
        assert!(!p.multi);
        assert_eq!(p.sources.len(), 1);
        assert_eq!(p.sources[0].name, "one");
        assert_eq!(p.http.listen, "127.0.0.1:0");
        assert_eq!(
            p.sources[0].config.mysql.server_id,
            crate::config::derived_server_id("one")
        );
    }

    #[test]
    fn sources_merge_over_the_shared_settings_key_by_key() {
        let dir = temp_dir("merge");
        let path = write(
            &dir,
            "relay.toml",
            &format!(
                "{SHARED}
[[source]]
name = \"orders\"

[[source]]
name = \"payments\"
[source.mysql]
url = \"mysql://root@127.0.0.1:3316/pay\"
server_id = 77
[source.kafka]
max_in_flight = 7
[source.outbox]
tables = [\"pay.outbox\", \"pay.outbox2\"]
"
            ),
        );
        let p = ProcessConfig::load(&path).expect("valid");
        assert!(p.multi);
        let names: Vec<&str> = p.sources.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["orders", "payments"]);
        let (orders, payments) = (&p.sources[0].config, &p.sources[1].config);
        assert_eq!(orders.connector_name, "orders");
        assert_eq!(orders.kafka.max_in_flight, 500);
        assert_eq!(orders.mysql.heartbeat_interval_ms, 2000);
        assert_eq!(orders.outbox.tables, ["shop.outbox"]);
        assert_eq!(
            orders.mysql.server_id,
            crate::config::derived_server_id("orders")
        );
        assert_eq!(payments.connector_name, "payments");
        assert_eq!(payments.kafka.max_in_flight, 7);
        // Merged key by key: the shared bootstrap servers and heartbeat stay.
        assert_eq!(payments.kafka.bootstrap_servers, "127.0.0.1:9092");
        assert_eq!(payments.mysql.heartbeat_interval_ms, 2000);
        assert_eq!(payments.mysql.server_id, 77);
        assert_eq!(payments.outbox.tables, ["pay.outbox", "pay.outbox2"]);
        assert_eq!(payments.url_database().as_deref(), Some("pay"));
        assert_ne!(p.sources[0].fingerprint, p.sources[1].fingerprint);
        // The process's own sections.
        assert_eq!(p.http.listen, "127.0.0.1:0");
        assert_eq!(p.poll_ms, DEFAULT_SOURCES_POLL_MS);
    }

    #[test]
    fn a_folder_holds_one_source_per_file_named_by_the_file() {
        let dir = temp_dir("folder");
        let folder = dir.join("sources.d");
        std::fs::create_dir_all(&folder).expect("mkdir");
        write(
            &folder,
            "b-orders.toml",
            "[outbox]\ntables = [\"b.outbox\"]\n",
        );
        write(&folder, "a-payments.toml", "name = \"payments\"\n");
        write(&folder, ".hidden.toml", "this is not toml");
        write(&folder, "notes.txt", "ignored");
        let path = write(
            &dir,
            "relay.toml",
            &format!("sources_dir = \"sources.d\"\nsources_poll_ms = 500\n{SHARED}"),
        );
        let p = ProcessConfig::load(&path).expect("valid");
        let names: Vec<&str> = p.sources.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["payments", "b-orders"]);
        assert_eq!(p.sources[1].config.outbox.tables, ["b.outbox"]);
        assert_eq!(p.poll_ms, 500);
        assert_eq!(p.sources_dir.as_deref(), Some(folder.as_path()));

        // An edit shows in the fingerprint; an untouched source keeps its own.
        let before: Vec<String> = p.sources.iter().map(|s| s.fingerprint.clone()).collect();
        write(
            &folder,
            "b-orders.toml",
            "[outbox]\ntables = [\"b.outbox2\"]\n",
        );
        let p = ProcessConfig::load(&path).expect("valid");
        assert_eq!(p.sources[0].fingerprint, before[0]);
        assert_ne!(p.sources[1].fingerprint, before[1]);
    }

    #[test]
    fn mistakes_are_named() {
        let dir = temp_dir("mistakes");
        let cases = [
            ("[[source]]\n[source.outbox]\ntables = [\"x.o\"]\n", "[[source]] number 1: a source needs a name"),
            ("[[source]]\nname = \"a\"\n[[source]]\nname = \"a\"\n", "two sources are named \"a\""),
            ("[[source]]\nname = \"a\"\n[source.http]\nlisten = \"127.0.0.1:1\"\n", "source \"a\": [http] is the process's own"),
            ("[[source]]\nname = \"a\"\n[source.kafka]\nbootstrap_server = \"x\"\n", "source \"a\": "),
            ("[[source]]\nname = \"a\"\nconnector_name = \"b\"\n", "write the source's connector name as name"),
            ("[[source]]\nname = \"a\"\n[source.mysql]\nserver_id = 9\n[[source]]\nname = \"b\"\n[source.mysql]\nserver_id = 9\n", "both register with server_id 9 on 127.0.0.1:3306"),
        ];
        for (i, (text, expected)) in cases.iter().enumerate() {
            let path = write(&dir, &format!("c{i}.toml"), &format!("{SHARED}\n{text}"));
            let err = ProcessConfig::load(&path).expect_err(text).to_string();
            assert!(err.contains(expected), "{text}: {err}");
        }
        let path = write(
            &dir,
            "top.toml",
            &format!("connector_name = \"x\"\nsources_dir = \"none\"\n{SHARED}"),
        );
        let err = ProcessConfig::load(&path)
            .expect_err("connector_name")
            .to_string();
        assert!(err.contains("connector_name is per source"), "{err}");
        let path = write(
            &dir,
            "nodir.toml",
            &format!("sources_dir = \"none\"\n{SHARED}"),
        );
        let err = ProcessConfig::load(&path)
            .expect_err("no folder")
            .to_string();
        assert!(err.contains("cannot read the folder"), "{err}");
    }
}
