//! The Debezium compatibility profile against the real Debezium 3.6.1: the same outbox rows go
//! through Debezium's MySQL connector with the outbox `EventRouter` (tests/debezium/Runner.java,
//! serialized as a Kafka Connect worker does with each common converter) and through the relay
//! with `[outbox] compat = "debezium"` and a `[debezium]` section of the same settings; every
//! record must match, in order per (topic, partition): partition, key bytes, value bytes,
//! header names and values in order (the `__debezium.context.runId` value and the record
//! timestamp aside: a run id and processing time differ by nature).
//!
//! The outbox is Debezium's documented table (`id`, `aggregatetype`, `aggregateid`, `type`,
//! `payload JSON`) plus a nullable `tenant` column, and a second one whose payload is `TEXT`.
//! What Debezium produced for each output is printed (`--nocapture`) whatever the outcome.
//!
//! The second test is the switch from Debezium to the relay: Debezium (Kafka offsets, as a
//! Connect worker keeps them) stops in the middle of a multi-row transaction while a writer
//! goes on, `outbox-relay migrate-from debezium` takes its offsets over, and the relay goes on
//! from there: every row must be in Debezium's records or the relay's, exactly once.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use mysql_async::prelude::*;
use outbox_relay_testkit::debezium::{
    ConverterKind, DebeziumProcess, DebeziumSpec, OffsetStore, Output, MARIADB_CONNECTOR,
};
use outbox_relay_testkit::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use outbox_relay_testkit::rdkafka::client::DefaultClientContext;
use outbox_relay_testkit::rdkafka::config::ClientConfig;
use outbox_relay_testkit::{
    collect_records, high_watermark_total, kafka_bootstrap, next_server_id, read_all_records,
    test_server, unique_suffix, Record, RelayConfigSpec, RelayProcess, TestDb,
};

/// The relay binary under test (built on first use).
fn bin() -> &'static str {
    outbox_relay_testkit::relay_bin()
}

const STARTUP: Duration = Duration::from_secs(180);
const WAIT: Duration = Duration::from_secs(180);
const STOP: Duration = Duration::from_secs(60);

/// Partitions of every output topic (both sides).
const PARTITIONS: i32 = 6;

/// The aggregate types of the rows: one topic each.
const AGGREGATES: [&str; 3] = ["Order", "Customer", "Shipment"];

/// Debezium's documented outbox table plus `tenant`, and the same with a `TEXT` payload.
const TABLES_SQL: [&str; 2] = [
    "CREATE TABLE outbox (
       id VARCHAR(36) NOT NULL PRIMARY KEY,
       aggregatetype VARCHAR(255) NOT NULL,
       aggregateid VARCHAR(255) NOT NULL,
       type VARCHAR(255) NOT NULL,
       payload JSON NULL,
       tenant VARCHAR(64) NULL
     ) DEFAULT CHARACTER SET utf8mb4",
    "CREATE TABLE outbox_text (
       id VARCHAR(36) NOT NULL PRIMARY KEY,
       aggregatetype VARCHAR(255) NOT NULL,
       aggregateid VARCHAR(255) NOT NULL,
       type VARCHAR(255) NOT NULL,
       payload TEXT NULL,
       tenant VARCHAR(64) NULL
     ) DEFAULT CHARACTER SET utf8mb4",
];

/// The payloads of the rows (`None`: SQL NULL), each written to both tables (the `TEXT` table
/// also gets a payload that is not JSON).
fn payloads() -> Vec<(&'static str, Option<String>)> {
    vec![
        (
            "nested_unicode",
            Some(
                r#"{"a":{"b":[1,{"c":"café ünïcödé 漢字 🎉"}],"d":null},"q":"quote \" backslash \\ slash / ctrl \u0001 tab \t nl \n","e":"\u00e9"}"#
                    .into(),
            ),
        ),
        ("emoji", Some(r#"{"party":"🎉","text":"naïve — ok"}"#.into())),
        (
            "numbers",
            Some(
                r#"{"big":1e21,"tiny":1e-7,"dec":0.1,"f":12345678.5,"negz":-0.0,"u64":18446744073709551615,"i64":-9223372036854775808,"x":1.5,"h":100,"exp":2.5E+3,"nexp":-3e-5}"#
                    .into(),
            ),
        ),
        ("n_big", Some(r#"{"big":1e21}"#.into())),
        ("n_tiny", Some(r#"{"tiny":1e-7}"#.into())),
        ("n_dec", Some(r#"{"dec":0.1,"f":12345678.5,"x":1.5,"h":100}"#.into())),
        ("n_negz", Some(r#"{"negz":-0.0}"#.into())),
        ("n_u64", Some(r#"{"u64":18446744073709551615}"#.into())),
        ("n_i64", Some(r#"{"i64":-9223372036854775808}"#.into())),
        ("n_exp", Some(r#"{"exp":2.5E+3,"nexp":-3e-5}"#.into())),
        ("big_alone", Some("1e21".into())),
        ("tiny_alone", Some("1e-7".into())),
        ("negz_alone", Some("-0.0".into())),
        ("u64_alone", Some("18446744073709551615".into())),
        ("array", Some("[1,2]".into())),
        ("array_objects", Some(r#"[{"a":1},{"b":"🎉"}]"#.into())),
        ("string", Some(r#""s""#.into())),
        ("int", Some("42".into())),
        ("bool", Some("true".into())),
        ("json_null", Some("null".into())),
        ("empty_object", Some("{}".into())),
        ("empty_array", Some("[]".into())),
        ("sql_null", None),
        (
            "order",
            Some(r#"{"orderId":"o-1","items":[{"sku":"A","qty":2,"price":9.99}],"total":19.98}"#.into()),
        ),
    ]
}

/// One outbox row.
#[derive(Debug, Clone)]
struct Row {
    table: &'static str,
    id: String,
    aggregate_type: &'static str,
    aggregate_id: String,
    event_type: String,
    payload: Option<String>,
    tenant: Option<String>,
    label: String,
}

/// The rows of the comparison: every payload in both tables, spread over the aggregate types,
/// several aggregate ids (unicode among them) and NULL and non-NULL tenants.
fn rows() -> Vec<Row> {
    let ids = ["o-1", "o-2", "c-ü", "42", "x"];
    let mut out = Vec::new();
    let mut n = 0usize;
    for table in ["outbox", "outbox_text"] {
        let mut list = payloads();
        if table == "outbox_text" {
            list.push(("not_json", Some("not json { at all".into())));
        }
        for (label, payload) in list {
            let aggregate_type = AGGREGATES[n % AGGREGATES.len()];
            out.push(Row {
                table,
                id: format!("00000000-0000-4000-8000-{n:012}"),
                aggregate_type,
                aggregate_id: ids[n % ids.len()].to_owned(),
                event_type: format!("{aggregate_type}Event{}", n % 2),
                payload,
                tenant: (!n.is_multiple_of(3)).then(|| format!("tenant-{}", n % 4)),
                label: format!("{table}/{label}"),
            });
            n += 1;
        }
    }
    out
}

/// Inserts `rows`, `per_tx` rows per transaction, one INSERT statement per row.
async fn insert_rows(db: &TestDb, rows: &[Row], per_tx: usize) -> Result<()> {
    let mut conn = db.conn().await?;
    for chunk in rows.chunks(per_tx.max(1)) {
        let mut tx = conn
            .start_transaction(mysql_async::TxOpts::default())
            .await?;
        for r in chunk {
            tx.exec_drop(
                format!(
                    "INSERT INTO {} (id, aggregatetype, aggregateid, type, payload, tenant) \
                     VALUES (?, ?, ?, ?, ?, ?)",
                    r.table
                ),
                (
                    &r.id,
                    r.aggregate_type,
                    &r.aggregate_id,
                    &r.event_type,
                    &r.payload,
                    &r.tenant,
                ),
            )
            .await
            .with_context(|| format!("inserting {}", r.label))?;
        }
        tx.commit().await?;
    }
    Ok(())
}

/// Creates `topics` with [`PARTITIONS`] partitions each.
async fn create_topics(topics: &[String]) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .create()
        .context("creating a Kafka admin client")?;
    let new: Vec<NewTopic> = topics
        .iter()
        .map(|t| NewTopic::new(t, PARTITIONS, TopicReplication::Fixed(1)))
        .collect();
    for r in admin
        .create_topics(&new, &AdminOptions::new())
        .await
        .context("creating topics")?
    {
        r.map_err(|(t, e)| anyhow::anyhow!("creating topic {t}: {e}"))?;
    }
    Ok(())
}

/// Bytes as text for a reader: lossy UTF-8 with control characters escaped.
fn show(bytes: Option<&[u8]>) -> String {
    match bytes {
        None => "null".into(),
        Some(b) => format!("{:?}", String::from_utf8_lossy(b)),
    }
}

/// Hex of up to 48 bytes from `from`.
fn hex_from(bytes: &[u8], from: usize) -> String {
    bytes
        .iter()
        .skip(from)
        .take(48)
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// One record, readably (topic, partition, offset, key, value, headers).
fn describe(r: &Record) -> String {
    let headers: Vec<String> = r
        .headers
        .iter()
        .map(|(n, v)| format!("{n}={}", show(v.as_deref())))
        .collect();
    format!(
        "{} [{}] @{} ts={:?}\n    key    {}\n    value  {}\n    headers [{}]",
        r.topic,
        r.partition,
        r.offset,
        r.timestamp_ms,
        show(r.key.as_deref()),
        show(r.value.as_deref()),
        headers.join(", ")
    )
}

/// Where two byte strings first differ, with hex from there; `None` when equal.
fn first_difference(what: &str, a: Option<&[u8]>, b: Option<&[u8]>) -> Option<String> {
    match (a, b) {
        (None, None) => None,
        (Some(a), Some(b)) if a == b => None,
        (Some(a), Some(b)) => {
            let at = a
                .iter()
                .zip(b)
                .position(|(x, y)| x != y)
                .unwrap_or(a.len().min(b.len()));
            Some(format!(
                "{what} differs at byte {at} (lengths {} / {}):\n      debezium {}\n         relay {}\n      debezium hex from {at}: {}\n         relay hex from {at}: {}",
                a.len(),
                b.len(),
                show(Some(a)),
                show(Some(b)),
                hex_from(a, at),
                hex_from(b, at)
            ))
        }
        (a, b) => Some(format!("{what}: debezium {} / relay {}", show(a), show(b))),
    }
}

/// A UUID's text form (8-4-4-4-12 hex digits).
fn is_uuid(bytes: Option<&[u8]>) -> bool {
    let Some(b) = bytes else { return false };
    let Ok(s) = std::str::from_utf8(b) else {
        return false;
    };
    let parts: Vec<&str> = s.split('-').collect();
    parts.len() == 5
        && parts
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(p, n)| p.len() == n && p.chars().all(|c| c.is_ascii_hexdigit()))
}

/// The header whose value differs by nature between two runs.
const RUN_ID_HEADER: &str = "__debezium.context.runId";

/// Every difference between a Debezium record and the relay's at the same place.
fn record_differences(d: &Record, r: &Record) -> Vec<String> {
    let mut out = Vec::new();
    if d.partition != r.partition {
        out.push(format!(
            "partition: debezium {} / relay {}",
            d.partition, r.partition
        ));
    }
    out.extend(first_difference("key", d.key.as_deref(), r.key.as_deref()));
    out.extend(first_difference(
        "value",
        d.value.as_deref(),
        r.value.as_deref(),
    ));
    let names = |x: &Record| x.headers.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    if names(d) != names(r) {
        out.push(format!(
            "header names: debezium {:?} / relay {:?}",
            names(d),
            names(r)
        ));
    } else {
        for ((n, dv), (_, rv)) in d.headers.iter().zip(&r.headers) {
            if n == RUN_ID_HEADER {
                if !is_uuid(dv.as_deref()) || !is_uuid(rv.as_deref()) {
                    out.push(format!(
                        "{n} is not UUID-shaped: debezium {} / relay {}",
                        show(dv.as_deref()),
                        show(rv.as_deref())
                    ));
                }
                continue;
            }
            out.extend(first_difference(
                &format!("header {n}"),
                dv.as_deref(),
                rv.as_deref(),
            ));
        }
    }
    out
}

/// Records by (topic without `prefix`, partition), in offset order.
fn by_place(records: &[Record], prefix: &str) -> BTreeMap<(String, i32), Vec<Record>> {
    let mut out: BTreeMap<(String, i32), Vec<Record>> = BTreeMap::new();
    for r in records {
        let topic = r.topic.strip_prefix(prefix).unwrap_or(&r.topic).to_owned();
        out.entry((topic, r.partition)).or_default().push(r.clone());
    }
    for list in out.values_mut() {
        list.sort_by_key(|r| r.offset);
    }
    out
}

/// Compares Debezium's records (topics `d_prefix…`) with the relay's (`r_prefix…`): the same
/// (topic, partition) places, the same records in each, in order.
fn compare(
    what: &str,
    debezium: &[Record],
    d_prefix: &str,
    relay: &[Record],
    r_prefix: &str,
) -> Result<()> {
    let d = by_place(debezium, d_prefix);
    let r = by_place(relay, r_prefix);
    let mut problems = Vec::new();
    let places: BTreeSet<&(String, i32)> = d.keys().chain(r.keys()).collect();
    for place in places {
        let empty = Vec::new();
        let (ds, rs) = (
            d.get(place).unwrap_or(&empty),
            r.get(place).unwrap_or(&empty),
        );
        for i in 0..ds.len().max(rs.len()) {
            match (ds.get(i), rs.get(i)) {
                (Some(a), Some(b)) => {
                    let diffs = record_differences(a, b);
                    if !diffs.is_empty() {
                        problems.push(format!(
                            "{}[{}] record {i}:\n  {}\n  debezium: {}\n  relay:    {}",
                            place.0,
                            place.1,
                            diffs.join("\n  "),
                            describe(a),
                            describe(b)
                        ));
                    }
                }
                (Some(a), None) => problems.push(format!(
                    "{}[{}] record {i}: only Debezium has\n  {}",
                    place.0,
                    place.1,
                    describe(a)
                )),
                (None, Some(b)) => problems.push(format!(
                    "{}[{}] record {i}: only the relay has\n  {}",
                    place.0,
                    place.1,
                    describe(b)
                )),
                (None, None) => {}
            }
        }
    }
    if !problems.is_empty() {
        bail!(
            "{what}: {} difference(s) between Debezium and the relay:\n{}",
            problems.len(),
            problems.join("\n")
        );
    }
    Ok(())
}

/// Port of the private MariaDB that reports a MySQL version for Debezium's MySQL connector
/// (`DEBEZIUM_SERVER_PORT`; see `outbox_relay_testkit::debezium::mariadb_masquerade`).
fn debezium_server_port() -> u16 {
    std::env::var("DEBEZIUM_SERVER_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(match test_server().name() {
            "mariadb10" => 3496,
            _ => 3506,
        })
}

/// The server the test runs on: the shared test server, or on MariaDB with the MySQL
/// connector a private one of the same flavor whose version string the connector accepts
/// (held by the returned handle). Returns the handle, the database (`TestDb`) and the port.
async fn debezium_db(
    prefix: &str,
) -> Result<(
    Option<std::sync::Arc<outbox_relay_testkit::PrivateService>>,
    TestDb,
    u16,
)> {
    let port = debezium_server_port();
    let service = tokio::task::spawn_blocking(move || {
        outbox_relay_testkit::debezium::mariadb_masquerade(port)
    })
    .await??;
    match service {
        Some(service) => {
            let db = TestDb::create_on(&format!("mysql://root@127.0.0.1:{port}"), prefix).await?;
            Ok((Some(service), db, port))
        }
        None => Ok((None, TestDb::create(prefix).await?, test_server().port())),
    }
}

/// The value of `[debezium] connector` for the connector class Debezium runs with.
fn connector_kind(libs_class: &str) -> &'static str {
    if libs_class == MARIADB_CONNECTOR {
        "mariadb"
    } else {
        "mysql"
    }
}

/// A TOML basic string.
fn toml_str(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

/// The relay's config for one converter pair: `[outbox] compat = "debezium"` and `[debezium]`
/// with the same EventRouter settings as Debezium's run, its records to `r_prefix…`.
#[allow(clippy::too_many_arguments)]
fn relay_toml(
    db: &TestDb,
    connector: &str,
    tables: &[String],
    conv: ConverterKind,
    router: &[(String, String)],
    r_prefix: &str,
    topic_prefix: &str,
    connector_kind: &str,
    extra_kafka_properties: &[(&str, &str)],
) -> String {
    let mut spec = RelayConfigSpec::for_tables(
        connector,
        &db.url(),
        next_server_id(),
        tables.to_vec(),
        "unused.{aggregate_type}",
    );
    spec.timestamp = None;
    spec.outbox_extra = "compat = \"debezium\"\n".into();
    for (k, v) in extra_kafka_properties {
        spec.kafka_properties.push(((*k).into(), (*v).into()));
    }
    // The profile routes by `route.topic.replacement`: no `outbox.topic` template.
    let toml: String = spec
        .to_toml()
        .lines()
        .filter(|l| !l.starts_with("topic = "))
        .map(|l| format!("{l}\n"))
        .collect();
    let mut section = format!(
        "\n[debezium]\nkey_converter = {}\nvalue_converter = {}\n",
        toml_str(conv.name()),
        toml_str(conv.name())
    );
    for (k, v) in router {
        let value = if k == "route.topic.replacement" {
            format!("{r_prefix}{v}")
        } else {
            v.clone()
        };
        let rendered = match value.as_str() {
            "true" | "false" => value.clone(),
            _ => toml_str(&value),
        };
        section.push_str(&format!("{} = {rendered}\n", toml_str(k)));
    }
    section.push_str(&format!(
        "\"topic.prefix\" = {}\nconnector = {}\ncontext_headers = true\ntimestamp = \"processing\"\n",
        toml_str(topic_prefix),
        toml_str(connector_kind)
    ));
    toml + &section
}

/// One comparison: Debezium with `router` (`transforms.outbox.*`) fanned out to the three
/// converter pairs, and a relay per pair with the same settings, over [`rows`].
async fn compare_with_debezium(name: &str, router: Vec<(String, String)>) -> Result<()> {
    let (_server, db, port) = debezium_db(&format!("dbz_{name}")).await?;
    let mut conn = db.conn().await?;
    conn.query_drop("DROP TABLE outbox").await?;
    for sql in TABLES_SQL {
        conn.query_drop(sql).await?;
    }
    drop(conn);
    let tables = vec![
        format!("{}.outbox", db.name()),
        format!("{}.outbox_text", db.name()),
    ];
    let base = format!("t_{}", unique_suffix());
    let mut spec = DebeziumSpec::new(name, next_server_id(), db.name(), tables.clone())?;
    spec.port = port;
    spec.router = router.clone();
    spec.skip_convert_errors = true;
    for conv in ConverterKind::ALL {
        spec.outputs.push(Output {
            name: conv.tag().into(),
            key: conv,
            value: conv,
            prefix: format!("{base}.d-{}.", conv.tag()),
        });
    }
    let mut topics = Vec::new();
    for side in ["d", "r"] {
        for conv in ConverterKind::ALL {
            for agg in AGGREGATES {
                topics.push(format!("{base}.{side}-{}.outbox.event.{agg}", conv.tag()));
            }
        }
    }
    create_topics(&topics).await?;

    let libs = outbox_relay_testkit::debezium::resolve_libs(test_server())?;
    let class = outbox_relay_testkit::debezium::connector_class(&libs);
    println!(
        "[{name}] Debezium {class} on {}, router settings {router:?}",
        test_server()
    );

    // The relays first (each starts at the binlog end), then Debezium; rows once both stream.
    let mut relays = Vec::new();
    let mut relay_errors = Vec::new();
    for conv in ConverterKind::ALL {
        let connector = format!("{name}-{}-{}", conv.tag(), unique_suffix());
        let toml = relay_toml(
            &db,
            &connector,
            &tables,
            conv,
            &router,
            &format!("{base}.r-{}.", conv.tag()),
            &spec.topic_prefix,
            connector_kind(&class),
            &[],
        );
        match RelayProcess::spawn(bin(), &toml, &[]) {
            Ok(relay) => relays.push((conv, connector, relay)),
            Err(e) => relay_errors.push(format!("{}: {e:#}", conv.name())),
        }
    }
    let debezium = DebeziumProcess::start(&spec, STARTUP).await?;
    let mut running = Vec::new();
    for (conv, connector, relay) in relays {
        match relay
            .wait_for_checkpoint_row(db.pool(), &connector, STARTUP)
            .await
        {
            Ok(_) => running.push((conv, relay)),
            Err(e) => relay_errors.push(format!(
                "the relay with {} converters did not start: {e:#}",
                conv.name()
            )),
        }
    }

    let rows = rows();
    insert_rows(&db, &rows, 3).await?;

    // Debezium's side, dumped whatever happens next.
    let mut debezium_records = BTreeMap::new();
    for conv in ConverterKind::ALL {
        let prefix = format!("{base}.d-{}.", conv.tag());
        let out_topics: Vec<String> = AGGREGATES
            .iter()
            .map(|a| format!("{prefix}outbox.event.{a}"))
            .collect();
        let tag = conv.tag();
        wait_for_records(&debezium, &out_topics, async || {
            let failed = debezium
                .convert_failures()
                .iter()
                .filter(|(o, _)| o == tag)
                .count();
            rows.len() - failed
        })
        .await?;
        let got = read_all_records(&kafka_bootstrap(), &out_topics, WAIT).await?;
        let failed: BTreeSet<String> = debezium
            .convert_failures()
            .into_iter()
            .filter(|(o, _)| o == tag)
            .map(|(_, id)| id)
            .collect();
        for line in debezium.convert_failure_lines() {
            if line.starts_with(&format!("CONVERT_FAILED output={tag} ")) {
                println!("[{name}] Debezium could not serialize, output {tag}: {line}");
            }
        }
        println!(
            "[{name}] Debezium output {} ({} records, key/value converter {}):",
            conv.tag(),
            got.len(),
            conv.name()
        );
        let mut sorted = got.clone();
        sorted.sort_by(|a, b| {
            (&a.topic, a.partition, a.offset).cmp(&(&b.topic, b.partition, b.offset))
        });
        for r in &sorted {
            let id = r.header("id").unwrap_or("?");
            let label = rows
                .iter()
                .find(|row| row.id == id)
                .map_or("?", |row| row.label.as_str());
            println!("  ({label}) {}", describe(r));
        }
        ensure!(
            got.len() + failed.len() == rows.len(),
            "Debezium's output {} has {} records and {} conversion failures for {} rows",
            conv.tag(),
            got.len(),
            failed.len(),
            rows.len()
        );
        debezium_records.insert(conv.tag(), (prefix, out_topics, got, failed));
    }
    debezium.stop(STOP).await?;

    ensure!(
        relay_errors.is_empty(),
        "[{name}] relay side:\n{}",
        relay_errors.join("\n")
    );
    let mut failures = Vec::new();
    for (conv, relay) in &running {
        let (d_prefix, d_topics, d_records, failed) = &debezium_records[conv.tag()];
        let r_prefix = format!("{base}.r-{}.", conv.tag());
        let r_topics: Vec<String> = d_topics
            .iter()
            .map(|t| t.replacen(d_prefix.as_str(), &r_prefix, 1))
            .collect();
        collect_records(
            &kafka_bootstrap(),
            &r_topics,
            rows.len() - failed.len(),
            WAIT,
        )
        .await?;
        relay.ensure_running()?;
        relay.stop(STOP).await?;
        // Rows Debezium's converter failed on are compared on no side (a Connect worker
        // stops there; the relay's answer for them is its own decision).
        let without_failed = |records: Vec<Record>| -> Vec<Record> {
            records
                .into_iter()
                .filter(|r| !r.header("id").is_some_and(|id| failed.contains(id)))
                .collect()
        };
        let r_records =
            without_failed(read_all_records(&kafka_bootstrap(), &r_topics, WAIT).await?);
        let d_all = read_all_records(&kafka_bootstrap(), d_topics, WAIT).await?;
        ensure!(
            d_all.len() == d_records.len(),
            "Debezium's output {} grew to {} records",
            conv.tag(),
            d_all.len()
        );
        if let Err(e) = compare(
            &format!("{name}, converters {}", conv.name()),
            &d_all,
            d_prefix,
            &r_records,
            &r_prefix,
        ) {
            failures.push(format!("{e:#}"));
        }
    }
    ensure!(failures.is_empty(), "{}", failures.join("\n\n"));
    db.drop_database().await?;
    Ok(())
}

/// Waits until `topics` hold `n()` records, failing at once when Debezium's runner dies.
async fn wait_for_records(
    debezium: &DebeziumProcess,
    topics: &[String],
    mut n: impl AsyncFnMut() -> usize,
) -> Result<()> {
    outbox_relay_testkit::wait_until(
        &format!("Debezium's records in {topics:?}"),
        WAIT,
        Duration::from_millis(250),
        async || {
            debezium.ensure_running()?;
            let total = high_watermark_total(&kafka_bootstrap(), topics).await?;
            Ok((total >= n().await as u64).then_some(()))
        },
    )
    .await
}

/// The router settings both sides share: Debezium's column names (its defaults), `type` and
/// `tenant` as headers, topics `outbox.event.<aggregatetype>`.
fn router(expand: bool, placement: &str) -> Vec<(String, String)> {
    vec![
        ("table.expand.json.payload".into(), expand.to_string()),
        ("table.fields.additional.placement".into(), placement.into()),
        (
            "route.topic.replacement".into(),
            "outbox.event.${routedByValue}".into(),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_records_as_debezium_payload_as_string() -> Result<()> {
    compare_with_debezium(
        "str",
        router(false, "type:header:eventType,tenant:header:tenant"),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_records_as_debezium_payload_expanded() -> Result<()> {
    compare_with_debezium(
        "exp",
        router(true, "type:header:eventType,tenant:header:tenant"),
    )
    .await
}

/// `tenant` in an envelope around the payload. With the payload not expanded: Debezium 3.6.1
/// with `table.expand.json.payload=true` and an envelope placement fails on the second row whose
/// payload has another JSON shape than the first (`DataException: Invalid Java object for
/// schema "payload" with type STRUCT: class java.lang.String`; the envelope schema is built
/// once per table schema, from the first payload).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_records_as_debezium_envelope_placement() -> Result<()> {
    compare_with_debezium(
        "env",
        router(false, "type:header:eventType,tenant:envelope:tenant"),
    )
    .await
}

/// A writer of outbox rows until told to stop: transactions of `per_tx` single-row INSERTs
/// (one rows event each), every `pause`. Returns the ids it committed.
fn spawn_writer(
    db: &TestDb,
    per_tx: usize,
    pause: Duration,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    committed: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> tokio::task::JoinHandle<Result<Vec<String>>> {
    let pool = db.pool().clone();
    tokio::spawn(async move {
        let mut conn = pool.get_conn().await?;
        let mut ids = Vec::new();
        let mut n = 0usize;
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            let mut tx = conn
                .start_transaction(mysql_async::TxOpts::default())
                .await?;
            let mut batch = Vec::new();
            for _ in 0..per_tx {
                let id = format!("10000000-0000-4000-8000-{n:012}");
                let agg = AGGREGATES[n % AGGREGATES.len()];
                tx.exec_drop(
                    "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, tenant) \
                     VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        &id,
                        agg,
                        format!("{agg}-{}", n % 7),
                        format!("{agg}Changed"),
                        format!("{{\"n\":{n}}}"),
                        n.is_multiple_of(2).then_some("t"),
                    ),
                )
                .await?;
                batch.push(id);
                n += 1;
            }
            tx.commit().await?;
            ids.extend(batch);
            committed.store(ids.len(), std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(pause).await;
        }
        Ok(ids)
    })
}

/// The switch from Debezium to the relay: Debezium (string converters, offsets in a Kafka topic
/// as a Connect worker keeps them) stops after a number of records that ends inside a
/// transaction of five rows while a writer goes on; `outbox-relay migrate-from debezium
/// --offsets-topic … --connector …` takes its offsets over; the relay then goes on, and every
/// committed row is in Debezium's records or the relay's exactly once (by the `id` header).
///
/// Waits for `migrate-from debezium` (being built on another branch): until it exists the
/// command fails and so does this test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_from_debezium_mid_transaction_loses_and_repeats_nothing() -> Result<()> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    let (_server, db, port) = debezium_db("dbz_migrate").await?;
    let mut conn = db.conn().await?;
    conn.query_drop("DROP TABLE outbox").await?;
    conn.query_drop(TABLES_SQL[0]).await?;
    drop(conn);
    let tables = vec![format!("{}.outbox", db.name())];
    let base = format!("t_{}", unique_suffix());
    let (d_prefix, r_prefix) = (format!("{base}.d."), format!("{base}.r."));
    let mut topics = Vec::new();
    for prefix in [&d_prefix, &r_prefix] {
        for agg in AGGREGATES {
            topics.push(format!("{prefix}outbox.event.{agg}"));
        }
    }
    create_topics(&topics).await?;
    let offsets_topic = format!("{base}.connect-offsets");

    // Four whole transactions and three rows of the fifth.
    const STOP_AFTER: u64 = 23;
    let router = router(false, "type:header:eventType,tenant:header:tenant");
    let mut spec = DebeziumSpec::new("migrate", next_server_id(), db.name(), tables.clone())?;
    spec.port = port;
    spec.router = router.clone();
    spec.offsets = OffsetStore::Kafka {
        topic: offsets_topic.clone(),
    };
    spec.stop_after = Some(STOP_AFTER);
    spec.outputs.push(Output {
        name: "s".into(),
        key: ConverterKind::String,
        value: ConverterKind::String,
        prefix: d_prefix.clone(),
    });
    let libs = outbox_relay_testkit::debezium::resolve_libs(test_server())?;
    let class = outbox_relay_testkit::debezium::connector_class(&libs);
    let debezium = DebeziumProcess::start(&spec, STARTUP).await?;

    let stop = Arc::new(AtomicBool::new(false));
    let committed = Arc::new(AtomicUsize::new(0));
    let writer = spawn_writer(
        &db,
        5,
        Duration::from_millis(100),
        stop.clone(),
        committed.clone(),
    );
    let stopped = debezium.wait_stopped(WAIT).await;
    if let Err(e) = stopped {
        stop.store(true, Ordering::SeqCst);
        let _ = writer.await;
        return Err(e);
    }
    let d_topics: Vec<String> = topics[..AGGREGATES.len()].to_vec();
    let d_records = read_all_records(&kafka_bootstrap(), &d_topics, WAIT).await?;
    println!(
        "[migrate] Debezium stopped after {} records ({} rows committed so far); log {}",
        d_records.len(),
        committed.load(Ordering::SeqCst),
        debezium.log.display()
    );
    ensure!(
        d_records.len() as u64 == STOP_AFTER,
        "Debezium produced {} records, expected test.stop_after = {STOP_AFTER}",
        d_records.len()
    );

    let connector = format!("migrate-{}", unique_suffix());
    let toml = relay_toml(
        &db,
        &connector,
        &tables,
        ConverterKind::String,
        &router,
        &r_prefix,
        &spec.topic_prefix,
        connector_kind(&class),
        &[],
    );
    let migrate = RelayProcess::spawn_args(
        bin(),
        &[
            "migrate-from",
            "debezium",
            "--offsets-topic",
            &offsets_topic,
            "--connector",
            &spec.name,
            "--yes",
            "--config",
        ],
        &toml,
        &[],
    )?;
    let status = migrate.wait_exit(WAIT).await;
    let migrated = match status {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(anyhow::anyhow!(
            "outbox-relay migrate-from debezium ended with {s}\n--- stderr ---\n{}\n--- stdout ---\n{}",
            migrate.stderr_tail(),
            migrate.stdout_text()
        )),
        Err(e) => Err(e),
    };
    if let Err(e) = migrated {
        stop.store(true, Ordering::SeqCst);
        let _ = writer.await;
        return Err(e);
    }
    println!("[migrate] migrate-from said:\n{}", migrate.stdout_text());

    let relay = RelayProcess::spawn(bin(), &toml, &[])?;
    relay
        .wait_for_checkpoint_row(db.pool(), &connector, STARTUP)
        .await?;
    // The writer goes on a little while the relay runs, then stops.
    let at_start = committed.load(Ordering::SeqCst);
    outbox_relay_testkit::wait_until(
        "the writer to commit 50 more rows with the relay running",
        WAIT,
        Duration::from_millis(100),
        async || {
            relay.ensure_running()?;
            Ok((committed.load(Ordering::SeqCst) >= at_start + 50).then_some(()))
        },
    )
    .await?;
    stop.store(true, Ordering::SeqCst);
    let ids = writer.await.context("the writer task")??;
    let wanted: BTreeSet<String> = ids.iter().cloned().collect();

    let r_topics: Vec<String> = topics[AGGREGATES.len()..].to_vec();
    let need = wanted.len() - d_records.len();
    collect_records(&kafka_bootstrap(), &r_topics, need, WAIT).await?;
    relay.ensure_running()?;
    relay.stop(STOP).await?;
    let r_records = read_all_records(&kafka_bootstrap(), &r_topics, WAIT).await?;

    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (side, records) in [("debezium", &d_records), ("relay", &r_records)] {
        for r in records.iter() {
            let id = r.header("id").unwrap_or("<no id header>").to_owned();
            seen.entry(id)
                .or_default()
                .push(format!("{side} {}[{}]@{}", r.topic, r.partition, r.offset));
        }
    }
    let missing: Vec<&String> = wanted.iter().filter(|id| !seen.contains_key(*id)).collect();
    let repeated: Vec<(&String, &Vec<String>)> =
        seen.iter().filter(|(_, at)| at.len() > 1).collect();
    let unknown: Vec<&String> = seen.keys().filter(|id| !wanted.contains(*id)).collect();
    ensure!(
        missing.is_empty() && repeated.is_empty() && unknown.is_empty(),
        "{} rows, {} Debezium records, {} relay records: missing {missing:?}, repeated {repeated:?}, unknown {unknown:?}",
        wanted.len(),
        d_records.len(),
        r_records.len()
    );
    db.drop_database().await?;
    Ok(())
}

/// The comparison itself: equal records pass (the run id may differ, both UUID-shaped); a
/// value, a header and a partition that differ are each named, with the first differing byte.
#[test]
fn comparison_names_each_difference() -> Result<()> {
    let record = |topic: &str, value: &[u8], run_id: &str, tenant: Option<&[u8]>| Record {
        topic: topic.into(),
        partition: 1,
        offset: 0,
        key: Some(b"o-1".to_vec()),
        value: Some(value.to_vec()),
        headers: vec![
            (RUN_ID_HEADER.into(), Some(run_id.as_bytes().to_vec())),
            ("id".into(), Some(b"1".to_vec())),
            ("tenant".into(), tenant.map(<[u8]>::to_vec)),
        ],
        timestamp_ms: Some(1),
    };
    let d = record(
        "d.outbox.event.Order",
        b"{\"a\":1}",
        "01a24090-7c19-7bf9-b352-ce6826fd0ac4",
        None,
    );
    let same = record(
        "r.outbox.event.Order",
        b"{\"a\":1}",
        "01a24090-7c19-7bf9-b352-ce6826fd0ac5",
        None,
    );
    compare("same", std::slice::from_ref(&d), "d.", &[same], "r.")?;

    let mut other = record(
        "r.outbox.event.Order",
        b"{\"a\":2}",
        "not-a-uuid",
        Some(b"t"),
    );
    other.partition = 2;
    let diffs = record_differences(&d, &other);
    assert_eq!(diffs.len(), 4, "{diffs:#?}");
    assert!(
        diffs[0].starts_with("partition: debezium 1 / relay 2"),
        "{diffs:#?}"
    );
    assert!(
        diffs[1].starts_with("value differs at byte 5") && diffs[1].contains("hex from 5: 31 7d"),
        "{diffs:#?}"
    );
    assert!(diffs[2].contains("runId is not UUID-shaped"), "{diffs:#?}");
    assert_eq!(diffs[3], "header tenant: debezium null / relay \"t\"");
    match compare("other", &[d], "d.", &[other], "r.") {
        Ok(()) => bail!("records in other partitions compared equal"),
        Err(e) => assert!(
            format!("{e:#}").contains("outbox.event.Order[1] record 0: only Debezium has"),
            "{e:#}"
        ),
    }
    Ok(())
}
