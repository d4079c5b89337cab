//! `outbox-relay migrate --inbox` and `outbox-relay prune --inbox` against the real server and
//! Kafka: the inbox tables are created idempotently in a consumer's database; prune deletes
//! only the consumer's rows that are older than the retention AND whose records its consumer
//! group has committed past, and nothing with `--dry-run`.

use std::process::Command;

use anyhow::{ensure, Context, Result};
use mysql_async::prelude::Queryable;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use outbox_relay_testkit::{kafka_bootstrap, unique_suffix, TestDb};

const BIN: &str = env!("CARGO_BIN_EXE_outbox-relay");

/// Runs the binary; returns (exit code, stdout, stderr).
fn run(args: &[&str]) -> Result<(i32, String, String)> {
    let out = Command::new(BIN)
        .args(args)
        .output()
        .context("running outbox-relay")?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// Commits `offset` for `group` on `topic`'s partition 0 and 1 (`None`: leaves it uncommitted).
fn commit(group: &str, topic: &str, offsets: &[(i32, i64)]) -> Result<()> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for (p, o) in offsets {
        tpl.add_partition_offset(topic, *p, Offset::Offset(*o))?;
    }
    c.commit(&tpl, CommitMode::Sync)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_inbox_creates_the_tables_once_and_prune_keeps_what_can_be_redelivered(
) -> Result<()> {
    let db = TestDb::create("inbox_ops").await?;
    let url = format!("{}/{}", outbox_relay_testkit::mysql_url(None), db.name());

    // migrate --inbox: created, then up to date; the tables take an inbox row.
    let (code, out, err) = run(&["migrate", "--inbox", "--database-url", &url])?;
    ensure!(code == 0, "migrate --inbox: exit {code}\n{out}\n{err}");
    ensure!(
        out.contains("outbox_inbox: created") && out.contains("outbox_inbox_version: created"),
        "{out}"
    );
    let (code, out, err) = run(&["migrate", "--inbox", "--database-url", &url])?;
    ensure!(
        code == 0,
        "second migrate --inbox: exit {code}\n{out}\n{err}"
    );
    ensure!(
        out.contains("outbox_inbox: up to date")
            && out.contains("outbox_inbox_version: up to date"),
        "{out}"
    );
    // A URL without a database is refused with the fix.
    let (code, _, err) = run(&[
        "migrate",
        "--inbox",
        "--database-url",
        &outbox_relay_testkit::mysql_url(None),
    ])?;
    ensure!(
        code == 2 && err.contains("names no database"),
        "exit {code}: {err}"
    );

    // Inbox rows: consumer "billing" on topic T, partitions 0 and 1, offsets 0..10, half of
    // them processed 3 days ago; the same for consumer "other" (never touched).
    let topic = format!("inbox_ops_{}", unique_suffix());
    let mut conn = db.conn().await?;
    for consumer in ["billing", "other"] {
        for partition in 0..2 {
            for offset in 0..10i64 {
                let age_days = if offset < 8 { 3 } else { 0 };
                conn.exec_drop(
                    "INSERT INTO outbox_inbox (consumer, event_key, topic, kafka_partition, \
                     kafka_offset, processed_at) VALUES (?, ?, ?, ?, ?, NOW(6) - INTERVAL ? DAY)",
                    (
                        consumer,
                        format!("k-{partition}-{offset}"),
                        &topic,
                        partition,
                        offset,
                        age_days,
                    ),
                )
                .await?;
            }
        }
    }
    // Kafka: the group committed offset 5 on partition 0 (records 0..4 are settled), nothing on
    // partition 1.
    let group = format!("billing-{}", unique_suffix());
    outbox_relay_testkit::create_topic(&kafka_bootstrap(), &topic, 1_000_000)
        .await
        .ok();
    {
        // create_topic makes one partition; partition 1 needs a second.
        use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions};
        use rdkafka::client::DefaultClientContext;
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", kafka_bootstrap())
            .create()?;
        for r in admin
            .create_partitions(&[NewPartitions::new(&topic, 2)], &AdminOptions::new())
            .await?
        {
            r.map_err(|(t, e)| anyhow::anyhow!("partitions of {t}: {e}"))?;
        }
    }
    let (g, t) = (group.clone(), topic.clone());
    tokio::task::spawn_blocking(move || commit(&g, &t, &[(0, 5)])).await??;

    let bootstrap = kafka_bootstrap();
    let prune = |extra: &[&str]| -> Result<(i32, String, String)> {
        let mut args = vec![
            "prune",
            "--inbox",
            "--database-url",
            &url,
            "--consumer",
            "billing",
            "--group",
            &group,
            "--bootstrap-servers",
            &bootstrap,
            "--older-than",
            "1d",
            "--batch-size",
            "2",
            "--pause-ms",
            "0",
        ];
        args.extend_from_slice(extra);
        run(&args)
    };
    let count = async |consumer: &str| -> Result<u64> {
        let n: Option<u64> = db
            .conn()
            .await?
            .exec_first(
                "SELECT COUNT(*) FROM outbox_inbox WHERE consumer = ?",
                (consumer,),
            )
            .await?;
        Ok(n.unwrap_or(0))
    };

    let (code, out, err) = prune(&["--dry-run"])?;
    ensure!(
        code == 0,
        "prune --inbox --dry-run: exit {code}\n{out}\n{err}"
    );
    ensure!(out.contains("would delete 5 inbox rows"), "{out}");
    ensure!(count("billing").await? == 20, "the dry run deleted rows");

    let (code, out, err) = prune(&[])?;
    ensure!(code == 0, "prune --inbox: exit {code}\n{out}\n{err}");
    ensure!(
        out.contains(&format!(
            "{topic}[1]: group {group} has no committed offset"
        )),
        "{out}"
    );
    ensure!(out.contains("deleted 5 inbox rows"), "{out}");
    // Left: partition 0 offsets 5..9 (5..7 old but not committed past, 8..9 recent), all of
    // partition 1 (no committed offset), and every row of the other consumer.
    let left: Vec<(i32, i64)> = conn
        .exec(
            "SELECT kafka_partition, kafka_offset FROM outbox_inbox WHERE consumer = 'billing' \
             ORDER BY kafka_partition, kafka_offset",
            (),
        )
        .await?;
    let want: Vec<(i32, i64)> = (5..10)
        .map(|o| (0, o))
        .chain((0..10).map(|o| (1, o)))
        .collect();
    ensure!(left == want, "left {left:?}");
    ensure!(
        count("other").await? == 20,
        "another consumer's rows were deleted"
    );

    // Once the group commits further, the old rows before it go; recent ones stay.
    let (g, t) = (group.clone(), topic.clone());
    tokio::task::spawn_blocking(move || commit(&g, &t, &[(0, 10), (1, 10)])).await??;
    let (code, out, err) = prune(&[])?;
    ensure!(code == 0, "second prune: exit {code}\n{out}\n{err}");
    ensure!(out.contains("deleted 11 inbox rows"), "{out}");
    ensure!(count("billing").await? == 4, "recent rows must stay");
    drop(conn);
    db.drop_database().await
}
