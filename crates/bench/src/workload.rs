//! The rows the benchmark writes: ~500-byte JSON payloads, aggregate ids over 10,000 keys, and
//! the two writers (backlog: as fast as possible in transactions of 1–100 rows; steady: fixed
//! rate, fixed transaction size).
//!
//! Every payload starts with `{"ts":<commit-ish time in µs since the epoch>`, the same instant
//! as the row's `created_at DATETIME(6)`: the latency of a record is its broker append time
//! (topics use `message.timestamp.type=LogAppendTime`) minus this value.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use mysql_async::prelude::*;
use mysql_async::Pool;

/// Distinct aggregate ids (Kafka keys).
pub const KEYS: u64 = 10_000;
/// Target payload size in bytes.
pub const PAYLOAD_BYTES: usize = 500;

/// Microseconds since the Unix epoch, now.
pub fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
        .unwrap_or_default()
}

/// A small deterministic generator (SplitMix64), so the raw-produce limit sees the same keys
/// and sizes as the backlog.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }
}

/// The aggregate id (Kafka key) of row number `seq`: spread over [`KEYS`] keys.
pub fn key_of(seq: u64) -> String {
    format!("order-{}", Rng::new(seq).next_u64() % KEYS)
}

/// The event key (unique per row) of row `seq` in workload `agg`.
pub fn event_key(agg: &str, seq: u64) -> String {
    format!("{agg}-{seq}")
}

const FILLER: &str = "Lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore et dolore magna aliqua Ut enim ad minim veniam quis nostrud exercitation ullamco laboris nisi ut aliquip ex ea commodo consequat Duis aute irure dolor in reprehenderit in voluptate velit esse cillum dolore eu fugiat nulla pariatur Excepteur sint occaecat cupidatat non proident sunt in culpa qui officia deserunt mollit anim id est laborum Lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod";

/// The JSON payload of row `seq` written at `ts_us`: [`PAYLOAD_BYTES`] bytes (as long as
/// `ts_us` has 16 digits), starting with `{"ts":`.
pub fn payload(ts_us: i64, seq: u64, key: &str) -> String {
    let mut s = format!(
        r#"{{"ts":{ts_us},"seq":{seq},"orderId":"{key}","customer":"customer-{c}","currency":"EUR","total":{t}.{cents},"items":[{{"sku":"SKU-{sku}","qty":{q}}}],"note":""#,
        c = seq % 977,
        t = seq % 1000,
        cents = seq % 100,
        sku = seq % 4099,
        q = seq % 7 + 1,
    );
    let tail = "\"}";
    let pad = PAYLOAD_BYTES.saturating_sub(s.len() + tail.len());
    s.push_str(&FILLER[..pad.min(FILLER.len())]);
    s.push_str(tail);
    s
}

/// `ts_us` as a `DATETIME(6)` literal (UTC, as the relay reads `created_at`).
pub fn datetime6(ts_us: i64) -> String {
    chrono::DateTime::from_timestamp_micros(ts_us)
        .map(|d| d.format("%Y-%m-%d %H:%M:%S%.6f").to_string())
        .unwrap_or_else(|| "1970-01-01 00:00:00.000000".into())
}

/// Appends the SQL tuple of one outbox row to `sql`; returns the payload length.
fn push_row(sql: &mut String, agg: &str, seq: u64) -> usize {
    let ts = now_micros();
    let key = key_of(seq);
    let body = payload(ts, seq, &key);
    sql.push_str(&format!(
        "('{agg}','{key}','OrderCreated','{ek}','{body}','{dt}')",
        ek = event_key(agg, seq),
        dt = datetime6(ts)
    ));
    body.len()
}

const INSERT_HEAD: &str =
    "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, event_key, payload, created_at) VALUES ";

/// One multi-row INSERT (autocommit: one transaction) of rows `first..first+n`.
fn insert_sql(agg: &str, first: u64, n: u64) -> (String, usize) {
    let mut sql = String::with_capacity(INSERT_HEAD.len() + n as usize * (PAYLOAD_BYTES + 120));
    sql.push_str(INSERT_HEAD);
    let mut bytes = 0;
    for i in 0..n {
        if i > 0 {
            sql.push(',');
        }
        bytes += push_row(&mut sql, agg, first + i);
    }
    (sql, bytes)
}

/// Commits one row of aggregate `agg` whose event key (`<agg>-prime`) and payload (`{}`) are
/// not a measured row's: the relay's producer learns the topic (metadata, and for exactly-once
/// the partition's first AddPartitionsToTxn) before the measured rows, as on a topic in use.
///
/// # Errors
/// A connection or the INSERT fails.
pub async fn write_prime(pool: &Pool, agg: &str) -> Result<()> {
    pool.get_conn()
        .await?
        .exec_drop(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, event_key, payload) \
             VALUES (?, 'prime', 'prime', ?, '{}')",
            (agg, format!("{agg}-prime")),
        )
        .await?;
    Ok(())
}

/// What a writer wrote.
#[derive(Debug, Clone, Default)]
pub struct Written {
    /// Rows committed.
    pub rows: u64,
    /// Sum of the payload sizes, bytes.
    pub payload_bytes: u64,
    /// Transactions committed.
    pub txns: u64,
    /// Wall time of the writer, seconds.
    pub secs: f64,
    /// Transactions retried after a deadlock (error 1213) or lock wait timeout (1205).
    pub deadlocks: u64,
    /// Steady workloads, per transaction: the sequence number of its first row (its rows are
    /// that one and the next `txn - 1`), when its statement was sent and when its commit call
    /// returned (µs since the epoch).
    pub commits: Vec<(u64, i64, i64)>,
}

/// Runs one autocommit statement, again after a deadlock or lock wait timeout (as an
/// application would: the polling relay's locking reads cause them).
async fn exec_retrying(conn: &mut mysql_async::Conn, sql: &str, retries: &AtomicU64) -> Result<()> {
    loop {
        match conn.query_drop(sql).await {
            Ok(()) => return Ok(()),
            Err(mysql_async::Error::Server(e)) if e.code == 1213 || e.code == 1205 => {
                retries.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => return Err(e).context("outbox INSERT"),
        }
    }
}

/// Writes `rows` rows of workload `agg` (sequence numbers `0..rows`) as fast as `conns`
/// connections can, in transactions of 1–100 rows (uniform, seeded).
///
/// # Errors
/// A connection or an INSERT fails.
pub async fn write_backlog(pool: &Pool, agg: &str, rows: u64, conns: u64) -> Result<Written> {
    let started = Instant::now();
    let per = rows.div_ceil(conns);
    let mut tasks = Vec::new();
    for w in 0..conns {
        let (from, to) = (w * per, ((w + 1) * per).min(rows));
        let pool = pool.clone();
        let agg = agg.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut conn = pool.get_conn().await.context("backlog writer connection")?;
            let mut rng = Rng::new(0xB4C4_0000 + w);
            let mut out = Written::default();
            let mut seq = from;
            while seq < to {
                let n = rng.range(1, 100).min(to - seq);
                let (sql, bytes) = insert_sql(&agg, seq, n);
                exec_retrying(&mut conn, &sql, &AtomicU64::new(0)).await?;
                out.rows += n;
                out.payload_bytes += bytes as u64;
                out.txns += 1;
                seq += n;
            }
            anyhow::Ok(out)
        }));
    }
    let mut total = Written::default();
    for t in tasks {
        let w = t.await.context("backlog writer task")??;
        total.rows += w.rows;
        total.payload_bytes += w.payload_bytes;
        total.txns += w.txns;
    }
    total.secs = started.elapsed().as_secs_f64();
    Ok(total)
}

/// Commits `txn`-row transactions of workload `agg` at `rate` rows/s (open loop: transaction
/// `i` is due at `i × txn / rate` seconds; a late writer sends at once) for `secs` seconds, on
/// enough connections that one slow commit does not hold the others back.
///
/// # Errors
/// A connection or an INSERT fails.
pub async fn write_steady(
    pool: &Pool,
    agg: &str,
    rate: u64,
    txn: u64,
    secs: u64,
) -> Result<Written> {
    let txn_rate = (rate / txn).max(1);
    let total_txns = txn_rate * secs;
    let conns = txn_rate.div_ceil(400).clamp(2, 48);
    let interval = Duration::from_secs_f64(1.0 / txn_rate as f64);
    let start = tokio::time::Instant::now() + Duration::from_millis(50);
    let rows = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let deadlocks = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for w in 0..conns {
        let pool = pool.clone();
        let agg = agg.to_owned();
        let (rows, bytes, deadlocks) = (rows.clone(), bytes.clone(), deadlocks.clone());
        tasks.push(tokio::spawn(async move {
            let mut conn = pool.get_conn().await.context("steady writer connection")?;
            let mut commits = Vec::new();
            let mut i = w;
            while i < total_txns {
                let due = start + interval.mul_f64(i as f64);
                tokio::time::sleep_until(due).await;
                let (sql, b) = insert_sql(&agg, i * txn, txn);
                let sent = now_micros();
                exec_retrying(&mut conn, &sql, &deadlocks).await?;
                commits.push((i * txn, sent, now_micros()));
                rows.fetch_add(txn, Ordering::Relaxed);
                bytes.fetch_add(b as u64, Ordering::Relaxed);
                i += conns;
            }
            anyhow::Ok(commits)
        }));
    }
    let mut commits = Vec::new();
    for t in tasks {
        commits.extend(t.await.context("steady writer task")??);
    }
    let secs = (tokio::time::Instant::now() - start).as_secs_f64();
    Ok(Written {
        rows: rows.load(Ordering::Relaxed),
        payload_bytes: bytes.load(Ordering::Relaxed),
        txns: total_txns,
        secs,
        deadlocks: deadlocks.load(Ordering::Relaxed),
        commits,
    })
}

/// The row sequence number a payload carries (`"seq":<digits>`), also inside a JSON string
/// that escapes the quotes.
pub fn payload_seq(value: &[u8]) -> Option<u64> {
    payload_number(value, b"seq")
}

/// The commit-ish time (µs) a payload starts with (`"ts":<digits>`), also inside a JSON
/// string that escapes the quotes.
pub fn payload_ts(value: &[u8]) -> Option<i64> {
    payload_number(value, b"ts")
}

/// The digits after the first `<field>":` (or `<field>\"`, the form inside an escaped JSON
/// string) in `value`, parsed.
fn payload_number<T: std::str::FromStr>(value: &[u8], field: &[u8]) -> Option<T> {
    let n = field.len() + 2;
    let pos = value.windows(n).position(|w| {
        w.starts_with(field) && (&w[field.len()..] == b"\":" || &w[field.len()..] == b"\\\"")
    })?;
    let digits: Vec<u8> = value[pos + n..]
        .iter()
        .skip_while(|b| !b.is_ascii_digit())
        .take_while(|b| b.is_ascii_digit())
        .copied()
        .collect();
    std::str::from_utf8(&digits).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_is_500_bytes_of_json_with_its_timestamp() {
        let ts = 1_700_000_000_123_456;
        let p = payload(ts, 123_456, &key_of(123_456));
        assert_eq!(p.len(), PAYLOAD_BYTES);
        let v: serde_json::Value = serde_json::from_str(&p).expect("payload is JSON");
        assert_eq!(v["ts"].as_i64(), Some(ts));
        assert_eq!(payload_ts(p.as_bytes()), Some(ts));
        assert_eq!(payload_ts(br#""{\"ts\":1700000000123456,""#), Some(ts));
        assert_eq!(payload_seq(p.as_bytes()), Some(123_456));
        assert_eq!(payload_seq(br#""{\"ts\":17,\"seq\":42,""#), Some(42));
    }

    #[test]
    fn datetime6_is_utc_with_microseconds() {
        assert_eq!(datetime6(1_000_001), "1970-01-01 00:00:01.000001");
    }
}
