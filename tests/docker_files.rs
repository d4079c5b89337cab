//! The Docker files stay consistent with the code (Docker cannot run in the test environment):
//! `docker/docker-compose.yml` has the services, images, ports and mounts the book's "Run
//! with Docker" describes; the `docker/relay.toml` it mounts is a valid relay configuration
//! (parsed by the relay's own loader) that points at those services; the MySQL config file has
//! the binlog settings the relay checks; the relay has a healthcheck on its `/readyz` (bash's
//! `/dev/tcp`: the image has no curl) and starts only after a one-shot service created the
//! topics the demo's rows go to, on a broker that creates no topics itself; `docker/Dockerfile`
//! builds with the same command as `make release`, from the workspace's rust-version; and
//! `.dockerignore` keeps build output, the test servers and `.git` out of the build context.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use outbox_relay_core::config::{RelayConfig, TlsMode};
use yaml_rust2::{Yaml, YamlLoader};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(path: &str) -> String {
    let p = repo().join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

fn compose() -> Yaml {
    let docs = YamlLoader::load_from_str(&read("docker/docker-compose.yml"))
        .unwrap_or_else(|e| panic!("docker-compose.yml is not valid YAML: {e}"));
    assert_eq!(docs.len(), 1, "one YAML document");
    docs.into_iter().next().unwrap_or(Yaml::Null)
}

fn strings(y: &Yaml) -> Vec<String> {
    y.as_vec()
        .map(|v| {
            v.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// A service's `environment` map (values as strings).
fn environment(service: &Yaml) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if let Some(h) = service["environment"].as_hash() {
        for (k, v) in h {
            let value = match v {
                Yaml::String(s) => s.clone(),
                Yaml::Integer(i) => i.to_string(),
                Yaml::Boolean(b) => b.to_string(),
                other => panic!("environment value {other:?}"),
            };
            out.insert(k.as_str().unwrap_or_default().to_owned(), value);
        }
    }
    out
}

#[test]
fn compose_has_the_five_services_with_their_images_and_ports() {
    let c = compose();
    let services: BTreeSet<&str> = c["services"]
        .as_hash()
        .expect("services")
        .keys()
        .filter_map(Yaml::as_str)
        .collect();
    assert_eq!(
        services,
        BTreeSet::from(["mysql", "kafka", "topics", "relay", "writer"])
    );
    let s = &c["services"];
    assert_eq!(s["mysql"]["image"].as_str(), Some("mysql:8.4"));
    assert_eq!(s["writer"]["image"].as_str(), Some("mysql:8.4"));
    assert_eq!(s["kafka"]["image"].as_str(), Some("apache/kafka:4.1.1"));
    assert_eq!(strings(&s["mysql"]["ports"]), vec!["127.0.0.1:3306:3306"]);
    let kafka_env = environment(&s["kafka"]);
    assert_eq!(kafka_env["KAFKA_PROCESS_ROLES"], "broker,controller");
    assert_eq!(
        kafka_env["KAFKA_ADVERTISED_LISTENERS"],
        "PLAINTEXT://kafka:9092"
    );
    assert_eq!(s["relay"]["build"]["context"].as_str(), Some(".."));
    assert_eq!(
        s["relay"]["build"]["dockerfile"].as_str(),
        Some("docker/Dockerfile")
    );
    for dep in ["mysql", "kafka"] {
        assert_eq!(
            s["relay"]["depends_on"][dep]["condition"].as_str(),
            Some("service_healthy"),
            "relay waits for {dep}"
        );
    }
}

#[test]
fn every_mounted_file_exists() {
    let c = compose();
    for (name, service) in c["services"].as_hash().expect("services") {
        for volume in strings(&service["volumes"]) {
            let host = volume.split(':').next().unwrap_or_default();
            let path = repo().join("docker").join(host);
            assert!(
                path.is_file(),
                "{:?} mounts {volume}, but {} is not a file",
                name.as_str(),
                path.display()
            );
        }
    }
}

#[test]
fn mysql_gets_the_binlog_settings_the_relay_checks() {
    let c = compose();
    assert!(strings(&c["services"]["mysql"]["volumes"])
        .contains(&"./mysql/relay.cnf:/etc/mysql/conf.d/relay.cnf:ro".to_owned()));
    let cnf = read("docker/mysql/relay.cnf");
    let settings: BTreeMap<String, String> = cnf
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('['))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    for (key, value) in [
        ("binlog_format", "ROW"),
        ("binlog_row_image", "FULL"),
        ("binlog_row_metadata", "FULL"),
        ("gtid_mode", "ON"),
        ("enforce_gtid_consistency", "ON"),
        ("server_id", "1"),
        ("log_bin", "mysql-bin"),
    ] {
        assert_eq!(settings.get(key).map(String::as_str), Some(value), "{key}");
    }
    assert!(cnf.starts_with('#') && cnf.contains("[mysqld]"), "{cnf}");
}

#[test]
fn relay_toml_is_a_valid_config_for_the_compose_services() {
    let c = compose();
    let relay = &c["services"]["relay"];
    assert!(strings(&relay["volumes"])
        .contains(&"./relay.toml:/etc/outbox-relay/relay.toml:ro".to_owned()));
    // The relay container's environment (the password reference reads it).
    for (k, v) in environment(relay) {
        std::env::set_var(k, v);
    }
    let config = RelayConfig::from_toml_str(&read("docker/relay.toml"))
        .unwrap_or_else(|e| panic!("docker/relay.toml: {e}"));
    let mysql_env = environment(&c["services"]["mysql"]);
    assert_eq!(
        config.url_database().as_deref(),
        Some(mysql_env["MYSQL_DATABASE"].as_str())
    );
    assert!(
        config.mysql.url.starts_with("mysql://relay@mysql:3306/"),
        "{}",
        config.mysql.url
    );
    assert_eq!(config.mysql.password.as_deref(), Some("relay-password"));
    assert_eq!(config.mysql.tls_mode, TlsMode::Required);
    assert_eq!(config.kafka.bootstrap_servers, "kafka:9092");
    assert_eq!(
        config
            .outbox_tables()
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        vec!["shop.outbox"]
    );
    // The user the init script creates is the one the config logs in as, with that password.
    let init = read("docker/mysql/01-relay-user.sql");
    assert!(
        init.contains("CREATE USER IF NOT EXISTS 'relay'@'%' IDENTIFIED BY 'relay-password'"),
        "{init}"
    );
    // The writer waits for this connector's checkpoint row before writing.
    let writer = strings(&c["services"]["writer"]["command"]).join(" ");
    assert!(
        writer.contains(&format!("connector_name = '{}'", config.connector_name)),
        "{writer}"
    );
}

#[test]
fn dockerfile_builds_like_make_release_and_runs_unprivileged() {
    let dockerfile = read("docker/Dockerfile");
    let makefile = read("Makefile");
    let release = makefile
        .split("\nrelease:\n")
        .nth(1)
        .and_then(|rest| rest.lines().next())
        .expect("Makefile has a release target")
        .trim()
        .replace("$(CARGO)", "cargo");
    assert_eq!(release, "cargo build --release --locked -p outbox-relay");
    let runs: Vec<&str> = dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("RUN cargo "))
        .collect();
    assert_eq!(runs.len(), 1, "one cargo command in the Dockerfile");
    assert_eq!(format!("cargo {}", runs[0].trim()), release);

    let manifest = read("Cargo.toml");
    let rust_version = manifest
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = "))
        .expect("workspace rust-version")
        .trim_matches('"');
    assert!(
        dockerfile.contains(&format!("FROM rust:{rust_version}-bookworm AS build")),
        "the builder must use rust {rust_version}"
    );
    for needle in [
        "FROM debian:bookworm-slim",
        "ca-certificates libssl3",
        "COPY --from=build /src/target/release/outbox-relay /usr/local/bin/outbox-relay",
        "USER 10001:10001",
        "ENTRYPOINT [\"/usr/local/bin/outbox-relay\"]",
        "CMD [\"run\", \"--config\", \"/etc/outbox-relay/relay.toml\"]",
    ] {
        assert!(dockerfile.contains(needle), "Dockerfile lacks {needle:?}");
    }
    let ignore = read(".dockerignore");
    for entry in [
        "target",
        "**/target",
        ".tools",
        ".services",
        ".services-*",
        ".git",
        "inbox/go/bin",
        "**/.venv",
        "**/__pycache__",
    ] {
        assert!(
            ignore.lines().any(|l| l.trim() == entry),
            ".dockerignore lacks {entry}"
        );
    }
}

/// The port of `http.listen` in `docker/relay.toml`.
fn relay_http_port() -> u16 {
    let config = RelayConfig::from_toml_str(
        &read("docker/relay.toml").replace("${env:RELAY_MYSQL_PASSWORD}", "unused"),
    )
    .unwrap_or_else(|e| panic!("docker/relay.toml: {e}"));
    let listen = config.http.listen;
    listen
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok())
        .unwrap_or_else(|| panic!("http.listen {listen:?} has no port"))
}

#[test]
fn the_relay_has_a_healthcheck_on_readyz_without_curl() {
    let c = compose();
    let check = &c["services"]["relay"]["healthcheck"];
    let test = strings(&check["test"]);
    assert_eq!(test[..3], ["CMD", "bash", "-c"], "{test:?}");
    let script = &test[3];
    let port = relay_http_port();
    for needle in [
        format!("exec 3<>/dev/tcp/127.0.0.1/{port}"),
        "GET /readyz HTTP/1.0".to_owned(),
        "grep -q ' 200 '".to_owned(),
    ] {
        assert!(script.contains(&needle), "{needle:?} not in {script:?}");
    }
    assert!(
        !script.contains("curl") && !script.contains("wget"),
        "{script}"
    );
    for key in ["interval", "timeout", "retries", "start_period"] {
        assert!(!check[key].is_badvalue(), "healthcheck lacks {key}");
    }
    // The writer writes once the relay is ready.
    assert_eq!(
        c["services"]["writer"]["depends_on"]["relay"]["condition"].as_str(),
        Some("service_healthy")
    );
    // The runtime image is Debian's, whose essential packages include bash, head and grep.
    assert!(read("docker/Dockerfile").contains("FROM debian:bookworm-slim"));
}

/// The aggregate types of the rows `tests/demo/orders.sql` inserts (the first value of each
/// `INSERT INTO outbox (aggregate_type, …) VALUES ('…'`).
fn demo_aggregate_types() -> BTreeSet<String> {
    read("tests/demo/orders.sql")
        .split("INSERT INTO outbox (aggregate_type")
        .skip(1)
        .filter_map(|rest| {
            let values = rest.split_once("VALUES ('")?.1;
            Some(values.split_once('\'')?.0.to_owned())
        })
        .collect()
}

#[test]
fn the_demo_topics_are_created_before_the_relay_starts_and_nothing_else_is() {
    let c = compose();
    let s = &c["services"];
    assert_eq!(
        environment(&s["kafka"])["KAFKA_AUTO_CREATE_TOPICS_ENABLE"],
        "false"
    );
    let topics = &s["topics"];
    assert_eq!(topics["image"].as_str(), s["kafka"]["image"].as_str());
    assert_eq!(
        topics["depends_on"]["kafka"]["condition"].as_str(),
        Some("service_healthy")
    );
    assert_eq!(
        s["relay"]["depends_on"]["topics"]["condition"].as_str(),
        Some("service_completed_successfully")
    );
    let script = strings(&topics["command"]).join(" ");
    for needle in [
        "/opt/kafka/bin/kafka-topics.sh --bootstrap-server kafka:9092 --create --if-not-exists",
        "--partitions 3 --replication-factor 1",
        "|| exit 1",
    ] {
        assert!(script.contains(needle), "{needle:?} not in {script:?}");
    }
    // Every topic the demo's rows go to, by docker/relay.toml's template.
    let config = RelayConfig::from_toml_str(
        &read("docker/relay.toml").replace("${env:RELAY_MYSQL_PASSWORD}", "unused"),
    )
    .unwrap_or_else(|e| panic!("docker/relay.toml: {e}"));
    let types = demo_aggregate_types();
    assert_eq!(
        types,
        BTreeSet::from(["Order".to_owned(), "Payment".to_owned()]),
        "the demo's aggregate types"
    );
    let listed: BTreeSet<&str> = script
        .split("for t in ")
        .nth(1)
        .and_then(|rest| rest.split_once("; do"))
        .map(|(list, _)| list.split_whitespace().collect())
        .unwrap_or_default();
    let wanted: BTreeSet<String> = types
        .iter()
        .map(|t| config.outbox.topic.replace("{aggregate_type}", t))
        .collect();
    assert_eq!(
        listed,
        wanted.iter().map(String::as_str).collect(),
        "the topics service creates exactly the demo's topics"
    );
}
