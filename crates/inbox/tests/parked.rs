//! The compensation hook of parked versions (`inbox/CONTRACT.md`, "Hooks", `on_gap_expired`),
//! against the real database (`OUTBOX_TEST_SERVER`, a database of its own) and Kafka: a parked
//! record whose gap deadline passed goes to the hook instead of the dead-letter topic; a failing
//! hook leaves the row for the next sweep; a hook that succeeds removes it (outcome
//! `compensated`), and no dead letter is written.

mod common;
use common::{database, Effects};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{ensure, Result};
use mysql_async::prelude::Queryable;
use outbox_inbox::{Hooks, Inbox, InboxConfig, InboxRecord, Outcome, Settled};
use outbox_relay_testkit::kafka::{create_topic, high_watermark_total};
use outbox_relay_testkit::unique::unique_suffix;
use outbox_relay_testkit::{kafka_bootstrap, wait_until};

/// Fails its first compensation, then compensates; notes what it was given and the outcomes.
#[derive(Default)]
struct Compensation {
    calls: Mutex<Vec<(String, String)>>,
    outcomes: Mutex<Vec<(String, &'static str)>>,
}

/// The hooks given to the inbox: the test keeps the other handle.
struct Shared(Arc<Compensation>);

impl Hooks for Shared {
    fn after_commit(&self, record: &InboxRecord, settled: &Settled) {
        let key = record
            .header_str("event_key")
            .unwrap_or_default()
            .to_owned();
        if let Ok(mut o) = self.0.outcomes.lock() {
            o.push((key, settled.outcome.as_str()));
        }
    }

    fn on_gap_expired(&self, record: &InboxRecord, parked_at: &str) -> Option<Result<(), String>> {
        let key = record
            .header_str("event_key")
            .unwrap_or_default()
            .to_owned();
        let mut calls = self.0.calls.lock().ok()?;
        calls.push((key, parked_at.to_owned()));
        Some(if calls.len() == 1 {
            Err("the refund service is down".into())
        } else {
            Ok(())
        })
    }
}

fn record(topic: &str, offset: i64, key: &str, version: &str) -> InboxRecord {
    InboxRecord {
        topic: topic.to_owned(),
        partition: 0,
        offset,
        key: Some(b"A".to_vec()),
        value: Some(b"{}".to_vec()),
        headers: [
            ("event_key", key),
            ("aggregate_type", "order"),
            ("version", version),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Some(v.as_bytes().to_vec())))
        .collect(),
    }
}

#[tokio::test]
async fn an_expired_gap_goes_to_the_compensation_hook_not_the_dead_letter_topic() -> Result<()> {
    let db = database("inbox_parked").await?;
    let suffix = unique_suffix();
    let topic = format!("inbox-rust-parked-{suffix}");
    let dlq = format!("{topic}.dlq");
    create_topic(&kafka_bootstrap(), &dlq, 1_048_588).await?;
    let mut config = InboxConfig::new("parked", dlq.clone());
    config.version_header = Some("version".into());
    config.gap_deadline = Duration::from_millis(300);
    config.backoff_initial = Duration::from_millis(5);
    config.backoff_max = Duration::from_millis(20);
    let hooks = Arc::new(Compensation::default());
    let inbox = Inbox::new(db.pool().clone(), config, &kafka_bootstrap())?
        .with_hooks(Shared(Arc::clone(&hooks)));

    let v1 = inbox
        .process(&record(&topic, 0, "A-v1", "1"), &Effects)
        .await?;
    ensure!(v1.outcome == Outcome::Processed, "{v1:?}");
    let v3 = inbox
        .process(&record(&topic, 1, "A-v3", "3"), &Effects)
        .await?;
    ensure!(v3.outcome == Outcome::Parked, "{v3:?}");

    // Sweeps until the deadline has passed and the hook was called: it fails, the row stays.
    wait_until(
        "the compensation hook's first call",
        Duration::from_secs(30),
        Duration::from_millis(50),
        async || {
            let sweep = inbox.sweep_parked(&Effects).await?;
            let called = hooks.calls.lock().map(|c| c.len()).unwrap_or(0);
            if called > 0 {
                ensure!(
                    sweep.compensated == 0 && sweep.dead_lettered == 0 && sweep.parked == 1,
                    "a failed compensation left the row: {sweep:?}"
                );
            }
            Ok((called > 0).then_some(()))
        },
    )
    .await?;
    // The next sweep compensates: the row is removed, no dead letter.
    let sweep = inbox.sweep_parked(&Effects).await?;
    ensure!(
        sweep.compensated == 1 && sweep.dead_lettered == 0 && sweep.parked == 0,
        "{sweep:?}"
    );
    let calls = hooks.calls.lock().map(|c| c.clone()).unwrap_or_default();
    ensure!(calls.len() == 2, "{calls:?}");
    ensure!(
        calls
            .iter()
            .all(|(k, at)| k == "A-v3" && at.ends_with('Z') && at.contains('T')),
        "the hook gets the parked record and when it was parked (RFC 3339 UTC): {calls:?}"
    );
    let outcomes = hooks.outcomes.lock().map(|o| o.clone()).unwrap_or_default();
    ensure!(
        outcomes.contains(&("A-v3".to_owned(), "compensated")),
        "after_commit is told: {outcomes:?}"
    );
    let mut conn = db.conn().await?;
    let parked: u64 = conn
        .query_first("SELECT COUNT(*) FROM outbox_inbox_parked")
        .await?
        .unwrap_or(0);
    ensure!(parked == 0, "{parked} parked rows left");
    let effects: Vec<String> = conn
        .query("SELECT event_key FROM effects ORDER BY id")
        .await?;
    ensure!(
        effects == ["A-v1"],
        "no effect for the compensated record: {effects:?}"
    );
    drop(conn);
    ensure!(
        high_watermark_total(&kafka_bootstrap(), std::slice::from_ref(&dlq)).await? == 0,
        "a compensated record was dead-lettered too"
    );
    drop(inbox);
    db.drop_database().await?;
    Ok(())
}
