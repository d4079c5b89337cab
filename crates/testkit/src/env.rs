//! Where the test services listen, and which database server the end-to-end suites run against.
//!
//! `OUTBOX_TEST_SERVER` names the server (`mariadb10`, `mariadb11` or `mysql8`, as
//! `tests/services/server.sh` names them; default `mariadb10`); `make test` runs every suite once
//! per server in `OUTBOX_TEST_SERVERS`. Each server's port comes from its own variable, the one
//! the service scripts honour: `MARIADB_PORT` (3306), `MARIADB11_PORT` (3316), `MYSQL8_PORT`
//! (3326). Kafka: `KAFKA_PORT` (9092). All on 127.0.0.1.

use std::fmt;

/// Host every service listens on.
pub const SERVICES_HOST: &str = "127.0.0.1";

fn port_from_env(var: &str, default: u16) -> u16 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.trim().parse::<u16>().ok())
        .unwrap_or(default)
}

/// A database server the suites run against.
///
/// Where the servers differ (binary JSON vs LONGTEXT, GTID forms, statement names, defaults),
/// tests branch on this and assert that server's right outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestServer {
    /// MariaDB 10.11 from Debian (`binlog_row_metadata=FULL`, JSON stored as LONGTEXT).
    MariaDb10,
    /// MariaDB 11.4.5 (utf8mb4 in `utf8mb4_uca1400_ai_ci` by default).
    MariaDb11,
    /// MySQL 8.0.31 with its own defaults: `binlog_row_metadata=MINIMAL`, binary JSON,
    /// GTIDs on, `caching_sha2_password`.
    Mysql8,
}

impl TestServer {
    /// Every server, in the order `make test` runs them.
    pub const ALL: [TestServer; 3] = [Self::MariaDb10, Self::MariaDb11, Self::Mysql8];

    /// The server named by `OUTBOX_TEST_SERVER` (default `mariadb10`).
    ///
    /// # Panics
    /// On a name that is not one of the three: a typo must not silently test another server.
    pub fn current() -> Self {
        match std::env::var("OUTBOX_TEST_SERVER") {
            Err(_) => Self::MariaDb10,
            Ok(name) => Self::from_name(name.trim()).unwrap_or_else(|| {
                panic!("OUTBOX_TEST_SERVER={name:?}: expected mariadb10, mariadb11 or mysql8")
            }),
        }
    }

    /// The server of a `tests/services/server.sh` flavor name.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The flavor name `tests/services/server.sh` takes (`mariadb10`, `mariadb11`, `mysql8`).
    pub fn name(self) -> &'static str {
        match self {
            Self::MariaDb10 => "mariadb10",
            Self::MariaDb11 => "mariadb11",
            Self::Mysql8 => "mysql8",
        }
    }

    /// The environment variable holding this server's port.
    pub fn port_var(self) -> &'static str {
        match self {
            Self::MariaDb10 => "MARIADB_PORT",
            Self::MariaDb11 => "MARIADB11_PORT",
            Self::Mysql8 => "MYSQL8_PORT",
        }
    }

    /// The port the service scripts start this server on when its variable is unset.
    pub fn default_port(self) -> u16 {
        match self {
            Self::MariaDb10 => 3306,
            Self::MariaDb11 => 3316,
            Self::Mysql8 => 3326,
        }
    }

    /// This server's port: its variable, or the default.
    pub fn port(self) -> u16 {
        port_from_env(self.port_var(), self.default_port())
    }

    /// MariaDB (either version): GTIDs `domain-server-seq`, no binary JSON, `SHOW SLAVE STATUS`.
    pub fn is_mariadb(self) -> bool {
        matches!(self, Self::MariaDb10 | Self::MariaDb11)
    }

    /// MySQL 8.0: GTIDs `uuid:n`, binary JSON, `binlog_row_metadata=MINIMAL` by default.
    pub fn is_mysql(self) -> bool {
        self == Self::Mysql8
    }
}

impl fmt::Display for TestServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The server the suites run against ([`TestServer::current`]).
pub fn test_server() -> TestServer {
    TestServer::current()
}

/// The test server's port (see the module doc).
pub fn mysql_port() -> u16 {
    test_server().port()
}

/// Kafka's port: env `KAFKA_PORT`, default 9092.
pub fn kafka_port() -> u16 {
    port_from_env("KAFKA_PORT", 9092)
}

/// The test Jaeger's OTLP/HTTP receiver, `http://127.0.0.1:PORT` (`JAEGER_OTLP_HTTP_PORT`,
/// default 4318; tests/services/jaeger.sh).
pub fn jaeger_otlp_endpoint() -> String {
    format!(
        "http://{SERVICES_HOST}:{}",
        port_from_env("JAEGER_OTLP_HTTP_PORT", 4318)
    )
}

/// The port of the test Jaeger's query HTTP API (`JAEGER_QUERY_PORT`, default 16686):
/// `/api/traces/<trace id>`.
pub fn jaeger_query_port() -> u16 {
    port_from_env("JAEGER_QUERY_PORT", 16686)
}

/// `mysql://root@127.0.0.1:PORT[/db]` for the test server (root, no password).
pub fn mysql_url(db: Option<&str>) -> String {
    let base = format!("mysql://root@{SERVICES_HOST}:{}", mysql_port());
    match db {
        Some(db) => format!("{base}/{db}"),
        None => base,
    }
}

/// `127.0.0.1:PORT` for the test broker.
pub fn kafka_bootstrap() -> String {
    format!("{SERVICES_HOST}:{}", kafka_port())
}
