//! JSON payloads end to end, on every server: a generated corpus of documents is inserted live
//! into the outbox's `payload JSON` column and every Kafka value must equal, byte for byte, the
//! server's own text of the stored document (`SELECT payload`).
//!
//! On MySQL 8.0 the column is stored in MySQL's binary JSON format, which the relay decodes and
//! renders itself (the server normalises the text: key order, spacing, number forms), so this is
//! the test of that decoder against the server's own rendering. On MariaDB `JSON` is LONGTEXT
//! with a validity check: the stored text is the inserted text, and the test checks it arrives
//! untouched.
//!
//! The corpus (seeded, the same on every run): nesting, unicode (BMP, astral, combining), every
//! escape and control character, integers at both 64-bit ends and past them, doubles (tiny,
//! huge, negative zero), literals, empty containers, documents over 64 KiB (MySQL's large
//! object/array format), and values built by SQL that only MySQL stores as opaque JSON scalars
//! (DECIMAL, DATE, DATETIME, TIME, binary strings).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{ensure, Result};
use mysql_async::prelude::*;
use outbox_relay_testkit::{
    collect_records, next_server_id, recent_created_at_base, test_server, unique_suffix,
    RelayConfigSpec, RelayProcess, TestDb,
};

/// The relay binary under test (built on first use).
fn bin() -> &'static str {
    outbox_relay_testkit::relay_bin()
}
const STARTUP: Duration = Duration::from_secs(60);
const RELAY_WAIT: Duration = Duration::from_secs(180);
const STOP: Duration = Duration::from_secs(30);

/// Generated documents (plus the SQL-built ones).
const GENERATED: usize = 400;

/// xorshift64*: a small deterministic generator, so the corpus is the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

/// JSON text of a string (serde_json's escaping: quotes, backslashes, control characters).
fn quote(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

const PIECES: [&str; 16] = [
    "order",
    "Zahlung",
    "ça",
    "日本語",
    "😀",
    "e\u{301}",
    "\"",
    "\\",
    "/",
    "\n",
    "\t",
    "\u{1}",
    "\u{1f}",
    "\u{7f}",
    "\u{2028}",
    "",
];

fn string(rng: &mut Rng) -> String {
    (0..rng.below(5)).map(|_| *rng.pick(&PIECES)).collect()
}

const INTEGERS: [&str; 12] = [
    "0",
    "-1",
    "1",
    "127",
    "-32768",
    "65535",
    "2147483647",
    "-2147483648",
    "9223372036854775807",
    "-9223372036854775808",
    "18446744073709551615",
    // Past uint64: MySQL stores a double.
    "18446744073709551616",
];

const DOUBLES: [&str; 10] = [
    "1.5",
    "-0.0",
    "0.1",
    "3.141592653589793",
    "1e300",
    "-2.5e-300",
    "5e-324",
    "1.7976931348623157e308",
    "123456789.125",
    "1E2",
];

fn value(rng: &mut Rng, depth: u32) -> String {
    let kinds = if depth >= 4 { 6 } else { 8 };
    match rng.below(kinds) {
        0 => rng.pick(&INTEGERS).to_string(),
        1 => (rng.next() as i64).to_string(),
        2 => rng.pick(&DOUBLES).to_string(),
        3 => quote(&string(rng)),
        4 => rng.pick(&["true", "false", "null"]).to_string(),
        5 => quote(&format!("k{}", rng.below(1000))),
        6 => {
            let items: Vec<String> = (0..rng.below(5)).map(|_| value(rng, depth + 1)).collect();
            format!("[{}]", items.join(","))
        }
        _ => {
            let n = rng.below(5);
            let members: Vec<String> = (0..n)
                .map(|i| {
                    // Distinct keys: the stored document of duplicates differs by server.
                    let key = format!("{}{i}", string(rng));
                    format!("{}:{}", quote(&key), value(rng, depth + 1))
                })
                .collect();
            format!("{{{}}}", members.join(","))
        }
    }
}

/// Documents as JSON text.
fn corpus() -> Vec<String> {
    let mut rng = Rng(0x5eed_1234_abcd_ef01);
    let mut docs: Vec<String> = (0..GENERATED)
        .map(|i| match i % 4 {
            // Top-level scalars are valid JSON documents too.
            0 => value(&mut rng, 3),
            _ => format!("{{\"doc\":{i},\"body\":{}}}", value(&mut rng, 0)),
        })
        .collect();
    docs.extend([
        "{}".to_owned(),
        "[]".to_owned(),
        "[[],{},[[]],{\"\":{}}]".to_owned(),
        format!("[{}]", INTEGERS.join(",")),
        format!("[{}]", DOUBLES.join(",")),
        // Over 64 KiB: one long string, and an object with many members (MySQL's large format).
        format!("{{\"big\":{}}}", quote(&"x😀\"".repeat(20_000))),
        format!(
            "{{{}}}",
            (0..3_000)
                .map(|i| format!("\"key{i:05}\":[{i},\"v{i}\",{}.5]", i))
                .collect::<Vec<_>>()
                .join(",")
        ),
        format!(
            "[{}]",
            (0..9_000)
                .map(|i| format!("{}", i64::MAX - i))
                .collect::<Vec<_>>()
                .join(",")
        ),
    ]);
    docs
}

/// Payloads built by SQL: on MySQL these are opaque JSON scalars (DECIMAL, DATE, DATETIME,
/// TIME, binary strings) that text cannot express; on MariaDB the same functions give text.
const SQL_BUILT: [&str; 6] = [
    "JSON_OBJECT('price', CAST('1234.5678' AS DECIMAL(12,4)), 'neg', CAST('-0.01' AS DECIMAL(5,2)))",
    "JSON_ARRAY(CAST('2024-02-29' AS DATE), CAST('1000-01-01' AS DATE), CAST('9999-12-31' AS DATE))",
    "JSON_OBJECT('at', CAST('2024-02-29 23:59:58.123456' AS DATETIME(6)), 'at0', CAST('1970-01-01 00:00:00' AS DATETIME))",
    "JSON_ARRAY(CAST('12:34:56.5' AS TIME(1)), CAST('-838:59:59' AS TIME), CAST('00:00:00' AS TIME))",
    "JSON_OBJECT('nested', JSON_ARRAY(CAST('1.10' AS DECIMAL(4,2)), JSON_OBJECT('d', CAST('2001-02-03' AS DATE))))",
    "JSON_OBJECT('u', CAST(18446744073709551615 AS UNSIGNED), 's', CAST(-9223372036854775808 AS SIGNED), 'f', CAST(1.25 AS DOUBLE))",
];

/// Binary strings in a JSON document: MySQL stores them as opaque BLOB scalars
/// (`"base64:type15:..."` in its text); MariaDB's JSON is utf8mb4 text, which refuses them
/// (error 1366), so they are inserted on MySQL only.
const SQL_BUILT_BINARY: [&str; 2] = [
    "JSON_OBJECT('bin', CAST(x'00ff10' AS BINARY(3)))",
    "JSON_ARRAY(CAST(x'6869' AS CHAR CHARACTER SET binary), 'text')",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_json_document_reaches_kafka_as_the_server_prints_it() -> Result<()> {
    let server = test_server();
    let db = TestDb::create("json_corpus").await?;
    let uid = unique_suffix();
    let connector = format!("json-{uid}");
    let spec = RelayConfigSpec::new(&db, &connector, next_server_id(), &format!("j_{uid}"));
    let relay = RelayProcess::spawn(bin(), &spec.to_toml(), &[])?;
    relay
        .wait_for_checkpoint_row(db.pool(), &connector, STARTUP)
        .await?;

    let docs = corpus();
    let created = recent_created_at_base();
    let mut conn = db.conn().await?;
    let insert = |payload_sql: &str| {
        format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, event_key, payload, \
             created_at) VALUES ('Json', ?, 'Doc', ?, {payload_sql}, FROM_UNIXTIME(? / 1000000))"
        )
    };
    // Several documents per transaction, so transactions of many rows events are covered too.
    let mut keys = Vec::new();
    for (chunk_no, chunk) in docs.chunks(25).enumerate() {
        let mut tx = conn
            .start_transaction(mysql_async::TxOpts::default())
            .await?;
        for (i, doc) in chunk.iter().enumerate() {
            let key = format!("{uid}-doc-{chunk_no}-{i}");
            tx.exec_drop(
                insert("?"),
                (
                    format!("doc-{}", i % 7),
                    key.as_str(),
                    doc.as_str(),
                    created,
                ),
            )
            .await?;
            keys.push(key);
        }
        tx.commit().await?;
    }
    let binary: &[&str] = if server.is_mysql() {
        &SQL_BUILT_BINARY
    } else {
        eprintln!(
            "not on {server}: binary strings inside JSON (MariaDB's JSON is utf8mb4 text and \
             refuses them with error 1366)"
        );
        &[]
    };
    for (i, sql) in SQL_BUILT.iter().chain(binary).enumerate() {
        let key = format!("{uid}-sql-{i}");
        conn.exec_drop(insert(sql), (format!("sql-{i}"), key.as_str(), created))
            .await?;
        keys.push(key);
    }

    // The server's own text of every stored document.
    let stored: BTreeMap<String, Vec<u8>> = conn
        .query::<(String, Vec<u8>), _>("SELECT event_key, payload FROM outbox")
        .await?
        .into_iter()
        .collect();
    ensure!(
        stored.len() == keys.len(),
        "{} rows stored for {} inserted",
        stored.len(),
        keys.len()
    );

    let records = collect_records(
        &spec.bootstrap_servers,
        &[spec.topic_for("Json")],
        keys.len(),
        RELAY_WAIT,
    )
    .await?;
    let mut problems = Vec::new();
    let mut seen = BTreeMap::new();
    for r in &records {
        let Some(key) = r.header("event_key") else {
            problems.push(format!("a record without event_key at offset {}", r.offset));
            continue;
        };
        *seen.entry(key.to_owned()).or_insert(0) += 1;
        let want = stored.get(key);
        if want.map(Vec::as_slice) != r.value.as_deref() {
            let show = |b: Option<&[u8]>| {
                b.map(|b| {
                    let s = String::from_utf8_lossy(b);
                    s.chars().take(300).collect::<String>()
                })
            };
            let first_diff = match (want, r.value.as_deref()) {
                (Some(w), Some(g)) => w.iter().zip(g).position(|(a, b)| a != b),
                _ => None,
            };
            problems.push(format!(
                "{key}: Kafka value differs from SELECT payload (first difference at byte \
                 {first_diff:?}):\n  server: {:?}\n  kafka:  {:?}",
                show(want.map(Vec::as_slice)),
                show(r.value.as_deref()),
            ));
        }
    }
    for key in &keys {
        if !seen.contains_key(key) {
            problems.push(format!("{key}: no record"));
        }
    }
    ensure!(
        problems.is_empty(),
        "{} of {} documents wrong on {server}:\n{}",
        problems.len(),
        keys.len(),
        problems.join("\n")
    );
    if server.is_mysql() {
        // The corpus must have exercised the binary format's opaque scalars: the server says
        // which JSON types it stored.
        let types: Vec<String> = conn
            .query(
                "SELECT DISTINCT JSON_TYPE(JSON_EXTRACT(payload, '$[0]')) FROM outbox \
                 WHERE aggregate_id LIKE 'sql-%' AND JSON_TYPE(payload) = 'ARRAY'",
            )
            .await?;
        for t in ["DATE", "TIME", "BLOB"] {
            ensure!(
                types.iter().any(|x| x == t),
                "MySQL stored no {t} scalar (types: {types:?})"
            );
        }
    }
    // Back to the pool: dropping the database waits for every connection of the pool.
    drop(conn);
    let status = relay.stop(STOP).await?;
    ensure!(status.success(), "relay exit: {status:?}");
    db.drop_database().await
}
