//! A missing dead-letter topic (`inbox/CONTRACT.md`, "Dead letters"): `InboxConsumer::run`
//! creates it before its first poll, or refuses to start naming the topic and the fix, against
//! the real database (`OUTBOX_TEST_SERVER`) and Kafka.

use std::ops::ControlFlow;
use std::time::Duration;

use anyhow::Result;
use mysql_async::Transaction;
use outbox_inbox::{
    Handler, HandlerError, Inbox, InboxConfig, InboxConsumer, InboxError, InboxRecord, Outcome,
};
use outbox_relay_testkit::db::migrations_dir;
use outbox_relay_testkit::kafka::{collect_records, create_topic};
use outbox_relay_testkit::mysql_async::prelude::Queryable;
use outbox_relay_testkit::rdkafka::config::ClientConfig;
use outbox_relay_testkit::rdkafka::producer::{FutureProducer, FutureRecord};
use outbox_relay_testkit::unique::unique_suffix;
use outbox_relay_testkit::{kafka_bootstrap, TestDb};

const TIMEOUT: Duration = Duration::from_secs(60);

/// Never called: the records of these tests have no event_key.
struct NoEffect;

impl Handler for NoEffect {
    async fn handle(&self, _: &mut Transaction<'_>, _: &InboxRecord) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// A database with the inbox tables and an inbox dead-lettering to `dlq`.
async fn inbox(dlq: &str) -> Result<(TestDb, Inbox)> {
    let db = TestDb::create("inbox_dlqtopic").await?;
    let mut conn = db.conn().await?;
    conn.query_drop(std::fs::read_to_string(
        migrations_dir().join("0004_inbox.sql"),
    )?)
    .await?;
    drop(conn);
    let inbox = Inbox::new(
        db.pool().clone(),
        InboxConfig::new("dlqtopic", dlq),
        &kafka_bootstrap(),
    )?;
    Ok((db, inbox))
}

fn client_config(group: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", kafka_bootstrap())
        .set("group.id", group)
        .set("auto.offset.reset", "earliest");
    config
}

#[tokio::test]
async fn a_missing_dead_letter_topic_is_created_and_the_dead_letter_arrives() -> Result<()> {
    let suffix = unique_suffix();
    let (topic, dlq) = (
        format!("inbox-rust-fresh-{suffix}"),
        format!("inbox-rust-fresh-dlq-{suffix}"), // nobody creates it
    );
    let bootstrap = kafka_bootstrap();
    create_topic(&bootstrap, &topic, 1_000_000).await?;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()?;
    producer
        .send(
            FutureRecord::<str, str>::to(&topic)
                .key("order-x")
                .payload("{}"),
            TIMEOUT,
        )
        .await
        .map_err(|(e, _)| e)?;
    let (db, inbox) = inbox(&dlq).await?;
    let consumer = InboxConsumer::with_config(
        client_config(&format!("inbox-rust-fresh-{suffix}")),
        &[topic.as_str()],
        inbox,
        NoEffect,
    )?;
    let mut outcomes = Vec::new();
    tokio::time::timeout(
        TIMEOUT,
        consumer.run_with(std::future::pending(), |_, settled, _| {
            outcomes.push(settled.outcome);
            ControlFlow::Break(())
        }),
    )
    .await??;
    assert_eq!(outcomes, vec![Outcome::DeadLettered]);
    let letters = collect_records(&bootstrap, std::slice::from_ref(&dlq), 1, TIMEOUT).await?;
    let reason = letters[0]
        .headers
        .iter()
        .find(|(k, _)| k == "dlq_reason")
        .and_then(|(_, v)| v.clone());
    assert_eq!(reason.as_deref(), Some(&b"missing event_key header"[..]));
    db.drop_database().await
}

#[tokio::test]
async fn a_dead_letter_topic_the_broker_will_not_create_is_refused_at_start() -> Result<()> {
    let suffix = unique_suffix();
    let topic = format!("inbox-rust-bad-{suffix}");
    let bad = format!("inbox-rust-bad/dlq-{suffix}"); // '/' is not allowed in a topic name
    create_topic(&kafka_bootstrap(), &topic, 1_000_000).await?;
    let (db, inbox) = inbox(&bad).await?;
    let consumer =
        InboxConsumer::with_config(client_config(&topic), &[topic.as_str()], inbox, NoEffect)?;
    let result = tokio::time::timeout(TIMEOUT, consumer.run(std::future::pending())).await?;
    match result {
        Err(e @ InboxError::DeadLetterTopic { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains(&bad) && text.contains("kafka-topics.sh --create"),
                "{text}"
            );
        }
        other => panic!("expected a refusal naming {bad}, got {other:?}"),
    }
    db.drop_database().await
}
