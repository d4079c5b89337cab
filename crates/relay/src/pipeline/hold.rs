//! Outbox tables held because the brokers refuse a record's topic
//! (`dead_letter.refused_topic = "hold"`).
//!
//! When a record of table T is refused by its topic (missing while the brokers create no
//! topics, or not authorized, as the sink learns from their metadata before sending, or as a
//! produce response said in an earlier run: see the parent module), that
//! record and every later record of T are kept here, in binlog order, instead of being
//! produced; the other tables go on. The checkpoint never passes the first held row: the
//! pipeline caps its stored point at [`Holds::floor`], the point just before the oldest hold's
//! first row. Each held table is retried on the `[retry]` backoff ([`Holds::due`]); once its
//! topic accepts, its records are sent in order and the hold ends when the last of them is
//! acknowledged ([`Holds::released_acked`]), which lifts the floor.
//!
//! Nothing here outlives a run: a run that ends (a stop, a restart) resumes from a checkpoint at
//! or before the floor, so the held rows are read from the binlog again (and the other tables'
//! records after the floor are sent again: at-least-once duplicates).
//!
//! The number of held records of a source is bounded ([`Holds::full`]): the pipeline stops
//! reading the binlog when it is reached, never drops a record.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBuilder};

use super::acks::Done;
use outbox_relay_core::observe::metrics::Metrics;
use outbox_relay_core::observe::spans::RowSpan;
use outbox_relay_core::position::BinlogPosition;
use outbox_relay_core::sink::Record;
use outbox_relay_core::state::checkpoint::Checkpoint;

/// What a held table's settings are (`dead_letter.hold_max_records` and `[retry]`).
#[derive(Debug, Clone, Copy)]
pub struct HoldSettings {
    /// Most records held at once in one source (all tables); reading the binlog pauses there.
    pub max_records: usize,
    /// First delay before a held table is retried (`retry.initial_backoff_ms`).
    pub initial_backoff: Duration,
    /// Largest delay between two retries of a held table (`retry.max_backoff_ms`).
    pub max_backoff: Duration,
}

/// One held record: routed, not sent, with what its acknowledgement entry needs.
pub(super) struct Held {
    pub record: Record,
    /// Where its acknowledgement would move the checkpoint (not used to move it: a released
    /// record is acknowledged after later records, see [`Holds::released_acked`]).
    pub done: Done,
    /// `database.table` of its outbox.
    pub table: Arc<str>,
    /// End of the rows event that carried its row.
    pub position: BinlogPosition,
    /// Binlog event time of its row (s since the epoch).
    pub event_time: u32,
    pub read_at: Instant,
    /// Key, value and header bytes.
    pub bytes: u64,
    pub span: Option<Box<RowSpan>>,
    pub event_key: Option<Vec<u8>>,
}

/// One held table.
struct Hold {
    /// Names this hold in the acknowledgements of its released records.
    id: u64,
    table: Arc<str>,
    /// The topic last refused, and why (the broker's error with the fix).
    topic: Arc<str>,
    reason: String,
    /// The point just before the first held row (its transaction's boundary plus the rows
    /// before it in that transaction).
    floor: Checkpoint,
    /// Held records not sent yet, in binlog order.
    queue: VecDeque<Held>,
    /// Records sent on release and not acknowledged yet.
    released: usize,
    /// `true` while the table's new records are held; `false` once every held record was sent
    /// (the hold then only waits for their acknowledgements).
    holding: bool,
    next_try: Instant,
    backoff: Box<dyn Iterator<Item = Duration> + Send>,
    since: Instant,
}

/// A hold just started, for the pipeline's warning.
pub(super) struct Started<'a> {
    pub table: &'a str,
    pub topic: &'a str,
    pub reason: &'a str,
    pub floor: &'a Checkpoint,
}

/// A hold that ended (every held record acknowledged), for the pipeline's log.
pub(super) struct Ended {
    pub table: Arc<str>,
    pub topic: Arc<str>,
    pub held_for: Duration,
}

/// The held tables of one run. See the module documentation.
pub(super) struct Holds {
    settings: HoldSettings,
    /// In the order they started, which is binlog order: the first has the lowest floor.
    holds: Vec<Hold>,
    /// Records in every queue.
    held: usize,
    next_id: u64,
    metrics: Arc<Metrics>,
}

impl Holds {
    /// No table held yet.
    pub fn new(settings: HoldSettings, metrics: Arc<Metrics>) -> Self {
        Self {
            settings,
            holds: Vec::new(),
            held: 0,
            next_id: 0,
            metrics,
        }
    }

    fn backoff(&self) -> Box<dyn Iterator<Item = Duration> + Send> {
        Box::new(
            ExponentialBuilder::default()
                .with_min_delay(self.settings.initial_backoff)
                .with_max_delay(self.settings.max_backoff)
                .with_jitter()
                .without_max_times()
                .build(),
        )
    }

    /// `true` while any table is held or has released records not acknowledged yet.
    pub fn any(&self) -> bool {
        !self.holds.is_empty()
    }

    /// Records held now (every table).
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.held
    }

    /// `true` when as many records are held as `hold_max_records` allows: stop reading.
    pub fn full(&self) -> bool {
        self.held >= self.settings.max_records
    }

    /// `true` when records of `table` are held: its next record must be held too.
    pub fn holding(&self, table: &str) -> bool {
        self.holds.iter().any(|h| h.holding && *h.table == *table)
    }

    /// The point the checkpoint may not pass: just before the oldest hold's first row.
    pub fn floor(&self) -> Option<&Checkpoint> {
        self.holds.first().map(|h| &h.floor)
    }

    /// Starts holding `table` with `first`, refused by `topic` for `reason`; its first retry
    /// is one backoff delay after `now`.
    pub fn start(
        &mut self,
        topic: Arc<str>,
        reason: String,
        first: Held,
        now: Instant,
    ) -> Started<'_> {
        let mut backoff = self.backoff();
        let delay = backoff.next().unwrap_or(self.settings.max_backoff);
        let (base, row) = &first.done;
        let floor = Checkpoint {
            // The rows before it in its transaction; on resume, the held row is the first one
            // relayed again.
            rows_acked: row.saturating_sub(1),
            ..(**base).clone()
        };
        let id = self.next_id;
        self.next_id += 1;
        let table = Arc::clone(&first.table);
        self.metrics.hold_started();
        self.metrics.held_records(&table, 1);
        self.held += 1;
        self.holds.push(Hold {
            id,
            table,
            topic,
            reason,
            floor,
            queue: VecDeque::from([first]),
            released: 0,
            holding: true,
            next_try: now + delay,
            backoff,
            since: now,
        });
        self.publish();
        let h = &self.holds[self.holds.len() - 1];
        Started {
            table: &h.table,
            topic: &h.topic,
            reason: &h.reason,
            floor: &h.floor,
        }
    }

    /// Holds `held` behind the held records of its table. `false` (and `held` dropped) when
    /// its table is not held: call only after [`Holds::holding`].
    pub fn push(&mut self, held: Held) -> bool {
        let Some(h) = self
            .holds
            .iter_mut()
            .find(|h| h.holding && *h.table == *held.table)
        else {
            return false;
        };
        self.metrics.held_records(&h.table, 1);
        h.queue.push_back(held);
        self.held += 1;
        true
    }

    /// The earliest time a held table is to be retried.
    pub fn next_try(&self) -> Option<Instant> {
        self.holds
            .iter()
            .filter(|h| h.holding)
            .map(|h| h.next_try)
            .min()
    }

    /// A held table whose retry is due at `now`: its hold's id and the topic last refused.
    pub fn due(&self, now: Instant) -> Option<(u64, Arc<str>)> {
        self.holds
            .iter()
            .find(|h| h.holding && h.next_try <= now)
            .map(|h| (h.id, Arc::clone(&h.topic)))
    }

    fn by_id(&mut self, id: u64) -> Option<&mut Hold> {
        self.holds.iter_mut().find(|h| h.id == id)
    }

    /// The next record of hold `id` to release; `None` when its queue is empty, which ends the
    /// holding of its table (new records of it are sent as usual, after the released ones).
    pub fn pop(&mut self, id: u64) -> Option<Held> {
        let h = self.holds.iter_mut().find(|h| h.id == id)?;
        match h.queue.pop_front() {
            Some(held) => {
                self.held -= 1;
                self.metrics.held_records(&h.table, -1);
                Some(held)
            }
            None => {
                h.holding = false;
                self.publish();
                None
            }
        }
    }

    /// A record [`Holds::pop`]ped from hold `id` was sent.
    pub fn sent(&mut self, id: u64) {
        if let Some(h) = self.by_id(id) {
            h.released += 1;
        }
    }

    /// A record [`Holds::pop`]ped from hold `id` was refused again (by `topic`, for `reason`):
    /// it goes back first in line, and the table is retried after the next backoff delay.
    pub fn refused_again(
        &mut self,
        id: u64,
        held: Held,
        topic: Arc<str>,
        reason: String,
        now: Instant,
    ) {
        let max = self.settings.max_backoff;
        let Some(h) = self.holds.iter_mut().find(|h| h.id == id) else {
            return;
        };
        self.metrics.held_records(&h.table, 1);
        h.queue.push_front(held);
        h.holding = true;
        h.next_try = now + h.backoff.next().unwrap_or(max).min(max);
        h.topic = topic;
        h.reason = reason;
        self.held += 1;
        self.publish();
    }

    /// A released record of hold `id` was acknowledged. When it was the hold's last record,
    /// the hold ends (its floor no longer holds the checkpoint back) and is returned.
    pub fn released_acked(&mut self, id: u64, now: Instant) -> Option<Ended> {
        let h = self.by_id(id)?;
        h.released = h.released.saturating_sub(1);
        self.end_if_acked(id, now)
    }

    /// Ends hold `id` when all its records were released and acknowledged (their
    /// acknowledgements may all have come while it was still releasing).
    pub fn end_if_acked(&mut self, id: u64, now: Instant) -> Option<Ended> {
        let i = self.holds.iter().position(|h| h.id == id)?;
        let h = &self.holds[i];
        if h.holding || h.released > 0 || !h.queue.is_empty() {
            return None;
        }
        let h = self.holds.remove(i);
        self.publish();
        Some(Ended {
            table: h.table,
            topic: h.topic,
            held_for: now.saturating_duration_since(h.since),
        })
    }

    /// Shows the held tables in `/readyz`.
    fn publish(&self) {
        self.metrics.set_held(
            self.holds
                .iter()
                .filter(|h| h.holding)
                .map(|h| {
                    format!(
                        "{} ({} records, topic {}: {})",
                        h.table,
                        h.queue.len(),
                        h.topic,
                        h.reason
                    )
                })
                .collect(),
        );
    }
}

impl Drop for Holds {
    /// The run ends: what it held is read again by the next one, so it is no longer counted.
    fn drop(&mut self) {
        for h in &self.holds {
            let n = i64::try_from(h.queue.len()).unwrap_or(i64::MAX);
            self.metrics.held_records(&h.table, -n);
        }
        self.metrics.set_held(Vec::new());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(max_records: usize) -> HoldSettings {
        HoldSettings {
            max_records,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(400),
        }
    }

    fn base(pos: u64) -> Arc<Checkpoint> {
        Arc::new(Checkpoint {
            position: BinlogPosition::new("mariadb-bin.000001", pos),
            rows_acked: 0,
            gtid_set: None,
            source_server_id: 1,
            source_server_uuid: None,
            table_layouts: None,
        })
    }

    fn held(table: &str, pos: u64, row: u64) -> Held {
        Held {
            record: Record {
                topic: Arc::from("t.Order"),
                key: format!("{pos}-{row}").into_bytes(),
                value: None,
                headers: Vec::new(),
                partition: None,
                timestamp_ms: 0,
                column_timestamp: false,
                fallback_ms: None,
            },
            done: (base(pos), row),
            table: Arc::from(table),
            position: BinlogPosition::new("mariadb-bin.000001", pos + 50),
            event_time: 0,
            read_at: Instant::now(),
            bytes: 1,
            span: None,
            event_key: None,
        }
    }

    fn key(h: &Held) -> String {
        String::from_utf8_lossy(&h.record.key).into_owned()
    }

    #[test]
    fn a_hold_keeps_its_tables_records_in_order_and_the_floor_before_the_first() {
        let metrics = Arc::new(Metrics::new());
        let mut holds = Holds::new(settings(10), Arc::clone(&metrics));
        let now = Instant::now();
        assert!(!holds.any() && holds.floor().is_none() && !holds.holding("a.outbox"));
        let started = holds.start(
            "t.Order".into(),
            "missing".into(),
            held("a.outbox", 100, 3),
            now,
        );
        // Two rows of its transaction came before it: resume with the held row.
        assert_eq!(started.floor.position.pos, 100);
        assert_eq!(started.floor.rows_acked, 2);
        assert!(holds.holding("a.outbox") && !holds.holding("b.outbox"));
        assert!(holds.push(held("a.outbox", 200, 1)));
        assert!(holds.push(held("a.outbox", 300, 1)));
        assert!(!holds.push(held("b.outbox", 300, 2)), "b is not held");
        assert_eq!(holds.held(), 3);
        // Not due before its first backoff delay.
        assert!(holds.due(now).is_none());
        let at = holds.next_try().expect("a retry is planned");
        assert!(at > now && at <= now + Duration::from_millis(400));
        let (id, topic) = holds.due(at).expect("due then");
        assert_eq!(&*topic, "t.Order");
        // Released in order; the floor stays until every released record is acknowledged.
        let mut order = Vec::new();
        while let Some(h) = holds.pop(id) {
            order.push(key(&h));
            holds.sent(id);
        }
        assert_eq!(order, ["100-3", "200-1", "300-1"]);
        assert!(!holds.holding("a.outbox"), "new rows are sent as usual");
        assert_eq!(holds.held(), 0);
        assert!(holds.released_acked(id, at).is_none());
        assert!(holds.released_acked(id, at).is_none());
        assert_eq!(holds.floor().map(|f| f.position.pos), Some(100));
        let ended = holds.released_acked(id, at).expect("the last one ends it");
        assert_eq!(&*ended.table, "a.outbox");
        assert!(!holds.any() && holds.floor().is_none());
    }

    #[test]
    fn a_record_refused_again_goes_back_first_and_waits_for_the_next_delay() {
        let mut holds = Holds::new(settings(10), Arc::new(Metrics::new()));
        let now = Instant::now();
        holds.start(
            "t.Order".into(),
            "missing".into(),
            held("a.outbox", 1, 1),
            now,
        );
        holds.push(held("a.outbox", 2, 1));
        let (id, _) = holds.due(now + Duration::from_secs(1)).expect("due");
        let first = holds.pop(id).expect("first");
        holds.refused_again(id, first, "t.Order".into(), "still missing".into(), now);
        assert!(holds.holding("a.outbox"));
        assert_eq!(holds.held(), 2);
        assert!(holds.due(now).is_none(), "waits for the next delay");
        let next = holds.next_try().expect("planned");
        assert!(next > now && next <= now + Duration::from_millis(400));
        let (id, _) = holds.due(next).expect("due again");
        assert_eq!(holds.pop(id).map(|h| key(&h)).as_deref(), Some("1-1"));
        assert_eq!(holds.pop(id).map(|h| key(&h)).as_deref(), Some("2-1"));
    }

    #[test]
    fn the_oldest_hold_sets_the_floor_and_the_bound_counts_every_table() {
        let mut holds = Holds::new(settings(3), Arc::new(Metrics::new()));
        let now = Instant::now();
        holds.start("t.A".into(), "missing".into(), held("a.outbox", 10, 1), now);
        holds.start("t.B".into(), "denied".into(), held("b.outbox", 20, 1), now);
        assert!(!holds.full());
        holds.push(held("b.outbox", 30, 1));
        assert!(holds.full(), "three records held: reading pauses");
        assert_eq!(holds.floor().map(|f| f.position.pos), Some(10));
        // Table a released and acknowledged: the floor moves to b's first row.
        let later = now + Duration::from_secs(1);
        let a = holds
            .holds
            .iter()
            .find(|h| &*h.table == "a.outbox")
            .map(|h| h.id)
            .expect("a");
        let r = holds.pop(a).expect("a's record");
        holds.sent(a);
        drop(r);
        assert!(holds.pop(a).is_none());
        assert!(!holds.full());
        assert!(holds.released_acked(a, later).is_some());
        assert_eq!(holds.floor().map(|f| f.position.pos), Some(20));
        assert!(holds.holding("b.outbox"));
    }

    #[test]
    fn held_records_are_a_gauge_per_table() {
        let metrics = Arc::new(Metrics::new());
        metrics.table_rows("a.outbox");
        {
            let mut holds = Holds::new(settings(10), Arc::clone(&metrics));
            holds.start(
                "t.A".into(),
                "missing".into(),
                held("a.outbox", 1, 1),
                Instant::now(),
            );
            holds.push(held("a.outbox", 2, 1));
            let text = metrics.render();
            assert!(
                text.contains("outbox_relay_held_records{table=\"a.outbox\"} 2"),
                "{text}"
            );
            assert!(
                text.contains("outbox_relay_holds_started_total 1"),
                "{text}"
            );
        }
        // A run's end forgets what it held (the next run reads it again).
        let text = metrics.render();
        assert!(
            text.contains("outbox_relay_held_records{table=\"a.outbox\"} 0"),
            "{text}"
        );
    }
}
