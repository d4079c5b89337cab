//! The binlog read and decoded on a thread of its own, ahead of the pipeline.
//!
//! Reading the dump, parsing its events and decoding the outbox rows (binary JSON rendering
//! included) used to share the pipeline's task with routing and producing; draining MySQL the
//! pipeline thread held three quarters of the relay's CPU samples while a second core had room
//! (issue 30's profile). Here the [`EventSource`] and the [`Decoder`] move to a thread named
//! `binlog-reader` with a current-thread Tokio runtime, and the pipeline receives, in binlog
//! order, the events that carry outbox rows or end a transaction ([`DecodedEvent`]).
//!
//! A dedicated thread rather than a task of the relay's runtime: two tasks passing messages are
//! kept on one worker by Tokio's LIFO slot, which a second worker cannot steal from, so they
//! would take turns on one core instead of using two.
//!
//! # Bounds
//! The thread runs ahead of the pipeline by at most [`MAX_EVENTS_AHEAD`] events and about
//! [`MAX_BYTES_AHEAD`] bytes (an event's size, or its rows when larger: an `XA COMMIT`
//! carries its transaction's rows); a single larger event passes alone. Beyond,
//! it stops reading the dump until the pipeline takes the oldest: `kafka.max_in_flight` still
//! bounds what is unacknowledged, this what is decoded but not yet produced.
//!
//! While the pipeline takes nothing (`kafka.max_in_flight` records unacknowledged, or
//! `dead_letter.hold_max_records` held) it says so ([`ReadAhead::pause`]) and the thread stops
//! reading before its next event: heartbeats then stay unread too, so `/readyz` sees the stall
//! as it did when the pipeline read the dump itself.
//!
//! # Order of failures
//! An error of the source or the decoder reaches the pipeline after every event before it,
//! as it did when both ran in the pipeline's task. A thread that stops without saying why (a
//! panic) is an error too, never the end of the source.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};

use outbox_relay_core::error::RelayError;
use outbox_relay_core::observe::metrics::Metrics;
use outbox_relay_core::sink::Record;
use outbox_relay_mysql::binlog::EventSource;
use outbox_relay_mysql::decode::{DecodedRow, Decoder, TxBoundary};

/// Most events decoded and not yet taken by the pipeline: at 5,000 one-row transactions/s
/// (two events each: rows, commit), about 400 ms, longer than an exactly-once commit's stall.
pub const MAX_EVENTS_AHEAD: usize = 4096;

/// About the most bytes decoded and not yet taken by the pipeline (2 MiB; see [`room_for`]).
///
/// Why not more: 4 and 16 MiB were measured draining a MySQL backlog (issue 30, fifteen
/// drains each); the pipeline waited for the reader less often, but the drain's share of its
/// limit did not move beyond the runs' spread, and the drain's peak RSS rose from 58–64 MB to
/// 60–67 and 79–88 MB, past the bench's 64 MB target.
pub const MAX_BYTES_AHEAD: usize = 2 << 20;

/// The room a reader thread out of room waits for before it reads on: a quarter of
/// [`MAX_BYTES_AHEAD`] (about 50 rows events of a backlog of 500-byte payloads), so that it
/// wakes once per many events the pipeline takes.
const REFILL_AHEAD: u32 = (MAX_BYTES_AHEAD / 4) as u32;

/// What one decoded row costs besides its payload and key (its record's fields, headers and
/// allocations), counted against [`MAX_BYTES_AHEAD`].
const ROW_OVERHEAD: usize = 256;

/// One binlog event that carries outbox rows or ends a transaction, decoded. Events with
/// neither (table maps, other tables' rows, a transaction's start) are read and counted
/// (`outbox_relay_binlog_events_total`) on the reader thread, and not passed on.
pub struct DecodedEvent {
    /// The event's binlog timestamp, s since the epoch.
    pub timestamp: u32,
    /// When the reader thread read it (the start of the read → ack latency of its rows).
    pub read_at: Instant,
    /// Its outbox rows, in binlog order.
    pub rows: Vec<DecodedRow>,
    /// The transaction boundary it ends with.
    pub boundary: Option<TxBoundary>,
    /// After it, the decoder is inside a transaction (or holds undecided XA transactions).
    pub in_transaction: bool,
    /// After it: prepared XA transactions whose outcome was not read yet.
    pub undecided_xa: usize,
    /// Its share of [`MAX_BYTES_AHEAD`], returned when the event is dropped.
    _room: OwnedSemaphorePermit,
}

enum Item {
    Event(DecodedEvent),
    /// The source has no more events (the end of the last binlog file).
    End,
    Failed(RelayError),
}

/// The receiving end: the pipeline's source of decoded events.
pub struct ReadAhead<E> {
    events: mpsc::Receiver<Item>,
    /// Set once the source ended or failed: nothing more comes.
    over: bool,
    /// The source and the decoder, handed back when the thread ends.
    back: oneshot::Receiver<(E, Decoder)>,
    /// `true` while the pipeline takes nothing: the thread reads no further.
    paused: watch::Sender<bool>,
    /// Where [`Spent`] sends sent records' buffers back to the thread.
    spent: std::sync::mpsc::Sender<Vec<Vec<u8>>>,
}

impl<E: EventSource + Send + 'static> ReadAhead<E> {
    /// Starts the reader thread with `source` and `decoder`.
    ///
    /// # Errors
    /// [`RelayError::Binlog`] when the operating system refuses a thread or the thread's
    /// runtime cannot start.
    pub fn start(source: E, decoder: Decoder, metrics: Arc<Metrics>) -> Result<Self, RelayError> {
        let (tx, events) = mpsc::channel(MAX_EVENTS_AHEAD);
        let (give_back, back) = oneshot::channel();
        let (paused, pause) = watch::channel(false);
        let (spent, to_free) = std::sync::mpsc::channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| RelayError::binlog(format!("cannot start the binlog reader: {e}")))?;
        std::thread::Builder::new()
            .name("binlog-reader".to_owned())
            .spawn(move || {
                let parts = runtime.block_on(read(source, decoder, tx, pause, metrics, to_free));
                // Nobody waiting (the run is over): dropped here.
                let _ = give_back.send(parts);
            })
            .map_err(|e| RelayError::binlog(format!("cannot start the binlog reader: {e}")))?;
        Ok(Self {
            events,
            over: false,
            back,
            paused,
            spent,
        })
    }

    /// Where the pipeline puts the records it handed to the producer, so that their buffers
    /// are freed on this thread, which allocated them.
    pub fn spent(&self) -> Spent {
        Spent {
            buffers: Vec::with_capacity(SPENT_BATCH),
            back: Some(self.spent.clone()),
        }
    }

    /// The next decoded event; `Ok(None)` once the source ended (and forever after).
    /// Cancel-safe: an event is only taken by a call that returns it.
    ///
    /// # Errors
    /// The source's or the decoder's error, after every event before it; a
    /// [`RelayError::Binlog`] when the reader thread stopped without one.
    pub async fn next(&mut self) -> Result<Option<DecodedEvent>, RelayError> {
        if self.over {
            return Ok(None);
        }
        match self.events.recv().await {
            Some(Item::Event(e)) => Ok(Some(e)),
            Some(Item::End) => {
                self.over = true;
                Ok(None)
            }
            Some(Item::Failed(e)) => {
                self.over = true;
                Err(e)
            }
            None => {
                self.over = true;
                Err(RelayError::binlog(
                    "the binlog reader thread stopped unexpectedly (see the panic message \
                     above); the run restarts from its checkpoint",
                ))
            }
        }
    }

    /// `true`: the pipeline takes nothing for now, so the thread stops before its next event
    /// (what it decoded already stays queued); `false`: it reads on.
    pub fn pause(&self, paused: bool) {
        self.paused
            .send_if_modified(|p| std::mem::replace(p, paused) != paused);
    }

    /// Stops the reader thread and returns the source and the decoder (`None` when the thread
    /// did not end within `wait`, or panicked). The live dump's connection closes with it.
    pub async fn close(self, wait: Duration) -> Option<(E, Decoder)> {
        // The thread sees the channel closed, whether reading, decoding or waiting for room.
        drop(self.events);
        tokio::time::timeout(wait, self.back).await.ok()?.ok()
    }
}

/// The reader thread's loop: reads, decodes and passes on until the source ends or fails, or
/// the pipeline closes the channel; returns the source and the decoder.
async fn read<E: EventSource>(
    mut source: E,
    mut decoder: Decoder,
    tx: mpsc::Sender<Item>,
    mut pause: watch::Receiver<bool>,
    metrics: Arc<Metrics>,
    to_free: std::sync::mpsc::Receiver<Vec<Vec<u8>>>,
) -> (E, Decoder) {
    let room = Arc::new(Semaphore::new(MAX_BYTES_AHEAD));
    loop {
        // Freed here, where they were allocated (see `Spent`).
        while let Ok(buffers) = to_free.try_recv() {
            drop(buffers);
        }
        if *pause.borrow_and_update() {
            tokio::select! {
                biased;
                () = tx.closed() => break,
                resumed = pause.wait_for(|p| !p) => if resumed.is_err() { break },
            }
        }
        let next = tokio::select! {
            biased;
            () = tx.closed() => break,
            next = source.next_event() => next,
        };
        let event = match next {
            Ok(Some(event)) => event,
            Ok(None) => {
                let _ = tx.send(Item::End).await;
                break;
            }
            Err(e) => {
                let _ = tx.send(Item::Failed(e)).await;
                break;
            }
        };
        let read_at = Instant::now();
        metrics.event_read(event.dated_at());
        let (rows, boundary) = match decoder.decode(&event, |id| source.table_map(id)) {
            Ok(decoded) => decoded.into_parts(),
            Err(e) => {
                let _ = tx.send(Item::Failed(e)).await;
                break;
            }
        };
        if rows.is_empty() && boundary.is_none() {
            continue;
        }
        let permits = room_for(&rows, event.event.header().event_size() as usize);
        let room = tokio::select! {
            biased;
            () = tx.closed() => break,
            room = take_room(&room, permits) => room,
        };
        let (undecided_xa, _) = decoder.undecided_xa();
        let item = Item::Event(DecodedEvent {
            timestamp: event.timestamp,
            read_at,
            rows,
            boundary,
            in_transaction: decoder.in_transaction(),
            undecided_xa,
            _room: room,
        });
        if tx.send(item).await.is_err() {
            break;
        }
    }
    (source, decoder)
}

/// Buffers a [`Spent`] sends back to the reader thread at once.
const SPENT_BATCH: usize = 1024;

/// Sent records' byte buffers on their way back to the reader thread, which frees them
/// before its next event ([`ReadAhead::spent`]).
///
/// Why: the reader thread allocates a row's key, value and header values; freed on the
/// pipeline's thread, each was a cross-thread free, which mimalloc queues on the page and the
/// allocating thread collects later. Draining a backlog, those frees and their collection were
/// about a tenth of each thread's CPU (issue 30's profile). A batch of buffers costs the
/// pipeline's thread one push each and one send per [`SPENT_BATCH`]. Buffers of other
/// threads (a JSON envelope's value) may come along; they are freed as before, from
/// another thread.
#[derive(Default)]
pub struct Spent {
    buffers: Vec<Vec<u8>>,
    /// `None`: freed in place (no reader thread, or it ended).
    back: Option<std::sync::mpsc::Sender<Vec<Vec<u8>>>>,
}

impl Spent {
    /// Takes `record`'s key, value and header values (after it was handed to the producer).
    pub fn put(&mut self, record: Record) {
        let Some(back) = &self.back else { return };
        let Record {
            key,
            value,
            headers,
            ..
        } = record;
        // Sent back before this record's buffers would outgrow the batch: growing it copied
        // the whole batch, about 2 % of the pipeline thread draining a backlog.
        let more = 2 + headers.len();
        if !self.buffers.is_empty()
            && self.buffers.len() + more > self.buffers.capacity().max(SPENT_BATCH)
        {
            let full = std::mem::replace(&mut self.buffers, Vec::with_capacity(SPENT_BATCH));
            if back.send(full).is_err() {
                // The thread ended: free them here from now on.
                self.back = None;
                return;
            }
        }
        self.buffers.push(key);
        self.buffers.extend(value);
        self.buffers
            .extend(headers.into_iter().filter_map(|(_, v)| v));
    }
}

/// Takes `permits` of `room`: at once when they are free; else once [`REFILL_AHEAD`] (or
/// `permits`, when more) are, the rest going back at once for the events read next.
///
/// Why not only `permits`: woken at each event the pipeline took, the reader thread and the
/// pipeline's took turns, a wake-up and a context switch per event on both (issue 30's
/// profile: an eighth of the pipeline thread's samples while draining a backlog).
async fn take_room(room: &Arc<Semaphore>, permits: u32) -> OwnedSemaphorePermit {
    if let Ok(taken) = Arc::clone(room).try_acquire_many_owned(permits) {
        return taken;
    }
    let want = permits.max(REFILL_AHEAD);
    let Ok(mut taken) = Arc::clone(room).acquire_many_owned(want).await else {
        // Never closed: wait for the pipeline to close the channel instead.
        return std::future::pending().await;
    };
    drop(taken.split((want - permits) as usize));
    taken
}

/// The share of [`MAX_BYTES_AHEAD`] an event of `event_size` bytes with `rows` holds: its rows'
/// payloads and keys plus [`ROW_OVERHEAD`] each, or the event's size when larger (a few rows
/// of a large event), at least 1 and at most the whole budget (a larger event passes alone).
fn room_for(rows: &[DecodedRow], event_size: usize) -> u32 {
    let bytes = rows
        .iter()
        .map(|r| {
            ROW_OVERHEAD
                + match r {
                    Ok(e) => e.payload.as_ref().map_or(0, Vec::len) + e.aggregate_id.len(),
                    Err(f) => f.value.as_ref().map_or(0, Vec::len),
                }
        })
        .sum::<usize>()
        .max(event_size)
        .clamp(1, MAX_BYTES_AHEAD);
    // MAX_BYTES_AHEAD < u32::MAX.
    u32::try_from(bytes).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    use outbox_relay_core::config::TableName;
    use outbox_relay_mysql::binlog::source::SourceEvent;
    use outbox_relay_mysql::binlog::TableMapEvent;

    /// A source that ends, fails or panics on its first read.
    enum Scripted {
        Ends,
        Fails,
        Panics,
    }

    impl EventSource for Scripted {
        async fn next_event(&mut self) -> Result<Option<SourceEvent>, RelayError> {
            match self {
                Self::Ends => Ok(None),
                Self::Fails => Err(RelayError::mysql("the server went away")),
                Self::Panics => panic!("a scripted panic of the reader thread"),
            }
        }

        fn table_map(&self, _: u64) -> Option<&TableMapEvent<'static>> {
            None
        }
    }

    fn decoder() -> Decoder {
        Decoder::new(
            Vec::new(),
            TableName {
                database: "relay".into(),
                table: "checkpoint".into(),
            },
            None,
        )
    }

    fn metrics() -> Arc<Metrics> {
        Arc::new(Metrics::new())
    }

    #[test]
    fn an_event_holds_its_size_or_its_rows_within_the_budget() {
        assert_eq!(room_for(&[], 0), 1);
        assert_eq!(room_for(&[], 8_000), 8_000);
        let failure = |value: usize| -> DecodedRow {
            Err(Box::new(outbox_relay_mysql::decode::RowFailure {
                error: RelayError::binlog("unreadable"),
                key: None,
                value: Some(vec![b'x'; value]),
                headers: Vec::new(),
            }))
        };
        // Two rows of 1,000 bytes: 2 × (1,000 + overhead), more than the 900-byte event.
        assert_eq!(
            room_for(&[failure(1_000), failure(1_000)], 900),
            2 * (1_000 + ROW_OVERHEAD as u32)
        );
        assert_eq!(
            room_for(&[failure(MAX_BYTES_AHEAD)], 10),
            MAX_BYTES_AHEAD as u32
        );
    }

    fn record(n: u8) -> Record {
        Record {
            topic: Arc::from("orders"),
            key: vec![n],
            value: Some(vec![n; 3]),
            headers: vec![
                (Arc::from("id"), Some(vec![n; 2])),
                (Arc::from("none"), None),
            ],
            partition: None,
            timestamp_ms: 0,
            column_timestamp: false,
            fallback_ms: None,
        }
    }

    #[test]
    fn spent_buffers_go_back_in_batches_and_are_freed_in_place_once_nobody_takes_them() {
        let (back, to_free) = std::sync::mpsc::channel();
        let mut spent = Spent {
            buffers: Vec::with_capacity(SPENT_BATCH),
            back: Some(back),
        };
        // Three buffers per record (key, value, the header with a value), four counted ahead
        // (key, value, two headers): a batch goes back when the next record's might not fit.
        let per_batch = (SPENT_BATCH - 4) / 3 + 1;
        for i in 0..per_batch {
            spent.put(record(u8::try_from(i % 200).expect("small")));
        }
        assert!(
            to_free.try_recv().is_err(),
            "nothing goes back before a batch is full"
        );
        spent.put(record(7));
        let batch = to_free.try_recv().expect("a full batch");
        assert_eq!(batch.len(), per_batch * 3);
        assert_eq!(batch.capacity(), SPENT_BATCH, "the batch never grew");
        assert_eq!(&batch[..3], &[vec![0], vec![0; 3], vec![0; 2]]);
        assert_eq!(spent.buffers, [vec![7], vec![7; 3], vec![7; 2]]);
        // The reader thread ended: the next full batch is freed here, and so is the rest.
        drop(to_free);
        for _ in 0..2 * per_batch {
            spent.put(record(1));
        }
        assert!(spent.back.is_none());
        assert!(spent.buffers.len() < SPENT_BATCH);
    }

    #[tokio::test]
    async fn a_reader_out_of_room_waits_for_a_quarter_of_the_budget() {
        let room = Arc::new(Semaphore::new(MAX_BYTES_AHEAD));
        // Room to spare: taken at once.
        let first = take_room(&room, 1_000).await;
        assert_eq!(room.available_permits(), MAX_BYTES_AHEAD - 1_000);
        let rest = Arc::clone(&room)
            .try_acquire_many_owned(u32::try_from(MAX_BYTES_AHEAD - 1_000).expect("fits"))
            .expect("the rest of the budget");
        // Out of room: the event's share alone freed is not enough to read on.
        let waiting = tokio::spawn({
            let room = Arc::clone(&room);
            async move { take_room(&room, 1_000).await }
        });
        // (The test's runtime has one thread: the spawned reader runs at each yield.)
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "taken without room");
        drop(first);
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!waiting.is_finished(), "woken by one event's share");
        // A quarter of the budget freed: it takes its share and gives the rest back.
        drop(rest);
        let taken = waiting.await.expect("the waiting reader");
        assert_eq!(taken.num_permits(), 1_000);
        assert_eq!(room.available_permits(), MAX_BYTES_AHEAD - 1_000);
        // An event larger than a quarter waits for its own share.
        let all = Arc::clone(&room)
            .try_acquire_many_owned(u32::try_from(MAX_BYTES_AHEAD - 1_000).expect("fits"))
            .expect("the budget");
        drop(taken);
        let big = REFILL_AHEAD + 5;
        let waiting = tokio::spawn({
            let room = Arc::clone(&room);
            async move { take_room(&room, big).await }
        });
        drop(all);
        let taken = waiting.await.expect("the waiting reader");
        assert_eq!(taken.num_permits(), big as usize);
        assert_eq!(room.available_permits(), MAX_BYTES_AHEAD - big as usize);
    }

    #[tokio::test]
    async fn a_source_that_ends_ends_the_stream_and_comes_back() {
        let mut ahead =
            ReadAhead::start(Scripted::Ends, decoder(), metrics()).expect("the reader starts");
        assert!(ahead.next().await.expect("no error").is_none());
        assert!(
            ahead.next().await.expect("no error").is_none(),
            "ended stays ended"
        );
        let back = ahead.close(Duration::from_secs(10)).await;
        assert!(matches!(back, Some((Scripted::Ends, _))));
    }

    #[tokio::test]
    async fn a_source_error_reaches_the_pipeline() {
        let mut ahead =
            ReadAhead::start(Scripted::Fails, decoder(), metrics()).expect("the reader starts");
        let err = ahead.next().await.err().expect("the source's error");
        assert!(err.to_string().contains("the server went away"), "{err}");
    }

    #[tokio::test]
    async fn a_reader_thread_that_panics_is_an_error_not_the_end() {
        let mut ahead =
            ReadAhead::start(Scripted::Panics, decoder(), metrics()).expect("the reader starts");
        let err = ahead.next().await.err().expect("an error, not Ok(None)");
        assert!(err.to_string().contains("stopped unexpectedly"), "{err}");
        assert!(ahead.close(Duration::from_secs(10)).await.is_none());
    }
}
