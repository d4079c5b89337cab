//! Outbox table patterns (`outbox.tables = ["<db>_t*.outbox"]`) end to end: the relay binary
//! against the server of `OUTBOX_TEST_SERVER` and Kafka.
//!
//! Each test has its own world (database `pt_<name>_<uid>`, topic prefix, connector, server
//! id); its tenant schemas are `<world db>_t<n>` (so the `_` of the pattern's literal part is
//! also a LIKE wildcard the relay must escape), its other schemas `<world db>_x<n>`. Topics are
//! `t_<uid>.{schema}.{aggregate_type}`. Every test drops the schemas it made.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use mysql_async::prelude::*;
use mysql_async::Conn;
use outbox_relay_testkit::{
    all_seen, collect_until, ensure_per_key_order, event_key_counts, insert_outbox_rows,
    list_topics, read_all_records, wait_for_stderr, InsertStyle, OutboxRow, Record, RowGen,
};

fn bin() -> &'static str {
    outbox_relay_testkit::relay_bin()
}

outbox_relay_testkit::world_fixture!(
    /// One test's isolated world.
    Fixture,
    bin(),
    "pt"
);

const STARTUP: Duration = Duration::from_secs(60);
const RELAY_WAIT: Duration = Duration::from_secs(120);
const STOP: Duration = Duration::from_secs(30);
const READ_ALL: Duration = Duration::from_secs(60);

/// The outbox table's DDL (`migrations/0001_outbox.sql`'s statement) for a table named `name`.
fn outbox_ddl(name: &str) -> Result<String> {
    let path = outbox_relay_testkit::db::migrations_dir().join("0001_outbox.sql");
    let sql = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
    Ok(sql.replace(
        "CREATE TABLE IF NOT EXISTS outbox (",
        &format!("CREATE TABLE IF NOT EXISTS `{name}` ("),
    ))
}

impl Fixture {
    /// A fixture whose relay follows `pattern` (`{db}` is replaced by the world's database)
    /// with topics by schema.
    async fn with_pattern(name: &str, pattern: &str) -> Result<Self> {
        let mut f = Self::new(name).await?;
        f.spec.tables = vec![pattern.replace("{db}", f.db.name())];
        f.spec.topic = format!("{}.{{schema}}.{{aggregate_type}}", f.topic_prefix());
        Ok(f)
    }

    /// A connection to `schema` of the world's server.
    async fn conn_to(&self, schema: &str) -> Result<Conn> {
        let url = self.db.url();
        let (server, _) = url.rsplit_once('/').context("the URL has a database")?;
        Ok(Conn::from_url(format!("{server}/{schema}")).await?)
    }

    /// Creates schema `<db><suffix>` with tables `tables` of the outbox shape; returns its name.
    async fn create_schema(&self, suffix: &str, tables: &[&str]) -> Result<String> {
        let schema = format!("{}{suffix}", self.db.name());
        let mut conn = self.db.conn().await?;
        conn.query_drop(format!(
            "CREATE DATABASE IF NOT EXISTS `{schema}` DEFAULT CHARACTER SET utf8mb4"
        ))
        .await?;
        drop(conn);
        let mut conn = self.conn_to(&schema).await?;
        for t in tables {
            conn.query_drop(outbox_ddl(t)?).await?;
        }
        conn.disconnect().await?;
        Ok(schema)
    }

    /// Commits `rows` into `schema.table`, one transaction.
    async fn commit_into(&self, schema: &str, table: &str, rows: &[OutboxRow]) -> Result<()> {
        let mut conn = self.conn_to(schema).await?;
        let mut tx = conn
            .start_transaction(mysql_async::TxOpts::default())
            .await?;
        insert_outbox_rows(&mut tx, &format!("`{table}`"), rows, InsertStyle::MultiRow).await?;
        tx.commit().await?;
        conn.disconnect().await?;
        Ok(())
    }

    /// The topic of `schema`'s `Order` records.
    fn topic_of(&self, schema: &str) -> String {
        format!("{}.{schema}.Order", self.topic_prefix())
    }

    async fn drop_schemas(&self, schemas: &[String]) -> Result<()> {
        let mut conn = self.db.conn().await?;
        for s in schemas {
            conn.query_drop(format!("DROP DATABASE IF EXISTS `{s}`"))
                .await?;
        }
        Ok(())
    }
}

fn keys(rows: &[OutboxRow]) -> HashSet<String> {
    rows.iter().map(|r| r.event_key.clone()).collect()
}

/// Each of `rows` is on `topic` exactly once, with its key, headers and payload.
fn ensure_relayed(records: &[Record], topic: &str, rows: &[OutboxRow]) -> Result<()> {
    let counts = event_key_counts(records);
    for row in rows {
        ensure!(
            counts.get(&row.event_key) == Some(&1),
            "{} seen {:?} times",
            row.event_key,
            counts.get(&row.event_key)
        );
        let r = records
            .iter()
            .find(|r| r.header("event_key") == Some(row.event_key.as_str()))
            .context("the record")?;
        ensure!(
            r.topic == topic,
            "{} on {}, not {topic}",
            row.event_key,
            r.topic
        );
        ensure!(
            r.key_str() == Some(row.aggregate_id.as_str()),
            "key of {r:?}"
        );
        ensure!(r.header("event_type") == Some(row.event_type.as_str()));
        ensure!(r.header("aggregate_type") == Some(row.aggregate_type.as_str()));
        ensure!(r.header("id").is_some(), "id header of {r:?}");
        let value: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap_or(b""))?;
        let payload: serde_json::Value = serde_json::from_str(&row.payload)?;
        ensure!(value == payload, "payload of {}", row.event_key);
    }
    Ok(())
}

/// Case 1 (and 3): three tenant schemas exist at start; their rows go to topics by `{schema}`,
/// while the same-shaped tables of another schema (`_x1.outbox`) and another name
/// (`_t1.orders`) produce nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_at_start_are_relayed_to_topics_by_schema() -> Result<()> {
    let f = Fixture::with_pattern("start", "{db}_t*.outbox").await?;
    let mut schemas = Vec::new();
    for n in 1..=3 {
        let tables: &[&str] = if n == 1 {
            &["outbox", "orders"]
        } else {
            &["outbox"]
        };
        schemas.push(f.create_schema(&format!("_t{n}"), tables).await?);
    }
    let other = f.create_schema("_x1", &["outbox"]).await?;
    let (relay, _) = f.start(STARTUP).await?;
    let mut gen = RowGen::new(&f.uid, "start", 4);
    // Rows of the tables that do not match come first: once the tenants' rows (later in the
    // binlog) are on Kafka, anything the others would have produced would be there too.
    f.commit_into(&other, "outbox", &gen.rows(3)).await?;
    f.commit_into(&schemas[0], "orders", &gen.rows(3)).await?;
    f.commit_into(f.db.name(), "outbox", &gen.rows(3)).await?;
    let mut per_tenant = Vec::new();
    for s in &schemas {
        let rows = gen.rows(5);
        f.commit_into(s, "outbox", &rows).await?;
        per_tenant.push(rows);
    }
    let topics: Vec<String> = schemas.iter().map(|s| f.topic_of(s)).collect();
    let wanted: HashSet<String> = per_tenant.iter().flat_map(|r| keys(r)).collect();
    collect_until(
        &f.spec.bootstrap_servers,
        &topics,
        RELAY_WAIT,
        all_seen(wanted),
    )
    .await?;
    relay.ensure_running()?;
    let status = relay.stop(STOP).await?;
    ensure!(
        status.success(),
        "relay exit: {status:?}\n{}",
        relay.stderr_tail()
    );
    let existing = list_topics(&f.spec.bootstrap_servers, &f.topic_prefix()).await?;
    ensure!(
        existing == topics.iter().cloned().collect::<BTreeSet<_>>(),
        "topics {existing:?}, expected only the tenants' {topics:?}"
    );
    let records = read_all_records(&f.spec.bootstrap_servers, &topics, READ_ALL).await?;
    ensure!(
        records.len() == 15,
        "{} records: {records:?}",
        records.len()
    );
    for (s, rows) in schemas.iter().zip(&per_tenant) {
        ensure_relayed(&records, &f.topic_of(s), rows)?;
    }
    schemas.push(other);
    f.drop_schemas(&schemas).await?;
    f.drop_database().await
}

/// Case 2: a tenant schema and its outbox table created while the relay runs: its rows arrive
/// from the first committed INSERT, in order, with keys and headers as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_created_while_running_is_relayed_in_order() -> Result<()> {
    let f = Fixture::with_pattern("live", "{db}_t*.outbox").await?;
    let first = f.create_schema("_t1", &["outbox"]).await?;
    let (relay, _) = f.start(STARTUP).await?;
    let late = f.create_schema("_t2", &["outbox"]).await?;
    let mut gen = RowGen::new(&f.uid, "live", 3);
    let mut rows = Vec::new();
    for _ in 0..4 {
        let batch = gen.rows(5);
        f.commit_into(&late, "outbox", &batch).await?;
        rows.extend(batch);
    }
    let topic = f.topic_of(&late);
    let seen = collect_until(
        &f.spec.bootstrap_servers,
        std::slice::from_ref(&topic),
        RELAY_WAIT,
        all_seen(keys(&rows)),
    )
    .await?;
    relay.ensure_running()?;
    ensure_relayed(&seen, &topic, &rows)?;
    let order: HashMap<String, usize> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| (r.event_key.clone(), i))
        .collect();
    ensure_per_key_order(&seen, &order)?;
    ensure!(
        relay
            .stderr_text()
            .contains("outbox table found by pattern"),
        "the relay logs the table it picked up"
    );
    let status = relay.stop(STOP).await?;
    ensure!(
        status.success(),
        "relay exit: {status:?}\n{}",
        relay.stderr_tail()
    );
    f.drop_schemas(&[first, late]).await?;
    f.drop_database().await
}

/// Case 3: tables that do not match, created while the relay runs (another schema; table names
/// that only start like the pattern's), produce nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_that_do_not_match_produce_nothing() -> Result<()> {
    let f = Fixture::with_pattern("none", "{db}_t*.outbox").await?;
    let tenant = f.create_schema("_t1", &["outbox"]).await?;
    let (relay, _) = f.start(STARTUP).await?;
    let other = f.create_schema("_x2", &["outbox"]).await?;
    let near = f.create_schema("_t3", &["outbox_old", "outboxes"]).await?;
    let mut gen = RowGen::new(&f.uid, "none", 2);
    f.commit_into(&other, "outbox", &gen.rows(2)).await?;
    f.commit_into(&near, "outbox_old", &gen.rows(2)).await?;
    f.commit_into(&near, "outboxes", &gen.rows(2)).await?;
    let sentinel = gen.rows(1);
    f.commit_into(&tenant, "outbox", &sentinel).await?;
    let topic = f.topic_of(&tenant);
    collect_until(
        &f.spec.bootstrap_servers,
        std::slice::from_ref(&topic),
        RELAY_WAIT,
        all_seen(keys(&sentinel)),
    )
    .await?;
    let status = relay.stop(STOP).await?;
    ensure!(
        status.success(),
        "relay exit: {status:?}\n{}",
        relay.stderr_tail()
    );
    let existing = list_topics(&f.spec.bootstrap_servers, &f.topic_prefix()).await?;
    ensure!(
        existing == BTreeSet::from([topic.clone()]),
        "topics {existing:?}, expected only {topic}"
    );
    let records = read_all_records(
        &f.spec.bootstrap_servers,
        std::slice::from_ref(&topic),
        READ_ALL,
    )
    .await?;
    ensure!(records.len() == 1, "{records:?}");
    ensure_relayed(&records, &topic, &sentinel)?;
    ensure!(
        !relay.stderr_text().contains("_x2.outbox"),
        "nothing is said about tables that do not match"
    );
    f.drop_schemas(&[tenant, other, near]).await?;
    f.drop_database().await
}

/// Case 4: a pattern that matches nothing at start: the relay starts, warns, and relays the
/// table once it appears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pattern_matching_nothing_at_start_warns_then_picks_up_the_table() -> Result<()> {
    let f = Fixture::with_pattern("empty", "{db}_late?.outbox").await?;
    let (relay, _) = f.start(STARTUP).await?;
    wait_for_stderr(&relay, "no matching table yet", Duration::from_secs(10)).await?;
    let late = f.create_schema("_late1", &["outbox"]).await?;
    let mut gen = RowGen::new(&f.uid, "empty", 2);
    let rows = gen.rows(4);
    f.commit_into(&late, "outbox", &rows).await?;
    let topic = f.topic_of(&late);
    let seen = collect_until(
        &f.spec.bootstrap_servers,
        std::slice::from_ref(&topic),
        RELAY_WAIT,
        all_seen(keys(&rows)),
    )
    .await?;
    relay.ensure_running()?;
    ensure_relayed(&seen, &topic, &rows)?;
    let status = relay.stop(STOP).await?;
    ensure!(
        status.success(),
        "relay exit: {status:?}\n{}",
        relay.stderr_tail()
    );
    f.drop_schemas(&[late]).await?;
    f.drop_database().await
}

/// Tenant isolation: one tenant's topic refuses its records (here `max.message.bytes` below
/// the record's size, known to the relay before sending); with dead letters on, that tenant's
/// rows go to the dead-letter topic and the other tenants' records keep flowing, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenants_refused_topic_does_not_stop_the_others() -> Result<()> {
    let mut f = Fixture::with_pattern("isolate", "{db}_t*.outbox").await?;
    let dlq = format!("{}.dlq", f.topic_prefix());
    f.spec.dead_letter_topic = Some(dlq.clone());
    let mut schemas = Vec::new();
    for n in 1..=3 {
        schemas.push(f.create_schema(&format!("_t{n}"), &["outbox"]).await?);
    }
    outbox_relay_testkit::create_topic(&f.spec.bootstrap_servers, &f.topic_of(&schemas[1]), 100)
        .await?;
    let (relay, _) = f.start(STARTUP).await?;
    let mut gen = RowGen::new(&f.uid, "isolate", 3);
    let mut per_tenant: Vec<Vec<OutboxRow>> = vec![Vec::new(); 3];
    for _ in 0..3 {
        for (i, s) in schemas.iter().enumerate() {
            let rows = gen.rows(2);
            f.commit_into(s, "outbox", &rows).await?;
            per_tenant[i].extend(rows);
        }
    }
    let good = [f.topic_of(&schemas[0]), f.topic_of(&schemas[2])];
    let mut topics = good.to_vec();
    topics.push(dlq.clone());
    let wanted: HashSet<String> = per_tenant.iter().flat_map(|r| keys(r)).collect();
    let seen = collect_until(
        &f.spec.bootstrap_servers,
        &topics,
        RELAY_WAIT,
        all_seen(wanted),
    )
    .await?;
    relay.ensure_running()?;
    for (i, topic) in [(0, &good[0]), (2, &good[1])] {
        let on_topic: Vec<Record> = seen.iter().filter(|r| r.topic == *topic).cloned().collect();
        ensure_relayed(&on_topic, topic, &per_tenant[i])?;
        let order: HashMap<String, usize> = per_tenant[i]
            .iter()
            .enumerate()
            .map(|(n, r)| (r.event_key.clone(), n))
            .collect();
        ensure_per_key_order(&on_topic, &order)?;
    }
    let dead: Vec<&Record> = seen.iter().filter(|r| r.topic == dlq).collect();
    let refused_table = format!("{}.outbox", schemas[1]);
    ensure!(
        dead.len() == per_tenant[1].len(),
        "{} dead letters",
        dead.len()
    );
    for r in &dead {
        ensure!(
            r.header("dlq_table") == Some(refused_table.as_str()),
            "{r:?}"
        );
    }
    let status = relay.stop(STOP).await?;
    ensure!(
        status.success(),
        "relay exit: {status:?}\n{}",
        relay.stderr_tail()
    );
    f.drop_schemas(&schemas).await?;
    f.drop_database().await
}
