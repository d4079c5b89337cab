//! Private test servers (a MariaDB with TLS, a Kafka with SASL/SCRAM) that a test binary starts
//! itself through `tests/services/*.sh` on ports of their own, and the certificates they use.
//!
//! A [`PrivateService`] is shared by the tests of one binary that run at the same time: the
//! first [`PrivateService::acquire`] starts it (`<script> up`), the last handle dropped stops it
//! (`<script> down`). `make services-down` stops them too, for a run that was killed.
//!
//! Data lives under `<repo>/.services/private/<name>` (git-ignored), the folder the Makefile's
//! `services-down` knows.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// How long one action of a private service's script may take (`up` initialises a data folder
/// the first time, a minute at most here): a script still running after this is stuck, and
/// [`crate::script::run`] kills it with what it started rather than hang the test binary.
const SCRIPT_LIMIT: Duration = Duration::from_secs(600);

/// The repository root (where `tests/services/` is).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("..")
}

/// `<repo>/.services/private/<name>`: `OUTBOX_SERVICES_DIR` of a private service.
pub fn private_services_dir(name: &str) -> PathBuf {
    repo_root().join(".services").join("private").join(name)
}

/// How to start one private service.
#[derive(Debug, Clone)]
pub struct ServiceSpec {
    /// Unique name; also the folder under `.services/private/`.
    pub name: String,
    /// Script under `tests/services/` (`server.sh`, `kafka.sh`).
    pub script: String,
    /// Arguments before the action (`["mysql8"]` for `server.sh mysql8 up`).
    pub args: Vec<String>,
    /// Environment of the script (`MARIADB_PORT`, `MARIADB_TLS_DIR`, …); `OUTBOX_SERVICES_DIR`
    /// is added.
    pub env: Vec<(String, String)>,
}

impl ServiceSpec {
    /// A private Kafka broker (`tests/services/kafka.sh`) named `name` on 127.0.0.1:`port`,
    /// its KRaft controller on `port + 1`, using the jars `make services-up` fetched for the
    /// shared broker; `env` adds to the script's environment (SASL listeners, …).
    pub fn kafka(name: &str, port: u16, env: Vec<(String, String)>) -> Self {
        let libs = repo_root().join(".services").join("kafka-libs-4.1.1");
        let mut all = vec![
            ("KAFKA_PORT".into(), port.to_string()),
            ("KAFKA_CONTROLLER_PORT".into(), (port + 1).to_string()),
            ("KAFKA_LIBS_DIR".into(), libs.display().to_string()),
        ];
        all.extend(env);
        Self {
            name: name.into(),
            script: "kafka.sh".into(),
            args: Vec::new(),
            env: all,
        }
    }
}

/// A running private service; stopped when the last handle is dropped.
#[derive(Debug)]
pub struct PrivateService {
    spec: ServiceSpec,
}

fn registry() -> &'static Mutex<HashMap<String, Weak<PrivateService>>> {
    static REGISTRY: std::sync::OnceLock<Mutex<HashMap<String, Weak<PrivateService>>>> =
        std::sync::OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new()))
}

impl PrivateService {
    /// The running service named `spec.name`, started first when no test of this binary holds
    /// it. `prepare` runs before the start (e.g. to write certificates).
    ///
    /// Blocks while the script runs (MariaDB: seconds; Kafka: up to two minutes).
    ///
    /// # Errors
    /// `prepare` fails or the script cannot start the service (its output is in the error).
    pub fn acquire(
        spec: ServiceSpec,
        prepare: impl FnOnce(&Path) -> Result<()>,
    ) -> Result<Arc<PrivateService>> {
        let mut map = loop {
            let map = registry()
                .lock()
                .map_err(|_| anyhow::anyhow!("private service registry poisoned"))?;
            match map.get(&spec.name) {
                Some(weak) => match weak.upgrade() {
                    Some(existing) => return Ok(existing),
                    // Its last holder is stopping it; the Drop removes the entry once `down`
                    // has run. Starting it now would race that `down`.
                    None => {
                        drop(map);
                        std::thread::sleep(std::time::Duration::from_millis(20));
                    }
                },
                None => break map,
            }
        };
        let dir = private_services_dir(&spec.name);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        prepare(&dir)?;
        let service = Arc::new(PrivateService { spec });
        if let Err(e) = service.script("up") {
            // Release the registry before `service` drops: its Drop takes the registry too.
            drop(map);
            return Err(e);
        }
        map.insert(service.spec.name.clone(), Arc::downgrade(&service));
        Ok(service)
    }

    /// `OUTBOX_SERVICES_DIR` of this service.
    pub fn dir(&self) -> PathBuf {
        private_services_dir(&self.spec.name)
    }

    /// Stops the service (its script's `down`) while this handle keeps it registered, so a
    /// test can take it away under a running relay; [`PrivateService::start`] brings it back.
    ///
    /// # Errors
    /// The script fails (its output is in the error).
    pub fn stop(&self) -> Result<()> {
        self.script("down")
    }

    /// Starts the service again after [`PrivateService::stop`] (its script's `up`, idempotent).
    ///
    /// # Errors
    /// The script fails (its output is in the error).
    pub fn start(&self) -> Result<()> {
        self.script("up")
    }

    /// Runs another action of the service's script with its options (`kafka.sh acl …`) and
    /// the service's environment.
    ///
    /// # Errors
    /// The script fails (its output is in the error).
    pub fn run(&self, action: &str, options: &[&str]) -> Result<()> {
        self.script_with(action, options)
    }

    fn script(&self, action: &str) -> Result<()> {
        self.script_with(action, &[])
    }

    fn script_with(&self, action: &str, options: &[&str]) -> Result<()> {
        let path = repo_root()
            .join("tests")
            .join("services")
            .join(&self.spec.script);
        let mut command = Command::new("bash");
        command
            .arg(&path)
            .args(&self.spec.args)
            .arg(action)
            .args(options)
            .env("OUTBOX_SERVICES_DIR", self.dir())
            .envs(self.spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let what = format!("{} {action} ({:?})", path.display(), self.spec.env);
        crate::script::run(command, &what, SCRIPT_LIMIT)?;
        Ok(())
    }
}

impl Drop for PrivateService {
    fn drop(&mut self) {
        // Stop while holding the registry: a test that acquires the service meanwhile waits and
        // then starts it afresh, instead of running `up` against this `down` (which left a broker
        // running without its pid file, so the next `up` refused the port).
        let mut registry = registry().lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = self.script("down") {
            eprintln!("stopping private service {}: {e:#}", self.spec.name);
        }
        registry.remove(&self.spec.name);
    }
}

/// Certificates for TLS tests, as PEM files in one folder: a CA (`ca.pem`), a server
/// certificate it signed for `localhost` and `127.0.0.1` (`server-cert.pem`,
/// `server-key.pem`), a client certificate it signed (`client-cert.pem`, `client-key.pem`,
/// subject CN `outbox-relay-test-client`), and an unrelated CA (`other-ca.pem`).
#[derive(Debug, Clone)]
pub struct TestPki {
    dir: PathBuf,
}

/// Subject common name of [`TestPki`]'s client certificate.
pub const TEST_CLIENT_CN: &str = "outbox-relay-test-client";

impl TestPki {
    /// The certificates in `dir`, generated when the folder does not hold a complete set yet
    /// (a server that still runs from an earlier test run keeps using the files it was started
    /// with).
    ///
    /// Safe to call from tests running at the same time: the set is written to a folder of its
    /// own and renamed into place, so nobody sees a CA from one call next to a server
    /// certificate from another (which fails the TLS handshake with "certificate signature
    /// failure").
    ///
    /// # Errors
    /// Generating or writing the files fails.
    pub fn ensure(dir: &Path) -> Result<Self> {
        static GENERATING: Mutex<()> = Mutex::new(());
        let _guard = GENERATING
            .lock()
            .map_err(|_| anyhow::anyhow!("test PKI lock poisoned"))?;
        let pki = Self {
            dir: dir.to_owned(),
        };
        if Self::complete(dir) {
            return Ok(pki);
        }
        // Only a folder the old, non-atomic code left half-written can exist incomplete (a set
        // is renamed into place whole): start over. Checked again right here, so a set another
        // test binary renamed into place since the check above is kept.
        if dir.exists() {
            if Self::complete(dir) {
                return Ok(pki);
            }
            std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
        }
        let parent = dir
            .parent()
            .with_context(|| format!("{} has no parent folder", dir.display()))?;
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
        let staging = parent.join(format!(
            ".{}.staging-{}",
            dir.file_name().and_then(|n| n.to_str()).unwrap_or("pki"),
            std::process::id()
        ));
        if staging.exists() {
            std::fs::remove_dir_all(&staging)
                .with_context(|| format!("removing {}", staging.display()))?;
        }
        std::fs::create_dir_all(&staging)
            .with_context(|| format!("creating {}", staging.display()))?;
        Self::generate(&staging)?;
        match std::fs::rename(&staging, dir) {
            Ok(()) => Ok(pki),
            // Another test binary put a complete set there first: use that one.
            Err(_) if Self::complete(dir) => {
                let _ = std::fs::remove_dir_all(&staging);
                Ok(pki)
            }
            Err(e) => Err(e)
                .with_context(|| format!("renaming {} to {}", staging.display(), dir.display())),
        }
    }

    const FILES: [&'static str; 6] = [
        "ca.pem",
        "server-cert.pem",
        "server-key.pem",
        "client-cert.pem",
        "client-key.pem",
        "other-ca.pem",
    ];

    fn complete(dir: &Path) -> bool {
        Self::FILES.iter().all(|f| dir.join(f).exists())
    }

    /// Writes a fresh CA, server and client certificate and an unrelated CA into `dir`.
    fn generate(dir: &Path) -> Result<()> {
        let (ca_pem, ca) = new_ca("outbox-relay test CA")?;
        let (other_pem, _) = new_ca("outbox-relay unrelated CA")?;

        let mut server = CertificateParams::new(vec!["localhost".to_owned()])?;
        server
            .subject_alt_names
            .push(SanType::IpAddress(std::net::IpAddr::from([127, 0, 0, 1])));
        server
            .distinguished_name
            .push(DnType::CommonName, "outbox-relay test server");
        server.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server_key = KeyPair::generate()?;
        let server_cert = server.signed_by(&server_key, &ca)?;

        let mut client = CertificateParams::new(Vec::<String>::new())?;
        client
            .distinguished_name
            .push(DnType::CommonName, TEST_CLIENT_CN);
        client.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client_key = KeyPair::generate()?;
        let client_cert = client.signed_by(&client_key, &ca)?;

        for (name, text) in [
            ("server-cert.pem", server_cert.pem()),
            ("server-key.pem", server_key.serialize_pem()),
            ("client-cert.pem", client_cert.pem()),
            ("client-key.pem", client_key.serialize_pem()),
            ("other-ca.pem", other_pem),
            ("ca.pem", ca_pem),
        ] {
            std::fs::write(dir.join(name), text)
                .with_context(|| format!("writing {}", dir.join(name).display()))?;
        }
        Ok(())
    }

    /// The folder (what `MARIADB_TLS_DIR` points at).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Path of one of the files (`ca.pem`, `client-cert.pem`, …).
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

fn new_ca(name: &str) -> Result<(String, Issuer<'static, KeyPair>)> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
    ];
    let key = KeyPair::generate()?;
    let cert = params.self_signed(&key)?;
    Ok((cert.pem(), Issuer::new(params, key)))
}
