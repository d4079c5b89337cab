//! The acknowledgement queue: every produced record and every transaction boundary in binlog
//! order, each resolved by its delivery report, taken out only after everything before it.
//!
//! Entry `i` of the queue is the record sent with sequence number `first_seq + i` (boundaries
//! take a number too, and are resolved from the start). Serving librdkafka's queue files
//! delivery reports by number in [`Deliveries`]; [`AckQueue::next`] serves it, applies them and yields
//! [`Ack`]s in order. A record Kafka refuses for good at delivery time is sent to the
//! dead-letter topic under the same number, so its place in the order holds until the dead
//! letter is acknowledged.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{refused_too, Ack, RowRef};
use outbox_relay_core::error::RelayError;
use outbox_relay_core::observe::audit::{self, AckAudit, RecordTimes};
use outbox_relay_core::observe::metrics::{self, DeadLetterKind, Metrics};
use outbox_relay_core::observe::spans::RowSpan;
use outbox_relay_core::position::BinlogPosition;
use outbox_relay_core::sink::{
    DeadLetter, Delivered, Deliveries, DeliveryReport, RecordSink, SendError,
};
use outbox_relay_core::state::checkpoint::Checkpoint;
use outbox_relay_kafka::sink::{ReadBack, ReadBackRequest, ReadBackResult};

/// Where a record entry's acknowledgement moves the checkpoint: the boundary before its
/// transaction plus its index in the transaction.
pub(super) type Done = (Arc<Checkpoint>, u64);

/// What an acknowledged or refused record needs later: metrics, and its dead letter.
pub(super) struct RecordInfo {
    pub topic: Arc<str>,
    /// Key, value and header bytes (`bytes_produced_total`).
    pub bytes: u64,
    /// Binlog event time of its row (s since the epoch).
    pub event_time: u32,
    pub read_at: Instant,
    /// End of the rows event that carried its row.
    pub position: BinlogPosition,
    /// `database.table` of its outbox.
    pub table: Arc<str>,
    /// Sent alone: everything before it was acknowledged first and nothing after it is sent
    /// before its report (so a refusal of its batch is its own).
    pub alone: bool,
    /// The row's OpenTelemetry span (`[tracing]`), ended by the record's report.
    pub span: Option<Box<RowSpan>>,
    /// The row's event_key, kept only with the acknowledgement audit on.
    pub event_key: Option<Vec<u8>>,
    /// A held record released by hold `.0` (sent after later records): its acknowledgement
    /// does not move the checkpoint ([`Ack::Released`]), and a refusal is not dead-lettered
    /// here (the run ends and the next one starts before it).
    pub released: Option<u64>,
    /// When it was handed to the producer; only with `[audit] timings`.
    pub sent_at: Option<Instant>,
}

/// A record whose batch the broker refused for good, after which the producer stopped
/// (`enable.gapless.guarantee`): the first one reported in this run.
pub(super) struct FatalRefusal {
    /// The row.
    pub row: RowRef,
    /// Sent alone (see [`RecordInfo::alone`]): the refusal is the row's own.
    pub alone: bool,
    pub reason: String,
    pub broker_error: String,
    /// The value may go into its dead letter (its size was not the problem).
    pub keep_value: bool,
    pub position: BinlogPosition,
    pub table: Arc<str>,
    /// Recorded because the refusal failed the sink's open commit
    /// ([`AckQueue::refusal_fails_commit`]): the producer may have no fatal error to name.
    pub failed_commit: bool,
    /// The record's topic.
    pub topic: Arc<str>,
    /// The topic is what was refused (not authorized, missing), not the record.
    pub topic_refused: bool,
}

/// A record's delivery outcome as its entry keeps it: an acknowledgement inline, a refusal or
/// an error (rare) boxed. Inline, the refusal's fields made every entry 304 bytes, copied into
/// and out of the queue for every record on the pipeline's thread.
enum Outcome {
    Acked(i32, i64),
    Other(Box<Result<Delivered, RelayError>>),
}

impl Outcome {
    fn of(outcome: Result<Delivered, RelayError>) -> Self {
        match outcome {
            Ok(Delivered::Acked(partition, offset)) => Self::Acked(partition, offset),
            other => Self::Other(Box::new(other)),
        }
    }

    fn into_result(self) -> Result<Delivered, RelayError> {
        match self {
            Self::Acked(partition, offset) => Ok(Delivered::Acked(partition, offset)),
            Self::Other(outcome) => *outcome,
        }
    }
}

enum Entry {
    Boundary(Arc<Checkpoint>, bool),
    Record {
        done: Done,
        info: RecordInfo,
        outcome: Option<Outcome>,
    },
    DeadLetter {
        done: Done,
        dl: Box<DeadLetter>,
        /// Enqueued already (false: refused at delivery, its dead letter still to be sent).
        sent: bool,
        outcome: Option<Outcome>,
        /// The row's OpenTelemetry span, ended by the dead letter's report.
        span: Option<Box<RowSpan>>,
    },
}

/// The acknowledgement queue of one pipeline run. See the module documentation.
pub(super) struct AckQueue {
    /// The source's metrics.
    metrics: Arc<Metrics>,
    entries: VecDeque<Entry>,
    /// Sequence number of `entries[0]`.
    first_seq: u64,
    deliveries: Arc<Deliveries>,
    has_dead_letter: bool,
    /// A record refused at delivery takes the records sent with it since the sink's last
    /// commit down ([`crate::sink::DeliveryMode::refusal_fails_commit`]): it is not
    /// dead-lettered in their place, the run ends as after the producer's fatal error.
    refusal_fails_commit: bool,
    /// Scratch space for taking reports.
    reports: Vec<DeliveryReport>,
    /// Entries refused at delivery whose dead letter is not enqueued yet.
    unsent: usize,
    /// The acknowledgement series, counted here and flushed after each batch of reports.
    tally: metrics::AckTally,
    /// The first record refused by a broker in a way that stopped the producer.
    pub fatal_refusal: Option<FatalRefusal>,
    /// `[audit]`: where each acknowledgement is written, and the lines of the current batch.
    audit: Option<(Arc<AckAudit>, String)>,
    /// Proves the first acknowledgement of each partition new to the process by reading it
    /// back ([`ReadBack`]); `None` in unit tests.
    read_back: Option<Arc<ReadBack>>,
    /// The (topic, partition) of the last acknowledgement asked about at `read_back`: the next
    /// ones there need not take its lock (runs of one partition are the common case; the router
    /// shares one `Arc` per topic run).
    last_asked: Option<(Arc<str>, i32)>,
    /// Entries whose acknowledgement waits for its read-back, and scratch space for results.
    awaiting: usize,
    read_backs: Vec<ReadBackResult>,
}

impl AckQueue {
    /// An empty queue for `sink`'s records; with `audit`, each acknowledgement is written
    /// there; with `read_back`, the first acknowledgement of each partition new to the process
    /// counts only once read back.
    pub fn new(
        sink: &impl RecordSink,
        audit: Option<Arc<AckAudit>>,
        read_back: Option<Arc<ReadBack>>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            tally: metrics.ack_tally(),
            metrics,
            entries: VecDeque::new(),
            first_seq: 0,
            deliveries: Arc::clone(sink.deliveries()),
            has_dead_letter: sink.has_dead_letter(),
            refusal_fails_commit: sink.delivery_mode().refusal_fails_commit(),
            reports: Vec::new(),
            unsent: 0,
            fatal_refusal: None,
            audit: audit.map(|a| (a, String::new())),
            read_back,
            last_asked: None,
            awaiting: 0,
            read_backs: Vec::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The sequence number the next pushed entry gets: send the record with it, then push.
    pub fn next_seq(&self) -> u64 {
        self.first_seq + self.entries.len() as u64
    }

    /// A transaction boundary (resolved at once).
    pub fn push_boundary(&mut self, base: Arc<Checkpoint>, advances: bool) {
        self.entries.push_back(Entry::Boundary(base, advances));
    }

    /// A record just sent with [`AckQueue::next_seq`].
    pub fn push_record(&mut self, done: Done, info: RecordInfo) {
        self.entries.push_back(Entry::Record {
            done,
            info,
            outcome: None,
        });
    }

    /// A dead letter just sent with [`AckQueue::next_seq`], with its row's span.
    pub fn push_dead_letter(&mut self, done: Done, dl: DeadLetter, span: Option<Box<RowSpan>>) {
        self.entries.push_back(Entry::DeadLetter {
            done,
            dl: Box::new(dl),
            sent: true,
            outcome: None,
            span,
        });
    }

    /// The next acknowledgement in order, waiting for delivery reports as needed; `None` when
    /// the queue is empty. Cancel-safe: state only changes in `self`, before each wait.
    pub async fn next(&mut self, sink: &impl RecordSink) -> Option<Ack> {
        loop {
            if let Some(ack) = self.pop_ready() {
                return Some(ack);
            }
            if self.entries.is_empty() {
                return None;
            }
            sink.serve();
            // librdkafka raises its fatal error before it files the refused batch's reports.
            // A refusal that fails the open commit ends the run as a fatal error does.
            self.apply_reports(sink.fatal().is_some() || self.refusal_fails_commit);
            self.apply_read_backs();
            if self.front_ready() {
                continue;
            }
            if self.unsent > 0 {
                // Its first record waits for the topic's partition leaders (KafkaSink::ensure_topic);
                // a failure here shows again as a send error.
                let _ = sink.ensure_dead_letter_topic().await;
            }
            if self.unsent > 0 && !self.send_dead_letters(sink) {
                // librdkafka's queue is full: its deliveries make room.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            match &self.read_back {
                Some(read_back) if self.awaiting > 0 => {
                    tokio::select! {
                        () = sink.events() => {}
                        () = read_back.ready() => {}
                    }
                }
                _ => sink.events().await,
            }
        }
    }

    /// Files the read-backs that finished under their entries: the acknowledgement, or (the
    /// record is not at its offset) an error that ends the run, whose next one sends it again.
    fn apply_read_backs(&mut self) {
        let Some(read_back) = &self.read_back else {
            return;
        };
        if self.awaiting == 0 {
            return;
        }
        read_back.take(&mut self.read_backs);
        for (request, verdict) in self.read_backs.drain(..) {
            let Some(Entry::Record {
                outcome: slot @ None,
                ..
            }) = request
                .seq
                .checked_sub(self.first_seq)
                .and_then(|i| usize::try_from(i).ok())
                .and_then(|i| self.entries.get_mut(i))
            else {
                continue;
            };
            self.awaiting = self.awaiting.saturating_sub(1);
            *slot = Some(match verdict {
                Ok(()) => Outcome::Acked(request.partition, request.offset),
                Err(why) => {
                    read_back.forget(&request.topic, request.partition);
                    self.last_asked = None;
                    tracing::error!(topic = %request.topic, partition = request.partition,
                        offset = request.offset, %why,
                        "Kafka acknowledged a record that is not in its log");
                    Outcome::of(Err(RelayError::kafka(format!(
                        "Kafka acknowledged the record at {} partition {} offset {}, but reading \
                         it back found {why}: it is sent again from the last checkpoint",
                        request.topic, request.partition, request.offset
                    ))))
                }
            });
        }
    }

    /// The next acknowledgement in order when its delivery report is already filed; `None`
    /// otherwise (nothing waits and the producer is not served: see [`AckQueue::next`]).
    pub fn next_ready(&mut self) -> Option<Ack> {
        self.pop_ready()
    }

    fn front_ready(&self) -> bool {
        match self.entries.front() {
            Some(Entry::Boundary(..)) => true,
            Some(Entry::Record { outcome, .. } | Entry::DeadLetter { outcome, .. }) => {
                outcome.is_some()
            }
            None => false,
        }
    }

    fn pop_ready(&mut self) -> Option<Ack> {
        if !self.front_ready() {
            return None;
        }
        let entry = self.entries.pop_front()?;
        self.first_seq += 1;
        Some(match entry {
            Entry::Boundary(base, advances) => Ack::Boundary(base, advances),
            Entry::Record {
                info:
                    RecordInfo {
                        released: Some(hold),
                        topic,
                        position,
                        ..
                    },
                outcome,
                ..
            } => Ack::Released(
                hold,
                match outcome?.into_result() {
                    Ok(Delivered::Acked(..)) => Ok(()),
                    Ok(Delivered::Refused { reason, .. }) => Err(RelayError::kafka(format!(
                        "a released held record (at {position}) was refused by topic {topic}: \
                         {reason}; the relay resumes from its checkpoint, before the held rows"
                    ))),
                    Err(e) => Err(e),
                },
            ),
            Entry::Record {
                done,
                info,
                outcome,
            } => Ack::Record(match outcome?.into_result() {
                Ok(Delivered::Acked(..)) => Ok(done),
                // Refused with a dead-letter topic became a DeadLetter entry when applied.
                Ok(Delivered::Refused { reason, .. }) => Err(RelayError::Row {
                    position: info.position,
                    table: info.table.to_string(),
                    reason,
                }),
                Err(e) => Err(e),
            }),
            Entry::DeadLetter {
                done, dl, outcome, ..
            } => Ack::Record(match outcome?.into_result() {
                Ok(Delivered::Acked(..)) => Ok(done),
                Ok(Delivered::Refused { reason, .. }) => Err(refused_too(&dl, &reason)),
                Err(e) => Err(e),
            }),
        })
    }

    /// Files the delivery reports that arrived under their entries. `fatal`: the producer has
    /// stopped (no dead letter can be sent with it).
    fn apply_reports(&mut self, fatal: bool) {
        self.deliveries.take_into(&mut self.reports);
        if self.reports.is_empty() {
            return;
        }
        let clock = metrics::AckClock::now();
        // `[audit] timings`: the wall clock of this batch of reports.
        let wall = self
            .audit
            .as_ref()
            .filter(|(a, _)| a.timings())
            .map(|_| (Instant::now(), audit::unix_micros()));
        for (seq, outcome) in self.reports.drain(..) {
            let Some(entry) = seq
                .checked_sub(self.first_seq)
                .and_then(|i| usize::try_from(i).ok())
                .and_then(|i| self.entries.get_mut(i))
            else {
                continue; // not of this queue (cannot happen: one sink per run)
            };
            match entry {
                Entry::Record {
                    done,
                    info,
                    outcome: slot @ None,
                } => match outcome {
                    Ok(Delivered::Acked(partition, offset)) => {
                        if let Some(span) = info.span.take() {
                            span.acked(partition, offset);
                        }
                        if let Some((_, lines)) = &mut self.audit {
                            let key = info.event_key.as_deref().map(String::from_utf8_lossy);
                            let times =
                                wall.zip(info.sent_at)
                                    .map(|((now, now_us), sent)| RecordTimes {
                                        read_us: audit::wall_micros(info.read_at, now, now_us),
                                        sent_us: audit::wall_micros(sent, now, now_us),
                                        acked_us: now_us,
                                    });
                            AckAudit::record(
                                lines,
                                &info.topic,
                                partition,
                                offset,
                                key.as_deref(),
                                &info.position,
                                times,
                            );
                        }
                        self.tally.acked(
                            &self.metrics,
                            &info.topic,
                            info.bytes,
                            info.event_time,
                            info.read_at,
                            &clock,
                        );
                        let prove = match &self.read_back {
                            Some(_)
                                if self.last_asked.as_ref().is_some_and(|(t, p)| {
                                    *p == partition && Arc::ptr_eq(t, &info.topic)
                                }) =>
                            {
                                None
                            }
                            Some(read_back) => {
                                self.last_asked = Some((Arc::clone(&info.topic), partition));
                                read_back
                                    .needs_proof(&info.topic, partition)
                                    .then_some(read_back)
                            }
                            None => None,
                        };
                        match prove {
                            Some(read_back) => {
                                // Held until read back (see `apply_read_backs`).
                                read_back.request(ReadBackRequest {
                                    seq,
                                    topic: Arc::clone(&info.topic),
                                    partition,
                                    offset,
                                });
                                self.awaiting += 1;
                            }
                            _ => *slot = Some(Outcome::Acked(partition, offset)),
                        }
                    }
                    Ok(Delivered::Refused {
                        reason,
                        broker_error,
                        value,
                        topic_refused,
                        ..
                    }) if fatal => {
                        // Its batch was refused and the producer stopped: the run ends, and the
                        // pipeline finds out which row it was (see `Refusals`).
                        if let Some(span) = info.span.take() {
                            span.failed(&reason);
                        }
                        if self.fatal_refusal.is_none() {
                            self.fatal_refusal = Some(FatalRefusal {
                                row: RowRef::of(done),
                                alone: info.alone,
                                reason: reason.clone(),
                                broker_error,
                                keep_value: value.is_some(),
                                position: info.position.clone(),
                                table: Arc::clone(&info.table),
                                failed_commit: self.refusal_fails_commit,
                                topic: Arc::clone(&info.topic),
                                topic_refused,
                            });
                        }
                        *slot = Some(Outcome::of(Err(RelayError::kafka(format!(
                            "the broker refused a batch for good, which stopped the producer: \
                             {reason}"
                        )))));
                    }
                    Ok(Delivered::Refused {
                        reason,
                        broker_error,
                        key,
                        value,
                        headers,
                        value_dropped,
                        ..
                    }) if self.has_dead_letter && info.released.is_none() => {
                        let dl = DeadLetter {
                            reason,
                            position: info.position.clone(),
                            table: info.table.to_string(),
                            topic: Some(info.topic.to_string()),
                            key,
                            value,
                            headers,
                            broker_error: Some(broker_error),
                            value_dropped,
                        };
                        tracing::warn!(reason = %dl.reason, position = %dl.position, table = %dl.table, "record refused by Kafka; sent to the dead-letter topic");
                        self.metrics.dead_lettered(DeadLetterKind::Broker);
                        *entry = Entry::DeadLetter {
                            done: done.clone(),
                            dl: Box::new(dl),
                            sent: false,
                            outcome: None,
                            span: info.span.take(),
                        };
                        self.unsent += 1;
                    }
                    other => {
                        if let Some(span) = info.span.take() {
                            span.failed(&not_delivered(&other));
                        }
                        *slot = Some(Outcome::of(other))
                    }
                },
                Entry::DeadLetter {
                    dl,
                    sent: true,
                    outcome: slot @ None,
                    span,
                    ..
                } => {
                    if let (Some((audit, lines)), Ok(Delivered::Acked(partition, offset))) =
                        (&mut self.audit, &outcome)
                    {
                        let key = dead_letter_key(dl);
                        audit.dead_letter(lines, *partition, *offset, key.as_deref(), &dl.position);
                    }
                    end_dead_letter_span(span, dl, &outcome);
                    *slot = Some(Outcome::of(outcome))
                }
                _ => {} // a second report for one record: librdkafka sends one
            }
        }
        self.tally.flush();
        if let Some((audit, lines)) = &mut self.audit {
            audit.write(lines);
        }
    }

    /// Enqueues the dead letters of records refused at delivery, under their records' numbers.
    /// `false` when librdkafka's queue is full (try again later).
    fn send_dead_letters(&mut self, sink: &impl RecordSink) -> bool {
        for (i, entry) in self.entries.iter_mut().enumerate() {
            if self.unsent == 0 {
                break;
            }
            let Entry::DeadLetter {
                dl,
                sent: sent @ false,
                outcome,
                span,
                ..
            } = entry
            else {
                continue;
            };
            match sink.send_dead_letter(dl, self.first_seq + i as u64) {
                Ok(()) => *sent = true,
                Err(SendError::QueueFull) => return false,
                Err(
                    SendError::Permanent(reason)
                    | SendError::TooLarge(reason)
                    | SendError::Timestamp(reason)
                    | SendError::BrokerRefused(reason),
                ) => {
                    *sent = true;
                    let failed = Err(refused_too(dl, &reason));
                    end_dead_letter_span(span, dl, &failed);
                    *outcome = Some(Outcome::of(failed));
                }
                Err(SendError::Failed(e)) => {
                    *sent = true;
                    let failed = Err(e);
                    end_dead_letter_span(span, dl, &failed);
                    *outcome = Some(Outcome::of(failed));
                }
            }
            self.unsent -= 1;
        }
        true
    }
}

/// The `event_key` header of a dead letter (the row's headers travel with it), for the audit.
fn dead_letter_key(dl: &DeadLetter) -> Option<String> {
    dl.headers
        .iter()
        .find(|(name, _)| name == "event_key")
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
}

/// Ends the span of a row that was dead-lettered, once its dead letter's `outcome` is known.
fn end_dead_letter_span(
    span: &mut Option<Box<RowSpan>>,
    dl: &DeadLetter,
    outcome: &Result<Delivered, RelayError>,
) {
    if let Some(span) = span.take() {
        match outcome {
            Ok(Delivered::Acked(..)) => span.dead_lettered(&dl.reason),
            other => span.failed(&format!(
                "{}; its dead letter: {}",
                dl.reason,
                not_delivered(other)
            )),
        }
    }
}

/// Why a record was not delivered, for its span.
fn not_delivered(outcome: &Result<Delivered, RelayError>) -> String {
    match outcome {
        Ok(Delivered::Acked(..)) => "delivered".to_owned(),
        Ok(Delivered::Refused { reason, .. }) => reason.clone(),
        Err(e) => e.to_string(),
    }
}
