//! End-to-end tests of a fleet (`[fleet]`): relay processes sharing one configuration's
//! sources through a Kafka consumer group, against the real server of the test run and Kafka.
//! Each test has its own group and control topic.
//!
//! Who runs a source is read from what the processes and the server say, never from the
//! relay's own bookkeeping alone: each process's `/readyz` body (the sources it streams), the
//! state rows' `lease_owner` (`host:pid`) and `lease_token` (a new token is a new run), and the
//! records on Kafka.
//!
//! The failover figures are printed (`cargo test -p outbox-relay-e2e --test fleet_e2e --
//! --nocapture | grep 'fleet:'`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use outbox_relay_kafka::fleet::source_partition;
use outbox_relay_testkit::kafka::{read_all_records, read_committed_records};
use outbox_relay_testkit::state::read_state_row;
use outbox_relay_testkit::{
    commit_rows, ensure_exactly_once, ensure_per_key_order, expect_exit_code, free_local_port,
    http_get, kafka_bootstrap, metric, unique_suffix, wait_for_stderr, wait_until, RelayProcess,
    RowGen, World, DEFAULT_CHECKPOINT_TABLE,
};

fn bin() -> &'static str {
    outbox_relay_testkit::relay_bin()
}

/// Start-up and rebalances until every source streams somewhere.
const SETTLE: Duration = Duration::from_secs(90);
/// Records reaching Kafka.
const RELAY_WAIT: Duration = Duration::from_secs(60);
const STOP: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(200);
/// The failover bound the tests hold the fleet to (session timeout 6 s + lease TTL 8 s, with
/// room for a loaded machine).
const FAILOVER_LIMIT: Duration = Duration::from_secs(20);

/// One fleet under test: its sources folder and the main file's settings.
struct Fleet {
    dir: PathBuf,
    group: String,
    worlds: Vec<World>,
    gens: Vec<RowGen>,
}

/// A process of the fleet.
struct Member {
    relay: RelayProcess,
    port: u16,
}

impl Fleet {
    /// `n` sources, one database each, named so that each has a control-topic partition of
    /// its own among `n` (so `n` partitions spread them evenly over the members).
    async fn new(tag: &str, n: usize) -> Result<Self> {
        Self::new_with(tag, n, |_| {}).await
    }

    /// [`Fleet::new`] with each source's spec changed by `tune` before its file is written.
    async fn new_with(tag: &str, n: usize, tune: impl Fn(&mut World)) -> Result<Self> {
        let dir = std::env::temp_dir()
            .join("outbox-relay-tests")
            .join(format!("{tag}_{}", unique_suffix()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut worlds = Vec::new();
        let mut used = HashSet::new();
        for i in 0..n {
            let mut w = World::new(bin(), &format!("{tag}{i}")).await?;
            let base = w.spec.connector_name.clone();
            let name = (0..)
                .map(|k| format!("{base}-{k}"))
                .find(|name| used.insert(source_partition(name, n as i32)))
                .context("a free partition")?;
            w.spec.connector_name = name;
            // Each process of the fleet derives its own server_id (a written one is refused).
            w.spec.server_id = 0;
            tune(&mut w);
            std::fs::write(
                dir.join(format!("{}.toml", w.connector())),
                w.spec.to_source_toml(),
            )?;
            worlds.push(w);
        }
        let gens = worlds.iter().map(|w| RowGen::new(&w.uid, "f", 3)).collect();
        Ok(Self {
            dir,
            group: format!("fleet-{tag}-{}", unique_suffix()),
            worlds,
            gens,
        })
    }

    /// The main file of a member listening on `port`, joining through `bootstrap`, with
    /// `extra` (top-level tables such as `[retry]`) appended.
    fn main_file(&self, port: u16, bootstrap: &str, extra: &str) -> String {
        format!(
            "sources_dir = {:?}\nsources_poll_ms = 0\n\n[kafka]\nbootstrap_servers = {:?}\n\n\
             [http]\nlisten = \"127.0.0.1:{port}\"\nready_kafka_ms = 5000\n\n[fleet]\n\
             enabled = true\ngroup_id = {:?}\ncontrol_topic = {:?}\npartitions = {}\n\n{extra}",
            self.dir.display().to_string(),
            bootstrap,
            self.group,
            self.group,
            self.worlds.len()
        )
    }

    fn spawn(&self) -> Result<Member> {
        self.spawn_with(&kafka_bootstrap(), "")
    }

    /// A member joining through `bootstrap`, its main file ending with `extra`.
    fn spawn_with(&self, bootstrap: &str, extra: &str) -> Result<Member> {
        let port = free_local_port()?;
        let relay = RelayProcess::spawn(bin(), &self.main_file(port, bootstrap, extra), &[])?;
        Ok(Member { relay, port })
    }

    /// Writes `n` rows to every source; returns their event keys per source.
    async fn write_all(&mut self, n: usize) -> Result<Vec<HashSet<String>>> {
        Ok(self
            .write_all_ordered(n)
            .await?
            .into_iter()
            .map(|keys| keys.into_iter().collect())
            .collect())
    }

    /// Writes `n` rows to every source (one transaction each); returns their event keys per
    /// source in commit order.
    async fn write_all_ordered(&mut self, n: usize) -> Result<Vec<Vec<String>>> {
        let mut keys = Vec::new();
        for (w, gen) in self.worlds.iter().zip(self.gens.iter_mut()) {
            let rows = gen.rows(n);
            let mut conn = w.db.conn().await?;
            commit_rows(&mut conn, &rows).await?;
            keys.push(rows.into_iter().map(|r| r.event_key).collect());
        }
        Ok(keys)
    }

    async fn wait_keys(&self, keys: &[HashSet<String>], members: &[&Member]) -> Result<()> {
        let tails = members
            .iter()
            .map(|m| m.relay.stderr_tail())
            .collect::<Vec<_>>()
            .join("\n---\n");
        for (w, k) in self.worlds.iter().zip(keys) {
            w.wait_for_keys(&[w.topic("Order")], k, None, RELAY_WAIT)
                .await
                .with_context(|| format!("source {}\n{tails}", w.connector()))?;
        }
        Ok(())
    }

    /// (lease_owner pid, lease_token) of every source's state row ((None, 0) before a
    /// source's first lease).
    async fn leases(&self) -> Result<BTreeMap<String, (Option<u32>, u64)>> {
        let mut out = BTreeMap::new();
        for w in &self.worlds {
            let row = read_state_row(w.db.pool(), DEFAULT_CHECKPOINT_TABLE, w.connector()).await?;
            out.insert(
                w.connector().to_owned(),
                row.map_or((None, 0), |r| (r.lease_owner_pid(), r.lease_token)),
            );
        }
        Ok(out)
    }

    /// Waits until every source streams in exactly one of `members` (its `/readyz` body),
    /// that member's pid holds its lease (state row), and each member runs between `min` and
    /// `max` sources; returns the source → member index map.
    async fn wait_settled(
        &self,
        members: &[&Member],
        min: usize,
        max: usize,
    ) -> Result<BTreeMap<String, usize>> {
        let names: Vec<String> = self
            .worlds
            .iter()
            .map(|w| w.connector().to_owned())
            .collect();
        wait_until("the fleet to settle", SETTLE, POLL, async || {
            let mut runs: BTreeMap<String, Vec<usize>> = BTreeMap::new();
            let mut counts = vec![0usize; members.len()];
            for (i, m) in members.iter().enumerate() {
                m.relay.ensure_running()?;
                let Ok((_, body)) = http_get(m.port, "/readyz").await else {
                    return Ok(None);
                };
                for name in &names {
                    if body.contains(&format!("{name}: ready: streaming")) {
                        runs.entry(name.clone()).or_default().push(i);
                        counts[i] += 1;
                    } else if body.contains(&format!("{name}:")) {
                        // Listed but not streaming yet (starting, waiting for its lease).
                        counts[i] += 1;
                    }
                }
            }
            if counts.iter().any(|&c| c < min || c > max) {
                return Ok(None);
            }
            let leases = self.leases().await?;
            let mut owner = BTreeMap::new();
            for name in &names {
                let Some([i]) = runs.get(name).map(Vec::as_slice) else {
                    return Ok(None);
                };
                if leases.get(name).and_then(|l| l.0) != Some(members[*i].relay.pid()) {
                    return Ok(None);
                }
                owner.insert(name.clone(), *i);
            }
            Ok(Some(owner))
        })
        .await
        .map_err(|e| {
            let tails = members
                .iter()
                .map(|m| m.relay.stderr_tail())
                .collect::<Vec<_>>()
                .join("\n---\n");
            anyhow::anyhow!("{e:#}\n{tails}")
        })
    }

    /// Every record of every source's topic, per source name.
    async fn records(&self) -> Result<HashMap<String, Vec<outbox_relay_testkit::kafka::Record>>> {
        let mut out = HashMap::new();
        for w in &self.worlds {
            let records =
                read_all_records(&w.spec.bootstrap_servers, &[w.topic("Order")], RELAY_WAIT)
                    .await?;
            out.insert(w.connector().to_owned(), records);
        }
        Ok(out)
    }
}

/// Per key, in partition order, each row's first record comes after the first records of the
/// rows written before it (re-sends after a failover repeat earlier rows: allowed).
fn check_key_order(source: &str, records: &[outbox_relay_testkit::kafka::Record]) -> Result<()> {
    let mut by_key: BTreeMap<(i32, String), Vec<(i64, u64)>> = BTreeMap::new();
    for r in records {
        let n = r
            .value_str()
            .and_then(|v| serde_json::from_str::<serde_json::Value>(v).ok())
            .and_then(|v| v.get("n").and_then(serde_json::Value::as_u64))
            .context("a payload with n")?;
        by_key
            .entry((r.partition, r.key_str().unwrap_or_default().to_owned()))
            .or_default()
            .push((r.offset, n));
    }
    for ((_, key), mut seq) in by_key {
        seq.sort_unstable();
        let mut seen = HashSet::new();
        let mut last = None;
        for (offset, n) in seq {
            if seen.insert(n) {
                ensure!(
                    last.is_none_or(|l| n > l),
                    "{source}: key {key}: row {n} first appears at offset {offset}, after row {last:?}"
                );
                last = Some(n);
            }
        }
    }
    Ok(())
}

async fn stop_cleanly(members: &[&Member]) -> Result<()> {
    for m in members {
        m.relay.sigterm()?;
    }
    for m in members {
        let status = m.relay.wait_exit(STOP).await?;
        ensure!(
            status.code() == Some(0),
            "exit {status:?}: {}",
            m.relay.stderr_tail()
        );
    }
    Ok(())
}

/// `fleet status --json` of `config`.
fn fleet_status(config: &Path) -> Result<serde_json::Value> {
    let out = std::process::Command::new(bin())
        .args(["fleet", "status", "--json", "--config"])
        .arg(config)
        .output()?;
    ensure!(
        out.status.success(),
        "fleet status: {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// Three processes share six sources (two each, every source in exactly one process);
/// `fleet status` names the owners; kill -9 of one moves its sources to the survivors within
/// the failover bound with no row lost; a fourth process joins and takes a share while the
/// sources that keep their owner are not restarted (same lease token).
#[tokio::test(flavor = "multi_thread")]
async fn a_fleet_shares_its_sources_fails_over_and_takes_in_a_new_process() -> Result<()> {
    let mut fleet = Fleet::new("fl", 6).await?;
    let (a, b, c) = (fleet.spawn()?, fleet.spawn()?, fleet.spawn()?);
    let owners = fleet.wait_settled(&[&a, &b, &c], 2, 2).await?;
    let keys = fleet.write_all(10).await?;
    fleet.wait_keys(&keys, &[&a, &b, &c]).await?;

    // fleet status: every source running, owned by the process holding its lease.
    let status = fleet_status(a.relay.config_path())?;
    let sources = status["sources"].as_array().context("sources")?;
    ensure!(sources.len() == 6, "{status}");
    for s in sources {
        ensure!(
            s["state"] == "running" && s["owner"].is_string() && s["owner"] == s["lease"]["owner"],
            "each source owned by the process holding its lease: {s}"
        );
    }
    ensure!(
        status["members"].as_array().map(Vec::len) == Some(3)
            && status["spread"]["min"] == 2
            && status["spread"]["max"] == 2,
        "{status}"
    );

    // kill -9 of a: its sources go to b and c; rows written meanwhile all arrive.
    let moved: Vec<String> = owners
        .iter()
        .filter(|(_, &i)| i == 0)
        .map(|(n, _)| n.clone())
        .collect();
    let before = fleet.leases().await?;
    a.relay.kill9()?;
    let killed = Instant::now();
    let during = fleet.write_all(5).await?;
    let owners = fleet.wait_settled(&[&b, &c], 3, 3).await?;
    let failover = killed.elapsed();
    println!(
        "fleet: kill -9 of a process with {} sources: running on the survivors after {:.1} s",
        moved.len(),
        failover.as_secs_f64()
    );
    ensure!(
        failover < FAILOVER_LIMIT,
        "failover took {failover:?} (limit {FAILOVER_LIMIT:?})"
    );
    let after = fleet.write_all(5).await?;
    fleet.wait_keys(&during, &[&b, &c]).await?;
    fleet.wait_keys(&after, &[&b, &c]).await?;
    let leases = fleet.leases().await?;
    for name in &moved {
        ensure!(leases[name].1 > before[name].1, "{name} took a new lease");
    }

    // A fourth process joins: it takes a share; the sources that keep their owner are not
    // restarted. Until it has joined, its /readyz says so and answers 503.
    let before = fleet.leases().await?;
    let d = fleet.spawn()?;
    let spawned = Instant::now();
    let (watch_stop, watch) = watch_readyz(d.port);
    let joined = fleet.wait_settled(&[&b, &c, &d], 2, 2).await?;
    let join_time = spawned.elapsed();
    let _ = watch_stop.send(());
    let seen = watch.await??;
    println!(
        "fleet: a new process took its share (2 of 6 sources) in {:.1} s (from spawn until they \
         stream there and it holds their leases)",
        join_time.as_secs_f64()
    );
    check_join_answers(&seen, &fleet.group)?;
    for m in [&b, &c, &d] {
        let (code, body) = http_get(m.port, "/readyz").await?;
        ensure!(
            code == 200
                && body.starts_with(&format!("fleet: joined group {} (generation ", fleet.group))
                && body
                    .lines()
                    .next()
                    .is_some_and(|l| l.ends_with(", 2 of 6 partitions)")),
            "a member of the settled fleet says it joined with 2 of 6 partitions: {code} {body}"
        );
        let (_, page) = http_get(m.port, "/metrics").await?;
        ensure!(
            metric(&page, "outbox_relay_fleet_joined") == Some(1.0),
            "outbox_relay_fleet_joined 1 once joined:\n{page}"
        );
    }
    let leases = fleet.leases().await?;
    let mut kept = 0;
    for (name, &i) in &joined {
        let was = owners[name];
        if i == was {
            kept += 1;
            ensure!(
                leases[name].1 == before[name].1,
                "{name} kept its owner and was not restarted: token {} → {}",
                before[name].1,
                leases[name].1
            );
        } else {
            ensure!(i == 2, "{name} moved only to the new process");
        }
    }
    ensure!(kept == 4, "four sources kept their owner, not {kept}");
    let last = fleet.write_all(5).await?;
    fleet.wait_keys(&last, &[&b, &c, &d]).await?;
    for (name, records) in fleet.records().await? {
        check_key_order(&name, &records)?;
    }
    stop_cleanly(&[&b, &c, &d]).await?;
    Ok(())
}

/// Every (status, body) a `/readyz` watch saw.
type Answers = tokio::task::JoinHandle<Result<Vec<(u16, String)>>>;

/// Polls `/readyz` on `port` every 100 ms until told to stop; returns every (status, body)
/// answered (none while the listener is not up yet).
fn watch_readyz(port: u16) -> (tokio::sync::oneshot::Sender<()>, Answers) {
    let (tx, mut rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let mut seen = Vec::new();
        loop {
            if let Ok(answer) = http_get(port, "/readyz").await {
                seen.push(answer);
            }
            tokio::select! {
                _ = &mut rx => return Ok(seen),
                () = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
    });
    (tx, task)
}

/// A joining process's `/readyz` answers: each starts with its membership line; it answered
/// 503 `fleet: not joined (…)` before joining (its listener is up before it asks Kafka
/// anything, and a rebalance takes far longer than the 100 ms between two polls); a 200 comes
/// only after it joined `group`.
fn check_join_answers(seen: &[(u16, String)], group: &str) -> Result<()> {
    let not_joined = seen
        .iter()
        .filter(|(_, body)| body.starts_with("fleet: not joined ("))
        .count();
    ensure!(
        not_joined > 0,
        "no 'fleet: not joined' answer before the process joined: {seen:?}"
    );
    for (code, body) in seen {
        let first = body.lines().next().unwrap_or_default();
        if first.starts_with("fleet: not joined (") {
            ensure!(*code == 503, "not joined yet but {code}: {body}");
        } else {
            ensure!(
                first.starts_with(&format!("fleet: joined group {group} (generation ")),
                "the membership line first: {body}"
            );
        }
    }
    Ok(())
}

/// With Kafka unreachable, joining follows the top-level `[retry]`: with `max_attempts = 3`
/// the process exits 1 after the third failed attempt, naming the bootstrap servers, the group
/// and the fix; without `max_attempts` it keeps retrying, its `/readyz` answers 503 `fleet: not
/// joined (…)` and `outbox_relay_fleet_joined` is 0, and it stops cleanly on SIGTERM.
#[tokio::test(flavor = "multi_thread")]
async fn joining_follows_the_retry_policy_while_kafka_is_unreachable() -> Result<()> {
    let fleet = Fleet::new("fr", 1).await?;
    let closed = format!("127.0.0.1:{}", free_local_port()?); // nothing listens
    let retry = "[retry]\ninitial_backoff_ms = 100\nmax_backoff_ms = 400\n";
    let bounded = fleet.spawn_with(&closed, &format!("{retry}max_attempts = 3\n"))?;
    let forever = fleet.spawn_with(&closed, retry)?;
    let started = Instant::now();

    let not_joined = format!(
        "fleet: not joined (cannot join group {}: attempt ",
        fleet.group
    );
    let (code, body) = wait_until("/readyz to say not joined", SETTLE, POLL, async || {
        forever.relay.ensure_running()?;
        let Ok((code, body)) = http_get(forever.port, "/readyz").await else {
            return Ok(None);
        };
        Ok(body.contains(&not_joined).then_some((code, body)))
    })
    .await?;
    ensure!(
        code == 503 && body.contains(&closed),
        "not ready before joining, naming the error: {code} {body}"
    );

    // 3 attempts of at most 10 s each (a broker's first answer) and two short backoffs.
    let status = bounded.relay.wait_exit(Duration::from_secs(60)).await?;
    let gave_up = started.elapsed();
    expect_exit_code(status, 1, &bounded.relay)?;
    println!(
        "fleet: Kafka unreachable, retry.max_attempts = 3: the process exited 1 after {:.1} s",
        gave_up.as_secs_f64()
    );
    ensure!(
        gave_up < Duration::from_secs(45),
        "gave up after {gave_up:?}"
    );
    let stderr = bounded.relay.stderr_text();
    for n in 1..=2 {
        ensure!(
            stderr.contains(&format!("attempt={n}")),
            "retry {n} logged:\n{stderr}"
        );
    }
    ensure!(
        !stderr.contains("attempt=3"),
        "the third failure ends the process:\n{stderr}"
    );
    let last = stderr
        .lines()
        .rev()
        .find(|l| l.contains("ERROR"))
        .unwrap_or_default();
    for part in [
        format!("fleet: cannot join group {:?}", fleet.group),
        format!("kafka.bootstrap_servers = {closed:?}"),
        "gave up after 3 attempts (retry.max_attempts = 3".to_owned(),
        "Fix: make a broker of".to_owned(),
    ] {
        ensure!(
            last.contains(&part),
            "the final error names {part:?}: {last}"
        );
    }

    // Without max_attempts: still retrying, not ready, not joined.
    forever.relay.ensure_running()?;
    let (code, body) = http_get(forever.port, "/readyz").await?;
    ensure!(
        code == 503 && body.starts_with("fleet: not joined ("),
        "{code} {body}"
    );
    let (_, page) = http_get(forever.port, "/metrics").await?;
    ensure!(
        metric(&page, "outbox_relay_fleet_joined") == Some(0.0),
        "outbox_relay_fleet_joined 0 before joining:\n{page}"
    );
    // It retries past the third failure (where the bounded process gave up).
    wait_for_stderr(&forever.relay, "attempt=3", Duration::from_secs(30)).await?;
    stop_cleanly(&[&forever]).await?;
    Ok(())
}

/// A fleet of exactly-once sources: two processes, four sources (each with its own progress
/// topic); rows written before, during and after a kill -9 of the process owning two of them
/// are each read once by a `read_committed` consumer, none missing, in commit order per key.
#[tokio::test(flavor = "multi_thread")]
async fn a_fleet_of_exactly_once_sources_fails_over_without_duplicates() -> Result<()> {
    let mut fleet = Fleet::new_with("fe", 4, |w| {
        w.spec.kafka_extra = format!(
            "delivery = \"exactly_once\"\nprogress_topic = \"t_{}.progress\"\n\
             transaction_interval_ms = 50\n",
            w.uid
        );
    })
    .await?;
    let (a, b) = (fleet.spawn()?, fleet.spawn()?);
    let owners = fleet.wait_settled(&[&a, &b], 2, 2).await?;
    let mut keys: Vec<Vec<String>> = vec![Vec::new(); fleet.worlds.len()];
    let add = |keys: &mut Vec<Vec<String>>, new: Vec<Vec<String>>| {
        for (all, k) in keys.iter_mut().zip(new) {
            all.extend(k);
        }
    };
    for _ in 0..4 {
        add(&mut keys, fleet.write_all_ordered(5).await?);
    }
    let sets = |keys: &[Vec<String>]| -> Vec<HashSet<String>> {
        keys.iter().map(|k| k.iter().cloned().collect()).collect()
    };
    fleet.wait_keys(&sets(&keys), &[&a, &b]).await?;

    let moved: Vec<String> = owners
        .iter()
        .filter(|(_, &i)| i == 0)
        .map(|(n, _)| n.clone())
        .collect();
    let before = fleet.leases().await?;
    a.relay.kill9()?;
    let killed = Instant::now();
    for _ in 0..2 {
        add(&mut keys, fleet.write_all_ordered(5).await?);
    }
    fleet.wait_settled(&[&b], 4, 4).await?;
    let failover = killed.elapsed();
    println!(
        "fleet: exactly-once, kill -9 of a process with {} sources: running on the survivor \
         after {:.1} s",
        moved.len(),
        failover.as_secs_f64()
    );
    ensure!(
        failover < FAILOVER_LIMIT,
        "failover took {failover:?} (limit {FAILOVER_LIMIT:?})"
    );
    let leases = fleet.leases().await?;
    for name in &moved {
        ensure!(leases[name].1 > before[name].1, "{name} took a new lease");
    }
    for _ in 0..2 {
        add(&mut keys, fleet.write_all_ordered(5).await?);
    }
    fleet.wait_keys(&sets(&keys), &[&b]).await?;
    stop_cleanly(&[&b]).await?;

    for (w, k) in fleet.worlds.iter().zip(&keys) {
        let records =
            read_committed_records(&w.spec.bootstrap_servers, &[w.topic("Order")], RELAY_WAIT)
                .await?;
        let expected: HashSet<String> = k.iter().cloned().collect();
        ensure_exactly_once(&records, &expected)
            .with_context(|| format!("source {}", w.connector()))?;
        let order: HashMap<String, usize> =
            k.iter().enumerate().map(|(i, k)| (k.clone(), i)).collect();
        ensure_per_key_order(&records, &order)
            .with_context(|| format!("source {}", w.connector()))?;
    }
    Ok(())
}

/// A process frozen (SIGSTOP) for longer than the session timeout and the lease TTL loses its
/// sources to the survivor, whose rows keep flowing; once resumed (SIGCONT) it produces
/// nothing for them: each row written while it was frozen is on Kafka exactly once, per-key
/// order holds, and the moved sources' lease tokens are the survivor's. It then rejoins and
/// takes a share again.
#[tokio::test(flavor = "multi_thread")]
async fn a_frozen_process_produces_nothing_after_it_resumes() -> Result<()> {
    let mut fleet = Fleet::new("fz", 4).await?;
    let (a, b) = (fleet.spawn()?, fleet.spawn()?);
    let owners = fleet.wait_settled(&[&a, &b], 2, 2).await?;
    let keys = fleet.write_all(10).await?;
    fleet.wait_keys(&keys, &[&a, &b]).await?;
    let frozen: Vec<String> = owners
        .iter()
        .filter(|(_, &i)| i == 0)
        .map(|(n, _)| n.clone())
        .collect();
    let before = fleet.leases().await?;

    a.relay.pause()?;
    let stopped = Instant::now();
    let mut during: Vec<HashSet<String>> = vec![HashSet::new(); fleet.worlds.len()];
    let mut took_over = None;
    // Frozen for longer than session timeout + lease TTL (14 s), rows written all along.
    while stopped.elapsed() < Duration::from_secs(16) {
        for (all, new) in during.iter_mut().zip(fleet.write_all(1).await?) {
            all.extend(new);
        }
        if took_over.is_none() {
            let leases = fleet.leases().await?;
            if frozen
                .iter()
                .all(|n| leases[n].0 == Some(b.relay.pid()) && leases[n].1 > before[n].1)
            {
                took_over = Some(stopped.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    fleet.wait_keys(&during, &[&b]).await?;
    let took_over = took_over.context("the survivor took the frozen process's sources")?;
    println!(
        "fleet: SIGSTOP of a process with {} sources: their leases taken by the survivor after \
         {:.1} s",
        frozen.len(),
        took_over.as_secs_f64()
    );
    ensure!(took_over < FAILOVER_LIMIT, "takeover took {took_over:?}");

    a.relay.resume()?;
    // It finds its membership lost and rejoins: a share again.
    fleet.wait_settled(&[&a, &b], 2, 2).await?;
    let last = fleet.write_all(5).await?;
    fleet.wait_keys(&last, &[&a, &b]).await?;

    let records = fleet.records().await?;
    for (w, rows) in fleet.worlds.iter().zip(&during) {
        let on_kafka = &records[w.connector()];
        check_key_order(w.connector(), on_kafka)?;
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for r in on_kafka {
            if let Some(k) = r.header("event_key") {
                *counts.entry(k).or_default() += 1;
            }
        }
        for k in rows {
            ensure!(
                counts.get(k.as_str()) == Some(&1),
                "{}: row {k} written while a was frozen is on Kafka {:?} times",
                w.connector(),
                counts.get(k.as_str())
            );
        }
    }
    let log = a.relay.stderr_text();
    ensure!(
        log.contains("partitions revoked"),
        "the resumed process gave its sources up: {}",
        a.relay.stderr_tail()
    );
    stop_cleanly(&[&a, &b]).await?;
    Ok(())
}
