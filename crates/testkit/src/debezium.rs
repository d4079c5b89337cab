//! The real Debezium for the Debezium compatibility tests: `tests/debezium/Runner.java`
//! (Debezium embedded 3.x, the server's connector, the outbox `EventRouter`, each routed record
//! serialized as a Kafka Connect worker does with the converters of each output) run by the
//! machine's Java with the jars `tests/bench/debezium.sh SERVER` resolved from Maven Central
//! (into `$OUTBOX_SERVICES_DIR/debezium-libs-<version>-<connector>`).
//!
//! [`DebeziumSpec`] writes the runner's properties; [`DebeziumProcess`] is the running child
//! (killed on drop, and by the test [`crate::Watchdog`] when it fires), with waits on its
//! `STARTED`, streaming and `STOPPED` lines that fail with the tail of its log.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::env::{kafka_bootstrap, TestServer};
use crate::relay::describe_exit;
use crate::unique::unique_suffix;
use crate::wait::wait_until;

/// The class of Debezium's MySQL connector (also used on MariaDB when Maven Central does not
/// serve `debezium-connector-mariadb`).
pub const MYSQL_CONNECTOR: &str = "io.debezium.connector.mysql.MySqlConnector";

/// The class of Debezium's MariaDB connector.
pub const MARIADB_CONNECTOR: &str = "io.debezium.connector.mariadb.MariaDbConnector";

/// The log lines that say the connector streams the binlog: Debezium's own
/// (`BinlogStreamingChangeEventSource`, through SLF4J) or, when SLF4J has no binding (Debezium
/// 3.6's slf4j-api 1.7 with slf4j-simple 2.0 log nothing), its binlog client's
/// (`BinaryLogClient#connect`, java.util.logging), written once the dump request is sent from
/// the position the snapshot took: rows committed after it are streamed.
pub const STREAMING_LINES: [&str; 2] = ["Connected to binlog at", "INFO: Connected to "];

/// The repository's root.
fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("..")
}

/// `tests/debezium/Runner.java`.
pub fn runner_source() -> PathBuf {
    repo_root()
        .join("tests")
        .join("debezium")
        .join("Runner.java")
}

/// The jars folder of Debezium's connector for `server`: the last line `tests/bench/debezium.sh
/// SERVER` prints (it resolves them from Maven Central on first use, honouring
/// `OUTBOX_SERVICES_DIR`), once per test process and server.
///
/// # Errors
/// The script fails (its output is in the error).
pub fn resolve_libs(server: TestServer) -> Result<PathBuf> {
    static LIBS: OnceLock<Mutex<HashMap<&'static str, PathBuf>>> = OnceLock::new();
    let cache = LIBS.get_or_init(|| Mutex::new(HashMap::new()));
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(libs) = cache.get(server.name()) {
        return Ok(libs.clone());
    }
    let script = repo_root().join("tests").join("bench").join("debezium.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg(server.name())
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "{} {} failed ({}):\n{}{}",
            script.display(),
            server.name(),
            describe_exit(&out.status),
            stdout,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let libs = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(|l| PathBuf::from(l.trim()))
        .context("tests/bench/debezium.sh printed no folder")?;
    cache.insert(server.name(), libs.clone());
    Ok(libs)
}

/// The connector class the libs folder holds (`<libs>/.connector-class`, written by
/// tests/bench/debezium.sh), [`MYSQL_CONNECTOR`] when absent.
pub fn connector_class(libs: &Path) -> String {
    std::fs::read_to_string(libs.join(".connector-class"))
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| MYSQL_CONNECTOR.into())
}

/// The version string a MariaDB server must report for Debezium's MySQL connector (when
/// Maven Central does not serve the MariaDB connector), as `make bench` does
/// (tests/bench/bench.sh): the connector takes MariaDB 10.11 for MySQL >= 8.4 and fails on
/// `SHOW BINARY LOG STATUS`, and its JDBC driver asks for `@@transaction_isolation` from 8.0.3
/// on. `8.0.2-MariaDB-log` still says MariaDB to the relay and to the binlog client.
pub const MARIADB_VERSION_FOR_MYSQL_CONNECTOR: &str = "8.0.2-MariaDB-log";

/// A private server of the test server's flavor for Debezium, when the test server is MariaDB
/// and the resolved connector is the MySQL one: `tests/services/server.sh` on `port` with
/// `MARIADB_VERSION_STRING` = [`MARIADB_VERSION_FOR_MYSQL_CONNECTOR`] (the shared server keeps
/// its own version). `None` when the shared test server serves as it is (MySQL, or the
/// MariaDB connector). The handle keeps it running; the last one dropped stops it.
///
/// # Errors
/// The jars do not resolve or the server does not start.
pub fn mariadb_masquerade(port: u16) -> Result<Option<std::sync::Arc<crate::PrivateService>>> {
    let server = TestServer::current();
    if !server.is_mariadb() || connector_class(&resolve_libs(server)?) != MYSQL_CONNECTOR {
        return Ok(None);
    }
    let service = crate::PrivateService::acquire(
        crate::ServiceSpec {
            name: format!("{}-debezium", server.name()),
            script: "server.sh".into(),
            args: vec![server.name().into()],
            env: vec![
                (server.port_var().into(), port.to_string()),
                (
                    "MARIADB_VERSION_STRING".into(),
                    MARIADB_VERSION_FOR_MYSQL_CONNECTOR.into(),
                ),
            ],
        },
        |_| Ok(()),
    )?;
    Ok(Some(service))
}

/// A Kafka Connect converter, as the relay's `[debezium]` `key_converter` / `value_converter`
/// name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConverterKind {
    /// `org.apache.kafka.connect.storage.StringConverter`.
    String,
    /// `org.apache.kafka.connect.json.JsonConverter` with `schemas.enable=false`.
    Json,
    /// `org.apache.kafka.connect.json.JsonConverter` with `schemas.enable=true`.
    JsonSchemas,
}

impl ConverterKind {
    /// Every converter.
    pub const ALL: [ConverterKind; 3] = [Self::String, Self::Json, Self::JsonSchemas];

    /// `string`, `json` or `json_schemas`.
    pub fn name(self) -> &'static str {
        match self {
            Self::String => "string",
            Self::Json => "json",
            Self::JsonSchemas => "json_schemas",
        }
    }

    /// A short tag for topic prefixes: `s`, `j`, `js`.
    pub fn tag(self) -> &'static str {
        match self {
            Self::String => "s",
            Self::Json => "j",
            Self::JsonSchemas => "js",
        }
    }
}

/// One output of a Debezium run: every routed record, serialized with these converters, goes
/// to `prefix + routed topic`.
#[derive(Debug, Clone)]
pub struct Output {
    /// Name in the properties (`[a-z0-9_]`).
    pub name: String,
    /// Key converter.
    pub key: ConverterKind,
    /// Value converter.
    pub value: ConverterKind,
    /// Prefix of the output topics.
    pub prefix: String,
}

/// Where Debezium keeps its source offsets.
#[derive(Debug, Clone)]
pub enum OffsetStore {
    /// `FileOffsetBackingStore` in this file.
    File(PathBuf),
    /// `KafkaOffsetBackingStore` on the test broker, in this topic (one partition, replication
    /// factor 1), as a Kafka Connect worker keeps them: key `["<name>",{"server":"<topic
    /// prefix>"}]`, value the connector's offset, both JSON without schemas.
    Kafka {
        /// `offset.storage.topic`.
        topic: String,
    },
}

/// One Debezium instance: the connector on the test server, the outbox `EventRouter` and the
/// runner's outputs.
#[derive(Debug, Clone)]
pub struct DebeziumSpec {
    /// The engine's `name` (a Connect connector's name: the offsets' key).
    pub name: String,
    /// `topic.prefix`: the connector's logical name.
    pub topic_prefix: String,
    /// `database.server.id`.
    pub server_id: u32,
    /// The server's flavor (MariaDB or MySQL).
    pub server: TestServer,
    /// The server's port on 127.0.0.1 (the test server's, or a private server's of its
    /// flavor: see [`mariadb_masquerade`]).
    pub port: u16,
    /// `database.include.list`.
    pub database: String,
    /// `table.include.list` (`db.table`).
    pub tables: Vec<String>,
    /// Offsets.
    pub offsets: OffsetStore,
    /// `transforms.outbox.*` settings besides `type` (e.g. `route.topic.replacement`).
    pub router: Vec<(String, String)>,
    /// Other connector or engine settings (they override the defaults written before them).
    pub extra: Vec<(String, String)>,
    /// The outputs of this run.
    pub outputs: Vec<Output>,
    /// `test.stop_after`: stop after this many routed records.
    pub stop_after: Option<u64>,
    /// `test.convert_errors=skip`: a record a converter cannot serialize is left out of that
    /// output (see [`DebeziumProcess::convert_failures`]) instead of failing the run as a
    /// Connect worker does.
    pub skip_convert_errors: bool,
    /// Scratch folder (properties, schema history, file offsets, the log).
    pub dir: PathBuf,
}

impl DebeziumSpec {
    /// A spec named `<name>-<unique>` with topic prefix `dbz_<unique>`, its scratch folder under
    /// the temp dir, file offsets there, no router settings and no outputs yet.
    ///
    /// # Errors
    /// The scratch folder cannot be created.
    pub fn new(name: &str, server_id: u32, database: &str, tables: Vec<String>) -> Result<Self> {
        let uid = unique_suffix();
        let dir = std::env::temp_dir()
            .join("outbox-relay-tests")
            .join(format!("debezium_{name}_{uid}"));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self {
            name: format!("{name}-{uid}"),
            topic_prefix: format!("dbz_{uid}"),
            server_id,
            server: TestServer::current(),
            port: TestServer::current().port(),
            database: database.to_owned(),
            tables,
            offsets: OffsetStore::File(dir.join("offsets.dat")),
            router: Vec::new(),
            extra: Vec::new(),
            outputs: Vec::new(),
            stop_after: None,
            skip_convert_errors: false,
            dir,
        })
    }

    /// The runner's properties with the connector in `libs`: from the current binlog end
    /// (`snapshot.mode=no_data`: schema only, no locks), over plain TCP as root, file schema
    /// history, offsets flushed after every batch.
    pub fn properties(&self, libs: &Path) -> String {
        let class = connector_class(libs);
        let mut props: Vec<(String, String)> = Vec::new();
        let mut set = |k: &str, v: &str| props.push((k.to_owned(), v.to_owned()));
        set("name", &self.name);
        set("connector.class", &class);
        set("tasks.max", "1");
        set("database.hostname", crate::env::SERVICES_HOST);
        set("database.port", &self.port.to_string());
        set("database.user", "root");
        set("database.password", "");
        set("database.ssl.mode", "disabled");
        if !self.server.is_mariadb() {
            // caching_sha2_password over plain TCP (see crates/bench/src/debezium.rs).
            set("driver.allowPublicKeyRetrieval", "true");
        }
        set("database.server.id", &self.server_id.to_string());
        set("topic.prefix", &self.topic_prefix);
        set("database.include.list", &self.database);
        set("table.include.list", &self.tables.join(","));
        set("include.schema.changes", "false");
        set("snapshot.mode", "no_data");
        set("snapshot.locking.mode", "none");
        set(
            "schema.history.internal",
            "io.debezium.storage.file.history.FileSchemaHistory",
        );
        set(
            "schema.history.internal.file.filename",
            &self.dir.join("schema.history").display().to_string(),
        );
        match &self.offsets {
            OffsetStore::File(path) => {
                set(
                    "offset.storage",
                    "org.apache.kafka.connect.storage.FileOffsetBackingStore",
                );
                set("offset.storage.file.filename", &path.display().to_string());
            }
            OffsetStore::Kafka { topic } => {
                set(
                    "offset.storage",
                    "org.apache.kafka.connect.storage.KafkaOffsetBackingStore",
                );
                set("offset.storage.topic", topic);
                set("offset.storage.partitions", "1");
                set("offset.storage.replication.factor", "1");
                set("bootstrap.servers", &kafka_bootstrap());
            }
        }
        set("offset.flush.interval.ms", "0");
        set("transforms", "outbox");
        set(
            "transforms.outbox.type",
            "io.debezium.transforms.outbox.EventRouter",
        );
        for (k, v) in &self.router {
            set(&format!("transforms.outbox.{k}"), v);
        }
        for (k, v) in &self.extra {
            set(k, v);
        }
        set("test.bootstrap", &kafka_bootstrap());
        let names: Vec<&str> = self.outputs.iter().map(|o| o.name.as_str()).collect();
        set("test.outputs", &names.join(","));
        for o in &self.outputs {
            set(&format!("test.output.{}.key", o.name), o.key.name());
            set(&format!("test.output.{}.value", o.name), o.value.name());
            set(&format!("test.output.{}.prefix", o.name), &o.prefix);
        }
        if let Some(n) = self.stop_after {
            set("test.stop_after", &n.to_string());
        }
        if self.skip_convert_errors {
            set("test.convert_errors", "skip");
        }
        // The MySQL connector on MariaDB: the runner rewrites its offsets (Runner.java).
        let maria_offsets = self.server.is_mariadb() && class == MYSQL_CONNECTOR;
        set("test.mariadb.offsets", &maria_offsets.to_string());
        let mut out = String::new();
        for (k, v) in props {
            out.push_str(&format!(
                "{}={}\n",
                properties_escape(&k),
                properties_escape(&v)
            ));
        }
        out
    }
}

/// `s` escaped for a Java properties file read by `Properties.load(InputStream)` (ISO 8859-1):
/// backslashes, leading blanks, separators in keys and every non-ASCII or control character as
/// `\uXXXX`.
pub fn properties_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for (i, c) in s.chars().enumerate() {
        match c {
            '\\' => out.push_str("\\\\"),
            '=' | ':' | '#' | '!' => {
                out.push('\\');
                out.push(c);
            }
            ' ' if i == 0 => out.push_str("\\ "),
            c if c.is_ascii() && !c.is_ascii_control() => out.push(c),
            c => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04X}"));
                }
            }
        }
    }
    out
}

/// A running `java … tests/debezium/Runner.java <properties>`; killed on drop.
pub struct DebeziumProcess {
    child: Mutex<Child>,
    /// Its stdout and stderr (slf4j-simple logs to stderr).
    pub log: PathBuf,
    /// The properties file it runs with.
    pub properties: PathBuf,
    started: Instant,
}

impl DebeziumProcess {
    /// Resolves the jars for `spec.server`, writes the properties into `spec.dir` and starts
    /// the runner (not waiting for anything: see [`DebeziumProcess::wait_started`]).
    ///
    /// # Errors
    /// The jars do not resolve, the files cannot be written or Java cannot be started.
    pub fn spawn(spec: &DebeziumSpec) -> Result<Self> {
        let libs = resolve_libs(spec.server)?;
        let label = unique_suffix();
        let properties = spec.dir.join(format!("runner_{label}.properties"));
        std::fs::write(&properties, spec.properties(&libs))
            .with_context(|| format!("writing {}", properties.display()))?;
        let log = spec.dir.join(format!("runner_{label}.log"));
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let child = Command::new("java")
            .args(["-Xms128m", "-Xmx1g", "-XX:+UseSerialGC", "-cp"])
            .arg(format!("{}/*", libs.display()))
            .arg(runner_source())
            .arg(&properties)
            .stdin(Stdio::null())
            .stdout(Stdio::from(out.try_clone()?))
            .stderr(Stdio::from(out))
            .spawn()
            .context("starting java (tests/debezium/Runner.java)")?;
        crate::watchdog::track_child(child.id());
        Ok(Self {
            child: Mutex::new(child),
            log,
            properties,
            started: Instant::now(),
        })
    }

    /// [`DebeziumProcess::spawn`], then [`DebeziumProcess::wait_streaming`].
    ///
    /// # Errors
    /// As both.
    pub async fn start(spec: &DebeziumSpec, timeout: Duration) -> Result<Self> {
        let me = Self::spawn(spec)?;
        me.wait_streaming(timeout).await?;
        Ok(me)
    }

    fn child(&self) -> MutexGuard<'_, Child> {
        self.child.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The java process id.
    pub fn pid(&self) -> u32 {
        self.child().id()
    }

    /// Everything the runner wrote so far.
    pub fn log_text(&self) -> String {
        std::fs::read(&self.log)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// The last 60 lines of the log.
    pub fn log_tail(&self) -> String {
        let text = self.log_text();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }

    /// The exit status once the runner has exited.
    ///
    /// # Errors
    /// Waiting on the child failed.
    pub fn try_exit_status(&self) -> Result<Option<ExitStatus>> {
        Ok(self.child().try_wait()?)
    }

    /// The records a converter could not serialize so far: (output name, `id` header), from
    /// the runner's `CONVERT_FAILED` lines (the whole line is printed by the runner).
    pub fn convert_failures(&self) -> Vec<(String, String)> {
        self.log_text()
            .lines()
            .filter_map(|l| l.strip_prefix("CONVERT_FAILED "))
            .filter_map(|l| {
                let mut words = l.split(' ');
                let output = words.next()?.strip_prefix("output=")?;
                let id = words.next()?.strip_prefix("id=")?;
                Some((output.to_owned(), id.to_owned()))
            })
            .collect()
    }

    /// The runner's `CONVERT_FAILED` lines.
    pub fn convert_failure_lines(&self) -> Vec<String> {
        self.log_text()
            .lines()
            .filter(|l| l.starts_with("CONVERT_FAILED "))
            .map(str::to_owned)
            .collect()
    }

    /// `Ok` while the runner runs and its engine has not failed.
    ///
    /// # Errors
    /// It exited, or logged `COMPLETED success=false` (the log's tail is in the error).
    pub fn ensure_running(&self) -> Result<()> {
        if let Some(status) = self.try_exit_status()? {
            bail!(
                "the Debezium runner exited after {:.1} s ({})\n--- runner log {} ---\n{}",
                self.started.elapsed().as_secs_f64(),
                describe_exit(&status),
                self.log.display(),
                self.log_tail()
            );
        }
        if self.log_text().contains("COMPLETED success=false") {
            bail!(
                "the Debezium engine failed\n--- runner log {} ---\n{}",
                self.log.display(),
                self.log_tail()
            );
        }
        Ok(())
    }

    async fn wait_line(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> Result<()> {
        wait_until(what, timeout, Duration::from_millis(200), async || {
            let text = self.log_text();
            if pred(&text) {
                return Ok(Some(()));
            }
            self.ensure_running()?;
            Ok(None)
        })
        .await
        .map_err(|e| {
            anyhow!(
                "{e:#}\n--- runner log {} ---\n{}",
                self.log.display(),
                self.log_tail()
            )
        })
    }

    /// Waits for the runner's `STARTED` (the connector task runs).
    ///
    /// # Errors
    /// Timeout, or the runner exited or failed first.
    pub async fn wait_started(&self, timeout: Duration) -> Result<()> {
        self.wait_line("the Debezium task to start", timeout, |t| {
            t.lines().any(|l| l == "STARTED")
        })
        .await
    }

    /// Waits until the connector streams the binlog (one of [`STREAMING_LINES`] in its log, after
    /// `STARTED`): rows committed from then on reach it. `snapshot.mode=no_data` takes the
    /// binlog end during the task's snapshot, which runs after `STARTED`.
    ///
    /// # Errors
    /// As [`DebeziumProcess::wait_started`].
    pub async fn wait_streaming(&self, timeout: Duration) -> Result<()> {
        self.wait_line(
            "the Debezium connector to stream the binlog",
            timeout,
            |t| t.lines().any(|l| l == "STARTED") && STREAMING_LINES.iter().any(|s| t.contains(s)),
        )
        .await
    }

    /// Waits for a `test.stop_after` run to end: `STOPPED` and exit code 0.
    ///
    /// # Errors
    /// Timeout, another exit, or a failed engine.
    pub async fn wait_stopped(&self, timeout: Duration) -> Result<()> {
        let status = wait_until(
            "the Debezium runner to stop after test.stop_after records",
            timeout,
            Duration::from_millis(200),
            async || self.try_exit_status(),
        )
        .await
        .map_err(|e| {
            anyhow!(
                "{e:#}\n--- runner log {} ---\n{}",
                self.log.display(),
                self.log_tail()
            )
        })?;
        let text = self.log_text();
        if !status.success() || !text.lines().any(|l| l == "STOPPED") {
            bail!(
                "the Debezium runner ended with {} without STOPPED\n--- runner log {} ---\n{}",
                describe_exit(&status),
                self.log.display(),
                self.log_tail()
            );
        }
        Ok(())
    }

    /// SIGTERM (the runner closes the engine, which commits the task's offsets) and waits up to
    /// `timeout` for the exit.
    ///
    /// # Errors
    /// The runner had already exited, or did not exit in time.
    pub async fn stop(&self, timeout: Duration) -> Result<ExitStatus> {
        {
            let mut child = self.child();
            if let Some(status) = child.try_wait()? {
                bail!(
                    "the Debezium runner had already exited ({})\n--- runner log ---\n{}",
                    describe_exit(&status),
                    self.log_tail()
                );
            }
            let pid = i32::try_from(child.id()).context("pid out of range")?;
            kill(Pid::from_raw(pid), Signal::SIGTERM).context("SIGTERM to the Debezium runner")?;
        }
        wait_until(
            "the Debezium runner to exit after SIGTERM",
            timeout,
            Duration::from_millis(100),
            async || self.try_exit_status(),
        )
        .await
        .map_err(|e| anyhow!("{e:#}\n--- runner log ---\n{}", self.log_tail()))
    }
}

impl Drop for DebeziumProcess {
    fn drop(&mut self) {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        if let Ok(None) = child.try_wait() {
            let _ = child.kill();
            let _ = child.wait();
        }
        crate::watchdog::untrack_child(child.id());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_values_are_escaped() {
        assert_eq!(
            properties_escape("outbox.event.${routedByValue}"),
            "outbox.event.${routedByValue}"
        );
        assert_eq!(properties_escape("a:b=c"), "a\\:b\\=c");
        assert_eq!(properties_escape("C:\\x é"), "C\\:\\\\x \\u00E9");
        assert_eq!(properties_escape(" x"), "\\ x");
    }

    #[test]
    fn converters_are_named_as_the_relay_names_them() {
        let names: Vec<_> = ConverterKind::ALL.iter().map(|c| c.name()).collect();
        assert_eq!(names, ["string", "json", "json_schemas"]);
    }
}
