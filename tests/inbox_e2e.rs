//! The shared inbox scenarios (`inbox/scenarios/scenarios.json`, `inbox/CONTRACT.md`) against
//! every consumer helper: Rust, Java, Go and Python (`OUTBOX_INBOX_LANGS`, default all four;
//! built by `make inbox`). For each scenario and language: a fresh database with the outbox,
//! the inbox tables and a `coupons` table without a unique key; the relay producing the outbox
//! rows to Kafka; the language's scenario consumer as a child process; the faults the scenario
//! names (redeliveries, exit 137 at a point, a rebalance, versions, a poison record). The
//! outcome is counted in the database: coupons per event_key, and on the dead-letter topic.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use mysql_async::prelude::Queryable;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::Value;

use outbox_relay_testkit::{
    collect_records, describe_exit, mysql_port, next_server_id, unique_suffix, wait_until, Record,
    RelayConfigSpec, RelayProcess, TestDb,
};

/// The relay binary under test (built on first use).
fn bin() -> &'static str {
    outbox_relay_testkit::relay_bin()
}
/// Records and database state the scenario waits for.
const WAIT: Duration = Duration::from_secs(120);
const POLL: Duration = Duration::from_millis(100);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Where the Java, Go and Python scenario consumers are: `OUTBOX_INBOX_HELPERS_DIR` (an `inbox/`
/// folder of another checkout, to run these scenarios against helpers built there), else this
/// repository's `inbox/`.
fn helpers_dir() -> PathBuf {
    std::env::var_os("OUTBOX_INBOX_HELPERS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("inbox"))
}

/// A helper's scenario consumer: the command line of `inbox/CONTRACT.md`.
#[derive(Debug, Clone)]
struct Lang {
    name: String,
    program: PathBuf,
    args: Vec<String>,
}

fn langs() -> Result<Vec<Lang>> {
    let wanted =
        std::env::var("OUTBOX_INBOX_LANGS").unwrap_or_else(|_| "rust,java,go,python".into());
    // target/debug/deps/inbox_e2e-… -> target/debug/examples/scenario_consumer
    let exe = std::env::current_exe()?;
    let target_debug = exe
        .parent()
        .and_then(Path::parent)
        .context("the test binary is not in target/<profile>/deps")?;
    let mut out = Vec::new();
    for name in wanted.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (program, args): (PathBuf, Vec<String>) = match name {
            "rust" => (target_debug.join("examples/scenario_consumer"), vec![]),
            "java" => (helpers_dir().join("java/run-scenario-consumer"), vec![]),
            "go" => (helpers_dir().join("go/bin/scenario-consumer"), vec![]),
            "python" => (
                helpers_dir().join("python/.venv/bin/python"),
                vec![
                    "-m".into(),
                    "outbox_inbox.examples.scenario_consumer".into(),
                ],
            ),
            other => bail!("OUTBOX_INBOX_LANGS names {other:?}: use rust, java, go, python"),
        };
        ensure!(
            program.exists(),
            "the {name} scenario consumer {} is missing: run `make inbox` (the Rust one: `cargo \
             build -p outbox-inbox --examples`)",
            program.display()
        );
        out.push(Lang {
            name: name.to_owned(),
            program,
            args,
        });
    }
    Ok(out)
}

fn scenario(name: &str) -> Result<Value> {
    let path = repo().join("inbox/scenarios/scenarios.json");
    let all: Value = serde_json::from_str(
        &std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?,
    )?;
    all["scenarios"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == name))
        .cloned()
        .with_context(|| format!("no scenario {name:?} in {}", path.display()))
}

/// One outbox row of a scenario.
#[derive(Debug, Clone)]
struct Event {
    aggregate_id: String,
    event_key: String,
    version: Option<i64>,
    payload: Value,
}

fn events(s: &Value) -> Vec<Event> {
    let e = &s["events"];
    if let Some(list) = e["list"].as_array() {
        return list
            .iter()
            .map(|x| Event {
                aggregate_id: x["aggregate_id"].as_str().unwrap_or_default().to_owned(),
                event_key: x["event_key"].as_str().unwrap_or_default().to_owned(),
                version: x["version"].as_i64(),
                payload: serde_json::json!({ "order_id": x["aggregate_id"] }),
            })
            .collect();
    }
    let orders = e["orders"].as_u64().unwrap_or(0);
    let per = e["per_order"].as_u64().unwrap_or(1);
    let mut out = Vec::new();
    for k in 1..=per {
        for n in 1..=orders {
            let key = format!("order-{n}-{k}");
            let mut payload = serde_json::json!({ "order_id": format!("order-{n}"), "amount": 10 });
            if let Some(o) = e["payload_overrides"][&key].as_object() {
                for (f, v) in o {
                    payload[f] = v.clone();
                }
            }
            out.push(Event {
                aggregate_id: format!("order-{n}"),
                event_key: key,
                version: None,
                payload,
            });
        }
    }
    out
}

/// A scenario's database, topics and relay.
struct World {
    db: TestDb,
    topic: String,
    dlq: String,
    relay: RelayProcess,
    bootstrap: String,
}

impl World {
    async fn new(name: &str, lang: &str, partitions: i32) -> Result<Self> {
        let db = TestDb::create(&format!("inbox_{}", &lang[..lang.len().min(4)])).await?;
        let mut conn = db.conn().await?;
        conn.query_drop("ALTER TABLE outbox ADD COLUMN version BIGINT NULL")
            .await?;
        for file in ["0004_inbox.sql", "0006_inbox_parked.sql"] {
            let sql = std::fs::read_to_string(repo().join("migrations").join(file))?;
            conn.query_drop(sql).await?;
        }
        conn.query_drop(
            "CREATE TABLE coupons (id BIGINT AUTO_INCREMENT PRIMARY KEY, consumer VARCHAR(191), \
             order_id VARCHAR(255), event_key VARCHAR(255), version BIGINT NULL, \
             created_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3))",
        )
        .await?;
        drop(conn);
        let uid = format!("ib_{}_{}", name.replace('_', ""), unique_suffix());
        let mut spec = RelayConfigSpec::new(&db, &format!("inbox-{uid}"), next_server_id(), &uid);
        spec.outbox_extra =
            "additional = [{ column = \"version\", placement = \"header\" }]\n".into();
        let topic = spec.topic_for("order");
        let dlq = format!("{uid}.inbox.dead_letter");
        let bootstrap = spec.bootstrap_servers.clone();
        create_topics(&bootstrap, &[(&topic, partitions), (&dlq, 1)]).await?;
        let relay = RelayProcess::spawn(bin(), &spec.to_toml(), &[])?;
        relay
            .wait_for_checkpoint_row(db.pool(), &spec.connector_name, WAIT)
            .await?;
        Ok(World {
            db,
            topic,
            dlq,
            relay,
            bootstrap,
        })
    }

    /// Inserts `events` into the outbox, one transaction each, in order.
    async fn insert(&self, events: &[Event]) -> Result<()> {
        let mut conn = self.db.conn().await?;
        for e in events {
            conn.exec_drop(
                "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, event_key, payload, \
                 version) VALUES ('order', ?, 'OrderPaid', ?, ?, ?)",
                (&e.aggregate_id, &e.event_key, e.payload.to_string(), e.version),
            )
            .await?;
        }
        Ok(())
    }

    /// The relay's records on the topic, once `n` have arrived.
    async fn relayed(&self, n: usize) -> Result<Vec<Record>> {
        let recs =
            collect_records(&self.bootstrap, std::slice::from_ref(&self.topic), n, WAIT).await?;
        ensure!(
            recs.len() >= n,
            "only {} of {n} outbox rows reached {}\n--- relay ---\n{}",
            recs.len(),
            self.topic,
            self.relay.stderr_tail()
        );
        Ok(recs)
    }

    /// Coupons per event_key.
    async fn coupons(&self) -> Result<BTreeMap<String, u64>> {
        let rows: Vec<(String, u64)> = self
            .db
            .conn()
            .await?
            .query("SELECT event_key, COUNT(*) FROM coupons GROUP BY event_key")
            .await?;
        Ok(rows.into_iter().collect())
    }

    async fn coupon_total(&self) -> Result<u64> {
        Ok(self.coupons().await?.values().sum())
    }

    async fn wait_coupons(&self, at_least: u64, consumers: &[&ScenarioConsumer]) -> Result<()> {
        wait_until(&format!("{at_least} coupons"), WAIT, POLL, async || {
            for c in consumers {
                c.ensure_running()?;
            }
            Ok((self.coupon_total().await? >= at_least).then_some(()))
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e:#}\n{}", describe(consumers)))
    }

    async fn dead_letters(&self, n: usize) -> Result<Vec<Record>> {
        let recs =
            collect_records(&self.bootstrap, std::slice::from_ref(&self.dlq), n, WAIT).await?;
        Ok(recs)
    }

    async fn dead_letter_count(&self) -> Result<u64> {
        outbox_relay_testkit::high_watermark_total(&self.bootstrap, std::slice::from_ref(&self.dlq))
            .await
    }

    async fn finish(self) -> Result<()> {
        let status = self.relay.stop(Duration::from_secs(60)).await?;
        ensure!(status.success(), "relay: {}", describe_exit(&status));
        self.db.drop_database().await
    }
}

async fn create_topics(bootstrap: &str, topics: &[(&str, i32)]) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()?;
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|(t, p)| NewTopic::new(t, *p, TopicReplication::Fixed(1)))
        .collect();
    for r in admin.create_topics(&new, &AdminOptions::new()).await? {
        r.map_err(|(t, e)| anyhow::anyhow!("creating topic {t}: {e}"))?;
    }
    Ok(())
}

tokio::task_local! {
    /// Set by [`in_batch_mode`]: every scenario consumer of the scenario runs in batch mode.
    static BATCH_MODE: bool;
}

/// Poll batches of the batch-mode variants: up to 50 records in one database transaction
/// (inbox/CONTRACT.md, "Batch mode"), waiting up to 200 ms for more, so the scenarios' records
/// (already on the topic when most consumers start) share batches, and a failure or a crash hits
/// a batch, not a lone record.
const BATCH_ENV: [(&str, &str); 2] = [("INBOX_BATCH", "50"), ("INBOX_BATCH_WAIT_MS", "200")];

/// Runs a scenario with every scenario consumer it starts in batch mode: the contract's
/// guarantees must hold unchanged.
async fn in_batch_mode(scenario: impl std::future::Future<Output = Result<()>>) -> Result<()> {
    BATCH_MODE.scope(true, scenario).await
}

/// A scenario consumer process; stdout and stderr go to files read back by the test.
struct ScenarioConsumer {
    label: String,
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl ScenarioConsumer {
    fn spawn(lang: &Lang, w: &World, group: &str, extra: &[(&str, String)]) -> Result<Self> {
        let dir = std::env::temp_dir().join("outbox-relay-tests");
        std::fs::create_dir_all(&dir)?;
        let label = format!("inbox_{}_{}", lang.name, unique_suffix());
        let stdout = dir.join(format!("{label}.stdout.log"));
        let stderr = dir.join(format!("{label}.stderr.log"));
        let mut cmd = Command::new(&lang.program);
        cmd.args(&lang.args)
            .env("INBOX_BOOTSTRAP", &w.bootstrap)
            .env("INBOX_DB_HOST", "127.0.0.1")
            .env("INBOX_DB_PORT", mysql_port().to_string())
            .env("INBOX_DB_USER", "root")
            .env("INBOX_DB_PASSWORD", "")
            .env("INBOX_DB_NAME", w.db.name())
            .env("INBOX_TOPIC", &w.topic)
            .env("INBOX_GROUP", group)
            .env("INBOX_CONSUMER", "fulfilment")
            .env("INBOX_DLQ_TOPIC", &w.dlq)
            .stdin(Stdio::null())
            .stdout(File::create(&stdout)?)
            .stderr(File::create(&stderr)?);
        if BATCH_MODE.try_with(|b| *b).unwrap_or(false) {
            for (k, v) in BATCH_ENV {
                cmd.env(k, v);
            }
        }
        for (k, v) in extra {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", lang.program.display()))?;
        Ok(ScenarioConsumer {
            label,
            child,
            stdout,
            stderr,
        })
    }

    fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.stdout)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// `(outcome, event_key, attempts)` of every `OUTCOME` line.
    fn outcomes(&self) -> Vec<(String, String, u32)> {
        self.lines()
            .iter()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.first() == Some(&"OUTCOME") && f.len() >= 6)
                    .then(|| (f[1].to_owned(), f[2].to_owned(), f[5].parse().unwrap_or(0)))
            })
            .collect()
    }

    /// Waits until `n` records were settled (`OUTCOME` lines).
    async fn wait_settled(&self, n: usize) -> Result<()> {
        wait_until(&format!("{n} records settled"), WAIT, POLL, async || {
            self.ensure_running()?;
            Ok((self.outcomes().len() >= n).then_some(()))
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e:#}\n{}", self.describe()))
    }

    fn stderr_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        let start = text.len().saturating_sub(4000);
        let start = (start..text.len())
            .find(|i| text.is_char_boundary(*i))
            .unwrap_or(text.len());
        text[start..].to_owned()
    }

    fn ensure_running(&self) -> Result<()> {
        // try_wait needs &mut; the pid check is enough for "still running".
        let alive = nix::sys::signal::kill(self.pid(), None).is_ok()
            && !std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))
                .map(|s| s.contains(") Z "))
                .unwrap_or(true);
        ensure!(alive, "{} exited\n{}", self.label, self.describe());
        Ok(())
    }

    /// kill -9, and waits for the process to end.
    fn kill9(&mut self) -> Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(self.child.id() as i32)
    }

    async fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let child = &mut self.child;
        let r = wait_until("the consumer to exit", timeout, POLL, async || {
            Ok(child.try_wait()?)
        })
        .await;
        r.map_err(|e| anyhow::anyhow!("{e:#}\n{}", self.describe()))
    }

    async fn stop(&mut self) -> Result<()> {
        nix::sys::signal::kill(self.pid(), nix::sys::signal::Signal::SIGTERM).ok();
        let status = self.wait_exit(Duration::from_secs(60)).await?;
        ensure!(
            status.success(),
            "{} after SIGTERM: {}\n{}",
            self.label,
            describe_exit(&status),
            self.describe()
        );
        Ok(())
    }

    /// A crash: SIGKILL (kill -9; no cleanup, no offset commit, no close), then waits for the
    /// exit and checks the kernel reports signal 9.
    async fn kill(&mut self) -> Result<()> {
        use std::os::unix::process::ExitStatusExt;
        nix::sys::signal::kill(self.pid(), nix::sys::signal::Signal::SIGKILL)?;
        let status = self.wait_exit(Duration::from_secs(60)).await?;
        ensure!(
            status.signal() == Some(9),
            "{} after SIGKILL: {}\n{}",
            self.label,
            describe_exit(&status),
            self.describe()
        );
        Ok(())
    }

    fn describe(&self) -> String {
        format!(
            "--- {} stdout (last lines) ---\n{}\n--- stderr ---\n{}",
            self.label,
            self.lines()
                .iter()
                .rev()
                .take(20)
                .rev()
                .cloned()
                .collect::<Vec<_>>()
                .join("\n"),
            self.stderr_tail()
        )
    }
}

impl Drop for ScenarioConsumer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn describe(consumers: &[&ScenarioConsumer]) -> String {
    consumers
        .iter()
        .map(|c| c.describe())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Asserts every event got exactly one coupon, except those in `none`.
async fn assert_one_coupon_each(
    w: &World,
    events: &[Event],
    none: &[&str],
    lang: &str,
) -> Result<()> {
    let coupons = w.coupons().await?;
    let mut wrong = Vec::new();
    for e in events {
        let want = u64::from(!none.contains(&e.event_key.as_str()));
        let got = coupons.get(&e.event_key).copied().unwrap_or(0);
        if got != want {
            wrong.push(format!("{}: {got} coupons (want {want})", e.event_key));
        }
    }
    ensure!(
        wrong.is_empty(),
        "[{lang}] coupons per event_key wrong: {}",
        wrong.join(", ")
    );
    Ok(())
}

/// The group's committed offsets equal the topic's end offsets (nothing left unsettled).
/// Sets `group`'s committed offsets on every partition of the topic back to 0, as if a crash had
/// come before any offset commit. The broker takes it once the group is empty: after a kill -9,
/// once the dead member's session ended (10 s), so it is retried until then.
async fn rewind_group(w: &World, group: &str) -> Result<()> {
    let (bootstrap, topic, g) = (w.bootstrap.clone(), w.topic.clone(), group.to_owned());
    tokio::task::spawn_blocking(move || -> Result<()> {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("group.id", &g)
            .set("enable.auto.commit", "false")
            .create()?;
        let md = c.fetch_metadata(Some(&topic), Duration::from_secs(10))?;
        let mut tpl = TopicPartitionList::new();
        for p in 0..md.topics()[0].partitions().len() as i32 {
            tpl.add_partition_offset(&topic, p, Offset::Offset(0))?;
        }
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            match c.commit(&tpl, rdkafka::consumer::CommitMode::Sync) {
                Ok(()) => return Ok(()),
                // Refused while the dead member still holds the group (its session not ended).
                Err(_) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(500));
                }
                Err(e) => bail!("rewinding group {g}: {e}"),
            }
        }
    })
    .await?
}

async fn assert_group_committed_to_end(w: &World, group: &str, lang: &str) -> Result<()> {
    assert_committed_to_end_of(w, group, &w.topic, lang).await
}

/// The group's committed offsets in `topic` equal its end offsets.
async fn assert_committed_to_end_of(w: &World, group: &str, topic: &str, lang: &str) -> Result<()> {
    let (committed, ends) = committed_and_ends(w, group, topic).await?;
    ensure!(
        committed == ends,
        "[{lang}] group {group} committed {committed:?} in {topic}, the partitions end at {ends:?}"
    );
    Ok(())
}

type Offsets = HashMap<i32, i64>;

/// The group's committed offsets in `topic` and the topic's end offsets, per partition.
async fn committed_and_ends(w: &World, group: &str, topic: &str) -> Result<(Offsets, Offsets)> {
    let (bootstrap, topic, g) = (w.bootstrap.clone(), topic.to_owned(), group.to_owned());
    tokio::task::spawn_blocking(move || -> Result<_> {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("group.id", &g)
            .set("enable.auto.commit", "false")
            .create()?;
        let md = c.fetch_metadata(Some(&topic), Duration::from_secs(10))?;
        let parts = md.topics()[0].partitions().len() as i32;
        let mut tpl = TopicPartitionList::new();
        let mut ends = HashMap::new();
        for p in 0..parts {
            tpl.add_partition(&topic, p);
            let (_, high) = c.fetch_watermarks(&topic, p, Duration::from_secs(10))?;
            ends.insert(p, high);
        }
        let committed = c.committed_offsets(tpl, Duration::from_secs(10))?;
        let committed: HashMap<i32, i64> = committed
            .elements()
            .iter()
            .map(|e| {
                let o = match e.offset() {
                    Offset::Offset(o) => o,
                    _ => 0,
                };
                (e.partition(), o)
            })
            .collect();
        Ok((committed, ends))
    })
    .await?
}

// ---------------------------------------------------------------------------------------------

async fn each_lang<F>(name: &str, run: F) -> Result<()>
where
    F: AsyncFn(&Lang, &Value) -> Result<()>,
{
    let s = scenario(name)?;
    let batch = BATCH_MODE.try_with(|b| *b).unwrap_or(false);
    let name = &if batch {
        format!("{name}, batch mode")
    } else {
        name.to_owned()
    };
    let mut failures = Vec::new();
    for lang in langs()? {
        eprintln!("[{name}] {} ...", lang.name);
        match run(&lang, &s).await {
            Ok(()) => eprintln!("[{name}] {}: ok", lang.name),
            Err(e) => {
                eprintln!("[{name}] {}: FAILED {e:#}", lang.name);
                failures.push(format!("{}: {e:#}", lang.name));
            }
        }
    }
    ensure!(failures.is_empty(), "{name}:\n{}", failures.join("\n\n"));
    Ok(())
}

async fn duplicate_deliveries_scenario() -> Result<()> {
    each_lang("duplicate_deliveries", async |lang, s| {
        let partitions = s["partitions"].as_i64().unwrap_or(1) as i32;
        let copies = s["redeliver"]["copies"].as_u64().unwrap_or(1) as usize;
        let evs = events(s);
        let w = World::new("dup", &lang.name, partitions).await?;
        w.insert(&evs).await?;
        let relayed = w.relayed(evs.len()).await?;
        let group = format!("g-{}", unique_suffix());
        let mut c = ScenarioConsumer::spawn(lang, &w, &group, &[])?;
        w.wait_coupons(evs.len() as u64, &[&c]).await?;
        // The same records again, `copies` times: key, value and headers unchanged.
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", &w.bootstrap)
            .create()?;
        for _ in 0..copies {
            for r in &relayed {
                let mut headers = OwnedHeaders::new();
                for (k, v) in &r.headers {
                    headers = headers.insert(Header {
                        key: k,
                        value: v.as_deref(),
                    });
                }
                let mut rec: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&r.topic)
                    .partition(r.partition)
                    .headers(headers);
                if let Some(k) = r.key.as_deref() {
                    rec = rec.key(k);
                }
                if let Some(v) = r.value.as_deref() {
                    rec = rec.payload(v);
                }
                producer
                    .send(rec, Duration::from_secs(30))
                    .await
                    .map_err(|(e, _)| anyhow::anyhow!("redelivering: {e}"))?;
            }
        }
        let want_dups = s["expect"]["min_duplicates"].as_u64().unwrap_or(0) as usize;
        wait_until("the redeliveries to settle", WAIT, POLL, async || {
            c.ensure_running()?;
            let n = c.outcomes().iter().filter(|o| o.0 == "duplicate").count();
            Ok((n >= want_dups).then_some(()))
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e:#}\n{}", c.describe()))?;
        c.stop().await?;
        assert_one_coupon_each(&w, &evs, &[], &lang.name).await?;
        let processed = c.outcomes().iter().filter(|o| o.0 == "processed").count();
        ensure!(
            processed == evs.len(),
            "[{}] {processed} processed",
            lang.name
        );
        ensure!(
            w.dead_letter_count().await? == 0,
            "[{}] dead letters",
            lang.name
        );
        assert_group_committed_to_end(&w, &group, &lang.name).await?;
        w.finish().await
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_deliveries_grant_one_coupon_each() -> Result<()> {
    duplicate_deliveries_scenario().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_mode_duplicate_deliveries_grant_one_coupon_each() -> Result<()> {
    in_batch_mode(duplicate_deliveries_scenario()).await
}

async fn crash_scenario(lang: &Lang, s: &Value, committed_before_crash: bool) -> Result<()> {
    let evs = events(s);
    let partitions = s["partitions"].as_i64().unwrap_or(1) as i32;
    let point = s["crash"]["point"].as_str().unwrap_or_default().to_owned();
    let key = s["crash"]["event_key"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let w = World::new("crash", &lang.name, partitions).await?;
    w.insert(&evs).await?;
    w.relayed(evs.len()).await?;
    let group = format!("g-{}", unique_suffix());
    let marker = std::env::temp_dir().join(format!("outbox-inbox-crash-{}", unique_suffix()));
    let env = [
        ("INBOX_CRASH_POINT", point.clone()),
        ("INBOX_CRASH_EVENT_KEY", key.clone()),
        ("INBOX_CRASH_MARKER", marker.display().to_string()),
    ];
    let mut first = ScenarioConsumer::spawn(lang, &w, &group, &env)?;
    let status = first.wait_exit(WAIT).await?;
    ensure!(
        status.code() == Some(137),
        "[{}] the consumer was to end with 137 at {point} of {key}: {}\n{}",
        lang.name,
        describe_exit(&status),
        first.describe()
    );
    ensure!(marker.exists(), "[{}] no crash marker", lang.name);
    // At the crash: the event's coupon is there only if the database commit came before it.
    let at_crash = w.coupons().await?.get(&key).copied().unwrap_or(0);
    ensure!(
        at_crash == u64::from(committed_before_crash),
        "[{}] {at_crash} coupons for {key} right after the crash at {point}",
        lang.name
    );
    let mut second = ScenarioConsumer::spawn(lang, &w, &group, &env)?;
    w.wait_coupons(evs.len() as u64, &[&second]).await?;
    wait_until(
        "the restarted consumer to settle the crashed record",
        WAIT,
        POLL,
        async || {
            second.ensure_running()?;
            Ok(second.outcomes().iter().any(|o| o.1 == key).then_some(()))
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e:#}\n{}", second.describe()))?;
    // The crash left the records after the last committed offsets of every partition to
    // settle again, not only the crashed record's: the restarted consumer commits each poll
    // batch (inbox/CONTRACT.md, 3), so wait for the commits to reach the end before stopping
    // it (stopped earlier, a partition it had not read yet stayed uncommitted on a loaded
    // machine).
    wait_until(
        "the restarted consumer to commit every partition to its end",
        WAIT,
        POLL,
        async || {
            second.ensure_running()?;
            let (committed, ends) = committed_and_ends(&w, &group, &w.topic).await?;
            Ok((committed == ends).then_some(()))
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("[{}] {e:#}\n{}", lang.name, second.describe()))?;
    second.stop().await?;
    let again: Vec<String> = second
        .outcomes()
        .into_iter()
        .filter(|o| o.1 == key)
        .map(|o| o.0)
        .collect();
    let want = if committed_before_crash {
        "duplicate"
    } else {
        "processed"
    };
    ensure!(
        again.first().map(String::as_str) == Some(want),
        "[{}] after the restart {key} was {again:?}, want {want}",
        lang.name
    );
    assert_one_coupon_each(&w, &evs, &[], &lang.name).await?;
    assert_group_committed_to_end(&w, &group, &lang.name).await?;
    std::fs::remove_file(&marker).ok();
    w.finish().await
}

async fn crash_after_handler_scenario() -> Result<()> {
    each_lang("crash_after_handler", async |lang, s| {
        crash_scenario(lang, s, false).await
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_handler_before_db_commit_grants_once() -> Result<()> {
    crash_after_handler_scenario().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_mode_crash_after_handler_before_db_commit_grants_once() -> Result<()> {
    in_batch_mode(crash_after_handler_scenario()).await
}

async fn crash_after_db_commit_scenario() -> Result<()> {
    each_lang("crash_after_db_commit", async |lang, s| {
        crash_scenario(lang, s, true).await
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_db_commit_before_offset_commit_grants_once() -> Result<()> {
    crash_after_db_commit_scenario().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_mode_crash_after_db_commit_before_offset_commit_grants_once() -> Result<()> {
    in_batch_mode(crash_after_db_commit_scenario()).await
}

async fn rebalance_scenario() -> Result<()> {
    each_lang("rebalance", async |lang, s| {
        let evs = events(s);
        let partitions = s["partitions"].as_i64().unwrap_or(1) as i32;
        let second_after = s["rebalance"]["second_after_coupons"].as_u64().unwrap_or(1);
        let stop_first_after = s["rebalance"]["stop_first_after_coupons"]
            .as_u64()
            .unwrap_or(2);
        let third = evs.len() / 3;
        let w = World::new("rebal", &lang.name, partitions).await?;
        let group = format!("g-{}", unique_suffix());
        let mut a = ScenarioConsumer::spawn(lang, &w, &group, &[])?;
        w.insert(&evs[..third]).await?;
        w.wait_coupons(second_after.min(third as u64), &[&a])
            .await?;
        // B joins while A works: the group rebalances; more rows flow meanwhile.
        let mut b = ScenarioConsumer::spawn(lang, &w, &group, &[])?;
        w.insert(&evs[third..2 * third]).await?;
        w.wait_coupons(stop_first_after.min(2 * third as u64), &[&a, &b])
            .await?;
        // A leaves (SIGTERM: it commits and leaves the group); B takes every partition.
        a.stop().await?;
        w.insert(&evs[2 * third..]).await?;
        w.wait_coupons(evs.len() as u64, &[&b]).await?;
        b.stop().await?;
        assert_one_coupon_each(&w, &evs, &[], &lang.name).await?;
        for (who, c) in [("first", &a), ("second", &b)] {
            let n = c.outcomes().iter().filter(|o| o.0 == "processed").count();
            ensure!(
                n > 0,
                "[{}] the {who} consumer processed nothing",
                lang.name
            );
        }
        assert_group_committed_to_end(&w, &group, &lang.name).await?;
        w.finish().await
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebalance_moves_partitions_and_grants_once() -> Result<()> {
    rebalance_scenario().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_mode_rebalance_moves_partitions_and_grants_once() -> Result<()> {
    in_batch_mode(rebalance_scenario()).await
}

/// Expected outcomes and dead-letter reasons of a scenario's `expect` block.
async fn check_expectations(
    w: &World,
    c: &ScenarioConsumer,
    s: &Value,
    lang: &str,
) -> Result<Vec<Record>> {
    let x = &s["expect"];
    let coupons = w.coupons().await?;
    if let Some(want) = x["coupons"].as_object() {
        for (k, n) in want {
            let got = coupons.get(k).copied().unwrap_or(0);
            ensure!(
                Some(got) == n.as_u64(),
                "[{lang}] {k}: {got} coupons, want {n}"
            );
        }
    }
    let outcomes = c.outcomes();
    let first_outcome = |k: &str| outcomes.iter().find(|o| o.1 == k).cloned();
    if let Some(want) = x["outcomes"].as_object() {
        for (k, o) in want {
            let got = first_outcome(k);
            ensure!(
                got.as_ref().map(|g| g.0.as_str()) == o.as_str(),
                "[{lang}] {k}: outcome {got:?}, want {o}"
            );
        }
    }
    if let Some(want) = x["attempts"].as_object() {
        for (k, n) in want {
            let got = first_outcome(k).map(|g| g.2);
            ensure!(
                got.map(u64::from) == n.as_u64(),
                "[{lang}] {k}: {got:?} attempts, want {n}"
            );
        }
    }
    let dl_n = x["dead_letters"].as_u64().unwrap_or(0);
    let dls = w.dead_letters(dl_n as usize).await?;
    ensure!(
        dls.len() as u64 == dl_n,
        "[{lang}] {} dead letters, want {dl_n}",
        dls.len()
    );
    if let Some(want) = x["dead_letter_reason_contains"].as_object() {
        for (k, reason) in want {
            let dl = dls
                .iter()
                .find(|r| r.header("event_key") == Some(k.as_str()))
                .with_context(|| format!("[{lang}] no dead letter for {k}"))?;
            let got = dl.header("dlq_reason").unwrap_or_default();
            ensure!(
                got.contains(reason.as_str().unwrap_or_default()),
                "[{lang}] {k}: dlq_reason {got:?}, want it to contain {reason}"
            );
            ensure!(
                dl.header("dlq_topic") == Some(w.topic.as_str())
                    && dl.header("dlq_consumer") == Some("fulfilment"),
                "[{lang}] {k}: dead-letter headers {:?}",
                dl.headers
            );
        }
    }
    if let Some(want) = x["dead_letter_attempts"].as_object() {
        for (k, n) in want {
            let dl = dls
                .iter()
                .find(|r| r.header("event_key") == Some(k.as_str()))
                .with_context(|| format!("[{lang}] no dead letter for {k}"))?;
            ensure!(
                dl.header("dlq_attempts")
                    .and_then(|a| a.parse::<u64>().ok())
                    == n.as_u64(),
                "[{lang}] {k}: dlq_attempts {:?}, want {n}",
                dl.header("dlq_attempts")
            );
        }
    }
    Ok(dls)
}

async fn out_of_order_versions_scenario() -> Result<()> {
    each_lang("out_of_order_versions", async |lang, s| {
        let evs = events(s);
        let w = World::new("vers", &lang.name, 1).await?;
        w.insert(&evs).await?;
        w.relayed(evs.len()).await?;
        let group = format!("g-{}", unique_suffix());
        let env = [
            ("INBOX_VERSION_HEADER", s["version_header"].as_str().unwrap_or("version").to_owned()),
            ("INBOX_GAP_POLICY", s["gap_policy"].as_str().unwrap_or("park").to_owned()),
        ];
        let mut c = ScenarioConsumer::spawn(lang, &w, &group, &env)?;
        c.wait_settled(evs.len()).await?;
        c.stop().await?;
        check_expectations(&w, &c, s, &lang.name).await?;
        let stored: Vec<(String, i64)> = w
            .db
            .conn()
            .await?
            .query("SELECT aggregate_id, version FROM outbox_inbox_version WHERE consumer = 'fulfilment'")
            .await?;
        let stored: BTreeMap<String, i64> = stored.into_iter().collect();
        let want: BTreeMap<String, i64> = s["expect"]["stored_versions"]
            .as_object()
            .map(|o| o.iter().map(|(k, v)| (k.clone(), v.as_i64().unwrap_or(-1))).collect())
            .unwrap_or_default();
        ensure!(stored == want, "[{}] stored versions {stored:?}, want {want:?}", lang.name);
        assert_group_committed_to_end(&w, &group, &lang.name).await?;
        w.finish().await
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_order_versions_are_stale_or_parked() -> Result<()> {
    out_of_order_versions_scenario().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_mode_out_of_order_versions_are_stale_or_parked() -> Result<()> {
    in_batch_mode(out_of_order_versions_scenario()).await
}

/// Parked rows left for the scenario consumer `fulfilment`.
async fn parked_left(w: &World) -> Result<u64> {
    let n: Option<u64> =
        w.db.conn()
            .await?
            .query_first("SELECT COUNT(*) FROM outbox_inbox_parked WHERE consumer = 'fulfilment'")
            .await?;
    Ok(n.unwrap_or(0))
}

/// Stored versions per aggregate id against the scenario's `expect.stored_versions`.
async fn check_stored_versions(w: &World, s: &Value, lang: &str) -> Result<()> {
    let stored: Vec<(String, i64)> = w
        .db
        .conn()
        .await?
        .query(
            "SELECT aggregate_id, version FROM outbox_inbox_version WHERE consumer = 'fulfilment'",
        )
        .await?;
    let stored: BTreeMap<String, i64> = stored.into_iter().collect();
    let want: BTreeMap<String, i64> = s["expect"]["stored_versions"]
        .as_object()
        .map(|o| {
            o.iter()
                .map(|(k, v)| (k.clone(), v.as_i64().unwrap_or(-1)))
                .collect()
        })
        .unwrap_or_default();
    ensure!(
        stored == want,
        "[{lang}] stored versions {stored:?}, want {want:?}"
    );
    Ok(())
}

fn version_env(s: &Value) -> Vec<(&'static str, String)> {
    let mut env = vec![
        (
            "INBOX_VERSION_HEADER",
            s["version_header"].as_str().unwrap_or("version").to_owned(),
        ),
        (
            "INBOX_GAP_POLICY",
            s["gap_policy"].as_str().unwrap_or("park").to_owned(),
        ),
    ];
    if let Some(ms) = s["gap_deadline_ms"].as_u64() {
        env.push(("INBOX_GAP_DEADLINE_MS", ms.to_string()));
    }
    if let Some(ms) = s["park_sweep_ms"].as_u64() {
        env.push(("INBOX_PARK_SWEEP_MS", ms.to_string()));
    }
    env
}

async fn parked_versions_resume_scenario() -> Result<()> {
    each_lang("parked_versions_resume", async |lang, s| {
        let evs = events(s);
        let later = events(&serde_json::json!({ "events": s["after_restart"] }));
        let w = World::new("parked", &lang.name, 1).await?;
        w.insert(&evs).await?;
        w.relayed(evs.len()).await?;
        let group = format!("g-{}", unique_suffix());
        let env = version_env(s);
        let mut first = ScenarioConsumer::spawn(lang, &w, &group, &env)?;
        // Every polled record settled, and P's two parked versions resumed.
        first.wait_settled(evs.len() + 2).await?;
        // A crash (kill -9) while Q's version 3 is parked: no close, no rollback. The parked row
        // is durable. The helpers commit offsets right after each poll batch, so the kill most
        // likely came after that commit: the group is rewound to the start, as if it had come
        // before it, and every record is delivered again.
        first.kill().await?;
        rewind_group(&w, &group).await?;
        ensure!(
            parked_left(&w).await? == 1,
            "[{}] the consumer crashed with Q's version 3 parked: want 1 parked row, got {}",
            lang.name,
            parked_left(&w).await?
        );
        // Restarted, Q's missing version arrives: 2 processed, 3 resumed. The records whose
        // offsets the crash left uncommitted come again first: those applied (resumed ones
        // included) are duplicates, Q's version 3 is parked again (its row ignores the copy).
        // Q-v2 is the partition's last record, so once Q-v3 resumed after it every redelivered
        // record has been settled.
        w.insert(&later).await?;
        w.relayed(evs.len() + later.len()).await?;
        let mut second = ScenarioConsumer::spawn(lang, &w, &group, &env)?;
        wait_until("Q-v3 resumed after the restart", WAIT, POLL, async || {
            second.ensure_running()?;
            Ok(second
                .outcomes()
                .iter()
                .any(|o| o.0 == "resumed" && o.1 == "Q-v3")
                .then_some(()))
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e:#}\n{}", second.describe()))?;
        second.stop().await?;
        let again = second.outcomes();
        ensure!(
            again
                .iter()
                .filter(|o| o.1 == "Q-v2" || o.0 == "resumed")
                .map(|o| (o.0.as_str(), o.1.as_str()))
                .collect::<Vec<_>>()
                == [("processed", "Q-v2"), ("resumed", "Q-v3")],
            "[{}] after the restart: {again:?}, want Q-v2 processed then Q-v3 resumed",
            lang.name
        );
        let redelivered: Vec<(&str, &str)> = again
            .iter()
            .filter(|o| o.1 != "Q-v2" && o.0 != "resumed")
            .map(|o| (o.0.as_str(), o.1.as_str()))
            .collect();
        let want_redelivered: Vec<(&str, &str)> = evs
            .iter()
            .map(|e| {
                let parked = e.event_key == "Q-v3";
                (
                    if parked { "parked" } else { "duplicate" },
                    e.event_key.as_str(),
                )
            })
            .collect();
        ensure!(
            redelivered == want_redelivered,
            "[{}] redelivered after the crash: {redelivered:?}, want {want_redelivered:?} \
             (applied ones duplicates, Q-v3 parked again)",
            lang.name
        );
        check_expectations(&w, &first, s, &lang.name).await?;
        let resumed: BTreeSet<String> = first
            .outcomes()
            .into_iter()
            .chain(second.outcomes())
            .filter(|o| o.0 == "resumed")
            .map(|o| o.1)
            .collect();
        let resumed_lines = first
            .outcomes()
            .into_iter()
            .chain(second.outcomes())
            .filter(|o| o.0 == "resumed")
            .count();
        ensure!(
            resumed_lines == resumed.len(),
            "[{}] a record resumed twice: {resumed_lines} resumed lines for {resumed:?}",
            lang.name
        );
        let want: BTreeSet<String> = s["expect"]["resumed"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        ensure!(
            resumed == want,
            "[{}] resumed {resumed:?}, want {want:?}",
            lang.name
        );
        // The business effects in version order.
        let order: Vec<String> =
            w.db.conn()
                .await?
                .query("SELECT event_key FROM coupons WHERE order_id = 'P' ORDER BY id")
                .await?;
        let want_order: Vec<String> = s["expect"]["coupon_order"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        ensure!(
            order == want_order,
            "[{}] coupons of P in order {order:?}, want {want_order:?}",
            lang.name
        );
        check_stored_versions(&w, s, &lang.name).await?;
        ensure!(
            parked_left(&w).await? == 0,
            "[{}] parked rows left",
            lang.name
        );
        assert_group_committed_to_end(&w, &group, &lang.name).await?;
        w.finish().await
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_versions_resume_by_themselves() -> Result<()> {
    parked_versions_resume_scenario().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_mode_parked_versions_resume() -> Result<()> {
    in_batch_mode(parked_versions_resume_scenario()).await
}

async fn gap_expires_scenario() -> Result<()> {
    each_lang("parked_gap_expires", async |lang, s| {
        let evs = events(s);
        let w = World::new("gapexp", &lang.name, 1).await?;
        w.insert(&evs).await?;
        w.relayed(evs.len()).await?;
        let group = format!("g-{}", unique_suffix());
        let mut c = ScenarioConsumer::spawn(lang, &w, &group, &version_env(s))?;
        // G-v1 processed, G-v3 parked, then dead-lettered by a sweep after its deadline.
        c.wait_settled(evs.len() + 1).await?;
        c.stop().await?;
        check_expectations(&w, &c, s, &lang.name).await?;
        check_stored_versions(&w, s, &lang.name).await?;
        ensure!(
            parked_left(&w).await? == 0,
            "[{}] parked rows left",
            lang.name
        );
        assert_group_committed_to_end(&w, &group, &lang.name).await?;
        w.finish().await
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_that_never_closes_is_dead_lettered_at_its_deadline() -> Result<()> {
    gap_expires_scenario().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_mode_a_gap_that_never_closes_is_dead_lettered_at_its_deadline() -> Result<()> {
    in_batch_mode(gap_expires_scenario()).await
}

async fn poison_record_scenario() -> Result<()> {
    each_lang("poison_record", async |lang, s| {
        let evs = events(s);
        let w = World::new("poison", &lang.name, 1).await?;
        w.insert(&evs).await?;
        let relayed = w.relayed(evs.len()).await?;
        let group = format!("g-{}", unique_suffix());
        let env = [(
            "INBOX_MAX_ATTEMPTS",
            s["max_attempts"].as_u64().unwrap_or(3).to_string(),
        )];
        let mut c = ScenarioConsumer::spawn(lang, &w, &group, &env)?;
        c.wait_settled(evs.len()).await?;
        c.stop().await?;
        let dls = check_expectations(&w, &c, s, &lang.name).await?;
        let zero: Vec<&str> = s["expect"]["coupons"]
            .as_object()
            .map(|o| {
                o.iter()
                    .filter(|(_, v)| v.as_u64() == Some(0))
                    .map(|(k, _)| k.as_str())
                    .collect()
            })
            .unwrap_or_default();
        assert_one_coupon_each(&w, &evs, &zero, &lang.name).await?;
        // The dead letter says where the record was; key, value and headers are the record's.
        for dl in &dls {
            let k = dl.header("event_key").unwrap_or_default();
            let orig = relayed
                .iter()
                .find(|r| r.header("event_key") == Some(k))
                .with_context(|| format!("no relayed record for {k}"))?;
            ensure!(
                dl.header("dlq_partition") == Some(orig.partition.to_string().as_str())
                    && dl.header("dlq_offset") == Some(orig.offset.to_string().as_str())
                    && dl.key == orig.key
                    && dl.value == orig.value
                    && orig.headers.iter().all(|h| dl.headers.contains(h)),
                "[{}] dead letter {:?} does not carry the record {:?}",
                lang.name,
                dl,
                orig
            );
        }
        // Order kept: the records after the poison one were processed after it.
        let order: Vec<String> = c.outcomes().into_iter().map(|o| o.1).collect();
        let want: Vec<String> = evs.iter().map(|e| e.event_key.clone()).collect();
        ensure!(order == want, "[{}] settled in order {order:?}", lang.name);
        assert_group_committed_to_end(&w, &group, &lang.name).await?;
        w.finish().await
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_record_is_dead_lettered_and_the_partition_moves_on() -> Result<()> {
    poison_record_scenario().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_mode_poison_record_is_dead_lettered_and_the_partition_moves_on() -> Result<()> {
    in_batch_mode(poison_record_scenario()).await
}

// ---------------------------------------------------------------------------------------------
// Retry tiers (inbox/CONTRACT.md, "Retry tiers").

fn tier_env(s: &Value) -> Vec<(&'static str, String)> {
    let tiers: Vec<String> = s["retry_tiers_ms"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_u64)
                .map(|v| v.to_string())
                .collect()
        })
        .unwrap_or_default();
    vec![
        (
            "INBOX_MAX_ATTEMPTS",
            s["max_attempts"].as_u64().unwrap_or(3).to_string(),
        ),
        ("INBOX_RETRY_TIERS_MS", tiers.join(",")),
    ]
}

/// Tier `n`'s topic under the default format.
fn tier_topic(w: &World, n: u64) -> String {
    format!("{}.retry.{n}", w.topic)
}

/// The copies on tier `n`'s topic, once `at_least` are there.
async fn tier_copies(w: &World, n: u64, at_least: usize) -> Result<Vec<Record>> {
    collect_records(&w.bootstrap, &[tier_topic(w, n)], at_least, WAIT).await
}

/// `(id, ms since the epoch)` of the coupons of `event_key`, in id order.
async fn coupon_times(w: &World, event_key: &str) -> Result<Vec<(u64, i64)>> {
    let rows: Vec<(u64, i64)> =
        w.db.conn()
            .await?
            .exec(
                "SELECT id, CAST(ROUND(UNIX_TIMESTAMP(created_at) * 1000) AS SIGNED) FROM coupons \
             WHERE event_key = ? ORDER BY id",
                (event_key,),
            )
            .await?;
    Ok(rows)
}

/// The coupon of each `expect.coupon_after_retry_at` event (key -> tier) was granted no earlier
/// than the `retry_at` of its first copy on that tier.
async fn check_coupon_after_retry_at(w: &World, s: &Value, lang: &str) -> Result<()> {
    let Some(want) = s["expect"]["coupon_after_retry_at"].as_object() else {
        return Ok(());
    };
    for (k, tier) in want {
        let tier = tier.as_u64().unwrap_or(1);
        let copies = tier_copies(w, tier, 1).await?;
        let retry_at = copies
            .iter()
            .filter(|r| r.header("event_key") == Some(k.as_str()))
            .filter_map(|r| r.header("retry_at").and_then(|v| v.parse::<i64>().ok()))
            .min()
            .with_context(|| format!("[{lang}] no copy of {k} with retry_at on tier {tier}"))?;
        let times = coupon_times(w, k).await?;
        ensure!(
            times.len() == 1,
            "[{lang}] {k}: {} coupons, want 1",
            times.len()
        );
        // The database's and the consumer's clocks are the machine's; 50 ms for rounding.
        ensure!(
            times[0].1 + 50 >= retry_at,
            "[{lang}] {k}: coupon granted at {} ms, before its tier {tier} copy's retry_at {retry_at}",
            times[0].1
        );
    }
    Ok(())
}

async fn retry_tiers_scenario() -> Result<()> {
    each_lang("retry_tiers", async |lang, s| {
        let evs = events(s);
        let x = &s["expect"];
        let w = World::new(
            "rtier",
            &lang.name,
            s["partitions"].as_i64().unwrap_or(1) as i32,
        )
        .await?;
        w.insert(&evs).await?;
        let relayed = w.relayed(evs.len()).await?;
        let group = format!("g-{}", unique_suffix());
        let mut c = ScenarioConsumer::spawn(lang, &w, &group, &tier_env(s))?;
        c.wait_settled(x["settled"].as_u64().unwrap_or(evs.len() as u64) as usize)
            .await?;
        c.stop().await?;
        let dls = check_expectations(&w, &c, s, &lang.name).await?;
        let zero: Vec<&str> = x["coupons"]
            .as_object()
            .map(|o| {
                o.iter()
                    .filter(|(_, v)| v.as_u64() == Some(0))
                    .map(|(k, _)| k.as_str())
                    .collect()
            })
            .unwrap_or_default();
        assert_one_coupon_each(&w, &evs, &zero, &lang.name).await?;
        // The partition was not blocked: later orders got their coupons first.
        if let Some(before) = x["coupons_before"].as_object() {
            for (k, earlier) in before {
                let id = coupon_times(&w, k).await?.first().map(|t| t.0);
                let id = id.with_context(|| format!("[{}] no coupon for {k}", lang.name))?;
                for e in earlier.as_array().into_iter().flatten() {
                    let e = e.as_str().unwrap_or_default();
                    let eid = coupon_times(&w, e).await?.first().map(|t| t.0);
                    ensure!(
                        eid.is_some_and(|eid| eid < id),
                        "[{}] coupon of {e} ({eid:?}) not before that of {k} ({id})",
                        lang.name
                    );
                }
            }
        }
        check_coupon_after_retry_at(&w, s, &lang.name).await?;
        // The dead letter after the last tier: the copy's history, naming the original record.
        if let Some(want) = x["dead_letter_retry"].as_object() {
            for (k, v) in want {
                let dl = dls
                    .iter()
                    .find(|r| r.header("event_key") == Some(k.as_str()))
                    .with_context(|| format!("[{}] no dead letter for {k}", lang.name))?;
                let orig = relayed
                    .iter()
                    .find(|r| r.header("event_key") == Some(k.as_str()))
                    .with_context(|| format!("no relayed record for {k}"))?;
                let history: Value =
                    serde_json::from_str(dl.header("retry_history").unwrap_or("null"))
                        .unwrap_or(Value::Null);
                let entries = history.as_array().map(Vec::len);
                ensure!(
                    dl.header("retry_count").and_then(|c| c.parse::<u64>().ok())
                        == v["retry_count"].as_u64()
                        && dl.header("original_topic") == Some(w.topic.as_str())
                        && dl.header("original_offset") == Some(orig.offset.to_string().as_str())
                        && dl.header("dlq_topic") == Some(w.topic.as_str())
                        && dl.header("dlq_partition") == Some(orig.partition.to_string().as_str())
                        && dl.header("dlq_offset") == Some(orig.offset.to_string().as_str())
                        && entries.map(|n| n as u64) == v["retry_history_entries"].as_u64()
                        && dl.key == orig.key
                        && dl.value == orig.value,
                    "[{}] dead letter of {k} after the last tier: {:?} (original {:?})",
                    lang.name,
                    dl,
                    orig
                );
            }
        }
        // The tier topics were created and hold the copies.
        for (i, want) in x["tier_copies"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let n = i as u64 + 1;
            let topic = tier_topic(&w, n);
            let got = outbox_relay_testkit::high_watermark_total(
                &w.bootstrap,
                std::slice::from_ref(&topic),
            )
            .await?;
            ensure!(
                Some(got) == want.as_u64(),
                "[{}] {topic} holds {got} copies, want {want}",
                lang.name
            );
            let copies = tier_copies(&w, n, got as usize).await?;
            for r in &copies {
                ensure!(
                    r.header("retry_count") == Some(n.to_string().as_str())
                        && r.header("original_topic") == Some(w.topic.as_str())
                        && r.header("retry_at")
                            .is_some_and(|v| v.parse::<i64>().is_ok())
                        && r.header("retry_error").is_some()
                        && r.header("event_key").is_some(),
                    "[{}] copy on {topic} without its headers: {r:?}",
                    lang.name
                );
            }
            assert_committed_to_end_of(&w, &group, &topic, &lang.name).await?;
        }
        assert_group_committed_to_end(&w, &group, &lang.name).await?;
        w.finish().await
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_tiers_move_the_partition_on_and_dead_letter_after_the_last() -> Result<()> {
    retry_tiers_scenario().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_mode_retry_tiers_move_the_partition_on_and_dead_letter_after_the_last() -> Result<()>
{
    in_batch_mode(retry_tiers_scenario()).await
}

async fn tier_crash_scenario() -> Result<()> {
    each_lang("crash_in_retry_tier", async |lang, s| {
        let evs = events(s);
        let key = s["kill_after_outcome"]["event_key"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let outcome = s["kill_after_outcome"]["outcome"]
            .as_str()
            .unwrap_or("retried")
            .to_owned();
        let w = World::new(
            "rtcrash",
            &lang.name,
            s["partitions"].as_i64().unwrap_or(1) as i32,
        )
        .await?;
        w.insert(&evs).await?;
        w.relayed(evs.len()).await?;
        let group = format!("g-{}", unique_suffix());
        let env = tier_env(s);
        let mut first = ScenarioConsumer::spawn(lang, &w, &group, &env)?;
        wait_until(&format!("{key} {outcome}"), WAIT, POLL, async || {
            first.ensure_running()?;
            Ok(first
                .outcomes()
                .iter()
                .any(|o| o.0 == outcome && o.1 == key)
                .then_some(()))
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e:#}\n{}", first.describe()))?;
        first.kill9()?;
        let killed_at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis() as i64;
        // The copy is on the tier, and was killed before its retry_at.
        let copies = tier_copies(&w, 1, 1).await?;
        let retry_at = copies
            .iter()
            .filter(|r| r.header("event_key") == Some(key.as_str()))
            .filter_map(|r| r.header("retry_at").and_then(|v| v.parse::<i64>().ok()))
            .min()
            .with_context(|| format!("[{}] no copy of {key} on tier 1", lang.name))?;
        ensure!(
            killed_at < retry_at,
            "[{}] killed at {killed_at}, after the copy's retry_at {retry_at}: the scenario \
             did not crash while the copy waited",
            lang.name
        );
        ensure!(
            w.coupons().await?.get(&key).copied().unwrap_or(0) == 0,
            "[{}] {key} has a coupon before its retry",
            lang.name
        );
        let mut second = ScenarioConsumer::spawn(lang, &w, &group, &env)?;
        w.wait_coupons(evs.len() as u64, &[&second]).await?;
        // Everything settled: the group's offsets at the end of the topic and of the tier.
        let tier = tier_topic(&w, 1);
        wait_until("the offsets committed to the end", WAIT, POLL, async || {
            second.ensure_running()?;
            let (c1, e1) = committed_and_ends(&w, &group, &w.topic).await?;
            let (c2, e2) = committed_and_ends(&w, &group, &tier).await?;
            Ok((c1 == e1 && c2 == e2).then_some(()))
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e:#}\n{}", second.describe()))?;
        second.stop().await?;
        assert_one_coupon_each(&w, &evs, &[], &lang.name).await?;
        check_coupon_after_retry_at(&w, s, &lang.name).await?;
        ensure!(
            w.dead_letter_count().await? == 0,
            "[{}] dead letters",
            lang.name
        );
        ensure!(
            second
                .outcomes()
                .iter()
                .any(|o| o.1 == key && o.0 == "processed"),
            "[{}] the restarted consumer did not process {key}: {:?}",
            lang.name,
            second.outcomes()
        );
        assert_group_committed_to_end(&w, &group, &lang.name).await?;
        assert_committed_to_end_of(&w, &group, &tier, &lang.name).await?;
        w.finish().await
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_while_a_copy_waits_in_a_retry_tier_grants_once() -> Result<()> {
    tier_crash_scenario().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_mode_crash_while_a_copy_waits_in_a_retry_tier_grants_once() -> Result<()> {
    in_batch_mode(tier_crash_scenario()).await
}
