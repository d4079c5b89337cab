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
//!
//! A top-level `[fleet]` table ([`FleetConfig`], many-source files only, the process's own like
//! `[http]`) makes the process one member of a fleet: processes that share the file's sources,
//! each running the sources of the control topic's partitions Kafka assigns it.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use figment::providers::{Env, Format, Serialized, Toml};
use figment::value::{Dict, Value};
use figment::Figment;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::explain::{Place, Places};
use super::{HttpConfig, KafkaConfig, RelayConfig, RetryConfig, TracingConfig, ENV_PREFIX};
use crate::error::RelayError;

/// Top-level keys of a many-source file that are not shared settings of its sources.
const PROCESS_KEYS: [&str; 3] = ["source", "sources_dir", "sources_poll_ms"];

/// Sections that belong to the process, not to a source.
const PROCESS_SECTIONS: [&str; 3] = ["http", "tracing", "fleet"];

// `[fleet]` as written: the keys, their defaults and their documentation (the configuration
// reference is generated from it); `FleetConfig` is what the process uses.
/// Many processes share the sources of a many-source file (a fleet): each joins a Kafka consumer
/// group on a control topic and runs exactly the sources whose partitions it is assigned;
/// a process that stops or freezes loses them to the others. Fencing stays the MySQL lease,
/// given a time to live. Only in a file with `[[source]]` tables or `sources_dir`; the process's
/// own, like `[http]`, never in a source. The membership uses the shared `[kafka]` section and
/// follows the shared `[retry]` while Kafka cannot be reached.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct FleetWritten {
    /// `false` ignores the `[fleet]` table: the process runs every source itself, as without
    /// it.
    pub enabled: bool,
    /// The Kafka consumer group the fleet's processes join; every process of one fleet needs the
    /// same value, and two fleets on one cluster need different ones.
    pub group_id: String,
    /// The topic whose partitions stand for the sources: a source runs in the process assigned
    /// its partition (`murmur2(name)`, Kafka's default partitioner). Created with `partitions`
    /// partitions when missing; no record is ever written to it.
    pub control_topic: String,
    /// Partitions of a control topic the relay creates, 1 to 10000: the most processes that can
    /// share the sources. An existing topic keeps its own count.
    #[schemars(range(min = 1, max = 10_000))]
    pub partitions: i64,
    /// This process's name in the group, shown by `fleet status` as a partition's owner and used
    /// as Kafka's `client.id`. Default `<hostname>:<pid>`; in Kubernetes
    /// `"${env:POD_NAME}"`. 1 to 249 characters.
    pub instance_id: Option<String>,
    /// Kafka's `session.timeout.ms` of the membership, 1000 to 3600000 ms (and within the
    /// brokers' `group.min.session.timeout.ms` / `group.max.session.timeout.ms`): a process
    /// silent this long loses its sources to the others. The default is the brokers' lowest by
    /// default.
    #[schemars(range(min = 1_000, max = 3_600_000))]
    pub session_timeout_ms: u64,
    /// Kafka's `heartbeat.interval.ms`, above 0 and below `session_timeout_ms` (a third of it is
    /// usual).
    #[schemars(range(min = 1))]
    pub heartbeat_interval_ms: u64,
    /// The MySQL lease's time to live, 2000 to 3600000 ms: the lease connection's `wait_timeout`
    /// is this in whole seconds (rounded up), a keeper confirms the lease every quarter of it,
    /// and no record is handed to the producer unless the lease was confirmed within half of
    /// it. A frozen or partitioned process stops producing before another takes its source.
    #[schemars(range(min = 2_000, max = 3_600_000))]
    pub lease_ttl_ms: u64,
}

impl Default for FleetWritten {
    fn default() -> Self {
        Self {
            enabled: true,
            group_id: DEFAULT_FLEET_GROUP.into(),
            control_topic: DEFAULT_FLEET_TOPIC.into(),
            partitions: DEFAULT_FLEET_PARTITIONS.into(),
            instance_id: None,
            session_timeout_ms: 6_000,
            heartbeat_interval_ms: 1_500,
            lease_ttl_ms: 8_000,
        }
    }
}

/// The top-level keys of a many-source file besides the shared sections and `[[source]]`
/// (their documentation is the configuration reference's).
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ManySourcesWritten {
    /// A folder with one TOML file per source (`orders.toml`: the source `orders`), relative to
    /// the configuration file. Each file holds one source's sections at its top level
    /// (`[mysql]`, `[outbox]`, ...) and may set `name`. Files whose name starts with `.` are
    /// skipped (Kubernetes mounts a ConfigMap through `..data` links). Makes the file a
    /// many-source file, as `[[source]]` tables do.
    pub sources_dir: Option<String>,
    /// How often a many-source process reads its configuration again to add, restart and
    /// remove sources without a SIGHUP. `0`: on SIGHUP only.
    pub sources_poll_ms: u64,
}

impl Default for ManySourcesWritten {
    fn default() -> Self {
        Self {
            sources_dir: None,
            sources_poll_ms: DEFAULT_SOURCES_POLL_MS,
        }
    }
}

/// One source of a many-source file. Besides `name`, a source holds any section
/// of a single-source file (`[source.mysql]`, `[source.outbox]`, `[source.kafka]`, ...) except
/// `[http]`, `[tracing]` and `[fleet]`, which are the process's own; each is merged key by key
/// over the file's top-level (shared) section of that name, and a list such as
/// `outbox.tables` replaces the shared one.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct SourceWritten {
    /// The source's connector name (what `connector_name` is in a single-source file): it keys
    /// the source's state-table row and its lease, so it must be unique; 1 to 191 characters.
    /// Required in `[[source]]`; a `sources_dir` file's name without `.toml` by default.
    pub name: String,
}

/// `[fleet]`: many processes share the file's sources. Each process joins Kafka consumer group
/// `group_id` on `control_topic` (`cooperative-sticky` assignment) and runs exactly the sources
/// whose partition (`murmur2(name) & 0x7fffffff % partitions`, Kafka's default partitioner) it
/// is assigned. Fencing stays the MySQL lease, given a time to live (`lease_ttl_ms`) so that a
/// frozen or partitioned process neither blocks a source nor produces after losing it.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// The consumer group of the fleet's processes (`group_id`, default `outbox-relay`).
    pub group_id: String,
    /// The topic whose partitions stand for the sources (`control_topic`, default
    /// `outbox-relay.fleet`); created with `partitions` partitions when missing. No record is
    /// ever written to it.
    pub control_topic: String,
    /// Partitions of a control topic created by the relay (`partitions`, default 64, 1 to
    /// 10000). An existing topic's own count is what the processes use.
    pub partitions: i32,
    /// This process's name in the group (`instance_id`, default `<hostname>:<pid>`; may be
    /// `${env:POD_NAME}`), shown by `fleet status` as a partition's owner; Kafka's `client.id`.
    pub instance_id: String,
    /// Kafka's `session.timeout.ms` of the membership (default 6000, the brokers' lowest by
    /// default): a process silent this long loses its sources.
    pub session_timeout_ms: u64,
    /// Kafka's `heartbeat.interval.ms` (default 1500, below `session_timeout_ms`).
    pub heartbeat_interval_ms: u64,
    /// The lease's time to live in ms (default 8000, at least 2000): the lease connection's
    /// `wait_timeout` is `ceil(lease_ttl_ms / 1000)` s, a keeper confirms the lease every
    /// `lease_ttl_ms / 4`, and no record is handed to the producer unless the lease was
    /// confirmed within `lease_ttl_ms / 2`.
    pub lease_ttl_ms: u64,
    /// The shared `[kafka]` section (bootstrap servers, security properties), secrets resolved.
    pub kafka: KafkaConfig,
    /// The top-level (shared) `[retry]` section, which joining the group follows while Kafka
    /// cannot be reached: backoff from `initial_backoff_ms` to `max_backoff_ms` (ms), and the
    /// process gives up after `max_attempts` failed attempts (0: retries forever). A source's
    /// own `[retry]` applies to that source only. Defaults as [`RetryConfig`].
    pub retry: RetryConfig,
}

/// Defaults of `[fleet]`.
pub const DEFAULT_FLEET_GROUP: &str = "outbox-relay";
/// Default `fleet.control_topic`.
pub const DEFAULT_FLEET_TOPIC: &str = "outbox-relay.fleet";
/// Default `fleet.partitions`.
pub const DEFAULT_FLEET_PARTITIONS: i32 = 64;

impl FleetConfig {
    /// `[fleet]` from its written value; `root` holds the shared `[kafka]`. `None` when
    /// `enabled = false`.
    fn from_written(
        value: &Value,
        root: &Dict,
        places: &Places,
    ) -> Result<Option<Self>, RelayError> {
        let w: FleetWritten = value
            .deserialize()
            .map_err(|e| places.error(e, &["fleet"]))?;
        if !w.enabled {
            return Ok(None);
        }
        let bad = |key: &str, why: &str| config_error(format!("fleet.{key} {why}"));
        let group_id = w.group_id;
        if group_id.trim().is_empty() {
            return Err(bad("group_id", "must not be empty"));
        }
        let control_topic = w.control_topic;
        if control_topic.is_empty()
            || control_topic.len() > 249
            || control_topic == "."
            || control_topic == ".."
            || !control_topic
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            return Err(bad(
                "control_topic",
                &format!(
                    "{control_topic:?} is not a valid Kafka topic name (1 to 249 of \
                     [a-zA-Z0-9._-])"
                ),
            ));
        }
        let partitions = w.partitions;
        let partitions = i32::try_from(partitions)
            .ok()
            .filter(|p| (1..=10_000).contains(p))
            .ok_or_else(|| {
                bad(
                    "partitions",
                    &format!("must be 1 to 10000, not {partitions}"),
                )
            })?;
        let instance_id = match w.instance_id {
            Some(id) => super::secrets::resolve("fleet.instance_id", &id)?,
            None => instance_name(),
        };
        if instance_id.trim().is_empty() || instance_id.len() > 249 {
            return Err(bad(
                "instance_id",
                "must be 1 to 249 characters (an empty ${env:…} variable?)",
            ));
        }
        let session_timeout_ms = w.session_timeout_ms;
        if !(1_000..=3_600_000).contains(&session_timeout_ms) {
            return Err(bad(
                "session_timeout_ms",
                "must be 1000 to 3600000 (and within the brokers' group.min/max.session.timeout.ms)",
            ));
        }
        let heartbeat_interval_ms = w.heartbeat_interval_ms;
        if heartbeat_interval_ms == 0 || heartbeat_interval_ms >= session_timeout_ms {
            return Err(bad(
                "heartbeat_interval_ms",
                &format!(
                    "must be above 0 and below fleet.session_timeout_ms ({session_timeout_ms}); \
                     a third of it is usual"
                ),
            ));
        }
        let lease_ttl_ms = w.lease_ttl_ms;
        if !(2_000..=3_600_000).contains(&lease_ttl_ms) {
            return Err(bad(
                "lease_ttl_ms",
                "must be 2000 to 3600000 (MySQL's wait_timeout counts whole seconds)",
            ));
        }
        let shared = Figment::from(Serialized::defaults(root.clone()));
        if !root.contains_key("kafka") {
            return Err(config_error(
                "[fleet] needs the shared [kafka] section (bootstrap_servers): the fleet's \
                 membership is a Kafka consumer group"
                    .into(),
            ));
        }
        let mut kafka: KafkaConfig = shared
            .extract_inner("kafka")
            .map_err(|e| places.error(e, &["kafka"]))?;
        for (key, value) in kafka.properties.iter_mut() {
            *value = super::secrets::resolve(&format!("kafka.properties.{key:?}"), value)?;
        }
        let retry: RetryConfig = if root.contains_key("retry") {
            shared
                .extract_inner("retry")
                .map_err(|e| places.error(e, &["retry"]))?
        } else {
            RetryConfig::default()
        };
        if retry.initial_backoff_ms == 0 || retry.max_backoff_ms < retry.initial_backoff_ms {
            return Err(config_error(
                "retry.initial_backoff_ms must be > 0 and <= retry.max_backoff_ms (the shared \
                 [retry], which the fleet's membership follows)"
                    .into(),
            ));
        }
        Ok(Some(Self {
            group_id,
            control_topic,
            partitions,
            instance_id,
            session_timeout_ms,
            heartbeat_interval_ms,
            lease_ttl_ms,
            kafka,
            retry,
        }))
    }

    /// The lease's time to live.
    pub fn lease_ttl(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.lease_ttl_ms)
    }
}

/// `host:pid`: this process's default name (the lease owner stored in the state row, the
/// default `fleet.instance_id`).
pub fn instance_name() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown-host".into());
    format!("{host}:{}", std::process::id())
}

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
    /// `[fleet]`, when present and enabled: this process runs only its share of the sources.
    pub fleet: Option<FleetConfig>,
}

fn config_error(msg: String) -> RelayError {
    RelayError::Config(msg)
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
            return Err(config_error(super::missing_file(path)));
        }
        let places = Places::file(path);
        let base =
            || Figment::from(Toml::file_exact(path)).merge(Env::prefixed(ENV_PREFIX).split("__"));
        let root: Dict = base().extract().map_err(|e| places.error(e, &[]))?;
        if !PROCESS_KEYS.iter().any(|k| root.contains_key(*k)) {
            if root.contains_key("fleet") {
                return Err(config_error(
                    "[fleet] shares the sources of a many-source file among processes: write \
                     the sources as [[source]] tables or in a sources_dir"
                        .into(),
                ));
            }
            let config = RelayConfig::from_figment(base(), &places)?;
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
                fleet: None,
            });
        }
        Self::from_root(root, path, &places)
    }

    /// A many-source configuration from the top-level `root` of the file at `path` (whose
    /// directory resolves a relative `sources_dir`), `places` its keys' lines.
    fn from_root(mut root: Dict, path: &Path, places: &Places) -> Result<Self, RelayError> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let tables = match root.remove("source") {
            None => Vec::new(),
            Some(Value::Array(_, items)) => items,
            Some(_) => {
                return Err(config_error(
                    "source must be written as [[source]] tables (an array of tables)".into(),
                ))
            }
        };
        let own: Dict = ["sources_dir", "sources_poll_ms"]
            .iter()
            .filter_map(|k| Some(((*k).to_owned(), root.remove(*k)?)))
            .collect();
        let own: ManySourcesWritten = Figment::from(Serialized::defaults(own))
            .extract()
            .map_err(|e| places.error(e, &[]))?;
        let sources_dir = own.sources_dir.map(|s| dir.join(s));
        let poll_ms = own.sources_poll_ms;
        let fleet = match root.remove("fleet") {
            None => None,
            Some(v) => FleetConfig::from_written(&v, &root, places)?,
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
            process
                .extract_inner("http")
                .map_err(|e| places.error(e, &["http"]))?
        } else {
            HttpConfig::default()
        };
        let tracing: TracingConfig = if root.contains_key("tracing") {
            process
                .extract_inner("tracing")
                .map_err(|e| places.error(e, &["tracing"]))?
        } else {
            TracingConfig::default()
        };

        // Each source's settings with where they are written: its own table or file first,
        // then the shared sections.
        let mut written: Vec<(String, Dict, Places)> = Vec::new();
        for (i, table) in tables.into_iter().enumerate() {
            let Value::Dict(_, mut dict) = table else {
                return Err(config_error(format!(
                    "[[source]] number {} is not a table",
                    i + 1
                )));
            };
            let name = take_name(&mut dict, None)
                .map_err(|why| config_error(format!("[[source]] number {}: {why}", i + 1)))?;
            let index = i.to_string();
            let here = Places(vec![
                Place::file(path, &["source", index.as_str()]),
                Place::file(path, &[]),
            ]);
            written.push((name, dict, here));
        }
        if let Some(folder) = &sources_dir {
            for (file, mut dict) in read_folder(folder)? {
                let stem = file
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let name = take_name(&mut dict, Some(&stem))
                    .map_err(|why| config_error(format!("{}: {why}", file.display())))?;
                let here = Places(vec![Place::file(&file, &[]), Place::file(path, &[])]);
                written.push((name, dict, here));
            }
        }

        let mut sources = Vec::with_capacity(written.len());
        let mut names: HashMap<String, ()> = HashMap::new();
        for (name, mut dict, here) in written {
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
            let settings: Dict = merged.extract().map_err(|e| here.error(e, &[]))?;
            let mut config = RelayConfig::from_figment(merged, &here).map_err(|e| match e {
                RelayError::Config(msg) => in_source(msg),
                other => other,
            })?;
            if let Some(fleet) = &fleet {
                config.mysql.server_id =
                    fleet_server_id(&name, fleet, &settings).map_err(in_source)?;
            }
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
            fleet,
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
                .map_err(|e| Places::file(&file).error(e, &[]))?;
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

/// A fleet's `server_id` for source `name` in this process: `2^31 + crc32("<name>@<instance_id>")
/// mod 2^31` ([`crate::config::derived_server_id`] of that string), different in every process.
///
/// Why per process: when a frozen process loses a source, its binlog dump connection may still
/// be open on the server, its dump thread blocked writing to a socket nobody reads (up to the
/// server's `net_write_timeout`). A successor registering with the same `server_id` was seen
/// (fleet fault profile, MariaDB 11.4 under writes) to receive nothing at all until the frozen
/// process resumed, 60 s later; with its own id it streams at once, and the old dump thread
/// ends on its own.
///
/// # Errors
/// The source sets `mysql.server_id` itself (the message says why and what to do).
fn fleet_server_id(name: &str, fleet: &FleetConfig, settings: &Dict) -> Result<u32, String> {
    let explicit = settings
        .get("mysql")
        .and_then(|m| m.find_ref("server_id"))
        // TOML integers are signed; an environment override may be unsigned.
        .and_then(|v| v.to_i128().or_else(|| v.to_u128().map(|u| u as i128)))
        .is_some_and(|id| id != 0);
    if explicit {
        return Err(
            "mysql.server_id is set, but in a fleet each process registers with its own \
             server_id per source (derived from the source's name and fleet.instance_id), so \
             that a frozen process's binlog connection cannot hold up the process that takes \
             the source over: remove mysql.server_id"
                .into(),
        );
    }
    Ok(crate::config::derived_server_id(&format!(
        "{name}@{}",
        fleet.instance_id
    )))
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

    #[test]
    fn a_fleet_derives_a_server_id_per_process_and_refuses_a_written_one() {
        let dir = temp_dir("fleet-ids");
        let file = |instance: &str| {
            format!(
                "{SHARED}\n[fleet]\ninstance_id = \"{instance}\"\n\n[[source]]\nname = \"a\"\n\n\
                 [[source]]\nname = \"b\"\n"
            )
        };
        let ids = |instance: &str| {
            let path = write(&dir, &format!("{instance}.toml"), &file(instance));
            let p = ProcessConfig::load(&path).expect("valid");
            p.sources
                .iter()
                .map(|s| s.config.mysql.server_id)
                .collect::<Vec<_>>()
        };
        let one = ids("relay-0");
        let two = ids("relay-1");
        assert_eq!(
            one,
            vec![
                crate::config::derived_server_id("a@relay-0"),
                crate::config::derived_server_id("b@relay-0")
            ]
        );
        assert!(one.iter().all(|id| !two.contains(id)), "{one:?} {two:?}");
        assert_eq!(ids("relay-0"), one, "stable for one instance");

        let path = write(
            &dir,
            "written.toml",
            &format!(
                "{SHARED}\n[fleet]\n\n[[source]]\nname = \"a\"\n[source.mysql]\nserver_id = 42\n"
            ),
        );
        let err = ProcessConfig::load(&path)
            .expect_err("a written server_id in a fleet")
            .to_string();
        assert!(
            err.contains("source \"a\"") && err.contains("remove mysql.server_id"),
            "{err}"
        );
    }

    #[test]
    fn fleet_defaults_and_the_helm_chart_form() {
        let dir = temp_dir("fleet");
        let path = write(
            &dir,
            "plain.toml",
            &format!("{SHARED}\n[fleet]\n\n[[source]]\nname = \"a\"\n"),
        );
        let p = ProcessConfig::load(&path).expect("valid");
        let f = p.fleet.expect("[fleet] present: enabled");
        assert_eq!(f.group_id, "outbox-relay");
        assert_eq!(f.control_topic, "outbox-relay.fleet");
        assert_eq!(f.partitions, 64);
        assert_eq!(f.instance_id, instance_name());
        assert_eq!(
            (
                f.session_timeout_ms,
                f.heartbeat_interval_ms,
                f.lease_ttl_ms
            ),
            (6000, 1500, 8000)
        );
        assert_eq!(f.kafka.bootstrap_servers, "127.0.0.1:9092");
        assert_eq!(
            (
                f.retry.initial_backoff_ms,
                f.retry.max_backoff_ms,
                f.retry.max_attempts
            ),
            (500, 30_000, 0),
            "no [retry]: the defaults"
        );

        // The top-level [retry] is the fleet's; a source's own [retry] is not.
        let path = write(
            &dir,
            "retry.toml",
            &format!(
                "{SHARED}\n[retry]\ninitial_backoff_ms = 50\nmax_backoff_ms = 200\n\
                 max_attempts = 3\n\n[fleet]\n\n[[source]]\nname = \"a\"\n[source.retry]\n\
                 max_attempts = 9\n"
            ),
        );
        let f = ProcessConfig::load(&path)
            .expect("valid")
            .fleet
            .expect("enabled");
        assert_eq!(
            (
                f.retry.initial_backoff_ms,
                f.retry.max_backoff_ms,
                f.retry.max_attempts
            ),
            (50, 200, 3)
        );

        // Exactly what the Helm chart renders.
        std::env::set_var("OUTBOX_RELAY_TEST_POD_NAME", "relay-7f9c-x2");
        let path = write(
            &dir,
            "helm.toml",
            &format!(
                "{SHARED}\n[fleet]\nenabled = true\ngroup_id = \"shop-relays\"\ncontrol_topic = \
                 \"shop.fleet\"\ninstance_id = \"${{env:OUTBOX_RELAY_TEST_POD_NAME}}\"\n\n\
                 [[source]]\nname = \"a\"\n"
            ),
        );
        let f = ProcessConfig::load(&path)
            .expect("valid")
            .fleet
            .expect("enabled");
        assert_eq!(f.group_id, "shop-relays");
        assert_eq!(f.control_topic, "shop.fleet");
        assert_eq!(f.instance_id, "relay-7f9c-x2");

        let path = write(
            &dir,
            "off.toml",
            &format!("{SHARED}\n[fleet]\nenabled = false\n[[source]]\nname = \"a\"\n"),
        );
        assert!(ProcessConfig::load(&path).expect("valid").fleet.is_none());
        let path = write(
            &dir,
            "none.toml",
            &format!("{SHARED}\n[[source]]\nname = \"a\"\n"),
        );
        assert!(ProcessConfig::load(&path).expect("valid").fleet.is_none());
    }

    #[test]
    fn fleet_mistakes_name_the_key() {
        let dir = temp_dir("fleet-mistakes");
        let cases = [
            ("partitions = 0", "fleet.partitions must be 1 to 10000, not 0"),
            ("partitions = 20000", "fleet.partitions must be 1 to 10000"),
            ("control_topic = \"a b\"", "fleet.control_topic \"a b\" is not a valid Kafka topic name"),
            ("group_id = \" \"", "fleet.group_id must not be empty"),
            ("heartbeat_interval_ms = 6000", "fleet.heartbeat_interval_ms must be above 0 and below fleet.session_timeout_ms (6000)"),
            ("lease_ttl_ms = 500", "fleet.lease_ttl_ms must be 2000 to 3600000"),
            ("session_timeout_ms = 10", "fleet.session_timeout_ms must be 1000"),
            ("instance_id = \"${env:OUTBOX_RELAY_TEST_UNSET_VAR}\"", "fleet.instance_id"),
            ("groupid = \"x\"", "unknown key \"groupid\" in [fleet] ("),
            ("groupid = \"x\"", "line 14): did you mean \"group_id\"? The valid keys are: control_topic, enabled, group_id,"),
        ];
        for (i, (line, expected)) in cases.iter().enumerate() {
            let path = write(
                &dir,
                &format!("f{i}.toml"),
                &format!("{SHARED}\n[fleet]\n{line}\n[[source]]\nname = \"a\"\n"),
            );
            let err = ProcessConfig::load(&path).expect_err(line).to_string();
            assert!(err.contains(expected), "{line}: {err}");
        }
        let path = write(
            &dir,
            "single.toml",
            &format!("connector_name = \"one\"\n{SHARED}\n[fleet]\n"),
        );
        let err = ProcessConfig::load(&path).expect_err("single").to_string();
        assert!(
            err.contains("[fleet] shares the sources of a many-source file"),
            "{err}"
        );
        let path = write(
            &dir,
            "insource.toml",
            &format!("{SHARED}\n[[source]]\nname = \"a\"\n[source.fleet]\ngroup_id = \"x\"\n"),
        );
        let err = ProcessConfig::load(&path)
            .expect_err("in source")
            .to_string();
        assert!(err.contains("[fleet] is the process's own"), "{err}");
    }
}
