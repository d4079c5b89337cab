//! Where the test services listen: `MARIADB_PORT` and `KAFKA_PORT` from the environment,
//! defaulting to 3306 and 9092 on 127.0.0.1 (as `tests/services/*.sh` start them).

/// Host both services listen on.
pub const SERVICES_HOST: &str = "127.0.0.1";

fn port_from_env(var: &str, default: u16) -> u16 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.trim().parse::<u16>().ok())
        .unwrap_or(default)
}

/// MariaDB's port: env `MARIADB_PORT`, default 3306.
pub fn mysql_port() -> u16 {
    port_from_env("MARIADB_PORT", 3306)
}

/// Kafka's port: env `KAFKA_PORT`, default 9092.
pub fn kafka_port() -> u16 {
    port_from_env("KAFKA_PORT", 9092)
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
