//! Relay configuration: a TOML file plus `OUTBOX_RELAY__SECTION__KEY` environment overrides.
//!
//! Every section rejects unknown keys, so a typo (`bootstrap_server`) is an error at start-up
//! instead of a silently ignored setting. Defaults are the values documented in the README's
//! configuration reference and on each field below.

pub mod debezium;
mod explain;
pub mod mysql_tls;
pub mod process;
pub mod reference;
pub mod secrets;
pub mod topic;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use figment::providers::{Env, Format, Toml};
use figment::Figment;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::RelayError;

/// Environment variable prefix for overrides; nested keys are separated by `__`
/// (`OUTBOX_RELAY__KAFKA__BOOTSTRAP_SERVERS=broker:9092`).
pub const ENV_PREFIX: &str = "OUTBOX_RELAY__";

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RelayConfig {
    /// Name of this connector: it keys the relay's row in the checkpoint table and its lease, so
    /// two relays with different names follow the same server independently, and two with the same
    /// name never run at once (the second waits). 1 to 191 characters. In a file of many sources
    /// each source's `name` is its connector name instead.
    #[serde(default = "default_connector_name")]
    #[schemars(length(min = 1, max = 191))]
    pub connector_name: String,
    /// The source server, MySQL or MariaDB: how to connect (URL, password, TLS), the replica
    /// `server_id` the relay registers with, and how it reads and resumes the binlog.
    pub mysql: MysqlConfig,
    /// Which tables are outboxes, and how each row becomes a Kafka record: columns, topic, key,
    /// headers, timestamp, and what to do with rows that do not fit.
    pub outbox: OutboxConfig,
    /// The Kafka producer: brokers, records in flight, librdkafka properties, and the delivery mode
    /// (at least once, or exactly once with Kafka transactions).
    pub kafka: KafkaConfig,
    /// The state table the relay writes its resume point to, and how often.
    #[serde(default)]
    pub checkpoint: CheckpointConfig,
    /// Reconnecting after MySQL or Kafka failures: capped exponential backoff, when to give up, and
    /// how long a stop waits for Kafka.
    #[serde(default)]
    pub retry: RetryConfig,
    /// What happens to a row that cannot be relayed: stop the relay naming the row, or send a
    /// dead-letter record and go on.
    #[serde(default)]
    pub dead_letter: DeadLetterConfig,
    /// The HTTP endpoints: `/metrics` (Prometheus), `/healthz` (the process runs) and `/readyz`
    /// (streaming and not stalled). `run` only: `replay` serves nothing.
    #[serde(default)]
    pub http: HttpConfig,
    /// Only for the switch from a polling relay (one that marks outbox rows as sent): rows it
    /// already sent are not produced again. See "Cutover from a polling relay". The section can be
    /// removed once the relay logs `cutover window ended`.
    #[serde(default)]
    pub cutover: Option<CutoverConfig>,
    /// OpenTelemetry: one span per relayed row, exported over OTLP/HTTP. Off unless an endpoint is
    /// configured (here or in the standard `OTEL_EXPORTER_OTLP_*` variables). `run` only: `replay`
    /// makes no spans.
    #[serde(default)]
    pub tracing: TracingConfig,
    /// The acknowledgement audit, for proving after the fact that every offset Kafka acknowledged
    /// holds its record. Off by default.
    #[serde(default)]
    pub audit: AuditConfig,
    /// The Debezium profile's settings, used with `outbox.compat = "debezium"`: the outbox event
    /// router's and the Kafka Connect worker's converters' settings the team ran, so the relay
    /// writes the bytes Debezium wrote. Every key also takes Debezium's own property name, quoted
    /// (`"table.expand.json.payload" = true`).
    #[serde(default)]
    pub debezium: debezium::DebeziumConfig,
}

/// `[audit]`: a record of what Kafka acknowledged, to be checked against the log
/// ([`crate::observe::audit`]).
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// A file the relay appends one JSON line to per record and dead letter Kafka acknowledged:
    /// `{"topic":…,"partition":…,"offset":…,"event_key":…,"position":"<binlog
    /// file>:<pos>","kind":"record"|"dead_letter"}`, one `write` per batch of delivery reports and
    /// no buffer in the process (a kill -9 loses no line of what it had applied). Absent: no audit,
    /// which costs nothing per record.
    pub acks_file: Option<PathBuf>,
    /// With `acks_file`: each record's line also gives when the relay read its binlog event,
    /// handed it to the producer and got its acknowledgement (`read_us`, `sent_us`, `acked_us`:
    /// wall-clock microseconds since the Unix epoch), and each Kafka transaction the
    /// exactly-once relay commits gets a line `{"kind":"commit","committed_us":...}`. For a
    /// latency budget per stage (`make bench` uses it); without `acks_file` nothing is timed.
    pub timings: bool,
}

/// `[cutover]`: the first runs after a polling relay (one that marks outbox rows `SENT` in a
/// `status` column) skip the rows it already sent. While the relay reads transactions that
/// committed at or before `until`, each transaction's outbox rows are checked against the
/// table's current state; the rows that match are not produced (they still move the
/// checkpoint), every other row is. See the README's "Cutover from a polling relay".
#[derive(Debug, Clone, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CutoverConfig {
    /// A SQL condition on an outbox table's columns that holds for rows the previous relay sent,
    /// such as `"status = 'SENT'"`. Evaluated on each row's current state, one query per source
    /// transaction and table (`SELECT id FROM t WHERE id IN (…) AND (skip_if)`), for transactions
    /// committed at or before `until`; matching rows are not produced (they still move the
    /// checkpoint). Run once on every outbox table at start-up: a condition the server refuses
    /// stops the relay with a configuration error. One condition, not statements (no `;`). Not with
    /// a binary (`BINARY`/`VARBINARY`/`BLOB`) id column. `skip_if` and `skip_ids_through` may be
    /// combined (a row is skipped when either says so); `[cutover]` needs at least one.
    #[serde(default)]
    pub skip_if: Option<String>,
    /// Id watermark: rows whose integer `id` is at most this were sent by the previous relay and
    /// are skipped without a query (within the window, as `skip_if`). Needs an integer id column.
    #[serde(default)]
    pub skip_ids_through: Option<i64>,
    /// `YYYY-MM-DD HH:MM:SS` (UTC, that second included): transactions whose commit time in the
    /// binlog is after it are relayed without checks. Set it to a time after the previous relay
    /// stopped. Once the relay reads the first such transaction it logs `cutover window ended`.
    pub until: String,
}

impl CutoverConfig {
    /// `until` in ms since the Unix epoch; the whole second it names is included.
    ///
    /// # Errors
    /// [`RelayError::Config`] naming `cutover.until` when it is not `YYYY-MM-DD HH:MM:SS`.
    pub fn until_ms(&self) -> Result<i64, RelayError> {
        chrono::NaiveDateTime::parse_from_str(self.until.trim(), "%Y-%m-%d %H:%M:%S")
            .map(|t| t.and_utc().timestamp_millis() + 999)
            .map_err(|e| {
                RelayError::Config(format!(
                    "cutover.until {:?} is not a date-time of the form \"YYYY-MM-DD HH:MM:SS\" \
                     (UTC): {e}",
                    self.until
                ))
            })
    }

    fn validate(&self) -> Result<(), RelayError> {
        let bad = |msg: &str| Err(RelayError::Config(msg.to_owned()));
        self.until_ms()?;
        match &self.skip_if {
            None if self.skip_ids_through.is_none() => return bad(
                "[cutover] needs cutover.skip_if (a SQL condition such as \"status = 'SENT'\") \
                     and/or cutover.skip_ids_through (an id watermark)",
            ),
            Some(c) if c.trim().is_empty() => {
                return bad(
                    "cutover.skip_if must not be empty (leave it out to use only \
                            cutover.skip_ids_through)",
                )
            }
            Some(c) if c.contains(';') => {
                return bad("cutover.skip_if is one SQL condition, not statements: remove the ';'")
            }
            _ => {}
        }
        Ok(())
    }
}

/// `[tracing]`: one OpenTelemetry span per relayed outbox row, exported as OTLP over
/// HTTP/protobuf (see [`crate::observe::spans`]). Off unless an endpoint is configured.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TracingConfig {
    /// Base URL of an OTLP/HTTP (protobuf) receiver, e.g. `http://otel-collector:4318` (Jaeger,
    /// Tempo, the OpenTelemetry Collector); spans go to `<url>/v1/traces`. Absent: the standard
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used as is) or `OTEL_EXPORTER_OTLP_ENDPOINT` (plus
    /// `/v1/traces`) when set, else off. `""`: off whatever the environment says;
    /// `OTEL_SDK_DISABLED=true`: off. `https://` uses the system's OpenSSL;
    /// `OTEL_EXPORTER_OTLP_HEADERS` (an API key, say) is honoured.
    pub otlp_endpoint: Option<String>,
    /// The spans' `service.name`. Absent: `OTEL_SERVICE_NAME` when set, else `outbox-relay`.
    /// `OTEL_RESOURCE_ATTRIBUTES` adds resource attributes.
    pub service_name: Option<String>,
    /// Share of new traces recorded (rows without a `traceparent`), from 0.0 (none) to 1.0 (all). A
    /// row with a `traceparent` follows its sampled flag (parent-based sampling).
    #[schemars(range(min = 0.0, max = 1.0))]
    pub sample_ratio: f64,
    /// Longest wait for one export request to the receiver.
    #[schemars(range(min = 1))]
    pub export_timeout_ms: u64,
    /// Most finished spans waiting for export (exported every 5 s or per 512 spans, on a thread of
    /// their own). When the receiver is slow or unreachable the queue fills and further spans are
    /// dropped, with a warning: relaying never waits for the receiver.
    #[schemars(range(min = 1))]
    pub max_queue_size: usize,
}

impl Default for TracingConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            service_name: None,
            sample_ratio: 1.0,
            export_timeout_ms: 10_000,
            max_queue_size: 8_192,
        }
    }
}

/// `[http]`: `/metrics` (Prometheus), `/healthz` (the process runs) and `/readyz` (streaming and
/// not stalled), see [`crate::observe::http`].
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Serve `/metrics`, `/healthz` and `/readyz`. `false`: no HTTP listener.
    pub enabled: bool,
    /// `IP:port` of the HTTP endpoints: loopback only by default; `0.0.0.0:9719` (or `[::]:9719`)
    /// to be scraped from other hosts or in a container. Port `0` picks a free port (logged at
    /// start-up). A port already in use stops the relay at start-up with a configuration error
    /// (exit code 2).
    pub listen: String,
    /// `/readyz` answers 503 when no binlog event or heartbeat was read for this long (the stream
    /// is stalled, or reading waits for Kafka's acknowledgements). Must exceed
    /// `mysql.heartbeat_interval_ms`.
    pub ready_stall_ms: u64,
    /// `/readyz` answers 503 when no Kafka broker answered the relay's metadata probe for this
    /// long, also while no rows flow; the probe runs every third of it while the relay streams.
    #[schemars(range(min = 3000))]
    pub ready_kafka_ms: u64,
}

/// Default `http.listen`.
pub const DEFAULT_HTTP_LISTEN: &str = "127.0.0.1:9719";

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            listen: DEFAULT_HTTP_LISTEN.into(),
            ready_stall_ms: 30_000,
            ready_kafka_ms: 30_000,
        }
    }
}

fn default_connector_name() -> String {
    "outbox-relay".to_owned()
}

/// The replica `server_id` of a connector that sets none: `2^31 + crc32(name) mod 2^31`, in
/// `2147483648..=4294967295` (far above the small ids people give servers by hand), the same
/// on every start and in every process. A connector streams from one process at a time (its
/// lease), so one id per connector is unique among the relay's connections. A fleet (`[fleet]`)
/// derives one per process instead (`"<name>@<instance_id>"`, see
/// `config::process`): a frozen process's dump connection, its dump thread blocked writing to
/// a socket nobody reads, was seen to starve a successor with the same id.
pub fn derived_server_id(connector_name: &str) -> u32 {
    0x8000_0000 | (crc32fast::hash(connector_name.as_bytes()) & 0x7FFF_FFFF)
}

/// `[mysql]`: the source server.
#[derive(Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MysqlConfig {
    /// `mysql://user:password@host:port/database`. The database is where the checkpoint table lives
    /// unless `checkpoint.table` names one. Percent-encode special characters of the password (`@`
    /// is `%40`, `:` is `%3A`, `/` is `%2F`, `#` is `%23`, `%` is `%25`), or give it in `password`.
    /// May hold `${env:NAME}` / `${file:PATH}` references. Never logged. TLS parameters in the URL
    /// (`require_ssl`, `verify_ca`, …) are refused: use `tls_mode`.
    pub url: String,
    /// The user's password, taken literally (no percent-encoding); replaces a password in `url`.
    /// Usually a reference: `"${file:/run/secrets/mysql_password}"` or `"${env:MYSQL_PASSWORD}"`.
    /// Absent: the URL's password. Never logged.
    #[serde(default)]
    pub password: Option<String>,
    /// TLS to the server, named after the MySQL client's `--ssl-mode`. Applies to every connection
    /// of the relay (binlog dump, start-up checks, checkpoint, lease).
    #[serde(default)]
    pub tls_mode: TlsMode,
    /// PEM file of the CA(s) that signed the server's certificate (the server's `ssl_ca`). Only
    /// with `tls_mode` `verify_ca` or `verify_identity`; when set, only these CAs are trusted.
    /// Absent: the system trust store.
    #[serde(default)]
    pub tls_ca: Option<PathBuf>,
    /// PEM file of the client certificate (then any intermediates), for users created `REQUIRE
    /// X509` / `REQUIRE SUBJECT …`. Needs `tls_key`, and a `tls_mode` other than `disabled`.
    #[serde(default)]
    pub tls_cert: Option<PathBuf>,
    /// PEM file of the client certificate's unencrypted private key (PKCS#8, PKCS#1 or SEC1). Needs
    /// `tls_cert`.
    #[serde(default)]
    pub tls_key: Option<PathBuf>,
    /// The replica `server_id` the relay registers with. Must differ from every server and replica
    /// in the topology: the server drops an older connection with the same id (checked at start-up,
    /// exit code 3 on a collision). `0` or absent: derived from `connector_name` as `2^31 +
    /// crc32(connector_name) mod 2^31`, the same on every start and in every process, far above the
    /// small ids servers are given by hand. In a fleet (`[fleet]`) each process derives its own per
    /// source and a written one is refused.
    #[serde(default)]
    pub server_id: u32,
    /// Heartbeat period asked of the server (`@master_heartbeat_period`): it sends one when it has
    /// had nothing else to send for this long.
    #[serde(default = "default_heartbeat_ms")]
    #[schemars(range(min = 100))]
    pub heartbeat_interval_ms: u64,
    /// Silence (no event, no heartbeat) after which the connection is presumed dead (half-open TCP)
    /// and the relay reconnects. Must exceed `heartbeat_interval_ms`.
    #[serde(default = "default_read_timeout_ms")]
    pub read_timeout_ms: u64,
    /// How the relay resumes reading the binlog from its checkpoint.
    #[serde(default)]
    pub resume: ResumeMode,
}

/// `mysql.resume`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ResumeMode {
    /// By GTID when the checkpoint has a GTID position (MariaDB `@slave_connect_state`; MySQL
    /// `COM_BINLOG_DUMP_GTID`), else by binlog file and position.
    #[default]
    Auto,
    /// Always by GTID (an error when the checkpoint has none): lets the relay continue on another
    /// server of the same replication topology.
    Gtid,
    /// Always by binlog file and position.
    Position,
}

/// `mysql.tls_mode`: the MySQL client's `--ssl-mode` values, in lower case.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TlsMode {
    /// No TLS.
    #[default]
    Disabled,
    /// TLS when the server offers it, else a plain connection; the certificate is not checked.
    Preferred,
    /// TLS or no connection; the certificate is not checked (protects against eavesdropping,
    /// not against an impostor).
    Required,
    /// TLS with a server certificate signed by `tls_ca` (or a CA of the system trust store);
    /// the host name is not checked.
    VerifyCa,
    /// As `verify_ca`, and the certificate must be issued for the host of `mysql.url` (a DNS name,
    /// or an IP address in its subjectAltName).
    VerifyIdentity,
}

impl TlsMode {
    /// The value as written in the config file.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disabled => "disabled",
            Self::Preferred => "preferred",
            Self::Required => "required",
            Self::VerifyCa => "verify_ca",
            Self::VerifyIdentity => "verify_identity",
        }
    }
}

fn default_heartbeat_ms() -> u64 {
    5_000
}

fn default_read_timeout_ms() -> u64 {
    15_000
}

/// `[dead_letter]`: rows that cannot be relayed (a NULL aggregate, a topic Kafka refuses, a
/// record over `message.max.bytes`, an authorization failure).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct DeadLetterConfig {
    /// What to do with a row that cannot be relayed (NULL aggregate type or id, a value that cannot
    /// be converted, a partial row image, an INSERT logged as a statement, a NULL payload with
    /// `outbox.null_payload = "dead_letter"`, an UPDATE with `outbox.on_update = "fail"`, a topic
    /// name Kafka forbids, a record over `message.max.bytes` or its topic's `max.message.bytes`, a
    /// topic that is missing or not authorized). `false`: stop with an error naming the row's
    /// binlog position and table; the checkpoint stays before it. `true`: produce a dead-letter
    /// record to `topic` and continue.
    pub enabled: bool,
    /// The dead-letter topic. Its records carry the row's key, value (dropped when its size was the
    /// problem) and headers, plus `dlq_reason` (why, with the fix), `dlq_topic`, `dlq_binlog_file`,
    /// `dlq_binlog_pos`, `dlq_table`, `dlq_broker_error` when a broker refused the record, and
    /// `dlq_value_dropped: true` when the value was dropped for its size. `outbox-relay dlq replay`
    /// sends them again after the fix.
    pub topic: String,
    /// A record whose topic the brokers refuse: missing while they create none
    /// (`auto.create.topics.enable=false`), or not authorized to the relay's principal, as their
    /// metadata says before sending or a produce response says (then one producer restart later).
    /// Takes precedence over `enabled` for these records only. `hold` is for at-least-once only:
    /// refused with `kafka.delivery = "exactly_once"`.
    pub refused_topic: RefusedTopic,
    /// With `refused_topic = "hold"`: most records held in memory for one source, all held tables
    /// together. When reached, the relay stops reading the binlog (backpressure) until a held
    /// table's topic accepts its records; nothing is dropped. Checked before each binlog event, so
    /// the rows of one event may pass it.
    #[schemars(range(min = 1))]
    pub hold_max_records: usize,
}

impl Default for DeadLetterConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            topic: "outbox.dead_letter".into(),
            refused_topic: RefusedTopic::RowError,
            hold_max_records: 10_000,
        }
    }
}

/// `dead_letter.refused_topic`: what to do with a record whose topic the brokers refuse (see
/// [`DeadLetterConfig::refused_topic`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RefusedTopic {
    /// A row error like any other: dead-lettered when `dead_letter.enabled`, else the relay
    /// stops naming the row. The behaviour of earlier releases.
    #[default]
    RowError,
    /// Hold the record and every later record of its outbox table until the topic accepts;
    /// the checkpoint stays before the first held row. At-least-once sources only.
    Hold,
}

impl std::fmt::Debug for MysqlConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MysqlConfig")
            .field("url", &crate::error::redact_url(&self.url))
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("tls_mode", &self.tls_mode)
            .field("tls_ca", &self.tls_ca)
            .field("tls_cert", &self.tls_cert)
            .field("tls_key", &self.tls_key)
            .field("server_id", &self.server_id)
            .field("heartbeat_interval_ms", &self.heartbeat_interval_ms)
            .field("read_timeout_ms", &self.read_timeout_ms)
            .field("resume", &self.resume)
            .finish()
    }
}

/// `[outbox]`: the outbox tables and how their rows become Kafka records.
///
/// The mapping fields here (`columns`, `topic`, `headers`, `additional`, `null_payload`,
/// `on_update`, `timestamp`, `timestamp_refused`, `datetime_time_zone`, `binary_format`,
/// `key_format`) are the defaults of every
/// outbox table; a `[[outbox.table]]` entry overrides any of them for one table.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OutboxConfig {
    /// Whose record layout the relay writes.
    #[serde(default)]
    pub compat: debezium::Compat,
    /// Outbox tables as `database.table`, mapped with the defaults of this section. Every INSERT
    /// committed on one of them becomes one Kafka record; DELETEs are ignored, UPDATEs follow
    /// `on_update`. `tables` and `[[outbox.table]]` together name at least one table. A name with
    /// `*` (any run of characters) or `?` (one character) within the database or the table part is
    /// a pattern, e.g. `tenant_*.outbox`, `*.outbox`, `shop.outbox_*`: every matching table, also
    /// one created while the relay runs. Matching is case-sensitive; `_`, `%` and every other
    /// character are literal. A pattern may not match the checkpoint table's name.
    #[serde(default)]
    pub tables: Vec<String>,
    /// One outbox table (or a pattern of them, as in `tables`) with its own mapping: `name` plus
    /// any of the keys below, each overriding the `[outbox]` key of that name for this table
    /// (`columns` and `headers` merged key by key). A configured column missing from the table is a
    /// start-up error naming it (exit code 3).
    #[serde(default)]
    pub table: Vec<OutboxTableConfig>,
    /// The names of the outbox table's columns, when they differ from the common outbox shape.
    /// Columns not named here (`status`, `retry_count`, …) are ignored unless listed in
    /// `additional`.
    #[serde(default)]
    pub columns: ColumnMapping,
    /// Topic template. Placeholders: `{aggregate_type}`, `{event_type}`, `{database}` (alias
    /// `{schema}`, the matched name with patterns) and `{table}`, replaced by the row's values;
    /// without placeholders it is a fixed topic. Literal parts may use `a-z A-Z 0-9 . _ -`. The
    /// default is the naming of Debezium's outbox event router.
    #[serde(default = "default_topic")]
    pub topic: String,
    /// The names of the standard headers; `""` leaves a header out.
    #[serde(default)]
    pub headers: HeaderNames,
    /// Extra columns copied into the record: `[{ column = "tenant", placement = "header", alias =
    /// "tenant-id" }, { column = "version", placement = "envelope" }]`. With an `envelope`
    /// placement the value becomes `{"payload": <payload>, "<alias>": <value>, …}`: numbers as JSON
    /// numbers, NULL as `null`, text as strings; the payload embedded as JSON when it is JSON (a
    /// JSON column or text that parses as JSON), as a JSON string when it is other text; a binary
    /// payload cannot go into an envelope (dead letter or stop).
    #[serde(default)]
    pub additional: Vec<AdditionalColumn>,
    /// What a row whose payload is NULL becomes.
    #[serde(default)]
    pub null_payload: NullPayload,
    /// What an UPDATE of outbox rows does (outbox rows are insert-only: an UPDATE is usually a bug
    /// in the writer). DELETEs are always ignored: deleting relayed rows is how the outbox is kept
    /// small.
    #[serde(default)]
    pub on_update: OnUpdate,
    /// Where the record timestamp (Kafka `CreateTime`) comes from.
    #[serde(default)]
    pub timestamp: TimestampSource,
    /// With `timestamp = "column"`: what a `created_at` value the record's topic would refuse
    /// becomes: more than its `message.timestamp.after.max.ms` ahead of now (Kafka 4's default: one
    /// hour), more than its `message.timestamp.before.max.ms` behind, or not after 1970, read from
    /// the topic's configuration with a margin of a tenth of the limit, at most a minute.
    /// `LogAppendTime` topics refuse no timestamp.
    #[serde(default)]
    pub timestamp_refused: TimestampRefused,
    /// IANA time zone (`Europe/Berlin`) or `UTC` in which DATETIME `created_at` values are read;
    /// TIMESTAMP columns are UTC by definition. Independent of the relay's and the server's time
    /// zone. A local time in a daylight-saving gap is a row error; in an overlap the earlier
    /// instant is taken.
    #[serde(default = "default_zone")]
    pub datetime_time_zone: String,
    /// The text form of binary-string (`BINARY`, `VARBINARY`) values used as id, key, header or
    /// envelope field. Payloads are always raw bytes. `BINARY(n)` values get back the trailing 0x00
    /// bytes the binlog drops.
    #[serde(default)]
    pub binary_format: BinaryFormat,
    /// What the Kafka key holds.
    #[serde(default)]
    pub key_format: KeyFormat,
    /// An `XA COMMIT` whose `XA PREPARE` (which carries the transaction's rows) was logged before
    /// the point the relay started reading from, so its rows are unknown.
    #[serde(default)]
    pub unknown_xa_commit: UnknownXaCommit,
    /// CloudEvents 1.0 attributes as headers on every record (the Kafka protocol binding's binary
    /// content mode; the payload is untouched): `ce_specversion` `1.0`, `ce_id` (the `event_key`
    /// column, else `id`), `ce_source`, `ce_type` (the `event_type` column), `ce_subject` (the
    /// aggregate id), `ce_time` (the record timestamp, RFC 3339 UTC with ms), `content-type`.
    /// Applies to every outbox table. A row without an event type, or without both `event_key` and
    /// `id`, is a row error (dead letter or stop).
    #[serde(default)]
    pub cloudevents: CloudEventsConfig,
    /// W3C trace context: an outbox table with columns named `traceparent` and/or `tracestate` (any
    /// case) sends their values as headers `traceparent` / `tracestate` (NULL: no header), with no
    /// mapping; columns `additional` maps already follow that mapping. Found at start-up from
    /// `information_schema`: a column added later is picked up at the next start. `replay` (binlog
    /// files, no server) sends only mapped ones.
    #[serde(default = "default_trace_context")]
    pub trace_context: bool,
}

fn default_trace_context() -> bool {
    true
}

/// `[outbox.cloudevents]`: with `enabled`, every record also carries the CloudEvents 1.0
/// attributes as headers, per the CloudEvents Kafka protocol binding's binary content mode
/// (`ce_specversion` = `1.0`, `ce_id` = the `event_key` column (the `id` column when it has no
/// value), `ce_source` = `source`, `ce_type` = the `event_type` column, `ce_subject` = the
/// aggregate id, `ce_time` = the record timestamp in RFC 3339 (UTC, milliseconds), and
/// `content-type` = `content_type`); the value (the payload) is untouched. A row without
/// `event_type`, or without both `event_key` and `id`, cannot be a CloudEvent: a row error
/// (dead letter or stop).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CloudEventsConfig {
    /// Add the CloudEvents headers to every record.
    pub enabled: bool,
    /// `ce_source`: a URI-reference naming the producer of the events (`/shop/orders`,
    /// `urn:shop:orders`). Required when `enabled`.
    pub source: String,
    /// The `content-type` header (CloudEvents `datacontenttype`) of the payload; `""` leaves it
    /// out.
    pub content_type: String,
}

impl Default for CloudEventsConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            source: String::new(),
            content_type: "application/json".into(),
        }
    }
}

/// `outbox.unknown_xa_commit`: an `XA COMMIT` whose `XA PREPARE` (which carries the
/// transaction's rows) the relay has not read, because it was logged before the relay's start
/// point (e.g. a first start while an XA transaction was prepared).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum UnknownXaCommit {
    /// Stop with an error naming the XID and how to resume from before its `XA PREPARE`.
    #[default]
    Stop,
    /// Log a warning and go on: for servers whose XA transactions never write the outbox
    /// tables. Outbox rows such a transaction wrote would not be relayed.
    Skip,
}

fn default_topic() -> String {
    "outbox.event.{aggregate_type}".to_owned()
}

fn default_zone() -> String {
    "UTC".to_owned()
}

/// `[[outbox.table]]`: one outbox table with its own mapping. Every field but `name` is
/// optional and defaults to the `[outbox]` value; `columns` and `headers` are merged key by key.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OutboxTableConfig {
    /// The table as `database.table`, or a pattern of them (`tenant_*.outbox`, as in
    /// `outbox.tables`).
    pub name: String,
    /// Column names of this table that differ from `[outbox.columns]`; the others are taken from
    /// there.
    #[serde(default)]
    pub columns: PartialColumnMapping,
    /// Topic template for this table's records (as `outbox.topic`). Absent: `outbox.topic`.
    pub topic: Option<String>,
    /// Header names for this table that differ from `[outbox.headers]`; the others are taken from
    /// there.
    #[serde(default)]
    pub headers: PartialHeaderNames,
    /// Extra columns of this table (as `outbox.additional`); replaces the `[outbox]` list. Absent:
    /// `outbox.additional`.
    pub additional: Option<Vec<AdditionalColumn>>,
    /// As `outbox.null_payload`, for this table. Absent: `outbox.null_payload`.
    pub null_payload: Option<NullPayload>,
    /// As `outbox.on_update`, for this table. Absent: `outbox.on_update`.
    pub on_update: Option<OnUpdate>,
    /// As `outbox.timestamp`, for this table. Absent: `outbox.timestamp`.
    pub timestamp: Option<TimestampSource>,
    /// As `outbox.timestamp_refused`, for this table. Absent: `outbox.timestamp_refused`.
    pub timestamp_refused: Option<TimestampRefused>,
    /// As `outbox.datetime_time_zone`, for this table. Absent: `outbox.datetime_time_zone`.
    pub datetime_time_zone: Option<String>,
    /// As `outbox.binary_format`, for this table. Absent: `outbox.binary_format`.
    pub binary_format: Option<BinaryFormat>,
    /// As `outbox.key_format`, for this table. Absent: `outbox.key_format`.
    pub key_format: Option<KeyFormat>,
}

/// `[outbox.columns]`: names of the outbox columns. Columns not named here (`status`,
/// `retry_count`, …) are ignored unless listed in `additional`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ColumnMapping {
    /// The event id column, sent as header `id`.
    pub id: String,
    /// The aggregate type column: the topic template's `{aggregate_type}` and header
    /// `aggregate_type`. Must not be NULL.
    pub aggregate_type: String,
    /// The aggregate id column: the Kafka key (its text form, see `outbox.key_format`), so one
    /// aggregate's events stay in order on one partition. Must not be NULL.
    pub aggregate_id: String,
    /// The event type column, sent as header `event_type`.
    pub event_type: String,
    /// The consumers' idempotency key column, sent as header `event_key`.
    pub event_key: String,
    /// The payload column: the record value, bytes as stored (MySQL's JSON as MySQL prints it). A
    /// NULL follows `outbox.null_payload`.
    pub payload: String,
    /// The creation time column, DATETIME (read in `outbox.datetime_time_zone`) or TIMESTAMP (UTC):
    /// the record timestamp with `outbox.timestamp = "column"`, and what `prune` and `check` read.
    /// `""`: none.
    pub created_at: String,
    /// An optional integer column with an explicit partition number; NULL or `""` (no such column)
    /// lets the key choose the partition (`murmur2_random`). A partition the topic does not have is
    /// a permanent refusal (dead letter or stop).
    pub partition: String,
}

impl Default for ColumnMapping {
    fn default() -> Self {
        Self {
            id: "id".into(),
            aggregate_type: "aggregate_type".into(),
            aggregate_id: "aggregate_id".into(),
            event_type: "event_type".into(),
            event_key: "event_key".into(),
            payload: "payload".into(),
            created_at: "created_at".into(),
            partition: String::new(),
        }
    }
}

/// [`ColumnMapping`] with every field optional (`[[outbox.table]] columns`).
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PartialColumnMapping {
    /// This table's event id column. Absent: `outbox.columns.id`.
    pub id: Option<String>,
    /// This table's aggregate type column. Absent: `outbox.columns.aggregate_type`.
    pub aggregate_type: Option<String>,
    /// This table's aggregate id column (the key). Absent: `outbox.columns.aggregate_id`.
    pub aggregate_id: Option<String>,
    /// This table's event type column. Absent: `outbox.columns.event_type`.
    pub event_type: Option<String>,
    /// This table's idempotency key column. Absent: `outbox.columns.event_key`.
    pub event_key: Option<String>,
    /// This table's payload column. Absent: `outbox.columns.payload`.
    pub payload: Option<String>,
    /// This table's creation time column (`""`: none). Absent: `outbox.columns.created_at`.
    pub created_at: Option<String>,
    /// This table's partition column (`""`: none). Absent: `outbox.columns.partition`.
    pub partition: Option<String>,
}

impl PartialColumnMapping {
    /// `base` with the fields set here replaced.
    pub fn over(&self, base: &ColumnMapping) -> ColumnMapping {
        let pick = |o: &Option<String>, b: &String| o.clone().unwrap_or_else(|| b.clone());
        ColumnMapping {
            id: pick(&self.id, &base.id),
            aggregate_type: pick(&self.aggregate_type, &base.aggregate_type),
            aggregate_id: pick(&self.aggregate_id, &base.aggregate_id),
            event_type: pick(&self.event_type, &base.event_type),
            event_key: pick(&self.event_key, &base.event_key),
            payload: pick(&self.payload, &base.payload),
            created_at: pick(&self.created_at, &base.created_at),
            partition: pick(&self.partition, &base.partition),
        }
    }
}

/// `[outbox.headers]`: the names of the standard headers; `""` leaves a header out.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct HeaderNames {
    /// The header carrying the `id` column.
    pub id: Arc<str>,
    /// The header carrying the `event_key` column.
    pub event_key: Arc<str>,
    /// The header carrying the `event_type` column.
    pub event_type: Arc<str>,
    /// The header carrying the `aggregate_type` column.
    pub aggregate_type: Arc<str>,
}

impl Default for HeaderNames {
    fn default() -> Self {
        Self {
            id: "id".into(),
            event_key: "event_key".into(),
            event_type: "event_type".into(),
            aggregate_type: "aggregate_type".into(),
        }
    }
}

/// [`HeaderNames`] with every field optional.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PartialHeaderNames {
    /// This table's `id` header name (`""`: none). Absent: `outbox.headers.id`.
    pub id: Option<String>,
    /// This table's `event_key` header name (`""`: none). Absent: `outbox.headers.event_key`.
    pub event_key: Option<String>,
    /// This table's `event_type` header name (`""`: none). Absent: `outbox.headers.event_type`.
    pub event_type: Option<String>,
    /// This table's `aggregate_type` header name (`""`: none). Absent:
    /// `outbox.headers.aggregate_type`.
    pub aggregate_type: Option<String>,
}

impl PartialHeaderNames {
    /// `base` with the fields set here replaced.
    pub fn over(&self, base: &HeaderNames) -> HeaderNames {
        let pick =
            |o: &Option<String>, b: &Arc<str>| o.as_deref().map_or_else(|| b.clone(), Arc::from);
        HeaderNames {
            id: pick(&self.id, &base.id),
            event_key: pick(&self.event_key, &base.event_key),
            event_type: pick(&self.event_type, &base.event_type),
            aggregate_type: pick(&self.aggregate_type, &base.aggregate_type),
        }
    }
}

/// One `additional` entry: a column copied into the record (Debezium's
/// `table.fields.additional.placement`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AdditionalColumn {
    /// The column's name.
    pub column: String,
    /// Where the column's value goes.
    pub placement: Placement,
    /// The header's or the envelope field's name. Absent: the column's name.
    pub alias: Option<String>,
}

/// Where an additional column goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// A Kafka header with the column's text form (omitted when NULL).
    Header,
    /// A field of a JSON envelope `{"payload": <payload>, "<alias>": <value>, …}` that replaces
    /// the plain payload as the record value. Numbers stay numbers, NULL is `null`.
    Envelope,
}

/// `null_payload`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NullPayload {
    /// A record with a null value and the row's key (a Kafka tombstone).
    #[default]
    Tombstone,
    /// No record; a warning with the row's position is logged.
    Skip,
    /// The row goes to the dead-letter topic (or stops the relay when none is configured).
    DeadLetter,
}

/// `timestamp`: where a record's timestamp (Kafka `CreateTime`) comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TimestampSource {
    /// The source transaction's commit time from the binlog: MySQL 8's GTID event carries it in
    /// microseconds (`original_commit_timestamp`), otherwise the header time (whole seconds) of
    /// the transaction's first event (MariaDB's GTID event, written at commit). The default of
    /// Debezium's outbox event router too (the change event's source time).
    #[default]
    Commit,
    /// The `outbox.columns.created_at` column (DATETIME read in `datetime_time_zone`, TIMESTAMP
    /// as UTC); a value the topic would refuse follows `timestamp_refused`.
    Column,
}

/// `timestamp_refused`: a `created_at` value (with `timestamp = "column"`) that the record's
/// topic would refuse: more than its `message.timestamp.after.max.ms` in the future, more than
/// its `message.timestamp.before.max.ms` in the past, or negative (Kafka documentation, topic
/// configurations `message.timestamp.*`). Never applies to `LogAppendTime` topics, where the
/// broker sets the timestamp itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TimestampRefused {
    /// Send the record with the commit time instead, with header `timestamp_fallback` holding
    /// the refused value (ms since the epoch), counted by
    /// `outbox_relay_timestamp_fallbacks_total`.
    #[default]
    Commit,
    /// A row error: dead-lettered when `dead_letter.enabled`, else the relay stops naming it.
    RowError,
}

/// `on_update`: outbox rows are insert-only; an UPDATE is usually a bug in the writer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OnUpdate {
    /// Nothing is produced.
    #[default]
    Ignore,
    /// Nothing is produced; a warning names the position.
    Warn,
    /// The update is an error: dead-lettered when configured, else the relay stops.
    Fail,
}

/// `binary_format`: the text form of binary-string (`BINARY`, `VARBINARY`) values used as id,
/// key, header or envelope field. Payloads are always raw bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum BinaryFormat {
    /// 16-byte values as canonical UUID text (`3f2504e0-4f89-11d3-9a0c-0305e82c3301`, as
    /// MySQL's `BIN_TO_UUID`), other lengths as lowercase hex.
    #[default]
    Uuid,
    /// Lowercase hex of every byte (as `HEX()`, lowercased).
    Hex,
    /// The bytes as stored.
    Raw,
}

/// `key_format`: the Kafka key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum KeyFormat {
    /// The aggregate id's text form as UTF-8 (numbers in decimal, binary per `binary_format`,
    /// strings converted from their column character set).
    #[default]
    Text,
    /// The aggregate id's bytes as stored (strings in their column character set, binary as is;
    /// numbers still in decimal text).
    Raw,
}

/// `[kafka]`: the producer. Its `Debug` output shows secret properties
/// ([`crate::config::secrets::is_secret_property`]) as `***`.
#[derive(Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KafkaConfig {
    /// The brokers to connect to first, `host:port[,host:port…]` (librdkafka `bootstrap.servers`).
    pub bootstrap_servers: String,
    /// Most records sent but not yet acknowledged. When reached, reading the binlog pauses until
    /// Kafka acknowledges the oldest (backpressure; the reader thread has decoded at most 4,096
    /// events, about 2 MiB, ahead): this bounds the relay's memory.
    #[serde(default = "default_max_in_flight")]
    #[schemars(range(min = 1))]
    pub max_in_flight: usize,
    /// Extra librdkafka producer properties, names quoted: `"linger.ms" = "5"`, `"compression.type"
    /// = "zstd"` (`gzip`, `snappy`, `lz4`, `zstd`), TLS (`"security.protocol" = "ssl"`,
    /// `"ssl.ca.location"`, …) and SASL PLAIN / SCRAM (`"sasl.mechanisms"`, `"sasl.username"`,
    /// `"sasl.password"`). The relay's own defaults are `linger.ms=1` and
    /// `message.timeout.ms=120000`. Values may hold `${env:NAME}` / `${file:PATH}` references;
    /// values of secret keys (`*password*`, `*secret*`, `sasl.jaas.config`,
    /// `sasl.oauthbearer.config`, `ssl.key.pem`) are shown as `***` in logs. `enable.idempotence`,
    /// `enable.gapless.guarantee`, `acks`, `request.required.acks`, `partitioner`,
    /// `bootstrap.servers`, `transactional.id` and `transaction.timeout.ms` are set by the relay
    /// and refused here: they would weaken ordering or delivery.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// What a consumer may see after a relay crash.
    #[serde(default)]
    pub delivery: Delivery,
    /// Exactly-once: the producer's `transactional.id`. Keep it stable and give every connector its
    /// own: a new producer with the same id fences the older one. Absent:
    /// `outbox-relay.<connector_name>`.
    #[serde(default)]
    pub transactional_id: Option<String>,
    /// Exactly-once: the compacted topic of resume points, keyed by `connector_name`; created (1
    /// partition, `cleanup.policy=compact`) when missing. A start reads its last 1,000 offsets, and
    /// the whole topic only when the connector has no point there.
    #[serde(default = "default_progress_topic")]
    pub progress_topic: String,
    /// Exactly-once: the longest a Kafka transaction stays open while the relay is current; records
    /// are committed, with their resume point, at the first source transaction boundary after it (a
    /// current relay commits sooner, as soon as it has read everything the server sent). While the
    /// relay catches up (it reads events 2 s old or more) transactions stay open up to 2 s or their
    /// size bounds.
    #[serde(default = "default_transaction_interval_ms")]
    #[schemars(range(min = 1))]
    pub transaction_interval_ms: u64,
    /// Exactly-once: the most records (dead letters included) in one Kafka transaction; a larger
    /// source transaction spans several, each resume point saying how many of its rows are
    /// committed.
    #[serde(default = "default_transaction_max_records")]
    #[schemars(range(min = 1))]
    pub transaction_max_records: u64,
    /// Exactly-once: the most record bytes (key, value, headers) in one Kafka transaction.
    #[serde(default = "default_transaction_max_bytes")]
    #[schemars(range(min = 1))]
    pub transaction_max_bytes: u64,
    /// Exactly-once: librdkafka's `transaction.timeout.ms`, after which the broker aborts a
    /// transaction the relay left open (crash, hang). A transaction open for a quarter of it counts
    /// as full and is committed. At least 1000 and more than twice `transaction_interval_ms`; at
    /// most the brokers' `transaction.max.timeout.ms` (900000 by default; over it `check` fails and
    /// `run` stops with exit code 3).
    #[serde(default = "default_transaction_timeout_ms")]
    #[schemars(range(min = 1000))]
    pub transaction_timeout_ms: u64,
}

/// `kafka.delivery`: what a consumer may see after a relay crash.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    /// Idempotent producer, checkpoint in the state table after Kafka acknowledged: a restart
    /// may send again records sent after the last checkpoint.
    #[default]
    AtLeastOnce,
    /// Transactional producer, resume point inside the Kafka transaction: `read_committed`
    /// consumers see every outbox row exactly once.
    ExactlyOnce,
}

fn default_progress_topic() -> String {
    "outbox-relay.progress".into()
}

fn default_transaction_interval_ms() -> u64 {
    100
}

fn default_transaction_max_records() -> u64 {
    500_000
}

fn default_transaction_max_bytes() -> u64 {
    64 << 20
}

fn default_transaction_timeout_ms() -> u64 {
    60_000
}

impl std::fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaConfig")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .field("max_in_flight", &self.max_in_flight)
            .field("properties", &self.redacted_properties())
            .field("delivery", &self.delivery)
            .field("transactional_id", &self.transactional_id)
            .field("progress_topic", &self.progress_topic)
            .field("transaction_interval_ms", &self.transaction_interval_ms)
            .field("transaction_max_records", &self.transaction_max_records)
            .field("transaction_max_bytes", &self.transaction_max_bytes)
            .field("transaction_timeout_ms", &self.transaction_timeout_ms)
            .finish()
    }
}

impl Default for KafkaConfig {
    /// No bootstrap servers; every other key at its default.
    fn default() -> Self {
        Self {
            bootstrap_servers: String::new(),
            max_in_flight: default_max_in_flight(),
            properties: BTreeMap::new(),
            delivery: Delivery::default(),
            transactional_id: None,
            progress_topic: default_progress_topic(),
            transaction_interval_ms: default_transaction_interval_ms(),
            transaction_max_records: default_transaction_max_records(),
            transaction_max_bytes: default_transaction_max_bytes(),
            transaction_timeout_ms: default_transaction_timeout_ms(),
        }
    }
}

impl KafkaConfig {
    /// The `transactional.id` of exactly-once mode for `connector`: [`KafkaConfig::transactional_id`]
    /// or `outbox-relay.<connector>`.
    pub fn transactional_id_for(&self, connector: &str) -> String {
        self.transactional_id
            .clone()
            .unwrap_or_else(|| format!("outbox-relay.{connector}"))
    }

    /// `properties` with the values of secret keys replaced by `***`, for logs.
    pub fn redacted_properties(&self) -> BTreeMap<&str, &str> {
        self.properties
            .iter()
            .map(|(k, v)| {
                let v = if crate::config::secrets::is_secret_property(k) {
                    "***"
                } else {
                    v.as_str()
                };
                (k.as_str(), v)
            })
            .collect()
    }
}

fn default_max_in_flight() -> usize {
    10_000
}

/// `[checkpoint]`: the state table.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointConfig {
    /// The state table: `table` (in the database of `mysql.url`) or `database.table`. Create it
    /// with `outbox-relay migrate` (`migrations/0002_checkpoint.sql`).
    pub table: String,
    /// Least time between two checkpoint writes. A graceful stop always writes the final one.
    pub interval_ms: u64,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        Self {
            table: "outbox_relay_checkpoint".into(),
            interval_ms: 1000,
        }
    }
}

/// `[retry]`: capped exponential backoff for lost MySQL or Kafka connections.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// First delay before reconnecting after a MySQL or Kafka failure. At least 1 and at most
    /// `max_backoff_ms`.
    #[schemars(range(min = 1))]
    pub initial_backoff_ms: u64,
    /// Largest delay (exponential backoff with jitter in between).
    pub max_backoff_ms: u64,
    /// Consecutive failed attempts, of any cause (MySQL, Kafka, the lease, start-up checks), before
    /// giving up with exit code 1; `0` retries forever. An attempt succeeds once it has streamed
    /// for 10 s; one that never reaches streaming (Kafka unreachable at start-up) fails however
    /// long it took.
    pub max_attempts: usize,
    /// On SIGTERM/SIGINT, the longest wait for Kafka to acknowledge the records in flight before
    /// the final checkpoint write. After it (Kafka unreachable) the relay exits 0 with the last
    /// checkpoint whose records were all acknowledged; the rest are sent again on the next start
    /// (at least once).
    pub stop_timeout_ms: u64,
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            initial_backoff_ms: 500,
            max_backoff_ms: 30_000,
            max_attempts: 0,
            stop_timeout_ms: 30_000,
        }
    }
}

/// A `database.table` name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TableName {
    /// Schema (database) name.
    pub database: String,
    /// Table name.
    pub table: String,
}

impl TableName {
    /// Parses `database.table`; with `default_db`, a bare `table` is accepted too.
    ///
    /// # Errors
    /// [`RelayError::Config`] naming the bad value.
    pub fn parse(s: &str, default_db: Option<&str>) -> Result<Self, RelayError> {
        let parts: Vec<&str> = s.split('.').collect();
        match (parts.as_slice(), default_db) {
            ([db, t], _) if !db.is_empty() && !t.is_empty() => Ok(Self {
                database: (*db).to_owned(),
                table: (*t).to_owned(),
            }),
            ([t], Some(db)) if !t.is_empty() => Ok(Self {
                database: db.to_owned(),
                table: (*t).to_owned(),
            }),
            _ => Err(RelayError::Config(format!(
                "table name {s:?} is not of the form database.table{}",
                if default_db.is_some() {
                    " or table"
                } else {
                    ""
                }
            ))),
        }
    }

    /// The name quoted for SQL: `` `db`.`table` ``.
    pub fn quoted(&self) -> String {
        format!(
            "`{}`.`{}`",
            self.database.replace('`', "``"),
            self.table.replace('`', "``")
        )
    }
}

impl std::fmt::Display for TableName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.database, self.table)
    }
}

/// The message for a configuration file that is not there: where it was looked for, and how to
/// name another.
pub(crate) fn missing_file(path: &Path) -> String {
    let dir = std::env::current_dir()
        .map(|d| format!(" (looked in {})", d.display()))
        .unwrap_or_default();
    let shown = if path.is_absolute() {
        String::new()
    } else {
        dir
    };
    format!(
        "config file {} does not exist{shown}: save your configuration there, or pass its \
         path with --config PATH (or OUTBOX_RELAY_CONFIG=PATH); {} lists every key",
        path.display(),
        reference::REFERENCE_PATH
    )
}

/// Producer properties the relay sets itself; overriding them would break ordering or
/// at-least-once delivery.
pub const FIXED_PRODUCER_PROPERTIES: [&str; 8] = [
    "enable.idempotence",
    "transactional.id",
    "transaction.timeout.ms",
    "enable.gapless.guarantee",
    "acks",
    "request.required.acks",
    "partitioner",
    "bootstrap.servers",
];

impl RelayConfig {
    /// Loads `path` (TOML) and applies `OUTBOX_RELAY__…` environment overrides, then validates.
    ///
    /// # Errors
    /// [`RelayError::Config`] for a missing file, a TOML syntax error, an unknown key, a missing
    /// required key or an invalid value; the message names the key.
    pub fn load(path: &Path) -> Result<Self, RelayError> {
        if !path.exists() {
            return Err(RelayError::Config(missing_file(path)));
        }
        Self::from_figment(
            Figment::from(Toml::file_exact(path)),
            &explain::Places::file(path),
        )
    }

    /// Parses a TOML string (plus environment overrides) and validates it.
    ///
    /// # Errors
    /// As [`RelayConfig::load`].
    pub fn from_toml_str(toml: &str) -> Result<Self, RelayError> {
        let places = explain::Places(vec![explain::Place::text("", Some(toml), &[])]);
        Self::from_figment(Figment::from(Toml::string(toml)), &places)
    }

    pub(crate) fn from_figment(
        figment: Figment,
        places: &explain::Places,
    ) -> Result<Self, RelayError> {
        let mut config: Self = figment
            .merge(Env::prefixed(ENV_PREFIX).split("__"))
            .extract()
            .map_err(|e| places.error(e, &[]))?;
        config.resolve_secrets()?;
        if config.mysql.server_id == 0 {
            config.mysql.server_id = derived_server_id(&config.connector_name);
        }
        config.validate()?;
        Ok(config)
    }

    /// Replaces `${env:NAME}` and `${file:PATH}` references (see [`crate::config::secrets`]).
    fn resolve_secrets(&mut self) -> Result<(), RelayError> {
        use crate::config::secrets::resolve;
        self.mysql.url = resolve("mysql.url", &self.mysql.url)?;
        if let Some(p) = &self.mysql.password {
            self.mysql.password = Some(resolve("mysql.password", p)?);
        }
        for (key, value) in self.kafka.properties.iter_mut() {
            *value = resolve(&format!("kafka.properties.{key:?}"), value)?;
        }
        Ok(())
    }

    fn validate(&self) -> Result<(), RelayError> {
        let bad = |msg: String| Err(RelayError::Config(msg));
        self.validate_tls()?;
        // URL, password and TLS files, as every connection will use them.
        crate::config::mysql_tls::opts(&self.mysql)?;
        let ce = &self.outbox.cloudevents;
        if ce.enabled && ce.source.trim().is_empty() {
            return bad(
                "outbox.cloudevents.source is required with outbox.cloudevents.enabled: a \
                 URI-reference naming the producer of the events, e.g. \"/shop/orders\""
                    .into(),
            );
        }
        if self.connector_name.trim().is_empty() || self.connector_name.len() > 191 {
            return bad("connector_name must be 1 to 191 characters".into());
        }
        if self.mysql.server_id == 0 {
            return bad(
                "mysql.server_id must be a non-zero replica id, unique in the topology".into(),
            );
        }
        if self.mysql.heartbeat_interval_ms < 100
            || self.mysql.read_timeout_ms <= self.mysql.heartbeat_interval_ms
        {
            return bad(
                "mysql.heartbeat_interval_ms must be >= 100 and mysql.read_timeout_ms greater than it"
                    .into(),
            );
        }
        if self.dead_letter.enabled && topic::TopicTemplate::parse(&self.dead_letter.topic).is_err()
        {
            return bad(format!(
                "dead_letter.topic {:?} is not a valid Kafka topic name",
                self.dead_letter.topic
            ));
        }
        if self.dead_letter.refused_topic == RefusedTopic::Hold {
            if self.dead_letter.hold_max_records == 0 {
                return bad(
                    "dead_letter.hold_max_records must be at least 1 (the most records \
                     held in memory before reading the binlog pauses; default 10000)"
                        .into(),
                );
            }
            if self.kafka.delivery == Delivery::ExactlyOnce {
                return bad(
                    "dead_letter.refused_topic = \"hold\" cannot be combined with \
                     kafka.delivery = \"exactly_once\": while a table is held, the other \
                     tables' records after its first held row are committed to Kafka while \
                     the resume point stays before that row, so a restart would commit them a \
                     second time and read_committed consumers would see duplicates. Fix: set \
                     dead_letter.refused_topic = \"row_error\" (dead letters with \
                     dead_letter.enabled = true), or use kafka.delivery = \"at_least_once\""
                        .into(),
                );
            }
        }
        self.table_mappings()?;
        self.checkpoint_table()?;
        if self.kafka.max_in_flight == 0 {
            return bad("kafka.max_in_flight must be at least 1".into());
        }
        for key in self.kafka.properties.keys() {
            if FIXED_PRODUCER_PROPERTIES.contains(&key.as_str()) {
                return bad(format!(
                    "kafka.properties.{key:?} is set by the relay (idempotent producer, acks=all, \
                     murmur2_random partitioner; bootstrap servers from kafka.bootstrap_servers; \
                     transactional.id and transaction.timeout.ms from kafka.transactional_id and \
                     kafka.transaction_timeout_ms); remove it"
                ));
            }
        }
        if self.kafka.delivery == Delivery::ExactlyOnce {
            let k = &self.kafka;
            if topic::TopicTemplate::parse(&k.progress_topic).is_err()
                || k.progress_topic.contains('{')
            {
                return bad(format!(
                    "kafka.progress_topic {:?} is not a valid Kafka topic name",
                    k.progress_topic
                ));
            }
            if k.transactional_id
                .as_deref()
                .is_some_and(|t| t.trim().is_empty())
            {
                return bad(
                    "kafka.transactional_id must not be empty (leave it out for \
                            outbox-relay.<connector_name>)"
                        .into(),
                );
            }
            if k.transaction_interval_ms == 0
                || k.transaction_max_records == 0
                || k.transaction_max_bytes == 0
            {
                return bad(
                    "kafka.transaction_interval_ms, kafka.transaction_max_records and \
                            kafka.transaction_max_bytes must be at least 1"
                        .into(),
                );
            }
            if k.transaction_timeout_ms < 1_000
                || k.transaction_timeout_ms <= 2 * k.transaction_interval_ms
            {
                return bad(format!(
                    "kafka.transaction_timeout_ms ({}) must be at least 1000 and more than twice \
                     kafka.transaction_interval_ms ({}): a transaction is committed that often",
                    k.transaction_timeout_ms, k.transaction_interval_ms
                ));
            }
            if self.dead_letter.enabled && self.dead_letter.topic == k.progress_topic {
                return bad("dead_letter.topic and kafka.progress_topic must differ".into());
            }
        }
        if self.http.ready_kafka_ms < 3_000 {
            return bad(format!(
                "http.ready_kafka_ms ({}) must be at least 3000: the Kafka probe runs every \
                 third of it and waits that long for a broker",
                self.http.ready_kafka_ms
            ));
        }
        if self.http.enabled && self.http.ready_stall_ms <= self.mysql.heartbeat_interval_ms {
            return bad(format!(
                "http.ready_stall_ms ({}) must exceed mysql.heartbeat_interval_ms ({}): an idle \
                 source only sends a heartbeat that often",
                self.http.ready_stall_ms, self.mysql.heartbeat_interval_ms
            ));
        }
        let t = &self.tracing;
        if !(0.0..=1.0).contains(&t.sample_ratio) {
            return bad(format!(
                "tracing.sample_ratio ({}) must be between 0.0 and 1.0",
                t.sample_ratio
            ));
        }
        if t.export_timeout_ms == 0 || t.max_queue_size == 0 {
            return bad(
                "tracing.export_timeout_ms and tracing.max_queue_size must be at least 1".into(),
            );
        }
        if let Some(e) = t.otlp_endpoint.as_deref().filter(|e| !e.is_empty()) {
            if !(e.starts_with("http://") || e.starts_with("https://")) {
                return bad(format!(
                    "tracing.otlp_endpoint {e:?} must be an http:// or https:// URL of an \
                     OTLP/HTTP receiver (e.g. http://127.0.0.1:4318)"
                ));
            }
        }
        if self.retry.initial_backoff_ms == 0
            || self.retry.max_backoff_ms < self.retry.initial_backoff_ms
        {
            return bad("retry.initial_backoff_ms must be > 0 and <= retry.max_backoff_ms".into());
        }
        if let Some(c) = &self.cutover {
            c.validate()?;
        }
        Ok(())
    }

    fn validate_tls(&self) -> Result<(), RelayError> {
        let m = &self.mysql;
        let bad = |msg: String| Err(RelayError::Config(msg));
        match (&m.tls_cert, &m.tls_key) {
            (Some(_), None) => {
                return bad(
                    "mysql.tls_cert needs mysql.tls_key (the certificate's private key)".into(),
                )
            }
            (None, Some(_)) => {
                return bad("mysql.tls_key needs mysql.tls_cert (the client certificate)".into())
            }
            _ => {}
        }
        if m.tls_mode == TlsMode::Disabled && (m.tls_ca.is_some() || m.tls_cert.is_some()) {
            return bad(
                "mysql.tls_ca/tls_cert/tls_key are set but mysql.tls_mode is \"disabled\": set \
                 tls_mode = \"verify_identity\" (or verify_ca, required, preferred)"
                    .into(),
            );
        }
        if m.tls_ca.is_some() && matches!(m.tls_mode, TlsMode::Preferred | TlsMode::Required) {
            return bad(format!(
                "mysql.tls_ca is only used to verify the server's certificate, which tls_mode = \
                 \"{}\" does not do: set tls_mode = \"verify_ca\" or \"verify_identity\", or remove \
                 tls_ca",
                m.tls_mode.as_str()
            ));
        }
        Ok(())
    }

    /// The outbox tables, parsed (empty when the configuration is invalid, which
    /// [`RelayConfig::load`] already refused).
    pub fn outbox_tables(&self) -> Vec<TableName> {
        self.table_mappings()
            .map(|m| m.into_iter().map(|t| (*t.table).clone()).collect())
            .unwrap_or_default()
    }

    /// The database named in `mysql.url`, if any.
    pub fn url_database(&self) -> Option<String> {
        let opts = mysql_async::Opts::from_url(&self.mysql.url).ok()?;
        opts.db_name().map(str::to_owned)
    }

    /// The checkpoint table, resolved against the URL's database.
    ///
    /// # Errors
    /// [`RelayError::Config`] when the table has no database part and the URL names none.
    pub fn checkpoint_table(&self) -> Result<TableName, RelayError> {
        let db = self.url_database();
        TableName::parse(&self.checkpoint.table, db.as_deref()).map_err(|_| {
            RelayError::Config(format!(
                "checkpoint.table {:?} needs a database: write it as database.table or add the \
                 database to mysql.url (mysql://user@host:3306/database)",
                self.checkpoint.table
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
[mysql]
url = "mysql://root@127.0.0.1:3306/shop"
server_id = 4242
[outbox]
tables = ["shop.outbox"]
[kafka]
bootstrap_servers = "127.0.0.1:9092"
"#;

    #[test]
    fn minimal_config_gets_documented_defaults() {
        let c = RelayConfig::from_toml_str(MINIMAL).expect("valid");
        assert_eq!(c.connector_name, "outbox-relay");
        assert_eq!(c.outbox.topic, "outbox.event.{aggregate_type}");
        assert_eq!(c.outbox.columns.aggregate_id, "aggregate_id");
        assert_eq!(c.kafka.max_in_flight, 10_000);
        assert_eq!(c.checkpoint.interval_ms, 1000);
        assert!(c.http.enabled);
        assert_eq!(c.http.listen, "127.0.0.1:9719");
        assert_eq!(c.http.ready_stall_ms, 30_000);
        assert_eq!(
            c.checkpoint_table().expect("resolves").to_string(),
            "shop.outbox_relay_checkpoint"
        );
    }

    #[test]
    fn refused_topic_hold_is_validated() {
        let c = RelayConfig::from_toml_str(MINIMAL).expect("valid");
        assert_eq!(c.dead_letter.refused_topic, RefusedTopic::RowError);
        assert_eq!(c.dead_letter.hold_max_records, 10_000);
        let hold = format!("{MINIMAL}\n[dead_letter]\nrefused_topic = \"hold\"\n");
        let c = RelayConfig::from_toml_str(&hold).expect("valid");
        assert_eq!(c.dead_letter.refused_topic, RefusedTopic::Hold);
        let zero = format!("{hold}hold_max_records = 0\n");
        let err = RelayConfig::from_toml_str(&zero)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("dead_letter.hold_max_records"), "{err}");
        let eos = hold.replace(
            "bootstrap_servers = \"127.0.0.1:9092\"",
            "bootstrap_servers = \"127.0.0.1:9092\"\ndelivery = \"exactly_once\"",
        );
        let err = RelayConfig::from_toml_str(&eos)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("dead_letter.refused_topic") && err.contains("exactly_once"),
            "{err}"
        );
        let bad = format!("{MINIMAL}\n[dead_letter]\nrefused_topic = \"park\"\n");
        assert!(RelayConfig::from_toml_str(&bad).is_err());
    }

    #[test]
    fn cutover_section_parses_and_is_validated() {
        let c = RelayConfig::from_toml_str(MINIMAL).expect("valid");
        assert_eq!(c.cutover, None);
        let ok = format!(
            "{MINIMAL}\n[cutover]\nskip_if = \"status = 'SENT'\"\nuntil = \"2026-12-02 08:00:00\"\n"
        );
        let c = RelayConfig::from_toml_str(&ok)
            .expect("valid")
            .cutover
            .expect("set");
        assert_eq!(c.skip_if.as_deref(), Some("status = 'SENT'"));
        assert_eq!(c.skip_ids_through, None);
        // The whole second is inside the window.
        assert_eq!(c.until_ms().expect("parses"), 1_796_198_400_999);
        let ids = format!(
            "{MINIMAL}\n[cutover]\nskip_ids_through = 12345\nuntil = \"2026-12-02 08:00:00\"\n"
        );
        let c = RelayConfig::from_toml_str(&ids)
            .expect("valid")
            .cutover
            .expect("set");
        assert_eq!((c.skip_if, c.skip_ids_through), (None, Some(12345)));
        for (toml, named) in [
            ("until = \"2026-12-02 08:00:00\"\n", "cutover.skip_if"),
            (
                "skip_if = \" \"\nuntil = \"2026-12-02 08:00:00\"\n",
                "cutover.skip_if",
            ),
            (
                "skip_if = \"1; DROP TABLE x\"\nuntil = \"2026-12-02 08:00:00\"\n",
                "cutover.skip_if",
            ),
            ("skip_if = \"status = 'SENT'\"\n", "until"),
            (
                "skip_if = \"status = 'SENT'\"\nuntil = \"2026-12-02T08:00\"\n",
                "cutover.until",
            ),
            (
                "skip_if = \"a\"\nuntil = \"2026-12-02 08:00:00\"\nskip = 1\n",
                "skip",
            ),
        ] {
            let err = RelayConfig::from_toml_str(&format!("{MINIMAL}\n[cutover]\n{toml}"))
                .expect_err(toml)
                .to_string();
            assert!(err.contains(named), "{toml}: {err}");
        }
    }

    #[test]
    fn unknown_key_is_rejected_with_its_name() {
        let toml = MINIMAL.replace("bootstrap_servers", "bootstrap_server");
        let err = RelayConfig::from_toml_str(&toml)
            .expect_err("unknown key")
            .to_string();
        assert!(err.contains("bootstrap_server"), "{err}");
    }

    #[test]
    fn fixed_producer_property_is_rejected() {
        let toml = format!("{MINIMAL}\n[kafka.properties]\n\"acks\" = \"1\"\n");
        let err = RelayConfig::from_toml_str(&toml)
            .expect_err("acks is fixed")
            .to_string();
        assert!(err.contains("acks"), "{err}");
    }

    #[test]
    fn exactly_once_defaults_and_its_invalid_settings_are_named() {
        let c = RelayConfig::from_toml_str(&format!("{MINIMAL}delivery = \"exactly_once\"\n"))
            .expect("valid");
        assert_eq!(c.kafka.delivery, Delivery::ExactlyOnce);
        assert_eq!(
            c.kafka.transactional_id_for(&c.connector_name),
            "outbox-relay.outbox-relay"
        );
        assert_eq!(c.kafka.progress_topic, "outbox-relay.progress");
        assert_eq!(
            (
                c.kafka.transaction_interval_ms,
                c.kafka.transaction_max_records,
                c.kafka.transaction_timeout_ms
            ),
            (100, 500_000, 60_000)
        );
        for (line, named) in [
            (
                "transaction_timeout_ms = 150",
                "kafka.transaction_timeout_ms",
            ),
            (
                "transaction_max_records = 0",
                "kafka.transaction_max_records",
            ),
            ("progress_topic = \"bad topic\"", "kafka.progress_topic"),
            ("transactional_id = \" \"", "kafka.transactional_id"),
        ] {
            let toml = format!("{MINIMAL}delivery = \"exactly_once\"\n{line}\n");
            let err = RelayConfig::from_toml_str(&toml)
                .expect_err(line)
                .to_string();
            assert!(err.contains(named), "{line}: {err}");
        }
        let toml = format!("{MINIMAL}\n[kafka.properties]\n\"transactional.id\" = \"x\"\n");
        let err = RelayConfig::from_toml_str(&toml)
            .expect_err("transactional.id is set by the relay")
            .to_string();
        assert!(err.contains("kafka.transactional_id"), "{err}");
        let err = RelayConfig::from_toml_str(&format!("{MINIMAL}delivery = \"twice\"\n"))
            .expect_err("unknown mode")
            .to_string();
        assert!(err.contains("delivery"), "{err}");
    }

    #[test]
    fn checkpoint_table_needs_a_database() {
        let toml = MINIMAL.replace("3306/shop", "3306");
        let err = RelayConfig::from_toml_str(&toml)
            .expect_err("no db")
            .to_string();
        assert!(err.contains("checkpoint.table"), "{err}");
    }

    #[test]
    fn debug_output_hides_every_secret() {
        std::env::set_var("OUTBOX_RELAY_TEST_KAFKA_PW", "kafka-s3cret");
        let toml = format!(
            "{}\n[kafka.properties]\n\"sasl.username\" = \"relay\"\n\
             \"sasl.password\" = \"${{env:OUTBOX_RELAY_TEST_KAFKA_PW}}\"\n\
             \"ssl.key.password\" = \"key-s3cret\"\n",
            MINIMAL.replace("root@", "root:url-s3cret@").replace(
                "server_id = 4242",
                "server_id = 4242\npassword = \"pw-s3cret\""
            )
        );
        let c = RelayConfig::from_toml_str(&toml).expect("valid");
        assert_eq!(c.kafka.properties["sasl.password"], "kafka-s3cret");
        let debug = format!("{c:?}");
        for secret in ["url-s3cret", "pw-s3cret", "kafka-s3cret", "key-s3cret"] {
            assert!(!debug.contains(secret), "{secret} in {debug}");
        }
        assert!(debug.contains("\"sasl.username\": \"relay\""), "{debug}");
        assert!(debug.contains("\"sasl.password\": \"***\""), "{debug}");
    }

    #[test]
    fn unresolvable_secret_reference_names_the_key_not_the_value() {
        let toml = format!(
            "{MINIMAL}\n[kafka.properties]\n\"sasl.password\" = \"${{file:/nonexistent/kafka-pw}}\"\n"
        );
        let err = RelayConfig::from_toml_str(&toml)
            .expect_err("missing file")
            .to_string();
        assert!(
            err.starts_with(
                "configuration error: kafka.properties.\"sasl.password\": cannot read secret \
                 file /nonexistent/kafka-pw"
            ),
            "{err}"
        );
        let toml = MINIMAL.replace(
            "server_id = 4242",
            "server_id = 4242\npassword = \"${env:OUTBOX_RELAY_TEST_UNSET_PW}\"",
        );
        let err = RelayConfig::from_toml_str(&toml)
            .expect_err("unset variable")
            .to_string();
        assert_eq!(
            err,
            "configuration error: mysql.password: environment variable \
             OUTBOX_RELAY_TEST_UNSET_PW (referenced as ${env:OUTBOX_RELAY_TEST_UNSET_PW}) is not set"
        );
    }

    #[test]
    fn bad_outbox_table_name_is_rejected() {
        let toml = MINIMAL.replace("\"shop.outbox\"", "\"outbox\"");
        let err = RelayConfig::from_toml_str(&toml)
            .expect_err("bare name")
            .to_string();
        assert!(err.contains("database.table"), "{err}");
    }

    #[test]
    fn http_section_is_read_and_checked() {
        let toml = format!(
            "{MINIMAL}\n[http]\nenabled = false\nlisten = \"0.0.0.0:9000\"\nready_stall_ms = 60000\n"
        );
        let c = RelayConfig::from_toml_str(&toml).expect("valid");
        assert!(!c.http.enabled);
        assert_eq!(c.http.listen, "0.0.0.0:9000");
        assert_eq!(c.http.ready_stall_ms, 60_000);
        let toml = format!("{MINIMAL}\n[http]\nready_stall_ms = 5000\n");
        let err = RelayConfig::from_toml_str(&toml)
            .expect_err("not above the heartbeat")
            .to_string();
        assert!(
            err.contains(
                "http.ready_stall_ms (5000) must exceed mysql.heartbeat_interval_ms (5000)"
            ),
            "{err}"
        );
    }

    #[test]
    fn debug_dump_hides_passwords() {
        let toml = MINIMAL.replace("root@", "relay:Pa55word@")
            + "\n[kafka.properties]\n\"sasl.password\" = \"KafkaSecret\"\n\"linger.ms\" = \"5\"\n";
        let c = RelayConfig::from_toml_str(&toml).expect("valid");
        let dump = format!("{c:?}");
        assert!(!dump.contains("Pa55word"), "{dump}");
        assert!(!dump.contains("KafkaSecret"), "{dump}");
        assert!(
            dump.contains("mysql://relay:***@127.0.0.1:3306/shop"),
            "{dump}"
        );
        assert!(dump.contains("\"linger.ms\": \"5\""), "{dump}");
    }
}
