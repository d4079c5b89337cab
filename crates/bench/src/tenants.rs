//! The `tenants` phase: one relay following `tenant_*.outbox` on a server with many schemas.
//!
//! A private MariaDB 10.11 (`tests/services/server.sh mariadb10` on `BENCH_TENANTS_PORT`, 3596,
//! its data under `.services/private/bench-tenants`, `innodb_file_per_table=0` so thousands of
//! tables stay small on disk) gets `BENCH_TENANTS` schemas (1000) `tenant_<n>` of
//! `BENCH_TENANT_TABLES` tables (10) each: `outbox` and `t1`…`t9` of the same shape, and the
//! relay's state database. Measured:
//!
//! - `start_to_streaming_s`: from the relay's spawn to its `streaming binlog` log line (first
//!   start: the start-up checks and the layouts of every matching table from
//!   `information_schema`), and again for a restart from the checkpoint;
//! - `peak_rss_mb`: the relay's peak resident set (VmHWM) after one row was inserted into every
//!   table of every schema (so every table map went through the decoder) and the outbox rows
//!   reached Kafka (one fixed topic, so the shared broker gets one topic, not one per tenant).
//!
//! Targets: under 5 s to streaming, under 200 MB.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use mysql_async::prelude::*;
use mysql_async::{Conn, Opts, Pool};
use outbox_relay_testkit::private::{PrivateService, ServiceSpec};
use outbox_relay_testkit::{high_watermark_total, next_server_id, unique_suffix, RelayProcess};
use serde_json::{json, Value};

use crate::{env_or, log, procs};

/// Seconds the relay may take to stream before the phase gives up.
const START_LIMIT: Duration = Duration::from_secs(120);

/// Runs the phase with the relay binary `relay_bin` and Kafka at `bootstrap`.
///
/// # Errors
/// The private server cannot be started, the schemas cannot be made, or the relay does not
/// stream or relay the rows in time.
pub async fn measure(relay_bin: &Path, bootstrap: &str) -> Result<Value> {
    let schemas: usize = env_or("BENCH_TENANTS", "1000")
        .parse()
        .context("BENCH_TENANTS")?;
    let tables: usize = env_or("BENCH_TENANT_TABLES", "10")
        .parse()
        .context("BENCH_TENANT_TABLES")?;
    let port: u16 = env_or("BENCH_TENANTS_PORT", "3596")
        .parse()
        .context("BENCH_TENANTS_PORT")?;
    ensure!(
        tables >= 1,
        "BENCH_TENANT_TABLES must be at least 1 (the outbox)"
    );
    let spec = ServiceSpec {
        name: "bench-tenants".into(),
        script: "server.sh".into(),
        args: vec!["mariadb10".into()],
        env: vec![
            ("MARIADB_PORT".into(), port.to_string()),
            (
                "SERVER_EXTRA_CNF".into(),
                "innodb_file_per_table=0\ntable_definition_cache=2000".into(),
            ),
        ],
    };
    log(format!(
        "tenants: private MariaDB on {port}, {schemas} schemas x {tables} tables"
    ));
    let server =
        tokio::task::spawn_blocking(move || PrivateService::acquire(spec, |_| Ok(()))).await??;
    let url = format!("mysql://root@127.0.0.1:{port}");
    let result = run(relay_bin, bootstrap, &url, schemas, tables).await;
    // Each run starts from empty schemas: a killed run's leftovers are dropped by the next.
    drop(server);
    result
}

async fn run(
    relay_bin: &Path,
    bootstrap: &str,
    url: &str,
    schemas: usize,
    tables: usize,
) -> Result<Value> {
    let pool = Pool::new(Opts::from_url(url)?);
    let mut conn = pool.get_conn().await?;
    let made = Instant::now();
    create_schemas(&pool, schemas, tables).await?;
    log(format!(
        "tenants: {} tables made in {:.1} s",
        schemas * tables,
        made.elapsed().as_secs_f64()
    ));
    let sfx = unique_suffix();
    let topic = format!("bench_tenants_{sfx}");
    let toml = format!(
        "connector_name = \"tenants-{sfx}\"\n\n[mysql]\nurl = \"{url}/relay_state\"\n\
         server_id = {sid}\n\n[outbox]\ntables = [\"tenant_*.outbox\"]\ntopic = \"{topic}\"\n\n\
         [kafka]\nbootstrap_servers = \"{bootstrap}\"\n",
        sid = next_server_id(),
    );
    let (relay, first_start) = start(relay_bin, &toml).await?;
    log(format!(
        "tenants: first start streams after {first_start:.2} s"
    ));
    // One row into every table: every table map goes through the decoder's matching, the
    // outboxes' rows to Kafka.
    for n in 0..schemas {
        let mut sql = String::new();
        for t in 0..tables {
            let table = if t == 0 {
                "outbox".to_owned()
            } else {
                format!("t{t}")
            };
            sql.push_str(&format!(
                "INSERT INTO tenant_{n}.{table} (aggregate_type, aggregate_id, event_type, \
                 event_key, payload) VALUES ('Order', 'o-{n}', 'OrderCreated', 'k-{n}-{t}', \
                 '{{\"n\":{n}}}');"
            ));
        }
        conn.query_drop(sql).await?;
    }
    let topics = [topic.clone()];
    let wanted = schemas as u64;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        relay.ensure_running()?;
        let n = high_watermark_total(bootstrap, &topics).await.unwrap_or(0);
        if n >= wanted {
            ensure!(n == wanted, "{n} records for {wanted} outbox rows");
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "only {n} of {wanted} records after 120 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let usage = procs::usage(relay.pid())?;
    log(format!(
        "tenants: {wanted} outbox rows relayed, peak RSS {:.1} MB",
        usage.peak_rss_mb
    ));
    let status = relay.stop(Duration::from_secs(30)).await?;
    ensure!(
        status.success(),
        "relay exit: {status:?}\n{}",
        relay.stderr_tail()
    );
    let (relay, restart) = start(relay_bin, &toml).await?;
    log(format!("tenants: restart streams after {restart:.2} s"));
    let restart_usage = procs::usage(relay.pid())?;
    relay.stop(Duration::from_secs(30)).await?;
    crate::kafka::delete_topics(bootstrap, &topics).await;
    conn.disconnect().await.ok();
    pool.disconnect().await.ok();
    Ok(json!({
        "schemas": schemas,
        "tables_per_schema": tables,
        "start_to_streaming_s": first_start,
        "restart_to_streaming_s": restart,
        "peak_rss_mb": usage.peak_rss_mb,
        "restart_peak_rss_mb": restart_usage.peak_rss_mb,
        "records": wanted,
        "targets": {
            "start_under_5_s": first_start < 5.0 && restart < 5.0,
            "rss_under_200_mb": usage.peak_rss_mb < 200.0,
        },
    }))
}

/// Starts the relay and waits for its `streaming binlog` line: (the relay, seconds).
async fn start(relay_bin: &Path, toml: &str) -> Result<(RelayProcess, f64)> {
    let started = Instant::now();
    let relay = RelayProcess::spawn(relay_bin, toml, &[])?;
    loop {
        if relay.stderr_text().contains("streaming binlog") {
            return Ok((relay, started.elapsed().as_secs_f64()));
        }
        relay.ensure_running()?;
        ensure!(
            started.elapsed() < START_LIMIT,
            "the relay does not stream after {START_LIMIT:?}:\n{}",
            relay.stderr_tail()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Drops every `tenant_%` schema and makes `schemas` × `tables` anew, and the relay's state
/// database with its checkpoint table.
async fn create_schemas(pool: &Pool, schemas: usize, tables: usize) -> Result<()> {
    let mut conn: Conn = pool.get_conn().await?;
    let old: Vec<String> = conn
        .query("SELECT SCHEMA_NAME FROM information_schema.SCHEMATA WHERE SCHEMA_NAME LIKE 'tenant!_%' ESCAPE '!' OR SCHEMA_NAME = 'relay_state'")
        .await?;
    for s in old {
        conn.query_drop(format!("DROP DATABASE `{s}`")).await?;
    }
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let migration = |f: &str| std::fs::read_to_string(root.join("migrations").join(f));
    let outbox = migration("0001_outbox.sql")?;
    conn.query_drop("CREATE DATABASE relay_state").await?;
    conn.query_drop(format!(
        "USE relay_state; {} {}",
        migration("0002_checkpoint.sql")?,
        migration("0003_checkpoint_layouts.sql")?
    ))
    .await?;
    // Two connections make the schemas (the machine has two cores).
    let mut tasks = Vec::new();
    for part in 0..2 {
        let pool = pool.clone();
        let outbox = outbox.clone();
        tasks.push(tokio::spawn(async move {
            let mut conn = pool.get_conn().await?;
            for n in (part..schemas).step_by(2) {
                let mut sql = format!("CREATE DATABASE tenant_{n}; USE tenant_{n}; {outbox}");
                for t in 1..tables {
                    sql.push_str(&format!("CREATE TABLE t{t} LIKE outbox;"));
                }
                conn.query_drop(sql).await?;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}
