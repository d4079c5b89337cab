//! The polling relay users would write instead (the shape of the common outbox libraries):
//! every 100 ms `SELECT … WHERE status = 'NEW' ORDER BY id LIMIT n FOR UPDATE SKIP LOCKED`,
//! produce the rows (same producer settings as the relay), wait for the acknowledgements,
//! `UPDATE … SET status = 'SENT'`, commit. A full batch is followed by the next poll at once.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use mysql_async::prelude::*;
use mysql_async::{Pool, TxOpts};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

use crate::kafka::producer_config;

/// The columns and index a polling relay needs on the outbox table.
pub const SCHEMA: &str = "ALTER TABLE outbox ADD COLUMN status ENUM('NEW','SENT') NOT NULL DEFAULT 'NEW', ADD INDEX ix_outbox_status_id (status, id)";

/// Rows per poll.
pub const BATCH: usize = 1000;
/// Sleep after a poll that found less than a full batch.
pub const INTERVAL: Duration = Duration::from_millis(100);

/// Counters of the polling relay's work (shared while it runs).
#[derive(Debug, Default)]
pub struct Counters {
    /// Statements sent to the database (SELECT … FOR UPDATE, UPDATE; BEGIN/COMMIT not counted).
    pub queries: AtomicU64,
    /// Rows set to SENT.
    pub rows_updated: AtomicU64,
    /// Records acknowledged by Kafka.
    pub produced: AtomicU64,
}

type Row = (u64, String, String, String, String, Option<Vec<u8>>);

/// Runs the polling relay on `pool`'s `outbox` table until `stop` is set, producing each row to
/// `<topic_prefix><aggregate_type>`.
///
/// # Errors
/// The database or Kafka fails.
pub async fn run(
    pool: Pool,
    bootstrap: String,
    topic_prefix: String,
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
) -> Result<()> {
    let producer: FutureProducer = producer_config(&bootstrap)
        .create()
        .context("creating the polling relay's producer")?;
    let mut conn = pool.get_conn().await.context("polling relay connection")?;
    let select = format!(
        "SELECT id, aggregate_type, aggregate_id, event_type, event_key, payload FROM outbox \
         WHERE status = 'NEW' ORDER BY id LIMIT {BATCH} FOR UPDATE SKIP LOCKED"
    );
    while !stop.load(Ordering::Relaxed) {
        let mut tx = conn.start_transaction(TxOpts::default()).await?;
        let rows: Vec<Row> = tx.query(&select).await.context("polling SELECT")?;
        counters.queries.fetch_add(1, Ordering::Relaxed);
        if rows.is_empty() {
            tx.commit().await?;
            tokio::time::sleep(INTERVAL).await;
            continue;
        }
        let topics: Vec<String> = rows
            .iter()
            .map(|r| format!("{topic_prefix}{}", r.1))
            .collect();
        let ids: Vec<String> = rows.iter().map(|r| r.0.to_string()).collect();
        let sends = rows.iter().zip(&topics).zip(&ids).map(|((r, topic), id)| {
            let headers = OwnedHeaders::new_with_capacity(4)
                .insert(Header {
                    key: "id",
                    value: Some(id.as_bytes()),
                })
                .insert(Header {
                    key: "event_key",
                    value: Some(r.4.as_bytes()),
                })
                .insert(Header {
                    key: "event_type",
                    value: Some(r.3.as_bytes()),
                })
                .insert(Header {
                    key: "aggregate_type",
                    value: Some(r.1.as_bytes()),
                });
            let mut rec: FutureRecord<'_, [u8], [u8]> =
                FutureRecord::to(topic).key(r.2.as_bytes()).headers(headers);
            if let Some(p) = &r.5 {
                rec = rec.payload(p.as_slice());
            }
            producer.send(rec, Duration::from_secs(60))
        });
        for res in futures::future::join_all(sends).await {
            res.map_err(|(e, _)| anyhow::anyhow!("polling relay produce: {e}"))?;
        }
        counters
            .produced
            .fetch_add(rows.len() as u64, Ordering::Relaxed);
        let update = format!(
            "UPDATE outbox SET status = 'SENT' WHERE id IN ({})",
            ids.join(",")
        );
        tx.query_drop(update).await.context("polling UPDATE")?;
        counters.queries.fetch_add(1, Ordering::Relaxed);
        counters
            .rows_updated
            .fetch_add(rows.len() as u64, Ordering::Relaxed);
        tx.commit().await?;
        if rows.len() < BATCH {
            tokio::time::sleep(INTERVAL).await;
        }
    }
    Ok(())
}
