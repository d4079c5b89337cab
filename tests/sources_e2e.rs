//! End-to-end tests of many sources in one process (`[[source]]` tables, `sources_dir`),
//! against the real server of the test run and Kafka: each source relays on its own, a source
//! with a wrong password or an unreachable server stops no other, `/readyz` and `/metrics`
//! speak per source, and sources are added, changed and removed without a restart (a change to
//! the folder, or SIGHUP), a removed one with its checkpoint written and its lease released.
//!
//! Expected values come from what the tests wrote (rows, their binlog end), Kafka's records
//! and the state tables, never from the relay's own output.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use mysql_async::prelude::*;
use outbox_relay_testkit::state::lease_lock_name;
use outbox_relay_testkit::{
    commit_rows, compare_positions, current_binlog_position, ensure_exactly_once, free_local_port,
    high_watermark_total, http_get, kafka_bootstrap, metric, source_metric, unique_suffix,
    wait_for_status, wait_until, BinlogPosition, RelayProcess, RowGen, World,
    DEFAULT_CHECKPOINT_TABLE,
};

/// The relay binary under test (built on first use).
fn bin() -> &'static str {
    outbox_relay_testkit::relay_bin()
}

/// Start-up until every good source streams.
const STARTUP: Duration = Duration::from_secs(90);
/// Records reaching Kafka, folder changes applied.
const RELAY_WAIT: Duration = Duration::from_secs(120);
/// A graceful stop until the process has exited.
const STOP: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(200);

/// A fresh folder for one test's source files.
fn folder(tag: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir()
        .join("outbox-relay-tests")
        .join(format!("{tag}_{}", unique_suffix()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

fn write(path: &Path, text: &str) -> Result<()> {
    // Written whole, then renamed: the relay's poll never reads half a file.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}

/// The main file of a many-source process: shared Kafka, the process's HTTP listener, the
/// sources folder polled every 300 ms.
fn main_file(dir: &Path, port: u16) -> String {
    format!(
        "sources_dir = {:?}\nsources_poll_ms = 300\n\n[kafka]\nbootstrap_servers = {:?}\n\n\
         [http]\nlisten = \"127.0.0.1:{port}\"\nready_kafka_ms = 5000\n",
        dir.display().to_string(),
        kafka_bootstrap()
    )
}

/// Writes `n` rows into `w`'s outbox; returns their event keys and the binlog end.
async fn write_rows(
    w: &World,
    gen: &mut RowGen,
    n: usize,
) -> Result<(HashSet<String>, BinlogPosition)> {
    let mut conn = w.db.conn().await?;
    let rows = gen.rows(n);
    commit_rows(&mut conn, &rows).await?;
    let end = current_binlog_position(&mut conn).await?;
    Ok((rows.into_iter().map(|r| r.event_key).collect(), end))
}

/// Whether `w`'s connector's lease is free (no session holds its lock).
async fn lease_is_free(w: &World) -> Result<bool> {
    let lock = lease_lock_name(w.db.name(), DEFAULT_CHECKPOINT_TABLE, w.connector());
    let mut conn = w.db.conn().await?;
    let free: Option<Option<i64>> = conn.exec_first("SELECT IS_FREE_LOCK(?)", (lock,)).await?;
    Ok(free.flatten() == Some(1))
}

/// The `/readyz` body once it satisfies `done`.
async fn wait_readyz(
    relay: &RelayProcess,
    port: u16,
    what: &str,
    done: impl Fn(u16, &str) -> bool,
) -> Result<String> {
    wait_until(what, RELAY_WAIT, POLL, async || {
        relay.ensure_running()?;
        // Not listening yet: the process is starting.
        let Ok((status, body)) = http_get(port, "/readyz").await else {
            return Ok(None);
        };
        Ok(done(status, &body).then_some(body))
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e:#}\n--- relay stderr ---\n{}", relay.stderr_tail()))
}

/// A folder of sources: two relay side by side while one with a wrong password fails and one
/// whose server is unreachable retries, without holding them up; `/readyz` names each; then
/// the folder changes under the running process: the bad sources are removed, a source is
/// added, one is changed (new topic), one is removed (stopped with its checkpoint written and
/// its lease released), and the untouched ones never stop.
#[tokio::test(flavor = "multi_thread")]
async fn a_sources_folder_runs_each_source_on_its_own_and_follows_its_changes() -> Result<()> {
    let a = World::new(bin(), "src_a").await?;
    let b = World::new(bin(), "src_b").await?;
    let c = World::new(bin(), "src_c").await?;
    let dir = folder("sources_d")?;
    let port = free_local_port()?;

    let mut bad = a.spec.clone();
    bad.connector_name = format!("bad-{}", a.uid);
    bad.server_id = 0; // derived from the name
    bad.mysql_url = a
        .spec
        .mysql_url
        .replacen("root@", "root:wrong-password@", 1);
    let mut down = b.spec.clone();
    down.connector_name = format!("down-{}", b.uid);
    down.server_id = 0;
    let closed = free_local_port()?;
    down.mysql_url = format!("mysql://root@127.0.0.1:{closed}/{}", b.db.name());
    for (name, spec) in [
        ("a", &a.spec),
        ("b", &b.spec),
        ("bad", &bad),
        ("down", &down),
    ] {
        write(&dir.join(format!("{name}.toml")), &spec.to_source_toml())?;
    }
    let relay = RelayProcess::spawn(bin(), &main_file(&dir, port), &[])?;

    let (a_name, b_name, c_name) = (a.connector(), b.connector(), c.connector());
    let body = wait_readyz(
        &relay,
        port,
        "a and b to stream while bad fails",
        |status, body| {
            status == 503
                && body.contains(&format!("{a_name}: ready: streaming"))
                && body.contains(&format!("{b_name}: ready: streaming"))
                && body.contains(&format!("{}: not ready: failed", bad.connector_name))
        },
    )
    .await?;
    ensure!(
        body.contains(&format!(
            "{}: not ready: not streaming",
            down.connector_name
        )) || body.contains(&format!("{}: not ready: connecting", down.connector_name))
            || body.contains(&format!("{}: not ready: starting", down.connector_name)),
        "the unreachable source is listed as retrying: {body}"
    );
    let bad_line = body
        .lines()
        .find(|l| l.starts_with(&bad.connector_name))
        .unwrap_or_default();
    ensure!(
        bad_line.contains("ccess denied") && !bad_line.contains("wrong-password"),
        "the bad source's reason names the refusal, not the password: {bad_line}"
    );
    let (status, one) = http_get(port, &format!("/readyz?source={a_name}")).await?;
    ensure!(
        status == 200 && one == "ready: streaming\n",
        "{status} {one}"
    );
    let (status, _) = http_get(port, "/readyz?source=nope").await?;
    ensure!(status == 404, "an unknown source answers 404, not {status}");

    // Both good sources relay while the bad ones fail and retry.
    let mut gen_a = RowGen::new(&a.uid, "a", 4);
    let mut gen_b = RowGen::new(&b.uid, "b", 4);
    let (keys_a, _) = write_rows(&a, &mut gen_a, 20).await?;
    let (keys_b, _) = write_rows(&b, &mut gen_b, 30).await?;
    a.wait_for_keys(&[a.topic("Order")], &keys_a, Some(&relay), RELAY_WAIT)
        .await?;
    b.wait_for_keys(&[b.topic("Order")], &keys_b, Some(&relay), RELAY_WAIT)
        .await?;
    let page = wait_until("the per-source counters", RELAY_WAIT, POLL, async || {
        let (_, page) = http_get(port, "/metrics").await?;
        let produced = |w: &World| {
            source_metric(
                &page,
                w.connector(),
                &format!(
                    "outbox_relay_records_produced_total{{topic=\"{}\"}}",
                    w.topic("Order")
                ),
            )
        };
        Ok((produced(&a) == Some(20.0) && produced(&b) == Some(30.0)).then_some(page.clone()))
    })
    .await?;
    ensure!(
        source_metric(&page, &bad.connector_name, "outbox_relay_source_failed") == Some(1.0),
        "the bad source counts as failed:\n{page}"
    );
    ensure!(
        source_metric(&page, a_name, "outbox_relay_source_failed") == Some(0.0)
            && source_metric(&page, a_name, "outbox_relay_source_connected") == Some(1.0),
        "a streams:\n{page}"
    );

    // The folder changes: the bad sources go, c comes, b moves to a new topic, a goes.
    std::fs::remove_file(dir.join("bad.toml"))?;
    std::fs::remove_file(dir.join("down.toml"))?;
    write(&dir.join("c.toml"), &c.spec.to_source_toml())?;
    let mut b2 = b.spec.clone();
    b2.topic = format!("t_{}.moved.{{aggregate_type}}", b.uid);
    write(&dir.join("b.toml"), &b2.to_source_toml())?;
    let (tail_a, end_a) = write_rows(&a, &mut gen_a, 5).await?;
    a.wait_for_keys(&[a.topic("Order")], &tail_a, Some(&relay), RELAY_WAIT)
        .await?;
    std::fs::remove_file(dir.join("a.toml"))?;

    wait_readyz(
        &relay,
        port,
        "b and c to stream, a and the bad ones gone",
        |status, body| {
            status == 200
                && body.contains(&format!("{b_name}: ready: streaming"))
                && body.contains(&format!("{c_name}: ready: streaming"))
                && !body.contains(a_name)
                && !body.contains(&bad.connector_name)
                && !body.contains(&down.connector_name)
        },
    )
    .await?;
    // a stopped gracefully: its checkpoint covers its last rows and its lease is free.
    wait_until("a's lease to be released", RELAY_WAIT, POLL, async || {
        Ok(lease_is_free(&a).await?.then_some(()))
    })
    .await?;
    let cp = a.checkpoint().await?;
    let mut conn = a.db.conn().await?;
    let order = compare_positions(&mut conn, &cp.position(), &end_a).await?;
    ensure!(
        order.is_ge(),
        "a's final checkpoint {cp:?} covers its last rows ({end_a})"
    );

    // b's new rows go to its new topic, c relays, and a's rows no longer do.
    let (keys_c, _) = write_rows(&c, &mut gen_a_for(&c), 10).await?;
    let (late_a, _) = write_rows(&a, &mut gen_a, 3).await?;
    let (moved_b, _) = write_rows(&b, &mut gen_b, 7).await?;
    c.wait_for_keys(&[c.topic("Order")], &keys_c, Some(&relay), RELAY_WAIT)
        .await?;
    b.wait_for_keys(&[b2.topic_for("Order")], &moved_b, Some(&relay), RELAY_WAIT)
        .await?;
    let on_a = high_watermark_total(&a.spec.bootstrap_servers, &[a.topic("Order")]).await?;
    ensure!(
        on_a == 25,
        "a removed source relays nothing more: {on_a} records on a's topic, {} rows written \
         after it was removed ({late_a:?})",
        late_a.len()
    );
    let (_, page) = http_get(port, "/metrics").await?;
    ensure!(
        !page.contains(&format!("source=\"{a_name}\"")),
        "a's series left /metrics"
    );
    ensure!(
        metric(
            &page,
            "outbox_relay_config_reloads_total{result=\"failed\"}"
        ) == Some(0.0),
        "{page}"
    );

    stop_cleanly(&relay).await?;
    for w in [&b, &c] {
        ensure!(
            lease_is_free(w).await?,
            "{}'s lease released on stop",
            w.connector()
        );
    }
    Ok(())
}

/// SIGTERM, then exit code 0 (every source stopped with its checkpoint written).
async fn stop_cleanly(relay: &RelayProcess) -> Result<()> {
    relay.sigterm()?;
    let status = relay.wait_exit(STOP).await?;
    ensure!(
        status.code() == Some(0),
        "exit {status:?}: {}",
        relay.stderr_tail()
    );
    Ok(())
}

/// A row generator for `w`.
fn gen_a_for(w: &World) -> RowGen {
    RowGen::new(&w.uid, "c", 4)
}

/// `[[source]]` tables in the main file, read again on SIGHUP only (`sources_poll_ms = 0`): a
/// source added by an edit starts after the signal, an invalid edit changes nothing (the
/// running source goes on, the reload counts as failed), and an operator command names the
/// source it acts on with `--source`.
#[tokio::test(flavor = "multi_thread")]
async fn source_tables_are_read_again_on_sighup() -> Result<()> {
    let a = World::new(bin(), "tab_a").await?;
    let b = World::new(bin(), "tab_b").await?;
    let port = free_local_port()?;
    let table = |w: &World| {
        format!(
            "[[source]]\nname = {:?}\n[source.mysql]\nurl = {:?}\n[source.outbox]\ntables = \
             [{:?}]\ntopic = {:?}\n",
            w.connector(),
            w.spec.mysql_url,
            w.db.outbox_table(),
            w.spec.topic
        )
    };
    let head = format!(
        "sources_poll_ms = 0\n\n[kafka]\nbootstrap_servers = {:?}\n[kafka.properties]\n\
         \"linger.ms\" = \"5\"\n\n[checkpoint]\ninterval_ms = 500\n\n[outbox]\ntimestamp = \
         \"column\"\nunknown_xa_commit = \"skip\"\n\n[http]\nlisten = \"127.0.0.1:{port}\"\n\n",
        kafka_bootstrap()
    );
    let relay = RelayProcess::spawn(bin(), &format!("{head}{}", table(&a)), &[])?;
    let path = relay.config_path().to_owned();
    wait_for_status(&relay, port, "/readyz", 200, STARTUP).await?;

    // An operator command on a many-source file needs --source.
    let status_of = |source: Option<&str>| {
        let mut cmd = std::process::Command::new(bin());
        cmd.args(["status", "--config"]).arg(&path);
        if let Some(s) = source {
            cmd.args(["--source", s]);
        }
        cmd.output()
    };
    let out = status_of(None)?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.code() == Some(2) && err.contains("--source") && err.contains(a.connector()),
        "{:?}: {err}",
        out.status
    );
    let out = status_of(Some(a.connector()))?;
    ensure!(
        out.status.success(),
        "status --source {}: {}",
        a.connector(),
        String::from_utf8_lossy(&out.stderr)
    );

    // An invalid edit and SIGHUP: nothing changes, the reload counts as failed.
    write(
        &path,
        &format!("{head}{}\n[[source]]\nname = 7\n", table(&a)),
    )?;
    relay.sighup()?;
    wait_until(
        "the failed reload to be counted",
        RELAY_WAIT,
        POLL,
        async || {
            let (_, page) = http_get(port, "/metrics").await?;
            Ok((metric(
                &page,
                "outbox_relay_config_reloads_total{result=\"failed\"}",
            ) == Some(1.0))
            .then_some(()))
        },
    )
    .await?;
    let mut gen_a = RowGen::new(&a.uid, "a", 3);
    let (keys_a, _) = write_rows(&a, &mut gen_a, 10).await?;
    a.wait_for_keys(&[a.topic("Order")], &keys_a, Some(&relay), RELAY_WAIT)
        .await?;

    // A valid edit adding b (exactly-once, its own transactional producer), and SIGHUP: b
    // starts, a goes on untouched.
    let b_eos = format!(
        "[source.kafka]\ndelivery = \"exactly_once\"\nprogress_topic = \"t_{}.progress\"\n\
         transaction_interval_ms = 50\n",
        b.uid
    );
    write(&path, &format!("{head}{}\n{}{b_eos}", table(&a), table(&b)))?;
    relay.sighup()?;
    let b_name = b.connector().to_owned();
    wait_readyz(&relay, port, "b to stream", |status, body| {
        status == 200 && body.contains(&format!("{b_name}: ready: streaming"))
    })
    .await?;
    let mut gen_b = RowGen::new(&b.uid, "b", 3);
    let (keys_b, _) = write_rows(&b, &mut gen_b, 10).await?;
    let (more_a, _) = write_rows(&a, &mut gen_a, 10).await?;
    let records_b = b
        .wait_for_keys(&[b.topic("Order")], &keys_b, Some(&relay), RELAY_WAIT)
        .await?;
    ensure_exactly_once(&records_b, &keys_b)?;
    a.wait_for_keys(&[a.topic("Order")], &more_a, Some(&relay), RELAY_WAIT)
        .await?;
    let (_, page) = http_get(port, "/metrics").await?;
    ensure!(
        source_metric(
            &page,
            a.connector(),
            &format!(
                "outbox_relay_records_produced_total{{topic=\"{}\"}}",
                a.topic("Order")
            )
        ) == Some(20.0),
        "a was not restarted by the reload (its counter kept counting):\n{page}"
    );
    let a_starts = relay.stderr_text().matches("source starting").count();
    ensure!(
        a_starts == 2,
        "two sources started once each, not {a_starts} starts"
    );

    stop_cleanly(&relay).await?;
    Ok(())
}
