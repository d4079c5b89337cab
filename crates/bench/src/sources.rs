//! `outbox-relay-bench sources` (`make bench-sources`, also the last step of `make bench`): the
//! cost of many idle sources in one process. On the server of `OUTBOX_TEST_SERVER` it creates
//! `BENCH_SOURCES` (default 100) databases, each with an outbox and a state table, and runs the
//! release relay twice over a `sources_dir` folder: with one source, then with all of them.
//! Each run is timed from the process start until `/readyz` answers 200 (every source
//! streaming), then left idle `BENCH_SOURCES_IDLE_SECS` (default 15) before its resident set
//! (`VmRSS`) and threads are read from `/proc`; then it is stopped with SIGTERM, which must end
//! with exit code 0. The cost per idle source is the difference of the two runs' RSS over the
//! sources added. The server's `max_connections` is raised for the run (each source holds about
//! three connections: the lease, the binlog dump and its pool) and put back afterwards.
//!
//! Writes `tests/bench/results/sources.json` and `sources.md` and the block of the book's benchmark page (docs/src/benchmark.md) between
//! `<!-- sources-bench:start -->` and `<!-- sources-bench:end -->`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use mysql_async::prelude::*;
use outbox_relay_testkit::{
    free_local_port, http_get, kafka_bootstrap, test_server, unique_suffix, TestDb,
};
use serde_json::{json, Value};

/// Longest wait for every source to stream.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// One run's figures.
struct Run {
    sources: usize,
    ready_s: f64,
    rss_mb: f64,
    threads: u64,
}

fn log(msg: impl AsRef<str>) {
    eprintln!("[bench-sources] {}", msg.as_ref());
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

/// `VmRSS` (MB) and `Threads` of process `pid`.
fn rss_and_threads(pid: u32) -> Result<(f64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> Option<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    let rss_kb = field("VmRSS:").context("no VmRSS")?;
    Ok((rss_kb as f64 / 1024.0, field("Threads:").unwrap_or(0)))
}

/// Runs the relay over the first `n` of `dbs` and measures it.
async fn run(relay: &Path, dir: &Path, dbs: &[TestDb], n: usize, idle: Duration) -> Result<Run> {
    let folder = dir.join(format!("sources-{n}"));
    std::fs::create_dir_all(&folder)?;
    for (i, db) in dbs.iter().take(n).enumerate() {
        std::fs::write(
            folder.join(format!("s{i:04}.toml")),
            format!(
                "[mysql]\nurl = \"{}\"\n[outbox]\ntables = [\"{}\"]\ntopic = \"bench_sources.{}.{{aggregate_type}}\"\n",
                db.url(),
                db.outbox_table(),
                db.name()
            ),
        )?;
    }
    let port = free_local_port()?;
    let config = dir.join(format!("relay-{n}.toml"));
    std::fs::write(
        &config,
        format!(
            "sources_dir = \"{}\"\n[kafka]\nbootstrap_servers = \"{}\"\n[http]\nlisten = \"127.0.0.1:{port}\"\n",
            folder.display(),
            kafka_bootstrap()
        ),
    )?;
    let log_path = dir.join(format!("relay-{n}.log"));
    let started = Instant::now();
    let mut child = Command::new(relay)
        .args(["run", "--config"])
        .arg(&config)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path)?)
        .spawn()
        .with_context(|| format!("starting {}", relay.display()))?;
    let pid = child.id();
    let ready = loop {
        if let Some(status) = child.try_wait()? {
            anyhow::bail!(
                "the relay exited ({status}) before all sources streamed; see {}",
                log_path.display()
            );
        }
        if let Ok((200, _)) = http_get(port, "/readyz").await {
            break started.elapsed();
        }
        ensure!(
            started.elapsed() < READY_TIMEOUT,
            "{n} sources did not all stream within {READY_TIMEOUT:?}; see {}",
            log_path.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    tokio::time::sleep(idle).await;
    let (rss_mb, threads) = rss_and_threads(pid)?;
    let (_, body) = http_get(port, "/readyz").await?;
    let ready_lines = body
        .lines()
        .filter(|l| l.contains(": ready: streaming"))
        .count();
    ensure!(
        ready_lines == n,
        "after the idle time {ready_lines} of {n} sources stream:\n{body}"
    );
    nix_kill(pid)?;
    let status = child.wait()?;
    ensure!(
        status.code() == Some(0),
        "the relay of {n} sources stopped with {status}; see {}",
        log_path.display()
    );
    log(format!(
        "{n} sources: ready in {:.2} s, idle RSS {rss_mb:.1} MB, {threads} threads",
        ready.as_secs_f64()
    ));
    Ok(Run {
        sources: n,
        ready_s: ready.as_secs_f64(),
        rss_mb,
        threads,
    })
}

fn nix_kill(pid: u32) -> Result<()> {
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()?;
    ensure!(status.success(), "kill -TERM {pid} failed");
    Ok(())
}

/// The whole measurement (see the module documentation).
pub async fn measure(relay: &Path, out: &Path, readme: Option<&Path>) -> Result<()> {
    ensure!(
        relay.exists(),
        "{} does not exist: build it with `cargo build --release -p outbox-relay`",
        relay.display()
    );
    let n: usize = env_or("BENCH_SOURCES", "100")
        .parse()
        .context("BENCH_SOURCES")?;
    ensure!(n >= 2, "BENCH_SOURCES must be at least 2");
    let idle = Duration::from_secs(
        env_or("BENCH_SOURCES_IDLE_SECS", "15")
            .parse()
            .context("BENCH_SOURCES_IDLE_SECS")?,
    );
    let server = test_server();
    let pool = mysql_async::Pool::new(outbox_relay_testkit::mysql_url(None).as_str());
    let mut conn = pool.get_conn().await?;
    let version: String = conn
        .query_first("SELECT VERSION()")
        .await?
        .context("no version")?;
    let max_conn: u64 = conn
        .query_first("SELECT @@global.max_connections")
        .await?
        .context("no max_connections")?;
    // The relay's ~3 per source, plus the pools of the test databases (`TestDb`) this
    // harness keeps open.
    let wanted = (n as u64) * 8 + 200;
    if max_conn < wanted {
        conn.query_drop(format!("SET GLOBAL max_connections = {wanted}"))
            .await?;
    }
    log(format!(
        "creating {n} databases on {} ({version})",
        server.name()
    ));
    let mut dbs = Vec::with_capacity(n);
    for _ in 0..n {
        dbs.push(TestDb::create("bsrc").await?);
    }
    let dir = std::env::temp_dir().join(format!("outbox-relay-bench-sources-{}", unique_suffix()));
    std::fs::create_dir_all(&dir)?;
    let result = async {
        let one = run(relay, &dir, &dbs, 1, idle).await?;
        let all = run(relay, &dir, &dbs, n, idle).await?;
        anyhow::Ok((one, all))
    }
    .await;
    for db in dbs {
        db.drop_database().await.ok();
    }
    if max_conn < wanted {
        conn.query_drop(format!("SET GLOBAL max_connections = {max_conn}"))
            .await
            .ok();
    }
    let (one, all) =
        result.with_context(|| format!("the relay's logs are kept in {}", dir.display()))?;
    std::fs::remove_dir_all(&dir).ok();
    let per_source = (all.rss_mb - one.rss_mb) / (all.sources - one.sources) as f64;
    let figures = json!({
        "server": server.name(),
        "server_version": version,
        "sources": all.sources,
        "idle_secs": idle.as_secs(),
        "one": {"ready_s": one.ready_s, "rss_mb": one.rss_mb, "threads": one.threads},
        "all": {"ready_s": all.ready_s, "rss_mb": all.rss_mb, "threads": all.threads},
        "per_source_mb": per_source,
        "targets": {
            "all_rss_under_1024_mb": all.rss_mb < 1024.0,
            "per_source_under_10_mb": per_source < 10.0,
            "ready_under_10_s": all.ready_s < 10.0,
        },
    });
    let table = markdown(&figures);
    std::fs::create_dir_all(out)?;
    std::fs::write(
        out.join("sources.json"),
        serde_json::to_string_pretty(&figures)? + "\n",
    )?;
    std::fs::write(out.join("sources.md"), &table)?;
    if let Some(readme) = readme {
        write_readme(readme, &table)?;
    }
    print!("{table}");
    Ok(())
}

fn markdown(v: &Value) -> String {
    let f = |p: &str| v.pointer(p).and_then(Value::as_f64).unwrap_or(f64::NAN);
    let u = |p: &str| v.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    let yes = |p: &str| {
        if v.pointer(p).and_then(Value::as_bool) == Some(true) {
            "met"
        } else {
            "**missed**"
        }
    };
    format!(
        "| sources in one process | all streaming after | idle RSS | threads |\n\
         | ---: | ---: | ---: | ---: |\n\
         | 1 | {:.2} s | {:.0} MB | {} |\n\
         | {} | {:.2} s | {:.0} MB | {} |\n\n\
         Per idle source: **{:.1} MB** (target under 10 MB: {}); {} sources within 1 GiB: {}; \
         started in under 10 s: {}. {} {}, Kafka on loopback, idle {} s before reading \
         `/proc/<pid>/status`; `make bench-sources` (BENCH_SOURCES={}).\n",
        f("/one/ready_s"),
        f("/one/rss_mb"),
        u("/one/threads"),
        u("/sources"),
        f("/all/ready_s"),
        f("/all/rss_mb"),
        u("/all/threads"),
        f("/per_source_mb"),
        yes("/targets/per_source_under_10_mb"),
        u("/sources"),
        yes("/targets/all_rss_under_1024_mb"),
        yes("/targets/ready_under_10_s"),
        v["server"].as_str().unwrap_or("?"),
        v["server_version"].as_str().unwrap_or("?"),
        u("/idle_secs"),
        u("/sources"),
    )
}

fn write_readme(readme: &Path, table: &str) -> Result<()> {
    let (start, end) = ("<!-- sources-bench:start -->", "<!-- sources-bench:end -->");
    let text = std::fs::read_to_string(readme)?;
    let (Some(a), Some(b)) = (text.find(start), text.find(end)) else {
        log(format!(
            "{} has no {start} block: not updated",
            readme.display()
        ));
        return Ok(());
    };
    let updated = format!(
        "{}{start}\n{table}{end}{}",
        &text[..a],
        &text[b + end.len()..]
    );
    std::fs::write(readme, updated)?;
    Ok(())
}
