//! Security end to end: TLS to MySQL (`mysql.tls_*`), SASL/SCRAM to Kafka (`kafka.properties`),
//! and secrets read from files and environment variables (`${file:…}`, `${env:…}`).
//!
//! These tests start their own private servers, so that the shared ones are never reconfigured:
//!
//! * a server of the flavor under test (`OUTBOX_TEST_SERVER`) with TLS, on 127.0.0.1:3366
//!   (MariaDB 10.11), 3376 (MariaDB 11.4) or 3386 (MySQL 8.0; `TLS_SERVER_PORT` moves it),
//!   certificates generated here (`TestPki`: a CA, a server certificate for
//!   localhost/127.0.0.1, a client certificate, an unrelated CA);
//! * a Kafka with a SASL_PLAINTEXT SCRAM-SHA-512 listener on 127.0.0.1:9494 (PLAINTEXT 9492,
//!   controller 9493; `SASL_KAFKA_PORT` moves all three), user `relay` created at format time.
//!
//! Each is started by the first test that needs it (`tests/services/*.sh up`, data under
//! `.services/private/`) and stopped when the last test of this binary that uses it ends;
//! `make services-down` stops them too.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Result};
use mysql_async::prelude::Queryable;
use outbox_relay_testkit::mysql_async;
use outbox_relay_testkit::{
    collect_records, describe_exit, insert_outbox_rows, next_server_id, recent_created_at_base,
    test_server, unique_suffix, InsertStyle, OutboxRow, PrivateService, RelayConfigSpec,
    RelayProcess, ServiceSpec, TestDb, TestPki, TestServer,
};

/// The relay binary under test (built on first use).
fn bin() -> &'static str {
    outbox_relay_testkit::relay_bin()
}
const RECORD_TIMEOUT: Duration = Duration::from_secs(60);
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);

fn port(var: &str, default: u16) -> u16 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// The private TLS server's port: `TLS_SERVER_PORT`, else one per flavor (the servers' runs
/// follow each other, and a port of its own keeps a left-over server from being reused).
fn tls_port() -> u16 {
    let default = match test_server() {
        TestServer::MariaDb10 => 3366,
        TestServer::MariaDb11 => 3376,
        TestServer::Mysql8 => 3386,
    };
    port("TLS_SERVER_PORT", default)
}

/// The private server with TLS (same flavor as the server under test), its certificates and a
/// test database `db_name` created on it as root (plain, root has no password and no REQUIRE
/// clause).
async fn tls_server(db_name: &str) -> Result<(Arc<PrivateService>, TestPki, TestDb)> {
    let server = test_server();
    let port = tls_port();
    let pki_dir = outbox_relay_testkit::private::private_services_dir("tls-pki");
    let pki = TestPki::ensure(&pki_dir)?;
    let spec = ServiceSpec {
        name: format!("tls-{server}"),
        script: "server.sh".into(),
        args: vec![server.name().into()],
        env: vec![
            (server.port_var().into(), port.to_string()),
            ("SERVER_TLS_DIR".into(), pki_dir.display().to_string()),
        ],
    };
    let service = PrivateService::acquire(spec, |_| Ok(()))?;
    let root_url = format!("mysql://root@127.0.0.1:{port}");
    let db = TestDb::create_on(&root_url, db_name).await?;
    Ok((service, pki, db))
}

/// The private Kafka with SCRAM: (service, SASL bootstrap, PLAINTEXT bootstrap).
fn sasl_kafka() -> Result<(Arc<PrivateService>, String, String)> {
    let plain = port("SASL_KAFKA_PORT", 9492);
    let sasl = plain + 2; // plain + 1 is the controller
    let spec = ServiceSpec::kafka(
        "sasl-kafka",
        plain,
        vec![
            ("KAFKA_SASL_PORT".into(), sasl.to_string()),
            ("KAFKA_SASL_SCRAM".into(), "1".into()),
            ("KAFKA_SASL_USER".into(), SASL_USER.into()),
            ("KAFKA_SASL_PASSWORD".into(), SASL_PASSWORD.into()),
        ],
    );
    let service = PrivateService::acquire(spec, |_| Ok(()))?;
    Ok((
        service,
        format!("127.0.0.1:{sasl}"),
        format!("127.0.0.1:{plain}"),
    ))
}

const SASL_USER: &str = "relay";
const SASL_PASSWORD: &str = "relay-scram-secret";

fn rows(uid: &str, n: usize) -> Vec<OutboxRow> {
    let base = recent_created_at_base();
    (0..n)
        .map(|i| OutboxRow {
            aggregate_type: "Order".into(),
            aggregate_id: format!("order-{uid}-{i}"),
            event_type: "OrderCreated".into(),
            event_key: format!("ek-{uid}-{i}"),
            payload: format!("{{\"n\": {i}}}"),
            created_at_micros: base + i as i64 * 1_000,
        })
        .collect()
}

/// Inserts `rows` in one transaction once the relay has stored its start checkpoint, and checks
/// that exactly these records arrive: key, value, event_key header.
async fn relay_and_check(
    relay: &RelayProcess,
    db: &TestDb,
    spec: &RelayConfigSpec,
    bootstrap_for_reading: &str,
    rows: &[OutboxRow],
) -> Result<()> {
    relay
        .wait_for_checkpoint_row(db.pool(), &spec.connector_name, RECORD_TIMEOUT)
        .await?;
    let mut conn = db.conn().await?;
    let mut tx = conn
        .start_transaction(mysql_async::TxOpts::default())
        .await?;
    insert_outbox_rows(&mut tx, "outbox", rows, InsertStyle::SingleRow).await?;
    tx.commit().await?;
    let topic = spec.topic_for("Order");
    let records = collect_records(
        bootstrap_for_reading,
        std::slice::from_ref(&topic),
        rows.len(),
        RECORD_TIMEOUT,
    )
    .await?;
    let mut got: Vec<(String, String, String)> = records
        .iter()
        .map(|r| {
            (
                r.key_str().unwrap_or_default().to_owned(),
                r.value_str().unwrap_or_default().to_owned(),
                r.header("event_key").unwrap_or_default().to_owned(),
            )
        })
        .collect();
    got.sort();
    let mut want: Vec<(String, String, String)> = rows
        .iter()
        .map(|r| {
            (
                r.aggregate_id.clone(),
                r.payload.clone(),
                r.event_key.clone(),
            )
        })
        .collect();
    want.sort();
    ensure!(
        got == want,
        "records on {topic}: {got:?}, expected {want:?}\n--- relay stderr ---\n{}",
        relay.stderr_tail()
    );
    Ok(())
}

/// [`relay_and_check`], then a graceful stop that must exit 0.
async fn relay_check_and_stop(
    relay: &RelayProcess,
    db: &TestDb,
    spec: &RelayConfigSpec,
    bootstrap_for_reading: &str,
    rows: &[OutboxRow],
) -> Result<()> {
    relay_and_check(relay, db, spec, bootstrap_for_reading, rows).await?;
    let status = relay.stop(EXIT_TIMEOUT).await?;
    ensure!(status.success(), "relay exit: {}", describe_exit(&status));
    Ok(())
}

/// The config of connector `<name>-<uid>` on `db`, topics prefixed `t_<uid>`.
fn spec_for(db: &TestDb, name: &str, uid: &str) -> RelayConfigSpec {
    let connector = format!("{name}-{uid}");
    RelayConfigSpec::new(db, &connector, next_server_id(), &format!("t_{uid}"))
}

/// A MySQL user name `<prefix>_<the last 12 characters of uid>`.
fn user_name(prefix: &str, uid: &str) -> String {
    format!("{prefix}_{}", &uid[uid.len().saturating_sub(12)..])
}

/// The `[kafka.properties]` of SASL/SCRAM-SHA-512 as user [`SASL_USER`] with `password`.
fn sasl_scram_properties(password: &str) -> [(String, String); 4] {
    [
        ("security.protocol".into(), "SASL_PLAINTEXT".into()),
        ("sasl.mechanisms".into(), "SCRAM-SHA-512".into()),
        ("sasl.username".into(), SASL_USER.into()),
        ("sasl.password".into(), password.into()),
    ]
}

/// Lines added to the `[mysql]` section of a spec's TOML.
fn with_mysql_lines(spec: &RelayConfigSpec, lines: &str) -> String {
    let toml = spec.to_toml();
    let anchor = format!("server_id = {}\n", spec.server_id);
    toml.replacen(&anchor, &format!("{anchor}{lines}\n"), 1)
}

/// The spec's TOML with `tls_mode = "verify_ca"` and `tls_ca` = the test PKI's file `ca_file`.
fn with_verify_ca(spec: &RelayConfigSpec, pki: &TestPki, ca_file: &str) -> String {
    with_mysql_lines(
        spec,
        &format!(
            "tls_mode = \"verify_ca\"\ntls_ca = {}",
            toml_path(&pki.file(ca_file))
        ),
    )
}

fn toml_path(p: &std::path::Path) -> String {
    format!("{:?}", p.display().to_string())
}

/// A user created REQUIRE SSL (the server refuses it any plain connection) with the book's
/// least privileges: the relay connects with tls_mode = verify_ca against the test CA, its
/// password read from a file (`${file:…}` in mysql.password), and relays the rows. Every
/// connection (checks, lease, checkpoint writes, binlog dump) is that user's, so each used TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_over_tls_with_verify_ca_and_a_password_file() -> Result<()> {
    let (_server, pki, db) = tls_server("sec_tls_ca").await?;
    let uid = unique_suffix();
    let user = user_name("tls", &uid);
    let password = "Tls:pass@word/#1";
    db.create_relay_user(&user, password, "SSL").await?;
    let pw_file = std::env::temp_dir().join(format!("outbox-relay-pw-{uid}"));
    std::fs::write(&pw_file, format!("{password}\n"))?;

    let mut spec = spec_for(&db, "sec-tls", &uid);
    spec.mysql_url = format!("mysql://{user}@127.0.0.1:{}/{}", tls_port(), db.name());
    let toml = with_mysql_lines(
        &spec,
        &format!(
            "password = \"${{file:{}}}\"\ntls_mode = \"verify_ca\"\ntls_ca = {}",
            pw_file.display(),
            toml_path(&pki.file("ca.pem"))
        ),
    );
    let relay = RelayProcess::spawn(bin(), &toml, &[])?;
    relay_check_and_stop(&relay, &db, &spec, &spec.bootstrap_servers, &rows(&uid, 3)).await?;
    let stderr = relay.stderr_text();
    ensure!(
        !stderr.contains(password),
        "the password appears in the relay's log:\n{stderr}"
    );
    std::fs::remove_file(&pw_file).ok();
    db.drop_database().await
}

/// A least-privileged password user over a plain connection (`tls_mode = "disabled"`), on the
/// shared server under test: on MySQL 8.0 the user has caching_sha2_password, the 8.0 default,
/// whose full authentication without TLS sends the password encrypted with the server's RSA
/// public key (asked for by the client); on MariaDB, mysql_native_password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_without_tls_as_a_least_privileged_password_user() -> Result<()> {
    let db = TestDb::create("sec_plain").await?;
    let uid = unique_suffix();
    let user = user_name("plain", &uid);
    let password = "Plain:pass@word/#2";
    db.create_relay_user(&user, password, "NONE").await?;
    let mut conn = db.conn().await?;
    let plugin: Option<String> = conn
        .exec_first(
            "SELECT plugin FROM mysql.user WHERE user = ? AND host = '%'",
            (user.as_str(),),
        )
        .await?;
    let want = if test_server().is_mysql() {
        "caching_sha2_password"
    } else {
        "mysql_native_password"
    };
    ensure!(
        plugin.as_deref() == Some(want),
        "{user} authenticates with {plugin:?}, expected {want} on {}",
        test_server()
    );
    drop(conn);
    let mut spec = spec_for(&db, "sec-plain", &uid);
    spec.mysql_url = format!(
        "mysql://{user}@127.0.0.1:{}/{}",
        outbox_relay_testkit::mysql_port(),
        db.name()
    );
    let toml = with_mysql_lines(
        &spec,
        "password = \"${env:TEST_RELAY_MYSQL_PASSWORD}\"\ntls_mode = \"disabled\"",
    );
    let relay = RelayProcess::spawn(bin(), &toml, &[("TEST_RELAY_MYSQL_PASSWORD", password)])?;
    relay_check_and_stop(&relay, &db, &spec, &spec.bootstrap_servers, &rows(&uid, 3)).await?;
    let mut admin = db.conn().await?;
    admin.query_drop(format!("DROP USER '{user}'@'%'")).await?;
    drop(admin);
    db.drop_database().await
}

/// A user created REQUIRE SUBJECT (a client certificate with that subject, signed by the
/// server's CA): tls_mode = verify_identity (the server certificate names 127.0.0.1) with
/// tls_cert/tls_key relays the rows; the password comes from `${env:…}`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_with_a_client_certificate_and_verify_identity() -> Result<()> {
    let (_server, pki, db) = tls_server("sec_tls_x509").await?;
    let uid = unique_suffix();
    let user = user_name("x509", &uid);
    let password = "x509-secret";
    db.create_relay_user(
        &user,
        password,
        &format!(
            "SUBJECT '/CN={}'",
            outbox_relay_testkit::private::TEST_CLIENT_CN
        ),
    )
    .await?;
    let mut spec = spec_for(&db, "sec-x509", &uid);
    spec.mysql_url = format!("mysql://{user}@127.0.0.1:{}/{}", tls_port(), db.name());
    let toml = with_mysql_lines(
        &spec,
        &format!(
            "password = \"${{env:TEST_RELAY_MYSQL_PASSWORD}}\"\ntls_mode = \"verify_identity\"\n\
             tls_ca = {}\ntls_cert = {}\ntls_key = {}",
            toml_path(&pki.file("ca.pem")),
            toml_path(&pki.file("client-cert.pem")),
            toml_path(&pki.file("client-key.pem")),
        ),
    );
    let relay = RelayProcess::spawn(bin(), &toml, &[("TEST_RELAY_MYSQL_PASSWORD", password)])?;
    relay_check_and_stop(&relay, &db, &spec, &spec.bootstrap_servers, &rows(&uid, 2)).await?;
    db.drop_database().await
}

/// tls_ca names a CA that did not sign the server's certificate: the relay stops with exit
/// code 3 and says it is TLS, what failed, and which settings fix it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_ca_stops_with_exit_code_3_naming_tls_and_the_fix() -> Result<()> {
    let (_server, pki, db) = tls_server("sec_tls_wrong_ca").await?;
    let uid = unique_suffix();
    let spec = spec_for(&db, "sec-wrongca", &uid);
    let toml = with_verify_ca(&spec, &pki, "other-ca.pem");
    expect_prerequisite_failure(
        &toml,
        &[
            "server prerequisite not met: TLS connection to the MySQL server",
            "the TLS handshake failed",
            "certificate verify failed",
            "Fix: set mysql.tls_ca to the CA file that signed the server's certificate",
        ],
    )
    .await?;
    db.drop_database().await
}

/// A user created REQUIRE X509 connecting without a client certificate: the server refuses the
/// login; the relay stops with exit code 3 and points at tls_cert/tls_key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x509_user_without_client_certificate_is_refused_with_the_fix() -> Result<()> {
    let (_server, pki, db) = tls_server("sec_tls_nocert").await?;
    let uid = unique_suffix();
    let user = user_name("nocert", &uid);
    db.create_relay_user(&user, "pw", "X509").await?;
    let mut spec = spec_for(&db, "sec-nocert", &uid);
    spec.mysql_url = format!("mysql://{user}:pw@127.0.0.1:{}/{}", tls_port(), db.name());
    let toml = with_verify_ca(&spec, &pki, "ca.pem");
    expect_prerequisite_failure(
        &toml,
        &[
            "error 1045",
            "REQUIRE X509",
            "mysql.tls_cert and mysql.tls_key",
        ],
    )
    .await?;
    db.drop_database().await
}

/// The relay authenticates to Kafka with SASL/SCRAM-SHA-512 (librdkafka properties in
/// [kafka.properties], the password from `${env:…}`), and the records arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produces_to_kafka_with_sasl_scram() -> Result<()> {
    let (_kafka, sasl_bootstrap, plain_bootstrap) = sasl_kafka()?;
    let db = TestDb::create("sec_sasl").await?;
    let uid = unique_suffix();
    let mut spec = spec_for(&db, "sec-sasl", &uid);
    spec.bootstrap_servers = sasl_bootstrap;
    spec.kafka_properties
        .extend(sasl_scram_properties("${env:TEST_RELAY_KAFKA_PASSWORD}"));
    let relay = RelayProcess::spawn(
        bin(),
        &spec.to_toml(),
        &[("TEST_RELAY_KAFKA_PASSWORD", SASL_PASSWORD)],
    )?;
    relay_check_and_stop(&relay, &db, &spec, &plain_bootstrap, &rows(&uid, 3)).await?;
    let stderr = relay.stderr_text();
    ensure!(
        !stderr.contains(SASL_PASSWORD),
        "the SASL password appears in the relay's log:\n{stderr}"
    );
    db.drop_database().await
}

/// A wrong SASL password: the relay stops with exit code 3, naming Kafka authentication, the
/// broker's answer and the settings to fix, without printing the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_sasl_password_is_a_clear_error() -> Result<()> {
    let (_kafka, sasl_bootstrap, _) = sasl_kafka()?;
    let db = TestDb::create("sec_sasl_bad").await?;
    let uid = unique_suffix();
    let mut spec = spec_for(&db, "sec-saslbad", &uid);
    spec.bootstrap_servers = sasl_bootstrap;
    let wrong = "not-the-scram-password";
    spec.kafka_properties.extend(sasl_scram_properties(wrong));
    let stderr = expect_prerequisite_failure(
        &spec.to_toml(),
        &[
            "server prerequisite not met: Kafka authentication",
            "invalid credentials with SASL mechanism SCRAM-SHA-512",
            "sasl.username",
            "sasl.password",
        ],
    )
    .await?;
    ensure!(
        !stderr.contains(wrong),
        "the password is in the log:\n{stderr}"
    );
    db.drop_database().await
}

/// Runs a relay with `toml` that must stop with exit code 3 (a prerequisite not met) and say each
/// of `needles` on stderr; returns its stderr.
async fn expect_prerequisite_failure(toml: &str, needles: &[&str]) -> Result<String> {
    let relay = RelayProcess::spawn(bin(), toml, &[])?;
    let status = relay.wait_exit(EXIT_TIMEOUT).await?;
    let stderr = relay.stderr_text();
    ensure!(
        status.code() == Some(3),
        "expected exit code 3, got {}\n{stderr}",
        describe_exit(&status)
    );
    for needle in needles {
        ensure!(
            stderr.contains(needle),
            "stderr lacks {needle:?}:\n{stderr}"
        );
    }
    Ok(stderr)
}
