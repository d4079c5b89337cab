//! Metrics (`inbox/CONTRACT.md`, "Metrics") read back from the Prometheus registry given in
//! `InboxConfig::metrics_registry`, against the real database (`OUTBOX_TEST_SERVER`) and Kafka:
//! `outbox_inbox_records_total` by outcome (processed, duplicate, stale, dead_lettered, parked,
//! resumed; a retry copy under its original topic), the parked gauges after sweeps, a second
//! inbox sharing the registry, and `outbox_inbox_consumer_lag` set by the runner.

mod common;
use common::{database, Effects};
use std::ops::ControlFlow;
use std::time::Duration;

use anyhow::{ensure, Result};
use outbox_inbox::{Inbox, InboxConfig, InboxConsumer, InboxRecord, Outcome};
use outbox_relay_testkit::kafka::create_topic;
use outbox_relay_testkit::kafka_bootstrap;
use outbox_relay_testkit::rdkafka::config::ClientConfig;
use outbox_relay_testkit::rdkafka::message::{Header, OwnedHeaders};
use outbox_relay_testkit::rdkafka::producer::{FutureProducer, FutureRecord};
use outbox_relay_testkit::unique::unique_suffix;
use prometheus::Registry;

fn record(
    topic: &str,
    offset: i64,
    event_key: &str,
    value: &str,
    version: &str,
    extra: &[(&str, &str)],
) -> InboxRecord {
    let mut headers: Vec<(String, Option<Vec<u8>>)> = [
        ("event_key", event_key),
        ("aggregate_type", "order"),
        ("version", version),
    ]
    .iter()
    .chain(extra)
    .map(|(k, v)| ((*k).to_owned(), Some(v.as_bytes().to_vec())))
    .collect();
    headers.retain(|(_, v)| v.as_deref() != Some(b""));
    InboxRecord {
        topic: topic.to_owned(),
        partition: 0,
        offset,
        key: Some(b"A".to_vec()),
        value: Some(value.as_bytes().to_vec()),
        headers,
    }
}

/// The value of series `name` with exactly `labels` (`None`: no such series).
fn value(registry: &Registry, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    registry
        .gather()
        .iter()
        .filter(|f| f.name() == name)
        .flat_map(|f| f.get_metric().iter())
        .find(|m| {
            m.get_label().len() == labels.len()
                && labels.iter().all(|(k, v)| {
                    m.get_label()
                        .iter()
                        .any(|l| l.name() == *k && l.value() == *v)
                })
        })
        // A counter's gauge part is 0, and the other way round.
        .map(|m| m.get_counter().get_value() + m.get_gauge().get_value())
}

#[tokio::test]
async fn settled_records_are_counted_by_outcome_and_the_parked_gauges_follow_the_sweeps(
) -> Result<()> {
    let suffix = unique_suffix();
    let topic = format!("inbox-rust-metrics-{suffix}");
    let dlq = format!("{topic}.dlq");
    let bootstrap = kafka_bootstrap();
    create_topic(&bootstrap, &dlq, 1_000_000).await?;
    let db = database("inbox_metrics").await?;
    let registry = Registry::new();
    let consumer = format!("metrics-{suffix}");
    let mut config = InboxConfig::new(&consumer, &dlq);
    config.version_header = Some("version".into());
    config.max_attempts = 1;
    config.metrics_registry = Some(registry.clone());
    let inbox = Inbox::new(db.pool().clone(), config.clone(), &bootstrap)?;
    // A second inbox on the same registry shares the series instead of failing.
    let other = Inbox::new(db.pool().clone(), config, &bootstrap)?;

    let outcome = |r: &InboxRecord| {
        let r = r.clone();
        let inbox = &inbox;
        async move { Ok::<_, anyhow::Error>(inbox.process(&r, &Effects).await?.outcome) }
    };
    ensure!(outcome(&record(&topic, 0, "e-1", "{}", "1", &[])).await? == Outcome::Processed);
    ensure!(outcome(&record(&topic, 0, "e-1", "{}", "1", &[])).await? == Outcome::Duplicate);
    // Another event with a version already applied: stale.
    ensure!(outcome(&record(&topic, 1, "e-1b", "{}", "1", &[])).await? == Outcome::Stale);
    ensure!(
        outcome(&record(&topic, 2, "e-poison", "poison", "", &[])).await? == Outcome::DeadLettered
    );
    ensure!(outcome(&record(&topic, 3, "e-3", "{}", "3", &[])).await? == Outcome::Parked);
    // A retry copy (read from another topic) counts under its original topic; through the
    // second inbox: the same series.
    let copy = record(
        &format!("{topic}.retry.1"),
        0,
        "e-copy",
        "{}",
        "",
        &[
            ("original_topic", &topic),
            ("original_partition", "0"),
            ("original_offset", "9"),
            ("retry_count", "1"),
        ],
    );
    ensure!(other.process(&copy, &Effects).await?.outcome == Outcome::Processed);

    let count = |outcome: &str| {
        value(
            &registry,
            "outbox_inbox_records_total",
            &[
                ("consumer", consumer.as_str()),
                ("topic", topic.as_str()),
                ("outcome", outcome),
            ],
        )
    };
    ensure!(count("processed") == Some(2.0), "{:?}", count("processed"));
    ensure!(count("duplicate") == Some(1.0));
    ensure!(count("stale") == Some(1.0));
    ensure!(count("dead_lettered") == Some(1.0));
    ensure!(count("parked") == Some(1.0));
    ensure!(count("resumed").is_none());
    ensure!(
        value(
            &registry,
            "outbox_inbox_records_total",
            &[
                ("consumer", consumer.as_str()),
                ("topic", format!("{topic}.retry.1").as_str()),
                ("outcome", "processed"),
            ],
        )
        .is_none(),
        "a copy is counted under its original topic"
    );

    // The parked gauges appear with the first sweep.
    let gauge = |name: &str| value(&registry, name, &[("consumer", consumer.as_str())]);
    ensure!(gauge("outbox_inbox_parked_records").is_none());
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let sweep = inbox.sweep_parked(&Effects).await?;
    ensure!(sweep.parked == 1, "{sweep:?}");
    ensure!(gauge("outbox_inbox_parked_records") == Some(1.0));
    let oldest = gauge("outbox_inbox_parked_oldest_seconds").unwrap_or(0.0);
    ensure!((1.0..60.0).contains(&oldest), "oldest {oldest}");

    // v2 applied: v3 resumes; the next sweep finds none.
    ensure!(outcome(&record(&topic, 4, "e-2", "{}", "2", &[])).await? == Outcome::Processed);
    ensure!(count("resumed") == Some(1.0));
    ensure!(count("processed") == Some(3.0));
    inbox.sweep_parked(&Effects).await?;
    ensure!(gauge("outbox_inbox_parked_records") == Some(0.0));
    ensure!(gauge("outbox_inbox_parked_oldest_seconds") == Some(0.0));
    drop(inbox);
    drop(other);
    db.drop_database().await
}

#[tokio::test]
async fn no_registry_no_metrics_in_the_default_registry() -> Result<()> {
    let db = database("inbox_metrics").await?;
    let inbox = Inbox::new(
        db.pool().clone(),
        InboxConfig::new(format!("nometrics-{}", unique_suffix()), "nometrics.dlq"),
        &kafka_bootstrap(),
    )?;
    let _ = inbox
        .process(&record("nometrics", 0, "e-1", "{}", "", &[]), &Effects)
        .await?;
    ensure!(prometheus::gather()
        .iter()
        .all(|f| !f.name().starts_with("outbox_inbox_")));
    drop(inbox);
    db.drop_database().await
}

#[tokio::test]
async fn the_runner_sets_the_consumer_lag_of_the_partitions_it_reads() -> Result<()> {
    let suffix = unique_suffix();
    let topic = format!("inbox-rust-lag-{suffix}");
    let dlq = format!("{topic}.dlq");
    let bootstrap = kafka_bootstrap();
    create_topic(&bootstrap, &topic, 1_000_000).await?;
    let db = database("inbox_metrics").await?;
    let registry = Registry::new();
    let consumer = format!("lag-{suffix}");
    let mut config = InboxConfig::new(&consumer, &dlq);
    config.metrics_registry = Some(registry.clone());
    let inbox = Inbox::new(db.pool().clone(), config, &bootstrap)?;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()?;
    let produce = |i: usize| {
        let producer = producer.clone();
        let topic = topic.clone();
        async move {
            let key = format!("e-{i}");
            producer
                .send(
                    FutureRecord::to(&topic)
                        .key("A")
                        .payload("{}")
                        .partition(0)
                        .headers(OwnedHeaders::new().insert(Header {
                            key: "event_key",
                            value: Some(key.as_str()),
                        })),
                    Duration::from_secs(10),
                )
                .await
                .map_err(|(e, _)| anyhow::anyhow!("{e}"))?;
            Ok::<_, anyhow::Error>(())
        }
    };
    produce(0).await?;
    let mut client = ClientConfig::new();
    client
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", &consumer)
        .set("auto.offset.reset", "earliest");
    let runner = InboxConsumer::with_config(client, &[topic.as_str()], inbox, Effects)?;
    // The first record is read before the statistics have a high watermark; more come once
    // they do (statistics every second), until the gauge is set.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(None::<f64>));
    let seen2 = std::sync::Arc::clone(&seen);
    let registry2 = registry.clone();
    let topic2 = topic.clone();
    let consumer2 = consumer.clone();
    let run = tokio::spawn(async move {
        runner
            .run_with(
                tokio::time::sleep(Duration::from_secs(60)),
                move |_, s, _| {
                    assert_eq!(s.outcome, Outcome::Processed);
                    let lag = value(
                        &registry2,
                        "outbox_inbox_consumer_lag",
                        &[
                            ("consumer", consumer2.as_str()),
                            ("topic", topic2.as_str()),
                            ("partition", "0"),
                        ],
                    );
                    if lag.is_some() {
                        if let Ok(mut s) = seen2.lock() {
                            *s = lag;
                        }
                        ControlFlow::Break(())
                    } else {
                        ControlFlow::Continue(())
                    }
                },
            )
            .await
    });
    for i in 1..40 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if run.is_finished() {
            break;
        }
        produce(i).await?;
    }
    run.await??;
    let lag = seen.lock().ok().and_then(|s| *s);
    ensure!(lag.is_some_and(|l| l >= 0.0), "{lag:?}");
    // The runner left the group: its partitions' series are removed (the next owner's count).
    let after = value(
        &registry,
        "outbox_inbox_consumer_lag",
        &[
            ("consumer", consumer.as_str()),
            ("topic", topic.as_str()),
            ("partition", "0"),
        ],
    );
    ensure!(after.is_none(), "{after:?}");
    db.drop_database().await
}
