//! `outbox-relay migrate --inbox` and `outbox-relay prune --inbox` against the real server and
//! Kafka: the inbox tables are created idempotently in a consumer's database; prune deletes
//! only the consumer's rows that are older than the retention AND whose records its consumer
//! group has committed past, and nothing with `--dry-run`. Inbox tables of the layout before
//! migrations/0005_inbox_keys.sql (text keys in the default collation) are reported by `check
//! --inbox-url` and upgraded by `migrate --inbox`, after which keys that differ only in case,
//! accent or trailing spaces are distinct. `migrate --inbox` also creates the parked table
//! (migrations/0006_inbox_parked.sql), and `check --inbox-url` warns while it is missing.

use std::process::Command;

use anyhow::{ensure, Context, Result};
use mysql_async::prelude::Queryable;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use outbox_relay_testkit::{
    describe_exit, kafka_bootstrap, unique_suffix, RelayProcess, TestDb, World,
};

/// The relay binary under test (built on first use).
fn bin() -> &'static str {
    outbox_relay_testkit::relay_bin()
}

/// Runs the binary; returns (exit code, stdout, stderr).
fn run(args: &[&str]) -> Result<(i32, String, String)> {
    let out = Command::new(bin())
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
        out.contains("outbox_inbox: created")
            && out.contains("outbox_inbox_version: created")
            && out.contains("outbox_inbox_parked: created"),
        "{out}"
    );
    let (code, out, err) = run(&["migrate", "--inbox", "--database-url", &url])?;
    ensure!(
        code == 0,
        "second migrate --inbox: exit {code}\n{out}\n{err}"
    );
    ensure!(
        out.contains("outbox_inbox: up to date")
            && out.contains("outbox_inbox_version: up to date")
            && out.contains("outbox_inbox_parked: up to date"),
        "{out}"
    );
    // The parked table takes a parked record; a redelivered one is ignored by its primary key.
    {
        let mut conn = db.conn().await?;
        for _ in 0..2 {
            conn.query_drop(
                "INSERT IGNORE INTO outbox_inbox_parked (consumer, aggregate_type, aggregate_id, \
                 version, event_key, topic, kafka_partition, kafka_offset, record_key, \
                 record_value, record_headers, reason, expires_at) VALUES ('billing', 'order', \
                 'A', 3, 'A-v3', 'orders', 0, 7, 'A', '{}', '[[\"version\",\"Mw==\"]]', \
                 'version gap: expected 2, got 3', NOW(6) + INTERVAL 1 HOUR)",
            )
            .await?;
        }
        let parked: Option<u64> = conn
            .query_first("SELECT COUNT(*) FROM outbox_inbox_parked")
            .await?;
        ensure!(parked == Some(1), "{parked:?}");
    }
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
    // The topic's own retention (5 days: its rows are 3 days old) keeps them all.
    let own = format!("{topic}=5d");
    let (code, out, err) = prune(&["--dry-run", "--topic-retention", &own])?;
    ensure!(code == 0, "--topic-retention: exit {code}\n{out}\n{err}");
    ensure!(
        out.contains("would delete 0 inbox rows") && out.contains("over 432000 s ago"),
        "{out}"
    );
    let (code, _, err) = prune(&["--dry-run", "--topic-retention", "5d"])?;
    ensure!(
        code == 2 && err.contains("is not TOPIC=AGE"),
        "exit {code}: {err}"
    );

    // Without --yes: the plan, exit 4, nothing deleted.
    let (code, out, err) = prune(&[])?;
    ensure!(
        code == 4,
        "prune --inbox without --yes: exit {code}\n{out}\n{err}"
    );
    ensure!(
        out.contains("would delete 5 inbox rows")
            && out.contains("not confirmed: nothing changed; run again with --yes"),
        "{out}"
    );
    ensure!(count("billing").await? == 20, "the plan deleted rows");

    let (code, out, err) = prune(&["--yes"])?;
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
    let (code, out, err) = prune(&["--yes"])?;
    ensure!(code == 0, "second prune: exit {code}\n{out}\n{err}");
    ensure!(out.contains("deleted 11 inbox rows"), "{out}");
    ensure!(count("billing").await? == 4, "recent rows must stay");
    drop(conn);
    db.drop_database().await
}

/// The inbox tables as migrations/0004_inbox.sql created them before keys were compared byte
/// for byte: text key columns in the database's default collation.
const OLD_INBOX_SQL: &str = "\
CREATE TABLE outbox_inbox (consumer VARCHAR(191) NOT NULL, event_key VARCHAR(255) NOT NULL, \
  topic VARCHAR(249) NOT NULL, kafka_partition INT NOT NULL, kafka_offset BIGINT NOT NULL, \
  processed_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), \
  PRIMARY KEY (consumer, event_key), KEY ix_outbox_inbox_processed (consumer, processed_at)) \
  ENGINE = InnoDB DEFAULT CHARSET = utf8mb4; \
CREATE TABLE outbox_inbox_version (consumer VARCHAR(191) NOT NULL, \
  aggregate_type VARCHAR(191) NOT NULL, aggregate_id VARCHAR(191) NOT NULL, \
  version BIGINT NOT NULL, updated_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) \
  ON UPDATE CURRENT_TIMESTAMP(6), PRIMARY KEY (consumer, aggregate_type, aggregate_id)) \
  ENGINE = InnoDB DEFAULT CHARSET = utf8mb4";

/// Event keys that differ from the first three only in case, accent or trailing spaces.
const KEYS: [&str; 3] = ["evt-a1B", "café", "k"];
const TWINS: [&str; 3] = ["evt-A1b", "cafe", "k "];

/// `check --inbox-url URL --config …` to its end: (exit code, stdout, stderr).
async fn check_with_inbox(w: &World, url: &str) -> Result<(i32, String, String)> {
    let p = RelayProcess::spawn_args(
        bin(),
        &["check", "--inbox-url", url, "--config"],
        &w.spec.to_toml(),
        &[],
    )?;
    let status = p.wait_exit(std::time::Duration::from_secs(90)).await?;
    let (out, err) = (p.stdout_text(), p.stderr_text());
    let code = status
        .code()
        .with_context(|| format!("check: {}\n{out}\n{err}", describe_exit(&status)))?;
    Ok((code, out, err))
}

/// Inserts an inbox row; `Ok(false)` when the primary key already has it (error 1062).
async fn insert_inbox(conn: &mut mysql_async::Conn, key: &str, offset: i64) -> Result<bool> {
    let r = conn
        .exec_drop(
            "INSERT INTO outbox_inbox (consumer, event_key, topic, kafka_partition, kafka_offset) \
             VALUES ('billing', ?, 'orders', 0, ?)",
            (key, offset),
        )
        .await;
    match r {
        Ok(()) => Ok(true),
        Err(mysql_async::Error::Server(e)) if e.code == 1062 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_inbox_makes_old_tables_compare_keys_byte_for_byte_and_check_warns_until_then(
) -> Result<()> {
    let w = World::new(bin(), "inbox_keys").await?;
    let db = w.db.name().to_owned();
    let url = format!("{}/{}", outbox_relay_testkit::mysql_url(None), db);
    let mut conn = w.db.conn().await?;
    conn.query_drop(OLD_INBOX_SQL).await?;
    // The outbox as the older migrations/0001_outbox.sql created it (the database's default,
    // case-insensitive collation).
    conn.query_drop(
        "ALTER TABLE outbox MODIFY event_key VARCHAR(255) CHARACTER SET utf8mb4 \
         COLLATE utf8mb4_general_ci NOT NULL",
    )
    .await?;
    for (i, k) in KEYS.iter().enumerate() {
        ensure!(insert_inbox(&mut conn, k, i as i64).await?, "{k:?}");
    }
    conn.query_drop(
        "INSERT INTO outbox_inbox_version (consumer, aggregate_type, aggregate_id, version) \
         VALUES ('billing', 'Order', 'A1', 7)",
    )
    .await?;

    // check: a warning for each inbox table (the parked table: missing) and for the outbox's
    // unique event key, each naming its fix; warnings only (exit 0).
    let (code, out, err) = check_with_inbox(&w, &url).await?;
    ensure!(code == 0, "check: exit {code}\n{out}\n{err}");
    for needle in [
        format!("WARN  inbox table {db}.outbox_inbox (key comparison): expected keys compared byte for byte"),
        format!("WARN  inbox table {db}.outbox_inbox_version (key comparison)"),
        format!("WARN  inbox table {db}.outbox_inbox_parked: expected the table (migrations/0006_inbox_parked.sql), found no such table"),
        "event_key varchar(255) in collation".to_owned(),
        "case- and accent-insensitive".to_owned(),
        format!("fix: outbox-relay migrate --inbox --database-url mysql://…/{db}"),
        format!("WARN  {db}.outbox.event_key (unique event key)"),
        format!("fix: if the application's event keys may differ only in case, accent or trailing spaces: ALTER TABLE `{db}`.`outbox` MODIFY `event_key`"),
        "NOT NULL, or `outbox-relay migrate --outbox` (migrations/0007_outbox_event_key.sql) for a table of the common shape; it copies the table".to_owned(),
    ] {
        ensure!(out.contains(&needle), "{needle:?} not in:\n{out}");
    }

    // migrate --inbox upgrades both tables and says so.
    let (code, out, err) = run(&["migrate", "--inbox", "--database-url", &url])?;
    ensure!(code == 0, "migrate --inbox: exit {code}\n{out}\n{err}");
    for t in ["outbox_inbox", "outbox_inbox_version"] {
        ensure!(
            out.contains(&format!(
                "{db}.{t}: upgraded: keys now compared byte for byte"
            )),
            "{t} not upgraded:\n{out}"
        );
    }
    ensure!(
        out.contains(&format!("{db}.outbox_inbox_parked: created")),
        "parked table not created:\n{out}"
    );
    ensure!(!out.contains("WARN"), "{out}");

    // Every existing row is kept; keys that differ only in case, accent or trailing spaces are
    // new events now, and the same key is still a duplicate.
    for (i, k) in TWINS.iter().enumerate() {
        ensure!(
            insert_inbox(&mut conn, k, 10 + i as i64).await?,
            "{k:?} still merged with {:?}",
            KEYS[i]
        );
    }
    for k in KEYS.iter().chain(TWINS.iter()) {
        ensure!(!insert_inbox(&mut conn, k, 99).await?, "{k:?} stored twice");
    }
    let keys: Vec<Vec<u8>> = conn
        .query("SELECT event_key FROM outbox_inbox ORDER BY kafka_offset")
        .await?;
    let want: Vec<Vec<u8>> = KEYS
        .iter()
        .chain(TWINS.iter())
        .map(|k| k.as_bytes().to_vec())
        .collect();
    ensure!(keys == want, "{keys:?}");
    conn.query_drop(
        "INSERT INTO outbox_inbox_version (consumer, aggregate_type, aggregate_id, version) \
         VALUES ('billing', 'order', 'a1', 1), ('billing', 'Order', 'A1 ', 1), \
         ('billing', 'Order', 'Á1', 1)",
    )
    .await?;
    let versions: Option<u64> = conn
        .query_first("SELECT COUNT(*) FROM outbox_inbox_version")
        .await?;
    ensure!(versions == Some(4), "{versions:?}");

    // Again: up to date; check finds nothing to warn about in the inbox.
    let (code, out, err) = run(&["migrate", "--inbox", "--database-url", &url])?;
    ensure!(code == 0, "migrate --inbox: exit {code}\n{out}\n{err}");
    ensure!(
        out.contains(&format!("{db}.outbox_inbox: up to date"))
            && out.contains(&format!("{db}.outbox_inbox_version: up to date"))
            && out.contains(&format!("{db}.outbox_inbox_parked: up to date")),
        "{out}"
    );
    let (code, out, err) = check_with_inbox(&w, &url).await?;
    ensure!(code == 0, "check: exit {code}\n{out}\n{err}");
    ensure!(!out.contains("WARN  inbox table"), "{out}");
    for t in [
        "outbox_inbox",
        "outbox_inbox_version",
        "outbox_inbox_parked",
    ] {
        let line = format!("OK    inbox table {db}.{t} (key comparison): byte for byte");
        ensure!(out.contains(&line), "{line:?} not in:\n{out}");
    }
    drop(conn);
    w.db.drop_database().await?;
    Ok(())
}

/// `migrate --inbox` as a consumer's user without DDL privileges (issue 31): the refused
/// statement, CREATE and ALTER on the database, the account and the two fixes (another
/// `--database-url`, or the GRANT line), never "check the user and password"; that GRANT makes
/// the next run create the tables.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_inbox_names_the_privilege_a_consumer_user_lacks() -> Result<()> {
    let db = TestDb::create("inbox_grant").await?;
    let name = db.name().to_owned();
    let user = format!("ig{}", unique_suffix().replace('_', ""));
    let user = &user[..user.len().min(30)];
    let mut admin = db.conn().await?;
    for sql in [
        format!("CREATE USER '{user}'@'%' IDENTIFIED BY 'inbox-pw'"),
        format!("GRANT SELECT, INSERT, DELETE ON `{name}`.* TO '{user}'@'%'"),
    ] {
        admin.query_drop(&sql).await.with_context(|| sql.clone())?;
    }
    let url = outbox_relay_testkit::mysql_url(Some(&name)).replacen(
        "root@",
        &format!("{user}:inbox-pw@"),
        1,
    );
    let (code, out, err) = run(&["migrate", "--inbox", "--database-url", &url])?;
    ensure!(code == 3, "exit {code}\n{out}\n{err}");
    let grant = format!("GRANT CREATE, ALTER ON `{name}`.* TO '{user}'@'%'");
    for needle in [
        format!("privileges of '{user}'@'%' for `outbox-relay migrate --inbox --database-url "),
        format!("expected CREATE, ALTER on `{name}`.* to create and upgrade the inbox tables"),
        "the server refused the statement CREATE TABLE IF NOT EXISTS outbox_inbox (…)".to_owned(),
        "give --database-url the URL of a user that may create and alter tables".to_owned(),
        format!("or, as an administrator: {grant}"),
    ] {
        ensure!(err.contains(&needle), "{needle:?} not in:\n{err}");
    }
    ensure!(
        !err.contains("check the user and password") && !err.contains("inbox-pw"),
        "{err}"
    );
    admin.query_drop(&grant).await?;
    let (code, out, err) = run(&["migrate", "--inbox", "--database-url", &url])?;
    ensure!(
        code == 0 && out.contains("outbox_inbox: created"),
        "after the GRANT: exit {code}\n{out}\n{err}"
    );
    admin.query_drop(format!("DROP USER '{user}'@'%'")).await?;
    drop(admin);
    db.drop_database().await
}
