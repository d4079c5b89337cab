//! Relay configuration: a TOML file plus `OUTBOX_RELAY__SECTION__KEY` environment overrides.
//!
//! Every section rejects unknown keys, so a typo (`bootstrap_server`) is an error at start-up
//! instead of a silently ignored setting. Defaults are the values documented in the README's
//! configuration reference and on each field below.

pub mod debezium;
pub mod mysql_tls;
pub mod process;
pub mod secrets;
pub mod topic;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use figment::providers::{Env, Format, Toml};
use figment::Figment;
use serde::Deserialize;

use crate::error::RelayError;

/// Environment variable prefix for overrides; nested keys are separated by `__`
/// (`OUTBOX_RELAY__KAFKA__BOOTSTRAP_SERVERS=broker:9092`).
pub const ENV_PREFIX: &str = "OUTBOX_RELAY__";

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelayConfig {
    /// Name of this connector. Keys its row in the checkpoint table, so two connectors with
    /// different names can follow the same server independently. Default `outbox-relay`.
    #[serde(default = "default_connector_name")]
    pub connector_name: String,
    /// Source server (MySQL or MariaDB) settings.
    pub mysql: MysqlConfig,
    /// Which tables are outboxes and how their columns map to the Kafka record.
    pub outbox: OutboxConfig,
    /// Kafka producer settings.
    pub kafka: KafkaConfig,
    /// Where and how often the checkpoint is written.
    #[serde(default)]
    pub checkpoint: CheckpointConfig,
    /// Reconnect/backoff policy for MySQL and Kafka failures.
    #[serde(default)]
    pub retry: RetryConfig,
    /// What to do with a row that cannot be relayed.
    #[serde(default)]
    pub dead_letter: DeadLetterConfig,
    /// The HTTP endpoints: Prometheus metrics, liveness and readiness.
    #[serde(default)]
    pub http: HttpConfig,
    /// Taking over from a polling relay: rows it already sent are not produced again.
    #[serde(default)]
    pub cutover: Option<CutoverConfig>,
    /// OpenTelemetry spans of relayed rows, exported over OTLP (off by default).
    #[serde(default)]
    pub tracing: TracingConfig,
    /// The acknowledgement audit (off by default).
    #[serde(default)]
    pub audit: AuditConfig,
    /// `[debezium]`: the Debezium profile's settings, used with `[outbox] compat = "debezium"`.
    #[serde(default)]
    pub debezium: debezium::DebeziumConfig,
}

/// `[audit]`: a record of what Kafka acknowledged, to be checked against the log
/// ([`crate::observe::audit`]).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// A file the relay appends one JSON line to per acknowledged record and dead letter
    /// (topic, partition, offset, event_key, binlog position). Absent: no audit. Each
    /// acknowledged offset can then be read back (the fault matrix and `make soak` do).
    /// Environment: `OUTBOX_RELAY__AUDIT__ACKS_FILE`.
    pub acks_file: Option<PathBuf>,
    /// With `acks_file`: each record's line also gives when the relay read its binlog event,
    /// handed it to the producer and got its acknowledgement (`read_us`, `sent_us`, `acked_us`:
    /// wall-clock microseconds since the Unix epoch), and each Kafka transaction the
    /// exactly-once relay commits gets a line `{"kind":"commit","committed_us":...}`. For a
    /// latency budget per stage (`make bench` uses it); off by default, and without
    /// `acks_file` nothing is timed. Environment: `OUTBOX_RELAY__AUDIT__TIMINGS`.
    pub timings: bool,
}

/// `[cutover]`: the first runs after a polling relay (one that marks outbox rows `SENT` in a
/// `status` column) skip the rows it already sent. While the relay reads transactions that
/// committed at or before `until`, each transaction's outbox rows are checked against the
/// table's current state; the rows that match are not produced (they still move the
/// checkpoint), every other row is. See the README's "Cutover from a polling relay".
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CutoverConfig {
    /// SQL condition on an outbox table's columns (`status = 'SENT'`) that holds for rows the
    /// previous relay sent, evaluated on the row's current state: `SELECT id FROM t WHERE id IN
    /// (…) AND (skip_if)`, one query per source transaction and table. Checked against every
    /// outbox table at start-up.
    #[serde(default)]
    pub skip_if: Option<String>,
    /// Id watermark: rows whose integer `id` is at most this were sent by the previous relay
    /// and are skipped without a query. The id column must be an integer column.
    #[serde(default)]
    pub skip_ids_through: Option<i64>,
    /// `YYYY-MM-DD HH:MM:SS` (UTC): transactions that committed after this (their commit time
    /// in the binlog) are relayed without checks: the previous relay was stopped before it.
    /// Once the relay reads the first such transaction, the cutover window is over.
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
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TracingConfig {
    /// Base URL of an OTLP/HTTP receiver (`http://collector:4318`); spans go to
    /// `<endpoint>/v1/traces`. Absent: the standard `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used
    /// as is) or `OTEL_EXPORTER_OTLP_ENDPOINT` (plus `/v1/traces`) when either is set, else off.
    /// `""`: off, whatever the environment says.
    pub otlp_endpoint: Option<String>,
    /// The `service.name` resource attribute. Absent: `OTEL_SERVICE_NAME`, else `outbox-relay`.
    pub service_name: Option<String>,
    /// Share of new traces recorded, 0.0 to 1.0 (a row without `traceparent`); a row with one
    /// follows its parent's sampled flag. Default 1.0.
    pub sample_ratio: f64,
    /// Longest wait for one export request, in ms. Default 10000.
    pub export_timeout_ms: u64,
    /// Most finished spans waiting for export; beyond it new spans are dropped (the relay never
    /// waits for the receiver). Default 8192.
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
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Serve the endpoints. Default `true`.
    pub enabled: bool,
    /// `IP:port` to listen on. Default `127.0.0.1:9719` (loopback only; `0.0.0.0:9719` to be
    /// scraped from other hosts). Port 0 picks a free port (logged at start-up). A port in use
    /// is a configuration error at start-up.
    pub listen: String,
    /// `/readyz` answers 503 when no binlog event or heartbeat was read for this long, in ms
    /// (the stream is stalled, or reading waits for Kafka). Must exceed
    /// `mysql.heartbeat_interval_ms`. Default 30000.
    pub ready_stall_ms: u64,
    /// `/readyz` answers 503 when no Kafka broker answered the relay's metadata probe for this
    /// long, in ms, also while no rows flow (the probe runs every third of it while streaming).
    /// At least 3000. Default 30000.
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
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MysqlConfig {
    /// Connection URL, `mysql://user:password@host:port/database`. The database part is where the
    /// checkpoint table lives unless `checkpoint.table` names one. May hold `${env:NAME}` and
    /// `${file:PATH}` references ([`crate::config::secrets`]). Never logged.
    pub url: String,
    /// The user's password, taken literally (no percent-encoding); replaces a password in
    /// `url`. May hold `${env:NAME}` and `${file:PATH}` references. Never logged. Default: the
    /// URL's password.
    #[serde(default)]
    pub password: Option<String>,
    /// TLS to the server, after the MySQL client's `--ssl-mode`: `disabled` (default),
    /// `preferred`, `required`, `verify_ca` or `verify_identity` (see [`TlsMode`]).
    #[serde(default)]
    pub tls_mode: TlsMode,
    /// PEM file of the CA(s) that signed the server's certificate (the server's `ssl_ca`);
    /// with `verify_ca`/`verify_identity` only. Default: the system trust store.
    #[serde(default)]
    pub tls_ca: Option<PathBuf>,
    /// PEM file of the client certificate (followed by any intermediates), for users created
    /// `REQUIRE X509`; needs `tls_key` and a `tls_mode` other than `disabled`.
    #[serde(default)]
    pub tls_cert: Option<PathBuf>,
    /// PEM file of the client certificate's unencrypted private key.
    #[serde(default)]
    pub tls_key: Option<PathBuf>,
    /// The `server_id` this relay registers with as a replica (COM_REGISTER_SLAVE). Must differ
    /// from every server and replica in the topology: the server drops an older connection that
    /// uses the same id. Default (absent or 0): derived from the connector name
    /// ([`derived_server_id`]), stable across restarts and processes.
    #[serde(default)]
    pub server_id: u32,
    /// Heartbeat period the server is asked for (`@master_heartbeat_period`), in ms. The server
    /// sends a heartbeat when it has had nothing else to send for this long. Default 5000.
    #[serde(default = "default_heartbeat_ms")]
    pub heartbeat_interval_ms: u64,
    /// Silence (no event, no heartbeat) after which the connection is presumed dead and the
    /// relay reconnects, in ms. Must exceed `heartbeat_interval_ms`. Default 15000.
    #[serde(default = "default_read_timeout_ms")]
    pub read_timeout_ms: u64,
    /// How to resume: `auto` (by GTID when the checkpoint has one and the server is MariaDB,
    /// else by file and position), `gtid`, or `position`. GTIDs let the relay continue on
    /// another server of the same replication topology. Default `auto`.
    #[serde(default)]
    pub resume: ResumeMode,
}

/// `mysql.resume`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResumeMode {
    /// GTID when available, else position.
    #[default]
    Auto,
    /// Always by GTID; an error when the checkpoint has none.
    Gtid,
    /// Always by binlog file and position.
    Position,
}

/// `mysql.tls_mode`: the MySQL client's `--ssl-mode` values, in lower case.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
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
    /// As `verify_ca`, and the certificate must be issued for the host of `mysql.url` (a DNS
    /// name, or an IP address in its subjectAltName).
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
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeadLetterConfig {
    /// `false` (default): stop the relay with an error naming the row's binlog position;
    /// the checkpoint stays before it. `true`: produce a dead-letter record to `topic`, with
    /// headers saying why and where, and continue.
    pub enabled: bool,
    /// Dead-letter topic. Default `outbox.dead_letter`.
    pub topic: String,
    /// A record whose topic the brokers refuse (missing while they create no topics, or not
    /// authorized), as learnt from their metadata before sending or from a produce response
    /// (then one producer restart later): `row_error` (default) treats
    /// it as any row error (`enabled` decides: dead letter or stop); `hold` parks that record
    /// and every later record of the same outbox table (`database.table`) in memory, in
    /// order, while the other tables go on, and retries the table with the `[retry]` backoff
    /// until its topic accepts. Takes precedence over `enabled` for such records only.
    pub refused_topic: RefusedTopic,
    /// With `refused_topic = "hold"`: most records held in memory for one source (all held
    /// tables together). When reached, the relay stops reading the binlog (backpressure) until
    /// a held table is released; nothing is dropped. Checked before each binlog event, so one
    /// event's rows may pass it. Default 10000; at least 1.
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
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
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutboxConfig {
    /// Whose record layout: `relay` (default) or `debezium` (Debezium's outbox event router
    /// and the worker's converters, set in `[debezium]`; its column names and defaults replace
    /// `columns`, `headers`, `additional` and `topic`, which must then stay unset).
    #[serde(default)]
    pub compat: debezium::Compat,
    /// Outbox tables as `database.table`, mapped with the defaults of this section. Every INSERT
    /// committed on one of them becomes one Kafka record; DELETEs are ignored, UPDATEs follow
    /// `on_update`. Default empty; `tables` and `table` together name at least one table.
    /// A name with `*` (any run of characters) or `?` (one character) in a part is a pattern
    /// (`tenant_*.outbox`): every matching table, also one created while the relay runs
    /// ([`crate::outbox::pattern`]).
    #[serde(default)]
    pub tables: Vec<String>,
    /// `[[outbox.table]]`: outbox tables with their own mapping (overrides of this section).
    #[serde(default)]
    pub table: Vec<OutboxTableConfig>,
    /// Column mapping (defaults follow the common outbox shape).
    #[serde(default)]
    pub columns: ColumnMapping,
    /// Topic template. `{aggregate_type}`, `{event_type}`, `{database}` (alias `{schema}`) and
    /// `{table}` are replaced by the row's values; a template without placeholders is a fixed topic. Default
    /// `outbox.event.{aggregate_type}` (the naming of Debezium's outbox event router).
    #[serde(default = "default_topic")]
    pub topic: String,
    /// Names of the standard headers.
    #[serde(default)]
    pub headers: HeaderNames,
    /// Extra columns copied into a header or into an envelope around the payload.
    #[serde(default)]
    pub additional: Vec<AdditionalColumn>,
    /// What a row whose payload is NULL becomes. Default `tombstone`.
    #[serde(default)]
    pub null_payload: NullPayload,
    /// What an UPDATE of an outbox row does. Default `ignore`.
    #[serde(default)]
    pub on_update: OnUpdate,
    /// Where the record timestamp comes from. Default `commit`: the source transaction's
    /// commit time from the binlog.
    #[serde(default)]
    pub timestamp: TimestampSource,
    /// With `timestamp = "column"`: what a column value the topic would refuse becomes.
    /// Default `commit`.
    #[serde(default)]
    pub timestamp_refused: TimestampRefused,
    /// Time zone in which DATETIME `created_at` values are read: an IANA name
    /// (`Europe/Berlin`) or `UTC`. TIMESTAMP columns are UTC by definition. Default `UTC`.
    #[serde(default = "default_zone")]
    pub datetime_time_zone: String,
    /// How binary (`BINARY`, `VARBINARY`) id, key and header columns become text. Default `uuid`.
    #[serde(default)]
    pub binary_format: BinaryFormat,
    /// What the Kafka key holds. Default `text`.
    #[serde(default)]
    pub key_format: KeyFormat,
    /// What to do with an `XA COMMIT` whose `XA PREPARE` was logged before the point the relay
    /// started reading from (its rows are unknown). Default `stop`.
    #[serde(default)]
    pub unknown_xa_commit: UnknownXaCommit,
    /// `[outbox.cloudevents]`: CloudEvents headers on every record (binary content mode).
    #[serde(default)]
    pub cloudevents: CloudEventsConfig,
    /// W3C trace context: when an outbox table has columns named `traceparent` and/or
    /// `tracestate` (any case) that `additional` does not already map, `run` sends their values
    /// as headers of those names (NULLs left out, like any header column). Found at start-up
    /// from information_schema (W3C Trace Context, "traceparent Header" / "tracestate Header").
    /// Default `true`.
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
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CloudEventsConfig {
    /// Add the headers. Default `false`.
    pub enabled: bool,
    /// `ce_source`: a URI-reference naming the context that produced the events (for example
    /// `/shop/orders` or `urn:shop:orders`). Required when enabled.
    pub source: String,
    /// `content-type` (CloudEvents `datacontenttype`) of the payload. Default
    /// `application/json`; `""` leaves the header out.
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
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
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutboxTableConfig {
    /// `database.table`, or a pattern of them (see [`OutboxConfig::tables`]).
    pub name: String,
    /// Column names that differ from `[outbox.columns]`.
    #[serde(default)]
    pub columns: PartialColumnMapping,
    /// Topic template for this table.
    pub topic: Option<String>,
    /// Header names that differ from `[outbox.headers]`.
    #[serde(default)]
    pub headers: PartialHeaderNames,
    /// Extra columns for this table (replaces `[outbox] additional`).
    pub additional: Option<Vec<AdditionalColumn>>,
    /// See [`OutboxConfig::null_payload`].
    pub null_payload: Option<NullPayload>,
    /// See [`OutboxConfig::on_update`].
    pub on_update: Option<OnUpdate>,
    /// See [`OutboxConfig::timestamp`].
    pub timestamp: Option<TimestampSource>,
    /// See [`OutboxConfig::timestamp_refused`].
    pub timestamp_refused: Option<TimestampRefused>,
    /// See [`OutboxConfig::datetime_time_zone`].
    pub datetime_time_zone: Option<String>,
    /// See [`OutboxConfig::binary_format`].
    pub binary_format: Option<BinaryFormat>,
    /// See [`OutboxConfig::key_format`].
    pub key_format: Option<KeyFormat>,
}

/// `[outbox.columns]`: names of the outbox columns. Columns not named here (`status`,
/// `retry_count`, …) are ignored unless listed in `additional`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ColumnMapping {
    /// Event id; sent as header `id`. Default `id`.
    pub id: String,
    /// Aggregate type; used by the topic template and sent as header `aggregate_type`.
    /// Default `aggregate_type`.
    pub aggregate_type: String,
    /// Aggregate id; the Kafka key (its text form, see `key_format`). Default `aggregate_id`.
    pub aggregate_id: String,
    /// Event type; sent as header `event_type`. Default `event_type`.
    pub event_type: String,
    /// Consumers' idempotency key; sent as header `event_key`. Default `event_key`.
    pub event_key: String,
    /// Payload; the Kafka value, bytes as stored (MySQL JSON as MySQL prints it). Default
    /// `payload`.
    pub payload: String,
    /// Creation time (DATETIME read in `datetime_time_zone`, or TIMESTAMP): the Kafka record
    /// timestamp with `timestamp = "column"`, and what `prune` and `check` read. `""`: none.
    /// Default `created_at`.
    pub created_at: String,
    /// Optional integer column holding an explicit partition number; NULL or `""` (default)
    /// lets the key choose the partition.
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
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[allow(missing_docs)]
pub struct PartialColumnMapping {
    pub id: Option<String>,
    pub aggregate_type: Option<String>,
    pub aggregate_id: Option<String>,
    pub event_type: Option<String>,
    pub event_key: Option<String>,
    pub payload: Option<String>,
    pub created_at: Option<String>,
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
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HeaderNames {
    /// Header carrying the `id` column. Default `id`. (Shared, not copied, by every record.)
    pub id: Arc<str>,
    /// Header carrying the `event_key` column. Default `event_key`.
    pub event_key: Arc<str>,
    /// Header carrying the `event_type` column. Default `event_type`.
    pub event_type: Arc<str>,
    /// Header carrying the `aggregate_type` column. Default `aggregate_type`.
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
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[allow(missing_docs)]
pub struct PartialHeaderNames {
    pub id: Option<String>,
    pub event_key: Option<String>,
    pub event_type: Option<String>,
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
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdditionalColumn {
    /// Column name.
    pub column: String,
    /// `header` or `envelope`.
    pub placement: Placement,
    /// Header or envelope field name. Default: the column name.
    pub alias: Option<String>,
}

/// Where an additional column goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// A Kafka header with the column's text form (omitted when NULL).
    Header,
    /// A field of a JSON envelope `{"payload": <payload>, "<alias>": <value>, …}` that replaces
    /// the plain payload as the record value. Numbers stay numbers, NULL is `null`.
    Envelope,
}

/// `null_payload`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
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
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaConfig {
    /// Comma-separated `host:port` list (librdkafka `bootstrap.servers`).
    pub bootstrap_servers: String,
    /// Most records produced but not yet acknowledged; when reached, reading the binlog pauses
    /// until Kafka acknowledges the oldest. Default 10000.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// Extra librdkafka producer properties (`"linger.ms" = "5"`, `"compression.type" =
    /// "zstd"`, security settings). They may not weaken the delivery guarantees:
    /// `enable.idempotence`, `acks` and `partitioner` are fixed by the relay and rejected here.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// `"at_least_once"` (default: an idempotent producer; a restart may send again what was
    /// sent after the last checkpoint) or `"exactly_once"` (a transactional producer that writes
    /// the resume point to [`KafkaConfig::progress_topic`] inside the Kafka transaction of the
    /// records it covers: a `read_committed` consumer sees every outbox row once).
    #[serde(default)]
    pub delivery: Delivery,
    /// Exactly-once: the producer's `transactional.id`. Default `outbox-relay.<connector_name>`:
    /// stable across restarts and instances, so a new instance fences an old one
    /// (`InitProducerId`, KIP-98).
    #[serde(default)]
    pub transactional_id: Option<String>,
    /// Exactly-once: the compacted topic holding each connector's resume point, keyed by
    /// `connector_name`. Default `outbox-relay.progress`; created (1 partition,
    /// `cleanup.policy=compact`) when missing.
    #[serde(default = "default_progress_topic")]
    pub progress_topic: String,
    /// Exactly-once: the longest a Kafka transaction stays open while the relay is current, in
    /// ms: records are committed (with their resume point) at the first transaction boundary
    /// after this long. Default 100. A consumer reading `read_committed` sees a record about this
    /// long after the relay read it, at most. While the relay catches up (the events it reads
    /// are 2 s old or more) transactions stay open up to 1 s or their size bounds.
    #[serde(default = "default_transaction_interval_ms")]
    pub transaction_interval_ms: u64,
    /// Exactly-once: the most records (dead letters included) in one Kafka transaction; a source
    /// transaction with more spans several, the resume point saying how many of its rows are
    /// committed. Default 500000.
    #[serde(default = "default_transaction_max_records")]
    pub transaction_max_records: u64,
    /// Exactly-once: the most record bytes (key, value, headers) in one Kafka transaction.
    /// Default 67108864 (64 MiB).
    #[serde(default = "default_transaction_max_bytes")]
    pub transaction_max_bytes: u64,
    /// Exactly-once: `transaction.timeout.ms`, in ms: a transaction the relay leaves open longer
    /// (it hung or died) is aborted by the broker. Default 60000; at most the broker's
    /// `transaction.max.timeout.ms` (900000 by default).
    #[serde(default = "default_transaction_timeout_ms")]
    pub transaction_timeout_ms: u64,
}

/// `kafka.delivery`: what a consumer may see after a relay crash.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
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
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointConfig {
    /// Checkpoint table, `table` (in the database of `mysql.url`) or `database.table`.
    /// Default `outbox_relay_checkpoint`. Create it with `migrations/0002_checkpoint.sql`.
    pub table: String,
    /// Least time between two checkpoint writes, in ms. Default 1000. A graceful stop always
    /// writes the final checkpoint.
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
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// First delay, in ms. Default 500.
    pub initial_backoff_ms: u64,
    /// Largest delay, in ms. Default 30000.
    pub max_backoff_ms: u64,
    /// Give up after this many consecutive failed attempts, of any cause (MySQL, Kafka, the
    /// lease, start-up checks); 0 retries forever. An attempt succeeds once it has streamed for
    /// 10 s; an attempt that never reaches streaming (Kafka unreachable at start-up, say) fails,
    /// however long it took. Default 0.
    pub max_attempts: usize,
    /// On a stop (SIGTERM/SIGINT), longest wait, in ms, for Kafka to acknowledge the records in
    /// flight before the final checkpoint write. After it (Kafka unreachable) the relay exits 0
    /// with the last checkpoint whose records were all acknowledged: the rest are sent again
    /// on the next start (at least once). Default 30000.
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
            return Err(RelayError::Config(format!(
                "config file {} does not exist",
                path.display()
            )));
        }
        Self::from_figment(Figment::from(Toml::file_exact(path)))
    }

    /// Parses a TOML string (plus environment overrides) and validates it.
    ///
    /// # Errors
    /// As [`RelayConfig::load`].
    pub fn from_toml_str(toml: &str) -> Result<Self, RelayError> {
        Self::from_figment(Figment::from(Toml::string(toml)))
    }

    pub(crate) fn from_figment(figment: Figment) -> Result<Self, RelayError> {
        let mut config: Self = figment
            .merge(Env::prefixed(ENV_PREFIX).split("__"))
            .extract()
            .map_err(|e| {
                // Figment names keys with its profile ("default.kafka.x"); users wrote "kafka.x".
                RelayError::Config(
                    e.into_iter()
                        .map(|e| e.to_string().replace("\"default.", "\""))
                        .collect::<Vec<_>>()
                        .join("; "),
                )
            })?;
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
