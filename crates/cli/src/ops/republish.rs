//! `outbox-relay republish`: rows still in the outbox table sent to Kafka again (incident
//! recovery: a consumer lost its data, a topic was deleted).
//!
//! Selects rows of each outbox table (or `--table`) by event_key, by a `created_at` range or by
//! a WHERE clause, reads them in id order (the order the table knows: an auto-increment id
//! follows insertion, and one aggregate's rows are written one after another), turns each row
//! into the record `run` would send (same mapping, router, topic, key, headers, envelope, with
//! the values' text forms from the server's binary protocol instead of the binlog), adds the
//! header `republished_at` (RFC 3339, UTC, the run's start) and produces it with the relay's
//! producer settings (idempotent, `acks=all`, `murmur2_random`, so each key lands on its
//! partition), at most `--rate` rows per second, in order. The record timestamp is the
//! republish time (the commit time is not in the table), or `created_at` with
//! `timestamp = "column"`. Without `--yes` it only counts and shows the first rows.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use mysql_async::consts::{ColumnFlags, ColumnType};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row, Value};

use outbox_relay_core::config::{RelayConfig, TimestampSource};
use outbox_relay_core::error::RelayError;
use outbox_relay_core::outbox::mapping::TableMapping;
use outbox_relay_core::outbox::OutboxEvent;
use outbox_relay_core::position::BinlogPosition;
use outbox_relay_kafka::publish::{InOrder, Producer};
use outbox_relay_kafka::route::Router;
use outbox_relay_mysql::decode::columns::{timestamp_ms, ColumnInfo, ColumnValue};
use outbox_relay_mysql::decode::event::{outbox_event, row_values, OutboxColumn};

/// Header every republished record carries: when the republish run started (RFC 3339, UTC).
pub const REPUBLISHED_HEADER: &str = "republished_at";

/// Rows read per query.
const PAGE: usize = 1000;
/// Most records waiting for their acknowledgement.
const IN_FLIGHT: usize = 10_000;
/// Rows shown by a plan (no `--yes`).
const SAMPLE: usize = 10;
/// utf8mb4_general_ci: JSON values arrive as UTF-8 text with the binary collation.
const UTF8MB4: u16 = 45;

/// Which rows to republish.
#[derive(Debug, Clone)]
pub enum Selection {
    /// Rows whose event_key column is one of these.
    EventKeys(Vec<String>),
    /// Rows whose `created_at` is in `[since, until)` (ms since the epoch, UTC; either end
    /// open).
    Created {
        /// First instant included.
        since_ms: Option<i64>,
        /// First instant excluded.
        until_ms: Option<i64>,
    },
    /// Rows matching this SQL condition on the outbox table (the operator's own SQL).
    Where(String),
}

/// `republish` arguments.
#[derive(Debug, Clone)]
pub struct RepublishOptions {
    /// The rows.
    pub selection: Selection,
    /// Only this outbox table (`database.table`); `None`: every configured one.
    pub table: Option<String>,
    /// Most rows sent per second (at least 1).
    pub rate: u32,
    /// Send; without it only count and show the first rows.
    pub yes: bool,
}

/// What `republish` found and did, per outbox table.
#[derive(Debug, Default)]
pub struct RepublishReport {
    /// Records were sent (`--yes`).
    pub sent: bool,
    /// Per table: name, rows selected, rows sent (acknowledged), and lines (the plan's first
    /// rows, or rows that cannot become a record, with why).
    pub tables: Vec<TableOutcome>,
}

/// One table of a [`RepublishReport`].
#[derive(Debug, Default)]
pub struct TableOutcome {
    /// `database.table`.
    pub table: String,
    /// Rows the selection matched.
    pub selected: u64,
    /// Records acknowledged by Kafka.
    pub sent: u64,
    /// Rows left out because they cannot become a record (each has a line).
    pub refused: u64,
    /// Plan lines (first rows) or refused rows.
    pub lines: Vec<String>,
}

impl RepublishReport {
    /// Rows that could not become records, in all tables.
    pub fn refused(&self) -> u64 {
        self.tables.iter().map(|t| t.refused).sum()
    }
}

impl fmt::Display for RepublishReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for t in &self.tables {
            for line in &t.lines {
                writeln!(f, "{line}")?;
            }
            if self.sent {
                writeln!(
                    f,
                    "{}: republished {} of {} selected rows ({} cannot become records)",
                    t.table, t.sent, t.selected, t.refused
                )?;
            } else {
                writeln!(
                    f,
                    "{}: {} rows would be republished (plan; nothing sent: add --yes)",
                    t.table, t.selected
                )?;
            }
        }
        Ok(())
    }
}

/// Republishes the selected rows (see the module documentation).
///
/// # Errors
/// [`RelayError::Config`] / [`RelayError::Argument`] when the selection needs a column the
/// mapping does not have, `--table` is not an outbox table, or a property is invalid;
/// [`RelayError::Mysql`] when the rows cannot be read (also a WHERE clause the server refuses);
/// [`RelayError::Kafka`] when Kafka refuses a record (rows before it were sent and
/// acknowledged: the message says how many).
pub async fn republish(
    config: &RelayConfig,
    opts: &RepublishOptions,
) -> Result<RepublishReport, RelayError> {
    config.table_mappings()?;
    let mut conn = super::connect(config).await?;
    let mappings = super::selected_mappings(&mut conn, config, opts.table.as_deref()).await?;
    let producer = if opts.yes {
        Some(Producer::new(&config.kafka, "republish")?)
    } else {
        None
    };
    let started = chrono::Utc::now();
    let stamp = started.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let mut report = RepublishReport {
        sent: opts.yes,
        ..RepublishReport::default()
    };
    let mut pacer = Pacer::new(opts.rate);
    for m in mappings {
        let m = Arc::new(m);
        let (cond, params) = condition(&mut conn, &m, &opts.selection).await?;
        let t = m.table.quoted();
        let id = super::quote_ident(&m.columns.id);
        let count: Option<u64> = conn
            .exec_first(
                format!("SELECT COUNT(*) FROM {t} WHERE {cond}"),
                params.clone(),
            )
            .await?;
        let mut outcome = TableOutcome {
            table: m.table.to_string(),
            selected: count.unwrap_or(0),
            ..TableOutcome::default()
        };
        let Some(producer) = &producer else {
            let sample: Vec<Row> = conn
                .exec(
                    format!(
                        "SELECT {} FROM {t} WHERE {cond} ORDER BY {id} LIMIT {SAMPLE}",
                        select_list(&m)
                    ),
                    params.clone(),
                )
                .await?;
            for row in sample {
                outcome.lines.push(plan_line(&m, row, &stamp));
            }
            report.tables.push(outcome);
            continue;
        };
        let mut sender = InOrder::new(producer, IN_FLIGHT);
        let router = Router::new();
        let mut after: Option<Value> = None;
        loop {
            let (sql, page_params) = match &after {
                None => (
                    format!(
                        "SELECT {} FROM {t} WHERE {cond} ORDER BY {id} LIMIT {PAGE}",
                        select_list(&m)
                    ),
                    params.clone(),
                ),
                Some(last) => {
                    let mut p = params.clone();
                    p.push(last.clone());
                    (
                        format!(
                            "SELECT {} FROM {t} WHERE ({cond}) AND {id} > ? ORDER BY {id} \
                             LIMIT {PAGE}",
                            select_list(&m)
                        ),
                        p,
                    )
                }
            };
            let rows: Vec<Row> = conn.exec(sql, page_params).await?;
            let n = rows.len();
            for row in rows {
                after = row.as_ref(0).cloned();
                let label = row_label(&row);
                match event_of(&m, row) {
                    Ok(None) => {}
                    Ok(Some(event)) => match router.try_route(event) {
                        Ok(mut record) => {
                            record.headers.push((
                                Arc::from(REPUBLISHED_HEADER),
                                Some(stamp.clone().into_bytes()),
                            ));
                            pacer.wait().await;
                            sender.send(&record, &label).await.map_err(|e| {
                                RelayError::kafka(format!(
                                    "{e} ({} rows of {} republished and acknowledged before it)",
                                    sender.sent() + outcome.sent,
                                    m.table
                                ))
                            })?;
                        }
                        Err((reason, _)) => {
                            outcome.refused += 1;
                            outcome
                                .lines
                                .push(format!("SKIP {} {label}: {reason}", m.table));
                        }
                    },
                    Err(reason) => {
                        outcome.refused += 1;
                        outcome
                            .lines
                            .push(format!("SKIP {} {label}: {reason}", m.table));
                    }
                }
            }
            if n < PAGE {
                break;
            }
        }
        sender.drain().await?;
        outcome.sent = sender.sent();
        report.tables.push(outcome);
    }
    Ok(report)
}

/// The WHERE condition (with `?` placeholders) and its parameters for `selection` on `m`.
pub(crate) async fn condition(
    conn: &mut Conn,
    m: &TableMapping,
    selection: &Selection,
) -> Result<(String, Vec<Value>), RelayError> {
    Ok(match selection {
        Selection::EventKeys(keys) => {
            if m.columns.event_key.is_empty() {
                return Err(RelayError::Config(format!(
                    "outbox table {} has no event_key column mapped (outbox.columns.event_key): \
                     select its rows with --since/--until or --where",
                    m.table
                )));
            }
            let marks = vec!["?"; keys.len()].join(", ");
            (
                format!("{} IN ({marks})", super::quote_ident(&m.columns.event_key)),
                keys.iter().map(|k| Value::from(k.as_str())).collect(),
            )
        }
        Selection::Created { since_ms, until_ms } => {
            if m.columns.created_at.is_empty() {
                return Err(RelayError::Config(format!(
                    "outbox table {} has no created_at column mapped (outbox.columns.created_at): \
                     select its rows with --event-key or --where",
                    m.table
                )));
            }
            let data_type = super::created_at_type(conn, m).await?;
            // The connection's zone is UTC (super::connect): TIMESTAMP compares in UTC;
            // DATETIME holds wall-clock time in the mapping's zone.
            let utc = data_type.as_deref() == Some("timestamp");
            let literal = |ms: i64| -> Result<Value, RelayError> {
                let t = chrono::DateTime::from_timestamp_millis(ms).ok_or_else(|| {
                    RelayError::Argument(format!("{ms} ms is not a representable time"))
                })?;
                let local = if utc {
                    t.naive_utc()
                } else {
                    t.with_timezone(&m.datetime_time_zone).naive_local()
                };
                Ok(Value::from(
                    local.format("%Y-%m-%d %H:%M:%S%.6f").to_string(),
                ))
            };
            let created = super::quote_ident(&m.columns.created_at);
            let mut parts = Vec::new();
            let mut params = Vec::new();
            if let Some(s) = since_ms {
                parts.push(format!("{created} >= ?"));
                params.push(literal(*s)?);
            }
            if let Some(u) = until_ms {
                parts.push(format!("{created} < ?"));
                params.push(literal(*u)?);
            }
            if parts.is_empty() {
                parts.push("TRUE".into());
            }
            (parts.join(" AND "), params)
        }
        Selection::Where(sql) => (format!("({sql})"), Vec::new()),
    })
}

/// The mapped columns, in the order [`event_of`] reads them: id, aggregate_type,
/// aggregate_id, event_type, event_key, payload, created_at, partition, additional ones
/// (unmapped ones as NULL).
pub(crate) fn select_list(m: &TableMapping) -> String {
    let c = &m.columns;
    let col = |name: &str| {
        if name.is_empty() {
            "NULL".to_owned()
        } else {
            super::quote_ident(name)
        }
    };
    let mut cols = vec![
        col(&c.id),
        col(&c.aggregate_type),
        col(&c.aggregate_id),
        col(&c.event_type),
        col(&c.event_key),
        col(&c.payload),
        col(&c.created_at),
        col(&c.partition),
    ];
    cols.extend(m.additional.iter().map(|a| col(&a.column)));
    cols.join(", ")
}

/// `id=… event_key=…` of a row read with [`select_list`], for messages.
pub(crate) fn row_label(row: &Row) -> String {
    let text = |i: usize| match row.as_ref(i) {
        Some(Value::Bytes(b)) => String::from_utf8_lossy(b).into_owned(),
        Some(Value::NULL) | None => "NULL".into(),
        Some(v) => v.as_sql(true).trim_matches('\'').to_owned(),
    };
    format!("id={} event_key={}", text(0), text(4))
}

fn plan_line(m: &Arc<TableMapping>, row: Row, stamp: &str) -> String {
    let label = row_label(&row);
    match event_of(m, row) {
        Ok(Some(event)) => match Router::new().try_route(event) {
            Ok(record) => format!(
                "WOULD {} {label} -> {} key={} ({REPUBLISHED_HEADER}={stamp})",
                m.table,
                record.topic,
                String::from_utf8_lossy(&record.key)
            ),
            Err((reason, _)) => format!("SKIP {} {label}: {reason}", m.table),
        },
        Ok(None) => format!(
            "SKIP {} {label}: NULL payload (outbox.null_payload = \"skip\")",
            m.table
        ),
        Err(reason) => format!("SKIP {} {label}: {reason}", m.table),
    }
}

/// The event `run` would have read for `row` (read with [`select_list`]); `None` for a row
/// `run` skips (a NULL payload with `null_payload = "skip"`).
///
/// # Errors
/// Why the row cannot become a record (a NULL aggregate type or id, a value that cannot be
/// converted, a NULL payload with `null_payload = "dead_letter"`).
pub(crate) fn event_of(m: &Arc<TableMapping>, row: Row) -> Result<Option<OutboxEvent>, String> {
    let columns = row.columns();
    let infos: Vec<ColumnInfo> = columns
        .iter()
        .map(|c| {
            let ty = c.column_type();
            ColumnInfo {
                name: c.name_str().into_owned(),
                column_type: Some(ty),
                collation: if ty == ColumnType::MYSQL_TYPE_JSON {
                    UTF8MB4
                } else {
                    c.character_set()
                },
                unsigned: c.flags().contains(ColumnFlags::UNSIGNED_FLAG),
                labels: None,
                fixed_len: None,
                nullable: !c.flags().contains(ColumnFlags::NOT_NULL_FLAG),
            }
        })
        .collect();
    let mut values = row.unwrap();
    let mut next = |i: usize| match (values.get_mut(i), infos.get(i)) {
        (Some(v), Some(info)) => Ok((ColumnValue::Value(std::mem::replace(v, Value::NULL)), info)),
        _ => Err(format!("the row has no column {i}")),
    };
    let now_ms = chrono::Utc::now().timestamp_millis();
    let (created_value, created_info) = next(6)?;
    let column_ms = match (&created_value, m.timestamp) {
        (ColumnValue::Value(v), TimestampSource::Column) => {
            // TIMESTAMP values arrive in the connection's zone, UTC.
            let zone = if created_info.column_type == Some(ColumnType::MYSQL_TYPE_TIMESTAMP) {
                chrono_tz::UTC
            } else {
                m.datetime_time_zone
            };
            timestamp_ms(v, zone).map_err(|e| format!("column {:?}: {e}", created_info.name))?
        }
        _ => None,
    };
    let partition = match next(7)? {
        (ColumnValue::Value(Value::NULL), _) => None,
        (ColumnValue::Value(Value::Int(p)), _) => i32::try_from(p).ok().filter(|p| *p >= 0),
        (ColumnValue::Value(Value::UInt(p)), _) => i32::try_from(p).ok(),
        (v, info) => {
            return Err(format!(
                "column {:?} (outbox.columns.partition) holds {v:?}, not a partition number",
                info.name
            ))
        }
    };
    // The columns in select_list's order: id, aggregate_type, aggregate_id, event_type,
    // event_key, payload, (created_at, partition,) the additional ones.
    let values = row_values(
        m,
        |c| {
            next(match c {
                OutboxColumn::Id => 0,
                OutboxColumn::AggregateType => 1,
                OutboxColumn::AggregateId => 2,
                OutboxColumn::EventType => 3,
                OutboxColumn::EventKey => 4,
                OutboxColumn::Payload => 5,
                OutboxColumn::Additional(i) => 8 + i,
            })
        },
        |e| e,
        |_, info| info.column_type == Some(ColumnType::MYSQL_TYPE_JSON),
    )?;
    outbox_event(
        m,
        values,
        partition,
        column_ms,
        now_ms,
        BinlogPosition::default(),
    )
    .map_err(|u| u.reason)
}

/// At most `rate` rows per second.
struct Pacer {
    start: tokio::time::Instant,
    interval: Duration,
    n: u32,
}

impl Pacer {
    fn new(rate: u32) -> Self {
        Self {
            start: tokio::time::Instant::now(),
            interval: Duration::from_secs_f64(1.0 / f64::from(rate.max(1))),
            n: 0,
        }
    }

    async fn wait(&mut self) {
        tokio::time::sleep_until(self.start + self.interval * self.n).await;
        self.n = self.n.saturating_add(1);
    }
}
