//! Retry tiers (`inbox/CONTRACT.md`, "Retry tiers") through `Inbox::process` against the real
//! database (`OUTBOX_TEST_SERVER`) and Kafka: the copy to the next tier and its headers, the copy
//! processed (its inbox row naming the original record; again: a duplicate), the dead letter
//! after the last tier; and a tier topic the broker will not create refused at start.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Result;
use mysql_async::prelude::Queryable;
use mysql_async::Transaction;
use outbox_inbox::{
    Handler, HandlerError, Inbox, InboxConfig, InboxConsumer, InboxError, InboxRecord, Outcome,
};
use outbox_relay_testkit::db::migrations_dir;
use outbox_relay_testkit::kafka::{collect_records, create_topic, Record};
use outbox_relay_testkit::rdkafka::config::ClientConfig;
use outbox_relay_testkit::unique::unique_suffix;
use outbox_relay_testkit::{kafka_bootstrap, TestDb};

const TIMEOUT: Duration = Duration::from_secs(60);

/// Inserts a row, then fails while `fail` is set.
struct Flaky {
    fail: AtomicBool,
}

impl Handler for Flaky {
    async fn handle(
        &self,
        tx: &mut Transaction<'_>,
        record: &InboxRecord,
    ) -> Result<(), HandlerError> {
        tx.exec_drop(
            "INSERT INTO effects (event_key) VALUES (?)",
            (record.header_str("event_key").unwrap_or_default(),),
        )
        .await?;
        if self.fail.load(Ordering::SeqCst) {
            return Err("not yet".into());
        }
        Ok(())
    }
}

async fn database() -> Result<TestDb> {
    let db = TestDb::create("inbox_tiers").await?;
    let mut conn = db.conn().await?;
    conn.query_drop(std::fs::read_to_string(
        migrations_dir().join("0004_inbox.sql"),
    )?)
    .await?;
    conn.query_drop("CREATE TABLE effects (id BIGINT AUTO_INCREMENT PRIMARY KEY, event_key TEXT)")
        .await?;
    Ok(db)
}

fn to_inbox(r: &Record) -> InboxRecord {
    InboxRecord {
        topic: r.topic.clone(),
        partition: r.partition,
        offset: r.offset,
        key: r.key.clone(),
        value: r.value.clone(),
        headers: r.headers.clone(),
    }
}

#[tokio::test]
async fn a_failed_record_goes_through_the_tiers_then_to_the_dead_letter_topic() -> Result<()> {
    let suffix = unique_suffix();
    let topic = format!("inbox-rust-tiers-{suffix}");
    let dlq = format!("{topic}.dlq");
    let bootstrap = kafka_bootstrap();
    for t in [
        &dlq,
        &format!("{topic}.retry.1"),
        &format!("{topic}.retry.2"),
    ] {
        create_topic(&bootstrap, t, 1_000_000).await?;
    }
    let db = database().await?;
    let mut config = InboxConfig::new("tiers", &dlq);
    config.max_attempts = 2;
    config.backoff_initial = Duration::from_millis(10);
    config.retry_tiers = vec![Duration::from_secs(60), Duration::from_secs(300)];
    let inbox = Inbox::new(db.pool().clone(), config, &bootstrap)?;
    let handler = Flaky {
        fail: AtomicBool::new(true),
    };
    let original = InboxRecord {
        topic: topic.clone(),
        partition: 3,
        offset: 42,
        key: Some(b"order-1".to_vec()),
        value: Some(b"{\"n\":1}".to_vec()),
        headers: vec![
            ("event_key".into(), Some(b"e-1".to_vec())),
            ("event_type".into(), Some(b"OrderPaid".to_vec())),
        ],
    };
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as i64;
    let settled = inbox.process(&original, &handler).await?;
    assert_eq!(settled.outcome, Outcome::Retried);
    assert_eq!(settled.attempts, 2);
    assert_eq!(settled.reason.as_deref(), Some("not yet"));

    // Tier 1: the copy, with the record's key, value and headers.
    let tier1 = format!("{topic}.retry.1");
    let copies = collect_records(&bootstrap, std::slice::from_ref(&tier1), 1, TIMEOUT).await?;
    assert_eq!(copies.len(), 1);
    let c1 = &copies[0];
    assert_eq!(c1.key, original.key);
    assert_eq!(c1.value, original.value);
    assert_eq!(c1.header("event_key"), Some("e-1"));
    assert_eq!(c1.header("event_type"), Some("OrderPaid"));
    assert_eq!(c1.header("retry_count"), Some("1"));
    assert_eq!(c1.header("original_topic"), Some(topic.as_str()));
    assert_eq!(c1.header("original_partition"), Some("3"));
    assert_eq!(c1.header("original_offset"), Some("42"));
    assert_eq!(c1.header("retry_error"), Some("not yet"));
    let retry_at: i64 = c1.header("retry_at").unwrap_or_default().parse()?;
    assert!(
        retry_at >= before + 60_000,
        "retry_at {retry_at}, sent after {before}"
    );
    let history: serde_json::Value =
        serde_json::from_str(c1.header("retry_history").unwrap_or(""))?;
    assert_eq!(history.as_array().map(Vec::len), Some(1));
    assert_eq!(history[0]["topic"], topic.as_str());
    assert_eq!(history[0]["offset"], 42);
    assert_eq!(history[0]["attempts"], 2);

    // The copy fails again: tier 2, the history grows, the origin stays.
    let settled = inbox.process(&to_inbox(c1), &handler).await?;
    assert_eq!(settled.outcome, Outcome::Retried);
    let tier2 = format!("{topic}.retry.2");
    let copies = collect_records(&bootstrap, std::slice::from_ref(&tier2), 1, TIMEOUT).await?;
    let c2 = &copies[0];
    assert_eq!(c2.header("retry_count"), Some("2"));
    assert_eq!(c2.header("original_offset"), Some("42"));
    assert_eq!(c2.header_count("retry_count"), 1);
    let history: serde_json::Value =
        serde_json::from_str(c2.header("retry_history").unwrap_or(""))?;
    assert_eq!(history.as_array().map(Vec::len), Some(2));
    assert_eq!(history[1]["topic"], tier1.as_str());

    // After the last tier: the dead letter, with the history, naming the original record.
    let settled = inbox.process(&to_inbox(c2), &handler).await?;
    assert_eq!(settled.outcome, Outcome::DeadLettered);
    let letters = collect_records(&bootstrap, std::slice::from_ref(&dlq), 1, TIMEOUT).await?;
    let dl = &letters[0];
    assert_eq!(dl.header("dlq_topic"), Some(topic.as_str()));
    assert_eq!(dl.header("dlq_partition"), Some("3"));
    assert_eq!(dl.header("dlq_offset"), Some("42"));
    assert_eq!(dl.header("dlq_attempts"), Some("2"));
    assert_eq!(dl.header("retry_count"), Some("2"));
    assert!(dl.header("retry_history").is_some());

    // A copy that succeeds: processed once, its inbox row naming the original record; again: a
    // duplicate.
    handler.fail.store(false, Ordering::SeqCst);
    let settled = inbox.process(&to_inbox(c2), &handler).await?;
    assert_eq!(settled.outcome, Outcome::Processed);
    let row: Option<(String, i32, i64)> = db
        .conn()
        .await?
        .query_first("SELECT topic, kafka_partition, kafka_offset FROM outbox_inbox")
        .await?;
    assert_eq!(row, Some((topic.clone(), 3, 42)));
    let settled = inbox.process(&to_inbox(c1), &handler).await?;
    assert_eq!(settled.outcome, Outcome::Duplicate);
    let settled = inbox.process(&original, &handler).await?;
    assert_eq!(settled.outcome, Outcome::Duplicate);
    let effects: Option<u64> = db
        .conn()
        .await?
        .query_first("SELECT COUNT(*) FROM effects")
        .await?;
    assert_eq!(effects, Some(1));
    // The inbox's connection is released before the database goes.
    drop(inbox);
    db.drop_database().await
}

#[tokio::test]
async fn a_tier_topic_the_broker_will_not_create_is_refused_at_start() -> Result<()> {
    let suffix = unique_suffix();
    let topic = format!("inbox-rust-badtier-{suffix}");
    let dlq = format!("{topic}.dlq");
    let bootstrap = kafka_bootstrap();
    create_topic(&bootstrap, &topic, 1_000_000).await?;
    let db = database().await?;
    let mut config = InboxConfig::new("badtier", &dlq);
    config.retry_tiers = vec![Duration::from_secs(1)];
    config.retry_topic_format = "{topic}/retry/{n}".into(); // '/' is not allowed
    let inbox = Inbox::new(db.pool().clone(), config, &bootstrap)?;
    let mut client = ClientConfig::new();
    client
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", &topic)
        .set("auto.offset.reset", "earliest");
    let handler = Flaky {
        fail: AtomicBool::new(false),
    };
    let consumer = InboxConsumer::with_config(client, &[topic.as_str()], inbox, handler)?;
    let result = tokio::time::timeout(TIMEOUT, consumer.run(std::future::pending())).await?;
    let bad = format!("{topic}/retry/1");
    match result {
        Err(e @ InboxError::RetryTopic { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains(&bad) && text.contains("retry_topic_format"),
                "{text}"
            );
        }
        other => panic!("expected a refusal naming {bad}, got {other:?}"),
    }
    db.drop_database().await
}
