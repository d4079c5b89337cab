//! Running the `outbox-relay` binary as a child process, and writing its configuration.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use mysql_async::Pool;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::checkpoint::{read_checkpoint, Checkpoint, DEFAULT_CHECKPOINT_TABLE};
use crate::env::kafka_bootstrap;
use crate::unique::unique_suffix;
use crate::wait::wait_until;

/// How much of the end of the relay's stderr error messages and `Drop` show.
const STDERR_TAIL: usize = 16 * 1024;

/// The settings a test varies; [`RelayConfigSpec::to_toml`] writes a complete config file for
/// the test services around them.
#[derive(Debug, Clone)]
pub struct RelayConfigSpec {
    /// `connector_name`: keys the checkpoint row.
    pub connector_name: String,
    /// `mysql.url`: the database that holds the checkpoint table.
    pub mysql_url: String,
    /// `mysql.server_id`: see [`crate::next_server_id`]; 0 leaves it out of
    /// [`RelayConfigSpec::to_source_toml`] (a fleet's sources).
    pub server_id: u32,
    /// `outbox.tables` (`db.table`).
    pub tables: Vec<String>,
    /// `outbox.topic` template, e.g. `t_<uid>.outbox.event.{aggregate_type}`.
    pub topic: String,
    /// `kafka.bootstrap_servers`.
    pub bootstrap_servers: String,
    /// `checkpoint.interval_ms`.
    pub checkpoint_interval_ms: u64,
    /// `[kafka.properties]`.
    pub kafka_properties: Vec<(String, String)>,
    /// `retry.initial_backoff_ms`.
    pub initial_backoff_ms: u64,
    /// `retry.max_backoff_ms`.
    pub max_backoff_ms: u64,
    /// `kafka.max_in_flight` (the relay's default, 10000, unless a test lowers it).
    pub max_in_flight: usize,
    /// `mysql.heartbeat_interval_ms`; `None` leaves the relay's default (5000).
    pub heartbeat_interval_ms: Option<u64>,
    /// `mysql.read_timeout_ms`; `None` leaves the relay's default (15000).
    pub read_timeout_ms: Option<u64>,
    /// `mysql.resume` (`auto`, `gtid` or `position`); `None` leaves the relay's default (`auto`).
    pub resume: Option<String>,
    /// `[dead_letter]`: `Some(topic)` writes `enabled = true` with that topic; `None` writes no
    /// section (dead-lettering disabled, the relay's default).
    pub dead_letter_topic: Option<String>,
    /// TOML appended to the `[outbox]` section after `topic` (mapping options, then
    /// `[outbox.columns]`-style sub-tables or `[[outbox.table]]` entries).
    pub outbox_extra: String,
    /// `outbox.timestamp` (`commit` or `column`); `None` leaves the relay's default (`commit`).
    /// [`RelayConfigSpec::new`] sets `column`: most suites check each record's timestamp against
    /// the `created_at` they wrote (`tests/refusals_e2e.rs` covers the default).
    pub timestamp: Option<String>,
    /// `outbox.unknown_xa_commit` (`stop` or `skip`); `None` leaves the relay's default (`stop`).
    /// [`RelayConfigSpec::new`] sets `skip`: the relays of tests sharing one server must not stop
    /// at another test's XA COMMIT whose XA PREPARE came before their start (those XA
    /// transactions never write their outbox). XA tests set `stop`.
    pub unknown_xa_commit: Option<String>,
    /// `http.listen`; `None` writes `enabled = false`. [`RelayConfigSpec::new`] sets
    /// `127.0.0.1:0` (a free port, so relays of parallel tests never collide on the default
    /// port); tests of the endpoints choose a port (see [`free_local_port`]).
    pub http_listen: Option<String>,
    /// TOML lines appended to the `[retry]` section (`max_attempts = 3`, `stop_timeout_ms = …`).
    pub retry_extra: String,
    /// TOML lines appended to the `[http]` section when `http_listen` is set
    /// (`ready_kafka_ms = 3000`).
    pub http_extra: String,
    /// TOML lines appended to the `[kafka]` section (`delivery = "exactly_once"`, …).
    pub kafka_extra: String,
    /// TOML lines of the `[dead_letter]` section (`refused_topic = "hold"`, …), written after
    /// `enabled`/`topic` when `dead_letter_topic` is set, as a section of their own otherwise.
    pub dead_letter_extra: String,
    /// TOML lines of a `[tracing]` section (`otlp_endpoint = …`); empty writes no section
    /// (spans off).
    pub tracing_extra: String,
}

impl RelayConfigSpec {
    /// A config relaying `db.outbox` of the test database `db` (checkpoints in the same
    /// database) to topics `<topic_prefix>.outbox.event.{aggregate_type}` on the test broker,
    /// with short backoffs and `linger.ms = 5`.
    pub fn new(
        db: &crate::TestDb,
        connector_name: &str,
        server_id: u32,
        topic_prefix: &str,
    ) -> Self {
        Self::for_tables(
            connector_name,
            &db.url(),
            server_id,
            vec![db.outbox_table()],
            &format!("{topic_prefix}.outbox.event.{{aggregate_type}}"),
        )
    }

    /// A config of connector `connector_name` on `mysql_url` relaying `tables` to the topic
    /// template `topic` on the test broker, with the defaults of [`RelayConfigSpec::new`].
    pub fn for_tables(
        connector_name: &str,
        mysql_url: &str,
        server_id: u32,
        tables: Vec<String>,
        topic: &str,
    ) -> Self {
        Self {
            connector_name: connector_name.to_owned(),
            mysql_url: mysql_url.to_owned(),
            server_id,
            tables,
            topic: topic.to_owned(),
            bootstrap_servers: kafka_bootstrap(),
            checkpoint_interval_ms: 500,
            kafka_properties: vec![("linger.ms".into(), "5".into())],
            initial_backoff_ms: 200,
            max_backoff_ms: 2_000,
            max_in_flight: 10_000,
            heartbeat_interval_ms: None,
            read_timeout_ms: None,
            resume: None,
            dead_letter_topic: None,
            outbox_extra: String::new(),
            timestamp: Some("column".into()),
            unknown_xa_commit: Some("skip".into()),
            http_listen: Some("127.0.0.1:0".into()),
            retry_extra: String::new(),
            http_extra: String::new(),
            kafka_extra: String::new(),
            dead_letter_extra: String::new(),
            tracing_extra: String::new(),
        }
    }

    /// The topic a record of `aggregate_type` goes to under this config's template.
    pub fn topic_for(&self, aggregate_type: &str) -> String {
        self.topic.replace("{aggregate_type}", aggregate_type)
    }

    /// This config as one source of a many-source process: a file of a `sources_dir` (its
    /// `name` instead of `connector_name`; no `[http]` or `[tracing]`, which are the
    /// process's).
    pub fn to_source_toml(&self) -> String {
        let single = Self {
            http_listen: None,
            tracing_extra: String::new(),
            ..self.clone()
        }
        .to_toml();
        let body = single
            .strip_suffix("\n[http]\nenabled = false\n")
            .unwrap_or(&single);
        let body = body.split_once('\n').map_or(body, |(_, rest)| rest);
        // server_id 0: left out (a fleet derives one per process and refuses a written one).
        let body = if self.server_id == 0 {
            body.replacen("server_id = 0\n", "", 1)
        } else {
            body.to_owned()
        };
        format!("name = {}\n{body}", toml_str(&self.connector_name))
    }

    /// The config file's TOML.
    pub fn to_toml(&self) -> String {
        let tables = self
            .tables
            .iter()
            .map(|t| toml_str(t))
            .collect::<Vec<_>>()
            .join(", ");
        let mut mysql_extra = String::new();
        if let Some(ms) = self.heartbeat_interval_ms {
            mysql_extra.push_str(&format!("heartbeat_interval_ms = {ms}\n"));
        }
        if let Some(ms) = self.read_timeout_ms {
            mysql_extra.push_str(&format!("read_timeout_ms = {ms}\n"));
        }
        if let Some(mode) = &self.resume {
            mysql_extra.push_str(&format!("resume = {}\n", toml_str(mode)));
        }
        let mut xa_line = self
            .unknown_xa_commit
            .as_ref()
            .map(|p| format!("unknown_xa_commit = {}\n", toml_str(p)))
            .unwrap_or_default();
        if let Some(t) = &self.timestamp {
            xa_line.push_str(&format!("timestamp = {}\n", toml_str(t)));
        }
        let mut out = format!(
            "connector_name = {}\n\n[mysql]\nurl = {}\nserver_id = {}\n{mysql_extra}\n[outbox]\n\
             tables = [{}]\ntopic = {}\n{xa_line}{}\n\n[kafka]\nbootstrap_servers = {}\nmax_in_flight = {}\n{}\n\
             [kafka.properties]\n",
            toml_str(&self.connector_name),
            toml_str(&self.mysql_url),
            self.server_id,
            tables,
            toml_str(&self.topic),
            self.outbox_extra,
            toml_str(&self.bootstrap_servers),
            self.max_in_flight,
            self.kafka_extra,
        );
        for (k, v) in &self.kafka_properties {
            out.push_str(&format!("{} = {}\n", toml_str(k), toml_str(v)));
        }
        out.push_str(&format!(
            "\n[checkpoint]\ntable = {}\ninterval_ms = {}\n\n[retry]\ninitial_backoff_ms = {}\n\
             max_backoff_ms = {}\n{}",
            toml_str(DEFAULT_CHECKPOINT_TABLE),
            self.checkpoint_interval_ms,
            self.initial_backoff_ms,
            self.max_backoff_ms,
            self.retry_extra,
        ));
        if let Some(topic) = &self.dead_letter_topic {
            out.push_str(&format!(
                "\n[dead_letter]\nenabled = true\ntopic = {}\n{}",
                toml_str(topic),
                self.dead_letter_extra
            ));
        } else if !self.dead_letter_extra.is_empty() {
            out.push_str(&format!("\n[dead_letter]\n{}", self.dead_letter_extra));
        }
        match &self.http_listen {
            Some(listen) => out.push_str(&format!(
                "\n[http]\nlisten = {}\n{}",
                toml_str(listen),
                self.http_extra
            )),
            None => out.push_str("\n[http]\nenabled = false\n"),
        }
        if !self.tracing_extra.is_empty() {
            out.push_str(&format!("\n[tracing]\n{}", self.tracing_extra));
        }
        out
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then released), for a
/// relay's `http.listen`.
///
/// # Errors
/// No port can be bound.
pub fn free_local_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("binding 127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// A TOML basic string.
fn toml_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A running `outbox-relay run --config <file>` child process.
///
/// The config is written to a fresh file under the temp dir; stdout and stderr (where the relay
/// logs) go to files next to it, so a test can assert on them and shows them when it fails.
/// Inherited `OUTBOX_RELAY__*` variables are removed from the child's environment (so only
/// the test decides the overrides); `RUST_LOG` defaults to `info`.
///
/// On drop, a relay that still runs is killed (SIGKILL), and the tail of its stderr is printed
/// with `eprintln!`, which the test harness shows only for failing tests.
pub struct RelayProcess {
    child: Mutex<Child>,
    label: String,
    config_path: PathBuf,
    stderr_path: PathBuf,
    stdout_path: PathBuf,
    started: Instant,
}

impl RelayProcess {
    /// Writes `config_toml` to a temp file and starts `binary run --config <file>` with
    /// `extra_env` added to the environment. Pass [`crate::relay_bin()`] as
    /// `binary`.
    ///
    /// # Errors
    /// The files cannot be written or the binary cannot be started.
    pub fn spawn(
        binary: impl AsRef<Path>,
        config_toml: &str,
        extra_env: &[(&str, &str)],
    ) -> Result<Self> {
        Self::spawn_args(binary, &["run", "--config"], config_toml, extra_env)
    }

    /// Like [`RelayProcess::spawn`] with other arguments before the config file path (which is
    /// always the last argument).
    ///
    /// # Errors
    /// As [`RelayProcess::spawn`].
    pub fn spawn_args(
        binary: impl AsRef<Path>,
        args_before_config: &[&str],
        config_toml: &str,
        extra_env: &[(&str, &str)],
    ) -> Result<Self> {
        let binary = binary.as_ref();
        let dir = std::env::temp_dir().join("outbox-relay-tests");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let label = format!("relay_{}", unique_suffix());
        let config_path = dir.join(format!("{label}.toml"));
        let stderr_path = dir.join(format!("{label}.stderr.log"));
        let stdout_path = dir.join(format!("{label}.stdout.log"));
        std::fs::write(&config_path, config_toml)
            .with_context(|| format!("writing {}", config_path.display()))?;
        let stderr = File::create(&stderr_path)?;
        let stdout = File::create(&stdout_path)?;

        let mut cmd = Command::new(binary);
        cmd.args(args_before_config)
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(Stdio::from(stdout))
            .stderr(Stdio::from(stderr));
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("OUTBOX_RELAY__") {
                cmd.env_remove(&key);
            }
        }
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "info");
        }
        // Plain logs in the capture file (the text is also stripped of ANSI escapes on reading).
        cmd.env("NO_COLOR", "1");
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        crate::watchdog::track_child(child.id());
        Ok(Self {
            child: Mutex::new(child),
            label,
            config_path,
            stderr_path,
            stdout_path,
            started: Instant::now(),
        })
    }

    fn child(&self) -> MutexGuard<'_, Child> {
        self.child.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child().id()
    }

    /// Path of the config file the relay was started with.
    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    /// Path of the file that receives the relay's stderr.
    pub fn stderr_path(&self) -> &Path {
        &self.stderr_path
    }

    /// Everything the relay wrote to stderr so far, without ANSI colour escapes.
    pub fn stderr_text(&self) -> String {
        std::fs::read(&self.stderr_path)
            .map(|b| strip_ansi(&String::from_utf8_lossy(&b)))
            .unwrap_or_default()
    }

    /// Everything the relay wrote to stdout so far.
    pub fn stdout_text(&self) -> String {
        std::fs::read(&self.stdout_path)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// The last ~16 KiB of stderr, for error messages.
    pub fn stderr_tail(&self) -> String {
        let text = self.stderr_text();
        if text.len() <= STDERR_TAIL {
            return text;
        }
        let mut cut = text.len() - STDERR_TAIL;
        while !text.is_char_boundary(cut) {
            cut += 1;
        }
        format!("[… {cut} bytes cut …]\n{}", &text[cut..])
    }

    fn signal(&self, sig: Signal) -> Result<()> {
        let mut child = self.child();
        if let Some(status) = child.try_wait()? {
            // Reaped: the pid may already belong to another process.
            bail!(
                "cannot send {sig}: the relay already exited ({})\n--- stderr ---\n{}",
                describe_exit(&status),
                self.stderr_tail()
            );
        }
        let pid = i32::try_from(child.id()).context("pid out of range")?;
        kill(Pid::from_raw(pid), sig).with_context(|| format!("sending {sig} to the relay {pid}"))
    }

    /// Sends SIGTERM (graceful stop).
    ///
    /// # Errors
    /// The signal could not be sent (the process is already reaped).
    pub fn sigterm(&self) -> Result<()> {
        self.signal(Signal::SIGTERM)
    }

    /// Sends SIGHUP (a many-source relay reads its configuration again).
    ///
    /// # Errors
    /// As [`RelayProcess::sigterm`].
    pub fn sighup(&self) -> Result<()> {
        self.signal(Signal::SIGHUP)
    }

    /// Sends SIGINT (graceful stop, as Ctrl-C).
    ///
    /// # Errors
    /// As [`RelayProcess::sigterm`].
    pub fn sigint(&self) -> Result<()> {
        self.signal(Signal::SIGINT)
    }

    /// Sends SIGSTOP: the process stalls (as in a long GC-like pause or a frozen VM) with its
    /// sockets open, until [`RelayProcess::resume`].
    ///
    /// # Errors
    /// As [`RelayProcess::sigterm`].
    pub fn pause(&self) -> Result<()> {
        self.signal(Signal::SIGSTOP)
    }

    /// Sends SIGCONT: a process stopped by [`RelayProcess::pause`] goes on.
    ///
    /// # Errors
    /// As [`RelayProcess::sigterm`].
    pub fn resume(&self) -> Result<()> {
        self.signal(Signal::SIGCONT)
    }

    /// Sends SIGKILL and reaps the process: a crash with no chance to flush or checkpoint.
    ///
    /// # Errors
    /// The process could not be killed or waited for.
    pub fn kill9(&self) -> Result<ExitStatus> {
        let mut child = self.child();
        if let Some(status) = child.try_wait()? {
            bail!(
                "the relay had already exited ({status}) before kill -9\nstderr:\n{}",
                self.stderr_tail()
            );
        }
        child.kill().context("kill -9 of the relay")?;
        Ok(child.wait()?)
    }

    /// The exit status if the process has exited, without waiting.
    ///
    /// # Errors
    /// Waiting on the child failed.
    pub fn try_exit_status(&self) -> Result<Option<ExitStatus>> {
        Ok(self.child().try_wait()?)
    }

    /// `Ok` while the process runs; an error with its exit status and stderr once it has exited.
    /// Use inside [`wait_until`] closures so a wait ends as soon as the relay dies.
    ///
    /// # Errors
    /// The relay has exited.
    pub fn ensure_running(&self) -> Result<()> {
        match self.try_exit_status()? {
            None => Ok(()),
            Some(status) => Err(anyhow!(
                "the relay {} exited unexpectedly after {:.1} s with {status}\n--- stderr ---\n{}",
                self.label,
                self.started.elapsed().as_secs_f64(),
                self.stderr_tail()
            )),
        }
    }

    /// Waits for the process to exit.
    ///
    /// # Errors
    /// It still runs after `timeout` (the error carries its stderr; the process is left
    /// running and is killed on drop).
    pub async fn wait_exit(&self, timeout: Duration) -> Result<ExitStatus> {
        wait_until(
            &format!("the relay {} to exit", self.label),
            timeout,
            Duration::from_millis(50),
            async || self.try_exit_status(),
        )
        .await
        .map_err(|e| anyhow!("{e}\n--- relay stderr ---\n{}", self.stderr_tail()))
    }

    /// SIGTERM, then [`RelayProcess::wait_exit`].
    ///
    /// # Errors
    /// As [`RelayProcess::sigterm`] and [`RelayProcess::wait_exit`].
    pub async fn stop(&self, timeout: Duration) -> Result<ExitStatus> {
        self.sigterm()?;
        self.wait_exit(timeout).await
    }

    /// Waits until the checkpoint row of `connector` exists in the default checkpoint table of
    /// `pool`'s database, failing at once if the relay exits meanwhile.
    ///
    /// # Errors
    /// Timeout, relay exit, or a failed query.
    pub async fn wait_for_checkpoint_row(
        &self,
        pool: &Pool,
        connector: &str,
        timeout: Duration,
    ) -> Result<Checkpoint> {
        wait_until(
            &format!("the checkpoint row of {connector:?}"),
            timeout,
            Duration::from_millis(100),
            async || {
                let row = read_checkpoint(pool, DEFAULT_CHECKPOINT_TABLE, connector).await?;
                if row.is_none() {
                    self.ensure_running()?;
                }
                Ok(row)
            },
        )
        .await
        .map_err(|e| anyhow!("{e:#}\n--- relay stderr ---\n{}", self.stderr_tail()))
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        let status = match child.try_wait() {
            Ok(Some(status)) => format!("exited with {status}"),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                "still running at the end of the test: killed".to_owned()
            }
        };
        crate::watchdog::untrack_child(child.id());
        drop(child);
        eprintln!(
            "--- relay {} ({status}); config {}; stderr {} ---\n{}\n--- end of relay {} stderr ---",
            self.label,
            self.config_path.display(),
            self.stderr_path.display(),
            self.stderr_tail(),
            self.label
        );
    }
}

/// Waits until the relay's stderr contains `needle`, failing at once if the relay exits first
/// (unless the text is there by then). Returns the stderr text.
///
/// # Errors
/// Timeout (the error shows the stderr tail) or the relay exited without writing `needle`.
pub async fn wait_for_stderr(
    relay: &RelayProcess,
    needle: &str,
    timeout: Duration,
) -> Result<String> {
    wait_until(
        &format!("the relay to log {needle:?}"),
        timeout,
        Duration::from_millis(100),
        async || {
            let text = relay.stderr_text();
            if text.contains(needle) {
                return Ok(Some(text));
            }
            relay.ensure_running()?;
            Ok(None)
        },
    )
    .await
    .map_err(|e| anyhow!("{e:#}\n--- relay stderr ---\n{}", relay.stderr_tail()))
}

/// `text` without ANSI CSI escape sequences (`ESC [ … final-byte`), such as colours.
pub fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            // Parameter and intermediate bytes, then one final byte in '@'..='~'.
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Exit code of `status`, or a description such as `killed by signal 9`.
pub fn describe_exit(status: &ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => status.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ansi_colours_are_stripped() {
        assert_eq!(
            strip_ansi("\u{1b}[2mts\u{1b}[0m \u{1b}[31mERROR\u{1b}[0m binlog_format=ROW"),
            "ts ERROR binlog_format=ROW"
        );
    }

    #[test]
    fn toml_strings_are_escaped() {
        assert_eq!(toml_str(r#"a"b\c"#), r#""a\"b\\c""#);
    }

    #[test]
    fn config_renders_all_sections() {
        let spec = RelayConfigSpec {
            connector_name: "c".into(),
            mysql_url: "mysql://root@127.0.0.1:3306/db".into(),
            server_id: 12345,
            tables: vec!["db.outbox".into()],
            topic: "t_1.outbox.event.{aggregate_type}".into(),
            bootstrap_servers: "127.0.0.1:9092".into(),
            checkpoint_interval_ms: 500,
            kafka_properties: vec![("linger.ms".into(), "5".into())],
            initial_backoff_ms: 200,
            max_backoff_ms: 2000,
            max_in_flight: 10_000,
            heartbeat_interval_ms: None,
            read_timeout_ms: None,
            resume: None,
            dead_letter_topic: None,
            outbox_extra: "null_payload = \"skip\"\n".into(),
            timestamp: None,
            unknown_xa_commit: None,
            http_listen: Some("127.0.0.1:0".into()),
            retry_extra: "max_attempts = 3\n".into(),
            http_extra: "ready_kafka_ms = 3000\n".into(),
            kafka_extra: String::new(),
            dead_letter_extra: String::new(),
            tracing_extra: String::new(),
        };
        let toml = spec.to_toml();
        let held = RelayConfigSpec {
            dead_letter_extra: "refused_topic = \"hold\"\n".into(),
            ..spec.clone()
        }
        .to_toml();
        assert!(
            held.contains("\n[dead_letter]\nrefused_topic = \"hold\"\n"),
            "{held}"
        );
        for needle in [
            "connector_name = \"c\"",
            "[mysql]",
            "server_id = 12345",
            "tables = [\"db.outbox\"]",
            "null_payload = \"skip\"",
            "topic = \"t_1.outbox.event.{aggregate_type}\"",
            "[kafka.properties]\n\"linger.ms\" = \"5\"",
            "[checkpoint]",
            "[retry]",
            "max_backoff_ms = 2000\nmax_attempts = 3\n",
            "[http]\nlisten = \"127.0.0.1:0\"\nready_kafka_ms = 3000\n",
        ] {
            assert!(toml.contains(needle), "{needle:?} missing from\n{toml}");
        }
        assert_eq!(spec.topic_for("Order"), "t_1.outbox.event.Order");
        assert!(toml.contains("max_in_flight = 10000"), "{toml}");
        assert!(!toml.contains("[dead_letter]"), "{toml}");
        assert!(!toml.contains("heartbeat_interval_ms"), "{toml}");

        let tuned = RelayConfigSpec {
            max_in_flight: 2000,
            heartbeat_interval_ms: Some(1000),
            read_timeout_ms: Some(4000),
            resume: Some("gtid".into()),
            dead_letter_topic: Some("t_1.dlq".into()),
            unknown_xa_commit: Some("stop".into()),
            http_listen: None,
            ..spec
        };
        let toml = tuned.to_toml();
        for needle in [
            "[mysql]\nurl = \"mysql://root@127.0.0.1:3306/db\"\nserver_id = 12345\n\
             heartbeat_interval_ms = 1000\nread_timeout_ms = 4000\nresume = \"gtid\"\n",
            "max_in_flight = 2000",
            "[dead_letter]\nenabled = true\ntopic = \"t_1.dlq\"",
            "topic = \"t_1.outbox.event.{aggregate_type}\"\nunknown_xa_commit = \"stop\"\n",
            "[http]\nenabled = false\n",
        ] {
            assert!(toml.contains(needle), "{needle:?} missing from\n{toml}");
        }
    }
}
