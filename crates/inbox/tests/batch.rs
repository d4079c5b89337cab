//! Batch mode (`inbox/CONTRACT.md`, "Batch mode"): `Inbox::process_batch` and the runner with
//! `batch_max_records > 1`, against the real database (`OUTBOX_TEST_SERVER`: the MariaDB path,
//! `INSERT IGNORE … RETURNING`, or the MySQL path, `SELECT … FOR UPDATE` + multi-row `INSERT`,
//! a database of its own) and Kafka. Each test asserts the rows in the database, the records on
//! Kafka and the count of business effects.

mod common;
use common::{database, Effects};

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{ensure, Context as _, Result};
use mysql_async::prelude::Queryable;
use mysql_async::{Pool, Transaction};
use outbox_inbox::{
    Handler, HandlerError, Hooks, Inbox, InboxConfig, InboxConsumer, InboxRecord, Outcome, Settled,
};
use outbox_relay_testkit::env::test_server;
use outbox_relay_testkit::kafka::{collect_records, create_topic};
use outbox_relay_testkit::rdkafka::config::ClientConfig;
use outbox_relay_testkit::rdkafka::consumer::{BaseConsumer, Consumer};
use outbox_relay_testkit::rdkafka::message::{Header, OwnedHeaders};
use outbox_relay_testkit::rdkafka::producer::{FutureProducer, FutureRecord};
use outbox_relay_testkit::rdkafka::{Offset, TopicPartitionList};
use outbox_relay_testkit::unique::unique_suffix;
use outbox_relay_testkit::{kafka_bootstrap, TestDb};

const TIMEOUT: Duration = Duration::from_secs(60);

fn record(topic: &str, offset: i64, key: &str, value: &str) -> InboxRecord {
    InboxRecord {
        topic: topic.to_owned(),
        partition: 0,
        offset,
        key: Some(b"A".to_vec()),
        value: Some(value.as_bytes().to_vec()),
        headers: vec![
            ("event_key".to_owned(), Some(key.as_bytes().to_vec())),
            ("aggregate_type".to_owned(), Some(b"order".to_vec())),
        ],
    }
}

/// A record of aggregate `order`/`id` at `version`.
fn versioned(topic: &str, offset: i64, id: &str, version: i64) -> InboxRecord {
    let key = format!("{id}-v{version}");
    InboxRecord {
        topic: topic.to_owned(),
        partition: 0,
        offset,
        key: Some(id.as_bytes().to_vec()),
        value: Some(b"{}".to_vec()),
        headers: vec![
            ("event_key".to_owned(), Some(key.into_bytes())),
            ("aggregate_type".to_owned(), Some(b"order".to_vec())),
            ("version".to_owned(), Some(version.to_string().into_bytes())),
        ],
    }
}

fn outcomes(settled: &[Settled]) -> Vec<Outcome> {
    settled.iter().map(|s| s.outcome).collect()
}

/// Effects per event key, sorted by key.
async fn effects(db: &TestDb) -> Result<Vec<(String, u64)>> {
    let mut conn = db.conn().await?;
    // Counted here: the effects column's collation would fold case.
    let keys: Vec<String> = conn.query("SELECT event_key FROM effects").await?;
    let mut counts = std::collections::BTreeMap::new();
    for k in keys {
        *counts.entry(k).or_insert(0u64) += 1;
    }
    Ok(counts.into_iter().collect())
}

/// The inbox rows of `consumer`: event_key, topic, partition, offset, processed_at set.
async fn inbox_rows(db: &TestDb, consumer: &str) -> Result<Vec<(String, String, i32, i64, bool)>> {
    let mut conn = db.conn().await?;
    Ok(conn
        .exec(
            "SELECT CAST(event_key AS CHAR), topic, kafka_partition, kafka_offset, \
             processed_at IS NOT NULL FROM outbox_inbox WHERE consumer = ? ORDER BY kafka_offset",
            (consumer,),
        )
        .await?)
}

async fn dlq_topic(topic: &str) -> Result<String> {
    let dlq = format!("{topic}.dlq");
    create_topic(&kafka_bootstrap(), &dlq, 1_048_588).await?;
    Ok(dlq)
}

fn config(consumer: &str, dlq: &str) -> InboxConfig {
    let mut c = InboxConfig::new(consumer, dlq);
    c.backoff_initial = Duration::from_millis(10);
    c.backoff_max = Duration::from_millis(50);
    c.batch_max_records = 100;
    c
}

#[tokio::test]
async fn a_batch_of_new_records_is_processed_with_the_rows_the_single_path_writes() -> Result<()> {
    let db = database("inbox_batch_new").await?;
    let topic = format!("inbox-rust-batch-new-{}", unique_suffix());
    let dlq = dlq_topic(&topic).await?;
    let inbox = Inbox::new(db.pool().clone(), config("bnew", &dlq), &kafka_bootstrap())?;
    let records: Vec<InboxRecord> = (0..50)
        .map(|i| record(&topic, i, &format!("k{i:02}"), "{}"))
        .collect();
    let settled = inbox.process_batch(&records, &Effects).await?;
    assert_eq!(outcomes(&settled), vec![Outcome::Processed; 50]);
    assert!(settled
        .iter()
        .all(|s| s.attempts == 1 && s.reason.is_none()));
    let fx = effects(&db).await?;
    assert_eq!(fx.len(), 50);
    assert!(fx.iter().all(|(_, n)| *n == 1), "{fx:?}");
    // The same columns the single path writes: the single path's row of one more record
    // beside the batch's.
    let single = inbox
        .process(&record(&topic, 50, "k50", "{}"), &Effects)
        .await?;
    assert_eq!(single.outcome, Outcome::Processed);
    let rows = inbox_rows(&db, "bnew").await?;
    let expected: Vec<(String, String, i32, i64, bool)> = (0..=50)
        .map(|i| (format!("k{i:02}"), topic.clone(), 0, i, true))
        .collect();
    assert_eq!(rows, expected);
    drop(inbox); // returns its connection: the pool's disconnect waits for it
    db.drop_database().await
}

#[tokio::test]
async fn keys_already_in_the_inbox_or_twice_in_the_batch_are_duplicates() -> Result<()> {
    let db = database("inbox_batch_dup").await?;
    let topic = format!("inbox-rust-batch-dup-{}", unique_suffix());
    let dlq = dlq_topic(&topic).await?;
    let inbox = Inbox::new(db.pool().clone(), config("bdup", &dlq), &kafka_bootstrap())?;
    let old = inbox
        .process(&record(&topic, 0, "old", "{}"), &Effects)
        .await?;
    assert_eq!(old.outcome, Outcome::Processed);
    let batch = [
        record(&topic, 1, "k1", "{}"),
        record(&topic, 2, "old", "{}"),
        record(&topic, 3, "k2", "{}"),
        record(&topic, 4, "k1", "{}"),
        // Differs from k1 only in case: another event (keys are bytes).
        record(&topic, 5, "K1", "{}"),
    ];
    let settled = inbox.process_batch(&batch, &Effects).await?;
    use Outcome::{Duplicate as D, Processed as P};
    assert_eq!(outcomes(&settled), vec![P, D, P, D, P]);
    assert!(settled.iter().all(|s| s.attempts == 1));
    assert_eq!(
        effects(&db).await?,
        vec![
            ("K1".to_owned(), 1),
            ("k1".to_owned(), 1),
            ("k2".to_owned(), 1),
            ("old".to_owned(), 1)
        ]
    );
    // The duplicate of k1 in the batch did not write a row of its own (offset 4).
    let offsets: Vec<i64> = inbox_rows(&db, "bdup").await?.iter().map(|r| r.3).collect();
    assert_eq!(offsets, vec![0, 1, 3, 5]);
    drop(inbox); // returns its connection: the pool's disconnect waits for it
    db.drop_database().await
}

#[tokio::test]
async fn a_handler_error_mid_batch_dead_letters_that_record_alone() -> Result<()> {
    let db = database("inbox_batch_poison").await?;
    let topic = format!("inbox-rust-batch-poison-{}", unique_suffix());
    let dlq = dlq_topic(&topic).await?;
    let mut c = config("bpoison", &dlq);
    c.max_attempts = 2;
    let inbox = Inbox::new(db.pool().clone(), c, &kafka_bootstrap())?;
    let batch = [
        record(&topic, 0, "a", "{}"),
        record(&topic, 1, "b", "{}"),
        record(&topic, 2, "p", "poison"),
        record(&topic, 3, "c", "{}"),
        record(&topic, 4, "d", "{}"),
    ];
    let settled = inbox.process_batch(&batch, &Effects).await?;
    use Outcome::{DeadLettered as X, Processed as P};
    assert_eq!(outcomes(&settled), vec![P, P, X, P, P]);
    assert_eq!(settled[2].attempts, 2);
    assert_eq!(settled[2].reason.as_deref(), Some("poison record"));
    // Exactly once each: the rolled-back batch left nothing; the poison record's effect was
    // rolled back with each of its attempts.
    assert_eq!(
        effects(&db).await?,
        vec![
            ("a".to_owned(), 1),
            ("b".to_owned(), 1),
            ("c".to_owned(), 1),
            ("d".to_owned(), 1)
        ]
    );
    let letters = collect_records(&kafka_bootstrap(), &[dlq], 1, TIMEOUT).await?;
    ensure!(letters.len() == 1, "{} dead letters", letters.len());
    let header = |name: &str| {
        letters[0]
            .headers
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.clone())
    };
    assert_eq!(header("dlq_attempts").as_deref(), Some(&b"2"[..]));
    assert_eq!(header("dlq_offset").as_deref(), Some(&b"2"[..]));
    assert_eq!(header("event_key").as_deref(), Some(&b"p"[..]));
    drop(inbox); // returns its connection: the pool's disconnect waits for it
    db.drop_database().await
}

/// Notes every `after_commit` (event key, outcome) and `before_commit` call.
#[derive(Clone, Default)]
struct Notes {
    after: Arc<Mutex<Vec<(String, &'static str)>>>,
    before: Arc<AtomicU32>,
}

impl Hooks for Notes {
    fn before_commit(&self, _record: &InboxRecord) {
        self.before.fetch_add(1, Ordering::SeqCst);
    }
    fn after_commit(&self, record: &InboxRecord, settled: &Settled) {
        let key = record
            .header_str("event_key")
            .unwrap_or_default()
            .to_owned();
        if let Ok(mut a) = self.after.lock() {
            a.push((key, settled.outcome.as_str()));
        }
    }
}

#[tokio::test]
async fn versions_in_a_batch_are_decided_in_order_and_a_gap_is_parked_then_resumed() -> Result<()> {
    let db = database("inbox_batch_versions").await?;
    let topic = format!("inbox-rust-batch-versions-{}", unique_suffix());
    let dlq = dlq_topic(&topic).await?;
    let mut c = config("bver", &dlq);
    c.version_header = Some("version".into());
    let notes = Notes::default();
    let inbox = Inbox::new(db.pool().clone(), c, &kafka_bootstrap())?.with_hooks(notes.clone());
    db.conn()
        .await?
        .exec_drop(
            "INSERT INTO outbox_inbox_version (consumer, aggregate_type, aggregate_id, version) \
             VALUES ('bver', 'order', 'B', 5)",
            (),
        )
        .await?;
    let batch = [
        versioned(&topic, 0, "A", 1),
        versioned(&topic, 1, "A", 2),
        versioned(&topic, 2, "A", 4),
        versioned(&topic, 3, "B", 3),
        versioned(&topic, 4, "A", 3),
    ];
    let settled = inbox.process_batch(&batch, &Effects).await?;
    use Outcome::{Parked, Processed as P, Stale};
    assert_eq!(outcomes(&settled), vec![P, P, Parked, Stale, P]);
    assert_eq!(
        settled[2].reason.as_deref(),
        Some("version gap: expected 3, got 4")
    );
    // Reported as the single path reports them: v4 parked, then resumed after the batch.
    let after = notes.after.lock().map(|a| a.clone()).unwrap_or_default();
    assert_eq!(
        after,
        vec![
            ("A-v1".to_owned(), "processed"),
            ("A-v2".to_owned(), "processed"),
            ("A-v4".to_owned(), "parked"),
            ("B-v3".to_owned(), "stale"),
            ("A-v3".to_owned(), "processed"),
            ("A-v4".to_owned(), "resumed"),
        ]
    );
    // before_commit: the three processed in the batch, then the resumed one.
    assert_eq!(notes.before.load(Ordering::SeqCst), 4);
    let mut conn = db.conn().await?;
    let stored: Vec<(String, i64)> = conn
        .query(
            "SELECT CAST(aggregate_id AS CHAR), version FROM outbox_inbox_version \
             WHERE consumer = 'bver' ORDER BY aggregate_id",
        )
        .await?;
    assert_eq!(stored, vec![("A".to_owned(), 4), ("B".to_owned(), 5)]);
    let parked: u64 = conn
        .query_first("SELECT COUNT(*) FROM outbox_inbox_parked")
        .await?
        .unwrap_or(99);
    assert_eq!(parked, 0);
    drop(conn);
    // The stale record's inbox row stays (a redelivery is a duplicate), like the single path's.
    let keys: Vec<String> = inbox_rows(&db, "bver")
        .await?
        .into_iter()
        .map(|r| r.0)
        .collect();
    assert_eq!(keys, vec!["A-v1", "A-v2", "A-v4", "B-v3", "A-v3"]);
    assert_eq!(
        effects(&db).await?,
        vec![
            ("A-v1".to_owned(), 1),
            ("A-v2".to_owned(), 1),
            ("A-v3".to_owned(), 1),
            ("A-v4".to_owned(), 1)
        ]
    );
    drop(inbox); // returns its connection: the pool's disconnect waits for it
    db.drop_database().await
}

#[tokio::test]
async fn a_key_inserted_concurrently_during_the_batch_is_a_duplicate() -> Result<()> {
    let db = database("inbox_batch_race").await?;
    let topic = format!("inbox-rust-batch-race-{}", unique_suffix());
    let dlq = dlq_topic(&topic).await?;
    // MySQL: READ COMMITTED on the inbox's connections, where the SELECT … FOR UPDATE takes
    // no gap locks and the concurrent insert goes through.
    let opts =
        mysql_async::OptsBuilder::from_opts(mysql_async::Opts::from_url(&db.url())?).init(vec![
            "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
        ]);
    let pool = Pool::new(opts);
    let mut inbox = Inbox::new(pool.clone(), config("brace", &dlq), &kafka_bootstrap())?;
    let other = db.pool().clone();
    let calls = Arc::new(AtomicU32::new(0));
    let (topic2, calls2) = (topic.clone(), calls.clone());
    inbox.set_batch_hook(move || {
        let (other, topic, calls) = (other.clone(), topic2.clone(), calls2.clone());
        Box::pin(async move {
            if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                // Another consumer instance commits k2's inbox row (its effect with it).
                let mut conn = other.get_conn().await.expect("second connection");
                conn.exec_drop(
                    "INSERT INTO outbox_inbox (consumer, event_key, topic, kafka_partition, \
                     kafka_offset) VALUES ('brace', 'k2', ?, 0, 99)",
                    (topic,),
                )
                .await
                .expect("the concurrent insert");
            }
        })
    });
    let batch = [
        record(&topic, 0, "k1", "{}"),
        record(&topic, 1, "k2", "{}"),
        record(&topic, 2, "k3", "{}"),
    ];
    let settled = inbox.process_batch(&batch, &Effects).await?;
    use Outcome::{Duplicate as D, Processed as P};
    assert_eq!(outcomes(&settled), vec![P, D, P]);
    assert!(settled.iter().all(|s| s.attempts == 1));
    assert_eq!(
        effects(&db).await?,
        vec![("k1".to_owned(), 1), ("k3".to_owned(), 1)]
    );
    let rows = inbox_rows(&db, "brace").await?;
    assert_eq!(rows.iter().map(|r| r.3).collect::<Vec<_>>(), vec![0, 2, 99]);
    let calls = calls.load(Ordering::SeqCst);
    if test_server().is_mysql() {
        // The multi-row INSERT met k2 (1062): the batch was redone, and found it.
        assert_eq!(calls, 2, "MySQL: one redo after the 1062");
    } else {
        // MariaDB: INSERT IGNORE … RETURNING left k2 out at once.
        assert_eq!(calls, 1, "MariaDB: no redo");
    }
    drop(inbox); // returns its connection: the pool's disconnect waits for it
    pool.disconnect().await?;
    db.drop_database().await
}

/// Writes the effect; the handler of `kill_key` first kills its own connection, once.
struct KillOnce {
    pool: Pool,
    kill_key: &'static str,
    killed: AtomicBool,
}

impl Handler for KillOnce {
    async fn handle(
        &self,
        tx: &mut Transaction<'_>,
        record: &InboxRecord,
    ) -> Result<(), HandlerError> {
        let key = record.header_str("event_key").unwrap_or_default();
        if key == self.kill_key && !self.killed.swap(true, Ordering::SeqCst) {
            let id: Option<u64> = tx.query_first("SELECT CONNECTION_ID()").await?;
            let mut other = self.pool.get_conn().await?;
            other
                .query_drop(format!("KILL CONNECTION {}", id.unwrap_or_default()))
                .await?;
        }
        tx.exec_drop("INSERT INTO effects (event_key) VALUES (?)", (key,))
            .await?;
        Ok(())
    }
}

#[tokio::test]
async fn a_connection_killed_mid_batch_redoes_the_whole_batch() -> Result<()> {
    let db = database("inbox_batch_kill").await?;
    let topic = format!("inbox-rust-batch-kill-{}", unique_suffix());
    let dlq = dlq_topic(&topic).await?;
    let inbox = Inbox::new(db.pool().clone(), config("bkill", &dlq), &kafka_bootstrap())?;
    let handler = KillOnce {
        pool: db.pool().clone(),
        kill_key: "k3",
        killed: AtomicBool::new(false),
    };
    let batch: Vec<InboxRecord> = (1..=5)
        .map(|i| record(&topic, i, &format!("k{i}"), "{}"))
        .collect();
    let settled = inbox.process_batch(&batch, &handler).await?;
    assert_eq!(outcomes(&settled), vec![Outcome::Processed; 5]);
    assert!(settled.iter().all(|s| s.attempts == 1), "{settled:?}");
    assert!(handler.killed.load(Ordering::SeqCst));
    let fx = effects(&db).await?;
    assert_eq!(
        fx,
        (1..=5).map(|i| (format!("k{i}"), 1)).collect::<Vec<_>>()
    );
    assert_eq!(inbox_rows(&db, "bkill").await?.len(), 5);
    drop(inbox); // returns its connection: the pool's disconnect waits for it
    db.drop_database().await
}

#[tokio::test]
async fn the_runner_settles_500_records_in_batches_of_100() -> Result<()> {
    let db = database("inbox_batch_runner").await?;
    let suffix = unique_suffix();
    let topic = format!("inbox-rust-batch-runner-{suffix}");
    let bootstrap = kafka_bootstrap();
    create_topic(&bootstrap, &topic, 1_048_588).await?;
    let dlq = dlq_topic(&topic).await?;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("linger.ms", "5")
        .create()?;
    let sends = (0..500).map(|i| {
        let key = format!("r{i:03}");
        let producer = &producer;
        let topic = &topic;
        async move {
            producer
                .send(
                    FutureRecord::to(topic).key("A").payload("{}").headers(
                        OwnedHeaders::new().insert(Header {
                            key: "event_key",
                            value: Some(key.as_str()),
                        }),
                    ),
                    TIMEOUT,
                )
                .await
                .map_err(|(e, _)| e)
        }
    });
    for r in futures::future::join_all(sends).await {
        r?;
    }
    let group = format!("inbox-rust-batch-runner-{suffix}");
    let mut client = ClientConfig::new();
    client
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", &group)
        .set("auto.offset.reset", "earliest");
    let before = Arc::new(AtomicU32::new(0));
    let notes = Notes {
        before: before.clone(),
        ..Notes::default()
    };
    let inbox =
        Inbox::new(db.pool().clone(), config("brunner", &dlq), &bootstrap)?.with_hooks(notes);
    let consumer = InboxConsumer::with_config(client.clone(), &[topic.as_str()], inbox, Effects)?;
    let mut settled = Vec::new();
    tokio::time::timeout(
        TIMEOUT,
        consumer.run_with(std::future::pending(), |_, s, _| {
            settled.push(s.outcome);
            if settled.len() >= 500 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        }),
    )
    .await
    .context("the runner did not settle 500 records in time")??;
    assert_eq!(settled, vec![Outcome::Processed; 500]);
    assert_eq!(before.load(Ordering::SeqCst), 500);
    let fx = effects(&db).await?;
    assert_eq!(fx.len(), 500);
    assert!(fx.iter().all(|(_, n)| *n == 1));
    let check: BaseConsumer = client.create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(&topic, 0);
    let committed = check.committed_offsets(tpl, Duration::from_secs(10))?;
    let offset = committed
        .find_partition(&topic, 0)
        .map(|p| p.offset())
        .context("no committed offset")?;
    assert_eq!(offset, Offset::Offset(500));
    db.drop_database().await
}
