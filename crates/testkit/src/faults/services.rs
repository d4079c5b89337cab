//! Starting and stopping the test services through the repository's own scripts
//! (`tests/services/server.sh <server>`, `tests/services/kafka.sh`), with the environment of this
//! process (`OUTBOX_TEST_SERVER` and its port variable, `KAFKA_PORT`, `KAFKA_CONTROLLER_PORT`,
//! `OUTBOX_SERVICES_DIR`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// The repository root, as compiled in (`crates/testkit/../..`).
pub fn default_repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("..")
}

/// One of the service scripts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// The database server under test: `tests/services/server.sh <OUTBOX_TEST_SERVER>`.
    Server,
    /// `tests/services/kafka.sh`.
    Kafka,
    /// A named database server, `tests/services/server.sh <name>` (the fleet's profile runs
    /// all three).
    Named(crate::env::TestServer),
}

impl Service {
    /// The script and the arguments before the action.
    fn script(self) -> (&'static str, Vec<&'static str>) {
        match self {
            Self::Server => ("server.sh", vec![crate::env::test_server().name()]),
            Self::Kafka => ("kafka.sh", Vec::new()),
            Self::Named(server) => ("server.sh", vec![server.name()]),
        }
    }
}

/// Runs the service scripts of one repository checkout.
#[derive(Debug, Clone)]
pub struct Services {
    dir: PathBuf,
}

impl Services {
    /// The scripts in `<repo_root>/tests/services`.
    pub fn new(repo_root: &Path) -> Self {
        Self {
            dir: repo_root.join("tests").join("services"),
        }
    }

    /// Runs `<script> <action>` and returns how long it took.
    ///
    /// # Errors
    /// The script cannot be started, fails, or takes longer than `timeout` (then it is killed
    /// with what it started, [`crate::script::run`]); the error carries its output.
    pub async fn run(&self, service: Service, action: &str, timeout: Duration) -> Result<Duration> {
        let (script, args) = service.script();
        let script = self.dir.join(script);
        let started = Instant::now();
        let mut command = std::process::Command::new(&script);
        command.args(args).arg(action);
        let what = format!("{} {action}", script.display());
        tokio::task::spawn_blocking(move || crate::script::run(command, &what, timeout))
            .await
            .context("the thread running a service script")??;
        Ok(started.elapsed())
    }

    /// `up` for the database server, then Kafka (both idempotent).
    ///
    /// # Errors
    /// As [`Services::run`].
    pub async fn up_all(&self) -> Result<()> {
        self.run(Service::Server, "up", Duration::from_secs(600))
            .await?;
        self.run(Service::Kafka, "up", Duration::from_secs(900))
            .await?;
        Ok(())
    }

    /// `down` then `up`; returns the time each took.
    ///
    /// # Errors
    /// As [`Services::run`].
    pub async fn restart(
        &self,
        service: Service,
        downtime: Duration,
    ) -> Result<(Duration, Duration)> {
        let down = self.run(service, "down", Duration::from_secs(120)).await?;
        tokio::time::sleep(downtime).await;
        let up = self.run(service, "up", Duration::from_secs(300)).await?;
        Ok((down, up))
    }
}
