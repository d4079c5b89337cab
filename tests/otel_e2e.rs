//! End-to-end tests of the OpenTelemetry spans (`[tracing]`) against the real servers, Kafka
//! and a real OTLP receiver: Jaeger v2 (tests/services/jaeger.sh), whose query API
//! (`/api/traces/<trace id>`) returns the spans it received.
//!
//! A row with a `traceparent` column gets a `send <topic>` span (kind producer) in the row's
//! trace, child of the row's span, with the messaging attributes of the Kafka record the test
//! consumed (topic, partition, offset); the record carries the relay's span in its
//! `traceparent`. A row without one starts a new trace. A dead-lettered row's span has status
//! error. With spans off the row's `traceparent` is sent as is. The standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT` turns spans on too, and a clean stop exports the queued spans.
//! Every wait polls with a deadline.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use mysql_async::prelude::*;
use outbox_relay_testkit::{
    collect_records, describe_record, http_get, jaeger_otlp_endpoint, jaeger_query_port,
    kafka_bootstrap, wait_until, Record, RelayProcess, World,
};
use serde_json::Value;

/// The relay binary under test (built on first use).
fn bin() -> &'static str {
    outbox_relay_testkit::relay_bin()
}
const WAIT: Duration = Duration::from_secs(90);

/// `n` random bytes as lowercase hex (std's randomly keyed hasher; no other source needed).
fn random_hex(n: usize) -> String {
    let mut out = String::new();
    while out.len() < 2 * n {
        let mut h = RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out.truncate(2 * n);
    out
}

/// The `traceparent` fields: (trace id, span id, flags).
fn traceparent_parts(tp: &str) -> Result<(String, String, String)> {
    match tp.split('-').collect::<Vec<_>>()[..] {
        ["00", trace, span, flags] if trace.len() == 32 && span.len() == 16 => {
            Ok((trace.to_owned(), span.to_owned(), flags.to_owned()))
        }
        _ => bail!("not a W3C traceparent: {tp:?}"),
    }
}

/// Waits until Jaeger has the span `span_id` of trace `trace_id`; returns it with the trace's
/// processes (service names).
async fn jaeger_span(trace_id: &str, span_id: &str) -> Result<(Value, Value)> {
    let path = format!("/api/traces/{trace_id}");
    wait_until(
        &format!("Jaeger has span {span_id} of trace {trace_id}"),
        WAIT,
        Duration::from_millis(250),
        async || {
            let (status, body) = http_get(jaeger_query_port(), &path).await?;
            if status == 404 {
                return Ok(None);
            }
            ensure!(status == 200, "GET {path}: {status} {body}");
            let json: Value = serde_json::from_str(&body).context("Jaeger's answer")?;
            let Some(trace) = json["data"].get(0) else {
                return Ok(None);
            };
            let span = trace["spans"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|s| s["spanID"] == span_id);
            Ok(span.map(|s| (s.clone(), trace["processes"].clone())))
        },
    )
    .await
}

/// The value of tag `key` of a span as Jaeger returns it (`tags: [{key, type, value}]`).
fn tag<'s>(span: &'s Value, key: &str) -> Option<&'s Value> {
    span["tags"]
        .as_array()?
        .iter()
        .find(|t| t["key"] == key)
        .map(|t| &t["value"])
}

fn tag_str<'s>(span: &'s Value, key: &str) -> Option<&'s str> {
    tag(span, key).and_then(Value::as_str)
}

/// The span's `CHILD_OF` parent: (trace id, span id).
fn parent_of(span: &Value) -> Option<(String, String)> {
    span["references"].as_array()?.iter().find_map(|r| {
        (r["refType"] == "CHILD_OF").then(|| {
            (
                r["traceID"].as_str().unwrap_or_default().to_owned(),
                r["spanID"].as_str().unwrap_or_default().to_owned(),
            )
        })
    })
}

fn service_of<'p>(span: &Value, processes: &'p Value) -> Option<&'p str> {
    processes[span["processID"].as_str()?]["serviceName"].as_str()
}

/// Checks the messaging attributes of `span` against the record `r` the test consumed, of
/// `table` relayed by connector `source`.
fn ensure_record_span(
    span: &Value,
    r: &Record,
    event_key: &str,
    (table, source): (&str, &str),
) -> Result<()> {
    let describe = || format!("span {span}\nrecord {}", describe_record(r));
    ensure!(
        span["operationName"] == format!("send {}", r.topic).as_str(),
        "span name: {}",
        describe()
    );
    ensure!(
        tag_str(span, "span.kind") == Some("producer")
            && tag_str(span, "messaging.system") == Some("kafka")
            && tag_str(span, "messaging.operation.type") == Some("send")
            && tag_str(span, "messaging.destination.name") == Some(r.topic.as_str())
            && tag_str(span, "messaging.destination.partition.id")
                == Some(r.partition.to_string().as_str())
            && tag(span, "messaging.kafka.offset").and_then(Value::as_i64) == Some(r.offset)
            && tag_str(span, "messaging.kafka.message.key") == r.key_str()
            && tag_str(span, "outbox.event_key") == Some(event_key)
            && tag_str(span, "outbox.table") == Some(table)
            && tag_str(span, "outbox.source") == Some(source)
            && tag_str(span, "outbox.binlog.position").is_some_and(|p| p.contains(':'))
            && tag_str(span, "otel.status_code") == Some("OK"),
        "attributes: {}",
        describe()
    );
    let events: Vec<&str> = span["logs"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|l| l["fields"].as_array().into_iter().flatten())
        .filter(|f| f["key"] == "event")
        .filter_map(|f| f["value"].as_str())
        .collect();
    ensure!(
        events == ["kafka.produce"],
        "events {events:?}: {}",
        describe()
    );
    Ok(())
}

/// A row with a `traceparent` (and `tracestate`): the relay's span is in the row's trace, a
/// child of the row's span, with the record's topic, partition and offset; the record's
/// `traceparent` is the relay's span (same trace), its `tracestate` the row's. A row without
/// one starts a new trace whose root is the relay's span. A dead-lettered row's span has
/// status error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_of_relayed_rows_reach_jaeger_as_children_of_the_rows_trace() -> Result<()> {
    let mut world = World::new(bin(), "otel").await?;
    let service = format!("outbox-relay-test-{}", world.uid);
    world.spec.tracing_extra = format!(
        "otlp_endpoint = \"{}\"\nservice_name = \"{service}\"\n",
        jaeger_otlp_endpoint()
    );
    let dlq = format!("{}dead", world.topic_prefix());
    world.spec.dead_letter_topic = Some(dlq.clone());
    world.spec.outbox_extra = "null_payload = \"dead_letter\"\n".into();
    let table = world.db.outbox_table();
    let mut conn = world.db.conn().await?;
    conn.query_drop(
        "ALTER TABLE outbox ADD COLUMN traceparent VARCHAR(55) NULL, \
         ADD COLUMN tracestate VARCHAR(512) NULL",
    )
    .await?;
    let (trace_id, parent_id) = (random_hex(16), random_hex(8));
    let row_tp = format!("00-{trace_id}-{parent_id}-01");
    let row_ts = "shop=t61rcWkgMzE";
    let (dl_trace, dl_parent) = (random_hex(16), random_hex(8));
    let k = |n: u32| format!("{}-ot{n}", world.uid);
    let insert = "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, event_key, \
                  payload, created_at, traceparent, tracestate) VALUES ('Order', ?, 'OrderPaid', \
                  ?, ?, UTC_TIMESTAMP(6), ?, ?)";
    let (relay, _) = world.start(WAIT).await?;
    conn.exec_drop(
        insert,
        (
            "order-1",
            k(1),
            Some("{}"),
            Some(row_tp.as_str()),
            Some(row_ts),
        ),
    )
    .await?;
    conn.exec_drop(
        insert,
        ("order-2", k(2), Some("{}"), None::<&str>, None::<&str>),
    )
    .await?;
    // A NULL payload with null_payload = "dead_letter".
    let dl_tp = format!("00-{dl_trace}-{dl_parent}-01");
    conn.exec_drop(
        insert,
        (
            "order-3",
            k(3),
            None::<&str>,
            Some(dl_tp.as_str()),
            None::<&str>,
        ),
    )
    .await?;
    let topic = world.topic("Order");
    let records =
        collect_records(&kafka_bootstrap(), &[topic.clone(), dlq.clone()], 3, WAIT).await?;
    let by_key = |n: u32| -> Result<&Record> {
        records
            .iter()
            .find(|r| r.header("event_key") == Some(k(n).as_str()))
            .with_context(|| format!("no record for row {n}"))
    };

    // Row 1: the row's trace.
    let r1 = by_key(1)?;
    ensure!(r1.topic == topic, "{}", describe_record(r1));
    let sent_tp = r1.header("traceparent").context("row 1: no traceparent")?;
    let (sent_trace, sent_span, flags) = traceparent_parts(sent_tp)?;
    ensure!(
        sent_trace == trace_id && sent_span != parent_id && flags == "01",
        "row 1: the record's traceparent {sent_tp} should be the relay's span in trace {trace_id}"
    );
    ensure!(
        r1.header("tracestate") == Some(row_ts) && r1.header_count("traceparent") == 1,
        "row 1: {}",
        describe_record(r1)
    );
    let (span, processes) = jaeger_span(&trace_id, &sent_span).await?;
    ensure!(
        parent_of(&span) == Some((trace_id.clone(), parent_id.clone())),
        "row 1: the span's parent should be the row's span {parent_id}: {span}"
    );
    ensure!(
        service_of(&span, &processes) == Some(service.as_str()),
        "service name: {processes}"
    );
    ensure_record_span(&span, r1, &k(1), (&table, world.connector()))?;

    // Row 2: no traceparent, a new trace rooted at the relay's span.
    let r2 = by_key(2)?;
    let tp2 = r2.header("traceparent").context("row 2: no traceparent")?;
    let (trace2, span2, _) = traceparent_parts(tp2)?;
    ensure!(
        trace2 != trace_id && r2.header("tracestate").is_none(),
        "row 2: {}",
        describe_record(r2)
    );
    let (span, _) = jaeger_span(&trace2, &span2).await?;
    ensure!(
        parent_of(&span).is_none(),
        "row 2: a root span expected: {span}"
    );
    ensure_record_span(&span, r2, &k(2), (&table, world.connector()))?;

    // Row 3: dead-lettered; its span (in the row's trace) has status error.
    let r3 = by_key(3)?;
    ensure!(r3.topic == dlq, "row 3: {}", describe_record(r3));
    ensure!(
        r3.header("traceparent") == Some(dl_tp.as_str()),
        "a dead letter keeps the row's traceparent: {}",
        describe_record(r3)
    );
    let span = wait_until(
        "the dead-lettered row's span in Jaeger",
        WAIT,
        Duration::from_millis(250),
        async || {
            let (status, body) =
                http_get(jaeger_query_port(), &format!("/api/traces/{dl_trace}")).await?;
            if status != 200 {
                return Ok(None);
            }
            let json: Value = serde_json::from_str(&body)?;
            Ok(json["data"][0]["spans"]
                .as_array()
                .and_then(|s| {
                    s.iter()
                        .find(|s| parent_of(s).is_some_and(|p| p.1 == dl_parent))
                })
                .cloned())
        },
    )
    .await?;
    ensure!(
        tag_str(&span, "otel.status_code") == Some("ERROR")
            && tag(&span, "outbox.dead_lettered").and_then(Value::as_bool) == Some(true)
            && tag_str(&span, "messaging.kafka.message.key") == Some("order-3")
            && tag(&span, "error").and_then(Value::as_bool) == Some(true),
        "row 3: {span}"
    );
    relay.stop(WAIT).await?;
    drop(conn); // the pool's disconnect waits for every connection
    world.db.drop_database().await?;
    Ok(())
}

/// Without `[tracing]` (and no OTEL_EXPORTER_OTLP_* variable) the record keeps the row's
/// `traceparent` as it is: no span, no change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tracing_the_rows_traceparent_is_sent_as_is() -> Result<()> {
    let world = World::new(bin(), "otel_off").await?;
    let mut conn = world.db.conn().await?;
    conn.query_drop("ALTER TABLE outbox ADD COLUMN traceparent VARCHAR(55) NULL")
        .await?;
    let tp = format!("00-{}-{}-01", random_hex(16), random_hex(8));
    let (relay, _) = world.start(WAIT).await?;
    conn.exec_drop(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, event_key, payload, \
         created_at, traceparent) VALUES ('Order', 'o-1', 'OrderPaid', ?, '{}', UTC_TIMESTAMP(6), ?)",
        (format!("{}-off", world.uid), tp.as_str()),
    )
    .await?;
    let records = collect_records(&kafka_bootstrap(), &[world.topic("Order")], 1, WAIT).await?;
    relay.stop(WAIT).await?;
    ensure!(
        records[0].header("traceparent") == Some(tp.as_str()),
        "{}",
        describe_record(&records[0])
    );
    drop(conn);
    world.db.drop_database().await?;
    Ok(())
}

/// The standard environment instead of `[tracing]` (`OTEL_EXPORTER_OTLP_ENDPOINT`,
/// `OTEL_SERVICE_NAME`), and a batch schedule of ten minutes (`OTEL_BSP_SCHEDULE_DELAY`): the
/// row's span reaches Jaeger only because the clean stop flushes the exporter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_stop_exports_the_queued_spans() -> Result<()> {
    let world = World::new(bin(), "otel_flush").await?;
    let service = format!("outbox-relay-flush-{}", world.uid);
    let mut conn = world.db.conn().await?;
    conn.query_drop("ALTER TABLE outbox ADD COLUMN traceparent VARCHAR(55) NULL")
        .await?;
    let (trace_id, parent_id) = (random_hex(16), random_hex(8));
    let endpoint = jaeger_otlp_endpoint();
    let relay = RelayProcess::spawn(
        bin(),
        &world.spec.to_toml(),
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_SERVICE_NAME", service.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "600000"),
        ],
    )?;
    relay
        .wait_for_checkpoint_row(world.db.pool(), world.connector(), WAIT)
        .await?;
    conn.exec_drop(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, event_key, payload, \
         created_at, traceparent) VALUES ('Order', 'o-1', 'OrderPaid', ?, '{}', UTC_TIMESTAMP(6), ?)",
        (
            format!("{}-flush", world.uid),
            format!("00-{trace_id}-{parent_id}-01"),
        ),
    )
    .await?;
    let records = collect_records(&kafka_bootstrap(), &[world.topic("Order")], 1, WAIT).await?;
    let (sent_trace, sent_span, _) =
        traceparent_parts(records[0].header("traceparent").context("no traceparent")?)?;
    ensure!(sent_trace == trace_id, "{}", describe_record(&records[0]));
    // Acknowledged, but its span waits in the batch queue for the next export.
    let (status, _) = http_get(jaeger_query_port(), &format!("/api/traces/{trace_id}")).await?;
    ensure!(status == 404, "exported before the stop: {status}");
    relay.stop(WAIT).await?;
    let (span, processes) = jaeger_span(&trace_id, &sent_span).await?;
    ensure!(
        parent_of(&span) == Some((trace_id.clone(), parent_id))
            && service_of(&span, &processes) == Some(service.as_str()),
        "{span} {processes}"
    );
    ensure_record_span(
        &span,
        &records[0],
        &format!("{}-flush", world.uid),
        (&world.db.outbox_table(), world.connector()),
    )?;
    drop(conn);
    world.db.drop_database().await?;
    Ok(())
}
