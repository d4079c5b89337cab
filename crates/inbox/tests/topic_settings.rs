//! Per-topic settings (`inbox/CONTRACT.md`, "Per-topic settings") through `Inbox::process`
//! against the real database (`OUTBOX_TEST_SERVER`) and Kafka: one topic dead-letters after 1
//! attempt and another after 3; one topic parks version gaps while another dead-letters them; a
//! retry copy is processed under its original topic's settings, not the consumer-wide ones.

mod common;
use common::{database, Effects};
use std::time::Duration;

use anyhow::{ensure, Result};
use mysql_async::prelude::Queryable;
use outbox_inbox::{
    GapPolicy, Inbox, InboxConfig, InboxConsumer, InboxRecord, Outcome, TopicSettings,
};
use outbox_relay_testkit::kafka::{collect_records, create_topic, Record};
use outbox_relay_testkit::kafka_bootstrap;
use outbox_relay_testkit::unique::unique_suffix;

const TIMEOUT: Duration = Duration::from_secs(60);

fn record(
    topic: &str,
    offset: i64,
    event_key: &str,
    value: &str,
    version: Option<&str>,
) -> InboxRecord {
    let mut headers = vec![
        ("event_key".to_owned(), Some(event_key.as_bytes().to_vec())),
        ("aggregate_type".to_owned(), Some(b"order".to_vec())),
    ];
    if let Some(v) = version {
        headers.push(("version".to_owned(), Some(v.as_bytes().to_vec())));
    }
    InboxRecord {
        topic: topic.to_owned(),
        partition: 0,
        offset,
        key: Some(format!("agg-{topic}").into_bytes()),
        value: Some(value.as_bytes().to_vec()),
        headers,
    }
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

fn fast(config: &mut InboxConfig) {
    config.backoff_initial = Duration::from_millis(5);
    config.backoff_max = Duration::from_millis(20);
}

#[tokio::test]
async fn each_topic_dead_letters_after_its_own_max_attempts() -> Result<()> {
    let suffix = unique_suffix();
    let once = format!("inbox-rust-pt-once-{suffix}");
    let thrice = format!("inbox-rust-pt-thrice-{suffix}");
    let dlq = format!("inbox-rust-pt-{suffix}.dlq");
    let bootstrap = kafka_bootstrap();
    create_topic(&bootstrap, &dlq, 1_000_000).await?;
    let db = database("inbox_topics").await?;
    let mut config = InboxConfig::new("pt-attempts", &dlq).topic(
        &once,
        TopicSettings {
            max_attempts: Some(1),
            ..TopicSettings::default()
        },
    );
    config.max_attempts = 3;
    fast(&mut config);
    let inbox = Inbox::new(db.pool().clone(), config, &bootstrap)?;

    let a = inbox
        .process(&record(&once, 7, "once-1", "poison", None), &Effects)
        .await?;
    ensure!(
        a.outcome == Outcome::DeadLettered && a.attempts == 1,
        "{a:?}"
    );
    let b = inbox
        .process(&record(&thrice, 8, "thrice-1", "poison", None), &Effects)
        .await?;
    ensure!(
        b.outcome == Outcome::DeadLettered && b.attempts == 3,
        "{b:?}"
    );
    let letters = collect_records(&bootstrap, std::slice::from_ref(&dlq), 2, TIMEOUT).await?;
    let attempts = |topic: &str| {
        letters
            .iter()
            .find(|l| l.header("dlq_topic") == Some(topic))
            .and_then(|l| l.header("dlq_attempts"))
            .map(str::to_owned)
    };
    ensure!(attempts(&once).as_deref() == Some("1"), "{letters:?}");
    ensure!(attempts(&thrice).as_deref() == Some("3"), "{letters:?}");
    let effects: Option<u64> = db
        .conn()
        .await?
        .query_first("SELECT COUNT(*) FROM effects")
        .await?;
    ensure!(
        effects == Some(0),
        "every attempt was rolled back: {effects:?}"
    );
    drop(inbox);
    db.drop_database().await
}

#[tokio::test]
async fn one_topic_parks_a_version_gap_another_dead_letters_it() -> Result<()> {
    let suffix = unique_suffix();
    let parks = format!("inbox-rust-pt-parks-{suffix}");
    let strict = format!("inbox-rust-pt-strict-{suffix}");
    let dlq = format!("inbox-rust-pt-gap-{suffix}.dlq");
    let bootstrap = kafka_bootstrap();
    create_topic(&bootstrap, &dlq, 1_000_000).await?;
    let db = database("inbox_topics").await?;
    // Consumer-wide: dead-letter gaps; one topic parks them, with its own deadline.
    let mut config = InboxConfig::new("pt-gaps", &dlq).topic(
        &parks,
        TopicSettings {
            gap_policy: Some(GapPolicy::Park),
            gap_deadline: Some(Duration::from_secs(2 * 3600)),
            ..TopicSettings::default()
        },
    );
    config.gap_policy = GapPolicy::DeadLetter;
    config.version_header = Some("version".into());
    fast(&mut config);
    let inbox = Inbox::new(db.pool().clone(), config, &bootstrap)?;

    for topic in [&parks, &strict] {
        let v1 = inbox
            .process(
                &record(topic, 0, &format!("{topic}-v1"), "{}", Some("1")),
                &Effects,
            )
            .await?;
        ensure!(v1.outcome == Outcome::Processed, "{v1:?}");
    }
    let parked = inbox
        .process(
            &record(&parks, 1, &format!("{parks}-v3"), "{}", Some("3")),
            &Effects,
        )
        .await?;
    ensure!(parked.outcome == Outcome::Parked, "{parked:?}");
    let dead = inbox
        .process(
            &record(&strict, 1, &format!("{strict}-v3"), "{}", Some("3")),
            &Effects,
        )
        .await?;
    ensure!(
        dead.outcome == Outcome::DeadLettered
            && dead.reason.as_deref() == Some("version gap: expected 2, got 3"),
        "{dead:?}"
    );
    // The parked row's deadline is the topic's (2 h), not the consumer-wide 1 h.
    let mut conn = db.conn().await?;
    let deadline_s: Option<i64> = conn
        .query_first("SELECT TIMESTAMPDIFF(SECOND, parked_at, expires_at) FROM outbox_inbox_parked")
        .await?;
    ensure!(
        deadline_s.is_some_and(|s| (7190..=7210).contains(&s)),
        "{deadline_s:?}"
    );
    let letters = collect_records(&bootstrap, std::slice::from_ref(&dlq), 1, TIMEOUT).await?;
    ensure!(
        letters.len() == 1 && letters[0].header("dlq_topic") == Some(strict.as_str()),
        "{letters:?}"
    );
    // The parked one resumes once its predecessor is applied.
    let v2 = inbox
        .process(
            &record(&parks, 2, &format!("{parks}-v2"), "{}", Some("2")),
            &Effects,
        )
        .await?;
    ensure!(v2.outcome == Outcome::Processed, "{v2:?}");
    let left: Option<u64> = conn
        .query_first("SELECT COUNT(*) FROM outbox_inbox_parked")
        .await?;
    ensure!(left == Some(0), "{left:?}");
    drop(conn);
    drop(inbox);
    db.drop_database().await
}

#[tokio::test]
async fn a_retry_copy_uses_its_original_topics_settings() -> Result<()> {
    let suffix = unique_suffix();
    let topic = format!("inbox-rust-pt-copy-{suffix}");
    let dlq = format!("{topic}.dlq");
    let tier1 = format!("{topic}.retry.1");
    let bootstrap = kafka_bootstrap();
    for t in [&dlq, &tier1] {
        create_topic(&bootstrap, t, 1_000_000).await?;
    }
    let db = database("inbox_topics").await?;
    // Consumer-wide: 3 attempts, no tiers. The topic: 1 attempt, one tier.
    let mut config = InboxConfig::new("pt-copy", &dlq).topic(
        &topic,
        TopicSettings {
            max_attempts: Some(1),
            retry_tiers: Some(vec![Duration::from_secs(60)]),
            ..TopicSettings::default()
        },
    );
    config.max_attempts = 3;
    fast(&mut config);
    ensure!(config.retry_topics(&topic) == vec![tier1.clone()]);
    let inbox = Inbox::new(db.pool().clone(), config, &bootstrap)?;

    let first = inbox
        .process(&record(&topic, 5, "copy-1", "poison", None), &Effects)
        .await?;
    ensure!(
        first.outcome == Outcome::Retried && first.attempts == 1,
        "{first:?}"
    );
    let copies = collect_records(&bootstrap, std::slice::from_ref(&tier1), 1, TIMEOUT).await?;
    ensure!(copies.len() == 1, "{copies:?}");
    let copy = to_inbox(&copies[0]);
    ensure!(copy.topic == tier1);
    // Read from the tier topic (which has no settings of its own), processed under the
    // original topic's: 1 attempt (not 3), then the dead-letter topic after its only tier.
    let again = inbox.process(&copy, &Effects).await?;
    ensure!(
        again.outcome == Outcome::DeadLettered && again.attempts == 1,
        "{again:?}"
    );
    let letters = collect_records(&bootstrap, std::slice::from_ref(&dlq), 1, TIMEOUT).await?;
    ensure!(
        letters[0].header("dlq_topic") == Some(topic.as_str())
            && letters[0].header("dlq_attempts") == Some("1"),
        "{letters:?}"
    );
    drop(inbox);
    db.drop_database().await
}

#[tokio::test]
async fn the_runner_creates_and_reads_each_topics_own_tier_topics_and_sweeps_when_one_parks(
) -> Result<()> {
    use outbox_relay_testkit::kafka::list_topics;
    use outbox_relay_testkit::rdkafka::config::ClientConfig;
    use outbox_relay_testkit::rdkafka::message::{Header, OwnedHeaders};
    use outbox_relay_testkit::rdkafka::producer::{FutureProducer, FutureRecord};
    use std::ops::ControlFlow;

    let suffix = unique_suffix();
    let prefix = format!("inbox-rust-pt-run-{suffix}");
    let two = format!("{prefix}-two");
    let none = format!("{prefix}-none");
    let wide = format!("{prefix}-wide");
    let dlq = format!("{prefix}.dlq");
    let bootstrap = kafka_bootstrap();
    for t in [&two, &none, &wide] {
        create_topic(&bootstrap, t, 1_000_000).await?;
    }
    let db = database("inbox_topics").await?;
    let registry = prometheus::Registry::new();
    let consumer = format!("pt-run-{suffix}");
    // Consumer-wide: one tier, gaps dead-lettered. `two`: two tiers and parked gaps; `none`: no
    // tiers; `wide`: the default.
    let mut config = InboxConfig::new(&consumer, &dlq)
        .topic(
            &two,
            TopicSettings {
                retry_tiers: Some(vec![Duration::from_secs(60), Duration::from_secs(120)]),
                gap_policy: Some(GapPolicy::Park),
                ..TopicSettings::default()
            },
        )
        .topic(
            &none,
            TopicSettings {
                retry_tiers: Some(vec![]),
                ..TopicSettings::default()
            },
        );
    config.retry_tiers = vec![Duration::from_secs(60)];
    config.gap_policy = GapPolicy::DeadLetter;
    config.version_header = Some("version".into());
    config.metrics_registry = Some(registry.clone());
    let inbox = Inbox::new(db.pool().clone(), config, &bootstrap)?;
    let mut client = ClientConfig::new();
    client
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", &consumer)
        .set("auto.offset.reset", "earliest");
    let runner = InboxConsumer::with_config(
        client,
        &[two.as_str(), none.as_str(), wide.as_str()],
        inbox,
        Effects,
    )?;
    let run = tokio::spawn(async move {
        let mut seen = Vec::new();
        runner
            .run_with(tokio::time::sleep(TIMEOUT), move |r, s, _| {
                seen.push((r.topic.clone(), s.outcome));
                // The copy on `two`'s second tier, due at once: read because subscribed.
                if r.topic.ends_with("-two.retry.2") {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            })
            .await
    });
    // The tier topics: each topic's own count.
    let expected: std::collections::BTreeSet<String> = [
        format!("{two}.retry.1"),
        format!("{two}.retry.2"),
        format!("{wide}.retry.1"),
    ]
    .into_iter()
    .collect();
    let mut tiers = Default::default();
    for _ in 0..100 {
        tiers = list_topics(&bootstrap, &prefix)
            .await?
            .into_iter()
            .filter(|t| t.contains(".retry."))
            .collect::<std::collections::BTreeSet<_>>();
        if tiers == expected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ensure!(tiers == expected, "{tiers:?}");
    // A copy on `two`'s second tier, due now: the runner reads it.
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis()
        .to_string();
    let headers = [
        ("event_key", "run-copy"),
        ("retry_count", "2"),
        ("retry_at", now.as_str()),
        ("original_topic", two.as_str()),
        ("original_partition", "0"),
        ("original_offset", "0"),
    ]
    .iter()
    .fold(OwnedHeaders::new(), |h, (k, v)| {
        h.insert(Header {
            key: k,
            value: Some(*v),
        })
    });
    producer
        .send(
            FutureRecord::to(&format!("{two}.retry.2"))
                .key("agg")
                .payload("{}")
                .headers(headers),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| anyhow::anyhow!("{e}"))?;
    tokio::time::timeout(TIMEOUT, run).await???;
    // The sweep ran (one topic parks, though the default does not): its gauge is set.
    let swept = registry
        .gather()
        .iter()
        .any(|f| f.name() == "outbox_inbox_parked_records");
    ensure!(swept, "no parked sweep");
    db.drop_database().await
}
