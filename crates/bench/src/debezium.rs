//! Debezium for comparison: tests/bench/debezium/Runner.java (Debezium embedded, the server's
//! connector, outbox event router, a KafkaProducer) run by the machine's Java with the jars that
//! tests/bench/debezium.sh resolved from Maven Central: the MySQL connector on MySQL 8.0, the
//! MariaDB connector on MariaDB when Maven serves it (else the MySQL connector there too).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// A running Debezium runner.
pub struct Debezium {
    child: Child,
    /// Its stderr/stdout log.
    pub log: PathBuf,
}

/// Where one Debezium instance keeps its state and what it watches.
pub struct Spec<'a> {
    /// Folder with the jars (`<libs>/*` on the class path).
    pub libs: &'a Path,
    /// tests/bench/debezium/Runner.java.
    pub runner: &'a Path,
    /// Scratch folder for the properties, offsets and schema history files.
    pub dir: &'a Path,
    /// Name of this instance (file names, topic prefix of its internal topics).
    pub name: &'a str,
    /// Database whose `outbox` table it follows.
    pub database: &'a str,
    /// Topic prefix: records go to `<prefix><aggregate_type>`.
    pub topic_prefix: &'a str,
    /// Replica server id.
    pub server_id: u32,
    /// The server's port.
    pub mysql_port: u16,
    /// The server is MariaDB (else MySQL).
    pub mariadb: bool,
    /// Kafka bootstrap servers.
    pub bootstrap: &'a str,
}

impl Spec<'_> {
    /// The Debezium properties: the connector in `libs` from the current binlog end (`no_data`:
    /// schema only, no locks), over plain TCP as the relay connects, file offsets (kept across
    /// restarts, as a Kafka Connect worker keeps them), outbox event router routing by
    /// `aggregate_type`.
    pub fn properties(&self) -> String {
        // tests/bench/debezium.sh writes which connector it resolved for the server.
        let class = std::fs::read_to_string(self.libs.join(".connector-class"))
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| "io.debezium.connector.mysql.MySqlConnector".into());
        // The MySQL connector against MariaDB: Runner.java rewrites its offsets, as MariaDB
        // opens transactions with a GTID event the connector does not see as BEGIN. Against
        // MySQL the connector's own offsets are right.
        let maria_offsets = self.mariadb && class == "io.debezium.connector.mysql.MySqlConnector";
        // MySQL 8.0 authenticates with caching_sha2_password (its default, and the only
        // built-in method left in 8.4+: mysql_native_password is deprecated since 8.0.34 and off
        // by default in 8.4). Over plain TCP, a login whose password hash is not yet in the
        // server's cache (every first login after a restart) needs the server's RSA public
        // key, which Connector/J fetches only with allowPublicKeyRetrieval=true: what a
        // Debezium user with a password sets when not using TLS. The bench's root has no
        // password, so nothing is exchanged here; the setting keeps the configuration one that
        // also works for such a user. TLS is off on every server, as for the relay and the
        // polling relay (MySQL 8.0 offers TLS by default and Debezium's default is `preferred`).
        let driver = if self.mariadb {
            ""
        } else {
            "driver.allowPublicKeyRetrieval=true\n"
        };
        let d = self.dir.display();
        let n = self.name;
        format!(
            "name={n}
connector.class={class}
tasks.max=1
database.hostname=127.0.0.1
database.port={port}
database.user=root
database.password=
database.ssl.mode=disabled
{driver}database.server.id={sid}
topic.prefix={n}
database.include.list={db}
table.include.list={db}.outbox
include.schema.changes=false
snapshot.mode=no_data
snapshot.locking.mode=none
schema.history.internal=io.debezium.storage.file.history.FileSchemaHistory
schema.history.internal.file.filename={d}/{n}.history
offset.storage=org.apache.kafka.connect.storage.FileOffsetBackingStore
offset.storage.file.filename={d}/{n}.offsets
offset.flush.interval.ms=1000
transforms=outbox
transforms.outbox.type=io.debezium.transforms.outbox.EventRouter
transforms.outbox.table.field.event.id=id
transforms.outbox.table.field.event.key=aggregate_id
transforms.outbox.table.field.event.payload=payload
transforms.outbox.route.by.field=aggregate_type
transforms.outbox.route.topic.replacement={prefix}${{routedByValue}}
transforms.outbox.table.fields.additional.placement=event_type:header,event_key:header,aggregate_type:header
bench.bootstrap={bootstrap}
bench.mariadb.offsets={maria_offsets}
",
            port = self.mysql_port,
            sid = self.server_id,
            db = self.database,
            prefix = self.topic_prefix,
            bootstrap = self.bootstrap,
        )
    }
}

impl Debezium {
    /// Starts the runner (`run` mode) and waits up to 120 s for its connector task to start.
    ///
    /// # Errors
    /// Java cannot be started, or the task does not start (the log's tail is in the error).
    pub async fn start(spec: &Spec<'_>) -> Result<Self> {
        let props = spec.dir.join(format!("{}.properties", spec.name));
        std::fs::write(&props, spec.properties())?;
        let log = spec.dir.join(format!("{}.log", spec.name));
        let out = File::create(&log)?;
        let child = Command::new("java")
            .args(["-Xms256m", "-Xmx2g", "-XX:+UseG1GC", "-cp"])
            .arg(format!("{}/*", spec.libs.display()))
            .arg(spec.runner)
            .arg(&props)
            .arg("run")
            .stdin(Stdio::null())
            .stdout(Stdio::from(out.try_clone()?))
            .stderr(Stdio::from(out))
            .spawn()
            .context("starting java (Debezium runner)")?;
        let mut me = Self { child, log };
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let text = std::fs::read_to_string(&me.log).unwrap_or_default();
            if text.lines().any(|l| l == "STARTED") {
                return Ok(me);
            }
            if let Some(status) = me.child.try_wait()? {
                bail!("the Debezium runner exited ({status}):\n{}", tail(&text));
            }
            if text.contains("COMPLETED success=false") || Instant::now() > deadline {
                me.stop().await;
                bail!("the Debezium connector did not start:\n{}", tail(&text));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The java process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails when the runner has exited or its connector stopped.
    ///
    /// # Errors
    /// As said, with the log's tail.
    pub fn ensure_running(&mut self) -> Result<()> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        if let Some(status) = self.child.try_wait()? {
            bail!("the Debezium runner exited ({status}):\n{}", tail(&text));
        }
        if text.contains("COMPLETED success=false") {
            bail!("the Debezium connector stopped:\n{}", tail(&text));
        }
        Ok(())
    }

    /// SIGTERM (the runner closes the engine, which commits its offsets), SIGKILL after 60 s.
    pub async fn stop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Debezium {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The last ~40 lines of a log.
pub fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}
