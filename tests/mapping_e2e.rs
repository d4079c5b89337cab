//! End-to-end tests of the column mapping against the real MariaDB and Kafka: the column types
//! users' outboxes have (BIGINT UNSIGNED, BINARY(16) UUIDs, latin1/utf8mb3/utf8mb4 text, ENUM,
//! DATETIME in a configured zone), per-table mapping options (fixed header names, additional
//! header and envelope columns, partition column, NULL payloads), tables with invisible and
//! generated columns (and MySQL's generated invisible primary key), and rows that cannot be
//! relayed (statement-logged INSERTs, UPDATEs) going to the dead-letter
//! topic while the stream continues.
//!
//! Expected values are written from the SQL below and MySQL's documented semantics.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use mysql_async::prelude::*;
use outbox_relay_testkit::{
    collect_records, create_topic, describe_record, kafka_bootstrap, read_all_records, Record,
    RelayProcess, World,
};

/// The relay binary under test (built on first use).
fn bin() -> &'static str {
    outbox_relay_testkit::relay_bin()
}
const WAIT: Duration = Duration::from_secs(90);

fn header<'r>(r: &'r Record, name: &str) -> Option<&'r [u8]> {
    r.headers
        .iter()
        .find(|(n, _)| n == name)
        .and_then(|(_, v)| v.as_deref())
}

/// Makes `table` the relay's only outbox table, routed to `<prefix><family>.<aggregate_type>`,
/// with the rest of its `[[outbox.table]]` entry in `entry` (TOML lines).
fn only_table(world: &mut World, table: &str, family: &str, entry: &str) -> String {
    let (db, prefix) = (world.db.name().to_owned(), world.topic_prefix());
    world.spec.tables = Vec::new();
    world.spec.outbox_extra = format!(
        "[[outbox.table]]\nname = \"{db}.{table}\"\ntopic = \"{prefix}{family}.{{aggregate_type}}\"\n{entry}"
    );
    format!("{prefix}{family}.")
}

/// The fields of `records` named in `fields` (`key`, `value` or a header name), one row per
/// record, sorted (records of different keys have no order between them).
fn fields_of(records: &[Record], fields: &[&str]) -> Vec<Vec<Option<String>>> {
    let mut rows: Vec<Vec<Option<String>>> = records
        .iter()
        .map(|r| {
            fields
                .iter()
                .map(|f| match *f {
                    "key" => r.key_str(),
                    "value" => r.value_str(),
                    header => r.header(header),
                })
                .map(|v| v.map(str::to_owned))
                .collect()
        })
        .collect();
    rows.sort();
    rows
}

/// `rows` as [`fields_of`] gives them, every field present.
fn present(rows: &[&[&str]]) -> Vec<Vec<Option<String>>> {
    rows.iter()
        .map(|r| r.iter().map(|v| Some((*v).to_owned())).collect())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn column_types_and_mapping_options_reach_kafka_exactly() -> Result<()> {
    let mut world = World::new(bin(), "mapping_types").await?;
    let mut conn = world.db.conn().await?;
    conn.query_drop(
        "CREATE TABLE typed_outbox (
           seq     BIGINT UNSIGNED NOT NULL PRIMARY KEY,
           uuid    BINARY(16) NOT NULL,
           agg_type VARCHAR(64) CHARACTER SET utf8mb4 NOT NULL,
           agg_id  VARCHAR(64) CHARACTER SET latin1 NOT NULL,
           kind    ENUM('Created','Paid') NOT NULL,
           ekey    VARCHAR(64) CHARACTER SET utf8mb4 NOT NULL,
           note    VARCHAR(20) CHARACTER SET utf8mb3 NULL,
           body    LONGBLOB NULL,
           tenant  INT NULL,
           version SMALLINT UNSIGNED NULL,
           part    INT NULL,
           made    DATETIME(3) NOT NULL
         ) ENGINE=InnoDB",
    )
    .await?;
    let prefix = only_table(
        &mut world,
        "typed_outbox",
        "typed",
        r#"columns = { id = "seq", aggregate_type = "agg_type", aggregate_id = "agg_id", event_type = "kind", event_key = "ekey", payload = "body", created_at = "made", partition = "part" }
headers = { event_key = "idempotency-key" }
additional = [
  { column = "uuid", placement = "header", alias = "event_uuid" },
  { column = "note", placement = "header" },
  { column = "tenant", placement = "envelope" },
  { column = "version", placement = "envelope", alias = "v" },
]
datetime_time_zone = "Europe/Berlin"
"#,
    );
    let (relay, _) = world.start(WAIT).await?;
    conn.query_drop(
        "INSERT INTO typed_outbox VALUES
           (18446744073709551615, UNHEX('3F2504E04F8911D39A0C0305E82C3300'), 'Order', 'café',
            'Paid', 'k-😀', 'ünïcode', '{\"a\": 1}', 7, 65535, NULL, '2026-01-02 03:04:05.678'),
           (9223372036854775808, UNHEX('000102030405060708090A0B0C0D0E0F'), 'Order', 'café',
            'Created', 'k-2', NULL, NULL, NULL, 1, 0, '2026-07-01 12:00:00')",
    )
    .await?;
    drop(conn); // DROP DATABASE at the end waits for open connections to the tables
    let topic = format!("{prefix}Order");
    let records =
        collect_records(&kafka_bootstrap(), std::slice::from_ref(&topic), 2, WAIT).await?;
    relay.stop(WAIT).await?;
    ensure!(
        records.len() == 2,
        "expected 2 records, got {}: {:?}",
        records.len(),
        records.iter().map(describe_record).collect::<Vec<_>>()
    );
    let (first, second) = (&records[0], &records[1]);
    // Key: the latin1 aggregate id as UTF-8 text.
    ensure!(
        first.key.as_deref() == Some("café".as_bytes()),
        "key {:?}",
        first.key
    );
    ensure!(second.key.as_deref() == Some("café".as_bytes()));
    let expect = |r: &Record, name: &str, want: Option<&str>| -> Result<()> {
        let got = header(r, name);
        ensure!(
            got == want.map(str::as_bytes),
            "header {name}: want {want:?}, got {:?}",
            got.map(String::from_utf8_lossy)
        );
        Ok(())
    };
    expect(first, "id", Some("18446744073709551615"))?;
    expect(first, "idempotency-key", Some("k-😀"))?;
    expect(first, "event_key", None)?;
    expect(first, "event_type", Some("Paid"))?;
    expect(first, "aggregate_type", Some("Order"))?;
    // BINARY(16) ending in 0x00 bytes: the binlog drops them; the UUID keeps all 16 bytes.
    expect(
        first,
        "event_uuid",
        Some("3f2504e0-4f89-11d3-9a0c-0305e82c3300"),
    )?;
    expect(first, "note", Some("ünïcode"))?;
    ensure!(
        first.value_str() == Some(r#"{"payload":{"a": 1},"tenant":7,"v":65535}"#),
        "envelope {:?}",
        first.value_str()
    );
    // 2026-01-02 03:04:05.678 in Berlin (UTC+1) is 02:04:05.678 UTC.
    ensure!(
        first.timestamp_ms == Some(1_767_319_445_678),
        "{:?}",
        first.timestamp_ms
    );
    expect(second, "id", Some("9223372036854775808"))?;
    expect(second, "event_type", Some("Created"))?;
    expect(
        second,
        "event_uuid",
        Some("00010203-0405-0607-0809-0a0b0c0d0e0f"),
    )?;
    expect(second, "note", None)?;
    // A NULL payload is a tombstone (null value), envelope or not.
    ensure!(
        second.value.is_none(),
        "tombstone: {:?}",
        second.value_str()
    );
    ensure!(second.partition == 0, "partition column 0");
    // 2026-07-01 12:00 in Berlin (UTC+2) is 10:00 UTC.
    ensure!(
        second.timestamp_ms == Some(1_782_900_000_000),
        "{:?}",
        second.timestamp_ms
    );
    world.db.drop_database().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_that_cannot_be_relayed_are_dead_lettered_and_the_stream_continues() -> Result<()> {
    let mut world = World::new(bin(), "mapping_dlq").await?;
    let dlq = format!("{}dead", world.topic_prefix());
    world.spec.dead_letter_topic = Some(dlq.clone());
    let db = world.db.name().to_owned();
    let mut conn = world.db.conn().await?;
    conn.query_drop("CREATE TABLE outbox2 LIKE outbox").await?;
    world.spec.outbox_extra = format!(
        "null_payload = \"skip\"\non_update = \"fail\"\n\
         [[outbox.table]]\nname = \"{db}.outbox2\"\nnull_payload = \"dead_letter\"\n"
    );
    let (relay, _) = world.start(WAIT).await?;
    let insert = |key: &str, payload: &str| {
        format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, event_key, payload) \
             VALUES ('Order', 'o-1', 'E', '{key}', {payload})"
        )
    };
    conn.query_drop(insert("a", "'{\"n\": 1}'")).await?;
    conn.query_drop(insert("null-payload", "NULL")).await?;
    // MariaDB logs every column of an INSERT even with MINIMAL (MySQL leaves out the columns
    // the statement did not set: that path is tested on a MySQL binlog fixture in decode.rs).
    conn.query_drop("SET SESSION binlog_row_image = MINIMAL")
        .await?;
    conn.query_drop(insert("minimal", "'{}'")).await?;
    conn.query_drop("SET SESSION binlog_row_image = FULL")
        .await?;
    // An INSERT logged as a statement: its rows are not in the binlog.
    let statement = insert("statement", "'{}'");
    conn.query_drop("SET SESSION binlog_format = STATEMENT")
        .await?;
    conn.query_drop(&statement).await?;
    conn.query_drop("SET SESSION binlog_format = ROW").await?;
    conn.query_drop("UPDATE outbox SET event_type = 'X' WHERE event_key = 'a'")
        .await?;
    conn.query_drop(insert("f", "'{\"n\": 2}'")).await?;
    conn.query_drop(insert("null-in-outbox2", "NULL").replace("INTO outbox ", "INTO outbox2 "))
        .await?;
    drop(conn);

    let main = world.topic("Order");
    let records = collect_records(&kafka_bootstrap(), std::slice::from_ref(&main), 3, WAIT).await?;
    let dead = collect_records(&kafka_bootstrap(), std::slice::from_ref(&dlq), 3, WAIT).await?;
    relay.stop(WAIT).await?;
    let records = read_all_records(&kafka_bootstrap(), &[main], WAIT)
        .await
        .unwrap_or(records);
    let keys: Vec<_> = records.iter().map(|r| r.header("event_key")).collect();
    ensure!(
        keys == [Some("a"), Some("minimal"), Some("f")],
        "relayed {keys:?}: the NULL payload is skipped, the failures are dead-lettered"
    );
    ensure!(
        records[1]
            .timestamp_ms
            .is_some_and(|t| t > 1_700_000_000_000),
        "the MINIMAL-image row has its created_at"
    );
    // Dead letters are spread over partitions (the statement's has no key): find them by reason.
    ensure!(
        dead.len() == 3,
        "dead letters: {:?}",
        dead.iter().map(describe_record).collect::<Vec<_>>()
    );
    let find = |needle: &str| {
        dead.iter()
            .find(|d| d.header("dlq_reason").is_some_and(|r| r.contains(needle)))
            .with_context(|| format!("no dead letter saying {needle:?}"))
    };
    let statement_dl = find("logged as a statement")?;
    ensure!(
        statement_dl.value_str() == Some(statement.as_str()),
        "the statement is the dead letter's value: {:?}",
        statement_dl.value_str()
    );
    let update_dl = find("UPDATE of an outbox row")?;
    // outbox2 maps NULL payloads to dead letters; the key and headers stay readable.
    let null_dl = find("payload is NULL")?;
    ensure!(
        null_dl.key_str() == Some("o-1") && null_dl.header("event_key") == Some("null-in-outbox2"),
        "{}",
        describe_record(null_dl)
    );
    for (d, table) in [
        (statement_dl, world.db.outbox_table()),
        (update_dl, world.db.outbox_table()),
        (null_dl, format!("{db}.outbox2")),
    ] {
        ensure!(
            d.header("dlq_table") == Some(table.as_str())
                && d.header("dlq_binlog_file").is_some_and(|f| !f.is_empty())
                && d.header("dlq_binlog_pos").is_some(),
            "where: {}",
            describe_record(d)
        );
    }
    world.db.drop_database().await.context("drop")?;
    Ok(())
}

/// A row whose partition column names a partition its topic does not have (issue 31): its
/// dead letter keeps the value (only a size refusal drops it), so `dlq replay` lists it as one
/// to replay once the topic has the partition, not as "value dropped".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_the_topic_lacks_is_dead_lettered_with_its_value() -> Result<()> {
    let mut world = World::new(bin(), "mapping_part").await?;
    let dlq = format!("{}dead", world.topic_prefix());
    world.spec.dead_letter_topic = Some(dlq.clone());
    let mut conn = world.db.conn().await?;
    conn.query_drop("ALTER TABLE outbox ADD COLUMN part INT NULL")
        .await?;
    let prefix = only_table(
        &mut world,
        "outbox",
        "part",
        "columns = { partition = \"part\" }\n",
    );
    let topic = format!("{prefix}Order");
    create_topic(&kafka_bootstrap(), &topic, 1_048_588).await?; // one partition: 0
    let (relay, _) = world.start(WAIT).await?;
    conn.query_drop(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, event_key, payload, part) \
         VALUES ('Order', 'o-1', 'E', 'p5', '{\"n\": 5}', 5), \
                ('Order', 'o-1', 'E', 'p0', '{\"n\": 0}', 0)",
    )
    .await?;
    drop(conn);
    let records =
        collect_records(&kafka_bootstrap(), std::slice::from_ref(&topic), 1, WAIT).await?;
    let dead = collect_records(&kafka_bootstrap(), std::slice::from_ref(&dlq), 1, WAIT).await?;
    relay.stop(WAIT).await?;
    ensure!(
        records.len() == 1 && records[0].header("event_key") == Some("p0"),
        "{:?}",
        records.iter().map(describe_record).collect::<Vec<_>>()
    );
    let d = dead.first().context("no dead letter")?;
    ensure!(
        d.header("event_key") == Some("p5")
            && d.header("dlq_reason")
                .is_some_and(|r| r.contains("names a partition topic"))
            && d.value_str() == Some(r#"{"n": 5}"#)
            && d.header("dlq_value_dropped").is_none(),
        "the dead letter keeps its value: {}",
        describe_record(d)
    );
    let p = RelayProcess::spawn_args(
        bin(),
        &["dlq", "replay", "--dry-run", "--config"],
        &world.spec.to_toml(),
        &[],
    )?;
    let status = p.wait_exit(WAIT).await?;
    let out = p.stdout_text();
    eprintln!("--- dlq replay --dry-run ---\n{out}{}", p.stderr_text());
    ensure!(
        status.code() == Some(0)
            && out.contains(&format!("-> {topic} event_key=p5"))
            && !out.contains("SKIP"),
        "exit {:?}:\n{out}\n{}",
        status.code(),
        p.stderr_text()
    );
    world.db.drop_database().await.context("drop")?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_column_missing_from_the_table_stops_at_start_up() -> Result<()> {
    let mut world = World::new(bin(), "mapping_missing").await?;
    world.spec.outbox_extra = "additional = [{ column = \"tenant_id\", placement = \"header\" }]\n\
                               [outbox.columns]\npartition = \"shard\"\n"
        .into();
    let relay = world.spawn()?;
    let status = relay.wait_exit(WAIT).await?;
    let stderr = relay.stderr_text();
    ensure!(
        status.code() == Some(3)
            && stderr.contains("\"tenant_id\" (outbox.additional)")
            && stderr.contains("\"shard\" (outbox.columns.partition)"),
        "expected exit code 3 naming both columns, got {status:?}\n{stderr}"
    );
    world.db.drop_database().await?;
    Ok(())
}

/// Many topics created by the relay's first records to them, while rows for them arrive in
/// multi-statement transactions: every row reaches its topic exactly once. (An idempotent
/// producer sending to a partition of a topic still being created could lose its first batch
/// while reporting it delivered; the relay waits for the partitions' leaders first.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_for_many_new_topics_all_arrive() -> Result<()> {
    use outbox_relay_testkit::{
        ensure_exactly_once, insert_outbox_rows, recent_created_at_base, InsertStyle, OutboxRow,
    };
    use std::collections::HashSet;

    let world = World::new(bin(), "mapping_topics").await?;
    let (relay, _) = world.start(WAIT).await?;
    let mut conn = world.db.conn().await?;
    let base = recent_created_at_base();
    let types: Vec<String> = (0..30).map(|i| format!("Agg{i:02}")).collect();
    let mut rows = Vec::new();
    for round in 0..4 {
        for (i, t) in types.iter().enumerate() {
            let n = round * types.len() + i;
            rows.push(OutboxRow {
                aggregate_type: t.clone(),
                aggregate_id: format!("{t}-{}", n % 7),
                event_type: "Created".into(),
                event_key: format!("{}-t{n:04}", world.uid),
                payload: format!("{{\"n\":{n}}}"),
                created_at_micros: base + i64::try_from(n)? * 1_000,
            });
        }
    }
    // Transactions of 3 single-row statements, so new topics start mid-transaction.
    for chunk in rows.chunks(3) {
        let mut tx = conn
            .start_transaction(mysql_async::TxOpts::default())
            .await?;
        insert_outbox_rows(&mut tx, "outbox", chunk, InsertStyle::SingleRow).await?;
        tx.commit().await?;
    }
    drop(conn);
    let topics: Vec<String> = types.iter().map(|t| world.topic(t)).collect();
    let expected: HashSet<String> = rows.iter().map(|r| r.event_key.clone()).collect();
    let _ = collect_records(&kafka_bootstrap(), &topics, rows.len(), WAIT).await?;
    relay.stop(WAIT).await?;
    let records = read_all_records(&kafka_bootstrap(), &topics, WAIT).await?;
    ensure_exactly_once(&records, &expected)?;
    world.db.drop_database().await?;
    Ok(())
}

/// Outbox tables shaped as users' schemas are: an INVISIBLE column before the mapped ones, the
/// aggregate id a STORED generated column extracted from the payload, a VIRTUAL generated column
/// placed in the envelope. Columns are found by name (MySQL 8 logs no names under its default
/// MINIMAL row metadata: the relay reads them from information_schema, where invisible and
/// generated columns keep their ordinal positions), and every server logs generated values in
/// the row image (MySQL 8.0 reference "Replication and Generated Columns"; MariaDB KB
/// "Generated Columns").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invisible_and_generated_columns_map_by_name() -> Result<()> {
    let mut world = World::new(bin(), "mapping_shapes").await?;
    let mut conn = world.db.conn().await?;
    conn.query_drop(
        "CREATE TABLE shaped_outbox (
           seq      BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
           audit    VARCHAR(32) NOT NULL DEFAULT 'by-default' INVISIBLE,
           agg_type VARCHAR(64) NOT NULL,
           body     LONGTEXT NOT NULL,
           agg_id   VARCHAR(64) AS (JSON_UNQUOTE(JSON_EXTRACT(body, '$.order'))) STORED,
           body_len INT AS (CHAR_LENGTH(body)) VIRTUAL,
           ekey     VARCHAR(64) NOT NULL,
           kind     VARCHAR(64) NOT NULL
         ) ENGINE=InnoDB",
    )
    .await?;
    let prefix = only_table(
        &mut world,
        "shaped_outbox",
        "shaped",
        r#"columns = { id = "seq", aggregate_type = "agg_type", aggregate_id = "agg_id", event_type = "kind", event_key = "ekey", payload = "body", created_at = "" }
timestamp = "commit"
additional = [
  { column = "audit", placement = "header" },
  { column = "body_len", placement = "envelope", alias = "size" },
]
"#,
    );
    let (relay, _) = world.start(WAIT).await?;
    conn.query_drop(
        "INSERT INTO shaped_outbox (agg_type, body, ekey, kind) \
         VALUES ('Order', '{\"order\": \"o-17\", \"total\": 5}', 'k-1', 'Placed')",
    )
    .await?;
    conn.query_drop(
        "INSERT INTO shaped_outbox (audit, agg_type, body, ekey, kind) \
         VALUES ('by-hand', 'Order', '{\"order\": \"o-18\"}', 'k-2', 'Paid')",
    )
    .await?;
    drop(conn);
    let topic = format!("{prefix}Order");
    let records =
        collect_records(&kafka_bootstrap(), std::slice::from_ref(&topic), 2, WAIT).await?;
    relay.stop(WAIT).await?;
    let got = fields_of(
        &records,
        &["key", "event_key", "event_type", "audit", "value"],
    );
    ensure!(
        got == present(&[
            &[
                "o-17",
                "k-1",
                "Placed",
                "by-default",
                r#"{"payload":{"order": "o-17", "total": 5},"size":29}"#
            ],
            &[
                "o-18",
                "k-2",
                "Paid",
                "by-hand",
                r#"{"payload":{"order": "o-18"},"size":17}"#
            ],
        ]),
        "records: {:?}",
        records.iter().map(describe_record).collect::<Vec<_>>()
    );
    world.db.drop_database().await.context("drop")?;
    Ok(())
}

/// MySQL 8.0.30+ with `sql_generate_invisible_primary_key=ON` (the default of managed services
/// such as Azure Database for MySQL) adds an invisible `my_row_id BIGINT UNSIGNED
/// AUTO_INCREMENT` as the first column of a table created without a primary key (MySQL 8.0
/// reference "Generated Invisible Primary Keys"): it shifts every column, and it is the natural
/// event id. MariaDB has no such mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generated_invisible_primary_key_is_the_event_id_on_mysql() -> Result<()> {
    let server = outbox_relay_testkit::env::test_server();
    if server.is_mariadb() {
        println!(
            "not on {}: MariaDB has no generated invisible primary keys",
            server.name()
        );
        return Ok(());
    }
    let mut world = World::new(bin(), "mapping_gipk").await?;
    let db = world.db.name().to_owned();
    let mut conn = world.db.conn().await?;
    conn.query_drop("SET SESSION sql_generate_invisible_primary_key = ON")
        .await?;
    conn.query_drop(
        "CREATE TABLE gipk_outbox (
           aggregate_type VARCHAR(64) NOT NULL,
           aggregate_id   VARCHAR(64) NOT NULL,
           event_type     VARCHAR(64) NOT NULL,
           event_key      VARCHAR(64) NOT NULL,
           payload        LONGTEXT NOT NULL
         ) ENGINE=InnoDB",
    )
    .await?;
    let (name, extra): (String, String) = conn
        .query_first(format!(
            "SELECT COLUMN_NAME, EXTRA FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = '{db}' AND TABLE_NAME = 'gipk_outbox' AND ORDINAL_POSITION = 1"
        ))
        .await?
        .context("gipk_outbox has no columns")?;
    ensure!(
        name == "my_row_id" && extra.contains("INVISIBLE"),
        "the server did not add its invisible primary key: first column {name} ({extra})"
    );
    let prefix = only_table(
        &mut world,
        "gipk_outbox",
        "gipk",
        r#"columns = { id = "my_row_id", created_at = "" }
timestamp = "commit"
"#,
    );
    let (relay, _) = world.start(WAIT).await?;
    conn.query_drop(
        "INSERT INTO gipk_outbox VALUES ('Order', 'o-1', 'Placed', 'k-1', '{\"n\": 1}'), \
                                        ('Order', 'o-2', 'Placed', 'k-2', '{\"n\": 2}')",
    )
    .await?;
    drop(conn);
    let topic = format!("{prefix}Order");
    let records =
        collect_records(&kafka_bootstrap(), std::slice::from_ref(&topic), 2, WAIT).await?;
    relay.stop(WAIT).await?;
    let got = fields_of(&records, &["id", "key", "event_key", "value"]);
    ensure!(
        got == present(&[
            &["1", "o-1", "k-1", r#"{"n": 1}"#],
            &["2", "o-2", "k-2", r#"{"n": 2}"#],
        ]),
        "records: {:?}",
        records.iter().map(describe_record).collect::<Vec<_>>()
    );
    world.db.drop_database().await.context("drop")?;
    Ok(())
}

/// `[outbox.cloudevents]`: every record carries the CloudEvents 1.0 attributes as `ce_*`
/// headers (Kafka protocol binding, binary content mode) beside the standard headers, with the
/// payload untouched; a row without an event type is a row error (here: dead-lettered) rather
/// than an invalid CloudEvent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudevents_headers_are_added_in_binary_mode() -> Result<()> {
    let mut world = World::new(bin(), "mapping_ce").await?;
    let dlq = format!("{}dead", world.topic_prefix());
    world.spec.dead_letter_topic = Some(dlq.clone());
    world.spec.outbox_extra =
        "[outbox.cloudevents]\nenabled = true\nsource = \"/shop/orders\"\n".into();
    let mut conn = world.db.conn().await?;
    // Outbox tables with an optional event type exist; such a row cannot be a CloudEvent.
    conn.query_drop("ALTER TABLE outbox MODIFY event_type VARCHAR(255) NULL")
        .await?;
    let (relay, _) = world.start(WAIT).await?;
    let k = |n: u32| format!("{}-ce{n}", world.uid);
    conn.exec_drop(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, event_key, payload, \
         created_at) VALUES ('Order', 'order-1', 'OrderPaid', ?, '{\"paid\": true}', \
         UTC_TIMESTAMP(6)), ('Order', 'order-2', NULL, ?, '{}', UTC_TIMESTAMP(6)), \
         ('Order', 'order-3', 'OrderCreated', ?, '{\"n\": 3}', UTC_TIMESTAMP(6))",
        (k(1), k(2), k(3)),
    )
    .await?;
    let topics = vec![world.topic("Order")];
    let records = collect_records(&kafka_bootstrap(), &topics, 2, WAIT).await?;
    let dead = collect_records(&kafka_bootstrap(), std::slice::from_ref(&dlq), 1, WAIT).await?;
    relay.stop(WAIT).await?;
    ensure!(records.len() == 2, "{} records", records.len());
    for (r, key, ty, payload) in [
        (&records[0], k(1), "OrderPaid", "{\"paid\": true}"),
        (&records[1], k(3), "OrderCreated", "{\"n\": 3}"),
    ] {
        let (r, key): (&Record, String) = if r.header("event_key") == Some(key.as_str()) {
            (r, key)
        } else {
            let other = records
                .iter()
                .find(|x| x.header("event_key") == Some(key.as_str()))
                .with_context(|| format!("no record for {key}"))?;
            (other, key)
        };
        let time = chrono_time(r.timestamp_ms.context("no timestamp")?);
        let want = [
            ("ce_specversion", "1.0".to_owned()),
            ("ce_id", key.clone()),
            ("ce_source", "/shop/orders".to_owned()),
            ("ce_type", ty.to_owned()),
            ("ce_subject", r.key_str().unwrap_or_default().to_owned()),
            ("ce_time", time),
            ("content-type", "application/json".to_owned()),
        ];
        for (name, value) in want {
            ensure!(
                r.header(name) == Some(value.as_str()),
                "{name}: {:?}, want {value:?} in {}",
                r.header(name),
                describe_record(r)
            );
        }
        ensure!(
            r.header("event_key") == Some(key.as_str()),
            "standard headers kept"
        );
        ensure!(
            r.value_str() == Some(payload),
            "payload changed: {}",
            describe_record(r)
        );
    }
    ensure!(
        dead.len() == 1
            && dead[0].header("event_key") == Some(k(2).as_str())
            && dead[0]
                .header("dlq_reason")
                .is_some_and(|r| r.contains("needs a type")),
        "the row without an event type: {:?}",
        dead.iter().map(describe_record).collect::<Vec<_>>()
    );
    // The pool's disconnect waits for every connection taken from it.
    drop(conn);
    world.db.drop_database().await?;
    Ok(())
}

/// RFC 3339, UTC, milliseconds: `ce_time` of a record timestamp (ms since the epoch).
fn chrono_time(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// W3C trace context (issue 17): an outbox table with `traceparent` and `tracestate` columns
/// sends their values as headers of those names with no mapping at all, NULLs left out; with
/// `outbox.trace_context = false` it does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_context_columns_become_headers() -> Result<()> {
    let mut world = World::new(bin(), "mapping_trace").await?;
    let mut conn = world.db.conn().await?;
    conn.query_drop(
        "ALTER TABLE outbox ADD COLUMN traceparent VARCHAR(55) NULL, \
         ADD COLUMN TraceState VARCHAR(512) NULL",
    )
    .await?;
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let ts = "congo=t61rcWkgMzE";
    let k = |n: u32| format!("{}-tc{n}", world.uid);
    let insert = "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, event_key, \
                  payload, created_at, traceparent, TraceState) VALUES (?, ?, 'OrderPaid', ?, \
                  '{}', UTC_TIMESTAMP(6), ?, ?)";
    let (relay, _) = world.start(WAIT).await?;
    for (n, parent, state) in [
        (1, Some(tp), Some(ts)),
        (2, Some(tp), None),
        (3, None, None),
    ] {
        conn.exec_drop(insert, ("Order", format!("order-{n}"), k(n), parent, state))
            .await?;
    }
    let topics = vec![world.topic("Order")];
    let records = collect_records(&kafka_bootstrap(), &topics, 3, WAIT).await?;
    relay.stop(WAIT).await?;
    let by_key = |n: u32| -> Result<&Record> {
        records
            .iter()
            .find(|r| r.header("event_key") == Some(k(n).as_str()))
            .with_context(|| format!("no record for row {n}"))
    };
    for (n, parent, state) in [
        (1, Some(tp), Some(ts)),
        (2, Some(tp), None),
        (3, None, None),
    ] {
        let r = by_key(n)?;
        ensure!(
            r.header("traceparent") == parent
                && r.header("tracestate") == state
                && r.header("TraceState").is_none(),
            "row {n}: {}",
            describe_record(r)
        );
    }

    // Turned off: the columns stay in the table, no header.
    world.spec.outbox_extra = "trace_context = false\n".into();
    let (relay, _) = world.start(WAIT).await?;
    conn.exec_drop(insert, ("Order", "order-4", k(4), Some(tp), Some(ts)))
        .await?;
    let records = collect_records(&kafka_bootstrap(), &topics, 4, WAIT).await?;
    relay.stop(WAIT).await?;
    let r = records
        .iter()
        .find(|r| r.header("event_key") == Some(k(4).as_str()))
        .context("no record for row 4")?;
    ensure!(
        r.header("traceparent").is_none() && r.header("tracestate").is_none(),
        "trace_context = false: {}",
        describe_record(r)
    );
    Ok(())
}
